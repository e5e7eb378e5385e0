"""The ranking as pure functions over arrays (rank_in_context, cue_scores): no memory."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marsys_mem.model.ranking import Ranking
from marsys_mem.retrieval.scoring import (
    context_rows,
    cue_scores,
    fuse_members,
    rank_in_context,
)

FLAT = Ranking(context_turns=0, thread_weight=0)


def _arrays(cosines, bm25, has_vec=None):
    """``own`` and ``has_vec`` for messages 0 .. n - 1, with the "no such turn" column."""
    n = len(cosines)
    own = np.zeros((2, n + 1))
    own[0, :n], own[1, :n] = cosines, bm25
    vec = np.zeros(n + 1, dtype=bool)
    vec[:n] = True if has_vec is None else has_vec
    return own, vec


def _chain_grid(n, before, after):
    """Candidates 0 .. n - 1 in one thread, in order: the turn before i is i - 1."""
    none = n
    rows = [np.arange(n)]
    rows += [
        np.array([i - d if i - d >= 0 else none for i in range(n)]) for d in range(1, before + 1)
    ]
    rows += [np.array([i + 1 if i + 1 < n else none for i in range(n)])] * after
    return np.array(rows, dtype=np.intp)


def test_without_context_it_is_the_fusion_of_the_own_scores():
    own, vec = _arrays([0.9, 0.2, 0.5, 0.1], [0.0, 4.0, 1.0, 0.0])
    order, fused = rank_in_context(own, vec, _chain_grid(4, 0, 0), None, FLAT)
    expected_order, expected = fuse_members(
        np.arange(4), own[:, :4], bm25_top=4.0, dense_weight=1.3, bm25_weight=1.0
    )
    assert order.tolist() == expected_order.tolist()
    assert fused.tolist() == expected.tolist()


def test_a_reply_is_found_through_the_turn_it_answers():
    """Turn 2 ("Yes! That's the one") matches nothing; the turn before it matches well."""
    own, vec = _arrays([0.1, 0.8, 0.1, 0.1, 0.1], [0.0, 5.0, 0.0, 0.0, 0.0])
    in_context = Ranking(context_turns=1, reply_weight=0, thread_weight=0)
    before, after = context_rows(in_context)
    order, _ = rank_in_context(own, vec, _chain_grid(5, before, after), None, in_context)
    assert order.tolist()[:2] == [1, 2]  # the reply comes right after its question
    flat_order, _ = rank_in_context(own, vec, _chain_grid(5, 0, 0), None, FLAT)
    assert flat_order.tolist()[0] == 1
    assert flat_order.tolist()[1] != 2  # alone, it ties with the other chatter


def test_a_neighbour_below_the_mean_lends_nothing():
    own, vec = _arrays([0.5, 0.1, 0.5, 0.9], [1.0, 0.0, 1.0, 2.0])
    ranking = Ranking(context_turns=1, reply_weight=0, thread_weight=0)
    # candidates 0 and 2 are alike; 2 follows 1, which is below the mean on both sides
    order, fused = rank_in_context(own, vec, _chain_grid(4, 1, 0), None, ranking)
    by = dict(zip(order.tolist(), fused.tolist(), strict=True))
    assert by[2] == pytest.approx(by[0])


def test_thread_relevance_lifts_the_thread_the_query_is_about():
    # two threads of two candidates each; thread 0 holds the keyword matches
    own, vec = _arrays([0.3, 0.3, 0.3, 0.3], [3.0, 2.0, 0.0, 0.1])
    grid = np.array([[0, 1, 2, 3]], dtype=np.intp)
    ranking = Ranking(context_turns=0, thread_weight=0.5)
    flat_order, flat = rank_in_context(own, vec, grid, None, ranking)
    one_thread = rank_in_context(own, vec, grid, np.zeros(4, dtype=np.intp), ranking)
    assert one_thread[0].tolist() == flat_order.tolist()  # one thread: nothing changes
    assert one_thread[1].tolist() == flat.tolist()
    threads = np.array([0, 0, 1, 1], dtype=np.intp)
    order, fused = rank_in_context(own, vec, grid, threads, ranking)
    spread = dict(zip(order.tolist(), fused.tolist(), strict=True))
    base = dict(zip(flat_order.tolist(), flat.tolist(), strict=True))
    assert spread[1] - spread[3] > base[1] - base[3]  # thread 0 moved away from thread 1
    # sparse thread numbers (far apart) give the same result
    far = rank_in_context(own, vec, grid, np.array([5, 5, 10**9, 10**9], dtype=np.intp), ranking)
    assert far[0].tolist() == order.tolist()
    assert far[1].tolist() == fused.tolist()


@pytest.mark.parametrize("fusion", ["zscore", "minmax", "convex", "rrf"])
def test_every_fusion_ranks_the_candidates_of_either_side(fusion):
    # candidate 0 has no vector, and no keyword match itself or lent by a turn: on neither side
    own, vec = _arrays([0.0, 0.9, 0.2, 0.0], [0.0, 0.0, 4.0, 1.0], [False, True, True, False])
    ranking = Ranking(fusion=fusion)
    before, after = context_rows(ranking)
    order, fused = rank_in_context(own, vec, _chain_grid(4, before, after), None, ranking)
    assert sorted(order.tolist()) == [1, 2, 3]
    assert np.all(np.diff(fused) <= 0)  # best first
    assert float(fused.max()) <= 1.0 + 1e-12


def test_no_candidates_rank_to_nothing():
    own, vec = _arrays([], [])
    order, fused = rank_in_context(own, vec, np.zeros((4, 0), dtype=np.intp), None, Ranking())
    assert len(order) == 0
    assert len(fused) == 0


def _reference_context(own, grid, ranking):
    """The scores in context, one candidate at a time (what rank_in_context vectorises)."""
    before, after = context_rows(ranking)
    n = grid.shape[1]
    cand = grid[0]
    mean = own[:, cand].mean(axis=1)
    ctx = np.zeros((2, n))
    for j in range(n):
        for side in range(2):
            total = own[side, cand[j]]
            for row in range(1, 1 + before + after):
                at = grid[row, j]
                if at == own.shape[1] - 1:
                    continue
                weight = ranking.context_weight**row if row <= before else ranking.reply_weight
                total += weight * max(0.0, own[side, at] - mean[side])
            ctx[side, j] = total
    return ctx


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 12),
    turns=st.integers(0, 4),
    reply=st.sampled_from([0.0, 0.25]),
    weight=st.sampled_from([0.0, 0.25, 0.6]),
    seed=st.integers(0, 10_000),
)
def test_the_vectorised_context_equals_the_loop(n, turns, reply, weight, seed):
    rng = np.random.default_rng(seed)
    own, vec = _arrays(rng.uniform(-0.1, 1.0, n), rng.choice([0.0, 0.5, 2.0, 7.0], n))
    ranking = Ranking(
        context_turns=turns, context_weight=weight, reply_weight=reply, thread_weight=0
    )
    grid = _chain_grid(n, *context_rows(ranking))
    ctx = _reference_context(own, grid, ranking)
    members = (vec[grid[0]] | (ctx[1] > 0)).nonzero()[0]
    expected_order, expected = fuse_members(
        members, ctx, bm25_top=max(float(ctx[1].max()), 0.0), dense_weight=1.3, bm25_weight=1.0
    )
    order, fused = rank_in_context(own, vec, grid, None, ranking)
    assert fused == pytest.approx(expected, abs=1e-9)
    ties = len(np.unique(np.round(expected, 9))) < len(expected)
    if not ties:
        assert order.tolist() == expected_order.tolist()


def test_no_cue_changes_nothing():
    scores = np.array([1.0, 0.8, 0.3])
    order, adjusted, norm = cue_scores(scores, Ranking())
    assert order.tolist() == [0, 1, 2]
    assert adjusted.tolist() == scores.tolist()
    assert norm == 1.0


def test_a_cue_lifts_the_candidates_that_have_it_and_everything_is_divided_alike():
    ranking = Ranking()
    scores = np.array([1.0, 0.9, 0.8, 0.5, 0.2])
    # the speaker cue looked at the first three; the others keep their order after them
    order, adjusted, norm = cue_scores(scores, ranking, speaker=np.array([False, False, True]))
    assert norm == 1.0 + ranking.speaker_weight
    assert order.tolist() == [2, 0, 1, 3, 4]
    assert adjusted.tolist() == pytest.approx(
        [(0.8 + 0.5) / 1.5, 1 / 1.5, 0.9 / 1.5, 0.5 / 1.5, 0.2 / 1.5]
    )
    # every cue the query has counts in the divisor, whichever candidates have it
    _, _, norm = cue_scores(
        scores,
        ranking,
        speaker=np.zeros(2, bool),
        period=np.zeros(2, bool),
        when=np.zeros(2, bool),
        tells=np.zeros(2, bool),
    )
    assert norm == pytest.approx(
        1.0
        + ranking.speaker_weight
        + ranking.time_weight
        + ranking.when_weight
        + ranking.question_weight
    )


def test_a_cue_may_be_a_share_and_its_bonus_scales_with_the_best_score():
    ranking = Ranking(question_weight=0.2)
    scores = np.array([2.0, 1.8])
    order, adjusted, norm = cue_scores(scores, ranking, tells=np.array([0.0, 0.5]))
    assert norm == 1.2
    assert order.tolist() == [0, 1]
    assert adjusted.tolist() == pytest.approx([2.0 / 1.2, (1.8 + 0.1 * 2.0) / 1.2])
    # a zero weight cue adds nothing
    order, adjusted, _ = cue_scores(scores, Ranking(question_weight=0), tells=np.array([0, 1.0]))
    assert adjusted.tolist() == scores.tolist()
