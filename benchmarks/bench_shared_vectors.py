"""Shared vectors: what a second host pays to use messages another host embedded.

Two RAGMemory objects on one SQLite file stand for two hosts. Host A adds ``--messages``
chat messages (and, later, ``--late`` more); host B then opens, catches up and searches.
Measured on host B, for each of two stores in the same run:

* **shared**: ``SQLiteStore``, which keeps vectors (``supports_vectors``): B reads A's
  vectors from the store and embeds nothing but its queries;
* **peer** (what every host did before): the same store with ``supports_vectors = False``
  and no index file on B: B embeds every message again.

Rows: ``open`` (B opens over the messages: ready to search, vectors indexed),
``catch-up`` (A adds ``--late`` messages; B's next ``refresh``, vectors included), and
``search`` (one hybrid search when nothing changed: the shared store's catch-up check is
part of it; the median of 30). Each number is the median of ``--repeats`` samples on fresh
files, the two stores interleaved; the ratio
is peer / shared time (above 1: shared is faster). ``texts embedded`` counts what B's
embedder was given in one sample (queries included).

The embedder is ``HashingEmbedder`` (fast, so the ratio understates what a real model
saves), or with ``--minilm`` the packaged all-MiniLM-L6-v2 (needs the ``embeddings`` extra).

Run it::

    python benchmarks/bench_shared_vectors.py              # about 1 minute on 2 cores
    python benchmarks/bench_shared_vectors.py --minilm --messages 2000
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from marsys_mem.patterns import RAGMemory
from marsys_mem.retrieval.embeddings import Embedder, HashingEmbedder
from marsys_mem.retrieval.embeddings import _feature_hash as _feature_hash
from marsys_mem.store import SQLiteStore

KEY = ("bench", "rag", "main")
WORDS = (
    "coffee machine report friday offsite garage level car parked sister lisbon weather "
    "rain novel guitar laptop battery ramen lunch quarter team octopus documentary key "
    "flowerpot blue green tea meeting budget invoice deadline travel train ticket"
).split()


class PeerStore(SQLiteStore):
    """The same SQLite store, without vectors: every host embeds every message itself."""

    supports_vectors = False


class Counting:
    """Wraps an embedder and counts the texts it is given."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.dim = inner.dim
        self.name = inner.name
        self.count = 0

    def embed(self, texts: Sequence[str]) -> Any:
        """Embed with the wrapped embedder, counting the texts."""
        self.count += len(texts)
        return self.inner.embed(texts)

    async def aembed(self, texts: Sequence[str]) -> Any:
        """Async twin of :meth:`embed`."""
        return self.embed(texts)


def chat(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(4, 40))) + f" #{seed}-{i}" for i in range(n)]


def sample(
    store_cls: type[SQLiteStore], make_embedder: Callable[[], Embedder], n: int, late: int
) -> tuple[float, float, float, int]:
    """One run: (open s, catch-up s, search s, texts host B embedded).

    Each host has its own embedder (a cold content cache, as on another machine).
    """
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "shared.db"
        a_emb = make_embedder()
        with store_cls(db) as store_a, RAGMemory(a_emb, store=store_a, key=KEY) as a:
            a.add_many(chat(n, 1))
            a.flush()
            b_emb = Counting(make_embedder())
            b_emb.embed(["load the model before the clock starts"])
            b_emb.count = 0
            _feature_hash.cache_clear()  # HashingEmbedder's process-wide cache: host B's is cold
            with store_cls(db) as store_b:
                gc.collect()
                t0 = time.perf_counter()
                b = RAGMemory(b_emb, store=store_b, key=KEY)
                b.flush()  # vectors indexed (embedding done, for the peer)
                opened = time.perf_counter() - t0
                a.add_many(chat(late, 2))
                a.flush()
                gc.collect()
                t0 = time.perf_counter()
                b.refresh()
                b.flush()
                caught = time.perf_counter() - t0
                b.search("coffee machine on friday", k=10)  # warm
                times = []
                for _ in range(30):
                    t0 = time.perf_counter()
                    b.search("where did I park the car?", k=10)
                    times.append(time.perf_counter() - t0)
                searched = statistics.median(times)
                assert len(b) == n + late
                b.close()
                return opened, caught, searched, b_emb.count


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--late", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--minilm", action="store_true")
    args = parser.parse_args(argv)
    make: Callable[[], Embedder]
    if args.minilm:
        from marsys_mem.retrieval.embeddings import SentenceTransformerEmbedder

        make = SentenceTransformerEmbedder
    else:
        make = HashingEmbedder
    embedder = make()
    results: dict[str, list[tuple[float, float, float, int]]] = {"shared": [], "peer": []}
    runs: list[tuple[str, Callable[[], tuple[float, float, float, int]]]] = [
        ("shared", lambda: sample(SQLiteStore, make, args.messages, args.late)),
        ("peer", lambda: sample(PeerStore, make, args.messages, args.late)),
    ]
    for _ in range(args.repeats):  # interleaved, so load on the machine hits both alike
        for name, run in runs:
            results[name].append(run())

    def med(name: str, i: int) -> float:
        return statistics.median(r[i] for r in results[name])

    print(
        f"embedder {embedder.name}; host A wrote {args.messages} messages, then {args.late} "
        f"more; medians of {args.repeats}"
    )
    print(f"{'host B':<28}{'shared':>12}{'peer':>12}{'peer/shared':>13}")
    for label, i, scale, unit in (
        ("open (ready to search)", 0, 1.0, "s"),
        (f"catch-up ({args.late} new)", 1, 1.0, "s"),
        ("search, nothing new", 2, 1000.0, "ms"),
    ):
        s, p = med("shared", i) * scale, med("peer", i) * scale
        print(f"{label:<28}{s:>10.3f}{unit:>2}{p:>10.3f}{unit:>2}{p / s:>12.1f}x")
    s_count = results["shared"][-1][3]
    p_count = results["peer"][-1][3]
    print(f"{'texts embedded by B':<28}{s_count:>12}{p_count:>12}")


if __name__ == "__main__":
    main()
