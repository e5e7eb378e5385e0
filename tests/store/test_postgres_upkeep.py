"""A growing PostgresStore keeps its IVFFlat lists trained (``IvfSettings.train_at`` /
``retrain_at``), one host at a time, on a thread of its own; real pgvector server.

The first index is built once a model has ``train_at`` vectors, again each time they reach
``retrain_at`` times those its lists were trained on (the count is the index's comment);
a host that finds another training gives up to it; an HNSW index, or an IVFFlat one built
before counts were kept, is not rebuilt; a bulk load trains once, at its end.
"""

import time

import psycopg
import pytest

from marsys_mem import Message
from marsys_mem.model.hnsw import HnswSettings, IvfSettings
from marsys_mem.store import postgres_search
from marsys_mem.store.postgres import PostgresStore
from marsys_mem.store.postgres_upkeep import TRAINING_LOCK
from marsys_mem.testing.conformance.search import unit_vectors

KEY = ("default", "a", "main")
MODEL = "m"
GROWING = IvfSettings(probes=2, train_at=200, retrain_at=2.0)


def _trained(dsn: str) -> tuple[str | None, int | None]:
    with psycopg.connect(dsn) as conn:
        return postgres_search.trained_on(conn, MODEL)


def _add(store: PostgresStore, start: int, n: int) -> None:
    msgs = [Message.user(f"t{i}", message_id=f"t{i}") for i in range(start, start + n)]
    store.append_messages(KEY, msgs)
    store.put_vectors(KEY, MODEL, [m.message_id for m in msgs], unit_vectors(n, 16, seed=start))


def _until(dsn: str, want: tuple[str | None, int | None], seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while _trained(dsn) != want:
        assert time.monotonic() < deadline, f"index {_trained(dsn)}, waited for {want}"
        time.sleep(0.1)


def test_a_growing_store_trains_its_lists_by_itself_and_again_as_it_doubles(
    pgvector_dsn: str,
) -> None:
    """Writes alone build the index at ``train_at`` and rebuild it at ``retrain_at``x;
    searches go on meanwhile and find every vector."""
    assert GROWING.check_every() == 20
    with PostgresStore(pgvector_dsn, vector_index=GROWING) as store:
        for start in range(0, 180, 20):
            _add(store, start, 20)
        assert store.train_vector_index() == []  # 180 < train_at: nothing due
        assert _trained(pgvector_dsn) == (None, None)
        _add(store, 180, 20)  # 200: the store's own look builds it
        _until(pgvector_dsn, ("ivfflat", 200))
        for start in range(200, 400, 50):
            _add(store, start, 50)
            assert len(store.search_vectors(MODEL, unit_vectors(1, 16, seed=7)[0], 10)) == 10
        _until(pgvector_dsn, ("ivfflat", 400))  # twice what the lists were trained on
        assert store.train_vector_index() == []


def test_train_vector_index_trains_what_is_due_and_waits_for_another_host(
    pgvector_dsn: str,
) -> None:
    """Another session holding the training lock: the store's looks give up to it, and
    ``train_vector_index(wait=False)`` too; once it lets go, the store trains."""
    with psycopg.connect(pgvector_dsn, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s)", (TRAINING_LOCK,))
        with PostgresStore(pgvector_dsn, vector_index=GROWING) as store:
            for start in range(0, 300, 50):
                _add(store, start, 50)
            assert store.train_vector_index(wait=False) == []
            time.sleep(0.5)  # any look the writes started has given up by now
            assert _trained(pgvector_dsn) == (None, None)
            other.execute("SELECT pg_advisory_unlock(%s)", (TRAINING_LOCK,))
            assert store.train_vector_index() in ([MODEL], [])  # [] if a look came first
            _until(pgvector_dsn, ("ivfflat", 300))


def test_an_hnsw_index_and_an_uncounted_ivfflat_index_are_not_rebuilt(
    pgvector_dsn: str,
) -> None:
    """IVFFlat settings over an HNSW index leave it (rebuild_vector_index switches kinds);
    an IVFFlat index with no count gets the count of now, untrained."""
    with PostgresStore(pgvector_dsn, vector_index=HnswSettings()) as store:
        _add(store, 0, 300)
    with PostgresStore(pgvector_dsn, vector_index=GROWING) as store:
        assert store.train_vector_index() == []
        assert _trained(pgvector_dsn) == ("hnsw", None)
        assert store.rebuild_vector_index() == [MODEL]
        assert _trained(pgvector_dsn) == ("ivfflat", 300)
    with psycopg.connect(pgvector_dsn, autocommit=True) as conn:
        conn.execute(f"COMMENT ON INDEX {postgres_search.index_name(MODEL)} IS NULL")
    with PostgresStore(pgvector_dsn, vector_index=GROWING) as store:
        _add(store, 300, 400)  # 700 vectors: over 2 x 300, but nothing says what it had
        assert store.train_vector_index() == []
        assert _trained(pgvector_dsn) == ("ivfflat", 700)


def test_a_bulk_load_trains_once_at_its_end(pgvector_dsn: str) -> None:
    """No look while the load runs (its writes skip the index); the end trains on all."""
    with PostgresStore(pgvector_dsn, vector_index=GROWING) as store:
        with store.bulk_load():
            for start in range(0, 500, 100):
                _add(store, start, 100)
            assert _trained(pgvector_dsn) == (None, None)
        assert _trained(pgvector_dsn) == ("ivfflat", 500)
        assert store.train_vector_index() == []


def test_close_stops_the_upkeep_and_a_closed_store_refuses_to_train(pgvector_dsn: str) -> None:
    store = PostgresStore(pgvector_dsn, vector_index=GROWING)
    _add(store, 0, 250)
    store.close()  # a training under way is cancelled; its half-built index dropped later
    with pytest.raises(Exception, match="closed"):
        store.train_vector_index()
    with PostgresStore(pgvector_dsn, vector_index=GROWING) as again:
        again.train_vector_index()
        assert _trained(pgvector_dsn) == ("ivfflat", 250)


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"kind": "ivfflat", "train_at": 0}, "train_at"),
        ({"kind": "ivfflat", "train_at": 2.5}, "train_at"),
        ({"kind": "ivfflat", "retrain_at": 1.0}, "retrain_at"),
        ({"kind": "ivfflat", "retrain_at": "2"}, "retrain_at"),
    ],
)
def test_bad_upkeep_settings_are_named(settings: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        PostgresStore("postgresql://nobody@127.0.0.1:1/none", vector_index=settings)


def test_the_build_gets_the_memory_its_lists_need(pgvector_dsn: str) -> None:
    """pgvector refuses an IVFFlat build past ``maintenance_work_mem`` (k-means keeps a
    bound per sample and list); the store's build raises the session's setting to fit."""
    sep = "&" if "?" in pgvector_dsn else "?"
    small = f"{pgvector_dsn}{sep}options=-c%20maintenance_work_mem%3D1MB"
    many = IvfSettings(lists=1000, probes=1, train_at=None, retrain_at=None)
    with PostgresStore(small, vector_index=many) as store:
        _add(store, 0, 300)
        with psycopg.connect(small, autocommit=True) as conn:
            assert conn.execute("SHOW maintenance_work_mem").fetchone() == ("1MB",)
            with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="maintenance_work_mem"):
                conn.execute(
                    "CREATE INDEX ON marsys_vectors USING ivfflat ((embedding::halfvec(16))"
                    " halfvec_cosine_ops) WITH (lists = 1000)"
                )
        assert store.rebuild_vector_index() == [MODEL]
    with psycopg.connect(small) as conn:
        assert postgres_search.trained_on(conn, MODEL) == ("ivfflat", 300)
        name = postgres_search.index_name(MODEL)
        # (by to_regclass: the test's own schema, where other tests' stores have theirs)
        row = conn.execute("SELECT reloptions FROM pg_class WHERE oid = to_regclass(%s)", (name,))
        assert row.fetchone() == (["lists=1000"],)
