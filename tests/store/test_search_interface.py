"""The search interface of every store (``SearchVectors`` / ``SearchText``), and the servers.

Stores that do not search inside themselves say so (``supports_search`` false) and refuse
the operations with a StoreError naming the check; bad input is refused by name first.
"""

import numpy as np
import psycopg
import pytest

from marsys_mem import Message
from marsys_mem.exceptions import StoreError
from marsys_mem.store import InMemoryStore, SQLiteStore
from marsys_mem.store.base import MAX_SEARCH_K, SearchHit, SearchText, SearchVectors
from marsys_mem.testing.postgres import PostgresServer

KEY = ("default", "a", "main")


def test_pgvector_server_has_the_extension(pgvector_server: PostgresServer) -> None:
    with psycopg.connect(pgvector_server.dsn(), autocommit=True) as conn:
        sql = "SELECT extversion FROM pg_extension WHERE extname = 'vector'"
        row = conn.execute(sql).fetchone()
    assert row is not None
    assert tuple(int(p) for p in row[0].split(".")[:2]) >= (0, 8)  # iterative index scans


def test_the_machine_server_has_no_pgvector_installed(postgres_dsn: str) -> None:
    """The fallback path's server: no ``vector`` extension in its database."""
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        row = conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone()
    assert row is None


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_stores_without_search_refuse_it(kind: str, tmp_path) -> None:
    store = InMemoryStore() if kind == "memory" else SQLiteStore(tmp_path / "m.db")
    with store:
        store.append_messages(KEY, [Message.user("hello")])
        assert store.supports_search is False
        with pytest.raises(StoreError, match="supports_search"):
            store.search_vectors("m", np.ones(4, dtype=np.float32), 3)
        with pytest.raises(StoreError, match="supports_search"):
            store.search_text("hello", 3)


async def test_async_twins_refuse_too() -> None:
    with InMemoryStore() as store:
        with pytest.raises(StoreError, match="supports_search"):
            await store.asearch_vectors("m", [1.0, 0.0], 3)
        with pytest.raises(StoreError, match="supports_search"):
            await store.asearch_text("hello", 3)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda s: s.search_text("   ", 3), "query must be a non-blank string"),
        (lambda s: s.search_text("x" * 10_001, 3), "query is 10001 characters"),
        (lambda s: s.search_text("hi", 0), "k must be an int from 1"),
        (lambda s: s.search_text("hi", MAX_SEARCH_K + 1), "k must be an int from 1"),
        (lambda s: s.search_text("hi", True), "k must be an int"),
        (lambda s: s.search_text("hi", 3, namespace=""), "namespace must be a non-empty"),
        (lambda s: s.search_text("hi", 3, keys=[("a", "b")]), "keys\\[0\\]"),
        (lambda s: s.search_text("hi", 3, keys="abc"), "keys must be an iterable"),
        (lambda s: s.search_vectors("", [1.0], 3), "model must be a non-blank"),
        (lambda s: s.search_vectors("m", [[1.0, 2.0]], 3), "vector must be a 1-D float32"),
        (lambda s: s.search_vectors("m", [], 3), "vector must be a 1-D float32"),
        (lambda s: s.search_vectors("m", [1.0, float("nan")], 3), "NaN or infinity"),
        (lambda s: s.search_vectors("m", [0.0, 0.0], 3), "all zeros"),
        (lambda s: s.search_vectors("m", ["a"], 3), "vector must be a numeric"),
    ],
)
def test_bad_search_input_is_named_before_anything_runs(call, match: str) -> None:
    """Validation comes first: a store without search names the bad field, not the support."""
    with InMemoryStore() as store, pytest.raises((ValueError, TypeError), match=match):
        call(store)


@pytest.mark.parametrize(
    ("weights", "match"),
    [
        ([("car", 1.0)], "weights must be a tuple"),
        ((("car", -1.0),), "weights\\[0\\]: the weight must be finite and >= 0"),
        ((("car", float("inf")),), "weights\\[0\\]: the weight must be finite"),
        ((("car", True),), "weights\\[0\\]: the weight must be a number"),
        ((("", 1.0),), "weights\\[0\\]: the word must be a non-blank"),
        ((("car",),), "weights\\[0\\]: the word must be"),
        (tuple((f"w{i}", 1.0) for i in range(65)), "weights holds 65 words"),
    ],
)
def test_bad_keyword_weights_are_named(weights: object, match: str) -> None:
    with InMemoryStore() as store, pytest.raises((ValueError, TypeError), match=match):
        store.batch([SearchText("car", 3, weights=weights)])  # type: ignore[arg-type]


def test_ops_are_frozen_records() -> None:
    op = SearchText("hi", 3)
    with pytest.raises(AttributeError):
        op.k = 4  # type: ignore[misc]
    hit = SearchHit(KEY, "m1", 0.5)
    assert (hit.key, hit.message_id, hit.score) == (KEY, "m1", 0.5)
    assert SearchVectors("m", np.ones(2, dtype=np.float32), 1).keys is None


def test_load_messages_by_ids() -> None:
    with InMemoryStore() as store:
        msgs = [Message.user(f"m{i}") for i in range(3)]
        store.append_messages(KEY, msgs)
        got = store.load_messages(KEY, ids=[msgs[2].message_id, "unknown"])
        assert [m.text for m in got] == ["m2"]
