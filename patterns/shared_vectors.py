"""Shared vectors: a RAGMemory's embeddings written once to its store, caught up by cursor.

:class:`SharedVectors` is the store-facing part of :class:`~marsys_mem.patterns.rag.RAGMemory`,
an object it holds when its store
:attr:`~marsys_mem.store.base.MemoryStore.supports_vectors`: every vector computed is
written to the store next to its message, under the embedder's name (the model; see
:mod:`marsys_mem.store.vectors`). Opening (:meth:`SharedVectors.read_all`), and catching
up before each search (:meth:`SharedVectors.read_new`), read from the store only what is
newer than the memory has: messages and vectors after its two cursors, in one
transaction. A stored vector goes into the index without embedding; a message with none
yet is embedded and its vector stored. So a message one process (or host) embedded is not
embedded again by the others, and each finds the others' messages after one catch-up.

Two memories can both embed a message only when both reach it before its vector is stored
(the later write replaces the earlier; a deterministic embedder writes the same vector).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from marsys_mem.exceptions import MessageNotFoundError, StoreError
from marsys_mem.model.messages import Message
from marsys_mem.retrieval.embeddings import Embedder
from marsys_mem.retrieval.vector_sync import StoredVectors
from marsys_mem.store.base import Key, LoadAfter, LoadVectors, MemoryStore
from marsys_mem.store.vectors import MAX_MODEL_CHARS, VectorPage

__all__ = ["NewInStore", "SharedVectors"]

log = logging.getLogger("marsys_mem.patterns.rag")


@dataclass(frozen=True, slots=True)
class NewInStore:
    """What the store has after a memory's cursors (:meth:`SharedVectors.read_new`).

    Attributes:
        messages: the messages appended after the message cursor, in the key's order.
        count: how many messages the key holds now (fewer than the memory: some deleted).
        vectors: the vectors written after the vector cursor (``None``: none, or none that
            fit the embedder).

    Example:
        >>> NewInStore([], 0, None).count
        0
    """

    messages: list[Message]
    count: int
    vectors: StoredVectors | None


class SharedVectors:
    """A memory's vectors in its store: written once beside their messages, read by cursor.

    Args:
        store: the store (it keeps vectors: :meth:`possible`).
        key: the store key of the memory's messages.
        embedder: the model (its name files the vectors).

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

    def __init__(self, store: MemoryStore, key: Key, embedder: Embedder) -> None:
        self.store = store
        self.key = key
        self.embedder = embedder
        self._msg_cursor = 0  # the store's message cursor the memory has caught up to
        self._vec_cursor = 0  # the store's vector cursor the memory has caught up to

    @staticmethod
    def possible(store: MemoryStore | None, embedder: Embedder | None) -> bool:
        """Whether a memory's vectors can go through ``store`` (decided when opening)."""
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

    @property
    def vector_cursor(self) -> int:
        """The store's vector cursor the memory has caught up to."""
        return self._vec_cursor

    def read_all(self) -> tuple[list[Message], StoredVectors | None]:
        """On opening: the key's messages and its stored vectors (one snapshot)."""
        vectors, page = self.store.batch(  # vectors first: see read_new
            [LoadVectors(self.key, self.embedder.name, 0), LoadAfter(self.key, 0)]
        )
        self._msg_cursor, self._vec_cursor = page.cursor, vectors.cursor
        if not self.usable(vectors):
            return page.messages, None
        return page.messages, (vectors.message_ids, vectors.vectors)

    def read_new(self) -> NewInStore:
        """What the store has after the cursors (one transaction); the cursors move past it.

        Call it under the memory's lock (its adds and removes hold it over their store
        write), so what it reads and the memory's view are one.
        """
        # Vectors before messages: even where a batch is not one snapshot (a store
        # reading each op at its own moment), every vector read has its message
        # committed before it, so the message read next includes it.
        vectors, page = self.store.batch(
            [
                LoadVectors(self.key, self.embedder.name, self._vec_cursor),
                LoadAfter(self.key, self._msg_cursor),
            ]
        )
        self._msg_cursor, self._vec_cursor = page.cursor, vectors.cursor
        stored = (
            (vectors.message_ids, vectors.vectors)
            if len(vectors) and self.usable(vectors)
            else None
        )
        return NewInStore(page.messages, page.count, stored)

    def usable(self, page: VectorPage) -> bool:
        """Whether stored vectors fit this embedder (a name must mean one dimension)."""
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

    def persist(self, ids: Sequence[str], vectors: npt.NDArray[np.float32]) -> None:
        """Write vectors just computed to the store; never raises.

        A message deleted meanwhile (by this or another process) is skipped; a store that
        fails is logged: the vectors stay in the memory's index, another process embeds
        its own.
        """
        if not ids:
            return
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
