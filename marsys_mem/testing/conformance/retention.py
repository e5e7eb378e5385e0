"""Conformance: retention, enforced by the store (:attr:`Capability.RETENTION`).

Clause of :mod:`marsys_mem.store.base`: "messages older than ``ttl`` (by their timestamp)
are deleted, then the oldest beyond ``max_messages`` per key. System and pinned messages
are exempt from ``ttl`` and are deleted last when over ``max_messages``"; a message with
``metadata["preserve"]`` is protected like a pinned one.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

from marsys_mem.model.messages import Message
from marsys_mem.store.base import Append, EnforceRetention, MemoryStore
from marsys_mem.testing.conformance.data import (
    KEY,
    OTHER_KEY,
    T0,
    THIRD_KEY,
    append_retention_messages,
    message_ids,
    user_messages,
)
from marsys_mem.testing.conformance.harness import StoreHarness

__all__ = ["RetentionConformance"]


class RetentionConformance(StoreHarness):
    """``enforce_retention``: ttl, ``max_messages``, protected messages, every key.

    Also the bound applied in the same batch as the append that exceeds it.

    Example:
        >>> import pytest
        >>> from marsys_mem.store import InMemoryStore
        >>> class TestRetention(RetentionConformance):
        ...     @pytest.fixture
        ...     def store(self):
        ...         with InMemoryStore() as s:
        ...             yield s
    """

    def test_retention_ttl_spares_protected(self, store: MemoryStore) -> None:
        """Messages older than ``ttl`` are deleted; system and pinned messages are exempt.

        Checks: with ``now=T0`` and a 4-day ttl, m1, m2 and m4 go; m0 (system), m3
        (pinned) and m5 (preserve) stay; m6, exactly at the cutoff, is not older and
        stays; enforcing again deletes nothing.
        """
        append_retention_messages(store)
        deleted = store.enforce_retention(KEY, ttl=timedelta(days=4), now=T0)
        assert deleted == 3  # m1, m2, m4
        assert message_ids(store.load_messages(KEY)) == ["m0", "m3", "m5", "m6", "m7", "m8", "m9"]
        assert store.enforce_retention(KEY, ttl=timedelta(days=4), now=T0) == 0

    def test_retention_ttl_default_now(self, store: MemoryStore) -> None:
        """``enforce_retention``: delete what ``ttl`` / ``max_messages`` do not allow.

        Checks: without ``now`` the current time is used.
        """
        old = Message.user("old", timestamp=datetime.now(UTC) - timedelta(days=2))
        new = Message.user("new")
        store.append_messages(KEY, [old, new])
        assert store.enforce_retention(KEY, ttl=timedelta(days=1)) == 1
        assert store.load_messages(KEY) == [new]

    def test_retention_max_messages_unprotected_first(self, store: MemoryStore) -> None:
        """Then the oldest beyond ``max_messages`` per key are deleted; protected ones last.

        Checks: over the bound the oldest unprotected go first, in append order.
        """
        append_retention_messages(store)
        assert store.enforce_retention(KEY, max_messages=5, now=T0) == 5
        assert message_ids(store.load_messages(KEY)) == ["m0", "m3", "m5", "m8", "m9"]

    def test_retention_max_messages_then_oldest_protected(self, store: MemoryStore) -> None:
        """System and pinned messages are deleted last when over ``max_messages``.

        Checks: when protected messages alone exceed the bound, the oldest protected go
        too, and the count is the bound.
        """
        append_retention_messages(store)
        assert store.enforce_retention(KEY, max_messages=2, now=T0) == 8
        assert message_ids(store.load_messages(KEY)) == ["m3", "m5"]
        assert store.count_messages(KEY) == 2

    def test_retention_ttl_then_max_messages(self, store: MemoryStore) -> None:
        """Messages older than ``ttl`` are deleted, then the oldest beyond ``max_messages``.

        Checks: both limits in one call, the ttl first.
        """
        append_retention_messages(store)
        deleted = store.enforce_retention(KEY, ttl=timedelta(days=4), max_messages=4, now=T0)
        assert deleted == 6
        assert message_ids(store.load_messages(KEY)) == ["m0", "m3", "m5", "m9"]

    def test_retention_all_keys(self, store: MemoryStore) -> None:
        """``EnforceRetention``: apply ``ttl`` / ``max_messages`` to ``key`` or to every key.

        Checks: with no key, retention applies to every key separately (the bound is
        per key).
        """
        append_retention_messages(store, KEY)
        append_retention_messages(store, OTHER_KEY)
        store.append_messages(THIRD_KEY, user_messages(2, start=T0 - timedelta(hours=1)))
        deleted = store.enforce_retention(ttl=timedelta(days=4), max_messages=5, now=T0)
        assert deleted == 2 * 5
        for key in (KEY, OTHER_KEY):
            assert message_ids(store.load_messages(key)) == ["m0", "m3", "m5", "m8", "m9"]
        assert store.count_messages(THIRD_KEY) == 2

    def test_retention_leaves_other_keys(self, store: MemoryStore) -> None:
        """``EnforceRetention``: apply ``ttl`` / ``max_messages`` to ``key``.

        Checks: retention for one key does not touch the others.
        """
        append_retention_messages(store, KEY)
        other = append_retention_messages(store, OTHER_KEY)
        store.enforce_retention(KEY, ttl=timedelta(days=1), max_messages=1, now=T0)
        assert store.count_messages(KEY) == 1
        assert store.load_messages(OTHER_KEY) == other

    def test_retention_without_limits_deletes_nothing(self, store: MemoryStore) -> None:
        """``enforce_retention``: delete what ``ttl`` / ``max_messages`` do not allow.

        Checks: no ttl and no max_messages (or limits nothing exceeds): 0 deleted.
        """
        msgs = append_retention_messages(store)
        assert store.enforce_retention(now=T0) == 0
        assert store.enforce_retention(KEY, max_messages=10, ttl=timedelta(days=11), now=T0) == 0
        assert store.load_messages(KEY) == msgs

    def test_bound_applied_in_the_appending_batch(self, store: MemoryStore) -> None:
        """``batch`` is one transaction: ``[Append, EnforceRetention]`` never exceeds N.

        Checks: writers in several threads append in such batches while a reader samples
        the count: no committed state a reader can see is over the bound, and what is
        left is the newest N, whoever appended them (the bound is counted by the store).
        """
        bound, per_batch, batches, threads = 7, 3, 25, 3
        seen: list[int] = []
        done = threading.Event()

        def write(t: int) -> None:
            for i in range(batches):
                msgs = tuple(user_messages(per_batch, prefix=f"t{t}-{i}-"))
                store.batch([Append(KEY, msgs), EnforceRetention(KEY, None, bound, T0)])

        def read() -> None:
            while not done.is_set():
                seen.append(store.count_messages(KEY))

        reader = threading.Thread(target=read)
        reader.start()
        writers = [threading.Thread(target=write, args=(t,)) for t in range(threads)]
        for w in writers:
            w.start()
        for w in writers:
            w.join()
        done.set()
        reader.join()
        assert seen
        assert max(seen) <= bound
        assert store.count_messages(KEY) == bound
        ids = message_ids(store.load_messages(KEY))
        assert [i.rsplit("-", 1)[1] for i in ids][-per_batch:] == ["0", "1", "2"]

    def test_bound_of_a_batch_larger_than_the_bound(self, store: MemoryStore) -> None:
        """The oldest beyond ``max_messages`` are deleted; protected ones last.

        Checks: appending more than N at once keeps that batch's newest N, the system
        message included; enforcing again deletes nothing.
        """
        store.append_messages(KEY, [Message.system("rules", message_id="s", timestamp=T0)])
        msgs = tuple(user_messages(20))
        results = store.batch([Append(KEY, msgs), EnforceRetention(KEY, None, 5, T0)])
        assert results == [None, 16]
        assert message_ids(store.load_messages(KEY)) == ["s", "m16", "m17", "m18", "m19"]
        assert store.count_messages(KEY) == 5
        assert store.enforce_retention(KEY, max_messages=5, now=T0) == 0
