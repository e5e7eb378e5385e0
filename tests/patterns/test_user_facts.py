"""FactMemory lifecycle with a fake clock: dedup, reinforce, decay, prune, contradictions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marsys_mem.exceptions import InvalidNameError, MessageNotFoundError
from marsys_mem.patterns.user_facts import FactCandidate, FactMemory
from marsys_mem.retrieval.embeddings import HashingEmbedder
from marsys_mem.store import InMemoryStore, SQLiteStore

T0 = datetime(2025, 1, 1, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **kw: float) -> None:
        self.now += timedelta(**kw)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def mem(clock: Clock) -> FactMemory:
    return FactMemory(HashingEmbedder(), clock=clock)


def test_restatement_reinforces_instead_of_copying(mem: FactMemory) -> None:
    first = mem.add("User likes green tea", subject="alice", confidence=0.5, source_ids=["m1"])
    again = mem.add("User likes green tea", subject="alice", source_ids=["m2"])
    assert (first.action, again.action) == ("added", "reinforced")
    assert again.fact.fact_id == first.fact.fact_id
    assert again.fact.confidence == pytest.approx(0.6)
    assert again.fact.source_ids == ("m1", "m2")
    assert len(mem.facts("alice")) == 1
    for _ in range(10):
        mem.add("User likes green tea", subject="alice")
    assert mem.facts("alice")[0].confidence == 1.0  # capped


def test_dedup_threshold_is_a_strict_cosine_bound(clock: Clock) -> None:
    emb = HashingEmbedder()
    a, b = "User likes green tea a lot", "User likes green tea"
    v = emb.embed([a, b])
    cos = float(v[0] @ v[1])
    assert 0.5 < cos < 0.99
    above = FactMemory(emb, clock=clock, dedup_threshold=cos - 0.01)
    above.add(a, subject="u")
    assert above.add(b, subject="u").action == "reinforced"
    at = FactMemory(emb, clock=clock, dedup_threshold=cos)  # "> threshold", not >=
    at.add(a, subject="u")
    assert at.add(b, subject="u").action == "added"
    # subjects never dedup against each other
    assert above.add(a, subject="bob").action == "added"


def test_decay_once_per_period_and_reinforcement_resets(mem: FactMemory, clock: Clock) -> None:
    fid = mem.add("User lives in Porto", subject="alice", confidence=0.8).fact.fact_id
    clock.advance(days=6)
    assert mem.maintain().decayed == ()
    clock.advance(days=1)  # 7 days without reinforcement
    assert mem.maintain().decayed == (fid,)
    assert mem.get(fid).confidence == pytest.approx(0.8 * 0.95)
    assert mem.maintain().decayed == ()  # idempotent within the period
    clock.advance(days=14)  # two more periods
    mem.maintain()
    assert mem.get(fid).confidence == pytest.approx(0.8 * 0.95**3)
    mem.add("User lives in Porto", subject="alice")
    assert mem.get(fid).confidence == pytest.approx(0.8 * 0.95**3 + 0.1)
    clock.advance(days=6)
    assert mem.maintain().decayed == ()


def test_prune_needs_low_confidence_and_age(mem: FactMemory, clock: Clock) -> None:
    weak = mem.add("User maybe owns a boat", subject="alice", confidence=0.29).fact.fact_id
    strong = mem.add("User's name is Alice", subject="alice", confidence=0.9).fact.fact_id
    clock.advance(days=30)
    assert mem.maintain().pruned == ()  # not older than 30 days yet
    clock.advance(days=1)
    report = mem.maintain()
    assert report.pruned == (weak,)
    assert [f.fact_id for f in mem.facts("alice")] == [strong]
    with pytest.raises(MessageNotFoundError):
        mem.get(weak)


def test_decay_then_prune_with_custom_thresholds(clock: Clock) -> None:
    mem = FactMemory(
        HashingEmbedder(),
        clock=clock,
        decay_factor=0.5,
        decay_after=timedelta(days=1),
        prune_below=0.2,
        prune_after=timedelta(days=2),
    )
    fid = mem.add("User plays chess", subject="u", confidence=0.8).fact.fact_id
    clock.advance(days=2)
    mem.maintain()
    assert mem.get(fid).confidence == pytest.approx(0.2)
    clock.advance(days=1)
    assert mem.maintain().pruned == (fid,)


def test_contradiction_invalidates_and_keeps_history(mem: FactMemory, clock: Clock) -> None:
    paris = mem.add("User lives in Paris", subject="alice", slot="home").fact
    clock.advance(days=10)
    change = mem.add("User lives in Berlin", subject="alice", slot="home")
    assert change.action == "superseded"
    berlin = change.fact
    (old,) = change.invalidated
    assert old.fact_id == paris.fact_id
    assert old.invalid_at == T0 + timedelta(days=10)
    assert [f.text for f in mem.facts("alice")] == ["User lives in Berlin"]
    assert [f.text for f in mem.facts("alice", include_invalid=True)] == [
        "User lives in Paris",
        "User lives in Berlin",
    ]
    for fid in (paris.fact_id, berlin.fact_id):
        assert [f.text for f in mem.history(fid)] == ["User lives in Paris", "User lives in Berlin"]
    assert [f.text for f in mem.as_of(T0 + timedelta(days=5), "alice")] == ["User lives in Paris"]
    assert [f.text for f in mem.as_of(T0 + timedelta(days=10), "alice")] == ["User lives in Berlin"]
    assert mem.as_of(T0 - timedelta(days=1)) == []
    # a third value extends the chain
    clock.advance(days=10)
    mem.add("User lives in Rome", subject="alice", slot="home")
    assert [f.text for f in mem.history(paris.fact_id)] == [
        "User lives in Paris",
        "User lives in Berlin",
        "User lives in Rome",
    ]
    # the invalid one is not searched by default, but is with include_invalid
    hits = mem.search("lives in Paris", k=5, min_score=0.0, subject="alice")
    assert "User lives in Paris" not in [h.text for h in hits]
    hits = mem.search("lives in Paris", k=1, min_score=0.0, include_invalid=True)
    assert hits[0].text == "User lives in Paris"


def test_contradiction_decided_by_a_custom_rule_over_cosine_candidates(clock: Clock) -> None:
    calls = []

    def rule(existing, candidate):  # type: ignore[no-untyped-def]
        calls.append((existing.text, candidate.text))
        return candidate.text.endswith("no more")

    old = "User likes very spicy Thai curry from the night market stalls in Bangkok"
    mem = FactMemory(HashingEmbedder(), clock=clock, contradicts=rule)
    mem.add(old, subject="u")
    mem.add("Completely unrelated statement about boats", subject="u")
    # cosine 0.93: without the rule, a reinforcement
    change = mem.add(old + " no more", subject="u")
    assert change.action == "superseded"
    assert [f.text for f in change.invalidated] == [old]
    # only the cosine >= 0.80 candidate was asked, not the unrelated fact
    assert calls == [(old, old + " no more")]
    assert mem.add(old + " no more", subject="u").action == "reinforced"


def test_forget_is_a_real_delete_and_unlinks_history(clock: Clock, tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = SQLiteStore(tmp_path / "f.db")
    mem = FactMemory(HashingEmbedder(), store=store, clock=clock)
    old = mem.add("User lives in Paris", subject="alice", slot="home").fact
    new = mem.add("User lives in Oslo", subject="alice", slot="home").fact
    assert mem.forget(old.fact_id) is True
    assert mem.forget(old.fact_id) is False
    assert mem.history(new.fact_id) == [mem.get(new.fact_id)]
    assert mem.get(new.fact_id).supersedes is None
    texts = [m.text for k in store.list_keys() for m in store.load_messages(k)]
    assert texts == ["User lives in Oslo"]
    assert mem.forget_subject("alice") == 1
    assert store.list_keys() == []
    store.close()


def test_restart_persistence_sqlite(clock: Clock, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "facts.db"
    store = SQLiteStore(path)
    mem = FactMemory(HashingEmbedder(), store=store, clock=clock, namespace="app")
    mem.add("User lives in Paris", subject="alice", slot="home", source_ids=["m1"])
    clock.advance(days=3)
    mem.add("User lives in Berlin", subject="alice", slot="home")
    mem.add("User likes jazz", subject="bob")
    mem.add("User likes jazz", subject="bob")
    before = {f.fact_id: f for s in mem.subjects() for f in mem.facts(s, include_invalid=True)}
    store.close()

    store = SQLiteStore(path)
    again = FactMemory(HashingEmbedder(), store=store, clock=clock, namespace="app")
    after = {f.fact_id: f for s in again.subjects() for f in again.facts(s, include_invalid=True)}
    assert after == before
    assert again.subjects() == ["alice", "bob"]
    assert again.facts("bob")[0].confidence == pytest.approx(0.8)
    assert again.search("jazz", k=1, min_score=0.0)[0].text == "User likes jazz"
    assert [f.text for f in again.as_of(T0 + timedelta(days=1), "alice")] == ["User lives in Paris"]
    # another embedder: vectors are recomputed on open, not mixed
    other = FactMemory(HashingEmbedder(64), store=store, clock=clock, namespace="app")
    assert all(f.embedder == HashingEmbedder(64).name for f in other.facts("alice"))
    store.close()


def test_retention_never_deletes_facts(clock: Clock) -> None:
    store = InMemoryStore()
    mem = FactMemory(HashingEmbedder(), store=store, clock=clock)
    mem.add("User's name is Alice", subject="alice")
    deleted = store.enforce_retention(ttl=timedelta(seconds=1), now=T0 + timedelta(days=999))
    assert deleted == 0
    assert len(FactMemory(HashingEmbedder(), store=store)) == 1


def test_search_scores_and_min_score(mem: FactMemory) -> None:
    mem.add("User's sister Clara lives in Lisbon", subject="alice", category="relation")
    mem.add("User works as a nurse", subject="alice", category="identity")
    mem.add("User works as a pilot", subject="bob")
    hits = mem.search("Where does Clara live", k=5, min_score=0.0, subject="alice")
    assert hits[0].text == "User's sister Clara lives in Lisbon"
    assert hits[0].rank == 1
    assert hits[0].bm25_score > 0
    assert all(0 <= h.score <= 1.0 + 1e-9 for h in hits)
    assert mem.search("quantum chromodynamics", k=5) == []  # below the default 0.60
    assert {h.fact.subject for h in mem.search("works as", k=5, min_score=0.0)} == {"alice", "bob"}


def test_the_subject_is_a_keyword_so_mem0s_argument_order_is_refused(mem: FactMemory) -> None:
    # mem0 writes add(user, text) nowhere, but add(text, user_id=...); a user coming from
    # an API with the subject first must get an error, not the fact "alice"
    with pytest.raises(TypeError) as refused:
        mem.add("alice", "I live in Paris")  # type: ignore[arg-type]
    assert "FactMemory.add('I live in Paris', user_id='alice')" in str(refused.value)
    assert "got 2 positional arguments: 'alice', 'I live in Paris'" in str(refused.value)
    assert len(mem) == 0
    with pytest.raises(ValueError, match="exactly one of subject=, user_id= or agent_id="):
        mem.add("User lives in Paris")
    with pytest.raises(ValueError, match="user_id='alice', agent_id='bot'"):
        mem.add("User lives in Paris", user_id="alice", agent_id="bot")
    assert len(mem) == 0
    # mem0's spelling: user_id= / agent_id= name the subject, as subject= does
    assert mem.add("User lives in Paris", user_id="alice", slot="home").fact.subject == "alice"
    assert mem.add("Bot speaks French", agent_id="bot").fact.subject == "bot"
    assert mem.add("User lives in Paris", subject="alice").action == "reinforced"
    assert [f.text for f in mem.facts("alice")] == ["User lives in Paris"]
    hits = mem.search("Where does the user live?", k=3, min_score=0.0, user_id="alice")
    assert [h.fact.subject for h in hits] == ["alice"]
    assert {h.fact.subject for h in mem.search("French", k=3, min_score=0.0)} >= {"bot"}
    with pytest.raises(ValueError, match="at most one of subject="):
        mem.search("Paris", subject="alice", user_id="alice")


def test_boundary_validation_changes_nothing(mem: FactMemory) -> None:
    with pytest.raises(ValueError, match="confidence"):
        mem.add("x", subject="alice", confidence=1.5)
    with pytest.raises(ValueError, match="text"):
        mem.add("   ", subject="alice")
    with pytest.raises(InvalidNameError, match="subject"):
        mem.add("User is ok", subject="bad/name")
    with pytest.raises(ValueError, match="subject"):
        mem.add(FactCandidate(text="User is ok", subject="bob"), subject="alice")
    with pytest.raises(TypeError, match="candidates\\[0\\]"):
        mem.add_many(["plain str"], "alice")  # type: ignore[list-item]
    with pytest.raises(ValueError, match="dedup_threshold"):
        FactMemory(HashingEmbedder(), dedup_threshold=2)
    with pytest.raises(ValueError, match="decay_after"):
        FactMemory(HashingEmbedder(), decay_after=timedelta(0))
    with pytest.raises(ValueError, match="query"):
        mem.search("  ")
    assert len(mem) == 0


async def test_async_twins(mem: FactMemory) -> None:
    await mem.aadd_many([FactCandidate(text="User likes tea")], "alice")
    hits = await mem.asearch("tea", min_score=0.0)
    assert hits[0].text == "User likes tea"


_texts = st.sampled_from(
    [
        "User likes tea",
        "User likes green tea",
        "User lives in Oslo",
        "User lives in Rome",
        "User is a nurse",
        "User plays chess",
    ]
)
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), _texts, st.floats(0, 1), st.sampled_from([None, "home", "x"])),
        st.tuples(st.just("wait"), st.integers(0, 40)),
        st.tuples(st.just("maintain")),
    ),
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(_ops)
def test_confidence_stays_in_unit_interval(ops) -> None:  # type: ignore[no-untyped-def]
    clock = Clock()
    mem = FactMemory(HashingEmbedder(64), clock=clock)
    for op in ops:
        if op[0] == "add":
            mem.add(op[1], subject="u", confidence=op[2], slot=op[3])
        elif op[0] == "wait":
            clock.advance(days=op[1])
        else:
            mem.maintain()
        for f in mem.facts("u", include_invalid=True):
            assert 0.0 <= f.confidence <= 1.0
        assert (
            sum(f.is_valid for f in mem.facts("u", include_invalid=True) if f.slot == "home") <= 1
        )


def test_no_agent_name_reaches_a_subjects_facts(tmp_path):
    """Facts live under an internal key: an agent named like the old key part shares nothing."""
    from marsys_mem import Message
    from marsys_mem.store.keys import parse_key

    store = SQLiteStore(tmp_path / "m.db")
    facts = FactMemory(HashingEmbedder(), store=store, namespace="team")
    facts.add("User lives in Paris", subject="alice", slot="home")
    # a conversation whose key once spelled the facts' key: ("team", "user-facts", "alice")
    store.append_messages(("team", "user-facts", "alice"), [Message.user("I am not a fact")])
    again = FactMemory(HashingEmbedder(), store=store, namespace="team")
    assert [f.text for f in again.facts("alice")] == ["User lives in Paris"]
    kinds = sorted(parse_key(k).kind for k in store.list_keys("team"))
    assert kinds == ["conversation", "user_facts"]
    with pytest.raises(InvalidNameError):
        store.load_messages(("team", "#user-facts", "alice"))  # not spellable by hand
    store.close()
