"""The vectorised hybrid ranking in context equals a plain per-candidate computation.

``RAGMemory._rank_in_context`` scores hundreds of candidates with array operations (thread
neighbours as slot arrays, one batch of cosines, array fusion). The reference here scores
the same candidates one at a time, in plain Python, straight from the definition in the
module docs: same candidates in the same order, same scores, on a corpus with interleaved
threads and removed messages (whose slots are reused).
"""

import itertools
import random

import numpy as np
import pytest

from marsys_mem.model.messages import Message
from marsys_mem.patterns import RAGMemory
from marsys_mem.retrieval.embeddings import HashingEmbedder
from marsys_mem.retrieval.scoring import Candidate, fuse_scores

WORDS = (
    "beagle floppy ears photo jumper coffee machine broken rain novel ramen lunch laptop "
    "battery offsite quarter garden tomato bike repair train ticket Lisbon sister piano "
    "recital marathon knee doctor allergy peanuts concert tickets Saturday yesterday July"
).split()


def _corpus(seed: int) -> list[Message]:
    rng = random.Random(seed)
    return [
        Message.user(
            " ".join(rng.choices(WORDS, k=rng.randint(3, 12))),
            name=rng.choice(["maya", "jonas", "priya"]),
            metadata={"thread": f"t{rng.randint(0, 30)}"},
        )
        for _ in range(700)
    ]


def _reference(mem: RAGMemory, query: str, qvec: np.ndarray, depth: int) -> list[Candidate]:
    """The ranking in context, one candidate at a time."""
    assert mem._index is not None
    ids, scores = mem._index.search(qvec, depth)
    dense = list(zip(ids[0], scores[0].tolist(), strict=False))
    bm25 = mem._bm25.search(query, depth)
    links = mem._links
    reply = 1 if mem.ranking.reply_weight and mem.ranking.context_turns else 0
    seeds = dict.fromkeys(itertools.chain((i for i, _ in dense), (i for i, _ in bm25)))
    cands = links.around(seeds, before=reply, after=min(mem.ranking.context_turns, 2))

    def cosine(mid: str) -> float | None:
        if mid not in mem._index:
            return None
        return float(mem._index.vectors([mid])[0] @ qvec[0])

    def keywords(mid: str) -> float:
        return mem._bm25.score_docs(query, [mid])[mid]

    # a neighbour lends what it scores above the candidates' mean (0.0 if below)
    mean_d = sum(cosine(m) or 0.0 for m in cands) / len(cands)
    mean_b = sum(keywords(m) for m in cands) / len(cands)

    def lent_d(mid: str) -> float:
        return max(0.0, (cosine(mid) or 0.0) - mean_d)

    def lent_b(mid: str) -> float:
        return max(0.0, keywords(mid) - mean_b)

    dense_of: dict[str, float] = {}
    bm25_of: dict[str, float] = {}
    for mid in cands:
        d, b = cosine(mid) or 0.0, keywords(mid)
        for step, other in enumerate(links.before(mid, mem.ranking.context_turns), 1):
            d += mem.ranking.context_weight**step * lent_d(other)
            b += mem.ranking.context_weight**step * lent_b(other)
        for other in links.after(mid, reply):
            d += mem.ranking.reply_weight * lent_d(other)
            b += mem.ranking.reply_weight * lent_b(other)
        if mem.ranking.fusion == "convex":
            cw = mem.ranking.context_weight
            turns, reply = mem.ranking.context_turns, mem.ranking.reply_weight
            d /= 1.0 + sum(cw**i for i in range(1, turns + 1)) + reply
        dense_of[mid], bm25_of[mid] = d, b
    # the thread's keyword relevance: what its candidates score above the mean, summed,
    # over the weakest thread's, added to each of its candidates
    relevance: dict[str | None, float] = {}
    for mid in cands:
        thread = links.thread_of(mid)
        relevance[thread] = relevance.get(thread, 0.0) + lent_b(mid)
    if len(relevance) > 1 and mem.ranking.thread_weight:
        weakest = min(relevance.values())
        for mid in cands:
            bm25_of[mid] += mem.ranking.thread_weight * (relevance[links.thread_of(mid)] - weakest)
    dense_list = sorted(
        ((m, dense_of[m]) for m in cands if cosine(m) is not None), key=lambda p: -p[1]
    )
    bm25_list = sorted(((m, bm25_of[m]) for m in cands if bm25_of[m] > 0), key=lambda p: -p[1])
    fused = fuse_scores(
        dense_list,
        bm25_list,
        dense_of,
        bm25_of,
        fusion=mem.ranking.fusion,
        dense_weight=mem.ranking.dense_weight,
        bm25_weight=mem.ranking.bm25_weight,
        rrf_k=mem.ranking.rrf_k,
    )
    return [(mid, f, cosine(mid), keywords(mid)) for mid, f, _, _ in fused]


def _keyword_slots(mem: RAGMemory, query: str, depth: int) -> np.ndarray:
    """The thread slots of the best ``depth`` BM25 hits."""
    return mem._links.slots([mid for mid, _ in mem._bm25.search(query, depth)])


def _tie_groups(ranked: list[Candidate]) -> list[set[str]]:
    """The ranking as runs of candidates with equal fused scores (to 1e-9), best first.

    The score fusions leave equal scores in candidate order and the reference in its
    lists' order; which of two equally scored candidates comes first is not specified.
    """
    groups: list[set[str]] = []
    last = None
    for mid, fused, _, _ in ranked:
        if last is None or abs(fused - last) > 1e-9:
            groups.append(set())
            last = fused
        groups[-1].add(mid)
    return groups


def _check(mem: RAGMemory, rng: random.Random, queries: int, depth: int = 40) -> None:
    for _ in range(queries):
        query = " ".join(rng.choices(WORDS, k=rng.randint(2, 6)))
        qvec = mem._embed_query(query)
        ids, _ = mem._index.search(qvec, depth)  # type: ignore[union-attr]
        dense = mem._links.slots(ids[0])  # the dense hits as thread slots
        scores = mem._index.query_scores(qvec)  # type: ignore[union-attr]
        got = mem._rank_in_context(query, scores, dense, _keyword_slots(mem, query, depth))
        want = _reference(mem, query, qvec, depth)
        assert len(got) > depth
        if mem.ranking.fusion == "rrf":  # ranks: the order of equal scores moves the scores
            assert [c[0] for c in got] == [c[0] for c in want]
        else:  # the same order, but for candidates of equal fused scores
            assert _tie_groups(list(got)) == _tie_groups(want)
            got = sorted(got, key=lambda c: c[0])  # each candidate's scores, by id
            want = sorted(want, key=lambda c: c[0])
        for (_, f, d, b), (_, wf, wd, wb) in zip(got, want, strict=True):
            assert f == pytest.approx(wf, abs=1e-6)
            assert (d is None) == (wd is None)
            assert d == pytest.approx(wd, abs=1e-6)
            assert b == pytest.approx(wb, abs=1e-6)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"fusion": "minmax"},
        {"fusion": "convex"},
        # ranks: scores in context that tie in exact arithmetic (both lists weighing the
        # same, quarter weights, a thread's relevance) differ in the last bit between the
        # reference's sums and the arrays', and a flipped tie moves RRF scores; these
        # weights give no ties on this corpus
        {
            "fusion": "rrf",
            "dense_weight": 1.5,
            "context_turns": 5,
            "context_weight": 0.5,
            "thread_weight": 0.0,
        },
        {"reply_weight": 0.0, "context_turns": 2},
        {"context_turns": 8, "context_weight": 0.9},
        {"thread_weight": 0.0},
        {"thread_weight": 1.0, "context_weight": 0.0, "reply_weight": 0.0},
        {"thread_weight": 1.0, "context_turns": 0},  # the thread only: no neighbours, no reply
    ],
    ids=[
        "zscore",
        "minmax",
        "convex",
        "rrf",
        "no-reply",
        "long-context",
        "no-thread",
        "thread",
        "thread-only",
    ],
)
def test_vectorised_ranking_equals_the_per_candidate_reference(options):
    messages = _corpus(seed=3)
    mem = RAGMemory(HashingEmbedder(), background=False, candidates=40, **options)
    try:
        mem.add_many(messages)
        mem.remove([m.message_id for m in messages[::7]])  # freed slots, relinked threads
        mem.add_many(_corpus(seed=4)[:100])  # reuse the freed slots
        rng = random.Random(5)
        _check(mem, rng, 12)
        # the memoised BM25 slots and vector labels must follow every change: slots freed
        # and reused by other messages, ids removed and added again with another text,
        # vectors replaced, and messages with no vector
        assert mem._index is not None
        mem.remove([m.message_id for m in messages[1::9]])
        mem.add_many(_corpus(seed=6)[:60])
        mem.add_many(
            Message.user(" ".join(rng.choices(WORDS, k=6)), message_id=m.message_id, name="maya")
            for m in messages[1::9][:30]
        )
        shuffled = [m.message_id for m in messages[2::5] if m.message_id in mem._index]
        mem._index.add(shuffled, mem._index.vectors(shuffled[::-1]))  # new labels
        mem._index.remove([m.message_id for m in messages[3::11]])  # no vector now
        _check(mem, rng, 12)
    finally:
        mem.close()


def test_thread_relevance_over_many_sparse_threads_equals_the_reference():
    # thread numbers far apart (thousands of threads, few candidates): the relevance is
    # summed per thread through np.unique rather than by counting numbers directly
    rng = random.Random(8)
    mem = RAGMemory(HashingEmbedder(), background=False, candidates=20)
    try:
        mem.add_many(
            Message.user(
                " ".join(rng.choices(WORDS, k=rng.randint(3, 12))),
                metadata={"thread": f"t{i}" if i % 3 else f"shared{i % 4}"},
            )
            for i in range(3000)
        )
        _check(mem, rng, 8, depth=20)
    finally:
        mem.close()


def test_lazy_candidates_read_like_the_list_they_stand_for():
    """The hybrid ranking hands its candidates over in arrays, made into tuples on reading."""
    mem = RAGMemory(HashingEmbedder(), background=False, candidates=40)
    try:
        mem.add_many(_corpus(seed=7)[:300])
        query = "beagle photo Saturday"
        qvec = mem._embed_query(query)
        ids, _ = mem._index.search(qvec, 40)  # type: ignore[union-attr]
        dense = mem._links.slots(ids[0])  # the dense hits as thread slots
        scores = mem._index.query_scores(qvec)  # type: ignore[union-attr]
        ranked = mem._rank_in_context(query, scores, dense, _keyword_slots(mem, query, 40))
        made = list(ranked)
        assert len(made) == len(ranked) > 40
        assert made[:5] == ranked[:5]
        assert made[-1] == ranked[-1] == ranked[len(made) - 1]
        with pytest.raises(IndexError):
            ranked[len(made)]
        for n in (0, 1, 17, len(made), len(made) + 5):
            head, rest = ranked.split(n)
            assert head == made[:n]
            assert list(rest) == made[n:]
            halved = rest.divided(2.0, head=head)
            assert list(halved) == head + [(m, f / 2.0, d, b) for m, f, d, b in made[n:]]
            assert list(halved.divided(4.0)) == [(m, f / 4.0, d, b) for m, f, d, b in halved]
    finally:
        mem.close()
