"""Conformance: several processes share one store (:attr:`Capability.MULTI_PROCESS`).

Optional: an in-process backend declares it unsupported, with the reason, in
:attr:`~marsys_mem.testing.conformance.harness.StoreHarness.unsupported`. Clauses of
:mod:`marsys_mem.store.base`: ``batch`` executes ops "in one transaction"; "Within a key,
messages keep the order they were appended in" (here: whichever process appends them).
"""

from __future__ import annotations

import time

from marsys_mem.testing.conformance.data import message_ids
from marsys_mem.testing.conformance.harness import Capability, StoreHarness
from marsys_mem.testing.conformance.writer import PER_BATCH, SHARED_KEY, WriterProcess, own_key

__all__ = ["MultiProcessConformance"]


class MultiProcessConformance(StoreHarness):
    """Writers in several processes, and a reader in this one, share one store.

    Uses :attr:`~StoreHarness.store_factory` in every process; skipped, with the reason,
    when the backend declares :attr:`Capability.MULTI_PROCESS` unsupported.

    Example:
        >>> class TestInProcess(MultiProcessConformance):
        ...     unsupported = {Capability.MULTI_PROCESS: "one process only"}
        >>> TestInProcess.capability_report()[Capability.MULTI_PROCESS]
        'unsupported: one process only'
    """

    def test_processes_writing_one_store(self, store_location: str) -> None:
        """``batch``: one transaction, seen whole by every process.

        Checks: three processes append batches (to their own key and a shared key, in
        one transaction) while this process reads: every acknowledged message is kept
        once, each process's messages keep its order, each batch's messages are
        adjacent in the shared key, and the reader never sees half a batch.
        """
        self.require(Capability.MULTI_PROCESS)
        writers, rounds = 3, 15
        reader = self.open_store(store_location)  # created before the children open it
        children: list[WriterProcess] = []
        try:
            ref = self.factory_reference()
            children = [WriterProcess(ref, store_location, f"w{w}", rounds) for w in range(writers)]
            for child in children:
                child.wait_ready()
            for child in children:
                child.go()
            seen: list[int] = []
            while any(c.process.poll() is None for c in children):
                seen.append(reader.count_messages(SHARED_KEY))
                time.sleep(0.002)  # sample; leave the CPU to the writers
            acked = {c.writer: c.acknowledged() for c in children}
            shared = message_ids(reader.load_messages(SHARED_KEY))
        finally:
            for child in children:
                child.kill()
            reader.close()
        total = writers * rounds * PER_BATCH
        assert len(shared) == len(set(shared)) == total
        assert all(n % PER_BATCH == 0 for n in seen), "a reader saw half a batch"
        assert seen == sorted(seen)
        with self.open_store(store_location) as again:
            for name, ids in acked.items():
                assert len(ids) == rounds * PER_BATCH
                assert message_ids(again.load_messages(own_key(name))) == ids
                assert [i for i in shared if i.startswith(f"{name}-")] == ids
        for start in range(0, total, PER_BATCH):  # each batch adjacent in the shared key
            prefixes = {i.rsplit("-", 1)[0] for i in shared[start : start + PER_BATCH]}
            assert len(prefixes) == 1, shared[start : start + PER_BATCH]
