"""Conformance: run snapshots (:attr:`Capability.RUNS`).

Clauses of :mod:`marsys_mem.store.base`: ``save_run``: "Save a run snapshot (replacing
one with the same run_id)"; ``load_run``: "The snapshot of ``run_id``, or ``None``";
``ListRuns``: "Run ids filtered by the fields given ... Ordered by ``started_at``, ties in
first-save order (re-saving keeps the place)".
"""

from __future__ import annotations

from datetime import timedelta

from marsys_mem.store.base import MemoryStore
from marsys_mem.testing.conformance.data import T0, snapshot_of
from marsys_mem.testing.conformance.harness import StoreHarness

__all__ = ["RunsConformance"]


class RunsConformance(StoreHarness):
    """Save, replace, load and list run snapshots.

    Example:
        >>> import pytest
        >>> from marsys_mem.store import InMemoryStore
        >>> class TestRuns(RunsConformance):
        ...     @pytest.fixture
        ...     def store(self):
        ...         with InMemoryStore() as s:
        ...             yield s
    """

    def test_save_and_load_run(self, store: MemoryStore) -> None:
        """``load_run``: the snapshot of ``run_id``, or ``None``.

        Checks: a snapshot round-trips losslessly; an unknown id gives None.
        """
        snap = snapshot_of("r1", parent_id="r0")
        store.save_run(snap)
        assert store.load_run("r1") == snap
        assert store.load_run("missing") is None

    def test_save_run_replaces(self, store: MemoryStore) -> None:
        """``save_run``: save a run snapshot (replacing one with the same run_id).

        Checks: the newer snapshot is loaded, the run is listed once, and filters see
        the new fields only.
        """
        store.save_run(snapshot_of("r1"))
        newer = snapshot_of("r1", agent="writer")
        store.save_run(newer)
        assert store.load_run("r1") == newer
        assert store.list_runs() == ["r1"]
        assert store.list_runs(agent="researcher") == []

    def test_list_runs_filters_and_order(self, store: MemoryStore) -> None:
        """``ListRuns``: run ids filtered by the fields given, ordered by ``started_at``.

        Checks: oldest first whatever the save order; every combination of
        ``namespace``, ``agent`` and ``parent_id`` filters.
        """
        later = T0 + timedelta(hours=1)
        store.save_run(snapshot_of("late", started_at=later + timedelta(hours=1)))
        store.save_run(snapshot_of("root", started_at=T0))
        store.save_run(snapshot_of("child", parent_id="root", agent="writer", started_at=later))
        store.save_run(snapshot_of("other", namespace="team2", parent_id="root", started_at=later))
        assert store.list_runs() == ["root", "child", "other", "late"]
        assert store.list_runs(agent="researcher") == ["root", "other", "late"]
        assert store.list_runs(namespace="team2") == ["other"]
        assert store.list_runs(parent_id="root") == ["child", "other"]
        assert store.list_runs(namespace="default", parent_id="root") == ["child"]
        assert store.list_runs(namespace="default", agent="writer", parent_id="root") == ["child"]
        assert store.list_runs(agent="nobody") == []
