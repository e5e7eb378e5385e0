"""Coordination under pressure (issue 25 item 7a): a slow async ``on_fact`` callback is bounded.

The regression: 20,000 facts to a receiver whose async callback sleeps made one task per
fact (40,000 pending tasks, RSS 83 -> 260 MB in 10 s) and nothing showed in ``stats``.
Now each subscription runs at most ``max_tasks`` calls at once with at most ``max_queue``
waiting; the oldest waiting delivery is dropped and counted (``callbacks_*`` in ``stats``).
"""

from __future__ import annotations

import asyncio
import gc
import types
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from marsys_mem.config import CoordinatorSettings
from marsys_mem.coordination import (
    BranchGraph,
    Coordinator,
    FactDelivery,
    InProcessBroker,
    InProcessTransport,
    MqttTransport,
)
from marsys_mem.coordination.callbacks import CallbackQueue, CallbackStats
from marsys_mem.patterns.shared import SharedMemoryPool


async def until(predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def graph() -> BranchGraph:
    g = BranchGraph()
    g.add_branch("main", agents=["writer"])
    return g


def pair(broker: InProcessBroker, **knobs: Any) -> tuple[Coordinator, Coordinator]:
    ns = f"press-{uuid.uuid4().hex[:8]}"
    a = Coordinator(graph(), transport=InProcessTransport(broker, namespace=ns),
                    pool=SharedMemoryPool())
    b = Coordinator(graph(), transport=InProcessTransport(broker, namespace=ns),
                    pool=SharedMemoryPool(), settings=CoordinatorSettings(**knobs))
    return a, b


def live_coroutines() -> int:
    gc.collect()
    # type(), not isinstance(): isinstance reads ``__class__``, which some objects (torch's
    # deprecated ``reduce_op``) answer with a warning once torch is imported
    return sum(1 for o in gc.get_objects() if type(o) is types.CoroutineType)


# ---------------------------------------------------------------------------- the regression
async def test_a_slow_async_callback_over_mqtt_keeps_tasks_and_memory_bounded(mqtt_broker):
    # before: one task per fact (3,000 here); now at most max_tasks, the rest dropped
    n, max_tasks, max_queue = 3_000, 8, 100
    ns = f"press-{uuid.uuid4().hex[:8]}"

    def transport() -> MqttTransport:
        return MqttTransport(mqtt_broker.host, mqtt_broker.port, ns,
                             client_id=f"press-{uuid.uuid4().hex[:12]}",
                             protocol=mqtt_broker.protocol, clean_session=True)

    a = Coordinator(graph(), transport=transport(), pool=SharedMemoryPool())
    pool_b = SharedMemoryPool()
    b = Coordinator(graph(), transport=transport(), pool=pool_b,
                    settings=CoordinatorSettings(max_callback_tasks=max_tasks,
                                                 max_callback_queue=max_queue))
    release = asyncio.Event()
    started: list[str] = []

    async def slow(delivery: FactDelivery) -> None:
        started.append(delivery.fact.text)
        await release.wait()

    async with a, b:
        b.on_fact(slow)
        before_tasks = len(asyncio.all_tasks())
        before_coros = live_coroutines()
        peak = 0
        for i in range(n):
            await a.share("writer", f"fact {i}")
            if i % 500 == 0:
                peak = max(peak, len(asyncio.all_tasks()))
        await until(lambda: b.stats["received"] == n)
        peak = max(peak, len(asyncio.all_tasks()))
        stats = b.stats
        assert peak <= before_tasks + max_tasks
        assert live_coroutines() - before_coros < 100  # before: one per fact
        assert stats["callbacks_in_flight"] == stats["callbacks_max_in_flight"] == max_tasks
        assert stats["callbacks_queued"] == max_queue
        assert stats["callbacks_dropped"] == n - max_tasks - max_queue
        assert len(pool_b.facts_for("writer")) == n  # no fact lost: only notifications
        release.set()
        await until(lambda: b.stats["callbacks_queued"] == b.stats["callbacks_in_flight"] == 0)
        # the newest waiting deliveries were kept: the last max_queue facts
        assert started[-max_queue:] == [f"fact {i}" for i in range(n - max_queue, n)]
        assert len(started) == max_tasks + max_queue
        assert b.stats["errors"] == 0


# ---------------------------------------------------------------------------- in process
async def test_drop_oldest_keeps_the_newest_deliveries_in_order():
    a, b = pair(InProcessBroker(), max_callback_tasks=1, max_callback_queue=10)
    gate = asyncio.Event()
    seen: list[str] = []

    async def serial(delivery: FactDelivery) -> None:
        await gate.wait()
        seen.append(delivery.fact.text)

    async with a, b:
        b.on_fact(serial)
        await a.share("writer", "f0")
        await until(lambda: b.stats["callbacks_in_flight"] == 1)
        for i in range(1, 100):
            await a.share("writer", f"f{i}")
        await until(lambda: b.stats["received"] == 100)
        assert b.stats["callbacks_dropped"] == 89  # f0 is running; f90..f99 wait
        gate.set()
        await until(lambda: len(seen) == 11)
    assert seen == ["f0", *(f"f{i}" for i in range(90, 100))]
    assert b.stats["callbacks_max_in_flight"] == 1


async def test_per_subscription_limits_override_the_coordinators():
    a, b = pair(InProcessBroker())
    gate = asyncio.Event()

    async def wait(_delivery: FactDelivery) -> None:
        await gate.wait()

    async with a, b:
        b.on_fact(wait, max_tasks=2, max_queue=3)
        for i in range(20):
            await a.share("writer", f"f{i}")
            if i == 1:
                await until(lambda: b.stats["callbacks_in_flight"] == 2)
        await until(lambda: b.stats["received"] == 20)
        assert b.stats["callbacks_in_flight"] == 2
        assert b.stats["callbacks_queued"] == 3
        assert b.stats["callbacks_dropped"] == 15
        gate.set()


async def test_a_sync_callback_returning_coroutines_is_bounded_and_never_leaks_them():
    # a lambda returning a coroutine: the coroutines dropped are closed (no "never awaited"
    # warning, which filterwarnings=error would turn into a failure)
    a, b = pair(InProcessBroker(), max_callback_tasks=2, max_callback_queue=5)
    gate = asyncio.Event()
    done: list[str] = []

    async def handle(delivery: FactDelivery) -> None:
        await gate.wait()
        done.append(delivery.fact.text)

    async with a, b:
        b.on_fact(lambda d: handle(d))
        for i in range(50):
            await a.share("writer", f"f{i}")
            if i == 1:
                await until(lambda: b.stats["callbacks_in_flight"] == 2)
        await until(lambda: b.stats["received"] == 50)
        assert b.stats["callbacks_dropped"] == 43
        gate.set()
        await until(lambda: len(done) == 7)
    gc.collect()


async def test_errors_unsubscribe_and_close_are_counted():
    a, b = pair(InProcessBroker(), max_callback_tasks=1, max_callback_queue=100)
    gate = asyncio.Event()

    async def failing(_delivery: FactDelivery) -> None:
        raise RuntimeError("boom")

    async def blocked(_delivery: FactDelivery) -> None:
        await gate.wait()

    async with a, b:
        b.on_fact(failing)
        unsubscribe = b.on_fact(blocked)
        for i in range(5):
            await a.share("writer", f"f{i}")
        await until(lambda: b.stats["errors"] == 5)
        assert b.stats["callbacks_in_flight"] == 1
        assert b.stats["callbacks_queued"] == 4
        unsubscribe()  # what waits for it is dropped
        assert b.stats["callbacks_queued"] == 0
        assert b.stats["callbacks_dropped"] == 4
        b.on_fact(blocked)
        for i in range(5, 8):
            await a.share("writer", f"f{i}")
        await until(lambda: b.stats["received"] == 8)
    # close gave them a second, then cancelled the running one and dropped the rest
    assert b.stats["callbacks_in_flight"] == 0
    assert b.stats["callbacks_dropped"] == 4 + 2
    assert b.stats["errors"] == 8


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_callback_tasks": 0}, r"max_callback_tasks\n.*input_value=0,"),
        ({"max_callback_queue": -1}, r"max_callback_queue\n.*input_value=-1,"),
        ({"max_callback_queue": True}, r"max_callback_queue\n.*input_value=True,"),
        ({"max_callback_tasks": 2.5}, r"max_callback_tasks\n.*input_value=2.5,"),
    ],
)
def test_bad_limits_are_refused_with_the_field_and_value(kwargs, match):
    with pytest.raises(ValueError, match=match):  # pydantic's ValidationError is a ValueError
        Coordinator(graph(), pool=SharedMemoryPool(), settings=kwargs)


def test_bad_per_subscription_limits_change_nothing():
    coord = Coordinator(graph(), pool=SharedMemoryPool())
    with pytest.raises(ValueError, match="max_queue must be an int >= 1, got 0"):
        coord.on_fact(print, max_queue=0)
    with pytest.raises(ValueError, match="max_tasks must be an int >= 1, got '4'"):
        coord.on_fact(print, max_tasks="4")  # type: ignore[arg-type]
    assert coord._callbacks == []


async def test_the_queue_alone_counts_what_it_drops():
    stats = CallbackStats()
    seen: list[int] = []

    async def record(item: int) -> None:
        seen.append(item)

    queue = CallbackQueue(record, stats, max_tasks=3, max_queue=4)
    for i in range(10):
        queue.submit(i)
    assert stats.queued == 4
    assert stats.dropped == 6
    await queue.close(timeout=1.0)
    assert seen == [6, 7, 8, 9]
    assert stats.max_running <= 3
    assert stats.queued == stats.running == 0


def test_an_async_callback_reached_from_sync_code_is_dropped_and_counted():
    # a graph change (join) delivers the backlog from sync code: no loop to run it on
    stats = CallbackStats()

    async def record(_item: int) -> None:  # pragma: no cover - never called
        raise AssertionError

    queue = CallbackQueue(record, stats)
    queue.submit(1)
    assert stats.dropped == 1
    assert stats.queued == 0
    queue_of_coroutines = CallbackQueue(lambda item: record(item), stats)
    queue_of_coroutines.submit(2)  # the coroutine is closed: no "never awaited" warning
    assert stats.dropped == 2
