import asyncio
import json
import math
import re

import pytest

from marsys_mem.context.summarize import ExtractiveSummarizer
from marsys_mem.exceptions import (
    DuplicateMessageError,
    EmbeddingError,
    StoreError,
    SummarizerError,
)
from marsys_mem.model.messages import Message
from marsys_mem.model.runs import RunSnapshot
from marsys_mem.patterns.episodic import Episode, EpisodeMatch, EpisodicMemory
from marsys_mem.patterns.rag import ScoredMessage
from marsys_mem.retrieval.embeddings import HashingEmbedder
from marsys_mem.store import InMemoryStore, SQLiteStore


class CountingSummarizer:
    """A deterministic fake: counts its calls and what it was asked to summarise."""

    def __init__(self):
        self.calls = []

    def __call__(self, messages):
        self.calls.append([m.text for m in messages])
        return f"{len(messages)} messages, first: {messages[0].text}"


@pytest.fixture
def summarizer():
    return CountingSummarizer()


@pytest.fixture
def mem(summarizer):
    m = EpisodicMemory(HashingEmbedder(), summarizer=summarizer)
    yield m
    m.close()


def ids(messages):
    return [m.message_id for m in messages]


# --------------------------------------------------------------------- episodes


def test_start_add_end(mem):
    assert mem.current is None
    assert mem.episodes() == []
    assert len(mem) == 0
    trip = mem.start_episode({"task": "trip", "tags": ["travel"]})
    assert isinstance(trip, Episode)
    assert trip.is_open
    assert trip.metadata["task"] == "trip"
    a = mem.add("We booked the hotel in Porto")
    b = mem.add(Message.assistant("Great, the hotel is booked", name="planner"))
    assert mem.current.id == trip.id
    assert mem.current.message_ids == (a, b)
    assert [m.metadata["episode_id"] for m in mem.messages()] == [trip.id, trip.id]
    work = mem.start_episode({"task": "report"})  # ends the trip episode
    eps = mem.episodes()
    assert [e.id for e in eps] == [trip.id, work.id]
    assert not eps[0].is_open
    assert eps[0].ended_at >= eps[0].started_at
    assert eps[1].is_open
    assert mem.current.id == work.id
    ended = mem.end_episode()
    assert ended.id == work.id
    assert not ended.is_open
    assert mem.current is None
    assert mem.end_episode() is None
    c = mem.add("a message with no episode open")  # starts one
    third = mem.current
    assert third.id not in (trip.id, work.id)
    assert third.message_ids == (c,)
    assert third.metadata == {}
    assert ids(mem.messages(trip.id)) == [a, b]
    assert mem.messages(work.id) == []
    assert mem.get_episode(trip.id).message_ids == (a, b)
    assert len(mem) == 3


def test_episode_snapshots_are_copies(mem):
    ep = mem.start_episode({"nested": {"x": 1}})
    ep.metadata["nested"]["x"] = 99
    mem.add("hello there")
    assert mem.get_episode(ep.id).metadata == {"nested": {"x": 1}}
    assert ep.message_ids == ()  # a snapshot, not a live view


def test_add_with_fields_and_existing_metadata(mem):
    mem.start_episode()
    mid = mem.add("hi", name="alice", metadata={"episode_id": "forged", "k": 1})
    m = mem.messages()[0]
    assert m.message_id == mid
    assert m.name == "alice"
    assert m.metadata == {"episode_id": mem.current.id, "k": 1}
    src = Message.user("original")
    mid = mem.add(src, name="bob")
    assert mid == src.message_id
    assert mem.messages()[-1].name == "bob"


@pytest.mark.parametrize(
    ("metadata", "error"),
    [
        ({"score": math.nan}, ValueError),
        ({"when": object()}, ValueError),
        ({1: "x"}, TypeError),
        (["not", "a", "mapping"], TypeError),
    ],
)
def test_bad_episode_metadata_changes_nothing(mem, metadata, error):
    ep = mem.start_episode({"task": "a"})
    with pytest.raises(error):
        mem.start_episode(metadata)
    assert [e.id for e in mem.episodes()] == [ep.id]
    assert mem.current.is_open


def test_bad_messages_change_nothing(mem):
    with pytest.raises(EmbeddingError, match="no text"):
        mem.add("   ")  # would have started an episode
    assert mem.episodes() == []
    assert mem.current is None
    with pytest.raises(TypeError, match="Message or a str"):
        mem.add(3.14)
    mid = mem.add("first")
    with pytest.raises(DuplicateMessageError):
        mem.add(Message.user("again", message_id=mid))
    with pytest.raises(EmbeddingError, match="max_chars"):
        mem.add("x" * 200_000)
    assert len(mem.episodes()) == 1
    assert mem.current.message_ids == (mid,)
    assert len(mem.rag) == 1


# --------------------------------------------------------------------- recall


@pytest.fixture
def filled(mem):
    trip = mem.start_episode({"task": "trip"})
    mem.add("We booked the hotel in Porto for the third of May")
    mem.add("The flight to Porto leaves at nine in the morning")
    work = mem.start_episode({"task": "work"})
    mem.add("The quarterly report is due on Friday afternoon")
    mem.add("The hotel conference room is booked for the offsite")
    home = mem.start_episode({"task": "home"})
    mem.add("The plumber comes on Monday to fix the sink")
    return mem, trip, work, home


def test_recall_across_and_within_episodes(filled):
    mem, trip, work, _ = filled
    hits = mem.recall("hotel booked", k=2)
    assert all(isinstance(h, ScoredMessage) for h in hits)
    assert {h.message.metadata["episode_id"] for h in hits} == {trip.id, work.id}
    within = mem.recall("hotel booked", k=5, episode_id=work.id)
    assert {h.message.metadata["episode_id"] for h in within} == {work.id}
    assert within[0].text == "The hotel conference room is booked for the offsite"
    assert mem.recall("plumber", k=3, min_score=1.1) == []


def test_recall_episodes_ranks_episodes_by_best_hit(filled):
    mem, trip, work, home = filled
    found = mem.recall_episodes("quarterly report due Friday", k=2)
    assert all(isinstance(f, EpisodeMatch) for f in found)
    assert found[0].episode.id == work.id
    assert found[0].hits[0].text == "The quarterly report is due on Friday afternoon"
    assert found[0].score == found[0].hits[0].score
    assert len(found) == 2
    assert len({f.episode.id for f in found}) == 2
    porto = mem.recall_episodes("Porto", k=3)
    assert porto[0].episode.id == trip.id
    assert len(porto[0].hits) == 2
    assert mem.recall_episodes("sink plumber", k=1)[0].episode.id == home.id


def test_recall_bad_input(filled):
    mem, *_ = filled
    for call in (mem.recall, mem.recall_episodes):
        with pytest.raises(ValueError, match="query"):
            call("")
        with pytest.raises(ValueError, match="query"):
            call("  \n")
        with pytest.raises(ValueError, match="k must be"):
            call("hotel", k=0)
        with pytest.raises(ValueError, match="k must be"):
            call("hotel", k=-3)
    with pytest.raises(KeyError, match="no episode"):
        mem.recall("hotel", episode_id="nope")
    with pytest.raises(KeyError, match="no episode"):
        mem.get_episode("nope")


async def test_async_twins(filled, summarizer):
    mem, trip, *_ = filled
    hits = await mem.arecall("Porto flight", k=1, episode_id=trip.id)
    assert hits[0].text == "The flight to Porto leaves at nine in the morning"
    found = await mem.arecall_episodes("Porto", k=1)
    assert found[0].episode.id == trip.id
    mid = await mem.aadd("added from a coroutine")
    assert mid in mem.current.message_ids
    assert len(await mem.asummaries()) == 3
    await mem.aflush()
    results = await asyncio.gather(*(mem.aadd(f"concurrent {i}") for i in range(8)))
    assert set(results) <= set(mem.current.message_ids)


# --------------------------------------------------------------------- summaries


def test_summaries_are_per_episode_and_cached(filled, summarizer):
    mem, trip, work, home = filled
    empty = mem.start_episode({"task": "empty"})
    out = mem.summaries()
    assert [ep.id for ep, _ in out] == [trip.id, work.id, home.id, empty.id]
    assert out[0][1] == "2 messages, first: We booked the hotel in Porto for the third of May"
    assert out[3][1] == ""  # no messages: the summariser is not called
    assert len(summarizer.calls) == 3
    assert out[0][0].summary == out[0][1]
    # nothing changed: nothing is recomputed
    assert mem.summaries() == out
    assert len(summarizer.calls) == 3
    # one episode changes: only it is recomputed
    mem.add("A late note for the empty episode")
    out2 = mem.summaries()
    assert len(summarizer.calls) == 4
    assert summarizer.calls[-1] == ["A late note for the empty episode"]
    assert out2[:3] == out[:3]
    assert out2[3][1].startswith("1 messages")
    assert mem.get_episode(empty.id).summary == out2[3][1]
    # a single episode
    assert mem.summaries(trip.id) == out[:1]
    assert len(summarizer.calls) == 4
    with pytest.raises(KeyError):
        mem.summaries("nope")


def test_default_summarizer_is_extractive():
    with EpisodicMemory(HashingEmbedder()) as mem:
        assert isinstance(mem.summarizer, ExtractiveSummarizer)
        mem.add("The budget is 4000 EUR.")
        mem.add("Noted: the budget is 4000 EUR.")
        ((_, text),) = mem.summaries()
        assert text.startswith("Summary of earlier conversation:")
        assert "4000 EUR" in text


async def test_async_summariser(filled):
    mem, *_ = filled
    calls = []

    async def llm(messages):
        await asyncio.sleep(0)
        calls.append(len(messages))
        return "async: " + " | ".join(m.text for m in messages)

    mem.summarizer = llm
    with pytest.raises(SummarizerError, match="asummaries"):
        mem.summaries()
    out = await mem.asummaries()
    assert [s.split(":")[0] for _, s in out] == ["async"] * 3
    assert calls == [2, 2, 1]
    await mem.asummaries()
    assert calls == [2, 2, 1]


def test_summariser_failures(filled):
    mem, trip, work, _ = filled
    state = {"n": 0}

    def flaky(messages):
        state["n"] += 1
        if state["n"] == 2:
            raise RuntimeError("model down")
        return "ok"

    mem.summarizer = flaky
    with pytest.raises(SummarizerError, match="model down"):
        mem.summaries()
    assert mem.get_episode(trip.id).summary == "ok"  # finished before the failure: kept
    assert mem.get_episode(work.id).summary is None
    mem.summarizer = lambda messages: 42
    with pytest.raises(SummarizerError, match="int, not str"):
        mem.summaries()


# --------------------------------------------------------------------- persistence


def open_mem(tmp_path, embedder=None, **kwargs):
    store = SQLiteStore(tmp_path / "episodes.db")
    mem = EpisodicMemory(
        embedder or HashingEmbedder(),
        store=store,
        namespace="ns",
        agent="assistant",
        index_path=tmp_path / "episodes.index",
        **kwargs,
    )
    return store, mem


def test_persistence_across_a_restart(tmp_path):
    summarizer = CountingSummarizer()
    store, mem = open_mem(tmp_path, summarizer=summarizer)
    trip = mem.start_episode({"task": "trip"})
    mem.add("We booked the hotel in Porto")
    work = mem.start_episode({"task": "work"})
    mem.add("The quarterly report is due on Friday")
    before = mem.summaries()
    assert len(summarizer.calls) == 2
    mem.close()
    assert not store.closed
    store.close()

    store, mem = open_mem(tmp_path, summarizer=summarizer)
    eps = mem.episodes()
    assert [e.id for e in eps] == [trip.id, work.id]
    assert eps[0].metadata == {"task": "trip"}
    assert not eps[0].is_open
    assert mem.current.id == work.id  # the open episode is resumed
    assert mem.summaries() == before  # cached summaries persist
    assert len(summarizer.calls) == 2
    hit = mem.recall("Which hotel did we book?", k=1)[0]
    assert hit.text == "We booked the hotel in Porto"
    assert hit.message.metadata["episode_id"] == trip.id
    mem.add("Also prepare the slides")  # goes to the resumed episode
    assert len(mem.get_episode(work.id).message_ids) == 2
    mem.summaries()
    assert len(summarizer.calls) == 3
    mem.close()
    store.close()


def test_index_file_deleted_is_rebuilt(tmp_path):
    store, mem = open_mem(tmp_path)
    mem.add("We booked the hotel in Porto")
    mem.add("The plumber comes on Monday")
    mem.close()
    store.close()
    (tmp_path / "episodes.index").unlink()
    store, mem = open_mem(tmp_path)
    assert mem.recall("plumber Monday", k=1, min_score=None)[0].text == (
        "The plumber comes on Monday"
    )
    mem.close()
    store.close()


def test_messages_without_a_saved_episode_get_it_rebuilt(tmp_path):
    store = SQLiteStore(tmp_path / "episodes.db")
    key = ("ns", "assistant", "episodes")
    store.append_messages(
        key, [Message.user("orphaned by a crash", metadata={"episode_id": "lost"})]
    )
    store.save_run(RunSnapshot(run_id="unrelated", namespace="ns", agent="assistant"))
    with EpisodicMemory(HashingEmbedder(), store=store, namespace="ns", agent="assistant") as mem:
        (ep,) = mem.episodes()
        assert ep.id == "lost"
        assert ep.is_open
        assert len(ep.message_ids) == 1
        assert mem.current.id == "lost"
    snap = store.load_run("lost")
    assert snap is not None
    assert snap.branch == "episodes"
    store.close()


def test_two_memories_on_one_store_are_separate():
    store = InMemoryStore()
    a = EpisodicMemory(HashingEmbedder(), store=store, agent="a")
    b = EpisodicMemory(HashingEmbedder(), store=store, agent="b")
    a.add("alpha fact")
    b.add("beta fact")
    assert [h.text for h in a.recall("fact", k=5)] == ["alpha fact"]
    assert len(a.episodes()) == len(b.episodes()) == 1
    a.close()
    b.close()
    assert not store.closed


def test_constructor_validation_and_close():
    with pytest.raises(ValueError, match="store key"):
        EpisodicMemory(None, namespace="")
    with pytest.raises(TypeError, match="store"):
        EpisodicMemory(None, store={})
    with pytest.raises(TypeError, match="summarizer"):
        EpisodicMemory(None, summarizer="extractive")
    with pytest.raises(ValueError, match="rag_options"):
        EpisodicMemory(None, rag_options={"key": ("a", "b", "c")})
    mem = EpisodicMemory(None, rag_options={"mode": "bm25"})
    mem.add("keyword search only")
    assert mem.recall("keyword", k=1)[0].text == "keyword search only"
    mem.close()
    mem.close()  # idempotent
    assert mem.closed
    assert mem.store.closed
    for call in (lambda: mem.add("x"), mem.start_episode, lambda: mem.recall("x")):
        with pytest.raises(StoreError, match="closed"):
            call()


# --------------------------------------------------------------------- real model


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("sentence_transformers", reason="needs the embeddings extra")
    import torch

    from marsys_mem.retrieval.embeddings import SentenceTransformerEmbedder

    torch.set_num_threads(1)
    emb = SentenceTransformerEmbedder()
    emb.embed(["warm up"])
    return emb


EPISODES = {
    "pets": ["My puppy is called Biscuit", "We walk in the park every evening"],
    "work": ["The quarterly report is due on Friday", "The offsite moved to next quarter"],
    "car": ["I parked the car on level 4 of the garage", "The tyres need replacing soon"],
}
_STOP = {"what", "is", "the", "of", "my", "a", "s", "where"}


def _words(text):
    return set(re.findall(r"[a-z0-9]+", text.lower())) - _STOP


@pytest.mark.parametrize(
    ("query", "episode", "answer"),
    [
        ("What's the name of my dog?", "pets", "My puppy is called Biscuit"),
        ("Where's my automobile?", "car", "I parked the car on level 4 of the garage"),
    ],
)
def test_minilm_recall_is_semantic(minilm, query, episode, answer):
    with EpisodicMemory(minilm) as mem:
        started = {}
        for name, texts in EPISODES.items():
            started[name] = mem.start_episode({"topic": name}).id
            for text in texts:
                mem.add(text)
        # a substring or keyword match cannot find it: no content word in common
        assert not _words(query) & _words(answer)
        assert all(query.lower() not in t.lower() for ts in EPISODES.values() for t in ts)
        # (the ranking, whatever the score: a paraphrase with no word in common scores
        # by its cosine alone, "automobile" below the default min_score)
        hit = mem.recall(query, k=1, min_score=None)[0]
        assert hit.text == answer
        assert hit.message.metadata["episode_id"] == started[episode]
        assert mem.recall_episodes(query, k=1, min_score=None)[0].episode.id == started[episode]
        only = mem.recall(query, k=1, episode_id=started[episode], min_score=None)
        assert only[0].text == answer


def test_minilm_persistence(minilm, tmp_path):
    store, mem = open_mem(tmp_path, embedder=minilm)
    for name, texts in EPISODES.items():
        mem.start_episode({"topic": name})
        for text in texts:
            mem.add(text)
    mem.close()
    store.close()
    store, mem = open_mem(tmp_path, embedder=minilm)
    found = mem.recall_episodes("What is my dog called?", k=1)[0]
    assert found.episode.metadata == {"topic": "pets"}
    mem.close()
    store.close()


# --------------------------------------------------------------------- remove


def test_remove_deletes_durably_and_drops_stale_summaries(tmp_path):
    summarizer = CountingSummarizer()
    store, mem = open_mem(tmp_path, summarizer=summarizer)
    trip = mem.start_episode({"task": "trip"})
    secret = mem.add("My passport number is X1234567")
    kept = mem.add("We booked the hotel in Porto")
    work = mem.start_episode({"task": "work"})
    report = mem.add("The quarterly report is due on Friday")
    assert "X1234567" in mem.summaries(trip.id)[0][1]
    assert mem.remove([secret, secret, "no-such-id"]) == 1
    assert mem.remove(secret) == 0  # already gone: nothing to do
    assert mem.get_episode(trip.id).message_ids == (kept,)
    assert mem.get_episode(trip.id).summary is None  # it quoted the removed message
    assert mem.get_episode(work.id).message_ids == (report,)
    assert all(h.message.message_id != secret for h in mem.recall("passport number", k=5))
    assert secret not in {m.message_id for m in store.load_messages(mem.key)}
    snapshot = store.load_run(trip.id)
    assert "X1234567" not in json.dumps(snapshot.metadata)
    calls = len(summarizer.calls)
    assert "X1234567" not in mem.summaries(trip.id)[0][1]
    assert len(summarizer.calls) == calls + 1  # recomputed once, cached again
    mem.close()
    store.close()

    store, mem = open_mem(tmp_path, summarizer=summarizer)
    assert mem.get_episode(trip.id).message_ids == (kept,)
    assert [m.message_id for m in mem.messages(work.id)] == [report]
    assert all(h.message.message_id != secret for h in mem.recall("passport number", k=5))
    mem.summaries()
    assert len(summarizer.calls) == calls + 2  # only work's (its cache was never filled)
    mem.close()
    store.close()


@pytest.mark.parametrize(
    ("bad", "error"),
    [(42, "ids must be a str or an iterable of str, got int"), (["ok", 7], r"ids\[1\] must")],
)
def test_remove_bad_ids_change_nothing(mem, bad, error):
    mid = mem.add("We booked the hotel in Porto")
    with pytest.raises(TypeError, match=error):
        mem.remove(bad)
    assert [m.message_id for m in mem.messages()] == [mid]
    assert len(mem.rag) == 1
