"""MemoryManager: the composition root that applies retention policies.

The manager owns a store and one :class:`ConversationMemory` per ``(agent, branch)``, each
governed by the agent's :class:`~marsys_mem.config.models.RetentionPolicy`:

* ``persistent`` memories are loaded from the store on first use and written through
  (every append is durable when ``add`` returns; or buffered until :meth:`flush` with
  ``write_through=False``). A process that restarts with the same config sees them again.
  ``max_stored_messages`` is enforced by the store in the transaction of every append
  (counted there, so it holds across processes sharing the store); ``ttl`` every
  ``retention_every`` appends, on flush, at the end of runs and sessions.
* ``session`` memories live in this process until :meth:`end_session`; they never reach
  the store.
* ``single_run`` memories are cleared when the agent's run ends (and at end_session).

Every kind of memory is bounded in process too: it never holds more than
``max_stored_messages`` messages. The bound drops by the one retention rule of
:mod:`marsys_mem.store.retention` (oldest unprotected first, system / pinned messages
last), in chunks of at most a tenth of the bound
(:func:`~marsys_mem.manager.sinks.trim_chunk`), so a full memory holds between
``limit - chunk + 1`` and ``limit`` messages; a persistent memory holds the newest part
of what its store holds. Messages older than ``ttl`` leave it every ``retention_every``
appends.

The write path runs one way: each memory's sink
(:class:`~marsys_mem.manager.sinks.AgentSink`) writes an append to the store, feeds the
patterns and returns the ids the bound evicts; the memory drops them itself after
appending (:meth:`ConversationMemory.evict`), without calling the sink back.

Runs (:meth:`run`) record what an agent did as a :class:`~marsys_mem.model.runs.RunSnapshot`:
saved in the store for persistent agents, kept in process otherwise. A run started with
``parent_id`` works on its own memory that continues the parent's chain
(:func:`~marsys_mem.model.runs.history`), so sibling runs never see each other.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from marsys_mem.config.load import load_config
from marsys_mem.config.models import MemoryConfig, RetentionPolicy
from marsys_mem.context.blocks import BlockItem
from marsys_mem.context.compose import Block, aassemble, assemble
from marsys_mem.context.policy import ContextPolicy, Summarizer
from marsys_mem.context.tokens import TokenCounter, get_counter
from marsys_mem.conversation import ConversationMemory
from marsys_mem.exceptions import ContextOverflowError, MarsysMemError, MessageNotFoundError
from marsys_mem.lifecycle import Closing
from marsys_mem.llm.base import LLM
from marsys_mem.llm.factory import make_llm
from marsys_mem.manager.sinks import AgentSink, MemoryBound, StoreWriter
from marsys_mem.model.events import EventBus
from marsys_mem.model.facts import SharedFact, fact_of_message
from marsys_mem.model.messages import Message, Provider, to_llm_format
from marsys_mem.model.names import inbox_key, validate_name
from marsys_mem.model.runs import RunContext, RunSnapshot, history
from marsys_mem.model.traces import TraceStep
from marsys_mem.patterns.agent import AgentPatterns, resolve_embedder
from marsys_mem.patterns.shared import SharedMemoryPool
from marsys_mem.patterns.threads import CrossThreadRecall
from marsys_mem.patterns.user_facts import FactMemory
from marsys_mem.retrieval.embeddings import (
    INSTALL_HINT,
    Embedder,
    HashingEmbedder,
    default_embedder,
)
from marsys_mem.store.base import Key, Load, MemoryStore
from marsys_mem.store.keys import parse_key
from marsys_mem.store.memory import InMemoryStore
from marsys_mem.store.owners import DeletionFeed
from marsys_mem.store.retention import is_expired, ttl_cutoff
from marsys_mem.store.sqlite import SQLiteStore

__all__ = ["MemoryManager"]


log = logging.getLogger("marsys_mem.manager")

_check_name = validate_name  # the one naming rule (InvalidNameError, a ValueError)


class _RunScope:
    """``with manager.run(agent) as run`` / ``async with ...``.

    ``begin`` and ``end`` are the manager's callbacks for the run's start and end.
    """

    def __init__(
        self,
        run: RunContext[ConversationMemory],
        begin: Callable[[RunContext[ConversationMemory]], None],
        end: Callable[[RunContext[ConversationMemory], BaseException | None], None],
    ) -> None:
        self._run = run
        self._begin = begin
        self._end = end
        self._entered = False

    def __enter__(self) -> RunContext[ConversationMemory]:
        if self._entered:
            raise RuntimeError("a run scope can be entered only once")
        self._entered = True
        self._begin(self._run)
        return self._run

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._end(self._run, exc)

    async def __aenter__(self) -> RunContext[ConversationMemory]:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self._end, self._run, exc)


class MemoryManager(Closing):
    """Owns the store and every agent's memory, and applies the retention policies.

    Args:
        config: the :class:`MemoryConfig` (default: in-memory store, session retention).
        store: a store to use instead of the one the config describes (not closed by
            :meth:`close` unless ``own_store``).
        write_through: persist each append before ``add`` returns (default); ``False``
            buffers persistent appends until :meth:`flush`, a run's end or :meth:`close`.
        retention_every: enforce ttl / max_stored_messages after this many appends.
        counter: token counter for every memory.
        summarizer: summariser for the ``summarize`` strategy.
        embedder: the embedder patterns with ``embedder: default`` use (default: the
            packaged MiniLM, loaded once per manager, if the ``embeddings`` extra is
            installed). Pass one to share a loaded model between managers.
        llm: the model agents with ``patterns.facts.extractor: llm`` extract facts with
            (an :class:`~marsys_mem.llm.base.LLM`: ``OpenAILLM``, ``AnthropicLLM``, ...).
            Default: the one the config's ``llm:`` section describes, if any (built by
            :func:`~marsys_mem.llm.factory.make_llm`, closed by :meth:`close`).
        facts: the :class:`~marsys_mem.patterns.user_facts.FactMemory` agents with
            ``patterns.facts`` learn into (default: one made on first use over this
            manager's store and namespace, with the first such agent's embedder; closed by
            :meth:`close`). Facts are about a subject, not a conversation: they live in the
            store whatever the agent's retention.

    Example:
        >>> manager = MemoryManager()
        >>> researcher = manager.memory("researcher")
        >>> _ = researcher.add(Message.user("Q4 growth?"))
        >>> with manager.run("researcher") as run:
        ...     _ = run.output(Message.assistant("12%"))
        >>> [m.text for m in manager.context_for("researcher").messages]
        ['Q4 growth?', '12%']
        >>> manager.close()
    """

    def __init__(
        self,
        config: MemoryConfig | None = None,
        *,
        store: MemoryStore | None = None,
        own_store: bool | None = None,
        write_through: bool = True,
        retention_every: int = 100,
        counter: TokenCounter | None = None,
        summarizer: Summarizer | None = None,
        embedder: Embedder | None = None,
        llm: LLM | None = None,
        facts: FactMemory | None = None,
    ) -> None:
        if retention_every < 1:
            raise ValueError(f"retention_every must be >= 1, got {retention_every}")
        self.config = config or MemoryConfig()
        self.namespace = validate_name("namespace", self.config.store.namespace)
        self.write_through = write_through
        self.retention_every = retention_every
        self.counter = counter
        self.summarizer = summarizer
        self._own_llm = llm is None and self.config.llm is not None
        if llm is None and self.config.llm is not None:
            llm = make_llm(self.config.llm)  # LLMError: its SDK or its key is missing
        if llm is not None and not callable(getattr(llm, "complete", None)):
            raise TypeError(f"llm must be an LLM (with complete()), got {llm!r}")
        if facts is not None and not isinstance(facts, FactMemory):
            raise TypeError(f"facts must be a FactMemory, got {type(facts).__name__}")
        self.llm = llm
        self._facts = facts
        self._own_facts = facts is None
        self._recall: CrossThreadRecall | None = None
        self._read_from_store: set[tuple[str, str]] = set()  # threads recall loaded once
        self.events = EventBus()
        self.shared = SharedMemoryPool()
        if store is None:
            store, own = self._open_store(), True
        else:
            own = False
        self.store = store
        self._own_store = own if own_store is None else own_store
        self._ephemeral_runs = InMemoryStore()  # snapshots of non-persistent agents
        self._memories: dict[tuple[str, str], ConversationMemory] = {}
        self._sinks: dict[tuple[str, str], AgentSink] = {}
        self._patterns: dict[tuple[str, str], AgentPatterns] = {}
        self._embedders: dict[str, Embedder | None] = {}
        if embedder is not None:
            self._embedders["default"] = embedder
        self._active_runs: dict[str, int] = {}
        self._session_started = datetime.now(UTC)
        # Other processes' writes and deletions on the same store (sync() reads them).
        self._feed = DeletionFeed(self.store.load_deletions, self.namespace)
        self._cursors: dict[tuple[str, str], int] = {}  # persistent slot -> append cursor
        self.closed = False

    @classmethod
    def from_config(cls, path: str | Path, **kwargs: Any) -> MemoryManager:
        """Build a manager from a YAML / TOML / JSON config file (see ``load_config``)."""
        return cls(load_config(path), **kwargs)

    def _open_store(self) -> MemoryStore:
        cfg = self.config.store
        if cfg.backend == "sqlite":
            return SQLiteStore(cfg.resolved_path(self.config.base_dir))
        if cfg.backend == "postgres":
            from marsys_mem.store.postgres import (  # noqa: PLC0415 (optional dependency: postgres)
                PostgresStore,
            )

            return PostgresStore(
                cfg.resolved_dsn(),
                min_size=cfg.pool.min,
                max_size=cfg.pool.max,
                connect_timeout=cfg.connect_timeout,
                vector_index=cfg.vector_index,
            )
        return InMemoryStore()

    def _check_open(self) -> None:
        if self.closed:
            raise MarsysMemError("this MemoryManager is closed")

    # ------------------------------------------------------------------ memories
    def policy(self, agent: str) -> RetentionPolicy:
        """The agent's effective retention policy."""
        return self.config.policy_for(_check_name("agent", agent))

    def key(self, agent: str, branch: str = "main") -> Key:
        """The store key of an agent's memory on a branch."""
        return (self.namespace, _check_name("agent", agent), _check_name("branch", branch))

    def memory(self, agent: str, branch: str = "main") -> ConversationMemory:
        """The agent's memory on ``branch`` (created, or loaded from the store, on first use)."""
        self._check_open()
        _check_name("agent", agent)
        _check_name("branch", branch)
        slot = (agent, branch)
        mem = self._memories.get(slot)
        if mem is not None:
            return mem
        policy = self.config.policy_for(agent)
        initial: list[Message] = []
        if policy.is_persistent:
            key = self.key(agent, branch)
            if policy.ttl is not None or policy.max_stored_messages is not None:
                # expired or excess messages (and all derived from them) go before any read
                self.store.enforce_retention(
                    key, ttl=policy.ttl, max_messages=policy.max_stored_messages
                )
            if self.store.supports_vectors:  # with the cursor sync() catches up from
                page = self.store.load_messages_after(key, 0)
                initial, self._cursors[slot] = list(page.messages), page.cursor
            else:
                initial = self.store.load_messages(key)
        mem = ConversationMemory(
            initial,
            policy=policy.context,
            counter=self.counter,
            summarizer=self.summarizer,
            strict_tools=False,  # stored history may hold results whose call expired
            events=self.events,
            agent=agent,
        )
        mem.strict_tools = True
        self._manage(slot, mem, policy, len(initial))
        return mem

    def attach_memory(self, agent: str, branch: str, memory: ConversationMemory) -> None:
        """Use ``memory`` as ``agent``'s memory on ``branch`` (e.g. a fork of another branch).

        Raises:
            ValueError: the agent already has a memory on that branch.
        """
        self._check_open()
        _check_name("agent", agent)
        _check_name("branch", branch)
        if not isinstance(memory, ConversationMemory):
            raise TypeError(f"expected a ConversationMemory, got {type(memory).__name__}")
        slot = (agent, branch)
        if slot in self._memories:
            raise ValueError(f"{agent!r} already has a memory on branch {branch!r}")
        policy = self.config.policy_for(agent)
        memory.agent = memory.agent or agent
        stored = self.store.count_messages(self.key(*slot)) if policy.is_persistent else 0
        self._manage(slot, memory, policy, stored, seed=stored == 0)

    def _manage(
        self,
        slot: tuple[str, str],
        memory: ConversationMemory,
        policy: RetentionPolicy,
        stored: int,
        *,
        seed: bool = False,
    ) -> None:
        """Give ``memory`` its sink, register it, and bring it within its policy.

        ``stored``: the store's message count under the memory's key (persistent agents);
        ``seed``: write the memory's messages to the (empty) store key first.
        """
        writer = None
        if policy.is_persistent:
            writer = StoreWriter(
                self.store,
                self.key(*slot),
                policy,
                stored,
                write_through=self.write_through,
                retention_every=self.retention_every,
            )
            if seed and len(memory):
                writer.write(memory.read())
        patterns = self._new_patterns(slot, policy, memory.read())
        bound = MemoryBound(policy, self.retention_every)
        with memory.lock:
            if writer is not None or patterns is not None or bound.active:
                sink = AgentSink(bound, writer, patterns, retention_every=self.retention_every)
                self._sinks[slot] = sink
                memory.sink = sink
                memory.evict(bound.enforce(memory))  # the store applies the rule itself
            else:
                memory.sink = None
        self._memories[slot] = memory
        self.shared.register(inbox_key(*slot), memory)

    def _embedder(self, spelling: str) -> Embedder | None:
        """One embedder per spelling for the whole manager (the model loads once)."""
        if spelling not in self._embedders:
            if spelling == "default":
                found = default_embedder()
                if found is None:
                    log.warning(
                        "marsys-mem: the embeddings extra is not installed; retrieval is "
                        "BM25-only (%s)",
                        INSTALL_HINT,
                    )
                self._embedders[spelling] = found
            else:
                resolved = resolve_embedder(spelling)  # type: ignore[arg-type]
                self._embedders[spelling] = resolved if resolved != "default" else None
        return self._embedders[spelling]

    def _new_patterns(
        self, slot: tuple[str, str], policy: RetentionPolicy, existing: Sequence[Message]
    ) -> AgentPatterns | None:
        """The agent's patterns on the slot's branch, if its policy enables any."""
        if not (policy.patterns.any or policy.patterns.learns_facts):
            return None
        index_dir = None
        if policy.is_persistent and self.config.store.backend == "sqlite":
            index_dir = self.config.store.resolved_path(self.config.base_dir).parent / "indexes"
            index_dir.mkdir(parents=True, exist_ok=True)
        patterns = AgentPatterns(
            policy.patterns,
            self.key(*slot),
            store=self.store if policy.is_persistent else None,
            embedder=self._embedder(policy.patterns.embedder),
            index_dir=index_dir,
            facts=self.fact_memory(policy.patterns.embedder)
            if policy.patterns.learns_facts
            else None,
            llm=self.llm,
        )
        if not policy.is_persistent:
            patterns.ingest(existing)
        self._patterns[slot] = patterns
        return patterns

    def fact_memory(self, embedder: str = "default") -> FactMemory:
        """The facts agents learn (made on first use, in this manager's store and namespace).

        ``embedder``: the config spelling of the embedder, used only when it is made
        (``none``, or ``default`` without the ``embeddings`` extra: a ``HashingEmbedder``).
        """
        self._check_open()
        if self._facts is None:
            emb = self._embedder(embedder)
            self._facts = FactMemory(
                emb if emb is not None else HashingEmbedder(),
                store=self.store,
                namespace=self.namespace,
            )
        return self._facts

    def thread_recall(
        self, embedder: Literal["default", "hashing", "none"] | None = None
    ) -> CrossThreadRecall:
        """The subjects' threads and cross-thread search (made on first use, links loaded).

        ``embedder``: the config spelling of the embedder, used only when it is made
        (default: the ``defaults.patterns.embedder`` of the config; ``none``, or
        ``default`` without the ``embeddings`` extra: a ``HashingEmbedder``, so scores
        keep one scale).
        """
        self._check_open()
        if self._recall is None:
            emb = self._embedder(embedder or self.config.defaults.patterns.embedder)
            self._recall = CrossThreadRecall(
                emb if emb is not None else HashingEmbedder(),
                store=self.store,
                namespace=self.namespace,
            )
        return self._recall

    def link_thread(self, subject: str, agent: str, branch: str = "main") -> bool:
        """Record that ``agent``'s conversation on ``branch`` is held with ``subject``.

        ``context_for(..., subject=...)`` does it for the thread it assembles; call this to
        link threads before that (say, sessions imported from elsewhere). Persisted in the
        store: a restarted manager knows the link.

        Returns:
            ``True`` if the link is new.

        Raises:
            InvalidNameError: a name breaks the naming rule.
            ValueError: the thread already belongs to another subject.
        """
        _check_name("subject", subject)
        _check_name("agent", agent)
        _check_name("branch", branch)
        return self.thread_recall(self.config.policy_for(agent).patterns.embedder).link(
            subject, agent, branch
        )

    def _thread_messages(self, agent: str, branch: str) -> Sequence[Message] | None:
        """A thread's current messages for cross-thread recall (see ``ThreadSource``).

        A memory in use: its messages. Otherwise a persistent agent's thread is read from
        the store once per process (no one here appends to it); any other is gone.
        """
        slot = (agent, branch)
        mem = self._memories.get(slot)
        if mem is not None:
            return mem.read()
        if not self.config.policy_for(agent).is_persistent:
            return []  # a session / single_run memory that ended
        if slot in self._read_from_store:
            return None
        self._read_from_store.add(slot)
        return self.store.load_messages(self.key(agent, branch))

    def patterns(self, agent: str, branch: str = "main") -> AgentPatterns | None:
        """The agent's memory patterns on ``branch`` (``None`` if its policy enables none)."""
        self.memory(agent, branch)
        return self._patterns.get((agent, branch))

    def forget(
        self,
        agent: str,
        branch: str = "main",
        *,
        message_ids: Iterable[str] | None = None,
        everything: bool = False,
    ) -> list[Message]:
        """Delete ``agent``'s messages on ``branch``: by id (all or none), or all of them.

        The one way to forget a message: it leaves the conversation, the store (persistent
        agents), and everything derived from it: the agent's RAG entries, episodes and
        tiers, and the facts learned from it (a fact with another source left stays).
        Any id a read path returned works: one the conversation already dropped but a
        pattern still holds (an archive, a recall hit) is forgotten there. ``everything``
        also empties the patterns of what they kept beyond the conversation. The store's
        files are then scrubbed (SQLite: the WAL checkpointed; deleted pages are zeroed).

        Returns:
            The removed messages (those the conversation held first, oldest first).

        Raises:
            ValueError: neither or both of ``message_ids`` (non-empty) and
                ``everything``; an id found nowhere (nothing is removed).

        Example:
            >>> manager = MemoryManager()
            >>> mid = manager.memory("planner").add(Message.user("my PIN is 1234"))
            >>> [m.text for m in manager.forget("planner", message_ids=[mid])]
            ['my PIN is 1234']
            >>> len(manager.memory("planner"))
            0
            >>> manager.close()
        """
        self._check_open()
        if isinstance(message_ids, str):
            raise ValueError(f"message_ids must be a list of ids, not one string {message_ids!r}")
        ids = None if message_ids is None else list(dict.fromkeys(message_ids))
        if everything == bool(ids):
            raise ValueError(
                "forget needs either message_ids (a non-empty list) or everything=true, "
                f"not both; got message_ids={ids!r}, everything={everything!r}"
            )
        memory = self.memory(agent, branch)
        patterns = self._patterns.get((agent, branch))
        key = self.key(agent, branch)
        stored = self.config.policy_for(agent).is_persistent
        with memory.lock:
            if everything:
                removed = list(memory)
                memory.clear()
                if stored:
                    self.store.delete_messages(key)
                elsewhere = patterns.held_ids() if patterns is not None else []
            else:
                assert ids is not None
                outside = [i for i in ids if i not in memory]
                found = self._held_elsewhere(key, patterns, outside, stored=stored)
                missing = [i for i in outside if i not in found]
                if missing:
                    raise ValueError(
                        f"message_ids: no message with id {missing[0]!r} in {agent}@{branch} "
                        "(nothing was removed)"
                    )
                removed = memory.remove(*[i for i in ids if i in memory])
                if stored and outside:
                    self.store.delete_messages(key, outside)
                removed += [found[i] for i in outside]
                elsewhere = outside
        if patterns is not None:
            patterns.forget([*[m.message_id for m in removed], *elsewhere], cause="forget")
            patterns.flush()  # saved indexes no longer hold the forgotten vectors
        self.store.scrub()
        return removed

    def _held_elsewhere(
        self, key: Key, patterns: AgentPatterns | None, ids: Sequence[str], *, stored: bool
    ) -> dict[str, Message]:
        """Of ``ids`` (not in the conversation's memory), those a pattern or the store holds."""
        found: dict[str, Message] = {}
        if not ids:
            return found
        if stored:
            found.update(
                (m.message_id, m) for m in self.store.batch([Load(key, ids=tuple(ids))])[0]
            )
        if patterns is not None:
            for mid in ids:
                if mid not in found:
                    held = patterns.get(mid)
                    if held is not None:
                        found[mid] = held
        return found

    def forget_shared(
        self,
        fact_ids: Iterable[str] | None = None,
        *,
        sharer: str | None = None,
        everything: bool = False,
    ) -> list[SharedFact]:
        """Forget shared facts: by id, by the agent that shared them, or all of them.

        They leave the shared pool (every agent's ``Shared facts:`` block) and the store
        (the records workflow runs and MCP servers keep, so a restart does not bring them
        back). To reach other processes' coordinators too, use
        :meth:`Coordinator.retract <marsys_mem.coordination.Coordinator.retract>`, which
        calls this. Returns the facts removed (from the pool or the store).

        Raises:
            ValueError: not exactly one of ``fact_ids`` (non-empty), ``sharer`` and
                ``everything``.

        Example:
            >>> manager = MemoryManager()
            >>> _ = manager.memory("a")
            >>> fact = manager.shared.share_insight("a", "Budget is 4000 EUR")
            >>> [f.text for f in manager.forget_shared([fact.id])]
            ['Budget is 4000 EUR']
            >>> manager.shared.facts()
            []
            >>> manager.close()
        """
        self._check_open()
        if isinstance(fact_ids, str):
            raise ValueError(f"fact_ids must be a list of ids, not one string {fact_ids!r}")
        ids = None if fact_ids is None else list(dict.fromkeys(fact_ids))
        if sharer is not None:
            validate_name("sharer", sharer)
        chosen = [bool(ids), sharer is not None, everything]
        if sum(chosen) != 1:
            raise ValueError(
                "forget_shared needs exactly one of fact_ids (a non-empty list), sharer or "
                f"everything=true; got fact_ids={ids!r}, sharer={sharer!r}, "
                f"everything={everything!r}"
            )

        def wanted(fact: SharedFact) -> bool:
            if everything:
                return True
            if sharer is not None:
                return fact.source_agent == sharer
            return ids is not None and fact.id in ids

        removed: dict[str, SharedFact] = {}
        doomed = {f.id for f in self.shared.facts() if wanted(f)} | set(ids or ())
        for pooled in self.shared.retract(doomed):
            removed[pooled.id] = pooled
        for key in self.store.list_keys(self.namespace):
            if parse_key(key).kind != "facts":
                continue
            gone: list[str] = []
            for m in self.store.load_messages(key):
                recorded = fact_of_message(m)
                if recorded is not None and (recorded.id in doomed or wanted(recorded)):
                    gone.append(m.message_id)
                    removed.setdefault(recorded.id, recorded)
                    self.shared.retract([recorded.id])
            if gone:
                self.store.delete_messages(key, gone)
        if removed:
            self.store.scrub()
        return list(removed.values())

    def memories(self) -> Iterator[tuple[str, str, ConversationMemory]]:
        """``(agent, branch, memory)`` for every memory in use."""
        for (agent, branch), mem in list(self._memories.items()):
            yield agent, branch, mem

    def apply_retention(self, agent: str | None = None) -> int:
        """Enforce ttl / max_stored_messages now, in the store and in memory.

        What they delete takes what was derived from it along (RAG entries, tiers, facts
        with no other source), and the store's files are scrubbed afterwards.

        Returns the number of messages deleted from the store (persistent memories) plus
        those removed from non-persistent memories.
        """
        self._check_open()
        removed = 0
        for slot, mem in list(self._memories.items()):
            sink = self._sinks.get(slot)
            if sink is None or (agent is not None and slot[0] != agent):
                continue
            with mem.lock:  # one step: no append slips between the store and the memory
                stored, drop = sink.retain(mem)
                dropped = mem.evict(drop)  # the store already applied the same rule
            removed += stored if sink.writer is not None else len(dropped)
        removed += self._retain_unloaded(agent)
        self.store.scrub()  # what expired is not left in the store's files
        for slot, patterns in list(self._patterns.items()):
            if agent is None or slot[0] == agent:
                patterns.sync()  # their copies went with the messages: drop them here too
        return removed

    def _expire_due(self) -> None:
        """Apply the ttl now to every agent one of whose messages has outlived it.

        ``ttl`` is a hard lifetime: no read (``context_for``, recall) may return an
        expired message or anything derived from it, whenever retention last ran. The
        check looks at each memory's oldest unprotected message only.
        """
        now = datetime.now(UTC)
        due: set[str] = set()
        for (agent, _), mem in list(self._memories.items()):
            ttl = self.config.policy_for(agent).ttl
            if ttl is None or agent in due:
                continue
            cutoff = ttl_cutoff(now, ttl)
            with mem.lock:  # by position: O(log n) each, never a copy of the memory
                head = [mem[i] for i in range(min(len(mem), 64))]
            oldest = next((m for m in head if not m.is_protected), None)
            if oldest is not None and is_expired(oldest, cutoff):
                due.add(agent)
        for agent in sorted(due):
            self.apply_retention(agent)

    def _retain_unloaded(self, agent: str | None) -> int:
        """Apply persistent agents' ttl / bound to their stored keys not loaded here."""
        removed = 0
        for key in self.store.list_keys(self.namespace):
            info = parse_key(key)
            if info.kind != "conversation" or (agent is not None and key[1] != agent):
                continue
            if (key[1], key[2]) in self._memories:
                continue
            policy = self.config.policy_for(key[1])
            if policy.is_persistent and (policy.ttl or policy.max_stored_messages):
                removed += self.store.enforce_retention(
                    key, ttl=policy.ttl, max_messages=policy.max_stored_messages
                )
        return removed

    def flush(self) -> None:
        """Write buffered persistent appends to the store and enforce retention."""
        self._check_open()
        self._flush_sinks()
        for patterns in self._patterns.values():
            patterns.flush()
        self.apply_retention()

    def _flush_sinks(self, slots: Iterable[tuple[str, str]] | None = None) -> None:
        """Write the buffered appends of ``slots`` (default: every memory's)."""
        for slot in list(self._sinks) if slots is None else slots:
            sink, mem = self._sinks.get(slot), self._memories.get(slot)
            if sink is None or mem is None:
                continue
            with mem.lock:  # the sink's other calls run under this lock too
                sink.flush()

    async def aflush(self) -> None:
        """Async twin of :meth:`flush`."""
        await asyncio.to_thread(self.flush)

    # ------------------------------------------------------------------ sessions
    def start_session(self) -> None:
        """Start a new session: clears what a previous session left (like end_session)."""
        self.end_session()
        self._session_started = datetime.now(UTC)

    def end_session(self) -> None:
        """End the session: persistent memories flushed, the others dropped."""
        self._check_open()
        self.flush()
        for patterns in self._patterns.values():
            patterns.end_episode()
        for slot in list(self._memories):
            if not self.config.policy_for(slot[0]).is_persistent:
                self._drop(slot)

    def _drop(self, slot: tuple[str, str]) -> None:
        """The end of a session / single run: the memory goes, with what was derived from it."""
        mem = self._memories.pop(slot, None)
        self._sinks.pop(slot, None)
        self.shared.forget(inbox_key(*slot))
        patterns = self._patterns.pop(slot, None)
        if patterns is not None:
            if mem is not None:  # facts learned from its messages go with them
                patterns.forget([m.message_id for m in mem.read()], cause="forget")
            patterns.close()
        if mem is not None:
            mem.clear()

    # ------------------------------------------------------------------ runs
    def run(
        self,
        agent: str,
        *,
        branch: str = "main",
        parent_id: str | None = None,
        run_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> _RunScope:
        """A run of ``agent``: ``with manager.run("a") as run:`` (or ``async with``).

        ``run_id``: the run's id (default: a random one); a run of an id saved before
        replaces that snapshot, and reopens its episode (episodic memory), so a replayed
        run (a workflow rerun) is stored once.

        Without ``parent_id`` the run writes to the agent's memory on ``branch``. With
        ``parent_id`` it gets its own memory holding the parent chain's history, so runs
        forked from the same parent never see each other. When the run ends its snapshot
        is saved, single_run memories are cleared and persistent ones flushed.

        Raises:
            MessageNotFoundError: ``parent_id`` is not a known run.
        """
        self._check_open()
        _check_name("agent", agent)
        _check_name("branch", branch)
        if parent_id is not None:
            memory = ConversationMemory(
                self.history(parent_id),
                policy=self.config.policy_for(agent).context,
                counter=self.counter,
                summarizer=self.summarizer,
                strict_tools=False,
                events=self.events,
                agent=agent,
            )
            memory.strict_tools = True
        else:
            memory = self.memory(agent, branch)
            patterns = self._patterns.get((agent, branch))
            # a run given its id (a replayed run) reopens its episode instead of a new one
            episode_id = None if run_id is None else f"episode_{run_id}"
            if patterns is not None and run_id is None:
                run_id = "run_" + uuid.uuid4().hex
            if patterns is not None:
                patterns.start_episode({"run_id": run_id, "agent": agent}, episode_id=episode_id)
        ctx = RunContext(
            agent=agent,
            memory=memory,
            parent_id=parent_id,
            run_id=run_id,
            namespace=self.namespace,
            branch=branch,
            metadata=metadata,
        )
        return _RunScope(ctx, self._begin_run, self._end_run)

    def _runs_store(self, agent: str) -> MemoryStore:
        return self.store if self.config.policy_for(agent).is_persistent else self._ephemeral_runs

    def _begin_run(self, run: RunContext[ConversationMemory]) -> None:
        self._active_runs[run.agent] = self._active_runs.get(run.agent, 0) + 1

    def _end_run(self, run: RunContext[ConversationMemory], error: BaseException | None) -> None:
        run.finish(error)
        count = self._active_runs.get(run.agent, 1) - 1
        if count > 0:
            self._active_runs[run.agent] = count
        else:
            self._active_runs.pop(run.agent, None)
        if self.closed:
            return
        if run.parent_id is None:
            patterns = self._patterns.get((run.agent, run.branch))
            if patterns is not None:
                patterns.end_episode()
        self._runs_store(run.agent).save_run(run.snapshot())
        policy = self.config.policy_for(run.agent)
        if policy.retention == "single_run" and count <= 0 and run.parent_id is None:
            self._drop((run.agent, run.branch))
        elif policy.is_persistent:
            self._flush_sinks([(run.agent, run.branch)])
            self.apply_retention(run.agent)

    def load_run(self, run_id: str) -> RunSnapshot | None:
        """A run's snapshot (persistent agents: from the store; others: this process)."""
        return self.store.load_run(run_id) or self._ephemeral_runs.load_run(run_id)

    def history(self, run_id: str) -> list[Message]:
        """The conversation up to the end of ``run_id`` (its chain, root first)."""
        if self.load_run(run_id) is None:
            raise MessageNotFoundError(f"run {run_id!r} is not known")
        return history(self, run_id)

    def trace(self, run_id: str) -> list[TraceStep]:
        """The steps ``run_id`` recorded (tool calls, model calls: timings, usage, errors).

        Read from the run's snapshot, so a persistent agent's trace survives a restart.
        Across runs: :func:`~marsys_mem.model.traces.slowest_steps` and
        :func:`~marsys_mem.model.traces.failed_steps` over ``manager.store``.

        Raises:
            MessageNotFoundError: ``run_id`` is not a known run.
        """
        snap = self.load_run(run_id)
        if snap is None:
            raise MessageNotFoundError(f"run {run_id!r} is not known")
        return list(snap.trace)

    # ------------------------------------------------------------------ context
    def context_for(
        self,
        agent: str,
        query: str | None = None,
        *,
        branch: str = "main",
        provider: Provider | None = None,
        subject: str | None = None,
    ) -> Any:
        """What ``agent`` would send to its LLM, under its policy.

        Returns a :class:`ContextWindow`, or the provider's message format when
        ``provider`` is given. Blocks, each under its share of ``max_tokens``: shared
        facts, user facts (``patterns.facts``: the subject's valid facts, those matching
        ``query`` first, else the most confident), core memory, snippets retrieved
        for ``query``, then cross-thread recall.

        ``subject``: whom this conversation is with (the user). The thread ``(agent,
        branch)`` is linked to the subject (:meth:`link_thread`), and with a ``query`` the
        messages of the subject's *other* threads scoring ``patterns.threads.min_score``
        or more come as a block "From other conversations with <subject>", each labelled
        ``[agent@branch, date]``, under ``budget.threads``, never repeating a message of
        this thread or a text already in the window (``patterns.threads: false``: link
        only). Other subjects' threads are never searched.

        Raises:
            InvalidNameError: ``agent``, ``branch`` or ``subject`` is not a name.
            TypeError: ``query`` is not a non-empty string.
            ValueError: the thread already belongs to another subject.
        """
        self.sync()
        mem, policy, blocks, counter = self._context_parts(agent, query, branch, subject)
        win = assemble(mem, policy, blocks, counter)
        return win if provider is None else to_llm_format(win.messages, provider)

    def sync(self) -> tuple[int, int]:
        """Catch up with what other processes did to this manager's store.

        Messages other processes appended to persistent agents' keys join this process's
        memories; messages deleted anywhere (forget, retention, cascades) leave them; shared
        facts forgotten elsewhere leave the shared pool. :meth:`context_for` calls it first,
        so two processes (two MCP servers) on one store behave as one memory.

        Returns:
            ``(added, removed)`` message counts.
        """
        self._check_open()
        self._expire_due()
        gone_by_key, complete = self._feed.poll()
        removed = 0
        for key, ids in gone_by_key.items():
            info = parse_key(key)
            if info.kind == "facts":
                self.shared.retract(mid.removeprefix("fact_") for mid in ids)
                continue
            if info.kind != "conversation" or key[0] != self.namespace:
                continue
            mem = self._memories.get((key[1], key[2]))
            if mem is not None:
                with mem.lock:
                    removed += len(mem.evict([i for i in ids if i in mem]))
        added = 0
        for slot, cursor in list(self._cursors.items()):
            mem = self._memories.get(slot)
            if mem is None:
                continue
            page = self.store.load_messages_after(self.key(*slot), cursor)
            with mem.lock:
                self._cursors[slot] = page.cursor
                if not complete:  # the deletion log was pruned past us: compare
                    stored = {m.message_id for m in self.store.load_messages(self.key(*slot))}
                    removed += len(
                        mem.evict([m.message_id for m in mem if m.message_id not in stored])
                    )
                new = [m for m in page.messages if m.message_id not in mem]
                if new:
                    strict, mem.strict_tools = mem.strict_tools, False
                    try:  # already stored: the sink must not write them again
                        mem.add_many(new, _publish=False)
                    finally:
                        mem.strict_tools = strict
                    added += len(new)
        return added, removed

    def _context_parts(
        self, agent: str, query: str | None, branch: str, subject: str | None = None
    ) -> tuple[ConversationMemory, ContextPolicy, list[Block], TokenCounter]:
        if query is not None and (not isinstance(query, str) or not query.strip()):
            raise TypeError(f"query must be a non-empty string, got {query!r}")
        if subject is not None:
            _check_name("subject", subject)
        mem = self.memory(agent, branch)
        policy = mem.policy
        counter = get_counter(policy.token_counter) if policy.token_counter else mem.counter
        budget = self.config.policy_for(agent).patterns.budget
        blocks: list[Block] = []
        facts = self.shared.facts_for(inbox_key(agent, branch))
        if facts:
            blocks.append(
                Block(
                    name="shared_facts",
                    header="Shared facts:",
                    items=[
                        BlockItem(f.text, source=f"{f.source_agent}@{f.source_branch}")
                        for f in reversed(facts[-self.shared.max_context_facts :])
                    ],
                    fraction=budget.shared,
                    drop_order=0,
                )
            )
        patterns = self._patterns.get((agent, branch))
        window: list[Message] | None = None
        if patterns is not None:
            window = self._probe_window(mem, policy, counter)
            blocks.extend(patterns.blocks(query, {m.message_id for m in window}))
        if subject is not None:
            self.link_thread(subject, agent, branch)
            cfg = self.config.policy_for(agent).patterns
            if query is not None and cfg.threads.enabled:
                if window is None:
                    window = self._probe_window(mem, policy, counter)
                block = self._thread_block(agent, branch, subject, query, mem, window, blocks)
                if block is not None:
                    blocks.append(block)
        return mem, policy, blocks, counter

    @staticmethod
    def _probe_window(
        mem: ConversationMemory, policy: ContextPolicy, counter: TokenCounter
    ) -> list[Message]:
        """The conversation window without blocks (what the blocks must not repeat)."""
        probe = ContextPolicy(
            max_messages=policy.max_messages,
            max_tokens=policy.max_tokens,
            token_counter=policy.token_counter,
        )
        try:
            return list(mem.context(probe, counter=counter).messages)
        except ContextOverflowError:
            return []

    def _thread_block(
        self,
        agent: str,
        branch: str,
        subject: str,
        query: str,
        mem: ConversationMemory,
        window: list[Message],
        blocks: list[Block],
    ) -> Block | None:
        """The cross-thread recall block for ``subject`` (``None``: nothing relevant)."""
        cfg = self.config.policy_for(agent).patterns
        recall = self.thread_recall(cfg.embedder)
        hits = recall.search(
            subject,
            query,
            self._thread_messages,
            exclude=(agent, branch),
            exclude_ids=[m.message_id for m in mem.read()],
            exclude_texts=[m.text for m in window if m.text.strip()],
            k=cfg.threads.k,
            min_score=cfg.threads.min_score,
        )
        if not hits:
            return None
        return Block(
            "thread_recall",
            f"From other conversations with {subject}:",
            [h.item() for h in hits],
            cfg.budget.threads_share,
            2,
        )

    async def acontext_for(
        self,
        agent: str,
        query: str | None = None,
        *,
        branch: str = "main",
        provider: Provider | None = None,
        subject: str | None = None,
    ) -> Any:
        """Async twin of :meth:`context_for` (async summarisers allowed)."""
        await asyncio.to_thread(self.sync)
        mem, policy, blocks, counter = self._context_parts(agent, query, branch, subject)
        win = await aassemble(mem, policy, blocks, counter)
        return win if provider is None else to_llm_format(win.messages, provider)

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Flush persistent memories and close the store. Idempotent."""
        if self.closed:
            return
        try:
            self._flush_sinks()
        finally:
            for patterns in self._patterns.values():
                patterns.close()
            if self._facts is not None and self._own_facts:
                self._facts.close()
            if self._recall is not None:
                self._recall.close()
            close_llm = getattr(self.llm, "close", None)
            if self._own_llm and close_llm is not None:
                close_llm()
            self.closed = True
            if self._own_store:
                self.store.close()
            self._ephemeral_runs.close()

    async def aclose(self) -> None:
        """Async twin of :meth:`close`."""
        await asyncio.to_thread(self.close)

    def __repr__(self) -> str:
        return (
            f"MemoryManager(store={type(self.store).__name__}, namespace={self.namespace!r}, "
            f"memories={len(self._memories)})"
        )
