"""Shared vectors on PostgreSQL: what a second host pays to use messages another embedded.

The measurement of ``bench_shared_vectors.py`` (host A adds ``--messages`` messages, then
``--late`` more; host B opens, catches up, searches), with ``PostgresStore`` instead of
SQLite, on a PostgreSQL the script starts itself (initdb + pg_ctl on a free loopback port,
``fsync`` off; each sample on a fresh schema):

* **shared**: ``PostgresStore`` (``supports_vectors``): B reads A's vectors from the store;
* **peer**: the same store with ``supports_vectors = False``: B embeds every message again.

Run it::

    python benchmarks/bench_shared_vectors_pg.py           # about 2 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from marsys_mem.retrieval.embeddings import Embedder, HashingEmbedder
from marsys_mem.store.postgres import PostgresStore
from marsys_mem.testing.postgres import PostgresServer

sys.path.insert(0, str(Path(__file__).parent))
from bench_shared_vectors import sample  # the benchmark next to this one

_schemas = itertools.count()


def store_class(server: PostgresServer, *, vectors: bool) -> Any:
    """A PostgresStore class opened like SQLiteStore(path): one fresh schema per path."""
    dsns: dict[str, str] = {}

    class Store(PostgresStore):
        supports_vectors = vectors

        def __init__(self, path: Path) -> None:
            key = str(path)
            if key not in dsns:
                dsns[key] = server.create_schema(f"bench{next(_schemas)}")
            super().__init__(dsns[key], max_size=2)

    return Store


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--late", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    make: Callable[[], Embedder] = HashingEmbedder
    results: dict[str, list[tuple[float, float, float, int]]] = {"shared": [], "peer": []}
    with PostgresServer(settings={"fsync": "off"}) as server:
        runs = [
            ("shared", store_class(server, vectors=True)),
            ("peer", store_class(server, vectors=False)),
        ]
        for _ in range(args.repeats):  # interleaved, so load on the machine hits both alike
            for name, cls in runs:
                results[name].append(sample(cls, make, args.messages, args.late))

    def med(name: str, i: int) -> float:
        return statistics.median(r[i] for r in results[name])

    print(
        f"PostgresStore, embedder {make().name}; host A wrote {args.messages} messages, then "
        f"{args.late} more; medians of {args.repeats}"
    )
    print(f"{'host B':<28}{'shared':>12}{'peer':>12}{'peer/shared':>13}")
    for label, i, scale, unit in (
        ("open (ready to search)", 0, 1.0, "s"),
        (f"catch-up ({args.late} new)", 1, 1.0, "s"),
        ("search, nothing new", 2, 1000.0, "ms"),
    ):
        s, p = med("shared", i) * scale, med("peer", i) * scale
        print(f"{label:<28}{s:>10.3f}{unit:>2}{p:>10.3f}{unit:>2}{p / s:>12.1f}x")
    print(f"{'texts embedded by B':<28}{results['shared'][-1][3]:>12}{results['peer'][-1][3]:>12}")


if __name__ == "__main__":
    main()
