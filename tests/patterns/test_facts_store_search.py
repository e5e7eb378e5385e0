"""FactMemory on a PostgreSQL that searches (pgvector + full text): hosts keep no facts.

On the ``pgvector_server`` a FactMemory reads the facts a call needs (one subject's) and
lets them go, stores each fact's vector with it, and searches through the database. So a
second host supersedes a fact the first host added a moment ago, and every host sees
forget and deletion cascades at once.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from marsys_mem.model.messages import Message
from marsys_mem.patterns import FactMemory
from marsys_mem.patterns.user_facts import FactCandidate
from marsys_mem.retrieval.embeddings import HashingEmbedder
from marsys_mem.store.keys import subject_facts_key
from marsys_mem.store.postgres import PostgresStore
from marsys_mem.testing.postgres import PostgresServer

_names = itertools.count()
CHAT = ("default", "alice", "main")


@pytest.fixture
def pg_dsn(pgvector_server: PostgresServer) -> str:
    return pgvector_server.create_schema(f"facts{next(_names)}")


@pytest.fixture
def stores(pg_dsn: str) -> Iterator[tuple[PostgresStore, PostgresStore]]:
    """Two stores on one database: two hosts."""
    with (
        PostgresStore(pg_dsn, max_size=2) as a,
        PostgresStore(pg_dsn, max_size=2) as b,
    ):
        yield a, b


def _holds_nothing(facts: FactMemory) -> None:
    assert facts.stateless
    assert facts._facts == {}
    assert facts._vectors == {}
    assert len(facts._bm25) == 0


def test_facts_are_read_per_call_and_searched_in_the_database(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    store, _ = stores
    now = [datetime(2025, 1, 1, tzinfo=UTC)]
    facts = FactMemory(HashingEmbedder(64), store=store, clock=lambda: now[0])
    assert facts.add("User lives in Paris", subject="alice", slot="home").action == "added"
    assert facts.add("User lives in Paris", subject="alice", slot="home").action == "reinforced"
    facts.add("User likes green tea", subject="alice", category="preference")
    facts.add("User's name is Bob", subject="bob", slot="name")
    _holds_nothing(facts)
    now[0] += timedelta(days=30)
    change = facts.add("User lives in Berlin", subject="alice", slot="home")
    assert change.action == "superseded"
    assert [f.text for f in change.invalidated] == ["User lives in Paris"]
    _holds_nothing(facts)
    assert len(facts) == 4
    assert facts.subjects() == ["alice", "bob"]
    assert [f.text for f in facts.facts("alice")] == [
        "User likes green tea",
        "User lives in Berlin",
    ]
    history = facts.history(change.fact.fact_id)
    assert [f.text for f in history] == ["User lives in Paris", "User lives in Berlin"]
    then = facts.as_of(datetime(2025, 1, 15, tzinfo=UTC), "alice")
    assert sorted(f.text for f in then) == ["User likes green tea", "User lives in Paris"]
    hit = facts.search("Where does the user live?", k=1, min_score=0.1)[0]
    assert hit.text == "User lives in Berlin"
    only_bob = facts.search("green tea", k=5, min_score=None, subject="bob")
    assert [h.fact.subject for h in only_bob] == ["bob"]
    assert facts.get(change.fact.fact_id).text == "User lives in Berlin"
    _holds_nothing(facts)
    # every fact's vector is in the store, beside its record
    stored = store.load_vectors(subject_facts_key("default", "alice"), facts.embedder.name)
    assert len(stored.message_ids) == 3
    now[0] += timedelta(days=8)
    assert len(facts.maintain().decayed) == 3  # every valid fact decays once
    _holds_nothing(facts)


def test_a_second_host_sees_and_supersedes_the_first_hosts_facts_at_once(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    store_a, store_b = stores
    a = FactMemory(HashingEmbedder(64), store=store_a)
    b = FactMemory(HashingEmbedder(64), store=store_b)  # opened before a adds anything
    paris = a.add("User lives in Paris", subject="alice", slot="home").fact
    assert b.search("where does the user live", k=1, min_score=0.1)[0].fact.fact_id == paris.fact_id
    change = b.add("User lives in Berlin", subject="alice", slot="home")
    assert change.action == "superseded"
    assert [f.fact_id for f in change.invalidated] == [paris.fact_id]
    assert [f.text for f in a.facts("alice")] == ["User lives in Berlin"]
    assert a.forget(change.fact.fact_id)
    assert [h.text for h in b.search("Berlin", k=3, min_score=0.0)] == []
    assert not b.forget(change.fact.fact_id)
    _holds_nothing(a)
    _holds_nothing(b)


def test_a_fact_goes_with_its_source_message_on_every_host(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    store_a, store_b = stores
    said = Message.user("I am allergic to peanuts")
    store_a.append_messages(CHAT, [said])
    a = FactMemory(HashingEmbedder(64), store=store_a)
    b = FactMemory(HashingEmbedder(64), store=store_b)
    [change] = a.add_many(
        [a_candidate("User is allergic to peanuts", said.message_id)],
        "alice",
        source_key=CHAT,
        stored_sources=True,
    )
    assert b.search("peanut allergy", k=1, min_score=None)[0].fact.fact_id == change.fact.fact_id
    store_b.delete_messages(CHAT, [said.message_id])  # forgotten at the source
    assert b.search("peanut allergy", k=1, min_score=None) == []
    assert len(a) == 0


def a_candidate(text: str, source: str) -> FactCandidate:
    return FactCandidate(text=text, category="identity", source_ids=(source,))


def test_facts_stored_before_the_store_searched_get_their_vectors(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    store, _ = stores
    store.supports_search = False  # as the store was before pgvector came (the old path)
    old = FactMemory(HashingEmbedder(64), store=store)
    fid = old.add("User lives in Paris", subject="alice", slot="home").fact.fact_id
    assert not old.stateless
    store.supports_search = True
    key = subject_facts_key("default", "alice")
    assert store.load_vectors(key, old.embedder.name).message_ids == ()
    new = FactMemory(HashingEmbedder(64), store=store)
    assert [f.fact_id for f in new.facts("alice")] == [fid]  # reading the subject stores it
    assert list(store.load_vectors(key, old.embedder.name).message_ids) == [fid]
    hits = new.search("where does the user live", k=1, min_score=0.1)
    assert [h.fact.fact_id for h in hits] == [fid]
