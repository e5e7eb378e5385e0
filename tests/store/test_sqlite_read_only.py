"""SQLiteStore(read_only=True): inspection reads a store without changing one byte of it."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from marsys_mem import Message
from marsys_mem.cli.main import main as cli
from marsys_mem.exceptions import StoreError
from marsys_mem.store.sqlite import MIGRATIONS, SQLiteStore

OlderStore = Callable[..., None]

KEY = ("default", "a", "main")


def _version_1_store(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    MIGRATIONS[0](conn)
    conn.execute("INSERT INTO schema_version (version, applied_at) VALUES (1, 'then')")
    conn.execute("COMMIT")
    conn.close()


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_an_older_store_is_read_as_it_is_and_left_as_it_was(
    tmp_path: Path, version: int, older_store: OlderStore
) -> None:
    """Issue 25 item 5: an older schema is read as it is, not refused, not migrated."""
    path = tmp_path / "old.db"
    older_store(path, version, [Message.user("hello"), Message.assistant("hi")], wal=version >= 3)
    before = _sha(path)
    with SQLiteStore(path, read_only=True) as store:
        assert store.schema_version == version
        assert store.list_keys() == [KEY]
        assert [m.text for m in store.load_messages(KEY)] == ["hello", "hi"]
        assert [m.text for m in store.load_messages(KEY, last=1)] == ["hi"]
        assert store.count_messages(KEY) == 2
        assert store.load_messages_after(KEY).cursor == 2
        assert store.load_vectors(None, "model").message_ids == ()
        assert store.load_deletions(after=0).message_ids == ()
        assert store.integrity_check() == "ok"
        assert [r.preview for r in store.read_rows(KEY, max_bytes=64)] == ["hello", "hi"]
    assert _sha(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.db"]  # no -wal, no -shm


def test_inspect_reads_an_older_store_and_points_at_migrate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], older_store: OlderStore
) -> None:
    path = tmp_path / "old.db"
    older_store(path, 1, [Message.user("hello")])
    before = _sha(path)
    assert cli(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "1 messages" in out
    assert "hello" in out
    assert f"schema version 1, older than 5: read as it is; `marsys-mem migrate {path}`" in out
    assert _sha(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.db"]


def test_a_store_with_no_schema_version_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "odd.db"
    _version_1_store(path)
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM schema_version")
    conn.close()
    before = _sha(path)
    with pytest.raises(StoreError, match=r"odd\.db records no schema version"):
        SQLiteStore(path, read_only=True)
    assert _sha(path) == before


def test_a_current_store_reads_and_refuses_writes(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    with SQLiteStore(path) as store:
        store.append_messages(KEY, [Message.user("hello")])
    before = path.read_bytes()
    with SQLiteStore(path, read_only=True) as store:
        assert [m.text for m in store.load_messages(KEY)] == ["hello"]
        assert store.count_messages(KEY) == 1
        with pytest.raises(StoreError, match="read-only"):
            store.append_messages(KEY, [Message.user("more")])
        store.scrub()  # nothing to do, nothing written
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.db"]  # no -wal / -shm made


def test_a_live_store_is_read_through_its_wal(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    with SQLiteStore(path) as writer:
        writer.append_messages(KEY, [Message.user("first")])
        with SQLiteStore(path, read_only=True) as reader:
            writer.append_messages(KEY, [Message.user("second")])
            assert [m.text for m in reader.load_messages(KEY)] == ["first", "second"]


def test_a_missing_file_is_not_created(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no such store file"):
        SQLiteStore(tmp_path / "nope.db", read_only=True)
    assert list(tmp_path.iterdir()) == []


def _shape(conn: sqlite3.Connection) -> dict[str, object]:
    """Tables (columns), indexes (columns) and triggers (normalised SQL) of a database."""
    shape: dict[str, object] = {}
    for kind, name, table, sql in conn.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"
    ):
        if kind == "table":
            shape[name] = [tuple(r[1:]) for r in conn.execute(f"PRAGMA table_info({name})")]
        elif kind == "index":
            shape[name] = (table, [r[2] for r in conn.execute(f"PRAGMA index_info({name})")])
        else:
            shape[name] = " ".join(str(sql).split())
    return shape


def test_the_schema_in_one_place_is_what_the_migrations_build(tmp_path: Path) -> None:
    """SCHEMA (a new store) and MIGRATIONS (a version-1 file, upgraded) agree."""
    old = tmp_path / "old.db"
    _version_1_store(old)
    SQLiteStore(old).close()  # migrated by the library, on open
    SQLiteStore(tmp_path / "new.db").close()
    with sqlite3.connect(old) as a, sqlite3.connect(tmp_path / "new.db") as b:
        assert _shape(a) == _shape(b)
        versions = [v for (v,) in b.execute("SELECT version FROM schema_version")]
        assert versions == [len(MIGRATIONS)]
