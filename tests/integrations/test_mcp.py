"""The MCP server (``marsys-mem mcp``), driven by the real ``mcp`` client library.

The round trips spawn ``python -m marsys_mem mcp --config FILE`` over stdio (and once over
streamable HTTP), as Claude Desktop or any MCP client would; the finer cases talk to the
same server in process (``mcp.Client(server.mcp)``), which runs the same request handling
without a subprocess. Embeddings: the HashingEmbedder or BM25 only (no model load).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from marsys_mem.config.load import load_config
from marsys_mem.integrations.mcp import MemoryServer
from marsys_mem.manager import MemoryManager
from marsys_mem.store import SQLiteStore

ROOT = Path(__file__).resolve().parents[2]

POLICY = """\
version: 1
store: {{backend: sqlite, path: {db}, namespace: mcp-test}}
defaults:
  retention: session
  context: {{max_tokens: 2000}}
agents:
  researcher:
    retention: persistent
    patterns: {{embedder: hashing, rag: {{k: 4}}}}
  planner:
    retention: persistent
    patterns: {{embedder: hashing}}
  writer:
    patterns: {{embedder: none}}
"""


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.format(db=json.dumps(str(tmp_path / "store" / "memory.db"))))
    return path


def _params(policy: Path, tmp_path: Path) -> StdioServerParameters:
    env = {"MARSYS_MEM_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "marsys_mem", "mcp", "--config", str(policy)],
        env=env,
        cwd=str(tmp_path),
    )


def _data(result: Any) -> Any:
    assert not result.is_error, result.content[0].text
    return json.loads(result.content[0].text)


async def _agents(client: Client) -> list[dict[str, Any]]:
    agents: list[dict[str, Any]] = _data(await client.call_tool("list_agents", {}))["agents"]
    return agents


def _error(result: Any) -> str:
    assert result.is_error, result.content
    text: str = result.content[0].text
    return text


async def test_stdio_round_trip(policy: Path, tmp_path: Path) -> None:
    async with Client(_params(policy, tmp_path)) as client:
        tools = {t.name for t in (await client.list_tools()).tools}
        assert tools == {"remember", "recall", "context", "forget", "share_fact", "list_agents"}

        ids = []
        for text in [
            "My sister Clara lives in Lisbon",
            "I parked the car on level 4 of the garage",
            "The quarterly report is due on Friday",
        ]:
            ids.append(
                _data(await client.call_tool("remember", {"agent": "researcher", "content": text}))[
                    "id"
                ]
            )
        reply = _data(
            await client.call_tool(
                "remember",
                {"agent": "researcher", "role": "assistant", "content": "Noted: level 4."},
            )
        )
        assert reply["persistent"] is True
        assert reply["messages"] == 4

        # recall: hybrid over the agent's RAG pattern, with both scores
        found = _data(
            await client.call_tool(
                "recall", {"agent": "researcher", "query": "where did I park the car", "k": 2}
            )
        )
        assert found["retriever"] == "the agent's RAG pattern"
        assert found["mode"] == "hybrid"
        top = found["hits"][0]
        assert top["text"] == "I parked the car on level 4 of the garage"
        assert top["rank"] == 1
        assert top["bm25_score"] > 0
        assert top["dense_score"] is not None
        assert top["score"] > 0
        assert len(found["hits"]) == 2

        # an agent without RAG: a RAGMemory over its messages (BM25 only for "none")
        _data(
            await client.call_tool(
                "remember", {"agent": "writer", "content": "Draft the Lisbon chapter"}
            )
        )
        found = _data(await client.call_tool("recall", {"agent": "writer", "query": "Lisbon"}))
        assert found["retriever"] == "a RAGMemory over its messages"
        assert found["mode"] == "bm25"
        assert found["hits"][0]["bm25_score"] > 0

        # context: the window under the policy, OpenAI format
        win = _data(await client.call_tool("context", {"agent": "researcher"}))
        assert win["provider"] == "openai"
        assert win["max_tokens"] == 2000
        assert [m["role"] for m in win["messages"]] == ["user"] * 3 + ["assistant"]
        assert 0 < win["tokens"] <= 2000

        # share_fact: scoped through the coordinator, lands in the receivers' context
        shared = _data(
            await client.call_tool(
                "share_fact",
                {"agent": "researcher", "text": "Lisbon hotels average 140 EUR", "scope": "global"},
            )
        )
        assert {"researcher", "planner", "writer"} <= set(shared["delivered_to"])
        win = _data(await client.call_tool("context", {"agent": "planner"}))
        assert "Lisbon hotels average 140 EUR" in win["messages"][0]["content"]
        assert win["messages"][0]["role"] == "system"

        # forget by id: gone from the memory and from recall
        gone = _data(
            await client.call_tool("forget", {"agent": "researcher", "message_ids": [ids[1]]})
        )
        assert gone == {
            "agent": "researcher",
            "branch": "main",
            "removed": 1,
            "facts_removed": 0,
            "left": 3,
        }
        found = _data(
            await client.call_tool(
                "recall", {"agent": "researcher", "query": "parked the car level 4", "k": 4}
            )
        )
        assert ids[1] not in [h["id"] for h in found["hits"]]

        agents = await _agents(client)
        by_name = {a["agent"]: a for a in agents}
        assert by_name["researcher"]["retention"] == "persistent"
        assert by_name["researcher"]["branches"] == {"main": 3}
        assert by_name["writer"]["rag"] is False

        listed = await client.read_resource("memory://agents")
        assert json.loads(listed.contents[0].text) == {"agents": agents}
        messages = await client.read_resource("memory://agents/researcher/messages")
        texts = [m["content"] for m in json.loads(messages.contents[0].text)]
        assert texts == [
            "My sister Clara lives in Lisbon",
            "The quarterly report is due on Friday",
            "Noted: level 4.",
        ]

        # bad inputs: a tool error naming the field, and nothing changed
        before = await _agents(client)
        text = _error(await client.call_tool("remember", {"agent": "a/b", "content": "x"}))
        assert "agent" in text
        assert "a/b" in text
        text = _error(await client.call_tool("recall", {"agent": "researcher", "query": "  "}))
        assert "query" in text
        text = _error(await client.call_tool("recall", {"agent": "researcher", "query": ""}))
        assert "query" in text
        text = _error(
            await client.call_tool(
                "share_fact", {"agent": "researcher", "text": "x", "scope": "everywhere"}
            )
        )
        assert "scope" in text
        assert "everywhere" in text
        text = _error(
            await client.call_tool(
                "forget", {"agent": "researcher", "message_ids": [ids[0], "no-such-id"]}
            )
        )
        assert "message_ids" in text
        assert "no-such-id" in text
        assert "nothing was removed" in text
        text = _error(await client.call_tool("forget", {"agent": "researcher"}))
        assert "message_ids" in text
        assert "everything" in text
        assert await _agents(client) == before

        # the server is still serving after every error
        assert _data(await client.call_tool("context", {"agent": "researcher"}))["messages"]


async def test_restart_keeps_persistent_agents(policy: Path, tmp_path: Path) -> None:
    async with Client(_params(policy, tmp_path)) as client:
        for agent in ("researcher", "planner", "writer"):
            _data(
                await client.call_tool(
                    "remember",
                    {"agent": agent, "content": f"{agent} knows the launch is on March 3"},
                )
            )
        _data(
            await client.call_tool(
                "remember", {"agent": "researcher", "content": "The venue is the old tram depot"}
            )
        )

    async with Client(_params(policy, tmp_path)) as client:  # a new server process
        by_name = {a["agent"]: a for a in await _agents(client)}
        assert by_name["researcher"]["branches"] == {"main": 2}
        assert by_name["planner"]["branches"] == {"main": 1}
        assert by_name["writer"]["branches"] == {}  # session memory: gone with the process
        win = _data(await client.call_tool("context", {"agent": "researcher"}))
        assert [m["content"] for m in win["messages"]] == [
            "researcher knows the launch is on March 3",
            "The venue is the old tram depot",
        ]
        found = _data(
            await client.call_tool(
                "recall", {"agent": "researcher", "query": "tram depot venue", "k": 1}
            )
        )
        assert found["hits"][0]["text"] == "The venue is the old tram depot"
        found = _data(await client.call_tool("recall", {"agent": "planner", "query": "launch"}))
        assert found["hits"][0]["text"] == "planner knows the launch is on March 3"

        # forgetting everything of a persistent agent reaches the store too
        assert (
            _data(await client.call_tool("forget", {"agent": "researcher", "everything": True}))[
                "removed"
            ]
            == 2
        )

    async with Client(_params(policy, tmp_path)) as client:
        win = _data(await client.call_tool("context", {"agent": "researcher"}))
        assert win["messages"] == []
        found = _data(await client.call_tool("recall", {"agent": "researcher", "query": "tram"}))
        assert found["hits"] == []


async def test_restart_keeps_shared_facts(policy: Path, tmp_path: Path) -> None:
    def facts_in(win: dict[str, Any]) -> str:
        first = win["messages"][0] if win["messages"] else {}
        return str(first["content"]) if first.get("role") == "system" else ""

    shares = [
        {"agent": "planner", "text": "Budget is 4,000 EUR", "scope": "global", "topic": "budget"},
        {"agent": "researcher", "branch": "pt", "text": "Porto is cheaper", "scope": "branch"},
    ]
    async with Client(_params(policy, tmp_path)) as client:
        for args in shares:
            _data(await client.call_tool("share_fact", args))
        _data(await client.call_tool("share_fact", shares[0]))  # again: recorded once
        _data(
            await client.call_tool(
                "remember",
                {"agent": "writer", "kind": "fact", "content": "The client prefers trains"},
            )
        )

    async with Client(_params(policy, tmp_path)) as client:  # a new server process
        planner = facts_in(_data(await client.call_tool("context", {"agent": "planner"})))
        assert "Budget is 4,000 EUR" in planner
        assert "The client prefers trains" in planner
        assert "Porto" not in planner  # scoped to branch pt, as when it was shared
        pt = _data(await client.call_tool("context", {"agent": "researcher", "branch": "pt"}))
        assert "Porto is cheaper" in facts_in(pt)
        writer = facts_in(_data(await client.call_tool("context", {"agent": "writer"})))
        assert "Budget is 4,000 EUR" in writer  # a session agent: its facts are shared ones
        late = facts_in(_data(await client.call_tool("context", {"agent": "newcomer"})))
        assert "Budget is 4,000 EUR" in late  # joined after the restart: in scope, delivered
        assert "Porto" not in late
        more = _data(
            await client.call_tool(
                "share_fact", {"agent": "planner", "text": "Launch is on March 3"}
            )
        )
        assert "planner" in more["delivered_to"]

    async with Client(_params(policy, tmp_path)) as client:  # and once more
        planner = facts_in(_data(await client.call_tool("context", {"agent": "planner"})))
        assert "Launch is on March 3" in planner
        assert planner.count("Budget is 4,000 EUR") == 1

    # recorded once each, as a workflow run records facts (what `marsys-mem search` reads)
    with SQLiteStore(tmp_path / "store" / "memory.db") as store:
        recorded = {
            key[2]: sorted(m.text for m in store.load_messages(key))
            for key in store.list_keys("mcp-test")
            if key[1] == "#facts"
        }
    assert recorded == {
        "main": ["Budget is 4,000 EUR", "Launch is on March 3", "The client prefers trains"],
        "pt": ["Porto is cheaper"],
    }


async def test_facts_are_not_recorded_in_a_memory_store() -> None:
    server = MemoryServer(MemoryManager())
    assert not server.durable
    await server.share_fact("planner", "Budget is 4,000 EUR", scope="global")
    assert "Budget is 4,000 EUR" in str(server.context("planner")["messages"][0]["content"])
    assert server.manager.store.list_keys() == []
    await server.aclose()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_streamable_http(policy: Path, tmp_path: Path) -> None:
    port = _free_port()
    env = {**os.environ, "MARSYS_MEM_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "marsys_mem",
            "mcp",
            "--config",
            str(policy),
            "--transport",
            "http",
            "--port",
            str(port),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    _out, err = proc.communicate(timeout=5)
                    pytest.fail(f"the server did not start: {err.decode()[-2000:]}")
                time.sleep(0.1)
        async with Client(f"http://127.0.0.1:{port}/mcp") as client:
            _data(
                await client.call_tool("remember", {"agent": "researcher", "content": "Over HTTP"})
            )
            win = _data(await client.call_tool("context", {"agent": "researcher"}))
            assert [m["content"] for m in win["messages"]] == ["Over HTTP"]
    finally:
        proc.terminate()
        proc.communicate(timeout=20)


# ---------------------------------------------------------------------------- in process
@pytest.fixture
async def server(policy: Path):
    srv = MemoryServer.from_config(policy)
    yield srv
    await srv.aclose()


async def test_share_fact_scopes_follow_the_branch_graph(server: MemoryServer) -> None:
    async with Client(server.mcp) as client:
        for agent, branch in [("planner", "main"), ("researcher", "pt"), ("writer", "es")]:
            _data(
                await client.call_tool(
                    "remember",
                    {"agent": agent, "branch": branch, "content": f"hello from {branch}"},
                )
            )
        fact = _data(
            await client.call_tool(
                "share_fact",
                {
                    "agent": "researcher",
                    "branch": "pt",
                    "text": "Porto is cheaper",
                    "scope": "branch",
                },
            )
        )
        assert fact["delivered_to"] == ["researcher@pt"]
        fact = _data(
            await client.call_tool(
                "share_fact",
                {
                    "agent": "researcher",
                    "branch": "pt",
                    "text": "Faro is sunny",
                    "scope": "lineage",
                },
            )
        )
        assert "researcher@pt" in fact["delivered_to"]
        assert "planner" in fact["delivered_to"]
        assert not any(k.endswith("@es") for k in fact["delivered_to"])

        def facts_in(win: dict[str, Any]) -> str:
            first = win["messages"][0]
            return str(first["content"]) if first["role"] == "system" else ""

        planner = _data(await client.call_tool("context", {"agent": "planner"}))
        writer = _data(await client.call_tool("context", {"agent": "writer", "branch": "es"}))
        assert "Faro is sunny" in facts_in(planner)
        assert "Porto" not in facts_in(planner)
        assert "Faro" not in facts_in(writer)

        # a late joiner receives what is already in its scope
        fact = _data(
            await client.call_tool(
                "share_fact", {"agent": "planner", "text": "Budget is 2,000 EUR", "scope": "global"}
            )
        )
        late = _data(await client.call_tool("context", {"agent": "newcomer"}))
        assert "Budget is 2,000 EUR" in facts_in(late)


async def test_remember_a_fact_through_the_shared_pool(server: MemoryServer) -> None:
    async with Client(server.mcp) as client:
        _data(await client.call_tool("remember", {"agent": "planner", "content": "hi"}))
        fact = _data(
            await client.call_tool(
                "remember",
                {"agent": "researcher", "kind": "fact", "content": "The client prefers trains"},
            )
        )
        assert fact["kind"] == "fact"
        assert len(fact["delivered_to"]) == fact["delivered_count"] >= 2
        win = _data(await client.call_tool("context", {"agent": "planner"}))
        assert "The client prefers trains" in win["messages"][0]["content"]
        # facts are not messages
        assert server.manager.memory("researcher").read() == []


async def test_context_with_a_query_brings_retrieved_snippets(server: MemoryServer) -> None:
    async with Client(server.mcp) as client:
        for i in range(60):
            _data(
                await client.call_tool(
                    "remember",
                    {
                        "agent": "researcher",
                        "content": f"filler message number {i}: " + "lorem ipsum " * 30,
                    },
                )
            )
        win = _data(
            await client.call_tool(
                "context", {"agent": "researcher", "query": "filler message number 3"}
            )
        )
        assert win["tokens"] <= 2000
        assert win["dropped"] > 0
        assert any("Relevant memories" in str(m["content"]) for m in win["messages"])


async def test_inputs_are_validated(server: MemoryServer) -> None:
    async with Client(server.mcp) as client:
        for args, field in [
            ({"agent": "", "content": "x"}, "agent"),
            ({"agent": "a#b", "content": "x"}, "agent"),
            ({"agent": "a", "content": "x", "branch": "b@c"}, "branch"),
            ({"agent": "a", "content": ""}, "content"),
            ({"agent": "a", "content": "x", "role": "tool"}, "role"),
            ({"agent": "a", "content": "x", "kind": "note"}, "kind"),
            ({"agent": "a", "content": "x" * 100_001}, "content"),
            ({"content": "x"}, "agent"),
        ]:
            assert field in _error(await client.call_tool("remember", args)), args
        assert "k" in _error(await client.call_tool("recall", {"agent": "a", "query": "q", "k": 0}))
        assert "confidence" in _error(
            await client.call_tool("share_fact", {"agent": "a", "text": "t", "confidence": 2})
        )
        text = _error(
            await client.call_tool(
                "forget", {"agent": "a", "message_ids": ["x"], "everything": True}
            )
        )
        assert "not both" in text
        assert {a["agent"] for a in await _agents(client)} == {
            "researcher",
            "planner",
            "writer",
        }  # nothing was created by the bad calls
        with pytest.raises(Exception, match=r"agent must be .* got 'a/b'"):
            await client.read_resource("memory://agents/a%2Fb/messages")
        # reading an unknown agent's messages creates nothing
        unknown = await client.read_resource("memory://agents/nobody/messages")
        assert json.loads(unknown.contents[0].text) == []
        assert "nobody" not in {a["agent"] for a in await _agents(client)}


def test_plain_methods_work_without_a_client(server: MemoryServer) -> None:
    mid = server.remember("planner", "Book the Lisbon trip", role="user")["id"]
    assert server.recall("planner", "Lisbon trip")["hits"][0]["id"] == mid
    assert server.context("planner")["messages"] == [
        {"role": "user", "content": "Book the Lisbon trip"}
    ]
    assert server.forget("planner", message_ids=[mid])["removed"] == 1
    assert server.recall("planner", "Lisbon trip")["hits"] == []


# ---------------------------------------------------------------------------- packaging
def test_the_example_policy_is_valid() -> None:
    config = load_config(ROOT / "examples" / "mcp" / "policy.yaml")
    assert any(p.retention == "persistent" for p in config.agents.values())
    desktop = json.loads((ROOT / "examples" / "mcp" / "claude_desktop_config.json").read_text())
    args = desktop["mcpServers"]["marsys-mem"]["args"]
    assert args[:2] == ["mcp", "--config"]


def test_a_missing_sdk_names_the_extra() -> None:
    code = textwrap.dedent("""
        import sys
        sys.modules["mcp"] = None  # as if the mcp extra were not installed
        from marsys_mem.exceptions import MissingDependencyError
        try:
            import marsys_mem.integrations.mcp
        except MissingDependencyError as exc:
            print(exc)
        from marsys_mem.cli.main import main
        raise SystemExit(main(["mcp"]))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "pip install 'marsys-mem[mcp]'" in done.stdout
    assert done.returncode == 1
    assert "marsys-mem[mcp]" in done.stderr


# ---------------------------------------------------------------------------- forget
PATTERNS_POLICY = """\
version: 1
store: {{backend: sqlite, path: {db}, namespace: mcp-forget}}
agents:
  archivist:
    retention: persistent
    patterns:
      embedder: hashing
      rag: {{k: 5}}
      episodic: {{k: 5}}
      hierarchical: {{working_size: 2, k: 5}}
"""


def _held(server: MemoryServer, agent: str) -> dict[str, set[str]]:
    """Message ids each memory pattern of ``agent`` holds."""
    patterns = server.manager.patterns(agent)
    assert patterns is not None
    assert patterns.rag is not None
    assert patterns.episodic is not None
    assert patterns.hierarchical is not None
    tiers = patterns.hierarchical
    return {
        "rag": {m.message_id for m in patterns.rag.messages()},
        "episodic": {m.message_id for m in patterns.episodic.rag.messages()},
        "hierarchical": {
            m.message_id for m in [*tiers.core(), *tiers.working(), *tiers.archive.messages()]
        },
    }


async def test_forget_reaches_episodic_and_hierarchical_memory(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(PATTERNS_POLICY.format(db=json.dumps(str(tmp_path / "memory.db"))))
    texts = ["My passport number is X1234567", "Lunch is at noon", "The van is blue", "Hi"]
    server = MemoryServer.from_config(policy)
    try:
        async with Client(server.mcp) as client:
            ids = [
                _data(await client.call_tool("remember", {"agent": "archivist", "content": t}))[
                    "id"
                ]
                for t in texts
            ]
            secret = ids[0]
            patterns = server.manager.patterns("archivist")
            assert patterns is not None
            assert patterns.hierarchical is not None
            assert patterns.hierarchical.tier_of(secret) == "archive"  # working_size 2
            assert all(secret in held for held in _held(server, "archivist").values())
            out = _data(
                await client.call_tool("forget", {"agent": "archivist", "message_ids": [secret]})
            )
            assert out["removed"] == 1
            assert all(secret not in held for held in _held(server, "archivist").values())
            ctx = _data(
                await client.call_tool("context", {"agent": "archivist", "query": "passport"})
            )
            assert "X1234567" not in json.dumps(ctx)
    finally:
        await server.aclose()

    server = MemoryServer.from_config(policy)  # a restart: the patterns reload their keys
    try:
        server.manager.memory("archivist")
        held = _held(server, "archivist")
        assert all(secret not in h and set(ids[1:]) <= h for h in held.values())
        assert server.forget("archivist", everything=True)["removed"] == 3
        assert _held(server, "archivist") == {
            "rag": set(),
            "episodic": set(),
            "hierarchical": set(),
        }
    finally:
        await server.aclose()
    server = MemoryServer.from_config(policy)
    try:
        server.manager.memory("archivist")
        assert _held(server, "archivist") == {
            "rag": set(),
            "episodic": set(),
            "hierarchical": set(),
        }
    finally:
        await server.aclose()


async def test_forget_shared_facts_through_the_mcp_client(server: MemoryServer) -> None:
    """issue 24 case 5, through the real client: by id, then everything the agent shared."""
    async with Client(server.mcp) as client:
        args = {"agent": "planner", "text": "The door code is 2468", "scope": "global"}
        first = _data(await client.call_tool("share_fact", args))
        _data(
            await client.call_tool(
                "remember", {"agent": "planner", "kind": "fact", "content": "Budget is 4,000 EUR"}
            )
        )
        gone = _data(
            await client.call_tool("forget", {"agent": "planner", "fact_ids": [first["id"]]})
        )
        assert gone["facts_removed"] == 1
        window = _data(await client.call_tool("context", {"agent": "writer"}))
        assert "2468" not in str(window)
        assert "Budget is 4,000 EUR" in str(window)
        gone = _data(await client.call_tool("forget", {"agent": "planner", "everything": True}))
        assert gone["facts_removed"] == 1
        window = _data(await client.call_tool("context", {"agent": "writer"}))
        assert "Budget" not in str(window)


async def test_look_alike_agent_names_are_refused(server: MemoryServer) -> None:
    """issue 25 item 9: a bidi override, a zero-width space or a line separator in a name."""
    async with Client(server.mcp) as client:
        for name in ["admin\u202e", "ad\u200bmin", "admin\u2028"]:
            result = await client.call_tool("remember", {"agent": name, "content": "hi"})
            assert result.is_error, name
        agents = [a["agent"] for a in await _agents(client)]
        assert all(a.isprintable() for a in agents)
