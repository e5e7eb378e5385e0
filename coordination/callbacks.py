"""``on_fact`` callbacks under pressure: a bounded queue and a few workers per subscription.

A coordinator calls every matching ``on_fact`` callback for each fact it delivers, on its
receive path. A sync callback runs there and then. An async one (or a sync one that
returns an awaitable) is queued in its subscription's :class:`CallbackQueue` and run by at
most ``max_tasks`` worker tasks; at most ``max_queue`` deliveries wait, and when the queue is
full the **oldest** waiting delivery is dropped and counted. So a slow callback costs a
fixed amount of memory and tasks, however many facts arrive.

Drop-oldest rather than backpressure: waiting for a slow callback would stall the receive
path, and with it every agent's inbox, the repair protocol and, over MQTT, the broker
connection. A dropped notification loses no fact: the fact is in the agent's inbox
(``Coordinator.facts_for``) all the same, and the newest notifications are kept.

The counters of all of a coordinator's queues live in one :class:`CallbackStats` (shown in
``Coordinator.stats`` as ``callbacks_*``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from marsys_mem.callables import discard, is_async_callable
from marsys_mem.config.coordination import CoordinatorSettings

__all__ = [
    "DEFAULT_MAX_CALLBACK_QUEUE",
    "DEFAULT_MAX_CALLBACK_TASKS",
    "CallbackQueue",
    "CallbackStats",
]

log = logging.getLogger("marsys_mem.coordination")

_DEFAULTS = CoordinatorSettings()
DEFAULT_MAX_CALLBACK_TASKS: Final = _DEFAULTS.max_callback_tasks
"""Async calls of one callback running at once, unless told otherwise (the settings')."""
DEFAULT_MAX_CALLBACK_QUEUE: Final = _DEFAULTS.max_callback_queue
"""Deliveries waiting for one callback, unless told otherwise (the oldest is dropped)."""


@dataclass(slots=True)
class CallbackStats:
    """Counters shared by a coordinator's callback queues.

    Attributes:
        queued: deliveries waiting now.
        running: async calls running now.
        max_running: the most async calls that ever ran at once.
        dropped: deliveries dropped (the oldest, when a queue was full; those left when
            the coordinator closed or the callback was unsubscribed).
        errors: calls that raised.

    Example:
        >>> CallbackStats().as_stats()["callbacks_dropped"]
        0
    """

    queued: int = 0
    running: int = 0
    max_running: int = 0
    dropped: int = 0
    errors: int = 0

    def as_stats(self) -> dict[str, int]:
        """The counters as ``Coordinator.stats`` shows them (``errors`` is shown apart)."""
        return {
            "callbacks_queued": self.queued,
            "callbacks_in_flight": self.running,
            "callbacks_max_in_flight": self.max_running,
            "callbacks_dropped": self.dropped,
        }


class CallbackQueue:
    """One subscription's callback, called for each delivery; async calls bounded.

    Args:
        callback: called with each delivery; sync or async.
        stats: the coordinator's counters (shared by its queues).
        max_tasks: async calls running at once (worker tasks), at least 1.
        max_queue: deliveries waiting, at least 1; when full the oldest is dropped.

    Example:
        >>> import asyncio
        >>> seen = []
        >>> async def slow(item):
        ...     await asyncio.sleep(0.01)
        ...     seen.append(item)
        >>> async def demo():
        ...     stats = CallbackStats()
        ...     queue = CallbackQueue(slow, stats, max_tasks=1, max_queue=2)
        ...     for i in range(5):
        ...         queue.submit(i)  # 2 wait at most: 0, 1, 2 are pushed out by 3, 4
        ...     await queue.close(timeout=1.0)
        ...     return seen, stats.dropped, stats.max_running
        >>> asyncio.run(demo())
        ([3, 4], 3, 1)
    """

    __slots__ = (
        "_active",
        "_pending",
        "_workers",
        "callback",
        "is_async",
        "max_queue",
        "max_tasks",
        "stats",
    )

    def __init__(
        self,
        callback: Callable[[Any], Any],
        stats: CallbackStats,
        *,
        max_tasks: int = DEFAULT_MAX_CALLBACK_TASKS,
        max_queue: int = DEFAULT_MAX_CALLBACK_QUEUE,
    ) -> None:
        for name, value in (("max_tasks", max_tasks), ("max_queue", max_queue)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        self.callback = callback
        self.stats = stats
        self.max_tasks = max_tasks
        self.max_queue = max_queue
        self.is_async = is_async_callable(callback)
        # a delivery (async callback: called by the worker) or an awaitable (what a sync
        # callback returned)
        self._pending: deque[Any] = deque()
        self._workers: set[asyncio.Task[None]] = set()
        self._active = 0  # workers still taking items (a finished one may linger in _workers)

    @property
    def waiting(self) -> int:
        """Deliveries waiting in this queue."""
        return len(self._pending)

    @property
    def busy(self) -> bool:
        """True while a worker task is alive (running a call or about to)."""
        return any(not task.done() for task in self._workers)

    def submit(self, item: Any) -> None:
        """Call the callback with ``item`` (sync), or queue the call (async). Never raises."""
        if self.is_async:
            self._enqueue(item, is_awaitable=False)
            return
        try:
            result = self.callback(item)
        except Exception:
            self.stats.errors += 1
            log.exception("on_fact callback %r failed", self.callback)
            return
        if inspect.isawaitable(result):
            self._enqueue(result, is_awaitable=True)

    def _enqueue(self, item: Any, *, is_awaitable: bool) -> None:
        pending, stats = self._pending, self.stats
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # e.g. a graph change delivering facts from sync code
            log.warning(
                "no running event loop: async on_fact callback %r not called", self.callback
            )
            self._drop((item, is_awaitable), 1)
            return
        if len(pending) >= self.max_queue:
            oldest = pending.popleft()
            stats.queued -= 1
            self._drop(oldest, 1)
        pending.append((item, is_awaitable))
        stats.queued += 1
        if self._active < self.max_tasks:
            self._active += 1
            task = loop.create_task(self._work())
            self._workers.add(task)
            task.add_done_callback(self._workers.discard)

    def _drop(self, entry: tuple[Any, bool], count: int) -> None:
        item, is_awaitable = entry
        if is_awaitable:
            discard(item)
        n = self.stats.dropped = self.stats.dropped + count
        if str(n).rstrip("0") == "1":  # the 1st, 10th, 100th...
            log.warning(
                "on_fact callback %r is too slow: dropped %d waiting deliveries so far "
                "(at most %d wait, %d run at once)",
                self.callback,
                n,
                self.max_queue,
                self.max_tasks,
            )

    async def _work(self) -> None:
        try:
            await self._drain()
        finally:
            self._active -= 1  # no await between the empty queue and this

    async def _drain(self) -> None:
        pending, stats = self._pending, self.stats
        while pending:
            item, is_awaitable = pending.popleft()
            stats.queued -= 1
            stats.running += 1
            stats.max_running = max(stats.max_running, stats.running)
            try:
                result: Awaitable[Any] | Any = item if is_awaitable else self.callback(item)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                stats.errors += 1
                log.exception("async on_fact callback %r failed", self.callback)
            finally:
                stats.running -= 1

    def clear(self) -> None:
        """Drop what is waiting (counted in ``dropped``)."""
        pending = list(self._pending)
        self._pending.clear()  # in place: the workers hold this deque
        self.stats.queued -= len(pending)
        for entry in pending:
            self._drop(entry, 1)

    async def close(self, timeout: float) -> None:
        """Let the queue drain for up to ``timeout`` seconds, then cancel and drop the rest."""
        if self._workers:
            _done, late = await asyncio.wait(set(self._workers), timeout=timeout)
            self.clear()
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)
        self.clear()
