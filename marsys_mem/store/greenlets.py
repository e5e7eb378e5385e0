"""Sync-style code over asyncio I/O: one code path for a store's sync and async calls.

:func:`run_sync_style` runs a plain function in a greenlet on the event loop's thread; the
function's I/O calls :func:`await_only` with an awaitable, which switches back to the
coroutine, awaits it there (so the event loop keeps running other tasks) and resumes the
function with the result, or raises the awaitable's exception inside it. So a backend's
batch logic (transactions, retries, error mapping) and every SQL statement is written
once, against a connection whose ``execute`` is sync-looking, and runs on a thread (the
sync API) or on the event loop (the async twins). It is the mechanism of SQLAlchemy's
asyncio extension, reduced to what a store needs. Needs ``greenlet`` (the ``postgres``
extra).

Example:
    >>> import asyncio
    >>> def work(x: int) -> int:
    ...     return await_only(asyncio.sleep(0, result=x)) + 1
    >>> asyncio.run(run_sync_style(work, 41))
    42
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from marsys_mem.exceptions import MissingDependencyError

try:
    import greenlet
except ModuleNotFoundError as exc:  # pragma: no cover - the extra is installed in CI
    raise MissingDependencyError(
        "the async PostgresStore needs greenlet: pip install 'marsys-mem[postgres]'"
    ) from exc

__all__ = ["await_only", "run_sync_style"]

T = TypeVar("T")


class _Bridged(greenlet.greenlet):  # type: ignore[misc]  # greenlet ships no usable stubs here
    """A greenlet whose parent is the coroutine that awaits on its behalf."""

    def __init__(self, fn: Callable[..., Any], parent: greenlet.greenlet) -> None:
        super().__init__(fn, parent)
        self.bridge_parent = parent


def await_only(awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` from sync-style code run by :func:`run_sync_style`.

    Raises:
        RuntimeError: not called inside :func:`run_sync_style` (the awaitable is closed).
    """
    current = greenlet.getcurrent()
    if not isinstance(current, _Bridged):
        close = getattr(awaitable, "close", None)
        if close is not None:
            close()  # no "coroutine was never awaited" warning
        raise RuntimeError("await_only() called outside run_sync_style()")
    return cast(T, current.bridge_parent.switch(awaitable))


async def run_sync_style(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args)`` on this thread, awaiting every :func:`await_only` it makes.

    Exceptions of ``fn`` propagate; a cancellation of the awaiting task is raised inside
    ``fn`` at the :func:`await_only` it was in (so its ``finally`` blocks run).
    """
    child = _Bridged(fn, greenlet.getcurrent())
    result: Any = child.switch(*args)
    while not child.dead:
        try:
            value = await result
        except BaseException:
            result = child.throw(*sys.exc_info())
        else:
            result = child.switch(value)
    return cast(T, result)
