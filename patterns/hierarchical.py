"""HierarchicalMemory: core, working and archival tiers, like an operating system's memory.

* **core**: messages whose importance is at or above ``core_threshold``, plus every system
  or pinned message. Always in context; never dropped to fit a budget.
* **working**: the most recent other messages, at most ``working_size`` of them. When it
  overflows, its oldest messages move to the archive (an assistant message with tool calls
  moves together with its results).
* **archive** (the episodic tier): a :class:`~marsys_mem.patterns.rag.RAGMemory`, searched
  by :meth:`HierarchicalMemory.archive_search` and by :meth:`HierarchicalMemory.context`
  when it is given a query.

Importance is given per message (``add(message, importance=0.9)``) or computed by the
pluggable ``scorer`` (``Message -> float`` in ``[0, 1]``; default :func:`default_importance`)
and stored in the message's ``metadata["importance"]``.

:meth:`~HierarchicalMemory.context` assembles core, then the archived snippets relevant to
the query as one system message, then working memory. Under a token (or message) budget,
the lowest-ranked snippets go first, then the oldest working messages; core is never
dropped: if core alone does not fit, :class:`~marsys_mem.exceptions.ContextOverflowError`
says by how much.

Persistence: core and working live in the store under ``(*key_prefix, "core")`` and
``(*key_prefix, "working")``; the archive is a RAGMemory on the same store under
``(*key_prefix, "archive")`` (or the ``archive`` you pass, with its own store). A move
between tiers writes the destination before it deletes the source, so a crash in between
leaves a message in two tiers, and opening again resolves that (core, then archive, then
working wins).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from marsys_mem.context.blocks import BlockItem, block_message
from marsys_mem.context.policy import ContextPolicy
from marsys_mem.context.tokens import TokenCounter, count_message, get_counter
from marsys_mem.exceptions import (
    ContextOverflowError,
    DuplicateMessageError,
    EmbeddingError,
    MessageNotFoundError,
    StoreError,
)
from marsys_mem.lifecycle import Closing
from marsys_mem.model.messages import Message
from marsys_mem.patterns.importance import Scorer, check_importance, default_importance
from marsys_mem.patterns.rag import RAGMemory, ScoredMessage
from marsys_mem.retrieval.calibration import DEFAULT_MIN_SCORE
from marsys_mem.retrieval.embeddings import Embedder
from marsys_mem.store.base import Append, Delete, Key, MemoryStore, validate_key
from marsys_mem.store.memory import InMemoryStore
from marsys_mem.store.owners import DeletionFeed

__all__ = ["HierarchicalMemory", "Tier"]

log = logging.getLogger("marsys_mem.patterns.hierarchical")

Tier = Literal["core", "working", "archive"]

# ---------------------------------------------------------------------- tool groups


def _units(messages: Sequence[Message]) -> list[list[int]]:
    """Positions grouped into units, oldest first.

    An assistant message with tool calls and the results that answer it form one unit;
    every other message is a unit of its own. A tool result whose call is not in
    ``messages`` (an orphan) is a unit flagged by a negative entry (``[-1 - position]``).
    """
    units: list[list[int]] = []
    owner_unit: dict[str, int] = {}  # call id -> index in units of its (latest) caller
    for pos, m in enumerate(messages):
        if m.role == "tool":
            u = owner_unit.get(m.tool_call_id or "")
            if u is None:
                units.append([-1 - pos])
            else:
                units[u].append(pos)
            continue
        units.append([pos])
        for call in m.tool_calls:
            owner_unit[call.id] = len(units) - 1
    return units


def _positions(unit: list[int]) -> list[int]:
    return [-1 - unit[0]] if unit[0] < 0 else unit


_SNIPPET_CHARS = 1000
_ARCHIVE_HEADER = "Relevant archived memories:"


def _snippet_message(hits: Sequence[ScoredMessage]) -> Message:
    items = [BlockItem.from_message(h.message, max_chars=_SNIPPET_CHARS) for h in hits]
    return block_message(
        _ARCHIVE_HEADER,
        items,
        name="archival_memory",
        metadata={"archival_memory": True, "archive_ids": [h.id for h in hits]},
    )


class HierarchicalMemory(Closing):
    """Core, working and archival memory tiers, assembled into one context.

    Args:
        embedder: the archive's embedder: an :class:`~marsys_mem.retrieval.embeddings.Embedder`,
            ``"default"`` (packaged all-MiniLM-L6-v2 if installed, else keyword search) or
            ``None`` (keyword search). Ignored when ``archive`` is given.
        core_threshold: messages with importance at or above it go to core (in ``[0, 1]``).
        working_size: most messages kept in working memory before the oldest move to the
            archive (a tool call group that straddles the limit may keep working memory a
            few messages above it until the next add; the newest group never moves).
        scorer: ``Message -> float`` in ``[0, 1]`` for messages added without an
            importance (default :func:`default_importance`).
        store: where core and working memory persist (default: a private
            :class:`~marsys_mem.store.InMemoryStore`). The memory does not close a store
            it was given.
        key_prefix: ``(namespace, agent)``; the tiers live under ``(*key_prefix, tier)``.
        archive: the archival tier; default: a new RAGMemory on ``store`` under
            ``(*key_prefix, "archive")``. A given archive is not closed by :meth:`close`.
        counter: the token counter for :meth:`context` when the policy names none.
        index_path: where the default archive saves its vector index.

    Thread-safe. System and pinned messages always go to core, whatever their importance.

    Example:
        >>> from marsys_mem.retrieval.embeddings import HashingEmbedder
        >>> mem = HierarchicalMemory(HashingEmbedder(), working_size=2)
        >>> _ = mem.add(Message.system("You are a travel assistant."))
        >>> _ = mem.add("Remember: my passport number is X1234567")
        >>> _ = mem.add("We booked the hotel in Porto", importance=0.5)
        >>> _ = mem.add("The flight leaves at 9am", importance=0.5)
        >>> _ = mem.add("Lovely weather today", importance=0.2)
        >>> [m.text for m in mem.core()]
        ['You are a travel assistant.', 'Remember: my passport number is X1234567']
        >>> [m.text for m in mem.working()]
        ['The flight leaves at 9am', 'Lovely weather today']
        >>> mem.archive_search("Which hotel did we book?", k=1)[0].text
        'We booked the hotel in Porto'
        >>> [m.role for m in mem.context("hotel", policy=ContextPolicy(max_tokens=200))]
        ['system', 'user', 'system', 'user', 'user']
        >>> mem.close()
    """

    _feed: DeletionFeed  # the store's deletions this memory has seen (set when loading)

    def __init__(
        self,
        embedder: Embedder | Literal["default"] | None = "default",
        *,
        core_threshold: float = 0.8,
        working_size: int = 20,
        scorer: Scorer | None = None,
        store: MemoryStore | None = None,
        key_prefix: tuple[str, str] = ("default", "hierarchical"),
        archive: RAGMemory | None = None,
        counter: TokenCounter | str | None = None,
        index_path: str | Path | None = None,
        owner: tuple[str, str, str] | None = None,
    ) -> None:
        self.core_threshold = check_importance(core_threshold, "core_threshold")
        if isinstance(working_size, bool) or not isinstance(working_size, int) or working_size < 1:
            raise ValueError(f"working_size must be an int >= 1, got {working_size!r}")
        self.working_size = working_size
        if scorer is not None and not callable(scorer):
            raise TypeError(f"scorer must be callable, got {type(scorer).__name__}")
        self.scorer: Scorer = scorer or default_importance
        if not isinstance(key_prefix, tuple) or len(key_prefix) != 2:
            raise ValueError(f"key_prefix must be a (namespace, agent) tuple, got {key_prefix!r}")
        self.core_key: Key = validate_key((*key_prefix, "core"))
        self.working_key: Key = validate_key((*key_prefix, "working"))
        self.key_prefix = key_prefix
        if store is not None and not isinstance(store, MemoryStore):
            raise TypeError(f"store must be a MemoryStore, got {type(store).__name__}")
        if archive is not None and not isinstance(archive, RAGMemory):
            raise TypeError(f"archive must be a RAGMemory, got {type(archive).__name__}")
        if archive is not None and index_path is not None:
            raise ValueError("index_path applies to the default archive only; not with archive=")
        self.counter = get_counter(counter)
        self.owner: Key | None = validate_key(owner) if owner is not None else None
        if owner is not None and store is None:
            raise ValueError("owner needs a store: the links to the owner's messages are stored")
        self._own_store = store is None
        self.store: MemoryStore = store if store is not None else InMemoryStore()
        self._own_archive = archive is None
        self._lock = threading.RLock()
        self._core: dict[str, Message] = {}
        self._working: list[Message] = []
        self._working_ids: set[str] = set()
        self._closed = False
        try:
            self.archive: RAGMemory = (
                archive
                if archive is not None
                else RAGMemory(
                    embedder,
                    store=self.store,
                    key=(*key_prefix, "archive"),
                    owner=self.owner,
                    index_path=index_path,
                )
            )
        except BaseException:
            if self._own_store:
                self.store.close()
            raise
        try:
            self._load()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ opening
    def sync(self) -> list[str]:
        """Drop what was deleted from the store (cascades, other processes); returns ids."""
        if self._closed:
            return []
        gone_by_key, complete = self._feed.poll()
        dropped = self.archive.sync()
        if complete and not (gone_by_key.get(self.core_key) or gone_by_key.get(self.working_key)):
            return dropped
        with self._lock:  # tiers are small: compare with what the store holds now
            stored_core = {m.message_id for m in self.store.load_messages(self.core_key)}
            stored_working = {m.message_id for m in self.store.load_messages(self.working_key)}
            gone = {mid for mid in self._core if mid not in stored_core}
            gone |= {mid for mid in self._working_ids if mid not in stored_working}
            core = [mid for mid in gone if mid in self._core]
            for mid in core:
                del self._core[mid]
            working = gone & self._working_ids
            if working:
                self._working = [w for w in self._working if w.message_id not in working]
                self._working_ids -= working
        return [*dropped, *core, *working]

    def _load(self) -> None:
        self._feed = DeletionFeed(self.store.load_deletions, self.core_key[0])
        core = self.store.load_messages(self.core_key)
        working = self.store.load_messages(self.working_key)
        core_ids = {m.message_id for m in core}
        stale_working = [
            m.message_id
            for m in working
            if m.message_id in core_ids or m.message_id in self.archive
        ]
        stale_archive = [mid for mid in core_ids if mid in self.archive]
        if stale_working:  # a move that crashed after writing its destination
            self.store.delete_messages(self.working_key, stale_working)
        if stale_archive:
            self.archive.remove(stale_archive)
        gone = set(stale_working)
        with self._lock:
            self._core = {m.message_id: m for m in core}
            self._working = [m for m in working if m.message_id not in gone]
            self._working_ids = {m.message_id for m in self._working}
            moved = self._evict_locked(self._working)
            if moved is not None:
                self._commit_working_locked([], *moved)

    # ------------------------------------------------------------------ helpers
    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("HierarchicalMemory is closed")

    def _tier_locked(self, message_id: str) -> Tier | None:
        if message_id in self._core:
            return "core"
        if message_id in self._working_ids:
            return "working"
        if message_id in self.archive:
            return "archive"
        return None

    def _core_calls_locked(self) -> set[str]:
        """Tool call ids of core messages (their results join them in core)."""
        return {c.id for m in self._core.values() for c in m.tool_calls}

    def _archival(self, m: Message) -> Message | None:
        """What the archive stores for ``m``.

        ``m`` itself, or for a message with no text a copy whose content describes its calls
        (``None`` if there is nothing to index).
        """
        if m.text.strip():
            return m
        parts: list[str] = []
        for call in m.tool_calls:
            args = json.dumps(call.arguments, ensure_ascii=False, sort_keys=True)
            parts.append(f"[called {call.name}({args})]")
        for agent_call in m.agent_calls:
            request = agent_call.request
            if not isinstance(request, str):
                request = json.dumps(request, ensure_ascii=False, sort_keys=True)
            parts.append(f"[asked {agent_call.agent}: {request}]")
        if m.structured_data is not None:
            parts.append(json.dumps(m.structured_data, ensure_ascii=False, sort_keys=True))
        if not parts:
            return None
        text = " ".join(parts)[: self.archive.ingest.max_chars]
        return m.model_copy(update={"content": text})

    def _evict_locked(self, working: list[Message]) -> tuple[list[Message], list[str]] | None:
        """Which of ``working`` (the prospective list) moves out: ``(archival copies, ids)``."""
        if len(working) <= self.working_size:
            return None
        newest = len(working) - 1
        remaining = len(working)
        out: list[int] = []
        for unit in _units(working):
            if remaining <= self.working_size:
                break
            positions = _positions(unit)
            if newest in positions:
                break
            out.extend(positions)
            remaining -= len(positions)
        if not out:
            return None
        out.sort()
        copies: list[Message] = []
        for pos in out:
            copy = self._archival(working[pos])
            if copy is None:
                log.debug("HierarchicalMemory: %s has no text to archive; dropped", working[pos])
            else:
                copies.append(copy)
        return copies, [working[pos].message_id for pos in out]

    def _commit_working_locked(
        self, new: list[Message], copies: list[Message], evicted: list[str]
    ) -> None:
        """Archive ``copies``, then append ``new`` to / delete ``evicted`` from working."""
        if copies:
            self.archive.add_many(copies)
        try:
            ops: list[Append | Delete] = []
            if new:
                ops.append(Append(self.working_key, tuple(new), copies_of=self.owner))
            if evicted:
                ops.append(Delete(self.working_key, tuple(evicted)))
            self.store.batch(ops)
        except BaseException:
            if copies:  # undo the archive half so nothing changed
                self.archive.remove([c.message_id for c in copies])
            raise
        gone = set(evicted)
        self._working = [m for m in [*self._working, *new] if m.message_id not in gone]
        self._working_ids = {m.message_id for m in self._working}

    # ------------------------------------------------------------------ writing
    def _prepare(
        self, message: Message | str, importance: float | None, fields: Any
    ) -> tuple[Message, float]:
        if isinstance(message, str):
            base = Message.user(message, **fields)
        elif isinstance(message, Message):
            base = message.model_copy(update=fields) if fields else message
        else:
            raise TypeError(f"expected a Message or a str, got {type(message).__name__}")
        if importance is not None:
            value = check_importance(importance, "importance")
        else:
            scored = self.scorer(base)
            try:
                value = check_importance(scored, "the scorer's importance")
            except TypeError as exc:
                raise ValueError(f"{exc} (scorer {self.scorer!r})") from None
            except ValueError as exc:
                raise ValueError(f"{exc} (scorer {self.scorer!r})") from None
        if len(base.text) > self.archive.ingest.max_chars:
            raise EmbeddingError(
                f"message {base.message_id!r} is {len(base.text)} characters long; the "
                f"archive's limit is max_chars={self.archive.ingest.max_chars}"
            )
        stored = base.model_copy(update={"metadata": {**base.metadata, "importance": value}})
        return stored, value

    def add(self, message: Message | str, importance: float | None = None, **fields: Any) -> str:
        """Add a message; returns its id.

        A str becomes ``Message.user(text, **fields)``; with a Message, ``fields`` update a
        copy. ``importance`` (in ``[0, 1]``) or else the scorer decides its tier; it is
        stored in ``metadata["importance"]``. Adding to a full working memory moves its
        oldest messages to the archive. System and pinned messages, and tool results whose
        call is in core, go to core whatever their importance.

        Raises:
            ValueError: importance outside ``[0, 1]`` or NaN (also from the scorer).
            TypeError: importance that is not a number.
            DuplicateMessageError: the id is already in one of the tiers.
            EmbeddingError: a text longer than the archive's ``max_chars``.

        Nothing changes when it raises.
        """
        self._check_open()
        stored, value = self._prepare(message, importance, fields)
        mid = stored.message_id
        with self._lock:
            self._check_open()
            if self._tier_locked(mid) is not None:
                raise DuplicateMessageError(f"message_id {mid!r} is already in this memory")
            if (
                stored.is_protected
                or value >= self.core_threshold
                or (stored.role == "tool" and stored.tool_call_id in self._core_calls_locked())
            ):
                self.store.batch([Append(self.core_key, (stored,), copies_of=self.owner)])
                self._core[mid] = stored
                return mid
            moved = self._evict_locked([*self._working, stored])
            copies, evicted = moved if moved is not None else ([], [])
            self._commit_working_locked([stored], copies, evicted)
            return mid

    async def aadd(
        self, message: Message | str, importance: float | None = None, **fields: Any
    ) -> str:
        """Async twin of :meth:`add` (runs in a worker thread)."""
        return await asyncio.to_thread(self.add, message, importance, **fields)

    def promote(self, message_id: str) -> Tier:
        """Move a working or archived message to core; returns ``"core"``.

        The message keeps its ``metadata["importance"]``. A core message stays where it is.

        Raises:
            MessageNotFoundError: no such message.
        """
        self._check_open()
        with self._lock:
            tier = self._tier_locked(message_id)
            if tier is None:
                raise MessageNotFoundError(f"no message {message_id!r} in this memory")
            if tier == "core":
                return "core"
            if tier == "working":
                m = next(w for w in self._working if w.message_id == message_id)
                self.store.batch(
                    [
                        Delete(self.working_key, (message_id,)),
                        Append(self.core_key, (m,), copies_of=self.owner),
                    ]
                )
                self._working = [w for w in self._working if w.message_id != message_id]
                self._working_ids.discard(message_id)
            else:
                m = self.archive.get(message_id)
                self.store.batch([Append(self.core_key, (m,), copies_of=self.owner)])
                self.archive.remove([message_id])
            self._core[message_id] = m
            return "core"

    def demote(self, message_id: str) -> Tier:
        """Move a message one tier down (core to working, working to archive).

        A message demoted to working becomes its newest message. Returns the new tier.

        Raises:
            MessageNotFoundError: no such message.
            ValueError: a system or pinned message (they stay in core), an archived
                message (already the lowest tier), or one with no text to archive.
        """
        self._check_open()
        with self._lock:
            tier = self._tier_locked(message_id)
            if tier is None:
                raise MessageNotFoundError(f"no message {message_id!r} in this memory")
            if tier == "archive":
                raise ValueError(f"message {message_id!r} is already in the archive")
            if tier == "core":
                m = self._core[message_id]
                if m.is_protected:
                    raise ValueError(
                        f"message {message_id!r} is a system or pinned message: it stays in core"
                    )
                moved = self._evict_locked([*self._working, m])
                copies, evicted = moved if moved is not None else ([], [])
                if copies:
                    self.archive.add_many(copies)
                try:
                    ops: list[Append | Delete] = [
                        Delete(self.core_key, (message_id,)),
                        Append(self.working_key, (m,), copies_of=self.owner),
                    ]
                    if evicted:
                        ops.append(Delete(self.working_key, tuple(evicted)))
                    self.store.batch(ops)
                except BaseException:
                    if copies:
                        self.archive.remove([c.message_id for c in copies])
                    raise
                del self._core[message_id]
                gone = set(evicted)
                self._working = [w for w in [*self._working, m] if w.message_id not in gone]
                self._working_ids = {w.message_id for w in self._working}
                return "working"
            m = next(w for w in self._working if w.message_id == message_id)
            copy = self._archival(m)
            if copy is None:
                raise ValueError(f"message {message_id!r} has no text to archive")
            self._commit_working_locked([], [copy], [message_id])
            return "archive"

    def remove(self, ids: str | Iterable[str]) -> int:
        """Delete messages by id from whichever tier holds them; returns how many were removed.

        For privacy requests: they leave the store too. Core and working are deleted in one
        store transaction; archived messages leave the archive (its store, its indexes)
        first, and are put back if that transaction fails, so nothing changes when it raises.
        Unknown ids are ignored.
        Removing an assistant message with tool calls does not remove its tool results: name
        them too.

        Raises:
            TypeError: ``ids`` is not a str or an iterable of str (``ids[i]`` named);
                nothing changed.

        Example:
            >>> from marsys_mem.retrieval.embeddings import HashingEmbedder
            >>> mem = HierarchicalMemory(HashingEmbedder(), working_size=1)
            >>> old, new = mem.add("My PIN is 1234"), mem.add("Lunch at noon")
            >>> mem.tier_of(old), mem.remove([old, "unknown"]), old in mem, len(mem)
            ('archive', 1, False, 1)
            >>> mem.close()
        """
        self._check_open()
        if isinstance(ids, str):
            wanted = [ids]
        elif isinstance(ids, Iterable) and not isinstance(ids, bytes | Mapping):
            wanted = list(ids)
        else:
            raise TypeError(f"ids must be a str or an iterable of str, got {type(ids).__name__}")
        for i, mid in enumerate(wanted):
            if not isinstance(mid, str):
                raise TypeError(f"ids[{i}] must be a str, got {type(mid).__name__} {mid!r}")
        with self._lock:
            self._check_open()
            where = {mid: self._tier_locked(mid) for mid in dict.fromkeys(wanted)}
            core = tuple(mid for mid, tier in where.items() if tier == "core")
            working = tuple(mid for mid, tier in where.items() if tier == "working")
            archived = [mid for mid, tier in where.items() if tier == "archive"]
            copies = [self.archive.get(mid) for mid in archived]
            if copies:
                self.archive.remove(archived)
            ops: list[Append | Delete] = []
            if core:
                ops.append(Delete(self.core_key, core))
            if working:
                ops.append(Delete(self.working_key, working))
            try:
                if ops:
                    self.store.batch(ops)
            except BaseException:
                if copies:  # undo the archive half so nothing changed
                    self.archive.add_many(copies)
                raise
            for mid in core:
                del self._core[mid]
            if working:
                gone = set(working)
                self._working = [w for w in self._working if w.message_id not in gone]
                self._working_ids -= gone
            return len(core) + len(working) + len(archived)

    # ------------------------------------------------------------------ reading
    def core(self) -> list[Message]:
        """Core messages, in the order they entered core."""
        self.sync()
        with self._lock:
            return list(self._core.values())

    def working(self) -> list[Message]:
        """Working messages, oldest first."""
        self.sync()
        with self._lock:
            return list(self._working)

    def tier_of(self, message_id: str) -> Tier | None:
        """Where ``message_id`` lives (``None``: nowhere)."""
        with self._lock:
            return self._tier_locked(message_id)

    def get(self, message_id: str) -> Message:
        """The message ``message_id``, from whichever tier holds it.

        Raises:
            MessageNotFoundError: no such message.
        """
        with self._lock:
            tier = self._tier_locked(message_id)
            if tier == "core":
                return self._core[message_id]
            if tier == "working":
                return next(w for w in self._working if w.message_id == message_id)
        if tier == "archive":
            return self.archive.get(message_id)
        raise MessageNotFoundError(f"no message {message_id!r} in this memory")

    def __contains__(self, message_id: object) -> bool:
        return isinstance(message_id, str) and self.tier_of(message_id) is not None

    def __len__(self) -> int:
        """Messages in all three tiers."""
        with self._lock:
            return len(self._core) + len(self._working) + len(self.archive)

    def archive_search(
        self, query: str, k: int = 5, min_score: float | None = DEFAULT_MIN_SCORE
    ) -> list[ScoredMessage]:
        """Search the archive (dense + keyword hybrid); best first.

        Raises:
            ValueError: an empty query or ``k <= 0``.
        """
        self._check_open()
        return self.archive.search(query, k, min_score)

    async def aarchive_search(
        self, query: str, k: int = 5, min_score: float | None = DEFAULT_MIN_SCORE
    ) -> list[ScoredMessage]:
        """Async twin of :meth:`archive_search`."""
        self._check_open()
        return await self.archive.asearch(query, k, min_score)

    # ------------------------------------------------------------------ context
    def context(
        self,
        query: str | None = None,
        *,
        k: int = 3,
        policy: ContextPolicy | None = None,
    ) -> list[Message]:
        """Core, then archived snippets for ``query`` (one system message), then working.

        Only the policy's limits are used (``max_tokens``, ``max_messages``, counted with
        its ``token_counter`` or the memory's counter). To fit them, the lowest-ranked
        snippets are dropped first, then the oldest working messages (a tool call with its
        results, and never an orphan tool result); core is always kept.

        Raises:
            ContextOverflowError: core alone does not fit the policy (with the numbers).
            ValueError: an empty query or ``k <= 0``.
        """
        self._check_open()
        hits = self.archive_search(query, k) if query is not None else []
        return self._assemble(hits, policy)

    async def acontext(
        self,
        query: str | None = None,
        *,
        k: int = 3,
        policy: ContextPolicy | None = None,
    ) -> list[Message]:
        """Async twin of :meth:`context`."""
        self._check_open()
        hits = await self.aarchive_search(query, k) if query is not None else []
        return self._assemble(hits, policy)

    def _assemble(self, hits: list[ScoredMessage], policy: ContextPolicy | None) -> list[Message]:
        if policy is not None and not isinstance(policy, ContextPolicy):
            raise TypeError(f"policy must be a ContextPolicy, got {type(policy).__name__}")
        with self._lock:
            core = list(self._core.values())
            working = list(self._working)
        units = [u for u in _units(working) if u[0] >= 0]  # orphan tool results: never sent
        max_t = policy.max_tokens if policy is not None else None
        max_m = policy.max_messages if policy is not None else None
        counter = (
            get_counter(policy.token_counter)
            if policy is not None and policy.token_counter is not None
            else self.counter
        )

        def cost(messages: Sequence[Message]) -> int:
            return sum(count_message(counter, m) for m in messages)

        core_t = cost(core)
        if max_t is not None and core_t > max_t:
            raise ContextOverflowError(
                f"core memory ({len(core)} messages) needs {core_t} tokens but the limit is "
                f"{max_t} (over by {core_t - max_t})",
                required=core_t,
                limit=max_t,
                unit="tokens",
            )
        if max_m is not None and len(core) > max_m:
            raise ContextOverflowError(
                f"core memory needs {len(core)} messages but the limit is {max_m} "
                f"(over by {len(core) - max_m})",
                required=len(core),
                limit=max_m,
                unit="messages",
            )
        tokens_left = math.inf if max_t is None else max_t - core_t
        messages_left = math.inf if max_m is None else max_m - len(core)
        sendable = sorted(p for u in units for p in u)
        working_t = cost([working[p] for p in sendable])
        snippet: Message | None = None
        for n in range(len(hits), 0, -1):  # the lowest-ranked snippets go first
            candidate = _snippet_message(hits[:n])
            t = count_message(counter, candidate)
            if t + working_t <= tokens_left and 1 + len(sendable) <= messages_left:
                snippet = candidate
                break
        if snippet is not None:
            return [*core, snippet, *(working[p] for p in sendable)]
        kept: list[int] = []
        for unit in reversed(units):  # newest first; stop at the first that does not fit
            t = cost([working[p] for p in unit])
            if t > tokens_left or len(unit) > messages_left:
                break
            kept.extend(unit)
            tokens_left -= t
            messages_left -= len(unit)
        return [*core, *(working[p] for p in sorted(kept))]

    # ------------------------------------------------------------------ lifecycle
    def flush(self, timeout: float | None = None) -> None:
        """Wait for the archive's pending embeddings and save its index."""
        self._check_open()
        self.archive.flush(timeout)

    async def aflush(self, timeout: float | None = None) -> None:
        """Async twin of :meth:`flush`."""
        await asyncio.to_thread(self.flush, timeout)

    def close(self) -> None:
        """Close the archive and store this memory made (not ones it was given). Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            archive = getattr(self, "archive", None)
            if archive is not None and self._own_archive:
                archive.close()
        finally:
            if self._own_store:
                self.store.close()

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def __repr__(self) -> str:
        return (
            f"HierarchicalMemory(core={len(self._core)}, working={len(self._working)}, "
            f"archive={len(self.archive)}, core_threshold={self.core_threshold}, "
            f"working_size={self.working_size})"
        )
