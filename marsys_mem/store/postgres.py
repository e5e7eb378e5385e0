"""PostgreSQL store: one database shared by agents on many hosts.

:class:`PostgresStore` runs over psycopg 3 and a :class:`psycopg_pool.ConnectionPool`
(``pip install 'marsys-mem[postgres]'``). Every batch is ONE transaction that commits or
rolls back whole. The async twins run the same batch code on the event loop, over a
:class:`psycopg_pool.AsyncConnectionPool` (:mod:`marsys_mem.store.postgres_async`), not
in threads.

Schema (version 2; the tables are prefixed so the store can share a database, and live
in the first schema of the connection's ``search_path``)::

    marsys_keys(id, namespace, agent, branch,   -- one row per key, UNIQUE (ns, agent, branch)
                n,                              -- messages stored under the key
                last_seq)                       -- the last seq handed out in the key
    marsys_messages(key_id, seq,                -- PRIMARY KEY: per-key order = seq order
                    message_id,                 -- UNIQUE (key_id, message_id)
                    ts,                         -- microseconds since 1970 UTC (exact)
                    protected,                  -- system / pinned / preserve
                    data)                       -- Message.model_dump_json()
    marsys_runs(run_id PRIMARY KEY, pos, parent_id, namespace, agent, started_at, data)
    marsys_schema_version(version PRIMARY KEY, applied_at)   -- one row per migration
    marsys_vectors, marsys_vector_models, marsys_vector_clock  -- version 2: embeddings
                                                -- (see marsys_mem.store.postgres_vectors)
    marsys_vectors.embedding, marsys_messages.tsv   -- version 4, with the vector extension:
                                                -- search in the database (postgres_search)

Several writers, several hosts: an append takes its key's ``marsys_keys`` row (an
``INSERT ... ON CONFLICT DO UPDATE``, which row-locks it until the transaction ends) and
takes its ``seq`` numbers from that row. So two appends to one key, from any hosts, are
serialised by the row lock: the later one waits for the earlier one's commit and numbers
its messages after it. Per-key order is commit order, a batch's messages are adjacent,
nothing is lost or numbered twice; appends to different keys never wait for each other.
A batch writing several keys locks them first, in sorted order (no deadlock between such
batches); a deadlock or serialisation failure the server reports anyway rolls the whole
batch back, and it is run again. Deletes and retention lock the key's row too, and a
statement-level trigger keeps ``n`` exact for every delete, so ``count_messages`` is O(1)
and ``max_messages`` holds at every committed state, across hosts: retention in the same
batch as an append (``[Append, EnforceRetention]``, as the manager sends it) counts under
the lock the append took.

Reading batches of one statement run on their own; longer reading batches run in one
``REPEATABLE READ READ ONLY`` snapshot, so they never see half of another batch.

Connections: opening the store connects once (``connect_timeout`` bounds it) to check
the server and migrate the schema, then opens the pool. Errors name the server (host,
port, database, user; never the password): :class:`~marsys_mem.exceptions.InvalidDSNError`
(cannot parse), :class:`~marsys_mem.exceptions.DatabaseNotFoundError`,
:class:`~marsys_mem.exceptions.StoreConnectionError` (refused, timed out, login failed,
or the server stayed away longer than ``retry_timeout``).

Restarts cost retries, not data. A batch that loses its connection before ``COMMIT`` is
sent was not committed: it is run again on another connection (the pool replaces broken
ones and checks the idle ones after a failure). A batch that loses it while ``COMMIT`` is
in flight may or may not have committed: the store reconnects and asks the server,
without running it again blindly: it waits until the transaction is no longer in
progress (``pg_xact_status``), then, for a batch that appended, looks for the last
message it appended (present: committed; absent: run again), and otherwise takes the
transaction's status. So an append that returned is committed, exactly once; one that
raised :class:`~marsys_mem.exceptions.StoreConnectionError` was not.

Migrations: :data:`MIGRATIONS` lists one function per schema version, applied in order
in one transaction under an advisory lock (hosts starting together migrate once). A
database with a newer version than this code knows is refused.

Search (:attr:`PostgresStore.supports_search`): with the ``vector`` extension (pgvector) in
the database, dense and keyword search run there (:mod:`marsys_mem.store.postgres_search`);
without it, hosts search with their own indexes, as the store says once when it opens.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Protocol

from pydantic import ValidationError

from marsys_mem.exceptions import (
    DatabaseNotFoundError,
    DuplicateMessageError,
    InvalidDSNError,
    MissingDependencyError,
    StoreConnectionError,
    StoreError,
)
from marsys_mem.model.hnsw import HnswSettings, IvfSettings
from marsys_mem.model.hnsw import vector_index as index_settings
from marsys_mem.model.messages import MESSAGE_LIST_ADAPTER
from marsys_mem.model.runs import RunSnapshot
from marsys_mem.store.base import (
    Append,
    CountMatches,
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
    ScoreAround,
    ScoreVectors,
    SearchText,
    SearchVectors,
    conflict_error,
)
from marsys_mem.store.owners import DELETION_LOG_SIZE, DeletionPage
from marsys_mem.store.retention import EVICTION_ORDER, ttl_cutoff

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg.conninfo import conninfo_to_dict
    from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout
except ModuleNotFoundError as exc:  # pragma: no cover - the extra is installed in CI
    raise MissingDependencyError(
        "PostgresStore needs psycopg 3 and psycopg_pool: pip install 'marsys-mem[postgres]'"
    ) from exc

from marsys_mem.store import postgres_search, postgres_vectors  # after the check: psycopg
from marsys_mem.store.greenlets import run_sync_style
from marsys_mem.store.postgres_async import AsyncIO, AsyncPools
from marsys_mem.store.postgres_upkeep import IvfUpkeep, training_lock

__all__ = ["MIGRATIONS", "Migration", "PostgresStore"]

Connection = psycopg.Connection[tuple[Any, ...]]
AsyncConnection = psycopg.AsyncConnection[tuple[Any, ...]]
Migration = Callable[[Connection], None]
"""A schema migration: runs inside the open transaction, must not commit."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_WRITES = (Append, Delete, ExpectLast, SaveRun, EnforceRetention, PutVectors)
_MIGRATION_LOCK = 0x4D4D454D  # pg_advisory_xact_lock id while migrating ("MMEM")
_RETRY_STATES = frozenset({"40001", "40P01"})  # serialization failure, deadlock
_WAITED = {
    "55P03": "a lock another session holds (lock_timeout)",
    "57014": "a statement to finish (statement_timeout)",
}
"""The errors of a wait bounded by :func:`_bound_waits`, and what waited."""


_WAIT_BOUNDS = (
    "SELECT set_config('lock_timeout', %s, true), set_config('statement_timeout', %s, true)"
)
_WAIT_BOUNDS_XID = _WAIT_BOUNDS + ", pg_current_xact_id()::text"


def _bound_waits(conn: Connection, deadline: float, *, xid: bool = False) -> str | None:
    """Bound every lock wait and statement of this transaction by the batch's deadline.

    Without it a statement blocked behind another session's lock waits as long as that
    lock is held, whatever ``retry_timeout`` says. ``set_config(..., true)`` is local to
    the transaction (the pooled connection keeps no setting). ``xid``: also return the
    transaction's id (in the same round trip; a write needs it to check a lost COMMIT).
    """
    ms = max(int((deadline - time.monotonic()) * 1000), 100)
    row = conn.execute(  # a lock wait is named as such: it times out before the statement does
        _WAIT_BOUNDS_XID if xid else _WAIT_BOUNDS, (str(ms), str(ms + 250))
    ).fetchone()
    return str(row[2]) if xid and row and row[2] is not None else None


_KEY_WHERE = "namespace = %s AND agent = %s AND branch = %s"
_KEY_ID = f"(SELECT id FROM marsys_keys WHERE {_KEY_WHERE})"  # noqa: S608 (SQL from constants; values bound)

_APPEND = (
    "WITH k AS ("
    " INSERT INTO marsys_keys AS k (namespace, agent, branch, n, last_seq)"
    " VALUES (%(ns)s, %(agent)s, %(branch)s, %(n)s, %(n)s)"
    " ON CONFLICT (namespace, agent, branch) DO UPDATE"
    " SET n = k.n + excluded.n, last_seq = k.last_seq + excluded.last_seq"
    " RETURNING id, last_seq)"
    " INSERT INTO marsys_messages (key_id, seq, message_id, ts, protected, data)"
    " SELECT k.id, k.last_seq - %(n)s + u.ord, u.mid, u.ts, u.prot, u.data"
    " FROM k, unnest(%(ids)b::text[], %(ts)b::bigint[], %(prot)b::boolean[], %(data)b::text[])"
    " WITH ORDINALITY AS u(mid, ts, prot, data, ord)"
)  # arrays sent in binary: no quoting and parsing of the JSON text (5x faster)
_APPEND_SEARCH = (
    _APPEND.replace("protected, data)", "protected, data, tsv)")
    .replace("u.prot, u.data", "u.prot, u.data, to_tsvector(%(cfg)s::regconfig, u.txt)")
    .replace("%(data)b::text[])", "%(data)b::text[], %(text)b::text[])")
    .replace("AS u(mid, ts, prot, data, ord)", "AS u(mid, ts, prot, data, txt, ord)")
)  # with search in the database: the keywords too (postgres_search.keyword_text)
_DUPLICATE_DETAIL = re.compile(r"\(key_id, message_id\)=\(\d+, (?P<id>.*)\) already exists")


def _micros(value: datetime) -> int:
    """Microseconds since 1970-01-01 UTC (exact)."""
    return (value - _EPOCH) // _MICROSECOND


# ---------------------------------------------------------------------- migrations
def _v1_tables(conn: Connection) -> None:
    """Version 1: keys, messages, runs, the delete-count trigger, the version history."""
    conn.execute(
        "CREATE TABLE marsys_schema_version ("
        " version integer PRIMARY KEY,"
        " applied_at timestamptz NOT NULL DEFAULT now())"
    )
    conn.execute(
        "CREATE TABLE marsys_keys ("
        " id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
        ' namespace text COLLATE "C" NOT NULL,'
        ' agent text COLLATE "C" NOT NULL,'
        ' branch text COLLATE "C" NOT NULL,'
        " n bigint NOT NULL DEFAULT 0,"
        " last_seq bigint NOT NULL DEFAULT 0,"
        " UNIQUE (namespace, agent, branch))"
    )
    conn.execute(
        "CREATE TABLE marsys_messages ("
        " key_id bigint NOT NULL,"
        " seq bigint NOT NULL,"
        ' message_id text COLLATE "C" NOT NULL,'
        " ts bigint NOT NULL,"
        " protected boolean NOT NULL,"
        " data text NOT NULL,"
        " PRIMARY KEY (key_id, seq),"
        " UNIQUE (key_id, message_id))"
    )
    conn.execute(
        "CREATE TABLE marsys_runs ("
        " run_id text PRIMARY KEY,"
        " pos bigint GENERATED ALWAYS AS IDENTITY,"
        " parent_id text,"
        " namespace text NOT NULL,"
        " agent text NOT NULL,"
        " started_at bigint NOT NULL,"
        " data text NOT NULL)"
    )
    conn.execute("CREATE INDEX marsys_runs_by_agent ON marsys_runs (namespace, agent)")
    conn.execute("CREATE INDEX marsys_runs_by_parent ON marsys_runs (parent_id)")
    # Every delete, whatever runs it, subtracts its rows from the keys' counts, once per
    # statement (a per-row trigger would cost a row update per deleted message).
    conn.execute(
        "CREATE FUNCTION marsys_messages_deleted() RETURNS trigger LANGUAGE plpgsql"
        " SET search_path FROM CURRENT AS $$ BEGIN"
        " UPDATE marsys_keys AS k SET n = k.n - d.c"
        " FROM (SELECT key_id, count(*) AS c FROM gone GROUP BY key_id) AS d"
        " WHERE k.id = d.key_id;"
        " RETURN NULL; END $$"
    )
    conn.execute(
        "CREATE TRIGGER marsys_messages_count AFTER DELETE ON marsys_messages"
        " REFERENCING OLD TABLE AS gone FOR EACH STATEMENT"
        " EXECUTE FUNCTION marsys_messages_deleted()"
    )


def _v3_owners(conn: Connection) -> None:
    """Version 3: ownership (``marsys_key_copies``, ``marsys_sources``), the deletion log.

    One statement trigger per delete (:mod:`marsys_mem.store.owners`): the copies of the
    deleted rows (same id, in keys holding copies of theirs) go; their own links go;
    records derived from them that have no other source are deleted (a nested delete, so
    the cascade cascades); the deletions are logged (key and id only)
    with cursors taken from ``marsys_deletion_clock`` (row-locked until commit, so the log
    is read in commit order, as the vector clock is).
    """
    conn.execute(
        "CREATE TABLE marsys_sources ("
        " key_id bigint NOT NULL,"
        ' message_id text COLLATE "C" NOT NULL,'
        " s_key_id bigint NOT NULL,"
        ' s_message_id text COLLATE "C" NOT NULL,'
        " PRIMARY KEY (s_key_id, s_message_id, key_id, message_id))"
    )
    conn.execute("CREATE INDEX marsys_sources_by_record ON marsys_sources (key_id, message_id)")
    conn.execute(
        "CREATE TABLE marsys_key_copies (owner_id bigint NOT NULL, key_id bigint NOT NULL,"
        " PRIMARY KEY (owner_id, key_id))"
    )
    conn.execute(
        "CREATE TABLE marsys_deletion_clock (id integer PRIMARY KEY CHECK (id = 1),"
        " last bigint NOT NULL)"
    )
    conn.execute("INSERT INTO marsys_deletion_clock (id, last) VALUES (1, 0)")
    conn.execute(
        "CREATE TABLE marsys_deletions ("
        " dseq bigint PRIMARY KEY,"
        " key_id bigint NOT NULL,"
        ' message_id text COLLATE "C" NOT NULL)'
    )
    conn.execute(
        "CREATE FUNCTION marsys_messages_owned() RETURNS trigger LANGUAGE plpgsql"
        " SET search_path FROM CURRENT AS $$ DECLARE c bigint; last_d bigint; BEGIN"
        " SELECT count(*) INTO c FROM gone;"
        " IF c = 0 THEN RETURN NULL; END IF;"
        " DELETE FROM marsys_messages m USING gone g, marsys_key_copies k"
        "  WHERE k.owner_id = g.key_id AND m.key_id = k.key_id"
        "  AND m.message_id = g.message_id;"
        " DELETE FROM marsys_sources s USING gone g"
        "  WHERE s.key_id = g.key_id AND s.message_id = g.message_id;"
        " DELETE FROM marsys_messages m USING ("
        "  SELECT DISTINCT s.key_id, s.message_id FROM marsys_sources s"
        "  JOIN gone g ON s.s_key_id = g.key_id AND s.s_message_id = g.message_id"
        "  WHERE NOT EXISTS (SELECT 1 FROM marsys_sources o"
        "   WHERE o.key_id = s.key_id AND o.message_id = s.message_id"
        "   AND NOT EXISTS (SELECT 1 FROM gone x"
        "    WHERE x.key_id = o.s_key_id AND x.message_id = o.s_message_id))) AS d"
        "  WHERE m.key_id = d.key_id AND m.message_id = d.message_id;"
        " DELETE FROM marsys_sources s USING gone g"
        "  WHERE s.s_key_id = g.key_id AND s.s_message_id = g.message_id;"
        " UPDATE marsys_deletion_clock SET last = last + c WHERE id = 1"
        "  RETURNING last INTO last_d;"
        " INSERT INTO marsys_deletions (dseq, key_id, message_id)"
        "  SELECT last_d - c + row_number() OVER (), key_id, message_id FROM gone;"
        " RETURN NULL; END $$"
    )
    conn.execute(
        "CREATE TRIGGER marsys_messages_owned AFTER DELETE ON marsys_messages"
        " REFERENCING OLD TABLE AS gone FOR EACH STATEMENT"
        " EXECUTE FUNCTION marsys_messages_owned()"
    )


MIGRATIONS: tuple[Migration, ...] = (
    _v1_tables,
    postgres_vectors.migrate_vectors,
    _v3_owners,
    postgres_search.migrate_search,
)
"""Schema migrations, in order: ``MIGRATIONS[i]`` takes a database from version i to i + 1."""


def _schema_version(conn: Connection) -> int:
    row = conn.execute("SELECT to_regclass('marsys_schema_version') IS NOT NULL").fetchone()
    if not row or not row[0]:
        return 0
    found = conn.execute("SELECT max(version) FROM marsys_schema_version").fetchone()
    return int(found[0]) if found and found[0] is not None else 0


def _migrate(conn: Connection, where: str) -> int:
    """Bring the database to the latest schema; returns the version it had before."""
    latest = len(MIGRATIONS)
    version = _schema_version(conn)
    if version == latest:
        return version
    # A session lock taken before the transaction starts, so the transaction's catalog
    # view is fresh: a host that waited sees what the one before it created.
    conn.execute("SELECT pg_advisory_lock(%s)", (_MIGRATION_LOCK,))
    try:
        with conn.transaction():
            version = _schema_version(conn)  # another host may have migrated meanwhile
            if version > latest:
                raise StoreError(
                    f"{where} has marsys-mem schema version {version}, newer than this "
                    f"marsys-mem knows ({latest}): upgrade marsys-mem to use it"
                )
            for target in range(version + 1, latest + 1):
                MIGRATIONS[target - 1](conn)
                conn.execute("INSERT INTO marsys_schema_version (version) VALUES (%s)", (target,))
    finally:
        if not conn.closed:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATION_LOCK,))
    return version


# ---------------------------------------------------------------------- DSNs and errors
_URL_PASSWORD = re.compile(r"(?P<head>://[^:/?#@\s]*:)(?P<pw>[^@]*)@")
_KW_PASSWORD = re.compile(r"(?P<head>\bpassword\s*=\s*)(?P<pw>'(?:[^'\\]|\\.)*'|\S+)")


def _secrets_of(dsn: str) -> list[str]:
    """Password spellings in ``dsn`` (parsed or not), to scrub from messages."""
    found = [m.group("pw") for m in _URL_PASSWORD.finditer(dsn)]
    found += [m.group("pw").strip("'") for m in _KW_PASSWORD.finditer(dsn)]
    try:
        parsed = conninfo_to_dict(dsn).get("password")
    except psycopg.Error:
        parsed = None
    if parsed:
        found.append(str(parsed))
    return sorted({s for s in found if s}, key=len, reverse=True)


def _scrub(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    text = _URL_PASSWORD.sub(r"\g<head>***@", text)
    return _KW_PASSWORD.sub(r"\g<head>***", text)


def _describe(params: dict[str, Any]) -> str:
    """``PostgreSQL at host:port, database 'd', user 'u'`` (what libpq will use)."""
    host = params.get("host") or params.get("hostaddr") or "the default socket"
    port = params.get("port") or "5432"
    where = f"PostgreSQL at {host}:{port}"
    if params.get("dbname"):
        where += f", database {params['dbname']!r}"
    if params.get("user"):
        where += f", user {params['user']!r}"
    return where


def _is_connection_loss(exc: BaseException, conn: Connection | None) -> bool:
    """Whether ``exc`` means the connection (or the server) went away."""
    if conn is not None and (conn.closed or conn.broken):
        return True
    if isinstance(exc, pg_errors.AdminShutdown | pg_errors.CannotConnectNow):
        return True
    if isinstance(exc, pg_errors.CrashShutdown | pg_errors.IdleSessionTimeout):
        return True
    return isinstance(exc, psycopg.OperationalError) and getattr(exc, "sqlstate", None) in (
        None,
        "08000",
        "08003",
        "08006",
        "57P01",
        "57P02",
        "57P03",
    )


class _Retry(Exception):
    """The attempt failed in a way that committed nothing: run the batch again."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


# ---------------------------------------------------------------------- the store
class PostgresStore(MemoryStore):
    """A :class:`MemoryStore` in a PostgreSQL database, shared by processes and hosts.

    Args:
        dsn: a ``postgresql://`` URL or a libpq conninfo string. Keep the password out of
            files: libpq also reads ``PGPASSWORD`` and ``~/.pgpass``, and the config takes
            the DSN from an environment variable.
        min_size: connections the pool keeps open.
        max_size: connections the pool opens at most (threads beyond wait for one).
        connect_timeout: seconds one connection attempt may take (libpq's minimum is 2).
        retry_timeout: seconds a batch keeps retrying while the server is unreachable
            (a restart), before :class:`~marsys_mem.exceptions.StoreConnectionError`.
        vector_index: how the vector index is built and searched, where the database has
            pgvector: :class:`~marsys_mem.model.hnsw.HnswSettings` (the default) or
            :class:`~marsys_mem.model.hnsw.IvfSettings`, or their fields as a mapping
            (``kind``: ``"hnsw"``, also when left out, or ``"ivfflat"``). The build
            settings (and the kind) apply to indexes built from now on; see
            :meth:`rebuild_vector_index`.

    Attributes:
        found_schema_version: the database's schema version when this store opened it
            (0: no tables yet); an older one is migrated on open, in one transaction.

    Raises:
        InvalidDSNError: ``dsn`` cannot be parsed.
        DatabaseNotFoundError: the server has no such database.
        StoreConnectionError: the server cannot be reached or refuses the login.
        StoreError: the database holds a newer schema, or a table of the same name that
            is not marsys-mem's.
        ValueError: a size or timeout is invalid.
        pydantic.ValidationError: ``vector_index`` is invalid (the field and value named).

    Example:
        >>> import os
        >>> from marsys_mem.model.messages import Message
        >>> with PostgresStore(os.environ["MARSYS_MEM_PG_DSN"]) as store:  # doctest: +SKIP
        ...     key = ("default", "researcher", "main")
        ...     store.append_messages(key, [Message.user("hi")])
        ...     [m.text for m in store.load_messages(key)]
        ['hi']
    """

    def __init__(
        self,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        connect_timeout: float = 10.0,
        retry_timeout: float = 60.0,
        vector_index: HnswSettings | IvfSettings | Mapping[str, Any] | None = None,
    ) -> None:
        index = index_settings(vector_index)
        for name, value, low in (("min_size", min_size, 0), ("max_size", max_size, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if min_size > max_size:
            raise ValueError(f"min_size ({min_size}) must not exceed max_size ({max_size})")
        for name, number in (
            ("connect_timeout", connect_timeout),
            ("retry_timeout", retry_timeout),
        ):
            if (
                isinstance(number, bool)
                or not isinstance(number, int | float)
                or not 0 < number < 1e6
            ):
                raise ValueError(f"{name} must be a number of seconds > 0, got {number!r}")
        if not isinstance(dsn, str):
            raise InvalidDSNError(f"dsn must be a string, got {type(dsn).__name__}")
        self._secrets = _secrets_of(dsn)
        try:
            params = conninfo_to_dict(dsn)
        except psycopg.Error as exc:
            raise InvalidDSNError(
                f"invalid PostgreSQL DSN: {_scrub(str(exc).strip(), self._secrets)} "
                "(expected postgresql://user@host:port/dbname or 'host=... dbname=...'; "
                "percent-encode special characters in a URL)"
            ) from None  # the parser's error may quote the password
        self.where = _describe(params)
        self.min_size = min_size
        self.max_size = max_size
        self.connect_timeout = float(connect_timeout)
        self.retry_timeout = float(retry_timeout)
        self._dsn = dsn
        self._lock = threading.Lock()
        self._kwargs: dict[str, Any] = {
            "autocommit": True,  # BEGIN / COMMIT are sent explicitly (see _attempt)
            "prepare_threshold": 0,  # a few fixed statements: prepare them on first use
            "connect_timeout": max(2, round(self.connect_timeout)),
        }
        with self._connect_once() as conn:
            try:
                self.found_schema_version = _migrate(conn, self.where)
                self._search = postgres_search.open_search(conn, self.where, _MIGRATION_LOCK, index)
            except psycopg.Error as exc:
                raise StoreError(
                    f"cannot set up the marsys-mem tables on {self.where}: {self._clean(exc)}"
                ) from exc
        self.supports_search = self._search is not None
        self.vector_index = index
        self._pool: ConnectionPool[Connection] | None = ConnectionPool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            kwargs=self._kwargs,
            open=False,
            timeout=self.retry_timeout,
            reconnect_timeout=max(self.retry_timeout, 60.0),
            name="marsys-mem",
            configure=self._configure,
        )
        self._pool.open(wait=False)
        self._apools = AsyncPools(  # the async twins' pools: one per event loop
            dsn,
            min_size=min_size,
            max_size=max_size,
            kwargs=self._kwargs,
            timeout=self.retry_timeout,
            reconnect_timeout=max(self.retry_timeout, 60.0),
            configure=self._aconfigure,
        )
        self._sync_io = _SyncIO(self._pool_or_raise, self._check_pool)
        self._upkeep = IvfUpkeep(self._connect_once)  # IVFFlat lists trained as it grows

    supports_vectors: ClassVar[bool] = True  # see marsys_mem.store.postgres_vectors

    def __repr__(self) -> str:
        state = ", closed" if self.closed else ""
        return f"PostgresStore({self.where}{state})"

    # ------------------------------------------------------------------ connections
    def _clean(self, exc: BaseException) -> str:
        return _scrub(str(exc).strip(), self._secrets)

    def _connection_error(self, exc: BaseException) -> StoreConnectionError:
        text = self._clean(exc)
        if "does not exist" in text and "database" in text:
            return DatabaseNotFoundError(
                f"{self.where}: the database does not exist ({text}); create it "
                "(createdb) or fix the DSN"
            )
        if "timeout expired" in text:
            text += f" (connect_timeout {self.connect_timeout:g} s)"
        return StoreConnectionError(f"cannot connect to {self.where}: {text}")

    def _configure(self, conn: Connection) -> None:
        """A new pooled connection's scan settings (:func:`postgres_search.scan_defaults`)."""
        if self._search is not None:
            conn.execute(*postgres_search.scan_defaults(self._search))
            if not conn.autocommit:
                conn.commit()

    async def _aconfigure(self, conn: AsyncConnection) -> None:
        """Async twin of :meth:`_configure`."""
        if self._search is not None:
            await conn.execute(*postgres_search.scan_defaults(self._search))
            if not conn.autocommit:
                await conn.commit()

    @contextmanager
    def _connect_once(self) -> Iterator[Connection]:
        try:
            conn = psycopg.connect(self._dsn, **self._kwargs)
        except psycopg.Error as exc:
            raise self._connection_error(exc) from None  # libpq's text may hold the DSN
        try:
            yield conn
        finally:
            conn.close()

    def _pool_or_raise(self) -> ConnectionPool[Connection]:
        with self._lock:
            if self.closed or self._pool is None:
                raise StoreError(f"PostgresStore ({self.where}) is closed")
            return self._pool

    @contextmanager
    def _connection(self, deadline: float, io: _IO) -> Iterator[Connection]:
        try:
            with io.connection(max(deadline - time.monotonic(), 0.001)) as conn:
                yield conn
        except PoolTimeout as exc:
            raise StoreConnectionError(
                f"{self.where}: no connection within {self.retry_timeout:g} s "
                f"(retry_timeout): {self._clean(exc)}"
            ) from exc
        except PoolClosed as exc:
            raise StoreError(f"PostgresStore ({self.where}) is closed") from exc

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Close the pool; further calls raise ``StoreError``. Idempotent."""
        with self._lock:
            self.closed = True
            pool, self._pool = self._pool, None
        self._upkeep.close()
        if pool is not None:
            pool.close()
            self._apools.close()

    def rebuild_vector_index(self) -> list[str]:
        """Build each model's vector index again with this store's :attr:`vector_index`.

        An IVFFlat index trains its lists again on the vectors stored now: rebuild it as
        the store grows (with ``lists=None`` the number of lists grows with it) or its
        texts drift. A store opened with another kind than its index's builds the new kind.

        For a store whose index was built with other settings (an earlier version, or
        before a bulk load): each new index is built beside the old one without blocking
        writes or searches (``CREATE INDEX CONCURRENTLY``; the old one serves meanwhile),
        then replaces it. Give the server ``maintenance_work_mem`` to hold the graph (about
        1.2 KB per 384-D vector) or the build slows down many times.

        Returns:
            The models whose index was rebuilt (none without pgvector).

        Example:
            >>> import os
            >>> with PostgresStore(  # doctest: +SKIP
            ...     os.environ["MARSYS_MEM_PG_DSN"], vector_index={"m": 24, "ef_construction": 128}
            ... ) as store:
            ...     store.rebuild_vector_index()
            ['all-MiniLM-L6-v2']
        """
        if self.closed:
            raise StoreError(f"PostgresStore ({self.where}) is closed")
        if self._search is None:
            return []
        with self._connect_once() as conn:
            try:
                with training_lock(conn):  # not beside another host's training
                    return postgres_search.rebuild_indexes(conn, self._search)
            except psycopg.Error as exc:
                raise StoreError(
                    f"cannot rebuild the vector index on {self.where}: {self._clean(exc)}"
                ) from exc

    def train_vector_index(self, *, wait: bool = True) -> list[str]:
        """Train each model's IVFFlat lists now if they are due (what the store does itself).

        A store opened with :class:`~marsys_mem.model.hnsw.IvfSettings` looks by itself,
        on a thread of its own, as it writes vectors (:mod:`marsys_mem.store.postgres_upkeep`):
        a model's first index at ``train_at`` vectors, again at ``retrain_at`` times those
        its lists were trained on. This looks now and waits for the training.

        Args:
            wait: wait while another host trains (else leave the training to it).

        Returns:
            The models whose index was built (none with HNSW settings or without pgvector).

        Example:
            >>> import os
            >>> with PostgresStore(  # doctest: +SKIP
            ...     os.environ["MARSYS_MEM_PG_DSN"], vector_index={"kind": "ivfflat"}
            ... ) as store:
            ...     store.train_vector_index()
            ['all-MiniLM-L6-v2']
        """
        if self.closed:
            raise StoreError(f"PostgresStore ({self.where}) is closed")
        if self._search is None:
            return []
        try:
            return self._upkeep.run(self._search, wait=wait)
        except psycopg.Error as exc:
            raise StoreError(
                f"cannot train the vector index on {self.where}: {self._clean(exc)}"
            ) from exc

    @contextmanager
    def bulk_load(self) -> Iterator[None]:
        """Write many vectors fast: the vector indexes are dropped, and built once at the end.

        An index takes each vector in as it is written, which bounds a load at about a
        thousand messages a second; built once over the loaded rows it takes a fraction of
        that time. Meanwhile searches (on every host) scan exactly: slower, never wrong.
        Writes through this store object inside the block do not build a new model's
        index either. On leaving (also on an error) every model without an index gets one
        (:attr:`vector_index`'s settings: an IVFFlat index trains its lists on all the
        vectors then). Without pgvector it does nothing.

        Example:
            >>> import os
            >>> with PostgresStore(os.environ["MARSYS_MEM_PG_DSN"]) as store:  # doctest: +SKIP
            ...     with store.bulk_load():
            ...         memory = RAGMemory(embedder, store=store)
            ...         memory.add_many(messages)  # no index kept up to date meanwhile
        """
        setup = self._search
        if setup is None:
            yield
            return
        with self._connect_once() as conn:
            try:
                postgres_search.drop_indexes(conn)
            except psycopg.Error as exc:
                raise StoreError(
                    f"cannot drop the vector indexes on {self.where}: {self._clean(exc)}"
                ) from exc
        self._search = replace(setup, deferred=True)
        try:
            yield
        finally:
            self._search = setup
            with self._connect_once() as conn:
                try:
                    with training_lock(conn):
                        postgres_search.build_missing_indexes(conn, setup)
                except psycopg.Error as exc:
                    raise StoreError(
                        f"cannot build the vector indexes on {self.where}: {self._clean(exc)}"
                    ) from exc

    # ------------------------------------------------------------------ core
    def _batch(self, ops: Sequence[Op]) -> list[Any]:
        return self._run(ops, self._sync_io)

    async def _abatch(self, ops: Sequence[Op]) -> list[Any]:
        """The same batch code as :meth:`_batch`, its I/O awaited on the event loop."""
        try:
            pool = await self._apools.get()
        except PoolClosed as exc:
            raise StoreError(f"PostgresStore ({self.where}) is closed") from exc
        return await run_sync_style(self._run, ops, AsyncIO(pool, self._apools.tasks))

    def _run(self, ops: Sequence[Op], io: _IO) -> list[Any]:
        """Run ``ops`` as one transaction, retried until ``retry_timeout``, over ``io``."""
        search = self._search
        prepared = _Prepared(ops, search)  # serialise outside any connection
        deadline = time.monotonic() + self.retry_timeout
        delay = 0.05
        while True:
            try:
                results = self._attempt(prepared, deadline, io)
            except _Retry as retry:
                if isinstance(retry.cause, psycopg.OperationalError):
                    io.check_pool()
                if time.monotonic() + delay >= deadline:
                    raise StoreConnectionError(
                        f"{self.where}: the batch did not go through within "
                        f"{self.retry_timeout:g} s (retry_timeout); nothing of it was "
                        f"committed: {self._clean(retry.cause)}"
                    ) from retry.cause
                io.sleep(delay)
                delay = min(delay * 2, 1.0)
            else:
                if search is not None and prepared.writes:
                    written: dict[str, int] = {}
                    for op in ops:
                        if isinstance(op, PutVectors):
                            written[op.model] = written.get(op.model, 0) + len(op.message_ids)
                    self._upkeep.wrote(search, written)
                return results

    def _check_pool(self) -> None:
        """After a lost connection: drop the pool's dead idle connections (in background)."""
        with self._lock:
            pool = self._pool
        if pool is not None:
            threading.Thread(target=_check_quietly, args=(pool,), daemon=True).start()

    def _attempt(self, prepared: _Prepared, deadline: float, io: _IO) -> list[Any]:
        ops = prepared.ops
        single = len(ops) == 1 and not prepared.writes
        with self._connection(deadline, io) as conn:
            xid: str | None = None
            backend = conn.info.backend_pid
            try:
                if prepared.writes:
                    conn.execute("BEGIN", prepare=False)
                    xid = _bound_waits(conn, deadline, xid=True)
                    prepared.lock_keys(conn)
                elif not single:
                    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", prepare=False)
                    _bound_waits(conn, deadline)
                results = [prepared.execute(conn, i) for i in range(len(ops))]
                if any(isinstance(op, Delete | EnforceRetention) for op in ops):
                    _prune_deletions(conn)
            except BaseException as exc:
                _rollback(conn)
                if isinstance(exc, psycopg.Error):
                    if _is_connection_loss(exc, conn) or exc.sqlstate in _RETRY_STATES:
                        raise _Retry(exc) from exc
                    if exc.sqlstate in _WAITED:
                        raise StoreError(
                            f"{self.where}: the batch waited past its "
                            f"{self.retry_timeout:g} s (retry_timeout) for "
                            f"{_WAITED[exc.sqlstate]}; rolled back, nothing of it was "
                            f"committed: {self._clean(exc)}"
                        ) from exc
                    raise StoreError(
                        f"PostgreSQL error on {self.where}, batch rolled back: {self._clean(exc)}"
                    ) from exc
                if isinstance(exc, ValidationError):
                    raise StoreError(
                        f"{self.where} holds data that does not validate: {exc}"
                    ) from exc
                raise
            if single:
                return results
            try:
                conn.execute("COMMIT", prepare=False)  # transaction control: never prepared
            except psycopg.Error as exc:
                if not _is_connection_loss(exc, conn):
                    _rollback(conn)
                    if exc.sqlstate in _RETRY_STATES:
                        raise _Retry(exc) from exc
                    raise StoreError(
                        f"PostgreSQL refused to commit on {self.where}, batch rolled back: "
                        f"{self._clean(exc)}"
                    ) from exc
                lost = exc
            else:
                return results
        # The connection died with COMMIT in flight: find out whether it landed.
        if xid is None or self._landed(prepared, xid, backend, deadline, lost, io):
            return results
        raise _Retry(lost)

    def _landed(
        self,
        prepared: _Prepared,
        xid: str,
        backend: int,
        deadline: float,
        lost: BaseException,
        io: _IO,
    ) -> bool:
        """Whether the transaction ``xid``, whose COMMIT got no answer, committed.

        A transaction still in progress (the server never saw the connection drop: its
        backend is idle, or still committing) is ended by terminating that backend, if
        it still runs that transaction; then its status is final.
        """
        delay = 0.05
        while True:
            try:
                with self._connection(deadline, io) as conn:
                    status = _xact_status(conn, xid)
                    if status == "in progress":
                        _end_backend(conn, backend, xid)
                        status = _xact_status(conn, xid)
                    if status != "in progress":
                        probe = prepared.last_appended()
                        if probe is None:
                            return status == "committed"
                        key, message_id = probe
                        row = conn.execute(
                            f"SELECT 1 FROM marsys_messages WHERE key_id = {_KEY_ID}"  # noqa: S608 (SQL from constants; values bound)
                            " AND message_id = %s",
                            (*key, message_id),
                        ).fetchone()
                        return row is not None
            except psycopg.Error as exc:
                if not _is_connection_loss(exc, None):
                    raise StoreError(
                        f"{self.where}: COMMIT got no answer and its outcome could not be "
                        f"checked: {self._clean(exc)}"
                    ) from exc
            except StoreConnectionError as exc:
                raise StoreConnectionError(
                    f"{self.where}: COMMIT got no answer, and the server stayed away for "
                    f"{self.retry_timeout:g} s (retry_timeout), so whether the batch was "
                    f"committed is unknown: {self._clean(lost)}"
                ) from exc
            if time.monotonic() + delay >= deadline:
                raise StoreConnectionError(
                    f"{self.where}: COMMIT got no answer and the transaction was still in "
                    f"progress after {self.retry_timeout:g} s: outcome unknown"
                ) from lost
            io.sleep(delay)
            delay = min(delay * 2, 1.0)


class _IO(Protocol):
    """What the batch code needs of its I/O: blocking (:class:`_SyncIO`) or on the loop.

    The async one is :class:`marsys_mem.store.postgres_async.AsyncIO`; its connection is
    an :class:`~marsys_mem.store.postgres_async.SyncFacade`, which offers the part of a
    ``psycopg.Connection`` the batch code uses.
    """

    def connection(self, timeout: float) -> AbstractContextManager[Any]:
        """A pooled connection for one attempt, given back at exit."""

    def sleep(self, seconds: float) -> None:
        """Wait before the next attempt."""

    def check_pool(self) -> None:
        """After a lost connection: have the pool drop its dead idle connections."""


class _SyncIO:
    """The sync API's I/O: the store's :class:`ConnectionPool`, ``time.sleep``."""

    def __init__(
        self, pool: Callable[[], ConnectionPool[Connection]], check: Callable[[], None]
    ) -> None:
        self._pool = pool
        self.check_pool = check

    @contextmanager
    def connection(self, timeout: float) -> Iterator[Connection]:
        with self._pool().connection(timeout=timeout) as conn:
            yield conn

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(seconds)


def _check_quietly(pool: ConnectionPool[Connection]) -> None:
    try:
        pool.check()
    except Exception:  # a closed pool, or the server still down: retried later
        return


def _end_backend(conn: Connection, pid: int, xid: str) -> None:
    """Terminate backend ``pid`` if it still runs transaction ``xid`` (32-bit compare)."""
    conn.execute(
        "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
        " WHERE pid = %s AND backend_xid::text = %s",
        (pid, str(int(xid) % 2**32)),
    ).fetchall()


def _xact_status(conn: Connection, xid: str) -> str | None:
    try:
        row = conn.execute("SELECT pg_xact_status(%s::xid8)", (xid,)).fetchone()
    except pg_errors.InvalidParameterValue:
        # "transaction ID is in the future": the server restarted without it ever being
        # logged, so it did not commit.
        return "aborted"
    return None if row is None or row[0] is None else str(row[0])


def _rollback(conn: Connection) -> None:
    if conn.closed or conn.broken:
        return
    try:
        conn.execute("ROLLBACK", prepare=False)
    except psycopg.Error:  # pragma: no cover - the original error is what matters
        pass


# ---------------------------------------------------------------------- executing ops
class _Prepared:
    """A batch's ops with their rows serialised, and how to lock and run each op."""

    def __init__(self, ops: Sequence[Op], search: postgres_search.SearchSetup | None) -> None:
        self.ops = ops
        self.search = search
        self.writes = any(isinstance(op, _WRITES) for op in ops)
        self.rows: dict[int, dict[str, Any]] = {}
        for i, op in enumerate(ops):
            if isinstance(op, Append) and op.messages:
                ns, agent, branch = op.key
                self.rows[i] = {
                    "ns": ns,
                    "agent": agent,
                    "branch": branch,
                    "n": len(op.messages),
                    "ids": [m.message_id for m in op.messages],
                    "ts": [_micros(m.timestamp) for m in op.messages],
                    "prot": [m.is_protected for m in op.messages],
                    "data": [m.model_dump_json() for m in op.messages],
                }
                if search is not None:
                    self.rows[i]["cfg"] = postgres_search.TEXT_CONFIG
                    self.rows[i]["text"] = [postgres_search.keyword_text(m) for m in op.messages]

    def last_appended(self) -> tuple[Key, str] | None:
        """The key and id of the batch's last appended message (``None``: no append)."""
        for op in reversed(self.ops):
            if isinstance(op, Append) and op.messages:
                return op.key, op.messages[-1].message_id
        return None

    def lock_keys(self, conn: Connection) -> None:
        """Lock the rows of every key this batch writes, in sorted order, if several.

        One key needs no lock up front: its first write locks the row. Retention over
        every key locks them all. An :class:`ExpectLast` locks its key (creating the key's
        row, empty, if need be) before any op runs: its check and the batch's commit see
        the same newest message.
        """
        everything = any(isinstance(op, EnforceRetention) and op.key is None for op in self.ops)
        written = sorted(
            {
                tuple(op.key)
                for op in self.ops
                if isinstance(op, Append | Delete | EnforceRetention | PutVectors | ExpectLast)
                and op.key is not None
            }
        )
        expects = any(isinstance(op, ExpectLast) for op in self.ops)
        if not everything and not expects and len(written) <= 1:
            return
        appended = sorted(
            {
                tuple(op.key)
                for op in self.ops
                if (isinstance(op, Append) and op.messages) or isinstance(op, ExpectLast)
            }
        )
        if appended:
            columns = [list(c) for c in zip(*appended, strict=True)]
            conn.execute(
                "INSERT INTO marsys_keys (namespace, agent, branch)"
                " SELECT * FROM unnest(%s::text[], %s::text[], %s::text[])"
                " ON CONFLICT (namespace, agent, branch) DO NOTHING",
                columns,
            )
        if everything:
            conn.execute(
                "SELECT id FROM marsys_keys ORDER BY namespace, agent, branch FOR UPDATE"
            ).fetchall()
            return
        columns = [list(c) for c in zip(*written, strict=True)]
        conn.execute(
            "SELECT id FROM marsys_keys WHERE (namespace, agent, branch) IN"
            " (SELECT * FROM unnest(%s::text[], %s::text[], %s::text[]))"
            " ORDER BY namespace, agent, branch FOR UPDATE",
            columns,
        ).fetchall()

    def execute(self, conn: Connection, i: int) -> Any:
        """Run op ``i`` on ``conn`` (inside the batch's transaction); its result."""
        op = self.ops[i]
        if isinstance(op, Append):
            return _append(conn, op, self.rows.get(i), search=self.search is not None)
        if isinstance(op, Load):
            return _load(conn, op)
        if isinstance(op, Delete):
            return _delete(conn, op)
        if isinstance(op, CountMessages):
            row = conn.execute(f"SELECT n FROM marsys_keys WHERE {_KEY_WHERE}", op.key).fetchone()  # noqa: S608 (SQL from constants; values bound)
            return int(row[0]) if row else 0
        if isinstance(op, ExpectLast):
            row = conn.execute(
                f"SELECT message_id FROM marsys_messages WHERE key_id = {_KEY_ID}"  # noqa: S608 (SQL from constants; values bound)
                " ORDER BY seq DESC LIMIT 1",
                op.key,
            ).fetchone()
            found = None if row is None else str(row[0])
            if found != op.message_id:
                raise conflict_error(op, found)
            return None
        if isinstance(op, ListKeys):
            return _list_keys(conn, op)
        if isinstance(op, SaveRun):
            return _save_run(conn, op)
        if isinstance(op, LoadRun):
            row = conn.execute(
                "SELECT data FROM marsys_runs WHERE run_id = %s", (op.run_id,)
            ).fetchone()
            return RunSnapshot.model_validate_json(row[0]) if row else None
        if isinstance(op, ListRuns):
            return _list_runs(conn, op)
        if isinstance(op, EnforceRetention):
            return _retention(conn, op)
        if isinstance(op, PutVectors):
            return postgres_vectors.put_vectors(conn, op, self.search)
        if isinstance(op, LoadVectors):
            return postgres_vectors.load_vectors(conn, op)
        if isinstance(op, LoadAfter):
            return postgres_vectors.load_after(conn, op)
        if isinstance(op, LoadDeletions):
            return _load_deletions(conn, op)
        if isinstance(op, SearchVectors) and self.search is not None:
            return postgres_search.search_vectors(conn, self.search, op)
        if isinstance(op, SearchText):
            return postgres_search.search_text(conn, op)
        if isinstance(op, LoadAround):
            return postgres_search.load_around(conn, op)
        if isinstance(op, ScoreVectors) and self.search is not None:
            return postgres_search.score_vectors(conn, self.search, op)
        if isinstance(op, ScoreAround) and self.search is not None:
            return postgres_search.score_around(conn, self.search, op)
        if isinstance(op, CountMatches):
            return postgres_search.count_matches(conn, op)
        raise TypeError(f"unknown store operation {op!r}")  # pragma: no cover


def _append(conn: Connection, op: Append, rows: dict[str, Any] | None, *, search: bool) -> None:
    if rows is None:  # nothing to append: the key is not created
        return
    try:
        conn.execute(_APPEND_SEARCH if search else _APPEND, rows)
    except pg_errors.UniqueViolation as exc:  # the batch fails whole: nothing to skip
        found = _DUPLICATE_DETAIL.search(exc.diag.message_detail or "")
        ids = {m.message_id for m in op.messages}
        duplicate = found.group("id") if found and found.group("id") in ids else None
        raise DuplicateMessageError(
            f"message_id {duplicate!r} is already stored under {op.key}"
            if duplicate is not None
            else f"a message_id of this append is already stored under {op.key}"
        ) from exc
    if op.copies_of is not None:
        conn.execute(
            "INSERT INTO marsys_keys (namespace, agent, branch) VALUES (%s, %s, %s)"
            " ON CONFLICT (namespace, agent, branch) DO NOTHING",
            op.copies_of,
        )
        conn.execute(
            f"INSERT INTO marsys_key_copies (owner_id, key_id) SELECT o.id, {_KEY_ID}"  # noqa: S608 (SQL from constants; values bound)
            f" FROM marsys_keys o WHERE o.namespace = %s AND o.agent = %s AND o.branch = %s"
            " ON CONFLICT DO NOTHING",
            [*op.key, *op.copies_of],
        )
    if op.sources:
        links = [
            (m.message_id, *ref.key, ref.message_id)
            for m, refs in zip(op.messages, op.sources, strict=True)
            for ref in refs
        ]
        columns = [list(c) for c in zip(*links, strict=True)]
        conn.execute(
            "INSERT INTO marsys_keys (namespace, agent, branch)"
            " SELECT DISTINCT * FROM unnest(%s::text[], %s::text[], %s::text[])"
            " ON CONFLICT (namespace, agent, branch) DO NOTHING",
            columns[1:4],
        )
        conn.execute(
            "INSERT INTO marsys_sources (key_id, message_id, s_key_id, s_message_id)"  # noqa: S608 (SQL from constants; values bound)
            f" SELECT {_KEY_ID}, u.mid, k.id, u.smid"
            " FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::text[])"
            " AS u(mid, ns, agent, branch, smid)"
            " JOIN marsys_keys k ON k.namespace = u.ns AND k.agent = u.agent"
            " AND k.branch = u.branch ON CONFLICT DO NOTHING",
            [*op.key, *columns],
        )


def _load_deletions(conn: Connection, op: LoadDeletions) -> DeletionPage:
    row = conn.execute("SELECT last FROM marsys_deletion_clock WHERE id = 1").fetchone()
    head = int(row[0]) if row else 0
    if op.after is None:
        return DeletionPage((), (), head)
    first = conn.execute("SELECT min(dseq) FROM marsys_deletions").fetchone()
    sql = (
        "SELECT d.dseq, k.namespace, k.agent, k.branch, d.message_id FROM marsys_deletions d"
        " JOIN marsys_keys k ON k.id = d.key_id WHERE d.dseq > %s"
    )
    params: list[Any] = [op.after]
    if op.namespace is not None:
        sql += " AND k.namespace = %s"
        params.append(op.namespace)
    rows = conn.execute(sql + " ORDER BY d.dseq", params).fetchall()
    return DeletionPage.of_rows(
        rows, head=head, after=op.after, first=first[0] if first is not None else None
    )


def _prune_deletions(conn: Connection) -> None:
    """Keep the newest :data:`DELETION_LOG_SIZE` entries of the deletion log."""
    conn.execute(
        "DELETE FROM marsys_deletions WHERE dseq <= "
        "(SELECT last FROM marsys_deletion_clock WHERE id = 1) - %s",
        (DELETION_LOG_SIZE,),
    )


def _load(conn: Connection, op: Load) -> list[Any]:
    if op.last == 0:
        return []
    sql = f"SELECT seq, data FROM marsys_messages WHERE key_id = {_KEY_ID}"  # noqa: S608 (SQL from constants; values bound)
    params: list[Any] = list(op.key)
    if op.ids is not None:
        sql += " AND message_id = ANY(%s::text[])"
        params.append(list(op.ids))
    if op.since is not None:
        sql += " AND ts >= %s"
        params.append(_micros(op.since))
    if op.last is not None:
        sql = f"SELECT seq, data FROM ({sql} ORDER BY seq DESC LIMIT %s) AS t ORDER BY seq"  # noqa: S608 (SQL from constants; values bound)
        params.append(op.last)
    else:
        sql += " ORDER BY seq"
    data = [row[1] for row in conn.execute(sql, params)]
    if not data:
        return []
    return MESSAGE_LIST_ADAPTER.validate_json("[" + ",".join(data) + "]")


def _lock_key(conn: Connection, key: Key) -> int | None:
    row = conn.execute(f"SELECT id FROM marsys_keys WHERE {_KEY_WHERE} FOR UPDATE", key).fetchone()  # noqa: S608 (SQL from constants; values bound)
    return int(row[0]) if row else None


def _delete(conn: Connection, op: Delete) -> int:
    key_id = _lock_key(conn, op.key)
    if key_id is None or (op.ids is not None and not op.ids):
        return 0
    sql = "DELETE FROM marsys_messages WHERE key_id = %s"
    params: list[Any] = [key_id]
    if op.ids is not None:
        sql += " AND message_id = ANY(%s::text[])"
        params.append(list(op.ids))
    if op.before is not None:
        sql += " AND ts < %s"
        params.append(_micros(op.before))
    return max(conn.execute(sql, params).rowcount, 0)


def _list_keys(conn: Connection, op: ListKeys) -> list[Key]:
    if op.namespace is None:
        cur = conn.execute("SELECT namespace, agent, branch FROM marsys_keys WHERE n > 0")
    else:
        cur = conn.execute(
            "SELECT namespace, agent, branch FROM marsys_keys WHERE n > 0 AND namespace = %s",
            (op.namespace,),
        )
    return sorted((str(a), str(b), str(c)) for a, b, c in cur)


def _save_run(conn: Connection, op: SaveRun) -> None:
    s = op.snapshot
    conn.execute(
        "INSERT INTO marsys_runs (run_id, parent_id, namespace, agent, started_at, data)"
        " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (run_id) DO UPDATE SET"
        " parent_id = excluded.parent_id, namespace = excluded.namespace,"
        " agent = excluded.agent, started_at = excluded.started_at, data = excluded.data",
        (s.run_id, s.parent_id, s.namespace, s.agent, _micros(s.started_at), s.model_dump_json()),
    )


def _list_runs(conn: Connection, op: ListRuns) -> list[str]:
    clauses: list[str] = []
    params: list[str] = []
    for column, value in (
        ("namespace", op.namespace),
        ("agent", op.agent),
        ("parent_id", op.parent_id),
    ):
        if value is not None:
            clauses.append(f"{column} = %s")  # column names from the fixed tuple above
            params.append(value)
    where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
    cur = conn.execute(f"SELECT run_id FROM marsys_runs{where} ORDER BY started_at, pos", params)  # noqa: S608 (SQL from constants; values bound)
    return [str(row[0]) for row in cur]


def _retention(conn: Connection, op: EnforceRetention) -> int:
    """The retention rule of :mod:`marsys_mem.store.retention`, in SQL (as SQLiteStore's).

    ttl: unprotected rows with ``ts`` before :func:`ttl_cutoff`; the bound: per key, the
    excess rows in :data:`EVICTION_ORDER` (by ``protected``, then ``seq``), counted from
    ``marsys_keys.n`` under the key's row lock.
    """
    deleted = 0
    key_id: int | None = None
    if op.key is not None:
        key_id = _lock_key(conn, op.key)
        if key_id is None:
            return 0
    where, params = ("key_id = %s AND ", [key_id]) if key_id is not None else ("", [])
    cutoff = ttl_cutoff(op.now, op.ttl)
    if cutoff is not None:
        deleted += conn.execute(
            f"DELETE FROM marsys_messages WHERE {where}NOT protected AND ts < %s",  # noqa: S608 (SQL from constants; values bound)
            [*params, _micros(cutoff)],
        ).rowcount
    if op.max_messages is not None:
        if key_id is not None:
            over = conn.execute(
                "SELECT id, n FROM marsys_keys WHERE id = %s AND n > %s",
                (key_id, op.max_messages),
            ).fetchall()
        else:
            over = conn.execute(
                "SELECT id, n FROM marsys_keys WHERE n > %s ORDER BY namespace, agent, branch",
                (op.max_messages,),
            ).fetchall()
        for found_id, count in over:
            excess = int(count) - op.max_messages
            for protected in EVICTION_ORDER:
                if excess <= 0:
                    break
                gone = conn.execute(
                    "DELETE FROM marsys_messages WHERE key_id = %s AND seq IN"
                    " (SELECT seq FROM marsys_messages WHERE key_id = %s AND protected = %s"
                    " ORDER BY seq LIMIT %s)",
                    (found_id, found_id, protected, excess),
                ).rowcount
                deleted += gone
                excess -= gone
    return deleted
