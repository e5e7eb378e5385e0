"""Embeddings stored next to their messages, and the cursors that let readers catch up.

A store that ``supports_vectors`` keeps one ``float32`` vector per message and embedding
model, deleted with its message in the same transaction; a model has one dimension in a
store for ever. Cursors only grow and follow commit order, so ``load_vectors(...,
after=cursor)`` and ``load_messages_after`` return exactly what was written since. This
module holds the result types and the one byte format (:func:`to_bytes` /
:func:`from_bytes`) every backend stores a vector in.

Guide (the contract for a backend):
``docs/guides/retention-and-stores.md#vectors-in-a-store-for-backend-authors``.

Example:
    >>> import numpy as np
    >>> from marsys_mem.model.messages import Message
    >>> from marsys_mem.store import InMemoryStore
    >>> store = InMemoryStore()
    >>> key = ("default", "rag", "main")
    >>> store.append_messages(key, [Message.user("hi", message_id="m1")])
    >>> store.put_vectors(key, "toy-2d", ["m1"], np.array([[0.6, 0.8]], dtype=np.float32))
    1
    >>> page = store.load_vectors(key, "toy-2d")
    >>> page.message_ids, page.vectors.tolist(), page.cursor > 0
    (('m1',), [[0.6000000238418579, 0.800000011920929]], True)
    >>> store.load_vectors(key, "toy-2d", after=page.cursor).message_ids
    ()
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from marsys_mem.model.messages import Message
from marsys_mem.store.keys import Key

__all__ = [
    "MAX_MODEL_CHARS",
    "MessagePage",
    "VectorPage",
    "empty_vectors",
    "from_bytes",
    "to_bytes",
]

MAX_MODEL_CHARS = 1000
"""The longest model name a store accepts."""

_LE_FLOAT32 = np.dtype("<f4")


@dataclass(frozen=True, slots=True)
class VectorPage:
    """Vectors of one model, in the order they were written, and the cursor after them.

    Attributes:
        keys: the key of each row's message.
        message_ids: the message id of each row.
        vectors: ``float32`` array of shape ``(rows, dim)`` (``(0, dim)`` when empty; ``dim``
            is 0 when the store holds no vector of the model).
        cursor: pass it as ``after`` to get only what is written later.

    Example:
        >>> page = VectorPage((), (), empty_vectors(4), 7)
        >>> len(page), page.vectors.shape
        (0, (0, 4))
    """

    keys: tuple[Key, ...]
    message_ids: tuple[str, ...]
    vectors: npt.NDArray[np.float32]
    cursor: int

    def __len__(self) -> int:
        return len(self.message_ids)


@dataclass(frozen=True, slots=True)
class MessagePage:
    """Messages appended to a key after a cursor, the cursor after them, the key's count.

    Attributes:
        messages: the messages appended after the cursor given, oldest first.
        cursor: pass it as ``after`` to get only what is appended later (the cursor given
            when nothing was appended since).
        count: how many messages the key holds now; a reader that held ``n`` messages
            before sees deletions as ``count != n + len(messages)``.

    Example:
        >>> page = MessagePage([], 3, 2)
        >>> len(page), page.count
        (0, 2)
    """

    messages: list[Message]
    cursor: int
    count: int

    def __len__(self) -> int:
        return len(self.messages)


def empty_vectors(dim: int) -> npt.NDArray[np.float32]:
    """A ``(0, dim)`` ``float32`` array (what an empty page holds)."""
    return np.zeros((0, dim), dtype=np.float32)


def to_bytes(vector: npt.NDArray[np.float32]) -> bytes:
    """One vector as stored: ``float32`` little-endian, ``4 * dim`` bytes, no header.

    Example:
        >>> to_bytes(np.array([1.0], dtype=np.float32)).hex()
        '0000803f'
    """
    return np.ascontiguousarray(vector, dtype=_LE_FLOAT32).tobytes()


def from_bytes(rows: list[bytes], dim: int) -> npt.NDArray[np.float32]:
    """Stored vectors back as one ``(len(rows), dim)`` native ``float32`` array.

    Raises:
        ValueError: a row is not ``4 * dim`` bytes long.

    Example:
        >>> from_bytes([bytes.fromhex('0000803f')], 1).tolist()
        [[1.0]]
    """
    if not rows:
        return empty_vectors(dim)
    size = 4 * dim
    for i, row in enumerate(rows):
        if len(row) != size:
            raise ValueError(f"stored vector {i} has {len(row)} bytes, expected {size} ({dim}-D)")
    flat = np.frombuffer(b"".join(rows), dtype=_LE_FLOAT32)
    return flat.astype(np.float32).reshape(len(rows), dim)
