"""Conformance: embeddings stored next to their messages (:attr:`Capability.VECTORS`).

Optional: a backend whose :attr:`~marsys_mem.store.base.MemoryStore.supports_vectors` is
false declares it unsupported, with the reason. Clauses of :mod:`marsys_mem.store.base`
(``PutVectors``, ``LoadVectors``, ``LoadAfter``) and :mod:`marsys_mem.store.vectors`:
one vector per ``(key, message_id, model)``, deleted with its message in the same
transaction; cursors that return exactly what was written after them.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import numpy as np
import numpy.typing as npt
import pytest

from marsys_mem.exceptions import MessageNotFoundError
from marsys_mem.store.base import Append, Delete, MemoryStore, PutVectors
from marsys_mem.testing.conformance.data import (
    KEY,
    OTHER_KEY,
    T0,
    append_retention_messages,
    message_ids,
    user_messages,
)
from marsys_mem.testing.conformance.harness import Capability, StoreHarness

__all__ = ["MODEL", "VectorsConformance", "vectors_of"]

MODEL = "conformance-model"
"""The model name the vector tests store under."""


def vectors_of(n: int, dim: int = 4, *, seed: int = 0) -> npt.NDArray[np.float32]:
    """``n`` distinct ``float32`` vectors of ``dim`` values (awkward bits included).

    Example:
        >>> vectors_of(2, 3).shape
        (2, 3)
    """
    rng = np.random.default_rng(seed)
    out = rng.standard_normal((n, dim)).astype(np.float32)
    if n and dim > 1:
        out[0, 0] = np.float32(1e-38)  # a subnormal-adjacent value must survive exactly
        out[0, 1] = np.float32(-0.0)
    return out


def _by_id(ids: tuple[str, ...], vectors: npt.NDArray[np.float32]) -> dict[str, bytes]:
    return {mid: vectors[i].tobytes() for i, mid in enumerate(ids)}


class VectorsConformance(StoreHarness):
    """Put and load vectors, catch up by cursor, cascade deletes, refuse bad input.

    Example:
        >>> import pytest
        >>> from marsys_mem.store import InMemoryStore
        >>> class TestVectors(VectorsConformance):
        ...     @pytest.fixture
        ...     def store(self):
        ...         with InMemoryStore() as s:
        ...             yield s
    """

    def test_vectors_roundtrip(self, store: MemoryStore) -> None:
        """``PutVectors`` / ``LoadVectors``: one vector per message and model.

        Checks: ``supports_vectors`` is true; vectors come back bit-identical as a
        ``float32`` ``(n, dim)`` array in write order, with their keys and ids, by key and
        store-wide; models do not mix; an unknown model gives an empty page whose cursor is
        the one given.
        """
        self.require(Capability.VECTORS)
        assert store.supports_vectors
        msgs = user_messages(3)
        store.append_messages(KEY, msgs)
        store.append_messages(OTHER_KEY, user_messages(2, prefix="o"))
        vecs = vectors_of(3)
        assert store.put_vectors(KEY, MODEL, message_ids(msgs), vecs) == 3
        assert store.put_vectors(OTHER_KEY, MODEL, ["o1"], vectors_of(1, seed=1)) == 1
        assert store.put_vectors(KEY, "other-model", ["m0"], vectors_of(1, 2)) == 1
        page = store.load_vectors(KEY, MODEL)
        assert page.message_ids == ("m0", "m1", "m2")
        assert page.keys == (KEY, KEY, KEY)
        assert page.vectors.dtype == np.float32
        assert page.vectors.shape == (3, 4)
        assert page.vectors.tobytes() == vecs.tobytes()
        every = store.load_vectors(None, MODEL)
        assert list(zip(every.keys, every.message_ids, strict=True)) == [
            (KEY, "m0"),
            (KEY, "m1"),
            (KEY, "m2"),
            (OTHER_KEY, "o1"),
        ]
        other = store.load_vectors(None, "other-model")
        assert other.message_ids == ("m0",)
        assert other.vectors.shape == (1, 2)
        empty = store.load_vectors(KEY, "never-stored", after=5)
        assert len(empty) == 0
        assert empty.cursor == 5
        assert empty.vectors.shape[0] == 0

    def test_rewrite_replaces_and_moves_after_the_cursor(self, store: MemoryStore) -> None:
        """``PutVectors``: a vector a message already has for ``model`` is replaced.

        Checks: the message keeps one vector (the new one), which a reader holding the old
        cursor receives as written after it.
        """
        self.require(Capability.VECTORS)
        store.append_messages(KEY, user_messages(2))
        store.put_vectors(KEY, MODEL, ["m0", "m1"], vectors_of(2))
        cursor = store.load_vectors(KEY, MODEL).cursor
        new = vectors_of(1, seed=7)
        store.put_vectors(KEY, MODEL, ["m0"], new)
        after = store.load_vectors(KEY, MODEL, after=cursor)
        assert after.message_ids == ("m0",)
        assert after.vectors.tobytes() == new.tobytes()
        assert after.cursor > cursor
        whole = store.load_vectors(KEY, MODEL)
        assert whole.message_ids == ("m1", "m0")
        assert _by_id(whole.message_ids, whole.vectors)["m0"] == new[0].tobytes()

    def test_cursor_catch_up(self, store: MemoryStore) -> None:
        """``LoadVectors``: written after cursor ``after``; ``limit`` pages.

        Checks: paging with ``limit`` returns every vector exactly once, in write order;
        the cursor after the last page returns nothing until more is written, then exactly
        that; a key's catch-up skips other keys' vectors; cursors only grow.
        """
        self.require(Capability.VECTORS)
        msgs = user_messages(7)
        store.append_messages(KEY, msgs)
        store.append_messages(OTHER_KEY, user_messages(1, prefix="o"))
        vecs = vectors_of(7)
        for i in range(0, 7, 3):  # three writes
            store.put_vectors(KEY, MODEL, message_ids(msgs[i : i + 3]), vecs[i : i + 3])
        seen: list[str] = []
        cursor = 0
        while True:
            page = store.load_vectors(KEY, MODEL, after=cursor, limit=2)
            assert page.cursor >= cursor
            if not len(page):
                break
            assert len(page) <= 2
            seen.extend(page.message_ids)
            cursor = page.cursor
        assert seen == message_ids(msgs)
        assert not len(store.load_vectors(KEY, MODEL, after=cursor))
        store.put_vectors(OTHER_KEY, MODEL, ["o0"], vectors_of(1))
        assert not len(store.load_vectors(KEY, MODEL, after=cursor))
        assert store.load_vectors(None, MODEL, after=cursor).message_ids == ("o0",)
        store.append_messages(KEY, user_messages(1, prefix="n"))
        store.put_vectors(KEY, MODEL, ["n0"], vectors_of(1))
        late = store.load_vectors(KEY, MODEL, after=cursor)
        assert late.message_ids == ("n0",)
        assert late.cursor > cursor

    def test_messages_after_cursor(self, store: MemoryStore) -> None:
        """``LoadAfter``: messages appended after cursor ``after``, the cursor, the count.

        Checks: ``after=0`` gives every message; the cursor returned gives nothing until
        more is appended, then exactly that, in order; ``count`` shows deletions.
        """
        self.require(Capability.VECTORS)
        msgs = user_messages(4)
        store.append_messages(KEY, msgs[:3])
        first = store.load_messages_after(KEY)
        assert first.messages == msgs[:3]
        assert first.count == 3
        assert first.cursor > 0
        none = store.load_messages_after(KEY, first.cursor)
        assert none.messages == []
        assert none.cursor == first.cursor
        assert none.count == 3
        store.append_messages(OTHER_KEY, user_messages(2, prefix="o"))
        store.append_messages(KEY, msgs[3:])
        store.delete_messages(KEY, ["m0"])
        later = store.load_messages_after(KEY, first.cursor)
        assert later.messages == msgs[3:]
        assert later.cursor > first.cursor
        assert later.count == 3  # 3 held + 1 new - 1 deleted: the reader sees a deletion
        assert store.load_messages_after(("default", "nobody", "main")).count == 0

    def test_vectors_deleted_with_their_messages(self, store: MemoryStore) -> None:
        """Vectors are deleted with their messages, whatever deletes them.

        Checks: ``delete_messages`` by ids, by ``before`` and of the whole key, and retention
        (ttl and ``max_messages``) leave no vector of a deleted message; a message stored
        again under the same id has no vector until one is put.
        """
        self.require(Capability.VECTORS)
        msgs = user_messages(6)
        store.append_messages(KEY, msgs)
        store.put_vectors(KEY, MODEL, message_ids(msgs), vectors_of(6))
        store.put_vectors(KEY, "other-model", ["m1"], vectors_of(1, 2))
        store.delete_messages(KEY, ["m1"])
        assert "m1" not in store.load_vectors(KEY, MODEL).message_ids
        assert not len(store.load_vectors(KEY, "other-model"))
        store.delete_messages(KEY, before=T0 + timedelta(minutes=3))  # m0, m2
        assert store.load_vectors(KEY, MODEL).message_ids == ("m3", "m4", "m5")
        store.append_messages(KEY, [msgs[0]])  # the same id again: a new message
        assert "m0" not in store.load_vectors(KEY, MODEL).message_ids
        store.delete_messages(KEY)
        assert not len(store.load_vectors(None, MODEL))

        kept = append_retention_messages(store, OTHER_KEY)
        store.put_vectors(OTHER_KEY, MODEL, message_ids(kept), vectors_of(len(kept)))
        store.enforce_retention(OTHER_KEY, ttl=timedelta(days=3), now=T0)
        store.enforce_retention(OTHER_KEY, max_messages=4, now=T0)
        left = message_ids(store.load_messages(OTHER_KEY))
        assert list(store.load_vectors(OTHER_KEY, MODEL).message_ids) == left

    def test_vector_writes_are_all_or_nothing(self, store: MemoryStore) -> None:
        """``batch``: one transaction; ``PutVectors`` of a message not stored fails whole.

        Checks: a put naming one unknown id stores none of its vectors
        (``MessageNotFoundError``); a batch whose later op fails keeps no vector it put
        and no deletion it made; a delete and an append of the same id in one batch leave
        the new message without the old vector.
        """
        self.require(Capability.VECTORS)
        store.append_messages(KEY, user_messages(2))
        with pytest.raises(MessageNotFoundError, match="nope"):
            store.put_vectors(KEY, MODEL, ["m0", "nope"], vectors_of(2))
        with pytest.raises(MessageNotFoundError):
            store.put_vectors(OTHER_KEY, MODEL, ["m0"], vectors_of(1))  # another key's id
        assert not len(store.load_vectors(None, MODEL))
        store.put_vectors(KEY, MODEL, ["m1"], vectors_of(1))
        before = store.load_vectors(None, MODEL)
        frozen = vectors_of(1, seed=3)
        frozen.flags.writeable = False
        with pytest.raises(MessageNotFoundError):
            store.batch(
                [
                    PutVectors(KEY, MODEL, ("m0",), frozen),
                    Delete(KEY, ("m1",)),
                    PutVectors(KEY, MODEL, ("gone",), frozen),
                ]
            )
        after = store.load_vectors(None, MODEL)
        assert after.message_ids == before.message_ids
        assert after.vectors.tobytes() == before.vectors.tobytes()
        assert message_ids(store.load_messages(KEY)) == ["m0", "m1"]
        (m1,) = [m for m in store.load_messages(KEY) if m.message_id == "m1"]
        store.batch([Delete(KEY, ("m1",)), Append(KEY, (m1,))])
        assert "m1" not in store.load_vectors(KEY, MODEL).message_ids

    def test_bad_vector_input_is_refused(self, store: MemoryStore) -> None:
        """Malformed vector arguments are rejected before anything is written.

        Checks: a blank or over-long model, repeated ids, a shape that does not match the
        ids, NaN or infinity, a non-float32 array given to the op, a negative cursor or a
        zero limit, and a dimension other than the model's (``ValueError`` naming both)
        raise, and nothing is stored.
        """
        self.require(Capability.VECTORS)
        store.append_messages(KEY, user_messages(2))
        ids = ["m0", "m1"]
        good = vectors_of(2)
        with pytest.raises(ValueError, match="model"):
            store.put_vectors(KEY, " ", ids, good)
        with pytest.raises(ValueError, match="model"):
            store.put_vectors(KEY, "x" * 1001, ids, good)
        with pytest.raises(ValueError, match="twice"):
            store.put_vectors(KEY, MODEL, ["m0", "m0"], good)
        with pytest.raises(ValueError, match="shape"):
            store.put_vectors(KEY, MODEL, ids, good[:1])
        with pytest.raises(ValueError, match="shape"):
            store.put_vectors(KEY, MODEL, ids, np.zeros((2, 0), dtype=np.float32))
        bad = good.copy()
        bad[1, 2] = np.nan
        with pytest.raises(ValueError, match=r"vectors\[1\]"):
            store.put_vectors(KEY, MODEL, ids, bad)
        with pytest.raises(TypeError, match="float32"):
            store.batch([PutVectors(KEY, MODEL, ("m0",), np.zeros((1, 4)))])  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            store.put_vectors(KEY, MODEL, "m0", good[:1])  # a single str is not ids
        with pytest.raises(ValueError, match="after"):
            store.load_vectors(KEY, MODEL, after=-1)
        with pytest.raises(ValueError, match="limit"):
            store.load_vectors(KEY, MODEL, limit=0)
        with pytest.raises(ValueError, match="after"):
            store.load_messages_after(KEY, -1)
        assert not len(store.load_vectors(None, MODEL))
        store.put_vectors(KEY, MODEL, ["m0"], good[:1])
        with pytest.raises(ValueError, match=r"4-D.*3-D"):
            store.put_vectors(KEY, MODEL, ["m1"], vectors_of(1, 3))
        assert store.load_vectors(None, MODEL).message_ids == ("m0",)

    def test_vector_async_twins(self, store: MemoryStore) -> None:
        """``aput_vectors``, ``aload_vectors``, ``aload_messages_after``: the async twins.

        Checks: they do what the sync methods do.
        """
        self.require(Capability.VECTORS)

        async def scenario() -> None:
            await store.aappend_messages(KEY, user_messages(2))
            page = await store.aload_messages_after(KEY)
            assert message_ids(page.messages) == ["m0", "m1"]
            assert await store.aput_vectors(KEY, MODEL, ["m1"], vectors_of(1)) == 1
            got = await store.aload_vectors(KEY, MODEL, after=0, limit=5)
            assert got.message_ids == ("m1",)

        asyncio.run(scenario())

    def test_vectors_shared_through_the_store(self, store_location: str) -> None:
        """Stored vectors outlive the store object and are read by another one.

        Checks: a second store object opened at the same location sees the first one's
        vectors after its cursor, and the first sees the second's (needs
        :attr:`Capability.DURABILITY` too).
        """
        self.require(Capability.VECTORS)
        self.require(Capability.DURABILITY)
        vecs = vectors_of(3)
        with self.open_store(store_location) as a, self.open_store(store_location) as b:
            a.append_messages(KEY, user_messages(3))
            a.put_vectors(KEY, MODEL, ["m0", "m1"], vecs[:2])
            seen = b.load_vectors(KEY, MODEL)
            assert seen.vectors.tobytes() == vecs[:2].tobytes()
            b.put_vectors(KEY, MODEL, ["m2"], vecs[2:])
            back = a.load_vectors(KEY, MODEL, after=seen.cursor)
            assert back.message_ids == ("m2",)
        with self.open_store(store_location) as again:
            assert again.load_vectors(KEY, MODEL).vectors.tobytes() == vecs.tobytes()
