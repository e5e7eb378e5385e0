"""Search hits, filters and rank fusion: the scoring half of retrieval, with no state.

:class:`~marsys_mem.patterns.rag.RAGMemory` (and the patterns built on it) use these:

* :class:`ScoredMessage`: one hit, with the score it is ranked by and both retrievers'.
* :func:`make_filter`: the agent / role / time / metadata predicate of a search.
* :func:`fuse_scores`: the hybrid ranking of a dense and a BM25 candidate list, by the
  weighted mean of both sides' standard scores (``"zscore"``), weighted reciprocal rank
  fusion (``"rrf"``), a convex blend of the scores (``"convex"``) or of the min-max
  normalised scores (``"minmax"``).
* :func:`rank_in_context`: the hybrid ranking of candidates scored with the turns around
  them (context, reply, thread relevance) and fused, over arrays, for a
  :class:`~marsys_mem.model.ranking.Ranking`.
* :func:`cue_scores`: the query cues (speaker, time, when, questions) added to the best
  candidates' scores.
* :func:`diversify`: a ranking that spreads the top hits over conversation sessions.
* :func:`check_query`, :func:`positive_int`, :func:`finite_number`: argument checks that
  name the argument and the value.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from marsys_mem.model.messages import Message
from marsys_mem.model.ranking import Ranking
from marsys_mem.retrieval.threads import distinct

__all__ = [
    "FUSIONS",
    "MODES",
    "Candidate",
    "Fusion",
    "MessageFilter",
    "ScoredMessage",
    "SearchMode",
    "check_query",
    "context_rows",
    "cue_scores",
    "diversify",
    "finite_number",
    "fuse_arrays",
    "fuse_members",
    "fuse_scores",
    "make_filter",
    "positive_int",
    "rank_in_context",
]

SearchMode = Literal["hybrid", "dense", "bm25"]
MODES: frozenset[str] = frozenset(("hybrid", "dense", "bm25"))
Fusion = Literal["zscore", "rrf", "convex", "minmax"]
FUSIONS: frozenset[str] = frozenset(("zscore", "rrf", "convex", "minmax"))

Candidate = tuple[str, float, float | None, float | None]
"""A ranked candidate: ``(message_id, score, dense_score, bm25_score)``."""


@dataclass(frozen=True, slots=True)
class ScoredMessage:
    """One search hit.

    Attributes:
        message: the message found.
        score: its calibrated relevance, a probability from 0 to 1 with the same meaning
            for every query, memory and store (:mod:`~marsys_mem.retrieval.calibration`;
            what ``min_score`` compares): it falls in ranking order.
        dense_score: cosine similarity to the query (``None`` in ``bm25`` mode, or when
            the message has no vector yet).
        bm25_score: BM25 score (``None`` in ``dense`` mode).
        rank: 1 for the best hit.
        fused: what the hits were ranked by: the cosine (``dense``), the BM25 score
            (``bm25``) or the fused score, relative to this search's candidates (its best
            near 1.0 whatever it matched: ``hybrid``); ``None`` when not given.

    Example:
        >>> hit = ScoredMessage(Message.user("hi"), score=0.9, dense_score=0.9, rank=1)
        >>> hit.text, hit.score, hit.bm25_score
        ('hi', 0.9, None)
    """

    message: Message
    score: float
    dense_score: float | None = None
    bm25_score: float | None = None
    rank: int = 1
    fused: float | None = None

    @property
    def id(self) -> str:
        """The message's ``message_id``."""
        return self.message.message_id

    @property
    def text(self) -> str:
        """The message's text."""
        return self.message.text


MessageFilter = Callable[[Message], bool]
"""A predicate that keeps a message (``True``) or drops it from the hits."""


def make_filter(
    agent: str | None,
    role: str | None,
    since: datetime | None,
    until: datetime | None,
    metadata: Mapping[str, Any] | None,
) -> MessageFilter | None:
    """The search filter for these criteria (``None`` when there are none).

    Keeps messages whose ``name`` or ``metadata["agent"]`` is ``agent``, whose ``role`` is
    ``role``, with ``since <= timestamp < until`` and whose metadata holds every item of
    ``metadata``.

    Raises:
        ValueError: ``since``/``until`` is not a timezone-aware datetime.
        TypeError: ``metadata`` is not a mapping.
    """
    for name, value in (("since", since), ("until", until)):
        if value is not None and (not isinstance(value, datetime) or value.tzinfo is None):
            raise ValueError(f"{name} must be a timezone-aware datetime, got {value!r}")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise TypeError(f"metadata must be a mapping, got {type(metadata).__name__}")
    if agent is None and role is None and since is None and until is None and not metadata:
        return None
    wanted = dict(metadata or {})

    def keep(m: Message) -> bool:
        if agent is not None and m.name != agent and m.metadata.get("agent") != agent:
            return False
        if role is not None and m.role != role:
            return False
        if since is not None and m.timestamp < since:
            return False
        if until is not None and m.timestamp >= until:
            return False
        return all(key in m.metadata and m.metadata[key] == v for key, v in wanted.items())

    return keep


def finite_number(name: str, value: object, *, minimum: float | None = None) -> float:
    """``value`` as a float, or ``ValueError`` naming ``name`` (not finite, or too small)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return float(value)


def positive_int(name: str, value: object) -> int:
    """``value`` if it is an int >= 1, else ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def check_query(query: object) -> str:
    """``query`` if it is a non-empty string, else ``ValueError`` showing it."""
    if not isinstance(query, str) or not query.strip():
        raise ValueError(f"query must be a non-empty string, got {query!r}")
    return query


def fuse_scores(
    dense: list[tuple[str, float]],
    bm25: list[tuple[str, float]],
    dense_of: Mapping[str, float],
    bm25_of: Mapping[str, float],
    *,
    fusion: Fusion = "rrf",
    dense_weight: float = 1.0,
    bm25_weight: float = 1.0,
    rrf_k: int = 60,
) -> list[Candidate]:
    """Rank the union of two candidate lists by their fused score, best first.

    Args:
        dense: ``(id, cosine)`` from the dense retriever, best first.
        bm25: ``(id, bm25)`` from the keyword retriever, best first.
        dense_of: the cosine of every candidate that has one (at least those in ``dense``).
        bm25_of: the BM25 score of every candidate (at least those in ``bm25``).
        fusion: ``"zscore"``: on each side, a candidate's standard score over the
            candidates (``(score - mean) / std``: how far it stands out), the weighted
            mean of both sides, rescaled so the best candidate scores 1.0 and the weakest
            0.0. A strong match on one side (a rare word only one message holds) stands
            out by many deviations (alone among ``n`` candidates: ``sqrt(n - 1)``) and is
            not drowned by the other side's spread, as it is with ``"minmax"``.
            ``"rrf"``: ``sum(weight / (rrf_k + rank))`` over the lists a candidate is in,
            divided by its maximum (1.0: ranked first by both); ``"convex"``:
            ``(dense_weight * cosine + bm25_weight * bm25 / best_bm25) / (dense_weight +
            bm25_weight)``; ``"minmax"``: the same blend of both scores min-max normalised
            over the candidates (best 1.0, worst 0.0 on each side).
        dense_weight: weight of the dense retriever.
        bm25_weight: weight of BM25.
        rrf_k: the RRF rank offset.

    Returns:
        ``(id, fused, cosine or None, bm25 or None)`` for every candidate, best first.

    Example:
        >>> hits = fuse_scores([("a", 0.9), ("b", 0.5)], [("b", 7.0)],
        ...                    {"a": 0.9, "b": 0.5}, {"a": 0.0, "b": 7.0})
        >>> [(i, round(s, 3)) for i, s, _, _ in hits]
        [('b', 0.992), ('a', 0.5)]
    """
    ids = list(dict.fromkeys(itertools.chain((i for i, _ in dense), (i for i, _ in bm25))))
    pos = {mid: i for i, mid in enumerate(ids)}
    dense_ids = list(dict.fromkeys(mid for mid, _ in dense))  # an id listed twice: once
    bm25_ids = list(dict.fromkeys(mid for mid, _ in bm25))
    order, fused = fuse_arrays(
        np.fromiter((pos[mid] for mid in dense_ids), dtype=np.intp, count=len(dense_ids)),
        np.fromiter((pos[mid] for mid in bm25_ids), dtype=np.intp, count=len(bm25_ids)),
        np.fromiter((dense_of.get(mid, 0.0) for mid in ids), dtype=np.float64, count=len(ids)),
        np.fromiter((bm25_of.get(mid, 0.0) for mid in ids), dtype=np.float64, count=len(ids)),
        fusion=fusion,
        dense_weight=dense_weight,
        bm25_weight=bm25_weight,
        rrf_k=rrf_k,
    )
    ranked = [ids[i] for i in order.tolist()]
    return [
        (mid, f, dense_of.get(mid), bm25_of.get(mid))
        for mid, f in zip(ranked, fused.tolist(), strict=True)
    ]


def fuse_arrays(
    dense_rank: npt.NDArray[np.intp],
    bm25_rank: npt.NDArray[np.intp],
    dense: npt.NDArray[np.float64],
    bm25: npt.NDArray[np.float64],
    *,
    fusion: Fusion = "rrf",
    dense_weight: float = 1.0,
    bm25_weight: float = 1.0,
    rrf_k: int = 60,
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float64]]:
    """The fusion of :func:`fuse_scores`, over arrays: for hundreds of candidates at once.

    The candidates are positions ``0 .. len(dense) - 1``; the result is the same ranking
    and scores as :func:`fuse_scores` with the lists ``[(i, dense[i]) for i in
    dense_rank]`` and ``[(i, bm25[i]) for i in bm25_rank]`` and every candidate's scores.

    Args:
        dense_rank: the dense list, best first (positions of candidates, each once).
        bm25_rank: the BM25 list, best first (each position once).
        dense: the cosine of every candidate (0.0 where it has none).
        bm25: the BM25 score of every candidate.
        fusion: see :func:`fuse_scores`.
        dense_weight: weight of the dense retriever.
        bm25_weight: weight of BM25.
        rrf_k: the RRF rank offset.

    Returns:
        ``(positions, fused)``: the candidates of either list, best first, and their scores.

    Example:
        >>> order, fused = fuse_arrays(np.array([0, 1]), np.array([1]),
        ...                            np.array([0.9, 0.5]), np.array([0.0, 7.0]))
        >>> order.tolist(), [round(f, 3) for f in fused.tolist()]
        ([1, 0], [0.992, 0.5])
    """
    # the candidates of either list, in first-seen order (plain ufuncs: np.unique's
    # Python wrapper alone costs tens of us when the caches are cold, as after a model run)
    in_dense = np.zeros(len(dense), dtype=bool)
    in_dense[dense_rank] = True
    members = np.concatenate([dense_rank, bm25_rank[~in_dense[bm25_rank]]])
    if fusion != "rrf":
        top = float(bm25[bm25_rank[0]]) if len(bm25_rank) else 0.0
        return fuse_members(
            members,
            np.stack([dense, bm25]),
            bm25_top=top,
            fusion=fusion,
            dense_weight=dense_weight,
            bm25_weight=bm25_weight,
        )
    dw, bw = dense_weight, bm25_weight
    norm = (dw + bw) / (rrf_k + 1)
    full = np.zeros(len(dense))
    full[dense_rank] = dw / (rrf_k + np.arange(1, len(dense_rank) + 1)) / norm
    full[bm25_rank] = full[bm25_rank] + bw / (rrf_k + np.arange(1, len(bm25_rank) + 1)) / norm
    fused = full[members]
    order = np.argsort(-fused, kind="stable")
    return members[order], fused[order]


def fuse_members(
    members: npt.NDArray[np.intp],
    scores: npt.NDArray[np.float64],
    *,
    bm25_top: float,
    fusion: Fusion = "zscore",
    dense_weight: float = 1.0,
    bm25_weight: float = 1.0,
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float64]]:
    """The score fusions of :func:`fuse_arrays` (all but ``"rrf"``), which need no ranks.

    They read only each member's two scores, so a caller holding the scores need not sort
    either side to name its lists: it passes the members (the candidates of either list)
    in any order it likes; equal fused scores keep that order.

    Args:
        members: positions of the candidates to fuse, each once.
        scores: shape ``(2, candidates)``: row 0 the cosine of every candidate (0.0 where
            it has none), row 1 its BM25 score.
        bm25_top: the best BM25 score of the BM25 list (``"convex"`` divides by it).
        fusion: ``"zscore"``, ``"convex"`` or ``"minmax"`` (see :func:`fuse_scores`).
        dense_weight: weight of the dense retriever.
        bm25_weight: weight of BM25.

    Returns:
        ``(positions, fused)``: the members, best first, and their scores.

    Raises:
        ValueError: ``fusion`` is ``"rrf"`` (it needs ranks: :func:`fuse_arrays`) or unknown.

    Example:
        >>> order, fused = fuse_members(np.array([0, 1]), np.array([[0.9, 0.5], [0.0, 7.0]]),
        ...                             bm25_top=7.0, fusion="convex")
        >>> order.tolist(), [round(f, 2) for f in fused.tolist()]
        ([1, 0], [0.75, 0.45])
    """
    dw, bw = dense_weight, bm25_weight
    picked = scores[:, members]  # both sides through one array operation each
    fused: npt.NDArray[np.float64]
    if fusion == "convex":
        scale = 1.0 / bm25_top if bm25_top > 0 else 0.0
        fused = (dw * picked[0] + bw * picked[1] * scale) / (dw + bw)
    elif fusion == "zscore":
        if len(members) < 2:  # nothing to stand out from: a match is the best there is
            fused = np.where((picked[0] > 0) | (picked[1] > 0), 1.0, 0.0)
        else:
            z = _zscore_rows(picked)
            fused = _minmax_array((dw * z[0] + bw * z[1]) / (dw + bw))
    elif fusion == "minmax":
        fused = (dw * _minmax_array(picked[0]) + bw * _minmax_array(picked[1])) / (dw + bw)
    else:
        raise ValueError(f"fuse_members fuses scores (zscore, convex, minmax), got {fusion!r}")
    order = (-fused).argsort(kind="stable")
    return members[order], fused[order]


def context_rows(ranking: Ranking) -> tuple[int, int]:
    """``(before, after)``: the turns before and after each candidate :func:`rank_in_context` reads.

    ``before`` is ``context_turns``; ``after`` is 1 when the reply counts (``reply_weight``
    and ``context_turns`` both set), else 0.

    Example:
        >>> context_rows(Ranking()), context_rows(Ranking(reply_weight=0)), context_rows(
        ...     Ranking(context_turns=0))
        ((3, 1), (3, 0), (0, 0))
    """
    turns = ranking.context_turns
    return turns, 1 if ranking.reply_weight and turns else 0


def rank_in_context(
    own: npt.NDArray[np.float64],
    has_vec: npt.NDArray[np.bool_],
    grid: npt.NDArray[np.intp],
    threads: npt.NDArray[np.intp] | None,
    ranking: Ranking,
    answers: npt.NDArray[np.bool_] | None = None,
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float64]]:
    """Rank candidates by their scores in context, and fuse the two sides (hybrid).

    On each side (cosine, BM25) a candidate's score in context is ``own +
    sum(context_weight ** i * lent(i-th turn before)) + reply_weight * lent(next turn)``,
    where a turn lends ``max(0, own - mean)`` (the mean of the candidates' own scores on
    that side: every turn has some cosine to any query, and summing that noise would rank
    messages by how chatty their surroundings are). On the BM25 side each candidate also
    gains ``thread_weight`` times the sum of what its thread's candidates lend, less the
    weakest thread's sum. A candidate that answers the question of the turn before it
    (``answers``) is lent ``answer_weight`` more of that turn's score on both sides. The
    two sides are then fused by the ranking's ``fusion``
    (:func:`fuse_members`, or :func:`fuse_arrays` for ``"rrf"``); a candidate takes part
    on the dense side when it has a vector, on the keyword side when its score in context
    is above 0.

    Args:
        own: shape ``(2, m + 1)``: row 0 the cosine (0.0: no vector), row 1 the BM25 score
            of ``m`` messages (the candidates and their neighbours); column ``m`` is "no
            such turn" and must hold 0.0.
        has_vec: shape ``(m + 1,)``: which messages have a vector.
        grid: shape ``(1 + before + after, n)`` (:func:`context_rows`): column ``j`` is
            candidate ``j``: row 0 its own column of ``own``, rows ``1 .. before`` the
            columns of the 1st .. ``before``-th turn before it in its thread, then the
            turn after it; ``m`` where there is none.
        threads: shape ``(n,)``: each candidate's thread number (``None``: one thread).
        ranking: the knobs: ``context_turns``, ``context_weight``, ``reply_weight``,
            ``thread_weight``, ``answer_weight``, ``fusion``, the weights and ``rrf_k``.
        answers: shape ``(n,)``: which candidates answer the turn before them, another
            speaker's question (:func:`~marsys_mem.retrieval.answers.answers_question`);
            ``None``: none.

    Returns:
        ``(order, fused)``: the candidates (positions ``0 .. n - 1``) of either side, best
        first, and their fused scores.

    Example:
        >>> own = np.array([[0.9, 0.1, 0.2, 0.0], [0.0, 3.0, 0.0, 0.0]])
        >>> grid = np.array([[0, 1, 2], [3, 0, 1]])  # one turn before each
        >>> ranking = Ranking(context_turns=1, reply_weight=0, thread_weight=0)
        >>> order, fused = rank_in_context(own, np.ones(4, bool), grid, None, ranking)
        >>> order.tolist(), [round(f, 3) for f in fused.tolist()]
        ([0, 1, 2], [1.0, 0.827, 0.0])
    """
    before, after = context_rows(ranking)
    n = grid.shape[1]
    if not n:
        return np.zeros(0, dtype=np.intp), np.zeros(0)
    cand_at = grid[0]
    cand_own = own[:, cand_at]
    # (the means as np.mean has them, without its Python wrapper)
    lent = np.maximum(own - (np.add.reduce(cand_own, axis=1) / n)[:, None], 0.0)
    lent[:, -1] = 0.0  # "no such turn"
    cw = ranking.context_weight
    weights = [cw]
    for _ in range(before - 1):
        weights.append(weights[-1] * cw)
    weights = weights[:before] + [ranking.reply_weight] * after
    # what the turns lend, weighed: (weights) @ (side, turn, candidate)
    ctx = cand_own + np.array(weights) @ lent[:, grid[1:]]
    if answers is not None and ranking.answer_weight and before:
        # the answer to a question like the query: lent more of the question's match
        previous = grid[1][answers]
        ctx[:, answers] += ranking.answer_weight * lent[:, previous]
    ctx_d, ctx_b = ctx
    if ranking.thread_weight and n > 1 and threads is not None:
        # the thread's keyword relevance: what its candidates score above the mean, summed,
        # over the weakest thread's; the same for every candidate of a thread (so with
        # one thread, nothing changes)
        lo, hi = int(np.minimum.reduce(threads)), int(np.maximum.reduce(threads))
        if lo != hi:
            if hi - lo <= 4 * n:  # thread numbers are dense: count them directly
                group = threads - lo
            else:
                _, group = distinct(threads)
            per = np.bincount(group, weights=lent[1, cand_at])[group]
            ctx_b += ranking.thread_weight * (per - np.minimum.reduce(per))
    if ranking.fusion == "convex":  # keep the blend <= 1: cosines in context, rescaled
        ctx_d /= 1.0 + sum(cw**i for i in range(1, before + 1)) + ranking.reply_weight
    if ranking.fusion == "rrf":  # ranks: each side sorted
        dense_order = np.argsort(-ctx_d, kind="stable")
        bm25_order = np.argsort(-ctx_b, kind="stable")
        return fuse_arrays(
            dense_order[has_vec[cand_at][dense_order]],
            bm25_order[ctx_b[bm25_order] > 0],
            ctx_d,
            ctx_b,
            fusion=ranking.fusion,
            dense_weight=ranking.dense_weight,
            bm25_weight=ranking.bm25_weight,
            rrf_k=ranking.rrf_k,
        )
    # scores only: the candidates of either side, in candidate order
    return fuse_members(
        (has_vec[cand_at] | (ctx_b > 0)).nonzero()[0],
        ctx,
        bm25_top=max(float(np.maximum.reduce(ctx_b)), 0.0),
        fusion=ranking.fusion,
        dense_weight=ranking.dense_weight,
        bm25_weight=ranking.bm25_weight,
    )


CueFlags = npt.NDArray[np.bool_] | npt.NDArray[np.float64]
"""How much each candidate has a cue: booleans, or shares from 0 to 1."""


def cue_scores(
    scores: npt.NDArray[np.float64],
    ranking: Ranking,
    *,
    speaker: CueFlags | None = None,
    period: CueFlags | None = None,
    when: CueFlags | None = None,
    tells: CueFlags | None = None,
    of_self: CueFlags | None = None,
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float64], float]:
    """The query's cues added to candidates' scores: the new order, scores and divisor.

    Each cue the query has (a flag array given; ``None``: the query has no such cue)
    adds its weight, times the best score, to the candidates that have it: ``speaker``
    (the candidate is the named participant's, ``speaker_weight``), ``period`` (sent in
    the period the query names, ``time_weight``), ``when`` (says when, for a query asking
    when, ``when_weight``), ``tells`` (does not ask, ``question_weight``), ``of_self``
    (its speaker tells about themselves, ``self_weight``). Every score is
    then divided by ``1 +`` the weights of the cues the query has, so the best stays near
    1.0. Candidates past the flags' length (not looked at) keep their order after the
    others, their scores divided alike.

    Args:
        scores: the candidates' scores, best first.
        ranking: the cue weights.
        speaker: per candidate looked at, whether it is the named participant's.
        period: ... whether it was sent in the named period.
        when: ... whether it says when.
        tells: ... whether it does not end with a question mark.
        of_self: ... how much its speaker tells about themselves (0 to 1:
            :func:`~marsys_mem.retrieval.answers.tells_of_self`).

    Returns:
        ``(order, adjusted, norm)``: positions best first, the adjusted scores in that
        order, and the divisor (1.0: no cue).

    Example:
        >>> order, adjusted, norm = cue_scores(
        ...     np.array([1.0, 0.9, 0.5]), Ranking(), speaker=np.array([False, True]))
        >>> order.tolist(), [round(a, 3) for a in adjusted.tolist()], norm
        ([1, 0, 2], [0.933, 0.667, 0.333], 1.5)
    """
    given = [  # (in this order: the bonus of a candidate is summed in it)
        (flags, weight)
        for flags, weight in (
            (speaker, ranking.speaker_weight),
            (period, ranking.time_weight),
            (when, ranking.when_weight),
            (tells, ranking.question_weight),
            (of_self, ranking.self_weight),
        )
        if flags is not None
    ]
    norm = 1.0
    norm += ranking.time_weight if period is not None else 0.0
    norm += ranking.when_weight if when is not None else 0.0
    norm += ranking.speaker_weight if speaker is not None else 0.0
    norm += ranking.question_weight if tells is not None else 0.0
    norm += ranking.self_weight if of_self is not None else 0.0
    n = len(scores)
    if not given or not n:
        return np.arange(n, dtype=np.intp), scores / norm, norm
    looked = min(n, max(len(flags) for flags, _ in given))
    top = abs(float(scores[0])) or 1.0
    bonus = np.zeros(looked)
    for flags, weight in given:
        part = flags[:looked]
        bonus[: len(part)] += (
            np.where(part, weight, 0.0) if part.dtype == np.bool_ else weight * part
        )
    head = (scores[:looked] + bonus * top) / norm
    order = np.argsort(-head, kind="stable")
    rest = np.arange(looked, n, dtype=np.intp)
    return (
        np.concatenate([order, rest]),
        np.concatenate([head[order], scores[looked:] / norm]),
        norm,
    )


def _zscore_rows(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """``(row - mean) / std`` for each row of a 2-D array (0.0 for a row of equal values).

    The arithmetic of ``row.mean()`` and ``row.std()`` (same sums, same rounding), spelled
    out in ufuncs over both rows at once: their Python wrappers cost more than the sums on
    a cold cache.
    """
    n = values.shape[1]
    dev = values - (np.add.reduce(values, axis=1) / n)[:, None]
    sd = np.sqrt(np.add.reduce(dev * dev, axis=1) / n)
    out: npt.NDArray[np.float64] = (
        dev * np.divide(1.0, sd, out=np.zeros_like(sd), where=sd > 0)[:, None]
    )
    return out


def _minmax_array(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """``values`` scaled to [0, 1].

    All equal: each is the best there is, 1.0 if it is positive (a lone match is a match),
    else 0.0 (nothing matched).
    """
    if not len(values):
        return values
    lo, hi = float(np.minimum.reduce(values)), float(np.maximum.reduce(values))
    if hi <= lo:
        return np.full(len(values), 1.0 if hi > 0 else 0.0)
    out: npt.NDArray[np.float64] = (values - lo) * (1.0 / (hi - lo))
    return out


def diversify(
    ranked: Sequence[Candidate],
    group_of: Callable[[str], Hashable],
    penalty: float,
) -> list[Candidate]:
    """Re-rank so the top hits spread over groups (conversation sessions).

    Greedy: a candidate's score is lowered by ``penalty`` times the best score for every
    better hit already taken from its group; the list stays sorted by the lowered score,
    which is what each returned candidate carries.

    Example:
        >>> ranked = [("a1", 1.0, None, None), ("a2", 0.9, None, None),
        ...           ("b1", 0.8, None, None)]
        >>> [c[0] for c in diversify(ranked, lambda mid: mid[0], 0.2)]
        ['a1', 'b1', 'a2']
    """
    if penalty <= 0 or len(ranked) < 2:
        return list(ranked)
    step = penalty * max(abs(ranked[0][1]), 1e-12)
    taken: dict[Hashable, int] = {}
    heap = [(-c[1], i, 0) for i, c in enumerate(ranked)]
    groups = [group_of(c[0]) for c in ranked]
    heapq.heapify(heap)
    out: list[Candidate] = []
    while heap:
        neg, i, seen = heapq.heappop(heap)
        count = taken.get(groups[i], 0)
        if count != seen:  # its group gained hits since it was scored: score it again
            heapq.heappush(heap, (-(ranked[i][1] - step * count), i, count))
            continue
        mid, _, dense, bm25 = ranked[i]
        out.append((mid, -neg, dense, bm25))
        taken[groups[i]] = count + 1
    return out
