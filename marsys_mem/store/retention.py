"""The retention rule: what ``ttl`` and ``max_messages`` delete, and in which order.

This module is the ONE statement of the rule. :class:`~marsys_mem.store.memory.InMemoryStore`
evaluates it here, :class:`~marsys_mem.store.sqlite.SQLiteStore` runs it as SQL built from
:func:`ttl_cutoff` and :data:`EVICTION_ORDER` (a test runs the same cases through both and
compares), and :class:`~marsys_mem.manager.MemoryManager` applies it to the memories it keeps
in process.

The rule, for one key's messages in append order (oldest first):

1. **ttl.** The cutoff is ``now - ttl`` (:func:`ttl_cutoff`; ``None`` when that reaches
   before year 1: then nothing is that old). A message expires when it is not protected
   and its timestamp is before the cutoff (:func:`is_expired`). Protected messages
   (system, pinned, ``metadata={"preserve": True}``: :attr:`Message.is_protected`) never
   expire.
2. **max_messages.** If more than ``max_messages`` remain, the excess is deleted in
   :data:`EVICTION_ORDER`: the oldest unprotected messages first, then, only if that is
   not enough, the oldest protected ones (:func:`evict_order`).

A tool call and its results are not kept together by the rule (a store does not know
the pairs); a context window built from what remains never starts with an orphan tool
result.

Example:
    >>> from datetime import UTC, datetime, timedelta
    >>> from marsys_mem.model.messages import Message
    >>> now = datetime(2025, 1, 2, tzinfo=UTC)
    >>> old = now - timedelta(days=3)
    >>> msgs = [Message.system("rules", timestamp=old), Message.user("stale", timestamp=old),
    ...         Message.user("a"), Message.user("b"), Message.user("c")]
    >>> drop = evicted(msgs, now=now, ttl=timedelta(days=1), max_messages=3)
    >>> [msgs[i].text for i in drop]
    ['stale', 'a']
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from marsys_mem.model.messages import Message

__all__ = ["EVICTION_ORDER", "evict_order", "evicted", "is_expired", "over_bound", "ttl_cutoff"]

EVICTION_ORDER: tuple[bool, ...] = (False, True)
"""The order in which a bound evicts, by :attr:`Message.is_protected`: unprotected
messages first, then protected ones; within each class the oldest first (append order)."""


def ttl_cutoff(now: datetime, ttl: timedelta | None) -> datetime | None:
    """The instant before which unprotected messages expire, or ``None`` (none expire).

    ``None`` when there is no ``ttl``, or when ``now - ttl`` reaches before year 1
    (``OverflowError``): nothing is that old.

    Example:
        >>> from datetime import UTC, datetime, timedelta
        >>> ttl_cutoff(datetime(2025, 1, 2, tzinfo=UTC), timedelta(days=1)).day
        1
        >>> ttl_cutoff(datetime(2025, 1, 2, tzinfo=UTC), timedelta.max) is None
        True
    """
    if ttl is None:
        return None
    try:
        return now - ttl
    except OverflowError:  # a ttl reaching before year 1: nothing is that old
        return None


def is_expired(message: Message, cutoff: datetime | None) -> bool:
    """Whether the ttl deletes ``message``: unprotected and older than ``cutoff``."""
    return cutoff is not None and not message.is_protected and message.timestamp < cutoff


def over_bound(count: int, max_messages: int | None) -> bool:
    """Whether ``count`` messages exceed ``max_messages`` (``None``: no bound). O(1)."""
    return max_messages is not None and count > max_messages


def evict_order(messages: Sequence[Message], count: int) -> list[int]:
    """Positions of the first ``count`` messages the bound evicts, in eviction order.

    By :data:`EVICTION_ORDER`: the oldest unprotected first, then the oldest protected.
    Costs O(positions scanned): it stops once ``count`` are found.
    """
    drop: list[int] = []
    if count <= 0:
        return drop
    for protected in EVICTION_ORDER:
        for i, m in enumerate(messages):
            if m.is_protected == protected:
                drop.append(i)
                if len(drop) >= count:
                    return drop
    return drop


def evicted(
    messages: Sequence[Message],
    *,
    now: datetime,
    ttl: timedelta | None = None,
    max_messages: int | None = None,
    headroom: int = 0,
) -> list[int]:
    """Positions (ascending) of the messages the rule deletes from ``messages``.

    Args:
        messages: one key's messages, oldest first.
        now: the current instant (timezone-aware).
        ttl: delete unprotected messages older than ``now - ttl`` (``None``: no ttl).
        max_messages: then keep at most this many (``None``: no bound).
        headroom: once over the bound, evict this many more by the same order (a memory
            that trims in chunks, so that trimming costs O(1) amortised per append).

    Returns:
        The positions to delete, ascending. Within the bound and with no ttl: ``[]`` in
        O(1).
    """
    cutoff = ttl_cutoff(now, ttl)
    if cutoff is None and not over_bound(len(messages), max_messages):
        return []
    expired = [i for i, m in enumerate(messages) if is_expired(m, cutoff)]
    if max_messages is None or len(messages) - len(expired) <= max_messages:
        return expired
    if not expired:
        excess = min(len(messages) - max_messages + max(headroom, 0), len(messages))
        return sorted(evict_order(messages, excess))
    gone = set(expired)
    left = [i for i in range(len(messages)) if i not in gone]
    kept = [messages[i] for i in left]
    excess = min(len(kept) - max_messages + max(headroom, 0), len(kept))
    return sorted([*expired, *(left[i] for i in evict_order(kept, excess))])
