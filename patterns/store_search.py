"""Search inside the store: a RAGMemory that holds no messages and no vectors.

:class:`StoreSearch` is the stateless part of :class:`~marsys_mem.patterns.rag.RAGMemory`,
an object it holds. When the memory's store searches by itself
(:attr:`~marsys_mem.store.base.MemoryStore.supports_search`: PostgreSQL with pgvector),
the memory loads nothing when it opens: ``add`` embeds on the host and writes the
messages and their vectors in one store transaction, and a search embeds the query,
asks the store for its best dense candidates (``search_vectors``, cosine) and keyword
candidates (``search_text``, the database's rank), reads those candidates' messages
(``Load(key, ids=...)``) and hands them to the same ranker as the in-process path
(context turns, thread relevance, fusion, time cues). A host is ready at once, its
memory does not grow with the store, and every host sees every other host's messages
and deletions the moment they commit: there is nothing to catch up.

The ranker sees what the in-process path would: the candidates' context turns are read
from the store with their exact cosines (``ScoreAround``: the turns before and after each
hit in its thread, as the in-process thread links have them), and the keyword side is
scored with BM25 on the host from the database's document frequencies of the query's
words (``CountMatches``). A hybrid search after the forward pass: the dense search, then
the dense hits' turns (parsed, and their query words counted, while the keyword side is
still read), while a helper thread counts the words and asks for the keyword page and
its hits' turns; then the ranking, and the hits it keeps, validated from the rows read.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from pydantic_core import from_json

from marsys_mem.exceptions import MessageNotFoundError
from marsys_mem.model.messages import MESSAGE_LIST_ADAPTER, Message
from marsys_mem.model.ranking import Ranking
from marsys_mem.retrieval.bm25 import bm25_of_counts, idfs_of, term_counts, tokenize
from marsys_mem.store.base import (
    MAX_COUNT_WORDS,
    MAX_SCORE_IDS,
    CountMatches,
    CountMessages,
    Key,
    Load,
    LoadAround,
    MemoryStore,
    ScoreAround,
    ScoreVectors,
    SearchHit,
    SearchText,
    SearchVectors,
    TurnRow,
)

__all__ = [
    "LENGTH_SAMPLE",
    "MAX_WORDS",
    "RANK_ALL_BELOW",
    "TEXT_BUDGET",
    "TEXT_WIDTH",
    "Found",
    "KeywordCounts",
    "StoreSearch",
    "TextPages",
    "TextTurns",
    "Turn",
    "TurnLike",
    "idf",
    "informative",
    "keyword_text",
    "may_match",
    "query_words",
    "term_pattern",
    "text_pages",
]

log = logging.getLogger("marsys_mem.patterns.rag")


@dataclass(frozen=True, slots=True)
class TextPages:
    """The store's keyword matches for one query, and each query term's document frequency.

    Attributes:
        depth: how many matches the search asked for.
        query: the ids the whole query matched, best first by the database's rank.
        freq: per query term (as the in-process BM25 tokenizes it), how many messages
            of the keys its word matches (the database's count).
        count: how many messages the keys hold.
        keys: the key of every id matched.
        unasked: the query's terms past the first :data:`MAX_WORDS`, not counted.

    Example:
        >>> pages = TextPages(2, ["a"], {"car": 2, "level": 1}, count=10, unasked=("x",))
        >>> pages.ids(), pages.doc_freq(), pages.exhausted
        (['a'], {'x': 10, 'car': 2, 'level': 1}, True)
    """

    depth: int
    query: list[str]
    freq: dict[str, int]
    count: int
    keys: dict[str, Key] = field(default_factory=dict)
    unasked: tuple[str, ...] = ()

    def ids(self) -> list[str]:
        """The ids matched, best first."""
        return list(self.query)

    def doc_freq(self) -> dict[str, int]:
        """Each term's document frequency.

        A term not counted (past :data:`MAX_WORDS`) counts as in every message.
        """
        freq = dict.fromkeys(self.unasked, self.count)
        freq.update(self.freq)
        return freq

    @property
    def exhausted(self) -> bool:
        """Whether the search returned all its matches."""
        return len(self.query) < self.depth


class TurnLike(Protocol):
    """What a ranker reads of a message.

    A :class:`~marsys_mem.model.messages.Message`, or a :class:`Turn` parsed from the
    store's row without validating it.
    """

    @property
    def message_id(self) -> str: ...  # noqa: D102

    @property
    def name(self) -> str | None: ...  # noqa: D102

    @property
    def text(self) -> str: ...  # noqa: D102

    @property
    def metadata(self) -> Mapping[str, Any]: ...  # noqa: D102

    @property
    def timestamp(self) -> datetime: ...  # noqa: D102


@dataclass(frozen=True, slots=True)
class Turn:
    """A stored message as a ranker reads it: its id, speaker, text, metadata and time.

    Parsed from the store's JSON (:meth:`of`) without building the message: a search
    reads hundreds of turns around its candidates and returns a few, which it loads.
    ``text`` is :attr:`Message.text <marsys_mem.model.messages.Message.text>`'s.

    Example:
        >>> row = TurnRow("m1", '{"content": [{"type": "text", "text": "hi"}], '
        ...     '"name": "ana", "metadata": {}, "timestamp": "2026-01-02T03:04:05Z"}', 0.5)
        >>> turn = Turn.of(row)
        >>> turn.text, turn.name, turn.timestamp.year
        ('hi', 'ana', 2026)
    """

    message_id: str
    name: str | None
    text: str
    metadata: Mapping[str, Any]
    timestamp: datetime

    @classmethod
    def of(cls, row: TurnRow) -> Turn:
        """The turn of a :class:`~marsys_mem.store.base.TurnRow` (a stored message)."""
        data = from_json(row.data)  # pydantic's parser: twice json.loads' speed here
        content = data.get("content")
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        elif isinstance(content, dict):
            text = json.dumps(content, ensure_ascii=False, sort_keys=True)
        else:
            text = "\n".join(p["text"] for p in content if p.get("type") == "text")
        name = data.get("name")
        return cls(
            row.message_id,
            name if isinstance(name, str) else None,
            text,
            data.get("metadata") or {},
            datetime.fromisoformat(data["timestamp"]),
        )


@dataclass(frozen=True, slots=True)
class TextTurns:
    """The turns around a query's keyword matches, with their cosines (``ScoreAround``).

    Attributes:
        rows: the matches' rows and those of the turns read around them.
        alone: the matches read without their turns (past ``near``).
        near_by: the ids of the rows read around a match (the matches among them).

    Example:
        >>> TextTurns([], frozenset(), frozenset()).rows
        []
    """

    rows: list[TurnRow]
    alone: frozenset[str]
    near_by: frozenset[str]


@dataclass(frozen=True, slots=True)
class Found:
    """What a store's search returned for one query, ready to rank.

    Attributes:
        dense: ``(message id, cosine)`` of the dense candidates, best first.
        text: ``(message id, BM25 score)`` of the keyword candidates, best first.
        cosines: the cosines the dense search returned (``COSINES`` times as many as
            ``dense``: most keyword candidates and context turns are among them).
        keyword: the BM25 score of every candidate (0.0: no query term).
        messages: every candidate's message by id, in the key's order (oldest first): a
            :class:`Turn` when ``light`` (the hits to return are made of ``stored``), else
            the message.
        floor: the cosine a candidate missing from ``cosines`` is given, the lowest of
            them (``None``: the search returned every vector the key has, so such a
            candidate has none).
        exhausted: neither side can return more candidates than it did.
        light: ``messages`` are turns, not messages.
        bare: the candidates read without the turns around them
            (``Ranking.context_candidates``): each belongs to its thread but has no
            neighbours in ``messages``.
        stored: when ``light``, each turn's message as stored (its JSON), as read with
            the turns: :meth:`StoreSearch.parse` makes the hits of it without loading them.

    Example:
        >>> found = Found([("a", 0.9)], [("b", 2.0)], {"a": 0.9}, {"b": 2.0}, {}, 0.9, True)
        >>> found.ids()
        ['a', 'b']
    """

    dense: list[tuple[str, float]]
    text: list[tuple[str, float]]
    cosines: dict[str, float]
    keyword: dict[str, float]
    messages: Mapping[str, TurnLike]
    floor: float | None
    exhausted: bool
    light: bool = False
    bare: frozenset[str] = frozenset()
    stored: Mapping[str, str] = field(default_factory=dict)

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
    """A store's keyword matches in ``keys`` and its query terms' document frequencies.

    Two batches: each word's match count (``CountMatches``, one query for all) with the
    keys' message counts, so the host scores the candidates with BM25 as the in-process
    path does (the database's own rank weighs a common word as much as a rare one); then
    the best ``depth`` matches by the database's rank of the query's informative words
    (:func:`informative`: over a big store, the words that match few messages).
    """
    words = query_words(query)
    unasked = tuple(list(words)[MAX_WORDS:])
    words = dict(list(words.items())[:MAX_WORDS])
    scope = tuple(keys)
    asked = tuple(dict.fromkeys(words.values()))
    ops: list[CountMatches | CountMessages] = [CountMatches(asked, scope)] if asked else []
    ops += [CountMessages(key) for key in scope]
    results = store.batch(ops)
    counted: dict[str, int] = results[0] if asked else {}
    count = sum(results[1:] if asked else results)
    freq = {term: counted[word] for term, word in words.items()}
    chosen = list(words.values()) if count < RANK_ALL_BELOW else informative(words, freq)
    text = query if count < RANK_ALL_BELOW else " ".join(chosen)
    df = {word: freq[term] for term, word in words.items()}
    weights = tuple((w, idf(df[w], max(count, 1))) for w in dict.fromkeys(chosen) if df[w] > 0)
    search = SearchText(text, depth, scope, weights=weights)
    page = store.batch([search])[0] if text.strip() else ()
    where = {h.message_id: h.key for h in page}
    return TextPages(depth, [h.message_id for h in page], freq, count, where, unasked)


def idf(df: int, count: int) -> float:
    """BM25's inverse document frequency of a term in ``df`` of ``count`` messages.

    Example:
        >>> round(idf(1, 1_000), 2), round(idf(900, 1_000), 2)
        (6.5, 0.11)
    """
    return math.log(1.0 + (count - df + 0.5) / (df + 0.5))


def informative(words: dict[str, str], freq: dict[str, int]) -> list[str]:
    """The words a keyword search over a big store asks the database to rank.

    The rarest first while their matches add up to at most :data:`TEXT_BUDGET`, so the
    database ranks a bounded number of rows whatever its size: a word in many messages has
    a small idf, and the candidates it alone would add rank low in BM25 (their BM25 scores
    still count every word). Under :data:`RANK_ALL_BELOW` messages the whole query is
    asked for. ``words``: term to word (:func:`query_words`); ``freq``: term to match count.

    Example:
        >>> words = {"maya": "Maya", "park": "parked", "car": "car"}
        >>> informative(words, {"maya": 900, "park": 4_000, "car": 30})
        ['car', 'Maya', 'parked']
        >>> informative(words, {"maya": 30_000, "park": 90_000, "car": 30})
        ['car']
    """
    matched = sorted((freq.get(term, 0), i, word) for i, (term, word) in enumerate(words.items()))
    chosen: list[str] = []
    total = 0
    for df, _, word in matched:
        if df == 0:
            continue
        if total + df > TEXT_BUDGET:
            break
        chosen.append(word)
        total += df
    return chosen


def may_match(terms: Sequence[str], text: str) -> bool:
    """Whether ``text`` may hold one of ``terms`` (as BM25 tokenizes it): a cheap filter.

    A term is a word with a suffix stripped (``-s``, ``-ing``, ``-ed``, ``-e``; ``-ies``
    became ``-y``), so a text holding it holds the term, or all of it but a final ``y``,
    once lower-cased and without apostrophes. False only if no term can be there.

    Example:
        >>> may_match(["park", "city"], "Parking in the cities"), may_match(["car"], "a bus")
        (True, False)
    """
    return term_pattern(terms).search(text.lower().replace("'", "")) is not None


def term_pattern(terms: Sequence[str]) -> re.Pattern[str]:
    """What :func:`may_match` looks for in a lower-cased text: any of ``terms``' stems.

    Example:
        >>> term_pattern(["city", "car"]).pattern
        'cit|car'
    """
    stems = [t[:-1] if len(t) > 1 and t.endswith("y") else t for t in terms]
    return re.compile("|".join(re.escape(t) for t in stems) if stems else r"(?!)")


LENGTH_SAMPLE = 32
"""How many candidate texts give the mean length (in terms) BM25 normalises by."""

MAX_WORDS = MAX_COUNT_WORDS
"""The most query terms counted (for their document frequencies) per search."""

TEXT_WIDTH = 1
"""How many more keyword matches than candidates a search reads (BM25 re-ranks them)."""

TEXT_BUDGET = 20_000
"""Over a big store, the most matches the database ranks for one keyword search.

On ``benchmarks/bench_scale.py``'s 1M-message store, 5,000 found 0.164 of the questions'
evidence turns in the hybrid top 10, 20,000 found 0.270 and 50,000 0.276 (per-host path:
0.297), at hybrid p50 77, 68 and 107 ms in one session."""

RANK_ALL_BELOW = 20_000
"""Under this many messages, a keyword search asks for every word of the query."""

_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)?")


def keyword_text(m: TurnLike, text: str, index_names: bool) -> str:
    """What BM25 indexes of a message: its text, after the speaker's name (``index_names``).

    The speaker is ``m.name``, else ``metadata["agent"]``.

    Example:
        >>> from marsys_mem.model.messages import Message
        >>> keyword_text(Message.user("hi", name="maya"), "hi", True)
        'maya: hi'
    """
    name = m.name or m.metadata.get("agent")
    if index_names and isinstance(name, str) and name:
        return f"{name}: {text}"
    return text


class KeywordCounts:
    """A query's terms counted in turns as they come; their BM25 scores once all are in.

    What BM25 needs of a turn (its length in terms, how often it holds each query term)
    does not depend on the corpus, so each side's turns are counted as soon as they are
    read, while the other side's are still on their way; :meth:`scores` then weighs the
    counts with the store's statistics. Only turns that may hold a query term
    (:func:`term_pattern`) are counted; the mean length is that of the first
    :data:`LENGTH_SAMPLE` turns in the key's order.

    Args:
        query: the query, as the keyword side searched for it.
        index_names: the speaker's name is part of a turn's keyword text
            (:func:`keyword_text`).

    Example:
        >>> from marsys_mem.model.messages import Message
        >>> counts = KeywordCounts("red car", index_names=False)
        >>> counts.add({"a": Message.user("a red car"), "b": Message.user("blue sky")})
        >>> pages = TextPages(10, ["a"], {"red": 5, "car": 50}, count=1_000)
        >>> scores = counts.scores(["a", "b"], pages)
        >>> scores["a"] > 0, scores["b"]
        (True, 0.0)
    """

    def __init__(self, query: str, *, index_names: bool) -> None:
        self.terms = list(dict.fromkeys(tokenize(query)))  # BM25 adds them in this order
        self._pattern = term_pattern(list(query_words(query)))
        self._index_names = index_names
        self._texts: dict[str, str] = {}
        self._held: dict[str, int] = {}  # id: its row in the counts below
        self._lengths: list[npt.NDArray[np.int64]] = []
        self._counts: list[npt.NDArray[np.float64]] = []

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._texts

    def add(self, turns: Mapping[str, TurnLike]) -> None:
        """Count the query's terms in ``turns`` (those already counted are skipped)."""
        texts = {
            mid: keyword_text(m, m.text, self._index_names)
            for mid, m in turns.items()
            if mid not in self._texts
        }
        self._texts.update(texts)
        search = self._pattern.search
        hold = [mid for mid, t in texts.items() if search(t.lower().replace("'", ""))]
        if not hold:
            return
        lengths, counts = term_counts([texts[mid] for mid in hold], self.terms)
        start = sum(len(x) for x in self._lengths)
        self._held.update((mid, start + i) for i, mid in enumerate(hold))
        self._lengths.append(lengths)
        self._counts.append(counts)

    def scores(
        self, ordered: Iterable[str], pages: TextPages, *, k1: float = 1.5, b: float = 0.75
    ) -> dict[str, float]:
        """BM25 of each counted turn of ``ordered`` (the key's order), by the store's statistics."""
        order = [mid for mid in ordered if mid in self._texts]
        keyword = dict.fromkeys(order, 0.0)
        held = [mid for mid in order if mid in self._held]
        if not held:
            return keyword
        sample = order[:LENGTH_SAMPLE]
        lengths = np.concatenate(self._lengths)
        counts = np.concatenate(self._counts)
        total = sum(
            int(lengths[self._held[mid]]) if mid in self._held else len(tokenize(self._texts[mid]))
            for mid in sample
        )
        rows = np.fromiter((self._held[mid] for mid in held), np.int64, len(held))
        idfs = idfs_of(self.terms, max(pages.count, len(order)), pages.doc_freq())
        found = bm25_of_counts(
            lengths[rows], counts[rows], idfs, total / max(len(sample), 1), k1=k1, b=b
        )
        keyword.update(zip(held, found.tolist(), strict=True))
        return keyword


class StoreSearch:
    """Search inside a store that searches: the part of a RAGMemory that holds nothing.

    :class:`~marsys_mem.patterns.rag.RAGMemory` holds one when its store searches by
    itself (:attr:`~marsys_mem.store.base.MemoryStore.supports_search`) and asks it for
    candidates, their turns and their messages; it ranks them itself.

    Args:
        store: a store that searches.
        key: the store key of the memory's messages.
        model: the embedder's name, which files its vectors in the store.
        ranking: the memory's ranking: its fields fixed for the memory's life (``k1``,
            ``b`` score the keyword side, ``index_names``, ``thread_key``) are read.

    Example:
        >>> from marsys_mem.model.ranking import Ranking
        >>> from marsys_mem.store import InMemoryStore
        >>> found = StoreSearch(InMemoryStore(), ("n", "a", "main"), "m", Ranking())
        >>> found.count()
        0
    """

    def __init__(self, store: MemoryStore, key: Key, model: str, ranking: Ranking) -> None:
        self.store = store
        self.key = key
        self.model = model
        self._k1, self._b = ranking.k1, ranking.b
        self._index_names = ranking.index_names
        self._thread_key = ranking.thread_key

    # ------------------------------------------------------------------ reading
    def text_pages(self, query: str, depth: int) -> TextPages:
        """The store's keyword matches under the key (see :func:`text_pages`)."""
        return text_pages(self.store, query, TEXT_WIDTH * depth, (self.key,))

    def search(
        self,
        query: str,
        qvec: npt.NDArray[np.float32] | None,
        text_pages: Callable[[], TextPages | None] | None,
        depth: int,
        *,
        around: tuple[int, int] | None = None,
        near: int | None = None,
        text_turns: Callable[[], TextTurns] | None = None,
    ) -> Found:
        """The store's ``depth`` best candidates on each side, their messages and scores.

        ``qvec``: the query's vector (``None``: no dense side); ``text_pages()``: the
        keyword matches (``text_pages`` ``None``: no keyword side), asked for after the
        dense search (it may be under way in another thread meanwhile); ``around``: how
        many turns before and after each candidate in its thread to read too, each with
        its cosine and keyword score (``ScoreAround``); ``near``: only around each side's
        best ``near`` candidates (the others are read alone: :attr:`Found.bare`; ``None``:
        around all); ``text_turns()``: the keyword matches' turns (:meth:`text_turns`, for
        ``text_pages()``'s matches, which may have been read on another thread beside the
        dense side's; ``None``: read here, those of the matches the dense side's did not
        read). A dense search alone (no keyword side, no turns around) reads its hits'
        messages with them (``with_data``).
        """
        dense: list[tuple[str, float]] = []
        dense_done = True
        alone = around is None and text_pages is None
        stored: list[str] = []
        if qvec is not None:
            # alone, the dense hits are the result: their messages come with them
            search = SearchVectors(self.model, qvec[0], depth, (self.key,), with_data=alone)
            hits: tuple[SearchHit, ...] = self.store.batch([search])[0]
            dense = [(h.message_id, h.score) for h in hits]
            dense_done = len(dense) < depth
            stored = [h.data for h in hits if h.data is not None]
        cosines = dict(dense)
        light = qvec is not None and around is not None
        rows: list[TurnRow] = []
        read: set[str] = set()  # the ids whose turns are read
        unlinked: set[str] = set()  # the ids read without their turns
        near_by: set[str] = set()  # the ids of the turns read around candidates
        # the keyword side's counts of the turns, made as each side's turns come in
        counting = self.keyword_counts(query) if light and text_pages is not None else None
        turns: dict[str, Turn] = {}
        if light and dense:  # the dense hits' turns, while the keyword side may still run
            ids = [mid for mid, _ in dense]
            best = ids[:near] if near is not None else None
            rows = self._read_turns(ids, best, qvec, around, unlinked, near_by)
            read = set(ids)
            turns = {r.message_id: Turn.of(r) for r in rows}
            if counting is not None:
                counting.add(turns)
        pages = text_pages() if text_pages is not None else None
        matched = pages.ids() if pages is not None else []
        ids = list(dict.fromkeys([mid for mid, _ in dense] + matched))
        messages: Mapping[str, TurnLike] = {}
        if ids and len(stored) == len(ids):  # every hit came with its message
            parsed = MESSAGE_LIST_ADAPTER.validate_json("[" + ",".join(stored) + "]")
            messages = {m.message_id: m for m in parsed}
        elif light and ids:  # the turns and their cosines, parsed lightly
            # a turn's window does not depend on the other ids: the keyword hits' turns
            # are read apart and the two sets merged in the key's order
            rest = [mid for mid in ids if mid not in read]
            more: list[TurnRow] = []
            if text_turns is not None:  # all the matches' turns, read beside the dense's
                ahead = text_turns()
                more = ahead.rows
                unlinked |= ahead.alone
                near_by |= ahead.near_by
            elif rest:
                best = matched[:near] if near is not None else None
                more = self._read_turns(rest, best, qvec, around, unlinked, near_by)
            if more:
                rows = sorted(
                    {r.position: r for r in rows + more}.values(), key=lambda r: r.position
                )
            unlinked -= near_by  # read around another candidate: it has its neighbours
            messages = {r.message_id: turns.get(r.message_id) or Turn.of(r) for r in rows}
            cosines.update((r.message_id, r.cosine) for r in rows if r.cosine is not None)
        elif ids:
            messages = {m.message_id: m for m in self.load(ids, around)}
            missing = [mid for mid in messages if mid not in cosines]
            if qvec is not None and missing:
                cosines.update(self.cosines(qvec[0], missing))
        as_stored = {r.message_id: r.data for r in rows} if light else {}
        keyword: dict[str, float] = {}
        text: list[tuple[str, float]] = []
        if pages is not None and messages:
            if counting is None:
                keyword = self.keyword_scores(query, messages, pages)
            else:
                counting.add(messages)  # the turns the dense side's did not hold
                keyword = counting.scores(messages, pages, k1=self._k1, b=self._b)
            text = sorted(
                ((mid, keyword[mid]) for mid in matched if keyword.get(mid, 0.0) > 0),
                key=lambda hit: -hit[1],
            )[:depth]
        exhausted = dense_done and (pages is None or pages.exhausted)
        bare = frozenset(unlinked)
        return Found(
            dense, text, cosines, keyword, messages, None, exhausted, light, bare, as_stored
        )

    def text_turns(
        self,
        pages: TextPages,
        qvec: npt.NDArray[np.float32],
        around: tuple[int, int],
        near: int | None = None,
    ) -> TextTurns:
        """The turns around ``pages``' matches (around its best ``near``), with cosines.

        As :meth:`search` reads them, for a helper thread to read beside the dense side's.
        A match that is also a dense candidate has its turns read twice (once here): the
        price of not waiting for the dense search.
        """
        alone: set[str] = set()
        near_by: set[str] = set()
        matched = pages.ids()
        best = matched[:near] if near is not None else None
        rows = self._read_turns(matched, best, qvec, around, alone, near_by) if matched else []
        return TextTurns(rows, frozenset(alone), frozenset(near_by))

    def _read_turns(
        self,
        ids: Sequence[str],
        best: Sequence[str] | None,
        qvec: npt.NDArray[np.float32] | None,
        around: tuple[int, int] | None,
        alone: set[str],
        near_by: set[str],
    ) -> list[TurnRow]:
        """``ids``' rows, with the turns around those of ``best`` (``None``: of all).

        The ids read alone are added to ``alone``, those of the turns read around the
        others to ``near_by``. One query (``ScoreAround(alone=...)``).
        """
        if best is None:
            return self.score_around(ids, qvec, around)
        assert qvec is not None
        assert around is not None
        wanted = set(best)
        near = tuple(mid for mid in ids if mid in wanted)
        far = tuple(mid for mid in ids if mid not in wanted)
        alone.update(far)
        op = ScoreAround(self.key, near, self.model, qvec[0], *around, alone=far)
        rows: tuple[TurnRow, ...] = self.store.batch([op])[0]
        far_ids = set(far)
        near_by.update(row.message_id for row in rows if row.message_id not in far_ids)
        return list(rows)

    def score_around(
        self,
        ids: Sequence[str],
        qvec: npt.NDArray[np.float32] | None,
        around: tuple[int, int] | None,
    ) -> list[TurnRow]:
        """``ids`` and the turns ``around`` them, with their cosines (``ScoreAround``)."""
        assert qvec is not None
        assert around is not None
        if not ids:
            return []
        op = ScoreAround(self.key, tuple(ids), self.model, qvec[0], *around)
        rows: tuple[TurnRow, ...] = self.store.batch([op])[0]
        return list(rows)

    def keyword_scores(
        self, query: str, messages: Mapping[str, TurnLike], pages: TextPages
    ) -> dict[str, float]:
        """BM25 of ``messages`` (the key's order) with the store's statistics.

        Only texts that may hold a query term are tokenized (:func:`may_match`); the mean
        length is that of the first :data:`LENGTH_SAMPLE` texts (:class:`KeywordCounts`).
        """
        counts = self.keyword_counts(query)
        counts.add(messages)
        return counts.scores(messages, pages, k1=self._k1, b=self._b)

    def keyword_counts(self, query: str) -> KeywordCounts:
        """A :class:`KeywordCounts` of ``query`` for this memory's keyword texts."""
        return KeywordCounts(query, index_names=self._index_names)

    def cosines(self, vector: npt.NDArray[np.float32], ids: Sequence[str]) -> dict[str, float]:
        """The exact cosines of ``ids``' vectors under the key (one batch)."""
        name = self.model
        ops = [
            ScoreVectors(name, vector, self.key, tuple(ids[i : i + MAX_SCORE_IDS]))
            for i in range(0, len(ids), MAX_SCORE_IDS)
        ]
        return {h.message_id: h.score for hits in self.store.batch(ops) for h in hits}

    def load(self, ids: Sequence[str], around: tuple[int, int] | None = None) -> list[Message]:
        """The messages of ``ids`` still stored under the key, in the key's order.

        ``around``: with the ``(before, after)`` turns around each in its thread.
        """
        op: Load | LoadAround = Load(self.key, ids=tuple(ids))
        if around is not None and any(around):
            op = LoadAround(self.key, tuple(ids), *around, thread=self._thread_key)
        found: list[Message] = self.store.batch([op])[0]
        return found

    @staticmethod
    def parse(ids: Sequence[str], stored: Mapping[str, str]) -> list[Message]:
        """The messages of ``ids`` from their stored JSON (:attr:`Found.stored`), validated.

        What :meth:`load` would return for them, as the search's own statement read them:
        no second round trip. Ids without a stored message are left out.
        """
        texts = [stored[mid] for mid in ids if mid in stored]
        if not texts:
            return []
        return MESSAGE_LIST_ADAPTER.validate_json("[" + ",".join(texts) + "]")

    # ------------------------------------------------------------------ the container
    def count(self) -> int:
        """How many messages the key holds."""
        return self.store.count_messages(self.key)

    def get(self, message_id: str) -> Message:
        """The stored message ``message_id``.

        Raises:
            MessageNotFoundError: no such message under the key.
        """
        if isinstance(message_id, str) and message_id:
            for m in self.load([message_id]):
                return m
        raise MessageNotFoundError(f"no message {message_id!r} in this RAGMemory")

    def messages(self) -> list[Message]:
        """Every message of the key, in order."""
        return self.store.load_messages(self.key)

    def remove(self, ids: Iterable[str]) -> int:
        """Delete the stored messages of ``ids`` (unknown ids are ignored); the count."""
        wanted = tuple(dict.fromkeys(ids))
        if not wanted:
            return 0
        return self.store.delete_messages(self.key, wanted)
