"""Stores: durable appends and loads, marsys-mem against LangGraph's checkpointers.

What it measures, on the same synthetic chat (alternating user / assistant messages of
20-700 characters, with ids), for each pair run in the same process:

* ``SQLiteStore`` (WAL, ``synchronous=FULL``: every append is on disk when it returns)
  against LangGraph's ``SqliteSaver`` (WAL, SQLite's default ``synchronous=FULL``),
* ``InMemoryStore`` against LangGraph's ``InMemorySaver``, and
* ``PostgresStore`` against LangGraph's ``PostgresSaver`` (langgraph-checkpoint-postgres),
  both on one PostgreSQL 15 the script starts itself (``marsys_mem.testing.postgres``:
  initdb + pg_ctl on a free loopback port, default settings: ``fsync`` and
  ``synchronous_commit`` on, so every append is on disk when it returns), each sample in
  a fresh schema, over TCP on loopback. Skipped, with a note, when PostgreSQL's binaries,
  psycopg or langgraph-checkpoint-postgres are missing (``--no-postgres`` skips it too).

Workloads:

* **batched appends**: the messages in batches of 1000; ours: one
  ``append_messages(key, batch)`` per batch. LangGraph: one checkpoint per batch.
* **one at a time**: one message per append; LangGraph: one checkpoint per message.
* **load**: read back a thread of 100k messages. Ours: ``load_messages(key)``;
  LangGraph: ``get_tuple(config)`` of the thread's latest checkpoint.

How the LangGraph side is modelled: as a LangGraph user keeps a conversation, in a
``messages`` channel reduced with ``langgraph.graph.message.add_messages`` (what
``MessagesState`` uses). Each write computes ``add_messages(history, new)`` and saves a
checkpoint with ``saver.put(config, checkpoint, metadata, {"messages": version})``,
chained to the previous one by ``config``, exactly what the Pregel loop hands the saver
after a step, minus the graph machinery (no ``put_writes``, no node runs): the peer is
measured at its fastest. Like a graph's checkpoint, each one holds the whole channel
value, so a LangGraph thread costs O(history) per write; that is part of what is
measured. (LangGraph 1.x also has a beta ``DeltaChannel`` that stores writes instead of
snapshots; it is not the default of ``MessagesState`` and is not measured here.)

For ``PostgresStore`` the script also times each batch of a 100k-message fill and
compares the cost per message of the first and the last 10% of the batches (flat: ratio
near 1; the store's appends do not slow down as a key grows).

Each number is the median of ``--repeats`` samples (``time.perf_counter``), each on a fresh
store / saver (files in a fresh temporary folder). The garbage collector stays on (it is
part of what a user pays for loading 100k objects); ``gc.collect()`` runs before each
sample. The ratio column is ours / LangGraph in messages/s (above 1: ours is faster).

Run it (about 1-2 minutes on a 2-core machine; ``--quick`` takes about 15 s). LangGraph is
only needed by this script; keep it out of the project's environment::

    python -m venv --system-site-packages .venv-bench
    .venv-bench/bin/pip install langgraph langgraph-checkpoint-sqlite \
        langgraph-checkpoint-postgres 'marsys-mem[postgres]'
    .venv-bench/bin/python benchmarks/bench_store.py            # or --quick
"""

from __future__ import annotations

import argparse
import gc
import platform
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph.message import add_messages
    from langgraph.version import __version__ as LANGGRAPH_VERSION
except ImportError:
    sys.exit(
        "This benchmark compares against LangGraph's checkpointers, which are not installed.\n"
        "Install them in a separate environment (marsys-mem does not need them):\n\n"
        "    python -m venv --system-site-packages .venv-bench\n"
        "    .venv-bench/bin/pip install langgraph langgraph-checkpoint-sqlite\n"
        "    .venv-bench/bin/python benchmarks/bench_store.py\n"
    )

import marsys_mem
from marsys_mem import Message
from marsys_mem.store import InMemoryStore, MemoryStore, SQLiteStore

KEY = ("bench", "agent", "main")
BATCH = 1000
TARGET_SQLITE_BATCHED = 20_000.0  # messages/s
TARGET_PG_BATCHED = 20_000.0  # messages/s
TARGET_PG_RATIO = 3.0  # PostgresStore / PostgresSaver, batched appends

_WORDS = (
    "the agent plans a search for quarterly revenue growth in tokyo and reports numbers "
    "memory context window token budget tool result weather forecast summary user asks "
    "assistant answers research branch planner finds facts shares insight data table"
).split()


# ---------------------------------------------------------------------- the messages
def _text(rng: random.Random, lo: int, hi: int) -> str:
    target = rng.randint(lo, hi)
    words: list[str] = []
    size = 0
    while size < target:
        word = rng.choice(_WORDS)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)[:target]


def make_messages(n: int, seed: int = 7) -> list[Message]:
    """``n`` chat messages: user (20-300 chars) and assistant (60-700 chars) alternating.

    Ids are random 32-hex-digit strings, like the default ``uuid4().hex`` ids (random ids
    are what a unique index sees in practice), drawn from a seeded generator.
    """
    rng = random.Random(seed)
    out: list[Message] = []
    for i in range(n):
        mid = f"{rng.getrandbits(128):032x}"
        if i % 2 == 0:
            out.append(Message.user(_text(rng, 20, 300), message_id=mid))
        else:
            out.append(Message.assistant(_text(rng, 60, 700), message_id=mid))
    return out


def to_langchain(msgs: Sequence[Message]) -> list[BaseMessage]:
    """The same messages as langchain messages (same text, same ids)."""
    return [
        HumanMessage(m.text, id=m.message_id)
        if m.role == "user"
        else AIMessage(m.text, id=m.message_id)
        for m in msgs
    ]


def batches(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


# ---------------------------------------------------------------------- the sides
@contextmanager
def temp_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="bench_store_"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class LangGraphThread:
    """A conversation kept the LangGraph way: add_messages + one checkpoint per write."""

    def __init__(self, saver: Any, thread_id: str = "bench") -> None:
        self.saver = saver
        self.config: dict[str, Any] = {
            "configurable": {"thread_id": thread_id, "checkpoint_ns": ""}
        }
        self.history: list[BaseMessage] = []
        self.version = 0

    def write(self, new: Sequence[BaseMessage]) -> None:
        """Reduce ``new`` into the history and save a checkpoint holding it (one write)."""
        self.history = add_messages(self.history, list(new))  # type: ignore[arg-type,assignment]
        self.version += 1
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"messages": self.history}
        checkpoint["channel_versions"] = {"messages": self.version}
        metadata: Any = {"source": "loop", "step": self.version, "parents": {}}
        self.config = self.saver.put(self.config, checkpoint, metadata, {"messages": self.version})

    def load(self) -> list[BaseMessage]:
        """The thread's messages, from its latest checkpoint."""
        found = self.saver.get_tuple(
            {"configurable": {"thread_id": self.config["configurable"]["thread_id"]}}
        )
        assert found is not None
        messages: list[BaseMessage] = found.checkpoint["channel_values"]["messages"]
        return messages


@contextmanager
def open_sqlite_saver(folder: Path) -> Iterator[Any]:
    conn = sqlite3.connect(folder / "langgraph.db", check_same_thread=False)
    try:
        saver = SqliteSaver(conn)
        saver.setup()
        yield saver
    finally:
        conn.close()


@contextmanager
def open_memory_saver(folder: Path) -> Iterator[Any]:
    yield InMemorySaver()


@contextmanager
def open_sqlite_store(folder: Path) -> Iterator[MemoryStore]:
    with SQLiteStore(folder / "marsys.db") as store:
        yield store


@contextmanager
def open_memory_store(folder: Path) -> Iterator[MemoryStore]:
    with InMemoryStore() as store:
        yield store


class PostgresSide:
    """The PostgreSQL server of the run, and a fresh schema per store / saver opened."""

    def __init__(self) -> None:
        from marsys_mem.testing.postgres import PostgresServer

        self.server = PostgresServer()
        self.server.start()
        self.count = 0

    def fresh_dsn(self) -> str:
        """A DSN whose search_path is a new, empty schema."""
        self.count += 1
        return self.server.create_schema(f"bench_{self.count}")

    def version(self) -> str:
        """The server's version."""
        import psycopg

        with psycopg.connect(self.server.dsn()) as conn:
            row = conn.execute("SHOW server_version").fetchone()
        return str(row[0]) if row else "?"

    def close(self) -> None:
        """Stop the server and remove its folder."""
        self.server.close()


PG: PostgresSide | None = None


@contextmanager
def open_postgres_store(folder: Path) -> Iterator[MemoryStore]:
    from marsys_mem.store.postgres import PostgresStore

    assert PG is not None
    with PostgresStore(PG.fresh_dsn(), min_size=1, max_size=2) as store:
        yield store


@contextmanager
def open_postgres_saver(folder: Path) -> Iterator[Any]:
    from langgraph.checkpoint.postgres import PostgresSaver

    assert PG is not None
    with PostgresSaver.from_conn_string(PG.fresh_dsn()) as saver:
        saver.setup()
        yield saver


def postgres_missing() -> str | None:
    """Why the PostgreSQL pair cannot run here, or ``None``."""
    from marsys_mem.testing.postgres import find_postgres_bin

    if find_postgres_bin() is None:
        return "PostgreSQL's initdb/pg_ctl not found"
    try:
        import langgraph.checkpoint.postgres  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        return f"{exc.name} is not installed (pip install langgraph-checkpoint-postgres)"
    return None


def time_fill_per_batch(n: int, msgs: list[Message]) -> tuple[float, float]:
    """Fill one key with ``n`` messages in batches; seconds/message of first, last 10%."""
    with open_postgres_store(Path()) as store:
        per_batch: list[float] = []
        for group in batches(msgs[:n], BATCH):
            start = time.perf_counter()
            store.append_messages(KEY, group)
            per_batch.append((time.perf_counter() - start) / len(group))
        assert store.count_messages(KEY) == n
    tenth = max(len(per_batch) // 10, 1)
    return statistics.median(per_batch[:tenth]), statistics.median(per_batch[-tenth:])


@dataclass
class Pair:
    """Our store and its LangGraph peer, each opened in a folder."""

    name: str
    ours: Callable[[Path], Any]
    peer_name: str
    peer: Callable[[Path], Any]


PAIRS = [
    Pair("SQLiteStore", open_sqlite_store, "SqliteSaver", open_sqlite_saver),
    Pair("InMemoryStore", open_memory_store, "InMemorySaver", open_memory_saver),
]


# ---------------------------------------------------------------------- timing
def median_time(sample: Callable[[], float], repeats: int) -> float:
    """Median of ``repeats`` samples; ``sample`` sets up, times its work, tears down."""
    times: list[float] = []
    for _ in range(repeats):
        gc.collect()
        times.append(sample())
    return statistics.median(times)


def time_appends(opener: Callable[[Path], Any], ours: bool, groups: list[Any]) -> float:
    with temp_dir() as folder, opener(folder) as target:
        if ours:
            start = time.perf_counter()
            for group in groups:
                target.append_messages(KEY, group)
            elapsed = time.perf_counter() - start
            assert target.count_messages(KEY) == sum(len(g) for g in groups)
        else:
            thread = LangGraphThread(target)
            start = time.perf_counter()
            for group in groups:
                thread.write(group)
            elapsed = time.perf_counter() - start
            assert len(thread.load()) == sum(len(g) for g in groups)
    return elapsed


def time_load(opener: Callable[[Path], Any], ours: bool, msgs: list[Any], repeats: int) -> float:
    """Fill once (not timed), then the median of ``repeats`` full loads."""
    with temp_dir() as folder, opener(folder) as target:
        if ours:
            for group in batches(msgs, BATCH):
                target.append_messages(KEY, group)

            def load() -> int:
                return len(target.load_messages(KEY))

        else:
            thread = LangGraphThread(target)
            thread.write(msgs)  # one checkpoint holding the whole thread

            def load() -> int:
                return len(thread.load())

        assert load() == len(msgs)  # warm-up and check

        def sample() -> float:
            start = time.perf_counter()
            n = load()
            elapsed = time.perf_counter() - start
            assert n == len(msgs)
            return elapsed

        return median_time(sample, repeats)


# ---------------------------------------------------------------------- report
@dataclass
class Row:
    """One line of the table."""

    workload: str
    ours: str
    ours_rate: float
    peer: str
    peer_rate: float
    extra: str = ""


def fmt_rate(rate: float) -> str:
    return f"{rate:,.0f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else "")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    parser.add_argument("--repeats", type=int, default=None, help="samples per number")
    parser.add_argument("--no-postgres", action="store_true", help="skip the PostgreSQL pair")
    args = parser.parse_args(argv)
    quick: bool = args.quick
    repeats: int = args.repeats or (3 if quick else 5)
    n_batched = 5_000 if quick else 20_000
    n_single = 200 if quick else 500
    n_load = 20_000 if quick else 100_000

    print("# marsys-mem stores vs LangGraph checkpointers\n")
    print(
        f"python {platform.python_version()}, sqlite {sqlite3.sqlite_version}, "
        f"marsys-mem {marsys_mem.__version__}, langgraph {LANGGRAPH_VERSION}, "
        f"{platform.machine()}, repeats={repeats}{', quick' if quick else ''}\n"
    )
    ours_all = make_messages(max(n_batched, n_single, n_load))
    lc_all = to_langchain(ours_all)

    global PG
    pairs = list(PAIRS)
    missing = "--no-postgres" if args.no_postgres else postgres_missing()
    if missing is None:
        PG = PostgresSide()
        pairs.append(
            Pair("PostgresStore", open_postgres_store, "PostgresSaver", open_postgres_saver)
        )
        print(f"postgresql {PG.version()} (started by this script, loopback TCP)\n")
    try:
        rows = run_pairs(pairs, repeats, n_batched, n_single, n_load, ours_all, lc_all)
        flat = time_fill_per_batch(n_load, ours_all) if PG is not None else None
    finally:
        if PG is not None:
            PG.close()
    report(rows, flat, n_load, missing)
    return 0


def run_pairs(
    pairs: list[Pair],
    repeats: int,
    n_batched: int,
    n_single: int,
    n_load: int,
    ours_all: list[Message],
    lc_all: list[BaseMessage],
) -> list[Row]:
    rows: list[Row] = []
    for pair in pairs:
        workloads = [
            (f"batched appends ({n_batched:,} msgs, {BATCH}/append)", n_batched, BATCH),
            (f"one at a time ({n_single:,} appends)", n_single, 1),
        ]
        for label, n, size in workloads:
            ours_groups = batches(ours_all[:n], size)
            peer_groups = batches(lc_all[:n], size)
            ours_t = median_time(
                lambda o=pair.ours, g=ours_groups: time_appends(o, True, g), repeats
            )
            peer_t = median_time(
                lambda o=pair.peer, g=peer_groups: time_appends(o, False, g), repeats
            )
            rows.append(Row(label, pair.name, n / ours_t, pair.peer_name, n / peer_t))
            print(f"  measured {pair.name} / {pair.peer_name}: {label}", file=sys.stderr)
        ours_t = time_load(pair.ours, True, ours_all[:n_load], repeats)
        peer_t = time_load(pair.peer, False, lc_all[:n_load], repeats)
        rows.append(
            Row(
                f"load {n_load:,} msgs",
                pair.name,
                n_load / ours_t,
                pair.peer_name,
                n_load / peer_t,
                extra=f"{ours_t * 1000:,.1f} ms vs {peer_t * 1000:,.1f} ms",
            )
        )
        print(f"  measured {pair.name} / {pair.peer_name}: load", file=sys.stderr)
    return rows


def report(
    rows: list[Row], flat: tuple[float, float] | None, n_load: int, missing: str | None
) -> None:
    sys.stderr.flush()
    print("| workload | ours | msgs/s | LangGraph peer | msgs/s | ratio | latency |")
    print("|---|---|---:|---|---:|---:|---|")
    for r in rows:
        print(
            f"| {r.workload} | {r.ours} | {fmt_rate(r.ours_rate)} | {r.peer} | "
            f"{fmt_rate(r.peer_rate)} | {r.ours_rate / r.peer_rate:.1f}x | {r.extra} |"
        )
    sqlite_batched = rows[0].ours_rate
    verdict = "PASS" if sqlite_batched >= TARGET_SQLITE_BATCHED else "FAIL"
    print(
        f"\ntarget: SQLiteStore batched appends >= {TARGET_SQLITE_BATCHED:,.0f} msgs/s: "
        f"{fmt_rate(sqlite_batched)} -> {verdict}"
    )
    pg = [r for r in rows if r.ours == "PostgresStore"]
    if not pg or flat is None:
        print(f"PostgresStore / PostgresSaver: not measured ({missing})")
        return
    rate, ratio = pg[0].ours_rate, pg[0].ours_rate / pg[0].peer_rate
    verdict = "PASS" if rate >= TARGET_PG_BATCHED and ratio >= TARGET_PG_RATIO else "FAIL"
    print(
        f"target: PostgresStore batched appends >= {TARGET_PG_BATCHED:,.0f} msgs/s and >= "
        f"{TARGET_PG_RATIO:.0f}x PostgresSaver: {fmt_rate(rate)}, {ratio:.1f}x -> {verdict}"
    )
    first, last = flat
    print(
        f"PostgresStore per-message cost while filling {n_load:,} msgs ({BATCH}/append), "
        f"median of the batches: first 10% {first * 1e6:.1f} us, last 10% {last * 1e6:.1f} us "
        f"(last/first {last / first:.2f})"
    )


if __name__ == "__main__":
    raise SystemExit(main())
