"""Keeping a memory's vector index in step with its messages.

:class:`VectorSync` is the dense part of :class:`~marsys_mem.patterns.rag.RAGMemory`, an
object it holds. It embeds the messages (in the background through an
:class:`~marsys_mem.retrieval.ingest.EmbeddingQueue`, or inline), puts the vectors in the
FAISS index, retries a failed batch text by text so one bad text does not sink its
neighbours, and on opening loads the saved index, repairing a stale one or rebuilding a
missing or corrupt one from the memory's messages.

What it knows of the memory is two callables: ``text_of(id)``, the text of a message the
memory holds and indexes (``None``: not held), and ``persist(ids, vectors)``, called with
every vector computed here once indexed (a shared store keeps them: see
:mod:`marsys_mem.patterns.shared_vectors`). Vectors read from elsewhere
(:data:`StoredVectors`) fill the index without embedding.

Every queued text carries a ticket; a batch that comes back for a message that was
removed (or removed and added again) since it was queued is ignored, so the index never
holds a vector of a message that is gone.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from marsys_mem.exceptions import EmbeddingError, IndexCorruptError
from marsys_mem.model.ranking import Ingest
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
    """A memory's vector index, kept in step with its messages (embedding, retries, files).

    Args:
        embedder: the model.
        ingest: batch size, backpressure and the index kind.
        lock: the memory's lock, which guards this object's state and the memory's
            messages alike (the background thread takes it to add a finished batch).
        text_of: the text of a message the memory holds and indexes; ``None``: not held
            (removed, or never added). Called under ``lock``.
        persist: called (outside ``lock``) with the vectors computed here, once indexed.
        index_path: where :meth:`save` writes the index (``None``: nowhere).
        background: embed in a background thread (else :meth:`embed_ids` embeds inline).

    Example:
        >>> import threading
        >>> from marsys_mem.retrieval.embeddings import HashingEmbedder
        >>> texts = {"a": "the spare key is under the flowerpot"}
        >>> sync = VectorSync(HashingEmbedder(32), Ingest(), lock=threading.RLock(),
        ...                   text_of=texts.get, background=False)
        >>> sync.embed_ids(["a"])
        >>> "a" in sync.index, sync.pending
        (True, 0)
    """

    def __init__(
        self,
        embedder: Embedder,
        ingest: Ingest,
        *,
        lock: threading.RLock,
        text_of: Callable[[str], str | None],
        persist: Callable[[Sequence[str], npt.NDArray[np.float32]], None] | None = None,
        index_path: Path | None = None,
        background: bool = True,
    ) -> None:
        self.embedder = embedder
        self.index_path = index_path
        self.index = FaissIndex(embedder.dim, kind=ingest.index_kind)
        self._lock = lock
        self._text_of = text_of
        self._persist = persist
        self._batch_size = ingest.batch_size
        self._pending: dict[str, int] = {}  # message id -> queue ticket of its text
        self._tickets = itertools.count(1)
        self._last_ticket = 0
        self._failed: dict[str, str] = {}  # message id -> why it has no vector
        self._unreported: list[str] = []  # failures flush() has not raised yet
        self._dirty = False  # index changed since it was last saved
        self._queue: EmbeddingQueue | None = None
        if background:
            self._queue = EmbeddingQueue(
                embedder,
                on_vectors=self._on_vectors,
                batch_size=ingest.batch_size,
                max_pending=ingest.max_pending,
                at_exit=self.save,  # never closed: keep the vectors done so far
            )

    # ------------------------------------------------------------------ state
    @property
    def background(self) -> bool:
        """Whether texts are embedded in a background thread."""
        return self._queue is not None

    @property
    def pending(self) -> int:
        """Messages whose embedding has not been indexed yet."""
        return len(self._pending)

    def is_pending(self, message_id: str) -> bool:
        """Whether ``message_id`` waits for its vector (call under the lock)."""
        return message_id in self._pending

    def failed(self) -> dict[str, str]:
        """Messages the embedder failed on (id -> reason), a copy."""
        with self._lock:
            return dict(self._failed)

    def take_unreported(self) -> list[str]:
        """The failures not reported yet; from now on they count as reported."""
        with self._lock:
            failed, self._unreported = self._unreported, []
        return failed

    def reason(self, message_id: str) -> str:
        """Why the embedder failed on ``message_id`` ("" if it did not)."""
        return self._failed.get(message_id, "")

    def unreported(self) -> list[str]:
        """The failures not reported yet (a copy)."""
        with self._lock:
            return list(self._unreported)

    def add_locked(self, ids: Sequence[str], vectors: npt.NDArray[np.float32]) -> None:
        """Index vectors computed for new messages (call under the lock)."""
        self.index.add(list(ids), vectors)
        self._dirty = True

    def forget_locked(self, ids: Sequence[str]) -> None:
        """Drop messages' vectors and whatever waits for them (call under the lock)."""
        for mid in ids:
            self._pending.pop(mid, None)
            self._failed.pop(mid, None)
        if self.index.remove(list(ids)):
            self._dirty = True

    def save(self) -> None:
        """Write the index to ``index_path`` if it changed since it was last written."""
        if self.index_path is None:
            return
        with self._lock:
            if not self._dirty:
                return
            meta = {"embedder": self.embedder.name, "count": len(self.index)}
            self.index.save(self.index_path, meta=meta)
            self._dirty = False

    def close(self) -> None:
        """Stop the background thread (what it has not embedded is dropped); idempotent."""
        queue, self._queue = self._queue, None
        if queue is not None:
            queue.close()

    # ------------------------------------------------------------------ opening
    def load(self, want: Sequence[str], stored: StoredVectors | None = None) -> None:
        """Use the saved index if it is sound; repair it if stale; else rebuild it.

        ``want``: the ids of the messages to index (those the memory holds, in order);
        ``stored``: ``(message ids, vectors)`` the store holds for these messages (shared
        vectors); they fill the index without embedding, only the rest is embedded.
        """
        path = self.index_path
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
                self.index = loaded
            if stored is not None:
                self.adopt_locked(*stored)
            index = self.index
            missing = [mid for mid in want if mid not in index]
        self.embed_ids(missing)
        index.build_codes(wait=False)  # a large index's first queries need not wait for them

    def adopt_locked(self, message_ids: Sequence[str], vectors: npt.NDArray[np.float32]) -> int:
        """Index stored vectors of messages that have none yet (no embedding); the count."""
        index = self.index
        rows: list[int] = []
        ids: list[str] = []
        cleared: set[str] = set()
        for row, mid in enumerate(message_ids):
            if mid not in index and self._text_of(mid) is not None:
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
        if self._persist is not None and len(ids):
            self._persist(ids, vectors)

    def embed_ids(self, ids: Sequence[str]) -> None:
        """Queue (or, without background, compute) the vectors of held messages."""
        if not ids:
            return
        with self._lock:
            texts = [self._text_of(mid) or "" for mid in ids]
        if self._queue is not None:
            self.submit(list(zip(ids, texts, strict=True)))
            return
        try:
            lengths = text_lengths(self.embedder, texts)
        except Exception:  # the embedder fails: the batches below report it
            lengths = [len(t) for t in texts]
        for rows_of_batch in length_batches(lengths, self._batch_size):  # padding wasted: none
            chunk = [ids[i] for i in rows_of_batch]
            try:
                vectors = self.embed([texts[i] for i in rows_of_batch])
            except EmbeddingError as exc:
                with self._lock:
                    for mid in chunk:
                        self._failed[mid] = str(exc)
                    self._unreported.extend(chunk)
                log.error("RAGMemory: could not embed %d messages: %s", len(chunk), exc)
                continue
            with self._lock:
                index = self.index
                rows = [
                    i
                    for i, mid in enumerate(chunk)
                    if mid not in index and self._text_of(mid) is not None
                ]
                fresh = [chunk[i] for i in rows]
                if fresh:
                    index.add(fresh, vectors[rows])
                    self._dirty = True
            self._persist_vectors(fresh, vectors[rows])

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Embed synchronously and validate.

        Raises:
            EmbeddingError: the embedder failed, or returned vectors that do not fit.
        """
        try:
            vectors = self.embedder.embed(list(texts))
        except EmbeddingError:
            raise
        except Exception as exc:
            raise EmbeddingError(f"embedder {self.embedder.name!r} failed: {exc}") from exc
        return self.check(vectors, len(texts))

    def check(self, vectors: Any, n: int) -> npt.NDArray[np.float32]:
        """``vectors`` as ``n`` rows of the embedder's dimension, or ``EmbeddingError``."""
        array = check_vectors(vectors, self.embedder.dim)
        if array.shape[0] != n:
            raise EmbeddingError(
                f"embedder {self.embedder.name!r} returned {array.shape[0]} vectors for {n} texts"
            )
        return array

    def submit(self, items: Sequence[tuple[str, str]]) -> None:
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
                if mid not in self.index and self._text_of(mid) is not None:
                    ids.append(mid)
                    rows.append(row)
            if ids:
                self.index.add(ids, vectors[rows])
                self._dirty = True
        if ids:
            self._persist_vectors(ids, vectors[rows])

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the queue; re-embed one by one what a failed batch dropped.

        Raises:
            TimeoutError: ``timeout`` seconds passed with embeddings still pending.
        """
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
            with self._lock:
                text = self._text_of(mid)
            vector: npt.NDArray[np.float32] | None = None
            reason = ""
            if text is not None:
                try:
                    vector = self.embed([text])
                except EmbeddingError as exc:
                    reason = str(exc)
            with self._lock:
                if self._pending.get(mid) != ticket:
                    continue
                del self._pending[mid]
                if self._text_of(mid) is None:
                    continue
                if vector is not None and mid not in self.index:
                    try:
                        self.index.add([mid], vector)
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
