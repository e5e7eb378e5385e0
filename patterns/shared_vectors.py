"""Shared vectors: a RAGMemory's embeddings written once to its store, caught up by cursor.

:class:`SharedVectors` is the store-facing half of :class:`~marsys_mem.patterns.rag.RAGMemory`
(its base class; not used on its own). With a store that
:attr:`~marsys_mem.store.base.MemoryStore.supports_vectors`, every vector computed is
written to the store next to its message, under the embedder's name (the model; see
:mod:`marsys_mem.store.vectors`). Opening, and catching up before each search
(:meth:`SharedVectors._catch_up`), read from the store only what is newer than the memory
has: messages and vectors after its two cursors, in one transaction. A stored vector goes
into the index without embedding; a message with none yet is embedded and its vector
stored. So a message one process (or host) embedded is not embedded again by the others,
and each finds the others' messages after one catch-up.

Two memories can both embed a message only when both reach it before its vector is stored
(the later write replaces the earlier; a deterministic embedder writes the same vector).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from marsys_mem.exceptions import MessageNotFoundError, StoreError
from marsys_mem.model.messages import Message
from marsys_mem.retrieval.vector_sync import StoredVectors, VectorSync
from marsys_mem.store.base import Key, LoadAfter, LoadVectors, MemoryStore
from marsys_mem.store.vectors import MAX_MODEL_CHARS, VectorPage

__all__ = ["SharedVectors"]

log = logging.getLogger("marsys_mem.patterns.rag")


class SharedVectors(VectorSync):
    """The store side of :class:`~marsys_mem.patterns.rag.RAGMemory` (a base class).

    The attributes below are set by ``RAGMemory.__init__``; ``_lock`` guards them all.

    Example:
        >>> from marsys_mem.patterns import RAGMemory
        >>> from marsys_mem.retrieval.embeddings import HashingEmbedder
        >>> from marsys_mem.store import InMemoryStore
        >>> store, key = InMemoryStore(), ("default", "rag", "main")
        >>> a = RAGMemory(HashingEmbedder(32), store=store, key=key, background=False)
        >>> _ = a.add("the spare key is under the blue flowerpot")
        >>> b = RAGMemory(HashingEmbedder(32), store=store, key=key)  # reuses a's vector
        >>> b.search("where is the spare key?", k=1, mode="dense", min_score=None)[0].text
        'the spare key is under the blue flowerpot'
        >>> a.close(); b.close()
    """

    store: MemoryStore | None
    key: Key
    _shared: bool  # vectors are written to, and caught up from, the store
    _msg_cursor: int  # the store's message cursor this memory has caught up to
    _vec_cursor: int  # the store's vector cursor this memory has caught up to

    def _share_vectors(self) -> bool:
        """Whether this memory's vectors go through its store (decided when opening)."""
        store, embedder = self.store, self.embedder
        if store is None or embedder is None or not store.supports_vectors:
            return False
        if len(embedder.name) > MAX_MODEL_CHARS:
            log.warning(
                "RAGMemory: the embedder's name is longer than %d characters, so its vectors "
                "are not stored in %r (each process embeds its own)",
                MAX_MODEL_CHARS,
                store,
            )
            return False
        return True

    def _read_store(self) -> tuple[list[Message], StoredVectors | None]:
        """On opening: the key's messages and, when shared, its stored vectors (one snapshot)."""
        if self.store is None:
            return [], None
        if not self._shared:
            return self.store.load_messages(self.key), None
        assert self.embedder is not None
        vectors, page = self.store.batch(  # vectors first: see _catch_up
            [LoadVectors(self.key, self.embedder.name, 0), LoadAfter(self.key, 0)]
        )
        self._msg_cursor, self._vec_cursor = page.cursor, vectors.cursor
        if not self._usable(vectors):
            return page.messages, None
        return page.messages, (vectors.message_ids, vectors.vectors)

    def _usable(self, page: VectorPage) -> bool:
        """Whether stored vectors fit this embedder (a name must mean one dimension)."""
        assert self.embedder is not None
        if not len(page) or page.vectors.shape[1] == self.embedder.dim:
            return True
        log.error(
            "RAGMemory: %r holds %d-D vectors under the name of this %d-D embedder %r; they "
            "are ignored (give the embedder a name of its own)",
            self.store,
            page.vectors.shape[1],
            self.embedder.dim,
            self.embedder.name,
        )
        return False

    def _catch_up(self) -> tuple[int, int]:
        """Read what the store has that this memory lacks (shared vectors only).

        Messages appended after the message cursor are indexed for BM25; their stored
        vectors (and any vector written after the vector cursor) go into the index; those
        without one are embedded and stored. Messages deleted from the store are dropped.

        Returns:
            ``(added, removed)`` message counts.
        """
        assert self.store is not None
        assert self.embedder is not None
        with self._lock:  # adds and removes hold it over their store write: one view
            # Vectors before messages: even where a batch is not one snapshot (a store
            # reading each op at its own moment), every vector read has its message
            # committed before it, so the message read next includes it.
            vectors, page = self.store.batch(
                [
                    LoadVectors(self.key, self.embedder.name, self._vec_cursor),
                    LoadAfter(self.key, self._msg_cursor),
                ]
            )
            new = [m for m in page.messages if m.message_id not in self._messages]
            for m in new:
                self._index_text_locked(m)
            removed = 0
            if page.count != len(self._messages):  # some were deleted: find which
                stored = {m.message_id for m in self.store.load_messages(self.key)}
                gone = [mid for mid in self._messages if mid not in stored]
                if gone:
                    self._forget_locked(gone)
                removed = len(gone)
            self._msg_cursor, self._vec_cursor = page.cursor, vectors.cursor
            if len(vectors) and self._usable(vectors):
                self._adopt_locked(vectors.message_ids, vectors.vectors)
            index = self._index
            assert index is not None
            todo = [
                m.message_id
                for m in new
                if m.message_id in self._bm25
                and m.message_id not in index
                and m.message_id not in self._pending
            ]
        self._embed_ids(todo)
        return len(new), removed

    def _persist_vectors(self, ids: Sequence[str], vectors: npt.NDArray[np.float32]) -> None:
        """Write vectors just computed to the store (shared vectors); never raises.

        A message deleted meanwhile (by this or another process) is skipped; a store that
        fails is logged: the vectors stay in this index, another process embeds its own.
        """
        if not self._shared or not ids:
            return
        assert self.store is not None
        assert self.embedder is not None
        store, model = self.store, self.embedder.name
        try:
            try:
                store.put_vectors(self.key, model, ids, vectors)
            except MessageNotFoundError:
                for i, mid in enumerate(ids):
                    with contextlib.suppress(MessageNotFoundError):
                        store.put_vectors(self.key, model, [mid], vectors[i : i + 1])
        except (StoreError, ValueError) as exc:
            log.error(
                "RAGMemory: could not store %d vectors in %r (%s); other processes will "
                "embed those messages again",
                len(ids),
                store,
                exc,
            )
