"""Conformance: threads sharing one store instance (:attr:`Capability.CONCURRENCY`).

Clause of :mod:`marsys_mem.store.base`: "Within a key, messages keep the order they were
appended in", whichever thread appends them; a backend checks ``closed`` again "under its
own lock", so one instance is shared by threads.
"""

from __future__ import annotations

import threading

from marsys_mem.exceptions import ConflictError
from marsys_mem.model.messages import Message
from marsys_mem.store.base import Append, ExpectLast, Load, MemoryStore
from marsys_mem.testing.conformance.data import KEY, message_ids, user_messages
from marsys_mem.testing.conformance.harness import StoreHarness

__all__ = ["ConcurrencyConformance"]


class ConcurrencyConformance(StoreHarness):
    """Several threads appending to one store instance lose nothing.

    (The bound kept while threads append in ``[Append, EnforceRetention]`` batches is
    checked with retention; several processes are :attr:`Capability.MULTI_PROCESS`.)

    Example:
        >>> import pytest
        >>> from marsys_mem.store import InMemoryStore
        >>> class TestThreads(ConcurrencyConformance):
        ...     @pytest.fixture
        ...     def store(self):
        ...         with InMemoryStore() as s:
        ...             yield s
    """

    def test_threads_appending_concurrently(self, store: MemoryStore) -> None:
        """Within a key, messages keep the order they were appended in (any thread).

        Checks: appends from four threads are all kept, once each, and each thread's
        messages keep that thread's order.
        """
        per_thread, threads = 50, 4

        def work(t: int) -> None:
            for i in range(per_thread):
                store.append_messages(KEY, user_messages(1, prefix=f"t{t}-{i}-"))

        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        ids = message_ids(store.load_messages(KEY))
        assert len(ids) == len(set(ids)) == per_thread * threads
        for t in range(threads):
            mine = [i for i in ids if i.startswith(f"t{t}-")]
            assert mine == [f"t{t}-{i}-0" for i in range(per_thread)]

    def test_threads_racing_expect_last(self, store: MemoryStore) -> None:
        """``ExpectLast`` is a compare-and-set: of two batches expecting one message, one wins.

        Checks: four threads each append 20 messages, each after the newest one it read
        (``[ExpectLast(key, newest), Append(key, (m,))]``, again on ``ConflictError``):
        every message follows the one it was written after, so no two were written
        after the same message, and none is lost.
        """
        per_thread, threads = 20, 4

        def work(t: int) -> None:
            for i in range(per_thread):
                while True:
                    (newest,) = store.batch([Load(KEY, last=1)])
                    after = newest[-1].message_id if newest else None
                    m = Message.user(f"t{t}-{i}", message_id=f"t{t}-{i}", metadata={"after": after})
                    try:
                        store.batch([ExpectLast(KEY, after), Append(KEY, (m,))])
                    except ConflictError:
                        continue
                    break

        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        stored = store.load_messages(KEY)
        assert len(stored) == per_thread * threads
        previous = [None, *(m.message_id for m in stored[:-1])]
        assert [m.metadata["after"] for m in stored] == previous
