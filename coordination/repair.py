"""The sender's side of gap repair: a bounded outbox that sends again on request, heartbeats.

A broker acknowledges a publish and can still lose it: killed before it saved or forwarded
it, it restarts without it (and without the sessions it had not saved, so a receiver that
reconnects late also misses what was published before it subscribed again). The
coordinators repair that end to end, over the namespace's control topic:

* the sender keeps its last ``max_size`` envelopes (at most ``max_bytes`` of them,
  :class:`Outbox`) and publishes them again when a receiver asks
  (:class:`~marsys_mem.coordination.envelope.ResendRequest`), each at most once per
  ``quiet`` seconds however many receivers ask;
* the sender publishes its high-water mark (the last ``seq`` it sent,
  :class:`~marsys_mem.coordination.envelope.HighWaterMark`) every ``interval`` seconds while
  it shares, backing off to ``max_interval`` when idle (:func:`heartbeats`), so a loss at
  the end of a stream, which no later envelope reveals, is noticed too;
* the receiver's :class:`~marsys_mem.coordination.ordering.SenderOrdering` asks for what a
  gap or a mark shows missing, every ``resend_after`` seconds until it arrives or the gap
  times out.

What it cannot repair: envelopes older than the sender's outbox. Those a broker held for a
receiver that was more than ``max_size`` envelopes behind when the broker crashed are
lost for it (the gap is skipped after ``gap_timeout`` and counted in ``stats["gaps"]``).
Keep ``max_outbox`` at least as large as the broker's per-client queue
(``max_queued_messages`` in mosquitto; its default is 1,000).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Iterable

__all__ = ["Outbox", "heartbeats"]

log = logging.getLogger("marsys_mem.coordination")

_BATCH = 256  # envelopes published again at once (the transport pipelines them)
_MAX_PER_REQUEST = 10_000  # most envelopes one request queues (the receiver asks again)

Publish = Callable[[str, bytes], Awaitable[None]]


class Outbox:
    """The last ``max_size`` envelopes one sender published, to publish again on request.

    Args:
        publish: ``await publish(topic, payload)`` (the transport's publish).
        max_size: envelopes kept (the oldest is dropped first).
        max_bytes: payload bytes kept (the oldest is dropped first; the newest is always
            kept).
        quiet: seconds during which an envelope just sent again is not sent again (many
            receivers asking for the same gap get one resend).

    Example:
        >>> import asyncio
        >>> sent = []
        >>> async def publish(topic, payload):
        ...     sent.append(payload)
        >>> async def demo():
        ...     outbox = Outbox(publish, max_size=2, quiet=0.1)
        ...     for seq in (1, 2, 3):
        ...         outbox.add(seq, "t", b"e%d" % seq)
        ...     queued = outbox.request([(1, 3)])  # 1 is no longer kept
        ...     await outbox.flush()
        ...     return queued, outbox.request([(2, 2)])  # just sent: quiet
        >>> asyncio.run(demo()), sent
        ((2, 0), [b'e2', b'e3'])
    """

    def __init__(
        self, publish: Publish, *, max_size: int, quiet: float, max_bytes: int = 64 * 2**20
    ) -> None:
        if max_size < 1 or max_bytes < 1 or quiet < 0:
            raise ValueError("max_size and max_bytes must be >= 1, quiet >= 0")
        self._publish = publish
        self.max_size = max_size
        self.max_bytes = max_bytes
        self.bytes = 0  # payload bytes kept
        self.quiet = quiet
        self.resent = 0  # envelopes published again
        self.failed = 0  # resends the transport refused
        # envelopes first .. first + len - 1 (a sender's seq numbers have no holes)
        self._first = 1
        self._payloads: deque[bytes] = deque()
        self._topics: deque[str] = deque()
        self._resent: dict[int, float] = {}  # loop time of the last resend, by seq
        self._pending: set[int] = set()
        self._worker: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._payloads)

    def _get(self, seq: int) -> tuple[str, bytes] | None:
        i = seq - self._first
        if 0 <= i < len(self._payloads):
            return self._topics[i], self._payloads[i]
        return None

    def add(self, seq: int, topic: str, payload: bytes) -> None:
        """Keep envelope ``seq`` (the next number after the last one kept)."""
        payloads, topics = self._payloads, self._topics
        if seq != self._first + len(payloads):  # not the next one: start over from it
            payloads.clear()
            topics.clear()
            self._resent.clear()
            self.bytes = 0
            self._first = seq
        payloads.append(payload)
        topics.append(topic)
        self.bytes += len(payload)
        while len(payloads) > self.max_size or (self.bytes > self.max_bytes and len(payloads) > 1):
            self.bytes -= len(payloads.popleft())
            topics.popleft()
            self._resent.pop(self._first, None)
            self._first += 1

    def request(self, ranges: Iterable[tuple[int, int]]) -> int:
        """Queue the kept envelopes in the inclusive ``ranges`` to be published again.

        Returns how many were queued (not kept, already queued, or sent again less than
        ``quiet`` seconds ago: not queued; at most 10,000, the lowest first: a receiver
        further behind asks again). Needs a running event loop.
        """
        if not self._payloads:
            return 0
        first, last = self._first, self._first + len(self._payloads) - 1
        resent = self._resent
        now = asyncio.get_running_loop().time()
        pending = self._pending
        queued = 0
        covered = -1  # ranges may overlap: each seq is looked at once
        for start, end in sorted(ranges):
            lo, hi = max(start, first, covered + 1), min(end, last)
            for seq in range(lo, hi + 1):
                if seq in pending or now - resent.get(seq, -math.inf) < self.quiet:
                    continue
                pending.add(seq)
                queued += 1
                if queued == _MAX_PER_REQUEST:
                    break
            covered = max(covered, hi)
            if queued == _MAX_PER_REQUEST:
                break
        if pending and (self._worker is None or self._worker.done()):
            self._worker = asyncio.get_running_loop().create_task(self._run(), name="resend")
        return queued

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        pending = self._pending
        while pending:
            batch = sorted(pending)[:_BATCH]
            pending.difference_update(batch)
            now = loop.time()
            sends = []
            for seq in batch:
                kept = self._get(seq)
                if kept is not None:
                    self._resent[seq] = now
                    sends.append(self._publish(*kept))
            results = await asyncio.gather(*sends, return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException):
                    self.failed += 1
                    if isinstance(result, asyncio.CancelledError):
                        raise result
                    log.warning("sending an envelope again failed: %s", result)
                else:
                    self.resent += 1

    async def flush(self) -> None:
        """Wait until what is queued has been published again."""
        while self._worker is not None and not self._worker.done():
            await asyncio.shield(self._worker)

    async def close(self) -> None:
        """Stop sending again (what is queued is dropped; the kept envelopes stay)."""
        worker, self._worker = self._worker, None
        self._pending.clear()
        if worker is not None and not worker.done():
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker


async def heartbeats(
    last_seq: Callable[[], int],
    send: Callable[[int], Awaitable[None]],
    *,
    interval: float,
    max_interval: float,
) -> None:
    """Publish the high-water mark every ``interval`` s while it grows, backing off when idle.

    ``last_seq()`` is the last ``seq`` sent; ``await send(seq)`` publishes the mark. Runs
    until cancelled; a mark that cannot be sent (the transport is down for good) is
    logged and tried again later.
    """
    delay = interval
    told = 0
    while True:
        await asyncio.sleep(delay)
        seq = last_seq()
        if seq == 0:
            continue  # nothing sent yet: nothing to lose
        delay = interval if seq != told else min(delay * 2, max_interval)
        try:
            await send(seq)
        except Exception as exc:  # e.g. TransportError: the next beat tries again
            log.debug("publishing the high-water mark failed: %s", exc)
            delay = max(delay, 1.0)
            continue
        told = seq
