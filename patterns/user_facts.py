"""FactMemory: durable facts about a subject (a user, an agent or a team), learned over time.

A fact is one short statement with a category, a confidence in ``[0, 1]``, the ids of the
messages it came from and its validity. Restatements reinforce a fact instead of copying
it; a contradiction invalidates the old fact but keeps it queryable (``history``,
``as_of``); ``forget`` deletes for real. With a store every change is written through
before memory changes, in one store transaction.

Guide (the life of a fact, storage, search): ``docs/guides/facts.md#the-life-of-a-fact``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal, Never

import numpy as np
import numpy.typing as npt
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, field_validator

from marsys_mem.exceptions import MessageNotFoundError, StoreError
from marsys_mem.lifecycle import Closing
from marsys_mem.model.messages import Message
from marsys_mem.model.names import validate_name
from marsys_mem.patterns.store_search import text_pages
from marsys_mem.retrieval.bm25 import BM25Index, score_with_stats
from marsys_mem.retrieval.calibration import (
    DEFAULT_MIN_SCORE,
    EVIDENCE_DEPTH,
    bm25_ceiling,
    calibrated,
)
from marsys_mem.retrieval.embeddings import Embedder, HashingEmbedder, default_embedder
from marsys_mem.retrieval.scoring import check_query, finite_number, positive_int
from marsys_mem.store.base import (
    Append,
    Delete,
    Key,
    Load,
    LoadVectors,
    MemoryStore,
    PutVectors,
    validate_key,
)
from marsys_mem.store.keys import SUBJECT_FACTS_AGENT, subject_facts_key
from marsys_mem.store.owners import DeletionFeed, Source
from marsys_mem.store.vectors import MAX_MODEL_CHARS

__all__ = [
    "Fact",
    "FactCandidate",
    "FactCategory",
    "FactChange",
    "FactMemory",
    "FactSource",
    "MaintenanceReport",
    "ScoredFact",
    "slot_rule",
]

log = logging.getLogger("marsys_mem.patterns.user_facts")


FactCategory = Literal["identity", "preference", "relation", "plan", "other"]

_Text = Annotated[str, Field(min_length=1, max_length=2000)]
_Confidence = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]


def _norm(text: str) -> str:
    return " ".join(text.lower().split()).rstrip(".!")


class FactCandidate(BaseModel):
    """A fact an extractor proposes; :meth:`FactMemory.add` decides what it becomes.

    Attributes:
        text: the statement, e.g. ``"User's name is Alice"``.
        category: ``identity``, ``preference``, ``relation``, ``plan`` or ``other``.
        confidence: how sure the extractor is, in ``[0, 1]``.
        slot: the attribute the fact sets (``"name"``, ``"home"``, ``"likes:coffee"``);
            two facts with the same slot and different text contradict (:func:`slot_rule`).
        source_ids: the ids of the messages it was extracted from.
        subject: whose fact it is, when the extractor knows (else the caller's subject).
        at: when it was stated (default: the memory's clock).

    Example:
        >>> FactCandidate(text="User's name is Alice", category="identity", slot="name").slot
        'name'
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    text: _Text
    category: FactCategory = "other"
    confidence: _Confidence = 0.7
    slot: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    source_ids: tuple[str, ...] = ()
    subject: str | None = None
    at: AwareDatetime | None = None

    @field_validator("text")
    @classmethod
    def _strip(cls, value: str) -> str:
        stripped = value.strip()
        if not stripped:
            raise ValueError("text must not be blank")
        return stripped


class FactSource(BaseModel):
    """A message a fact was learned from: its conversation's store key and its id.

    Example:
        >>> FactSource(key=("d", "alice", "main"), message_id="m1").key[1]
        'alice'
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: tuple[str, str, str]
    message_id: str


class Fact(BaseModel):
    """One stored fact, with its confidence, sources and validity.

    Attributes:
        fact_id: stable id (also the ``message_id`` of its store record).
        subject: whose fact it is.
        text: the statement.
        category: see :class:`FactCandidate`.
        confidence: current confidence in ``[0, 1]`` (decay applied by ``maintain``).
        slot: the attribute it sets, or ``None``.
        source_ids: ids of the messages it was stated or reinforced in.
        sources: those messages with their store keys, where known: when every one of
            them is deleted (forget, ttl, bound, end of session), the fact is deleted too.
        created_at: when it was first learned.
        reinforced_at: when it was last stated or restated.
        decay_periods: full ``decay_after`` periods already applied since ``reinforced_at``.
        reinforcements: how often it was restated.
        valid_from: since when it holds.
        invalid_at: when a contradicting fact replaced it (``None``: still valid).
        supersedes: the fact it replaced; superseded_by: the fact that replaced it.
        embedding: its vector, with ``embedder`` the name of the model that made it.

    Example:
        >>> from datetime import UTC, datetime
        >>> t = datetime(2025, 1, 1, tzinfo=UTC)
        >>> f = Fact(fact_id="f1", subject="alice", text="User likes tea", created_at=t,
        ...          reinforced_at=t, valid_from=t)
        >>> f.is_valid, f.valid_at(t)
        (True, True)
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    fact_id: _Text
    subject: _Text
    text: _Text
    category: FactCategory = "other"
    confidence: _Confidence = 0.7
    slot: str | None = None
    source_ids: tuple[str, ...] = ()
    sources: tuple[FactSource, ...] = ()
    created_at: AwareDatetime
    reinforced_at: AwareDatetime
    decay_periods: Annotated[int, Field(ge=0)] = 0
    reinforcements: Annotated[int, Field(ge=0)] = 0
    valid_from: AwareDatetime
    invalid_at: AwareDatetime | None = None
    supersedes: str | None = None
    superseded_by: str | None = None
    embedding: tuple[float, ...] | None = Field(default=None, repr=False)
    embedder: str | None = None

    @property
    def is_valid(self) -> bool:
        """Not invalidated by a contradiction."""
        return self.invalid_at is None

    def valid_at(self, when: datetime) -> bool:
        """Whether the fact was believed at ``when`` (``valid_from <= when < invalid_at``)."""
        return self.valid_from <= when and (self.invalid_at is None or when < self.invalid_at)


@dataclass(frozen=True, slots=True)
class FactChange:
    """What :meth:`FactMemory.add` did.

    Attributes:
        action: ``"added"`` (a new fact), ``"reinforced"`` (a restatement of ``fact``) or
            ``"superseded"`` (a new ``fact`` that invalidated ``invalidated``).
        fact: the fact added or reinforced, as stored now.
        invalidated: the facts it closed (``superseded`` only).
    """

    action: Literal["added", "reinforced", "superseded"]
    fact: Fact
    invalidated: tuple[Fact, ...] = ()


@dataclass(frozen=True, slots=True)
class ScoredFact:
    """One search hit: the fact, its calibrated score, cosine and BM25 score, rank (1: best).

    ``score`` is a probability of relevance on the scale of every search
    (:mod:`~marsys_mem.retrieval.calibration`), so facts and messages merge by it.
    """

    fact: Fact
    score: float
    dense_score: float
    bm25_score: float
    rank: int = 1

    @property
    def text(self) -> str:
        """The fact's text."""
        return self.fact.text


@dataclass(frozen=True, slots=True)
class MaintenanceReport:
    """What :meth:`FactMemory.maintain` changed: ids decayed and pruned."""

    decayed: tuple[str, ...] = ()
    pruned: tuple[str, ...] = ()
    at: datetime = field(default_factory=lambda: datetime.now(UTC))


ContradictionRule = Callable[[Fact, FactCandidate], bool]


def slot_rule(existing: Fact, candidate: FactCandidate) -> bool:
    """The default contradiction rule: same slot, different statement.

    Facts without a slot never contradict by this rule (pass your own ``contradicts``,
    e.g. one that asks an LLM, to decide those).

    Example:
        >>> from datetime import UTC, datetime
        >>> t = datetime(2025, 1, 1, tzinfo=UTC)
        >>> old = Fact(fact_id="f", subject="u", text="User lives in Paris", slot="home",
        ...            created_at=t, reinforced_at=t, valid_from=t)
        >>> slot_rule(old, FactCandidate(text="User lives in Berlin", slot="home"))
        True
    """
    return (
        existing.slot is not None
        and existing.slot == candidate.slot
        and _norm(existing.text) != _norm(candidate.text)
    )


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _positive_delta(name: str, value: object) -> timedelta:
    if not isinstance(value, timedelta) or value <= timedelta(0):
        raise ValueError(f"{name} must be a positive timedelta, got {value!r}")
    return value


def _unit(name: str, value: object) -> float:
    number = finite_number(name, value, minimum=0.0)
    if number > 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return number


def _one_subject(
    subject: str | None, user_id: str | None, agent_id: str | None, *, required: bool = True
) -> str | None:
    """The subject given as ``subject``, ``user_id`` or ``agent_id`` (at most one).

    ``None`` when none is given and none is ``required``; else ValueError.
    """
    given = {
        name: value
        for name, value in (("subject", subject), ("user_id", user_id), ("agent_id", agent_id))
        if value is not None
    }
    if len(given) > 1 or (required and not given):
        got = ", ".join(f"{k}={v!r}" for k, v in given.items()) or "none"
        raise ValueError(
            f"name whom the facts are about with {'exactly' if required else 'at most'} one "
            f"of subject=, user_id= or agent_id= (got {got})"
        )
    return next(iter(given.values()), None)


class FactMemory(Closing):
    """Durable facts about subjects: dedup by meaning, decay, contradictions kept as history.

    Args:
        embedder: an :class:`~marsys_mem.retrieval.embeddings.Embedder`; ``"default"``:
            the packaged MiniLM when the ``embeddings`` extra is installed, else a
            :class:`~marsys_mem.retrieval.embeddings.HashingEmbedder` (keyword-like, with
            one logged notice).
        store: a :class:`~marsys_mem.store.MemoryStore` to write through to and load from
            (not closed by this memory).
        namespace: the store namespace.
        clock: returns the current time (timezone-aware); tests pass a fake one.
        dedup_threshold: cosine above which a new fact reinforces an existing one.
        contradiction_threshold: cosine at or above which a valid fact is a contradiction
            candidate (facts with the candidate's slot are candidates too).
        contradicts: ``(existing, candidate) -> bool``, the contradiction decision.
        reinforce_step: confidence added by a restatement (capped at 1.0).
        decay_factor: confidence multiplier per ``decay_after`` without reinforcement.
        decay_after: the decay period.
        prune_below: facts under this confidence ...
        prune_after: ... and older than this are deleted by :meth:`maintain`.
        bm25_weight: how much keyword matches raise the search score (0: dense only).

    Example:
        >>> from datetime import UTC, datetime, timedelta
        >>> now = [datetime(2025, 1, 1, tzinfo=UTC)]
        >>> facts = FactMemory(HashingEmbedder(), clock=lambda: now[0])
        >>> facts.add("User lives in Paris", subject="alice", slot="home").action
        'added'
        >>> facts.add("User lives in Paris", subject="alice", slot="home").fact.confidence
        0.8
        >>> now[0] += timedelta(days=30)
        >>> change = facts.add("User lives in Berlin", subject="alice", slot="home")
        >>> change.action, [f.text for f in change.invalidated]
        ('superseded', ['User lives in Paris'])
        >>> [f.text for f in facts.facts("alice")]
        ['User lives in Berlin']
        >>> [f.text for f in facts.as_of(datetime(2025, 1, 15, tzinfo=UTC), "alice")]
        ['User lives in Paris']
        >>> facts.search("Where does the user live?", k=1, min_score=0.1)[0].text
        'User lives in Berlin'
    """

    def __init__(
        self,
        embedder: Embedder | Literal["default"] = "default",
        *,
        store: MemoryStore | None = None,
        namespace: str = "default",
        clock: Callable[[], datetime] = _utcnow,
        dedup_threshold: float = 0.85,
        contradiction_threshold: float = 0.80,
        contradicts: ContradictionRule = slot_rule,
        reinforce_step: float = 0.1,
        decay_factor: float = 0.95,
        decay_after: timedelta = timedelta(days=7),
        prune_below: float = 0.3,
        prune_after: timedelta = timedelta(days=30),
        bm25_weight: float = 0.5,
    ) -> None:
        self.dedup_threshold = _unit("dedup_threshold", dedup_threshold)
        self.contradiction_threshold = _unit("contradiction_threshold", contradiction_threshold)
        self.reinforce_step = _unit("reinforce_step", reinforce_step)
        self.decay_factor = _unit("decay_factor", decay_factor)
        self.prune_below = _unit("prune_below", prune_below)
        self.bm25_weight = _unit("bm25_weight", bm25_weight)
        self.decay_after = _positive_delta("decay_after", decay_after)
        self.prune_after = _positive_delta("prune_after", prune_after)
        if not callable(clock):
            raise ValueError(f"clock must be callable, got {clock!r}")
        if not callable(contradicts):
            raise ValueError(f"contradicts must be callable, got {contradicts!r}")
        if store is not None and not isinstance(store, MemoryStore):
            raise TypeError(f"store must be a MemoryStore, got {type(store).__name__}")
        self.namespace = validate_name("namespace", namespace)
        if isinstance(embedder, str):
            if embedder != "default":
                raise ValueError(f"embedder must be an Embedder or 'default', got {embedder!r}")
            resolved = default_embedder()
            if resolved is None:
                log.warning(
                    "FactMemory: no embedding model (pip install 'marsys-mem[embeddings]'); "
                    "facts are compared with a HashingEmbedder (shared words, not meaning)"
                )
                resolved = HashingEmbedder()
            embedder = resolved
        self.embedder: Embedder = embedder
        self.store = store
        self.contradicts = contradicts
        self._clock = clock
        self._lock = threading.RLock()
        self._facts: dict[str, Fact] = {}
        self._vectors: dict[str, npt.NDArray[np.float32]] = {}
        self._bm25 = BM25Index()
        self._closed = False
        self._feed: DeletionFeed | None = None
        # the store searches: facts are read per call, never kept (see _view)
        self._stateless = (
            store is not None
            and store.supports_search
            and len(self.embedder.name) <= MAX_MODEL_CHARS
        )
        self._viewed: set[str] | None = set()  # subjects read for this call (None: all)
        self._view_depth = 0
        if store is not None:
            if self._stateless:
                self._feed = DeletionFeed(store.load_deletions, self.namespace)
            else:
                self._load()

    # ------------------------------------------------------------------ storage
    def _key(self, subject: str) -> Key:
        return subject_facts_key(self.namespace, subject)

    def _read(self, messages: Iterable[Message], stale: list[Fact]) -> None:
        """Index stored fact records (those made by another embedder go to ``stale``)."""
        for m in messages:
            if m.structured_data is None:
                continue
            try:
                fact = Fact.model_validate(m.structured_data)
            except ValidationError as exc:
                log.warning("FactMemory: skipping unreadable fact %s: %s", m.message_id, exc)
                continue
            if fact.embedding is None or fact.embedder != self.embedder.name:
                stale.append(fact)
                continue
            self._index(fact, np.asarray(fact.embedding, dtype=np.float32))

    def _load(self) -> None:
        assert self.store is not None
        self._feed = DeletionFeed(self.store.load_deletions, self.namespace)
        self._read_keys(self._fact_keys(None))

    def _fact_keys(self, subject: str | None) -> list[Key]:
        """The store keys of ``subject``'s facts (``None``: of every subject)."""
        if subject is not None:
            return [self._key(subject)]
        assert self.store is not None
        return [k for k in self.store.list_keys(self.namespace) if k[1] == SUBJECT_FACTS_AGENT]

    def _read_keys(self, keys: Sequence[Key]) -> None:
        """Index the facts stored under ``keys``; those of another embedder are embedded again."""
        assert self.store is not None
        stale: list[Fact] = []
        if not keys:
            return
        if not self._stateless:
            for messages in self.store.batch([Load(key) for key in keys]):
                self._read(messages, stale)
        else:  # with the ids of the stored vectors: a fact written before the store searched
            model = self.embedder.name  # (an upgraded store) has none yet: it gets it now
            ops = [op for key in keys for op in (Load(key), LoadVectors(key, model))]
            results = self.store.batch(ops)
            puts: list[PutVectors] = []
            for key, messages, page in zip(keys, results[::2], results[1::2], strict=True):
                self._read(messages, stale)
                have = set(page.message_ids)
                ids = [m.message_id for m in messages if m.message_id in self._facts]
                if lacking := tuple(mid for mid in ids if mid not in have):
                    rows = np.stack([self._vectors[mid] for mid in lacking])
                    puts.append(PutVectors(key, model, lacking, rows.astype(np.float32)))
            if puts:
                self.store.batch(puts)
        if stale:  # made by another embedder: embed again (and store the new vectors)
            vectors = self._embed([f.text for f in stale])
            redone = [self._with_vector(f, v) for f, v in zip(stale, vectors, strict=True)]
            self._write(redone, replace=True)
            for f, v in zip(redone, vectors, strict=True):
                self._index(f, v)

    @property
    def stateless(self) -> bool:
        """Whether the store searches and this memory keeps no facts between calls."""
        return self._stateless

    @contextlib.contextmanager
    def _view(self, subject: str | None) -> Iterator[None]:
        """For one call: ``subject``'s facts (``None``: all) read from a store that searches.

        Re-entrant (an inner call reads what the outer one lacks); the outermost lets the
        facts go when it ends. Without search in the store the facts are always held.
        """
        if not self._stateless:
            yield
            return
        with self._lock:
            self._view_depth += 1
            try:
                viewed = self._viewed
                if viewed is not None and (subject is None or subject not in viewed):
                    if subject is None:
                        self._read_keys([k for k in self._fact_keys(None) if k[2] not in viewed])
                        self._viewed = None
                    else:
                        self._read_keys(self._fact_keys(subject))
                        viewed.add(subject)
                yield
            finally:
                self._view_depth -= 1
                if not self._view_depth:
                    self._facts.clear()
                    self._vectors.clear()
                    self._bm25 = BM25Index()
                    self._viewed = set()

    def _subject_of(self, fact_id: object) -> str | None:
        """The subject of a stored fact (a store that searches), or ``None``."""
        if not isinstance(fact_id, str) or not fact_id or self.store is None:
            return None
        keys = self._fact_keys(None)
        found = self.store.batch([Load(key, ids=(fact_id,)) for key in keys]) if keys else []
        for key, messages in zip(keys, found, strict=True):
            if messages:
                return key[2]
        return None

    def _with_vector(self, fact: Fact, vector: npt.NDArray[np.float32]) -> Fact:
        values = tuple(round(float(x), 6) for x in vector)
        return fact.model_copy(update={"embedding": values, "embedder": self.embedder.name})

    def _record(self, fact: Fact) -> Message:
        data: dict[str, Any] = fact.model_dump(mode="json")
        return Message.system(
            fact.text,
            message_id=fact.fact_id,
            structured_data=data,
            pinned=True,
            timestamp=fact.created_at,
            metadata={"kind": "fact", "subject": fact.subject},
        )

    def sync(self) -> int:
        """Catch up with the store's deletions (cascades, other processes); returns drops.

        A fact whose every source message was deleted was deleted by the store with it;
        a fact rewritten by another process is read again.
        """
        if self._feed is None or self._closed:
            return 0
        assert self.store is not None
        if self._stateless:  # nothing held: nothing to drop
            self._feed.poll()
            return 0
        gone_by_key, complete = self._feed.poll()
        if not complete:  # the log was pruned past us: read everything again
            with self._lock:
                dropped = len(self._facts)
                for fid in list(self._facts):
                    self._unindex(fid)
                stale: list[Fact] = []
                for key in self.store.list_keys(self.namespace):
                    if key[1] == SUBJECT_FACTS_AGENT:
                        self._read(self.store.load_messages(key), stale)
                return max(dropped - len(self._facts), 0)
        dropped = 0
        for key, ids in gone_by_key.items():
            if key[1] != SUBJECT_FACTS_AGENT:
                continue
            wanted = tuple(dict.fromkeys(ids))
            back = self.store.batch([Load(key, ids=wanted)])[0]
            with self._lock:
                again = {m.message_id for m in back}
                for fid in wanted:
                    if fid not in again and fid in self._facts:
                        self._unindex(fid)
                        dropped += 1
                self._read(back, [])
        return dropped

    def forget_sources(self, key: Key, message_ids: Iterable[str]) -> int:
        """The messages ``message_ids`` of ``key`` are gone: facts lose them as sources.

        A fact left with no source is deleted; one with another source left is kept
        (and rewritten without the gone ones). Returns how many facts were deleted. The
        store does the same by itself for stored messages; this covers the rest
        (messages never stored: session and single-run agents).
        """
        self._check_open()
        self.sync()
        with self._view(None):
            return self._forget_sources(key, message_ids)

    def _forget_sources(self, key: Key, message_ids: Iterable[str]) -> int:
        gone = {(tuple(key), mid) for mid in message_ids}
        with self._lock:
            doomed: list[Fact] = []
            kept: list[Fact] = []
            for f in self._facts.values():
                if not f.sources:
                    continue
                left = tuple(s for s in f.sources if (s.key, s.message_id) not in gone)
                if len(left) == len(f.sources):
                    continue
                if left:
                    ids = tuple(s.message_id for s in left)
                    kept.append(f.model_copy(update={"sources": left, "source_ids": ids}))
                else:
                    doomed.append(f)
        for f in doomed:
            self.forget(f.fact_id)
        if doomed and self.store is not None:
            self.store.scrub()  # their text is not left in the store's files
        if kept:
            with self._lock:
                kept = [f for f in kept if f.fact_id in self._facts]
                self._write(kept, replace=True)
                for f in kept:
                    self._index(f, self._vectors[f.fact_id])
        return len(doomed)

    def _write(self, facts: Sequence[Fact], *, replace: bool, delete: Sequence[Fact] = ()) -> None:
        """Write ``facts`` (replacing stored versions if ``replace``) and delete ``delete``."""
        if self.store is None:
            return
        ops: list[Append | Delete | PutVectors] = []
        by_subject: dict[str, list[Fact]] = {}
        for f in facts:
            by_subject.setdefault(f.subject, []).append(f)
        for f in delete:
            ops.append(Delete(self._key(f.subject), (f.fact_id,)))
        for subject, group in by_subject.items():
            key = self._key(subject)
            if replace:
                ops.append(Delete(key, tuple(f.fact_id for f in group)))
            sources = tuple(tuple(Source(s.key, s.message_id) for s in f.sources) for f in group)
            owned = sources if any(sources) else ()
            ops.append(Append(key, tuple(self._record(f) for f in group), sources=owned))
            with_vector = [f for f in group if f.embedding is not None]
            if self._stateless and with_vector:  # searched in the store: the vectors too
                vectors = np.asarray([f.embedding for f in with_vector], dtype=np.float32)
                ids = tuple(f.fact_id for f in with_vector)
                ops.append(PutVectors(key, self.embedder.name, ids, vectors))
        if ops:
            self.store.batch(ops)

    def _index(self, fact: Fact, vector: npt.NDArray[np.float32]) -> None:
        if fact.fact_id in self._facts:
            self._bm25.remove(fact.fact_id)
        self._facts[fact.fact_id] = fact
        self._vectors[fact.fact_id] = vector
        self._bm25.add(fact.fact_id, fact.text)

    def _unindex(self, fact_id: str) -> None:
        self._facts.pop(fact_id, None)
        self._vectors.pop(fact_id, None)
        self._bm25.remove(fact_id)

    def _embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        vectors = np.asarray(self.embedder.embed(list(texts)), dtype=np.float32)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        result: npt.NDArray[np.float32] = vectors / norms
        return result

    def _now(self) -> datetime:
        now = self._clock()
        if not isinstance(now, datetime) or now.tzinfo is None:
            raise ValueError(f"clock must return a timezone-aware datetime, got {now!r}")
        return now.astimezone(UTC)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("FactMemory is closed")

    # ------------------------------------------------------------------ writing
    def add(
        self,
        fact: FactCandidate | str,
        *misplaced: Never,
        subject: str | None = None,
        user_id: str | None = None,
        agent_id: str | None = None,
        category: FactCategory = "other",
        confidence: float = 0.7,
        slot: str | None = None,
        source_ids: Iterable[str] = (),
    ) -> FactChange:
        """Learn one fact about a subject: add it, reinforce its twin, or supersede.

        Whom the fact is about is a keyword, so that the fact and its subject cannot be
        swapped: ``subject=``, or mem0's spelling ``user_id=`` / ``agent_id=`` (the same
        subject names; give exactly one). A str becomes a :class:`FactCandidate` with the
        keyword fields; a candidate keeps its own (its ``subject``, if set, must equal the
        one given).

        Example:
            >>> facts = FactMemory(HashingEmbedder())
            >>> facts.add("User lives in Paris", user_id="alice").fact.subject
            'alice'
            >>> facts.add("alice", "I live in Paris")  # the subject first is refused, not stored
            Traceback (most recent call last):
            TypeError: FactMemory.add() takes one positional argument, the fact; whom it is \
about is a keyword: FactMemory.add('I live in Paris', user_id='alice') (or subject= / \
agent_id=), got 2 positional arguments: 'alice', 'I live in Paris'
            >>> len(facts)
            1

        Raises:
            TypeError: more than one positional argument, such as the subject before the
                fact (the message shows the call to write; nothing changed).
            ValueError: a bad field, or not exactly one of ``subject`` / ``user_id`` /
                ``agent_id`` (the message names it; nothing changed).
        """
        if misplaced:
            given = [fact, *misplaced]
            raise TypeError(
                "FactMemory.add() takes one positional argument, the fact; whom it is about "
                f"is a keyword: FactMemory.add({given[-1]!r}, user_id={given[0]!r}) (or "
                f"subject= / agent_id=), got {len(given)} positional arguments: "
                + ", ".join(repr(g) for g in given)
            )
        who = _one_subject(subject, user_id, agent_id)
        assert who is not None
        if isinstance(fact, str):
            try:
                fact = FactCandidate(
                    text=fact,
                    category=category,
                    confidence=confidence,
                    slot=slot,
                    source_ids=tuple(source_ids),
                )
            except ValidationError as exc:
                raise ValueError(f"invalid fact: {exc}") from None
        return self.add_many([fact], who)[0]

    def add_many(
        self,
        candidates: Iterable[FactCandidate],
        subject: str,
        *,
        source_key: Key | None = None,
        stored_sources: bool = False,
    ) -> list[FactChange]:
        """Learn several facts in order (one embedding call; each written when decided).

        ``source_key``: the store key of the conversation the candidates' ``source_ids``
        are in; the facts then follow those messages (deleted when all of them are).
        ``stored_sources``: those messages are in this memory's store (a persistent
        conversation): a fact whose sources were all deleted before it was written is
        deleted at once.

        Raises:
            TypeError: an item is not a :class:`FactCandidate`.
            ValueError: ``subject`` is not a name, or a candidate names another subject.
        """
        self._check_open()
        validate_name("subject", subject)
        batch = list(candidates)
        for i, c in enumerate(batch):
            if not isinstance(c, FactCandidate):
                raise TypeError(f"candidates[{i}] must be a FactCandidate, got {type(c).__name__}")
            if c.subject is not None and c.subject != subject:
                raise ValueError(
                    f"candidates[{i}].subject is {c.subject!r}, but the facts are for {subject!r}"
                )
        if source_key is not None:
            validate_key(source_key)
        if not batch:
            return []
        self.sync()
        vectors = self._embed([c.text for c in batch])
        with self._lock, self._view(subject):
            changes = [
                self._learn(c, v, subject, source_key) for c, v in zip(batch, vectors, strict=True)
            ]
        if source_key is not None and self.store is not None and stored_sources:
            # a source deleted before its fact was written would never take the fact along
            ids = tuple(dict.fromkeys(mid for c in batch for mid in c.source_ids))
            stored = {m.message_id for m in self.store.batch([Load(source_key, ids=ids)])[0]}
            missing = [mid for mid in ids if mid not in stored]
            if missing:
                self.forget_sources(source_key, missing)
        return changes

    async def aadd_many(
        self, candidates: Iterable[FactCandidate], subject: str
    ) -> list[FactChange]:
        """Async twin of :meth:`add_many` (runs in a worker thread)."""
        return await asyncio.to_thread(self.add_many, list(candidates), subject)

    def _learn(
        self,
        c: FactCandidate,
        vector: npt.NDArray[np.float32],
        subject: str,
        source_key: Key | None = None,
    ) -> FactChange:
        now = self._now()
        from_ = (
            tuple(FactSource(key=source_key, message_id=mid) for mid in c.source_ids)
            if source_key is not None
            else ()
        )
        at = c.at.astimezone(UTC) if c.at is not None else now
        valid = [f for f in self._facts.values() if f.subject == subject and f.is_valid]
        sims: dict[str, float] = {}
        if valid:
            matrix = np.stack([self._vectors[f.fact_id] for f in valid])
            sims = dict(zip((f.fact_id for f in valid), (matrix @ vector).tolist(), strict=True))
        candidates = [
            f
            for f in valid
            if sims[f.fact_id] >= self.contradiction_threshold
            or (c.slot is not None and f.slot == c.slot)
        ]
        same = [f for f in valid if _norm(f.text) == _norm(c.text)]  # a restatement
        contradicted = [] if same else [f for f in candidates if self.contradicts(f, c)]
        if not contradicted:
            twins = same or [f for f in valid if sims[f.fact_id] > self.dedup_threshold]
            if twins:
                best = max(twins, key=lambda f: sims[f.fact_id])
                sources = tuple(dict.fromkeys((*best.source_ids, *c.source_ids)))
                # unowned (no sources known) stays unowned: it never follows a message
                owned = tuple(dict.fromkeys((*best.sources, *from_))) if best.sources else ()
                updated = best.model_copy(
                    update={
                        "sources": owned,
                        "confidence": min(1.0, round(best.confidence + self.reinforce_step, 10)),
                        "reinforced_at": max(at, best.reinforced_at),
                        "decay_periods": 0,
                        "reinforcements": best.reinforcements + 1,
                        "source_ids": sources,
                    }
                )
                self._write([updated], replace=True)
                self._index(updated, self._vectors[best.fact_id])
                return FactChange("reinforced", updated)
        fact_id = uuid.uuid4().hex
        new = self._with_vector(
            Fact(
                fact_id=fact_id,
                subject=subject,
                text=c.text,
                category=c.category,
                confidence=c.confidence,
                slot=c.slot,
                source_ids=c.source_ids,
                sources=from_,
                created_at=now,
                reinforced_at=at,
                valid_from=at,
                supersedes=contradicted[-1].fact_id if contradicted else None,
            ),
            vector,
        )
        closed = [
            f.model_copy(update={"invalid_at": max(at, f.valid_from), "superseded_by": fact_id})
            for f in contradicted
        ]
        self._write([*closed, new], replace=True)
        for f in closed:
            self._index(f, self._vectors[f.fact_id])
        self._index(new, vector)
        return FactChange("superseded" if closed else "added", new, tuple(closed))

    def forget(self, fact_id: str) -> bool:
        """Delete a fact for real (from the store too); returns whether it existed.

        The facts it superseded or was superseded by lose their link to it.
        """
        self._check_open()
        subject: str | None = None
        if self._stateless:
            subject = self._subject_of(fact_id)
            if subject is None:
                return False
        with self._lock, self._view(subject):
            fact = self._facts.get(fact_id) if isinstance(fact_id, str) else None
            if fact is None:
                return False
            relinked = [
                f.model_copy(
                    update={
                        "supersedes": None if f.supersedes == fact_id else f.supersedes,
                        "superseded_by": None if f.superseded_by == fact_id else f.superseded_by,
                    }
                )
                for f in self._facts.values()
                if fact_id in (f.supersedes, f.superseded_by)
            ]
            self._write(relinked, replace=True, delete=[fact])
            self._unindex(fact_id)
            for f in relinked:
                self._index(f, self._vectors[f.fact_id])
            return True

    def forget_subject(self, subject: str) -> int:
        """Delete every fact about ``subject``; returns how many."""
        self._check_open()
        validate_name("subject", subject)
        with self._lock, self._view(subject):
            ids = [f.fact_id for f in self._facts.values() if f.subject == subject]
            if self.store is not None and ids:
                self.store.delete_messages(self._key(subject))
            for fid in ids:
                self._unindex(fid)
            return len(ids)

    def maintain(self) -> MaintenanceReport:
        """Decay facts not reinforced for ``decay_after``, prune weak old ones.

        Decay is per full period since ``reinforced_at`` and applied once per period
        (calling again in the same period changes nothing). Pruning deletes facts with
        confidence under ``prune_below`` created more than ``prune_after`` ago.
        """
        self._check_open()
        with self._lock, self._view(None):
            now = self._now()
            decayed: list[Fact] = []
            for f in self._facts.values():
                if not f.is_valid:
                    continue
                due = int((now - f.reinforced_at) / self.decay_after)
                if due > f.decay_periods:
                    factor = self.decay_factor ** (due - f.decay_periods)
                    decayed.append(
                        f.model_copy(
                            update={
                                "confidence": max(0.0, min(1.0, f.confidence * factor)),
                                "decay_periods": due,
                            }
                        )
                    )
            current = {**self._facts, **{f.fact_id: f for f in decayed}}
            pruned = [
                f
                for f in current.values()
                if f.confidence < self.prune_below and now - f.created_at > self.prune_after
            ]
            pruned_ids = {f.fact_id for f in pruned}
            kept = [f for f in decayed if f.fact_id not in pruned_ids]
            self._write(kept, replace=True, delete=pruned)
            for f in kept:
                self._index(f, self._vectors[f.fact_id])
            for f in pruned:
                self._unindex(f.fact_id)
            return MaintenanceReport(
                tuple(f.fact_id for f in decayed), tuple(sorted(pruned_ids)), now
            )

    # ------------------------------------------------------------------ reading
    def __len__(self) -> int:
        with self._view(None):
            return len(self._facts)

    def get(self, fact_id: str) -> Fact:
        """The fact with ``fact_id``.

        Raises:
            MessageNotFoundError: no such fact.
        """
        subject = self._subject_of(fact_id) if self._stateless else None
        with self._view(subject):
            try:
                return self._facts[fact_id]
            except (KeyError, TypeError):
                pass
        raise MessageNotFoundError(f"no fact {fact_id!r} in this FactMemory")

    def subjects(self) -> list[str]:
        """The subjects that have facts, sorted."""
        self.sync()
        with self._lock, self._view(None):
            return sorted({f.subject for f in self._facts.values()})

    def facts(self, subject: str, *, include_invalid: bool = False) -> list[Fact]:
        """``subject``'s facts, oldest first (only valid ones unless ``include_invalid``)."""
        validate_name("subject", subject)
        self.sync()
        with self._lock, self._view(subject):
            found = [
                f
                for f in self._facts.values()
                if f.subject == subject and (include_invalid or f.is_valid)
            ]
        return sorted(found, key=lambda f: (f.valid_from, f.created_at))

    def history(self, fact_id: str) -> list[Fact]:
        """The versions of a belief, oldest first: the facts linked by supersession.

        Raises:
            MessageNotFoundError: no such fact.
        """
        subject = self._subject_of(fact_id) if self._stateless else None
        with self._lock, self._view(subject):
            fact = self.get(fact_id)
            chain = [fact]
            seen = {fact.fact_id}
            back = fact
            while back.supersedes in self._facts and back.supersedes not in seen:
                back = self._facts[back.supersedes]
                seen.add(back.fact_id)
                chain.insert(0, back)
            ahead = fact
            while ahead.superseded_by in self._facts and ahead.superseded_by not in seen:
                ahead = self._facts[ahead.superseded_by]
                seen.add(ahead.fact_id)
                chain.append(ahead)
            return chain

    def as_of(self, when: datetime, subject: str | None = None) -> list[Fact]:
        """The facts believed at ``when`` (``valid_from <= when < invalid_at``).

        Raises:
            ValueError: ``when`` is not timezone-aware.
        """
        if not isinstance(when, datetime) or when.tzinfo is None:
            raise ValueError(f"when must be a timezone-aware datetime, got {when!r}")
        if subject is not None:
            validate_name("subject", subject)
        self.sync()
        with self._lock, self._view(subject):
            found = [
                f
                for f in self._facts.values()
                if (subject is None or f.subject == subject) and f.valid_at(when)
            ]
        return sorted(found, key=lambda f: (f.valid_from, f.created_at))

    def search(
        self,
        query: str,
        k: int = 5,
        min_score: float | None = DEFAULT_MIN_SCORE,
        *,
        subject: str | None = None,
        user_id: str | None = None,
        agent_id: str | None = None,
        include_invalid: bool = False,
    ) -> list[ScoredFact]:
        """The ``k`` facts that best match ``query``, best first, scored on the calibrated scale.

        Ranked by the cosine raised by keyword matches (``cosine + bm25_weight * (1 -
        cosine) * bm25 / best bm25``); the score each carries, which ``min_score``
        compares, is :func:`~marsys_mem.retrieval.calibration.calibrated` (a probability
        of relevance that falls in ranking order, the scale of every search). ``subject``
        (or mem0's ``user_id`` / ``agent_id``, at most one): only that subject's facts;
        none: every subject's.

        Raises:
            ValueError: an empty query, ``k <= 0``, a bad ``min_score`` / ``subject``, or
                more than one of ``subject`` / ``user_id`` / ``agent_id``.
        """
        subject = _one_subject(subject, user_id, agent_id, required=False)
        self._check_open()
        check_query(query)
        k = positive_int("k", k)
        if min_score is not None:
            min_score = finite_number("min_score", min_score)
        if subject is not None:
            validate_name("subject", subject)
        self.sync()
        qvec = self._embed([query])[0]
        if self._stateless:
            pool, vectors, bm25, ceiling = self._candidates(
                query, qvec, k, subject, include_invalid
            )
        else:
            with self._lock:
                pool = [
                    f
                    for f in self._facts.values()
                    if (subject is None or f.subject == subject) and (include_invalid or f.is_valid)
                ]
                vectors = {f.fact_id: self._vectors[f.fact_id] for f in pool}
                bm25 = self._bm25.score_docs(query, [f.fact_id for f in pool])
                index = self._bm25
                ceiling = bm25_ceiling(index.doc_freqs(query).values(), len(index), index.k1)
        if not pool:
            return []
        best = max(bm25.values(), default=0.0)
        scored: list[tuple[float, float, float, Fact]] = []
        for f in pool:
            cos = max(-1.0, min(1.0, float(vectors[f.fact_id] @ qvec)))
            kw = bm25.get(f.fact_id, 0.0)
            boost = self.bm25_weight * (1.0 - max(cos, 0.0)) * (kw / best if best > 0 else 0.0)
            scored.append((cos + boost, cos, kw, f))
        scored.sort(key=lambda s: (-s[0], -s[3].confidence))
        head = scored[: max(k, EVIDENCE_DEPTH)]
        scores = calibrated(
            [s[0] for s in head], [s[1] for s in head], [s[2] for s in head], ceiling
        )
        hits: list[ScoredFact] = []
        for (_, cos, kw, f), score in zip(head[:k], scores, strict=False):
            if min_score is not None and score < min_score:
                break  # scores fall in ranking order
            hits.append(ScoredFact(f, score, cos, kw, len(hits) + 1))
        return hits

    def _candidates(
        self,
        query: str,
        qvec: npt.NDArray[np.float32],
        k: int,
        subject: str | None,
        include_invalid: bool,
    ) -> tuple[list[Fact], dict[str, npt.NDArray[np.float32]], dict[str, float], float]:
        """A store that searches: its dense and keyword candidates, their vectors and BM25.

        The BM25 scores use the store's document frequencies (see
        :func:`~marsys_mem.patterns.store_search.text_pages`), and so does the query's
        BM25 ceiling, returned last.
        """
        assert self.store is not None
        keys = self._fact_keys(subject)
        if not keys:
            return [], {}, {}, 0.0
        depth = max(4 * k, 50)
        pages = text_pages(self.store, query, depth, keys)
        hits = self.store.search_vectors(self.embedder.name, qvec, depth, keys=keys)
        where = {**pages.keys, **{h.message_id: h.key for h in hits}}
        wanted: dict[Key, list[str]] = {}
        for mid in dict.fromkeys([*(h.message_id for h in hits), *pages.ids()]):
            wanted.setdefault(where[mid], []).append(mid)
        loads = [Load(key, ids=tuple(ids)) for key, ids in wanted.items()]
        pool: list[Fact] = []
        vectors: dict[str, npt.NDArray[np.float32]] = {}
        for messages in self.store.batch(loads) if loads else []:
            for m in messages:
                try:
                    fact = Fact.model_validate(m.structured_data)
                except ValidationError as exc:
                    log.warning("FactMemory: skipping unreadable fact %s: %s", m.message_id, exc)
                    continue
                if fact.embedding is None or fact.embedder != self.embedder.name:
                    continue  # embedded again when its subject is next read
                if include_invalid or fact.is_valid:
                    pool.append(fact)
                    vectors[fact.fact_id] = np.asarray(fact.embedding, dtype=np.float32)
        scores = score_with_stats(
            query, [f.text for f in pool], doc_count=pages.count, doc_freq=pages.doc_freq()
        )
        ceiling = bm25_ceiling(pages.doc_freq().values(), pages.count, 1.5)  # score_with_stats'
        by_id = dict(zip((f.fact_id for f in pool), scores.tolist(), strict=True))
        return pool, vectors, by_id, ceiling

    async def asearch(
        self,
        query: str,
        k: int = 5,
        min_score: float | None = DEFAULT_MIN_SCORE,
        *,
        subject: str | None = None,
        user_id: str | None = None,
        agent_id: str | None = None,
        include_invalid: bool = False,
    ) -> list[ScoredFact]:
        """Async twin of :meth:`search` (runs in a worker thread)."""
        return await asyncio.to_thread(
            functools.partial(
                self.search,
                query,
                k,
                min_score,
                subject=subject,
                user_id=user_id,
                agent_id=agent_id,
                include_invalid=include_invalid,
            )
        )

    # ------------------------------------------------------------------ lifecycle
    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def close(self) -> None:
        """Stop accepting writes (the store stays open: it is the caller's). Idempotent."""
        self._closed = True

    def __repr__(self) -> str:
        return f"<FactMemory facts={len(self._facts)} embedder={self.embedder.name!r}>"
