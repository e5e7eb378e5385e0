"""Conformance: data outlives the store object and its process (:attr:`Capability.DURABILITY`).

Optional: an in-process backend declares it unsupported, with the reason, in
:attr:`~marsys_mem.testing.conformance.harness.StoreHarness.unsupported`. Clauses of
:mod:`marsys_mem.store.base`: ``MemoryStore`` is "Durable storage for messages and run
snapshots"; "``append_messages`` is durable when it returns".
"""

from __future__ import annotations

from marsys_mem.testing.conformance.data import (
    KEY,
    message_ids,
    observable_state,
    snapshot_of,
    user_messages,
)
from marsys_mem.testing.conformance.harness import Capability, StoreHarness
from marsys_mem.testing.conformance.writer import SHARED_KEY, WriterProcess, own_key

__all__ = ["DurabilityConformance"]


class DurabilityConformance(StoreHarness):
    """A store opened again (after ``close``, or after its writer exited) has the data.

    Uses :attr:`~StoreHarness.store_factory` to open the store at the ``store_location``
    fixture; skipped, with the reason, when the backend declares
    :attr:`Capability.DURABILITY` unsupported.

    Example:
        >>> from marsys_mem.store import SQLiteStore
        >>> class TestDurable(DurabilityConformance):
        ...     store_factory = SQLiteStore
        >>> TestDurable.capability_report()[Capability.DURABILITY]
        'required'
    """

    def test_data_survives_reopen(self, store_location: str) -> None:
        """``MemoryStore``: durable storage for messages and run snapshots.

        Checks: after ``close``, a store opened at the same location has the same keys,
        messages, counts and runs, and appends continue after the old messages.
        """
        self.require(Capability.DURABILITY)
        msgs = user_messages(5)
        with self.open_store(store_location) as first:
            first.append_messages(KEY, msgs)
            first.save_run(snapshot_of("r1"))
            first.save_run(snapshot_of("r2", parent_id="r1"))
            before = observable_state(first, [KEY], ["r1", "r2"])
        with self.open_store(store_location) as again:
            assert observable_state(again, [KEY], ["r1", "r2"]) == before
            assert again.load_messages(KEY) == msgs
            again.append_messages(KEY, user_messages(1, prefix="n"))
            assert message_ids(again.load_messages(KEY, last=2)) == ["m4", "n0"]

    def test_acknowledged_writes_survive_the_writer_process(self, store_location: str) -> None:
        """``append_messages`` is durable when it returns.

        Checks: a child process writes batches and exits without closing the store
        (:func:`os._exit`); every batch it saw return is there, whole and in order,
        when the store is opened again.
        """
        self.require(Capability.DURABILITY)
        self.open_store(store_location).close()  # created before the child opens it
        child = WriterProcess(self.factory_reference(), store_location, "w", 20, "exit")
        try:
            child.wait_ready()
            child.go()
            acked = child.acknowledged()
        finally:
            child.kill()
        assert len(acked) == 20 * 2
        with self.open_store(store_location) as again:
            assert message_ids(again.load_messages(own_key("w"))) == acked
            assert message_ids(again.load_messages(SHARED_KEY)) == acked
