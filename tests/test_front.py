"""The front door: Memory's methods are the MCP tools, with whose memory as ``user_id``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import marsys_mem
from marsys_mem import Memory, MemoryManager
from marsys_mem.exceptions import InvalidNameError
from marsys_mem.integrations.mcp import MemoryServer


def test_three_lines() -> None:
    memory = Memory()
    memory.remember("My sister Clara lives in Lisbon", user_id="alice")
    hits = memory.recall("Where does Clara live?", user_id="alice")["hits"]
    assert hits[0]["text"] == "My sister Clara lives in Lisbon"
    memory.close()


def test_users_are_kept_apart() -> None:
    with Memory() as memory:
        memory.remember("I like green tea", user_id="alice")
        memory.remember("I like black coffee", user_id="bob")
        found = memory.recall("drink", user_id="bob", k=5, min_score=None)["hits"]
        assert [h["text"] for h in found] == ["I like black coffee"]  # alice's: not there
        # the default threshold: "drink" is no word of bob's, and no close meaning here
        assert [h["text"] for h in memory.recall("coffee", user_id="bob")["hits"]] == [
            "I like black coffee"
        ]
        window = memory.context(user_id="alice")
        assert [m["content"] for m in window["messages"]] == ["I like green tea"]
        assert window["agent"] == "alice"


def test_recall_checks_min_score() -> None:
    with Memory() as memory:
        memory.remember("I like black coffee", user_id="bob")
        for bad in (-0.1, 1.5, "high", True):
            with pytest.raises(ValueError, match="min_score"):
                memory.recall("coffee", user_id="bob", min_score=bad)  # type: ignore[arg-type]
        assert memory.recall("x", user_id="bob")["hits"] == []  # nonsense: below the default


def test_forget_by_id_and_everything() -> None:
    with Memory() as memory:
        keep = memory.remember("keep me", user_id="alice")["id"]
        drop = memory.remember("drop me", user_id="alice")["id"]
        assert memory.forget(user_id="alice", message_ids=[drop])["left"] == 1
        assert [m["message_id"] for m in memory.messages(user_id="alice")] == [keep]
        assert memory.recall("drop", user_id="alice", min_score=None)["hits"][0]["id"] == keep
        assert memory.recall("drop", user_id="alice")["hits"] == []  # "keep me" is no match
        assert memory.forget(user_id="alice", everything=True)["removed"] == 1
        assert memory.messages(user_id="alice") == []


def test_share_fact_sync_and_async_reach_the_scope() -> None:
    with Memory() as memory:
        memory.remember("hi", user_id="planner")
        memory.remember("hi", user_id="writer")
        out = memory.share_fact("The budget is 10k", user_id="planner", scope="global")
        assert out["delivered_to"] == ["planner", "writer"]
        texts = [m["content"] for m in memory.context(user_id="writer")["messages"]]
        assert any("The budget is 10k" in t for t in texts)
        assert memory.forget(user_id="planner", fact_ids=[out["id"]])["facts_removed"] == 1

    async def run() -> dict[str, Any]:
        async with Memory() as memory:
            return await memory.ashare_fact("x is 1", user_id="a", topic="x", confidence=0.5)

    assert asyncio.run(run())["delivered_count"] == 1


async def test_sync_share_fact_inside_a_loop_names_the_twin() -> None:
    memory = Memory()
    with pytest.raises(RuntimeError, match="ashare_fact"):
        memory.share_fact("a fact", user_id="alice")
    await memory.aclose()


@pytest.mark.parametrize(
    ("call", "error", "needle"),
    [
        (lambda m: m.remember("", user_id="alice"), ValueError, "content must not be empty"),
        (lambda m: m.remember(42, user_id="alice"), TypeError, "content must be a string"),
        (lambda m: m.remember("x", user_id="a/b"), InvalidNameError, "user_id must be"),
        (lambda m: m.remember("x", user_id="alice", role="tool"), ValueError, "role must be"),
        (lambda m: m.remember("x", user_id="alice", kind="note"), ValueError, "kind must be"),
        (lambda m: m.remember("x", user_id="alice", branch="#"), InvalidNameError, "branch"),
        (lambda m: m.remember("x", user_id="alice", pinned="yes"), TypeError, "pinned must"),
        (lambda m: m.recall("  ", user_id="alice"), ValueError, "query must not be empty"),
        (lambda m: m.recall("q", user_id="alice", k=0), ValueError, "k must be"),
        (lambda m: m.recall("q", user_id="alice", mode="fuzzy"), ValueError, "mode must be"),
        (lambda m: m.context("", user_id="alice"), ValueError, "query must not be empty"),
        (lambda m: m.forget(user_id="alice"), ValueError, "needs message_ids"),
        (lambda m: m.forget(user_id="alice", message_ids=[]), ValueError, "message_ids"),
        (lambda m: m.forget(user_id="alice", message_ids="m1"), TypeError, "message_ids"),
        (lambda m: m.share_fact("f", user_id="alice", scope="all"), ValueError, "scope must"),
        (lambda m: m.share_fact("f", user_id="alice", confidence=2), ValueError, "confidence"),
        (lambda m: m.share_fact("f" * 20_001, user_id="alice"), ValueError, "text holds"),
    ],
)
def test_bad_input_names_the_field_and_changes_nothing(call: Any, error: Any, needle: str) -> None:
    with Memory() as memory:
        memory.remember("before", user_id="alice")
        with pytest.raises(error, match=needle):
            call(memory)
        assert [m["content"] for m in memory.messages(user_id="alice")] == ["before"]
        assert memory.manager.shared.facts() == []


def test_user_id_is_required_keyword() -> None:
    with Memory() as memory, pytest.raises(TypeError, match="user_id"):
        memory.recall("q")  # type: ignore[call-arg]


def test_over_a_configured_manager_and_durable_store(tmp_path: Path) -> None:
    config = tmp_path / "policy.yaml"
    config.write_text(
        f"version: 1\nstore: {{backend: sqlite, path: {tmp_path / 'm.db'}}}\n"
        "agents:\n  alice: {retention: persistent}\n"
    )
    with Memory.from_config(config) as memory:
        assert memory.remember("I live in Paris", user_id="alice")["persistent"]
        memory.share_fact("Paris is in France", user_id="alice")
    with Memory(MemoryManager.from_config(config)) as memory:
        assert [m["content"] for m in memory.messages(user_id="alice")] == ["I live in Paris"]
        assert [f.text for f in memory.recorded_facts()] == ["Paris is in France"]


def test_the_mcp_server_is_built_on_it() -> None:
    server = MemoryServer(MemoryManager())
    assert isinstance(server.memory, Memory)
    mid = server.remember("alice", "hello")["id"]
    assert server.memory.messages(user_id="alice")[0]["message_id"] == mid
    with pytest.raises(InvalidNameError, match="agent must be"):  # the tool's field name
        server.recall("a/b", "q")
    server.close()
    assert server.closed
    assert server.memory.closed


def test_exported_lazily_from_the_top_level() -> None:
    assert "Memory" in marsys_mem.__all__
    assert marsys_mem.Memory is Memory
