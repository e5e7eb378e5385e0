"""PostgresStore beyond the conformance suite: errors, restarts, lost COMMITs, migrations.

Everything runs against a real PostgreSQL the session starts (tests/store/conftest.py);
faults are real too: the server is restarted or crashed, and a loopback TCP proxy drops
the connection right around a COMMIT.
"""

import contextlib
import itertools
import socket
import threading
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from marsys_mem.exceptions import (
    DatabaseNotFoundError,
    DuplicateMessageError,
    InvalidDSNError,
    StoreConnectionError,
    StoreError,
)
from marsys_mem.model.messages import Message
from marsys_mem.store.base import Append, EnforceRetention
from marsys_mem.store.postgres import MIGRATIONS, PostgresStore
from marsys_mem.testing.conformance import KEY, T0, message_ids, user_messages
from marsys_mem.testing.postgres import PostgresServer

pytestmark = pytest.mark.slow


def _with_port(dsn: str, port: int) -> str:
    parts = urlsplit(dsn)
    netloc = parts.netloc.rsplit(":", 1)[0] + f":{port}"
    return urlunsplit(parts._replace(netloc=netloc))


# ---------------------------------------------------------------------- clear errors
def test_bad_dsn_is_refused_without_showing_the_password() -> None:
    with pytest.raises(InvalidDSNError, match="invalid PostgreSQL DSN") as err:
        PostgresStore("postgresql://alice:se cret@127.0.0.1:5/db")
    assert "se cret" not in str(err.value)
    assert "cret" not in str(err.value)
    with pytest.raises(InvalidDSNError):
        PostgresStore("host=127.0.0.1 port=x password=hunter2 =oops")


def test_unreachable_server_names_it(postgres_server: PostgresServer) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dsn = _with_port(postgres_server.dsn(), port)
    with pytest.raises(StoreConnectionError, match=f"127.0.0.1:{port}") as err:
        PostgresStore(dsn)
    assert postgres_server.password not in str(err.value)
    assert "refused" in str(err.value).lower()


def test_connect_timeout_bounds_a_silent_server(postgres_server: PostgresServer) -> None:
    with socket.socket() as silent:  # accepts TCP connections (backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        dsn = _with_port(postgres_server.dsn(), silent.getsockname()[1])
        started = time.monotonic()
        with pytest.raises(StoreConnectionError, match="connect_timeout 2 s"):
            PostgresStore(dsn, connect_timeout=2)
        assert time.monotonic() - started < 15


def test_missing_database_and_wrong_password(postgres_server: PostgresServer) -> None:
    with pytest.raises(DatabaseNotFoundError, match="'nosuchdb'") as missing:
        PostgresStore(postgres_server.dsn("nosuchdb"))
    assert postgres_server.password not in str(missing.value)
    wrong = postgres_server.dsn().replace(postgres_server.password, "not-the-password")
    with pytest.raises(StoreConnectionError, match="password authentication failed") as auth:
        PostgresStore(wrong)
    assert "not-the-password" not in str(auth.value)
    assert not isinstance(auth.value, DatabaseNotFoundError)


def test_invalid_pool_settings() -> None:
    with pytest.raises(ValueError, match="max_size"):
        PostgresStore("postgresql://x@127.0.0.1/db", max_size=0)
    with pytest.raises(ValueError, match="must not exceed"):
        PostgresStore("postgresql://x@127.0.0.1/db", min_size=3, max_size=2)
    with pytest.raises(ValueError, match="connect_timeout"):
        PostgresStore("postgresql://x@127.0.0.1/db", connect_timeout=0)


# ---------------------------------------------------------------------- schema
def test_migrations_record_versions_and_refuse_newer(postgres_dsn: str) -> None:
    with PostgresStore(postgres_dsn) as store:
        store.append_messages(KEY, user_messages(2))
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM marsys_schema_version")]
        assert versions == list(range(1, len(MIGRATIONS) + 1))
        conn.execute("INSERT INTO marsys_schema_version (version) VALUES (99)")
    with pytest.raises(StoreError, match="schema version 99, newer"):
        PostgresStore(postgres_dsn)


def test_hosts_starting_together_migrate_once(new_postgres_dsn: Callable[[], str]) -> None:
    dsn = new_postgres_dsn()
    stores: list[PostgresStore] = []
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            stores.append(PostgresStore(dsn, min_size=0))
        except BaseException as exc:  # collected, asserted below
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == []
        stores[0].append_messages(KEY, user_messages(1))
        assert all(s.count_messages(KEY) == 1 for s in stores)
    finally:
        for s in stores:
            s.close()


def test_count_stays_exact_under_any_delete(postgres_dsn: str) -> None:
    """The statement trigger keeps n exact, also for deletes run by hand in SQL."""
    with PostgresStore(postgres_dsn) as store:
        store.append_messages(KEY, user_messages(10))
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM marsys_messages WHERE message_id IN ('m1', 'm2', 'm3')")
        assert store.count_messages(KEY) == 7
        assert store.enforce_retention(KEY, max_messages=5, now=T0) == 2
        assert store.count_messages(KEY) == len(store.load_messages(KEY)) == 5
        store.delete_messages(KEY)
        assert store.list_keys() == []


# ---------------------------------------------------------------------- several writers
def test_writers_on_one_key_keep_commit_order_and_the_bound(postgres_dsn: str) -> None:
    """Several stores (as hosts) append to one key with retention in the same batch."""
    bound, writers, rounds = 25, 4, 30
    stores = [PostgresStore(postgres_dsn, max_size=2) for _ in range(writers)]
    counts: list[int] = []
    try:

        def work(w: int) -> None:
            for i in range(rounds):
                msgs = tuple(user_messages(2, prefix=f"w{w}-{i}-"))
                stores[w].batch([Append(KEY, msgs), EnforceRetention(KEY, None, bound, T0)])
                counts.append(stores[w].count_messages(KEY))

        threads = [threading.Thread(target=work, args=(w,)) for w in range(writers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ids = message_ids(stores[0].load_messages(KEY))
    finally:
        for s in stores:
            s.close()
    assert len(ids) == bound
    assert max(counts) <= bound
    for w in range(writers):  # each writer's surviving messages in its own order
        mine = [i for i in ids if i.startswith(f"w{w}-")]
        assert mine == sorted(mine, key=lambda i: (int(i.split("-")[1]), i))
    batches = [i.rsplit("-", 1)[0] for i in ids]
    runs = [len(list(group)) for _, group in itertools.groupby(batches)]
    assert all(n == 2 for n in runs[1:]), ids  # adjacent; only the oldest may be cut


# ---------------------------------------------------------------------- restarts
@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_a_server_restart_costs_retries_not_data(
    postgres_server: PostgresServer, postgres_dsn: str, mode: str
) -> None:
    """Appends stream from threads while the server restarts (cleanly, or by a crash)."""
    store = PostgresStore(postgres_dsn, max_size=4, retry_timeout=60)
    shared = ("default", "shared", "main")
    acked: dict[int, list[str]] = {t: [] for t in range(4)}
    failed: dict[int, list[str]] = {t: [] for t in range(4)}
    go = threading.Event()

    def work(t: int) -> None:
        go.wait()
        for i in range(120):
            msgs = tuple(user_messages(1, prefix=f"t{t}-{i}-"))
            try:
                store.batch([Append(("default", f"t{t}", "main"), msgs), Append(shared, msgs)])
            except StoreConnectionError:
                failed[t].append(msgs[0].message_id)
            else:
                acked[t].append(msgs[0].message_id)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    go.set()
    while sum(len(a) for a in acked.values()) < 80:
        time.sleep(0.01)
    postgres_server.restart(mode)  # type: ignore[arg-type]
    for th in threads:
        th.join()
    try:
        everything = message_ids(store.load_messages(shared))
        assert len(everything) == len(set(everything))
        for t in range(4):
            own = message_ids(store.load_messages(("default", f"t{t}", "main")))
            assert own == acked[t]  # every acknowledged append, once, in order
            assert not set(failed[t]) & set(everything)  # a raised one is absent
            assert [i for i in everything if i.startswith(f"t{t}-")] == acked[t]
        assert sum(len(f) for f in failed.values()) == 0  # 60 s of retries outlast a restart
        store.append_messages(KEY, user_messages(1))  # the pool works again by itself
        assert store.count_messages(KEY) == 1
    finally:
        store.close()


def test_down_longer_than_retry_timeout_raises_and_commits_nothing(
    postgres_server: PostgresServer, postgres_dsn: str
) -> None:
    store = PostgresStore(postgres_dsn, retry_timeout=1.5, connect_timeout=2)
    try:
        store.append_messages(KEY, user_messages(1))
        postgres_server.stop()
        try:
            started = time.monotonic()
            with pytest.raises(StoreConnectionError, match="retry_timeout") as err:
                store.append_messages(KEY, user_messages(1, prefix="lost"))
            assert time.monotonic() - started < 20
            assert postgres_server.password not in str(err.value)
        finally:
            postgres_server.start()
        # what was committed, read by a fresh store: the first one's pool may still be
        # backing off from the outage for longer than its 1.5 s retry_timeout
        with PostgresStore(postgres_dsn) as check:
            assert message_ids(check.load_messages(KEY)) == ["m0"]
    finally:
        store.close()


# ---------------------------------------------------------------------- lost COMMITs
class CommitCutter:
    """A loopback TCP proxy that cuts the connection once, right around a COMMIT.

    ``arm("after")``: forward COMMIT to the server, then cut before its answer comes
    back (the batch IS committed; the client cannot know). ``arm("before")``: cut
    without forwarding it. Either way the server side is left open and silent, as in a
    network partition: the server does not notice, so a transaction that did not reach
    COMMIT stays in progress until the store ends it.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.mode: str | None = None
        self.cuts = 0
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._cut: set[int] = set()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def arm(self, mode: str) -> None:
        with self._lock:
            self.mode = mode

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target_port))
            with self._lock:
                self._sockets += [client, server]
            threading.Thread(target=self._up, args=(client, server), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                with self._lock:
                    mode = self.mode if b"COMMIT\x00" in data else None
                    if mode:
                        self.mode = None
                        self.cuts += 1
                        self._cut.add(id(server))
                if mode == "after":
                    server.sendall(data)
                if mode:
                    client.shutdown(socket.SHUT_RDWR)
                    return
                server.sendall(data)

    def _down(self, server: socket.socket, client: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                if id(server) in self._cut:
                    continue  # the answer to the COMMIT is never relayed
                client.sendall(data)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        self.listener.close()
        with self._lock:
            for s in self._sockets:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
        self._thread.join(5)


@pytest.fixture
def cutter(postgres_server: PostgresServer) -> Iterator[CommitCutter]:
    proxy = CommitCutter(postgres_server.port)
    yield proxy
    proxy.close()


@pytest.mark.parametrize("mode", ["after", "before"])
def test_a_commit_without_answer_is_checked_not_rerun(
    cutter: CommitCutter, postgres_dsn: str, mode: str
) -> None:
    dsn = _with_port(postgres_dsn, cutter.port) + "&sslmode=disable"
    with PostgresStore(dsn, max_size=2) as store:
        store.append_messages(KEY, user_messages(2))
        cutter.arm(mode)
        # One batch, two keys: committed whole or not at all, and then run again once.
        batch = tuple(user_messages(3, prefix="x"))
        store.batch([Append(KEY, batch), Append(("default", "other", "main"), batch)])
        assert cutter.cuts == 1
        assert message_ids(store.load_messages(KEY)) == ["m0", "m1", "x0", "x1", "x2"]
        assert store.count_messages(("default", "other", "main")) == 3
        # The same again must now be a duplicate: the retry did not append twice.
        with pytest.raises(DuplicateMessageError):
            store.append_messages(KEY, batch[:1])
        store.append_messages(KEY, [Message.user("after", message_id="after")])
        assert store.count_messages(KEY) == 6


@pytest.mark.parametrize("mode", ["after", "before"])
def test_a_lost_commit_of_a_batch_without_appends_is_resolved_by_its_status(
    cutter: CommitCutter, postgres_dsn: str, mode: str
) -> None:
    dsn = _with_port(postgres_dsn, cutter.port) + "&sslmode=disable"
    with PostgresStore(dsn, max_size=2) as store:
        store.append_messages(KEY, user_messages(4))
        cutter.arm(mode)
        assert store.delete_messages(KEY, ids=["m0", "m1"]) == 2
        assert cutter.cuts == 1
        assert message_ids(store.load_messages(KEY)) == ["m2", "m3"]
        assert store.count_messages(KEY) == 2


# ---------------------------------------------------------------------- bounded waits
def test_a_statement_blocked_by_a_lock_waits_at_most_retry_timeout(postgres_dsn: str) -> None:
    """issue 25 item 6: before, an append behind another session's table lock returned
    after the lock's full 25 s; now it fails after retry_timeout, naming what it waited for,
    and commits nothing."""
    with PostgresStore(postgres_dsn, retry_timeout=2) as store:
        store.append_messages(KEY, user_messages(1))
        with psycopg.connect(postgres_dsn, autocommit=False) as blocker:
            blocker.execute("LOCK TABLE marsys_messages IN ACCESS EXCLUSIVE MODE")
            started = time.monotonic()
            with pytest.raises(StoreError, match=r"waited past its 2 s .*lock_timeout"):
                store.append_messages(KEY, user_messages(1, prefix="late"))
            assert time.monotonic() - started < 6
            blocker.rollback()
        assert message_ids(store.load_messages(KEY)) == ["m0"]
        store.append_messages(KEY, user_messages(1, prefix="after"))  # the setting is gone
        assert store.count_messages(KEY) == 2
