"""Search inside the store: a RAGMemory that holds no messages and no vectors.

:class:`StoreSearch` is the stateless half of :class:`~marsys_mem.patterns.rag.RAGMemory`
(its base class; not used on its own). When the memory's store searches by itself
(:attr:`~marsys_mem.store.base.MemoryStore.supports_search`: PostgreSQL with pgvector),
the memory loads nothing when it opens: ``add`` embeds on the host and writes the
messages and their vectors in one store transaction, and a search embeds the query,
asks the store for its best dense candidates (``search_vectors``, cosine) and keyword
candidates (``search_text``, the database's rank), reads those candidates' messages
(``Load(key, ids=...)``) and hands them to the same ranker as the in-process path
(context turns, thread relevance, fusion, time cues). A host is ready at once, its
memory does not grow with the store, and every host sees every other host's messages
and deletions the moment they commit: there is nothing to catch up.

What the database returns is all the ranker sees: the context turns of a candidate are
the candidates of its thread (the store has no operation that reads the turns around a
message), a candidate found by keywords only is given the lowest cosine of the dense
candidates (its cosine is at most that), and the keyword scores are the database's rank,
not BM25 (the fusion standardises each side, so only their spread matters).
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from marsys_mem.exceptions import MessageNotFoundError
from marsys_mem.model.messages import Message
from marsys_mem.retrieval.bm25 import BM25Index, score_with_stats, tokenize
from marsys_mem.retrieval.embeddings import Embedder
from marsys_mem.store.base import CountMessages, Key, Load, MemoryStore, SearchText

__all__ = ["COSINES", "MAX_WORDS", "Found", "StoreSearch", "TextPages", "query_words", "text_pages"]

log = logging.getLogger("marsys_mem.patterns.rag")


@dataclass(frozen=True, slots=True)
class TextPages:
    """The store's keyword matches for one query: the whole query's and each word's.

    Attributes:
        depth: how many matches each search asked for.
        query: the ids the whole query matched, best first by the database's rank.
        words: per query term (as the in-process BM25 tokenizes it), the ids its word
            matched.
        count: how many messages the keys hold.
        keys: the key of every id matched.
        unasked: the query's terms past the first :data:`MAX_WORDS`, not searched alone.

    Example:
        >>> pages = TextPages(2, ["a"], {"car": ["a", "b"], "level": ["a"]}, count=10)
        >>> pages.ids(), pages.doc_freq(), pages.exhausted
        (['a', 'b'], {'car': 2, 'level': 1}, False)
    """

    depth: int
    query: list[str]
    words: dict[str, list[str]]
    count: int
    keys: dict[str, Key] = field(default_factory=dict)
    unasked: tuple[str, ...] = ()

    def ids(self) -> list[str]:
        """Every id matched, the whole query's first, each once."""
        return list(dict.fromkeys(itertools.chain(self.query, *self.words.values())))

    def doc_freq(self) -> dict[str, int]:
        """Each term's document frequency: exact below ``depth``, else ``depth`` (a floor).

        A term not asked about (past :data:`MAX_WORDS`) counts as common: ``depth``.
        """
        freq = dict.fromkeys(self.unasked, self.depth)
        freq.update((term, len(ids)) for term, ids in self.words.items())
        return freq

    @property
    def exhausted(self) -> bool:
        """Whether every search returned all its matches."""
        return all(len(ids) < self.depth for ids in (self.query, *self.words.values()))


@dataclass(frozen=True, slots=True)
class Found:
    """What a store's search returned for one query, ready to rank.

    Attributes:
        dense: ``(message id, cosine)`` of the dense candidates, best first.
        text: ``(message id, BM25 score)`` of the keyword candidates, best first.
        cosines: the cosines the dense search returned (``COSINES`` times as many as
            ``dense``: most keyword candidates and context turns are among them).
        keyword: the BM25 score of every candidate (0.0: no query term).
        messages: every candidate's message by id, in the key's order (oldest first).
        floor: the cosine a candidate missing from ``cosines`` is given, the lowest of
            them (``None``: the search returned every vector the key has, so such a
            candidate has none).
        exhausted: neither side can return more candidates than it did.

    Example:
        >>> found = Found([("a", 0.9)], [("b", 2.0)], {"a": 0.9}, {"b": 2.0}, {}, 0.9, True)
        >>> found.ids()
        ['a', 'b']
    """

    dense: list[tuple[str, float]]
    text: list[tuple[str, float]]
    cosines: dict[str, float]
    keyword: dict[str, float]
    messages: dict[str, Message]
    floor: float | None
    exhausted: bool

    def ids(self) -> list[str]:
        """The candidates of either side, dense first, each once."""
        return list(dict.fromkeys([mid for mid, _ in self.dense] + [mid for mid, _ in self.text]))


def query_words(query: str) -> dict[str, str]:
    """Each term of ``query`` (as BM25 tokenizes it) and the first word that gave it.

    Example:
        >>> query_words("Where did Maya park the cars? parking level 4")
        {'maya': 'Maya', 'park': 'park', 'car': 'cars', 'level': 'level', '4': '4'}
    """
    words: dict[str, str] = {}
    for word in _WORD.findall(query):
        for term in tokenize(word):
            words.setdefault(term, word)
    return words


def text_pages(store: MemoryStore, query: str, depth: int, keys: Sequence[Key]) -> TextPages:
    """A store's keyword matches in ``keys``: the whole query's and each word's (one batch).

    Each word's matches give its document frequency (below ``depth``), so the host scores
    the candidates with BM25 as the in-process path does (the database's own rank weighs
    a common word as much as a rare one).
    """
    words = query_words(query)
    unasked = tuple(list(words)[MAX_WORDS:])
    words = dict(list(words.items())[:MAX_WORDS])
    scope = tuple(keys)
    ops: list[SearchText | CountMessages] = [SearchText(query, depth, scope)]
    ops += [SearchText(word, depth, scope) for word in words.values()]
    ops += [CountMessages(key) for key in scope]
    results = store.batch(ops)
    pages, counts = results[: 1 + len(words)], results[1 + len(words) :]
    ids = [[h.message_id for h in page] for page in pages]
    where = {h.message_id: h.key for page in pages for h in page}
    pages_of = dict(zip(words, ids[1:], strict=True))
    return TextPages(depth, ids[0], pages_of, sum(counts), where, unasked)


MAX_WORDS = 12
"""The most query terms searched one by one (for their document frequencies) per search."""

COSINES = 4
"""How many more cosines than dense candidates a search reads (for the other candidates)."""

_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)?")


class StoreSearch:
    """The stateless side of :class:`~marsys_mem.patterns.rag.RAGMemory` (a base class).

    The attributes below are set by ``RAGMemory.__init__``.

    Example:
        >>> from marsys_mem.patterns import RAGMemory
        >>> from marsys_mem.store import InMemoryStore
        >>> mem = RAGMemory(None, store=InMemoryStore())  # a store that does not search
        >>> mem.stateless
        False
        >>> mem.close()
    """

    store: MemoryStore | None
    key: Key
    owner: Key | None
    embedder: Embedder | None
    _bm25: BM25Index  # empty here: its k1 and b score the store's candidates
    _stateless: bool

    @property
    def stateless(self) -> bool:
        """Whether searches run in the store and this memory holds no messages or vectors."""
        return self._stateless

    def _searches_in_store(self) -> bool:
        """Whether to search in the store (decided when opening): it can, and vectors fit."""
        store, embedder = self.store, self.embedder
        if store is None or embedder is None or not store.supports_search:
            return False
        return self._share_vectors()

    def _share_vectors(self) -> bool:
        raise NotImplementedError  # SharedVectors'

    def _keyword_text(self, m: Message, text: str) -> str:
        raise NotImplementedError  # RAGMemory's

    # ------------------------------------------------------------------ reading
    def _text_pages(self, query: str, depth: int) -> TextPages:
        """The store's keyword matches under this memory's key (see :func:`text_pages`)."""
        assert self.store is not None
        return text_pages(self.store, query, depth, (self.key,))

    def _search_store(
        self,
        query: str,
        qvec: npt.NDArray[np.float32] | None,
        text_pages: Callable[[], TextPages | None],
        depth: int,
    ) -> Found:
        """The store's ``depth`` best candidates on each side, their messages and scores.

        ``qvec``: the query's vector (``None``: no dense side); ``text_pages()``: the
        keyword matches (``None``: no keyword side), asked for after the dense search (it
        may be under way in another thread meanwhile).
        """
        assert self.store is not None
        dense: list[tuple[str, float]] = []
        cosines: dict[str, float] = {}
        floor: float | None = None
        dense_done = True
        if qvec is not None:
            assert self.embedder is not None
            wide = COSINES * depth
            hits = self.store.search_vectors(self.embedder.name, qvec[0], wide, keys=(self.key,))
            cosines = {h.message_id: h.score for h in hits}
            dense = [(h.message_id, h.score) for h in hits[:depth]]
            dense_done = len(dense) < depth
            if len(hits) == wide:
                floor = hits[-1].score  # the key holds more vectors, none with a higher cosine
        pages = text_pages()
        matched = pages.ids() if pages is not None else []
        ids = list(dict.fromkeys([mid for mid, _ in dense] + matched))
        messages = {m.message_id: m for m in self._load(ids)} if ids else {}
        keyword: dict[str, float] = {}
        text: list[tuple[str, float]] = []
        if pages is not None and messages:
            texts = [self._keyword_text(m, m.text) for m in messages.values()]
            scores = score_with_stats(
                query,
                texts,
                doc_count=max(pages.count, len(messages)),
                doc_freq=pages.doc_freq(),
                k1=self._bm25.k1,
                b=self._bm25.b,
            )
            keyword = dict(zip(messages, scores.tolist(), strict=True))
            text = sorted(
                ((mid, keyword[mid]) for mid in matched if keyword.get(mid, 0.0) > 0),
                key=lambda hit: -hit[1],
            )[:depth]
        exhausted = dense_done and (pages is None or pages.exhausted)
        return Found(dense, text, cosines, keyword, messages, floor, exhausted)

    def _load(self, ids: Sequence[str]) -> list[Message]:
        """The messages of ``ids`` still stored under the key, in the key's order."""
        assert self.store is not None
        found: list[Message] = self.store.batch([Load(self.key, ids=tuple(ids))])[0]
        return found

    # ------------------------------------------------------------------ the container
    def _stored_count(self) -> int:
        assert self.store is not None
        return self.store.count_messages(self.key)

    def _stored_get(self, message_id: str) -> Message:
        if isinstance(message_id, str) and message_id:
            for m in self._load([message_id]):
                return m
        raise MessageNotFoundError(f"no message {message_id!r} in this RAGMemory")

    def _stored_messages(self) -> list[Message]:
        assert self.store is not None
        return self.store.load_messages(self.key)

    def _stored_remove(self, ids: Iterable[str]) -> int:
        """Delete the stored messages of ``ids`` (unknown ids are ignored); the count."""
        assert self.store is not None
        wanted = tuple(dict.fromkeys(ids))
        if not wanted:
            return 0
        return self.store.delete_messages(self.key, wanted)
