"""Calibrated scores: one meaning for every query, memory and store; one default min_score.

A nonsense query's best hit scores below :data:`DEFAULT_MIN_SCORE` while a real match
scores above it, on a small synthetic corpus, in-process and through a store (SQLite;
pgvector's in-database search where PostgreSQL with pgvector is installed), with the
hashing embedder and with the packaged MiniLM model.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import pytest

from marsys_mem.model.messages import Message
from marsys_mem.patterns import RAGMemory
from marsys_mem.patterns.user_facts import FactMemory
from marsys_mem.retrieval.bm25 import BM25Index, tokenize
from marsys_mem.retrieval.calibration import (
    DEFAULT_MIN_SCORE,
    EVIDENCE_DEPTH,
    HYBRID,
    Calibration,
    bm25_ceiling,
    calibrated,
    fit_calibration,
    nonsense_queries,
)
from marsys_mem.retrieval.embeddings import Embedder, HashingEmbedder
from marsys_mem.store.sqlite import SQLiteStore
from marsys_mem.testing.postgres import PostgresServer

CORPUS = [
    "I parked the car on level 4 of the airport garage",
    "My sister Clara lives in Lisbon near the river",
    "The tracking number of the printer order is QX-7781",
    "Lovely weather today, we should go for a walk",
    "The quarterly report is due on Friday",
    "We had pizza with mushrooms for dinner yesterday",
    "My puppy is called Biscuit and he loves the beach",
    "The dentist appointment moved to Tuesday morning",
    "Can you send me the slides from the kickoff meeting?",
    "I started learning the cello last winter",
    "Our flight to Osaka leaves at seven in the evening",
    "The plumber fixed the leaking kitchen sink",
]

REAL = {
    "Where did I park the car?": 0,
    "Where does Clara live?": 1,
    "QX-7781": 2,
    "When is the quarterly report due?": 4,
    "What did we eat for dinner, pizza?": 5,
    "What is the puppy called?": 6,
}

WORDS = [
    "walrus", "tundra", "glacier", "harpsichord", "obelisk", "quinoa", "zeppelin",
    "marmalade", "trombone", "volcano", "abacus", "lagoon", "meteor", "saxophone",
    "porcupine", "cathedral", "lantern", "nebula", "origami", "parsnip",
]  # fmt: skip


def _nonsense() -> list[str]:
    known = {t for text in CORPUS for t in tokenize(text)}
    return nonsense_queries(40, WORDS, known, seed=27)


def _check(mem: RAGMemory) -> None:
    """Nonsense queries' best hits below the default, real matches' above it."""
    for query in _nonsense():
        best = mem.search(query, k=3, min_score=None)
        assert best, query  # the ranker always has something to offer ...
        assert best[0].score < DEFAULT_MIN_SCORE, (query, best[0])  # ... that is no match
        assert mem.search(query, k=3) == []  # the default threshold leaves it out
    for query, index in REAL.items():
        hits = mem.search(query, k=3)
        assert hits, query
        assert hits[0].text == CORPUS[index], query
        assert hits[0].score >= DEFAULT_MIN_SCORE, (query, hits[0])


# --------------------------------------------------------------------- the pieces


def test_calibrated_scores_fall_in_ranking_order_and_keep_it() -> None:
    rng = np.random.default_rng(7)
    for _ in range(50):
        fused = np.sort(rng.random(15))[::-1].tolist()
        dense = rng.uniform(-0.1, 0.9, 15).tolist()
        bm25 = rng.uniform(0.0, 9.0, 15).tolist()
        scores = calibrated(fused, dense, bm25, 20.0)
        assert all(0.0 <= s <= 1.0 for s in scores)
        assert scores == sorted(scores, reverse=True)


def test_hybrid_evidence_is_pooled_over_the_first_hits_only() -> None:
    first = [1.0] + [0.9] * (EVIDENCE_DEPTH - 1)
    later = calibrated([*first, 0.5], [0.1] * EVIDENCE_DEPTH + [0.95], [0.0] * 11, 10.0)
    alone = calibrated(first, [0.1] * EVIDENCE_DEPTH, [0.0] * EVIDENCE_DEPTH, 10.0)
    assert later[:EVIDENCE_DEPTH] == alone  # a strong hit past the first 10 lends nothing


def test_missing_sides_count_as_no_evidence() -> None:
    assert calibrated([], [], [], 0.0) == []
    no_vector = calibrated([1.0], [None], [None], 0.0)
    assert no_vector == pytest.approx([1 / (1 + np.exp(-HYBRID.bias))])
    assert calibrated([3.0], [None], [3.0], 0.0, mode="bm25")[0] < DEFAULT_MIN_SCORE


def test_bm25_ceiling_is_the_score_of_a_message_matching_every_term_many_times() -> None:
    index = BM25Index()
    index.add_many([(str(i), text) for i, text in enumerate(CORPUS)])
    index.add("many", "Clara Clara Clara Clara Clara Clara Clara Clara Clara Lisbon " * 30)
    query = "Clara in Lisbon"
    ceiling = bm25_ceiling(index.doc_freqs(query).values(), len(index), index.k1)
    best = index.search(query, k=1)[0]
    assert best[0] == "many"
    assert 0.8 * ceiling < best[1] < ceiling
    # a word no message holds is part of the query nothing matches: the ceiling grows
    more = bm25_ceiling(index.doc_freqs(query + " zeppelin").values(), len(index), index.k1)
    assert more > ceiling
    assert bm25_ceiling(index.doc_freqs("the a x").values(), len(index), index.k1) == 0.0


def test_fit_calibration_finds_where_relevance_starts() -> None:
    rng = np.random.default_rng(3)
    cos = rng.uniform(0.0, 1.0, 4000)
    relevant = rng.random(4000) < 1 / (1 + np.exp(-(12 * cos - 6)))
    features = np.stack([np.zeros(4000), cos, np.zeros(4000)], axis=1)
    cal = fit_calibration(features, relevant, np.ones(4000))
    assert isinstance(cal, Calibration)
    assert cal.dense == pytest.approx(12, rel=0.2)
    assert -cal.bias / cal.dense == pytest.approx(0.5, abs=0.05)


def test_nonsense_queries_are_reproducible_and_share_no_word_with_the_memory() -> None:
    queries = _nonsense()
    assert queries == _nonsense()
    assert len(queries) == 40
    assert sum(len(q) == 1 for q in queries) == 8  # single letters
    known = {t for text in CORPUS for t in tokenize(text)}
    for q in queries:
        assert not known.intersection(tokenize(q)), q


# --------------------------------------------------------------------- memories


def test_nonsense_scores_below_the_default_and_real_matches_above() -> None:
    with RAGMemory(HashingEmbedder(), background=False) as mem:
        mem.add_many(CORPUS)
        _check(mem)
        # the old per-query scale gave "x" 1.0; raw sides stay on the hit
        hit = mem.search("x", k=1, min_score=None)[0]
        assert hit.fused > 0.9  # near the best there is, whatever it matched (cues aside)
        assert hit.bm25_score == 0.0
        assert hit.dense_score is not None


def test_a_hits_score_does_not_depend_on_k() -> None:
    with RAGMemory(HashingEmbedder(), background=False) as mem:
        mem.add_many(CORPUS)
        for query in ["Where did I park the car?", "Clara", "x"]:
            one = mem.search(query, k=1, min_score=None)[0]
            many = mem.search(query, k=12, min_score=None)
            assert many[0].score == pytest.approx(one.score)
            assert [h.score for h in many] == sorted((h.score for h in many), reverse=True)


@pytest.mark.parametrize("mode", ["dense", "bm25"])
def test_single_side_modes_are_calibrated_too(mode: str) -> None:
    with RAGMemory(HashingEmbedder(), background=False) as mem:
        mem.add_many(CORPUS)
        hits = mem.search("Where did I park the car?", k=5, min_score=None, mode=mode)  # type: ignore[arg-type]
        assert hits[0].text == CORPUS[0]
        assert hits[0].fused == (hits[0].dense_score if mode == "dense" else hits[0].bm25_score)
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        assert mem.search("qzvoe mprk", k=3, mode=mode) == []  # type: ignore[arg-type]


def test_a_store_gives_the_same_scores(tmp_path) -> None:
    with SQLiteStore(tmp_path / "m.db") as store:
        with RAGMemory(HashingEmbedder(), store=store, background=False) as stored:
            stored.add_many(CORPUS)
        with (
            RAGMemory(HashingEmbedder(), store=store, background=False) as reopened,
            RAGMemory(HashingEmbedder(), background=False) as plain,
        ):
            plain.add_many(CORPUS)
            _check(reopened)
            for query in [*REAL, "x", "walrus glacier"]:
                a = reopened.search(query, k=5, min_score=None)
                b = plain.search(query, k=5, min_score=None)
                assert [h.score for h in a] == pytest.approx([h.score for h in b])


_names = itertools.count()


@pytest.fixture
def pg_store(pgvector_server: PostgresServer) -> Iterator[object]:
    from marsys_mem.store.postgres import PostgresStore

    with PostgresStore(pgvector_server.create_schema(f"cal{next(_names)}"), max_size=4) as s:
        yield s


def test_the_database_search_gives_the_same_scale(pg_store) -> None:
    """pgvector's in-database search: BM25 from the database's statistics, same scores."""
    assert pg_store.supports_search
    with (
        RAGMemory(HashingEmbedder(), store=pg_store) as mem,
        RAGMemory(HashingEmbedder(), background=False) as plain,
    ):
        assert mem.stateless
        mem.add_many(Message.user(text) for text in CORPUS)
        plain.add_many(CORPUS)
        _check(mem)
        for query in [*REAL, "x", "walrus glacier"]:
            a = mem.search(query, k=3, min_score=None)
            b = plain.search(query, k=3, min_score=None)
            if query in REAL:  # (nonsense: ties among equally weak hits may swap)
                assert [h.text for h in a] == [h.text for h in b], query
            # (the database's statistics: BM25's average length from a sample of turns)
            assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=0.05)


def test_facts_are_scored_on_the_same_scale() -> None:
    with FactMemory(HashingEmbedder()) as facts:
        for text in CORPUS:
            facts.add(text, subject="u")
        for query in _nonsense():
            assert facts.search(query, subject="u") == []
            best = facts.search(query, subject="u", min_score=None)[0]
            assert best.score < DEFAULT_MIN_SCORE
        hit = facts.search("Where does Clara live?", subject="u")[0]
        assert hit.text == CORPUS[1]
        assert hit.score >= DEFAULT_MIN_SCORE


# --------------------------------------------------------------------- the real model


@pytest.fixture(scope="module")
def minilm() -> Embedder:
    pytest.importorskip("sentence_transformers", reason="needs the embeddings extra")
    from marsys_mem.retrieval.embeddings import SentenceTransformerEmbedder

    emb = SentenceTransformerEmbedder()
    emb.embed(["warm up"])
    return emb


def test_the_packaged_model_scores_nonsense_below_and_matches_above(minilm: Embedder) -> None:
    with RAGMemory(minilm, background=False) as mem:
        mem.add_many(CORPUS)
        _check(mem)
