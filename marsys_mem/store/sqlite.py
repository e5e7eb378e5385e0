"""SQLite store: one file, shared safely by threads and processes.

:class:`SQLiteStore` uses the standard library's :mod:`sqlite3` only. Each batch is one
transaction that commits or rolls back whole; WAL mode with ``synchronous=FULL`` by
default (an append is on disk when it returns) and a busy timeout let several processes
write one file. ``max_messages`` is enforced inside the write transaction, a message's
vectors are deleted with it by a trigger, cursors follow commit order, and a file that is
not a marsys-mem database is refused and left untouched. SQL is parameterised; nothing is
pickled.

Guide (schema, bounds, migrations):
``docs/guides/retention-and-stores.md#the-sqlite-store-in-detail``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sqlite3
import stat
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import ValidationError

from marsys_mem.exceptions import DuplicateMessageError, MessageNotFoundError, StoreError
from marsys_mem.model.messages import MESSAGE_LIST_ADAPTER, Message
from marsys_mem.model.runs import RunSnapshot
from marsys_mem.store.base import (
    Append,
    CountMessages,
    Delete,
    EnforceRetention,
    ExpectLast,
    Key,
    ListKeys,
    ListRuns,
    Load,
    LoadAfter,
    LoadAround,
    LoadDeletions,
    LoadRun,
    LoadVectors,
    MemoryStore,
    Op,
    PutVectors,
    SaveRun,
    conflict_error,
    messages_around,
    validate_key,
)
from marsys_mem.store.owners import DELETION_LOG_SIZE, DeletionPage
from marsys_mem.store.retention import EVICTION_ORDER, ttl_cutoff
from marsys_mem.store.rows import StoredRow, error_reason, head_preview
from marsys_mem.store.vectors import MessagePage, VectorPage, from_bytes, to_bytes

__all__ = [
    "APPLICATION_ID",
    "MIGRATIONS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "Migrated",
    "Migration",
    "SQLiteStore",
    "Synchronous",
    "migrate_file",
]

Synchronous = Literal["FULL", "NORMAL"]
"""The ``PRAGMA synchronous`` levels a :class:`SQLiteStore` accepts."""

Migration = Callable[[sqlite3.Connection], None]
"""A schema migration: runs inside the open transaction, must not commit."""

APPLICATION_ID = 0x4D4D454D
"""``PRAGMA application_id`` of a marsys-mem database (``"MMEM"``)."""

_HEADER = b"SQLite format 3\x00"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_KEY_WHERE = "namespace = ? AND agent = ? AND branch = ?"
_WRITES = (Append, Delete, ExpectLast, SaveRun, EnforceRetention, PutVectors)
_DELETES = (Delete, EnforceRetention)
_SOURCE_INSERT = (
    "INSERT OR IGNORE INTO sources (namespace, agent, branch, message_id, "
    "s_namespace, s_agent, s_branch, s_message_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_CHUNK = 500  # ids per IN (...) query: below SQLite's bound-parameter limit
_INSERT = (
    "INSERT INTO messages (namespace, agent, branch, message_id, ts, protected, data) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)


_COUNT_ADD = (
    "INSERT INTO key_counts (namespace, agent, branch, n) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (namespace, agent, branch) DO UPDATE SET n = n + excluded.n"
)


def _micros(value: datetime) -> int:
    """Microseconds since 1970-01-01 UTC (exact)."""
    return (value - _EPOCH) // _MICROSECOND


# ---------------------------------------------------------------------- migrations
def _v1_tables(conn: sqlite3.Connection) -> None:
    """Version 1: messages, runs and the schema_version history."""
    conn.execute(
        "CREATE TABLE schema_version ( version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)"
    )
    conn.execute(
        "CREATE TABLE messages ("
        " seq INTEGER PRIMARY KEY AUTOINCREMENT,"
        " namespace TEXT NOT NULL,"
        " agent TEXT NOT NULL,"
        " branch TEXT NOT NULL,"
        " message_id TEXT NOT NULL,"
        " ts INTEGER NOT NULL,"
        " data TEXT NOT NULL,"
        " UNIQUE (namespace, agent, branch, message_id))"
    )
    # Index entries end with the rowid (seq), so this index yields a key's rows in order.
    conn.execute("CREATE INDEX messages_by_key ON messages (namespace, agent, branch)")
    conn.execute(
        "CREATE TABLE runs ("
        " run_id TEXT PRIMARY KEY,"
        " parent_id TEXT,"
        " namespace TEXT NOT NULL,"
        " agent TEXT NOT NULL,"
        " started_at INTEGER NOT NULL,"
        " data TEXT NOT NULL)"
    )
    conn.execute("CREATE INDEX runs_by_agent ON runs (namespace, agent)")
    conn.execute("CREATE INDEX runs_by_parent ON runs (parent_id)")


def _v2_protected(conn: sqlite3.Connection) -> None:
    """Version 2: the ``protected`` column that retention orders by, backfilled."""
    conn.execute("ALTER TABLE messages ADD COLUMN protected INTEGER NOT NULL DEFAULT 0")
    last = 0
    while True:
        rows = conn.execute(
            "SELECT seq, data FROM messages WHERE seq > ? ORDER BY seq LIMIT 1000", (last,)
        ).fetchall()
        if not rows:
            break
        protected = [(seq,) for seq, data in rows if Message.model_validate_json(data).is_protected]
        conn.executemany("UPDATE messages SET protected = 1 WHERE seq = ?", protected)
        last = rows[-1][0]


def _v3_key_counts(conn: sqlite3.Connection) -> None:
    """Version 3: ``key_counts`` (rows per key), backfilled.

    Appends add to it in their own transaction (one statement per append); a trigger
    subtracts every deleted row, whatever deletes it.
    """
    conn.execute(
        "CREATE TABLE key_counts ("
        " namespace TEXT NOT NULL,"
        " agent TEXT NOT NULL,"
        " branch TEXT NOT NULL,"
        " n INTEGER NOT NULL,"
        " PRIMARY KEY (namespace, agent, branch)) WITHOUT ROWID"
    )
    conn.execute(
        "INSERT INTO key_counts (namespace, agent, branch, n) "
        "SELECT namespace, agent, branch, count(*) FROM messages "
        "GROUP BY namespace, agent, branch"
    )
    conn.execute(
        "CREATE TRIGGER messages_count_delete AFTER DELETE ON messages BEGIN "
        "UPDATE key_counts SET n = n - 1 WHERE namespace = old.namespace "
        "AND agent = old.agent AND branch = old.branch; "
        "DELETE FROM key_counts WHERE namespace = old.namespace AND agent = old.agent "
        "AND branch = old.branch AND n <= 0; END"
    )
    # A message's key never changes (nothing updates those columns); refuse it if tried.
    conn.execute(
        "CREATE TRIGGER messages_key_fixed BEFORE UPDATE OF namespace, agent, branch "
        "ON messages BEGIN SELECT RAISE(ABORT, 'a message key cannot change'); END"
    )


def _v4_vectors(conn: sqlite3.Connection) -> None:
    """Version 4: ``vector_models`` and ``vectors``, deleted with their messages by a trigger.

    ``vectors`` repeats the message's key and id so that a catch-up (``vseq > cursor``, by
    key or store-wide) is one range scan of an index, with no join.
    """
    conn.execute(
        "CREATE TABLE vector_models (model TEXT PRIMARY KEY, dim INTEGER NOT NULL) WITHOUT ROWID"
    )
    conn.execute(
        "CREATE TABLE vectors ("
        " vseq INTEGER PRIMARY KEY AUTOINCREMENT,"
        " msg_seq INTEGER NOT NULL,"
        " namespace TEXT NOT NULL,"
        " agent TEXT NOT NULL,"
        " branch TEXT NOT NULL,"
        " message_id TEXT NOT NULL,"
        " model TEXT NOT NULL,"
        " data BLOB NOT NULL,"
        " UNIQUE (msg_seq, model))"
    )
    conn.execute("CREATE INDEX vectors_by_model ON vectors (model, vseq)")
    conn.execute("CREATE INDEX vectors_by_key ON vectors (namespace, agent, branch, model, vseq)")
    conn.execute(
        "CREATE TRIGGER messages_vectors_delete AFTER DELETE ON messages BEGIN "
        "DELETE FROM vectors WHERE msg_seq = old.seq; END"
    )


_OWNERSHIP: tuple[str, ...] = (
    (
        "CREATE TABLE sources ("
        " namespace TEXT NOT NULL, agent TEXT NOT NULL, branch TEXT NOT NULL,"
        " message_id TEXT NOT NULL,"
        " s_namespace TEXT NOT NULL, s_agent TEXT NOT NULL, s_branch TEXT NOT NULL,"
        " s_message_id TEXT NOT NULL,"
        " PRIMARY KEY (s_namespace, s_agent, s_branch, s_message_id,"
        "  namespace, agent, branch, message_id)) WITHOUT ROWID"
    ),
    "CREATE INDEX sources_by_record ON sources (namespace, agent, branch, message_id)",
    (
        "CREATE TABLE key_copies ("
        " o_namespace TEXT NOT NULL, o_agent TEXT NOT NULL, o_branch TEXT NOT NULL,"
        " namespace TEXT NOT NULL, agent TEXT NOT NULL, branch TEXT NOT NULL,"
        " PRIMARY KEY (o_namespace, o_agent, o_branch, namespace, agent, branch)) WITHOUT ROWID"
    ),
    (
        "CREATE TABLE deletions ("
        " dseq INTEGER PRIMARY KEY,"  # the newest row is never pruned: rowids only grow
        " namespace TEXT NOT NULL, agent TEXT NOT NULL, branch TEXT NOT NULL,"
        " message_id TEXT NOT NULL)"
    ),
    (
        "CREATE TRIGGER messages_logged_delete AFTER DELETE ON messages BEGIN "
        "INSERT INTO deletions (namespace, agent, branch, message_id) "
        "VALUES (old.namespace, old.agent, old.branch, old.message_id); END"
    ),
    # The two link triggers fire only for rows that have links (one index probe each).
    (
        "CREATE TRIGGER messages_record_delete AFTER DELETE ON messages "
        "WHEN EXISTS (SELECT 1 FROM sources) AND EXISTS (SELECT 1 FROM sources "
        "WHERE namespace = old.namespace "
        "AND agent = old.agent AND branch = old.branch AND message_id = old.message_id) "
        "BEGIN DELETE FROM sources WHERE namespace = old.namespace AND agent = old.agent "
        "AND branch = old.branch AND message_id = old.message_id; END"
    ),
    (
        "CREATE TRIGGER messages_source_delete AFTER DELETE ON messages "
        "WHEN EXISTS (SELECT 1 FROM sources) AND EXISTS (SELECT 1 FROM sources "
        "WHERE s_namespace = old.namespace "
        "AND s_agent = old.agent AND s_branch = old.branch AND s_message_id = old.message_id) "
        "BEGIN "
        "DELETE FROM messages WHERE seq IN (SELECT m.seq FROM sources s JOIN messages m "
        "ON m.namespace = s.namespace AND m.agent = s.agent AND m.branch = s.branch "
        "AND m.message_id = s.message_id "
        "WHERE s.s_namespace = old.namespace AND s.s_agent = old.agent "
        "AND s.s_branch = old.branch AND s.s_message_id = old.message_id "
        "AND NOT EXISTS (SELECT 1 FROM sources o WHERE o.namespace = s.namespace "
        "AND o.agent = s.agent AND o.branch = s.branch AND o.message_id = s.message_id "
        "AND NOT (o.s_namespace = old.namespace AND o.s_agent = old.agent "
        "AND o.s_branch = old.branch AND o.s_message_id = old.message_id))); "
        "DELETE FROM sources WHERE s_namespace = old.namespace AND s_agent = old.agent "
        "AND s_branch = old.branch AND s_message_id = old.message_id; END"
    ),
)
"""The ownership tables and triggers (schema version 5; :mod:`marsys_mem.store.owners`)."""


def _v5_owners(conn: sqlite3.Connection) -> None:
    """Version 5: ownership (``key_copies``, ``sources``) and the ``deletions`` log.

    Triggers per deleted row (``recursive_triggers`` is on, so a cascade cascades): the
    row is logged (key and id only) for readers to catch up; its own links go; records
    derived from it lose that link and, with no source left, are deleted too. Copies
    (same id, in the keys that hold copies of its key) are deleted by the statements that
    delete (:func:`_delete_where`), set-based: a per-row trigger costs 3x as much
    (:mod:`marsys_mem.store.owners`).
    """
    for statement in _OWNERSHIP:
        conn.execute(statement)


MIGRATIONS: tuple[Migration, ...] = (
    _v1_tables,
    _v2_protected,
    _v3_key_counts,
    _v4_vectors,
    _v5_owners,
)
"""Schema migrations, in order: ``MIGRATIONS[i]`` takes a file from version i to i + 1."""


SCHEMA: tuple[str, ...] = (
    "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)",
    # a key's messages in append order (seq); data: the message's pydantic JSON
    "CREATE TABLE messages ("
    " seq INTEGER PRIMARY KEY AUTOINCREMENT,"
    " namespace TEXT NOT NULL, agent TEXT NOT NULL, branch TEXT NOT NULL,"
    " message_id TEXT NOT NULL,"
    " ts INTEGER NOT NULL,"  # microseconds since 1970 (UTC)
    " data TEXT NOT NULL,"
    " protected INTEGER NOT NULL DEFAULT 0,"  # system / pinned: retention spares them
    " UNIQUE (namespace, agent, branch, message_id))",
    "CREATE INDEX messages_by_key ON messages (namespace, agent, branch)",
    "CREATE TABLE runs ("
    " run_id TEXT PRIMARY KEY, parent_id TEXT,"
    " namespace TEXT NOT NULL, agent TEXT NOT NULL,"
    " started_at INTEGER NOT NULL, data TEXT NOT NULL)",
    "CREATE INDEX runs_by_agent ON runs (namespace, agent)",
    "CREATE INDEX runs_by_parent ON runs (parent_id)",
    # rows per key: appends add, a trigger subtracts (count_messages is O(1))
    "CREATE TABLE key_counts ("
    " namespace TEXT NOT NULL, agent TEXT NOT NULL, branch TEXT NOT NULL,"
    " n INTEGER NOT NULL, PRIMARY KEY (namespace, agent, branch)) WITHOUT ROWID",
    "CREATE TRIGGER messages_count_delete AFTER DELETE ON messages BEGIN "
    "UPDATE key_counts SET n = n - 1 WHERE namespace = old.namespace "
    "AND agent = old.agent AND branch = old.branch; "
    "DELETE FROM key_counts WHERE namespace = old.namespace AND agent = old.agent "
    "AND branch = old.branch AND n <= 0; END",
    "CREATE TRIGGER messages_key_fixed BEFORE UPDATE OF namespace, agent, branch "
    "ON messages BEGIN SELECT RAISE(ABORT, 'a message key cannot change'); END",
    # embeddings next to their messages, one per model (vseq: the write-order cursor)
    "CREATE TABLE vector_models (model TEXT PRIMARY KEY, dim INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE vectors ("
    " vseq INTEGER PRIMARY KEY AUTOINCREMENT, msg_seq INTEGER NOT NULL,"
    " namespace TEXT NOT NULL, agent TEXT NOT NULL, branch TEXT NOT NULL,"
    " message_id TEXT NOT NULL, model TEXT NOT NULL, data BLOB NOT NULL,"
    " UNIQUE (msg_seq, model))",
    "CREATE INDEX vectors_by_model ON vectors (model, vseq)",
    "CREATE INDEX vectors_by_key ON vectors (namespace, agent, branch, model, vseq)",
    "CREATE TRIGGER messages_vectors_delete AFTER DELETE ON messages BEGIN "
    "DELETE FROM vectors WHERE msg_seq = old.seq; END",
    *_OWNERSHIP,
)
"""The current schema (version :data:`SCHEMA_VERSION`), the one place to read it: a new
store is made from it; :data:`MIGRATIONS` take files of earlier versions to the same schema
(a test compares the two). A new migration is added to both (and to ``SCHEMA_VERSION``)."""

SCHEMA_VERSION = 5
"""The version :data:`SCHEMA` is (``len(MIGRATIONS)`` unless a migration was just added)."""


def _schema_version(conn: sqlite3.Connection) -> int:
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
    ).fetchone()
    if exists is None:
        return 0
    row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def _migrate(conn: sqlite3.Connection, path: str) -> None:
    migrations = MIGRATIONS
    latest = len(migrations)
    version = _schema_version(conn)
    if version == latest:
        return
    if version > latest:
        raise StoreError(
            f"{path} has schema version {version}, newer than this marsys-mem knows "
            f"({latest}): upgrade marsys-mem to open it"
        )
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = _schema_version(conn)  # another process may have migrated meanwhile
        if version > latest:
            raise StoreError(
                f"{path} has schema version {version}, newer than this marsys-mem knows "
                f"({latest}): upgrade marsys-mem to open it"
            )
        if version == 0 and latest >= SCHEMA_VERSION:  # a new store: SCHEMA at once
            for statement in SCHEMA:
                conn.execute(statement)
            version = SCHEMA_VERSION
            conn.execute(
                "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)",
                (version, datetime.now(UTC).isoformat()),
            )
        for target in range(version + 1, latest + 1):
            migrations[target - 1](conn)
            conn.execute(
                "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)",
                (target, datetime.now(UTC).isoformat()),
            )
        # The file says it is ours (a constant, checked to be an int above).
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


# ---------------------------------------------------------------------- which files open
_LEGACY_TABLES = frozenset({"schema_version", "messages", "runs"})


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _not_ours(path: str, why: str) -> StoreError:
    return StoreError(
        f"{_short(path, 200)} is not a marsys-mem database ({why}); a new store is created "
        "only where no file exists: give another path (or remove the file yourself)"
    )


def _check_file(path: str) -> None:
    """Refuse, by looking at the file alone, what cannot be a marsys-mem database."""
    try:
        info = os.stat(path)
        if stat.S_ISDIR(info.st_mode):
            raise _not_ours(path, "it is a folder")
        if not stat.S_ISREG(info.st_mode):
            raise _not_ours(path, "it is not a regular file")
        if info.st_size == 0:
            raise _not_ours(path, "it is an empty file")
        with open(path, "rb") as f:
            header = f.read(len(_HEADER))
    except OSError as exc:
        raise StoreError(f"cannot open {_short(path, 200)}: {exc}") from exc
    if header != _HEADER:
        raise _not_ours(path, "it is not an SQLite database")


def _check_identity(conn: sqlite3.Connection, path: str) -> None:
    """Refuse another application's SQLite database (before anything writes to it)."""
    app_id = int(conn.execute("PRAGMA application_id").fetchone()[0])
    if app_id == APPLICATION_ID:
        return
    if app_id != 0:
        raise _not_ours(path, f"its application_id is {app_id:#x}, another application's")
    tables = sorted(
        str(name)
        for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite%'"
        )
    )
    if _LEGACY_TABLES <= set(tables):
        return  # written by marsys-mem before version 3 stamped the application_id
    if not tables:
        raise _not_ours(path, "it is an SQLite database with no tables")
    shown = ", ".join(_short(t, 40) for t in tables[:5])
    more = f" and {len(tables) - 5} more" if len(tables) > 5 else ""
    raise _not_ours(path, f"an SQLite database of another application, with tables {shown}{more}")


def _open_read_only(path: str, busy_timeout: float) -> tuple[sqlite3.Connection, int]:
    """A read-only connection to an existing store, and its schema version.

    Nothing is written: no migration, no journal-mode change. A store of an older schema
    is read as it is (:func:`_stand_in`); one with no schema version, or a newer one, is
    refused with what to do.
    """
    if not os.path.isfile(path):
        raise StoreError(f"{_short(path, 200)}: no such store file")
    uri = Path(os.path.abspath(path)).as_uri() + "?mode=ro"
    if not os.path.exists(path + "-wal"):
        # Closed cleanly (no writer has it open): read the file as it is, creating no
        # -wal / -shm beside it. With a -wal, a writer may be live: read through it.
        uri += "&immutable=1"
    try:
        conn = sqlite3.connect(
            uri, uri=True, timeout=busy_timeout, isolation_level=None, check_same_thread=False
        )
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open {_short(path, 200)} read-only: {exc}") from exc
    version = 0
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        _check_identity(conn, path)
        version = _schema_version(conn)
        latest = len(MIGRATIONS)
        if version > latest:
            raise StoreError(
                f"{_short(path, 200)} has schema version {version}, newer than this "
                f"marsys-mem knows ({latest}): upgrade marsys-mem to read it"
            )
        if version < 1:
            raise StoreError(
                f"{_short(path, 200)} records no schema version (its schema_version table "
                "is empty): it is damaged, or was not written by marsys-mem"
            )
        if version < latest:
            _stand_in(conn)
    except sqlite3.Error as exc:
        conn.close()
        raise StoreError(
            f"cannot read {_short(path, 200)}: {exc}"
            + (
                f" (schema version {version}: `marsys-mem migrate FILE` upgrades it)"
                if 0 < version < len(MIGRATIONS)
                else ""
            )
        ) from exc
    except BaseException:
        conn.close()
        raise
    return conn, version


_CREATE_TABLE = re.compile(r"CREATE TABLE (\w+) ")


def _stand_in(conn: sqlite3.Connection) -> None:
    """Make a store of an older schema readable as it is, writing nothing to it.

    Each table of :data:`SCHEMA` the file lacks stands in, in the connection's temporary
    schema: empty (the older version had none of those records), except ``key_counts``,
    a view counting the rows of ``messages``.
    """
    present = {
        str(name)
        for (name,) in conn.execute("SELECT name FROM main.sqlite_master WHERE type = 'table'")
    }
    for statement in SCHEMA:
        found = _CREATE_TABLE.match(statement)
        if found is None or found[1] in present:
            continue
        if found[1] == "key_counts":
            conn.execute(
                "CREATE TEMP VIEW key_counts AS SELECT namespace, agent, branch, count(*) AS n "
                "FROM main.messages GROUP BY namespace, agent, branch"
            )
        else:  # statements of the fixed SCHEMA above, nothing else
            conn.execute(statement.replace("CREATE TABLE ", "CREATE TEMP TABLE ", 1))


def _remove(path: str) -> None:
    for suffix in ("", "-journal", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path + suffix)


def _create(path: str) -> None:
    """Create a complete new store at ``path``, unless a file appears there first.

    The database is built under a temporary name in the same folder and hard-linked into
    place, which fails if the path exists: a reader never sees a half-made file, and of
    several processes creating the same store at once one wins and the others open its
    file. (Where the file system has no hard links it is renamed into place if the path
    is still free: a narrower race.)
    """
    folder, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(folder, f".{name}.{uuid.uuid4().hex}.creating")
    try:
        conn = sqlite3.connect(tmp, isolation_level=None)
        try:
            _migrate(conn, path)
            conn.execute("PRAGMA journal_mode = WAL")
        finally:
            conn.close()
        try:
            os.link(tmp, path)
        except FileExistsError:
            return  # another process created it first: use theirs
        except OSError:
            if os.path.lexists(path):
                return
            os.rename(tmp, path)
        with contextlib.suppress(OSError):  # make the new name durable too (POSIX)
            fd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot create a marsys-mem store at {_short(path, 200)}: {exc}") from exc
    except OSError as exc:
        raise StoreError(f"cannot create a marsys-mem store at {_short(path, 200)}: {exc}") from exc
    finally:
        _remove(tmp)


def _set_wal(conn: sqlite3.Connection, busy_timeout: float) -> str:
    """Switch to WAL; the switch can report busy without waiting, so retry until timeout."""
    deadline = time.monotonic() + busy_timeout
    while True:
        try:
            row = conn.execute("PRAGMA journal_mode = WAL").fetchone()
            return str(row[0]) if row else ""
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


# ---------------------------------------------------------------------- migrating a file
@dataclass(frozen=True, slots=True)
class Migrated:
    """What :func:`migrate_file` did.

    Attributes:
        path: the store file.
        from_version: its schema version before.
        to_version: its schema version now (:data:`SCHEMA_VERSION`).
        backup: the original file, kept beside it (``None``: nothing to migrate, or no
            backup asked for).

    Example:
        >>> Migrated("m.db", 5, 5).changed
        False
    """

    path: str
    from_version: int
    to_version: int
    backup: str | None = None

    @property
    def changed(self) -> bool:
        """Whether the file was migrated (it had an older schema)."""
        return self.from_version != self.to_version


def migrate_file(path: str | os.PathLike[str], *, backup: bool = True) -> Migrated:
    """Upgrade the store file at ``path`` to :data:`SCHEMA_VERSION`, whole or not at all.

    The file is never written: a copy (SQLite's backup API) is migrated and checked
    (``integrity_check``) beside it, then renamed over it in one step, the original kept
    as ``FILE.v{version}.bak`` (unless ``backup=False``). On any failure the copy is
    removed and the file's bytes are as they were. A store in use (its ``-wal`` or
    ``-shm`` beside it) is refused: close every process using it first (a process that
    kept it open would go on writing to the replaced file).

    Raises:
        StoreError: no such file, not a marsys-mem store, in use, a newer schema, or the
            migration failed (the message names the file and says it is unchanged).
    """
    path = os.fspath(path)
    shown = _short(path, 200)
    if not os.path.isfile(path):
        raise StoreError(f"{shown}: no such store file")
    _check_file(path)
    for suffix in ("-wal", "-shm"):
        if os.path.exists(path + suffix):
            raise StoreError(
                f"{shown} is in use, or was not closed cleanly ({_short(path + suffix, 200)} "
                "exists): close every process using it, then migrate (opening it once "
                "with the library also recovers and upgrades it)"
            )
    before = os.stat(path)
    conn, version = _open_read_only(path, 30.0)
    conn.close()
    if version == len(MIGRATIONS):
        return Migrated(path, version, version)
    folder, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(folder, f".{name}.{uuid.uuid4().hex}.migrating")
    try:
        source = sqlite3.connect(
            Path(os.path.abspath(path)).as_uri() + "?mode=ro&immutable=1", uri=True
        )
        target = sqlite3.connect(tmp, isolation_level=None)
        try:
            source.backup(target)
            _migrate(target, path)
            problems = [str(r[0]) for r in target.execute("PRAGMA integrity_check")]
            if problems == ["ok"]:
                problems = _count_mismatches(target) + _orphan_vectors(target) or problems
            if problems != ["ok"]:
                raise StoreError("the migrated copy fails its check: " + "; ".join(problems))
            target.execute("PRAGMA journal_mode = WAL")  # as every store is kept
        finally:
            source.close()
            target.close()
        os.chmod(tmp, stat.S_IMODE(before.st_mode))
        now = os.stat(path)
        if (now.st_ino, now.st_size, now.st_mtime_ns) != (
            before.st_ino,
            before.st_size,
            before.st_mtime_ns,
        ) or any(os.path.exists(path + s) for s in ("-wal", "-shm")):
            raise StoreError("it changed, or was opened, while it was being migrated")
        kept = _backup_name(path, version) if backup else None
        if kept is not None:
            os.link(path, kept)  # the original's own bytes, no copy
        os.replace(tmp, path)
    except (sqlite3.Error, OSError, StoreError, ValidationError, ValueError) as exc:
        reason = str(exc)
        if isinstance(exc, ValidationError):  # a row an older version stored does not validate
            reason = (
                f"a stored row does not validate ({error_reason(exc)}); `marsys-mem inspect "
                f"{shown}` lists such rows"
            )
        raise StoreError(
            f"{shown}: migrating schema version {version} to {len(MIGRATIONS)} failed, "
            f"the file is unchanged: {reason}"
        ) from exc
    finally:
        _remove(tmp)
    with contextlib.suppress(OSError):  # make the rename durable too (POSIX)
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return Migrated(path, version, len(MIGRATIONS), kept)


def _backup_name(path: str, version: int) -> str:
    """A free name for the original file: ``FILE.v1.bak``, else ``FILE.v1.2.bak``, ..."""
    name = f"{path}.v{version}.bak"
    n = 1
    while os.path.lexists(name):
        n += 1
        name = f"{path}.v{version}.{n}.bak"
    return name


# ---------------------------------------------------------------------- the store
class SQLiteStore(MemoryStore):
    """A :class:`~marsys_mem.store.base.MemoryStore` in one SQLite file.

    Args:
        path: the database file (``str`` or path; parent folders are created), or
            ``":memory:"`` for a private in-memory database. Where no file exists a new
            store is created; a file that exists must be a marsys-mem database.
        synchronous: ``"FULL"`` (default: a commit is on disk when it returns) or
            ``"NORMAL"`` (faster; in WAL mode the last commits can be lost on power loss,
            never on a process crash).
        busy_timeout: seconds to wait for another connection's write lock before failing.
        read_only: open an existing store for reading only: nothing is migrated or
            written (``inspect`` opens stores this way); writes raise
            :class:`~marsys_mem.exceptions.StoreError`. A store of an older schema is read
            as it is (what its version did not have reads as empty).

    Attributes:
        path: the database file, as given (``os.fspath``).
        synchronous: the ``PRAGMA synchronous`` level in use.
        busy_timeout: the busy timeout in seconds.
        journal_mode: what SQLite reported after asking for WAL (``"wal"`` for a file,
            ``"memory"`` for ``":memory:"``).
        schema_version: the file's schema version (older than :data:`SCHEMA_VERSION`
            only when opened read-only).

    Raises:
        StoreError: the file cannot be opened or created, is not a marsys-mem database
            (an empty file, not SQLite, another application's database, a folder), or
            has a schema version newer than this code knows.
        ValueError: ``synchronous`` or ``busy_timeout`` is invalid.

    Example:
        >>> from marsys_mem.model.messages import Message
        >>> with SQLiteStore(":memory:") as store:
        ...     key = ("default", "researcher", "main")
        ...     store.append_messages(key, [Message.user("hi")])
        ...     [m.text for m in store.load_messages(key)], store.integrity_check()
        (['hi'], 'ok')
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Synchronous = "FULL",
        busy_timeout: float = 30.0,
        read_only: bool = False,
    ) -> None:
        level = synchronous.upper() if isinstance(synchronous, str) else synchronous
        if level not in ("FULL", "NORMAL"):
            raise ValueError(f"synchronous must be 'FULL' or 'NORMAL', got {synchronous!r}")
        if (
            isinstance(busy_timeout, bool)
            or not isinstance(busy_timeout, int | float)
            or not 0 <= busy_timeout < 1e9  # also rules out nan and inf
        ):
            raise ValueError(
                f"busy_timeout must be a finite number of seconds >= 0, got {busy_timeout!r}"
            )
        self.path = os.fspath(path)
        self.synchronous: Synchronous = "FULL" if level == "FULL" else "NORMAL"
        self.busy_timeout = float(busy_timeout)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        if not self.path:
            raise StoreError("the path of an SQLiteStore must not be empty")
        memory = self.path == ":memory:"
        self.read_only = bool(read_only)
        self.schema_version = SCHEMA_VERSION
        if self.read_only:
            self._conn, self.schema_version = _open_read_only(self.path, self.busy_timeout)
            self.journal_mode = str(self._conn.execute("PRAGMA journal_mode").fetchone()[0])
            return
        if not memory:
            try:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
                exists = os.path.lexists(self.path)
            except (OSError, ValueError) as exc:
                raise StoreError(
                    f"cannot create the folder of {_short(self.path, 200)}: {exc}"
                ) from exc
            if not exists:
                _create(self.path)
            _check_file(self.path)
        try:
            if memory:
                conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
            else:  # mode=rw: never create a file here (only _create does, atomically)
                uri = Path(os.path.abspath(self.path)).as_uri() + "?mode=rw"
                conn = sqlite3.connect(
                    uri,
                    uri=True,
                    timeout=self.busy_timeout,
                    isolation_level=None,  # we issue BEGIN / COMMIT ourselves
                    check_same_thread=False,  # the lock serialises threads (async twins)
                )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open {_short(self.path, 200)}: {exc}") from exc
        try:
            # PRAGMA values cannot be bound; both are checked above (int, fixed set).
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            if not memory:
                _check_identity(conn, self.path)
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
            # A cascade deletes rows from inside the delete trigger: let it fire again.
            conn.execute("PRAGMA recursive_triggers = ON")
            # Deleted text is overwritten in the file, not left in free pages.
            conn.execute("PRAGMA secure_delete = ON")
            # Migrated before the switch to WAL: a migration that fails rolls back to the
            # file's very bytes (the journal mode, in the file's header, is left as it was).
            _migrate(conn, self.path)
            self.journal_mode = _set_wal(conn, self.busy_timeout)
        except sqlite3.Error as exc:
            conn.close()
            raise StoreError(
                f"cannot open {_short(self.path, 200)} as a marsys-mem store: {exc}"
            ) from exc
        except ValidationError as exc:  # a row an older version stored does not validate
            conn.close()
            raise StoreError(
                f"{_short(self.path, 200)}: migrating it to schema version {SCHEMA_VERSION} "
                f"failed, the file is unchanged: a stored row does not validate "
                f"({error_reason(exc)}); `marsys-mem inspect {_short(self.path, 200)}` lists "
                "such rows"
            ) from exc
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def __repr__(self) -> str:
        state = ", closed" if self.closed else ""
        return f"SQLiteStore({self.path!r}, synchronous={self.synchronous!r}{state})"

    supports_vectors: ClassVar[bool] = True

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Close the connection; further calls raise ``StoreError``. Idempotent."""
        with self._lock:
            self.closed = True
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()

    def scrub(self) -> None:
        """Checkpoint the WAL into the file and truncate it (after a forget).

        With ``secure_delete`` on, deleted rows are zeroed in the pages written back, so
        once the WAL is checkpointed and truncated no file of the store holds their text.
        A reader holding an old snapshot (another process) can keep the checkpoint from
        completing; the next scrub finishes it. A read-only store does nothing.
        """
        if self.read_only:
            return
        with self._lock:
            conn = self._open_conn()
            try:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"cannot checkpoint {self.path}: {exc}") from exc

    def integrity_check(self) -> str:
        """``PRAGMA integrity_check``, then ``key_counts`` against the rows it counts.

        Returns:
            ``"ok"``, or the problems found, one per line.

        Raises:
            StoreError: the store is closed or the check could not run.
        """
        with self._lock:
            conn = self._open_conn()
            try:
                conn.execute("BEGIN")  # one snapshot for both checks
                try:
                    problems = [str(r[0]) for r in conn.execute("PRAGMA integrity_check")]
                    if problems == ["ok"]:
                        problems = _count_mismatches(conn) + _orphan_vectors(conn) or problems
                finally:
                    conn.execute("COMMIT")
            except sqlite3.Error as exc:
                raise StoreError(f"integrity_check failed on {self.path}: {exc}") from exc
        return "\n".join(problems)

    def read_rows(
        self, key: Key, *, last: int | None = None, max_bytes: int | None = None
    ) -> list[StoredRow]:
        """The rows under ``key``, oldest first, each read on its own (for inspection).

        A row that does not validate (bad JSON, a message the model refuses) comes back
        with its ``error`` rather than failing the read: one bad row hides nothing else.

        Args:
            key: ``(namespace, agent, branch)``.
            last: only the newest ``last`` rows.
            max_bytes: a row larger than this is not loaded: only its first ``max_bytes``
                bytes are read (incremental blob I/O), for its role and the beginning of
                its text (``head_text``). ``None``: every row is loaded whole.

        Raises:
            ValueError: a bad key, ``last`` or ``max_bytes``.
            StoreError: the store is closed or cannot be read.
        """
        validate_key(key)
        for name, value in (("last", last), ("max_bytes", max_bytes)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{name} must be an int or None, got {value!r}")
        if last is not None and last < 0:
            raise ValueError(f"last must be >= 0, got {last!r}")
        if max_bytes is not None and max_bytes < 64:
            raise ValueError(f"max_bytes must be >= 64, got {max_bytes!r}")
        if last == 0:
            return []
        data = ", data" if max_bytes is None else ""
        sql = f"SELECT seq, message_id, ts{data} FROM messages WHERE {_KEY_WHERE}"  # noqa: S608 (SQL from constants; values bound)
        params: list[Any] = list(key)
        if last is not None:
            sql = f"SELECT * FROM ({sql} ORDER BY seq DESC LIMIT ?) ORDER BY seq"  # noqa: S608 (SQL from constants; values bound)
            params.append(last)
        else:
            sql += " ORDER BY seq"
        with self._lock:
            conn = self._open_conn()
            try:
                conn.execute("BEGIN")  # one snapshot for the rows and their blobs
                try:
                    rows = conn.execute(sql, params).fetchall()
                    if max_bytes is None:
                        return _whole_rows(rows)
                    return [_bounded_row(conn, row, max_bytes) for row in rows]
                finally:
                    conn.execute("COMMIT")
            except sqlite3.Error as exc:
                raise StoreError(
                    f"cannot read the rows of {key} in {self.path}: {exc}{self._older()}"
                ) from exc

    async def aread_rows(
        self, key: Key, *, last: int | None = None, max_bytes: int | None = None
    ) -> list[StoredRow]:
        """Async twin of :meth:`read_rows`."""
        return await asyncio.to_thread(self.read_rows, key, last=last, max_bytes=max_bytes)

    def _older(self) -> str:
        """A hint for errors on a store read as it is, with an older schema."""
        if self.schema_version >= SCHEMA_VERSION:
            return ""
        return (
            f" (its schema version is {self.schema_version}, older than this marsys-mem's "
            f"{SCHEMA_VERSION}: `marsys-mem migrate {self.path}` upgrades it)"
        )

    def _open_conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"SQLiteStore({self.path!r}) is closed")
        return self._conn

    # ------------------------------------------------------------------ core
    def _batch(self, ops: Sequence[Op]) -> list[Any]:
        # Serialise outside the lock: the transaction then holds the file only for SQL.
        rows = {id(op): _rows(op) for op in ops if isinstance(op, Append)}
        writes = any(isinstance(op, _WRITES) for op in ops)
        if writes and self.read_only:
            raise StoreError(f"{self.path} is open read-only: nothing can be written")
        with self._lock:
            conn = self._open_conn()
            try:
                conn.execute("BEGIN IMMEDIATE" if writes else "BEGIN")
            except sqlite3.Error as exc:
                raise StoreError(f"cannot start a transaction on {self.path}: {exc}") from exc
            try:
                results = [_execute(conn, op, rows) for op in ops]
                if any(isinstance(op, _DELETES) for op in ops):
                    _prune_deletions(conn)
                conn.execute("COMMIT")
            except BaseException as exc:
                _rollback(conn)
                if isinstance(exc, sqlite3.Error):
                    raise StoreError(
                        f"SQLite error on {self.path}, batch rolled back: {exc}{self._older()}"
                    ) from exc
                if isinstance(exc, ValidationError):
                    raise StoreError(
                        f"{self.path} holds data that does not validate: {exc}"
                    ) from exc
                raise
        return results


def _time(ts: int) -> datetime:
    return _EPOCH + timedelta(microseconds=int(ts))


def _whole_rows(rows: list[tuple[Any, ...]]) -> list[StoredRow]:
    """Rows ``(seq, message_id, ts, data)`` validated: all at once, else one by one."""
    try:  # the common case: every row valid, validated in one call
        messages: list[Message | None] = list(
            MESSAGE_LIST_ADAPTER.validate_json("[" + ",".join(r[3] for r in rows) + "]")
        )
        errors: list[str | None] = [None] * len(rows)
    except (ValidationError, TypeError):  # TypeError: a row's data is not text
        messages, errors = [], []
        for row in rows:
            try:
                messages.append(Message.model_validate_json(row[3]))
                errors.append(None)
            except (ValidationError, TypeError) as exc:
                messages.append(None)
                errors.append(error_reason(exc))
    return [
        StoredRow(
            int(seq),
            str(mid),
            _time(ts),
            len(data.encode()) if isinstance(data, str) else len(data or b""),
            message=message,
            role=message.role if message is not None else None,
            error=error,
        )
        for (seq, mid, ts, data), message, error in zip(rows, messages, errors, strict=True)
    ]


def _bounded_row(conn: sqlite3.Connection, row: tuple[Any, ...], max_bytes: int) -> StoredRow:
    """Row ``(seq, message_id, ts)`` read through a blob: whole if small, else its head."""
    seq, mid, ts = int(row[0]), str(row[1]), _time(row[2])
    with conn.blobopen("messages", "data", seq, readonly=True) as blob:
        size = len(blob)
        head = blob.read(min(size, max_bytes))
    if size <= max_bytes:
        try:
            message = Message.model_validate_json(head)
        except ValidationError as exc:
            return StoredRow(seq, mid, ts, size, error=error_reason(exc))
        return StoredRow(seq, mid, ts, size, message=message, role=message.role)
    try:
        role, text = head_preview(head)
    except ValueError as exc:
        return StoredRow(seq, mid, ts, size, error=error_reason(exc))
    return StoredRow(seq, mid, ts, size, role=role, head_text=text)


def _count_mismatches(conn: sqlite3.Connection) -> list[str]:
    """Keys whose ``key_counts`` row disagrees with the rows in ``messages``."""
    cur = conn.execute(
        "SELECT namespace, agent, branch, sum(actual), sum(counted) FROM ("
        " SELECT namespace, agent, branch, count(*) AS actual, 0 AS counted FROM messages"
        " GROUP BY namespace, agent, branch"
        " UNION ALL SELECT namespace, agent, branch, 0, n FROM key_counts)"
        " GROUP BY namespace, agent, branch HAVING sum(actual) != sum(counted)"
    )
    return [
        f"key_counts of {(ns, agent, branch)!r}: {counted}, but {actual} rows"
        for ns, agent, branch, actual, counted in cur
    ]


def _orphan_vectors(conn: sqlite3.Connection) -> list[str]:
    """Vectors whose message is gone, or whose key or id disagrees with it."""
    (n,) = conn.execute(
        "SELECT count(*) FROM vectors v LEFT JOIN messages m ON m.seq = v.msg_seq "
        "WHERE m.seq IS NULL OR m.namespace != v.namespace OR m.agent != v.agent "
        "OR m.branch != v.branch OR m.message_id != v.message_id"
    ).fetchone()
    return [f"{n} vectors without their message"] if n else []


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:  # pragma: no cover - the original error is what matters
            pass


Row = tuple[str, str, str, str, int, int, str]


def _rows(op: Append) -> list[Row]:
    ns, agent, branch = op.key
    return [
        (
            ns,
            agent,
            branch,
            m.message_id,
            _micros(m.timestamp),
            int(m.is_protected),
            m.model_dump_json(),
        )
        for m in op.messages
    ]


def _execute(conn: sqlite3.Connection, op: Op, rows: dict[int, list[Row]]) -> Any:
    if isinstance(op, Append):
        return _append(conn, op, rows[id(op)])
    if isinstance(op, Load):
        return _load(conn, op)
    if isinstance(op, LoadAround):
        return messages_around(_load(conn, Load(op.key)), op) if op.ids else []
    if isinstance(op, Delete):
        return _delete(conn, op)
    if isinstance(op, CountMessages):
        return _count(conn, op.key)
    if isinstance(op, ExpectLast):
        return _expect_last(conn, op)
    if isinstance(op, ListKeys):
        if op.namespace is None:
            cur = conn.execute("SELECT DISTINCT namespace, agent, branch FROM messages")
        else:
            cur = conn.execute(
                "SELECT DISTINCT namespace, agent, branch FROM messages WHERE namespace = ?",
                (op.namespace,),
            )
        return sorted((str(a), str(b), str(c)) for a, b, c in cur)
    if isinstance(op, SaveRun):
        s = op.snapshot
        conn.execute(
            "INSERT INTO runs (run_id, parent_id, namespace, agent, started_at, data) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (run_id) DO UPDATE SET "
            "parent_id = excluded.parent_id, namespace = excluded.namespace, "
            "agent = excluded.agent, started_at = excluded.started_at, data = excluded.data",
            (
                s.run_id,
                s.parent_id,
                s.namespace,
                s.agent,
                _micros(s.started_at),
                s.model_dump_json(),
            ),
        )
        return None
    if isinstance(op, LoadRun):
        found = conn.execute("SELECT data FROM runs WHERE run_id = ?", (op.run_id,)).fetchone()
        return RunSnapshot.model_validate_json(found[0]) if found else None
    if isinstance(op, ListRuns):
        return _list_runs(conn, op)
    if isinstance(op, EnforceRetention):
        return _retention(conn, op)
    if isinstance(op, LoadAfter):
        return _load_after(conn, op)
    if isinstance(op, PutVectors):
        return _put_vectors(conn, op)
    if isinstance(op, LoadVectors):
        return _load_vectors(conn, op)
    if isinstance(op, LoadDeletions):
        return _load_deletions(conn, op)
    raise TypeError(f"unknown store operation {op!r}")  # pragma: no cover


def _append(conn: sqlite3.Connection, op: Append, rows: list[Row]) -> None:
    before = conn.total_changes  # no trigger fires on insert: these are our rows
    try:
        conn.executemany(_INSERT, rows)
    except sqlite3.IntegrityError as exc:
        inserted = conn.total_changes - before  # rows of this op before the failing one
        if "UNIQUE" not in str(exc) or not 0 <= inserted < len(op.messages):
            raise
        duplicate = op.messages[inserted].message_id
        raise DuplicateMessageError(
            f"message_id {duplicate!r} is already stored under {op.key}"
        ) from exc
    if rows:  # counted here, once per append (a per-row trigger costs ~20% of batched speed)
        conn.execute(_COUNT_ADD, (*op.key, len(rows)))
    if op.copies_of is not None:
        conn.execute(
            "INSERT OR IGNORE INTO key_copies (o_namespace, o_agent, o_branch, namespace, "
            "agent, branch) VALUES (?, ?, ?, ?, ?, ?)",
            (*op.copies_of, *op.key),
        )
    if op.sources:
        conn.executemany(
            _SOURCE_INSERT,
            [
                (*op.key, m.message_id, *ref.key, ref.message_id)
                for m, refs in zip(op.messages, op.sources, strict=True)
                for ref in refs
            ],
        )


def _load_deletions(conn: sqlite3.Connection, op: LoadDeletions) -> DeletionPage:
    (head,) = conn.execute("SELECT coalesce(max(dseq), 0) FROM deletions").fetchone()
    if op.after is None:
        return DeletionPage((), (), int(head))
    (first,) = conn.execute("SELECT min(dseq) FROM deletions").fetchone()
    sql = "SELECT dseq, namespace, agent, branch, message_id FROM deletions WHERE dseq > ?"
    params: list[Any] = [op.after]
    if op.namespace is not None:
        sql += " AND namespace = ?"
        params.append(op.namespace)
    rows = conn.execute(sql + " ORDER BY dseq", params).fetchall()
    return DeletionPage.of_rows(rows, head=int(head), after=op.after, first=first)


def _prune_deletions(conn: sqlite3.Connection) -> None:
    """Keep the newest :data:`DELETION_LOG_SIZE` entries of the deletion log."""
    conn.execute(
        "DELETE FROM deletions WHERE dseq <= (SELECT max(dseq) FROM deletions) - ?",
        (DELETION_LOG_SIZE,),
    )


def _load(conn: sqlite3.Connection, op: Load) -> list[Message]:
    if op.last == 0:
        return []
    sql = f"SELECT seq, data FROM messages WHERE {_KEY_WHERE}"  # noqa: S608 (SQL from constants; values bound)
    params: list[Any] = list(op.key)
    if op.ids is not None:
        if not op.ids:
            return []
        where_ids, id_params = _ids_in(op.ids)
        sql += f" AND {where_ids}"
        params.extend(id_params)
    if op.since is not None:
        sql += " AND ts >= ?"
        params.append(_micros(op.since))
    if op.last is not None:
        sql = f"SELECT seq, data FROM ({sql} ORDER BY seq DESC LIMIT ?) ORDER BY seq"  # noqa: S608 (SQL from constants; values bound)
        params.append(op.last)
    else:
        sql += " ORDER BY seq"
    data = [row[1] for row in conn.execute(sql, params)]
    if not data:
        return []
    return MESSAGE_LIST_ADAPTER.validate_json("[" + ",".join(data) + "]")


def _delete_where(
    conn: sqlite3.Connection,
    where: str,
    params: Sequence[Any],
    owner: tuple[str, str, str] | None = None,
) -> int:
    """``DELETE FROM messages WHERE {where}``, their copies first; the rows deleted.

    Copies live in the keys that hold copies of a deleted row's key (``key_copies``),
    under the same id; they are deleted set-based, one statement per holding key (and
    their own copies in turn). ``owner``: the one key ``where`` is limited to, if any.
    The rest of the cascade (sources, the log) is the triggers' work.
    """
    if owner is None:
        pairs = conn.execute(
            "SELECT o_namespace, o_agent, o_branch, namespace, agent, branch FROM key_copies"
        ).fetchall()
    else:
        pairs = [
            (*owner, *holder)
            for holder in conn.execute(
                "SELECT namespace, agent, branch FROM key_copies WHERE o_namespace = ? "
                "AND o_agent = ? AND o_branch = ?",
                owner,
            )
        ]
    for ns, agent, branch, *holder in pairs:
        # the subquery's bare columns are its own (the innermost FROM): the deleted rows
        _delete_where(
            conn,
            f"{_KEY_WHERE} AND message_id IN (SELECT message_id FROM messages WHERE {where} "  # noqa: S608 (SQL from constants; values bound)
            "AND namespace = ? AND agent = ? AND branch = ?)",
            (*holder, *params, ns, agent, branch),
            owner=(holder[0], holder[1], holder[2]),
        )
    return max(conn.execute(f"DELETE FROM messages WHERE {where}", params).rowcount, 0)  # noqa: S608 (SQL from constants; values bound)


def _ids_in(ids: Sequence[str]) -> tuple[str, list[Any]]:
    """``message_id IN (...)``: a list of values (index lookups) when short, else JSON.

    SQLite looks each value of a short list up in the key's unique index; for a long
    list (past the bound-parameter limit) it scans the key's rows once instead.
    """
    if len(ids) <= _CHUNK:
        return f"message_id IN ({','.join('?' * len(ids))})", list(ids)
    return "message_id IN (SELECT value FROM json_each(?))", [json.dumps(list(ids))]


def _delete(conn: sqlite3.Connection, op: Delete) -> int:
    where, params = _KEY_WHERE, list[Any](op.key)
    if op.ids is not None:
        if not op.ids:
            return 0
        where_ids, id_params = _ids_in(op.ids)
        where += f" AND {where_ids}"
        params.extend(id_params)
    if op.before is not None:
        where += " AND ts < ?"
        params.append(_micros(op.before))
    return _delete_where(conn, where, params, op.key)


def _expect_last(conn: sqlite3.Connection, op: ExpectLast) -> None:
    """Raise ``ConflictError`` unless ``op.key``'s newest row is ``op.message_id``.

    The batch runs under ``BEGIN IMMEDIATE`` (``ExpectLast`` is a write): no other
    connection can change the key between this check and the commit.
    """
    row = conn.execute(
        f"SELECT message_id FROM messages WHERE {_KEY_WHERE} ORDER BY seq DESC LIMIT 1", op.key  # noqa: S608 (SQL from constants; values bound)
    ).fetchone()
    found = None if row is None else str(row[0])
    if found != op.message_id:
        raise conflict_error(op, found)


def _count(conn: sqlite3.Connection, key: tuple[str, str, str]) -> int:
    """Rows under ``key``, from ``key_counts`` (O(1); exact in every committed state)."""
    row = conn.execute(f"SELECT n FROM key_counts WHERE {_KEY_WHERE}", key).fetchone()  # noqa: S608 (SQL from constants; values bound)
    return int(row[0]) if row else 0


def _list_runs(conn: sqlite3.Connection, op: ListRuns) -> list[str]:
    clauses: list[str] = []
    params: list[str] = []
    for column, value in (
        ("namespace", op.namespace),
        ("agent", op.agent),
        ("parent_id", op.parent_id),
    ):
        if value is not None:
            clauses.append(f"{column} = ?")  # column names from the fixed tuple above
            params.append(value)
    where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
    cur = conn.execute(f"SELECT run_id FROM runs{where} ORDER BY started_at, rowid", params)  # noqa: S608 (SQL from constants; values bound)
    return [str(row[0]) for row in cur]


def _retention(conn: sqlite3.Connection, op: EnforceRetention) -> int:
    """The retention rule of :mod:`marsys_mem.store.retention`, in SQL.

    ttl: ``protected = 0 AND ts < cutoff`` is :func:`~marsys_mem.store.retention.is_expired`
    with the cutoff of :func:`~marsys_mem.store.retention.ttl_cutoff`. The bound: per key,
    the excess rows in :data:`~marsys_mem.store.retention.EVICTION_ORDER` (by ``protected``,
    then ``seq``: oldest first within each class), as ``evict_order`` chooses them.
    """
    deleted = 0
    where, key_params = (_KEY_WHERE, tuple(op.key)) if op.key is not None else ("1", ())
    cutoff = ttl_cutoff(op.now, op.ttl)
    if cutoff is not None:
        deleted += _delete_where(
            conn,
            f"{where} AND protected = 0 AND ts < ?",
            (*key_params, _micros(cutoff)),
            op.key,
        )
    if op.max_messages is not None:
        # Counted inside this (write) transaction: the bound holds across processes.
        if op.key is not None:
            over: list[tuple[str, str, str, int]] = [(*op.key, _count(conn, op.key))]
        else:
            over = conn.execute(
                "SELECT namespace, agent, branch, n FROM key_counts WHERE n > ? "
                "ORDER BY namespace, agent, branch",
                (op.max_messages,),
            ).fetchall()
        for ns, agent, branch, count in over:
            excess = int(count) - op.max_messages
            # One query per protection class, in the rule's order; each walks the key's
            # index in seq order and stops after `excess` rows.
            for protected in EVICTION_ORDER:
                if excess <= 0:
                    break
                gone = _delete_where(
                    conn,
                    "seq IN (SELECT seq FROM messages "  # noqa: S608 (SQL from constants; values bound)
                    f"WHERE {_KEY_WHERE} AND protected = ? ORDER BY seq LIMIT ?)",
                    (ns, agent, branch, int(protected), excess),
                    (ns, agent, branch),
                )
                deleted += gone
                excess -= gone
    return deleted


# ---------------------------------------------------------------------- vectors
def _load_after(conn: sqlite3.Connection, op: LoadAfter) -> MessagePage:
    rows = conn.execute(
        f"SELECT seq, data FROM messages WHERE {_KEY_WHERE} AND seq > ? ORDER BY seq",  # noqa: S608 (SQL from constants; values bound)
        (*op.key, op.after),
    ).fetchall()
    messages = (
        MESSAGE_LIST_ADAPTER.validate_json("[" + ",".join(r[1] for r in rows) + "]") if rows else []
    )
    cursor = int(rows[-1][0]) if rows else op.after
    return MessagePage(messages, cursor, _count(conn, op.key))


def _model_dim(conn: sqlite3.Connection, model: str) -> int | None:
    row = conn.execute("SELECT dim FROM vector_models WHERE model = ?", (model,)).fetchone()
    return int(row[0]) if row else None


def _put_vectors(conn: sqlite3.Connection, op: PutVectors) -> int:
    dim = int(op.vectors.shape[1])
    known = _model_dim(conn, op.model)
    if known is None:
        conn.execute("INSERT INTO vector_models (model, dim) VALUES (?, ?)", (op.model, dim))
    elif known != dim:
        raise ValueError(f"vectors of model {op.model!r} are {known}-D in this store, got {dim}-D")
    seq_of: dict[str, int] = {}
    ids = op.message_ids
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start : start + _CHUNK]
        marks = ",".join("?" * len(chunk))
        for seq, mid in conn.execute(
            f"SELECT seq, message_id FROM messages WHERE {_KEY_WHERE} AND message_id IN ({marks})",  # noqa: S608 (SQL from constants; values bound)
            (*op.key, *chunk),
        ):
            seq_of[str(mid)] = int(seq)
    for mid in ids:
        if mid not in seq_of:
            raise MessageNotFoundError(f"put_vectors: no message {mid!r} is stored under {op.key}")
    conn.executemany(
        "INSERT OR REPLACE INTO vectors "
        "(msg_seq, namespace, agent, branch, message_id, model, data) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        [
            (seq_of[mid], *op.key, mid, op.model, to_bytes(op.vectors[i]))
            for i, mid in enumerate(ids)
        ],
    )
    return len(ids)


def _load_vectors(conn: sqlite3.Connection, op: LoadVectors) -> VectorPage:
    dim = _model_dim(conn, op.model) or 0
    sql = "SELECT vseq, namespace, agent, branch, message_id, data FROM vectors WHERE "
    params: list[Any] = []
    if op.key is not None:
        sql += f"{_KEY_WHERE} AND "
        params.extend(op.key)
    sql += "model = ? AND vseq > ? ORDER BY vseq"
    params.extend((op.model, op.after))
    if op.limit is not None:
        sql += " LIMIT ?"
        params.append(op.limit)
    rows = conn.execute(sql, params).fetchall()
    try:
        vectors = from_bytes([bytes(r[5]) for r in rows], dim)
    except ValueError as exc:
        raise StoreError(f"stored vectors of model {op.model!r} are corrupt: {exc}") from exc
    return VectorPage(
        tuple((str(r[1]), str(r[2]), str(r[3])) for r in rows),
        tuple(str(r[4]) for r in rows),
        vectors,
        int(rows[-1][0]) if rows else op.after,
    )
