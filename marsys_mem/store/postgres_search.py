"""PostgresStore's search inside the database: pgvector (dense) and full text (keywords).

With the ``vector`` extension in the store's database, schema version 4 adds::

    marsys_vectors.embedding halfvec            -- the vector again, half precision, indexed:
        marsys_hnsw_<md5(model)>                --   one partial cosine index per model (HNSW,
                                                --   or IVFFlat: the store's vector_index), on
                                                --   (embedding::halfvec(dim)), WHERE model = it
    marsys_messages.tsv tsvector                -- 'english' lexemes of the speaker's name and
        marsys_messages_tsv (GIN)               --   the text (what RAGMemory's BM25 indexes)

The exact ``float32`` bytes stay in ``marsys_vectors.data`` (``load_vectors`` returns them
bit for bit); ``embedding`` is what the index searches. One column for every model, its
dimension given per model by the index expression, so a model needs no table of its own
and deleting a message (whatever deletes it: ``forget``, ttl, ``max_messages``, a cascade)
removes its vectors and its keywords in the same transaction, through the foreign key and
the row itself. The migration fills both columns from what is stored, in place, once.

Without the extension nothing changes: hosts keep searching with their own indexes, and
the store says so once, when it opens.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psycopg
from psycopg import sql

from marsys_mem.model.hnsw import HnswSettings, IvfSettings
from marsys_mem.model.messages import MESSAGE_LIST_ADAPTER, Message
from marsys_mem.store.base import (
    CountMatches,
    Key,
    LoadAround,
    ScoreAround,
    ScoreVectors,
    SearchHit,
    SearchText,
    SearchVectors,
    TurnRow,
)
from marsys_mem.store.vectors import from_bytes

__all__ = [
    "COUNT_CAP",
    "COUNT_EXACT",
    "KEYWORD_CHARS",
    "TEXT_CONFIG",
    "THREAD_FIELD",
    "TRAINED_ON",
    "TSV_STATISTICS",
    "SearchSetup",
    "build_missing_indexes",
    "count_matches",
    "count_vectors",
    "drop_indexes",
    "index_name",
    "ivf_build_bytes",
    "key_filter",
    "keyword_text",
    "literals",
    "load_around",
    "migrate_search",
    "nearest",
    "nearest_once",
    "open_search",
    "prepare_search",
    "rebuild_index",
    "rebuild_indexes",
    "scans_exactly",
    "score_around",
    "score_vectors",
    "search_text",
    "search_vectors",
    "thread_index",
    "trained_on",
    "tsv_statistics",
]

log = logging.getLogger(__name__)

Connection = psycopg.Connection[tuple[Any, ...]]

TEXT_CONFIG = "english"
"""The text search configuration: stop words dropped and words stemmed, as BM25's tokenizer."""

KEYWORD_CHARS = 100_000
"""The characters of a message's text that are indexed for keyword search (tsvector's limit
is 1 MB; RAGMemory indexes no longer text either)."""

EXACT_BELOW = 20_000
"""A filtered search over fewer candidate messages than this and less than a twentieth of
the store scans them exactly (no index): the index would walk 20x k rows to find k that
pass; over fewer than :data:`EXACT_ALWAYS_BELOW` it always does."""

EXACT_ALWAYS_BELOW = 2_000
"""A filtered search over fewer candidate messages than this scans them exactly."""


def scans_exactly(candidates: int, total: int) -> bool:
    """Whether a search filtered to ``candidates`` of ``total`` messages scans exactly.

    Example:
        >>> scans_exactly(1_500, 10_000), scans_exactly(10_000, 10_000)
        (True, False)
        >>> scans_exactly(10_000, 1_000_000), scans_exactly(30_000, 1_000_000)
        (True, False)
    """
    return candidates < EXACT_ALWAYS_BELOW or (candidates < EXACT_BELOW and candidates * 20 < total)


COUNT_EXACT = 1_000
"""Over a big scope, a word the planner's statistics put in at least this many of its
messages is not counted (see :func:`count_matches`)."""

COUNT_CAP = 50_000
"""The most matches of one word :func:`count_matches` counts (statistics missing or stale)."""

TSV_STATISTICS = 1_000
"""The ``tsv`` column's statistics target: ANALYZE keeps its 10,000 most common lexemes
with their frequencies (100 by default keeps 1,000), so a word outside them is rare."""

_CHUNK = 2_000


@dataclass(frozen=True, slots=True)
class SearchSetup:
    """Where the ``vector`` extension lives in the store's database (its types, operators).

    Attributes:
        schema: the extension's schema.
        index: how vector indexes are built and searched (:class:`HnswSettings` or
            :class:`IvfSettings`).
        deferred: a new model's vectors are written without building its index (a bulk
            load builds it at the end: :func:`build_missing_indexes`).

    Example:
        >>> SearchSetup("public").schema
        'public'
    """

    schema: str
    index: HnswSettings | IvfSettings = field(default_factory=HnswSettings)
    deferred: bool = False

    def halfvec(self, dim: int | None = None) -> sql.Composable:
        """The ``halfvec`` type, qualified (``halfvec(dim)`` with a dimension)."""
        name = sql.SQL("{}.halfvec").format(sql.Identifier(self.schema))
        return name if dim is None else sql.SQL("{}({})").format(name, sql.Literal(int(dim)))

    def distance(self) -> sql.Composable:
        """The cosine distance operator, qualified."""
        return sql.SQL("OPERATOR({}.<=>)").format(sql.Identifier(self.schema))


def keyword_text(message: Message) -> str:
    """What keyword search indexes of a message: ``name: text`` (as RAGMemory's BM25).

    The speaker is ``message.name``, else ``metadata["agent"]``; the text is cut at
    :data:`KEYWORD_CHARS`, NUL characters blanked.

    Example:
        >>> keyword_text(Message.user("hi", name="ana"))
        'ana: hi'
    """
    text = message.text[:KEYWORD_CHARS].replace("\x00", " ")  # PostgreSQL text holds no NUL
    name = message.name or message.metadata.get("agent")
    return f"{name}: {text}" if isinstance(name, str) and name else text


# ---------------------------------------------------------------------- opening
def _extension_schema(conn: Connection) -> str | None:
    row = conn.execute(
        "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace"
        " WHERE e.extname = 'vector'"
    ).fetchone()
    return None if row is None else str(row[0])


def _available(conn: Connection) -> bool:
    row = conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'").fetchone()
    return row is not None


def _installed(conn: Connection) -> bool:
    row = conn.execute(
        "SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('marsys_vectors')"
        " AND attname = 'embedding' AND NOT attisdropped"
    ).fetchone()
    return row is not None


def _create_extension(conn: Connection) -> str | None:
    """``CREATE EXTENSION vector`` if the server ships it and we may; its schema or ``None``."""
    if not _available(conn):
        return None
    conn.execute("SAVEPOINT marsys_vector")
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    except psycopg.Error as exc:  # no privilege: stay on the hosts
        conn.execute("ROLLBACK TO SAVEPOINT marsys_vector")
        log.debug("CREATE EXTENSION vector failed: %s", exc)
        return None
    conn.execute("RELEASE SAVEPOINT marsys_vector")
    return _extension_schema(conn)


def migrate_search(conn: Connection) -> None:
    """Schema version 4: the search columns and indexes, if the ``vector`` extension is there.

    Runs inside the migration's transaction. Without the extension (and no right to create
    it) it does nothing; :func:`open_search` adds them when the extension appears later.
    """
    schema = _extension_schema(conn) or _create_extension(conn)
    if schema is not None and not _installed(conn):
        _install(conn, SearchSetup(schema))


def open_search(
    conn: Connection, where: str, lock: int, index: HnswSettings | IvfSettings | None = None
) -> SearchSetup | None:
    """At open: the store's search setup, or ``None`` (said once, in a log line).

    A database whose extension was installed after its schema reached version 4 gets the
    search columns now, under the migration lock ``lock`` (hosts opening together do it once).
    ``index``: how this store builds and searches vector indexes (default: :class:`HnswSettings`).
    """
    index = index or HnswSettings()
    schema = _extension_schema(conn)
    if schema is not None and _installed(conn):
        if not _has_thread_index(conn) or not _has_tsv_statistics(conn):  # an older store
            conn.execute("SELECT pg_advisory_lock(%s)", (lock,))
            try:
                with conn.transaction():
                    thread_index(conn)
                    tsv_statistics(conn)
            finally:
                if not conn.closed:
                    conn.execute("SELECT pg_advisory_unlock(%s)", (lock,))
        return SearchSetup(schema, index)
    if schema is None and not _available(conn):
        log.info(
            "%s has no 'vector' extension (pgvector): search stays on the hosts "
            "(each keeps its own index of the store's vectors)",
            where,
        )
        return None
    conn.execute("SELECT pg_advisory_lock(%s)", (lock,))
    try:
        with conn.transaction():
            schema = _extension_schema(conn) or _create_extension(conn)
            if schema is not None and not _installed(conn):
                _install(conn, SearchSetup(schema, index))
    finally:
        if not conn.closed:
            conn.execute("SELECT pg_advisory_unlock(%s)", (lock,))
    if schema is None:
        log.info(
            "%s: the 'vector' extension (pgvector) is available but not installed, and this "
            "user may not create it (CREATE EXTENSION vector): search stays on the hosts",
            where,
        )
        return None
    return SearchSetup(schema, index)


def _has_thread_index(conn: Connection) -> bool:
    row = conn.execute("SELECT to_regclass('marsys_messages_thread') IS NOT NULL").fetchone()
    return bool(row and row[0])


def _has_tsv_statistics(conn: Connection) -> bool:
    row = conn.execute(
        "SELECT coalesce(attstattarget, -1) = %s FROM pg_attribute"
        " WHERE attrelid = to_regclass('marsys_messages') AND attname = 'tsv'",
        (TSV_STATISTICS,),
    ).fetchone()
    return bool(row and row[0])


def tsv_statistics(conn: Connection) -> None:
    """Set the ``tsv`` column's statistics target (:data:`TSV_STATISTICS`), if not yet."""
    if not _has_tsv_statistics(conn):
        conn.execute(
            sql.SQL("ALTER TABLE marsys_messages ALTER COLUMN tsv SET STATISTICS {}").format(
                sql.Literal(TSV_STATISTICS)
            )
        )


def _install(conn: Connection, setup: SearchSetup) -> None:
    """Add the columns, fill them from what is stored (once), then index them."""
    conn.execute(
        sql.SQL("ALTER TABLE marsys_vectors ADD COLUMN embedding {}").format(setup.halfvec())
    )
    conn.execute("ALTER TABLE marsys_messages ADD COLUMN tsv tsvector")
    _fill_keywords(conn)
    _fill_embeddings(conn, setup)
    conn.execute("CREATE INDEX marsys_messages_tsv ON marsys_messages USING gin (tsv)")
    tsv_statistics(conn)
    thread_index(conn)
    for model, dim in conn.execute("SELECT model, dim FROM marsys_vector_models").fetchall():
        model_index(conn, setup, str(model), int(dim))


def _fill_keywords(conn: Connection) -> None:
    after = (0, 0)
    while True:
        rows = conn.execute(
            "SELECT key_id, seq, data FROM marsys_messages WHERE (key_id, seq) > (%s, %s)"
            " ORDER BY key_id, seq LIMIT %s",
            (*after, _CHUNK),
        ).fetchall()
        if not rows:
            return
        messages = MESSAGE_LIST_ADAPTER.validate_json("[" + ",".join(r[2] for r in rows) + "]")
        conn.execute(
            "UPDATE marsys_messages m SET tsv = to_tsvector(%s::regconfig, u.txt)"
            " FROM unnest(%s::bigint[], %s::bigint[], %s::text[]) AS u(key_id, seq, txt)"
            " WHERE m.key_id = u.key_id AND m.seq = u.seq",
            (
                TEXT_CONFIG,
                [r[0] for r in rows],
                [r[1] for r in rows],
                [keyword_text(m) for m in messages],
            ),
        )
        after = (int(rows[-1][0]), int(rows[-1][1]))


def _fill_embeddings(conn: Connection, setup: SearchSetup) -> None:
    for model, dim in conn.execute("SELECT model, dim FROM marsys_vector_models").fetchall():
        after = 0
        while True:
            rows = conn.execute(
                "SELECT vseq, data FROM marsys_vectors WHERE model = %s AND vseq > %s"
                " ORDER BY vseq LIMIT %s",
                (model, after, _CHUNK),
            ).fetchall()
            if not rows:
                break
            vectors = from_bytes([bytes(r[1]) for r in rows], int(dim))
            conn.execute(
                sql.SQL(
                    "UPDATE marsys_vectors v SET embedding = u.emb::{}"
                    " FROM unnest(%s::bigint[], %s::text[]) AS u(vseq, emb)"
                    " WHERE v.vseq = u.vseq"
                ).format(setup.halfvec(int(dim))),
                ([r[0] for r in rows], literals(vectors)),
            )
            after = int(rows[-1][0])


# ---------------------------------------------------------------------- writing
def index_name(model: str) -> str:
    """The name of ``model``'s vector index (HNSW or IVFFlat: the prefix is historical).

    Example:
        >>> index_name("minilm")
        'marsys_hnsw_...'
    """
    return "marsys_hnsw_" + hashlib.md5(model.encode(), usedforsecurity=False).hexdigest()[:16]


def model_index(
    conn: Connection,
    setup: SearchSetup,
    model: str,
    dim: int,
    *,
    name: str | None = None,
    concurrently: bool = False,
) -> None:
    """The cosine index of ``model``'s vectors, of ``setup.index``'s kind and settings.

    HNSW: built with ``m`` and ``ef_construction`` (once, when the model appears). IVFFlat:
    its lists trained on the model's vectors now (:meth:`IvfSettings.lists_for` their
    count). ``name``: another name than :func:`index_name` (a rebuild); ``concurrently``:
    without blocking writes (outside a transaction).
    """
    index = setup.index
    rows = 0
    if isinstance(index, IvfSettings):
        rows = count_vectors(conn, model)
        lists = index.lists_for(rows)
        method = sql.SQL("ivfflat")
        options = sql.SQL("lists = {}").format(sql.Literal(lists))
        # k-means over 50 samples a list keeps a bound per sample and list: the session
        # gets the memory the build needs (a server's default 64 MB fits ~550 lists)
        need = ivf_build_bytes(lists, rows, dim)
        conn.execute(
            "SELECT set_config('maintenance_work_mem', %s, false)"
            " WHERE pg_size_bytes(current_setting('maintenance_work_mem')) < %s",
            (f"{-(-need // 2**20)}MB", need),
        )
    else:
        method = sql.SQL("hnsw")
        options = sql.SQL("m = {}, ef_construction = {}").format(
            sql.Literal(index.m), sql.Literal(index.ef_construction)
        )
    name = name or index_name(model)
    conn.execute(
        sql.SQL(
            "CREATE INDEX {c}IF NOT EXISTS {n} ON marsys_vectors USING {method}"
            " ((embedding::{t}) {s}.halfvec_cosine_ops) WITH ({options})"
            " WHERE model = {model}"
        ).format(
            c=sql.SQL("CONCURRENTLY " if concurrently else ""),
            n=sql.Identifier(name),
            method=method,
            t=setup.halfvec(dim),
            s=sql.Identifier(setup.schema),
            options=options,
            model=sql.Literal(model),
        )
    )
    if isinstance(index, IvfSettings):  # what the lists were trained on, kept with them
        conn.execute(
            sql.SQL("COMMENT ON INDEX {} IS {}").format(
                sql.Identifier(name), sql.Literal(f"{TRAINED_ON}{rows}")
            )
        )


def ivf_build_bytes(lists: int, rows: int, dim: int) -> int:
    """About the memory pgvector's IVFFlat build asks of ``maintenance_work_mem``.

    Its k-means samples 50 vectors a list (at least 10,000, at most ``rows``) and keeps a
    lower bound per sample and centroid (4 bytes each), the centroids' distances to each
    other, and the samples and centroids themselves; 5% more, and 16 MB, to spare.

    Example:
        >>> round(ivf_build_bytes(4000, 1_000_000, 384) / 2**20)  # pgvector asked 3,275 MB
        3614
        >>> round(ivf_build_bytes(100, 5_000, 384) / 2**20)
        26
    """
    samples = min(max(50 * lists, 10_000), max(rows, 1))
    floats = samples * lists + lists * lists + (samples + 3 * lists) * (dim + 4)
    return int(floats * 4 * 1.05) + 16 * 2**20


TRAINED_ON = "marsys-mem: lists trained on "
"""The start of an IVFFlat index's comment, before the number of vectors it was trained on."""


def count_vectors(conn: Connection, model: str) -> int:
    """How many vectors of ``model`` the store holds (an index-only count)."""
    row = conn.execute("SELECT count(*) FROM marsys_vectors WHERE model = %s", (model,)).fetchone()
    return int(row[0]) if row else 0


def trained_on(conn: Connection, model: str) -> tuple[str | None, int | None]:
    """``model``'s index method and the vectors its lists were trained on.

    The method is ``None`` when the model has no index; the count is ``None`` for an HNSW
    index or an IVFFlat one built before the count was kept.
    """
    row = conn.execute(
        "SELECT a.amname, obj_description(c.oid, 'pg_class') FROM pg_class c"
        " JOIN pg_am a ON a.oid = c.relam WHERE c.oid = to_regclass(%s)",
        (index_name(model),),
    ).fetchone()
    if row is None:
        return None, None
    note = str(row[1] or "")
    count = note[len(TRAINED_ON) :] if note.startswith(TRAINED_ON) else ""
    return str(row[0]), int(count) if count.isdigit() else None


def drop_indexes(conn: Connection) -> list[str]:
    """Drop every model's vector index (a bulk load, which builds them after); their names."""
    names = [
        str(r[0])
        for r in conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid"
            " WHERE i.indrelid = to_regclass('marsys_vectors') AND c.relname LIKE 'marsys_hnsw_%%'"
        )
    ]
    for name in names:
        conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(sql.Identifier(name)))
    return names


def build_missing_indexes(conn: Connection, setup: SearchSetup) -> list[str]:
    """Build the vector index of every model that has none (after a bulk load); the models.

    A plain ``CREATE INDEX`` (writes wait for it, searches do not): the fastest build, with
    the server's parallel maintenance workers.
    """
    rows = conn.execute("SELECT model, dim FROM marsys_vector_models ORDER BY model").fetchall()
    built = []
    for model, dim in rows:
        if conn.execute("SELECT to_regclass(%s)", (index_name(str(model)),)).fetchone() == (None,):
            model_index(conn, setup, str(model), int(dim))
            built.append(str(model))
    return built


def rebuild_indexes(conn: Connection, setup: SearchSetup) -> list[str]:
    """Build every model's vector index again with ``setup.index``; the models rebuilt.

    Each new index is built beside the old one without blocking writes (``CREATE INDEX
    CONCURRENTLY``; searches keep using the old one), then takes its place. ``conn`` is in
    autocommit mode.
    """
    models = [
        (str(r[0]), int(r[1]))
        for r in conn.execute("SELECT model, dim FROM marsys_vector_models ORDER BY model")
    ]
    for model, dim in models:
        rebuild_index(conn, setup, model, dim)
    return [model for model, _ in models]


def rebuild_index(conn: Connection, setup: SearchSetup, model: str, dim: int) -> None:
    """Build ``model``'s vector index again beside the old one, then swap them.

    ``CREATE INDEX CONCURRENTLY`` (writes and searches go on; searches use the old index
    meanwhile); ``conn`` is in autocommit mode. A build left unfinished (its connection
    lost) is dropped by the next one.
    """
    name = index_name(model)
    fresh = name[: len("marsys_hnsw_")] + "new_" + name[len("marsys_hnsw_") :]
    conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(sql.Identifier(fresh)))
    model_index(conn, setup, model, dim, name=fresh, concurrently=True)
    with conn.transaction():
        conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(sql.Identifier(name)))
        conn.execute(
            sql.SQL("ALTER INDEX {} RENAME TO {}").format(
                sql.Identifier(fresh), sql.Identifier(name)
            )
        )


def literals(vectors: np.ndarray[Any, Any]) -> list[str]:
    """Vectors as pgvector text literals (``[x,y,...]``), 6 significant digits.

    ``halfvec`` keeps about 3; the exact ``float32`` bytes travel separately (``data``).

    Example:
        >>> literals(np.array([[0.5, -1.0]], dtype=np.float32))
        ['[0.5,-1]']
    """
    if not len(vectors):
        return []
    fmt = "[" + ",".join(["%.6g"] * int(vectors.shape[1])) + "]"
    return [fmt % tuple(row) for row in vectors.tolist()]


# ---------------------------------------------------------------------- searching
def key_filter(
    conn: Connection, keys: tuple[Key, ...] | None, namespace: str | None
) -> tuple[list[int] | None, int]:
    """The key ids a search is limited to (``None``: all) and their messages' count.

    Example:
        >>> key_filter(None, None, None)  # no filter: no query
        (None, -1)
    """
    found = _key_query(keys, namespace)
    if found is None:
        return None, -1
    row = conn.execute(*found).fetchone()
    assert row is not None  # an aggregate always returns its row
    return [int(i) for i in row[0]], int(row[1])


def _key_query(keys: tuple[Key, ...] | None, namespace: str | None) -> tuple[str, list[Any]] | None:
    """The query of :func:`key_filter` and its parameters (``None``: no filter)."""
    if keys is None and namespace is None:
        return None
    query = (
        "SELECT coalesce(array_agg(id), '{}') AS ids, coalesce(sum(n), 0) AS sum"
        " FROM marsys_keys WHERE true"
    )
    params: list[Any] = []
    if keys is not None:
        columns = [list(c) for c in zip(*keys, strict=True)] if keys else [[], [], []]
        query += (
            " AND (namespace, agent, branch) IN"
            " (SELECT * FROM unnest(%s::text[], %s::text[], %s::text[]))"
        )
        params.extend(columns)
    if namespace is not None:
        query += " AND namespace = %s"
        params.append(namespace)
    return query, params


def _hits(rows: list[tuple[Any, ...]]) -> tuple[SearchHit, ...]:
    return tuple(
        SearchHit(
            (str(r[0]), str(r[1]), str(r[2])),
            str(r[3]),
            float(r[4]),
            str(r[5]) if len(r) > 5 and r[5] is not None else None,
        )
        for r in rows
    )


def prepare_search(
    conn: Connection, op: SearchVectors, setup: SearchSetup | None = None
) -> tuple[int | None, list[int] | None, int]:
    """Set the connection's index scan for ``op``; the model's dimension and the key filter.

    Returns ``(dim, key_ids, count)``: the model's dimension (``None``: unknown model) and
    :func:`key_filter`'s ids and count, in the same round trip. The scan settings are
    ``setup.index``'s ``scan_settings(k)``: ``hnsw.ef_search`` suits ``k``
    (:meth:`HnswSettings.search_width`), or ``ivfflat.probes``; their ``iterative_scan``
    lets a filtered scan go on until it has ``k`` rows that pass. Session settings: they
    only steer index scans, which only a search runs, and each search sets them first.

    Raises:
        ValueError: the query vector's dimension is not the one ``op.model`` is stored in.
    """
    scan = (HnswSettings() if setup is None else setup.index).scan_settings(op.k)
    settings = ", set_config(%s, %s, false)" * len(scan)  # names and values bound
    query = "SELECT (SELECT dim FROM marsys_vector_models WHERE model = %s)" + settings  # noqa: S608
    params: list[Any] = [op.model, *(x for item in scan.items() for x in item)]
    keys = _key_query(op.keys, op.namespace)
    if keys is not None:
        query += ", kf.* FROM (" + keys[0] + ") AS kf"
        params.extend(keys[1])
    row = conn.execute(query, params).fetchone()
    assert row is not None  # one row, whatever the tables hold
    dim = None if row[0] is None else int(row[0])
    if dim is not None and dim != op.vector.shape[0]:
        raise ValueError(
            f"vector is {op.vector.shape[0]}-D; model {op.model!r} is stored {dim}-D here"
        )
    if keys is None:
        return dim, None, -1
    return dim, [int(i) for i in row[1 + len(scan)]], int(row[2 + len(scan)])


def scan_defaults(setup: SearchSetup) -> tuple[str, list[str]]:
    """The statement (and its values) that gives a new connection the store's scan settings.

    A search sets them again in its own statement, but as a filter on the index scan's
    rows, and pgvector reads them when the scan starts: the new connection's first search
    would run on pgvector's defaults (one IVFFlat probe, no iterative scan). The pools run
    this on each connection they open; ``k`` up to ``ef_search / 2`` needs nothing more.

    Example:
        >>> from marsys_mem.model.hnsw import IvfSettings
        >>> scan_defaults(SearchSetup("public", IvfSettings(probes=8)))[1][:2]
        ['ivfflat.probes', '8']
    """
    scan = setup.index.scan_settings(1)
    values = [x for item in scan.items() for x in item]
    return "SELECT " + ", ".join(["set_config(%s, %s, false)"] * len(scan)), values


def search_vectors(
    conn: Connection, setup: SearchSetup, op: SearchVectors
) -> tuple[SearchHit, ...]:
    """Run ``op``: the HNSW index (iterative scan when filtered), or an exact scan of few rows.

    One statement (:func:`nearest_once`) sets the scan, resolves the key filter and
    searches; only a search that returns fewer than ``k`` rows (an unknown model, another
    dimension, few vectors, or an index scan that stopped early) looks further.

    Raises:
        ValueError: the query vector's dimension is not the one ``op.model`` is stored in.
    """
    rows = nearest_once(conn, setup, op)
    if len(rows) >= op.k:
        return _hits(rows)
    dim, key_ids, candidates = prepare_search(conn, op, setup)  # raises on another dimension
    if dim is None or (key_ids is not None and not key_ids):
        return ()
    if key_ids is not None and scans_exactly(candidates, _total(conn)):
        return _hits(rows)  # that was the exact scan
    return _hits(nearest(conn, setup, op, dim, key_ids, exact=True))  # make sure, exactly


def _total(conn: Connection) -> int:
    row = conn.execute("SELECT coalesce(sum(n), 0) FROM marsys_keys").fetchone()
    return int(row[0]) if row else 0


def nearest_once(
    conn: Connection, setup: SearchSetup, op: SearchVectors, *, explain: bool = False
) -> list[tuple[Any, ...]]:
    """:func:`prepare_search` and :func:`nearest` in one statement (one round trip).

    The scan's settings are set by a one-time filter, which runs before the index scan's
    first row (when pgvector reads them); the key filter is resolved in the statement, and
    of the two ways to search (the HNSW index, or an exact scan of the keys' rows under
    :func:`scans_exactly`'s count) the one its count picks runs. A model stored in another
    dimension than ``op.vector``'s returns no rows (:func:`search_vectors` then says why).
    """
    dim = int(op.vector.shape[0])
    distance = sql.SQL("(v.embedding::{t}) {op} %(q)s::{t}").format(
        t=setup.halfvec(dim), op=setup.distance()
    )
    scan = setup.index.scan_settings(op.k)
    settings = "".join(  # names and values bound
        f"set_config(%(g{n})s, %(s{n})s, false) IS NOT NULL AND " for n in range(len(scan))
    )
    ready = sql.SQL(
        settings + "(SELECT dim FROM marsys_vector_models WHERE model = %(model)s) = %(dim)s"  # noqa: S608
    )
    params: dict[str, Any] = {
        "q": literals(op.vector[None, :])[0],
        "model": op.model,
        "k": op.k,
        "dim": dim,
        "exact": EXACT_BELOW,
        "always": EXACT_ALWAYS_BELOW,
    }
    for n, (name, value) in enumerate(scan.items()):
        params[f"g{n}"], params[f"s{n}"] = name, value
    head = sql.SQL("EXPLAIN " if explain else "")
    tail = sql.SQL(" JOIN marsys_keys k ON k.id = c.key_id ORDER BY c.d, c.key_id, c.message_id")
    data = sql.SQL(", m.data" if op.with_data else "")
    if op.with_data:  # each hit's message, by its unique index, in the same query
        tail = sql.SQL(
            " JOIN marsys_keys k ON k.id = c.key_id CROSS JOIN LATERAL (SELECT m.data"
            " FROM marsys_messages m WHERE m.key_id = c.key_id"
            ' AND m.message_id = (c.message_id COLLATE "C") LIMIT 1) AS m'
            " ORDER BY c.d, c.key_id, c.message_id"
        )
    found = _key_query(op.keys, op.namespace)
    if found is None:
        query = sql.SQL(
            "{x}SELECT k.namespace, k.agent, k.branch, c.message_id, 1 - c.d{data} FROM"
            " (SELECT v.key_id, v.message_id, {d} AS d FROM marsys_vectors v"
            " WHERE {ready} AND v.model = %(model)s ORDER BY {d} LIMIT %(k)s) AS c{tail}"
        ).format(x=head, d=distance, ready=ready, tail=tail, data=data)
        return conn.execute(query, params, prepare=False).fetchall()
    keys_sql, keys_params = found
    for n, value in enumerate(keys_params):
        params[f"p{n}"] = value
    parts = keys_sql.split("%s")  # named parameters, for one dict
    keys_sql = parts[0] + "".join(f"%(p{n})s{rest}" for n, rest in enumerate(parts[1:]))
    keys_sql = keys_sql.replace("{", "{{").replace("}", "}}")  # literal braces in a template
    keys_sql = keys_sql.replace(
        " FROM marsys_keys WHERE",
        ", (SELECT coalesce(sum(n), 0) FROM marsys_keys) AS total FROM marsys_keys WHERE",
        1,
    )
    exact = "(kf.sum < %(always)s OR (kf.sum < %(exact)s AND kf.sum * 20 < kf.total))"
    # the same two searches as nearest(): the index (its filter hidden from the planner's
    # estimate by coalesce) and the exact scan by the keys' index ("+ 0" hides the HNSW one)
    query = sql.SQL(
        "{x}WITH kf AS MATERIALIZED (" + keys_sql + ")"  # noqa: S608 (SQL from constants; values bound)
        " SELECT k.namespace, k.agent, k.branch, c.message_id, 1 - c.d{data} FROM kf CROSS JOIN"
        " LATERAL ((SELECT v.key_id, v.message_id, {d} AS d FROM marsys_vectors v"
        " WHERE NOT " + exact + " AND {ready} AND v.model = %(model)s"
        " AND coalesce((v.key_id + 0) = ANY(kf.ids), false) ORDER BY {d} LIMIT %(k)s)"
        " UNION ALL (SELECT v.key_id, v.message_id, {d} AS d FROM marsys_vectors v"
        " WHERE " + exact + " AND {ready} AND v.model = %(model)s"
        " AND v.key_id = ANY(kf.ids) ORDER BY ({d}) + 0 LIMIT %(k)s)) AS c{tail}"
    ).format(x=head, d=distance, ready=ready, tail=tail, data=data)
    return conn.execute(query, params, prepare=False).fetchall()


def nearest(
    conn: Connection,
    setup: SearchSetup,
    op: SearchVectors,
    dim: int,
    key_ids: list[int] | None,
    *,
    exact: bool,
    explain: bool = False,
) -> list[tuple[Any, ...]]:
    """The nearest rows: by the model's HNSW index, or (``exact``) by scanning the keys'."""
    distance = sql.SQL("(v.embedding::{t}) {op} %(q)s::{t}").format(
        t=setup.halfvec(dim), op=setup.distance()
    )
    # The index serves ORDER BY <its expression> <=> q: "+ 0" hides it (an exact scan of
    # the keys' rows, by their index), and hides the keys' index from the HNSW query, so
    # the planner does not sort a big filter's rows when its statistics lag (a fresh store).
    order = sql.SQL("({}) + 0").format(distance) if exact else distance
    # coalesce(): the planner estimates a bare "key_id + 0 = ANY(...)" at 0.5% of the rows,
    # and pgvector's costing then expects the index scan to read 200x the limit and takes
    # a sequential scan and a sort instead (measured: 276 ms against 2.3 ms at 100k rows)
    filtered = "v.key_id = ANY(%(keys)s::bigint[])"
    if not exact:
        filtered = "coalesce((v.key_id + 0) = ANY(%(keys)s::bigint[]), false)"
    where = sql.SQL(f" AND {filtered}" if key_ids is not None else "")
    query = sql.SQL(
        "{x}WITH c AS MATERIALIZED (SELECT v.key_id, v.message_id, {d} AS d"
        " FROM marsys_vectors v WHERE v.model = %(model)s{w} ORDER BY {o} LIMIT %(k)s)"
        " SELECT k.namespace, k.agent, k.branch, c.message_id, 1 - c.d FROM c"
        " JOIN marsys_keys k ON k.id = c.key_id ORDER BY c.d, c.key_id, c.message_id"
    ).format(x=sql.SQL("EXPLAIN " if explain else ""), d=distance, w=where, o=order)
    params = {"q": literals(op.vector[None, :])[0], "model": op.model, "k": op.k, "keys": key_ids}
    # Not prepared: each search is planned with its model, so the model's partial index fits.
    return conn.execute(query, params, prepare=False).fetchall()


def search_text(conn: Connection, op: SearchText) -> tuple[SearchHit, ...]:
    """Run ``op``: any of the query's words (an OR), ranked by ``ts_rank``, best first.

    An OR, as BM25 scores a document on any query term; ``ts_rank(tsv, q, 1)``: term
    frequency, divided by 1 + log(length), so long messages do not win by size alone.
    With ``op.weights``, the rank is the sum over the weighted words of weight x that
    word's ``ts_rank`` (BM25's shape when the weights are idfs).
    """
    key_ids, _ = key_filter(conn, op.keys, op.namespace)
    if key_ids is not None and not key_ids:
        return ()
    where = " AND m.key_id = ANY(%(keys)s::bigint[])" if key_ids is not None else ""
    rank = "ts_rank(m.tsv, q.q, 1)"
    weighted = ""
    if op.weights:
        weighted = (
            " w AS MATERIALIZED (SELECT u.wt, replace(plainto_tsquery(%(cfg)s::regconfig,"
            " u.word)::text, ' & ', ' | ')::tsquery AS q"
            " FROM unnest(%(words)s::text[], %(wts)s::float8[]) AS u(word, wt)),"
        )
        rank = (
            "(SELECT coalesce(sum(w.wt * ts_rank(m.tsv, w.q, 1)), 0) FROM w"
            " WHERE numnode(w.q) > 0 AND m.tsv @@ w.q)"
        )
    rows = conn.execute(
        "WITH q AS (SELECT replace(plainto_tsquery(%(cfg)s::regconfig, %(query)s)::text,"  # noqa: S608 (SQL from constants; values bound)
        f" ' & ', ' | ')::tsquery AS q),{weighted}"
        f" c AS MATERIALIZED (SELECT m.key_id, m.seq, m.message_id, {rank} AS r"
        f" FROM marsys_messages m, q WHERE m.tsv @@ q.q{where}"
        " ORDER BY r DESC, m.key_id, m.seq LIMIT %(k)s)"
        " SELECT k.namespace, k.agent, k.branch, c.message_id, c.r FROM c"
        " JOIN marsys_keys k ON k.id = c.key_id ORDER BY c.r DESC, c.key_id, c.seq",
        {
            "cfg": TEXT_CONFIG,
            "query": op.query,
            "k": op.k,
            "keys": key_ids,
            "words": [w for w, _ in op.weights],
            "wts": [float(x) for _, x in op.weights],
        },
    ).fetchall()
    return _hits(rows)


def count_matches(conn: Connection, op: CountMatches) -> dict[str, int]:
    """Run ``op``: each word's matches, counted exactly up to :data:`COUNT_EXACT`.

    A word matches as :func:`search_text` matches a one-word query (its lexemes ORed); a
    word with no lexeme (a stop word) counts 0. Over a scope of fewer than
    :data:`EXACT_BELOW` messages every count is exact (one GIN scan for all the words).
    Over a bigger one, a word the planner's statistics of the ``tsv`` column find in more
    than :data:`COUNT_EXACT` of the scope's messages is not counted: its count is that
    frequency times the scope's size (an estimate, which is all BM25's idf needs of a
    common word); any other word is counted, stopping at :data:`COUNT_CAP`. So the cost is
    bounded by the rare words' matches, whatever the store's size.
    """
    counts = dict.fromkeys(op.words, 0)
    key_ids, scope = key_filter(conn, op.keys, op.namespace)
    if not op.words or (key_ids is not None and not key_ids):
        return counts
    if key_ids is None:
        row = conn.execute("SELECT coalesce(sum(n), 0) FROM marsys_keys").fetchone()
        scope = int(row[0]) if row else 0
    where = " AND m.key_id = ANY(%(keys)s::bigint[])" if key_ids is not None else ""
    words = list(counts)
    params = {"cfg": TEXT_CONFIG, "words": words, "keys": key_ids}
    if scope < EXACT_BELOW:
        rows = conn.execute(
            "WITH w AS MATERIALIZED (SELECT u.i, replace(plainto_tsquery(%(cfg)s::regconfig,"  # noqa: S608 (SQL from constants; values bound)
            " u.word)::text, ' & ', ' | ')::tsquery AS q"
            " FROM unnest(%(words)s::text[]) WITH ORDINALITY AS u(word, i)),"
            " a AS (SELECT string_agg('(' || q::text || ')', ' | ')::tsquery AS q FROM w"
            " WHERE numnode(q) > 0),"
            " m AS MATERIALIZED (SELECT m.tsv FROM marsys_messages m"
            f" WHERE m.tsv @@ (SELECT q FROM a){where})"
            " SELECT w.i, count(*) FROM m JOIN w ON numnode(w.q) > 0 AND m.tsv @@ w.q"
            " GROUP BY w.i",
            params,
        ).fetchall()
    else:
        rows = conn.execute(
            "WITH w AS MATERIALIZED (SELECT u.i,"  # noqa: S608 (SQL from constants; values bound)
            " replace(plainto_tsquery(%(cfg)s::regconfig, u.word)::text, ' & ', ' | ')::tsquery"
            " AS q, tsvector_to_array(to_tsvector(%(cfg)s::regconfig, u.word)) AS lx"
            " FROM unnest(%(words)s::text[]) WITH ORDINALITY AS u(word, i)),"
            " st AS MATERIALIZED (SELECT s.most_common_elems::text::text[] AS e,"
            " s.most_common_elem_freqs AS f FROM pg_stats s"
            " JOIN pg_class c ON c.oid = to_regclass('marsys_messages')"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE s.schemaname = n.nspname AND s.tablename = 'marsys_messages'"
            " AND s.attname = 'tsv'),"
            " e AS (SELECT w.i, w.q, (SELECT max(st.f[array_position(st.e, x)]) * %(scope)s"
            " FROM st, unnest(w.lx) AS x) AS est FROM w WHERE numnode(w.q) > 0)"
            " SELECT e.i, CASE WHEN e.est >= %(exact)s THEN round(e.est)::bigint"
            " ELSE (SELECT count(*) FROM (SELECT 1 FROM marsys_messages m"
            f" WHERE m.tsv @@ e.q{where} LIMIT %(cap)s) AS x) END FROM e",
            {**params, "scope": scope, "exact": COUNT_EXACT, "cap": COUNT_CAP},
        ).fetchall()
    counts.update((words[int(r[0]) - 1], int(r[1])) for r in rows)
    return counts


def score_vectors(conn: Connection, setup: SearchSetup, op: ScoreVectors) -> tuple[SearchHit, ...]:
    """Run ``op``: the cosines of the ids' vectors, read by primary key (no index scan).

    The same half-precision column and operator as :func:`search_vectors`, so these
    cosines and a search's are on one scale.

    Raises:
        ValueError: the query vector's dimension is not the one ``op.model`` is stored in.
    """
    row = conn.execute(
        "SELECT dim FROM marsys_vector_models WHERE model = %s", (op.model,)
    ).fetchone()
    if row is None or not op.ids:
        return ()
    dim = int(row[0])
    if dim != op.vector.shape[0]:
        raise ValueError(
            f"vector is {op.vector.shape[0]}-D; model {op.model!r} is stored {dim}-D here"
        )
    # a primary-key probe per id: the ids in the column's collation (C), and the model hidden
    # from the key's index, which the planner takes otherwise when its statistics lag
    query = sql.SQL(
        "SELECT k.namespace, k.agent, k.branch, v.message_id,"
        " 1 - ((v.embedding::{t}) {op} %(q)s::{t}) AS s"
        " FROM marsys_keys k, unnest(%(ids)s::text[]) AS i(id) CROSS JOIN LATERAL"
        " (SELECT v.message_id, v.embedding FROM marsys_vectors v WHERE v.key_id = k.id"
        " AND v.message_id = (i.id COLLATE \"C\") AND v.model || '' = %(model)s LIMIT 1)"
        " AS v"
        " WHERE k.namespace = %(ns)s AND k.agent = %(agent)s AND k.branch = %(branch)s"
        " ORDER BY s DESC, v.message_id"
    ).format(t=setup.halfvec(dim), op=setup.distance())
    ns, agent, branch = op.key
    params = {
        "q": literals(op.vector[None, :])[0],
        "ns": ns,
        "agent": agent,
        "branch": branch,
        "ids": list(op.ids),
        "model": op.model,
    }
    return _hits(conn.execute(query, params, prepare=False).fetchall())


THREAD_FIELD = "thread"
"""The metadata field whose threads ``marsys_messages_thread`` indexes (RAGMemory's default
``thread_key``); :class:`LoadAround` on another field walks the key without the index."""


def _thread_expr(alias: str, field: str) -> sql.Composable:
    # the value's JSON text as stored, JSON null as SQL NULL; a NUL escape (which no
    # PostgreSQL text holds) read as a space first, so that no stored message fails it
    return sql.SQL(
        "NULLIF(((replace({}.data, '\\u0000', '\\u0020')::json) -> 'metadata' -> {})::text, 'null')"
    ).format(sql.Identifier(alias), sql.Literal(field))


def thread_index(conn: Connection) -> None:
    """The index of each key's messages by thread (:data:`THREAD_FIELD`), then position."""
    conn.execute(
        sql.SQL(
            "CREATE INDEX IF NOT EXISTS marsys_messages_thread ON marsys_messages (key_id, {}, seq)"
        ).format(_thread_expr("marsys_messages", THREAD_FIELD))
    )


def load_around(conn: Connection, op: LoadAround) -> list[Message]:
    """Run ``op``: each id's thread walked both ways, in one query.

    A turn's thread is the JSON text of ``metadata[thread]`` in the message's stored JSON
    (``null`` and missing alike: no thread); each walk reads ``before`` (``after``) turns
    of the same thread, by the thread index for :data:`THREAD_FIELD` (else by the key's
    primary key, parsing each turn).
    """
    if not op.ids:
        return []
    rows = conn.execute(_around_query(op.thread), _around_params(op)).fetchall()
    if not rows:
        return []
    return MESSAGE_LIST_ADAPTER.validate_json("[" + ",".join(r[0] for r in rows) + "]")


def score_around(conn: Connection, setup: SearchSetup, op: ScoreAround) -> tuple[TurnRow, ...]:
    """Run ``op``: :func:`load_around`'s turns, unparsed, with their cosines (one query).

    Raises:
        ValueError: the query vector's dimension is not the one ``op.model`` is stored in.
    """
    if not op.ids and not op.alone:
        return ()
    params = _around_params(op)
    params.update(q=literals(op.vector[None, :])[0], model=op.model, dim=op.vector.shape[0])
    rows = conn.execute(_around_query(op.thread, setup), params, prepare=False).fetchall()
    stored = {int(r[3]) for r in rows if r[3] is not None}
    if stored and stored != {op.vector.shape[0]}:
        raise ValueError(
            f"vector is {op.vector.shape[0]}-D; model {op.model!r} is stored {stored.pop()}-D here"
        )
    return tuple(
        TurnRow(str(r[1]), str(r[0]), None if r[2] is None else float(r[2]), int(r[4]))
        for r in rows
    )


def _around_params(op: LoadAround | ScoreAround) -> dict[str, Any]:
    ns, agent, branch = op.key
    alone = list(op.alone) if isinstance(op, ScoreAround) else []
    return {
        "ns": ns,
        "agent": agent,
        "branch": branch,
        "ids": list(op.ids) + alone,
        "walks": [True] * len(op.ids) + [False] * len(alone),  # each id's turns read or not
        "before": op.before,
        "after": op.after,
    }


def _around_query(thread: str | None, setup: SearchSetup | None = None) -> sql.Composed:
    """The turns around ids (``data``; with ``setup``: also id, cosine and model dimension)."""

    def walk(older: bool) -> sql.Composable:
        step = sql.SQL("p.seq < t.seq" if older else "p.seq > t.seq")
        order = sql.SQL("p.seq DESC" if older else "p.seq")
        limit = sql.SQL("%(before)s" if older else "%(after)s")
        if thread is None:
            return sql.SQL(
                "(SELECT p.seq, p.data, p.message_id FROM marsys_messages p"
                " WHERE t.w AND p.key_id = t.key_id AND {s} ORDER BY {o} LIMIT {n})"
            ).format(s=step, o=order, n=limit)
        expr = _thread_expr("p", thread)
        # (t.w and t.th are the outer row's: each filter is checked once, before a scan)
        return sql.SQL(
            "(SELECT p.seq, p.data, p.message_id FROM marsys_messages p WHERE t.w"
            " AND t.th IS NOT NULL AND p.key_id = t.key_id AND {e} = t.th AND {s}"
            " ORDER BY {o} LIMIT {n})"
            " UNION ALL (SELECT p.seq, p.data, p.message_id FROM marsys_messages p"
            " WHERE t.w AND t.th IS NULL AND p.key_id = t.key_id AND {e} IS NULL AND {s}"
            " ORDER BY {o} LIMIT {n})"
        ).format(e=expr, s=step, o=order, n=limit)

    th = sql.SQL("NULL::text") if thread is None else _thread_expr("m", thread)
    columns: sql.Composable = sql.SQL("s.data")
    scored: sql.Composable = sql.SQL("")
    if setup is not None:
        columns = sql.SQL("s.data, s.message_id, c.s, c.dim, s.seq")
        # the same half-precision column and operator as a search, so the scales agree
        scored = sql.SQL(
            " LEFT JOIN LATERAL (SELECT CASE WHEN {dims}(v.embedding) = %(dim)s"
            " THEN 1 - (v.embedding {op} %(q)s::{t}) END AS s, {dims}(v.embedding) AS dim"
            " FROM marsys_vectors v WHERE v.key_id = k.id AND v.message_id = s.message_id"
            " AND v.model || '' = %(model)s LIMIT 1) AS c ON true"
        ).format(
            op=setup.distance(),
            t=setup.halfvec(),
            dims=sql.SQL("{}.vector_dims").format(sql.Identifier(setup.schema)),
        )
    return sql.SQL(
        "WITH k AS (SELECT id FROM marsys_keys"
        " WHERE namespace = %(ns)s AND agent = %(agent)s AND branch = %(branch)s),"
        # one unique-index probe per id (LIMIT 1 keeps the planner from joining by a scan
        # of the whole key, which it does when its statistics lag); each walk reads its
        # turns' rows as it finds them, and each turn is kept once
        " t AS MATERIALIZED (SELECT m.key_id, m.seq, m.data, m.message_id, {th} AS th, i.w"
        " FROM k, unnest(%(ids)s::text[], %(walks)s::bool[]) AS i(id, w) CROSS JOIN LATERAL"
        " (SELECT * FROM marsys_messages m WHERE m.key_id = k.id"
        ' AND m.message_id = (i.id COLLATE "C") LIMIT 1) AS m),'
        " s AS MATERIALIZED (SELECT DISTINCT ON (u.seq) u.seq, u.data, u.message_id FROM"
        " (SELECT t.seq, t.data, t.message_id FROM t"
        " UNION ALL SELECT b.* FROM t CROSS JOIN LATERAL ({older}) AS b"
        " UNION ALL SELECT a.* FROM t CROSS JOIN LATERAL ({newer}) AS a) AS u"
        " ORDER BY u.seq)"
        " SELECT {columns} FROM k, s{scored} ORDER BY s.seq"
    ).format(th=th, older=walk(True), newer=walk(False), columns=columns, scored=scored)
