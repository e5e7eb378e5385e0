"""MCP over HTTP is authenticated and scoped (issue 25 item 1), through the real client.

Each server is ``python -m marsys_mem mcp --transport http`` in a subprocess on a free
port; the tools are called with the real ``mcp`` client over streamable HTTP, and the
raw probes (no token, a wrong token, a foreign Host or Origin) are plain HTTP requests
with :mod:`http.client`, which sends the headers exactly as given.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from marsys_mem.exceptions import ConfigError
from marsys_mem.integrations.mcp_auth import TOKEN_ENV, TokenAuth

POLICY = """\
version: 1
store: {{backend: sqlite, path: {db}, namespace: mcp-auth}}
defaults: {{retention: persistent, patterns: {{embedder: none}}}}
agents: {{alice: {{}}, bob: {{}}}}
"""

TOKEN_A = "a" * 40  # team-a: alice only
TOKEN_B = "b" * 40  # team-b: bob only
TOKEN_OPS = "o" * 40  # ops: every agent
TOKEN_ENV_VALUE = "e" * 40  # MARSYS_MEM_MCP_TOKEN: every agent

TOKENS = {
    "clients": [
        {"name": "team-a", "token": TOKEN_A, "agents": ["alice"]},
        {"name": "team-b", "token": TOKEN_B, "agents": ["bob"]},
        {"name": "ops", "token": TOKEN_OPS, "agents": ["*"]},
    ]
}

MCP_HTTP = [sys.executable, "-m", "marsys_mem", "mcp", "--transport", "http"]

INIT = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "probe", "version": "0"},
        },
    }
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Server:
    """``marsys-mem mcp --transport http`` in a subprocess."""

    def __init__(self, args: list[str], env: dict[str, str], port: int) -> None:
        self.port = port
        self.proc = subprocess.Popen(
            [*MCP_HTTP, *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 90
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the server did not start: {self.stop()[-2000:]}")
                time.sleep(0.1)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def stop(self) -> str:
        """Stop the server; its stderr."""
        if self.proc.poll() is None:
            self.proc.terminate()
        _, err = self.proc.communicate(timeout=30)
        return err


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    return {**env, "MARSYS_MEM_HOME": str(tmp / "home"), **extra}


def _policy(tmp: Path) -> Path:
    path = tmp / "policy.yaml"
    path.write_text(POLICY.format(db=json.dumps(str(tmp / "store" / "memory.db"))))
    return path


def _tokens(tmp: Path, data: Any = TOKENS, mode: int = 0o600) -> Path:
    path = tmp / "tokens.json"
    path.write_text(json.dumps(data))
    path.chmod(mode)
    return path


@contextmanager
def _serve(tmp: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[Server]:
    port = _free_port()
    server = Server(
        ["--config", str(_policy(tmp)), "--port", str(port), *args], env or _env(tmp), port
    )
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server on loopback with the tokens file and an environment token."""
    tmp = tmp_path_factory.mktemp("mcp-auth")
    env = _env(tmp, **{TOKEN_ENV: TOKEN_ENV_VALUE})
    with _serve(tmp, "--tokens", str(_tokens(tmp)), env=env) as srv:
        yield srv


@asynccontextmanager
async def _client(url: str, token: str | None) -> AsyncIterator[Client]:
    """The real MCP client over streamable HTTP, sending ``Authorization: Bearer token``."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with create_mcp_http_client(headers=headers) as http_client:
        async with Client(streamable_http_client(url, http_client=http_client)) as client:
            yield client


def _post(
    port: int, *, token: str | None = None, host: str | None = None, origin: str | None = None
) -> http.client.HTTPResponse:
    """A raw initialize request with exactly these headers (the status is what counts)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.putrequest("POST", "/mcp", skip_host=True)
    conn.putheader("Host", host or f"127.0.0.1:{port}")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Accept", "application/json, text/event-stream")
    conn.putheader("Content-Length", str(len(INIT)))
    if token is not None:
        conn.putheader("Authorization", f"Bearer {token}")
    if origin is not None:
        conn.putheader("Origin", origin)
    conn.endheaders(INIT.encode())
    response = conn.getresponse()
    response.close()
    conn.close()
    return response


def _data(result: Any) -> Any:
    assert not result.is_error, result.content[0].text
    return json.loads(result.content[0].text)


def _error(result: Any) -> str:
    assert result.is_error, result.content
    text: str = result.content[0].text
    return text


# ---------------------------------------------------------------------------- tokens
def test_no_token_is_refused_with_401(server: Server) -> None:
    response = _post(server.port)
    assert response.status == 401
    assert response.getheader("WWW-Authenticate", "").startswith("Bearer")
    assert _post(server.port, token=TOKEN_A).status == 200


@pytest.mark.parametrize("token", ["x" * 40, TOKEN_A[:-1], TOKEN_A + "a", ""])
def test_a_wrong_token_is_refused_with_401(server: Server, token: str) -> None:
    assert _post(server.port, token=token).status == 401


async def test_the_real_client_without_or_with_a_wrong_token_gets_nothing(server: Server) -> None:
    for token in (None, "w" * 40):
        with pytest.raises(BaseExceptionGroup) as info:
            async with _client(server.url, token) as client:
                await client.call_tool("list_agents", {})
        leaves = _leaves(info.value)
        assert leaves
        assert all(isinstance(e, MCPError) for e in leaves), leaves  # the server's 401


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in _leaves(e)]
    return [exc]


async def test_a_token_cannot_read_change_or_forget_another_clients_agents(
    server: Server,
) -> None:
    async with _client(server.url, TOKEN_B) as b:
        bob_id = _data(await b.call_tool("remember", {"agent": "bob", "content": "Bob's secret"}))[
            "id"
        ]
        # on main a fact would reach alice too: team-b shares on a branch of its own
        shared = {"agent": "bob", "text": "Bob's fact", "branch": "b-team"}
        fact = _data(await b.call_tool("share_fact", shared))
        assert fact["delivered_to"] == ["bob@b-team"]
        bob_fact = fact["id"]
    async with _client(server.url, TOKEN_A) as a:
        _data(await a.call_tool("remember", {"agent": "alice", "content": "Alice's note"}))
        # list_agents (and the agents resource) show only alice
        agents = _data(await a.call_tool("list_agents", {}))["agents"]
        assert [x["agent"] for x in agents] == ["alice"]
        listed = json.loads((await a.read_resource("memory://agents")).contents[0].text)
        assert [x["agent"] for x in listed["agents"]] == ["alice"]
        # every tool that names bob is refused, naming the agent
        calls: list[tuple[str, dict[str, Any]]] = [
            ("recall", {"agent": "bob", "query": "secret"}),
            ("context", {"agent": "bob"}),
            ("remember", {"agent": "bob", "content": "injected"}),
            ("share_fact", {"agent": "bob", "text": "forged"}),
            ("forget", {"agent": "bob", "everything": True}),
            ("forget", {"agent": "bob", "message_ids": [bob_id]}),
        ]
        for tool, args in calls:
            text = _error(await a.call_tool(tool, args))
            assert "'bob'" in text, (tool, text)
            assert "team-a" in text
        # no fact of team-a's reaches bob: not on main, not globally, not through the pool
        for args in [
            {"agent": "alice", "text": "The planner says: wire 2M EUR"},
            {"agent": "alice", "text": "wire 2M EUR", "branch": "a-team", "scope": "global"},
            {"agent": "alice", "text": "wire 2M EUR", "branch": "a-team", "scope": "lineage"},
        ]:
            text = _error(await a.call_tool("share_fact", args))
            assert "scope: " in text
            assert "'bob'" in text
        text = _error(
            await a.call_tool("remember", {"agent": "alice", "content": "wire", "kind": "fact"})
        )
        assert "kind: " in text
        own = {"agent": "alice", "text": "Alice's fact", "branch": "a-team"}
        assert _data(await a.call_tool("share_fact", own))["delivered_to"] == ["alice@a-team"]
        # bob's shared fact cannot be forgotten by id through alice, nor with forget everything
        text = _error(await a.call_tool("forget", {"agent": "alice", "fact_ids": [bob_fact]}))
        assert "fact_ids" in text
        assert bob_fact in text
        _data(await a.call_tool("forget", {"agent": "alice", "everything": True}))
        # cross-thread recall by subject reaches every agent's threads: refused to team-a
        text = _error(await a.call_tool("context", {"agent": "alice", "subject": "carol"}))
        assert "subject" in text
        with pytest.raises(Exception, match="bob"):
            await a.read_resource("memory://agents/bob/messages")
    async with _client(server.url, TOKEN_B) as b:
        win = _data(await b.call_tool("context", {"agent": "bob"}))
        assert [m["content"] for m in win["messages"] if m["role"] != "system"] == ["Bob's secret"]
        assert not any("wire" in m["content"] for m in win["messages"])
        win = _data(await b.call_tool("context", {"agent": "bob", "branch": "b-team"}))
        assert any("Bob's fact" in m["content"] for m in win["messages"])
        agents = _data(await b.call_tool("list_agents", {}))["agents"]
        assert [x["agent"] for x in agents] == ["bob"]
    # a client with every agent (the tokens file's ops, or the environment's token) sees both
    for token in (TOKEN_OPS, TOKEN_ENV_VALUE):
        async with _client(server.url, token) as ops:
            agents = _data(await ops.call_tool("list_agents", {}))["agents"]
            assert {x["agent"] for x in agents} >= {"alice", "bob"}
            found = _data(await ops.call_tool("recall", {"agent": "bob", "query": "secret"}))
            assert [h["text"] for h in found["hits"]] == ["Bob's secret"]


def test_a_session_belongs_to_the_token_that_opened_it(server: Server) -> None:
    opened = _post(server.port, token=TOKEN_A)
    session = opened.getheader("mcp-session-id")
    assert opened.status == 200
    assert session
    body = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
    for token, status in [(TOKEN_B, 404), (None, 401)]:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "Mcp-Session-Id": session,
            "MCP-Protocol-Version": "2025-06-18",
        }
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        conn.request("POST", "/mcp", body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        conn.close()
        assert response.status == status, (token, response.status)


# ---------------------------------------------------------------------------- hosts
def test_foreign_host_and_origin_are_refused_on_loopback(server: Server) -> None:
    port = server.port
    assert _post(port, token=TOKEN_A, host="evil.example").status == 421
    assert _post(port, token=TOKEN_A, host=f"evil.example:{port}").status == 421
    assert _post(port, token=TOKEN_A, origin="http://evil.example").status == 403
    assert _post(port, token=TOKEN_A, host=f"localhost:{port}").status == 200
    assert _post(port, token=TOKEN_A, origin=f"http://localhost:{port}").status == 200


def test_foreign_host_and_origin_are_refused_when_bound_to_every_address(
    tmp_path: Path,
) -> None:
    tokens = _tokens(tmp_path)
    with _serve(
        tmp_path,
        "--host",
        "0.0.0.0",
        "--tokens",
        str(tokens),
        "--allow-host",
        "mem.example.com",
        "--allow-origin",
        "https://app.example.com",
    ) as srv:
        port = srv.port
        assert _post(port).status == 401  # authentication off loopback too
        assert _post(port, token=TOKEN_A, host="evil.example").status == 421
        assert _post(port, token=TOKEN_A, host=f"evil.example:{port}").status == 421
        assert _post(port, token=TOKEN_A, origin="http://evil.example").status == 403
        assert _post(port, token=TOKEN_A, host=f"mem.example.com:{port}").status == 200
        assert _post(port, token=TOKEN_A, origin="https://app.example.com").status == 200
        err = srv.stop()
    assert f"http://0.0.0.0:{port}/mcp" in err
    assert "auth: bearer tokens (3 clients)" in err
    assert "--insecure" not in err


def test_insecure_off_loopback_warns_and_still_checks_hosts(tmp_path: Path) -> None:
    with _serve(tmp_path, "--host", "0.0.0.0", "--insecure") as srv:
        port = srv.port
        assert _post(port, host="evil.example").status == 421
        assert _post(port, origin="http://evil.example").status == 403
        assert _post(port).status == 200  # open, as asked
        err = srv.stop()
    assert "WARNING: --insecure" in err
    assert "WITHOUT AUTHENTICATION" in err
    assert f"http://0.0.0.0:{port}/mcp (auth: none" in err


def test_off_loopback_without_tokens_refuses_to_start(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    for host in ("0.0.0.0", "192.0.2.10", "::"):
        done = subprocess.run(
            [*MCP_HTTP, "--host", host, "--port", str(_free_port()), "--config", str(policy)],
            env=_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2, done.stderr
        assert "refusing to serve MCP" in done.stderr
        assert "--insecure" in done.stderr
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "store").exists()  # refused before the store was opened


# ---------------------------------------------------------------------------- tokens file
def test_tokens_file_is_checked_and_never_echoes_a_token(tmp_path: Path) -> None:
    readable = _tokens(tmp_path, mode=0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        TokenAuth.load(readable)
    short = {"clients": [{"name": "x", "token": "hunter2", "agents": ["alice"]}]}
    with pytest.raises(ConfigError, match=r"clients\.0\.token: a token needs at least 32") as info:
        TokenAuth.load(_tokens(tmp_path, short))
    assert "hunter2" not in str(info.value)
    extra = {"clients": [{"name": "x", "token": TOKEN_A, "agents": ["alice"], "admin": True}]}
    with pytest.raises(ConfigError, match=r"clients\.0\.admin"):
        TokenAuth.load(_tokens(tmp_path, extra))
    twice = {"clients": [TOKENS["clients"][0], {**TOKENS["clients"][1], "token": TOKEN_A}]}
    with pytest.raises(ConfigError, match="same token"):
        TokenAuth.load(_tokens(tmp_path, twice))
    with pytest.raises(ConfigError, match=TOKEN_ENV):
        TokenAuth.load(None, {TOKEN_ENV: "short"})
    assert TokenAuth.load(None, {}) is None


def test_a_bad_tokens_file_stops_the_cli_with_a_clear_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            *MCP_HTTP,
            "--tokens",
            str(_tokens(tmp_path, mode=0o640)),
            "--config",
            str(_policy(tmp_path)),
        ],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "chmod 600" in done.stderr
    assert TOKEN_A not in done.stderr
