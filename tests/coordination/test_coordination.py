"""The coordination suite: every behaviour test runs in process and through a real broker."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from marsys_mem.config import CoordinatorSettings
from marsys_mem.conversation import ConversationMemory
from marsys_mem.coordination import (
    BranchGraph,
    Coordinator,
    FactDelivery,
    FactEnvelope,
    InProcessBroker,
    InProcessTransport,
    MqttTransport,
    fact_topic,
)
from marsys_mem.coordination.envelope import HighWaterMark, ResendRequest
from marsys_mem.coordination.repair import Outbox
from marsys_mem.coordination.wire import control_topic
from marsys_mem.exceptions import (
    AuthenticationError,
    BranchError,
    CoordinationError,
    TransportError,
    UnknownBranchError,
)
from marsys_mem.manager import MemoryManager
from marsys_mem.model.facts import SharedFact
from marsys_mem.model.messages import Message
from marsys_mem.model.names import inbox_key
from marsys_mem.patterns.shared import SharedMemoryPool

WAIT = 10.0  # upper bound of any single wait


async def until(predicate: Callable[[], bool], timeout: float = WAIT) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.005)


async def settle(coord: Coordinator, received: int, timeout: float = WAIT) -> None:
    """Wait until ``coord`` has taken ``received`` payloads off the wire."""
    await until(lambda: coord.stats["received"] >= received, timeout)


class Net:
    """Makes transports of one kind (in process or MQTT) on one broker."""

    def __init__(self, kind: str, broker: Any) -> None:
        self.kind = kind
        self.broker = broker

    def transport(
        self, namespace: str, client_id: str | None = None, *, max_payload: int = 64 * 1024,
        **kwargs: Any,
    ) -> Any:
        if self.kind == "inprocess":
            return InProcessTransport(self.broker, namespace=namespace, client_id=client_id,
                                      max_payload=max_payload)
        return MqttTransport(
            self.broker.host, self.broker.port, namespace,
            client_id=client_id or f"t-{uuid.uuid4().hex[:16]}", max_payload=max_payload,
            reconnect_min=0.05, reconnect_max=0.5, protocol=self.broker.protocol, **kwargs,
        )

    def raw(self, namespace: str) -> Any:
        """A transport that publishes anything (up to 1 MiB) on the namespace's topics."""
        return self.transport(namespace, max_payload=1024 * 1024)


@pytest.fixture(params=["inprocess", "mqtt"])
def net(request: pytest.FixtureRequest) -> Net:
    if request.param == "inprocess":
        return Net("inprocess", InProcessBroker())
    return Net("mqtt", request.getfixturevalue("mqtt_broker"))


@pytest.fixture
def ns() -> str:
    return f"ns-{uuid.uuid4().hex[:10]}"


def fork_tree() -> BranchGraph:
    #          main (planner, writer)
    #         /                      \
    #    r1 (researcher)          r2 (critic)
    #        |
    #    r1a (researcher, scout)
    g = BranchGraph()
    g.add_branch("main", agents=["planner", "writer"])
    g.fork("main", "r1", agents=["researcher"])
    g.fork("main", "r2", agents=["critic"])
    g.fork("r1", "r1a", agents=["researcher", "scout"])
    return g


ALL = {("planner", "main"), ("writer", "main"), ("researcher", "r1"), ("critic", "r2"),
       ("researcher", "r1a"), ("scout", "r1a")}


def holders(pool: SharedMemoryPool, fact_id: str) -> set[tuple[str, str]]:
    return {(a, b) for a, b in ALL if pool.has(inbox_key(a, b), fact_id)}


def envelope(ns: str, seq: int, text: str, *, sender: str = "raw-sender", branch: str = "main",
             scope: str = "global") -> FactEnvelope:
    fact = SharedFact.create(text, agent="outsider", branch=branch, scope=scope)  # type: ignore[arg-type]
    return FactEnvelope(namespace=ns, sender=sender, seq=seq, branch=branch, scope=scope,  # type: ignore[arg-type]
                        fact=fact)


def raw_bytes(env: FactEnvelope) -> bytes:
    return env.model_dump_json().encode()


# ---------------------------------------------------------------------------- scopes
async def test_scope_semantics_across_a_fork_tree(net, ns):
    graph = fork_tree()
    pool_a, pool_b = SharedMemoryPool(), SharedMemoryPool()
    a = Coordinator(graph, transport=net.transport(ns), pool=pool_a)
    b = Coordinator(graph, transport=net.transport(ns), pool=pool_b)
    async with a, b:
        shared = {
            "branch": await a.share("researcher", "r1 branch fact", branch="r1", scope="branch"),
            "subtree": await a.share("researcher", "r1 subtree fact", branch="r1",
                                     scope="subtree"),
            "lineage": await a.share("researcher", "r1 lineage fact", branch="r1",
                                     scope="lineage"),
            "global": await a.share("critic", "r2 global fact", branch="r2", scope="global"),
            "leaf": await a.share("scout", "r1a lineage fact", branch="r1a", scope="lineage"),
        }
        await settle(b, 5)
    expected = {
        "branch": {("researcher", "r1")},
        "subtree": {("researcher", "r1"), ("researcher", "r1a"), ("scout", "r1a")},
        "lineage": {("planner", "main"), ("writer", "main"), ("researcher", "r1"),
                    ("researcher", "r1a"), ("scout", "r1a")},
        "global": ALL,
        "leaf": {("planner", "main"), ("writer", "main"), ("researcher", "r1"),
                 ("researcher", "r1a"), ("scout", "r1a")},
    }
    for name, fact in shared.items():
        assert holders(pool_b, fact.id) == expected[name], name  # received over the wire
        assert holders(pool_a, fact.id) == expected[name], name  # delivered locally
    # the same agent on two branches keeps two isolated inboxes
    assert [f.text for f in pool_b.facts_for("researcher@r1a")] == [
        "r1 subtree fact", "r1 lineage fact", "r2 global fact", "r1a lineage fact"]
    assert pool_b.facts_for("researcher") == []  # researcher is not on main
    assert b.stats["delivered"] == sum(len(v) for v in expected.values())


async def test_facts_appear_in_context_and_callbacks(net, ns):
    graph = fork_tree()
    manager = MemoryManager()
    pool = SharedMemoryPool()
    sync_seen: list[FactDelivery] = []
    async_seen: list[str] = []
    a = Coordinator(graph, transport=net.transport(ns), pool=SharedMemoryPool())
    b = Coordinator(graph, manager, transport=net.transport(ns), pool=pool)

    async def on_writer(delivery: FactDelivery) -> None:
        await asyncio.sleep(0)
        async_seen.append(delivery.fact.text)

    b.on_fact(sync_seen.append, branch="r1a")
    unsubscribe = b.on_fact(on_writer, agent="writer")
    b.on_fact(lambda d: 1 / 0, agent="critic")  # a failing callback is counted, not fatal
    async with a, b:
        await a.share("planner", "Budget is 4000 EUR", scope="global",
                      metadata={"topic": "budget"})
        await settle(b, 1)
        await until(lambda: len(async_seen) == 1)
        unsubscribe()
        await a.share("planner", "Deadline is Friday", scope="global")
        await settle(b, 2)
        context = pool.context_for("writer")
        assert context is not None
        assert context.role == "system"
        assert '- planner@main: "Budget is 4000 EUR"' in context.text
        assert "Deadline is Friday" in context.text
        assert b.context_for("researcher", "r1a") is not None
        assert "Budget" in b.context_for("scout", "r1a").text
        assert {(d.agent, d.branch) for d in sync_seen} == {("researcher", "r1a"),
                                                            ("scout", "r1a")}
        assert len(sync_seen) == 4
        assert async_seen == ["Budget is 4000 EUR"]
        assert b.stats["errors"] == 2
    manager.close()


# ---------------------------------------------------------------------------- exactly once
async def test_exactly_once_per_agent_when_the_transport_delivers_twice(net, ns):
    graph = fork_tree()
    pool = SharedMemoryPool()
    b = Coordinator(graph, transport=net.transport(ns), pool=pool)
    raw = net.raw(ns)
    async with b, raw:
        env = envelope(ns, 1, "Facts are delivered once")
        for _ in range(3):
            await raw.publish(fact_topic(ns, "main"), raw_bytes(env))
        await raw.publish(fact_topic(ns, "main"), raw_bytes(envelope(ns, 2, "second")))
        await settle(b, 4)
        assert b.stats["duplicates"] == 2
        for agent, branch in ALL:
            assert [f.text for f in pool.facts_for(inbox_key(agent, branch))] == [
                "Facts are delivered once", "second"]
        # the same fact (same text) from another sender: every inbox keeps one copy
        other = envelope(ns, 1, "  facts are DELIVERED once ", sender="other-sender")
        await raw.publish(fact_topic(ns, "main"), raw_bytes(other))
        await settle(b, 5)
        assert b.stats["skipped"] == len(ALL)
        assert all(len(pool.facts_for(inbox_key(a, br))) == 2 for a, br in ALL)
        assert b.stats["delivered"] == 2 * len(ALL)


# ---------------------------------------------------------------------------- ordering
async def test_order_per_sender(net, ns):
    graph = fork_tree()
    pool = SharedMemoryPool()
    a = Coordinator(graph, transport=net.transport(ns), pool=SharedMemoryPool())
    b = Coordinator(graph, transport=net.transport(ns), pool=pool)
    async with a, b:
        texts = [f"fact number {i}" for i in range(40)]
        await asyncio.gather(*(a.share("planner", t, scope="global") for t in texts))
        await settle(b, 40)
        assert [f.text for f in pool.facts_for("writer")] == texts
        assert [f.text for f in pool.facts_for("scout@r1a")] == texts


async def test_out_of_order_envelopes_are_buffered(net, ns):
    graph = fork_tree()
    pool = SharedMemoryPool()
    b = Coordinator(graph, transport=net.transport(ns), pool=pool)
    raw = net.raw(ns)
    async with b, raw:
        for seq in (1, 3, 5, 2, 4, 3):
            await raw.publish(fact_topic(ns, "main"), raw_bytes(envelope(ns, seq, f"f{seq}")))
        await settle(b, 6)
        assert [f.text for f in pool.facts_for("planner")] == ["f1", "f2", "f3", "f4", "f5"]
        assert b.stats["duplicates"] == 1


async def test_a_gap_is_skipped_after_the_timeout_and_filled_late(net, ns):
    graph = fork_tree()
    pool = SharedMemoryPool()
    b = Coordinator(graph, transport=net.transport(ns), pool=pool,
                    settings=CoordinatorSettings(gap_timeout=0.2))
    raw = net.raw(ns)
    async with b, raw:
        for seq in (1, 3, 4):
            await raw.publish(fact_topic(ns, "main"), raw_bytes(envelope(ns, seq, f"f{seq}")))
        await settle(b, 3)
        assert [f.text for f in pool.facts_for("planner")] == ["f1"]
        await until(lambda: b.stats["gaps"] == 1)
        assert [f.text for f in pool.facts_for("planner")] == ["f1", "f3", "f4"]
        await raw.publish(fact_topic(ns, "main"), raw_bytes(envelope(ns, 2, "f2")))
        await settle(b, 4)
        assert [f.text for f in pool.facts_for("planner")] == ["f1", "f3", "f4", "f2"]
        await raw.publish(fact_topic(ns, "main"), raw_bytes(envelope(ns, 2, "f2")))
        await settle(b, 5)
        assert b.stats["duplicates"] == 1


# ---------------------------------------------------------------------------- late joiners
async def test_late_joiners_receive_the_facts_in_their_scope(net, ns):
    graph = fork_tree()
    manager = MemoryManager()
    pool = SharedMemoryPool()
    a = Coordinator(graph, transport=net.transport(ns), pool=SharedMemoryPool())
    b = Coordinator(graph, manager, transport=net.transport(ns), pool=pool)
    async with a, b:
        sub = await a.share("planner", "main subtree fact", scope="subtree")
        only = await a.share("planner", "main branch fact", scope="branch")
        glob = await a.share("critic", "global fact", branch="r2", scope="global")
        r2 = await a.share("critic", "r2 branch fact", branch="r2", scope="branch")
        await settle(b, 4)
        # an agent joining main gets what main's agents got
        got = b.join("newbie", "main")
        assert [f.id for f in got] == [sub.id, only.id, glob.id]
        # a fork of main: subtree and global facts, not main's branch-only ones
        b.fork("main", "r3", agents=["planner", "analyst"])
        assert [f.id for f in b.facts_for("analyst", "r3")] == [sub.id, glob.id]
        assert [f.id for f in b.facts_for("planner", "r3")] == [sub.id, glob.id]
        # a new root branch added straight to the graph gets the global fact
        graph.add_branch("side", agents=["loner"])
        assert [f.id for f in b.facts_for("loner", "side")] == [glob.id]
        assert r2.id not in {f.id for f in b.facts_for("newbie")}
        # and new facts keep flowing to them
        await a.share("planner", "after joining", scope="subtree")
        await settle(b, 5)
        assert b.facts_for("analyst", "r3")[-1].text == "after joining"
        assert b.facts_for("newbie")[-1].text == "after joining"
    manager.close()


def needs_persistent_sessions(net: Net) -> None:
    if net.kind == "mqtt" and net.broker.kind != "mosquitto":
        pytest.fail("this test needs mosquitto (apt-get install -y mosquitto): the amqtt "
                    "fallback broker does not queue messages for persistent sessions")


async def test_a_reconnecting_coordinator_gets_what_it_missed(net, ns):
    needs_persistent_sessions(net)
    graph = fork_tree()
    pool = SharedMemoryPool()
    client_id = f"receiver-{uuid.uuid4().hex[:8]}"
    a = Coordinator(graph, transport=net.transport(ns), pool=SharedMemoryPool())
    async with a:
        async with Coordinator(graph, transport=net.transport(ns, client_id), pool=pool) as b:
            await a.share("planner", "before the break", scope="global")
            await settle(b, 1)
        for i in range(10):  # b is away: its persistent session collects these
            await a.share("planner", f"missed {i}", scope="global")
        async with Coordinator(graph, transport=net.transport(ns, client_id), pool=pool) as b2:
            await settle(b2, 10)
            await a.share("planner", "after the break", scope="global")
            await settle(b2, 11)
    assert [f.text for f in pool.facts_for("writer")] == (
        ["before the break"] + [f"missed {i}" for i in range(10)] + ["after the break"])


# ---------------------------------------------------------------------------- namespaces
async def test_namespaces_are_isolated(net, ns):
    graph = fork_tree()
    pool_a, pool_b = SharedMemoryPool(), SharedMemoryPool()
    a = Coordinator(graph, transport=net.transport(ns + "-a"), pool=pool_a)
    b = Coordinator(graph, transport=net.transport(ns + "-b"), pool=pool_b)
    raw = net.raw(ns + "-b")
    async with a, b, raw:
        await a.share("planner", "team a only", scope="global")
        await b.share("planner", "team b only", scope="global")
        # an envelope claiming namespace a, smuggled onto b's topic, is refused
        await raw.publish(fact_topic(ns + "-b", "main"), raw_bytes(envelope(ns + "-a", 1, "x")))
        await settle(b, 1)
        await asyncio.sleep(0.1)
        assert [f.text for f in pool_a.facts_for("writer")] == ["team a only"]
        assert [f.text for f in pool_b.facts_for("writer")] == ["team b only"]
        assert b.stats["malformed"] == 1
        assert a.stats["malformed"] == 0  # nothing of b's namespace reached a
        assert a.stats["delivered"] == len(ALL)  # only its own fact
        with pytest.raises(ValueError, match="outside this transport's namespace"):
            await raw.publish(fact_topic(ns + "-a", "main"), b"{}")
        with pytest.raises(ValueError, match="outside this transport's namespace"):
            await raw.subscribe("marsys/#")


# ---------------------------------------------------------------------------- bad payloads
async def test_malformed_and_oversized_payloads_are_dropped_and_counted(net, ns):
    graph = fork_tree()
    pool = SharedMemoryPool()
    a = Coordinator(graph, transport=net.transport(ns), pool=SharedMemoryPool())
    b = Coordinator(graph, transport=net.transport(ns), pool=pool,
                    settings=CoordinatorSettings(max_payload=4096))
    raw = net.raw(ns)
    good = raw_bytes(envelope(ns, 1, "fine"))
    wrong_topic = raw_bytes(envelope(ns, 2, "claims main", branch="main"))
    extra = good.replace(b'{"v":1,', b'{"v":1,"evil":true,')
    bad = [
        b"not json at all",
        b"",
        b"{}",
        b"\xff\xfe\x00garbage",
        b'{"v": 2}',
        extra,
        good.replace(b'"seq":1', b'"seq":0'),
        good.replace(b'"scope":"global"', b'"scope":"everyone"'),
        b"[" * 10_000 + b"]" * 10_000,  # deep nesting, under the size limit? no: 20 kB
    ]
    async with a, b, raw:
        for payload in bad[:-1]:
            await raw.publish(fact_topic(ns, "main"), payload)
        await raw.publish(fact_topic(ns, "r1"), wrong_topic)  # topic says r1, envelope main
        await raw.publish(fact_topic(ns, "main"), bad[-1])  # oversized for b
        await raw.publish(fact_topic(ns, "main"), b"x" * 5000)  # oversized
        await settle(b, len(bad) + 2)
        assert b.stats["malformed"] == len(bad) - 1 + 1
        assert b.stats["oversized"] == 2
        assert b.stats["delivered"] == 0
        # the coordinator keeps working
        await a.share("planner", "still working", scope="global")
        await raw.publish(fact_topic(ns, "main"), good)
        await settle(b, len(bad) + 4)
        assert [f.text for f in pool.facts_for("writer")] == ["still working", "fine"]
        assert b.running
        assert b.error is None


# ---------------------------------------------------------------------------- fork and merge
async def test_fork_gives_copy_on_write_memories(net, ns):
    graph = BranchGraph()
    graph.add_branch("main", agents=["planner", "researcher"])
    manager = MemoryManager()
    manager.memory("researcher", "main").add(Message.user("shared history"))
    async with Coordinator(graph, manager, transport=net.transport(ns)) as coord:
        coord.fork("main", "r1")
        coord.fork("main", "r2", agents=["researcher", "newcomer"])
        r1 = manager.memory("researcher", "r1")
        r2 = manager.memory("researcher", "r2")
        assert [m.text for m in r1.read()] == ["shared history"]
        r1.add(Message.assistant("r1 finding"))
        assert [m.text for m in manager.memory("researcher", "main").read()] == ["shared history"]
        assert [m.text for m in r2.read()] == ["shared history"]
        assert len(manager.memory("newcomer", "r2")) == 0
        assert r1.appended()[0].text == "r1 finding"
        with pytest.raises(UnknownBranchError):
            coord.fork("nope", "x")
        with pytest.raises(BranchError):
            coord.fork("main", "r1")
    manager.close()


async def test_merge_brings_facts_and_resolves_conflicts(net, ns):
    graph = BranchGraph()
    graph.add_branch("main", agents=["planner"])
    graph.fork("main", "r1", agents=["researcher"])
    graph.fork("main", "r2", agents=["analyst"])
    manager = MemoryManager()
    pool_a, pool_b = SharedMemoryPool(), SharedMemoryPool()
    a = Coordinator(graph, manager, transport=net.transport(ns), pool=pool_a)
    b = Coordinator(graph, transport=net.transport(ns), pool=pool_b)
    async with a, b:
        await a.share("planner", "Growth is 10%", scope="branch",
                      metadata={"topic": "growth"}, confidence=0.9)
        await a.share("researcher", "Growth is 12%", branch="r1",
                      metadata={"topic": "growth"}, confidence=0.5)
        await a.share("researcher", "Churn is 3%", branch="r1")
        await a.share("analyst", "Growth is 11%", branch="r2", metadata={"topic": "growth"},
                      confidence=0.95)
        await a.share("analyst", "Margin is 40%", branch="r2")
        await settle(b, 5)
        # newest wins: r1's growth replaces main's
        result = await a.merge("r1", into="main", conflict="newest")
        assert [f.text for f in result.facts] == ["Growth is 12%", "Churn is 3%"]
        assert all(f.metadata["merged_from"] == "r1" for f in result.facts)
        for pool in (pool_a, pool_b):
            await until(lambda p=pool: len(p.facts_for("planner")) == 2)
            assert [f.text for f in pool.facts_for("planner")] == ["Growth is 12%", "Churn is 3%"]
        assert graph.status("r1") == "merged"
        assert graph.nx.edges["r1", "main"]["kind"] == "merge"
        # confidence: r2's 0.95 beats the 0.5 in main
        await a.merge("r2", into="main", conflict="confidence")
        for pool in (pool_a, pool_b):
            await until(lambda p=pool: "Margin is 40%" in [f.text for f in p.facts_for("planner")])
            assert sorted(f.text for f in pool.facts_for("planner")) == [
                "Churn is 3%", "Growth is 11%", "Margin is 40%"]
        # the branch inboxes themselves are untouched
        assert [f.text for f in pool_b.facts_for("researcher@r1")] == [
            "Growth is 12%", "Churn is 3%"]
    manager.close()


async def test_merge_keep_both_with_provenance(net, ns):
    graph = BranchGraph()
    graph.add_branch("main", agents=["planner"])
    graph.fork("main", "r1", agents=["researcher"])
    pool = SharedMemoryPool()
    async with Coordinator(graph, transport=net.transport(ns), pool=pool) as coord:
        await coord.share("planner", "Launch in May", metadata={"topic": "launch"})
        await coord.share("researcher", "Launch in June", branch="r1",
                          metadata={"topic": "launch"})
        await coord.merge("r1", into="main", conflict="keep_both")
        facts = coord.facts_for("planner")
        assert [(f.text, f.source_branch, f.metadata.get("merged_from")) for f in facts] == [
            ("Launch in May", "main", None), ("Launch in June", "r1", "r1")]
        assert '- researcher@r1: "' in coord.context_for("planner").text


async def test_merge_strategies_summary_and_messages(net, ns):
    graph = BranchGraph()
    graph.add_branch("main", agents=["planner", "researcher"])
    manager = MemoryManager()
    manager.memory("researcher", "main").add(Message.user("Find the Q4 numbers."))
    async with Coordinator(graph, manager, transport=net.transport(ns)) as coord:
        coord.fork("main", "r1", agents=["researcher"])
        coord.fork("main", "r2", agents=["researcher", "helper"])
        r1 = manager.memory("researcher", "r1")
        r1.add(Message.assistant("Q4 revenue grew 12% to 4.2M EUR."))
        r1.add(Message.assistant("Churn fell to 3%."))
        result = await coord.merge("r1", into="main", strategy="summary")
        assert result.summary is not None
        assert "12%" in result.summary
        for agent in ("planner", "researcher"):
            last = manager.memory(agent, "main").read()[-1]
            assert last.role == "system"
            assert last.text.startswith("Merged from branch r1 (recalled from memory; data, not")
            assert last.metadata["merged_from"] == "r1"
        assert result.messages == 2
        # messages: the child's new messages land in the same agents' memories
        manager.memory("researcher", "r2").add(Message.assistant("r2 says hi"))
        manager.memory("helper", "r2").add(Message.user("helper note"))
        before = len(manager.memory("researcher", "main"))
        result = await coord.merge("r2", into="main", strategy="messages")
        assert result.messages == 2
        assert manager.memory("researcher", "main").read()[-1].text == "r2 says hi"
        assert len(manager.memory("researcher", "main")) == before + 1
        assert "helper" in graph.agents("main")
        assert [m.text for m in manager.memory("helper", "main").read()] == ["helper note"]

        async def async_summary(messages: list[Message]) -> str:
            return f"{len(messages)} messages"

        coord.fork("main", "r3", agents=["researcher"])
        manager.memory("researcher", "r3").add(Message.assistant("one"))
        result = await coord.merge("r3", into="main", strategy="summary",
                                   summarizer=async_summary)
        assert result.summary == "1 messages"
    manager.close()


async def test_bad_merges_change_nothing(net, ns):
    graph = BranchGraph()
    graph.add_branch("main", agents=["planner"])
    graph.fork("main", "r1", agents=["researcher"])
    pool = SharedMemoryPool()
    async with Coordinator(graph, transport=net.transport(ns), pool=pool) as coord:
        await coord.share("researcher", "r1 fact", branch="r1")
        before = (graph.to_dict(), pool.facts_for("planner"), coord.stats)
        with pytest.raises(BranchError, match="into itself"):
            await coord.merge("r1", into="r1")
        with pytest.raises(UnknownBranchError):
            await coord.merge("r9", into="main")
        with pytest.raises(ValueError, match="descends"):
            await coord.merge("main", into="r1")
        with pytest.raises(ValueError, match="strategy"):
            await coord.merge("r1", into="main", strategy="rebase")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="needs a manager"):
            await coord.merge("r1", into="main", strategy="summary")
        assert (graph.to_dict(), pool.facts_for("planner"), coord.stats) == before


# ---------------------------------------------------------------------------- errors
async def test_share_errors(net, ns):
    graph = fork_tree()
    coord = Coordinator(graph, transport=net.transport(ns), pool=SharedMemoryPool())
    with pytest.raises(CoordinationError, match="not running"):
        await coord.share("planner", "too early")
    async with coord:
        with pytest.raises(CoordinationError, match="re-entrant"):
            await coord.__aenter__()
        with pytest.raises(UnknownBranchError):
            await coord.share("planner", "x", branch="nowhere")
        with pytest.raises(ValueError, match="over max_payload"):
            await coord.share("planner", "big", metadata={"blob": "x" * 70_000})
        with pytest.raises(ValueError, match="at least 1 character"):
            await coord.share("planner", "   ")
        fact = SharedFact.create("prepared", agent="planner", branch="r1")
        with pytest.raises(ValueError, match="shared as it is"):
            await coord.share("planner", fact, branch="main")
        assert (await coord.share("planner", fact)).id == fact.id
        graph.close("r2")
        with pytest.raises(BranchError, match="closed"):
            await coord.share("critic", "x", branch="r2")
        with pytest.raises(TypeError):
            await coord.share("planner", 42)  # type: ignore[arg-type]
        assert coord.stats["delivered"] == 1  # only the prepared fact, to researcher@r1
    with pytest.raises(ValueError, match="differs"):
        Coordinator(graph, transport=net.transport(ns), namespace="other")


# ---------------------------------------------------------------------------- MQTT only
async def test_broker_restart_mid_stream_loses_nothing_acknowledged(mqtt_broker, ns):
    net = Net("mqtt", mqtt_broker)
    needs_persistent_sessions(net)
    graph = fork_tree()
    pool = SharedMemoryPool()
    a = Coordinator(graph, transport=net.transport(ns, f"s-{uuid.uuid4().hex[:8]}"),
                    pool=SharedMemoryPool())
    b = Coordinator(graph, transport=net.transport(ns, f"r-{uuid.uuid4().hex[:8]}"), pool=pool)
    acknowledged: list[str] = []
    async with a, b:
        restart: asyncio.Future[None] | None = None
        async with asyncio.timeout(60):
            for i in range(60):
                text = f"stream fact {i}"
                await a.share("planner", text, scope="global")
                acknowledged.append(text)
                if i == 20:  # stop the broker while the stream goes on
                    restart = asyncio.ensure_future(asyncio.to_thread(mqtt_broker.restart, 0.5))
                await asyncio.sleep(0.01)
            assert restart is not None
            await restart
            await until(lambda: len(pool.facts_for("writer")) >= len(acknowledged), 20)
            assert [f.text for f in pool.facts_for("writer")] == acknowledged
            # a burst of concurrent shares (many unacknowledged at once) across a restart
            burst = [f"burst fact {i}" for i in range(400)]

            async def share(text: str) -> None:
                await a.share("planner", text, scope="global")
                acknowledged.append(text)

            sharing = asyncio.gather(*(share(t) for t in burst))
            await until(lambda: len(acknowledged) >= 60 + 5)
            await asyncio.to_thread(mqtt_broker.restart, 0.3)
            assert not sharing.done()  # the outage hit the burst
            await sharing
            await until(lambda: len(pool.facts_for("writer")) >= 60 + len(burst), 20)
            await until(lambda: a.transport.connected and b.transport.connected)  # type: ignore[attr-defined]
        texts = [f.text for f in pool.facts_for("writer")]
        assert texts[60:] == burst  # in the sender's order, none lost, none twice
        assert sorted(texts) == sorted(acknowledged)
        assert a.transport.reconnects >= 2  # type: ignore[attr-defined]
        assert b.transport.reconnects >= 2  # type: ignore[attr-defined]


async def test_broker_requiring_a_password_rejects_a_client_without_one(secure_broker, ns):
    host, port = secure_broker.host, secure_broker.port
    anonymous = MqttTransport(host, port, ns, client_id=f"anon-{uuid.uuid4().hex[:8]}")
    with pytest.raises(AuthenticationError, match="refused") as info:
        await anonymous.__aenter__()
    assert isinstance(info.value, TransportError)
    assert "none was given" in str(info.value)
    wrong = MqttTransport(host, port, ns, client_id=f"w-{uuid.uuid4().hex[:8]}",
                          username="agent", password="nope")
    with pytest.raises(AuthenticationError):
        async with wrong:
            pass
    graph = fork_tree()
    pool = SharedMemoryPool()
    good = MqttTransport(host, port, ns, client_id=f"g-{uuid.uuid4().hex[:8]}",
                         username="agent", password="s3cret")
    async with Coordinator(graph, transport=good, pool=pool) as coord:
        await coord.share("planner", "authenticated", scope="global")
        assert [f.text for f in pool.facts_for("writer")] == ["authenticated"]


async def test_mqtt_transport_errors(mqtt_broker, ns):
    with pytest.raises(TransportError, match="cannot connect"):
        async with MqttTransport("127.0.0.1", 1, ns, client_id="x", connect_timeout=0.3):
            pass
    transport = MqttTransport(mqtt_broker.host, mqtt_broker.port, ns,
                              client_id=f"e-{uuid.uuid4().hex[:8]}", max_payload=100)
    with pytest.raises(TransportError, match="closed"):
        await transport.publish(fact_topic(ns, "main"), b"x")
    async with transport:
        with pytest.raises(CoordinationError, match="re-entrant"):
            await transport.__aenter__()
        with pytest.raises(ValueError, match="over the maximum"):
            await transport.publish(fact_topic(ns, "main"), b"x" * 101)
        with pytest.raises(ValueError, match="cannot contain"):
            await transport.publish("marsys/" + ns + "/branch/+/facts", b"x")
        with pytest.raises(TypeError):
            await transport.publish(fact_topic(ns, "main"), "text")  # type: ignore[arg-type]
        await transport.publish(fact_topic(ns, "main"), b"x" * 100)
        assert transport.connected
    assert not transport.connected
    for bad, message in (({"port": 0}, "port"), ({"client_id": ""}, "client_id"),
                         ({"password": "p"}, "username"), ({"reconnect_min": 0}, "reconnect")):
        kwargs: dict[str, Any] = {"client_id": "ok", **bad}
        port = kwargs.pop("port", 1883)
        with pytest.raises(ValueError, match=message):
            MqttTransport("127.0.0.1", port, ns, **kwargs)


async def test_inprocess_transport_sessions():
    broker = InProcessBroker(max_queued=3)
    sub = InProcessTransport(broker, namespace="t", client_id="sub")
    pub = InProcessTransport(broker, namespace="t")
    async with pub:
        async with sub:
            await sub.subscribe("marsys/t/branch/+/facts")
            with pytest.raises(TransportError, match="already connected"):
                await InProcessTransport(broker, namespace="t", client_id="sub").__aenter__()
        for i in range(5):  # sub is away: its queue keeps the last 3
            await pub.publish(fact_topic("t", "main"), str(i).encode())
        await pub.publish("marsys/t/other", b"not matched")
        assert broker.dropped == 2
        async with sub:
            got = []
            async with asyncio.timeout(WAIT):
                async for _topic, payload in sub.messages():
                    got.append(payload)
                    if len(got) == 3:
                        break
        assert got == [b"2", b"3", b"4"]
    assert "sub" in broker.sessions  # persistent
    assert not any(s.startswith("inproc-") for s in broker.sessions)  # clean ones are gone


def test_memory_fork_helper_falls_back_without_attach_memory():
    from marsys_mem.coordination import attach_memory

    manager = MemoryManager()
    memory = ConversationMemory([Message.user("hi")])
    attach_memory(manager, "a", "b", memory)
    assert manager.memory("a", "b") is memory
    manager.close()


async def test_facts_for_a_branch_not_known_yet_are_delivered_when_it_appears(net, ns):
    graph = fork_tree()
    pool = SharedMemoryPool()
    b = Coordinator(graph, transport=net.transport(ns), pool=pool)
    raw = net.raw(ns)
    async with b, raw:
        env = envelope(ns, 1, "from a branch we do not know", branch="elsewhere",
                       scope="subtree")
        await raw.publish(fact_topic(ns, "elsewhere"), raw_bytes(env))
        await settle(b, 1)
        assert b.stats["delivered"] == 0
        graph.add_branch("elsewhere", agents=["visitor"])
        graph.fork("elsewhere", "deeper", agents=["diver"])
        assert [f.text for f in b.facts_for("visitor", "elsewhere")] == [env.fact.text]
        assert [f.text for f in b.facts_for("diver", "deeper")] == [env.fact.text]
        assert b.facts_for("writer") == []


async def test_route_cache_does_not_grow_with_unknown_branch_names(net, ns):
    # strangers publishing on made-up branches must not grow the route cache (issue 9)
    graph = fork_tree()
    b = Coordinator(graph, transport=net.transport(ns), pool=SharedMemoryPool())
    raw = net.raw(ns)
    async with b, raw:
        for i in range(300):
            for scope in ("branch", "global"):
                env = envelope(ns, 2 * i + 1 + (scope == "global"), f"made up {i}",
                               branch=f"nowhere-{i}", scope=scope)
                await raw.publish(fact_topic(ns, f"nowhere-{i}"), raw_bytes(env))
        await settle(b, 600)
        assert len(b._targets_cache) <= 2  # one entry per scope for every unknown branch
        assert b.stats["delivered"] == 300 * len(ALL)  # the global ones reached everyone


# ---------------------------------------------------------------------------- repair
@pytest.mark.parametrize("away", ["queue overflowed", "session lost"])
async def test_what_the_broker_lost_is_sent_again(away, ns):
    # b is away; the broker loses what it published meanwhile: the oldest of its queue
    # (a gap b sees when the rest arrives) or everything (b's session is gone: only a's
    # high-water mark shows the loss). a sends the missing facts again when b asks.
    broker = InProcessBroker(max_queued=5)
    graph = fork_tree()
    pool = SharedMemoryPool()
    a = Coordinator(graph, transport=InProcessTransport(broker, namespace=ns),
                    pool=SharedMemoryPool(), settings=CoordinatorSettings(heartbeat=0.02))
    clean = away == "session lost"
    b = Coordinator(graph, transport=InProcessTransport(
        broker, namespace=ns, client_id=f"b-{ns}", clean_session=clean), pool=pool,
        settings=CoordinatorSettings(resend_after=0.02))
    texts = [f"fact {i}" for i in range(21)]
    async with a:
        async with b:
            await a.share("planner", texts[0], scope="global")
        for text in texts[1:]:
            await a.share("planner", text, scope="global")
        assert broker.dropped == (0 if clean else 15)
        async with b:
            await until(lambda: len(pool.facts_for("writer")) == len(texts))
            await asyncio.sleep(0.1)
            assert [f.text for f in pool.facts_for("writer")] == texts  # in order, once
            assert b.stats["resend_requests"] >= 1
            assert a.stats["resent"] == (20 if clean else 15)
            assert b.stats["gaps"] == 0


async def test_the_outbox_is_bounded_by_count_and_bytes():
    sent: list[bytes] = []

    async def publish(topic: str, payload: bytes) -> None:
        sent.append(payload)

    outbox = Outbox(publish, max_size=100, max_bytes=1000, quiet=0)
    for seq in range(1, 51):
        outbox.add(seq, "t", b"x" * 100)  # 10 fit in 1000 bytes
    assert len(outbox) == 10
    assert outbox.bytes == 1000
    assert outbox.request([(1, 50)]) == 10  # only what is kept: 41..50
    await outbox.flush()
    assert len(sent) == 10
    outbox.add(51, "t", b"y" * 5000)  # larger than max_bytes: kept alone
    assert len(outbox) == 1
    await outbox.close()


async def test_control_payloads_are_checked_and_resend_requests_answered_once(net, ns):
    graph = fork_tree()
    pool = SharedMemoryPool()
    a = Coordinator(graph, transport=net.transport(ns), pool=SharedMemoryPool(),
                    settings=CoordinatorSettings(resend_after=1.0))
    b = Coordinator(graph, transport=net.transport(ns), pool=pool)
    raw = net.raw(ns)
    topic = control_topic(ns)
    async with a, b, raw:
        for i in range(3):
            await a.share("planner", f"kept {i}", scope="global")
        await settle(b, 3)
        for payload in (b"not json", b'{"v":1,"kind":"resend"}', b'{"v":1,"kind":"nope"}',
                        ResendRequest(namespace=ns, sender="x", to=a.sender_id, epoch=a.epoch,
                                      ranges=[(1, 1)]).model_dump_json().encode().replace(
                                          b'"ranges":[[1,1]]', b'"ranges":[[5,2]]'),
                        HighWaterMark(namespace=ns + "x", sender="x", epoch=1,
                                      seq=1).model_dump_json().encode()):
            await raw.publish(topic, payload)
        await until(lambda: a.stats["malformed"] == 5)
        # a request from anyone: a sends again what it has, once per quiet period,
        # and b drops the copies as duplicates
        ask = ResendRequest(namespace=ns, sender="x", to=a.sender_id, epoch=a.epoch,
                            ranges=[(2, 3), (1, 2), (3, 99)])
        for _ in range(3):
            await raw.publish(topic, ask.model_dump_json().encode())
        await until(lambda: b.stats["duplicates"] == 3)
        await asyncio.sleep(0.1)
        assert a.stats["resent"] == 3
        # a request for another start of a (an older epoch) is not answered
        old = ResendRequest(namespace=ns, sender="x", to=a.sender_id, epoch=a.epoch - 1,
                            ranges=[(1, 3)])
        await raw.publish(topic, old.model_dump_json().encode())
        await asyncio.sleep(0.1)
        assert a.stats["resent"] == 3
        assert [f.text for f in pool.facts_for("writer")] == [f"kept {i}" for i in range(3)]
        assert b.stats["received"] == 6


async def test_close_delivers_what_the_transport_already_received():
    broker = InProcessBroker()
    graph = fork_tree()
    pool = SharedMemoryPool()
    b = Coordinator(graph, transport=InProcessTransport(broker, namespace="n"), pool=pool)
    raw = InProcessTransport(broker, namespace="n")
    async with raw:
        await b.__aenter__()
        for seq in range(1, 51):
            await raw.publish(fact_topic("n", "main"), raw_bytes(envelope("n", seq, f"f{seq}")))
        await b.close()  # the 50 payloads were queued, none processed yet
    assert len(pool.facts_for("writer")) == 50
    assert not b.running


async def test_a_pool_with_deliver_many_is_used_in_one_call():
    class BatchPool(SharedMemoryPool):
        calls = 0

        def deliver_many(self, agents, fact):
            BatchPool.calls += 1
            return super().deliver_many(agents, fact)

    graph = fork_tree()
    pool = BatchPool()
    seen: list[str] = []
    async with Coordinator(graph, transport=InProcessTransport(InProcessBroker()),
                           pool=pool) as coord:
        coord.on_fact(lambda d: seen.append(d.key), agent="scout")
        await coord.share("planner", "batched", scope="global")
        await coord.share("planner", "batched", scope="global")  # already there: skipped
    assert BatchPool.calls == 2
    assert len(pool.facts_for("writer")) == 1
    assert seen == ["scout@r1a"]
    assert coord.stats["skipped"] == len(ALL)


async def test_mqtt_3_1_1_works_and_own_echoes_are_ignored(mqtt_broker, ns):
    graph = fork_tree()
    pool_a, pool_b = SharedMemoryPool(), SharedMemoryPool()

    def transport() -> MqttTransport:
        return MqttTransport(mqtt_broker.host, mqtt_broker.port, ns, protocol="3.1.1",
                             client_id=f"v3-{uuid.uuid4().hex[:8]}")

    a = Coordinator(graph, transport=transport(), pool=pool_a)
    b = Coordinator(graph, transport=transport(), pool=pool_b)
    async with a, b:
        for i in range(5):
            await a.share("planner", f"v3 fact {i}", scope="global")
        await settle(b, 5)
        await settle(a, 5)  # MQTT 3.1.1 has no No Local: a hears itself, and ignores it
        assert [f.text for f in pool_b.facts_for("writer")] == [f"v3 fact {i}" for i in range(5)]
        assert [f.text for f in pool_a.facts_for("writer")] == [f"v3 fact {i}" for i in range(5)]
        assert a.stats["duplicates"] == 0
        assert a.stats["delivered"] == 5 * len(ALL)


@pytest.mark.parametrize("sender_id", ["coord-1", "planner \"é\" \\ ünïcode", "日本"])
async def test_own_echo_prefix_matches_every_envelope_we_send(sender_id):
    # the receive path drops our own echoes on a byte prefix, before parsing: that prefix
    # must be exactly how our envelopes begin, whatever the id contains
    broker = InProcessBroker()
    graph = fork_tree()
    pool = SharedMemoryPool()
    coord = Coordinator(graph, transport=InProcessTransport(broker, namespace="n"), pool=pool,
                        sender_id=sender_id)
    _, payload = coord._envelope(SharedFact.create("x", agent="planner"), "main", "global")
    assert payload.startswith(coord._echo_prefix)
    other = Coordinator(graph, transport=InProcessTransport(broker, namespace="n"),
                        pool=SharedMemoryPool(), sender_id=sender_id + "2")
    assert not payload.startswith(other._echo_prefix)
    async with coord:
        coord._handle(fact_topic("n", "main"), payload)  # an echo: ignored, not delivered
        assert coord.stats["received"] == 1
        assert coord.stats["delivered"] == 0
        assert pool.facts_for("writer") == []
