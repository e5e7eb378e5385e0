"""Conformance: search inside the store (:attr:`Capability.SEARCH`).

Optional: a backend whose :attr:`~marsys_mem.store.base.MemoryStore.supports_search` is
false declares it unsupported, with the reason (its hosts search). Clauses of
:class:`~marsys_mem.store.base.SearchVectors`, :class:`~marsys_mem.store.base.SearchText`
and :class:`~marsys_mem.store.base.SearchHit`: hits best first, at most ``k``, limited to
the keys or namespace given; what is deleted (by id, ttl, ``max_messages``, a cascade) is
never found again, from the moment the delete commits.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from marsys_mem.exceptions import StoreError
from marsys_mem.model.messages import Message
from marsys_mem.store.base import Append, Key, MemoryStore
from marsys_mem.store.keys import internal_key
from marsys_mem.testing.conformance.data import KEY, OTHER_KEY, T0, THIRD_KEY, user_messages
from marsys_mem.testing.conformance.harness import Capability, StoreHarness

__all__ = ["SEARCH_MODEL", "SearchConformance", "unit_vectors"]

SEARCH_MODEL = "conformance-search"
"""The model name the search tests store vectors under."""

_FOREIGN: Key = ("elsewhere", "researcher", "main")
_TEXTS = (
    "My sister Clara lives in Lisbon",
    "I parked the car on level 4",
    "The weather in Lisbon is lovely today",
    "Clara's birthday is on the 3rd of May",
)


def unit_vectors(n: int, dim: int = 16, *, seed: int = 0) -> npt.NDArray[np.float32]:
    """``n`` random unit vectors (``float32``), far enough apart to rank without ties.

    Example:
        >>> v = unit_vectors(3, 4)
        >>> v.shape, bool(np.allclose(np.linalg.norm(v, axis=1), 1.0))
        ((3, 4), True)
    """
    rng = np.random.default_rng(seed)
    out = rng.standard_normal((n, dim)).astype(np.float32)
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    return out


def _exact(vectors: npt.NDArray[np.float32], query: npt.NDArray[np.float32], k: int) -> list[int]:
    return [int(i) for i in np.argsort(-(vectors @ query), kind="stable")[:k]]


class SearchConformance(StoreHarness):
    """Dense and keyword search in the store: ranking, filters, deletions, bad input.

    Example:
        >>> import pytest
        >>> from marsys_mem.store import InMemoryStore
        >>> class TestSearch(SearchConformance):
        ...     unsupported = {Capability.SEARCH: "its hosts search"}
        ...     @pytest.fixture
        ...     def store(self):
        ...         with InMemoryStore() as s:
        ...             yield s
    """

    def _with_vectors(
        self, store: MemoryStore, key: Key, n: int, *, seed: int = 0, prefix: str = "m"
    ) -> tuple[list[Message], npt.NDArray[np.float32]]:
        msgs = user_messages(n, prefix=prefix)
        store.append_messages(key, msgs)
        vectors = unit_vectors(n, seed=seed)
        store.put_vectors(key, SEARCH_MODEL, [m.message_id for m in msgs], vectors)
        return msgs, vectors

    def test_search_vectors_ranks_by_cosine(self, store: MemoryStore) -> None:
        """``SearchVectors``: the ``k`` nearest by cosine similarity, best first.

        Checks: ``supports_search`` is true; the hits are the exact top ``k`` in order
        (vectors far apart), each score the cosine similarity (to 1e-2: an index may keep
        vectors at half precision); ``k`` larger than the stored vectors returns them all.
        """
        self.require(Capability.SEARCH)
        assert store.supports_search
        msgs, vectors = self._with_vectors(store, KEY, 12)
        query = vectors[3] + 0.1 * vectors[7]
        hits = store.search_vectors(SEARCH_MODEL, query, 5)
        cosine = vectors @ (query / np.linalg.norm(query))
        want = _exact(vectors, query, 5)
        assert [h.message_id for h in hits] == [msgs[i].message_id for i in want]
        assert all(h.key == KEY for h in hits)
        for hit, i in zip(hits, want, strict=True):
            assert hit.score == pytest.approx(float(cosine[i]), abs=1e-2)
        assert len(store.search_vectors(SEARCH_MODEL, query, 100)) == 12

    def test_search_vectors_filters(self, store: MemoryStore) -> None:
        """``keys`` limits hits to those keys, ``namespace`` to that namespace.

        Checks: every hit of a filtered search is in the filter and they are the exact top
        ``k`` there; ``keys=()`` and a namespace or key with no vectors give no hits.
        """
        self.require(Capability.SEARCH)
        self._with_vectors(store, KEY, 10, seed=1, prefix="a")
        msgs_b, vectors_b = self._with_vectors(store, OTHER_KEY, 10, seed=2, prefix="b")
        self._with_vectors(store, _FOREIGN, 10, seed=3, prefix="c")
        query = unit_vectors(1, seed=9)[0]
        hits = store.search_vectors(SEARCH_MODEL, query, 4, keys=[OTHER_KEY])
        assert [h.message_id for h in hits] == [
            msgs_b[i].message_id for i in _exact(vectors_b, query, 4)
        ]
        spread = store.search_vectors(SEARCH_MODEL, query, 30, namespace="default")
        assert len(spread) == 20
        assert {h.key for h in spread} == {KEY, OTHER_KEY}
        both = store.search_vectors(SEARCH_MODEL, query, 30, keys=[KEY, _FOREIGN])
        assert {h.key for h in both} == {KEY, _FOREIGN}
        crossed = store.search_vectors(SEARCH_MODEL, query, 30, keys=[KEY], namespace="elsewhere")
        assert crossed == []
        assert store.search_vectors(SEARCH_MODEL, query, 3, keys=()) == []
        assert store.search_vectors(SEARCH_MODEL, query, 3, keys=[THIRD_KEY]) == []
        assert store.search_vectors(SEARCH_MODEL, query, 3, namespace="nobody") == []

    def test_search_on_an_empty_store_and_unknown_model(self, store: MemoryStore) -> None:
        """No vectors (or none of the model): no hits; no messages: no keyword hits.

        Checks: an empty store returns ``[]`` for both searches; a model the store never
        saw has no hits; a query vector of another dimension than the model's is refused
        with a ValueError naming both dimensions.
        """
        self.require(Capability.SEARCH)
        query = unit_vectors(1)[0]
        assert store.search_vectors(SEARCH_MODEL, query, 5) == []
        assert store.search_text("Lisbon", 5) == []
        self._with_vectors(store, KEY, 3)
        assert store.search_vectors("never-stored", query, 5) == []
        with pytest.raises(ValueError, match=r"8-D.*16-D|16-D.*8-D"):
            store.search_vectors(SEARCH_MODEL, np.ones(8, dtype=np.float32), 5)

    def test_deleted_messages_are_never_found(self, store: MemoryStore) -> None:
        """Deleting a message (by id, ttl, ``max_messages``, a copy's cascade) ends its hits.

        Checks: at once after each delete, neither search returns the message, and the
        others are still found.
        """
        self.require(Capability.SEARCH)
        texts = [f"Lisbon note {i}" for i in range(6)]
        msgs = [
            Message.user(t, message_id=f"d{i}", timestamp=T0 + timedelta(days=i))
            for i, t in enumerate(texts)
        ]
        store.append_messages(KEY, msgs)
        vectors = unit_vectors(6, seed=4)
        store.put_vectors(KEY, SEARCH_MODEL, [m.message_id for m in msgs], vectors)

        def found() -> tuple[set[str], set[str]]:
            dense = store.search_vectors(SEARCH_MODEL, vectors[0], 10)
            words = store.search_text("Lisbon", 10)
            return {h.message_id for h in dense}, {h.message_id for h in words}

        assert found() == ({m.message_id for m in msgs},) * 2
        store.delete_messages(KEY, ["d5"])
        assert found() == ({"d0", "d1", "d2", "d3", "d4"},) * 2
        store.enforce_retention(KEY, ttl=timedelta(days=2), now=T0 + timedelta(days=3, hours=1))
        assert found() == ({"d2", "d3", "d4"},) * 2
        store.enforce_retention(KEY, max_messages=2)
        assert found() == ({"d3", "d4"},) * 2
        # a copy (a RAG index of KEY) goes with its source
        rag = internal_key(KEY, "rag")
        copy = Message.user("Lisbon copy", message_id="d3")
        store.batch([Append(rag, (copy,), copies_of=KEY)])
        store.put_vectors(rag, SEARCH_MODEL, ["d3"], vectors[3:4])
        assert {h.key for h in store.search_text("copy", 5)} == {rag}
        store.delete_messages(KEY, ["d3"])
        assert store.search_text("copy", 5) == []
        assert found() == ({"d4"},) * 2

    def test_search_text_matches_any_word(self, store: MemoryStore) -> None:
        """``SearchText``: messages with any of the query's words, ranked, best first.

        Checks: a message with more of the words ranks above one with fewer; word forms
        match ("lives" / "live"); the speaker's name is searchable; a message with none
        of the words is not a hit; ``keys`` / ``namespace`` filter; hits' keys load
        their messages.
        """
        self.require(Capability.SEARCH)
        msgs = [Message.user(t, message_id=f"t{i}") for i, t in enumerate(_TEXTS)]
        msgs.append(Message.assistant("Noted, thanks", message_id="t4", name="Bartholomew"))
        store.append_messages(KEY, msgs)
        store.append_messages(_FOREIGN, [Message.user("Clara lives in Lisbon", message_id="f")])
        hits = store.search_text("where does Clara live in Lisbon", 10)
        ids = [h.message_id for h in hits]
        assert ids[0] in {"t0", "f"}
        assert set(ids) == {"t0", "t2", "t3", "f"}
        assert ids.index("t0") < ids.index("t2")
        assert all(a.score >= b.score for a, b in itertools.pairwise(hits))
        assert [h.message_id for h in store.search_text("bartholomew", 5)] == ["t4"]
        assert {h.message_id for h in store.search_text("Clara", 5, keys=[KEY])} == {"t0", "t3"}
        assert [h.message_id for h in store.search_text("Clara", 5, namespace="elsewhere")] == ["f"]
        assert store.search_text("Clara", 5, keys=[OTHER_KEY]) == []
        assert store.search_text("submarine", 5) == []
        top = store.search_text("parked car", 1)
        assert [m.text for m in store.load_messages(top[0].key, ids=[top[0].message_id])] == [
            _TEXTS[1]
        ]

    def test_search_hits_of_internal_keys_load(self, store: MemoryStore) -> None:
        """Hits in internal keys (a RAG copy) come with a key the store accepts back.

        Checks: the hit's key is the internal key, and ``load_messages(hit.key, ids=...)``
        and a ``keys`` filter with it work.
        """
        self.require(Capability.SEARCH)
        rag = internal_key(KEY, "rag")
        store.append_messages(KEY, [Message.user("Clara in Lisbon", message_id="x")])
        copy = Message.user("Clara in Lisbon", message_id="x")
        store.batch([Append(rag, (copy,), copies_of=KEY)])
        store.put_vectors(rag, SEARCH_MODEL, ["x"], unit_vectors(1))
        (hit,) = store.search_vectors(SEARCH_MODEL, unit_vectors(1)[0], 5)
        assert hit.key == rag
        assert [m.message_id for m in store.load_messages(hit.key, ids=[hit.message_id])] == ["x"]
        assert {h.key for h in store.search_text("Clara", 5, keys=[rag])} == {rag}

    def test_search_async_twins(self, store: MemoryStore) -> None:
        """``asearch_vectors`` / ``asearch_text`` return what the sync methods return.

        Checks: the same hits, filters included, from the async twins.
        """
        self.require(Capability.SEARCH)
        _, vectors = self._with_vectors(store, KEY, 5)
        store.append_messages(OTHER_KEY, [Message.user("Lisbon", message_id="w")])

        async def both() -> tuple[list[object], list[object]]:
            dense = await store.asearch_vectors(SEARCH_MODEL, vectors[1], 3, keys=[KEY])
            words = await store.asearch_text("Lisbon", 3, namespace="default")
            return list(dense), list(words)

        dense, words = asyncio.run(both())
        assert dense == store.search_vectors(SEARCH_MODEL, vectors[1], 3, keys=[KEY])
        assert words == store.search_text("Lisbon", 3, namespace="default")

    def test_search_refuses_bad_input_by_name(self, store: MemoryStore) -> None:
        """Bad arguments: a ValueError/TypeError naming the field; nothing else happens.

        Checks: NaN, ``k``, an empty query, a malformed key, an empty namespace.
        """
        self.require(Capability.SEARCH)
        self._with_vectors(store, KEY, 2)
        bad_key: Any = ("a", "b")
        cases: list[tuple[Callable[[], object], str]] = [
            (lambda: store.search_vectors(SEARCH_MODEL, [np.nan] * 16, 3), "NaN"),
            (lambda: store.search_vectors(SEARCH_MODEL, unit_vectors(1)[0], 0), "k must"),
            (lambda: store.search_text("", 3), "query must"),
            (lambda: store.search_text("x", 3, keys=[bad_key]), r"keys\[0\]"),
            (lambda: store.search_text("x", 3, namespace=""), "namespace must"),
        ]
        for call, field in cases:
            with pytest.raises((ValueError, TypeError), match=field):
                call()
        assert store.count_messages(KEY) == 2

    def test_score_vectors_gives_exact_cosines_of_ids(self, store: MemoryStore) -> None:
        """``ScoreVectors``: the cosines of the given ids' vectors in the key, best first.

        Checks: one hit per id with a vector (unknown ids, ids of another key and messages
        without a vector are left out), each the cosine (to 1e-2), ordered best first;
        an unknown model or no ids give nothing; another dimension is refused by name.
        """
        self.require(Capability.SEARCH)
        msgs, vectors = self._with_vectors(store, KEY, 8)
        self._with_vectors(store, OTHER_KEY, 3, seed=5, prefix="o")
        store.append_messages(KEY, [Message.user("no vector", message_id="bare")])
        query = vectors[2] + 0.3 * vectors[5]
        cosine = vectors @ (query / np.linalg.norm(query))
        want = [1, 2, 5, 6]
        ids = [msgs[i].message_id for i in want] + ["bare", "nope", "o0"]
        hits = store.score_vectors(SEARCH_MODEL, query, KEY, ids)
        order = sorted(want, key=lambda i: -cosine[i])
        assert [h.message_id for h in hits] == [msgs[i].message_id for i in order]
        assert all(h.key == KEY for h in hits)
        for hit, i in zip(hits, order, strict=True):
            assert hit.score == pytest.approx(float(cosine[i]), abs=1e-2)
        assert store.score_vectors("never-stored", query, KEY, ids) == []
        assert store.score_vectors(SEARCH_MODEL, query, KEY, []) == []
        with pytest.raises(ValueError, match=r"8-D.*16-D|16-D.*8-D"):
            store.score_vectors(SEARCH_MODEL, np.ones(8, dtype=np.float32), KEY, ids)
        with pytest.raises(ValueError, match=r"ids\[0\]"):
            store.score_vectors(SEARCH_MODEL, query, KEY, [""])

    def test_count_matches_counts_each_word_in_one_call(self, store: MemoryStore) -> None:
        """``CountMatches``: each word's keyword matches, counted, filtered as a search.

        Checks: each count is the number of messages ``search_text(word)`` finds (word
        forms match, the speaker's name counts); a word nothing holds and a stop word
        count 0; ``keys`` / ``namespace`` filter; bad words are refused by name.
        """
        self.require(Capability.SEARCH)
        msgs = [Message.user(t, message_id=f"t{i}") for i, t in enumerate(_TEXTS)]
        msgs.append(Message.assistant("Noted, thanks", message_id="t4", name="Bartholomew"))
        store.append_messages(KEY, msgs)
        store.append_messages(_FOREIGN, [Message.user("Clara lives in Lisbon", message_id="f")])
        words = ["Lisbon", "Clara", "living", "bartholomew", "submarine", "the"]
        counts = store.count_matches(words)
        assert counts == {
            "Lisbon": 3,
            "Clara": 3,
            "living": 2,
            "bartholomew": 1,
            "submarine": 0,
            "the": 0,
        }
        for word in words[:4]:
            assert counts[word] == len(store.search_text(word, 100))
        assert store.count_matches(["Clara"], keys=[KEY]) == {"Clara": 2}
        assert store.count_matches(["Clara"], namespace="elsewhere") == {"Clara": 1}
        assert store.count_matches(["Clara"], keys=()) == {"Clara": 0}
        assert store.count_matches([]) == {}
        with pytest.raises(ValueError, match=r"words\[1\]"):
            store.count_matches(["Clara", " "])

    def test_supports_search_matches_the_declaration(self, store: MemoryStore) -> None:
        """``supports_search`` says what the backend declared; without it, search is refused.

        Checks: a backend that declares search unsupported has ``supports_search`` false
        and refuses both operations with a StoreError pointing at the flag.
        """
        required = self.capability_report()[Capability.SEARCH] == "required"
        assert store.supports_search is required
        if not required:
            with pytest.raises(StoreError, match="supports_search"):
                store.search_text("x", 3)
            with pytest.raises(StoreError, match="supports_search"):
                store.search_vectors(SEARCH_MODEL, unit_vectors(1)[0], 3)
            with pytest.raises(StoreError, match="supports_search"):
                store.score_vectors(SEARCH_MODEL, unit_vectors(1)[0], KEY, ["m0"])
            with pytest.raises(StoreError, match="supports_search"):
                store.count_matches(["x"])
