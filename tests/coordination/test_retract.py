"""Forgetting shared facts everywhere: tombstones on the wire (in process and over MQTT).

``Coordinator.retract`` sends a :class:`RetractEnvelope` (ids only) in the sender's ordered
stream: every coordinator of the namespace drops the facts from its pool, its agents'
inboxes, its log (late joiners never get them) and its manager's store, and refuses them
if they come again. With a signing transport a forged tombstone is dropped.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from marsys_mem import MemoryManager
from marsys_mem.config import MemoryConfig
from marsys_mem.coordination import (
    BranchGraph,
    Coordinator,
    InProcessBroker,
    InProcessTransport,
    MqttTransport,
    fact_topic,
)
from marsys_mem.coordination.envelope import RetractEnvelope
from marsys_mem.model.facts import fact_message
from marsys_mem.patterns.shared import SharedMemoryPool
from marsys_mem.store.keys import facts_key

KEY = "team-secret-0123456789abcdef-xyz"  # a test key, not a real secret


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.005)
    return True


@pytest.fixture(params=["inprocess", "mqtt"])
def make_transport(request: pytest.FixtureRequest) -> Callable[..., Any]:
    if request.param == "inprocess":
        broker = InProcessBroker()
        return lambda ns, **kw: InProcessTransport(broker, namespace=ns, **kw)
    mqtt = request.getfixturevalue("mqtt_broker")
    return lambda ns, **kw: MqttTransport(
        mqtt.host,
        mqtt.port,
        ns,
        client_id=f"t-{uuid.uuid4().hex[:16]}",
        reconnect_min=0.05,
        reconnect_max=0.5,
        protocol=mqtt.protocol,
        **kw,
    )


def _graph() -> BranchGraph:
    g = BranchGraph()
    g.add_branch("main", agents=["planner", "writer"])
    return g


def _texts(pool: SharedMemoryPool, agent: str = "writer") -> list[str]:
    return [f.text for f in pool.facts_for(agent)]


async def test_a_retraction_reaches_every_coordinator(
    make_transport: Callable[..., Any], tmp_path: Path
) -> None:
    ns = f"rt-{uuid.uuid4().hex[:8]}"
    store = {"backend": "sqlite", "path": str(tmp_path / "b.db"), "namespace": ns}
    config = MemoryConfig.model_validate({"version": 1, "store": store})
    manager_b = MemoryManager(config)
    pool_a = SharedMemoryPool()
    a = Coordinator(_graph(), transport=make_transport(ns, signing_key=KEY), pool=pool_a)
    b = Coordinator(
        _graph(), manager_b, transport=make_transport(ns, signing_key=KEY), pool=manager_b.shared
    )
    try:
        async with a, b:
            keep = await a.share("planner", "Hotels cost 140 EUR", scope="global")
            drop = await a.share("planner", "The door code is DOOR-2468", scope="global")
            assert await until(lambda: len(_texts(manager_b.shared)) == 2)
            record = facts_key(ns, "main")  # what b's side recorded in its store
            manager_b.store.append_messages(record, [fact_message(drop)])

            removed = await a.retract([drop.id])
            assert [f.id for f in removed] == [drop.id]
            assert _texts(pool_a) == ["Hotels cost 140 EUR"]  # here at once
            assert await until(lambda: _texts(manager_b.shared) == ["Hotels cost 140 EUR"])
            assert b.stats["retracted"] == 1
            assert manager_b.store.count_messages(record) == 0  # b's store forgot it too
            assert [f.id for f in b.facts()] == [keep.id]  # its log too: late joiners
            b.join("critic")
            assert _texts(manager_b.shared, "critic") == ["Hotels cost 140 EUR"]
            manager_b.shared.add_fact(drop)  # a late copy is refused
            assert "The door code is DOOR-2468" not in _texts(manager_b.shared)
    finally:
        manager_b.close()
    assert b"DOOR-2468" not in (tmp_path / "b.db").read_bytes()


async def test_a_forged_tombstone_is_dropped(make_transport: Callable[..., Any]) -> None:
    ns = f"rt-{uuid.uuid4().hex[:8]}"
    pool_b = SharedMemoryPool()
    a = Coordinator(
        _graph(), transport=make_transport(ns, signing_key=KEY), pool=SharedMemoryPool()
    )
    b = Coordinator(_graph(), transport=make_transport(ns, signing_key=KEY), pool=pool_b)
    attacker = make_transport(ns)  # no key
    async with a, b, attacker:
        fact = await a.share("planner", "Hotels cost 140 EUR", scope="global")
        assert await until(lambda: _texts(pool_b) == ["Hotels cost 140 EUR"])
        forged = RetractEnvelope(
            namespace=ns, sender=a.sender_id, epoch=a.epoch, seq=2, branch="main",
            fact_ids=(fact.id,),
        )
        await attacker.publish(fact_topic(ns, "main"), forged.model_dump_json().encode())
        assert await until(lambda: b.stats["unsigned"] == 1)
        assert _texts(pool_b) == ["Hotels cost 140 EUR"]


def test_a_tombstone_carries_ids_only() -> None:
    env = RetractEnvelope(namespace="t", sender="c", seq=1, branch="main", fact_ids=("f1",))
    assert set(env.model_dump()) == {
        "v", "kind", "namespace", "sender", "epoch", "seq", "branch", "fact_ids"
    }
    with pytest.raises(ValueError, match="fact_ids"):
        RetractEnvelope(namespace="t", sender="c", seq=1, branch="main", fact_ids=())
