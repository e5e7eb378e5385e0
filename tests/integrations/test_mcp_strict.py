"""Strict MCP inputs (issue 25 item 9), through the real ``mcp`` client.

The client talks to the server in process (``Client(server.mcp)``: the same request
handling and argument validation as over stdio or HTTP, without a subprocess).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from marsys_mem.integrations.mcp import MemoryServer

POLICY = """\
version: 1
store: {{backend: sqlite, path: {db}, namespace: mcp-strict}}
defaults: {{retention: persistent, patterns: {{embedder: none}}}}
agents: {{alice: {{}}}}
"""


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[MemoryServer]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(db=json.dumps(str(tmp_path / "memory.db"))))
    srv = MemoryServer.from_config(policy)
    yield srv
    await srv.aclose()


def _data(result: Any) -> Any:
    assert not result.is_error, result.content[0].text
    return json.loads(result.content[0].text)


def _error(result: Any) -> str:
    """The tool error's text: one clean line (no pydantic dump, no documentation link)."""
    assert result.is_error, result.content
    text: str = result.content[0].text
    assert "\n" not in text, text
    assert "pydantic" not in text, text
    assert "http" not in text, text
    assert "validation error" not in text, text
    return text


async def _messages(client: Client, agent: str = "alice") -> list[str]:
    win = _data(await client.call_tool("context", {"agent": agent}))
    return [m["content"] for m in win["messages"] if m["role"] != "system"]


async def test_forget_everything_yes_is_an_error_not_true(server: MemoryServer) -> None:
    async with Client(server.mcp) as client:
        _data(await client.call_tool("remember", {"agent": "alice", "content": "keep me"}))
        for value in ["yes", "true", "1", 1, 0, None, [True]]:
            text = _error(await client.call_tool("forget", {"agent": "alice", "everything": value}))
            assert text.startswith("Error executing tool forget: everything: "), text
            assert repr(value) in text
        assert await _messages(client) == ["keep me"]
        removed = _data(await client.call_tool("forget", {"agent": "alice", "everything": True}))
        assert removed["removed"] == 1


async def test_unknown_arguments_are_refused_and_nothing_changes(server: MemoryServer) -> None:
    async with Client(server.mcp) as client:
        cases: list[tuple[str, dict[str, Any], str]] = [
            ("remember", {"agent": "alice", "content": "x", "agnet": "bob"}, "agnet"),
            ("remember", {"agent": "alice", "content": "x", "metadata": {"a": 1}}, "metadata"),
            ("recall", {"agent": "alice", "query": "x", "limit": 3}, "limit"),
            ("forget", {"agent": "alice", "all": True}, "all"),
            ("share_fact", {"agent": "alice", "text": "x", "sharer": "bob"}, "sharer"),
            ("list_agents", {"verbose": True}, "verbose"),
        ]
        for tool, args, name in cases:
            text = _error(await client.call_tool(tool, args))
            assert f"{name}: unknown argument" in text, text
            assert "there are:" in text or tool == "list_agents"
        assert await _messages(client) == []


async def test_numbers_and_strings_are_not_coerced(server: MemoryServer) -> None:
    async with Client(server.mcp) as client:
        _data(await client.call_tool("remember", {"agent": "alice", "content": "a note"}))
        text = _error(
            await client.call_tool("recall", {"agent": "alice", "query": "note", "k": "3"})
        )
        assert "k: expected an integer, got '3'" in text
        text = _error(
            await client.call_tool("recall", {"agent": "alice", "query": "note", "k": 2.5})
        )
        assert "k: " in text
        text = _error(await client.call_tool("remember", {"agent": "alice", "content": 42}))
        assert "content: expected a string, got 42" in text
        text = _error(
            await client.call_tool("remember", {"agent": "alice", "content": "x", "pinned": "no"})
        )
        assert "pinned: expected true or false, got 'no'" in text
        text = _error(await client.call_tool("remember", {"content": "x"}))
        assert "agent: required" in text
        # a number where a float is wanted is still a number
        fact = {"agent": "alice", "text": "Budget is 4000 EUR", "confidence": 1}
        assert _data(await client.call_tool("share_fact", fact))["text"] == "Budget is 4000 EUR"
        assert await _messages(client) == ["a note"]


async def test_errors_name_the_field_and_the_value_in_one_line(server: MemoryServer) -> None:
    async with Client(server.mcp) as client:
        text = _error(await client.call_tool("remember", {"agent": "a/b", "content": "x"}))
        assert "agent" in text
        assert "a/b" in text
        assert text.count("got ") == 1, text  # the value once, however the rule words it
        text = _error(await client.call_tool("recall", {"agent": "alice", "query": ""}))
        assert "query" in text
        text = _error(
            await client.call_tool(
                "share_fact", {"agent": "alice", "text": "x", "scope": "everywhere"}
            )
        )
        assert "scope" in text
        assert "'everywhere'" in text
        # a control character in a value is shown escaped, on the one line
        text = _error(await client.call_tool("remember", {"agent": "al\x1b[2Jice", "content": "x"}))
        assert "\x1b" not in text
        assert "\\x1b" in text


@pytest.mark.parametrize(
    "name",
    ["ali\u202ece", "ali\u200bce", "ali\u2028ce", "ali\u2066ce", "\ufeffalice", "alice\u200f"],
)
async def test_look_alike_agent_names_are_refused(server: MemoryServer, name: str) -> None:
    async with Client(server.mcp) as client:
        for tool, args in [
            ("remember", {"agent": name, "content": "x"}),
            ("recall", {"agent": name, "query": "x"}),
            ("context", {"agent": name}),
            ("forget", {"agent": name, "everything": True}),
            ("share_fact", {"agent": name, "text": "x"}),
            ("remember", {"agent": "alice", "content": "x", "branch": name}),
            ("context", {"agent": "alice", "subject": name}),
        ]:
            text = _error(await client.call_tool(tool, args))
            assert "agent" in text or "branch" in text or "subject" in text
        agents = _data(await client.call_tool("list_agents", {}))["agents"]
        assert [a["agent"] for a in agents] == ["alice"]


async def test_every_tool_publishes_a_closed_input_schema(server: MemoryServer) -> None:
    async with Client(server.mcp) as client:
        tools = (await client.list_tools()).tools
        assert len(tools) == 6
        for tool in tools:
            assert tool.input_schema.get("additionalProperties") is False, tool.name
        forget = next(t for t in tools if t.name == "forget")
        assert forget.input_schema["properties"]["everything"]["type"] == "boolean"
