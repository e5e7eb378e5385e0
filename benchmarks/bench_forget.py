"""Ownership and forgetting: what cascades cost, against the code before them (main).

Every derived record (a RAG copy, a tier entry, a learned fact) now names the messages it
came from, and deleting a message deletes what was derived only from it, in the same
transaction, with every deletion logged for other processes (``marsys_mem.store.owners``).
This script measures what that costs on SQLite (WAL, ``synchronous=FULL``), on the same
workloads, for this tree and for a baseline tree (default: commit 85cf284, the last one
before the change, checked out with ``git worktree`` into a temporary folder), each side
in its own subprocess importing its own ``marsys_mem``:

* **append, one at a time**: 2,000 single-message appends to a conversation key.
* **append with copies**: 20,000 messages in batches of 64, each batch appended to the
  conversation and (a RAG copy) to a second key; ours links each copy to its message,
  the baseline writes the copies unlinked (what it did).
* **manager add**: 1,000 ``memory.add`` on a persistent agent with RAG (hashing embedder,
  so the model is not what is timed): the whole write path, patterns included.
* **forget one**: 10,000 messages and their copies; delete one message. Ours: the copy
  goes by cascade; the baseline deletes message and copy in one batch (what its
  ``forget`` did).
* **forget 100k**: 100,000 messages and copies; delete the conversation (ours: cascade;
  the baseline: both keys in one batch).
* **retention sweep 100k**: 100,000 messages and copies, half older than the ttl; ours:
  one ``enforce_retention`` on the conversation (copies cascade); the baseline: the same
  sweep on both keys (it could not reach the copies otherwise).

Each number is the median of ``--repeats`` samples, each on a fresh store in a fresh
folder. The ratio is ours / baseline for times (lower is better) and baseline / ours for
rates, so above 1.0 ours is slower.

Usage: ``python benchmarks/bench_forget.py [--baseline DIR] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

BASELINE_COMMIT = "85cf284"
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


# ---------------------------------------------------------------------- worker side
def _messages(n: int, *, old: int = 0) -> list[Any]:
    from marsys_mem import Message

    now = datetime.now(UTC)
    then = now - timedelta(days=2)
    return [
        Message.user(f"message {i} about the harbour and the ships {i % 97}",
                     timestamp=then if i < old else now)
        for i in range(n)
    ]


def _copies_op(key: Any, messages: list[Any], owner: Any) -> Any:
    from marsys_mem.store.base import Append

    if _linked():  # this tree: the copies' key holds copies of the conversation
        return Append(key, tuple(messages), copies_of=owner)
    return Append(key, tuple(messages))  # the baseline: copies are not linked


def _filled(folder: Path, n: int, *, old: int = 0) -> tuple[Any, Any, Any]:
    from marsys_mem.store import SQLiteStore

    store = SQLiteStore(folder / "m.db")
    chat, rag = ("d", "a", "main"), ("d", "a", "copies")
    msgs = _messages(n, old=old)
    for start in range(0, n, 1000):
        batch = msgs[start : start + 1000]
        store.append_messages(chat, batch)
        store.batch([_copies_op(rag, batch, chat)])
    return store, chat, rag


def _linked() -> bool:
    try:
        import marsys_mem.store.owners  # noqa: F401
    except ImportError:
        return False
    return True


def w_append_one(folder: Path) -> float:
    from marsys_mem.store import SQLiteStore

    store = SQLiteStore(folder / "m.db")
    msgs = _messages(2000)
    start = time.perf_counter()
    for m in msgs:
        store.append_messages(("d", "a", "main"), [m])
    elapsed = time.perf_counter() - start
    store.close()
    return len(msgs) / elapsed


def w_append_copies(folder: Path) -> float:
    from marsys_mem.store import SQLiteStore

    store = SQLiteStore(folder / "m.db")
    chat, rag = ("d", "a", "main"), ("d", "a", "copies")
    msgs = _messages(20_000)
    start = time.perf_counter()
    for i in range(0, len(msgs), 64):
        batch = msgs[i : i + 64]
        store.append_messages(chat, batch)
        store.batch([_copies_op(rag, batch, chat)])
    elapsed = time.perf_counter() - start
    store.close()
    return len(msgs) / elapsed


def w_manager_add(folder: Path) -> float:
    from marsys_mem import MemoryManager
    from marsys_mem.config import MemoryConfig

    config = MemoryConfig.model_validate(
        {
            "version": 1,
            "store": {"backend": "sqlite", "path": str(folder / "m.db")},
            "agents": {
                "a": {"retention": "persistent", "patterns": {"embedder": "hashing", "rag": True}}
            },
        }
    )
    msgs = _messages(1000)
    with MemoryManager(config) as manager:
        mem = manager.memory("a")
        start = time.perf_counter()
        for m in msgs:
            mem.add(m)
        manager.flush()
        elapsed = time.perf_counter() - start
    return len(msgs) / elapsed


def w_forget_one(folder: Path) -> float:
    store, chat, rag = _filled(folder, 10_000)
    ids = [m.message_id for m in store.load_messages(chat)][::200]
    from marsys_mem.store.base import Delete

    times = []
    for mid in ids:
        ops = [Delete(chat, (mid,))] if _linked() else [Delete(chat, (mid,)), Delete(rag, (mid,))]
        start = time.perf_counter()
        store.batch(ops)
        times.append(time.perf_counter() - start)
    assert store.count_messages(rag) == 10_000 - len(ids)
    store.close()
    return statistics.median(times) * 1000


def w_forget_all(folder: Path) -> float:
    store, chat, rag = _filled(folder, 100_000)
    from marsys_mem.store.base import Delete

    ops = [Delete(chat)] if _linked() else [Delete(chat), Delete(rag)]
    start = time.perf_counter()
    store.batch(ops)
    elapsed = time.perf_counter() - start
    assert store.count_messages(rag) == 0
    store.close()
    return elapsed * 1000


def w_sweep(folder: Path) -> float:
    store, chat, rag = _filled(folder, 100_000, old=50_000)
    from marsys_mem.store.base import EnforceRetention

    now, ttl = datetime.now(UTC), timedelta(days=1)
    ops = [EnforceRetention(chat, ttl, None, now)]
    if not _linked():
        ops.append(EnforceRetention(rag, ttl, None, now))
    start = time.perf_counter()
    store.batch(ops)
    elapsed = time.perf_counter() - start
    assert store.count_messages(rag) == 50_000
    store.close()
    return elapsed * 1000


WORKLOADS: dict[str, tuple[str, str, Callable[[Path], float]]] = {
    "append_one": ("append, one at a time", "msgs/s", w_append_one),
    "append_copies": ("append with copies (batches of 64)", "msgs/s", w_append_copies),
    "manager_add": ("manager add (persistent, RAG)", "msgs/s", w_manager_add),
    "forget_one": ("forget one of 10k (+ copy)", "ms", w_forget_one),
    "forget_all": ("forget 100k (+ copies)", "ms", w_forget_all),
    "sweep": ("retention sweep: 50k of 100k (+ copies)", "ms", w_sweep),
}


def worker(repeats: int) -> None:
    import logging

    logging.disable(logging.WARNING)
    results: dict[str, float] = {}
    for name, (_, _, fn) in WORKLOADS.items():
        samples = []
        for _ in range(repeats):
            folder = Path(tempfile.mkdtemp(prefix="bench-forget-"))
            try:
                samples.append(fn(folder))
            finally:
                shutil.rmtree(folder, ignore_errors=True)
        results[name] = statistics.median(samples)
    print(json.dumps(results))


# ---------------------------------------------------------------------- driver side
def _baseline(path: str | None) -> tuple[Path, Callable[[], None]]:
    if path is not None:
        return Path(path), lambda: None
    folder = Path(tempfile.mkdtemp(prefix="bench-forget-baseline-")) / "tree"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(folder),
         BASELINE_COMMIT],
        check=True,
        capture_output=True,
    )

    def remove() -> None:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(folder)],
            check=False,
            capture_output=True,
        )

    return folder, remove


def _run(tree: Path, repeats: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--worker", "--repeats", str(repeats)],
        env=env,
        cwd=str(tree),
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--baseline", help=f"a checkout to compare with (default: {BASELINE_COMMIT})"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.repeats)
        return
    baseline, cleanup = _baseline(args.baseline)
    try:
        ours = _run(ROOT, args.repeats)
        base = _run(baseline, args.repeats)
    finally:
        cleanup()
    print(f"SQLite, medians of {args.repeats}; baseline {args.baseline or BASELINE_COMMIT}")
    print("| workload | unit | ours (cascades) | baseline | ours vs baseline |")
    print("|:---|:---|---:|---:|---:|")
    for name, (label, unit, _) in WORKLOADS.items():
        a, b = ours[name], base[name]
        ratio = b / a if unit == "msgs/s" else a / b  # > 1: ours is slower
        print(f"| {label} | {unit} | {a:,.1f} | {b:,.1f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
