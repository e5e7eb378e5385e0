"""PostgresStore with an IVFFlat vector index (``vector_index={"kind": "ivfflat"}``).

What is IVFFlat's own: the lists are trained when the index is built (a bulk load's end,
``rebuild_vector_index``), never on a model's first vectors; until then searches scan
exactly; each search sets ``ivfflat.probes``; a filtered search still returns ``k``; the
kind can be changed by a rebuild, both ways. The conformance suite runs on these settings
too (tests/store/test_postgres_conformance.py); the config file's ``kind: ivfflat`` is
tested beside HNSW's (tests/store/test_postgres_search.py).
"""

import asyncio

import numpy as np
import psycopg
import pytest

from marsys_mem import Message
from marsys_mem.model.hnsw import HnswSettings, IvfSettings
from marsys_mem.store import postgres_search
from marsys_mem.store.base import SearchVectors
from marsys_mem.store.postgres import PostgresStore
from marsys_mem.testing.conformance.search import unit_vectors

KEY = ("default", "a", "main")
OTHER = ("default", "b", "main")
MODEL = "m"


def _indexes(dsn: str) -> list[tuple[str, str, list[str]]]:
    """The store's vector indexes: (name, access method, options)."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT c.relname, a.amname, c.reloptions FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_am a ON a.oid = c.relam"
            " WHERE n.nspname = current_schema() AND c.relname LIKE 'marsys_hnsw_%%'"
            " ORDER BY c.relname"
        ).fetchall()
    return [(str(r[0]), str(r[1]), sorted(r[2] or [])) for r in rows]


def _fill(store: PostgresStore, n: int, seed: int, key: tuple[str, str, str] = KEY) -> np.ndarray:
    vectors = unit_vectors(n, dim=16, seed=seed)
    msgs = [Message.user(f"{key[1]}{i}", message_id=f"{key[1]}{i}") for i in range(n)]
    store.append_messages(key, msgs)
    store.put_vectors(key, MODEL, [m.message_id for m in msgs], vectors)
    return vectors


def _exact(vectors: np.ndarray, query: np.ndarray, k: int, prefix: str = "a") -> list[str]:
    return [f"{prefix}{i}" for i in np.argsort(-(vectors @ query))[:k]]


def test_lists_are_trained_when_the_index_is_built_not_on_the_first_vectors(
    pgvector_dsn: str,
) -> None:
    """No index on a model's first vectors (exact scans meanwhile); a rebuild trains
    ``lists_for(rows)`` lists; scanning every list finds exactly the exact top k."""
    settings = IvfSettings(probes=2)
    with PostgresStore(pgvector_dsn, vector_index=settings) as store:
        assert store.vector_index == settings
        vectors = _fill(store, 300, seed=1)
        assert _indexes(pgvector_dsn) == []
        query = unit_vectors(1, dim=16, seed=9)[0]
        exact = _exact(vectors, query, 10)
        assert [h.message_id for h in store.search_vectors(MODEL, query, 10)] == exact
        assert store.rebuild_vector_index() == [MODEL]
    ((_, method, options),) = _indexes(pgvector_dsn)
    assert (method, options) == ("ivfflat", [f"lists={settings.lists_for(300)}"])
    with PostgresStore(pgvector_dsn, vector_index={"kind": "ivfflat", "probes": 2}) as store:
        found = [h.message_id for h in store.search_vectors(MODEL, query, 10)]
        assert len(found) == 10
        assert set(found) <= {f"a{i}" for i in range(300)}
    # every list scanned: the index returns the exact neighbours, by the index
    every = postgres_search.SearchSetup("public", IvfSettings(probes=settings.lists_for(300)))
    op = SearchVectors(MODEL, query, 10)
    with psycopg.connect(pgvector_dsn, autocommit=True) as conn:
        rows = postgres_search.nearest_once(conn, every, op)
        assert [r[3] for r in rows] == exact
        assert conn.execute("SHOW ivfflat.probes").fetchone() == (str(every.index.probes),)
        conn.execute("ANALYZE")  # 300 rows: the planner would rather scan and sort them
        conn.execute("SET enable_seqscan = off")
        conn.execute("SET enable_bitmapscan = off")
        plan = postgres_search.nearest_once(conn, every, op, explain=True)
        assert "Index Scan using marsys_hnsw_" in "\n".join(r[0] for r in plan)


def test_a_bulk_load_trains_the_lists_on_everything_loaded(pgvector_dsn: str) -> None:
    """Explicit ``lists`` are kept; the index appears at the end of the load."""
    with PostgresStore(pgvector_dsn, vector_index={"kind": "ivfflat", "lists": 8}) as store:
        with store.bulk_load():
            vectors = _fill(store, 200, seed=2)
            assert _indexes(pgvector_dsn) == []
        assert [(m, o) for _, m, o in _indexes(pgvector_dsn)] == [("ivfflat", ["lists=8"])]
        found = store.search_vectors(MODEL, vectors[17], 1)
        assert found[0].message_id == "a17"


def test_a_filtered_search_over_the_lists_still_returns_k(pgvector_dsn: str) -> None:
    """ivfflat's iterative scan: a key with few vectors among many still gets ``k`` hits
    from the index (lists are probed on past ``probes``), from a pooled connection's
    first search on (the pool gives each connection the scan settings)."""
    n = postgres_search.EXACT_BELOW
    with PostgresStore(pgvector_dsn, vector_index={"kind": "ivfflat", "probes": 1}) as store:
        crowd = _fill(store, n, seed=3)
        _fill(store, 40, seed=4, key=OTHER)
        silent = ("default", "silent", "main")  # many messages, no vectors: the index is used
        store.append_messages(silent, [Message.user("s", message_id=f"s{i}") for i in range(n)])
        store.rebuild_vector_index()
        query = crowd[0]
        hits = store.search_vectors(MODEL, query, 10, keys=[OTHER, silent])
        # lists scanned one after another (relaxed order): k hits, not always the exact k
        assert len(hits) == 10
        assert all(h.message_id.startswith("b") for h in hits)
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    op = SearchVectors(MODEL, query, 10, keys=(OTHER, silent))
    with psycopg.connect(pgvector_dsn, autocommit=True) as conn:
        conn.execute("ANALYZE")
        setup = postgres_search.SearchSetup("public", IvfSettings(probes=1))
        conn.execute(*postgres_search.scan_defaults(setup))  # as the store's pool does
        rows = postgres_search.nearest_once(conn, setup, op)
        assert len(rows) == 10
        assert all(r[3].startswith("b") for r in rows)
        plan = postgres_search.nearest_once(conn, setup, op, explain=True)
        assert "Index Scan using marsys_hnsw_" in "\n".join(r[0] for r in plan)


def test_a_rebuild_changes_the_kind_both_ways(pgvector_dsn: str) -> None:
    """HNSW -> IVFFlat -> HNSW, each by ``rebuild_vector_index``; searches go on."""
    with PostgresStore(pgvector_dsn) as store:
        vectors = _fill(store, 120, seed=5)
    assert [m for _, m, _ in _indexes(pgvector_dsn)] == ["hnsw"]
    with PostgresStore(pgvector_dsn, vector_index=IvfSettings(lists=4, probes=4)) as store:
        assert store.rebuild_vector_index() == [MODEL]
        assert [m for _, m, _ in _indexes(pgvector_dsn)] == ["ivfflat"]
        assert store.search_vectors(MODEL, vectors[3], 1)[0].message_id == "a3"
        # a new model under IVFFlat settings waits for a build: exact meanwhile
        store.put_vectors(KEY, "other", ["a1", "a2"], unit_vectors(2, dim=4, seed=6))
        assert len(_indexes(pgvector_dsn)) == 1
        assert (
            store.search_vectors("other", unit_vectors(2, dim=4, seed=6)[1], 1)[0].message_id
            == "a2"
        )
    with PostgresStore(pgvector_dsn, vector_index=HnswSettings(m=8, ef_construction=32)) as store:
        assert store.rebuild_vector_index() == ["m", "other"]
        assert [m for _, m, _ in _indexes(pgvector_dsn)] == ["hnsw", "hnsw"]
        assert store.search_vectors(MODEL, vectors[7], 1)[0].message_id == "a7"


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"kind": "ivf"}, "'hnsw', 'ivfflat'"),
        ({"kind": "ivfflat", "lists": 0}, "ivfflat.lists"),
        ({"kind": "ivfflat", "lists": 10, "probes": 20}, r"probes \(20\) must not exceed lists"),
        ({"kind": "ivfflat", "m": 16}, "ivfflat.m"),
        ({"kind": "ivfflat", "probes": "many"}, "ivfflat.probes"),
    ],
)
def test_bad_ivfflat_settings_are_refused_before_connecting(
    settings: dict[str, object], named: str
) -> None:
    """The field and the value are named; nothing is opened."""
    with pytest.raises(ValueError, match=named):
        PostgresStore("postgresql://nobody@127.0.0.1:1/none", vector_index=settings)


@pytest.mark.parametrize(
    ("settings", "shown"),
    [
        (
            IvfSettings(lists=4, probes=3),
            {"ivfflat.probes": "3", "ivfflat.iterative_scan": "relaxed_order"},
        ),
        (
            HnswSettings(ef_search=77),
            {"hnsw.ef_search": "77", "hnsw.iterative_scan": "relaxed_order"},
        ),
    ],
)
def test_each_pooled_connection_opens_with_the_scan_settings(
    pgvector_dsn: str, settings: HnswSettings | IvfSettings, shown: dict[str, str]
) -> None:
    """Sync and async pools: a connection's first search already scans with the store's
    settings (pgvector reads them when the scan starts, before a statement's own
    ``set_config`` filter has run)."""
    with PostgresStore(pgvector_dsn, vector_index=settings) as store:
        vectors = _fill(store, 30, seed=7)
        pool = store._pool  # the pool's own connections are what is checked
        assert pool is not None
        with pool.connection() as conn:
            for name, value in shown.items():
                assert conn.execute("SELECT current_setting(%s)", (name,)).fetchone() == (value,)

        async def search() -> list[str]:
            hits = (await store.abatch([SearchVectors(MODEL, vectors[4], 3)]))[0]
            return [h.message_id for h in hits]

        assert asyncio.run(search())[0] == "a4"
