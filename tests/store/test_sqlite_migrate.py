"""``marsys-mem migrate`` / ``migrate_file``: an older store upgraded whole, or not at all."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from marsys_mem import Message
from marsys_mem.cli.main import main as cli
from marsys_mem.exceptions import StoreError
from marsys_mem.store.sqlite import SCHEMA_VERSION, SQLiteStore, migrate_file

KEY = ("default", "a", "main")
OlderStore = Callable[..., None]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _shape(path: Path) -> set[tuple[str, str]]:
    with sqlite3.connect(path) as conn:
        found = {(str(t), str(n)) for t, n in conn.execute("SELECT type, name FROM sqlite_master")}
    conn.close()
    return found


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_an_older_store_is_migrated_on_a_copy_and_the_original_kept(
    tmp_path: Path, version: int, older_store: OlderStore, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "old.db"
    older_store(path, version, [Message.user("hello"), Message.system("rules")], wal=version >= 3)
    original = _sha(path)
    assert cli(["migrate", str(path)]) == 0
    out = capsys.readouterr().out
    backup = tmp_path / f"old.db.v{version}.bak"
    assert f"migrated from schema version {version} to {SCHEMA_VERSION}" in out
    assert f"the original is kept as {backup}" in out
    assert _sha(backup) == original  # the original's bytes, untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.db", backup.name]
    SQLiteStore(tmp_path / "new.db").close()
    assert _shape(path) == _shape(tmp_path / "new.db")  # the current schema, nothing missing
    with SQLiteStore(path, read_only=True) as store:
        assert store.schema_version == SCHEMA_VERSION
        assert [m.text for m in store.load_messages(KEY)] == ["hello", "rules"]
        assert store.integrity_check() == "ok"
    with sqlite3.connect(path) as conn:  # the system message is protected (v2's backfill)
        assert conn.execute("SELECT protected FROM messages ORDER BY seq").fetchall() == [
            (0,),
            (1,),
        ]
    conn.close()
    with SQLiteStore(path) as store:  # and the library opens it as its own
        store.append_messages(KEY, [Message.user("more")])
        assert store.count_messages(KEY) == 3


def test_a_failed_migration_leaves_the_file_unchanged_and_names_it(
    tmp_path: Path, older_store: OlderStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 25 item 5: a failed migration changed the file's bytes; its error named no file."""
    path = tmp_path / "old.db"
    older_store(path, 1, [Message.user("hello")])
    with sqlite3.connect(path) as conn:  # a row version 2's backfill cannot read
        conn.execute(
            "INSERT INTO messages (namespace, agent, branch, message_id, ts, data) "
            "VALUES ('default', 'a', 'main', 'bad', 5, '{\"role\": \"user\", \"content\": \"cut')"
        )
    conn.close()
    before = _sha(path)
    assert cli(["migrate", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"error: {path}: migrating schema version 1 to {SCHEMA_VERSION} failed" in err
    assert "the file is unchanged" in err
    assert f"`marsys-mem inspect {path}` lists such rows" in err
    assert _sha(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.db"]  # no copy, no backup left
    # and inspect still reads it, reporting the row
    assert cli(["inspect", str(path)]) == 0
    assert (
        "1 invalid row skipped (key default/a@main, id bad: Invalid JSON" in capsys.readouterr().out
    )
    assert _sha(path) == before


def test_opening_an_older_store_whose_migration_fails_changes_nothing(
    tmp_path: Path, older_store: OlderStore
) -> None:
    """The library's own migration on open: rolled back to the file's bytes, the file named."""
    path = tmp_path / "old.db"
    older_store(path, 1, [Message.user("hello")])
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE messages SET data = '{\"role\": 1}'")
    conn.close()
    before = _sha(path)
    with pytest.raises(StoreError, match=r"old\.db: migrating it to schema version 5 failed, the"):
        SQLiteStore(path)
    assert _sha(path) == before  # was: switched to WAL before the migration failed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.db"]


def test_a_store_in_use_is_not_migrated(tmp_path: Path, older_store: OlderStore) -> None:
    path = tmp_path / "old.db"
    older_store(path, 4, [Message.user("hello")], wal=True)
    holder = sqlite3.connect(path)  # another process has it open: -wal and -shm beside it
    try:
        holder.execute("SELECT count(*) FROM messages").fetchall()
        assert (tmp_path / "old.db-wal").exists()
        before = _sha(path)
        with pytest.raises(StoreError, match=r"old\.db is in use, or was not closed cleanly"):
            migrate_file(path)
        assert _sha(path) == before
    finally:
        holder.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.db"]


def test_a_current_store_is_left_as_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "m.db"
    with SQLiteStore(path) as store:
        store.append_messages(KEY, [Message.user("hello")])
    before = _sha(path)
    assert cli(["migrate", str(tmp_path)]) == 0  # a folder holding one store
    assert f"{path}: schema version {SCHEMA_VERSION}, up to date (unchanged)" in (
        capsys.readouterr().out
    )
    assert _sha(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.db"]


def test_no_backup_and_bad_paths(
    tmp_path: Path, older_store: OlderStore, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "old.db"
    older_store(path, 2, [Message.user("hello")])
    done = migrate_file(path, backup=False)
    assert (done.from_version, done.to_version, done.backup) == (2, SCHEMA_VERSION, None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.db"]
    assert cli(["migrate", str(tmp_path / "nope.db")]) == 2
    assert "nope.db: no such store file or folder" in capsys.readouterr().err
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    before = _sha(other)
    assert cli(["migrate", str(other)]) == 2
    assert "other.db is not a marsys-mem database" in capsys.readouterr().err
    assert _sha(other) == before
