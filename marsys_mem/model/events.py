"""Typed memory events and a bounded event bus.

Memories publish what they do to an :class:`EventBus`: messages added or removed, a history
cleared, a window trimmed or summarised, a memory forked. Every event carries the message
counts before and after, and trimming/summarising events also the strategy and tokens.

The bus keeps the last ``max_history`` events (a ring buffer: it never grows without
limit) and calls subscribers synchronously. A subscriber that raises does not break the
memory: the error is logged and counted in ``EventBus.errors``. ``add`` events are only
built when someone subscribed to them, so appends stay cheap.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import deque
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from marsys_mem.callables import discard

__all__ = [
    "AddEvent",
    "ClearEvent",
    "EventBus",
    "EventKind",
    "ForkEvent",
    "MemoryEvent",
    "RemoveEvent",
    "SummarizeEvent",
    "TrimEvent",
    "WindowEvent",
]

log = logging.getLogger("marsys_mem.model.events")

EventKind = Literal["add", "remove", "clear", "trim", "summarize", "fork", "window"]


class _EventBase(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    agent: str | None = None
    before: int = Field(ge=0, description="messages in the memory before")
    after: int = Field(ge=0, description="messages in the memory after")
    timestamp: datetime = Field(default_factory=lambda: datetime.now(UTC))


class AddEvent(_EventBase):
    """Messages were appended. ``message_ids``: the new ids, in order.

    Example:
        >>> AddEvent(before=0, after=1, message_ids=("m1",)).kind
        'add'
    """

    kind: Literal["add"] = "add"
    message_ids: tuple[str, ...] = ()


class RemoveEvent(_EventBase):
    """Messages were removed by id.

    Example:
        >>> RemoveEvent(before=2, after=1, message_ids=("m1",)).after
        1
    """

    kind: Literal["remove"] = "remove"
    message_ids: tuple[str, ...] = ()


class ClearEvent(_EventBase):
    """The memory was cleared (``kept``: system messages kept, if asked).

    Example:
        >>> ClearEvent(before=5, after=0).kind
        'clear'
    """

    kind: Literal["clear"] = "clear"


class TrimEvent(_EventBase):
    """``trim_oldest`` deleted the messages that fell out of the window.

    Example:
        >>> TrimEvent(before=9, after=4, strategy="trim_oldest", tokens_before=90,
        ...           tokens_after=40, message_ids=("a",)).strategy
        'trim_oldest'
    """

    kind: Literal["trim"] = "trim"
    strategy: str
    tokens_before: int
    tokens_after: int
    message_ids: tuple[str, ...] = ()


class SummarizeEvent(_EventBase):
    """The summariser ran over ``summarized`` messages that had not been summarised before.

    ``before``/``after`` are the history size and the window size.

    Example:
        >>> SummarizeEvent(before=100, after=21, strategy="summarize", summarized=79,
        ...                tokens_before=5000, tokens_after=900).summarized
        79
    """

    kind: Literal["summarize"] = "summarize"
    strategy: str
    summarized: int
    tokens_before: int
    tokens_after: int


class WindowEvent(_EventBase):
    """A context window was built (``before``: history size, ``after``: window size).

    Example:
        >>> WindowEvent(before=10, after=3, strategy="sliding_window", tokens_before=100,
        ...             tokens_after=30).tokens_after
        30
    """

    kind: Literal["window"] = "window"
    strategy: str
    tokens_before: int
    tokens_after: int


class ForkEvent(_EventBase):
    """A memory was forked (``child``: the child's agent/branch label, if any).

    Example:
        >>> ForkEvent(before=3, after=3, child="researcher-2").child
        'researcher-2'
    """

    kind: Literal["fork"] = "fork"
    child: str | None = None


MemoryEvent = Annotated[
    AddEvent | RemoveEvent | ClearEvent | TrimEvent | SummarizeEvent | WindowEvent | ForkEvent,
    Field(discriminator="kind"),
]
EVENT_ADAPTER: TypeAdapter[MemoryEvent] = TypeAdapter(MemoryEvent)

Handler = Callable[[Any], Any]
_KINDS = frozenset(("add", "remove", "clear", "trim", "summarize", "fork", "window", "*"))


class EventBus:
    """Publish/subscribe for memory events, with a bounded history.

    Args:
        max_history: events kept for :meth:`history` (oldest dropped first).

    Example:
        >>> bus = EventBus(max_history=100)
        >>> seen = []
        >>> unsubscribe = bus.subscribe("trim", seen.append)
        >>> bus.publish(TrimEvent(before=3, after=1, strategy="trim_oldest",
        ...                       tokens_before=30, tokens_after=10))
        >>> len(seen), len(bus.history())
        (1, 1)
        >>> unsubscribe()
    """

    def __init__(self, max_history: int = 1000) -> None:
        if max_history < 0:
            raise ValueError(f"max_history must be >= 0, got {max_history}")
        self._history: deque[Any] = deque(maxlen=max_history)
        self._handlers: dict[str, list[Handler]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self.errors = 0

    @property
    def max_history(self) -> int:
        """How many events :meth:`history` keeps."""
        return self._history.maxlen or 0

    def subscribe(self, kind: EventKind | Literal["*"], handler: Handler) -> Callable[[], None]:
        """Call ``handler(event)`` for each event of ``kind`` (``"*"``: all kinds).

        An async handler is scheduled on the running event loop. Returns a function that
        unsubscribes.

        Raises:
            ValueError: an unknown kind.
            TypeError: ``handler`` is not callable.
        """
        if kind not in _KINDS:
            raise ValueError(f"unknown event kind {kind!r}; expected one of {sorted(_KINDS)}")
        if not callable(handler):
            raise TypeError(f"handler must be callable, got {type(handler).__name__}")
        self._handlers.setdefault(kind, []).append(handler)

        def unsubscribe() -> None:
            handlers = self._handlers.get(kind, [])
            if handler in handlers:
                handlers.remove(handler)

        return unsubscribe

    def wants(self, kind: str) -> bool:
        """True if some handler listens to ``kind`` (or to everything)."""
        return bool(self._handlers.get(kind) or self._handlers.get("*"))

    def publish(self, event: Any) -> None:
        """Record ``event`` and call its subscribers."""
        self._history.append(event)
        for handler in (*self._handlers.get(event.kind, ()), *self._handlers.get("*", ())):
            try:
                result = handler(event)
                if inspect.isawaitable(result):
                    self._schedule(result, handler)
            except Exception:
                self.errors += 1
                log.exception("event handler %r failed on %s event", handler, event.kind)

    def _schedule(self, awaitable: Any, handler: Handler) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            discard(awaitable)
            raise RuntimeError(f"async handler {handler!r} needs a running event loop") from None
        task = loop.create_task(awaitable)
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._task_done(t, handler))

    def _task_done(self, task: asyncio.Task[Any], handler: Handler) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self.errors += 1
            log.error("async event handler %r failed", handler, exc_info=exc)

    def history(self, kind: str | None = None) -> list[Any]:
        """Recorded events, oldest first, optionally of one kind."""
        if kind is None:
            return list(self._history)
        return [e for e in self._history if e.kind == kind]

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._history))

    def __len__(self) -> int:
        return len(self._history)

    def clear(self) -> None:
        """Forget the recorded events (subscriptions stay)."""
        self._history.clear()
