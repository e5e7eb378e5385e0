"""The one naming rule, and the internal keys built from names (marsys_mem.model.names)."""

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import ValidationError

from marsys_mem import MemoryManager, Message
from marsys_mem.config.models import MemoryConfig, PatternsConfig, StoreConfig
from marsys_mem.coordination import (
    BranchGraph,
    Coordinator,
    InProcessBroker,
    InProcessTransport,
    MqttTransport,
    fact_topic,
)
from marsys_mem.coordination.envelope import FactEnvelope
from marsys_mem.coordination.wire import parse_fact_topic
from marsys_mem.exceptions import ConfigError, InvalidNameError
from marsys_mem.model.facts import SharedFact
from marsys_mem.model.names import NAME_PATTERN, inbox_key, is_name, parse_inbox_key, validate_name
from marsys_mem.model.names import validate_name as names_validate_name
from marsys_mem.patterns import EpisodicMemory, HierarchicalMemory, RAGMemory
from marsys_mem.patterns.agent import AgentPatterns
from marsys_mem.store import InMemoryStore, SQLiteStore
from marsys_mem.store.keys import facts_key, internal_key
from marsys_mem.workflow.models import AgentSpec, BranchSpec, ForkStep

BAD_NAMES = [
    pytest.param("", id="empty"),
    pytest.param("a/b", id="slash"),
    pytest.param("a+b", id="plus"),
    pytest.param("a#b", id="hash"),
    pytest.param("main#rag", id="rag-suffix"),
    pytest.param("a@b", id="at"),
    pytest.param("a\x00b", id="nul"),
    pytest.param("a\nb", id="newline"),
    pytest.param("main\n", id="trailing-newline"),
    pytest.param("a\tb", id="tab"),
    pytest.param("a\x7f", id="del"),
    pytest.param("a\x85", id="c1-control"),
    pytest.param("bad \udc80", id="lone-surrogate"),
    pytest.param("x" * 257, id="257-chars"),
    pytest.param("x" * 100_000, id="huge"),
    pytest.param(7, id="int"),
    pytest.param(None, id="none"),
    pytest.param(b"main", id="bytes"),
]
GOOD_NAMES = ["main", "r-1", "research_2.v3", "a b", "é", "日本", "a\U0001f600", "x" * 256, "$SYS"]


def _unchecked_config(namespace: Any) -> MemoryConfig:
    """A config whose namespace skipped validation (the manager checks it again)."""
    return MemoryConfig.model_construct(store=StoreConfig.model_construct(namespace=namespace))


def _manager_entry_points(manager: MemoryManager) -> list[Callable[[Any], object]]:
    return [
        lambda n: manager.memory(n),
        lambda n: manager.memory("alice", n),
        lambda n: manager.context_for(n),
        lambda n: manager.context_for("alice", branch=n),
        lambda n: manager.run(n),
        lambda n: manager.run("alice", branch=n),
        lambda n: manager.run("alice", branch=n, parent_id="r0"),
        lambda n: manager.key(n),
        lambda n: manager.key("alice", n),
        lambda n: manager.patterns(n),
        lambda n: manager.policy(n),
        lambda n: manager.attach_memory(n, "main", manager.memory("bob").fork()),
        lambda n: manager.attach_memory("carol", n, manager.memory("bob").fork()),
        lambda n: MemoryManager(_unchecked_config(n)),
    ]


def _store_entry_points(store: Any) -> list[Callable[[Any], object]]:
    calls: list[Callable[[Any], object]] = []
    for i in range(3):

        def key(n: Any, i: int = i) -> tuple[Any, ...]:
            parts: list[Any] = ["default", "alice", "main"]
            parts[i] = n
            return tuple(parts)

        calls += [
            lambda n, key=key: store.append_messages(key(n), [Message.user("x")]),
            lambda n, key=key: store.load_messages(key(n)),
            lambda n, key=key: store.count_messages(key(n)),
            lambda n, key=key: store.delete_messages(key(n)),
        ]
    return calls


def _other_entry_points(tmp_store: Any) -> list[Callable[[Any], object]]:
    graph = BranchGraph()
    graph.add_branch("main", agents=["planner"])
    cfg = PatternsConfig.model_validate({"embedder": "hashing", "rag": True})
    return [
        lambda n: names_validate_name("agent", n),
        lambda n: validate_name("branch", n),  # the transports' (same function)
        lambda n: inbox_key(n, "main"),
        lambda n: inbox_key("writer", n),
        lambda n: graph.add_branch(n),
        lambda n: graph.fork("main", n),
        lambda n: graph.add_branch("other", agents=[n]),
        lambda n: graph.add_agent("main", n),
        lambda n: fact_topic(n, "main"),
        lambda n: fact_topic("default", n),
        lambda n: InProcessTransport(namespace=n, broker=InProcessBroker()),
        lambda n: MqttTransport("127.0.0.1", 1, namespace=n, client_id="c1"),
        lambda n: internal_key((n, "a", "main"), "rag"),
        lambda n: internal_key(("d", n, "main"), "episodes"),
        lambda n: internal_key(("d", "a", n), "tiers", "core"),
        lambda n: facts_key("d", n),
        lambda n: RAGMemory(None, store=tmp_store, key=("d", "a", n)),
        lambda n: EpisodicMemory(None, store=tmp_store, agent=n),
        lambda n: HierarchicalMemory(None, store=tmp_store, key_prefix=("d", n)),
        lambda n: AgentPatterns(cfg, ("d", n, "main"), store=tmp_store),
    ]


def _all_entry_points(store: Any) -> list[Callable[[Any], object]]:
    manager = MemoryManager(store=store)
    return _manager_entry_points(manager) + _store_entry_points(store) + _other_entry_points(store)


@pytest.mark.parametrize("bad", BAD_NAMES)
@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_every_entry_point_rejects_the_same_bad_names(tmp_path, backend, bad):
    store = InMemoryStore() if backend == "memory" else SQLiteStore(tmp_path / "m.db")
    with store:
        calls = _all_entry_points(store)
        assert len(calls) > 40
        for i, call in enumerate(calls):
            with pytest.raises(InvalidNameError) as info:
                call(bad)
            message = str(info.value)
            assert "must be 1-256 characters" in message or "tuple of names" in message, i
            assert len(message) < 300, i  # never the whole of a huge value
        assert store.list_keys() == []
        assert store.list_runs() == []


@pytest.mark.parametrize("bad", [p for p in BAD_NAMES if p.id != "bytes"])
def test_models_apply_the_same_rule(bad):
    """Config and workflow files and wire envelopes use the rule as a pattern: same names fail.

    (pydantic decodes ``bytes`` to ``str`` in these models, so ``b"main"`` is ``"main"``.)
    """
    fact = SharedFact.create("x", agent="a")
    for build in [
        lambda: MemoryConfig.model_validate({"store": {"namespace": bad}}),
        lambda: AgentSpec(name=bad),
        lambda: BranchSpec(name=bad),
        lambda: ForkStep(parent="main", child=bad),
        lambda: SharedFact.create("x", agent=bad),  # provenance: "(from agent@branch)"
        lambda: SharedFact.create("x", agent="a", branch=bad),
        lambda: FactEnvelope(
            namespace=bad, sender="s", seq=1, branch="main", scope="branch", fact=fact
        ),
        lambda: FactEnvelope(
            namespace="d", sender="s", seq=1, branch=bad, scope="branch", fact=fact
        ),
    ]:
        with pytest.raises(ValidationError):
            build()


@pytest.mark.parametrize("good", GOOD_NAMES)
def test_good_names_pass_everywhere(tmp_path, good):
    assert names_validate_name("agent", good) == good
    assert is_name(good)
    with MemoryManager() as manager:
        manager.memory(good, good).add(Message.user("hi"))
        assert [m.text for m in manager.context_for(good, branch=good).messages] == ["hi"]
    with SQLiteStore(tmp_path / "m.db") as store:
        store.append_messages((good, good, good), [Message.user("hi")])
        assert store.list_keys() == [(good, good, good)]
    graph = BranchGraph()
    graph.add_branch(good, agents=[good])
    assert parse_fact_topic(fact_topic(good, good)) == (good, good)
    AgentSpec(name=good)
    fact = SharedFact.create("x", agent=good, branch=good)
    FactEnvelope(namespace=good, sender="s", seq=1, branch=good, scope="branch", fact=fact)


def test_invalid_name_error_is_a_config_error_naming_kind_and_value():
    with pytest.raises(InvalidNameError) as info:
        MemoryManager().memory("alice", branch="main#rag")
    assert isinstance(info.value, ConfigError)
    assert isinstance(info.value, ValueError)
    assert str(info.value) == (
        "branch must be 1-256 characters without '/', '+', '#', '@', control or invisible "
        "characters, got 'main#rag' (it contains '#')"
    )
    with pytest.raises(InvalidNameError, match=r"'xxxx.*\.\.\. \(100000 characters\) \(100000"):
        names_validate_name("agent", "x" * 100_000)
    with pytest.raises(InvalidNameError, match="lone surrogate"):
        names_validate_name("agent", "bad \udc80")
    with pytest.raises(InvalidNameError, match="a int, not a string"):
        names_validate_name("agent", 3)


def test_bad_names_change_nothing_in_the_manager():
    manager = MemoryManager()
    manager.memory("alice").add(Message.user("hi"))
    for bad in ["a#b", "a@b", ""]:
        with pytest.raises(InvalidNameError):
            manager.memory(bad)
        with pytest.raises(InvalidNameError):
            manager.memory("alice", bad)
    assert [(a, b) for a, b, _m in manager.memories()] == [("alice", "main")]
    assert manager.shared.agents == ["alice"]
    manager.close()


def test_inbox_keys_round_trip():
    assert inbox_key("writer") == "writer"
    assert inbox_key("writer", "r1") == "writer@r1"
    assert parse_inbox_key("writer@r1") == ("writer", "r1")
    assert parse_inbox_key("writer") == ("writer", "main")
    for bad in ["writer@main", "a@b@c", "@r1", "writer@"]:
        with pytest.raises(InvalidNameError):
            parse_inbox_key(bad)


def test_name_pattern_is_the_documented_rule():
    assert NAME_PATTERN == (
        r"^[^/+#@\x00-\x1f\x7f-\x9f\u061c\u180e\u200b-\u200f\u2028-\u202e"
        r"\u2060-\u2064\u2066-\u2069\ufeff]{1,256}$"
    )


def test_coordinator_inboxes_use_the_rule():
    async def go() -> None:
        graph = BranchGraph()
        graph.add_branch("main", agents=["planner"])
        transport = InProcessTransport(namespace="default", broker=InProcessBroker())
        async with Coordinator(graph, transport=transport) as coord:
            with pytest.raises(InvalidNameError):
                coord.facts_for("a@b")
            with pytest.raises(InvalidNameError):
                coord.context_for("planner", "main#rag")
            with pytest.raises(InvalidNameError):
                coord.join("x#y")
            assert graph.agents("main") == ["planner"]

    asyncio.run(go())


@pytest.mark.parametrize(
    "char",
    [
        "\u202e",
        "\u202a",
        "\u2066",
        "\u200b",
        "\u200d",
        "\u200e",
        "\u2028",
        "\u2029",
        "\ufeff",
        "\u2060",
        "\u061c",
        "\u180e",
    ],
)
def test_invisible_and_bidi_characters_are_not_in_names(char: str) -> None:
    """issue 25 item 9: look-alike names (a bidi override, a zero-width space, a line
    separator) are refused everywhere: by validate_name and by NAME_PATTERN (pydantic)."""
    from pydantic import BaseModel, Field, ValidationError

    from marsys_mem.model.names import NAME_PATTERN, is_name

    name = f"admin{char}"
    assert not is_name(name)
    with pytest.raises(InvalidNameError, match=r"it contains"):
        names_validate_name("agent", name)

    class Named(BaseModel):
        agent: str = Field(pattern=NAME_PATTERN)

    with pytest.raises(ValidationError):
        Named(agent=name)
    assert Named(agent="admin\u00e9").agent == "admin\u00e9"  # letters beyond ASCII stay
