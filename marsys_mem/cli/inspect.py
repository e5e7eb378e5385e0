"""Looking inside a SQLite store: what it holds, and searching it.

:func:`inspect_store` summarises a store file (``marsys-mem inspect``): every
``(namespace, agent, branch)`` conversation with its message count and last activity,
the runs, the memory-pattern keys (RAG, episodes, tiers), and the facts a workflow run
recorded. :func:`search_store` searches the stored messages and facts (``marsys-mem
search``): BM25 over the conversations, or the agents' persisted RAG memory (dense + BM25)
when there is one and the embeddings extra is installed; the facts a workflow run recorded
are searched the same way beside them, and their hits say ``kind="fact"``.

Keys other than conversations are internal (:func:`marsys_mem.store.keys.parse_key`): pattern
data (``rag``, ``episodes``, ``tiers``), the facts of workflow runs (agent ``#facts``), the
facts learned about subjects (``user-facts``) and the threads held with them (``threads``).
Keys whose names break the naming rule (written before it existed) are listed as
``invalid``; they stay readable but are not searched.

Both read without writing (the store is opened read-only, an older schema read as it is) and
row by row: a row that does not validate is skipped and reported (:class:`InvalidRow`),
never failing the whole read, and a conversation's last message is previewed from the
first bytes of its row, whatever its size.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from marsys_mem.exceptions import StoreError, StoreNotFoundError
from marsys_mem.model.facts import SharedFact
from marsys_mem.model.messages import Message
from marsys_mem.patterns.agent import index_file
from marsys_mem.patterns.rag import RAGMemory
from marsys_mem.retrieval.bm25 import BM25Index
from marsys_mem.retrieval.calibration import DEFAULT_MIN_SCORE, bm25_ceiling, calibrated
from marsys_mem.retrieval.embeddings import Embedder, default_embedder
from marsys_mem.retrieval.scoring import ScoredMessage
from marsys_mem.store.base import Key
from marsys_mem.store.keys import KeyInfo, parse_key
from marsys_mem.store.rows import StoredRow, error_reason
from marsys_mem.store.sqlite import SCHEMA_VERSION, SQLiteStore
from marsys_mem.workflow.runner import LOST_TO

__all__ = [
    "ConversationSummary",
    "InternalKeySummary",
    "InvalidRow",
    "SearchHit",
    "StoreSummary",
    "StoredFact",
    "find_store",
    "inspect_store",
    "search_store",
]

log = logging.getLogger("marsys_mem.cli.inspect")

SearchMode = Literal["auto", "bm25", "hybrid"]

PREVIEW_BYTES = 64 * 1024
"""A row larger than this is not loaded to preview it: its first bytes are read."""
_PREVIEW_ROWS = 4  # newest rows read per key (the newest valid one is previewed)
_PREVIEW_CHARS = 200
_Source = Literal["bm25", "rag"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ConversationSummary(_Model):
    """One agent's conversation on one branch.

    Example:
        >>> ConversationSummary(namespace="default", agent="a", branch="main", messages=3,
        ...                     runs=1).key
        'a@main'
    """

    namespace: str
    agent: str
    branch: str
    messages: int
    runs: int = 0
    last_message: datetime | None = None
    last_text: str | None = None

    @property
    def key(self) -> str:
        """``agent@branch``."""
        return f"{self.agent}@{self.branch}"


class InternalKeySummary(_Model):
    """A key holding pattern data (``rag``, ``episodic``, ``hierarchical``) or facts.

    ``kind`` is ``invalid`` for a key whose names break the naming rule (an older store).

    Example:
        >>> InternalKeySummary(namespace="d", agent="a", branch="main#rag", kind="rag",
        ...                    messages=4).kind
        'rag'
    """

    namespace: str
    agent: str
    branch: str
    kind: str
    messages: int


class InvalidRow(_Model):
    """A stored row that does not validate, skipped by ``inspect`` or ``search``.

    ``kind``: a ``message`` row (``id`` its message id), a ``run`` snapshot (``id`` the
    run id; ``agent`` and ``branch`` are empty) or a recorded ``fact`` (in a message row).

    Example:
        >>> InvalidRow(namespace="d", agent="a", branch="main", id="m1",
        ...            reason="Invalid JSON").described
        'key d/a@main, id m1: Invalid JSON'
    """

    namespace: str
    agent: str
    branch: str
    id: str
    reason: str
    kind: Literal["message", "run", "fact"] = "message"

    @property
    def described(self) -> str:
        """Where the row is and why it is invalid, in one line."""
        where = f"{self.agent}@{self.branch}" if self.agent else self.kind
        return f"key {self.namespace}/{where}, id {self.id}: {self.reason}"


class StoredFact(_Model):
    """A fact a workflow run recorded (agent ``#facts``).

    Example:
        >>> StoredFact(namespace="d", branch="main", text="Q4 grew 12%", source_agent="r",
        ...            source_branch="r1", scope="lineage").source_agent
        'r'
    """

    namespace: str
    branch: str
    text: str
    source_agent: str
    source_branch: str
    scope: str
    confidence: float = 1.0
    topic: str | None = None
    merged_from: str | None = None
    lost_to: str | None = Field(
        default=None,
        description="A conflict on its topic on this branch kept another fact: which "
        "(agent@branch: text).",
    )


class StoreSummary(_Model):
    """What a store holds (``marsys-mem inspect``).

    Example:
        >>> StoreSummary(path="m.db", namespaces=[]).messages
        0
    """

    path: str
    integrity: str = "ok"
    schema_version: int = SCHEMA_VERSION
    namespaces: list[str]
    conversations: list[ConversationSummary] = Field(default_factory=list)
    internal: list[InternalKeySummary] = Field(default_factory=list)
    facts: list[StoredFact] = Field(default_factory=list)
    runs: int = Field(default=0, description="Runs of the conversations (not pattern episodes).")
    invalid: list[InvalidRow] = Field(
        default_factory=list, description="Rows read that do not validate (skipped)."
    )

    @property
    def messages(self) -> int:
        """Messages in all conversations."""
        return sum(c.messages for c in self.conversations)

    @property
    def agents(self) -> list[str]:
        """Every agent the store holds something of, sorted.

        A conversation, pattern data (RAG, episodes, tiers) or a fact it shared: a store
        whose agents kept session memory only still holds the facts they shared.
        """
        names = {c.agent for c in self.conversations}
        names |= {f.source_agent for f in self.facts}
        for i in self.internal:
            info = _info((i.namespace, i.agent, i.branch))
            if info is not None and info.agent is not None:
                names.add(info.agent)
        return sorted(names)

    @property
    def branches(self) -> list[str]:
        """Every branch the store holds something of (as :attr:`agents`), sorted."""
        names = {c.branch for c in self.conversations}
        names |= {b for f in self.facts for b in (f.branch, f.source_branch)}
        for i in self.internal:
            info = _info((i.namespace, i.agent, i.branch))
            if info is not None and info.kind in ("rag", "episodes", "tiers", "facts"):
                names.add(info.branch)
        return sorted(names)


class SearchHit(_Model):
    """A search result: the message or fact, where it is stored, and its score.

    ``kind="fact"``: a fact a workflow run recorded (``role`` is ``"fact"``, ``agent`` and
    ``branch`` the agent that shared it and the branch it was recorded on, ``message_id``
    the fact's id, ``timestamp`` when it was shared). ``lost_to``: the fact lost a
    conflict on its topic (a merge kept another): where, and the fact that won.

    Example:
        >>> SearchHit(rank=1, score=2.5, agent="a", branch="main", role="user",
        ...           text="hi", message_id="m1").where
        'a@main'
    """

    rank: int
    score: float
    agent: str
    branch: str
    role: str
    text: str
    message_id: str
    timestamp: datetime | None = None
    source: Literal["bm25", "rag"] = "bm25"
    kind: Literal["message", "fact"] = "message"
    lost_to: str | None = Field(
        default=None,
        description="A fact that lost a conflict on its topic: 'on BRANCH to AGENT@BRANCH: "
        "winner text'.",
    )

    @property
    def where(self) -> str:
        """``agent@branch``."""
        return f"{self.agent}@{self.branch}"


def find_store(path: str | Path) -> Path:
    """The SQLite file at ``path``: the file, or the ``memory.db`` of a folder.

    In a folder (such as ``.marsys_mem/`` or a ``--store`` folder) without ``memory.db``,
    the only ``*.db`` file.

    Raises:
        StoreNotFoundError: nothing there (nothing is created).
    """
    path = Path(path)
    if path.is_file():
        return path
    if path.is_dir():
        default = path / "memory.db"
        if default.is_file():
            return default
        found = sorted(path.glob("*.db"))
        if len(found) == 1:
            return found[0]
        if found:
            names = ", ".join(p.name for p in found)
            raise StoreNotFoundError(f"{path}: several stores here ({names}); name one")
        raise StoreNotFoundError(f"{path}: no store here (no memory.db or *.db file)")
    raise StoreNotFoundError(f"{path}: no such store file or folder")


def _open(path: str | Path) -> SQLiteStore:
    file = find_store(path)
    try:
        return SQLiteStore(file, read_only=True)  # inspection never writes
    except StoreError as exc:
        raise StoreError(f"{file}: not a marsys-mem store ({exc})") from exc


_KINDS = {
    "rag": "rag",
    "episodes": "episodic",
    "tiers": "hierarchical",
    "facts": "facts",
    "user_facts": "user-facts",
    "threads": "threads",
}


def _info(key: Key) -> KeyInfo | None:
    """What ``key`` holds (``None``: names that break the naming rule)."""
    try:
        return parse_key(key)
    except ValueError:
        return None


def _internal_kind(key: Key) -> str | None:
    """``None`` for a conversation, else the kind shown by ``inspect``."""
    info = _info(key)
    if info is None:
        return "invalid"
    return _KINDS.get(info.kind)


def _lost_to(key: Key, message: Message) -> str | None:
    """``on BRANCH to AGENT@BRANCH: text`` for a recorded fact that lost a conflict there."""
    won = message.metadata.get(LOST_TO)
    if not isinstance(won, dict):
        return None
    who = f"{won.get('agent', '?')}@{won.get('branch', '?')}"
    return f"on {key[2]} to {who}: {' '.join(str(won.get('text', '')).split())}"


def _stored_fact(
    key: Key, data: object, lost_to: str | None = None
) -> tuple[StoredFact | None, str]:
    """The fact a ``#facts`` row records, or ``None`` and why not."""
    try:
        fact = SharedFact.model_validate(data)
    except ValidationError as exc:
        return None, f"the recorded fact does not validate: {error_reason(exc)}"
    topic = fact.metadata.get("topic")
    merged = fact.metadata.get("merged_from")
    return StoredFact(
        namespace=key[0],
        branch=key[2],
        text=fact.text,
        source_agent=fact.source_agent,
        source_branch=fact.source_branch,
        scope=fact.scope,
        confidence=fact.confidence,
        topic=str(topic) if topic is not None else None,
        merged_from=str(merged) if merged is not None else None,
        lost_to=lost_to,
    ), ""


def _invalid(key: Key, row: StoredRow) -> InvalidRow:
    return InvalidRow(
        namespace=key[0],
        agent=key[1],
        branch=key[2],
        id=row.message_id,
        reason=row.error or "invalid",
    )


def _preview(text: str) -> str:
    """The beginning of ``text`` on one line (only the beginning is ever split)."""
    return " ".join(text[: _PREVIEW_CHARS * 2].split())[:_PREVIEW_CHARS]


def inspect_store(path: str | Path) -> StoreSummary:
    """Summarise the store at ``path`` (a SQLite file or a folder holding one).

    Nothing is written; rows that do not validate are skipped and listed in
    :attr:`StoreSummary.invalid` (those read: each key's newest rows, the recorded facts
    and the runs).

    Raises:
        StoreNotFoundError: no store there.
        StoreError: the file is not a marsys-mem store.
    """
    with _open(path) as store:
        keys = store.list_keys()
        conversations: list[ConversationSummary] = []
        internal: list[InternalKeySummary] = []
        facts: list[StoredFact] = []
        invalid: list[InvalidRow] = []
        runs_by: dict[Key, int] = {}
        namespaces = sorted({k[0] for k in keys})
        total_runs = 0
        for ns in namespaces:
            for run_id in store.list_runs(namespace=ns):
                try:
                    snap = store.load_run(run_id)
                except StoreError as exc:  # a snapshot that does not validate
                    cause = exc.__cause__
                    reason = error_reason(cause) if isinstance(cause, Exception) else str(exc)
                    invalid.append(
                        InvalidRow(
                            namespace=ns, agent="", branch="", id=run_id, reason=reason, kind="run"
                        )
                    )
                    continue
                if snap is not None and _internal_kind((ns, snap.agent, snap.branch)) is None:
                    runs_by[(ns, snap.agent, snap.branch)] = (
                        runs_by.get((ns, snap.agent, snap.branch), 0) + 1
                    )
                    total_runs += 1
        for key in keys:
            count = store.count_messages(key)
            kind = _internal_kind(key)
            if kind == "facts":
                for row in store.read_rows(key):
                    if row.message is None:
                        invalid.append(_invalid(key, row))
                        continue
                    fact, why = _stored_fact(
                        key, row.message.metadata.get("fact"), _lost_to(key, row.message)
                    )
                    if fact is not None:
                        facts.append(fact)
                    else:
                        invalid.append(
                            _invalid(key, row).model_copy(update={"reason": why, "kind": "fact"})
                        )
            if kind is not None:
                internal.append(
                    InternalKeySummary(
                        namespace=key[0], agent=key[1], branch=key[2], kind=kind, messages=count
                    )
                )
                continue
            # the newest rows, each read only up to PREVIEW_BYTES (a huge row is not loaded)
            rows = store.read_rows(key, last=_PREVIEW_ROWS, max_bytes=PREVIEW_BYTES)
            invalid.extend(_invalid(key, row) for row in rows if not row.valid)
            last = next((row for row in reversed(rows) if row.valid), None)
            conversations.append(
                ConversationSummary(
                    namespace=key[0],
                    agent=key[1],
                    branch=key[2],
                    messages=count,
                    runs=runs_by.get(key, 0),
                    last_message=last.timestamp if last else None,
                    last_text=_preview(last.preview) if last else None,
                )
            )
        return StoreSummary(
            path=str(store.path),
            integrity=store.integrity_check(),
            schema_version=store.schema_version,
            namespaces=namespaces,
            conversations=conversations,
            internal=internal,
            facts=facts,
            runs=total_runs,
            invalid=invalid,
        )


def _index_file(db: Path, key: Key) -> Path:
    """Where ``AgentPatterns`` saves the RAG index of a SQLite-backed agent."""
    conversation = parse_key(key).conversation
    assert conversation is not None
    return index_file(db.parent / "indexes", conversation, "rag")


def _branch(key: Key) -> str:
    """The conversation branch a key belongs to (its branch, or the one its data is of)."""
    info = _info(key)
    return info.branch if info is not None else key[2]


def search_store(
    path: str | Path,
    query: str,
    *,
    agent: str | None = None,
    branch: str | None = None,
    namespace: str | None = None,
    k: int = 5,
    mode: SearchMode = "auto",
    status: Callable[[str], None] | None = None,
    on_invalid: Callable[[InvalidRow], None] | None = None,
    min_score: float | None = DEFAULT_MIN_SCORE,
) -> tuple[list[SearchHit], str]:
    """Search the stored messages and facts for ``query``; returns ``(hits, how)``.

    ``mode``: ``bm25`` (keywords over the conversations), ``hybrid`` (the agents'
    persisted RAG memory, dense + BM25; needs the embeddings extra and an agent with
    ``patterns: {rag: ...}``), or ``auto`` (hybrid when possible, else BM25). ``how``
    says which ran. ``status(text)`` is called before slow work (loading the model).
    A stored row that does not validate is skipped, and given to ``on_invalid``.

    The facts workflow runs recorded are searched too, ranked with the messages the same
    way (in BM25's one index, or by the same hybrid retrieval); their hits have
    ``kind="fact"``. ``agent`` filters facts by the agent that shared them, ``branch`` by
    the branch they were recorded on. A fact recorded on several branches (merged) is one
    hit, on the branch it was shared on; one that lost a conflict on its topic on some
    branch (a merge kept another) says where and to what (:attr:`SearchHit.lost_to`).

    Scores are calibrated (:mod:`~marsys_mem.retrieval.calibration`: a probability of
    relevance, one scale for every memory), so every memory's hits merge by score; hits
    below ``min_score`` are left out (``None``: keep all).

    Raises:
        ValueError: an empty query, ``k < 1``, or ``min_score`` not a number from 0 to 1.
        StoreNotFoundError: no store there.
    """
    if not isinstance(query, str) or not query.strip():
        raise ValueError("the query must be a non-empty string")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if min_score is not None and (
        isinstance(min_score, bool)
        or not isinstance(min_score, int | float)
        or not 0.0 <= min_score <= 1.0
    ):
        raise ValueError(f"min_score must be a number from 0 to 1, got {min_score!r}")
    with _open(path) as store:
        all_keys = store.list_keys(namespace)
        keys = [
            key for key in all_keys if agent in (None, key[1]) and branch in (None, _branch(key))
        ]
        skipped = on_invalid or (lambda row: None)
        facts, lost = _facts(store, all_keys, agent, branch, skipped)
        rag_keys = [key for key in keys if _internal_kind(key) == "rag"]
        how = "bm25"
        if mode != "bm25" and rag_keys:
            embedder = default_embedder()
            if embedder is None:
                how = "bm25 (the embeddings extra is not installed)"
            else:
                if status is not None:
                    status("loading the embedding model and the RAG indexes")
                try:
                    hits = _search_rag(store, rag_keys, facts, lost, query, k, embedder, min_score)
                    return hits, "hybrid (RAG index)"
                except StoreError as exc:
                    if not isinstance(exc.__cause__, ValidationError):
                        raise
                for key in rag_keys:  # a RAG memory loads whole: report its bad rows
                    _valid_messages(store, key, skipped)
                how = "bm25 (a RAG memory holds rows that do not validate)"
        elif mode == "hybrid":
            how = "bm25 (no agent in this store has a RAG memory)"
        conv_keys = [key for key in keys if _internal_kind(key) is None]
        hits = _search_bm25(store, conv_keys, facts, lost, query, k, skipped, min_score)
        return hits, how


def _valid_messages(
    store: SQLiteStore, key: Key, skipped: Callable[[InvalidRow], None]
) -> list[Message]:
    """The messages under ``key`` that validate; the others go to ``skipped``."""
    messages = []
    for row in store.read_rows(key):
        if row.message is None:
            skipped(_invalid(key, row))
        else:
            messages.append(row.message)
    return messages


def _facts(
    store: SQLiteStore,
    keys: list[Key],
    agent: str | None,
    branch: str | None,
    skipped: Callable[[InvalidRow], None],
) -> tuple[list[tuple[str, SharedFact]], dict[str, str]]:
    """``(branch, fact)`` of the facts recorded in ``keys``: each fact once, filtered.

    A fact recorded on several branches (merged) is given on the branch it was shared on
    when it is recorded there, else on the first one. Also returns, by fact id, how the
    facts that lost a conflict on a branch lost (any branch's record, whatever the
    filter: a fact found on its own branch may have lost a merge into another).
    """
    found: dict[str, tuple[str, SharedFact]] = {}
    lost: dict[str, str] = {}
    for key in keys:
        if _internal_kind(key) != "facts":
            continue
        if branch not in (None, key[2]):
            for m in _valid_messages(store, key, lambda row: None):
                how = _lost_to(key, m)
                fid = m.message_id.removeprefix("fact_")
                if how is not None:
                    lost.setdefault(fid, how)
            continue
        for m in _valid_messages(store, key, skipped):
            try:
                fact = SharedFact.model_validate(m.metadata.get("fact"))
            except ValidationError as exc:
                reason = f"the recorded fact does not validate: {error_reason(exc)}"
                skipped(
                    InvalidRow(
                        namespace=key[0],
                        agent=key[1],
                        branch=key[2],
                        id=m.message_id,
                        reason=reason,
                        kind="fact",
                    )
                )
                continue
            how = _lost_to(key, m)
            if how is not None:
                lost.setdefault(fact.id, how)
            if agent not in (None, fact.source_agent):
                continue
            if fact.id not in found or key[2] == fact.source_branch:
                found[fact.id] = (key[2], fact)
    return list(found.values()), lost


def _fact_hit(
    rank: int,
    score: float,
    branch: str,
    fact: SharedFact,
    source: _Source,
    lost: dict[str, str],
) -> SearchHit:
    return SearchHit(
        rank=rank,
        score=round(float(score), 4),
        agent=fact.source_agent,
        branch=branch,
        role="fact",
        text=" ".join(fact.text.split()),
        message_id=fact.id,
        timestamp=fact.created_at,
        source=source,
        kind="fact",
        lost_to=lost.get(fact.id),
    )


def _search_bm25(
    store: SQLiteStore,
    keys: list[Key],
    facts: list[tuple[str, SharedFact]],
    lost: dict[str, str],
    query: str,
    k: int,
    skipped: Callable[[InvalidRow], None],
    min_score: float | None = DEFAULT_MIN_SCORE,
) -> list[SearchHit]:
    index = BM25Index()
    found: dict[str, tuple[Key, Message] | tuple[str, SharedFact]] = {}
    for key in keys:
        for m in _valid_messages(store, key, skipped):
            text = m.text
            if not text.strip():
                continue
            doc_id = f"{len(found)}"
            found[doc_id] = (key, m)
            index.add(doc_id, text)
    for recorded in facts:
        doc_id = f"{len(found)}"
        found[doc_id] = recorded
        index.add(doc_id, recorded[1].text)
    ranked = index.search(query, k=k)
    ceiling = bm25_ceiling(index.doc_freqs(query).values(), len(index), index.k1)
    scores = [s for _, s in ranked]
    calibrated_scores = calibrated(scores, [None] * len(scores), scores, ceiling, mode="bm25")
    hits = []
    for rank, ((doc_id, _), score) in enumerate(zip(ranked, calibrated_scores, strict=True), 1):
        if min_score is not None and score < min_score:
            break  # calibrated in ranking order: nothing later passes
        where, item = found[doc_id]
        if isinstance(item, SharedFact):
            assert isinstance(where, str)
            hits.append(_fact_hit(rank, score, where, item, "bm25", lost))
        else:
            assert isinstance(where, tuple)
            hits.append(_hit(rank, score, where, item, "bm25"))
    return hits


def _hit(rank: int, score: float, key: Key, msg: Message, source: _Source) -> SearchHit:
    return SearchHit(
        rank=rank,
        score=round(float(score), 4),
        agent=key[1],
        branch=_branch(key),
        role=msg.role,
        text=" ".join(msg.text.split()),
        message_id=msg.message_id,
        timestamp=msg.timestamp,
        source=source,
    )


def _search_rag(
    store: SQLiteStore,
    keys: list[Key],
    facts: list[tuple[str, SharedFact]],
    lost: dict[str, str],
    query: str,
    k: int,
    embedder: Embedder,
    min_score: float | None = DEFAULT_MIN_SCORE,
) -> list[SearchHit]:
    db = Path(store.path)
    # every memory's hits, merged by their calibrated scores (one scale for all memories)
    found: list[tuple[ScoredMessage, Key | str, Message | SharedFact]] = []
    for key in keys:
        saved = _index_file(db, key)
        rag = RAGMemory(
            embedder,
            store=store,
            key=key,
            index_path=saved if saved.is_file() else None,
        )
        try:
            rag.flush()  # messages without a saved vector are embedded first
            found.extend((hit, key, hit.message) for hit in rag.search(query, k, min_score))
        finally:
            rag.close()
    if facts:  # ranked by the same hybrid retrieval, in a memory of their own (not saved)
        rag = RAGMemory(embedder)
        try:
            ids = rag.add_many(fact.text for _, fact in facts)  # embedded in one batch
            by_id = dict(zip(ids, facts, strict=True))
            for hit in rag.search(query, k, min_score):
                scope, fact = by_id[hit.message.message_id]
                found.append((hit, scope, fact))
        finally:
            rag.close()
    found.sort(key=lambda f: -f[0].score)  # stable: a memory's own order on ties
    ranked = [(h.score, where, item) for h, where, item in found]
    hits = []
    for rank, (score, where, item) in enumerate(ranked[:k], 1):
        if isinstance(item, SharedFact):
            assert isinstance(where, str)
            hits.append(_fact_hit(rank, score, where, item, "rag", lost))
        else:
            assert isinstance(where, tuple)
            hits.append(_hit(rank, score, where, item, "rag"))
    return hits
