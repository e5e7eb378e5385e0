"""Conformance: closing a store (:attr:`Capability.LIFECYCLE`).

Clause of :mod:`marsys_mem.store.base`: ``close``: "Release resources; further calls raise
``StoreError``. Idempotent."
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta

import pytest

from marsys_mem.exceptions import StoreError
from marsys_mem.store.base import ListKeys, MemoryStore
from marsys_mem.testing.conformance.data import KEY, snapshot_of, user_messages
from marsys_mem.testing.conformance.harness import StoreHarness

__all__ = ["LifecycleConformance"]


class LifecycleConformance(StoreHarness):
    """``close`` (idempotent; every later call raises StoreError) and ``with store:``.

    Example:
        >>> import pytest
        >>> from marsys_mem.store import InMemoryStore
        >>> class TestLifecycle(LifecycleConformance):
        ...     @pytest.fixture
        ...     def store(self):
        ...         with InMemoryStore() as s:
        ...             yield s
    """

    def test_closed_store_raises_store_error(self, store: MemoryStore) -> None:
        """``close``: further calls raise ``StoreError``. Idempotent.

        Checks: closing twice is fine; every method, async twins included, then raises
        StoreError saying the store is closed.
        """
        store.append_messages(KEY, user_messages(1))
        store.close()
        store.close()
        calls: list[Callable[[], object]] = [
            lambda: store.append_messages(KEY, user_messages(1, prefix="x")),
            lambda: store.load_messages(KEY),
            lambda: store.delete_messages(KEY),
            lambda: store.count_messages(KEY),
            lambda: store.list_keys(),
            lambda: store.save_run(snapshot_of("r1")),
            lambda: store.load_run("r1"),
            lambda: store.list_runs(),
            lambda: store.enforce_retention(ttl=timedelta(days=1)),
            lambda: store.batch([ListKeys()]),
            lambda: asyncio.run(store.aload_messages(KEY)),
            lambda: asyncio.run(store.aappend_messages(KEY, user_messages(1, prefix="y"))),
        ]
        for call in calls:
            with pytest.raises(StoreError, match="closed"):
                call()

    def test_context_manager_closes(self, store: MemoryStore) -> None:
        """``close``: release resources; ``with store:`` calls it on exit.

        Checks: ``with`` gives the store itself and closes it on exit; calls then raise
        StoreError.
        """
        with store as entered:
            assert entered is store
            store.append_messages(KEY, user_messages(1))
        assert store.closed
        with pytest.raises(StoreError):
            store.load_messages(KEY)
