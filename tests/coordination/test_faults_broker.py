"""Fault suite: a broker killed with SIGKILL mid-stream, and a coordinator restarted.

Each test reports acknowledged vs delivered (``-rP`` or ``-s`` shows the lines) and asserts
0 lost and 0 applied twice. The broker is mosquitto with persistence on (``autosave_interval
1``), killed with SIGKILL, so what it had acknowledged but not yet saved or forwarded is gone
from the broker: the coordinators must repair that end to end (the receiver notices the gap,
or the sender's high-water mark shows it, and asks the sender to send again).
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from marsys_mem.coordination import (
    BranchGraph,
    Coordinator,
    InProcessBroker,
    InProcessTransport,
    MqttTransport,
)
from marsys_mem.patterns.shared import SharedMemoryPool

TRIALS = 10
FACTS = 2000  # per trial: the whole file runs in well under a minute
WINDOW = 32  # shares in flight at once (unacknowledged publishes)


async def until(predicate: Callable[[], bool], timeout: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def graph() -> BranchGraph:
    g = BranchGraph()
    g.add_branch("main", agents=["planner", "writer"])
    return g


def transport(broker: Any, ns: str, client_id: str) -> MqttTransport:
    return MqttTransport(broker.host, broker.port, ns, client_id=client_id,
                         reconnect_min=0.05, reconnect_max=0.3, protocol=broker.protocol)


async def one_trial(broker: Any, trial: int, rng: random.Random) -> tuple[int, int, int, int]:
    """Stream FACTS facts, SIGKILL the broker once in the middle (or at the very end).

    Returns (acknowledged, delivered once, delivered twice or more, sent again on request).
    """
    ns = f"crash-{uuid.uuid4().hex[:8]}"
    received: Counter[str] = Counter()
    sender = Coordinator(graph(), transport=transport(broker, ns, f"s-{ns}"),
                         pool=SharedMemoryPool())
    receiver = Coordinator(graph(), transport=transport(broker, ns, f"r-{ns}"),
                           pool=SharedMemoryPool())
    receiver.on_fact(lambda d: received.update([d.fact.text]), agent="writer")
    acknowledged: list[str] = []
    # the last trials crash after the last share: nothing later shows the loss
    kill_at = FACTS - WINDOW if trial >= TRIALS - 2 else rng.randrange(FACTS // 5, FACTS * 4 // 5)
    texts = iter(range(FACTS))

    async def share() -> None:
        for i in texts:
            text = f"trial {trial} fact {i}"
            await sender.share("planner", text)
            acknowledged.append(text)

    async def crash() -> None:
        await until(lambda: len(acknowledged) >= kill_at, 60)
        await asyncio.to_thread(broker.crash_restart, rng.uniform(0.05, 0.5))

    async with sender, receiver:
        await asyncio.gather(crash(), *(share() for _ in range(WINDOW)))
        await until(lambda: all(received[t] for t in acknowledged), 30)
        await asyncio.sleep(0.2)  # anything sent twice has arrived by now
    once = sum(1 for t in acknowledged if received[t] == 1)
    twice = sum(1 for n in received.values() if n > 1)
    return len(acknowledged), once, twice, sender.stats["resent"]


async def test_broker_sigkill_mid_stream_loses_nothing_acknowledged(crash_broker):
    rng = random.Random(9)
    totals = [0, 0, 0, 0]
    lost_trials = repaired_trials = 0
    for trial in range(TRIALS):
        acked, once, twice, resent = await one_trial(crash_broker, trial, rng)
        for i, n in enumerate((acked, once, twice, resent)):
            totals[i] += n
        lost_trials += once < acked
        repaired_trials += resent > 0
    print(f"broker SIGKILL x{TRIALS}: acknowledged {totals[0]}, delivered once {totals[1]}, "
          f"lost {totals[0] - totals[1]}, applied twice {totals[2]} ({lost_trials} trials with "
          f"a loss); sent again on request {totals[3]} ({repaired_trials} trials)")
    assert totals[0] == TRIALS * FACTS
    assert totals[3] > 0, "no crash lost anything: the test did not test the repair"
    assert totals[2] == 0, "facts applied twice"
    assert totals[1] == totals[0], f"{totals[0] - totals[1]} acknowledged facts lost"


async def test_facts_queued_for_an_absent_receiver_survive_a_broker_sigkill(crash_broker):
    # the receiver is away (its persistent session queues for it); the broker crashes
    # before it saved that queue; the receiver comes back to an empty queue, and nothing
    # more is shared: only the sender's high-water mark shows what is missing
    ns = f"away-{uuid.uuid4().hex[:8]}"
    received: Counter[str] = Counter()
    pool = SharedMemoryPool()
    sender = Coordinator(graph(), transport=transport(crash_broker, ns, f"s-{ns}"),
                         pool=SharedMemoryPool())
    receiver = Coordinator(graph(), transport=transport(crash_broker, ns, f"r-{ns}"), pool=pool)
    receiver.on_fact(lambda d: received.update([d.fact.text]), agent="writer")
    async with sender:
        async with receiver:
            await sender.share("planner", "before")
            await until(lambda: received["before"] == 1, 10)
        away = [f"while away {i}" for i in range(20)]
        for text in away:
            await sender.share("planner", text)
        await asyncio.to_thread(crash_broker.crash_restart, 0.1)
        async with receiver:  # the same receiver, back (e.g. after a network outage)
            await until(lambda: all(received[t] for t in away), 20)
            await asyncio.sleep(0.2)
    print(f"receiver away during a broker SIGKILL: acknowledged {len(away)}, "
          f"delivered {sum(1 for t in away if received[t])}, resent {sender.stats['resent']}")
    assert [received[t] for t in away] == [1] * len(away)
    assert [f.text for f in pool.facts_for("writer")] == ["before", *away]  # in order, too


# ---------------------------------------------------------------------------- restarts
@pytest.mark.parametrize("kind", ["inprocess", "mqtt"])
async def test_a_restarted_coordinator_is_heard_again(kind, crash_broker):
    # same sender id, a new process: its sequence starts again, its facts still arrive
    ns = f"restart-{uuid.uuid4().hex[:8]}"
    inproc = InProcessBroker()

    def make(client_id: str) -> InProcessTransport | MqttTransport:
        if kind == "inprocess":
            return InProcessTransport(inproc, namespace=ns, client_id=client_id)
        return transport(crash_broker, ns, client_id)

    deliveries: Counter[str] = Counter()
    receiver = Coordinator(graph(), transport=make(f"r-{ns}"), pool=SharedMemoryPool())
    receiver.on_fact(lambda d: deliveries.update([d.fact.text]), agent="writer")
    async with receiver:
        for run in range(3):  # three lives of the same coordinator
            sender = Coordinator(graph(), transport=make(f"s-{ns}"), pool=SharedMemoryPool(),
                                 sender_id="planner-group")
            async with sender:
                for i in range(3):
                    await sender.share("planner", f"life {run} fact {i}")
                await until(lambda r=run: deliveries[f"life {r} fact 2"] > 0, 10)
        await asyncio.sleep(0.2)
    expected = [f"life {r} fact {i}" for r in range(3) for i in range(3)]
    print(f"coordinator restarted x2 ({kind}): acknowledged {len(expected)}, "
          f"delivered {sum(1 for t in expected if deliveries[t])}")
    assert [deliveries[t] for t in expected] == [1] * len(expected)
    assert [f.text for f in receiver.facts_for("writer")] == expected
