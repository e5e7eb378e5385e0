"""PostgresStore's async twins: psycopg's async pool against the sync batch in threads.

``--tasks`` concurrent coroutines on one event loop, each one async append (one message,
to one of 20 keys), then each one async load of a key's newest 20 messages, on a
PostgreSQL the script starts itself (initdb + pg_ctl on a free loopback port, ``fsync``
off), both stores with the same pool size (``--pool``):

* **async pool**: ``PostgresStore`` (its ``_abatch``: the batch code awaited on the loop
  over a :class:`psycopg_pool.AsyncConnectionPool`);
* **threads**: the same store whose ``_abatch`` is ``MemoryStore``'s (the sync batch in
  ``asyncio.to_thread``, as every async twin ran before).

Throughput is operations per second of the whole wave; p50/p95 the latency of one
operation (from its start, so it includes the wait for a connection); both pools are
grown to their size first. Medians of
``--repeats`` waves, each on a fresh schema. Run it::

    python benchmarks/bench_pg_async.py            # about a minute on 2 cores
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from marsys_mem.model.messages import Message
from marsys_mem.store.base import MemoryStore, Op
from marsys_mem.store.postgres import PostgresStore
from marsys_mem.testing.postgres import PostgresServer

_schemas = itertools.count()


class ThreadedPostgresStore(PostgresStore):
    """The previous async twins: the sync batch in a worker thread."""

    async def _abatch(self, ops: Sequence[Op]) -> list[Any]:
        return await MemoryStore._abatch(self, ops)


async def wave(calls: list[Callable[[], Awaitable[Any]]]) -> tuple[float, list[float]]:
    """Run every call at once; the wave's seconds and each call's latency."""

    async def timed(call: Callable[[], Awaitable[Any]]) -> float:
        t0 = time.perf_counter()
        await call()
        return time.perf_counter() - t0

    t0 = time.perf_counter()
    latencies = await asyncio.gather(*(timed(c) for c in calls))
    return time.perf_counter() - t0, list(latencies)


def measure(store: PostgresStore, tasks: int, pool: int) -> dict[str, tuple[float, float, float]]:
    """ops/s, p50 ms, p95 ms of a wave of appends, then of loads."""
    keys = [("bench", f"agent{i}", "main") for i in range(20)]

    async def scenario() -> dict[str, tuple[float, float, float]]:
        await store.aappend_messages(keys[0], [Message.user("warm-up")])  # opens the pool
        for _ in range(3):  # both pools grown to their size before the waves
            await asyncio.gather(*(store.aload_messages(keys[0]) for _ in range(4 * pool)))
        out = {}
        appends = [
            (lambda i=i: store.aappend_messages(keys[i % 20], [Message.user(f"turn {i}")]))
            for i in range(tasks)
        ]
        loads = [(lambda i=i: store.aload_messages(keys[i % 20], last=20)) for i in range(tasks)]
        for name, calls in (("append", appends), ("load", loads)):
            seconds, lat = await wave(calls)
            lat.sort()
            out[name] = (
                tasks / seconds,
                1000 * lat[len(lat) // 2],
                1000 * lat[int(len(lat) * 0.95)],
            )
        return out

    return asyncio.run(scenario())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--pool", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    kinds: dict[str, type[PostgresStore]] = {
        "async pool": PostgresStore,
        "threads": ThreadedPostgresStore,
    }
    samples: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    with PostgresServer(settings={"fsync": "off"}) as server:
        for _ in range(args.repeats):
            for kind, cls in kinds.items():  # interleaved: both see the same machine
                with cls(server.create_schema(f"b{next(_schemas)}"), max_size=args.pool) as s:
                    for op, numbers in measure(s, args.tasks, args.pool).items():
                        samples.setdefault((op, kind), []).append(numbers)
    print(f"{args.tasks} concurrent async calls, pool of {args.pool}, medians of {args.repeats}")
    print("| op | async pool ops/s | p50 | p95 | threads ops/s | p50 | p95 | ratio (ops/s) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for op in ("append", "load"):
        a, t = (
            [statistics.median(x[j] for x in samples[(op, kind)]) for j in range(3)]
            for kind in kinds
        )
        print(
            f"| {op} | {a[0]:,.0f} | {a[1]:.1f} ms | {a[2]:.1f} ms "
            f"| {t[0]:,.0f} | {t[1]:.1f} ms | {t[2]:.1f} ms | {a[0] / t[0]:.2f}x |"
        )


if __name__ == "__main__":
    main()
