"""RAGMemory: retrieval over messages, dense (embeddings) + BM25 keywords, fused.

Writes never wait for a model (embedding runs batched in the background), and a search
sees every message added before it. With a store, the store is the source of truth: the
vector index is a cache, rebuilt or repaired from it, and a removed message is never
returned. Without the ``embeddings`` extra, search is BM25 only (one notice).

Guide (ranking modes and options, speed, persistence, shared vectors, search in the
store): ``docs/guides/patterns.md#rag-search-in-depth``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, Unpack, overload

import numpy as np
import numpy.typing as npt

from marsys_mem.exceptions import (
    DuplicateMessageError,
    EmbeddingError,
    MessageNotFoundError,
    StoreError,
)
from marsys_mem.lifecycle import Closing
from marsys_mem.model.messages import Message
from marsys_mem.model.ranking import Ingest, PresetName, RagOptions, Ranking, resolve_settings
from marsys_mem.patterns.shared_vectors import SharedVectors
from marsys_mem.patterns.store_search import (
    Found,
    StoreSearch,
    TextPages,
    TextTurns,
    TurnLike,
    keyword_text,
)
from marsys_mem.retrieval.ahead import WorkAhead
from marsys_mem.retrieval.answers import answers_question, in_first_person, tells_of_self
from marsys_mem.retrieval.bm25 import BM25Index
from marsys_mem.retrieval.calibration import (
    DEFAULT_MIN_SCORE,
    EVIDENCE_DEPTH,
    bm25_ceiling,
    calibrated,
)
from marsys_mem.retrieval.dates import Period, asks_when, mentions_time, query_period
from marsys_mem.retrieval.embeddings import Embedder, default_embedder, embed_query
from marsys_mem.retrieval.index import FaissIndex, QueryScores
from marsys_mem.retrieval.query_names import PARTICIPANT_SHARE, without_names
from marsys_mem.retrieval.questions import asks
from marsys_mem.retrieval.scoring import (
    MODES,
    Candidate,
    Fusion,
    MessageFilter,
    ScoredMessage,
    SearchMode,
    check_query,
    context_rows,
    cue_scores,
    diversify,
    finite_number,
    fuse_scores,
    make_filter,
    positive_int,
    rank_in_context,
)
from marsys_mem.retrieval.speakers import SpeakerNames, speaker_of
from marsys_mem.retrieval.threads import LabelSlots, SlotArray, SlotMemo, ThreadLinks, distinct
from marsys_mem.retrieval.vector_sync import StoredVectors, VectorSync
from marsys_mem.store.base import Append, Key, Load, MemoryStore, PutVectors, validate_key
from marsys_mem.store.owners import DeletionFeed

__all__ = ["Fusion", "Ingest", "RAGMemory", "Ranking", "ScoredMessage", "SearchMode"]

log = logging.getLogger("marsys_mem.patterns.rag")

_notice_given = False
_notice_lock = threading.Lock()


def _has_row(rows: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    has: npt.NDArray[np.bool_] = rows >= 0
    return has


def _flags(
    turns: Sequence[TurnLike | None], has: Callable[[int, TurnLike], bool]
) -> npt.NDArray[np.bool_]:
    """``has(i, turn)`` for each turn (``False`` where the message is gone)."""
    return np.fromiter(
        (m is not None and has(i, m) for i, m in enumerate(turns)), dtype=bool, count=len(turns)
    )


def _answers(
    links: ThreadLinks,
    need: SlotArray,
    grid: npt.NDArray[np.intp],
    messages: Mapping[str, TurnLike],
    asked_of: Callable[[SlotArray], npt.NDArray[np.int64]] | None = None,
) -> npt.NDArray[np.bool_]:
    """Which candidates (``grid[0]``) answer the turn before them (``grid[1]``).

    That turn asks and another speaker wrote it
    (:func:`~marsys_mem.retrieval.answers.answers_question`); ``need`` holds the slots of
    ``links`` that the grid's cells point at (``len(need)``: no such turn);
    ``asked_of(slots)``: whether the messages of ``slots`` ask, 1 or 0 (memoised; ``None``:
    worked out here from their texts).
    """
    m = len(need)
    asked = np.zeros(m + 1, dtype=bool)
    speakers = np.full(m + 1, -1, dtype=np.intp)
    before = grid[1]
    cells, _ = distinct(before[before < m])  # the turns before: which ask
    if asked_of is not None:
        asked[cells] = asked_of(need[cells]) > 0
    else:
        for cell, mid in zip(cells.tolist(), links.ids_of(need[cells]), strict=True):
            turn = messages.get(mid)
            asked[cell] = turn is not None and asks(turn.text)
    after = asked[before].nonzero()[0]  # only the turns after one that asks: who wrote them
    if not len(after):
        return np.zeros(len(before), dtype=bool)
    cells, _ = distinct(np.concatenate([grid[0][after], before[after]]))
    codes: dict[str | None, int] = {}
    for cell, mid in zip(cells.tolist(), links.ids_of(need[cells]), strict=True):
        turn = messages.get(mid)
        if turn is not None:
            speakers[cell] = codes.setdefault(speaker_of(turn), len(codes))
    return answers_question(asked, speakers, grid[0], before)


def _bm25_only_notice() -> None:
    global _notice_given
    with _notice_lock:
        if _notice_given:
            return
        _notice_given = True
    log.warning(
        "RAGMemory: no embedding model (pip install 'marsys-mem[embeddings]'); "
        "retrieval is BM25 keyword search only"
    )


OwnScores = tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_], npt.NDArray[np.float64]]
"""Messages' own scores, for the ranker: their cosines (0.0: no vector), which have a vector,
and their keyword scores."""

_SETTINGS = frozenset(Ranking.model_fields) - {"mode"} | frozenset(Ingest.model_fields)
"""Fields of the ranking and ingest, which are not the memory's attributes (but ``mode``)."""

_BUILT_WITH = ("k1", "b", "index_names", "thread_key")
"""The ranking's fields the indexes are built with: fixed for a memory's life."""

_SPREAD = 2
"""How many turns after a hit become candidates (each is still scored with all its context)."""
_CUED = 100
"""How many of the best hybrid candidates the time, speaker and question cues may lift."""


@dataclass(frozen=True, slots=True)
class _Cues:
    """What a hybrid query gives before its vector, worked out beside the forward pass.

    ``bm25`` holds the best ``depth`` keyword hits and ``bm25_slots`` their thread slots,
    read when the keyword index was at ``generation`` (used only while it still is, for
    the same depth: the thread links change with the keyword index). ``speaker``: the one
    participant the query as asked names (the keyword hits are of its content, without
    the names: ``strip_names``).
    """

    period: Period | None
    when: bool
    speaker: str | None
    bm25: list[tuple[str, float]]
    bm25_slots: SlotArray
    depth: int
    generation: int

    def current(self, bm25: BM25Index, depth: int) -> bool:
        """Whether the keyword hits still hold for ``bm25`` at ``depth``."""
        return self.depth == depth and self.generation == bm25.generation


class _Ranked(Sequence[Candidate]):
    """Hybrid candidates best first, made into tuples only when read.

    A search reads few of its hundreds of candidates (the ``k`` hits; the ``_CUED`` best
    for the time cues), so the candidates stay in arrays (thread slots, scores, cosines
    with NaN for "no vector", BM25 scores) after the ``head``: candidates already made.
    Valid while the thread links do not change: read it under the memory's lock.
    """

    __slots__ = ("_bm25", "_dense", "_fused", "_head", "_links", "_slots")

    def __init__(
        self,
        links: ThreadLinks,
        slots: npt.NDArray[np.intp],
        fused: npt.NDArray[np.float64],
        dense: npt.NDArray[np.float64],
        bm25: npt.NDArray[np.float64],
        head: Sequence[Candidate] = (),
    ) -> None:
        self._links = links
        self._slots = slots
        self._fused = fused
        self._dense = dense
        self._bm25 = bm25
        self._head = list(head)

    @classmethod
    def of(cls, links: ThreadLinks, candidates: Sequence[Candidate]) -> _Ranked:
        """Candidates already made."""
        empty = np.zeros(0)
        return cls(links, np.zeros(0, dtype=np.intp), empty, empty, empty, candidates)

    def __len__(self) -> int:
        return len(self._head) + len(self._slots)

    @overload
    def __getitem__(self, i: int) -> Candidate: ...
    @overload
    def __getitem__(self, i: slice) -> list[Candidate]: ...
    def __getitem__(self, i: int | slice) -> Candidate | list[Candidate]:
        if isinstance(i, slice):
            return list(self)[i]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(i)
        i %= n
        if i < len(self._head):
            return self._head[i]
        return self._made(i - len(self._head), i - len(self._head) + 1)[0]

    def __iter__(self) -> Iterator[Candidate]:
        yield from self._head
        start, n = 0, len(self._slots)
        while start < n:  # in growing chunks: a search mostly stops after the first
            stop = min(n, max(16, 2 * start))
            yield from self._made(start, stop)
            start = stop

    def _made(self, start: int, stop: int) -> list[Candidate]:
        dense = self._dense[start:stop].astype(object)
        dense[np.isnan(self._dense[start:stop])] = None  # no vector
        return list(
            zip(
                self._links.ids_of(self._slots[start:stop]),
                self._fused[start:stop].tolist(),
                dense.tolist(),
                self._bm25[start:stop].tolist(),
                strict=True,
            )
        )

    def split(self, n: int) -> tuple[list[Candidate], _Ranked]:
        """The first ``n`` candidates, made, and the rest."""
        head = self._head[:n]
        k = n - len(head)
        rest = _Ranked(
            self._links,
            self._slots[k:],
            self._fused[k:],
            self._dense[k:],
            self._bm25[k:],
            self._head[n:],
        )
        return head + self._made(0, max(k, 0)), rest

    def divided(self, norm: float, head: Sequence[Candidate] = ()) -> _Ranked:
        """``head``, then these candidates with their scores divided by ``norm``."""
        return _Ranked(
            self._links,
            self._slots,
            self._fused / norm,
            self._dense,
            self._bm25,
            [*head, *((mid, score / norm, d, b) for mid, score, d, b in self._head)],
        )


class RAGMemory(Closing):
    """Searchable memory of messages: dense + BM25 hybrid retrieval, durable if asked.

    Args:
        embedder: an :class:`~marsys_mem.retrieval.embeddings.Embedder`; ``"default"`` (the packaged
            all-MiniLM-L6-v2 when the ``embeddings`` extra is installed, else BM25 only
            with one logged notice); ``None`` for BM25 only.
        store: a :class:`~marsys_mem.store.MemoryStore` to write through to and load from.
            The memory does not close it.
        key: the store key ``(namespace, agent, branch)`` the messages live under.
        owner: the key whose messages these are copies of (deleting one there deletes
            its copy here); needs a ``store``.
        index_path: where to save the vector index (needs a ``store``: the index is derived
            data and is checked against, or rebuilt from, the store's messages).
        ranking: how a search ranks (:class:`~marsys_mem.model.ranking.Ranking`): the
            model, a preset's name (``"conversation"``, the default, or ``"notes"``), or
            a mapping of its fields.
        ingest: how messages are taken in (:class:`~marsys_mem.model.ranking.Ingest`):
            the model or a mapping of its fields. On a store that searches
            (:attr:`stateless`) ``add`` always embeds before returning: a message and its
            vector are written in one transaction.
        **options: any single field of either (``mode="bm25"``, ``context_turns=0``,
            ``background=False``: :class:`~marsys_mem.model.ranking.RagOptions`), on top
            of ``ranking`` and ``ingest``.

    Raises:
        TypeError: an option that is no field of ``Ranking`` or ``Ingest``.
        ValueError: a bad value (the error names the field and the value).

    Thread-safe: one lock guards the indexes; the background thread takes it only to add
    the vectors of a finished batch.

    Example:
        >>> from marsys_mem.retrieval.embeddings import HashingEmbedder
        >>> mem = RAGMemory(HashingEmbedder())
        >>> mid = mem.add("My sister Clara lives in Lisbon", name="alice")
        >>> ids = mem.add_many(["I parked the car on level 4", "Lovely weather today"])
        >>> hit = mem.search("Where did I park the car?", k=1)[0]
        >>> hit.text, hit.rank, len(mem)
        ('I parked the car on level 4', 1, 3)
        >>> [h.text for h in mem.search("Clara", k=3, agent="alice")]
        ['My sister Clara lives in Lisbon']
        >>> mem.remove(mid), len(mem)
        (1, 2)
        >>> mem.close()

        With the real model the match is by meaning (needs the ``embeddings`` extra)::

        >>> mem = RAGMemory()  # doctest: +SKIP
        >>> _ = mem.add("My puppy is called Biscuit")  # doctest: +SKIP
        >>> mem.search("What is the dog's name?", k=1)[0].text  # doctest: +SKIP
        'My puppy is called Biscuit'
    """

    def __init__(
        self,
        embedder: Embedder | Literal["default"] | None = "default",
        *,
        store: MemoryStore | None = None,
        key: tuple[str, str, str] = ("default", "rag", "main"),
        owner: tuple[str, str, str] | None = None,
        index_path: str | Path | None = None,
        ranking: Ranking | PresetName | Mapping[str, Any] | None = None,
        ingest: Ingest | Mapping[str, Any] | None = None,
        **options: Unpack[RagOptions],
    ) -> None:
        self._ranking, self._ingest = resolve_settings(ranking, ingest, options)
        mode = self._ranking.mode
        self._speakers = SpeakerNames()  # who takes part, and what the others call them
        self.key: Key = validate_key(key)
        self.owner: Key | None = validate_key(owner) if owner is not None else None
        if owner is not None and store is None:
            raise ValueError("owner needs a store: the links to the owner's messages are stored")
        if store is not None and not isinstance(store, MemoryStore):
            raise TypeError(f"store must be a MemoryStore, got {type(store).__name__}")
        if index_path is not None and store is None:
            raise ValueError(
                "index_path needs a store: the saved index is checked against (and rebuilt "
                "from) the store's messages; pass store=SQLiteStore(...)"
            )
        if isinstance(embedder, str):
            if embedder != "default":
                raise ValueError(
                    f"embedder must be an Embedder, None or 'default', got {embedder!r}"
                )
            resolved = default_embedder()
            if resolved is None:
                _bm25_only_notice()
            embedder = resolved
        if embedder is None and mode == "dense":
            raise ValueError("mode='dense' needs an embedder")
        self.embedder: Embedder | None = embedder
        self.mode: SearchMode = mode if embedder is not None else "bm25"
        self.store = store
        self.index_path = Path(index_path) if index_path is not None else None
        self._lock = threading.RLock()
        self._messages: dict[str, Message] = {}
        self._says_when: dict[str, bool] = {}  # message -> mentions_time(text), when first asked
        self._of_self: dict[str, float] = {}  # message -> tells_of_self(text), when first asked
        self._bm25 = BM25Index(k1=self.ranking.k1, b=self.ranking.b)
        self._links = ThreadLinks()
        # per thread slot (which is also the message's BM25 slot): its vector label
        # per thread slot: the storage row of the message's vector, for one index layout
        self._row_memo: tuple[FaissIndex | None, int, SlotMemo] = (None, -1, SlotMemo())
        # whether each message of the thread links asks (1) or not (0), by slot
        self._asks_memo = SlotMemo()
        self._slot_memo: tuple[FaissIndex | None, LabelSlots] = (None, LabelSlots())
        self._closed = False
        # the vectors in the store (set by _open when they go through it)
        self._shared_vectors: SharedVectors | None = None
        self._feed: DeletionFeed | None = None
        # the store searches: no messages or vectors held here (add embeds inline)
        self._in_store: StoreSearch | None = None
        if store is not None and embedder is not None and self._searches_in_store():
            self._in_store = StoreSearch(store, self.key, embedder.name, self._ranking)
        # the vector index, kept in step with the messages (None: no embedder)
        self._vectors: VectorSync | None = None
        if embedder is not None:
            self._vectors = VectorSync(
                embedder,
                self.ingest,
                lock=self._lock,
                text_of=self._indexed_text,
                persist=self._persist_vectors,
                index_path=self.index_path,
                background=self.ingest.background and not self._stateless,
            )
        try:
            self._open()
        except BaseException:
            if self._vectors is not None:
                self._vectors.close()
            raise

    # ------------------------------------------------------------------ settings
    def __getattr__(self, name: str) -> Any:
        # only for names not found: a ranking or ingest field asked of the memory
        if name in _SETTINGS:
            where = "ranking" if name in Ranking.model_fields else "ingest"
            raise AttributeError(
                f"RAGMemory has no attribute {name!r}: it is a field of its {where} "
                f"(mem.{where}.{name})"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _SETTINGS:
            raise AttributeError(
                f"RAGMemory.{name} is a field of its ranking or ingest: set "
                f"mem.ranking = mem.ranking.replace({name}=...) (ranking fields only)"
            )
        super().__setattr__(name, value)

    @property
    def ranking(self) -> Ranking:
        """How searches rank (:class:`~marsys_mem.model.ranking.Ranking`).

        It may be replaced by another ranking, except for the fields the indexes were
        built with (``k1``, ``b``, ``index_names``, ``thread_key``: a new memory for those).

        Example:
            >>> from marsys_mem.retrieval.embeddings import HashingEmbedder
            >>> mem = RAGMemory(HashingEmbedder(), ranking="notes")
            >>> mem.ranking.context_turns
            0
            >>> mem.ranking = mem.ranking.replace(diversity=0.1)
            >>> mem.close()
        """
        return self._ranking

    @ranking.setter
    def ranking(self, value: Ranking) -> None:
        if not isinstance(value, Ranking):
            raise TypeError(f"ranking must be a Ranking, got {type(value).__name__}")
        fixed = [f for f in _BUILT_WITH if getattr(value, f) != getattr(self._ranking, f)]
        if fixed:
            raise ValueError(
                f"the indexes of this RAGMemory were built with {fixed[0]}="
                f"{getattr(self._ranking, fixed[0])!r}; a new memory is needed for "
                f"{getattr(value, fixed[0])!r}"
            )
        if value.mode == "dense" and self.embedder is None:
            raise ValueError("mode='dense' needs an embedder; this RAGMemory has none")
        with self._lock:
            self._ranking = value
            self.mode = value.mode if self.embedder is not None else "bm25"

    @property
    def ingest(self) -> Ingest:
        """How messages are taken in (:class:`~marsys_mem.model.ranking.Ingest`; fixed)."""
        return self._ingest

    # ------------------------------------------------------------------ opening
    def _open(self) -> None:
        """Load the store's messages and bring the vector index in line with them.

        On a store that searches: nothing to load.
        """
        if self.store is not None:  # before reading: no deletion falls between
            self._feed = DeletionFeed(self.store.load_deletions, self.key[0])
        if self._stateless:
            return
        messages: list[Message] = []
        stored: StoredVectors | None = None
        if self.store is not None and self.embedder is not None and self._share_vectors():
            self._shared_vectors = SharedVectors(self.store, self.key, self.embedder)
            messages, stored = self._shared_vectors.read_all()
        elif self.store is not None:
            messages = self.store.load_messages(self.key)
        with self._lock:
            for m in messages:
                self._index_text_locked(m)
            self._bm25.warm()  # a big index's common words, ready for the first searches
            want = [mid for mid in self._messages if mid in self._bm25]
        if self._vectors is not None:
            self._vectors.load(want, stored)

    @property
    def _shared(self) -> bool:
        """Whether the vectors go through the store (:class:`SharedVectors`)."""
        return self._shared_vectors is not None

    def _share_vectors(self) -> bool:
        return SharedVectors.possible(self.store, self.embedder)

    def _searches_in_store(self) -> bool:
        """Whether to search in the store (decided when opening): it can, and vectors fit."""
        store = self.store
        return store is not None and store.supports_search and self._share_vectors()

    @property
    def stateless(self) -> bool:
        """Whether searches run in the store and this memory holds no messages or vectors.

        Example:
            >>> from marsys_mem.store import InMemoryStore
            >>> mem = RAGMemory(None, store=InMemoryStore())  # a store that does not search
            >>> mem.stateless
            False
            >>> mem.close()
        """
        return self._in_store is not None

    @property
    def _stateless(self) -> bool:
        return self._in_store is not None

    @property
    def _searching(self) -> StoreSearch:
        """The store's search (only on a store that searches: :attr:`stateless`)."""
        assert self._in_store is not None
        return self._in_store

    def _persist_vectors(self, ids: Sequence[str], vectors: npt.NDArray[np.float32]) -> None:
        """Vectors just indexed: written to the store when it keeps them."""
        if self._shared_vectors is not None:
            self._shared_vectors.persist(ids, vectors)

    def _catch_up(self) -> tuple[int, int]:
        """Read what the store has that this memory lacks (shared vectors only).

        Messages appended after the message cursor are indexed for BM25; their stored
        vectors (and any vector written after the vector cursor) go into the index; those
        without one are embedded and stored. Messages deleted from the store are dropped.

        Returns:
            ``(added, removed)`` message counts.
        """
        shared, sync = self._shared_vectors, self._vectors
        assert shared is not None
        assert sync is not None
        assert self.store is not None
        with self._lock:  # adds and removes hold it over their store write: one view
            found = shared.read_new()
            new = [m for m in found.messages if m.message_id not in self._messages]
            for m in new:
                self._index_text_locked(m)
            removed = 0
            if found.count != len(self._messages):  # some were deleted: find which
                stored = {m.message_id for m in self.store.load_messages(self.key)}
                gone = [mid for mid in self._messages if mid not in stored]
                if gone:
                    self._forget_locked(gone)
                removed = len(gone)
            if found.vectors is not None:
                sync.adopt_locked(*found.vectors)
            index = sync.index
            todo = [
                m.message_id
                for m in new
                if m.message_id in self._bm25
                and m.message_id not in index
                and not sync.is_pending(m.message_id)
            ]
        sync.embed_ids(todo)
        return len(new), removed

    def _indexed_text(self, message_id: str) -> str | None:
        """The text of a message this memory holds and indexes (``None``: not held)."""
        m = self._messages.get(message_id)
        return m.text if m is not None and message_id in self._bm25 else None

    @property
    def _index(self) -> FaissIndex | None:
        """The vector index (``None``: no embedder)."""
        return self._vectors.index if self._vectors is not None else None

    def _wait(self, timeout: float | None = None) -> None:
        """Wait for the pending embeddings (see :meth:`VectorSync.wait`)."""
        if self._vectors is not None:
            self._vectors.wait(timeout)

    # ------------------------------------------------------------------ container protocol
    def __len__(self) -> int:
        if self._stateless:
            return self._searching.count()
        return len(self._messages)

    def __contains__(self, message_id: object) -> bool:
        if self._stateless:
            return (
                isinstance(message_id, str)
                and bool(message_id)
                and bool(self._searching.load([message_id]))
            )
        return isinstance(message_id, str) and message_id in self._messages

    def __iter__(self) -> Iterator[Message]:
        return iter(self.messages())

    def get(self, message_id: str) -> Message:
        """The message with ``message_id``.

        Raises:
            MessageNotFoundError: no such message.
        """
        if self._stateless:
            return self._searching.get(message_id)
        try:
            return self._messages[message_id]
        except (KeyError, TypeError):
            raise MessageNotFoundError(f"no message {message_id!r} in this RAGMemory") from None

    def messages(self) -> list[Message]:
        """All messages, in the order they were added (on a store that searches: read from it)."""
        if self._stateless:
            return self._searching.messages()
        with self._lock:
            return list(self._messages.values())

    @property
    def pending(self) -> int:
        """Messages whose embedding has not been indexed yet."""
        return self._vectors.pending if self._vectors is not None else 0

    @property
    def failed(self) -> dict[str, str]:
        """Messages the embedder failed on (id -> reason): found by keywords only.

        They are embedded again by the next ``RAGMemory`` opened on the same store and
        ``index_path``.
        """
        return self._vectors.failed() if self._vectors is not None else {}

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    # ------------------------------------------------------------------ writing
    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("RAGMemory is closed")

    def _text_of(self, m: Message) -> str:
        text = m.text
        if not text.strip():
            raise EmbeddingError(
                f"message {m.message_id!r} has no text to index (content {m.content!r})"
            )
        if len(text) > self.ingest.max_chars:
            raise EmbeddingError(
                f"message {m.message_id!r} is {len(text)} characters long; the limit is "
                f"max_chars={self.ingest.max_chars}"
            )
        return text

    def _index_text_locked(self, m: Message) -> None:
        """Add a stored message to the message map and BM25 (texts it cannot index: map only)."""
        self._messages[m.message_id] = m
        try:
            text = self._text_of(m)
        except EmbeddingError:
            log.debug("RAGMemory: message %s has no indexable text", m.message_id)
            return
        self._bm25.add(m.message_id, self._keyword_text(m, text))
        self._link_locked(m)

    def _link_locked(self, m: Message) -> None:
        """Link a message BM25 just indexed into its thread, in BM25's slot.

        One slot per message for both: a candidate's thread slot reads its keyword score.
        """
        slot = self._bm25.slot_of(m.message_id)
        assert slot is not None  # indexed just before
        thread = self._thread_of(m)
        self._links.add(m.message_id, thread, slot=slot)
        self._speakers.observe(speaker_of(m), m.text, thread)

    def _keyword_text(self, m: TurnLike, text: str) -> str:
        """What BM25 indexes: the text, after the speaker's name (``index_names``)."""
        return keyword_text(m, text, self.ranking.index_names)

    def _context_window(self) -> tuple[int, int] | None:
        """The turns before and after a hit that :meth:`_rank_candidates` reads (or ``None``).

        Its candidates are a hit, ``reply`` turns before it and ``min(turns, _SPREAD)``
        after; each candidate reads ``turns`` turns before it and ``reply`` after.
        """
        turns = self.ranking.context_turns
        if not turns or not (
            self.ranking.thread_weight or self.ranking.context_weight or self.ranking.reply_weight
        ):
            return None  # (the ranker's in_context, with turns to walk)
        reply = 1 if self.ranking.reply_weight else 0
        return reply + turns, min(turns, _SPREAD) + reply

    def _ask_flags(self, ids: list[str]) -> npt.NDArray[np.int64]:
        """Whether each of this memory's messages ``ids`` asks a question: 1 or 0."""
        messages = self._messages
        return np.fromiter(
            (1 if (m := messages.get(mid)) is not None and asks(m.text) else 0 for mid in ids),
            dtype=np.int64,
            count=len(ids),
        )

    def _thread_of(self, m: TurnLike) -> str:
        """The conversation thread of ``m``: ``metadata[thread_key]``, else one shared thread."""
        if self.ranking.thread_key is None:
            return ""
        value = m.metadata.get(self.ranking.thread_key)
        return "" if value is None else f"#{value}"

    def _session_of(self, mid: str, messages: Mapping[str, TurnLike]) -> tuple[str, str]:
        """The session of a message, for :func:`diversify`: its thread and its day."""
        m = messages.get(mid)
        if m is None:
            return ("", mid)
        session = m.metadata.get("session")
        if isinstance(session, str):
            return (self._thread_of(m), session)
        return (self._thread_of(m), m.timestamp.date().isoformat())

    @staticmethod
    def _to_message(item: Message | str, fields: Mapping[str, Any]) -> Message:
        if isinstance(item, str):
            return Message.user(item, **fields)
        if isinstance(item, Message):
            return item.model_copy(update=dict(fields)) if fields else item
        raise TypeError(f"expected a Message or a str, got {type(item).__name__}")

    def add(self, message: Message | str, **fields: Any) -> str:
        """Add a message (a str becomes ``Message.user(text, **fields)``); returns its id.

        BM25 indexes it at once; the embedding is computed in the background (with
        ``background=False``: before returning). With a store, the message is durable
        when this returns.

        Raises:
            EmbeddingError: no text, or more than ``max_chars`` characters (nothing changed);
                without background, also a failing embedder.
            DuplicateMessageError: the id is already in the memory (or its store key).
        """
        return self.add_many([self._to_message(message, fields)])[0]

    def add_many(self, messages: Iterable[Message | str]) -> list[str]:
        """Add several messages at once (one store transaction); returns their ids.

        All or nothing: if one message is rejected, none is added.

        Raises:
            EmbeddingError: a message has no text or is too long.
            DuplicateMessageError: an id repeats or is already in the memory.
        """
        self._check_open()
        if isinstance(messages, str | Message):
            raise TypeError("add_many takes an iterable of messages; use add() for one")
        batch = [self._to_message(item, {}) for item in messages]
        texts = [self._text_of(m) for m in batch]
        seen: set[str] = set()
        for m in batch:
            if m.message_id in seen or m.message_id in self._messages:
                raise DuplicateMessageError(
                    f"message_id {m.message_id!r} is already in this RAGMemory"
                )
            seen.add(m.message_id)
        if not batch:
            return []
        vectors = None
        sync = self._vectors
        if sync is not None and not sync.background:
            vectors = sync.embed(texts)
        ids = [m.message_id for m in batch]
        with self._lock:
            if any(mid in self._messages for mid in ids):  # raced with another writer
                raise DuplicateMessageError(f"one of {ids!r} is already in this RAGMemory")
            if self.store is not None:
                if vectors is not None and (self._shared or self._stateless):
                    assert self.embedder is not None
                    model = self.embedder.name
                    self.store.batch(
                        [
                            Append(self.key, tuple(batch), copies_of=self.owner),
                            PutVectors(self.key, model, tuple(ids), vectors),
                        ]
                    )
                else:
                    self.store.batch([Append(self.key, tuple(batch), copies_of=self.owner)])
            if self._stateless:  # the store holds them, and searches them
                return ids
            for m, text in zip(batch, texts, strict=True):
                self._messages[m.message_id] = m
                self._bm25.add(m.message_id, self._keyword_text(m, text))
                self._link_locked(m)
            if vectors is not None:
                assert sync is not None
                sync.add_locked(ids, vectors)
        if sync is not None and sync.background:
            sync.submit(list(zip(ids, texts, strict=True)))
        return ids

    def sync(self) -> list[str]:
        """Drop what was deleted from the store since the last sync; returns those ids.

        Deletions by this memory, by a cascade (its owner's message was deleted: ttl,
        bound, forget), or by another process are read from the store's deletion log.
        Search calls it first; patterns built on this memory call it to learn what went.
        """
        if self._feed is None or self._closed:
            return []
        gone_by_key, complete = self._feed.poll()
        if not complete and not self._stateless:
            _, removed = self.refresh_all()
            return removed
        logged = list(dict.fromkeys(gone_by_key.get(self.key, ())))
        if not self._stateless:
            logged = [mid for mid in logged if mid in self._messages]
        if not logged:
            return []
        assert self.store is not None
        # Deleted then stored again (a move between tiers, a rewrite) is not gone.
        back = {m.message_id for m in self.store.batch([Load(self.key, ids=tuple(logged))])[0]}
        with self._lock:
            present = [
                mid
                for mid in logged
                if (self._stateless or mid in self._messages) and mid not in back
            ]
            if present and not self._stateless:
                self._forget_locked(present)
        return present

    def refresh_all(self) -> tuple[int, list[str]]:
        """Compare with every message of the store key: ``(added, removed ids)``.

        On a store that searches there is nothing to compare: ``(0, [])``.
        """
        assert self.store is not None
        if self._stateless:
            return 0, []
        stored = self.store.load_messages(self.key)
        stored_ids = {m.message_id for m in stored}
        with self._lock:
            gone = [mid for mid in self._messages if mid not in stored_ids]
            if gone:
                self._forget_locked(gone)
            new = [m for m in stored if m.message_id not in self._messages]
            for m in new:
                self._index_text_locked(m)
            todo = [m.message_id for m in new if m.message_id in self._bm25]
        if self._vectors is not None:
            self._vectors.embed_ids(todo)
        return len(new), gone

    def remove(self, ids: str | Iterable[str]) -> int:
        """Remove messages by id (from the store too); returns how many were removed.

        Unknown ids are ignored.
        """
        self._check_open()
        wanted = [ids] if isinstance(ids, str) else list(ids)
        for i, mid in enumerate(wanted):
            if not isinstance(mid, str):
                raise TypeError(f"ids[{i}] must be a str, got {type(mid).__name__}")
        if self._stateless:
            return self._searching.remove(wanted)
        with self._lock:
            present = [mid for mid in dict.fromkeys(wanted) if mid in self._messages]
            if not present:
                return 0
            if self.store is not None:
                self.store.delete_messages(self.key, present)
            self._forget_locked(present)
        return len(present)

    def _forget_locked(self, ids: Sequence[str]) -> None:
        for mid in ids:
            del self._messages[mid]
            self._bm25.remove(mid)
            self._links.remove(mid)
            self._says_when.pop(mid, None)
            self._of_self.pop(mid, None)
        if self._vectors is not None:
            self._vectors.forget_locked(ids)

    def refresh(self) -> tuple[int, int]:
        """Re-read the store: pick up messages other writers added or removed.

        Returns:
            ``(added, removed)`` counts. Without a store: ``(0, 0)``.
        """
        self._check_open()
        if self.store is None:
            return 0, 0
        removed = len(self.sync())
        if self._stateless:
            return 0, removed
        if self._shared:
            added, more = self._catch_up()
            return added, removed + more
        added, gone = self.refresh_all()
        return added, removed + len(gone)

    def flush(self, timeout: float | None = None) -> None:
        """Wait for pending embeddings, then save the index to ``index_path`` (if set).

        Also waits for the compact codes a large vector index scans (made in the background
        from 4,096 vectors, about 30 s at 1M: the searches until then score every vector),
        so the searches after a flush run at their steady speed.

        Raises:
            EmbeddingError: the embedder failed on messages since the last flush (they stay
                searchable by keywords; see :attr:`failed`). Raised once per failure.
            TimeoutError: ``timeout`` seconds passed with embeddings still pending.
        """
        self._check_open()
        sync = self._vectors
        if sync is None:
            return
        sync.wait(timeout)
        sync.index.build_codes()
        sync.save()
        failed = sync.take_unreported()
        if failed:
            raise EmbeddingError(
                f"the embedder failed on {len(failed)} message(s) {failed[:5]!r}: "
                f"{sync.reason(failed[0]) or 'unknown error'}; they are found by keywords "
                "only"
            )

    # ------------------------------------------------------------------ reading
    def search(
        self,
        query: str,
        k: int = 5,
        min_score: float | None = DEFAULT_MIN_SCORE,
        *,
        mode: SearchMode | None = None,
        agent: str | None = None,
        role: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> list[ScoredMessage]:
        """The ``k`` messages that best match ``query``, best first.

        Waits for pending embeddings first, so every message added before the call can be
        found. Filters keep messages whose ``name`` or ``metadata["agent"]`` is ``agent``,
        whose ``role`` is ``role``, with ``since <= timestamp < until``, and whose metadata
        holds every ``metadata`` item; candidates are fetched deeper until ``k`` pass or
        none are left.

        Args:
            query: the search text.
            k: how many hits at most.
            min_score: drop hits whose calibrated score (a probability of relevance,
                the same scale for every query, memory and store: see
                :mod:`~marsys_mem.retrieval.calibration`) is below it; ``None``: keep all.
                The default, 0.8, drops what a query with no answer finds (``"x"``).
            mode: ``"hybrid"``, ``"dense"`` or ``"bm25"``; default: the memory's mode.
            agent: keep only this agent's messages.
            role: keep only this role.
            since: keep only messages at or after this (timezone-aware) time.
            until: keep only messages before this (timezone-aware) time.
            metadata: keep only messages whose metadata contains these items.

        Raises:
            ValueError: an empty query, ``k <= 0``, an unknown mode or a bad filter.
            EmbeddingError: the embedder failed on the query.
        """
        self._check_open()
        check_query(query)
        k = positive_int("k", k)
        if min_score is not None:
            min_score = finite_number("min_score", min_score)
        resolved = self._resolve_mode(mode)
        keep = make_filter(agent, role, since, until, metadata)
        if self._stateless:  # the query as asked (strip_names: see _search_in_store)
            return self._search_in_store(query, k, min_score, resolved, keep)
        self.sync()
        if self._shared:
            self._catch_up()
        self._wait()
        if resolved == "bm25":
            with self._lock:
                return self._search_locked(query, None, k, min_score, resolved, keep)
        cues: WorkAhead[_Cues] | None = None
        asked = query
        if resolved == "hybrid":  # the keyword side runs beside the model's forward pass
            depth = self._depth(k, keep)
            query = self._content(query)  # both sides look for its content
            cues = WorkAhead.start(lambda: self._query_cues(query, depth, asked))
        qvec = self._embed_query(query)
        # (the cues before the lock: their job takes it)
        ready = cues.result() if cues is not None else None
        with self._lock:
            return self._search_locked(query, qvec, k, min_score, resolved, keep, ready)

    def _search_in_store(
        self,
        query: str,
        k: int,
        min_score: float | None,
        mode: SearchMode,
        keep: MessageFilter | None,
    ) -> list[ScoredMessage]:
        """:meth:`search` on a store that searches: its candidates, ranked here.

        The keyword side is asked for beside the model's forward pass and the dense search
        (database round trips, which let go of the GIL). Both look for the query as asked,
        names included (``strip_names`` does not apply): this memory observes none of a
        searching store's messages, so it knows no participant's name before the store's
        candidates come, and the speaker cue learns their names from those candidates.
        """
        # one side alone is an ordering the store makes: its k best are the hits
        first = self._depth(k, keep) if mode == "hybrid" else k if keep is None else 4 * k
        text: WorkAhead[TextPages] | None = None
        if mode != "dense":  # beside the forward pass and the dense search
            text = WorkAhead.start(lambda: self._searching.text_pages(query, first))
        qvec = self._embed_query(query) if mode != "bm25" else None
        around = (self._context_window() or (0, 0)) if mode == "hybrid" else None
        near = self.ranking.context_candidates
        turns: WorkAhead[TextTurns] | None = None
        if text is not None and qvec is not None and around is not None:
            # the keyword matches' turns, read beside the dense search and its turns
            pages = text
            vector = qvec
            turns = WorkAhead.start(
                lambda: self._searching.text_turns(pages.result(), vector, around, near)
            )

        def rank(depth: int) -> tuple[Sequence[Candidate], bool, Mapping[str, Message]]:
            def pages() -> TextPages | None:
                if text is None:
                    return None
                return text.result() if depth == first else self._searching.text_pages(query, depth)

            keyword = pages if text is not None else None
            ahead = turns.result if turns is not None and depth == first else None
            found = self._searching.search(
                query, qvec, keyword, depth, around=around, near=near, text_turns=ahead
            )
            if mode == "dense":
                ranked: Sequence[Candidate] = [(mid, c, c, None) for mid, c in found.dense]
            elif mode == "bm25":
                ranked = [(mid, r, None, r) for mid, r in found.text]
            else:
                ranked = self._rank_found(query, found)
            if not found.light:
                return ranked, found.exhausted, found.messages  # type: ignore[return-value]
            # the ranker read turns: the messages that can be returned (a filter may pass
            # any of them; else the best k, and as many again, and those whose evidence
            # the calibration pools), validated from the rows read with the turns
            best = ranked if keep is not None else ranked[: max(2 * k, EVIDENCE_DEPTH)]
            parsed = self._searching.parse([mid for mid, *_ in best], found.stored)
            return ranked, found.exhausted, {m.message_id: m for m in parsed}

        def ceiling() -> float:  # the store's statistics, as the keyword side scored with
            if text is None:
                return 0.0
            pages = text.result()
            return bm25_ceiling(pages.doc_freq().values(), pages.count, self._bm25.k1)

        return self._collect(rank, k, min_score, keep, first, mode=mode, ceiling=ceiling)

    def _rank_found(self, query: str, found: Found) -> Sequence[Candidate]:
        """Rank a store's candidates (hybrid) with the in-process ranker.

        The candidates are linked into their threads in the key's order, so a candidate's
        context turns are the candidates before and after it in its thread.
        """
        turns = found.messages.values()  # the key's order
        links = ThreadLinks.of(
            [m.message_id for m in turns],
            [self._thread_of(m) for m in turns],
            # a candidate read without its turns (context_candidates) has no neighbours
            [m.message_id not in found.bare for m in turns] if found.bare else None,
        )
        cosines = dict(found.cosines)
        keyword = found.keyword
        dense = [(mid, c) for mid, c in found.dense if mid in links]
        text = [(mid, r) for mid, r in found.text if mid in links]
        floor = found.floor
        if not self.ranking.in_context:
            if floor is not None:
                cosines.update((mid, floor) for mid, _ in text if mid not in cosines)
            fused = fuse_scores(
                dense,
                text,
                cosines,
                keyword,
                fusion=self.ranking.fusion,
                dense_weight=self.ranking.dense_weight,
                bm25_weight=self.ranking.bm25_weight,
                rrf_k=self.ranking.rrf_k,
            )
            return self._adjust(query, _Ranked.of(links, fused), None, found.messages)

        def own_scores(need: SlotArray) -> OwnScores:
            ids = links.ids_of(need)
            has_vec = np.array([mid in cosines or floor is not None for mid in ids], dtype=bool)
            cos = np.array([cosines.get(mid, floor or 0.0) for mid in ids], dtype=np.float64)
            rank = np.array([keyword.get(mid, 0.0) for mid in ids], dtype=np.float64)
            return cos, has_vec, rank

        ranked = self._rank_candidates(
            links,
            links.slots([mid for mid, _ in dense]) if self.embedder is not None else None,
            links.slots([mid for mid, _ in text]),
            own_scores,
            found.messages,
        )
        return self._adjust(query, ranked, None, found.messages)

    def _depth(self, k: int, keep: MessageFilter | None) -> int:
        """How many candidates a search fetches first."""
        return (
            max(k, self.ranking.candidates) if keep is None else max(4 * k, self.ranking.candidates)
        )

    def _content(self, query: str) -> str:
        """What a hybrid search looks for: ``query`` without the participants' names.

        Only with ``strip_names`` and the speaker cue on (who the query is about is then
        the cue's), and only the names of those who wrote at least ``PARTICIPANT_SHARE``
        of the messages: see :mod:`~marsys_mem.retrieval.query_names`. With
        ``first_person``, a query about one of them (or two, "X and Y") is asked as they
        would ask it (:func:`~marsys_mem.retrieval.answers.in_first_person`).
        """
        if not (self.ranking.strip_names and self.ranking.speaker_weight):
            return query
        names = self._speakers.name_words(PARTICIPANT_SHARE)
        if self.ranking.first_person:
            voiced = in_first_person(query, names)
            if voiced is not None:
                return voiced
        return without_names(query, names)

    def _query_cues(self, query: str, depth: int, asked: str | None = None) -> _Cues:
        """The best ``depth`` keyword hits of ``query`` and the cues of the query as ``asked``.

        ``query``: what the retrievers look for (:meth:`_content`); ``asked``: the query as
        asked (default ``query``). See :class:`_Cues`.
        """
        asked = query if asked is None else asked
        period = query_period(asked) if self.ranking.time_weight else None
        when = bool(self.ranking.when_weight) and asks_when(asked)
        speaker = self._speakers.named(asked) if self.ranking.speaker_weight else None
        with self._lock:
            bm25 = self._bm25
            bm25.prepare(query)  # every document's score: the candidates' are read later
            hits = bm25.search(query, depth)
            slots = self._links.slots([mid for mid, _ in hits])
            return _Cues(period, when, speaker, hits, slots, depth, bm25.generation)

    def _embed_query(self, query: str) -> npt.NDArray[np.float32]:
        """The query's vector, through the embedder's query cache when it has one."""
        assert self.embedder is not None
        try:
            vectors = embed_query(self.embedder, query)
        except EmbeddingError:
            raise
        except Exception as exc:
            raise EmbeddingError(f"embedder {self.embedder.name!r} failed: {exc}") from exc
        assert self._vectors is not None
        return self._vectors.check(vectors, 1)

    async def asearch(
        self,
        query: str,
        k: int = 5,
        min_score: float | None = DEFAULT_MIN_SCORE,
        *,
        mode: SearchMode | None = None,
        agent: str | None = None,
        role: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> list[ScoredMessage]:
        """Async twin of :meth:`search` (runs in a worker thread)."""
        return await asyncio.to_thread(
            self.search,
            query,
            k,
            min_score,
            mode=mode,
            agent=agent,
            role=role,
            since=since,
            until=until,
            metadata=metadata,
        )

    def _resolve_mode(self, mode: SearchMode | None) -> SearchMode:
        if mode is None:
            return self.mode
        if mode not in MODES:
            raise ValueError(f"mode must be one of {sorted(MODES)}, got {mode!r}")
        if mode != "bm25" and self.embedder is None:
            if mode == "dense":
                raise ValueError("mode='dense' needs an embedder; this RAGMemory has none")
            return "bm25"
        return mode

    def _search_locked(
        self,
        query: str,
        qvec: npt.NDArray[np.float32] | None,
        k: int,
        min_score: float | None,
        mode: SearchMode,
        keep: MessageFilter | None,
        cues: _Cues | None = None,
    ) -> list[ScoredMessage]:
        total = len(self._messages)
        if total == 0:
            return []

        def rank(depth: int) -> tuple[Sequence[Candidate], bool, Mapping[str, Message]]:
            depth = min(depth, total)
            ranked, exhausted = self._rank(query, qvec, mode, depth, cues)
            return ranked, exhausted or depth >= total, self._messages

        def ceiling() -> float:
            bm25 = self._bm25
            return bm25_ceiling(bm25.doc_freqs(query).values(), len(bm25), bm25.k1)

        return self._collect(rank, k, min_score, keep, mode=mode, ceiling=ceiling)

    def _collect(
        self,
        rank: Callable[[int], tuple[Sequence[Candidate], bool, Mapping[str, Message]]],
        k: int,
        min_score: float | None,
        keep: MessageFilter | None,
        first: int | None = None,
        *,
        mode: SearchMode = "hybrid",
        ceiling: Callable[[], float] = lambda: 0.0,
    ) -> list[ScoredMessage]:
        """The ``k`` best hits that pass ``keep`` and ``min_score``, ranked deeper until found.

        ``rank(depth)``: the candidates ranked from each retriever's ``depth`` best, best
        first, whether no deeper search can add any, and the candidates' messages;
        ``first``: the first depth (default :meth:`_depth`). The hits are scored by
        :func:`~marsys_mem.retrieval.calibration.calibrated` (``ceiling()``: the query's
        BM25 ceiling), over at least the first ``EVIDENCE_DEPTH`` that pass ``keep``, so a
        hit's score does not depend on ``k``; scores fall in ranking order.
        """
        depth = first if first is not None else self._depth(k, keep)
        want = max(k, EVIDENCE_DEPTH)
        while True:
            ranked, exhausted, messages = rank(depth)
            kept: list[tuple[Message, Candidate]] = []
            for candidate in ranked:
                m = messages.get(candidate[0])
                if m is None or (keep is not None and not keep(m)):
                    continue
                kept.append((m, candidate))
                if len(kept) == want:
                    break
            if len(kept) < k and not exhausted:
                depth *= 4
                continue
            scores = calibrated(
                [c[1] for _, c in kept],
                [c[2] for _, c in kept],
                [c[3] for _, c in kept],
                ceiling() if mode != "dense" and kept else 0.0,
                mode=mode,
            )
            hits: list[ScoredMessage] = []
            for (m, (_, fused, dense, bm25)), score in zip(kept[:k], scores, strict=False):
                if min_score is not None and score < min_score:
                    break  # scores fall in ranking order: nothing later passes either
                hits.append(ScoredMessage(m, score, dense, bm25, len(hits) + 1, fused))
            return hits

    def _rank(
        self,
        query: str,
        qvec: npt.NDArray[np.float32] | None,
        mode: SearchMode,
        depth: int,
        cues: _Cues | None = None,
    ) -> tuple[Sequence[Candidate], bool]:
        """Candidates ``(id, score, dense, bm25)`` best first, and whether none are left.

        ``cues``: worked out ahead for this query (their keyword hits are used if still
        current for this depth).
        """
        in_context = mode == "hybrid" and self.ranking.in_context
        dense: list[tuple[str, float]] = []
        dense_slots: SlotArray | None = None
        query_scores: QueryScores | None = None
        dense_done = True
        index = self._index
        if mode != "bm25" and qvec is not None and index is not None and len(index):
            n = len(index)
            if in_context:  # the hits' labels go straight to thread slots
                # one read of the vectors gives the hits and, later, the candidates' cosines
                query_scores = index.query_scores(qvec)
                labels = query_scores.candidates(min(depth, n))  # ranked below
                if self._slot_memo[0] is not index:  # labels belong to one index
                    self._slot_memo = (index, LabelSlots())
                dense_slots = self._slot_memo[1].get(self._links, labels, index.ids_of_labels)
            else:
                top, scores = index.query_scores(qvec).top(min(depth, n))
                messages = self._messages
                hits = zip(index.ids_of_labels(top), scores.tolist(), strict=False)
                dense = [(m, s) for m, s in hits if m in messages]
            dense_done = depth >= n
        bm25: list[tuple[str, float]] = []
        bm25_slots: SlotArray | None = None
        bm25_done = True
        if mode != "dense":
            if cues is not None and cues.current(self._bm25, depth):
                bm25, bm25_slots = cues.bm25, cues.bm25_slots
            else:
                bm25 = self._bm25.search(query, depth)
            bm25_done = len(bm25) < depth
        done = dense_done and bm25_done
        if mode == "dense":
            return [(mid, s, s, None) for mid, s in dense], done
        if mode == "bm25":
            return [(mid, s, None, s) for mid, s in bm25], done
        if in_context:
            if bm25_slots is None:
                bm25_slots = self._links.slots([mid for mid, _ in bm25])
            ranked = self._rank_in_context(query, query_scores, dense_slots, bm25_slots)
        else:
            ranked = _Ranked.of(self._links, self._fuse(query, qvec, dense, bm25))
        return self._adjust(query, ranked, cues), done

    def _rank_in_context(
        self,
        query: str,
        query_scores: QueryScores | None,
        dense_slots: SlotArray | None,
        bm25_slots: SlotArray,
    ) -> _Ranked:
        """Rank the hits and the turns around them in this memory's indexes (hybrid).

        The ranking is :meth:`_rank_candidates`'; the candidates' own scores come from the
        vector index (``query_scores``, None: no dense side) and BM25.
        """

        def own_scores(need: SlotArray) -> OwnScores:
            cosines = np.zeros(len(need))
            has_vec = np.zeros(len(need), dtype=bool)
            index = self._index
            if query_scores is not None and index is not None:
                memo_index, layout, memo = self._row_memo
                if memo_index is not index or layout != index.layout:  # rows moved: look again
                    memo = SlotMemo()
                    self._row_memo = (index, index.layout, memo)
                # "no vector" (-1) is looked up again: the vector may have come since
                rows = memo.get(self._links, need, index.rows, _has_row)
                has_vec = rows >= 0
                cosines = query_scores.row_scores(rows, fill=0.0)
            # thread slots are BM25 slots
            return cosines, has_vec, self._bm25.slot_scores(query, need)

        return self._rank_candidates(self._links, dense_slots, bm25_slots, own_scores)

    def _rank_candidates(
        self,
        links: ThreadLinks,
        dense_slots: SlotArray | None,
        bm25_slots: SlotArray,
        own_scores: Callable[[SlotArray], OwnScores],
        messages: Mapping[str, TurnLike] | None = None,
    ) -> _Ranked:
        """Rank the hits and the turns around them by their scores in context (hybrid).

        The one ranker of both paths: this memory's own indexes (:meth:`_rank_in_context`)
        and a store that searches (:meth:`_rank_found`, over the links of the candidates
        it returned).

        The candidates are the retrievers' hits and the turns around them (a turn after a
        hit may owe its meaning to it); this gathers them and their neighbours' scores
        into arrays, and :func:`~marsys_mem.retrieval.scoring.rank_in_context` ranks them.
        Candidates carry their own cosine and BM25 scores. ``own_scores(slots)`` gives the
        cosines (0.0 where there is no vector), which have a vector, and the keyword scores
        of the messages at ``slots`` of ``links``; ``messages`` the messages of ``links``
        (default: this memory's), read for the answer cue.
        """
        turns, reply = context_rows(self.ranking)
        # candidates: the hits and the turns around them, as slots of the thread links
        # (which hold exactly the memory's messages: other ids get -1 and are dropped), in
        # first-seen order (a hit of both retrievers comes again, and is dropped)
        hits = bm25_slots  # the keyword hits' slots (-1: ids the memory lacks)
        if dense_slots is not None:  # the dense hits' slots
            hits = np.concatenate([dense_slots, hits])
        cand_slots = links.around_slots(hits, before=reply, after=min(turns, _SPREAD))
        n = len(cand_slots)
        if not n:
            return _Ranked.of(links, [])
        lanes = links.walk(cand_slots, turns, forward=False)  # row i: the turn i + 1 before
        nxt = links.walk(cand_slots, reply, forward=True)
        # own scores of the candidates and of their neighbours, once per message: `need`
        # holds them sorted by slot; row 0 of `own` the cosines, row 1 the BM25 scores (both
        # sides go through one array operation each); own[:, -1] stays 0.0 for "no such
        # turn" (-1)
        need, where = links.positions(np.concatenate([cand_slots, lanes.ravel(), nxt.ravel()]))
        m = len(need)
        own = np.zeros((2, m + 1))
        has_vec = np.zeros(m + 1, dtype=bool)
        own[0, :-1], has_vec[:-1], own[1, :-1] = own_scores(need)
        # rows: the candidates, the turns 1 .. turns before them, the next turn
        grid = where.reshape(1 + turns + reply, n)
        threads = links.thread_numbers(cand_slots) if self.ranking.thread_weight else None
        answers = None
        if self.ranking.answer_weight and turns:
            found = self._messages if messages is None else messages
            asked_of = None
            if messages is None:  # this memory's links: whether a message asks, once

                def asked_of(slots: SlotArray) -> npt.NDArray[np.int64]:
                    return self._asks_memo.get(links, slots, self._ask_flags)

            answers = _answers(links, need, grid, found, asked_of)
        order, fused = rank_in_context(own, has_vec, grid, threads, self.ranking, answers)
        picked = grid[0][order]
        dense_own = np.where(has_vec[picked], own[0, picked], np.nan)
        return _Ranked(links, cand_slots[order], fused, dense_own, own[1, picked])

    def _adjust(
        self,
        query: str,
        ranked: _Ranked,
        cues: _Cues | None,
        messages: Mapping[str, TurnLike] | None = None,
    ) -> Sequence[Candidate]:
        """The cues (time, when, speaker, question), then diversity.

        The best ``_CUED`` candidates are looked at (a regex per text); their flags go to
        :func:`~marsys_mem.retrieval.scoring.cue_scores`.

        ``messages``: the candidates' messages (default: this memory's).
        """
        found = self._messages if messages is None else messages
        if not len(ranked):
            return ranked
        speaker = None
        if cues is not None:  # of the query as asked: `query` may lack its names
            period, when, speaker = cues.period, cues.when, cues.speaker
        else:
            period = query_period(query) if self.ranking.time_weight else None
            when = bool(self.ranking.when_weight) and asks_when(query)
            if self.ranking.speaker_weight:
                others = (speaker_of(m) or "" for m in messages.values()) if messages else ()
                speaker = self._speakers.named(query, others)
        tells = bool(self.ranking.question_weight)  # a bonus for telling: every query
        of_self = bool(self.ranking.self_weight)  # a bonus for telling of oneself: every query
        if period is not None or when or speaker is not None or tells or of_self:
            # only the best candidates are looked at (regex per text)
            best, rest = ranked.split(_CUED)
            turns = [found.get(mid) for mid, *_ in best]
            flags = {}
            if speaker is not None:
                flags["speaker"] = _flags(turns, lambda _, m: speaker_of(m) == speaker)
            if period is not None:
                flags["period"] = _flags(turns, lambda _, m: period.contains(m.timestamp))
            if when:
                if messages is None:
                    flags["when"] = _flags(turns, lambda i, m: self._mentions_time(best[i][0], m))
                else:
                    flags["when"] = _flags(turns, lambda _, m: mentions_time(m.text))
            if tells and messages is None:  # this memory's: whether each asks, once
                slots = self._links.slots([mid for mid, *_ in best])
                linked = slots >= 0  # (a message with no text to index is not)
                told = _flags(turns, lambda i, m: not linked[i] and not asks(m.text))
                told[linked] = self._asks_memo.get(self._links, slots[linked], self._ask_flags) == 0
                flags["tells"] = told
            elif tells:
                flags["tells"] = _flags(turns, lambda _, m: not asks(m.text))
            if of_self:
                flags["of_self"] = np.fromiter(
                    (
                        0.0
                        if m is None
                        else self._tells_of_self(best[i][0], m)
                        if messages is None
                        else tells_of_self(m.text)  # a store's: not kept
                        for i, m in enumerate(turns)
                    ),
                    dtype=np.float64,
                    count=len(turns),
                )
            scores = np.array([c[1] for c in best])
            order, adjusted, norm = cue_scores(scores, self.ranking, **flags)
            head = [
                (best[i][0], score, best[i][2], best[i][3])
                for i, score in zip(order.tolist(), adjusted.tolist(), strict=True)
            ]
            ranked = rest.divided(norm, head=head)
        if self.ranking.diversity:
            return diversify(
                ranked, lambda mid: self._session_of(mid, found), self.ranking.diversity
            )
        return ranked

    def _tells_of_self(self, mid: str, m: TurnLike) -> float:
        """``tells_of_self(m.text)``, computed once per message."""
        told = self._of_self.get(mid)
        if told is None:
            told = self._of_self[mid] = tells_of_self(m.text)
        return told

    def _mentions_time(self, mid: str, m: TurnLike) -> bool:
        """``mentions_time(m.text)``, computed once per message."""
        said = self._says_when.get(mid)
        if said is None:
            said = self._says_when[mid] = mentions_time(m.text)
        return said

    def _fuse(
        self,
        query: str,
        qvec: npt.NDArray[np.float32] | None,
        dense: list[tuple[str, float]],
        bm25: list[tuple[str, float]],
    ) -> list[Candidate]:
        """Fuse the two candidate lists; every candidate gets both retrievers' scores."""
        dense_of = dict(dense)
        bm25_of = dict(bm25)
        ids = list(dict.fromkeys(itertools.chain((i for i, _ in dense), (i for i, _ in bm25))))
        index = self._index
        if qvec is not None and index is not None:
            lacking = [i for i in ids if i not in dense_of and i in index]
            if lacking:
                cosines = index.vectors(lacking) @ qvec[0]
                dense_of.update(zip(lacking, cosines.tolist(), strict=True))
        lacking = [i for i in ids if i not in bm25_of]
        if lacking:
            bm25_of.update(self._bm25.score_docs(query, lacking))
        return fuse_scores(
            dense,
            bm25,
            dense_of,
            bm25_of,
            fusion=self.ranking.fusion,
            dense_weight=self.ranking.dense_weight,
            bm25_weight=self.ranking.bm25_weight,
            rrf_k=self.ranking.rrf_k,
        )

    # ------------------------------------------------------------------ async twins
    async def aadd(self, message: Message | str, **fields: Any) -> str:
        """Async twin of :meth:`add`."""
        return await asyncio.to_thread(self.add, message, **fields)

    async def aadd_many(self, messages: Iterable[Message | str]) -> list[str]:
        """Async twin of :meth:`add_many`."""
        return await asyncio.to_thread(self.add_many, list(messages))

    async def aremove(self, ids: str | Iterable[str]) -> int:
        """Async twin of :meth:`remove`."""
        return await asyncio.to_thread(self.remove, ids)

    async def aflush(self, timeout: float | None = None) -> None:
        """Async twin of :meth:`flush`."""
        await asyncio.to_thread(self.flush, timeout)

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Finish pending embeddings, save the index, stop the worker. Idempotent.

        Embedding failures are logged, not raised. The store is left open.
        """
        if self._closed:
            return
        sync = self._vectors
        try:
            if sync is not None:
                sync.wait()
                sync.save()
        finally:
            try:
                if sync is not None:
                    sync.close()
            except EmbeddingError as exc:  # a batch submitted after the last wait failed
                log.error("RAGMemory: embedding failed while closing: %s", exc)
            self._closed = True
        unreported = sync.unreported() if sync is not None else []
        if unreported:
            log.error(
                "RAGMemory closed with %d messages not embedded: %s",
                len(unreported),
                unreported[:5],
            )

    def __repr__(self) -> str:
        name = self.embedder.name if self.embedder is not None else None
        return (
            f"RAGMemory(messages={len(self._messages)}, mode={self.mode!r}, embedder={name!r}, "
            f"pending={self.pending})"
        )
