"""ConversationMemory: one agent's typed, append-only conversation history.

The history is kept in *segments*. A memory owns one segment it appends to, and may borrow
prefixes of other segments: that is how :meth:`ConversationMemory.fork` shares a parent's
history without copying it (copy-on-write). A borrowed segment is never changed in place:
deleting messages builds a new segment, so forks never see each other's changes. Each
segment indexes its messages (id, protected positions, tool-call links), so lookups and
context windows cost O(1) / O(window), not O(history).

Threads: a memory may be written and read from several threads at once. Every change runs
under the memory's re-entrant lock (:attr:`ConversationMemory.lock`). Readers and window
builders take a view under the lock (the segments and their current lengths: O(number of
forks)) and work on it without the lock: segments only grow, so a view never changes under
them. A summariser therefore runs without the lock, and writers are not blocked by it.
"""

from __future__ import annotations

import bisect
import functools
import threading
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, overload, runtime_checkable

from marsys_mem.context.policy import ContextPolicy, ContextWindow, Summarizer
from marsys_mem.context.tokens import TokenCounter, count_message, get_counter
from marsys_mem.context.window import (
    SummaryState,
    WindowBuild,
    abuild_window,
    build_window,
    latest_before,
)
from marsys_mem.display import MAX_CHARS, MAX_ROWS, MemoryView, memory_html
from marsys_mem.exceptions import (
    DuplicateMessageError,
    DuplicateToolCallError,
    MessageNotFoundError,
    OrphanToolResultError,
)
from marsys_mem.model.events import (
    AddEvent,
    ClearEvent,
    EventBus,
    ForkEvent,
    RemoveEvent,
    SummarizeEvent,
    TrimEvent,
    WindowEvent,
)
from marsys_mem.model.messages import Message, Provider, to_llm_format

__all__ = ["ConversationMemory", "MemorySink"]


@runtime_checkable
class MemorySink(Protocol):
    """Mirrors a memory's changes, e.g. into a store (write-through persistence).

    Each method is called after validation and before the memory changes: if it raises,
    the change does not happen, so memory and sink never disagree.

    The write path runs one way, memory to sink. ``on_append`` may return the ids of
    messages the memory must drop once the append is done (e.g. what a retention rule
    evicts; a store sink has already deleted them in the append's transaction): the
    memory drops them itself (:meth:`ConversationMemory.evict`) without calling the sink
    back, and publishes a ``remove`` event. ``None`` (or nothing) drops nothing, so a sink
    written before this hook keeps working. A sink never changes the memory itself.

    The methods run under the memory's lock, so they see every thread's changes in the
    order the memory applies them, one call at a time.
    """

    def on_append(
        self, memory: ConversationMemory, messages: Sequence[Message]
    ) -> Collection[str] | None:
        """``messages`` are about to be appended; returns ids to drop afterwards (or None)."""

    def on_remove(self, memory: ConversationMemory, messages: Sequence[Message]) -> None:
        """``messages`` are about to be removed (remove, trim_oldest, clear(keep_system))."""

    def on_clear(self, memory: ConversationMemory) -> None:
        """Every message is about to be removed."""


class _Segment:
    """An indexed run of messages. Only its owner appends; nobody edits it in place."""

    __slots__ = ("ids", "messages", "owners", "protected", "results")

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.ids: dict[str, int] = {}
        self.protected: list[int] = []
        self.owners: dict[str, list[int]] = {}  # call id -> positions (ascending)
        self.results: dict[str, list[int]] = {}

    def append(self, m: Message) -> None:
        pos = len(self.messages)
        self.messages.append(m)
        self.ids[m.message_id] = pos
        if m.role == "system" or m.pinned or m.metadata.get("preserve") is True:
            self.protected.append(pos)
        for call in m.tool_calls:
            self.owners.setdefault(call.id, []).append(pos)
        if m.tool_call_id is not None:
            self.results.setdefault(m.tool_call_id, []).append(pos)

    @classmethod
    def of(cls, messages: Iterable[Message]) -> _Segment:
        seg = cls()
        for m in messages:
            seg.append(m)
        return seg


class _View:
    """The history of a memory at one moment: its segments, each up to its length then.

    Segments are only ever appended to and never edited in place, so a view stays valid and
    unchanged while the memory goes on (appends, removals, clears, forks) in other threads.
    It implements the index protocol the window builder needs.
    """

    __slots__ = ("_len", "_segs", "_starts")

    def __init__(self, segs: list[tuple[_Segment, int]], starts: list[int]) -> None:
        self._segs = segs  # (segment, bound), oldest first; no empty ones
        self._starts = starts  # global position of each segment's first message
        self._len = starts[-1] + segs[-1][1] if segs else 0

    @staticmethod
    def of(segs: list[tuple[_Segment, int]], starts: list[int]) -> _View:
        """A view; the common case (one segment: nothing forked) gets the fast one."""
        return _FlatView(segs, starts) if len(segs) == 1 else _View(segs, starts)

    @property
    def segments(self) -> list[tuple[_Segment, int]]:
        """``(segment, bound)`` pairs, oldest first: what a fork borrows (a new list)."""
        return list(self._segs)

    @property
    def starts(self) -> list[int]:
        """The global position of each segment's first message (a new list)."""
        return list(self._starts)

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, position: int) -> Message:
        if position < 0:
            position += self._len
        if not 0 <= position < self._len:
            raise IndexError("message position out of range")
        i = bisect.bisect_right(self._starts, position) - 1
        return self._segs[i][0].messages[position - self._starts[i]]

    def __iter__(self) -> Iterator[Message]:
        return iter(self.messages())

    def messages(self) -> list[Message]:
        """The messages of the view, oldest first (a new list)."""
        out: list[Message] = []
        for seg, bound in self._segs:
            out.extend(seg.messages[:bound])
        return out

    def position(self, message_id: str) -> int | None:
        """Global position of the message with this id, or ``None``."""
        for i in range(len(self._segs) - 1, -1, -1):
            seg, bound = self._segs[i]
            local = seg.ids.get(message_id)
            if local is not None and local < bound:
                return self._starts[i] + local
        return None

    def protected_positions(self) -> list[int]:
        out: list[int] = []
        for (seg, bound), start in zip(self._segs, self._starts, strict=True):
            out.extend(start + p for p in seg.protected[: bisect.bisect_left(seg.protected, bound)])
        return out

    def call_owner(self, call_id: str, before: int | None = None) -> int | None:
        for i in range(len(self._segs) - 1, -1, -1):
            seg, bound = self._segs[i]
            start = self._starts[i]
            limit = bound if before is None else min(bound, before - start)
            local = latest_before(seg.owners.get(call_id), limit)
            if local is not None:
                return start + local
        return None

    def call_results(self, call_id: str) -> list[int]:
        out: list[int] = []
        for (seg, bound), start in zip(self._segs, self._starts, strict=True):
            out.extend(start + p for p in seg.results.get(call_id, ()) if p < bound)
        return out


class _FlatView(_View):
    """A view of one segment starting at position 0 (a memory with nothing forked)."""

    __slots__ = ("_seg",)

    def __init__(self, segs: list[tuple[_Segment, int]], starts: list[int]) -> None:
        super().__init__(segs, starts)
        self._seg = segs[0][0]

    def __getitem__(self, position: int) -> Message:
        if 0 <= position < self._len:
            return self._seg.messages[position]
        return super().__getitem__(position)

    def messages(self) -> list[Message]:
        return self._seg.messages[: self._len]

    def position(self, message_id: str) -> int | None:
        local = self._seg.ids.get(message_id)
        return local if local is not None and local < self._len else None

    def protected_positions(self) -> list[int]:
        protected = self._seg.protected
        return protected[: bisect.bisect_left(protected, self._len)]

    def call_owner(self, call_id: str, before: int | None = None) -> int | None:
        limit = self._len if before is None else min(self._len, before)
        return latest_before(self._seg.owners.get(call_id), limit)

    def call_results(self, call_id: str) -> list[int]:
        return [p for p in self._seg.results.get(call_id, ()) if p < self._len]


_NONE: frozenset[str] = frozenset()


def _to_message(item: Message | Mapping[str, Any]) -> Message:
    if isinstance(item, Message):
        return item
    if isinstance(item, Mapping):
        return Message.model_validate(item)
    raise TypeError(f"expected a Message or a message dict, got {type(item).__name__}")


class ConversationMemory:
    """An agent's conversation history, and the bounded window it sends to its LLM.

    Messages are immutable and appended; ``read()`` returns all of them (initial and
    appended), ``appended()`` only those added after construction (this run). Token totals
    are kept incrementally. Thread-safe: several threads may add, remove, trim, fork and
    read at once; each change is atomic under :attr:`lock`, which callers may also hold to
    make several calls one atomic step.

    Args:
        messages: the initial history (validated like :meth:`add_many`).
        policy: the default :class:`ContextPolicy` for :meth:`context`.
        counter: token counter (default :class:`~marsys_mem.context.tokens.HeuristicCounter`).
        summarizer: default summariser for the ``summarize`` strategy.
        strict_tools: reject tool results that answer no earlier tool call, and tool call
            ids used twice.
        events: an :class:`EventBus` to publish events to.
        agent: label put on events.
        sink: a :class:`MemorySink` that mirrors changes (e.g. to a store). It is called
            before the memory changes, so if it raises the memory stays as it was. The
            initial ``messages`` are not sent to it; forks do not inherit it.

    Example:
        >>> from marsys_mem import ToolCall
        >>> mem = ConversationMemory([Message.system("You are terse."), Message.user("Hi")])
        >>> mid = mem.add(Message.user("Weather in Tokyo?"))
        >>> call = ToolCall(id="c1", name="weather", arguments={"city": "Tokyo"})
        >>> _ = mem.add(Message.assistant("", tool_calls=[call]))
        >>> _ = mem.add(Message.tool("72F", tool_call_id="c1", name="weather"))
        >>> len(mem), len(mem.appended()), mem.get(mid).text
        (5, 3, 'Weather in Tokyo?')
        >>> win = mem.context(ContextPolicy(max_messages=4))  # it starts on a user turn
        >>> [m.role for m in win.messages]
        ['system', 'user', 'assistant', 'tool']
    """

    def __init__(
        self,
        messages: Iterable[Message | Mapping[str, Any]] | None = None,
        *,
        policy: ContextPolicy | None = None,
        counter: TokenCounter | None = None,
        summarizer: Summarizer | None = None,
        strict_tools: bool = True,
        events: EventBus | None = None,
        agent: str | None = None,
        sink: MemorySink | None = None,
    ) -> None:
        self._lock = threading.RLock()
        self._generation = 0  # bumped whenever messages are removed (positions shift)
        self.policy = policy or ContextPolicy()
        self.counter = get_counter(counter)
        self.summarizer = summarizer
        self.strict_tools = strict_tools
        self.events = events
        self.agent = agent
        self.sink: MemorySink | None = None
        self._borrowed: list[tuple[_Segment, int]] = []
        self._starts: list[int] = []  # global start position of each borrowed segment
        self._own = _Segment()
        self._offset = 0  # global position of the own segment's first message
        self._total = 0
        self._other_totals: dict[Hashable, list[Any]] = {}  # cache key -> [counter, total]
        self._summary: SummaryState | None = None
        self._initial = 0
        if messages is not None:
            self.add_many(messages, _publish=False)
        self._initial = len(self)
        self.sink = sink

    @property
    def lock(self) -> threading.RLock:
        """The re-entrant lock every change holds; hold it to make several calls atomic.

        Example:
            >>> mem = ConversationMemory()
            >>> with mem.lock:  # no other thread can add between the check and the add
            ...     if not len(mem):
            ...         _ = mem.add(Message.user("first"))
            >>> len(mem)
            1
        """
        return self._lock

    def _view(self) -> _View:
        """The history as it is now (call with the lock held)."""
        segs = list(self._borrowed)
        starts = list(self._starts)
        n = len(self._own.messages)
        if n:
            segs.append((self._own, n))
            starts.append(self._offset)
        return _View.of(segs, starts)

    # ------------------------------------------------------------------ index protocol
    def __len__(self) -> int:
        with self._lock:
            return self._offset + len(self._own.messages)

    @overload
    def __getitem__(self, position: int) -> Message: ...

    @overload
    def __getitem__(self, position: slice) -> list[Message]: ...

    def __getitem__(self, position: int | slice) -> Message | list[Message]:
        if isinstance(position, slice):
            return self.read()[position]
        with self._lock:
            return self._view()[position]

    def __iter__(self) -> Iterator[Message]:
        with self._lock:
            view = self._view()
        return iter(view.messages())

    def __contains__(self, message_id: object) -> bool:
        if not isinstance(message_id, str):
            return False
        with self._lock:
            return self._position(message_id) is not None

    def _position(self, message_id: str) -> int | None:
        if not self._borrowed:  # fast path: nothing forked (offset is 0)
            return self._own.ids.get(message_id)
        return self._view().position(message_id)

    def protected_positions(self) -> list[int]:
        """Global positions of system and pinned messages, ascending."""
        with self._lock:
            return self._view().protected_positions()

    def call_owner(self, call_id: str, before: int | None = None) -> int | None:
        """Position of the latest message (before ``before``) that made tool call ``call_id``."""
        with self._lock:
            return self._call_owner(call_id, before)

    def call_results(self, call_id: str) -> list[int]:
        """Positions of the tool results answering ``call_id``."""
        with self._lock:
            return self._call_results(call_id)

    def _call_owner(self, call_id: str, before: int | None = None) -> int | None:
        if not self._borrowed:  # fast path: nothing forked
            return latest_before(self._own.owners.get(call_id), before)
        return self._view().call_owner(call_id, before)

    def _call_results(self, call_id: str) -> list[int]:
        if not self._borrowed:
            return list(self._own.results.get(call_id, ()))
        return self._view().call_results(call_id)

    # ------------------------------------------------------------------ writing
    def _check(
        self,
        m: Message,
        pending_calls: Collection[str],
        pending_results: Collection[str],
        pending_ids: Collection[str],
    ) -> None:
        if m.message_id in pending_ids or self._position(m.message_id) is not None:
            raise DuplicateMessageError(f"message_id {m.message_id!r} is already in this memory")
        if not self.strict_tools:
            return
        for call in m.tool_calls:
            if call.id in pending_calls or self._call_owner(call.id) is not None:
                raise DuplicateToolCallError(
                    f"tool call id {call.id!r} is already used by an earlier message "
                    "(create the memory with strict_tools=False to allow it)"
                )
        if m.tool_call_id is not None:
            cid = m.tool_call_id
            if cid not in pending_calls and self._call_owner(cid) is None:
                raise OrphanToolResultError(
                    f"tool result {m.message_id!r} answers tool_call_id {cid!r}, but no earlier "
                    "assistant message made that call (strict_tools=False allows it)"
                )
            if cid in pending_results or self._call_results(cid):
                raise DuplicateToolCallError(f"tool call {cid!r} already has a result")

    def add(self, message: Message | Mapping[str, Any]) -> str:
        """Append one message and return its ``message_id``.

        A dict is validated into a :class:`Message` first.

        Raises:
            pydantic.ValidationError: a malformed message dict.
            DuplicateMessageError: the id is already in the memory.
            OrphanToolResultError: (strict) a tool result answering no earlier call.
            DuplicateToolCallError: (strict) a reused tool call id or a second result.
        """
        m = _to_message(message)
        tokens = count_message(self.counter, m)  # cached on the message: outside the lock
        with self._lock:
            self._check(m, _NONE, _NONE, _NONE)
            drop = self.sink.on_append(self, (m,)) if self.sink is not None else None
            self._own.append(m)
            self._total += tokens
            if self._other_totals:
                for entry in self._other_totals.values():
                    entry[1] += count_message(entry[0], m)
            if self.events is not None and self.events.wants("add"):
                self._publish_add(self._offset + len(self._own.messages) - 1, (m.message_id,))
            if drop:
                self.evict(drop)
        return m.message_id

    store = add

    def add_many(
        self, messages: Iterable[Message | Mapping[str, Any]], *, _publish: bool = True
    ) -> list[str]:
        """Append several messages atomically: all are validated before any is added.

        Raises:
            The errors of :meth:`add`; on error the memory is unchanged.
        """
        batch = [_to_message(m) for m in messages]
        tokens = sum(count_message(self.counter, m) for m in batch)
        with self._lock:
            calls: set[str] = set()
            results: set[str] = set()
            ids: set[str] = set()
            for m in batch:
                self._check(m, calls, results, ids)
                ids.add(m.message_id)
                calls.update(c.id for c in m.tool_calls)
                if m.tool_call_id is not None:
                    results.add(m.tool_call_id)
            drop = None
            if _publish and batch and self.sink is not None:
                drop = self.sink.on_append(self, batch)
            before = len(self)
            for m in batch:
                self._own.append(m)
                for entry in self._other_totals.values():
                    entry[1] += count_message(entry[0], m)
            self._total += tokens
            if _publish and batch and self.events is not None and self.events.wants("add"):
                self._publish_add(before, tuple(m.message_id for m in batch))
            if drop:
                self.evict(drop)
        return [m.message_id for m in batch]

    def _publish_add(self, before: int, ids: tuple[str, ...]) -> None:
        assert self.events is not None
        self.events.publish(
            AddEvent(agent=self.agent, before=before, after=len(self), message_ids=ids)
        )

    def _rebuild(
        self, keep: Callable[[int, Message], bool], *, mirror: bool = True
    ) -> list[Message]:
        """Replace the history by the messages ``keep`` accepts; returns the removed ones.

        ``mirror``: tell the sink first (``False``: it already knows). Call with the lock
        held.
        """
        removed: list[Message] = []
        kept: list[Message] = []
        initial = self._initial
        for pos, m in enumerate(self):
            if keep(pos, m):
                kept.append(m)
            else:
                removed.append(m)
                if pos < self._initial:
                    initial -= 1
        if not removed:
            return removed
        if mirror and self.sink is not None:
            self.sink.on_remove(self, removed)
        self._borrowed, self._starts, self._offset = [], [], 0
        self._own = _Segment.of(kept)  # a new segment: forks keep the old one
        self._total -= sum(count_message(self.counter, m) for m in removed)
        self._other_totals.clear()
        self._initial = initial
        self._summary = None
        self._generation += 1
        return removed

    def remove(self, *message_ids: str) -> list[Message]:
        """Remove messages by id; returns them.

        Raises:
            MessageNotFoundError: an id is not in the memory (nothing is removed).
        """
        with self._lock:
            missing = [i for i in message_ids if self._position(i) is None]
            if missing:
                raise MessageNotFoundError(f"no message with id {missing[0]!r} in this memory")
            return self._remove(set(message_ids), mirror=True)

    def evict(self, message_ids: Iterable[str]) -> list[Message]:
        """Drop messages that were already removed where the sink mirrors to; returns them.

        What a sink's ``on_append`` returns is dropped this way after the append (e.g. the
        messages a retention rule evicted, which a store sink deleted in the same
        transaction). The sink is not called; ids not in the memory are ignored; a
        ``remove`` event is published as by :meth:`remove`.

        Example:
            >>> mem = ConversationMemory([Message.user("old"), Message.user("new")])
            >>> [m.text for m in mem.evict([mem[0].message_id, "gone already"])]
            ['old']
            >>> [m.text for m in mem]
            ['new']
        """
        if isinstance(message_ids, str):
            raise TypeError("message_ids must be an iterable of ids, not a single str")
        targets = set(message_ids)
        with self._lock:
            return self._remove(targets, mirror=False) if targets else []

    def _remove(self, targets: set[str], *, mirror: bool) -> list[Message]:
        """Remove the messages whose id is in ``targets``; publish it (lock held)."""
        before = len(self)
        removed = self._rebuild(lambda _pos, m: m.message_id not in targets, mirror=mirror)
        if self.events is not None and removed:
            self.events.publish(
                RemoveEvent(
                    agent=self.agent,
                    before=before,
                    after=len(self),
                    message_ids=tuple(m.message_id for m in removed),
                )
            )
        return removed

    def clear(self, *, keep_system: bool = False) -> None:
        """Remove every message (``keep_system``: keep the system messages)."""
        with self._lock:
            before = len(self)
            if keep_system:
                self._rebuild(lambda _pos, m: m.role == "system")
            else:
                if self.sink is not None:
                    self.sink.on_clear(self)
                self._borrowed, self._starts, self._offset = [], [], 0
                self._own, self._total, self._initial, self._summary = _Segment(), 0, 0, None
                self._other_totals.clear()
                self._generation += 1
            if self.events is not None:
                self.events.publish(ClearEvent(agent=self.agent, before=before, after=len(self)))

    def _init_fork(
        self,
        view: _View,
        total: int,
        other_totals: dict[Hashable, list[Any]],
        summary: SummaryState | None,
    ) -> None:
        """Set up a memory made by :meth:`fork` (``self``): it borrows ``view``'s segments."""
        self._lock = threading.RLock()
        self._generation = 0
        self._borrowed = view.segments
        self._starts = view.starts
        self._own = _Segment()
        self._offset = len(view)
        self._total = total
        self._other_totals = other_totals
        self._summary = summary
        self._initial = len(view)

    def fork(self, *, agent: str | None = None) -> ConversationMemory:
        """A child memory that shares this history without copying it (copy-on-write).

        The child sees everything up to now; what either side adds or removes afterwards
        is invisible to the other. The child's ``appended()`` starts empty.

        Example:
            >>> parent = ConversationMemory([Message.user("shared")])
            >>> child = parent.fork()
            >>> _ = child.add(Message.user("child only"))
            >>> len(parent), len(child)
            (1, 2)
        """
        child = ConversationMemory.__new__(ConversationMemory)
        child.policy, child.counter, child.summarizer = self.policy, self.counter, self.summarizer
        child.strict_tools, child.events = self.strict_tools, self.events
        child.sink = None
        child.agent = agent if agent is not None else self.agent
        with self._lock:
            view = self._view()  # the child borrows every segment up to its length now
            other_totals = {k: list(v) for k, v in self._other_totals.items()}
            child._init_fork(view, self._total, other_totals, self._summary)  # noqa: SLF001 (same class)
            if self.events is not None:
                self.events.publish(
                    ForkEvent(
                        agent=self.agent, before=len(view), after=len(view), child=child.agent
                    )
                )
        return child

    # ------------------------------------------------------------------ reading
    def read(self) -> list[Message]:
        """All messages, oldest first: the initial history and what was appended."""
        with self._lock:
            view = self._view()
        return view.messages()

    def appended(self) -> list[Message]:
        """Only the messages added after construction (or after the fork)."""
        with self._lock:
            initial, view = self._initial, self._view()
        return view.messages()[initial:] if initial else view.messages()

    def get(self, message_id: str) -> Message | None:
        """The message with this id, or ``None``."""
        with self._lock:
            pos = self._position(message_id)
            return None if pos is None else self[pos]

    def get_recent(self, n: int) -> list[Message]:
        """The ``n`` newest messages, oldest first."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        with self._lock:
            view = self._view()
        size = len(view)
        return [view[p] for p in range(max(0, size - n), size)]

    def filter(
        self,
        *,
        role: str | Collection[str] | None = None,
        since: datetime | None = None,
        predicate: Callable[[Message], bool] | None = None,
    ) -> list[Message]:
        """Messages matching all the given conditions (role(s), at or after ``since``)."""
        roles = {role} if isinstance(role, str) else set(role) if role is not None else None
        if since is not None and since.tzinfo is None:
            raise ValueError("since must be timezone-aware (e.g. datetime.now(UTC))")
        return [
            m
            for m in self
            if (roles is None or m.role in roles)
            and (since is None or m.timestamp >= since)
            and (predicate is None or predicate(m))
        ]

    @property
    def total_tokens(self) -> int:
        """Tokens of the whole history by this memory's counter (kept incrementally)."""
        return self._total

    def to_llm_format(self, provider: Provider = "openai") -> Any:
        """The whole history in a provider's format (see ``messages.to_llm_format``)."""
        return to_llm_format(self, provider)

    # ------------------------------------------------------------------ context
    def _resolve(
        self, policy: ContextPolicy | None, counter: TokenCounter | None
    ) -> tuple[ContextPolicy, TokenCounter]:
        policy = policy or self.policy
        if counter is None:
            counter = get_counter(policy.token_counter) if policy.token_counter else self.counter
        return policy, counter

    def _history_tokens(self, counter: TokenCounter) -> int:
        """History tokens by ``counter``: kept incrementally once a counter has been used."""
        key = counter.cache_key
        if key == self.counter.cache_key:
            return self._total
        entry = self._other_totals.get(key)
        if entry is None:  # first window with this counter: one scan, then incremental
            entry = self._other_totals[key] = [
                counter,
                sum(count_message(counter, m) for m in self),
            ]
        total: int = entry[1]
        return total

    def _begin(self, counter: TokenCounter) -> tuple[_View, SummaryState | None, int, int]:
        """What a window is built from, taken at one moment: view, summary, tokens."""
        with self._lock:
            tokens = self._history_tokens(counter)  # may run a counter: before the snapshot
            return self._view(), self._summary, tokens, self._generation

    def _after_window(self, built: WindowBuild, view: _View, generation: int) -> ContextWindow:
        with self._lock:
            return self._apply_window(built, view, generation)

    def _apply_window(self, built: WindowBuild, view: _View, generation: int) -> ContextWindow:
        """Cache the summary / delete what trim_oldest dropped (with the lock held).

        The window was built on ``view``; other threads may have added messages since
        (kept: they are newer than the window) or removed some (then the positions moved,
        and what to delete is found by id).
        """
        win = built.window
        policy_strategy = win.strategy
        unchanged = generation == self._generation  # nothing removed since the view
        if policy_strategy == "summarize" and built.summarized and unchanged:
            self._summary = built.state
        if policy_strategy == "trim_oldest" and win.dropped:
            keep = set(built.kept)
            size = len(view)
            before, tokens_before = len(self), self._total
            if unchanged:  # the view is a prefix of the history: positions still hold
                removed = self._rebuild(lambda pos, _m: pos in keep or pos >= size)
            else:
                drop = {m.message_id for pos, m in enumerate(view) if pos not in keep}
                removed = self._rebuild(lambda _pos, m: m.message_id not in drop)
            if self.events is not None:
                self.events.publish(
                    TrimEvent(
                        agent=self.agent,
                        before=before,
                        after=len(self),
                        strategy=policy_strategy,
                        tokens_before=tokens_before,
                        tokens_after=self._total,
                        message_ids=tuple(m.message_id for m in removed),
                    )
                )
            return ContextWindow(
                messages=win.messages,
                tokens=win.tokens,
                dropped=win.dropped,
                summary=None,
                strategy=win.strategy,
                history_messages=win.history_messages,
                history_tokens=win.history_tokens,
                dropped_ids=tuple(m.message_id for m in removed),
            )
        if self.events is not None:
            if win.summarized:
                self.events.publish(
                    SummarizeEvent(
                        agent=self.agent,
                        before=win.history_messages,
                        after=len(win),
                        strategy=policy_strategy,
                        summarized=win.summarized,
                        tokens_before=win.history_tokens,
                        tokens_after=win.tokens,
                    )
                )
            if self.events.wants("window"):
                self.events.publish(
                    WindowEvent(
                        agent=self.agent,
                        before=win.history_messages,
                        after=len(win),
                        strategy=policy_strategy,
                        tokens_before=win.history_tokens,
                        tokens_after=win.tokens,
                    )
                )
        return win

    def context(
        self,
        policy: ContextPolicy | None = None,
        *,
        counter: TokenCounter | None = None,
        summarizer: Summarizer | None = None,
    ) -> ContextWindow:
        """The window this agent would send under ``policy`` (default: the memory's).

        ``trim_oldest`` deletes what falls out of the window from this memory;
        ``summarize`` caches the summary and extends it on later calls.

        Raises:
            ContextOverflowError: what must be kept does not fit (memory unchanged).
            SummarizerError: the summariser failed or is async (use :meth:`acontext`).
        """
        policy, counter = self._resolve(policy, counter)
        view, state, tokens, generation = self._begin(counter)
        built = build_window(
            view,
            policy,
            counter=counter,
            summarizer=summarizer or self.summarizer,
            state=state,
            history_tokens=tokens,
        )
        return self._after_window(built, view, generation)

    async def acontext(
        self,
        policy: ContextPolicy | None = None,
        *,
        counter: TokenCounter | None = None,
        summarizer: Summarizer | None = None,
    ) -> ContextWindow:
        """Async twin of :meth:`context`; the summariser may be sync or async."""
        policy, counter = self._resolve(policy, counter)
        view, state, tokens, generation = self._begin(counter)
        built = await abuild_window(
            view,
            policy,
            counter=counter,
            summarizer=summarizer or self.summarizer,
            state=state,
            history_tokens=tokens,
        )
        return self._after_window(built, view, generation)

    def __html_view__(self, *, max_rows: int = MAX_ROWS, max_chars: int = MAX_CHARS) -> str:
        """This memory as a bounded HTML table (:class:`~marsys_mem.display.HtmlViewable`).

        One consistent snapshot of the history, of which only the rows shown are read.
        """
        with self._lock:
            view, initial, tokens = self._view(), self._initial, self._total
        return memory_html(
            MemoryView(
                messages=view,
                agent=self.agent,
                appended=len(view) - initial,
                tokens=tokens,
                policy=self.policy,
                count=functools.partial(count_message, self.counter),
            ),
            max_rows=max_rows,
            max_chars=max_chars,
        )

    def _repr_html_(self) -> str:
        return self.__html_view__()

    def __repr__(self) -> str:
        label = f"agent={self.agent!r}, " if self.agent else ""
        return (
            f"ConversationMemory({label}messages={len(self)}, appended={len(self) - self._initial}"
            f", tokens={self._total})"
        )
