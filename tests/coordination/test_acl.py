"""The mosquitto example (examples/mosquitto/): one user per namespace, confined by the ACL.

A real mosquitto runs with ``examples/mosquitto/mosquitto.conf`` (only its listener and
file paths rewritten for the test) and ``examples/mosquitto/acl`` exactly as shipped; the
password file is made with ``mosquitto_passwd -b`` as the example's README says.

How "never delivered" is shown without waiting on a clock: mosquitto routes a PUBLISH to
its subscribers before it acknowledges it, and delivers to one subscriber in routing
order. So a message published after the intruder's acknowledged publish reaches a
subscriber after the intruder's would have; once it is there, the intruder's is not coming.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path

import aiomqtt
import pytest

from marsys_mem.coordination import (
    BranchGraph,
    Coordinator,
    FactEnvelope,
    MqttTransport,
    fact_topic,
)
from marsys_mem.exceptions import AuthenticationError
from marsys_mem.model.facts import SharedFact
from marsys_mem.patterns.shared import SharedMemoryPool
from tests.coordination.conftest import Broker, _mosquitto_passwd

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mosquitto"
USERS = {"team-a": "password-a-for-tests", "team-b": "password-b-for-tests"}


class ExampleBroker(Broker):
    """mosquitto with the example's configuration, ACL and a password file per the recipe."""

    def _mosquitto_config(self) -> Path:
        passwd_exe = _mosquitto_passwd()
        if passwd_exe is None:
            pytest.fail("mosquitto_passwd is missing (apt-get install mosquitto)")
        pwfile = self.workdir / "marsys-passwd"
        pwfile.touch(mode=0o600)
        for user, password in (self.users or {}).items():
            subprocess.run([passwd_exe, "-b", str(pwfile), user, password], check=True)
        acl = self.workdir / "marsys-acl"
        acl.write_bytes((EXAMPLE / "acl").read_bytes())
        rewrite = {
            "listener": f"listener {self.port} 127.0.0.1",
            "password_file": f"password_file {pwfile}",
            "acl_file": f"acl_file {acl}",
            "persistence_location": f"persistence_location {self.workdir}/",
        }
        lines, seen = [], set()
        for line in (EXAMPLE / "mosquitto.conf").read_text().splitlines():
            word = line.split(" ", 1)[0]
            if word in rewrite:
                seen.add(word)
                line = rewrite[word]
            lines.append(line)
        assert seen == set(rewrite), f"the example config lacks {set(rewrite) - seen}"
        if os.geteuid() == 0:
            lines.append("user root")  # else mosquitto drops to 'mosquitto': tmp not writable
        conf = self.workdir / "mosquitto.conf"
        conf.write_text("\n".join(lines) + "\n")
        return conf


@pytest.fixture(scope="module")
def example_broker(tmp_path_factory: pytest.TempPathFactory):
    broker = ExampleBroker(tmp_path_factory.mktemp("mqtt-acl"), users=USERS)
    if broker.kind != "mosquitto":
        pytest.fail("the ACL example is mosquitto's: install mosquitto (apt-get install mosquitto)")
    broker.start()
    yield broker
    broker.stop()


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.005)
    return True


def coordinator(broker: Broker, user: str, pool: SharedMemoryPool, *, namespace: str | None = None,
                password: str | None = None) -> Coordinator:
    graph = BranchGraph()
    graph.add_branch("main", agents=["writer"])
    transport = MqttTransport(
        broker.host, broker.port, namespace or user, client_id=f"{user}-{uuid.uuid4().hex[:8]}",
        username=user, password=password or USERS[user], reconnect_min=0.05, reconnect_max=0.5,
        connect_timeout=5.0,
    )
    return Coordinator(graph, transport=transport, pool=pool)


def texts(pool: SharedMemoryPool) -> list[str]:
    return [f.text for f in pool.facts_for("writer")]


def test_the_example_files_are_what_the_docs_say():
    acl = (EXAMPLE / "acl").read_text()
    rules = [line for line in acl.splitlines() if line and not line.startswith("#")]
    assert rules == ["pattern readwrite marsys/%u/#"]
    conf = (EXAMPLE / "mosquitto.conf").read_text()
    assert re.search(r"^allow_anonymous false$", conf, re.M)
    readme = (EXAMPLE / "README.md").read_text()
    assert "mosquitto_passwd -b" in readme
    assert "signing_key=" in readme


async def test_each_namespace_user_is_confined_to_its_own_topics(example_broker):
    pool_a1, pool_a2, pool_b1, pool_b2 = (SharedMemoryPool() for _ in range(4))
    a1, a2 = coordinator(example_broker, "team-a", pool_a1), coordinator(example_broker, "team-a",
                                                                          pool_a2)
    b1, b2 = coordinator(example_broker, "team-b", pool_b1), coordinator(example_broker, "team-b",
                                                                          pool_b2)
    seen_by_intruder: list[str] = []
    async with a1, a2, b1, b2, aiomqtt.Client(
        example_broker.host, example_broker.port, identifier=f"intruder-{uuid.uuid4().hex[:8]}",
        username="team-a", password=USERS["team-a"], protocol=aiomqtt.ProtocolVersion.V5,
    ) as intruder:
        # each namespace's own traffic flows
        await a1.share("writer", "a fact")
        await b1.share("writer", "b fact")
        assert await until(lambda: texts(pool_a2) == ["a fact"] and texts(pool_b2) == ["b fact"])

        # team-a's user, as a raw client, tries to read every namespace and to write into
        # team-b's, forging b1's sender id with a higher seq (what silenced b1 before)
        for flt in ("#", "marsys/#", "marsys/+/branch/+/facts", "marsys/team-b/branch/+/facts"):
            await intruder.subscribe(flt, qos=1)  # mosquitto grants it, then filters by ACL

        async def listen() -> None:
            async for message in intruder.messages:
                seen_by_intruder.append(message.topic.value)

        task = asyncio.get_running_loop().create_task(listen())
        fact = SharedFact.create("forged by team-a", agent="writer")
        forged = FactEnvelope(namespace="team-b", sender=b1.sender_id, seq=1_000_000,
                              branch="main", scope="branch", fact=fact)
        await intruder.publish(fact_topic("team-b", "main"), forged.model_dump_json().encode(),
                               qos=1)  # acknowledged, and dropped by the broker
        await b1.share("writer", "b after the intrusion")  # routed after the forged one
        await a1.share("writer", "a after the intrusion")  # routed after b1's
        assert await until(lambda: len(texts(pool_b2)) == 2 and len(texts(pool_a2)) == 2)
        assert await until(lambda: fact_topic("team-a", "main") in seen_by_intruder)
        task.cancel()

        # team-b got neither the forged fact nor a gap from it; team-a read nothing of team-b
        assert texts(pool_b2) == ["b fact", "b after the intrusion"]
        assert b2.stats["received"] == 2
        assert b2.stats["malformed"] == b2.stats["duplicates"] == b2.stats["gaps"] == 0
        assert set(seen_by_intruder) == {fact_topic("team-a", "main")}
        assert texts(pool_a2) == ["a fact", "a after the intrusion"]


async def test_a_coordinator_logged_in_as_another_namespace_hears_nothing(example_broker):
    # a coordinator of team-b that logs in with team-a's credentials: connects (mosquitto
    # grants the subscription) but nothing of team-b reaches it, and what it shares is dropped
    pool_spy, pool_b2, pool_a2 = SharedMemoryPool(), SharedMemoryPool(), SharedMemoryPool()
    spy = coordinator(example_broker, "team-a", pool_spy, namespace="team-b")
    b1 = coordinator(example_broker, "team-b", SharedMemoryPool())
    b2 = coordinator(example_broker, "team-b", pool_b2)
    a2 = coordinator(example_broker, "team-a", pool_a2)
    async with spy, b1, b2, a2:
        await spy.share("writer", "from the wrong user")  # acknowledged, dropped by the broker
        await b1.share("writer", "team-b only")  # routed after the spy's
        assert await until(lambda: texts(pool_b2) == ["team-b only"])
        await asyncio.sleep(0.1)  # the spy's copy of b1's fact would be as quick as b2's
        assert b2.stats["received"] == 1
        assert spy.stats["received"] == 0
        assert texts(pool_spy) == ["from the wrong user"]  # its own, delivered locally only
        assert texts(pool_a2) == []  # and nothing leaked sideways into team-a


async def test_a_wrong_password_is_refused(example_broker):
    coord = coordinator(example_broker, "team-a", SharedMemoryPool(), password="not-the-one")
    with pytest.raises(AuthenticationError, match="refused"):
        async with coord:
            pass
