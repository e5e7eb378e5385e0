"""Isolation between agents and branches: no name reaches another key's data (issue 9, item 7).

Each test plants a secret where one agent's memory keeps it (its RAG memory, its
hierarchical tiers, its episodes, its shared-fact inbox on another branch), then tries to
reach it through a crafted agent or branch name. Before the naming rule every attempt
read the secret.
"""

import asyncio
from pathlib import Path

import pytest

from marsys_mem import MemoryManager, Message
from marsys_mem.config.models import MemoryConfig
from marsys_mem.coordination import BranchGraph, Coordinator, InProcessBroker, InProcessTransport
from marsys_mem.exceptions import InvalidNameError
from marsys_mem.store.sqlite import SQLiteStore

SECRET = "The vault code is 7421"


def _config(tmp_path: Path) -> MemoryConfig:
    """Every agent persistent on SQLite, with RAG, episodic and hierarchical memory."""
    return MemoryConfig.model_validate(
        {
            "version": 1,
            "store": {"backend": "sqlite", "path": str(tmp_path / "m.db")},
            "defaults": {
                "retention": "persistent",
                "patterns": {
                    "embedder": "hashing",
                    "rag": True,
                    "episodic": True,
                    # every message goes to core: the tiers hold the secret too
                    "hierarchical": {"core_threshold": 0.0},
                },
            },
        }
    )


def _plant(tmp_path: Path) -> None:
    """Alice tells her memory a secret (in a run, so episodic memory records it)."""
    with MemoryManager(_config(tmp_path)) as manager:
        with manager.run("alice") as run:
            run.memory.add(Message.user(SECRET))
            run.output(Message.assistant("Noted."))
        manager.flush()


def _texts(store_path: Path) -> dict[tuple[str, str, str], list[str]]:
    with SQLiteStore(store_path) as store:
        return {key: [m.text for m in store.load_messages(key)] for key in store.list_keys()}


@pytest.mark.parametrize(
    ("agent", "branch"),
    [
        pytest.param("alice", "main#rag", id="rag"),
        pytest.param("alice#main#tiers", "core", id="tiers-core"),
        pytest.param("alice#main#tiers", "working", id="tiers-working"),
        pytest.param("alice#main#tiers", "archive", id="tiers-archive"),
        pytest.param("alice#main#episodes", "episodes", id="episodes"),
        pytest.param("#facts", "main", id="facts"),
    ],
)
def test_no_name_reads_another_keys_data(tmp_path, agent, branch):
    _plant(tmp_path)
    before = _texts(tmp_path / "m.db")
    assert any(SECRET in texts for key, texts in before.items() if key[1] != "alice")
    with MemoryManager(_config(tmp_path)) as manager:
        with pytest.raises(InvalidNameError, match="must be 1-256 characters"):
            manager.memory(agent, branch)
        with pytest.raises(InvalidNameError):
            manager.context_for(agent, branch=branch)
        with pytest.raises(InvalidNameError):
            manager.run(agent, branch=branch)
        assert all(name != agent for name, _b, _m in manager.memories())
    assert _texts(tmp_path / "m.db") == before  # nothing written under a forged key


def test_the_owner_still_reads_its_patterns_after_a_restart(tmp_path):
    """The internal keys keep their old spellings: a store written before still loads."""
    _plant(tmp_path)
    keys = set(_texts(tmp_path / "m.db"))
    assert {
        ("default", "alice", "main"),
        ("default", "alice", "main#rag"),
        ("default", "alice#main#episodes", "episodes"),
        ("default", "alice#main#tiers", "core"),
    } <= keys
    with MemoryManager(_config(tmp_path)) as manager:
        patterns = manager.patterns("alice")
        assert patterns is not None
        assert patterns.rag is not None
        assert SECRET in [m.text for m in patterns.rag]
        assert patterns.hierarchical is not None
        assert SECRET in [m.text for m in patterns.hierarchical.core()]
        assert patterns.episodic is not None
        assert [h.message.text for h in patterns.episodic.recall("vault code", 1)] == [SECRET]


async def test_inbox_names_do_not_collide_across_branches(tmp_path):
    """``writer@r1`` on main must not read the inbox of ``writer`` on branch r1."""
    graph = BranchGraph()
    graph.add_branch("main", agents=["planner"])
    graph.fork("main", "r1", agents=["writer"])
    manager = MemoryManager()
    transport = InProcessTransport(namespace="default", broker=InProcessBroker())
    async with Coordinator(graph, manager, transport) as coord:
        await coord.share("planner", SECRET, branch="r1", scope="branch")
        await asyncio.sleep(0)
        assert [f.text for f in coord.facts_for("writer", "r1")] == [SECRET]
        assert SECRET in manager.context_for("writer", branch="r1").messages[0].text
        with pytest.raises(InvalidNameError, match="'@'"):
            manager.context_for("writer@r1")
        with pytest.raises(InvalidNameError):
            manager.memory("writer@r1")
        with pytest.raises(InvalidNameError):
            coord.facts_for("writer@r1")
        with pytest.raises(InvalidNameError):
            coord.join("writer@r1", "main")
    assert all("@" not in agent for agent, _b, _m in manager.memories())
    manager.close()


def test_store_api_refuses_forged_internal_keys(tmp_path):
    """A plain string spelling an internal key is not a key: stores accept only built ones."""
    _plant(tmp_path)
    before = _texts(tmp_path / "m.db")
    with SQLiteStore(tmp_path / "m.db") as store:
        for forged in [
            ("default", "alice", "main#rag"),
            ("default", "alice#main#tiers", "core"),
            ("default", "alice#main#episodes", "episodes"),
        ]:
            with pytest.raises(InvalidNameError, match="store key"):
                store.load_messages(forged)
            with pytest.raises(InvalidNameError, match="store key"):
                store.append_messages(forged, [Message.user("planted")])
        # what list_keys returns is accepted back, internal keys included
        for key in store.list_keys():
            assert [m.text for m in store.load_messages(key)] == before[key]
    assert _texts(tmp_path / "m.db") == before
