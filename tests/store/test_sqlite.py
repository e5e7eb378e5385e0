"""SQLiteStore beyond the conformance suite: schema, migrations, crashes, processes, bounds."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import marsys_mem.store.sqlite as sqlite_mod
from marsys_mem.exceptions import DuplicateMessageError, StoreError
from marsys_mem.model.messages import Message
from marsys_mem.model.runs import RunSnapshot
from marsys_mem.store import InMemoryStore, SQLiteStore
from marsys_mem.store.base import (
    Append,
    CountMessages,
    Delete,
    EnforceRetention,
    Key,
    ListKeys,
    Load,
    Op,
    SaveRun,
)
from marsys_mem.testing.conformance.data import T0, snapshot_of, user_messages

KEY: Key = ("default", "researcher", "main")


@contextlib.contextmanager
def raw(path: Path) -> Iterator[sqlite3.Connection]:
    """A plain sqlite3 connection to inspect or forge a file (always closed)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        yield conn
    finally:
        conn.close()


def rows(path: Path) -> list[tuple[Any, ...]]:
    with raw(path) as conn:
        return conn.execute(
            "SELECT seq, namespace, agent, branch, message_id, ts, protected, data "
            "FROM messages ORDER BY seq"
        ).fetchall()


def dump(path: Path) -> Any:
    """Every row of every table, and the AUTOINCREMENT counter."""
    with raw(path) as conn:
        return (
            rows(path),
            conn.execute("SELECT * FROM runs ORDER BY rowid").fetchall(),
            conn.execute("SELECT * FROM sqlite_sequence").fetchall(),
            conn.execute("SELECT version FROM schema_version ORDER BY version").fetchall(),
        )


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "store.db"


@pytest.fixture
def store(db: Path) -> Iterator[SQLiteStore]:
    s = SQLiteStore(db)
    yield s
    s.close()


# ---------------------------------------------------------------------- opening
def test_schema_version_table_and_pragmas(store: SQLiteStore, db: Path) -> None:
    assert store.journal_mode == "wal"
    assert store.synchronous == "FULL"
    conn = store._conn
    assert conn is not None
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert conn.execute("PRAGMA synchronous").fetchone() == (2,)  # FULL
    assert conn.execute("PRAGMA busy_timeout").fetchone() == (30000,)
    with raw(db) as check:
        versions = check.execute("SELECT version FROM schema_version ORDER BY version")
        # a new store is made from SCHEMA at once: one row, the current version
        assert [v for (v,) in versions] == [len(sqlite_mod.MIGRATIONS)]
        columns = [c[1] for c in check.execute("PRAGMA table_info(messages)")]
        assert columns == [
            "seq",
            "namespace",
            "agent",
            "branch",
            "message_id",
            "ts",
            "data",
            "protected",
        ]
        run_columns = [c[1] for c in check.execute("PRAGMA table_info(runs)")]
        assert run_columns == ["run_id", "parent_id", "namespace", "agent", "started_at", "data"]


def test_options(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "n.db", synchronous="NORMAL", busy_timeout=0.5) as s:
        assert s._conn is not None
        assert s._conn.execute("PRAGMA synchronous").fetchone() == (1,)
        assert s._conn.execute("PRAGMA busy_timeout").fetchone() == (500,)
        assert "NORMAL" in repr(s)
    with pytest.raises(ValueError, match="synchronous"):
        SQLiteStore(tmp_path / "x.db", synchronous="OFF")  # type: ignore[arg-type]
    for bad in (-1, float("nan"), float("inf"), True, "30"):
        with pytest.raises(ValueError, match="busy_timeout"):
            SQLiteStore(tmp_path / "x.db", busy_timeout=bad)  # type: ignore[arg-type]
    assert not (tmp_path / "x.db").exists()


def test_paths_str_path_nested_and_memory(tmp_path: Path) -> None:
    nested = tmp_path / "a" / "b" / "c.db"
    with SQLiteStore(str(nested)) as s:
        s.append_messages(KEY, user_messages(1))
    assert nested.exists()
    with SQLiteStore(nested) as s:
        assert s.count_messages(KEY) == 1
    with SQLiteStore(":memory:") as s:
        s.append_messages(KEY, user_messages(2))
        assert s.count_messages(KEY) == 2
        assert s.integrity_check() == "ok"


def test_data_survives_reopen(db: Path) -> None:
    msgs = user_messages(5)
    snap = snapshot_of("r1")
    with SQLiteStore(db) as s:
        s.append_messages(KEY, msgs)
        s.save_run(snap)
    with SQLiteStore(db) as s:
        assert s.load_messages(KEY) == msgs
        assert s.load_run("r1") == snap
        s.append_messages(KEY, user_messages(1, prefix="n"))
        assert [m.message_id for m in s.load_messages(KEY, last=2)] == ["m4", "n0"]


def _make_zero_byte(path: Path) -> None:
    path.write_bytes(b"")


def _make_text(path: Path) -> None:
    path.write_bytes(b"this is not sqlite" * 100)


def _make_other_app(path: Path) -> None:
    with raw(path) as conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO users (name) VALUES ('ada')")


def _make_half_ours(path: Path) -> None:
    with raw(path) as conn:  # one of our table names, but not our schema
        conn.execute("CREATE TABLE messages (x)")


def _make_no_tables(path: Path) -> None:
    with raw(path) as conn:
        conn.execute("PRAGMA user_version = 7")  # a valid SQLite file with no tables


def _make_foreign_id(path: Path) -> None:
    with raw(path) as conn:  # our tables, but another application's id
        conn.executescript(V1_SCHEMA)
        conn.execute("PRAGMA application_id = 1234")


def _make_folder(path: Path) -> None:
    path.mkdir()


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (_make_zero_byte, "it is an empty file"),
        (_make_text, "it is not an SQLite database"),
        (_make_other_app, "another application, with tables users"),
        (_make_half_ours, "another application, with tables messages"),
        (_make_no_tables, "SQLite database with no tables"),
        (_make_foreign_id, "application_id is 0x4d2, another application's"),
        (_make_folder, "it is a folder"),
    ],
)
def test_an_existing_file_that_is_not_ours_is_refused_and_left_alone(
    tmp_path: Path, make: Any, reason: str
) -> None:
    """Only where no file exists is a store created (issue 9, item 5)."""
    path = tmp_path / "memory.db"
    make(path)
    before = sorted((p.name, p.read_bytes() if p.is_file() else None) for p in tmp_path.iterdir())
    for attempt in range(2):  # still refused the second time: nothing was written
        with pytest.raises(StoreError) as info:
            SQLiteStore(path)
        message = str(info.value)
        assert str(path) in message, attempt
        assert "is not a marsys-mem database" in message
        assert reason in message
    after = sorted((p.name, p.read_bytes() if p.is_file() else None) for p in tmp_path.iterdir())
    assert after == before


def test_a_long_path_is_shortened_in_the_error(tmp_path: Path) -> None:
    path = tmp_path / ("x" * 200 + ".db")
    path.write_bytes(b"")
    with pytest.raises(StoreError, match="empty file") as info:
        SQLiteStore(path)
    assert len(str(info.value)) < 400


def test_empty_path_is_refused() -> None:
    with pytest.raises(StoreError, match="must not be empty"):
        SQLiteStore("")


def test_a_new_store_is_stamped_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    with SQLiteStore(path) as s:
        s.append_messages(KEY, user_messages(1))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.db"]
    with raw(path) as conn:
        assert conn.execute("PRAGMA application_id").fetchone() == (sqlite_mod.APPLICATION_ID,)
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    with SQLiteStore(path) as s:  # and it opens again
        assert s.count_messages(KEY) == 1


def test_a_failed_creation_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("SELECT * FROM no_such_table")

    monkeypatch.setattr(sqlite_mod, "MIGRATIONS", (*sqlite_mod.MIGRATIONS, broken))
    with pytest.raises(StoreError, match="cannot create a marsys-mem store"):
        SQLiteStore(tmp_path / "new.db")
    assert list(tmp_path.iterdir()) == []


def test_closed_store(store: SQLiteStore) -> None:
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.integrity_check()
    assert "closed" in repr(store)


# ---------------------------------------------------------------------- migrations
V1_SCHEMA = """
CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL);
CREATE TABLE messages (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    namespace TEXT NOT NULL, agent TEXT NOT NULL, branch TEXT NOT NULL,
    message_id TEXT NOT NULL, ts INTEGER NOT NULL, data TEXT NOT NULL,
    UNIQUE (namespace, agent, branch, message_id));
CREATE INDEX messages_by_key ON messages (namespace, agent, branch);
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY, parent_id TEXT, namespace TEXT NOT NULL, agent TEXT NOT NULL,
    started_at INTEGER NOT NULL, data TEXT NOT NULL);
CREATE INDEX runs_by_agent ON runs (namespace, agent);
CREATE INDEX runs_by_parent ON runs (parent_id);
INSERT INTO schema_version VALUES (1, '2024-01-01T00:00:00+00:00');
"""


def _micros(dt: datetime) -> int:
    return (dt - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def test_migrates_a_version_1_file(db: Path) -> None:
    """A file written before the ``protected`` column existed is upgraded and backfilled."""
    start = T0 - timedelta(days=10)
    msgs = [
        Message.system("rules", message_id="s", timestamp=start),
        Message.user("pinned", message_id="p", timestamp=start, pinned=True),
        Message.user("kept", message_id="k", timestamp=start, metadata={"preserve": True}),
        *user_messages(1500, start=start),  # more than one backfill chunk
    ]
    snap = snapshot_of("r1")
    with raw(db) as conn:
        conn.executescript(V1_SCHEMA)
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO messages (namespace, agent, branch, message_id, ts, data) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [(*KEY, m.message_id, _micros(m.timestamp), m.model_dump_json()) for m in msgs],
        )
        conn.execute(
            "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?)",
            ("r1", None, "default", "researcher", _micros(T0), snap.model_dump_json()),
        )
        conn.execute("COMMIT")
    with SQLiteStore(db) as s:
        assert s.load_messages(KEY) == msgs
        assert s.load_run("r1") == snap
        with raw(db) as conn:
            protected = conn.execute("SELECT message_id FROM messages WHERE protected = 1")
            assert sorted(i for (i,) in protected) == ["k", "p", "s"]
            versions = conn.execute("SELECT version FROM schema_version ORDER BY version")
            assert [v for (v,) in versions] == [1, 2, 3, 4, 5]
            counts = conn.execute("SELECT namespace, agent, branch, n FROM key_counts")
            assert counts.fetchall() == [(*KEY, 1503)]
            stamp = conn.execute("PRAGMA application_id").fetchone()
            assert stamp == (sqlite_mod.APPLICATION_ID,)
        assert s.integrity_check() == "ok"
        assert s.enforce_retention(KEY, ttl=timedelta(days=1), now=T0) == 1500
        assert [m.message_id for m in s.load_messages(KEY)] == ["s", "p", "k"]


def test_newer_version_is_refused(db: Path) -> None:
    with SQLiteStore(db) as s:
        s.append_messages(KEY, user_messages(2))
    newer = len(sqlite_mod.MIGRATIONS) + 1
    with raw(db) as conn:
        conn.execute("INSERT INTO schema_version VALUES (?, 'future')", (newer,))
    before = dump(db)
    with pytest.raises(StoreError, match=f"schema version {newer}, newer"):
        SQLiteStore(db)
    assert dump(db) == before


def test_migrations_run_in_order_in_one_transaction(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with SQLiteStore(db) as s:
        s.append_messages(KEY, user_messages(3))
    applied: list[int] = []
    latest = len(sqlite_mod.MIGRATIONS)

    def extra(conn: sqlite3.Connection) -> None:
        applied.append(latest + 1)
        conn.execute("CREATE TABLE extra (x INTEGER)")

    def broken(conn: sqlite3.Connection) -> None:
        applied.append(latest + 2)
        conn.execute("INSERT INTO extra VALUES (1)")
        conn.execute("SELECT * FROM no_such_table")

    before = dump(db)
    monkeypatch.setattr(sqlite_mod, "MIGRATIONS", (*sqlite_mod.MIGRATIONS, extra, broken))
    with pytest.raises(StoreError, match="no_such_table"):
        SQLiteStore(db)
    assert applied == [latest + 1, latest + 2]
    assert dump(db) == before  # the first was rolled back with the second
    with raw(db) as conn:
        assert conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'extra'").fetchone() is None

    monkeypatch.setattr(sqlite_mod, "MIGRATIONS", (*sqlite_mod.MIGRATIONS[:latest], extra))
    with SQLiteStore(db) as s:
        assert s.count_messages(KEY) == 3
    with raw(db) as conn:
        versions = [v for (v,) in conn.execute("SELECT version FROM schema_version")]
        assert versions == [latest, latest + 1]  # created from SCHEMA, then one migration
        assert conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'extra'").fetchone()


# ---------------------------------------------------------------------- atomicity
def test_failed_batch_leaves_the_file_unchanged(store: SQLiteStore, db: Path) -> None:
    store.append_messages(KEY, user_messages(100))
    store.append_messages(("default", "writer", "main"), user_messages(10, prefix="w"))
    store.save_run(snapshot_of("r1"))
    before = dump(db)
    middle = [*user_messages(50, prefix="n"), Message.user("dup", message_id="m42")]
    middle += user_messages(50, prefix="z")
    with pytest.raises(DuplicateMessageError, match="'m42'") as info:
        store.append_messages(KEY, middle)
    assert "researcher" in str(info.value)
    assert isinstance(info.value.__cause__, sqlite3.IntegrityError)
    assert dump(db) == before
    with pytest.raises(DuplicateMessageError, match="'w0'"):
        store.batch(
            [
                Delete(KEY, ids=("m0", "m1")),
                SaveRun(snapshot_of("r2")),
                EnforceRetention(KEY, timedelta(days=1), 5, T0 + timedelta(days=30)),
                Append(("default", "writer", "main"), tuple(user_messages(5, prefix="w"))),
            ]
        )
    assert dump(db) == before
    # The AUTOINCREMENT counter was rolled back too: the next row continues the sequence.
    store.append_messages(KEY, user_messages(1, prefix="after"))
    assert rows(db)[-1][0] == before[0][-1][0] + 1


def test_busy_file_fails_cleanly_then_recovers(db: Path) -> None:
    with SQLiteStore(db, busy_timeout=0.2) as s:
        s.append_messages(KEY, user_messages(1))
        with raw(db) as blocker:
            blocker.execute("BEGIN IMMEDIATE")
            started = time.monotonic()
            with pytest.raises(StoreError, match="locked") as info:
                s.append_messages(KEY, user_messages(1, prefix="b"))
            assert 0.15 < time.monotonic() - started < 5
            assert isinstance(info.value.__cause__, sqlite3.OperationalError)
            assert s.load_messages(KEY) == user_messages(1)  # readers are not blocked
            blocker.execute("ROLLBACK")
        s.append_messages(KEY, user_messages(1, prefix="b"))
        assert s.count_messages(KEY) == 2


def test_corrupt_row_raises_store_error(store: SQLiteStore, db: Path) -> None:
    store.append_messages(KEY, user_messages(2))
    with raw(db) as conn:
        conn.execute("UPDATE messages SET data = '{\"role\": \"nobody\"}' WHERE message_id = 'm1'")
    with pytest.raises(StoreError, match="does not validate"):
        store.load_messages(KEY)


def test_sql_is_parameterised(store: SQLiteStore) -> None:
    evil: Key = ("x'; DROP TABLE messages; --", 'a" OR 1=1 --', "b); DELETE FROM runs; --")
    msgs = [Message.user("'); DROP TABLE runs; --", message_id="'; --")]
    store.append_messages(evil, msgs)
    store.save_run(snapshot_of("r'1", agent="'; DROP TABLE runs; --"))
    assert store.load_messages(evil) == msgs
    assert store.list_keys() == [evil]
    assert store.list_runs(agent="'; DROP TABLE runs; --") == ["r'1"]
    assert store.delete_messages(evil, ids=["'; --"]) == 1
    assert store.integrity_check() == "ok"


# ---------------------------------------------------------------------- crash
WRITER = """
import sys
from marsys_mem.model.messages import Message
from marsys_mem.store import SQLiteStore
from marsys_mem.store.base import Append

path, writer, count, per_batch, sync = sys.argv[1:6]
store = SQLiteStore(path, synchronous=sync)
own = ("crash", writer, "main")
shared = ("crash", "shared", "main")
print("ready", flush=True)
if sys.stdin.readline().strip() != "go":
    raise SystemExit("no go")
n = int(per_batch)
for i in range(int(count)):
    msgs = [Message.user(f"{writer} {i} {j}", message_id=f"{writer}-{i * n + j}") for j in range(n)]
    if writer.startswith("shared") and i % 5 == 4:
        store.batch([Append(own, tuple(msgs)), Append(shared, tuple(msgs))])
    elif writer.startswith("shared"):
        store.append_messages(own, msgs)
        store.append_messages(shared, msgs)
    else:
        store.append_messages(own, msgs)
    print(" ".join(m.message_id for m in msgs), flush=True)
store.close()
"""


def spawn_writer(
    db: Path, writer: str, count: int, per_batch: int, sync: str = "FULL"
) -> subprocess.Popen[str]:
    """Start a writer process; it opens the store, prints "ready" and waits for "go"."""
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(db), writer, str(count), str(per_batch), sync],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def go(proc: subprocess.Popen[str]) -> None:
    """Wait until ``proc`` has opened the store, then let it write."""
    assert proc.stdout is not None
    assert proc.stdin is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.stdin.write("go\n")
    proc.stdin.flush()


def close_pipes(proc: subprocess.Popen[str]) -> None:
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()


@pytest.mark.parametrize("sync", ["FULL", "NORMAL"])
def test_sigkill_mid_stream_loses_no_acknowledged_message(db: Path, sync: str) -> None:
    with SQLiteStore(db) as s:  # created (and migrated) before the writer starts
        s.append_messages(KEY, user_messages(1))
    proc = spawn_writer(db, "w", count=1_000_000, per_batch=20, sync=sync)
    acked: list[str] = []
    try:
        go(proc)
        assert proc.stdout is not None
        while len(acked) < 150 * 20:
            line = proc.stdout.readline()
            assert line, "the writer died before being killed"
            acked.extend(line.split())
        os.kill(proc.pid, signal.SIGKILL)  # mid-stream: it is still appending
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        close_pipes(proc)
    with SQLiteStore(db) as s:
        assert s.integrity_check() == "ok"
        stored = [m.message_id for m in s.load_messages(("crash", "w", "main"))]
        # Every acknowledged message is there, in order; at most the batches in flight
        # (committed but not yet printed) follow, whole.
        assert stored[: len(acked)] == acked
        assert stored == [f"w-{i}" for i in range(len(stored))]
        assert len(stored) % 20 == 0
        s.append_messages(KEY, user_messages(1, prefix="after"))
        assert [m.message_id for m in s.load_messages(KEY)] == ["m0", "after0"]


# ---------------------------------------------------------------------- processes
def test_four_processes_share_one_file(db: Path) -> None:
    writers, rounds, per_batch = 4, 40, 3
    # The file does not exist yet: the four processes create and migrate it concurrently.
    procs = [spawn_writer(db, f"shared{w}", rounds, per_batch) for w in range(writers)]
    try:
        for p in procs:  # all opened: go at once
            go(p)
        outputs = [p.communicate(timeout=120)[0] for p in procs]
        assert [p.returncode for p in procs] == [0] * writers
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            close_pipes(p)
    with SQLiteStore(db) as s:
        assert s.integrity_check() == "ok"
        shared = [m.message_id for m in s.load_messages(("crash", "shared", "main"))]
        assert len(shared) == len(set(shared)) == writers * rounds * per_batch
        for w, out in enumerate(outputs):
            expected = [f"shared{w}-{i}" for i in range(rounds * per_batch)]
            assert out.split() == expected  # every append was acknowledged
            own = [m.message_id for m in s.load_messages(("crash", f"shared{w}", "main"))]
            assert own == expected
            assert [i for i in shared if i.startswith(f"shared{w}-")] == expected
        assert s.list_keys("crash") == sorted(
            [("crash", "shared", "main")] + [("crash", f"shared{w}", "main") for w in range(4)]
        )


# ---------------------------------------------------------------------- bounded storage
def page_count(db: Path) -> int:
    with raw(db) as conn:
        return int(conn.execute("PRAGMA page_count").fetchone()[0])


def test_periodic_retention_keeps_storage_bounded(store: SQLiteStore, db: Path) -> None:
    keys: list[Key] = [("bound", "a", "main"), ("bound", "b", "main")]
    pinned = Message.system("rules", message_id="rules", timestamp=T0)
    for key in keys:
        store.append_messages(key, [pinned])
    per_round, bound = 50, 300
    pages: list[int] = []
    n = 0
    for r in range(60):
        for key in keys:
            msgs = [
                Message.user(
                    f"r{r} {j}", message_id=f"{r}-{j}", timestamp=T0 + timedelta(seconds=n + j)
                )
                for j in range(per_round)
            ]
            store.append_messages(key, msgs)
        n += per_round
        now = T0 + timedelta(seconds=n)
        if r < 40:  # phase 1: the count bound binds (ttl is long)
            store.enforce_retention(ttl=timedelta(hours=1), max_messages=bound, now=now)
            expected = min(1 + n, bound)
        else:  # phase 2: the ttl binds (a 120 s window = 120 messages, plus the pinned one)
            store.enforce_retention(ttl=timedelta(seconds=120), max_messages=bound, now=now)
            expected = 1 + 120
        for key in keys:
            assert store.count_messages(key) == expected
            loaded = store.load_messages(key)
            assert loaded[0] == pinned  # protected: kept by ttl and deleted last by the bound
            assert [m.timestamp for m in loaded[1:]] == sorted(m.timestamp for m in loaded[1:])
            assert loaded[-1].message_id == f"{r}-{per_round - 1}"
        pages.append(page_count(db))
    # 6000 messages went in per key, 300 at most stayed: freed pages are reused, so the
    # file reaches its size once the bound is reached (round 6) and then stops growing.
    assert pages[-1] <= pages[29] * 1.1
    assert pages[-1] < pages[6] * 1.5


# ---------------------------------------------------------------------- differential
_ids_st = st.sampled_from([f"i{i}" for i in range(8)])
_keys_st = st.sampled_from([("n", "a", "main"), ("n", "b", "main"), ("m", "a", "x")])
_times_st = st.integers(min_value=0, max_value=20).map(lambda m: T0 + timedelta(minutes=m))


@st.composite
def _message(draw: st.DrawFn) -> Message:
    kind = draw(st.sampled_from(["user", "system", "pinned", "preserve"]))
    mid, ts = draw(_ids_st), draw(_times_st)
    if kind == "system":
        return Message.system("s", message_id=mid, timestamp=ts)
    return Message.user(
        kind,
        message_id=mid,
        timestamp=ts,
        pinned=kind == "pinned",
        metadata={"preserve": True} if kind == "preserve" else {},
    )


_op_st: st.SearchStrategy[Op] = st.one_of(
    st.builds(Append, _keys_st, st.lists(_message(), max_size=4).map(tuple)),
    st.builds(
        Load,
        _keys_st,
        st.none() | _times_st,
        st.none() | st.integers(min_value=0, max_value=5),
    ),
    st.builds(
        Delete,
        _keys_st,
        st.none() | st.lists(_ids_st, max_size=3).map(tuple),
        st.none() | _times_st,
    ),
    st.builds(CountMessages, _keys_st),
    st.builds(ListKeys, st.none() | st.sampled_from(["n", "m", "z"])),
    st.builds(
        EnforceRetention,
        st.none() | _keys_st,
        st.none() | st.integers(min_value=1, max_value=20).map(lambda m: timedelta(minutes=m)),
        st.none() | st.integers(min_value=1, max_value=6),
        _times_st,
    ),
)


def _outcome(store: Any, batch: list[Op]) -> Any:
    try:
        return ("ok", store.batch(batch))
    except (DuplicateMessageError, ValueError, TypeError) as exc:
        return ("error", type(exc).__name__)


@settings(max_examples=60, deadline=None)
@given(batches=st.lists(st.lists(_op_st, min_size=1, max_size=4), max_size=8))
def test_sqlite_behaves_like_in_memory(batches: list[list[Op]]) -> None:
    """Random batches give the same results and the same final state on both backends."""
    with InMemoryStore() as mem, SQLiteStore(":memory:") as sql:
        for batch in batches:
            assert _outcome(sql, batch) == _outcome(mem, batch)
        keys = mem.list_keys()
        assert sql.list_keys() == keys
        for key in keys:
            assert sql.load_messages(key) == mem.load_messages(key)


def test_runs_snapshot_round_trip_with_every_field(store: SQLiteStore) -> None:
    snap = RunSnapshot(
        run_id="r1",
        parent_id="r0",
        namespace="team",
        agent="researcher",
        branch="fork",
        status="error",
        started_at=T0,
        ended_at=T0 + timedelta(seconds=1, microseconds=7),
        messages=user_messages(3),
        input_ids=["m0"],
        usage={"prompt_tokens": 1},
        error="ValueError: boom",
        metadata={"a": [1, {"b": None}]},
    )
    store.save_run(snap)
    assert store.load_run("r1") == snap
