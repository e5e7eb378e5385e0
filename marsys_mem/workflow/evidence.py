"""Evidence for a question: what an agent holds that best answers it, with no LLM.

A workflow's ``ask`` step calls no model. It records what the agent would send
(``context_for`` with the question as the retrieval query) and picks, among the facts the
agent received, the messages retrieval found and the messages in its window, the one that
best matches the question: BM25 over the candidates (scaled to the best hit) plus, with a
semantic embedder, the cosine similarity.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from marsys_mem.model.facts import SharedFact
from marsys_mem.model.messages import Message
from marsys_mem.retrieval.bm25 import BM25Index
from marsys_mem.retrieval.embeddings import Embedder
from marsys_mem.retrieval.scoring import ScoredMessage

__all__ = ["Evidence", "best_evidence", "gather_evidence"]

Evidence = tuple[str, str, str]
"""A candidate answer: ``(text, where it came from, the text to match against)``."""


def gather_evidence(
    facts: Iterable[SharedFact], hits: Iterable[ScoredMessage], window: Iterable[Message]
) -> list[Evidence]:
    """The candidates: facts (matched with their topic), retrieval hits, window messages.

    System messages of the window are left out (they hold instructions, facts and
    snippets that are already candidates on their own).

    Example:
        >>> fact = SharedFact.create("Budget is 4000 EUR", agent="planner",
        ...                          metadata={"topic": "budget"})
        >>> gather_evidence([fact], [], [Message.user("What is the budget?")])
        [('Budget is 4000 EUR', 'fact from planner@main', 'budget: Budget is 4000 EUR'), \
('What is the budget?', 'user message in the window', 'What is the budget?')]
    """
    out: list[Evidence] = []
    for f in facts:
        topic = f.metadata.get("topic")
        match = f"{topic}: {f.text}" if topic else f.text
        out.append((f.text, f"fact from {f.source_agent}@{f.source_branch}", match))
    for h in hits:
        text = h.message.text
        out.append((text, f"retrieved {h.message.role} message", text))
    for m in window:
        if m.role != "system" and m.text.strip():
            out.append((m.text, f"{m.role} message in the window", m.text))
    return out


def best_evidence(
    question: str, candidates: Sequence[Evidence], embedder: Embedder | None = None
) -> tuple[str | None, str | None]:
    """The candidate that best matches ``question``: ``(text, source)``.

    ``candidates`` are ``(text, source, search_text)``; the score is BM25 (scaled to the
    best hit) plus, with an embedder, the cosine similarity. Candidates that are questions
    themselves are passed over unless nothing else is left. First wins ties.
    """
    unique: dict[str, Evidence] = {}
    for cand in candidates:
        key = " ".join(cand[0].split()).casefold()
        if key and key not in unique:
            unique[key] = cand
    pool = [c for c in unique.values() if not c[0].rstrip().endswith("?")]
    pool = pool or list(unique.values())
    if not pool:
        return None, None
    scores = [0.0] * len(pool)
    index = BM25Index()
    for i, cand in enumerate(pool):
        index.add(str(i), cand[2])
    hits = index.search(question, k=len(pool))
    if hits:
        top = hits[0][1] or 1.0
        for doc_id, score in hits:
            scores[int(doc_id)] += score / top
    if embedder is not None:
        vectors = embedder.embed([question] + [cand[2] for cand in pool])
        for i, sim in enumerate((vectors[1:] @ vectors[0]).tolist()):
            scores[i] += max(0.0, float(sim))
    best = max(range(len(pool)), key=lambda i: (scores[i], -i))
    if scores[best] <= 0:
        return None, None
    return pool[best][0], pool[best][1]
