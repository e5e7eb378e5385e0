"""MarsysStore: LangGraph's BaseStore contract, hybrid search, TTL, durability, a real graph."""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.embeddings import Embeddings
from langgraph.config import get_store
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import (
    GetOp,
    InvalidNamespaceError,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchOp,
)
from langgraph.store.memory import InMemoryStore as LangGraphInMemoryStore

from marsys_mem.exceptions import EmbeddingError, MissingDependencyError, StoreError
from marsys_mem.integrations.langgraph.store import MarsysStore
from marsys_mem.retrieval.embeddings import HashingEmbedder
from marsys_mem.store import InMemoryStore, SQLiteStore


class Clock:
    """A settable clock (the store reads time only through it)."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, minutes: float) -> None:
        self.now += timedelta(minutes=minutes)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(clock: Clock) -> Any:
    s = MarsysStore(embedder=HashingEmbedder(), clock=clock)
    yield s
    s.close()


def _keys(items: list[Any]) -> list[tuple[tuple[str, ...], str]]:
    return [(i.namespace, i.key) for i in items]


# ---------------------------------------------------------------------- put / get / delete
def test_put_get_update_delete(store: MarsysStore, clock: Clock) -> None:
    ns = ("users", "alice")
    assert store.get(ns, "food") is None
    store.put(ns, "food", {"text": "likes ramen", "n": 1})
    first = store.get(ns, "food")
    assert first is not None
    assert first.value == {"text": "likes ramen", "n": 1}
    assert first.namespace == ns
    assert first.key == "food"
    assert first.created_at == first.updated_at == clock.now
    clock.advance(1)
    store.put(ns, "food", {"text": "likes udon"})
    second = store.get(ns, "food")
    assert second is not None
    assert second.value == {"text": "likes udon"}
    assert second.created_at == first.created_at
    assert second.updated_at == clock.now
    store.delete(ns, "food")
    assert store.get(ns, "food") is None
    store.delete(ns, "never-there")  # deleting a missing item is a no-op
    assert len(store) == 0


def test_returned_values_are_copies(store: MarsysStore) -> None:
    value = {"tags": ["a"]}
    store.put(("n",), "k", value)
    value["tags"].append("b")  # the caller's dict is not the stored one
    got = store.get(("n",), "k")
    assert got is not None
    assert got.value == {"tags": ["a"]}
    got.value["tags"].append("c")
    again = store.get(("n",), "k")
    assert again is not None
    assert again.value == {"tags": ["a"]}


@pytest.mark.parametrize(
    ("namespace", "message"),
    [
        ((), "cannot be empty"),
        (("a.b",), "contains '.'"),
        (("",), "non-empty string"),
    ],
)
def test_invalid_namespaces_are_rejected(
    store: MarsysStore, namespace: tuple[str, ...], message: str
) -> None:
    with pytest.raises(InvalidNamespaceError, match=message):
        store.batch([PutOp(namespace, "k", {"v": 1})])


def test_the_langgraph_root_label_is_refused_by_put_and_passes_in_a_batch(
    store: MarsysStore,
) -> None:
    # as in LangGraph's own stores: put() refuses it, LangGraph's own batches write there
    ref = LangGraphInMemoryStore()
    for s in (store, ref):
        with pytest.raises(InvalidNamespaceError, match="langgraph"):
            s.put(("langgraph", "x"), "k", {"v": 1})
        s.batch([PutOp(("langgraph", "x"), "k", {"v": 1})])
        item = s.get(("langgraph", "x"), "k")
        assert item is not None
        assert item.value == {"v": 1}


def test_a_bad_op_in_a_batch_changes_nothing(store: MarsysStore) -> None:
    with pytest.raises(ValueError, match=r"PutOp\(namespace=\('b',\), key='k2'\): value must be"):
        store.batch([PutOp(("a",), "k1", {"v": 1}), PutOp(("b",), "k2", {"v": object()})])
    with pytest.raises(ValueError, match=r"SearchOp\.limit must be an int >= 0, got -1"):
        store.batch([PutOp(("a",), "k1", {"v": 1}), SearchOp(("a",), limit=-1)])
    with pytest.raises(ValueError, match="unknown operator '\\$regex'"):
        store.batch([PutOp(("a",), "k1", {"v": 1}), SearchOp(("a",), filter={"v": {"$regex": 1}})])
    with pytest.raises(ValueError, match=r"PutOp\.ttl must be None or minutes > 0, got -1"):
        store.batch([PutOp(("a",), "k1", {"v": 1}), PutOp(("a",), "k3", {"v": 1}, ttl=-1)])
    with pytest.raises(TypeError, match="unknown store operation"):
        store.batch([PutOp(("a",), "k1", {"v": 1}), "get everything"])  # type: ignore[list-item]
    assert len(store) == 0
    assert store.list_namespaces() == []


def test_batch_reads_see_the_state_before_its_writes_and_the_last_put_wins(
    store: MarsysStore,
) -> None:
    store.put(("a",), "k", {"v": 0})
    results = store.batch(
        [
            PutOp(("a",), "k", {"v": 1}),
            GetOp(("a",), "k"),
            PutOp(("a",), "k", {"v": 2}),
            SearchOp(("a",)),
        ]
    )
    assert results[0] is None
    assert results[2] is None
    assert results[1].value == {"v": 0}
    assert [i.value for i in results[3]] == [{"v": 0}]
    got = store.get(("a",), "k")
    assert got is not None
    assert got.value == {"v": 2}


# ---------------------------------------------------------------------- search: filters
def _fill(store: MarsysStore, clock: Clock) -> None:
    rows = [
        (("docs", "a"), "1", {"type": "report", "score": 5, "meta": {"lang": "en"}}),
        (("docs", "a"), "2", {"type": "memo", "score": 2, "meta": {"lang": "de"}}),
        (("docs", "b"), "3", {"type": "report", "score": 9, "meta": {"lang": "de"}}),
        (("other",), "4", {"type": "report", "score": 7}),
    ]
    for ns, key, value in rows:
        store.put(ns, key, value)
        clock.advance(1)


def test_search_filters_namespaces_and_pages(store: MarsysStore, clock: Clock) -> None:
    _fill(store, clock)

    def keys(**kw: Any) -> list[str]:
        prefix = kw.pop("prefix", ("docs",))
        return [i.key for i in store.search(prefix, **kw)]

    assert keys() == ["3", "2", "1"]  # newest first
    assert keys(prefix=()) == ["4", "3", "2", "1"]
    assert keys(prefix=("docs", "a")) == ["2", "1"]
    assert keys(filter={"type": "report"}) == ["3", "1"]
    assert keys(filter={"score": {"$gt": 2}}) == ["3", "1"]
    assert keys(filter={"score": {"$gte": 2, "$lt": 9}}) == ["2", "1"]
    assert keys(filter={"score": {"$lte": 5}}) == ["2", "1"]
    assert keys(filter={"type": {"$ne": "report"}}) == ["2"]
    assert keys(filter={"type": {"$eq": "memo"}}) == ["2"]
    assert keys(filter={"meta": {"lang": "de"}}) == ["3", "2"]
    assert keys(filter={"missing": {"$gt": 1}}) == []
    assert keys(limit=2) == ["3", "2"]
    assert keys(limit=2, offset=2) == ["1"]
    assert keys(limit=0) == []
    assert all(i.score is None for i in store.search(("docs",)))


def test_filters_agree_with_langgraphs_own_store(store: MarsysStore, clock: Clock) -> None:
    _fill(store, clock)
    ref = LangGraphInMemoryStore()
    for item in store.search((), limit=100):
        ref.put(item.namespace, item.key, item.value)
    for flt in (
        {"type": "report"},
        {"score": {"$gt": 4}},
        {"score": {"$ne": 9}},
        {"meta": {"lang": "en"}},
        {"type": "report", "score": {"$lte": 7}},
    ):
        ours = sorted(_keys(store.search((), filter=flt, limit=100)))
        theirs = sorted(_keys(ref.search((), filter=flt, limit=100)))
        assert ours == theirs, flt


# ---------------------------------------------------------------------- search: query
def test_query_search_is_hybrid_ranked_with_scores(store: MarsysStore) -> None:
    ns = ("users", "alice", "memories")
    store.put(ns, "m1", {"text": "Alice's sister Clara lives in Lisbon"})
    store.put(ns, "m2", {"text": "Alice parked the car on level 4"})
    store.put(ns, "m3", {"text": "Alice prefers green tea over coffee"})
    store.put(ns, "m4", {"text": "where is the car parked? a private note"}, index=False)
    hits = store.search(("users",), query="where did alice park the car", limit=10)
    assert hits[0].key == "m2"
    scored = [h for h in hits if h.score is not None]
    assert [h.key for h in hits[len(scored) :]] == ["m4"]  # unindexed: after, no score
    # hybrid fusion: 1.0 for the best candidate, 0.0 for the weakest one
    assert all(0 <= h.score <= 1.0 for h in scored)  # type: ignore[operator]
    assert [h.score for h in scored] == sorted((h.score for h in scored), reverse=True)
    assert hits[0].score > 0.95  # first by both retrievers: calibrated, near 1
    page = store.search(("users",), query="where did alice park the car", limit=1, offset=1)
    assert _keys(page) == _keys(hits[1:2])
    best = hits[0].value["text"]
    filtered = store.search(("users",), query="car", filter={"text": {"$ne": best}})
    assert "m2" not in [h.key for h in filtered]


def test_index_fields_choose_what_is_searchable(clock: Clock) -> None:
    with MarsysStore(embedder=None, index={"fields": ["title"]}, clock=clock) as s:
        s.put(("b",), "1", {"title": "Gardening basics", "body": "quantum chromodynamics"})
        s.put(("b",), "2", {"title": "Quantum physics", "body": "tomatoes"})
        s.put(("b",), "3", {"title": "cooking", "body": "quantum"}, index=["body"])
        assert sorted(h.key for h in s.search(("b",), query="quantum") if h.score) == ["2", "3"]
        assert [h.key for h in s.search(("b",), query="tomatoes") if h.score] == []
        s.put(("b",), "2", {"title": "Roses", "body": "x"})  # re-indexed on update
        assert [h.key for h in s.search(("b",), query="quantum") if h.score] == ["3"]
        s.delete(("b",), "3")
        assert [h.key for h in s.search(("b",), query="quantum") if h.score] == []


def test_constructor_checks(clock: Clock) -> None:
    with pytest.raises(ValueError, match=r"index\.dims must be the embed model's vector length"):
        MarsysStore(embedder=None, index={"embed": "openai:text-embedding-3-small"})
    with pytest.raises(ValueError, match="not both"):
        MarsysStore(embedder=None, index={"dims": 4, "embed": lambda texts: [[1.0] * 4]})
    with pytest.raises(ValueError, match=r"unknown or unsupported keys \['distance_type'\]"):
        MarsysStore(embedder=None, index={"dims": 4, "distance_type": "l2"})
    with pytest.raises(ValueError, match="mode must be 'hybrid' or 'dense'"):
        MarsysStore(embedder=None, mode="bm25x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"index\.fields must be a list"):
        MarsysStore(embedder=None, index={"fields": "text"})
    with pytest.raises(ValueError, match="default_ttl"):
        MarsysStore(embedder=None, ttl_config={"default_ttl": 0})
    with pytest.raises(ValueError, match="refresh_on_read"):
        MarsysStore(embedder=None, ttl_config={"refresh_on_read": "yes"})  # type: ignore[typeddict-item]
    with pytest.raises(TypeError, match="store must be a MemoryStore"):
        MarsysStore({})  # type: ignore[arg-type]


# ---------------------------------------------------------------------- list_namespaces
def test_list_namespaces(store: MarsysStore) -> None:
    for ns in [("a", "b", "c"), ("a", "b", "d"), ("a", "x", "c"), ("z",)]:
        store.put(ns, "k", {"v": 1})
    assert store.list_namespaces() == [("a", "b", "c"), ("a", "b", "d"), ("a", "x", "c"), ("z",)]
    assert store.list_namespaces(prefix=("a", "b")) == [("a", "b", "c"), ("a", "b", "d")]
    assert store.list_namespaces(suffix=("c",)) == [("a", "b", "c"), ("a", "x", "c")]
    assert store.list_namespaces(prefix=("a", "*", "c")) == [("a", "b", "c"), ("a", "x", "c")]
    assert store.list_namespaces(prefix=("a",), suffix=("d",)) == [("a", "b", "d")]
    assert store.list_namespaces(max_depth=2) == [("a", "b"), ("a", "x"), ("z",)]
    assert store.list_namespaces(limit=2, offset=1) == [("a", "b", "d"), ("a", "x", "c")]
    store.delete(("z",), "k")
    assert ("z",) not in store.list_namespaces()
    assert store.batch(
        [ListNamespacesOp(match_conditions=(MatchCondition("suffix", ("*", "d")),))]
    ) == [[("a", "b", "d")]]


# ---------------------------------------------------------------------- TTL
def test_ttl_expires_and_reads_refresh_it(store: MarsysStore, clock: Clock) -> None:
    store.put(("s",), "short", {"v": 1}, ttl=10)
    store.put(("s",), "forever", {"v": 2})
    clock.advance(8)
    assert store.get(("s",), "short") is not None  # refreshes: now expires at 18
    clock.advance(8)
    assert store.get(("s",), "short", refresh_ttl=False) is not None  # no refresh
    clock.advance(3)  # 19 > 18
    assert store.get(("s",), "short") is None
    assert [i.key for i in store.search(("s",))] == ["forever"]
    assert store.list_namespaces() == [("s",)]
    assert len(store) == 2  # expired, not yet swept
    assert store.sweep_ttl() == 1
    assert len(store) == 1


def test_search_refreshes_ttl_of_what_it_returns(store: MarsysStore, clock: Clock) -> None:
    store.put(("s",), "a", {"v": 1}, ttl=10)
    store.put(("s",), "b", {"v": 2}, ttl=10)
    clock.advance(6)
    assert [i.key for i in store.search(("s",), filter={"v": 1})] == ["a"]
    clock.advance(6)
    assert [i.key for i in store.search(("s",))] == ["a"]  # b expired at 10


def test_expired_namespaces_are_not_listed(store: MarsysStore, clock: Clock) -> None:
    store.put(("gone",), "k", {"v": 1}, ttl=1)
    clock.advance(2)
    assert store.list_namespaces() == []


def test_default_ttl_and_sweep_interval(clock: Clock, tmp_path: Path) -> None:
    backing = SQLiteStore(tmp_path / "m.db")
    config = {"default_ttl": 5.0, "refresh_on_read": False, "sweep_interval_minutes": 1}
    with MarsysStore(backing, embedder=None, ttl_config=config, clock=clock) as s:  # type: ignore[arg-type]
        s.put(("s",), "k", {"v": 1})  # default_ttl applies
        s.put(("s",), "pinned", {"v": 2}, ttl=None)
        clock.advance(0.5)
        assert s.get(("s",), "k") is not None  # refresh_on_read=False
        clock.advance(5)
        assert backing.count_messages(s.key) == 2  # expired, not swept yet
        assert s.get(("s",), "k") is None  # a batch after the interval sweeps
        assert backing.count_messages(s.key) == 1
        s.put(("s",), "other", {"v": 3})
        assert {i.key for i in s.search(("s",))} == {"pinned", "other"}
    backing.close()


# ---------------------------------------------------------------------- durability
def test_items_survive_a_new_store_on_the_same_file(tmp_path: Path, clock: Clock) -> None:
    path = tmp_path / "memory.db"
    with (
        SQLiteStore(path) as backing,
        MarsysStore(backing, embedder=HashingEmbedder(), clock=clock) as s,
    ):
        s.put(("u", "1"), "city", {"text": "Alice lives in Lisbon"})
        s.put(("u", "1"), "food", {"text": "Alice likes ramen"}, ttl=5)
        s.put(("u", "2"), "pet", {"text": "Bob has a cat named Biscuit"}, index=False)
        s.put(("u", "1"), "city", {"text": "Alice moved to Porto"})
        s.put(("u", "1"), "tmp", {"text": "scratch"})
        s.delete(("u", "1"), "tmp")
        created = s.get(("u", "1"), "city").created_at  # type: ignore[union-attr]
    clock.advance(3)
    with (
        SQLiteStore(path) as backing,
        MarsysStore(backing, embedder=HashingEmbedder(), clock=clock) as s,
    ):
        assert len(s) == 3
        city = s.get(("u", "1"), "city")
        assert city is not None
        assert city.value == {"text": "Alice moved to Porto"}
        assert city.created_at == created
        hits = s.search(("u",), query="porto")
        assert hits[0].key == "city"
        assert hits[0].score > 0.95
        assert hits[-1].key == "pet"
        assert hits[-1].score is None
        assert s.list_namespaces() == [("u", "1"), ("u", "2")]
        clock.advance(3)  # food: written at 0 with ttl 5, its last read at 3 refreshed it
        assert s.get(("u", "1"), "food") is not None
        clock.advance(6)
        assert s.get(("u", "1"), "food") is None


def test_a_failing_backing_store_changes_nothing(tmp_path: Path, clock: Clock) -> None:
    backing = SQLiteStore(tmp_path / "m.db")
    s = MarsysStore(backing, embedder=HashingEmbedder(), clock=clock)
    s.put(("a",), "k", {"text": "old words"})
    backing.close()  # every write now fails in the backing store
    with pytest.raises(StoreError):
        s.batch([PutOp(("a",), "k", {"text": "new words"}), PutOp(("a",), "k2", {"v": 1})])
    with pytest.raises(StoreError):
        s.delete(("a",), "k")
    got = s.get(("a",), "k")
    assert got is not None
    assert got.value == {"text": "old words"}
    assert s.get(("a",), "k2") is None
    assert [h.key for h in s.search(("a",), query="old words") if h.score] == ["k"]
    assert [h.key for h in s.search(("a",), query="new words") if h.score] == ["k"]
    s.close()


def test_closed_store_refuses(store: MarsysStore) -> None:
    store.close()
    store.close()
    with pytest.raises(RuntimeError, match="closed"):
        store.put(("a",), "k", {"v": 1})


def test_other_messages_under_the_key_are_left_alone(clock: Clock) -> None:
    from marsys_mem.model.messages import Message

    backing = InMemoryStore()
    backing.append_messages(("langgraph", "store", "items"), [Message.user("not an item")])
    with MarsysStore(backing, embedder=None, clock=clock) as s:
        assert len(s) == 0
        s.put(("a",), "k", {"v": 1})
    assert backing.count_messages(("langgraph", "store", "items")) == 2


# ---------------------------------------------------------------------- async
async def test_async_api(store: MarsysStore) -> None:
    await store.aput(("a", "b"), "k", {"text": "async memories work"})
    got = await store.aget(("a", "b"), "k")
    assert got is not None
    assert got.value == {"text": "async memories work"}
    hits = await store.asearch(("a",), query="memories")
    assert [h.key for h in hits] == ["k"]
    assert hits[0].score is not None
    assert await store.alist_namespaces(prefix=("a",)) == [("a", "b")]
    await store.adelete(("a", "b"), "k")
    assert await store.aget(("a", "b"), "k") is None
    assert await store.asweep_ttl() == 0


# ---------------------------------------------------------------------- a real graph
class _State(TypedDict):
    user: str
    fact: str  # "" for none
    query: str
    recalled: list[str]


def _remember(state: _State) -> dict[str, Any]:
    if not state["fact"]:
        return {}
    store = get_store()
    store.put(("users", state["user"], "memories"), state["fact"][:12], {"text": state["fact"]})
    return {}


def _recall(state: _State) -> dict[str, Any]:
    store = get_store()
    hits = store.search(("users", state["user"], "memories"), query=state["query"], limit=3)
    return {"recalled": [h.value["text"] for h in hits]}


def test_a_state_graph_keeps_long_term_memory_across_runs(tmp_path: Path) -> None:
    builder = StateGraph(_State)
    builder.add_node("remember", _remember)
    builder.add_node("recall", _recall)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", "recall")
    builder.add_edge("recall", END)
    path = tmp_path / "memory.db"
    with SQLiteStore(path) as backing, MarsysStore(backing, embedder=HashingEmbedder()) as s:
        graph = builder.compile(store=s)
        graph.invoke({"user": "alice", "fact": "I live in Lisbon", "query": "x", "recalled": []})
        out = graph.invoke(
            {"user": "alice", "fact": "My cat is Biscuit", "query": "cat", "recalled": []}
        )
        assert set(out["recalled"]) == {"I live in Lisbon", "My cat is Biscuit"}
    with SQLiteStore(path) as backing, MarsysStore(backing, embedder=HashingEmbedder()) as s:
        graph = builder.compile(store=s)  # a new store on the same file: a new process's view
        ask = {"user": "alice", "fact": "", "query": "where do I live", "recalled": []}
        out = graph.invoke(ask)
        assert out["recalled"][0] == "I live in Lisbon"
        out = graph.invoke({"user": "bob", "fact": "Bob likes tea", "query": "tea", "recalled": []})
        assert out["recalled"] == ["Bob likes tea"]  # namespaces keep users apart


# ---------------------------------------------------------------------- model check
_ns = st.sampled_from([("a",), ("a", "b"), ("c",)])
_key = st.sampled_from(["k1", "k2", "k3"])
_value = st.fixed_dictionaries({"n": st.integers(0, 3)}) | st.none()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(_ns, _key, _value), max_size=25))
def test_matches_langgraphs_in_memory_store(ops: list[tuple[Any, str, Any]]) -> None:
    """Random puts and deletes: the same items, namespaces and filter results as LangGraph's."""
    ref = LangGraphInMemoryStore()
    with MarsysStore(embedder=None) as ours:
        for ns, key, value in ops:
            for s in (ours, ref):
                s.batch([PutOp(ns, key, value)])
        for ns in [("a",), ("a", "b"), ("c",)]:
            for key in ["k1", "k2", "k3"]:
                a, b = ours.get(ns, key), ref.get(ns, key)
                assert (a and a.value) == (b and b.value)
        # (LangGraph's in-memory store also lists namespaces emptied or merely read)
        held = {i.namespace for i in ref.search((), limit=1000)}
        assert ours.list_namespaces() == sorted(held)
        for flt in (None, {"n": 1}, {"n": {"$gte": 2}}):
            assert sorted(_keys(ours.search((), filter=flt, limit=50))) == sorted(
                _keys(ref.search((), filter=flt, limit=50))
            )


# ---------------------------------------------------------------------- LangGraph's index config
def _words(text: str, dims: int) -> list[float]:
    """A deterministic bag-of-words vector (each word hashed to one of ``dims`` places)."""
    vector = [0.0] * dims
    for word in re.findall(r"[a-z]+", text.lower()):
        vector[int(hashlib.sha256(word.encode()).hexdigest(), 16) % dims] += 1.0
    return vector


def embed_texts(texts: Sequence[str]) -> list[list[float]]:
    return [_words(t, 1536) for t in texts]


async def aembed_texts(texts: Sequence[str]) -> list[list[float]]:
    await asyncio.sleep(0)
    return embed_texts(texts)


class WordEmbeddings(Embeddings):
    """A LangChain ``Embeddings``, as LangGraph's docs pass one (``init_embeddings(...)``)."""

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return embed_texts(texts)

    def embed_query(self, text: str) -> list[float]:
        return _words(text, 1536)


MEMORIES = {
    "home": {"text": "Alice lives in Lisbon near the river"},
    "pet": {"text": "Her puppy is called Biscuit"},
    "food": {"text": "She loves spicy ramen"},
}


@pytest.mark.parametrize(
    "embed", [embed_texts, aembed_texts, WordEmbeddings()], ids=["sync", "async", "Embeddings"]
)
async def test_index_embed_works_as_langgraphs_docs_write_it(embed: Any) -> None:
    # the LangGraph docs' semantic-search setup, unchanged: index={"dims": 1536, "embed": ...}
    ref = LangGraphInMemoryStore(index={"dims": 1536, "embed": embed})
    with MarsysStore(index={"dims": 1536, "embed": embed}) as store:
        assert store.index_config is not None
        assert store.index_config["dims"] == 1536
        assert isinstance(store.index_config["embed"], Embeddings)
        for s in (store, ref):
            for key, value in MEMORIES.items():
                await s.aput(("users", "alice"), key, value)
        for query in ("what is the puppy called", "where does alice live", "ramen"):
            ours = await store.asearch(("users",), query=query, limit=3)
            theirs = await ref.asearch(("users",), query=query, limit=3)
            assert ours[0].key == theirs[0].key
            # scored as LangGraph scores: the cosine similarity
            assert [h.score for h in ours] == pytest.approx([h.score for h in theirs], abs=1e-5)
            assert {h.key: h.score for h in ours} == pytest.approx(
                {h.key: h.score for h in theirs}, abs=1e-5
            )
        if embed is not aembed_texts:  # an async function has no sync path in LangGraph
            hits = store.search(("users",), query="what is the puppy called", limit=1)
            assert hits[0].key == "pet"


def test_index_embed_fields_are_one_entry_each_and_survive_a_restart(tmp_path: Path) -> None:
    index = {"dims": 1536, "embed": WordEmbeddings(), "fields": ["title", "tags[*]"]}
    with SQLiteStore(tmp_path / "lg.db") as backing:
        with MarsysStore(backing, index=index) as store:
            store.put(("docs",), "a", {"title": "Gardening basics", "tags": ["roses", "soil"]})
            store.put(("docs",), "b", {"title": "Quantum physics", "tags": ["particles"]})
            hit = store.search(("docs",), query="roses", limit=1)[0]
            assert (hit.key, hit.score) == ("a", pytest.approx(1.0))  # its best field
        (stored,) = [
            m
            for m in backing.load_messages(("langgraph", "store", "items"))
            if m.text == ("Gardening basics\nroses\nsoil")
        ]
        assert stored.metadata["texts"] == ["Gardening basics", "roses", "soil"]
        with MarsysStore(backing, index=index) as again:  # the index is rebuilt per field
            assert [h.key for h in again.search(("docs",), query="soil", limit=1)] == ["a"]
            assert again.search(("docs",), query="soil", limit=1)[0].score == pytest.approx(1.0)


def test_index_embed_errors_name_the_setting() -> None:
    def wrong(texts: Sequence[str]) -> list[list[float]]:
        return [[1.0, 0.0] for _ in texts]

    with MarsysStore(index={"dims": 4, "embed": wrong}) as store:
        store.put(("a",), "k", {"text": "hello"})  # stored; found by keywords only
        with pytest.raises(EmbeddingError, match=r"shape \(1, 2\), expected \(1, 4\).*dims is 4"):
            store.search(("a",), query="hello")
    with MarsysStore(index={"dims": 4, "embed": wrong}, mode="hybrid") as store:
        assert store.index_config is not None
    with pytest.raises(ValueError, match=r"index\.dims must be .* got 0"):
        MarsysStore(index={"dims": 0, "embed": wrong})


def test_index_embed_as_a_provider_string_goes_through_langchain() -> None:
    if importlib.util.find_spec("langchain") is None:
        # what LangGraph says, as the error of a missing dependency
        with pytest.raises(MissingDependencyError, match="langchain"):
            MarsysStore(index={"dims": 1536, "embed": "openai:text-embedding-3-small"})
    else:
        with pytest.raises(ValueError, match=r"index\.embed"):
            MarsysStore(index={"dims": 1536, "embed": "nosuchprovider:model"})


def test_hybrid_mode_keeps_bm25_with_a_langgraph_embed() -> None:
    with MarsysStore(index={"dims": 1536, "embed": WordEmbeddings()}, mode="hybrid") as store:
        for key, value in MEMORIES.items():
            store.put(("users", "alice"), key, value)
        hits = store.search(("users",), query="Biscuit", limit=3)
        assert hits[0].key == "pet"
        assert hits[0].score > 0.95  # hybrid: the calibrated score of a match
