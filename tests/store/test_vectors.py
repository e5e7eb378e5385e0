"""Stored vectors beyond the conformance suite: SQLite schema and migration, format, undo."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

import marsys_mem.store.sqlite as sqlite_mod
from marsys_mem.exceptions import MessageNotFoundError, StoreError
from marsys_mem.store import InMemoryStore, MemoryStore, SQLiteStore
from marsys_mem.store.base import PutVectors
from marsys_mem.store.vectors import from_bytes, to_bytes
from marsys_mem.testing.conformance import Capability, VectorsConformance
from marsys_mem.testing.conformance.data import KEY, user_messages
from marsys_mem.testing.conformance.vectors import MODEL, vectors_of


def test_a_version_3_file_opens_and_upgrades(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file written before vectors existed gets the tables, keeps its data, stores vectors."""
    db = tmp_path / "old.db"
    msgs = user_messages(5)
    with monkeypatch.context() as m:
        m.setattr(sqlite_mod, "MIGRATIONS", sqlite_mod.MIGRATIONS[:3])
        with SQLiteStore(db) as old:
            old.append_messages(KEY, msgs)
    conn = sqlite3.connect(db)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert "vectors" not in tables
        assert conn.execute("SELECT max(version) FROM schema_version").fetchone() == (3,)
    finally:
        conn.close()
    with SQLiteStore(db) as store:
        assert store.load_messages(KEY) == msgs
        page = store.load_messages_after(KEY)
        assert page.count == 5
        store.put_vectors(KEY, MODEL, ["m0", "m4"], vectors_of(2))
        store.delete_messages(KEY, ["m0"])
        assert store.load_vectors(KEY, MODEL).message_ids == ("m4",)
        assert store.integrity_check() == "ok"
    conn = sqlite3.connect(db)
    try:
        versions = [v for (v,) in conn.execute("SELECT version FROM schema_version")]
        assert versions == [1, 2, 3, 4, 5]
    finally:
        conn.close()


def test_sqlite_keeps_float32_little_endian_bytes(tmp_path: Path) -> None:
    """The documented format: ``4 * dim`` bytes, float32 little-endian, no header."""
    db = tmp_path / "f.db"
    vec = vectors_of(1, 3)
    with SQLiteStore(db) as store:
        store.append_messages(KEY, user_messages(1))
        store.put_vectors(KEY, MODEL, ["m0"], vec)
    conn = sqlite3.connect(db)
    try:
        (blob,) = conn.execute("SELECT data FROM vectors").fetchone()
        (dim,) = conn.execute("SELECT dim FROM vector_models WHERE model = ?", (MODEL,)).fetchone()
    finally:
        conn.close()
    assert blob == vec[0].astype("<f4").tobytes() == to_bytes(vec[0])
    assert dim == 3
    assert from_bytes([blob], 3).tobytes() == vec.tobytes()
    with pytest.raises(ValueError, match="12"):
        from_bytes([blob[:-1]], 3)


def test_integrity_check_finds_vectors_without_their_message(tmp_path: Path) -> None:
    db = tmp_path / "i.db"
    with SQLiteStore(db) as store:
        store.append_messages(KEY, user_messages(2))
        store.put_vectors(KEY, MODEL, ["m0", "m1"], vectors_of(2))
    conn = sqlite3.connect(db, isolation_level=None)
    try:  # forge what the trigger prevents: a message deleted without its vector
        conn.execute("DROP TRIGGER messages_vectors_delete")
        conn.execute("DELETE FROM messages WHERE message_id = 'm0'")
    finally:
        conn.close()
    with SQLiteStore(db) as store:
        assert "1 vectors without their message" in store.integrity_check()


def test_a_store_without_vectors_refuses_the_vector_operations() -> None:
    class NoVectors(InMemoryStore):
        supports_vectors = False

    store: MemoryStore = NoVectors()
    store.append_messages(KEY, user_messages(1))
    for call in (
        lambda: store.load_vectors(KEY, MODEL),
        lambda: store.put_vectors(KEY, MODEL, ["m0"], vectors_of(1)),
        lambda: store.load_messages_after(KEY),
    ):
        with pytest.raises(StoreError, match="does not store vectors"):
            call()
    assert store.count_messages(KEY) == 1


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_a_failed_rewrite_restores_the_old_vector_and_its_place(backend: str) -> None:
    """All or nothing: the replaced vector comes back, in its place in write order."""
    store: MemoryStore = InMemoryStore() if backend == "memory" else SQLiteStore(":memory:")
    with store:
        store.append_messages(KEY, user_messages(3))
        old = vectors_of(3)
        store.put_vectors(KEY, MODEL, ["m0", "m1", "m2"], old)
        before = store.load_vectors(KEY, MODEL)
        new = vectors_of(1, seed=9)
        new.flags.writeable = False
        with pytest.raises(MessageNotFoundError):
            store.batch([PutVectors(KEY, MODEL, ("m1",), new), PutVectors(KEY, MODEL, ("x",), new)])
        after = store.load_vectors(KEY, MODEL)
        assert after.message_ids == before.message_ids == ("m0", "m1", "m2")
        assert after.vectors.tobytes() == old.tobytes()
        assert not len(store.load_vectors(KEY, MODEL, after=before.cursor))
        # a new model whose first put fails is not left behind with its dimension
        two = vectors_of(1, 2)
        two.flags.writeable = False
        with pytest.raises(MessageNotFoundError):
            store.batch(
                [PutVectors(KEY, "fresh", ("m0",), two), PutVectors(KEY, "fresh", ("x",), two)]
            )
        store.put_vectors(KEY, "fresh", ["m0"], vectors_of(1, 5))
        assert store.load_vectors(KEY, "fresh").vectors.shape == (1, 5)


def test_in_memory_catch_up_stays_cheap_after_many_deletes() -> None:
    """Deleted rows are compacted away; cursors keep working across compactions."""
    store = InMemoryStore()
    msgs = user_messages(300)
    store.append_messages(KEY, msgs)
    store.put_vectors(KEY, MODEL, [m.message_id for m in msgs], vectors_of(300))
    store.delete_messages(KEY, [m.message_id for m in msgs[:290]])
    cursor = store.load_vectors(KEY, MODEL).cursor
    store.put_vectors(KEY, MODEL, ["m295"], vectors_of(1, seed=4))
    page = store.load_vectors(KEY, MODEL, after=cursor)
    assert page.message_ids == ("m295",)
    assert len(store.load_vectors(None, MODEL)) == 10
    state = store._state.vectors[MODEL]
    assert len(state.seqs) < 100  # compacted
    assert np.array_equal(store.load_vectors(KEY, MODEL).vectors[-1], vectors_of(1, seed=4)[0])


class _NoVectorsHarness(VectorsConformance):
    """A backend that keeps no vectors declares it, with the reason (not collected)."""

    unsupported: ClassVar[Mapping[Capability, str]] = {
        Capability.VECTORS: "this backend keeps messages only"
    }


def test_vectors_can_be_declared_unsupported_with_a_reason() -> None:
    class NoVectors(InMemoryStore):
        supports_vectors = False

    harness = _NoVectorsHarness()
    assert _NoVectorsHarness.capability_report()[Capability.VECTORS] == (
        "unsupported: this backend keeps messages only"
    )
    with pytest.raises(pytest.skip.Exception, match="keeps messages only"):
        harness.test_vectors_roundtrip(NoVectors())
