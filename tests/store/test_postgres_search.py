"""PostgresStore's search inside the database: the fallback, the migration, the index.

On ``postgres_dsn`` (the machine's PostgreSQL, no pgvector) the store keeps today's path
and says so once; on ``pgvector_dsn`` it searches in SQL. The conformance suite
(tests/store/test_postgres_conformance.py) holds the contract; these hold what is
PostgreSQL's own: the schema migration from bytea vectors, creating the extension, one that
arrives later, and filtered searches over an HNSW index that still return ``k``.
"""

import logging
from pathlib import Path
from urllib.parse import quote

import numpy as np
import psycopg
import pytest

from marsys_mem import Message
from marsys_mem.exceptions import StoreError
from marsys_mem.manager import MemoryManager
from marsys_mem.model.hnsw import HnswSettings, IvfSettings
from marsys_mem.store import postgres_search, postgres_vectors
from marsys_mem.store.base import Append, CountMatches, PutVectors, SearchText, SearchVectors
from marsys_mem.store.postgres import MIGRATIONS, PostgresStore, _Prepared
from marsys_mem.testing.conformance.search import unit_vectors
from marsys_mem.testing.postgres import PostgresServer

KEY = ("default", "a", "main")
OTHER = ("default", "b", "main")
MODEL = "m"
LOG = "marsys_mem.store.postgres_search"


def _search_logs(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOG]


def test_without_pgvector_search_stays_on_the_hosts(
    postgres_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The fallback: no search in SQL, said once at open; vectors still stored for hosts."""
    caplog.set_level(logging.INFO, logger=LOG)
    with PostgresStore(postgres_dsn) as store:
        assert store.supports_search is False
        (line,) = _search_logs(caplog)
        assert "no 'vector' extension" in line
        assert "search stays on the hosts" in line
        msgs = [Message.user("hello", message_id="h")]
        store.append_messages(KEY, msgs)
        store.put_vectors(KEY, MODEL, ["h"], unit_vectors(1))
        assert store.load_vectors(None, MODEL).message_ids == ("h",)
        with pytest.raises(StoreError, match="supports_search"):
            store.search_vectors(MODEL, unit_vectors(1)[0], 3)
        with pytest.raises(StoreError, match="supports_search"):
            store.search_text("hello", 3)
        assert len(_search_logs(caplog)) == 1  # said once, at open
    with psycopg.connect(postgres_dsn) as conn:
        columns = conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'marsys_messages'::regclass"
            " AND attnum > 0 AND NOT attisdropped"
        ).fetchall()
    assert "tsv" not in {c[0] for c in columns}  # no change to the schema without it


def _version3_store(dsn: str, texts: list[str], vectors: np.ndarray) -> list[str]:
    """A database as marsys-mem's schema version 3 left it: messages, bytea vectors."""
    msgs = [Message.user(t, message_id=f"o{i}", name="ana") for i, t in enumerate(texts)]
    ids = [m.message_id for m in msgs]
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        for target in range(1, 4):
            MIGRATIONS[target - 1](conn)
            conn.execute("INSERT INTO marsys_schema_version (version) VALUES (%s)", (target,))
        append = Append(KEY, tuple(msgs))
        prepared = _Prepared([append], None)  # what version 3 wrote: no keywords
        prepared.execute(conn, 0)
        op = PutVectors(KEY, MODEL, tuple(ids), vectors)
        postgres_vectors.put_vectors(conn, op)  # bytea only, as version 3
    return ids


def test_a_version_3_store_is_migrated_in_place_once_and_searches(
    pgvector_dsn: str, new_pgvector_dsn
) -> None:
    """Migration: bytea vectors and stored texts fill the new columns, in place, once."""
    texts = ["Clara lives in Lisbon", "parked on level 4", "lovely weather", "Clara's cake"]
    vectors = unit_vectors(4, dim=8, seed=3)
    ids = _version3_store(pgvector_dsn, texts, vectors)
    with PostgresStore(pgvector_dsn) as store:
        assert store.found_schema_version == 3
        assert store.supports_search
        hits = store.search_vectors(MODEL, vectors[2], 2)
        assert hits[0].message_id == ids[2]
        assert hits[0].score == pytest.approx(1.0, abs=1e-2)
        assert {h.message_id for h in store.search_text("Clara", 5)} == {ids[0], ids[3]}
        assert {h.message_id for h in store.search_text("ana", 5)} == set(ids)  # the speaker
        page = store.load_vectors(KEY, MODEL)
        assert page.vectors.tobytes() == vectors.tobytes()  # the exact bytes stay
    with PostgresStore(pgvector_dsn) as again:  # once: version 4 now, nothing to do
        assert again.found_schema_version == len(MIGRATIONS) == 4
        assert [h.message_id for h in again.search_vectors(MODEL, vectors[1], 1)] == [ids[1]]
    with psycopg.connect(pgvector_dsn) as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM marsys_schema_version")]
    assert sorted(versions) == [1, 2, 3, 4]


def test_the_store_creates_the_extension_where_it_may(pgvector_server: PostgresServer) -> None:
    """A database where pgvector is available but not installed: the owner installs it."""
    dsn = pgvector_server.create_database("fresh_search")
    with PostgresStore(dsn) as store:
        assert store.supports_search
        store.append_messages(KEY, [Message.user("Lisbon", message_id="x")])
        assert [h.message_id for h in store.search_text("lisbon", 2)] == ["x"]
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone()


def test_an_extension_installed_later_is_used_at_the_next_open(
    pgvector_server: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A user who may not create the extension stays on the hosts until an admin adds it."""
    caplog.set_level(logging.INFO, logger=LOG)
    pgvector_server.create_database("late_search")
    pgvector_server.execute("CREATE ROLE limited LOGIN PASSWORD 'limited-pw'")
    pgvector_server.execute("CREATE SCHEMA app AUTHORIZATION limited", "late_search")
    base = pgvector_server.dsn("late_search", search_path="app")
    dsn = base.replace(
        f"{pgvector_server.user}:{quote(pgvector_server.password, safe='')}@",
        "limited:limited-pw@",
    )
    vectors = unit_vectors(3, dim=8, seed=5)
    with PostgresStore(dsn) as store:
        assert not store.supports_search
        assert any("may not create it" in line for line in _search_logs(caplog))
        msgs = [Message.user(f"note {i} Lisbon", message_id=f"n{i}") for i in range(3)]
        store.append_messages(KEY, msgs)
        store.put_vectors(KEY, MODEL, [m.message_id for m in msgs], vectors)
    pgvector_server.execute("CREATE EXTENSION vector", "late_search")
    with PostgresStore(dsn) as store:
        assert store.supports_search
        assert [h.message_id for h in store.search_vectors(MODEL, vectors[1], 1)] == ["n1"]
        assert len(store.search_text("Lisbon", 5)) == 3


def test_a_filtered_search_over_the_index_still_returns_k(pgvector_dsn: str) -> None:
    """pgvector's iterative scans: a filter that few indexed rows pass still gets ``k``.

    20,000 vectors of another key crowd the query's neighbourhood; the filter's keys hold
    more than ``EXACT_BELOW`` messages (so the index is used) but only 40 vectors.
    """
    n = postgres_search.EXACT_BELOW
    crowd = unit_vectors(n, dim=16, seed=1)
    wanted = unit_vectors(40, dim=16, seed=2)
    with PostgresStore(pgvector_dsn) as store:
        big = [Message.user(f"c{i}", message_id=f"c{i}") for i in range(n)]
        store.append_messages(KEY, big)
        store.put_vectors(KEY, MODEL, [m.message_id for m in big], crowd)
        silent = ("default", "silent", "main")  # many messages, no vectors
        store.append_messages(silent, [Message.user("s", message_id=f"s{i}") for i in range(n)])
        few = [Message.user(f"w{i}", message_id=f"w{i}") for i in range(40)]
        store.append_messages(OTHER, few)
        store.put_vectors(OTHER, MODEL, [m.message_id for m in few], wanted)
        query = crowd[0]
        hits = store.search_vectors(MODEL, query, 10, keys=[OTHER, silent])
        exact = np.argsort(-(wanted @ query))[:10]
        assert [h.message_id for h in hits] == [f"w{i}" for i in exact]
        unfiltered = store.search_vectors(MODEL, query, 10)
        assert unfiltered[0].message_id == "c0"
    # The filtered query itself, on the index (not the exact re-check): k rows, the exact ones.
    op = SearchVectors(MODEL, query, 10, keys=(OTHER, silent))
    with psycopg.connect(pgvector_dsn, autocommit=True) as conn:
        setup = postgres_search.SearchSetup("public")
        dim, key_ids, count = postgres_search.prepare_search(conn, op)
        assert (key_ids, count) == postgres_search.key_filter(conn, op.keys, None)
        assert dim is not None
        assert count >= postgres_search.EXACT_BELOW  # so search_vectors uses the index
        conn.execute("ANALYZE")
        conn.execute("SET enable_sort = off")  # the planner may sort a small filter; not here
        rows = postgres_search.nearest(conn, setup, op, dim, key_ids, exact=False)
        assert [r[3] for r in rows] == [f"w{i}" for i in exact]
        plan = postgres_search.nearest(conn, setup, op, dim, key_ids, exact=False, explain=True)
        assert "Index Scan using marsys_hnsw_" in "\n".join(r[0] for r in plan)
        plan = postgres_search.nearest(conn, setup, op, dim, key_ids, exact=True, explain=True)
        assert "marsys_hnsw_" not in "\n".join(r[0] for r in plan)


def test_models_of_different_dimensions_each_get_an_index(pgvector_dsn: str) -> None:
    """Per-model partial indexes: two models, two dimensions, one column, no mixing."""
    with PostgresStore(pgvector_dsn) as store:
        msgs = [Message.user(f"x{i}", message_id=f"x{i}") for i in range(5)]
        store.append_messages(KEY, msgs)
        ids = [m.message_id for m in msgs]
        small, large = unit_vectors(5, dim=4, seed=1), unit_vectors(5, dim=12, seed=2)
        store.put_vectors(KEY, "small", ids, small)
        store.put_vectors(KEY, "large", ids, large)
        assert store.search_vectors("small", small[3], 1)[0].message_id == "x3"
        assert store.search_vectors("large", large[4], 1)[0].message_id == "x4"
        with pytest.raises(ValueError, match="model 'small' is stored 4-D"):
            store.search_vectors("small", large[0], 1)
    with psycopg.connect(pgvector_dsn) as conn:
        names = conn.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()"
            " AND indexname LIKE 'marsys_hnsw_%%'"
        ).fetchall()
    assert len(names) == 2


def test_a_host_opened_later_searches_at_once(pgvector_dsn: str) -> None:
    """Stateless hosts: a second store object finds what the first wrote, loading nothing."""
    vectors = unit_vectors(50, dim=8, seed=7)
    with PostgresStore(pgvector_dsn) as writer:
        msgs = [Message.user(f"fact {i}", message_id=f"f{i}") for i in range(50)]
        writer.append_messages(KEY, msgs)
        writer.put_vectors(KEY, MODEL, [m.message_id for m in msgs], vectors)
        with PostgresStore(pgvector_dsn) as reader:
            assert reader.search_vectors(MODEL, vectors[17], 1)[0].message_id == "f17"
            writer.delete_messages(KEY, ["f17"])
            assert "f17" not in {h.message_id for h in reader.search_vectors(MODEL, vectors[17], 5)}


def test_weighted_keywords_rank_a_rare_word_first_and_counts_scale(pgvector_dsn: str) -> None:
    """SearchText's weights (BM25's idfs) rank by word; CountMatches past EXACT_BELOW."""
    with PostgresStore(pgvector_dsn) as store:
        msgs = [Message.user(f"common chatter {i} common", message_id=f"c{i}") for i in range(30)]
        msgs.append(Message.user("a rare word", message_id="r"))
        store.append_messages(KEY, msgs)
        weights = (("common", 0.05), ("rare", 3.0))
        ranked = store.batch([SearchText("common rare", 3, (KEY,), weights=weights)])[0]
        assert ranked[0].message_id == "r"
        weights = (("common", 3.0), ("rare", 0.05))
        ranked = store.batch([SearchText("common rare", 3, (KEY,), weights=weights)])[0]
        assert "r" not in {h.message_id for h in ranked}
        assert store.count_matches(["common", "rare", "the"], keys=[KEY]) == {
            "common": 30,
            "rare": 1,
            "the": 0,
        }
    # a scope past EXACT_BELOW: a word the statistics call common is estimated, not counted
    with psycopg.connect(pgvector_dsn, autocommit=True) as conn:
        conn.execute("ANALYZE marsys_messages")
        big = postgres_search.EXACT_BELOW
        conn.execute("UPDATE marsys_keys SET n = %s WHERE agent = 'a'", (big,))
        try:
            op = CountMatches(("common", "rare"), (KEY,))
            counts = postgres_search.count_matches(conn, op)
        finally:
            conn.execute("UPDATE marsys_keys SET n = 31 WHERE agent = 'a'")
    assert counts["rare"] == 1  # below the statistics' threshold: counted
    assert counts["common"] == round(big * 30 / 31)  # by the statistics: estimated


def test_a_dense_search_can_return_its_messages(pgvector_dsn: str) -> None:
    """with_data: each hit carries its stored message, read in the search's own query."""
    vectors = unit_vectors(30, dim=8, seed=3)
    with PostgresStore(pgvector_dsn) as store:
        msgs = [Message.user(f"note {i}", message_id=f"n{i}", name="ana") for i in range(30)]
        store.append_messages(KEY, msgs)
        store.put_vectors(KEY, MODEL, [m.message_id for m in msgs], vectors)
        for keys in ((KEY,), None):  # filtered (exact scan of a small key) and not (index)
            op = SearchVectors(MODEL, vectors[4], 3, keys, with_data=True)
            hits = store.batch([op])[0]
            assert hits[0].message_id == "n4"
            assert hits[0].data is not None
            assert Message.model_validate_json(hits[0].data) == msgs[4]
        assert store.search_vectors(MODEL, vectors[4], 1)[0].data is None  # not asked
        with pytest.raises(TypeError, match="with_data must be a bool"):
            store.batch([SearchVectors(MODEL, vectors[4], 3, with_data=1)])  # type: ignore[arg-type]


def _index_options(dsn: str) -> list[tuple[str, list[str]]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT c.relname, c.reloptions FROM pg_class c JOIN pg_namespace n"
            " ON n.oid = c.relnamespace WHERE n.nspname = current_schema()"
            " AND c.relname LIKE 'marsys_hnsw_%%' ORDER BY c.relname"
        ).fetchall()
    return [(str(r[0]), sorted(r[1] or [])) for r in rows]


def test_the_vector_index_is_built_and_searched_with_the_store_settings(
    pgvector_dsn: str,
) -> None:
    """``vector_index``: the graph's m / ef_construction at build, ef_search per search."""
    vectors = unit_vectors(40, dim=8, seed=3)
    msgs = [Message.user(f"v{i}", message_id=f"v{i}") for i in range(40)]
    with PostgresStore(pgvector_dsn, vector_index={"m": 8, "ef_construction": 32}) as store:
        assert store.vector_index == HnswSettings(m=8, ef_construction=32)
        store.append_messages(KEY, msgs)
        store.put_vectors(KEY, MODEL, [m.message_id for m in msgs], vectors)
        assert store.search_vectors(MODEL, vectors[5], 1)[0].message_id == "v5"
    ((_, options),) = _index_options(pgvector_dsn)
    assert options == ["ef_construction=32", "m=8"]
    # each search sets hnsw.ef_search from the settings (at least 2k)
    setup = postgres_search.SearchSetup("public", HnswSettings(ef_search=321))
    with psycopg.connect(pgvector_dsn, autocommit=True) as conn:
        postgres_search.nearest_once(conn, setup, SearchVectors(MODEL, vectors[0], 3))
        assert conn.execute("SHOW hnsw.ef_search").fetchone() == ("321",)
        postgres_search.nearest_once(conn, setup, SearchVectors(MODEL, vectors[0], 400))
        assert conn.execute("SHOW hnsw.ef_search").fetchone() == ("800",)


def test_rebuilding_the_vector_index_applies_new_settings_and_keeps_searching(
    pgvector_dsn: str,
) -> None:
    """An index built with other settings is rebuilt in place; searches find the same."""
    vectors = unit_vectors(60, dim=8, seed=4)
    msgs = [Message.user(f"r{i}", message_id=f"r{i}") for i in range(60)]
    with PostgresStore(pgvector_dsn) as old:
        old.append_messages(KEY, msgs)
        old.put_vectors(KEY, MODEL, [m.message_id for m in msgs], vectors)
        before = [h.message_id for h in old.search_vectors(MODEL, vectors[9], 5)]
    ((name, options),) = _index_options(pgvector_dsn)
    assert options == ["ef_construction=64", "m=16"]
    with PostgresStore(pgvector_dsn, vector_index=HnswSettings(m=24, ef_construction=96)) as new:
        assert new.rebuild_vector_index() == [MODEL]
        assert [h.message_id for h in new.search_vectors(MODEL, vectors[9], 5)] == before
        new.put_vectors(KEY, MODEL, ["r0"], vectors[1:2])  # writes go to the new index
        assert new.search_vectors(MODEL, vectors[1], 2)[1].message_id in {"r0", "r1"}
    assert _index_options(pgvector_dsn) == [(name, ["ef_construction=96", "m=24"])]


def test_bad_vector_index_settings_are_refused_before_connecting() -> None:
    """The field and the value are named; nothing is opened."""
    with pytest.raises(ValueError, match=r"vector_index|m\b") as info:
        PostgresStore("postgresql://nobody@127.0.0.1:1/none", vector_index={"m": 1})
    assert "greater than or equal to 2" in str(info.value)
    with pytest.raises(ValueError, match=r"ef_construction \(20\) must be at least 2 \* m"):
        PostgresStore(
            "postgresql://x@127.0.0.1:1/none", vector_index={"m": 16, "ef_construction": 20}
        )
    with pytest.raises(ValueError, match="ef_search"):
        PostgresStore("postgresql://x@127.0.0.1:1/none", vector_index={"ef_search": "wide"})


@pytest.mark.parametrize(
    ("written", "settings"),
    [
        (
            "{m: 12, ef_construction: 48, ef_search: 150}",
            HnswSettings(m=12, ef_construction=48, ef_search=150),
        ),
        ("{kind: ivfflat, lists: 64, probes: 8}", IvfSettings(lists=64, probes=8)),
    ],
)
def test_the_config_file_sets_the_vector_index(
    tmp_path: Path,
    pgvector_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    written: str,
    settings: HnswSettings | IvfSettings,
) -> None:
    """``store.vector_index`` in a config file reaches the store a MemoryManager opens
    (HNSW without a ``kind``; ``kind: ivfflat`` for IVFFlat)."""
    path = tmp_path / "memory.yaml"
    path.write_text(
        "store:\n  backend: postgres\n  dsn_env: TEST_VECTOR_INDEX_DSN\n"
        f"  vector_index: {written}\n"
    )
    monkeypatch.setenv("TEST_VECTOR_INDEX_DSN", pgvector_dsn)
    with MemoryManager.from_config(path) as manager:
        store = manager.store
        assert isinstance(store, PostgresStore)
        assert store.vector_index == settings


def test_a_bulk_load_builds_the_indexes_once_at_the_end(pgvector_dsn: str) -> None:
    """Inside ``bulk_load`` no HNSW index is kept up to date; searches stay right; after it,
    every model (an old one and one that appeared during the load) has its index."""
    vectors = unit_vectors(80, dim=8, seed=5)
    msgs = [Message.user(f"b{i}", message_id=f"b{i}") for i in range(80)]
    ids = [m.message_id for m in msgs]
    with PostgresStore(pgvector_dsn, vector_index={"m": 10, "ef_construction": 40}) as store:
        store.append_messages(KEY, msgs[:40])
        store.put_vectors(KEY, MODEL, ids[:40], vectors[:40])
        assert len(_index_options(pgvector_dsn)) == 1
        with store.bulk_load():
            assert _index_options(pgvector_dsn) == []
            store.append_messages(KEY, msgs[40:])
            store.put_vectors(KEY, MODEL, ids[40:], vectors[40:])
            store.put_vectors(KEY, "other", ids, unit_vectors(80, dim=4, seed=6))
            assert _index_options(pgvector_dsn) == []
            assert store.search_vectors(MODEL, vectors[70], 1)[0].message_id == "b70"
        options = _index_options(pgvector_dsn)
        assert [o for _, o in options] == [["ef_construction=40", "m=10"]] * 2
        assert store.search_vectors(MODEL, vectors[55], 1)[0].message_id == "b55"
        # an error inside still leaves the indexes built
        with pytest.raises(RuntimeError, match="boom"), store.bulk_load():
            raise RuntimeError("boom")
        assert len(_index_options(pgvector_dsn)) == 2
