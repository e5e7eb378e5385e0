"""The background extraction pipeline and the offline extractor."""

from __future__ import annotations

import threading
import time

import pytest

from marsys_mem.model.messages import Message
from marsys_mem.patterns.extraction import ExtractionPipeline, extract_facts_offline, is_trivial
from marsys_mem.patterns.user_facts import FactCandidate, FactMemory
from marsys_mem.retrieval.embeddings import HashingEmbedder


@pytest.mark.parametrize(
    "text", ["ok", "OK!", "thanks", "Thank you very much.", "👍", "🎉🎉 !!", "  ", "got it"]
)
def test_trivial(text: str) -> None:
    assert is_trivial(Message.user(text))


@pytest.mark.parametrize("text", ["ok, I live in Oslo", "no meat for me", "42", "Thanks to Bo"])
def test_not_trivial(text: str) -> None:
    assert not is_trivial(Message.user(text))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("My name is Alice.", [("User's name is Alice", "name", "identity")]),
        ("I'm a data engineer at heart", [("User is a data engineer at heart", "job", "identity")]),
        ("I am 34 years old", [("User is 34 years old", "age", "identity")]),
        ("I live in Porto, near the river", [("User lives in Porto", "home", "identity")]),
        ("I work at Acme Corp.", [("User works at Acme Corp", "employer", "identity")]),
        ("I prefer window seats", [("User prefers window seats", "prefers", "preference")]),
        ("I like jazz", [("User likes jazz", "likes:jazz", "preference")]),
        ("I don't like jazz", [("User does not like jazz", "likes:jazz", "preference")]),
        ("I hate mornings!", [("User dislikes mornings", "likes:mornings", "preference")]),
        (
            "My sister is called Clara",
            [("User's sister is called Clara", "relation:sister:name", "relation")],
        ),
        (
            "My dog lives with my parents",
            [("User's dog lives with my parents", "relation:dog:lives", "relation")],
        ),
        ("I'm moving to Berlin in May", [("User is moving to Berlin in May", "move", "plan")]),
        ("I plan to learn Dutch", [("User plans to learn Dutch", "plan:learn dutch", "plan")]),
        ("What's the weather like?", []),
        ("I'm a bit tired", []),
    ],
)
def test_offline_extractor_patterns(text: str, expected: list[tuple[str, str, str]]) -> None:
    m = Message.user(text)
    got = extract_facts_offline([m])
    assert [(c.text, c.slot, c.category) for c in got] == expected
    assert all(c.source_ids == (m.message_id,) and c.at == m.timestamp for c in got)


def test_offline_extractor_reads_user_messages_only() -> None:
    msgs = [Message.assistant("My name is Bot"), Message.system("I live in the cloud")]
    assert extract_facts_offline(msgs) == []


class RecordingExtractor:
    def __init__(self, delay: float = 0.0) -> None:
        self.batches: list[list[str]] = []
        self.delay = delay
        self.entered = threading.Event()
        self.release = threading.Event()
        self.release.set()

    def __call__(self, messages: list[Message]) -> list[FactCandidate]:
        self.entered.set()
        self.release.wait(10)
        time.sleep(self.delay)
        self.batches.append([m.text for m in messages])
        return extract_facts_offline(messages)


def test_trivial_messages_never_reach_the_extractor() -> None:
    facts = FactMemory(HashingEmbedder())
    ex = RecordingExtractor()
    with ExtractionPipeline(facts, "alice", ex, debounce=0.01) as pipe:
        assert pipe.submit([Message.user("ok"), Message.user("thanks!"), Message.user("🙂")]) == 0
        pipe.flush()
        assert ex.batches == []
        assert pipe.stats.skipped == 3
        assert pipe.stats.calls == 0


def test_turns_are_debounced_into_one_call() -> None:
    facts = FactMemory(HashingEmbedder())
    ex = RecordingExtractor()
    with ExtractionPipeline(facts, "alice", ex, debounce=0.5) as pipe:
        for text in ("My name is Alice", "I live in Oslo", "I like skiing"):
            pipe.submit([Message.user(text), Message.assistant("Noted.")])
        time.sleep(0.1)
        assert ex.batches == []  # still inside the debounce window
        deadline = time.monotonic() + 5
        while not ex.batches and time.monotonic() < deadline:
            time.sleep(0.02)
        pipe.flush()
    assert ex.batches == [["My name is Alice", "I live in Oslo", "I like skiing"]]
    assert pipe.stats.calls == 1
    assert pipe.stats.extracted == 3
    assert [f.text for f in facts.facts("alice")] == [
        "User's name is Alice",
        "User lives in Oslo",
        "User likes skiing",
    ]


def test_max_batch_splits_and_submit_never_waits_for_the_model() -> None:
    facts = FactMemory(HashingEmbedder())
    ex = RecordingExtractor()
    ex.release.clear()  # the extractor blocks until released
    with ExtractionPipeline(facts, "alice", ex, debounce=10, max_batch=2) as pipe:
        pipe.submit([Message.user("I like tea"), Message.user("I like jazz")])
        assert ex.entered.wait(5)  # max_batch reached: sent without waiting for debounce
        start = time.perf_counter()
        for i in range(200):
            pipe.submit(Message.user(f"I like thing{i}"))
        elapsed = time.perf_counter() - start
        assert elapsed < 0.5  # the model is blocked, submit is not
        ex.release.set()
        pipe.flush(timeout=30)
    assert all(len(b) <= 2 for b in ex.batches)
    assert sum(len(b) for b in ex.batches) == 202
    assert len(facts.facts("alice")) == 202


async def test_async_extractor_and_subjects() -> None:
    facts = FactMemory(HashingEmbedder())

    async def extractor(messages: list[Message]) -> list[FactCandidate]:
        return extract_facts_offline(messages)

    with ExtractionPipeline(facts, "alice", extractor, debounce=0.01) as pipe:
        pipe.submit(Message.user("I live in Oslo"))
        pipe.submit(Message.user("I live in Rome"), subject="bob")
        await pipe.aflush()
    assert [f.text for f in facts.facts("alice")] == ["User lives in Oslo"]
    assert [f.text for f in facts.facts("bob")] == ["User lives in Rome"]


def test_extractor_error_is_reported_once_and_pipeline_goes_on() -> None:
    facts = FactMemory(HashingEmbedder())
    fail = [True]

    def flaky(messages: list[Message]) -> list[FactCandidate]:
        if fail[0]:
            fail[0] = False
            raise RuntimeError("model down")
        return extract_facts_offline(messages)

    with ExtractionPipeline(facts, "alice", flaky, debounce=0.01) as pipe:
        pipe.submit(Message.user("I live in Oslo"))
        with pytest.raises(RuntimeError, match="model down"):
            pipe.flush()
        pipe.submit(Message.user("I live in Rome"))
        pipe.flush()
        assert pipe.stats.errors == 1
    assert [f.text for f in facts.facts("alice")] == ["User lives in Rome"]


def test_restated_and_changed_facts_through_the_pipeline() -> None:
    facts = FactMemory(HashingEmbedder())
    with ExtractionPipeline(facts, "alice", debounce=0.01) as pipe:
        pipe.submit(Message.user("I live in Paris"))
        pipe.flush()
        pipe.submit(Message.user("As I said, I live in Paris"))
        pipe.flush()
        pipe.submit(Message.user("Big news: I live in Berlin now"))
        pipe.flush()
    (current,) = facts.facts("alice")
    assert current.text == "User lives in Berlin now"
    assert [f.text for f in facts.history(current.fact_id)] == [
        "User lives in Paris",
        "User lives in Berlin now",
    ]
    assert facts.history(current.fact_id)[0].confidence == pytest.approx(0.8)


def test_close_extracts_what_waits_and_rejects_later_submits() -> None:
    facts = FactMemory(HashingEmbedder())
    pipe = ExtractionPipeline(facts, "alice", debounce=60)
    pipe.submit(Message.user("I live in Oslo"))
    pipe.close(timeout=10)
    assert len(facts.facts("alice")) == 1
    with pytest.raises(RuntimeError, match="closed"):
        pipe.submit(Message.user("I live in Rome"))
    with ExtractionPipeline(facts, "a") as other, pytest.raises(TypeError, match="messages\\[0\\]"):
        other.submit(["text"])  # type: ignore[list-item]
