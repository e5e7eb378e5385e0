"""The MCP rough edges a newcomer met (issue 28), through the real ``mcp`` client.

The HTTP server says where it listens and that it is ready (stderr, one line each, as
uvicorn-based servers do); every tool error is one readable line naming the field and
the value (no pydantic dump); ``delivered_to`` is a list of inboxes in every tool that
returns it, with ``delivered_count`` beside it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from marsys_mem.integrations.mcp import MemoryServer
from marsys_mem.manager import MemoryManager


def _data(result: Any) -> Any:
    assert not result.is_error, result.content[0].text
    return json.loads(result.content[0].text)


async def test_http_server_says_where_it_listens_and_that_it_is_ready(tmp_path: Path) -> None:
    env = {**os.environ, "MARSYS_MEM_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "marsys_mem", "mcp", "--transport", "http", "--port", "0"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        lines: list[str] = []
        deadline = time.monotonic() + 90
        while len(lines) < 2 and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line.rstrip("\n"))
        assert len(lines) == 2, lines
        where, ready = lines
        found = re.fullmatch(
            r"marsys-mem: MCP server listening on (http://127\.0\.0\.1:(\d+)/mcp) "
            r"\(auth: none; allowed hosts: .*\)",
            where,
        )
        assert found is not None, where
        assert int(found.group(2)) > 0  # the port bound, not the 0 asked for
        assert ready == "marsys-mem: ready, serving MCP over streamable HTTP (Ctrl+C to stop)"
        async with Client(found.group(1)) as client:  # ready means ready: no retry needed
            stored = _data(await client.call_tool("remember", {"agent": "a", "content": "hi"}))
            assert stored["messages"] == 1
    finally:
        proc.terminate()
        proc.communicate(timeout=20)


BAD_CALLS = [
    ("remember", {"agent": "a#b", "content": "x"}, "agent", "'a#b'"),
    ("remember", {"agent": "a", "content": "   "}, "content", "'   '"),
    ("remember", {"agent": "a", "content": "x", "role": "tool"}, "role", "'tool'"),
    ("remember", {"agent": "a", "content": "x", "pinned": "yes"}, "pinned", "'yes'"),
    ("remember", {"agent": "a", "content": "x", "colour": 1}, "colour", "unknown argument"),
    ("recall", {"agent": "a", "query": "q", "k": 0}, "k", "got 0"),
    ("recall", {"agent": "a", "query": "q", "mode": "fuzzy"}, "mode", "'fuzzy'"),
    ("share_fact", {"agent": "a", "text": "t", "confidence": 2}, "confidence", "got 2"),
    ("share_fact", {"agent": "a", "text": "t", "scope": "world"}, "scope", "'world'"),
    ("forget", {"agent": "a", "message_ids": []}, "message_ids", "got []"),
    ("forget", {"agent": "a", "message_ids": "m1"}, "message_ids", "'m1'"),
    ("context", {"agent": "a", "subject": "x/y"}, "subject", "'x/y'"),
]


def _check_readable(text: str, field: str, value: str) -> None:
    assert "\n" not in text, text
    assert f"{field}: " in text, text
    assert value in text, text
    for dump in ("validation error", "pydantic", "For further information", "should be"):
        assert dump not in text, text


async def test_tool_errors_are_one_readable_line(tmp_path: Path) -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "marsys_mem", "mcp"],
        env={**os.environ, "MARSYS_MEM_HOME": str(tmp_path / "home")},
        cwd=str(tmp_path),
    )
    async with Client(params) as client:
        for tool, arguments, field, value in BAD_CALLS:
            result = await client.call_tool(tool, arguments)
            assert result.is_error, (tool, arguments)
            _check_readable(result.content[0].text, field, value)
        with pytest.raises(Exception, match=r"agent must be .* got 'a/b'") as raised:
            await client.read_resource("memory://agents/a%2Fb/messages")
        _check_readable(f"agent: {raised.value}", "agent", "'a/b'")


async def test_delivered_to_is_a_list_in_every_tool() -> None:
    server = MemoryServer(MemoryManager())
    try:
        async with Client(server.mcp) as client:
            for agent in ("planner", "writer"):
                _data(await client.call_tool("remember", {"agent": agent, "content": "hi"}))
            pooled = _data(
                await client.call_tool(
                    "remember", {"agent": "planner", "kind": "fact", "content": "Trains only"}
                )
            )
            scoped = _data(
                await client.call_tool(
                    "share_fact", {"agent": "planner", "text": "Budget 2k", "scope": "global"}
                )
            )
        for result in (pooled, scoped):
            assert result["delivered_to"] == ["planner", "writer"]
            assert result["delivered_count"] == 2
    finally:
        await server.aclose()
