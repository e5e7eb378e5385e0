"""The memory patterns of one agent, built from its config and fed by its conversation.

``MemoryManager`` creates one :class:`AgentPatterns` per ``(agent, branch)`` whose policy
enables a pattern (``patterns:`` in the config file). Every message the agent's memory
appends is ingested into each enabled pattern (messages without text, such as a bare tool
call, are skipped; embedding happens in the background, so appends stay fast). At
``context_for`` time it yields the memory blocks:

* ``user_facts``: valid facts learned about the subject (``patterns.facts``), most
  relevant to the query first, else most confident;
* ``core``: the hierarchical core tier (important messages), if enabled;
* ``retrieval``: snippets for the query from RAG, episodic recall and the hierarchical
  archive, deduplicated, never repeating a message already in the conversation window.

With ``patterns.facts`` every user message is also submitted to a background
:class:`~marsys_mem.patterns.extraction.ExtractionPipeline` (``submit`` never waits) that
learns into a :class:`~marsys_mem.patterns.user_facts.FactMemory` the manager gives (one per
manager, shared by every agent, in the manager's store).

Persistent agents keep their patterns in the manager's store, under the internal keys of
:func:`marsys_mem.store.keys.internal_key` (no agent or branch name can spell them); the vector
index of a SQLite-backed agent is saved next to the database file (:func:`index_file`).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from marsys_mem.config.models import FactsPatternConfig, PatternsConfig
from marsys_mem.context.blocks import BlockItem
from marsys_mem.context.compose import Block
from marsys_mem.exceptions import ConfigError, MarsysMemError
from marsys_mem.llm.base import LLM
from marsys_mem.model.messages import Message
from marsys_mem.patterns.episodic import EpisodicMemory
from marsys_mem.patterns.extraction import (
    ExtractionPipeline,
    FactExtractor,
    LLMExtractor,
    extract_facts_offline,
)
from marsys_mem.patterns.hierarchical import HierarchicalMemory
from marsys_mem.patterns.rag import RAGMemory, ScoredMessage
from marsys_mem.patterns.user_facts import Fact, FactMemory
from marsys_mem.retrieval.embeddings import Embedder, HashingEmbedder
from marsys_mem.store.base import Key, Load, MemoryStore
from marsys_mem.store.keys import internal_key, validate_key
from marsys_mem.store.retention import evicted

__all__ = ["AgentPatterns", "fact_extractor", "index_file", "rank_facts", "resolve_embedder"]

log = logging.getLogger("marsys_mem.patterns")

_SNIPPET_CHARS = 300


def resolve_embedder(
    spelling: Literal["default", "hashing", "none"],
) -> Embedder | Literal["default"] | None:
    """The embedder a config spelling asks for (``default`` stays lazy)."""
    if spelling == "hashing":
        return HashingEmbedder()
    if spelling == "none":
        return None
    return "default"


def index_file(index_dir: Path, key: Key, kind: Literal["rag", "episodic", "archive"]) -> Path:
    """Where the ``kind`` vector index of the agent whose conversation is ``key`` is saved.

    Names contain no ``/``, so the hashed ``namespace/agent/branch/kind`` is unambiguous.

    Example:
        >>> index_file(Path("indexes"), ("d", "a", "main"), "rag").name
        'rag-e7273c7f2b22d5d56d87.faiss'
    """
    namespace, agent, branch = validate_key(key)
    digest = hashlib.sha256(f"{namespace}/{agent}/{branch}/{kind}".encode()).hexdigest()
    return index_dir / f"{kind}-{digest[:20]}.faiss"


def fact_extractor(config: FactsPatternConfig, llm: LLM | None) -> FactExtractor:
    """The extractor ``config.extractor`` names (``llm`` needs the manager's ``llm``).

    Raises:
        ConfigError: ``extractor: llm`` without an ``llm``.

    Example:
        >>> fact_extractor(FactsPatternConfig(), None) is extract_facts_offline
        True
    """
    if config.extractor == "offline":
        return extract_facts_offline
    if llm is None:
        raise ConfigError(
            "patterns.facts.extractor: 'llm' needs a model: pass llm=OpenAILLM(...) (or any "
            "LLM) to MemoryManager, or use extractor: offline"
        )
    return LLMExtractor(llm)


def rank_facts(
    facts: FactMemory, subject: str, query: str | None, *, k: int, min_score: float
) -> list[Fact]:
    """At most ``k`` valid facts about ``subject``, the most useful first.

    Those scoring ``min_score`` or more for ``query`` come first (best first), then the
    others by confidence (the most recently reinforced first on ties).

    Example:
        >>> from marsys_mem.retrieval.embeddings import HashingEmbedder
        >>> facts = FactMemory(HashingEmbedder())
        >>> _ = facts.add("User likes green tea", subject="u", confidence=0.5)
        >>> _ = facts.add("User lives in Oslo", subject="u", confidence=0.9)
        >>> [f.text for f in rank_facts(facts, "u", None, k=5, min_score=0.3)]
        ['User lives in Oslo', 'User likes green tea']
        >>> [f.text for f in rank_facts(facts, "u", "green tea?", k=5, min_score=0.3)]
        ['User likes green tea', 'User lives in Oslo']
    """
    ranked: list[Fact] = []
    if query is not None:
        ranked = [h.fact for h in facts.search(query, k, min_score, subject=subject)]
    chosen = {f.fact_id for f in ranked}
    rest = [f for f in facts.facts(subject) if f.fact_id not in chosen]
    rest.sort(key=lambda f: (-f.confidence, -f.reinforced_at.timestamp()))
    return (ranked + rest)[:k]


def _snippet(m: Message) -> BlockItem:
    return BlockItem.from_message(m, max_chars=_SNIPPET_CHARS)


class AgentPatterns:
    """RAG, episodic and hierarchical memory of one agent on one branch.

    Args:
        config: the agent's :class:`~marsys_mem.config.models.PatternsConfig`.
        key: the agent's store key ``(namespace, agent, branch)``.
        store: where persistent patterns live (``None``: in process only).
        embedder: shared embedder (or ``"default"`` / ``None``).
        index_dir: folder for saved vector indexes (persistent SQLite agents).
        facts: the fact memory ``patterns.facts`` learns into (required with it; not
            closed by :meth:`close`: the manager owns it).
        llm: the model for ``patterns.facts.extractor: llm``.

    Example:
        >>> from marsys_mem.config.models import PatternsConfig
        >>> cfg = PatternsConfig.model_validate({"embedder": "hashing", "rag": True})
        >>> patterns = AgentPatterns(cfg, ("default", "a", "main"))
        >>> patterns.ingest([Message.user("My sister Clara lives in Lisbon")])
        >>> [b.name for b in patterns.blocks("Where does Clara live?", exclude=set())]
        ['retrieval']
        >>> patterns.close()
    """

    def __init__(
        self,
        config: PatternsConfig,
        key: Key,
        *,
        store: MemoryStore | None = None,
        embedder: Embedder | Literal["default"] | None = None,
        index_dir: Path | None = None,
        facts: FactMemory | None = None,
        llm: LLM | None = None,
    ) -> None:
        self.config = config
        self.key = key
        self.store = store
        self._unverified: dict[str, None] = {}  # ingested, not yet checked against the store
        rag_key = internal_key(key, "rag")  # raises InvalidNameError for a bad name
        namespace, episodes_agent, _ = internal_key(key, "episodes")
        tiers_prefix = internal_key(key, "tiers", "core")[:2]
        emb = embedder if embedder is not None else resolve_embedder(config.embedder)
        if config.embedder == "none":
            emb = None
        # Stored copies link to the conversation's messages: they go when those go.
        owner = key if store is not None else None
        self.archive = config.rag is not None and config.rag.keep == "archive"

        def index_path(kind: Literal["rag", "episodic", "archive"]) -> Path | None:
            if index_dir is None or store is None:
                return None
            return index_file(index_dir, key, kind)

        self.rag: RAGMemory | None = None
        self.episodic: EpisodicMemory | None = None
        self.hierarchical: HierarchicalMemory | None = None
        self.facts: FactMemory | None = None
        self.extraction: ExtractionPipeline | None = None
        fcfg = config.facts if config.learns_facts else None
        extractor: FactExtractor = extract_facts_offline
        if fcfg is not None:
            if facts is None:
                raise ValueError("patterns.facts is enabled: pass the FactMemory as facts=")
            extractor = fact_extractor(fcfg, llm)
        try:
            if config.rag is not None:
                self.rag = RAGMemory(
                    emb,
                    store=store,
                    key=rag_key,
                    owner=None if self.archive else owner,
                    index_path=index_path("rag"),
                    ranking=config.rag.ranking,
                    ingest=config.rag.ingest,
                )
            if config.episodic is not None:
                self.episodic = EpisodicMemory(
                    emb,
                    store=store,
                    namespace=namespace,
                    agent=episodes_agent,
                    index_path=index_path("episodic"),
                    rag_options={"owner": owner},
                )
            if config.hierarchical is not None:
                self.hierarchical = HierarchicalMemory(
                    emb,
                    core_threshold=config.hierarchical.core_threshold,
                    working_size=config.hierarchical.working_size,
                    store=store,
                    key_prefix=tiers_prefix,
                    index_path=index_path("archive"),
                    owner=owner,
                )
            if fcfg is not None and facts is not None:
                self.facts = facts
                self.extraction = ExtractionPipeline(
                    facts,
                    fcfg.subject,
                    extractor,
                    debounce=fcfg.debounce,
                    max_batch=fcfg.max_batch,
                    maintain=fcfg.maintain,
                    source_key=key,
                    stored_sources=store is not None,
                )
        except BaseException:
            self.close()
            raise
        if store is not None:  # copies a store of an earlier version kept past their message
            self._unverified.update(dict.fromkeys(self.held_ids()))

    # ------------------------------------------------------------------ ingest
    def ingest(self, messages: Iterable[Message]) -> None:
        """Add messages with text to every enabled pattern (errors are logged, not raised).

        User messages also go to the fact extraction pipeline (queued, never awaited).
        """
        messages = list(messages)
        if self.extraction is not None:
            try:
                self.extraction.submit(messages)
            except RuntimeError as exc:  # closed pipeline
                log.debug("fact extraction skipped %d message(s): %s", len(messages), exc)
        added: list[str] = []
        for m in messages:
            if not m.text.strip() or m.role == "system":
                continue
            for pattern in (self.rag, self.episodic, self.hierarchical):
                if pattern is None:
                    continue
                try:
                    pattern.add(m)
                    added.append(m.message_id)
                except MarsysMemError as exc:  # duplicate after a reload, oversized text
                    log.debug("pattern %s skipped message %s: %s", pattern, m.message_id, exc)
        if added and self.store is not None:
            self._unverified.update(dict.fromkeys(added))

    def _drop_orphans(self) -> None:
        """Copies of messages the store deleted before they were made go (before a read).

        A message older than the ttl, evicted in its own append, or deleted by another
        process between its append and its copy: its cascade found no copy to delete.
        Checked in one query for everything ingested since the last read.
        """
        if not self._unverified or self.store is None:
            return
        ids, self._unverified = list(self._unverified), {}
        if len(ids) > 500:  # a whole index (on opening): read the conversation's ids once
            stored = {m.message_id for m in self.store.load_messages(self.key)}
        else:
            stored = {m.message_id for m in self.store.batch([Load(self.key, ids=tuple(ids))])[0]}
        missing = [mid for mid in ids if mid not in stored]
        if missing:  # an archive keeps its entries: it has its own bound and ttl
            self.forget(missing, cause="bound")
            self.store.scrub()

    def forget(self, ids: Sequence[str], *, cause: Literal["forget", "ttl", "bound"]) -> int:
        """The conversation lost ``ids``: remove what every pattern derived from them.

        ``cause`` ``bound`` (``max_stored_messages``) spares a RAG archive
        (``rag: {keep: archive}``), which has its own bound; ``forget`` and ``ttl`` reach
        everything. Pending fact extraction runs first, so no fact is learned from a
        message after it went. Returns how many pattern entries were removed.
        """
        if not ids:
            return 0
        if self.extraction is not None:
            try:
                self.extraction.flush()
            except Exception:
                log.exception("fact extraction failed for %s", self.key)
        removed = 0
        for pattern in (self.rag, self.episodic, self.hierarchical):
            if pattern is None or (pattern is self.rag and self.archive and cause == "bound"):
                continue
            removed += pattern.remove(list(ids))
        if self.facts is not None:
            removed += self.facts.forget_sources(self.key, ids)
        return removed

    def sync(self) -> list[str]:
        """Catch every pattern up with the store's deletions (cascades, other processes).

        Returns the ids dropped. Facts catch up too (their count is not in the list).
        """
        dropped: list[str] = []
        for pattern in (self.rag, self.episodic, self.hierarchical):
            if pattern is not None:
                dropped += pattern.sync()
        if self.facts is not None:
            self.facts.sync()
        return dropped

    def held_ids(self) -> list[str]:
        """Every message id some pattern holds (for ``forget(everything=True)``)."""
        held: dict[str, None] = {}
        if self.rag is not None:
            held.update(dict.fromkeys(m.message_id for m in self.rag.messages()))
        if self.episodic is not None:
            held.update(dict.fromkeys(m.message_id for m in self.episodic.rag.messages()))
        if self.hierarchical is not None:
            h = self.hierarchical
            held.update(dict.fromkeys(m.message_id for m in [*h.core(), *h.working()]))
            held.update(dict.fromkeys(m.message_id for m in h.archive.messages()))
        return list(held)

    def get(self, message_id: str) -> Message | None:
        """The message ``message_id`` if a pattern holds it."""
        for rag in self._rags():
            if message_id in rag:
                return rag.get(message_id)
        if self.hierarchical is not None and message_id in self.hierarchical:
            return self.hierarchical.get(message_id)
        return None

    def _rags(self) -> list[RAGMemory]:
        rags = [self.rag] if self.rag is not None else []
        if self.episodic is not None:
            rags.append(self.episodic.rag)
        return rags

    def retain(self, ttl: timedelta | None) -> int:
        """Apply a RAG archive's own bound and ttl (``rag: {keep: archive, ...}``).

        ``ttl``: the agent's, used when the archive states none. Returns the count removed.
        """
        if not self.archive or self.rag is None or self.config.rag is None:
            return 0
        cfg = self.config.rag
        messages = self.rag.messages()
        drop = evicted(
            messages,
            now=datetime.now(UTC),
            ttl=cfg.ttl if cfg.ttl is not None else ttl,
            max_messages=cfg.max_stored_messages,
        )
        return self.rag.remove([messages[i].message_id for i in drop]) if drop else 0

    def start_episode(self, metadata: dict[str, Any], *, episode_id: str | None = None) -> None:
        """Begin an episode (one per run) if episodic memory is enabled.

        ``episode_id``: reopen the episode of that id if there is one (a replayed run).
        """
        if self.episodic is not None:
            self.episodic.start_episode(metadata, episode_id=episode_id)

    def end_episode(self) -> None:
        """End the current episode, if any."""
        if self.episodic is not None:
            self.episodic.end_episode()

    # ------------------------------------------------------------------ blocks
    def _hits(self, query: str) -> list[ScoredMessage]:
        hits: list[ScoredMessage] = []
        if self.rag is not None and self.config.rag is not None:
            hits += self.rag.search(query, self.config.rag.k, self.config.rag.min_score)
        if self.episodic is not None and self.config.episodic is not None:
            hits += self.episodic.recall(query, self.config.episodic.k)
        if self.hierarchical is not None and self.config.hierarchical is not None:
            hits += self.hierarchical.archive_search(query, self.config.hierarchical.k)
        # one calibrated scale: the patterns' hits merge by score (stable: ties keep order)
        return sorted(hits, key=lambda h: -h.score)

    def blocks(self, query: str | None, exclude: set[str]) -> list[Block]:
        """The ``user_facts``, ``core`` and ``retrieval`` blocks (``exclude``: ids in window)."""
        self._drop_orphans()
        budget = self.config.budget
        out: list[Block] = []
        fcfg = self.config.facts
        if self.facts is not None and fcfg is not None:
            known = rank_facts(self.facts, fcfg.subject, query, k=fcfg.k, min_score=fcfg.min_score)
            if known:
                out.append(
                    Block(
                        "user_facts",
                        f"Known facts about {fcfg.subject}:",
                        [BlockItem(f.text) for f in known],
                        budget.facts,
                        1,
                    )
                )
        if self.hierarchical is not None:
            core = [m for m in self.hierarchical.core() if m.message_id not in exclude]
            core = [m for m in core if m.role != "system" and m.text.strip()]
            if core:
                items = [_snippet(m) for m in reversed(core)]  # newest first survive cuts
                out.append(Block("core_memory", "Core memory:", items, budget.core, 1))
        if query is not None:
            seen = set(exclude)
            hits: list[BlockItem] = []
            for hit in self._hits(query):
                if hit.message.message_id in seen:
                    continue
                seen.add(hit.message.message_id)
                hits.append(_snippet(hit.message))
            if hits:
                out.append(Block("retrieval", "Relevant memories:", hits, budget.retrieval, 2))
        return out

    def search_all(self, query: str) -> list[ScoredMessage]:
        """Every enabled pattern's hits for ``query`` (for reports and the CLI)."""
        self._drop_orphans()
        return self._hits(query)

    # ------------------------------------------------------------------ lifecycle
    def flush(self) -> None:
        """Wait for pending fact extraction and embeddings (and save indexes).

        An extractor error is logged (the pipeline's stats count it), not raised.
        """
        if self.extraction is not None:
            try:
                self.extraction.flush()
            except Exception:
                log.exception("fact extraction failed for %s", self.key)
        self._drop_orphans()
        for pattern in self._patterns():
            pattern.flush()

    def _patterns(self) -> Sequence[Any]:
        return [p for p in (self.rag, self.episodic, self.hierarchical) if p is not None]

    def close(self) -> None:
        """Flush and close every pattern (fact extraction drains first). Idempotent."""
        if self.extraction is not None:
            try:
                self.extraction.close()
            except Exception:
                log.exception("closing the fact extraction of %s failed", self.key)
        try:
            self._drop_orphans()
        except MarsysMemError:
            log.exception("checking the copies of %s against the store failed", self.key)
        for pattern in self._patterns():
            try:
                pattern.close()
            except MarsysMemError:
                log.exception("closing %r failed", pattern)
