"""LangGraph checkpointers: MarsysCheckpointer against SqliteSaver and InMemorySaver.

Run it (a few minutes on a 2-core machine; ``--messages 400`` for a quick look)::

    pip install -e '.[dev]' && python benchmarks/bench_langgraph.py

What it measures: one ``StateGraph(MessagesState)`` thread, invoked N times (default
2,000), each invoke adding one user message of about 250 characters (the graph's node
answers nothing, so the thread holds exactly N messages at the end). Every checkpointer
runs the same invokes:

* ``MarsysCheckpointer`` over ``SQLiteStore`` (a file, ``synchronous=FULL``, its default:
  every commit waits for the disk), over ``SQLiteStore(synchronous="NORMAL")`` (WAL
  commits without waiting for the disk; the last ones can be lost on power loss, never
  on a crash) and over ``InMemoryStore``;
* LangGraph's ``SqliteSaver`` (a file; langgraph-checkpoint-sqlite) and ``InMemorySaver``;
* ``LangGraph alone``: ``InMemorySaver`` with a pass-through serde (it keeps references,
  serialises nothing): what LangGraph itself costs per invoke (its ``add_messages`` over the
  whole list, channel bookkeeping), whatever the checkpointer.

For the MarsysCheckpointer rows, the time spent inside the checkpointer (``put``,
``put_writes``, ``get_tuple``, summed per invoke) is reported apart: the checkpointer's
own share, as wall time and as CPU time of the calling thread. LangGraph runs ``put`` in
a background thread while the graph goes on, so the wall time also holds waits for the
GIL and for the disk (each ``put``/``put_writes`` is a committed SQLite transaction);
the CPU time is the checkpointer's own work.

Reported per checkpointer: ms per message (= per invoke: one message each) averaged over
the first 200 and the last 200 invokes, their ratio (last / first; flat is 1.0), and the
storage at the end: the database file (plus its WAL) for the SQLite ones, the bytes held
for the in-memory ones (serialised blobs for InMemorySaver, the stored messages' JSON for
InMemoryStore). Targets (issue 11): last 200 within 1.5x of the first 200, and storage at
least 50x smaller than SqliteSaver's.
"""

from __future__ import annotations

import argparse
import gc
import os
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph

from marsys_mem.integrations.langgraph import MarsysCheckpointer
from marsys_mem.store import InMemoryStore, SQLiteStore

WINDOW = 200
TEXT = (
    "Please compare the quarterly numbers for the Dutch cargo e-bike market with last "
    "year's and tell me which of the three suppliers grew fastest, with a short reason "
    "and the one figure that matters most for our planning meeting. Turn {i}."
)


def _node(state: MessagesState) -> dict[str, Any]:
    return {}


def _graph(saver: Any) -> Any:
    builder = StateGraph(MessagesState)
    builder.add_node("agent", _node)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", END)
    return builder.compile(checkpointer=saver)


def _file_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


OWN: dict[str, tuple[list[float], list[float]]] = {}  # name -> (wall, cpu) s per invoke


class _PassThrough:
    """A serde that keeps the object itself: InMemorySaver then costs (almost) nothing."""

    def dumps_typed(self, obj: Any) -> tuple[str, Any]:
        return ("ref", obj)

    def loads_typed(self, data: tuple[str, Any]) -> Any:
        return data[1]


def _timed(saver: Any, spent: list[float]) -> Any:
    """Wrap the saver's per-invoke methods: wall time to ``spent[0]``, CPU to ``spent[2]``."""
    for name in ("put", "put_writes", "get_tuple"):
        method = getattr(saver, name)

        def wrapper(*args: Any, _method: Any = method, **kwargs: Any) -> Any:
            start, cpu = time.perf_counter(), time.thread_time()
            try:
                return _method(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - start
                spent[2] += time.thread_time() - cpu

        setattr(saver, name, wrapper)
    return saver


def _run(graph: Any, n: int, spent: list[float] | None = None) -> list[float]:
    config = {"configurable": {"thread_id": "bench"}}
    times: list[float] = []
    own: list[float] = []
    own_cpu: list[float] = []
    for i in range(n):
        message = HumanMessage(TEXT.format(i=i))
        if spent is not None:
            spent[0] = spent[2] = 0.0
        start = time.perf_counter()
        graph.invoke({"messages": [message]}, config)
        times.append(time.perf_counter() - start)
        if spent is not None:
            own.append(spent[0])
            own_cpu.append(spent[2])
    state = graph.get_state(config)
    assert len(state.values["messages"]) == n, len(state.values["messages"])
    if spent is not None:
        OWN[str(spent[1])] = (own, own_cpu)
    return times


def bench_marsys_sqlite(folder: Path, n: int, synchronous: str = "FULL") -> tuple[list[float], int]:
    path = folder / f"marsys-{synchronous}.db"
    store = SQLiteStore(path, synchronous=synchronous)  # type: ignore[arg-type]
    name = "MarsysCheckpointer[SQLiteStore" + ("]" if synchronous == "FULL" else ", NORMAL]")
    spent: list[Any] = [0.0, name, 0.0]
    times = _run(_graph(_timed(MarsysCheckpointer(store), spent)), n, spent)
    store.close()
    return times, _file_size(path)


def bench_marsys_sqlite_normal(folder: Path, n: int) -> tuple[list[float], int]:
    return bench_marsys_sqlite(folder, n, "NORMAL")


def bench_marsys_memory(folder: Path, n: int) -> tuple[list[float], int]:
    store = InMemoryStore()
    spent: list[Any] = [0.0, "MarsysCheckpointer[InMemoryStore]", 0.0]
    times = _run(_graph(_timed(MarsysCheckpointer(store), spent)), n, spent)
    size = sum(
        len(m.model_dump_json()) for key in store.list_keys() for m in store.load_messages(key)
    )
    return times, size


def bench_sqlite_saver(folder: Path, n: int) -> tuple[list[float], int]:
    path = folder / "langgraph.db"
    conn = sqlite3.connect(path, check_same_thread=False)
    times = _run(_graph(SqliteSaver(conn)), n)
    conn.close()
    return times, _file_size(path)


def bench_in_memory_saver(folder: Path, n: int) -> tuple[list[float], int]:
    saver = InMemorySaver()
    times = _run(_graph(saver), n)
    size = sum(len(b[1]) for b in saver.blobs.values())
    size += sum(len(c[0][1]) + len(c[1][1]) for ns in saver.storage.values()
                for cps in ns.values() for c in cps.values())  # fmt: skip
    size += sum(len(w[2][1]) for ws in saver.writes.values() for w in ws.values())
    return times, size


def bench_langgraph_alone(folder: Path, n: int) -> tuple[list[float], int]:
    return _run(_graph(InMemorySaver(serde=_PassThrough())), n), 0  # type: ignore[arg-type]


BENCHES: dict[str, Callable[[Path, int], tuple[list[float], int]]] = {
    "MarsysCheckpointer[SQLiteStore]": bench_marsys_sqlite,
    "MarsysCheckpointer[SQLiteStore, NORMAL]": bench_marsys_sqlite_normal,
    "MarsysCheckpointer[InMemoryStore]": bench_marsys_memory,
    "SqliteSaver": bench_sqlite_saver,
    "InMemorySaver": bench_in_memory_saver,
    "LangGraph alone": bench_langgraph_alone,
}


def _mb(size: int) -> str:
    return f"{size / 1e6:,.2f} MB" if size >= 1e5 else f"{size / 1e3:,.1f} kB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000, help="invokes (one message each)")
    parser.add_argument("--only", nargs="*", help="run only these checkpointers (names above)")
    parser.add_argument(
        "--skip-sqlite-saver", action="store_true", help="no SqliteSaver (slow): no size ratio"
    )
    args = parser.parse_args()
    n = args.messages
    window = min(WINDOW, n // 2)
    results: dict[str, tuple[float, float, int, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, bench in BENCHES.items():
            if name == "SqliteSaver" and args.skip_sqlite_saver:
                continue
            if args.only and name not in args.only and name != "SqliteSaver":
                continue
            gc.collect()
            started = time.perf_counter()
            times, size = bench(Path(tmp), n)
            total = time.perf_counter() - started
            first = 1000 * sum(times[:window]) / window
            last = 1000 * sum(times[-window:]) / window
            results[name] = (first, last, size, total)
            print(f"  {name}: done in {total:.0f} s", flush=True)
    sqlite_size = results["SqliteSaver"][2] if "SqliteSaver" in results else 0
    print(f"\n{n:,} messages, one per invoke; ms per message, first and last {window}")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus\n")
    head = f"{'checkpointer':42} {'first':>8} {'last':>8} {'last/first':>10} {'storage':>12} {'SqliteSaver/this':>17}"  # noqa: E501
    print(head)
    print("-" * len(head))
    for name, (first, last, size, _) in results.items():
        ratio = f"{sqlite_size / size:16.1f}x" if size and sqlite_size else f"{'-':>17}"
        shown = _mb(size) if size else "-"
        print(f"{name:42} {first:8.2f} {last:8.2f} {last / first:9.2f}x {shown:>12} {ratio}")
    if OWN:
        print("\ninside the checkpointer (put + put_writes + get_tuple), ms per invoke")
        for name, (own, own_cpu) in OWN.items():
            for label, values in ((" wall", own), (" CPU", own_cpu)):
                first = 1000 * sum(values[:window]) / window
                last = 1000 * sum(values[-window:]) / window
                print(f"{name + label:42} {first:8.2f} {last:8.2f} {last / first:9.2f}x")
    first, last, size, _ = results["MarsysCheckpointer[SQLiteStore]"]
    print("\nTargets (MarsysCheckpointer[SQLiteStore])")
    flat, smaller = last / first, sqlite_size / size
    verdict = {True: "PASS", False: "FAIL"}
    print(f"  per-message cost flat, last/first <= 1.5: {flat:.2f}  {verdict[flat <= 1.5]}")
    cpu = OWN.get("MarsysCheckpointer[SQLiteStore]", ([], []))[1]
    if cpu:
        own = sum(cpu[-window:]) / sum(cpu[:window])
        print(f"    of which the checkpointer's own CPU, last/first: {own:.2f}")
    if "LangGraph alone" in results:
        lg_first, lg_last = results["LangGraph alone"][:2]
        print(f"    LangGraph alone (no storage), last/first: {lg_last / lg_first:.2f}")
    if sqlite_size:
        ok = verdict[smaller >= 50]
        print(f"  storage >= 50x smaller than SqliteSaver: {smaller:.0f}x  {ok}")


if __name__ == "__main__":
    main()
