"""Conformance: the async twins (:attr:`Capability.ASYNC`).

Clause of :mod:`marsys_mem.store.base`: "Async twins (``a``-prefixed) never block the
event loop"; each is the "Async twin of" its sync method.
They are run with :func:`asyncio.run`, so the suite needs no pytest-asyncio.
"""

from __future__ import annotations

import asyncio

import pytest

from marsys_mem.exceptions import DuplicateMessageError
from marsys_mem.store.base import CountMessages, ListKeys, MemoryStore
from marsys_mem.testing.conformance.data import KEY, OTHER_KEY, T0, snapshot_of, user_messages
from marsys_mem.testing.conformance.harness import StoreHarness

__all__ = ["AsyncConformance"]


class AsyncConformance(StoreHarness):
    """Every ``a``-prefixed method does what its sync twin does, concurrent calls too.

    Example:
        >>> import pytest
        >>> from marsys_mem.store import InMemoryStore
        >>> class TestAsync(AsyncConformance):
        ...     @pytest.fixture
        ...     def store(self):
        ...         with InMemoryStore() as s:
        ...             yield s
    """

    def test_async_twins(self, store: MemoryStore) -> None:
        """Async twins (``a``-prefixed) give the same results as their sync methods.

        Checks: append (two at once with ``gather``), load with ``since``/``last``,
        delete, save/load run, retention, batch and the duplicate error, then the sync
        view agrees.
        """
        msgs = user_messages(4)
        snap = snapshot_of("r1")

        async def scenario() -> None:
            await store.aappend_messages(KEY, msgs[:2])
            await asyncio.gather(
                store.aappend_messages(KEY, msgs[2:]),
                store.aappend_messages(OTHER_KEY, user_messages(2, prefix="o")),
            )
            assert await store.aload_messages(KEY) == msgs
            assert await store.aload_messages(KEY, since=msgs[1].timestamp, last=2) == msgs[2:]
            assert await store.adelete_messages(KEY, ids=["m0"]) == 1
            assert await store.adelete_messages(KEY, before=msgs[2].timestamp) == 1
            await store.asave_run(snap)
            assert await store.aload_run("r1") == snap
            assert await store.aload_run("nope") is None
            deleted = await store.aenforce_retention(KEY, max_messages=1, now=T0)
            assert deleted == 1
            assert await store.abatch([CountMessages(KEY), ListKeys()]) == [1, [KEY, OTHER_KEY]]
            assert await store.adelete_messages(OTHER_KEY) == 2
            with pytest.raises(DuplicateMessageError):
                await store.aappend_messages(KEY, msgs[3:])

        asyncio.run(scenario())
        assert store.load_messages(KEY) == msgs[3:]
