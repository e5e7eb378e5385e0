"""The storage contract: one ABC, a small core, friendly methods on top.

A backend implements :meth:`MemoryStore._batch`: execute a list of operations in ONE
transaction and return one result per operation. If any operation fails, none of them
takes effect (no partial writes). Everything else (``append_messages``,
``load_messages``, ..., and the async twins) is built on it here, after validating the
arguments, so every backend behaves the same and passes the one conformance suite in
:mod:`marsys_mem.testing`.

Keys are ``(namespace, agent, branch)`` tuples of non-empty strings. Within a key,
messages keep the order they were appended in and ``message_id`` is unique.

Vectors (optional, :attr:`MemoryStore.supports_vectors`): ``put_vectors`` stores a message's
embedding under a model name, ``load_vectors`` reads what was written after a cursor, and
``load_messages_after`` what was appended after one; see :mod:`marsys_mem.store.vectors`.

Search (optional, :attr:`MemoryStore.supports_search`): ``search_vectors`` ranks the stored
vectors of a model by cosine similarity to a query vector, ``search_text`` ranks messages
by the database's keyword rank, both inside the store (no host loads the vectors), each
optionally limited to some keys or a namespace; hits are :class:`SearchHit`, best first.

Retention (``enforce_retention``) follows the one rule in :mod:`marsys_mem.store.retention`:
messages older than ``ttl`` (by their timestamp) are deleted, then the oldest beyond
``max_messages`` per key. System and pinned messages are exempt from ``ttl`` and are
deleted last when over ``max_messages``.
"""

from __future__ import annotations

import abc
import asyncio
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, TypeVar

import numpy as np
import numpy.typing as npt

from marsys_mem.exceptions import ConflictError, DuplicateMessageError, StoreError
from marsys_mem.lifecycle import Closing
from marsys_mem.model.messages import Message
from marsys_mem.model.runs import RunSnapshot
from marsys_mem.store.keys import Key, stored_key, validate_key
from marsys_mem.store.owners import DeletionPage, Source
from marsys_mem.store.vectors import MAX_MODEL_CHARS, MessagePage, VectorPage

__all__ = [
    "SEARCH_OPS",
    "VECTOR_OPS",
    "Append",
    "CountMatches",
    "CountMessages",
    "Delete",
    "DeletionPage",
    "EnforceRetention",
    "ExpectLast",
    "Key",
    "ListKeys",
    "ListRuns",
    "Load",
    "LoadAfter",
    "LoadAround",
    "LoadDeletions",
    "LoadRun",
    "LoadVectors",
    "MemoryStore",
    "MessagePage",
    "Op",
    "PutVectors",
    "SaveRun",
    "ScoreAround",
    "ScoreVectors",
    "SearchHit",
    "SearchText",
    "SearchVectors",
    "Source",
    "TurnRow",
    "VectorPage",
    "conflict_error",
    "messages_around",
    "thread_value",
    "validate_key",
]


def _check_aware(name: str, value: datetime | None) -> None:
    if value is not None and (not isinstance(value, datetime) or value.tzinfo is None):
        raise ValueError(f"{name} must be a timezone-aware datetime, got {value!r}")


def _check_int(name: str, value: object, minimum: int) -> None:
    if value is not None and (
        not isinstance(value, int) or isinstance(value, bool) or value < minimum
    ):
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def _check_str(name: str, value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")


@dataclass(frozen=True, slots=True)
class Append:
    """Append ``messages`` to ``key`` (result: ``None``).

    ``sources``: empty (records owned by their key only), or one tuple of
    :class:`~marsys_mem.store.owners.Source` per message: the messages it was derived from.
    Deleting every source of a record deletes the record (:mod:`marsys_mem.store.owners`).
    ``copies_of``: ``key`` holds copies of that key's messages, under the same ids (a RAG
    index, tiers): deleting a message there deletes its copy here. It is a property of
    the key from then on, and costs nothing per record.
    """

    key: Key
    messages: tuple[Message, ...]
    sources: tuple[tuple[Source, ...], ...] = ()
    copies_of: Key | None = None


@dataclass(frozen=True, slots=True)
class Load:
    """Load a key's messages, oldest first (result: ``list[Message]``).

    ``since``: only messages with timestamp >= since; ``last``: only the newest ``last``;
    ``ids``: only messages with these ids (unknown ids are ignored).
    """

    key: Key
    since: datetime | None = None
    last: int | None = None
    ids: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class LoadAround:
    """The messages of ``ids`` and the turns around them in their thread (``list[Message]``).

    For each stored id of ``ids`` (unknown ids are ignored): the message itself, the
    ``before`` messages before it and the ``after`` messages after it *in its thread*, in
    the key's order. A thread is the messages of the key whose ``metadata[thread]`` has
    the same JSON value (missing or ``null``: one thread of their own; see
    :func:`thread_value`); ``thread=None``: the whole key is one thread. The result is
    the union, in the key's order (oldest first), each message once: the neighbours
    RAGMemory's ranker reads around a hit (``RAGMemory(thread_key=...)``).
    """

    key: Key
    ids: tuple[str, ...]
    before: int = 0
    after: int = 0
    thread: str | None = "thread"


@dataclass(frozen=True, slots=True)
class Delete:
    """Delete messages of ``key`` by id and/or older than ``before`` (result: count).

    Both given: a message must match both. Neither given: delete all the key's messages.
    """

    key: Key
    ids: tuple[str, ...] | None = None
    before: datetime | None = None


@dataclass(frozen=True, slots=True)
class ExpectLast:
    """Compare-and-set: the batch goes on only if ``key``'s newest message is ``message_id``.

    ``None``: only if ``key`` holds no message. Otherwise the batch raises
    :class:`~marsys_mem.exceptions.ConflictError` naming the key, the id expected and the
    one found, and nothing of it is written (result: ``None``). It counts as a write: the
    key is locked from the check to the commit (``BEGIN IMMEDIATE`` in SQLite, the key's
    row in PostgreSQL, the store's lock in memory), so of two batches that expect the same
    newest message and each append a new one to ``key``, exactly one commits.
    """

    key: Key
    message_id: str | None


@dataclass(frozen=True, slots=True)
class CountMessages:
    """Number of messages stored under ``key`` (result: ``int``)."""

    key: Key


@dataclass(frozen=True, slots=True)
class ListKeys:
    """Keys that hold messages, sorted (result: ``list[Key]``); optionally one namespace."""

    namespace: str | None = None


@dataclass(frozen=True, slots=True)
class SaveRun:
    """Save (or replace) a run snapshot (result: ``None``)."""

    snapshot: RunSnapshot


@dataclass(frozen=True, slots=True)
class LoadRun:
    """Load a run snapshot (result: ``RunSnapshot | None``)."""

    run_id: str


@dataclass(frozen=True, slots=True)
class ListRuns:
    """Run ids filtered by the fields given (result: ``list[str]``).

    Ordered by ``started_at``, ties in first-save order (re-saving keeps the place).
    """

    namespace: str | None = None
    agent: str | None = None
    parent_id: str | None = None


@dataclass(frozen=True, slots=True)
class EnforceRetention:
    """Apply ``ttl`` / ``max_messages`` to ``key`` or to every key (result: deleted count)."""

    key: Key | None
    ttl: timedelta | None
    max_messages: int | None
    now: datetime


@dataclass(frozen=True, slots=True)
class LoadAfter:
    """Messages appended to ``key`` after cursor ``after`` (result: :class:`MessagePage`).

    The page also carries the cursor after them and the key's current message count.
    """

    key: Key
    after: int = 0


@dataclass(frozen=True, slots=True)
class PutVectors:
    """Store the ``model`` vectors of messages of ``key`` (result: count stored).

    ``vectors[i]`` is the vector of ``message_ids[i]`` (a ``float32`` array of shape
    ``(len(message_ids), dim)``, finite). Every message must be stored under ``key``
    (else :class:`~marsys_mem.exceptions.MessageNotFoundError`); a vector a message
    already has for ``model`` is replaced (and counts as written now). ``dim`` must be the
    dimension the store holds ``model``'s vectors in, if it holds any (else ValueError).
    """

    key: Key
    model: str
    message_ids: tuple[str, ...]
    vectors: npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class LoadVectors:
    """``model`` vectors written after cursor ``after`` (result: :class:`VectorPage`).

    ``key=None``: of every key. Rows come in write order; ``limit``: at most that many
    (the page's cursor then points after the last row returned).
    """

    key: Key | None
    model: str
    after: int = 0
    limit: int | None = None


@dataclass(frozen=True, slots=True)
class LoadDeletions:
    """Deletions logged after cursor ``after`` (result: :class:`DeletionPage`).

    ``after=None``: no entries, only the current cursor (where a new reader starts).
    ``namespace``: only deletions under keys of that namespace (the cursor still moves
    past the others).
    """

    after: int | None = None
    namespace: str | None = None


MAX_SEARCH_K = 1000
"""The most hits one search returns (HNSW's ``ef_search`` tops out there)."""

MAX_QUERY_CHARS = 10_000
"""The longest keyword query :class:`SearchText` accepts."""


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One search result: a message of ``key`` and its score (higher is better).

    Dense search: ``score`` is the cosine similarity; keyword search: the database's rank.
    Read the message with ``store.load_messages(hit.key, ids=[hit.message_id])``.

    Example:
        >>> SearchHit(("default", "a", "main"), "m1", 0.5).message_id
        'm1'
    """

    key: Key
    message_id: str
    score: float
    data: str | None = None
    """The message as stored (its JSON), when the search was asked for it (``with_data``)."""


@dataclass(frozen=True, slots=True)
class SearchVectors:
    """The ``k`` stored ``model`` vectors nearest ``vector`` (result: ``tuple[SearchHit, ...]``).

    By cosine similarity, best first. ``vector``: a finite ``float32`` array of shape
    ``(dim,)``, ``dim`` the one the store holds ``model`` in (else ValueError); an unknown
    model has no hits. ``keys``: only messages of those keys (``()``: none); ``namespace``:
    only keys of that namespace; both ``None``: the whole store. ``with_data``: each hit
    carries its message's stored JSON (:attr:`SearchHit.data`), read in the same query.
    """

    model: str
    vector: npt.NDArray[np.float32]
    k: int
    keys: tuple[Key, ...] | None = None
    namespace: str | None = None
    with_data: bool = False


@dataclass(frozen=True, slots=True)
class SearchText:
    """The ``k`` messages that best match ``query`` by keyword (result: ``tuple[SearchHit, ...]``).

    Any of the query's words may match (an OR of its terms, as BM25 scores them), ranked
    by the database, best first. ``keys`` / ``namespace`` as in :class:`SearchVectors`.
    ``weights``: ``(word, weight)`` pairs (at most :data:`MAX_COUNT_WORDS`, weights finite
    and >= 0): then a match ranks by the sum over those words of weight x the database's
    rank of that word alone (e.g. BM25's idf from :class:`CountMatches`), so a rare word
    outranks a common one; ``query`` still says which messages match.
    """

    query: str
    k: int
    keys: tuple[Key, ...] | None = None
    namespace: str | None = None
    weights: tuple[tuple[str, float], ...] = ()


MAX_SCORE_IDS = 10_000
"""The most messages one :class:`ScoreVectors` or :class:`LoadAround` names."""

MAX_COUNT_WORDS = 64
"""The most words one :class:`CountMatches` counts."""


@dataclass(frozen=True, slots=True)
class ScoreVectors:
    """The cosine similarity of ``vector`` to the ``model`` vectors of ``ids`` in ``key``.

    Result: ``tuple[SearchHit, ...]``, one per id that has a ``model`` vector (others are
    left out), best first; exact (no index), at the precision the store searches in. For
    the candidates a keyword search found, whose cosines a dense search did not return.
    ``vector`` as in :class:`SearchVectors`.
    """

    model: str
    vector: npt.NDArray[np.float32]
    key: Key
    ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CountMatches:
    """How many messages each of ``words`` matches by keyword (result: ``dict[str, int]``).

    One count per word (each word alone, as :class:`SearchText` matches it: a word the
    database drops, a stop word, counts 0), in one round trip: the document frequencies
    a host needs to score keyword candidates with BM25. ``keys`` / ``namespace`` as in
    :class:`SearchVectors`.
    """

    words: tuple[str, ...]
    keys: tuple[Key, ...] | None = None
    namespace: str | None = None


@dataclass(frozen=True, slots=True)
class TurnRow:
    """One message as :class:`ScoreAround` returns it: unparsed, with its cosine.

    Attributes:
        message_id: the message's id.
        data: the message as stored (its JSON; ``Message.model_validate_json`` reads it).
        cosine: its vector's cosine similarity to the query (``None``: it has none).
        position: its place in the key's order (the rows of two searches merge by it).

    Example:
        >>> TurnRow("m1", '{"role": "user", "content": "hi"}', 0.5).cosine
        0.5
    """

    message_id: str
    data: str
    cosine: float | None
    position: int = 0


@dataclass(frozen=True, slots=True)
class ScoreAround:
    """:class:`LoadAround` for a ranker: rows, not messages, each with its cosine.

    Result: ``tuple[TurnRow, ...]``, the messages :class:`LoadAround` with the same
    ``key``, ``ids``, ``before``, ``after`` and ``thread`` returns, in the same order,
    each with the cosine of its ``model`` vector to ``vector`` (as :class:`ScoreVectors`
    scores it). One query where a ranker would otherwise load messages and then score
    them: it parses only what it ranks, and validates the hits it keeps from their rows.
    ``alone``: more ids whose own rows are returned too, without the turns around them
    (in the same order: the key's).
    """

    key: Key
    ids: tuple[str, ...]
    model: str
    vector: npt.NDArray[np.float32]
    before: int = 0
    after: int = 0
    thread: str | None = "thread"
    alone: tuple[str, ...] = ()


VECTOR_OPS = (LoadAfter, PutVectors, LoadVectors)
"""The operations only a store that :attr:`~MemoryStore.supports_vectors` executes."""

SEARCH_OPS = (SearchVectors, SearchText, ScoreVectors, CountMatches, ScoreAround)
"""The operations only a store that :attr:`~MemoryStore.supports_search` executes."""


Op = (
    Append
    | Load
    | Delete
    | CountMessages
    | ExpectLast
    | ListKeys
    | SaveRun
    | LoadRun
    | ListRuns
    | EnforceRetention
    | LoadAfter
    | PutVectors
    | LoadVectors
    | LoadDeletions
    | LoadAround
    | SearchVectors
    | SearchText
    | ScoreVectors
    | CountMatches
    | ScoreAround
)


def thread_value(message: Message, thread: str | None) -> str | None:
    """The thread ``message`` is in, as :class:`LoadAround` compares them (``None``: no value).

    The value's compact JSON text (as the message's stored JSON holds it): ``"a"`` and
    ``7`` are threads, missing and ``null`` are none.

    Example:
        >>> m = Message.user("hi", metadata={"thread": "t7", "n": 7})
        >>> thread_value(m, "thread"), thread_value(m, "n"), thread_value(m, "topic")
        ('"t7"', '7', None)
    """
    if thread is None:
        return None
    value = message.metadata.get(thread)
    if value is None:
        return None
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def messages_around(messages: Sequence[Message], op: LoadAround) -> list[Message]:
    """:class:`LoadAround` over a key's ``messages`` (in the key's order), in Python.

    Example:
        >>> ms = [Message.user(t, message_id=t, metadata={"thread": t[0]}) for t in
        ...       ["a1", "b1", "a2", "b2", "a3", "a4"]]
        >>> [m.message_id for m in messages_around(ms, LoadAround(("n", "a", "b"), ("a3",), 1, 1))]
        ['a2', 'a3', 'a4']
    """
    wanted = frozenset(op.ids)
    if not wanted:
        return []
    threads: dict[str | None, list[int]] = {}
    for i, m in enumerate(messages):
        threads.setdefault(thread_value(m, op.thread), []).append(i)
    picked: set[int] = set()
    for rows in threads.values():
        for j, i in enumerate(rows):
            if messages[i].message_id in wanted:
                picked.update(rows[max(j - op.before, 0) : j + op.after + 1])
    return [messages[i] for i in sorted(picked)]


def conflict_error(op: ExpectLast, found: str | None) -> ConflictError:
    """The error of an :class:`ExpectLast` that does not hold (the same in every backend)."""
    expected, got = (
        "no message" if message_id is None else repr(message_id)
        for message_id in (op.message_id, found)
    )
    return ConflictError(
        f"{tuple(op.key)}: expected its newest message to be {expected}, found {got} "
        "(another writer got there first); nothing of the batch was written"
    )


def _validate(op: Op) -> None:
    """Boundary validation shared by every backend; raises ValueError/TypeError."""
    if isinstance(op, Append):
        validate_key(op.key)
        seen: set[str] = set()
        for i, m in enumerate(op.messages):
            if not isinstance(m, Message):
                raise TypeError(f"messages[{i}] must be a Message, got {type(m).__name__}")
            if m.message_id in seen:
                raise DuplicateMessageError(
                    f"message_id {m.message_id!r} appears twice in one append to {op.key}"
                )
            seen.add(m.message_id)
        _validate_sources(op)
    elif isinstance(op, LoadDeletions):
        _check_int("after", op.after, 0)
        _check_str("namespace", op.namespace)
    elif isinstance(op, Load):
        validate_key(op.key)
        _check_aware("since", op.since)
        _check_int("last", op.last, 0)
        if op.ids is not None:
            if not isinstance(op.ids, tuple):
                raise TypeError(f"ids must be a tuple of strings, got {type(op.ids).__name__}")
            for i, mid in enumerate(op.ids):
                _check_str(f"ids[{i}]", mid)
    elif isinstance(op, Delete):
        validate_key(op.key)
        _check_aware("before", op.before)
        if op.ids is not None:
            if not isinstance(op.ids, tuple):
                raise TypeError(f"ids must be a tuple of strings, got {type(op.ids).__name__}")
            for i, mid in enumerate(op.ids):
                _check_str(f"ids[{i}]", mid)
    elif isinstance(op, CountMessages):
        validate_key(op.key)
    elif isinstance(op, ExpectLast):
        validate_key(op.key)
        _check_str("message_id", op.message_id)
    elif isinstance(op, EnforceRetention):
        if op.key is not None:
            validate_key(op.key)
        if op.now is None:
            raise ValueError("now must be a timezone-aware datetime, got None")
        _check_aware("now", op.now)
        if op.ttl is not None and (not isinstance(op.ttl, timedelta) or op.ttl <= timedelta(0)):
            raise ValueError(f"ttl must be a positive timedelta, got {op.ttl!r}")
        _check_int("max_messages", op.max_messages, 1)
    elif isinstance(op, SaveRun):
        if not isinstance(op.snapshot, RunSnapshot):
            raise TypeError(f"snapshot must be a RunSnapshot, got {type(op.snapshot).__name__}")
    elif isinstance(op, LoadRun):
        if not isinstance(op.run_id, str) or not op.run_id:
            raise ValueError(f"run_id must be a non-empty string, got {op.run_id!r}")
    elif isinstance(op, ListKeys):
        _check_str("namespace", op.namespace)
    elif isinstance(op, ListRuns):
        for name in ("namespace", "agent", "parent_id"):
            _check_str(name, getattr(op, name))
    elif isinstance(op, LoadAfter):
        validate_key(op.key)
        _check_int("after", op.after, 0)
    elif isinstance(op, PutVectors):
        _validate_put_vectors(op)
    elif isinstance(op, LoadVectors):
        if op.key is not None:
            validate_key(op.key)
        _check_model(op.model)
        _check_int("after", op.after, 0)
        _check_int("limit", op.limit, 1)
    elif isinstance(op, SearchVectors | SearchText):
        _validate_search(op)
    elif isinstance(op, LoadAround):
        validate_key(op.key)
        _check_id_tuple("ids", op.ids)
        if isinstance(op.before, bool) or not isinstance(op.before, int) or op.before < 0:
            raise ValueError(f"before must be an int >= 0, got {op.before!r}")
        if isinstance(op.after, bool) or not isinstance(op.after, int) or op.after < 0:
            raise ValueError(f"after must be an int >= 0, got {op.after!r}")
        _check_str("thread", op.thread)
    elif isinstance(op, ScoreVectors):
        _check_model(op.model)
        _check_query_vector(op.vector)
        validate_key(op.key)
        _check_id_tuple("ids", op.ids)
    elif isinstance(op, CountMatches):
        _validate_count(op)
    elif isinstance(op, ScoreAround):
        _validate(LoadAround(op.key, op.ids, op.before, op.after, op.thread))
        _check_id_tuple("alone", op.alone)
        _check_model(op.model)
        _check_query_vector(op.vector)
    else:
        raise TypeError(f"unknown store operation {op!r}")


def _validate_sources(op: Append) -> None:
    if op.copies_of is not None:
        validate_key(op.copies_of)
        if tuple(op.copies_of) == tuple(op.key):
            raise ValueError(f"copies_of: a key cannot hold copies of itself ({op.key})")
    if not isinstance(op.sources, tuple):
        raise TypeError(f"sources must be a tuple, got {type(op.sources).__name__}")
    if not op.sources:
        return
    if len(op.sources) != len(op.messages):
        raise ValueError(
            f"sources must hold one tuple per message: {len(op.messages)} messages, "
            f"{len(op.sources)} tuples of sources"
        )
    for i, refs in enumerate(op.sources):
        if not isinstance(refs, tuple):
            raise TypeError(f"sources[{i}] must be a tuple of Source, got {type(refs).__name__}")
        for j, ref in enumerate(refs):
            if not isinstance(ref, Source):
                raise TypeError(f"sources[{i}][{j}] must be a Source, got {type(ref).__name__}")
            validate_key(ref.key)
            _check_str(f"sources[{i}][{j}].message_id", ref.message_id)


def _check_model(model: object) -> None:
    if not isinstance(model, str) or not model.strip() or len(model) > MAX_MODEL_CHARS:
        raise ValueError(
            f"model must be a non-blank string of at most {MAX_MODEL_CHARS} characters, "
            f"got {model!r:.80}"
        )


def _validate_put_vectors(op: PutVectors) -> None:
    validate_key(op.key)
    _check_model(op.model)
    if not isinstance(op.message_ids, tuple):
        raise TypeError(
            f"message_ids must be a tuple of strings, got {type(op.message_ids).__name__}"
        )
    seen: set[str] = set()
    for i, mid in enumerate(op.message_ids):
        _check_str(f"message_ids[{i}]", mid)
        if mid in seen:
            raise ValueError(f"message_ids[{i}] {mid!r} appears twice in one put_vectors")
        seen.add(mid)
    v = op.vectors
    if not isinstance(v, np.ndarray) or v.dtype != np.float32 or v.ndim != 2:
        shown = f"{v.dtype} array of shape {v.shape}" if isinstance(v, np.ndarray) else type(v)
        raise TypeError(f"vectors must be a 2-D float32 numpy array, got {shown}")
    if v.shape[0] != len(op.message_ids) or v.shape[1] < 1:
        raise ValueError(
            f"vectors must have shape ({len(op.message_ids)}, dim >= 1) for "
            f"{len(op.message_ids)} message_ids, got {v.shape}"
        )
    finite = np.isfinite(v).all(axis=1)
    if not finite.all():
        row = int(np.argmin(finite))
        raise ValueError(f"vectors[{row}] (message {op.message_ids[row]!r}) holds NaN or infinity")


def _check_id_tuple(name: str, ids: object) -> None:
    if not isinstance(ids, tuple):
        raise TypeError(f"{name} must be a tuple of strings, got {type(ids).__name__}")
    if len(ids) > MAX_SCORE_IDS:
        raise ValueError(f"{name} holds {len(ids)} ids; the limit is {MAX_SCORE_IDS}")
    for i, mid in enumerate(ids):
        _check_str(f"{name}[{i}]", mid)


def _check_query_vector(v: object) -> None:
    if not isinstance(v, np.ndarray) or v.dtype != np.float32 or v.ndim != 1 or not v.size:
        shown = f"{v.dtype} array of shape {v.shape}" if isinstance(v, np.ndarray) else type(v)
        raise TypeError(f"vector must be a 1-D float32 numpy array (dim,), got {shown}")
    if not np.isfinite(v).all():
        raise ValueError("vector holds NaN or infinity")
    if not np.any(v):
        raise ValueError("vector is all zeros: it has no cosine similarity to anything")


def _check_keys_filter(keys: object, namespace: object) -> None:
    if keys is not None:
        if not isinstance(keys, tuple):
            raise TypeError(f"keys must be a tuple of keys, got {type(keys).__name__}")
        for i, key in enumerate(keys):
            try:
                validate_key(key)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"keys[{i}]: {exc}") from None
    _check_str("namespace", namespace)


def _validate_count(op: CountMatches) -> None:
    if not isinstance(op.words, tuple):
        raise TypeError(f"words must be a tuple of strings, got {type(op.words).__name__}")
    if len(op.words) > MAX_COUNT_WORDS:
        raise ValueError(f"words holds {len(op.words)} words; the limit is {MAX_COUNT_WORDS}")
    for i, word in enumerate(op.words):
        if not isinstance(word, str) or not word.strip() or len(word) > MAX_QUERY_CHARS:
            raise ValueError(
                f"words[{i}] must be a non-blank string of at most {MAX_QUERY_CHARS} "
                f"characters, got {word!r:.80}"
            )
    _check_keys_filter(op.keys, op.namespace)


def _check_weights(weights: object) -> None:
    if not isinstance(weights, tuple):
        raise TypeError(f"weights must be a tuple of (word, weight), got {type(weights).__name__}")
    if len(weights) > MAX_COUNT_WORDS:
        raise ValueError(f"weights holds {len(weights)} words; the limit is {MAX_COUNT_WORDS}")
    for i, pair in enumerate(weights):
        ok = isinstance(pair, tuple) and len(pair) == 2
        word, weight = pair if ok else (None, None)
        if not (isinstance(word, str) and word.strip() and len(word) <= MAX_QUERY_CHARS):
            raise ValueError(f"weights[{i}]: the word must be a non-blank string, got {pair!r:.80}")
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise ValueError(f"weights[{i}]: the weight must be a number, got {pair!r:.80}")
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"weights[{i}]: the weight must be finite and >= 0, got {weight!r}")


def _validate_search(op: SearchVectors | SearchText) -> None:
    if isinstance(op, SearchVectors):
        _check_model(op.model)
        _check_query_vector(op.vector)
        if not isinstance(op.with_data, bool):
            raise TypeError(f"with_data must be a bool, got {op.with_data!r}")
    else:
        if not isinstance(op.query, str) or not op.query.strip():
            raise ValueError(f"query must be a non-blank string, got {op.query!r:.80}")
        if len(op.query) > MAX_QUERY_CHARS:
            raise ValueError(
                f"query is {len(op.query)} characters long; the limit is {MAX_QUERY_CHARS}"
            )
        _check_weights(op.weights)
    if isinstance(op.k, bool) or not isinstance(op.k, int) or not 1 <= op.k <= MAX_SEARCH_K:
        raise ValueError(f"k must be an int from 1 to {MAX_SEARCH_K}, got {op.k!r}")
    _check_keys_filter(op.keys, op.namespace)


_T = TypeVar("_T")


def _frozen_array(value: Any, field: str, shape: str) -> npt.NDArray[np.float32]:
    """The caller's ``field`` as a private read-only C-contiguous float32 copy.

    Ops are immutable, so they hold their own copy; ``shape`` ("1-D", "2-D") words the error.
    """
    try:
        array = np.array(value, dtype=np.float32, order="C", copy=True)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{field} must be a numeric {shape} array: {exc}") from exc
    array.flags.writeable = False
    return array


def _as_query_vector(vector: Any) -> npt.NDArray[np.float32]:
    """The caller's query vector as a private 1-D float32 copy."""
    return _frozen_array(vector, "vector", "1-D")


def _as_vectors(vectors: Any) -> npt.NDArray[np.float32]:
    """The caller's vectors as a private C-contiguous float32 copy."""
    return _frozen_array(vectors, "vectors", "2-D")


def _tuple_of(values: Iterable[_T] | None, field: str, what: str) -> tuple[_T, ...] | None:
    """``values`` as a tuple (``None`` stays ``None``).

    A lone string is refused, naming ``field``: it would be read as an iterable of characters.
    """
    if values is None:
        return None
    if isinstance(values, str | bytes):
        raise TypeError(
            f"{field} must be an iterable of {what}, not a single {type(values).__name__}"
        )
    return tuple(values)


def _search_keys(keys: Iterable[Key] | None) -> tuple[Key, ...] | None:
    return _tuple_of(keys, "keys", "keys")


def _ids(ids: Iterable[str] | None) -> tuple[str, ...] | None:
    return _tuple_of(ids, "ids", "message ids")


class MemoryStore(Closing, abc.ABC):
    """Durable storage for messages and run snapshots.

    Subclasses implement :meth:`_batch` (and :meth:`close` if they hold resources).
    :meth:`batch` checks ``closed`` before calling ``_batch`` but outside any lock, so a
    backend must check it again under its own lock.
    ``append_messages`` is durable when it returns. Async twins (``a``-prefixed) never
    block the event loop: they run :meth:`_abatch`, by default :meth:`_batch` in a worker
    thread; a backend with async I/O overrides it.

    Example:
        >>> from marsys_mem.store import InMemoryStore
        >>> store = InMemoryStore()
        >>> key = ("default", "researcher", "main")
        >>> store.append_messages(key, [Message.user("hi")])
        >>> [m.text for m in store.load_messages(key)]
        ['hi']
    """

    closed: bool = False
    supports_vectors: ClassVar[bool] = False
    """Whether this backend stores vectors and executes :data:`VECTOR_OPS` (else they raise
    :class:`~marsys_mem.exceptions.StoreError`)."""
    supports_search: bool = False
    """Whether this store searches inside itself and executes :data:`SEARCH_OPS` (else they
    raise :class:`~marsys_mem.exceptions.StoreError`). A backend may decide it when it opens
    (PostgreSQL: whether its database has the ``vector`` extension)."""

    @abc.abstractmethod
    def _batch(self, ops: Sequence[Op]) -> list[Any]:
        """Execute validated ``ops`` in one transaction; all or nothing."""

    # ------------------------------------------------------------------ core
    def batch(self, ops: Iterable[Op]) -> list[Any]:
        """Validate and execute ``ops`` in one transaction; one result per op.

        Raises:
            ValueError, TypeError: a malformed op (nothing executed).
            DuplicateMessageError: an appended id is already stored under its key.
            StoreError: the backend failed (nothing written).
        """
        ops = self._accepted(ops)
        return self._returned(ops, self._batch(ops) if ops else [])

    async def abatch(self, ops: Iterable[Op]) -> list[Any]:
        """Async twin of :meth:`batch` (the backend's :meth:`_abatch`)."""
        ops = self._accepted(ops)
        return self._returned(ops, await self._abatch(ops) if ops else [])

    async def _abatch(self, ops: Sequence[Op]) -> list[Any]:
        """:meth:`_batch` without blocking the event loop: here, in a worker thread.

        A backend with async I/O of its own overrides it (PostgresStore: its async pool).
        """
        return await asyncio.to_thread(self._batch, ops)

    def _accepted(self, ops: Iterable[Op]) -> list[Op]:
        """``ops`` as a list, each validated, on an open store that executes it."""
        ops = list(ops)
        if self.closed:
            raise StoreError(f"{type(self).__name__} is closed")
        for op in ops:
            _validate(op)
            if not self.supports_vectors and isinstance(op, VECTOR_OPS):
                raise StoreError(
                    f"{type(self).__name__} does not store vectors ({type(op).__name__}); "
                    "check supports_vectors first"
                )
            if not self.supports_search and isinstance(op, SEARCH_OPS):
                raise StoreError(
                    f"{type(self).__name__} does not search inside the store "
                    f"({type(op).__name__}); check supports_search first, and search on "
                    "the host otherwise"
                )
        return ops

    def _returned(self, ops: list[Op], results: list[Any]) -> list[Any]:
        """The backend's ``results``, with the keys in them marked as the store's own."""
        for i, op in enumerate(ops):  # keys a store returns, it accepts back (internal too)
            if isinstance(op, ListKeys):
                results[i] = [stored_key(k) for k in results[i]]
            elif isinstance(op, SearchVectors | SearchText | ScoreVectors) and results[i]:
                found = {hit.key: stored_key(hit.key) for hit in results[i]}
                results[i] = tuple(replace(hit, key=found[hit.key]) for hit in results[i])
            elif isinstance(op, LoadDeletions) and results[i].keys:
                page = results[i]
                marked = {k: stored_key(k) for k in set(page.keys)}
                results[i] = replace(page, keys=tuple(marked[k] for k in page.keys))
        return results

    # ------------------------------------------------------------------ friendly methods
    def append_messages(self, key: Key, messages: Iterable[Message]) -> None:
        """Append messages to ``key``, atomically; durable when it returns."""
        self.batch([Append(key, tuple(messages))])

    def load_messages(
        self,
        key: Key,
        since: datetime | None = None,
        last: int | None = None,
        *,
        ids: Iterable[str] | None = None,
    ) -> list[Message]:
        """A key's messages, oldest first (``since``: timestamp >= since; ``last``: newest n).

        ``ids``: only the messages with these ids (unknown ones are ignored), e.g. the hits
        of a search.
        """
        result: list[Message] = self.batch([Load(key, since, last, _ids(ids))])[0]
        return result

    def delete_messages(
        self, key: Key, ids: Iterable[str] | None = None, before: datetime | None = None
    ) -> int:
        """Delete by ids and/or timestamp < ``before``; neither: the whole key. Returns count."""
        result: int = self.batch([Delete(key, _ids(ids), before)])[0]
        return result

    def count_messages(self, key: Key) -> int:
        """Messages stored under ``key``."""
        result: int = self.batch([CountMessages(key)])[0]
        return result

    def list_keys(self, namespace: str | None = None) -> list[Key]:
        """Keys that hold at least one message, sorted."""
        result: list[Key] = self.batch([ListKeys(namespace)])[0]
        return result

    def save_run(self, snapshot: RunSnapshot) -> None:
        """Save a run snapshot (replacing one with the same run_id)."""
        self.batch([SaveRun(snapshot)])

    def load_run(self, run_id: str) -> RunSnapshot | None:
        """The snapshot of ``run_id``, or ``None``."""
        result: RunSnapshot | None = self.batch([LoadRun(run_id)])[0]
        return result

    def list_runs(
        self,
        *,
        namespace: str | None = None,
        agent: str | None = None,
        parent_id: str | None = None,
    ) -> list[str]:
        """Run ids matching the filters, oldest first."""
        result: list[str] = self.batch([ListRuns(namespace, agent, parent_id)])[0]
        return result

    def enforce_retention(
        self,
        key: Key | None = None,
        *,
        ttl: timedelta | None = None,
        max_messages: int | None = None,
        now: datetime | None = None,
    ) -> int:
        """Delete what ``ttl`` / ``max_messages`` do not allow; returns the count deleted.

        The rule (and its order) is :mod:`marsys_mem.store.retention`'s.
        """
        now = now or datetime.now(UTC)
        result: int = self.batch([EnforceRetention(key, ttl, max_messages, now)])[0]
        return result

    def load_deletions(
        self, after: int | None = None, *, namespace: str | None = None
    ) -> DeletionPage:
        """Deletions logged after cursor ``after`` (``None``: just the current cursor).

        A cache calls it before it reads, and drops what was deleted (by this process, by
        a cascade, or by another process). See :mod:`marsys_mem.store.owners`.
        """
        result: DeletionPage = self.batch([LoadDeletions(after, namespace)])[0]
        return result

    def scrub(self) -> None:
        """Make deleted text unrecoverable from the store's files (call after a forget).

        A backend with files of its own (SQLite: the WAL checkpointed and truncated;
        deleted pages are zeroed by ``secure_delete``) overrides it; the default does
        nothing (memory is freed; PostgreSQL leaves dead rows to its VACUUM).
        """

    def load_messages_after(self, key: Key, after: int = 0) -> MessagePage:
        """Messages appended to ``key`` after cursor ``after``, the next cursor, the count.

        Needs :attr:`supports_vectors`. ``after=0``: every message of the key.
        """
        result: MessagePage = self.batch([LoadAfter(key, after)])[0]
        return result

    def put_vectors(self, key: Key, model: str, message_ids: Iterable[str], vectors: Any) -> int:
        """Store ``model`` vectors of messages of ``key`` (row i: ``message_ids[i]``).

        Needs :attr:`supports_vectors`. A message's earlier vector of ``model`` is
        replaced. Returns the number stored.

        Raises:
            MessageNotFoundError: a message id is not stored under ``key`` (nothing stored).
            ValueError: bad shape, NaN or infinity, or a dimension other than the one the
                store holds ``model``'s vectors in.
        """
        op = PutVectors(key, model, tuple(_ids(message_ids) or ()), _as_vectors(vectors))
        result: int = self.batch([op])[0]
        return result

    def load_vectors(
        self, key: Key | None, model: str, *, after: int = 0, limit: int | None = None
    ) -> VectorPage:
        """``model`` vectors written after cursor ``after`` (``key=None``: every key).

        Needs :attr:`supports_vectors`. Returns a :class:`VectorPage` whose ``cursor``
        is the ``after`` of the next call.
        """
        result: VectorPage = self.batch([LoadVectors(key, model, after, limit)])[0]
        return result

    def search_vectors(
        self,
        model: str,
        vector: Any,
        k: int,
        *,
        keys: Iterable[Key] | None = None,
        namespace: str | None = None,
    ) -> list[SearchHit]:
        """The ``k`` stored ``model`` vectors most similar to ``vector`` (cosine), best first.

        Needs :attr:`supports_search`. ``keys``: only those keys' messages; ``namespace``:
        only that namespace's; neither: the whole store. See :class:`SearchVectors`.

        Raises:
            StoreError: the store does not search (``supports_search`` is false).
            ValueError, TypeError: bad input, named (nothing searched).
        """
        op = SearchVectors(model, _as_query_vector(vector), k, _search_keys(keys), namespace)
        return list(self.batch([op])[0])

    def search_text(
        self,
        query: str,
        k: int,
        *,
        keys: Iterable[Key] | None = None,
        namespace: str | None = None,
    ) -> list[SearchHit]:
        """The ``k`` messages that best match ``query``'s words, best first.

        Needs :attr:`supports_search`. Filters as :meth:`search_vectors`; see
        :class:`SearchText`.
        """
        return list(self.batch([SearchText(query, k, _search_keys(keys), namespace)])[0])

    def load_around(
        self,
        key: Key,
        ids: Iterable[str],
        before: int = 0,
        after: int = 0,
        *,
        thread: str | None = "thread",
    ) -> list[Message]:
        """The messages of ``ids`` and the turns around them in their thread, oldest first.

        Every backend executes it; see :class:`LoadAround`.
        """
        op = LoadAround(key, _ids(ids) or (), before, after, thread)
        found: list[Message] = self.batch([op])[0]
        return found

    def score_vectors(
        self, model: str, vector: Any, key: Key, ids: Iterable[str]
    ) -> list[SearchHit]:
        """The exact cosines of ``vector`` to the ``model`` vectors of ``ids`` in ``key``.

        Needs :attr:`supports_search`; see :class:`ScoreVectors`.
        """
        op = ScoreVectors(model, _as_query_vector(vector), key, _ids(ids) or ())
        return list(self.batch([op])[0])

    def count_matches(
        self,
        words: Iterable[str],
        *,
        keys: Iterable[Key] | None = None,
        namespace: str | None = None,
    ) -> dict[str, int]:
        """How many messages each word matches by keyword (one round trip).

        Needs :attr:`supports_search`; see :class:`CountMatches`.
        """
        words = tuple(words) if not isinstance(words, str) else (words,)
        found: dict[str, int] = self.batch([CountMatches(words, _search_keys(keys), namespace)])[0]
        return found

    # ------------------------------------------------------------------ async twins
    async def asearch_vectors(
        self,
        model: str,
        vector: Any,
        k: int,
        *,
        keys: Iterable[Key] | None = None,
        namespace: str | None = None,
    ) -> list[SearchHit]:
        """Async twin of :meth:`search_vectors`."""
        op = SearchVectors(model, _as_query_vector(vector), k, _search_keys(keys), namespace)
        return list((await self.abatch([op]))[0])

    async def asearch_text(
        self,
        query: str,
        k: int,
        *,
        keys: Iterable[Key] | None = None,
        namespace: str | None = None,
    ) -> list[SearchHit]:
        """Async twin of :meth:`search_text`."""
        op = SearchText(query, k, _search_keys(keys), namespace)
        return list((await self.abatch([op]))[0])

    async def aload_around(
        self,
        key: Key,
        ids: Iterable[str],
        before: int = 0,
        after: int = 0,
        *,
        thread: str | None = "thread",
    ) -> list[Message]:
        """Async twin of :meth:`load_around`."""
        op = LoadAround(key, _ids(ids) or (), before, after, thread)
        found: list[Message] = (await self.abatch([op]))[0]
        return found

    async def ascore_vectors(
        self, model: str, vector: Any, key: Key, ids: Iterable[str]
    ) -> list[SearchHit]:
        """Async twin of :meth:`score_vectors`."""
        op = ScoreVectors(model, _as_query_vector(vector), key, _ids(ids) or ())
        return list((await self.abatch([op]))[0])

    async def acount_matches(
        self,
        words: Iterable[str],
        *,
        keys: Iterable[Key] | None = None,
        namespace: str | None = None,
    ) -> dict[str, int]:
        """Async twin of :meth:`count_matches`."""
        words = tuple(words) if not isinstance(words, str) else (words,)
        op = CountMatches(words, _search_keys(keys), namespace)
        found: dict[str, int] = (await self.abatch([op]))[0]
        return found

    async def aload_messages_after(self, key: Key, after: int = 0) -> MessagePage:
        """Async twin of :meth:`load_messages_after`."""
        result: MessagePage = (await self.abatch([LoadAfter(key, after)]))[0]
        return result

    async def aput_vectors(
        self, key: Key, model: str, message_ids: Iterable[str], vectors: Any
    ) -> int:
        """Async twin of :meth:`put_vectors`."""
        op = PutVectors(key, model, tuple(_ids(message_ids) or ()), _as_vectors(vectors))
        result: int = (await self.abatch([op]))[0]
        return result

    async def aload_vectors(
        self, key: Key | None, model: str, *, after: int = 0, limit: int | None = None
    ) -> VectorPage:
        """Async twin of :meth:`load_vectors`."""
        result: VectorPage = (await self.abatch([LoadVectors(key, model, after, limit)]))[0]
        return result

    async def aappend_messages(self, key: Key, messages: Iterable[Message]) -> None:
        """Async twin of :meth:`append_messages`."""
        await self.abatch([Append(key, tuple(messages))])

    async def aload_messages(
        self,
        key: Key,
        since: datetime | None = None,
        last: int | None = None,
        *,
        ids: Iterable[str] | None = None,
    ) -> list[Message]:
        """Async twin of :meth:`load_messages`."""
        result: list[Message] = (await self.abatch([Load(key, since, last, _ids(ids))]))[0]
        return result

    async def adelete_messages(
        self, key: Key, ids: Iterable[str] | None = None, before: datetime | None = None
    ) -> int:
        """Async twin of :meth:`delete_messages`."""
        result: int = (await self.abatch([Delete(key, _ids(ids), before)]))[0]
        return result

    async def acount_messages(self, key: Key) -> int:
        """Async twin of :meth:`count_messages`."""
        result: int = (await self.abatch([CountMessages(key)]))[0]
        return result

    async def alist_keys(self, namespace: str | None = None) -> list[Key]:
        """Async twin of :meth:`list_keys`."""
        result: list[Key] = (await self.abatch([ListKeys(namespace)]))[0]
        return result

    async def alist_runs(
        self,
        *,
        namespace: str | None = None,
        agent: str | None = None,
        parent_id: str | None = None,
    ) -> list[str]:
        """Async twin of :meth:`list_runs`."""
        result: list[str] = (await self.abatch([ListRuns(namespace, agent, parent_id)]))[0]
        return result

    async def asave_run(self, snapshot: RunSnapshot) -> None:
        """Async twin of :meth:`save_run`."""
        await self.abatch([SaveRun(snapshot)])

    async def aload_run(self, run_id: str) -> RunSnapshot | None:
        """Async twin of :meth:`load_run`."""
        result: RunSnapshot | None = (await self.abatch([LoadRun(run_id)]))[0]
        return result

    async def aenforce_retention(
        self,
        key: Key | None = None,
        *,
        ttl: timedelta | None = None,
        max_messages: int | None = None,
        now: datetime | None = None,
    ) -> int:
        """Async twin of :meth:`enforce_retention`."""
        now = now or datetime.now(UTC)
        result: int = (await self.abatch([EnforceRetention(key, ttl, max_messages, now)]))[0]
        return result

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Release resources; further calls raise ``StoreError``. Idempotent."""
        self.closed = True
