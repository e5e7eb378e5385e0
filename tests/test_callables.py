"""The one helper for callables that may be sync or async (marsys_mem.callables)."""

import asyncio
import functools
import warnings

import pytest

from marsys_mem.callables import (
    acall,
    call_blocking,
    call_sync,
    discard,
    is_async_callable,
    run_blocking,
)
from marsys_mem.exceptions import SummarizerError


async def _double(x: int) -> int:
    return 2 * x


class _AsyncHook:
    async def __call__(self, x: int) -> int:
        return x + 1


class _SyncHook:
    def __call__(self, x: int) -> int:
        return x - 1


def _boom(x: int) -> int:
    raise KeyError(x)


def test_is_async_callable_sees_functions_objects_and_partials():
    assert is_async_callable(_double)
    assert is_async_callable(_AsyncHook())
    assert is_async_callable(functools.partial(_double, 1))
    assert not is_async_callable(_SyncHook())
    assert not is_async_callable(len)
    assert not is_async_callable("not callable")


def test_call_sync_returns_and_refuses_async_without_a_warning():
    assert call_sync(_SyncHook(), 3) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a coroutine left unclosed would warn
        with pytest.raises(TypeError, match="the summariser is async: use acontext"):
            call_sync(_double, 1, what="the summariser", use="acontext()")
        with pytest.raises(SummarizerError, match="is async"):
            call_sync(_AsyncHook(), 1, error=SummarizerError)


def test_call_sync_wraps_errors_only_when_asked():
    with pytest.raises(KeyError):
        call_sync(_boom, 1)
    with pytest.raises(SummarizerError, match="the summariser raised KeyError: 1") as info:
        call_sync(_boom, 1, what="the summariser", error=SummarizerError)
    assert isinstance(info.value.__cause__, KeyError)


async def test_acall_awaits_async_and_passes_sync_through():
    assert await acall(_double, 2) == 4
    assert await acall(_AsyncHook(), 2) == 3
    assert await acall(len, "ab") == 2
    with pytest.raises(SummarizerError, match="raised KeyError"):
        await acall(_boom, 1, error=SummarizerError)


def test_call_blocking_runs_async_results():
    assert call_blocking(_double, 5) == 10
    assert call_blocking(abs, -5) == 5


async def test_run_blocking_inside_a_running_loop_uses_a_worker_thread():
    assert run_blocking(_double(3)) == 6


async def test_discard_closes_coroutines_and_cancels_futures():
    coro = _double(1)
    discard(coro)
    assert coro.cr_frame is None  # closed
    future = asyncio.get_running_loop().create_future()
    discard(future)
    assert future.cancelled()
    discard(42)  # anything else is left alone
