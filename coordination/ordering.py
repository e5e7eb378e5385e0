"""Per-sender ordering: release sequenced items once each, in each sender's order, and repair gaps.

:class:`SenderOrdering` turns a transport that may reorder, repeat or (when a broker
crashes) lose items into exactly-once, in-order delivery per sender: early items are
buffered, missing ranges are asked of the sender, a gap open past ``gap_timeout`` is
skipped (its items still released if they come), and memory stays bounded whatever
arrives.

Guide: ``docs/guides/coordination.md#ordering-and-gap-repair``.
"""

from __future__ import annotations

import asyncio
import logging
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["SenderOrdering"]

log = logging.getLogger("marsys_mem.coordination")

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")

_MAX_RANGES = 4_096  # most remembered ranges per sender, per kind (skipped / pre-start)
_MAX_REQUEST = 64  # most seq ranges in one resend request


class _SeqRanges:
    """A set of ints kept as sorted, disjoint, non-touching half-open ranges ``[start, end)``.

    Memory follows the number of ranges, not of ints: a skipped gap of a million ``seq``
    numbers is one range.
    """

    __slots__ = ("ends", "starts")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def __len__(self) -> int:
        """The number of ranges."""
        return len(self.starts)

    def __contains__(self, x: object) -> bool:
        if not isinstance(x, int):
            return False
        i = bisect_right(self.starts, x) - 1
        return i >= 0 and x < self.ends[i]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return zip(self.starts, self.ends, strict=True)

    def add(self, start: int, end: int) -> None:
        """Add ``[start, end)``, merging with the ranges it overlaps or touches."""
        if start >= end:
            return
        starts, ends = self.starts, self.ends
        i = bisect_left(ends, start)  # first range ending at or after start
        j = bisect_right(starts, end)  # first range starting after end
        if i < j:
            start = min(start, starts[i])
            end = max(end, ends[j - 1])
        starts[i:j] = [start]
        ends[i:j] = [end]

    def remove(self, start: int, end: int) -> None:
        """Remove ``[start, end)`` (splitting a range it falls inside)."""
        if start >= end:
            return
        starts, ends = self.starts, self.ends
        i = bisect_right(ends, start)  # first range ending after start
        j = bisect_left(starts, end)  # first range starting at or after end
        if i >= j:
            return
        new_starts, new_ends = [], []
        if starts[i] < start:
            new_starts.append(starts[i])
            new_ends.append(start)
        if ends[j - 1] > end:
            new_starts.append(end)
            new_ends.append(ends[j - 1])
        starts[i:j] = new_starts
        ends[i:j] = new_ends

    def discard(self, x: int) -> bool:
        """Remove ``x``; True if it was there."""
        if x not in self:
            return False
        self.remove(x, x + 1)
        return True

    def complement(self, start: int, end: int) -> list[tuple[int, int]]:
        """The ranges of ``[start, end)`` that are not in the set."""
        out: list[tuple[int, int]] = []
        starts, ends = self.starts, self.ends
        cur = start
        i = bisect_right(ends, start)
        while i < len(starts) and starts[i] < end:
            if starts[i] > cur:
                out.append((cur, starts[i]))
            cur = max(cur, ends[i])
            i += 1
        if cur < end:
            out.append((cur, end))
        return out

    def pop_first(self) -> None:
        """Forget the lowest range."""
        del self.starts[0]
        del self.ends[0]


@dataclass(slots=True, eq=False)
class _Stream(Generic[K, T]):
    """Ordering state of one sender.

    ``expected``: the next ``seq`` to release in order; ``base``: where this receiver's
    view of the sequence starts (lower ``seq`` numbers are pre-start); ``high``: the
    highest ``seq`` the sender announced; ``buffer``: early items; ``missing``: skipped
    or announced ``seq`` numbers in ``[base, expected)`` that never arrived (released if
    they do); ``pre_seen``: pre-start ``seq`` numbers already released; ``gap_since``:
    when the open gap opened (loop time); ``repair_until``: ``missing`` is asked for
    until then; ``asks`` / ``asked_at``: asks made without progress since ``expected``
    was ``asked_at`` (they space out the next ask).
    """

    key: K
    expected: int
    base: int
    high: int
    buffer: dict[int, T] = field(default_factory=dict)
    missing: _SeqRanges = field(default_factory=_SeqRanges)
    pre_seen: _SeqRanges = field(default_factory=_SeqRanges)
    timer: asyncio.TimerHandle | None = None
    gap_since: float | None = None
    repair_until: float = 0.0
    asks: int = 0
    asked_at: int = 0


def _loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # no loop (e.g. a doctest): gaps wait for max_pending
        return None


class SenderOrdering(Generic[K, T]):
    """Releases ``(sender, seq, item)`` triples exactly once each, in each sender's order.

    Args:
        release: called with each item when its turn comes (must not raise; the caller
            guards its own errors).
        gap_timeout: seconds a gap in a sender's sequence may stay open before the items
            after it are released anyway.
        max_pending: most early items buffered per sender before its gap is skipped.
        max_senders: most senders tracked at once (the least recently heard from is
            forgotten first).
        request: called with ``(sender, [(first, last), ...])`` (inclusive ``seq`` ranges,
            at most 64) to ask a sender to send again what did not arrive; ``None``: no
            repair, gaps only wait for ``gap_timeout``. Must not raise.
        resend_after: seconds a gap stays open before it is asked for, and between the
            first asks (doubling while nothing arrives, up to ``gap_timeout / 4``).
        max_buffered: most early items buffered over all senders (default
            ``4 * max_pending``); past it, the gap of the sender that overflowed is skipped.
        max_remembered: most ranges of skipped and pre-start ``seq`` numbers remembered
            over all senders (4,096 per sender and kind at most).

    Example:
        >>> out = []
        >>> order = SenderOrdering(out.append, gap_timeout=5.0, max_pending=100)
        >>> order.accept("a", 1, "first")
        >>> order.accept("a", 3, "third")   # early: buffered until 2 arrives
        >>> order.accept("a", 2, "second")
        >>> order.accept("a", 2, "second")  # a duplicate: dropped
        >>> out, order.duplicates
        (['first', 'second', 'third'], 1)
    """

    def __init__(
        self,
        release: Callable[[T], None],
        *,
        gap_timeout: float,
        max_pending: int,
        max_senders: int = 10_000,
        request: Callable[[K, list[tuple[int, int]]], None] | None = None,
        resend_after: float = 0.25,
        max_buffered: int | None = None,
        max_remembered: int = 100_000,
    ) -> None:
        if gap_timeout <= 0 or resend_after <= 0:
            raise ValueError("gap_timeout and resend_after must be > 0")
        if max_pending < 1 or max_senders < 1 or max_remembered < 1:
            raise ValueError("max_pending, max_senders and max_remembered must be >= 1")
        self._release = release
        self._request = request
        self.gap_timeout = gap_timeout
        self.resend_after = resend_after
        self.max_pending = max_pending
        self.max_senders = max_senders
        self.max_buffered = max(max_pending, max_buffered or 4 * max_pending)
        self.max_remembered = max_remembered
        self.duplicates = 0  # items dropped: released before
        self.gaps = 0  # gaps skipped (after gap_timeout or past a buffer limit)
        self.late = 0  # items released after their gap was skipped
        self.requests = 0  # resend requests made
        self.forgotten = 0  # remembered ranges dropped to stay within max_remembered
        self.evicted = 0  # senders forgotten to stay within max_senders
        self._buffered = 0
        self._remembered = 0
        self._senders: OrderedDict[K, _Stream[K, T]] = OrderedDict()

    @property
    def buffered(self) -> int:
        """Early items waiting for a gap to close, over all senders."""
        return self._buffered

    @property
    def remembered(self) -> int:
        """Ranges of skipped and pre-start ``seq`` numbers remembered, over all senders."""
        return self._remembered

    def __len__(self) -> int:
        """The number of senders tracked."""
        return len(self._senders)

    # ------------------------------------------------------------------ receiving
    def accept(self, sender: K, seq: int, item: T) -> None:
        """Release ``item`` now, later (after the items before it), or never (a duplicate)."""
        senders = self._senders
        state = senders.get(sender)
        if state is None:
            state = self._start(sender, seq)
        else:
            senders.move_to_end(sender)
        expected = state.expected
        if seq == expected:
            self._release(item)
            state.expected = expected + 1
            if state.buffer:
                self._drain(state)
            if state.gap_since is not None:
                self._update(state)
            return
        if seq < expected:
            if seq >= state.base:
                if self._take(state.missing, seq):
                    self.late += 1
                    self._release(item)  # late, after its gap was skipped
                else:
                    self.duplicates += 1
            elif seq in state.pre_seen:
                self.duplicates += 1
            else:
                self._remember(state.pre_seen, seq, seq + 1)
                self._release(item)  # sent before the first one this receiver saw
            return
        buffer = state.buffer
        if seq in buffer:
            self.duplicates += 1
            return
        buffer[seq] = item
        self._buffered += 1
        if len(buffer) > self.max_pending or self._buffered > self.max_buffered:
            self._skip_gap(state)
        elif state.timer is None or state.gap_since is None:
            self._update(state)

    def announce(self, sender: K, last: int) -> None:
        """``sender`` says it has sent every ``seq`` up to ``last``: ask for what is missing."""
        senders = self._senders
        state = senders.get(sender)
        if state is None:
            self._start(sender, last + 1)  # what comes next is this receiver's to get
            return
        senders.move_to_end(sender)
        if last + 1 < state.base:
            self._lower_base(state, last + 1)
        if last > state.high:
            state.high = last
            if last >= state.expected:
                self._update(state)

    # ------------------------------------------------------------------ state
    def _start(self, sender: K, seq: int) -> _Stream[K, T]:
        state: _Stream[K, T] = _Stream(sender, expected=seq, base=seq, high=seq - 1)
        senders = self._senders
        senders[sender] = state
        if len(senders) > self.max_senders:
            _, old = senders.popitem(last=False)
            self._evict(old)
        return state

    def _evict(self, state: _Stream[K, T]) -> None:
        """Forget a sender: its buffered items are released first (nothing is dropped)."""
        self.evicted += 1
        if state.timer is not None:
            state.timer.cancel()
            state.timer = None
        buffer = state.buffer
        if buffer:
            self.gaps += 1
            log.warning("forgetting sender %r (over max_senders): releasing %d early items",
                        state.key, len(buffer))
            for seq in sorted(buffer):
                self._release(buffer[seq])
            self._buffered -= len(buffer)
            buffer.clear()
        self._remembered -= len(state.missing) + len(state.pre_seen)

    def _remember(self, ranges: _SeqRanges, start: int, end: int) -> None:
        before = len(ranges)
        ranges.add(start, end)
        self._remembered += len(ranges) - before
        self._trim(ranges)

    def _take(self, ranges: _SeqRanges, seq: int) -> bool:
        before = len(ranges)
        if not ranges.discard(seq):
            return False
        self._remembered += len(ranges) - before
        self._trim(ranges)
        return True

    def _trim(self, ranges: _SeqRanges) -> None:
        while ranges and (len(ranges) > _MAX_RANGES or self._remembered > self.max_remembered):
            ranges.pop_first()
            self._remembered -= 1
            self.forgotten += 1

    def _lower_base(self, state: _Stream[K, T], base: int) -> None:
        """The sequence started before this receiver's first item: ask for that part too."""
        old = state.base
        wanted = state.pre_seen.complement(base, old)
        before = len(state.pre_seen)
        state.pre_seen.remove(base, old)  # now below ``expected``, not missing: released
        self._remembered += len(state.pre_seen) - before
        state.base = base
        for start, end in wanted:
            self._remember(state.missing, start, end)
        loop = _loop()
        if wanted and loop is not None and self._request is not None:
            state.repair_until = loop.time() + self.gap_timeout
            self._schedule(state, loop)

    def _drain(self, state: _Stream[K, T]) -> None:
        buffer = state.buffer
        expected = state.expected
        start = expected
        while expected in buffer:
            self._release(buffer.pop(expected))
            expected += 1
        state.expected = expected
        self._buffered -= expected - start

    def _gap_open(self, state: _Stream[K, T]) -> bool:
        return bool(state.buffer) or state.high >= state.expected

    def _update(self, state: _Stream[K, T]) -> None:
        """Note whether a gap is open now; keep its timer running while one is."""
        loop = _loop()
        if not self._gap_open(state):
            state.gap_since = None
            timer = state.timer
            if timer is not None and not (
                state.missing and loop is not None and loop.time() < state.repair_until
            ):
                timer.cancel()  # the next gap is asked for promptly, on a timer of its own
                state.timer = None
            return
        if loop is None:
            return
        if state.gap_since is None:
            state.gap_since = loop.time()
        self._schedule(state, loop)

    def _schedule(self, state: _Stream[K, T], loop: asyncio.AbstractEventLoop) -> None:
        if state.timer is not None:
            return
        now = loop.time()
        delay: float | None = None
        if state.gap_since is not None:
            delay = max(0.0, state.gap_since + self.gap_timeout - now)
            if self._request is not None:
                delay = min(delay, self._ask_interval(state))
        elif self._request is not None and state.missing and now < state.repair_until:
            delay = self._ask_interval(state)
        if delay is not None:
            state.timer = loop.call_later(delay, self._tick, state)

    def _ask_interval(self, state: _Stream[K, T]) -> float:
        """``resend_after``, doubled for each ask that brought nothing, up to gap_timeout/4."""
        if state.expected != state.asked_at:
            state.asks = 0  # progress since the last ask
        longest = max(self.resend_after, self.gap_timeout / 4)
        backoff: float = self.resend_after * (1 << min(state.asks, 16))
        return min(backoff, longest)

    def _tick(self, state: _Stream[K, T]) -> None:
        state.timer = None
        if self._senders.get(state.key) is not state:
            return  # forgotten meanwhile
        loop = asyncio.get_running_loop()
        now = loop.time()
        if state.gap_since is not None and now >= state.gap_since + self.gap_timeout:
            self._skip_gap(state)
        if self._request is not None:
            wanted = self._wanted(state, now)
            if wanted:
                self.requests += 1
                if state.expected != state.asked_at:
                    state.asks = 0
                state.asks += 1
                state.asked_at = state.expected
                self._request(state.key, wanted)
        if state.timer is None:
            self._schedule(state, loop)

    def _wanted(self, state: _Stream[K, T], now: float) -> list[tuple[int, int]]:
        """The ``seq`` ranges (inclusive) of the open gap, and of ``missing`` while repairing."""
        out: list[tuple[int, int]] = []
        if state.gap_since is not None:
            nxt = state.expected
            for seq in sorted(state.buffer):
                if seq > nxt:
                    out.append((nxt, seq - 1))
                    if len(out) == _MAX_REQUEST:
                        return out
                nxt = seq + 1
            if state.high >= nxt:
                out.append((nxt, state.high))
        if state.missing and now < state.repair_until:
            for start, end in state.missing:
                if len(out) == _MAX_REQUEST:
                    break
                out.append((start, end - 1))
        return out

    def _skip_gap(self, state: _Stream[K, T]) -> None:
        """Give up on the open gap: release what follows it, remember it as missing."""
        if state.buffer:
            first = min(state.buffer)
        elif state.high >= state.expected:
            first = state.high + 1
        else:
            return
        gap = (state.expected, first - 1)
        self._remember(state.missing, state.expected, first)
        state.expected = first
        self._drain(state)
        self.gaps += 1
        log.warning(
            "facts %d..%d from %r did not arrive within %.1fs: delivering the later ones",
            gap[0],
            gap[1],
            state.key,
            self.gap_timeout,
        )
        state.gap_since = None
        loop = _loop()
        if loop is not None and self._request is not None:
            state.repair_until = loop.time() + self.gap_timeout  # still worth asking for
            state.asks = 0
        self._update(state)  # a further gap gets its own gap_timeout
        if state.timer is None and loop is not None:
            self._schedule(state, loop)

    def close(self) -> None:
        """Cancel the timers (buffered items stay buffered)."""
        for state in self._senders.values():
            if state.timer is not None:
                state.timer.cancel()
                state.timer = None
