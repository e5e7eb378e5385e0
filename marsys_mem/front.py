"""One front door: :class:`Memory`, the MCP server's tools as methods over a MemoryManager.

``remember``, ``recall``, ``context``, ``forget`` and ``share_fact`` take whose memory as a
keyword (``user_id``: a user's id or an agent's name), validate every input at the door (a
bad one raises an error naming the field and the value, and changes nothing) and return
JSON-ready dicts. The MCP server (:mod:`marsys_mem.integrations.mcp`) and the agent tools
are built on it, so each operation has one implementation.

Guide: ``docs/guides/integrations.md#one-front-door``.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from marsys_mem.config.models import RetentionPolicy
from marsys_mem.context.policy import ContextWindow
from marsys_mem.coordination import BranchGraph, Coordinator, InProcessTransport
from marsys_mem.exceptions import DuplicateMessageError
from marsys_mem.manager import MemoryManager
from marsys_mem.model.facts import FactScope, SharedFact, fact_message, fact_of_message
from marsys_mem.model.messages import Message, to_llm_format
from marsys_mem.model.names import inbox_key, validate_name
from marsys_mem.patterns.rag import RAGMemory, ScoredMessage, SearchMode
from marsys_mem.retrieval.calibration import DEFAULT_MIN_SCORE
from marsys_mem.retrieval.embeddings import Embedder, HashingEmbedder, default_embedder
from marsys_mem.store import InMemoryStore
from marsys_mem.store.keys import facts_key, parse_key

__all__ = ["MAX_FACT", "MAX_TEXT", "Memory"]

MAX_TEXT = 100_000
"""The longest message :meth:`Memory.remember` takes (characters)."""
MAX_FACT = 20_000
"""The longest fact :meth:`Memory.share_fact` takes (characters)."""

_ROLES = ("user", "assistant", "system")
_SCOPES = ("branch", "subtree", "lineage", "global")
_MODES = ("hybrid", "dense", "bm25")


def _text(field: str, value: object, limit: int) -> str:
    """``value`` if it is a non-blank string of at most ``limit`` characters, else an error."""
    if not isinstance(value, str):
        raise TypeError(f"{field} must be a string, got {type(value).__name__} {value!r:.80}")
    if not value.strip():
        raise ValueError(f"{field} must not be empty or only whitespace, got {value!r:.80}")
    if len(value) > limit:
        raise ValueError(f"{field} holds at most {limit} characters, got {len(value)}")
    return value


def _flag(field: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{field} must be true or false, got {value!r:.80}")
    return value


def _ids(field: str, value: object) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise TypeError(f"{field} must be a list of ids, got {value!r:.80}")
    if not value:
        raise ValueError(f"{field}: give at least one id, or leave it out")
    for item in value:
        if not isinstance(item, str) or not item or len(item) > 200:
            raise ValueError(f"{field}: each id is a string of 1-200 characters, got {item!r:.80}")
    return list(value)


def _hit(hit: ScoredMessage) -> dict[str, Any]:
    m = hit.message
    return {
        "rank": hit.rank,
        "id": m.message_id,
        "role": m.role,
        "text": m.text,
        "score": round(hit.score, 6),
        "dense_score": None if hit.dense_score is None else round(hit.dense_score, 6),
        "bm25_score": None if hit.bm25_score is None else round(hit.bm25_score, 6),
        "timestamp": m.timestamp.isoformat(),
    }


def _message(m: Message) -> dict[str, Any]:
    data: dict[str, Any] = m.model_dump(mode="json", exclude_none=True)
    return data


class Memory:
    """Long-term memory in three lines: remember, recall, context, forget, share facts.

    The methods are the MCP server's tools, with whose memory as the keyword ``user_id``
    (a user's id or an agent's name; an agent the policy file names gets its policy).
    Results are JSON-ready dicts. A bad input raises an error naming the field and the
    value (:class:`~marsys_mem.exceptions.InvalidNameError` for a name, ``ValueError`` or
    ``TypeError`` otherwise) and changes nothing. Sync methods run outside an event loop;
    from async code use the ``a`` twins (:meth:`acontext`, :meth:`aforget`,
    :meth:`ashare_fact`).

    Args:
        manager: the :class:`MemoryManager` to use (``None``: a new one, in memory).
        own_manager: close the manager with this object (default: ``True``).

    Example:
        >>> memory = Memory()
        >>> _ = memory.remember("My sister Clara lives in Lisbon", user_id="alice")
        >>> [h["text"] for h in memory.recall("Where does Clara live?", user_id="alice")["hits"]]
        ['My sister Clara lives in Lisbon']
        >>> [m["content"] for m in memory.context(user_id="alice")["messages"]]
        ['My sister Clara lives in Lisbon']
        >>> memory.share_fact("Clara moved to Porto", user_id="alice")["delivered_to"]
        ['alice']
        >>> memory.forget(user_id="alice", everything=True)["removed"]
        1
        >>> memory.recall("", user_id="alice")
        Traceback (most recent call last):
        ...
        ValueError: query must not be empty or only whitespace, got ''
        >>> memory.close()
    """

    def __init__(self, manager: MemoryManager | None = None, *, own_manager: bool = True) -> None:
        if manager is None:
            manager = MemoryManager()
        elif not isinstance(manager, MemoryManager):
            raise TypeError(f"manager must be a MemoryManager, got {type(manager).__name__}")
        self.manager = manager
        self.own_manager = _flag("own_manager", own_manager)
        self.graph = BranchGraph()
        self.graph.add_branch("main", agents=list(manager.config.agents))
        self.coordinator: Coordinator | None = None
        self._recorded: set[tuple[str, str]] | None = None  # (branch, fact id) in the store
        self._fallback: dict[tuple[str, str], RAGMemory] = {}
        self._forgotten_facts: list[str] = []  # ids the last forget removed (for aforget)
        self._embedders: dict[str, Embedder | None] = {}
        self._loop: asyncio.AbstractEventLoop | None = None  # the sync methods' event loop
        self._loop_lock = threading.Lock()  # one sync call on it at a time (tool threads)
        self.closed = False

    @classmethod
    def from_config(cls, path: str | Path | None = None, **kwargs: Any) -> Memory:
        """A memory over ``MemoryManager.from_config(path)`` (``None``: in memory, session)."""
        manager = MemoryManager() if path is None else MemoryManager.from_config(path)
        try:
            return cls(manager, **kwargs)
        except BaseException:
            manager.close()
            raise

    # ------------------------------------------------------------------ helpers
    def _join(self, agent: str, branch: str) -> None:
        """Put ``agent`` on ``branch`` in the graph (a new branch forks from ``main``)."""
        graph = self.graph
        if branch not in graph:
            graph.fork("main", branch, agents=[agent])
        elif agent not in graph.agents(branch):
            graph.add_agent(branch, agent)

    def _policy(self, agent: str) -> RetentionPolicy:
        return self.manager.policy(agent)

    def _run(self, coro: Any) -> Any:
        """Run ``coro`` on this object's own event loop (sync methods; not inside a loop)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coro.close()
            raise RuntimeError(
                "this sync method cannot run inside an event loop; await its async twin "
                "(acontext, aforget, ashare_fact, aclose)"
            )
        with self._loop_lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
            return self._loop.run_until_complete(coro)

    # ------------------------------------------------------------------ remember
    def remember(
        self,
        content: str,
        *,
        user_id: str,
        role: Literal["user", "assistant", "system"] = "user",
        kind: Literal["message", "fact"] = "message",
        branch: str = "main",
        name: str | None = None,
        pinned: bool = False,
    ) -> dict[str, Any]:
        """Add a message to ``user_id``'s memory, or (``kind="fact"``) a shared fact.

        A fact goes through the manager's :class:`SharedMemoryPool` to every agent in use
        (scope ``global``); for scoped sharing use :meth:`share_fact`. A fact's result
        names the inboxes that hold it, as :meth:`share_fact`'s does: ``delivered_to``
        (``agent`` on main, else ``agent@branch``, sorted) and ``delivered_count``.
        """
        agent = validate_name("user_id", user_id)
        validate_name("branch", branch)
        if kind not in ("message", "fact"):
            raise ValueError(f"kind must be message or fact, got {kind!r}")
        _text("content", content, MAX_FACT if kind == "fact" else MAX_TEXT)
        _flag("pinned", pinned)
        if kind == "fact":
            self.manager.memory(agent, branch)  # a pool member, so it receives facts too
            self._join(agent, branch)
            fact = self.manager.shared.share_insight(agent, content, branch=branch)
            self._record(fact)
            shared = self.manager.shared
            reached = sorted(a for a in shared.agents if shared.has(a, fact.id))
            return {
                "kind": "fact",
                "id": fact.id,
                "agent": agent,
                "branch": branch,
                "text": fact.text,
                "delivered_to": reached,
                "delivered_count": len(reached),
            }
        if role not in _ROLES:
            raise ValueError(f"role must be user, assistant or system, got {role!r}")
        fields: dict[str, Any] = {"pinned": pinned}
        if name is not None:
            fields["name"] = validate_name("name", name)
        message = Message(role=role, content=content, **fields)
        memory = self.manager.memory(agent, branch)
        self._join(agent, branch)
        mid = memory.add(message)
        return {
            "kind": "message",
            "id": mid,
            "agent": agent,
            "branch": branch,
            "role": role,
            "messages": len(memory),
            "persistent": self._policy(agent).is_persistent,
        }

    # ------------------------------------------------------------------ recall
    def _embedder(self, spelling: Literal["default", "hashing", "none"]) -> Embedder | None:
        if spelling not in self._embedders:
            if spelling == "hashing":
                self._embedders[spelling] = HashingEmbedder()
            elif spelling == "none":
                self._embedders[spelling] = None
            else:
                self._embedders[spelling] = default_embedder()
        return self._embedders[spelling]

    def _fallback_rag(self, agent: str, branch: str) -> RAGMemory:
        """A RAGMemory mirroring the agent's messages (for agents without a RAG pattern)."""
        slot = (agent, branch)
        rag = self._fallback.get(slot)
        if rag is None:
            emb = self._embedder(self._policy(agent).patterns.embedder)
            rag = self._fallback[slot] = RAGMemory(emb)
        wanted = {
            m.message_id: m
            for m in self.manager.memory(agent, branch)
            if m.role != "system" and m.text.strip()
        }
        stale = [m.message_id for m in rag.messages() if m.message_id not in wanted]
        if stale:
            rag.remove(stale)
        missing = [m for mid, m in wanted.items() if mid not in rag]
        if missing:
            rag.add_many(missing)
        return rag

    def recall(
        self,
        query: str,
        *,
        user_id: str,
        k: int = 5,
        branch: str = "main",
        mode: SearchMode | None = None,
        min_score: float | None = DEFAULT_MIN_SCORE,
    ) -> dict[str, Any]:
        """The ``k`` messages of ``user_id`` that best match ``query``, best first, scored.

        Searches the agent's RAG pattern if its policy has one, else a
        :class:`RAGMemory` kept over its messages (hybrid dense + BM25). Each hit's
        ``score`` is calibrated (a probability of relevance, one scale for every search);
        hits below ``min_score`` are left out (``None``: keep all), so a query nothing
        answers finds nothing.
        """
        agent = validate_name("user_id", user_id)
        validate_name("branch", branch)
        _text("query", query, MAX_TEXT)
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 100:
            raise ValueError(f"k must be a whole number from 1 to 100, got {k!r}")
        if mode is not None and mode not in _MODES:
            raise ValueError(f"mode must be hybrid, dense or bm25, got {mode!r}")
        if min_score is not None and (
            isinstance(min_score, bool)
            or not isinstance(min_score, int | float)
            or not 0.0 <= min_score <= 1.0
        ):
            raise ValueError(f"min_score must be a number from 0 to 1 or None, got {min_score!r}")
        self.manager.sync()  # other processes' writes and deletions on the same store
        patterns = self.manager.patterns(agent, branch)
        self._join(agent, branch)
        if patterns is not None and patterns.rag is not None:
            rag, source = patterns.rag, "the agent's RAG pattern"
        else:
            rag, source = self._fallback_rag(agent, branch), "a RAGMemory over its messages"
        hits = rag.search(query, k, min_score, mode=mode)
        return {
            "agent": agent,
            "branch": branch,
            "query": query,
            "retriever": source,
            "mode": mode or rag.mode,
            "hits": [_hit(h) for h in hits],
        }

    # ------------------------------------------------------------------ context
    def _window(self, agent: str, win: ContextWindow, branch: str) -> dict[str, Any]:
        policy = self.manager.memory(agent, branch).policy
        return {
            "agent": agent,
            "branch": branch,
            "provider": "openai",
            "messages": to_llm_format(list(win.messages), "openai"),
            "tokens": win.tokens,
            "max_tokens": policy.max_tokens,
            "max_messages": policy.max_messages,
            "strategy": win.strategy,
            "dropped": win.dropped,
            "history_messages": win.history_messages,
        }

    def _context_args(self, user_id: str, query: str | None, branch: str) -> str:
        agent = validate_name("user_id", user_id)
        validate_name("branch", branch)
        if query is not None:
            _text("query", query, MAX_TEXT)
        self.manager.memory(agent, branch)
        self._join(agent, branch)
        return agent

    def context(
        self,
        query: str | None = None,
        *,
        user_id: str,
        branch: str = "main",
        subject: str | None = None,
    ) -> dict[str, Any]:
        """The window ``user_id`` would send to its LLM under its policy (OpenAI format).

        ``query``: retrieve snippets for this question too. ``subject``: whom the
        conversation is with; recalls from their other threads
        (``MemoryManager.context_for``). Shared facts recorded in a durable store reach
        the window once the coordinator has started (:meth:`acontext`, :meth:`share_fact`).
        """
        agent = self._context_args(user_id, query, branch)
        win = self.manager.context_for(agent, query, branch=branch, subject=subject)
        return self._window(agent, win, branch)

    async def acontext(
        self,
        query: str | None = None,
        *,
        user_id: str,
        branch: str = "main",
        subject: str | None = None,
    ) -> dict[str, Any]:
        """Async twin of :meth:`context` (async summarisers allowed).

        Starts the coordinator first, so the facts a store recorded reach the agent.
        """
        agent = validate_name("user_id", user_id)
        validate_name("branch", branch)
        if query is not None:
            _text("query", query, MAX_TEXT)
        await self.start()
        self._context_args(agent, query, branch)
        win = await self.manager.acontext_for(agent, query, branch=branch, subject=subject)
        return self._window(agent, win, branch)

    # ------------------------------------------------------------------ forget
    def forget(
        self,
        *,
        user_id: str,
        message_ids: list[str] | None = None,
        fact_ids: list[str] | None = None,
        everything: bool = False,
        branch: str = "main",
    ) -> dict[str, Any]:
        """Delete messages by id (all or none), shared facts by id, or everything.

        Messages leave the memory, the store (persistent agents) and everything derived
        from them (RAG entries, episodes, tiers, learned facts). ``fact_ids``: shared facts
        (``remember(kind="fact")``, :meth:`share_fact`) leave every agent's shared facts
        and the store. ``everything``: all the agent's messages on the branch, and every
        fact it shared. Use :meth:`aforget` from async code to reach coordinators
        elsewhere.
        """
        agent = validate_name("user_id", user_id)
        validate_name("branch", branch)
        message_ids = _ids("message_ids", message_ids)
        fact_ids = _ids("fact_ids", fact_ids)
        _flag("everything", everything)
        removed: list[Message] = []
        if message_ids is not None or everything:
            removed = self.manager.forget(
                agent, branch, message_ids=message_ids, everything=everything
            )
        elif fact_ids is None:
            raise ValueError(
                "forget needs message_ids, fact_ids or everything=true; got none of them"
            )
        facts: list[SharedFact] = []
        if fact_ids:
            facts += self.manager.forget_shared(fact_ids)
        if everything:
            facts += self.manager.forget_shared(sharer=agent)
        if self._recorded is not None:
            gone = {f.id for f in facts}
            self._recorded = {r for r in self._recorded if r[1] not in gone}
        ids = [m.message_id for m in removed]
        memory = self.manager.memory(agent, branch)
        fallback = self._fallback.get((agent, branch))
        if fallback is not None and ids:
            fallback.remove(ids)
        self._forgotten_facts = sorted({f.id for f in facts})
        return {
            "agent": agent,
            "branch": branch,
            "removed": len(ids),
            "facts_removed": len(self._forgotten_facts),
            "left": len(memory),
        }

    async def aforget(
        self,
        *,
        user_id: str,
        message_ids: list[str] | None = None,
        fact_ids: list[str] | None = None,
        everything: bool = False,
        branch: str = "main",
    ) -> dict[str, Any]:
        """:meth:`forget`, then a tombstone for the forgotten facts to every coordinator."""
        result = self.forget(
            user_id=user_id,
            message_ids=message_ids,
            fact_ids=fact_ids,
            everything=everything,
            branch=branch,
        )
        gone = self._forgotten_facts
        if gone and self.coordinator is not None:
            await self.coordinator.retract(gone)
        return result

    # ------------------------------------------------------------------ shared facts
    @property
    def durable(self) -> bool:
        """Whether shared facts are recorded in the store (it outlives the process)."""
        return not isinstance(self.manager.store, InMemoryStore)

    def recorded_facts(self) -> list[SharedFact]:
        """The facts recorded in the store, oldest first (each on the branch it came from)."""
        facts: list[SharedFact] = []
        self._recorded = set()
        if not self.durable:
            return facts
        store = self.manager.store
        for key in store.list_keys(self.manager.namespace):
            if parse_key(key).kind != "facts":
                continue
            for m in store.load_messages(key):
                fact = fact_of_message(m)
                # a workflow's merged fact is recorded on another branch too: shared once
                if fact is not None and fact.source_branch == key[2]:
                    self._recorded.add((key[2], fact.id))
                    facts.append(fact)
        facts.sort(key=lambda f: f.created_at)
        return facts

    def _record(self, fact: SharedFact) -> None:
        """Record ``fact`` under its branch's ``#facts`` key (once; durable stores only)."""
        if not self.durable:
            return
        if self._recorded is None:
            self.recorded_facts()
        recorded = self._recorded if self._recorded is not None else set()
        branch = fact.source_branch
        if (branch, fact.id) in recorded:
            return
        key = facts_key(self.manager.namespace, branch)
        try:
            self.manager.store.append_messages(key, [fact_message(fact)])
        except DuplicateMessageError:
            pass  # recorded meanwhile, by another process on the same store
        recorded.add((branch, fact.id))
        self._recorded = recorded

    async def start(self) -> Coordinator:
        """Start the coordinator (once); it shares the facts the store recorded again."""
        if self.coordinator is None:
            transport = InProcessTransport(namespace=self.manager.namespace)
            coordinator = Coordinator(
                self.graph, self.manager, transport, settings=self.manager.config.coordination
            )
            await coordinator.__aenter__()
            self.coordinator = coordinator
            for fact in self.recorded_facts():
                self._join(fact.source_agent, fact.source_branch)
                await coordinator.share(fact.source_agent, fact)
        return self.coordinator

    async def ashare_fact(
        self,
        text: str,
        *,
        user_id: str,
        branch: str = "main",
        scope: FactScope = "branch",
        topic: str | None = None,
        confidence: float = 1.0,
    ) -> dict[str, Any]:
        """Share a fact from ``user_id`` on ``branch`` with every agent in ``scope``.

        The result's ``delivered_to`` lists the inboxes that hold the fact now (``agent``
        on main, else ``agent@branch``, sorted), ``delivered_count`` how many.
        """
        agent = validate_name("user_id", user_id)
        validate_name("branch", branch)
        _text("text", text, MAX_FACT)
        if scope not in _SCOPES:
            raise ValueError(f"scope must be branch, subtree, lineage or global, got {scope!r}")
        if isinstance(confidence, bool) or not isinstance(confidence, int | float):
            raise TypeError(f"confidence must be a number between 0 and 1, got {confidence!r}")
        if not 0.0 <= confidence <= 1.0:
            raise ValueError(f"confidence must be between 0 and 1, got {confidence!r}")
        if topic is not None and (not isinstance(topic, str) or len(topic) > 200):
            raise ValueError(f"topic must be a string of at most 200 characters, got {topic!r:.80}")
        self.manager.memory(agent, branch)
        self._join(agent, branch)
        coordinator = await self.start()
        metadata: dict[str, Any] | None = {"topic": topic} if topic else None
        fact = await coordinator.share(
            agent, text, branch=branch, scope=scope, confidence=confidence, metadata=metadata
        )
        self._record(fact)
        reached = sorted(
            inbox_key(a, b)
            for a, b in self.graph.agents_in_scope(branch, scope)
            if self.manager.shared.has(inbox_key(a, b), fact.id)
        )
        return {
            "id": fact.id,
            "agent": agent,
            "branch": branch,
            "scope": scope,
            "text": fact.text,
            "delivered_to": reached,
            "delivered_count": len(reached),
        }

    def share_fact(
        self,
        text: str,
        *,
        user_id: str,
        branch: str = "main",
        scope: FactScope = "branch",
        topic: str | None = None,
        confidence: float = 1.0,
    ) -> dict[str, Any]:
        """Sync twin of :meth:`ashare_fact` (outside an event loop)."""
        result: dict[str, Any] = self._run(
            self.ashare_fact(
                text,
                user_id=user_id,
                branch=branch,
                scope=scope,
                topic=topic,
                confidence=confidence,
            )
        )
        return result

    # ------------------------------------------------------------------ inspection
    def list_agents(self) -> list[dict[str, Any]]:
        """Every agent the policy names, in use or in the store: retention and message counts."""
        manager = self.manager
        manager.sync()
        counts: dict[str, dict[str, int]] = {a: {} for a in manager.config.agents}
        for agent, branch, memory in manager.memories():
            counts.setdefault(agent, {})[branch] = len(memory)
        for key in manager.store.list_keys(manager.namespace):
            info = parse_key(key)
            if info.kind != "conversation" or info.conversation is None:
                continue
            _, agent, branch = info.conversation
            branches = counts.setdefault(agent, {})
            if branch not in branches:
                branches[branch] = manager.store.count_messages(key)
        out = []
        for agent in sorted(counts):
            policy = manager.policy(agent)
            out.append(
                {
                    "agent": agent,
                    "retention": policy.retention,
                    "configured": agent in manager.config.agents,
                    "rag": policy.patterns.rag is not None,
                    "branches": dict(sorted(counts[agent].items())),
                }
            )
        return out

    def messages(self, *, user_id: str, branch: str = "main") -> list[dict[str, Any]]:
        """``user_id``'s messages on ``branch``, oldest first (JSON-ready); creates nothing."""
        agent = validate_name("user_id", user_id)
        validate_name("branch", branch)
        self.manager.sync()
        for a, b, memory in self.manager.memories():
            if (a, b) == (agent, branch):
                return [_message(m) for m in memory]
        if not self._policy(agent).is_persistent:
            return []
        stored = self.manager.store.load_messages(self.manager.key(agent, branch))
        return [_message(m) for m in stored]

    # ------------------------------------------------------------------ closing
    async def aclose(self) -> None:
        """Stop the coordinator and close the manager (if owned). Idempotent."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.coordinator is not None:
                await self.coordinator.close()
        finally:
            for rag in self._fallback.values():
                rag.close()
            if self.own_manager:
                await self.manager.aclose()

    def close(self) -> None:
        """Sync twin of :meth:`aclose` (outside a running event loop)."""
        if self.closed:
            return
        if self._loop is None:
            asyncio.run(self.aclose())
            return
        try:
            self._run(self.aclose())
        finally:
            self._loop.close()

    def __enter__(self) -> Memory:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> Memory:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
