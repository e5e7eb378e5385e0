"""Per-sender ordering: release sequenced items once each, in each sender's order.

A transport may deliver out of order (a reconnect replays what was not acknowledged) and
more than once (QoS 1). :class:`SenderOrdering` turns that into exactly-once, in-order
delivery per sender, with bounded memory and without waiting forever:

* An item whose ``seq`` is the next one expected from its sender is released at once,
  followed by any buffered items that now follow on.
* An early item is buffered. A gap that stays open ``gap_timeout`` seconds (or a buffer
  past ``max_pending`` items) is skipped: the buffered items are released, and the items
  of the gap are still released if they turn up later (``gaps`` counts the skips).
* A ``seq`` already released is a duplicate: dropped and counted in ``duplicates``.
* The first item seen from a sender starts its sequence; items numbered before it (sent
  before this receiver started listening) are released once each as they come.

Timers need a running event loop; everything else is plain synchronous code, called from
the loop that receives the items.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["SenderOrdering"]

log = logging.getLogger("marsys_mem.coordination")

T = TypeVar("T")

_MAX_REMEMBERED = 100_000  # most skipped / pre-start seqs remembered per sender


@dataclass
class _Sender(Generic[T]):
    """Ordering state of one sender: next expected seq, early arrivals, skipped seqs."""

    expected: int
    base: int
    buffer: dict[int, T] = field(default_factory=dict)
    missing: set[int] = field(default_factory=set)
    pre_seen: set[int] = field(default_factory=set)
    timer: asyncio.TimerHandle | None = None


class SenderOrdering(Generic[T]):
    """Releases ``(sender, seq, item)`` triples exactly once each, in each sender's order.

    Args:
        release: called with each item when its turn comes (must not raise; the caller
            guards its own errors).
        gap_timeout: seconds a gap in a sender's sequence may stay open before the items
            after it are released anyway.
        max_pending: most early items buffered per sender before its gap is skipped.
        max_senders: most senders tracked at once (the least recently started is
            forgotten first).

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
    ) -> None:
        self._release = release
        self.gap_timeout = gap_timeout
        self.max_pending = max_pending
        self.max_senders = max_senders
        self.duplicates = 0
        self.gaps = 0
        self._senders: OrderedDict[str, _Sender[T]] = OrderedDict()

    def accept(self, sender: str, seq: int, item: T) -> None:
        """Release ``item`` now, later (after the items before it), or never (a duplicate)."""
        state = self._senders.get(sender)
        if state is None:
            state = self._senders[sender] = _Sender(expected=seq, base=seq)
            if len(self._senders) > self.max_senders:
                _, old = self._senders.popitem(last=False)
                if old.timer is not None:
                    old.timer.cancel()
        if seq == state.expected:
            self._release(item)
            state.expected += 1
            if state.buffer:
                self._drain(state)
            return
        if seq < state.expected:
            if seq in state.missing:
                state.missing.discard(seq)
                self._release(item)  # late, after its gap was skipped
            elif seq < state.base and seq not in state.pre_seen:
                if len(state.pre_seen) < _MAX_REMEMBERED:
                    state.pre_seen.add(seq)
                self._release(item)  # sent before the first one this receiver saw
            else:
                self.duplicates += 1
            return
        if seq in state.buffer:
            self.duplicates += 1
            return
        state.buffer[seq] = item
        if len(state.buffer) > self.max_pending:
            self._skip_gap(sender)
        elif state.timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop (e.g. a doctest): the gap waits for max_pending
                return
            state.timer = loop.call_later(self.gap_timeout, self._skip_gap, sender)

    def _drain(self, state: _Sender[T]) -> None:
        buffer = state.buffer
        while state.expected in buffer:
            self._release(buffer.pop(state.expected))
            state.expected += 1
        if not buffer and state.timer is not None:
            state.timer.cancel()
            state.timer = None

    def _skip_gap(self, sender: str) -> None:
        state = self._senders.get(sender)
        if state is None:
            return
        if state.timer is not None:
            state.timer.cancel()
            state.timer = None
        if not state.buffer:
            return
        first = min(state.buffer)
        if first - state.expected <= _MAX_REMEMBERED:
            state.missing.update(range(state.expected, first))
        self.gaps += 1
        log.warning(
            "facts %d..%d from %s did not arrive within %.1fs: delivering the later ones",
            state.expected,
            first - 1,
            sender,
            self.gap_timeout,
        )
        state.expected = first
        self._drain(state)
        if state.buffer and state.timer is None:
            state.timer = asyncio.get_running_loop().call_later(
                self.gap_timeout, self._skip_gap, sender
            )

    def close(self) -> None:
        """Cancel the gap timers (buffered items stay buffered)."""
        for state in self._senders.values():
            if state.timer is not None:
                state.timer.cancel()
                state.timer = None
