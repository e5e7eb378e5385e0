"""Keeping a RAGMemory's vector index in step with its messages.

:class:`VectorSync` is the dense half of :class:`~marsys_mem.patterns.rag.RAGMemory`
(its base class; not used on its own). It embeds the messages (in the background through
an :class:`~marsys_mem.retrieval.ingest.EmbeddingQueue`, or inline), puts the vectors in the FAISS
index, retries a failed batch text by text so one bad text does not sink its neighbours,
and on opening loads the saved index, repairing a stale one or rebuilding a missing or
corrupt one from the store's messages.

Vectors read from elsewhere (:data:`StoredVectors`, e.g. a shared store's, see
:mod:`marsys_mem.patterns.shared_vectors`) fill the index without embedding; every vector
computed here is handed to :meth:`VectorSync._persist_vectors` (a no-op here) once indexed.

Every queued text carries a ticket; a batch that comes back for a message that was
removed (or removed and added again) since it was queued is ignored, so the index never
holds a vector of a message that is gone.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from marsys_mem.exceptions import EmbeddingError, IndexCorruptError
from marsys_mem.model.messages import Message
from marsys_mem.retrieval.bm25 import BM25Index
from marsys_mem.retrieval.embeddings import (
    Embedder,
    check_vectors,
    length_batches,
    text_lengths,
)
from marsys_mem.retrieval.index import FaissIndex
from marsys_mem.retrieval.ingest import EmbeddingQueue

__all__ = ["StoredVectors", "VectorSync"]

StoredVectors = tuple[Sequence[str], npt.NDArray[np.float32]]
"""Vectors read from somewhere durable: message ids and their rows."""

log = logging.getLogger("marsys_mem.patterns.rag")


class VectorSync:
    """The vector side of :class:`~marsys_mem.patterns.rag.RAGMemory` (a base class).

    The attributes below are set by ``RAGMemory.__init__``; ``_lock`` guards them all.

    Example:
        >>> from marsys_mem.retrieval.embeddings import HashingEmbedder
        >>> from marsys_mem.patterns import RAGMemory
        >>> with RAGMemory(HashingEmbedder(32), background=False) as mem:
        ...     _ = mem.add("the vector of this text is in the index at once")
        ...     mem.pending, len(mem)  # background=False: embedded during add
        (0, 1)
    """

    embedder: Embedder | None
    index_path: Path | None
    _lock: threading.RLock
    _messages: dict[str, Message]
    _bm25: BM25Index
    _index: FaissIndex | None
    _queue: EmbeddingQueue | None
    _pending: dict[str, int]  # message id -> queue ticket of its text
    _tickets: itertools.count[int]
    _last_ticket: int
    _failed: dict[str, str]  # message id -> why it has no vector
    _unreported: list[str]  # failures flush() has not raised yet
    _dirty: bool  # index changed since it was last saved
    _batch_size: int

    def _load_index(self, stored: StoredVectors | None = None) -> None:
        """Use the saved index if it is sound; repair it if stale; else rebuild it.

        ``stored``: ``(message ids, vectors)`` the store holds for these messages (shared
        vectors); they fill the index without embedding, only the rest is embedded.
        """
        assert self.embedder is not None
        path = self.index_path
        want = [mid for mid in self._messages if mid in self._bm25]
        loaded: FaissIndex | None = None
        n_stored = len(stored[0]) if stored is not None else 0
        if path is not None and path.exists():
            try:
                loaded = FaissIndex.load(
                    path,
                    expected_dim=self.embedder.dim,
                    expected_meta={"embedder": self.embedder.name},
                )
            except IndexCorruptError as exc:
                log.warning(
                    "RAGMemory: vector index %s is unusable (%s); rebuilding it from the "
                    "store's %d messages (%d stored vectors)",
                    path,
                    exc,
                    len(want),
                    n_stored,
                )
                self._dirty = True  # overwrite the bad file even if the store is empty
        elif path is not None and want:
            log.warning(
                "RAGMemory: vector index %s is missing; rebuilding it from the store's "
                "%d messages (%d stored vectors)",
                path,
                len(want),
                n_stored,
            )
        if loaded is not None:
            have = set(loaded.ids())
            wanted = set(want)
            extra = have - wanted
            lacking = sum(1 for mid in want if mid not in have)
            if extra or lacking:
                log.warning(
                    "RAGMemory: vector index %s is stale (%d vectors of messages no longer "
                    "stored, %d messages without vectors); repairing it",
                    path,
                    len(extra),
                    lacking,
                )
                if extra:
                    loaded.remove(sorted(extra))
                self._dirty = True
        with self._lock:
            if loaded is not None:
                self._index = loaded
            if stored is not None:
                self._adopt_locked(*stored)
            assert self._index is not None
            index = self._index
            missing = [mid for mid in want if mid not in index]
        self._embed_ids(missing)

    def _adopt_locked(self, message_ids: Sequence[str], vectors: npt.NDArray[np.float32]) -> int:
        """Index stored vectors of messages that have none yet (no embedding); the count."""
        index = self._index
        assert index is not None
        rows: list[int] = []
        ids: list[str] = []
        cleared: set[str] = set()
        for row, mid in enumerate(message_ids):
            if mid in self._messages and mid in self._bm25 and mid not in index:
                rows.append(row)
                ids.append(mid)
                self._pending.pop(mid, None)  # a queued embedding of it is not needed
                if self._failed.pop(mid, None) is not None:
                    cleared.add(mid)  # another process embedded what failed here
        if cleared:
            self._unreported = [mid for mid in self._unreported if mid not in cleared]
        if ids:
            index.add(ids, vectors if len(rows) == len(message_ids) else vectors[rows])
            self._dirty = True
        return len(ids)

    def _persist_vectors(self, ids: Sequence[str], vectors: npt.NDArray[np.float32]) -> None:
        """Hook: keep vectors just computed somewhere durable (the store: shared vectors)."""

    def _index_text_locked(self, m: Message) -> None:
        """Index a stored message's text (RAGMemory's)."""
        raise NotImplementedError

    def _forget_locked(self, ids: Sequence[str]) -> None:
        """Drop messages from every index (RAGMemory's)."""
        raise NotImplementedError

    def _embed_ids(self, ids: Sequence[str]) -> None:
        """Queue (or, without background, compute) the vectors of stored messages."""
        if not ids or self.embedder is None:
            return
        texts = [self._messages[mid].text for mid in ids]
        if self._queue is not None:
            self._submit(list(zip(ids, texts, strict=True)))
            return
        try:
            lengths = text_lengths(self.embedder, texts)
        except Exception:  # the embedder fails: the batches below report it
            lengths = [len(t) for t in texts]
        for rows_of_batch in length_batches(lengths, self._batch_size):  # padding wasted: none
            chunk = [ids[i] for i in rows_of_batch]
            try:
                vectors = self._embed([texts[i] for i in rows_of_batch])
            except EmbeddingError as exc:
                with self._lock:
                    for mid in chunk:
                        self._failed[mid] = str(exc)
                    self._unreported.extend(chunk)
                log.error("RAGMemory: could not embed %d messages: %s", len(chunk), exc)
                continue
            with self._lock:
                index = self._index
                assert index is not None
                rows = [
                    i for i, mid in enumerate(chunk) if mid in self._messages and mid not in index
                ]
                fresh = [chunk[i] for i in rows]
                if fresh:
                    index.add(fresh, vectors[rows])
                    self._dirty = True
            self._persist_vectors(fresh, vectors[rows])

    def _embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Embed synchronously and validate; raises EmbeddingError."""
        assert self.embedder is not None
        try:
            vectors = self.embedder.embed(list(texts))
        except EmbeddingError:
            raise
        except Exception as exc:
            raise EmbeddingError(f"embedder {self.embedder.name!r} failed: {exc}") from exc
        return self._check(vectors, len(texts))

    def _check(self, vectors: Any, n: int) -> npt.NDArray[np.float32]:
        assert self.embedder is not None
        array = check_vectors(vectors, self.embedder.dim)
        if array.shape[0] != n:
            raise EmbeddingError(
                f"embedder {self.embedder.name!r} returned {array.shape[0]} vectors for {n} texts"
            )
        return array

    def _submit(self, items: Sequence[tuple[str, str]]) -> None:
        """Hand texts to the background queue (outside the lock: submit may wait)."""
        assert self._queue is not None
        tickets: list[tuple[str, str]] = []
        with self._lock:
            for mid, text in items:
                ticket = next(self._tickets)
                self._pending[mid] = ticket
                tickets.append((f"{ticket}:{mid}", text))
            self._last_ticket = ticket
        self._queue.submit_many(tickets)

    def _on_vectors(self, keys: list[str], vectors: npt.NDArray[np.float32]) -> None:
        """Queue callback (background thread): index a finished batch of valid vectors."""
        with self._lock:
            ids: list[str] = []
            rows: list[int] = []
            for row, key in enumerate(keys):
                ticket, mid = key.split(":", 1)
                if self._pending.get(mid) != int(ticket):
                    continue  # removed (or removed and added again) since it was queued
                del self._pending[mid]
                assert self._index is not None
                if mid in self._messages and mid not in self._index:
                    ids.append(mid)
                    rows.append(row)
            if ids:
                assert self._index is not None
                self._index.add(ids, vectors[rows])
                self._dirty = True
        if ids:
            self._persist_vectors(ids, vectors[rows])

    def _wait(self, timeout: float | None = None) -> None:
        """Wait for the queue; re-embed one by one what a failed batch dropped."""
        if self._queue is None:
            return
        with self._lock:
            upto = self._last_ticket
        try:
            self._queue.flush(timeout)
        except EmbeddingError as exc:
            log.warning("RAGMemory: an embedding batch failed (%s); retrying it text by text", exc)
        with self._lock:
            stuck = [(mid, t) for mid, t in self._pending.items() if t <= upto]
        if stuck:
            self._retry(stuck)

    def _retry(self, stuck: Sequence[tuple[str, int]]) -> None:
        """Embed texts of a dropped batch singly: a bad text does not sink its neighbours."""
        failed: list[str] = []
        stored: list[tuple[str, npt.NDArray[np.float32]]] = []
        for mid, ticket in stuck:
            m = self._messages.get(mid)
            vector: npt.NDArray[np.float32] | None = None
            reason = ""
            if m is not None:
                try:
                    vector = self._embed([m.text])
                except EmbeddingError as exc:
                    reason = str(exc)
            with self._lock:
                if self._pending.get(mid) != ticket:
                    continue
                del self._pending[mid]
                if mid not in self._messages:
                    continue
                assert self._index is not None
                if vector is not None and mid not in self._index:
                    try:
                        self._index.add([mid], vector)
                        self._dirty = True
                        stored.append((mid, vector))
                        continue
                    except Exception as exc:
                        reason = f"{type(exc).__name__}: {exc}"
                if vector is None:
                    self._failed[mid] = reason
                    self._unreported.append(mid)
                    failed.append(mid)
        if stored:
            self._persist_vectors([mid for mid, _ in stored], np.vstack([v for _, v in stored]))
        if failed:
            log.error(
                "RAGMemory: the embedder failed on %d message(s) %s (%s); they are found by "
                "keywords only",
                len(failed),
                failed[:5],
                self._failed.get(failed[0], ""),
            )
