"""Callables that may be sync or async: the one way to tell, call, await or let go of them.

What a user passes in (summarisers, fact extractors, embed functions, ``on_fact`` callbacks,
event handlers) may be a function, a coroutine function, or an object whose ``__call__`` is
either. Every module calls such things through these helpers, so the rules are stated once:
an async result on a sync path is closed (no "never awaited" warning) and refused, or run to
completion where the caller documents that it blocks.

Example:
    >>> import asyncio
    >>> async def shout(text):
    ...     return text.upper()
    >>> is_async_callable(shout), asyncio.run(acall(shout, "hi")), call_blocking(shout, "hi")
    (True, 'HI', 'HI')
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

__all__ = ["acall", "call_blocking", "call_sync", "discard", "is_async_callable", "run_blocking"]

T = TypeVar("T")


def is_async_callable(func: object) -> bool:
    """True if calling ``func`` returns a coroutine (an ``async def``, or an async ``__call__``).

    Example:
        >>> class Hook:
        ...     async def __call__(self, item): ...
        >>> is_async_callable(Hook()), is_async_callable(print)
        (True, False)
    """
    call = getattr(func, "__call__", None)  # noqa: B004 (an object whose __call__ is async)
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(call)


def discard(value: object) -> None:
    """Let go of an awaitable that will never be awaited (no "never awaited" warning).

    A coroutine is closed, a future cancelled; anything else is left alone.

    Example:
        >>> async def job(): ...
        >>> discard(job())  # closed: no RuntimeWarning at garbage collection
    """
    if inspect.iscoroutine(value):
        value.close()
    elif isinstance(value, asyncio.Future):
        value.cancel()


def call_sync(
    func: Callable[..., Any],
    /,
    *args: Any,
    what: str = "the callable",
    use: str = "its async twin",
    error: Callable[[str], Exception] | None = None,
) -> Any:
    """Call ``func(*args)`` on a sync path, refusing an async result.

    Args:
        func: the callable.
        *args: its arguments.
        what: how errors name it (``"the summariser"``).
        use: what to call instead when it is async (``"acontext()"``).
        error: the exception type to raise (``SummarizerError``); ``None``: what ``func``
            raises propagates and an async result raises ``TypeError``.

    Raises:
        TypeError: (or ``error``) ``func`` returned an awaitable; it was closed, not run.
        Exception: what ``func`` raised, as ``error`` (chained) when one is given.

    Example:
        >>> async def slow(x): return x
        >>> call_sync(len, "abc")
        3
        >>> call_sync(slow, 1, what="the summariser", use="acontext()")
        Traceback (most recent call last):
        ...
        TypeError: the summariser is async: use acontext() instead
    """
    try:
        result = func(*args)
    except Exception as exc:
        if error is None:
            raise
        raise error(f"{what} raised {type(exc).__name__}: {exc}") from exc
    if inspect.isawaitable(result):
        discard(result)
        raise (error or TypeError)(f"{what} is async: use {use} instead")
    return result


async def acall(
    func: Callable[..., Any],
    /,
    *args: Any,
    what: str = "the callable",
    error: Callable[[str], Exception] | None = None,
) -> Any:
    """Call ``func(*args)`` and await the result if it is awaitable.

    Args:
        func: the callable, sync or async.
        *args: its arguments.
        what: how errors name it.
        error: the exception type to raise what ``func`` raised as (chained); ``None``:
            it propagates unchanged.

    Example:
        >>> import asyncio
        >>> asyncio.run(acall(len, "abc"))
        3
    """
    try:
        result = func(*args)
        if inspect.isawaitable(result):
            result = await result
    except Exception as exc:
        if error is None:
            raise
        raise error(f"{what} raised {type(exc).__name__}: {exc}") from exc
    return result


def run_blocking(awaitable: Awaitable[T]) -> T:
    """Run ``awaitable`` to completion from sync code and return its result.

    ``asyncio.run`` in this thread, or in a fresh worker thread when this thread already
    runs an event loop (which then waits: call it from sync code only).

    Example:
        >>> async def two(): return 2
        >>> run_blocking(two())
        2
    """

    async def wait() -> T:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, wait()).result()


def call_blocking(func: Callable[..., Any], /, *args: Any) -> Any:
    """Call ``func(*args)``; an awaitable result is run to completion (:func:`run_blocking`).

    Example:
        >>> async def double(x): return 2 * x
        >>> call_blocking(double, 4), call_blocking(abs, -4)
        (8, 4)
    """
    result = func(*args)
    if inspect.isawaitable(result):
        return run_blocking(result)
    return result
