"""Conformance: batches, one transaction each (:attr:`Capability.BATCHES`).

Clauses of :mod:`marsys_mem.store.base`: ``batch``: "Validate and execute ``ops`` in one
transaction; one result per op"; "If any operation fails, none of them takes effect (no
partial writes)"; "ValueError, TypeError: a malformed op (nothing executed)".
"""

from __future__ import annotations

import asyncio

import pytest

from marsys_mem.exceptions import ConflictError, DuplicateMessageError
from marsys_mem.model.messages import Message
from marsys_mem.store.base import (
    Append,
    CountMessages,
    Delete,
    EnforceRetention,
    ExpectLast,
    ListKeys,
    ListRuns,
    Load,
    LoadRun,
    MemoryStore,
    SaveRun,
)
from marsys_mem.testing.conformance.data import (
    KEY,
    OTHER_KEY,
    T0,
    THIRD_KEY,
    observable_state,
    snapshot_of,
    user_messages,
)
from marsys_mem.testing.conformance.harness import StoreHarness

__all__ = ["BatchesConformance"]


class BatchesConformance(StoreHarness):
    """``batch``: results in op order, later ops see earlier ones, all or nothing.

    Example:
        >>> import pytest
        >>> from marsys_mem.store import InMemoryStore
        >>> class TestBatches(BatchesConformance):
        ...     @pytest.fixture
        ...     def store(self):
        ...         with InMemoryStore() as s:
        ...             yield s
    """

    def test_batch_returns_one_result_per_op(self, store: MemoryStore) -> None:
        """``batch``: execute ``ops`` in one transaction; one result per op.

        Checks: every kind of op, results in op order; later ops see the earlier writes
        of the same batch.
        """
        msgs = user_messages(3)
        snap = snapshot_of("r1")
        results = store.batch(
            [
                Append(KEY, tuple(msgs)),
                Load(KEY, last=2),
                CountMessages(KEY),
                ListKeys(),
                Delete(KEY, ids=("m0",)),
                CountMessages(KEY),
                SaveRun(snap),
                LoadRun("r1"),
                ListRuns(),
                EnforceRetention(KEY, None, 1, T0),
                Load(KEY),
            ]
        )
        assert results == [None, msgs[1:], 3, [KEY], 1, 2, None, snap, ["r1"], 1, msgs[2:]]

    def test_expect_last(self, store: MemoryStore) -> None:
        """``ExpectLast``: the batch goes on only if the key's newest message is the one given.

        Checks: ``None`` holds for an empty key; the newest id holds (also as written
        earlier in the same batch); any other id fails with ``ConflictError`` naming the
        key, the id expected and the one found, and nothing of the batch is written; a
        malformed id is a ``ValueError``.
        """
        m0, m1, m2 = user_messages(3)
        assert store.batch([ExpectLast(KEY, None), Append(KEY, (m0,))]) == [None, None]
        assert store.batch([Append(KEY, (m1,)), ExpectLast(KEY, "m1")]) == [None, None]
        before = observable_state(store, [KEY, OTHER_KEY], [])
        for stale in ("m0", None, "nope"):
            with pytest.raises(ConflictError, match=r"'researcher'.*'m1'") as caught:
                store.batch(
                    [
                        Append(OTHER_KEY, tuple(user_messages(1, prefix="o"))),
                        ExpectLast(KEY, stale),
                        Append(KEY, (m2,)),
                    ]
                )
            assert (repr(stale) if stale else "no message") in str(caught.value)
            assert observable_state(store, [KEY, OTHER_KEY], []) == before
        with pytest.raises(ValueError, match="message_id"):
            store.batch([ExpectLast(KEY, "")])
        store.batch([ExpectLast(KEY, "m1"), Append(KEY, (m2,))])
        assert [m.message_id for m in store.load_messages(KEY)] == ["m0", "m1", "m2"]

    def test_empty_batch(self, store: MemoryStore) -> None:
        """``batch``: one result per op.

        Checks: an empty batch (sync and async) returns an empty list.
        """
        assert store.batch([]) == []
        assert asyncio.run(store.abatch([])) == []

    def test_failed_batch_leaves_store_unchanged(self, store: MemoryStore) -> None:
        """If any operation fails, none of them takes effect (no partial writes).

        Checks: a batch failing on its last op undoes every earlier op (appends to old
        and new keys, deletes, saved and replaced runs, retention); the store works after.
        """
        msgs = user_messages(4)
        other = user_messages(3, prefix="o")
        store.append_messages(KEY, msgs)
        store.append_messages(OTHER_KEY, other)
        store.save_run(snapshot_of("r1"))
        keys = [KEY, OTHER_KEY, THIRD_KEY]
        before = observable_state(store, keys, ["r1", "r2"])
        with pytest.raises(DuplicateMessageError):
            store.batch(
                [
                    Append(KEY, tuple(user_messages(2, prefix="n"))),
                    Append(THIRD_KEY, tuple(user_messages(2, prefix="t"))),
                    Delete(OTHER_KEY, ids=("o0",)),
                    Delete(KEY, before=msgs[2].timestamp),
                    SaveRun(snapshot_of("r2")),
                    SaveRun(snapshot_of("r1", agent="changed")),
                    EnforceRetention(None, None, 1, T0),
                    Append(OTHER_KEY, (Message.user("dup", message_id="o2"),)),
                ]
            )
        assert observable_state(store, keys, ["r1", "r2"]) == before
        store.append_messages(KEY, user_messages(1, prefix="after"))  # still works
        assert store.count_messages(KEY) == 5

    def test_conflicting_appends_in_one_batch(self, store: MemoryStore) -> None:
        """``batch``: DuplicateMessageError: an appended id is already stored under its key.

        Checks: two appends in one batch using the same id in one key fail the batch
        whole, the other key's append included.
        """
        with pytest.raises(DuplicateMessageError, match="x"):
            store.batch(
                [
                    Append(KEY, (Message.user("a", message_id="x"),)),
                    Append(OTHER_KEY, (Message.user("b", message_id="y"),)),
                    Append(
                        KEY, (Message.user("c", message_id="z"), Message.user("d", message_id="x"))
                    ),
                ]
            )
        assert store.list_keys() == []
        assert store.load_messages(KEY) == []

    def test_invalid_op_in_batch_executes_nothing(self, store: MemoryStore) -> None:
        """``batch``: ValueError, TypeError: a malformed op (nothing executed).

        Checks: a malformed op after a valid append rejects the batch before any op runs.
        """
        with pytest.raises(ValueError, match="key"):
            store.batch([Append(KEY, tuple(user_messages(2))), Load(("bad",), None, None)])  # type: ignore[arg-type]
        assert store.list_keys() == []
