"""An MCP server over a :class:`~marsys_mem.MemoryManager`: ``marsys-mem mcp --config FILE``.

Any MCP client gets the memory of the agents a retention-policy file describes, over
stdio or streamable HTTP (``pip install -e '.[mcp]'``). Tools: ``remember``, ``recall``,
``context``, ``forget``, ``share_fact``, ``list_agents``. Every input is validated
strictly (a bad one is a one-line tool error naming the field, and changes nothing); over
HTTP each bearer token reaches only its own agents, and off loopback the server refuses to
start without tokens.

Guide: ``docs/guides/integrations.md#tools-and-resources``.

Example:
    >>> server = MemoryServer(MemoryManager())
    >>> server.remember("alice", "My sister Clara lives in Lisbon")["role"]
    'user'
    >>> [h["text"] for h in server.recall("alice", "Where does Clara live?", k=1)["hits"]]
    ['My sister Clara lives in Lisbon']
    >>> server.close()
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import socket
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, Literal, ParamSpec, TypeVar

from pydantic import AfterValidator, Field, ValidationError

from marsys_mem.coordination import BranchGraph, Coordinator
from marsys_mem.exceptions import (
    ConfigError,
    MarsysMemError,
    MissingDependencyError,
)
from marsys_mem.front import MAX_FACT, MAX_TEXT, Memory
from marsys_mem.manager import MemoryManager
from marsys_mem.model.facts import FactScope
from marsys_mem.model.names import NAME_PATTERN, validate_name
from marsys_mem.patterns.rag import SearchMode

try:
    import uvicorn
    from mcp.server.auth.middleware.auth_context import get_access_token
    from mcp.server.auth.settings import AuthSettings
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ResourceError, ToolError
    from mcp.server.mcpserver.tools import Tool
    from pydantic import AnyHttpUrl
except ImportError as exc:  # pragma: no cover - the extra is installed in CI
    raise MissingDependencyError(
        "the MCP server needs the mcp extra: pip install 'marsys-mem[mcp]'"
    ) from exc

from marsys_mem.integrations.mcp_auth import ClientGrant, TokenAuth
from marsys_mem.integrations.mcp_http import HttpSettings
from marsys_mem.integrations.mcp_strict import StrictTool, describe

__all__ = ["MemoryServer", "Transport", "serve"]

log = logging.getLogger("marsys_mem.integrations.mcp")

Transport = Literal["stdio", "http"]
"""How the server talks to its client: stdio (a spawned process) or streamable HTTP."""


_P = ParamSpec("_P")
_T = TypeVar("_T")


# ---------------------------------------------------------------------------- inputs
def _agent(value: str) -> str:
    return validate_name("agent", value)


def _branch(value: str) -> str:
    return validate_name("branch", value)


def _subject(value: str) -> str:
    return validate_name("subject", value)


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty or only whitespace")
    return value


AgentName = Annotated[
    str, AfterValidator(_agent), Field(pattern=NAME_PATTERN, description="the agent's name")
]
BranchName = Annotated[
    str,
    AfterValidator(_branch),
    Field(pattern=NAME_PATTERN, description="the branch (default main)"),
]
SubjectName = Annotated[
    str,
    AfterValidator(_subject),
    Field(pattern=NAME_PATTERN, description="whom the conversation is with (the user)"),
]
Text = Annotated[str, Field(min_length=1, max_length=MAX_TEXT), AfterValidator(_not_blank)]
FactText = Annotated[str, Field(min_length=1, max_length=MAX_FACT), AfterValidator(_not_blank)]
MessageId = Annotated[str, Field(min_length=1, max_length=200)]


def _tool_errors(fn: Callable[_P, Awaitable[_T]]) -> Callable[_P, Awaitable[_T]]:
    """Turn the library's anticipated errors into tool errors (``isError``) the model reads."""

    @functools.wraps(fn)  # the SDK reads the tool's signature through __wrapped__
    async def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return await fn(*args, **kwargs)
        except ValidationError as exc:  # one line, never pydantic's dump
            raise ToolError(describe(exc)) from exc
        except (MarsysMemError, ValueError, TypeError, KeyError) as exc:
            raise ToolError(str(exc)) from exc

    return wrapper


# ---------------------------------------------------------------------------- the server
class MemoryServer:
    """The memory of a :class:`MemoryManager`'s agents, served over MCP.

    The tools are plain methods too (``remember``, ``recall``, ``context``, ``forget``,
    ``share_fact``, ``list_agents``), so the server can be tried without a client;
    :attr:`mcp` is the SDK's ``MCPServer`` that exposes them, and :meth:`run` serves it.

    Args:
        manager: the manager whose agents are served (closed by :meth:`close` when
            ``own_manager``).
        name: the server's name, as clients show it.
        own_manager: close the manager with the server (default: ``True``).
        auth: bearer tokens for HTTP clients, each limited to its agents
            (:class:`~marsys_mem.integrations.mcp_auth.TokenAuth`); ``None``: no
            authentication (stdio, or HTTP on loopback).

    Example:
        >>> server = MemoryServer(MemoryManager())
        >>> mid = server.remember("planner", "Book the Lisbon trip")["id"]
        >>> [m["content"] for m in server.context("planner")["messages"]]
        ['Book the Lisbon trip']
        >>> server.forget("planner", message_ids=[mid])["removed"]
        1
        >>> sorted(t.name for t in asyncio.run(server.mcp.list_tools()))[:3]
        ['context', 'forget', 'list_agents']
        >>> server.close()
    """

    def __init__(
        self,
        manager: MemoryManager,
        *,
        name: str = "marsys-mem",
        own_manager: bool = True,
        auth: TokenAuth | None = None,
    ) -> None:
        if not isinstance(manager, MemoryManager):
            raise TypeError(f"manager must be a MemoryManager, got {type(manager).__name__}")
        if auth is not None and not isinstance(auth, TokenAuth):
            raise TypeError(f"auth must be a TokenAuth, got {type(auth).__name__}")
        self.memory = Memory(manager, own_manager=own_manager)
        self.auth = auth
        self.mcp: MCPServer[Any] = MCPServer(
            name,
            instructions=(
                "Long-term memory for agents. remember adds a message (or a shared fact); "
                "recall searches an agent's messages; context shows what the agent would "
                "send to its LLM; share_fact shares a fact with other agents by scope."
            ),
            log_level="WARNING",
            tools=self._tools(),
            # bearer tokens only: no OAuth routes, no protected-resource metadata (the
            # issuer URL is required by the SDK's settings and unused without them)
            auth=None
            if auth is None
            else AuthSettings(issuer_url=AnyHttpUrl("http://127.0.0.1"), resource_server_url=None),
            token_verifier=auth,
        )
        self._register_resources()

    @classmethod
    def from_config(cls, path: str | Path | None = None, **kwargs: Any) -> MemoryServer:
        """A server over ``MemoryManager.from_config(path)`` (``None``: in memory, session)."""
        manager = MemoryManager() if path is None else MemoryManager.from_config(path)
        try:
            return cls(manager, **kwargs)
        except BaseException:
            manager.close()
            raise

    # ------------------------------------------------------------------ state (the Memory's)
    @property
    def manager(self) -> MemoryManager:
        """The manager whose agents are served."""
        return self.memory.manager

    @property
    def own_manager(self) -> bool:
        """Whether :meth:`close` closes the manager."""
        return self.memory.own_manager

    @property
    def graph(self) -> BranchGraph:
        """The branches and their agents (facts are shared by scope over it)."""
        return self.memory.graph

    @property
    def coordinator(self) -> Coordinator | None:
        """The coordinator, once started (``None`` before)."""
        return self.memory.coordinator

    @property
    def closed(self) -> bool:
        """Whether the server (and its :class:`Memory`) is closed."""
        return self.memory.closed

    @property
    def durable(self) -> bool:
        """Whether shared facts are recorded in the store (it outlives the process)."""
        return self.memory.durable

    # ------------------------------------------------------------------ tools
    # The operations are the front door's (:class:`~marsys_mem.front.Memory`); here the
    # agent comes first and is named ``agent`` in errors, as the tools' argument is.
    def remember(
        self,
        agent: str,
        content: str,
        *,
        role: Literal["user", "assistant", "system"] = "user",
        kind: Literal["message", "fact"] = "message",
        branch: str = "main",
        name: str | None = None,
        pinned: bool = False,
    ) -> dict[str, Any]:
        """Add a message to ``agent``'s memory, or (``kind="fact"``) a shared fact.

        :meth:`Memory.remember <marsys_mem.front.Memory.remember>` with ``user_id=agent``.
        """
        validate_name("agent", agent)
        return self.memory.remember(
            content, user_id=agent, role=role, kind=kind, branch=branch, name=name, pinned=pinned
        )

    def recall(
        self,
        agent: str,
        query: str,
        *,
        k: int = 5,
        branch: str = "main",
        mode: SearchMode | None = None,
    ) -> dict[str, Any]:
        """The ``k`` messages of ``agent`` that best match ``query``, best first, scored."""
        validate_name("agent", agent)
        return self.memory.recall(query, user_id=agent, k=k, branch=branch, mode=mode)

    def context(
        self,
        agent: str,
        query: str | None = None,
        *,
        branch: str = "main",
        subject: str | None = None,
    ) -> dict[str, Any]:
        """The window ``agent`` would send to its LLM under its policy (OpenAI format).

        ``subject``: whom the conversation is with; recalls from their other threads
        (``MemoryManager.context_for``).
        """
        validate_name("agent", agent)
        return self.memory.context(query, user_id=agent, branch=branch, subject=subject)

    async def acontext(
        self,
        agent: str,
        query: str | None = None,
        *,
        branch: str = "main",
        subject: str | None = None,
    ) -> dict[str, Any]:
        """Async twin of :meth:`context` (async summarisers allowed).

        Starts the coordinator first, so the facts a store recorded reach the agent.
        """
        validate_name("agent", agent)
        return await self.memory.acontext(query, user_id=agent, branch=branch, subject=subject)

    def forget(
        self,
        agent: str,
        *,
        message_ids: list[str] | None = None,
        fact_ids: list[str] | None = None,
        everything: bool = False,
        branch: str = "main",
    ) -> dict[str, Any]:
        """Delete messages by id (all or none), shared facts by id, or everything.

        :meth:`Memory.forget <marsys_mem.front.Memory.forget>` with ``user_id=agent``; use
        :meth:`aforget` from async code to reach coordinators elsewhere.
        """
        validate_name("agent", agent)
        return self.memory.forget(
            user_id=agent,
            message_ids=message_ids,
            fact_ids=fact_ids,
            everything=everything,
            branch=branch,
        )

    async def aforget(
        self,
        agent: str,
        *,
        message_ids: list[str] | None = None,
        fact_ids: list[str] | None = None,
        everything: bool = False,
        branch: str = "main",
    ) -> dict[str, Any]:
        """:meth:`forget`, then a tombstone for the forgotten facts to every coordinator."""
        validate_name("agent", agent)
        return await self.memory.aforget(
            user_id=agent,
            message_ids=message_ids,
            fact_ids=fact_ids,
            everything=everything,
            branch=branch,
        )

    async def share_fact(
        self,
        agent: str,
        text: str,
        *,
        branch: str = "main",
        scope: FactScope = "branch",
        topic: str | None = None,
        confidence: float = 1.0,
    ) -> dict[str, Any]:
        """Share a fact from ``agent`` on ``branch`` with every agent in ``scope``.

        The result's ``delivered_to`` lists the inboxes that hold the fact now (``agent``
        on main, else ``agent@branch``, sorted), ``delivered_count`` how many.
        """
        validate_name("agent", agent)
        return await self.memory.ashare_fact(
            text, user_id=agent, branch=branch, scope=scope, topic=topic, confidence=confidence
        )

    def list_agents(self) -> list[dict[str, Any]]:
        """Every agent the policy names, in use or in the store: retention and message counts."""
        return self.memory.list_agents()

    def messages(self, agent: str, branch: str = "main") -> list[dict[str, Any]]:
        """``agent``'s messages on ``branch``, oldest first (JSON-ready); creates nothing."""
        validate_name("agent", agent)
        return self.memory.messages(user_id=agent, branch=branch)

    # ------------------------------------------------------------------ access
    def _client(self) -> ClientGrant | None:
        """The HTTP client of the current request; ``None``: trusted (stdio, in process)."""
        if self.auth is None:
            return None
        token = get_access_token()  # set by the SDK's bearer middleware for this request
        return None if token is None else self.auth.grant(token.client_id)

    def _allow(self, agent: str) -> ClientGrant | None:
        """Refuse (a tool error) an agent the current client's token does not name."""
        client = self._client()
        if client is not None and not client.allows(agent):
            raise ToolError(
                f"agent: {agent!r} is not one of the agents client {client.name!r} may use"
            )
        return client

    def _allow_facts(self, client: ClientGrant | None, fact_ids: list[str] | None) -> None:
        """Refuse fact ids the client did not share (or that do not exist) to a limited client."""
        if client is None or client.everything or not fact_ids:
            return
        sharers = {f.id: f.source_agent for f in self.memory.recorded_facts()}
        sharers.update({f.id: f.source_agent for f in self.manager.shared.facts()})
        for fid in fact_ids:
            sharer = sharers.get(fid)
            if sharer is None or not client.allows(sharer):
                raise ToolError(
                    f"fact_ids: {fid!r} is not a fact shared by an agent client "
                    f"{client.name!r} may use; nothing was removed"
                )

    def _reach(self, agent: str, branch: str, scope: FactScope) -> set[str]:
        """The agents a fact ``agent`` shares on ``branch`` with ``scope`` would reach now."""
        graph = self.graph
        if branch in graph:
            reached = {a for a, _ in graph.agents_in_scope(branch, scope)}
        elif scope in ("branch", "subtree"):  # a new branch: forked from main, agent alone
            reached = set()
        else:  # its lineage is main; global is every branch
            reached = {
                a
                for a, _ in graph.agents_in_scope(
                    "main", "branch" if scope == "lineage" else "global"
                )
            }
        return reached | {agent}

    def _allow_share(
        self, client: ClientGrant | None, agent: str, branch: str, scope: FactScope
    ) -> None:
        """Refuse a fact that would reach agents the current (limited) client may not use."""
        if client is None or client.everything:
            return
        others = sorted(a for a in self._reach(agent, branch, scope) if not client.allows(a))
        if others:
            raise ToolError(
                f"scope: a fact shared on branch {branch!r} with scope {scope!r} would reach "
                f"agents {', '.join(map(repr, others))} that client {client.name!r} may not "
                "use; share it on a branch of its own agents"
            )

    def _visible(self, agents: list[dict[str, Any]]) -> list[dict[str, Any]]:
        client = self._client()
        return [a for a in agents if client is None or client.allows(a["agent"])]

    # ------------------------------------------------------------------ MCP wiring
    def _tools(self) -> list[Tool]:
        """The tools, each with strict arguments (:class:`StrictTool`) and access checks."""

        @_tool_errors
        async def remember(
            agent: AgentName,
            content: Annotated[Text, Field(description="the message text, or the fact")],
            role: Literal["user", "assistant", "system"] = "user",
            kind: Annotated[
                Literal["message", "fact"],
                Field(description="message: the agent's memory; fact: the shared pool"),
            ] = "message",
            branch: BranchName = "main",
            pinned: Annotated[bool, Field(description="always kept in the window")] = False,
        ) -> dict[str, Any]:
            """Remember a message for an agent (or, with kind=fact, a fact for every agent)."""
            client = self._allow(agent)
            if kind == "fact" and client is not None and not client.everything:
                raise ToolError(
                    f"kind: a fact reaches every agent, and client {client.name!r} may use "
                    "only some; use share_fact on a branch of its own agents"
                )
            return self.remember(agent, content, role=role, kind=kind, branch=branch, pinned=pinned)

        @_tool_errors
        async def recall(
            agent: AgentName,
            query: Annotated[Text, Field(description="what to look for")],
            k: Annotated[int, Field(ge=1, le=100, description="how many hits")] = 5,
            branch: BranchName = "main",
            mode: Annotated[
                Literal["hybrid", "dense", "bm25"] | None,
                Field(description="ranking (default: the agent's)"),
            ] = None,
        ) -> dict[str, Any]:
            """Search an agent's messages (hybrid dense + BM25), best first, with scores."""
            self._allow(agent)
            return self.recall(agent, query, k=k, branch=branch, mode=mode)

        @_tool_errors
        async def context(
            agent: AgentName,
            query: Annotated[
                Text | None, Field(description="retrieve snippets for this question")
            ] = None,
            branch: BranchName = "main",
            subject: SubjectName | None = None,
        ) -> dict[str, Any]:
            """The messages the agent would send to its LLM now, under its policy (OpenAI)."""
            client = self._allow(agent)
            if subject is not None and client is not None and not client.everything:
                raise ToolError(
                    "subject: recalls from the subject's conversations with any agent, so "
                    f"it needs a token for every agent (*); client {client.name!r} has not"
                )
            return await self.acontext(agent, query, branch=branch, subject=subject)

        @_tool_errors
        async def forget(
            agent: AgentName,
            message_ids: Annotated[
                list[MessageId] | None,
                Field(min_length=1, max_length=10_000, description="the ids to delete"),
            ] = None,
            fact_ids: Annotated[
                list[MessageId] | None,
                Field(min_length=1, max_length=1000, description="shared facts to forget"),
            ] = None,
            everything: Annotated[
                bool,
                Field(
                    description="delete all of the agent's messages on the branch and every "
                    "fact it shared"
                ),
            ] = False,
            branch: BranchName = "main",
        ) -> dict[str, Any]:
            """Delete an agent's messages by id, shared facts by id, or all (everything=true)."""
            self._allow_facts(self._allow(agent), fact_ids)
            return await self.aforget(
                agent,
                message_ids=message_ids,
                fact_ids=fact_ids,
                everything=everything,
                branch=branch,
            )

        @_tool_errors
        async def share_fact(
            agent: AgentName,
            text: Annotated[FactText, Field(description="the fact")],
            branch: BranchName = "main",
            scope: Annotated[
                Literal["branch", "subtree", "lineage", "global"],
                Field(description="which branches' agents receive it"),
            ] = "branch",
            topic: Annotated[
                str | None,
                Field(max_length=200, description="facts on one topic conflict"),
            ] = None,
            confidence: Annotated[float, Field(ge=0.0, le=1.0)] = 1.0,
        ) -> dict[str, Any]:
            """Share a fact from an agent with the agents in scope (through the coordinator)."""
            self._allow_share(self._allow(agent), agent, branch, scope)
            return await self.share_fact(
                agent, text, branch=branch, scope=scope, topic=topic, confidence=confidence
            )

        @_tool_errors
        async def list_agents() -> dict[str, Any]:
            """The agents: retention, whether RAG is on, message counts per branch."""
            return {"agents": self._visible(self.list_agents())}

        tools: list[Callable[..., Any]] = [
            remember,
            recall,
            context,
            forget,
            share_fact,
            list_agents,
        ]
        return [StrictTool.of(fn, name=fn.__name__) for fn in tools]

    def _register_resources(self) -> None:
        app = self.mcp

        @app.resource("memory://agents", name="agents", mime_type="application/json")
        def agents_resource() -> str:
            """Every agent: retention and message counts per branch."""
            return json.dumps({"agents": self._visible(self.list_agents())}, indent=1)

        @app.resource(
            "memory://agents/{agent}/messages",
            name="agent_messages",
            mime_type="application/json",
        )
        def messages_resource(agent: str) -> str:
            """An agent's messages on main, oldest first."""
            try:
                validate_name("agent", agent)
                self._allow(agent)
                return json.dumps(self.messages(agent), indent=1, ensure_ascii=False)
            except ToolError as exc:
                raise ResourceError(str(exc)) from exc
            except ValidationError as exc:  # one line, never pydantic's dump
                raise ResourceError(describe(exc)) from exc
            except (MarsysMemError, ValueError) as exc:
                raise ResourceError(str(exc)) from exc

    # ------------------------------------------------------------------ running
    async def run(
        self,
        transport: Transport = "stdio",
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        http: HttpSettings | None = None,
    ) -> None:
        """Serve until the client leaves (stdio) or the process is stopped (http); then close.

        Over HTTP (``http``, or ``host`` and ``port``): refuses to start off loopback
        without :attr:`auth` unless ``http.insecure`` (then warns on stderr), enforces the
        allowed Hosts and Origins, and once it listens prints two lines on stderr: the
        endpoint's URL (``marsys-mem: MCP server listening on http://...``), then
        ``marsys-mem: ready, ...``.

        Raises:
            ConfigError: off loopback without authentication (nothing is served).
        """
        if transport not in ("stdio", "http"):
            raise ValueError(f"transport must be 'stdio' or 'http', got {transport!r}")
        try:
            settings = http or HttpSettings(host=host, port=port)
            if transport == "http":
                warning = settings.check(authenticated=self.auth is not None)
                if warning:
                    print(warning, file=sys.stderr, flush=True)
            await self.memory.start()  # recorded facts reach their agents before any request
            if transport == "stdio":
                await self.mcp.run_stdio_async()
            else:
                await self._serve_http(settings)
        finally:
            await self.aclose()

    async def _serve_http(self, settings: HttpSettings) -> None:
        """Serve streamable HTTP (uvicorn, as the SDK does); say where and when ready.

        Once the socket is bound, two lines on stderr, as uvicorn-based servers print
        them: where it listens (the endpoint's URL with the bound port, the
        authentication, the allowed hosts), then that it is ready.
        """
        security = settings.transport_security()
        app = self.mcp.streamable_http_app(transport_security=security, host=settings.host)
        config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning")
        auth = "none" if self.auth is None else f"bearer tokens ({len(self.auth)} clients)"

        def ready(port: int) -> None:
            url = settings.model_copy(update={"port": port}).url
            hosts = ", ".join(security.allowed_hosts)
            print(
                f"marsys-mem: MCP server listening on {url} (auth: {auth}; allowed hosts: "
                f"{hosts})",
                file=sys.stderr,
                flush=True,
            )
            print(
                "marsys-mem: ready, serving MCP over streamable HTTP (Ctrl+C to stop)",
                file=sys.stderr,
                flush=True,
            )

        await _AnnouncingServer(config, ready).serve()

    async def aclose(self) -> None:
        """Stop the coordinator and close the manager (if owned). Idempotent."""
        await self.memory.aclose()

    def close(self) -> None:
        """Sync twin of :meth:`aclose` (outside a running event loop)."""
        self.memory.close()


class _AnnouncingServer(uvicorn.Server):
    """A uvicorn server that calls ``ready(port)`` once it listens (the bound port)."""

    def __init__(self, config: uvicorn.Config, ready: Callable[[int], None]) -> None:
        super().__init__(config)
        self._ready = ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """Bind and start (uvicorn's), then announce the port actually bound."""
        await super().startup(sockets)
        if not self.started:  # pragma: no cover - uvicorn exits when it cannot bind
            return
        bound = [s.getsockname() for srv in self.servers for s in (srv.sockets or ())]
        port = next((int(a[1]) for a in bound if isinstance(a, tuple)), self.config.port)
        self._ready(port)


def serve(
    config: str | Path | None,
    transport: Transport = "stdio",
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    name: str = "marsys-mem",
    tokens: str | Path | None = None,
    allowed_hosts: tuple[str, ...] = (),
    allowed_origins: tuple[str, ...] = (),
    insecure: bool = False,
) -> None:
    """Serve the agents of the policy file ``config`` over MCP (what ``marsys-mem mcp`` runs).

    Over HTTP, clients authenticate with the tokens of the ``tokens`` file and/or
    ``MARSYS_MEM_MCP_TOKEN`` (:meth:`TokenAuth.load`); see :class:`HttpSettings` for
    ``allowed_hosts``, ``allowed_origins`` and ``insecure``.

    Raises:
        ConfigError: a bad policy or tokens file, or an address off loopback without
            tokens (before anything is served).
    """
    auth: TokenAuth | None = None
    http: HttpSettings | None = None
    if transport == "http":
        try:
            http = HttpSettings(
                host=host,
                port=port,
                allowed_hosts=allowed_hosts,
                allowed_origins=allowed_origins,
                insecure=insecure,
            )
        except ValidationError as exc:
            raise ConfigError(describe(exc)) from None
        auth = TokenAuth.load(tokens)
        http.check(authenticated=auth is not None)  # refuse before the store is opened
    elif tokens is not None or allowed_hosts or allowed_origins or insecure:
        raise ConfigError(
            "--tokens, --allow-host, --allow-origin and --insecure are for --transport http"
        )
    server = MemoryServer.from_config(config, name=name, auth=auth)
    asyncio.run(server.run(transport, http=http))
