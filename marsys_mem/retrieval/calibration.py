"""Calibrated relevance: a search score with one meaning for every query, memory and backend.

A hybrid search ranks its candidates by a fused score that is relative to the query's own
candidates (the best is 1.0 whatever it matched: the nonsense query ``"x"`` scored 1.0).
That order is kept; the score a hit carries is instead a probability of relevance, from a
fixed logistic map of evidence on absolute scales:

* **dense**: the cosine to the query (the best among the first :data:`EVIDENCE_DEPTH` hits
  for a hybrid search, the hit's own in ``mode="dense"``);
* **keyword**: the BM25 score divided by the query's ceiling, what a message holding every
  query term many times would score (:func:`bm25_ceiling`: each distinct query term at its
  ``idf * (k1 + 1)``; a term no message holds at the highest idf), so 0.0 is no shared
  word, a match on a few common words of a long query is small, and a message holding a
  one-word query's rare word is near 0.4; pooled the same way;
* **rank**: how far below the query's first hit the ranker put this one (its fused score
  minus the first's, <= 0), so a hybrid query's hits keep their order.

So ``score = 1 / (1 + exp(-(rank * (fused - fused_first) + dense * cosine + keyword *
bm25 / ceiling + bias)))``, the same on the in-process path (faiss or numpy vectors, any
store) and on a store that searches (pgvector), whose keyword scores are BM25 with the
database's statistics. One threshold, :data:`DEFAULT_MIN_SCORE`, then means the same
everywhere: ``RAGMemory.search``, ``FactMemory.search``, the context builder, ``recall``
and ``marsys-mem search`` default to it, and merge the hits of several memories by it.

How the constants were fitted (``python benchmarks/bench_realtalk.py DATA --calibrate``
refits them and prints this module's constants): on REALTALK's tune split only (chats
1-5), with the default ``RAGMemory`` (all-MiniLM-L6-v2, ``fusion="zscore"``), weighted
logistic regression of the first 10 hits of every query: positives the annotated evidence
turns of the real questions (half the weight), negatives the hits of queries that have no
answer in the chat (the other half): 200 nonsense queries (:func:`nonsense_queries`; 98%
of that weight) and 200 questions of other chats whose participants differ (2%: common
words, no answer). The nonsense queries share no word with the chat, so alone they make
any keyword match relevant; the few other-chat questions teach that common words are not.
The fit is for that model and fusion: another embedder's cosines have another spread
(refit, or set ``min_score`` yourself); ``fusion="rrf"`` ranks give the rank term little.

The measured result is in ``docs/benchmarks.md`` (REALTALK, calibration): nonsense queries
whose best hit scores below :data:`DEFAULT_MIN_SCORE` and evidence turns of the top 10 at
or above it, on both splits.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from marsys_mem.retrieval.bm25 import tokenize

__all__ = [
    "DEFAULT_MIN_SCORE",
    "DENSE",
    "EVIDENCE_DEPTH",
    "HYBRID",
    "KEYWORD",
    "Calibration",
    "bm25_ceiling",
    "calibrated",
    "fit_calibration",
    "nonsense_queries",
]

DEFAULT_MIN_SCORE = 0.8
"""The one default ``min_score``, chosen on the tune split: the lowest threshold in tenths
that kept 99% of its nonsense queries' best hits out (before the last refit: 0.7 kept
98.5%; after it 0.7 keeps 99.0% too, and 0.8 was kept). A match by meaning alone passes
from a cosine of about 0.54 (MiniLM)."""

EVIDENCE_DEPTH = 10
"""How many of a hybrid search's first hits pool their evidence (whatever ``k`` is)."""


@dataclass(frozen=True, slots=True)
class Calibration:
    """A fitted logistic map from a search's raw evidence to a probability of relevance.

    Attributes:
        rank: weight of the fused score's distance below the first hit's (hybrid).
        dense: weight of the cosine.
        keyword: weight of the BM25 score over the query's ceiling.
        bias: the intercept.

    Example:
        >>> cal = Calibration(rank=0.0, dense=10.0, keyword=0.0, bias=-5.0)
        >>> [round(p, 3) for p in cal.probability(np.zeros(2), np.array([0.5, 0.8]),
        ...                                        np.zeros(2)).tolist()]
        [0.5, 0.953]
    """

    rank: float
    dense: float
    keyword: float
    bias: float

    def probability(
        self,
        below_first: npt.NDArray[np.float64],
        dense: npt.NDArray[np.float64],
        keyword: npt.NDArray[np.float64],
    ) -> npt.NDArray[np.float64]:
        """``sigmoid(rank * below_first + dense * dense + keyword * keyword + bias)``."""
        z = self.rank * below_first + self.dense * dense + self.keyword * keyword + self.bias
        out: npt.NDArray[np.float64] = 1.0 / (1.0 + np.exp(-np.clip(z, -60.0, 60.0)))
        return out


# Fitted by `python benchmarks/bench_realtalk.py DATA --calibrate` on chats 1-5 (see the
# module docs), on the ranking of RAGMemory's defaults (names out, question cue, dense
# weight 1.3): 438 evidence turns in the top 10s, 400 queries without an answer.
HYBRID = Calibration(rank=8.08, dense=15.82, keyword=31.75, bias=-7.11)
"""The hybrid map: the first hits' best cosine and keyword share, and the hit's rank term."""
DENSE = Calibration(rank=0.0, dense=26.6, keyword=0.0, bias=-7.38)
"""``mode="dense"``: the hit's own cosine."""
KEYWORD = Calibration(rank=0.0, dense=0.0, keyword=38.76, bias=-3.7)
"""``mode="bm25"``: the hit's own keyword share."""


def bm25_ceiling(doc_freqs: Iterable[int], doc_count: int, k1: float) -> float:
    """A query's BM25 ceiling: ``sum(idf(df) * (k1 + 1))`` over its distinct terms.

    What a message holding every term of the query many times would score: a BM25 score
    over it is the share of the query matched, weighed by rarity. ``doc_freqs``: the
    document frequency of each distinct query term (0: no message holds it; it counts at
    the highest idf, the part of the query nothing matches); ``doc_count``: the
    messages. A query without terms (stop words, single letters) has
    ceiling 0.0.

    Example:
        >>> round(bm25_ceiling([1, 500], 1_000, 1.5), 2)
        17.99
        >>> round(bm25_ceiling([0], 1_000, 1.5), 2), bm25_ceiling([], 1_000, 1.5)
        (19.0, 0.0)
    """
    n = max(doc_count, 1)
    total = 0.0
    for df in doc_freqs:
        df = min(max(df, 0), n)
        total += math.log(1.0 + (n - df + 0.5) / (df + 0.5)) * (k1 + 1.0)
    return total


def calibrated(
    fused: Sequence[float],
    dense: Sequence[float | None],
    bm25: Sequence[float | None],
    ceiling: float,
    *,
    mode: str = "hybrid",
) -> list[float]:
    """The calibrated scores of a search's hits, best first (their order is kept).

    Args:
        fused: each hit's ranking score, best first (the cosine in ``dense`` mode).
        dense: each hit's cosine (``None``: no vector).
        bm25: each hit's BM25 score (``None``: no keyword side).
        ceiling: the query's :func:`bm25_ceiling` in the memory searched.
        mode: ``"hybrid"`` (the first :data:`EVIDENCE_DEPTH` hits pool their evidence, each
            hit keeps its rank term: scores fall in ranking order), ``"dense"`` or
            ``"bm25"`` (each hit's own score, which ranks them).

    Returns:
        The probability of relevance of each hit, in the order given.

    Example:
        A query nothing answers (``"x"``: no term, weak cosines), then one whose first hit
        shares a word with it:

        >>> [round(s, 2) for s in calibrated([1.0, 0.6], [0.12, 0.1], [0.0, 0.0], 0.0)]
        [0.01, 0.0]
        >>> [round(s, 2) for s in calibrated([1.0, 0.8, 0.5], [0.45, 0.3, 0.2],
        ...                                  [3.0, 0.0, 0.0], 20.0)]
        [0.99, 0.96, 0.68]
    """
    n = len(fused)
    if not n:
        return []
    cos = np.array([0.0 if c is None else c for c in dense], dtype=np.float64)
    share = np.array([0.0 if b is None else b for b in bm25], dtype=np.float64)
    share = share / ceiling if ceiling > 0 else np.zeros(n)
    if mode == "dense":
        p = DENSE.probability(np.zeros(n), cos, np.zeros(n))
    elif mode == "bm25":
        p = KEYWORD.probability(np.zeros(n), np.zeros(n), share)
    else:
        f = np.asarray(fused, dtype=np.float64)
        pooled_cos = np.full(n, float(cos[:EVIDENCE_DEPTH].max()))
        pooled_kw = np.full(n, float(share[:EVIDENCE_DEPTH].max()))
        p = HYBRID.probability(np.minimum(f - f[0], 0.0), pooled_cos, pooled_kw)
    return [float(v) for v in p]


def fit_calibration(
    features: npt.NDArray[np.float64],
    relevant: npt.NDArray[np.bool_],
    weights: npt.NDArray[np.float64],
    *,
    l2: float = 1e-3,
) -> Calibration:
    """Weighted L2-regularised logistic regression (Newton steps), as a :class:`Calibration`.

    Args:
        features: shape ``(n, 3)``: rank term, cosine, keyword share of each example.
        relevant: whether each example is relevant.
        weights: each example's weight.
        l2: the ridge on the coefficients (not on the bias).

    Example:
        >>> x = np.array([[0.0, c, 0.0] for c in (0.1, 0.2, 0.3, 0.6, 0.7, 0.8)])
        >>> cal = fit_calibration(x, np.array([0, 0, 1, 0, 1, 1], bool), np.ones(6))
        >>> round(-cal.bias / cal.dense, 2)  # where the probability crosses 0.5
        0.45
    """
    x = np.hstack([features, np.ones((len(features), 1))])
    y = relevant.astype(np.float64)
    ridge = np.full(x.shape[1], l2)
    ridge[-1] = 0.0
    beta = np.zeros(x.shape[1])
    for _ in range(200):
        p = 1.0 / (1.0 + np.exp(-np.clip(x @ beta, -60.0, 60.0)))
        grad = x.T @ (weights * (p - y)) + ridge * beta
        hess = (x * (weights * p * (1.0 - p))[:, None]).T @ x + np.diag(ridge + 1e-12)
        step = np.linalg.solve(hess, grad)
        beta -= step
        if float(np.abs(step).max()) < 1e-10:
            break
    r, d, k, b = (round(float(v), 2) for v in beta)
    return Calibration(rank=r, dense=d, keyword=k, bias=b)


_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def nonsense_queries(n: int, words: Sequence[str], known: Iterable[str], *, seed: int) -> list[str]:
    """``n`` queries that nothing can answer, made deterministically from ``seed``.

    One in five a single letter (``"x"``), two in five 1-4 random letter strings of 3-10
    letters (``"qzvoe mprk"``), two in five 2-6 words drawn from ``words`` whose BM25 terms
    are all absent from ``known`` (the memory's own terms: a word salad that shares no
    word with it).

    Example:
        >>> nonsense_queries(5, ["walrus", "tundra", "glacier", "parked"], ["park"], seed=1)
        ['e', 'dpyopum', 'pamn woi', 'glacier walrus tundra', 'walrus glacier']
    """
    rng = random.Random(seed)  # noqa: S311 - reproducible queries, not secrets
    terms = set(known)
    pool = [w for w in words if tokenize(w) and not terms.intersection(tokenize(w))]
    out: list[str] = []
    for i in range(n):
        kind = i % 5
        if kind == 0:
            out.append(rng.choice(_LETTERS))
        elif kind in (1, 2) or len(pool) < 2:
            out.append(
                " ".join(
                    "".join(rng.choice(_LETTERS) for _ in range(rng.randint(3, 10)))
                    for _ in range(rng.randint(1, 4))
                )
            )
        else:
            out.append(" ".join(rng.sample(pool, min(len(pool), rng.randint(2, 6)))))
    return out
