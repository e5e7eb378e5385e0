"""Vector indexes: the :class:`VectorIndex` protocol and :class:`FaissIndex`.

Ids are strings (a message id, a chunk id); scores are inner products, which equal cosine
similarities for the unit vectors an :class:`~marsys_mem.retrieval.embeddings.Embedder` returns.

:class:`FaissIndex` searches exactly (``IndexFlatIP``) while small and switches to HNSW
(``IndexHNSWFlat``, approximate, sub-linear) past ``hnsw_threshold`` vectors when
``kind="auto"``. It is saved atomically into one self-checking file (no pickle) and refuses
to load a file that is truncated, corrupt or was built for another embedder, raising
:class:`~marsys_mem.exceptions.IndexCorruptError`: rebuild it from the store then.

The file format lives in :mod:`marsys_mem.retrieval.index_file`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, Protocol, Self, runtime_checkable

import faiss
import numpy as np
import numpy.typing as npt

from marsys_mem.exceptions import EmbeddingError, IndexCorruptError, StoreError
from marsys_mem.retrieval.codes import LISTS_FROM, CodeMaker
from marsys_mem.retrieval.embeddings import FloatArray, check_vectors
from marsys_mem.retrieval.index_file import (
    FORMAT_VERSION,
    read_index_file,
    read_index_header,
    write_index_file,
)

__all__ = [
    "FORMAT_VERSION",
    "FaissIndex",
    "IndexKind",
    "QueryScores",
    "VectorIndex",
    "single_thread",
]

IndexKind = Literal["flat", "ivf", "hnsw", "auto"]

_faiss_untyped: Any = faiss  # for the parts faiss's own type stubs leave out

_TOMBSTONE_RATIO = 0.2

COARSE_FROM = 4096
"""Vectors from which a flat index scores one query's candidates from compact codes first
(see :meth:`FaissIndex.best_labels` and :mod:`marsys_mem.retrieval.codes`)."""

_COARSE_DEPTH = 4
"""The codes pick ``_COARSE_DEPTH * k`` candidates (at least :data:`_COARSE_FLOOR`) for
the exact ``k`` best (on MiniLM vectors of 10k chat messages, 4x held the exact best 100
for 98.5% of 396 queries, 3x for 97%, 2x for 54%)."""

_COARSE_FLOOR = 256
"""Candidates the codes pick at least (for a small ``k``: with 4, the best 4 codes held
the best vector for only 73% of queries over random 32-dimensional vectors; with 256,
for all)."""


def _heap_top(
    scores: npt.NDArray[np.float32], rows: npt.NDArray[np.int64] | None, k: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """The ``k`` best ``(rows, scores)``, best first, through faiss's heap in the order given.

    ``rows`` name the scores (ascending storage rows); ``None``: the scores of rows
    ``0 .. len - 1``. Equal scores come out as faiss's heap has them, which depends only on
    the rows scoring at least the ``k``-th score, in order (lower scores are evicted first).
    """
    n = len(scores)
    k_eff = min(k, n)
    best = np.empty(k_eff, dtype=np.float32)
    found = np.empty(k_eff, dtype=np.int64)
    if k_eff:
        heap = _faiss_untyped.float_minheap_array_t()
        heap.nh, heap.k = 1, k_eff
        heap.val, heap.ids = faiss.swig_ptr(best), faiss.swig_ptr(found)
        heap.heapify()
        if rows is None:
            heap.addn(n, faiss.swig_ptr(scores), 0, 0, 1)
        else:
            heap.addn_with_ids(n, faiss.swig_ptr(scores), faiss.swig_ptr(rows), 0, 0, 1)
        heap.reorder()
    return found, best


def _best_of(scores: npt.NDArray[np.float32], k: int) -> npt.NDArray[np.int64]:
    """The rows of :func:`_heap_top` (``rows=None``), in no particular order.

    By a partition; when a tie at the ``k``-th score crosses the cut, the heap picks which
    of its members stay (as it does for :func:`_heap_top`).
    """
    n = len(scores)
    if k >= n:
        return np.arange(n, dtype=np.int64)
    picked = np.argpartition(scores, n - k)[n - k :]
    if np.count_nonzero(scores >= np.minimum.reduce(scores[picked])) == k:  # no tie at the cut
        return picked
    return _heap_top(scores, None, k)[0]


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """Run faiss with one OpenMP thread inside the block (restored afterwards).

    For one query, thread start-up costs more than it saves (about 3x slower on two
    shared cores). :meth:`FaissIndex.search` does this itself for single queries.

    Example:
        >>> with single_thread():
        ...     pass
    """
    previous = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(previous)


@runtime_checkable
class VectorIndex(Protocol):
    """A mutable set of ``(id, vector)`` pairs searched by inner product (a protocol).

    Contract: adding an existing id replaces its vector; :meth:`search` returns, per query
    row, at most ``k`` live ids best first with their scores, never a removed id; bad input
    raises :class:`~marsys_mem.exceptions.EmbeddingError` and changes nothing.

    Example:
        >>> isinstance(FaissIndex(4), VectorIndex)
        True
    """

    @property
    def dim(self) -> int:
        """Dimension of the vectors."""
        ...

    def __len__(self) -> int:
        """Number of live ids."""
        ...

    def __contains__(self, id: object) -> bool:
        """Whether ``id`` is in the index."""
        ...

    def ids(self) -> list[str]:
        """The live ids."""
        ...

    def add(self, ids: Sequence[str], vectors: FloatArray) -> None:
        """Add or replace vectors (row ``i`` belongs to ``ids[i]``)."""
        ...

    def remove(self, ids: Iterable[str]) -> int:
        """Remove ids (unknown ones are ignored); returns how many were removed."""
        ...

    def search(self, vectors: FloatArray, k: int) -> tuple[list[list[str]], FloatArray]:
        """The ``k`` best ids per query row and their inner-product scores."""
        ...

    def save(self, path: str | os.PathLike[str], *, meta: Mapping[str, Any] | None = None) -> None:
        """Write the index to ``path`` atomically."""
        ...


def _check_ids(ids: Sequence[str], what: str = "ids") -> list[str]:
    if isinstance(ids, str | bytes):
        raise EmbeddingError(f"{what} must be a sequence of str, not one string: use [id]")
    try:
        items = list(ids)
    except TypeError as exc:
        raise EmbeddingError(f"{what} must be a sequence of str, got {ids!r}") from exc
    for i, item in enumerate(items):
        if not isinstance(item, str) or not item:
            raise EmbeddingError(f"{what}[{i}] must be a non-empty str, got {item!r}")
    return items


def _check_k(k: object) -> int:
    if not isinstance(k, int | np.integer) or isinstance(k, bool) or k <= 0:
        raise EmbeddingError(f"k must be a positive int, got {k!r}")
    return int(k)


def _check_int(name: str, value: object, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


class QueryScores:
    """One query's inner products with a :class:`FaissIndex`, from :meth:`~FaissIndex.query_scores`.

    A flat index takes the query's inner product with every stored vector in one pass
    (faiss's kernel, one thread, the vectors read in place) when it is made; :meth:`top`
    and :meth:`label_scores` then read that array, so the best vectors and the scores of
    any others (their neighbours in a thread) cost one read of the vectors, not two. It
    answers for the vectors stored when it was made (later changes are not seen). From
    :data:`COARSE_FROM` vectors, a flat index instead scans compact codes of its vectors
    for :meth:`top` (see :meth:`FaissIndex.best_labels`); an HNSW index searches its graph;
    both then read the asked-for vectors for :meth:`label_scores`, at call time.
    """

    def __init__(
        self,
        index: FaissIndex,
        query: npt.NDArray[np.float32],
        scores: npt.NDArray[np.float32] | None,
        rows: npt.NDArray[np.int64] | None,
        row_labels: npt.NDArray[np.int64] | None,
    ) -> None:
        self._index = index
        # its own index's, for a query it has checked
        self._best_labels = index._best_labels  # noqa: SLF001
        self._candidates = index._candidate_labels  # noqa: SLF001
        self._query = query
        self._scores = scores  # row -> inner product (small flat), None: at call time
        self._rows = rows  # label -> row, -1: none (one spare -1 cell at the end)
        self._row_labels = row_labels  # row -> label

    def top(self, k: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        """The labels of the ``k`` best live vectors and their scores, best first.

        For a flat index, faiss's own heap takes the rows in storage order (which is label
        order), as a faiss search does for ``k`` below 100 (equal scores come out as they
        do there; from 100, faiss keeps other members of a tie at the ``k``-th place);
        scores may differ from a search's by float rounding.

        Args:
            k: results wanted (>= 1); at most the number of vectors come back.

        Raises:
            EmbeddingError: ``k`` is not a positive int.
        """
        k_int = _check_k(k)
        if self._scores is None:
            return self._best_labels(self._query, k_int)  # the query is checked
        assert self._row_labels is not None
        rows, scores = _heap_top(self._scores, None, k_int)
        return self._row_labels[rows], scores

    def candidates(self, k: int) -> npt.NDArray[np.int64]:
        """About the ``k`` best live labels, in no particular order: for a caller that scores them.

        A small flat index gives exactly :meth:`top`'s labels (by a partition of the scores
        it holds; which members of a tie at the ``k``-th score come back is faiss's heap's
        choice only when the tie crosses the cut). From :data:`COARSE_FROM` vectors, the
        ``k`` best by the compact codes' estimates (an approximate search, as HNSW's: on
        MiniLM vectors of 10k chat messages they hold 85% of the exact best 100, the
        others near the 100th score), with no exact pass: the caller reads the exact
        scores of the candidates (:meth:`row_scores`) anyway. Until the codes are made, and
        for HNSW, the exact or graph search of :meth:`top`.

        Args:
            k: results wanted (>= 1); at most the number of vectors come back.

        Raises:
            EmbeddingError: ``k`` is not a positive int.
        """
        k_int = _check_k(k)
        if self._scores is None:
            return self._candidates(self._query, k_int)
        assert self._row_labels is not None
        found: npt.NDArray[np.int64] = self._row_labels[_best_of(self._scores, k_int)]
        return found

    def row_scores(
        self, rows: npt.NDArray[np.int64], fill: float = math.nan
    ) -> npt.NDArray[np.float64]:
        """The inner product with the vector in each storage row (``fill``: ``-1``).

        Args:
            rows: from :meth:`FaissIndex.rows`, at the layout this was made at.
            fill: the score of a ``-1`` row.
        """
        if self._scores is None:
            return self._index.row_inner_products(rows, self._query, fill)
        out = np.full(len(rows), fill)
        known = rows >= 0
        out[known] = self._scores[rows[known]]
        return out

    def label_scores(self, labels: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        """The inner product with the vector of each label (NaN: none, or not live).

        Args:
            labels: from :meth:`FaissIndex.labels` or :meth:`top`.
        """
        if self._scores is None:
            return self._index.label_inner_products(labels, self._query)
        assert self._rows is not None
        rows = self._rows[np.where((labels >= 0) & (labels < len(self._rows)), labels, -1)]
        out = np.full(len(labels), np.nan)
        known = rows >= 0
        out[known] = self._scores[rows[known]]
        return out


class FaissIndex:
    """A faiss inner-product index with string ids, replace/remove, and safe files.

    ``kind="flat"`` searches exactly (brute force, ~0.4 ms per query over 10k x 384 on
    one core; :meth:`query_scores` scans compact codes first from :data:`COARSE_FROM`
    vectors, see :meth:`best_labels`). ``kind="ivf"`` is the same below ``lists_from``
    vectors; from there its codes are split into lists and a query scans those nearest to
    it (an eighth of them, see :mod:`~marsys_mem.retrieval.codes`): at 1M MiniLM vectors
    of chat turns, 1.2 ms instead of 6.0 per query, 0.977 of the exact best 10 found
    instead of 0.996.
    ``kind="hnsw"`` uses an HNSW graph (approximate,
    ~1 ms over 100k x 384, but building it costs about 0.4 ms per vector).
    ``kind="auto"`` (the default) starts flat and rebuilds as HNSW the first time more
    than ``hnsw_threshold`` ids are live; it stays HNSW afterwards. HNSW cannot delete:
    removed or replaced vectors become tombstones, filtered out of every search, and the
    graph is rebuilt from the live vectors when tombstones pass 20% of it.

    Vectors are stored as given (``float32``); the score is the inner product, i.e. the
    cosine similarity for unit vectors. Every method is thread-safe (one lock), so an
    :class:`~marsys_mem.retrieval.ingest.EmbeddingQueue` callback may add while others search.
    Bad input raises :class:`~marsys_mem.exceptions.EmbeddingError` (a ``ValueError``)
    naming the numbers, and leaves the index unchanged.

    Args:
        dim: vector dimension.
        kind: ``"flat"``, ``"ivf"``, ``"hnsw"`` or ``"auto"``.
        hnsw_threshold: live ids past which ``"auto"`` switches to HNSW.
        lists_from: vectors from which an ``"ivf"`` index splits its codes into lists.
        hnsw_m: HNSW graph degree (more: better recall, more memory).
        ef_search: HNSW search breadth (more: better recall, slower); at least ``k`` is used.

    Raises:
        ValueError: a bad ``dim``, ``kind`` or HNSW setting.

    Example:
        >>> import numpy as np
        >>> index = FaissIndex(3)
        >>> index.add(["a", "b", "c"], np.eye(3, dtype=np.float32))
        >>> ids, scores = index.search(np.array([[0.8, 0.6, 0.0]], dtype=np.float32), k=2)
        >>> ids, scores.astype(float).round(2).tolist()
        ([['a', 'b']], [[0.8, 0.6]])
        >>> index.remove(["a"]), len(index), "a" in index
        (1, 2, False)
        >>> index.search(np.array([[1.0, 0.5, 0.2]], dtype=np.float32), k=5)[0]
        [['b', 'c']]
    """

    def __init__(
        self,
        dim: int,
        kind: IndexKind = "auto",
        *,
        hnsw_threshold: int = 50_000,
        hnsw_m: int = 32,
        ef_search: int = 64,
        lists_from: int = LISTS_FROM,
    ) -> None:
        self._dim = _check_int("dim", dim, 1)
        if kind not in ("flat", "ivf", "hnsw", "auto"):
            raise ValueError(f"kind must be 'flat', 'ivf', 'hnsw' or 'auto', got {kind!r}")
        self._requested: IndexKind = kind
        self._lists_from = _check_int("lists_from", lists_from, COARSE_FROM)
        self._hnsw_threshold = _check_int("hnsw_threshold", hnsw_threshold, 0)
        self._hnsw_m = _check_int("hnsw_m", hnsw_m, 2)
        self._ef_search = _check_int("ef_search", ef_search, 1)
        self._lock = threading.RLock()
        self._label_of: dict[str, int] = {}
        self._id_of: dict[int, str] = {}
        self._dead: set[int] = set()  # HNSW tombstones (labels still in the graph)
        self._dead_selector: Any = None
        self._next_label = 0
        self._kind: Literal["flat", "hnsw"] = "hnsw" if kind == "hnsw" else "flat"
        self._index: Any = None
        self._inner: Any = None
        self._index, self._inner = self._new_faiss(self._kind)
        # label -> row of the vector in the faiss storage (-1: none); rebuilt lazily after
        # any change to the faiss index (None: stale)
        self._rows: npt.NDArray[np.int64] | None = None
        # row -> label, set with ``_rows`` (and stale with it)
        self._row_labels: npt.NDArray[np.int64] | None = None
        # codes of a large flat storage, made in the background for the first query that
        # wants them
        self._codes = self._code_maker()
        self._layout = 0  # bumped whenever a stored vector moves or goes (see layout)

    # ----------------------------------------------------------------- properties

    @property
    def dim(self) -> int:
        """Dimension of the vectors."""
        return self._dim

    @property
    def layout(self) -> int:
        """A number that changes whenever a stored vector moves or goes (not on appends).

        Rows from :meth:`rows` hold while it is unchanged; a vector added later gets a
        new row.
        """
        return self._layout

    @property
    def kind(self) -> Literal["flat", "hnsw"]:
        """The structure in use now (``"auto"`` resolves to one of them)."""
        return self._kind

    @property
    def requested_kind(self) -> IndexKind:
        """The ``kind`` given to the constructor."""
        return self._requested

    @property
    def tombstones(self) -> int:
        """Removed or replaced vectors still inside an HNSW graph (0 for flat)."""
        return len(self._dead)

    def __len__(self) -> int:
        return len(self._label_of)

    def __contains__(self, id: object) -> bool:
        return id in self._label_of

    def ids(self) -> list[str]:
        """The live ids, in the order they were first added."""
        with self._lock:
            return list(self._label_of)

    def __repr__(self) -> str:
        return (
            f"FaissIndex(dim={self._dim}, kind={self._requested!r}) "
            f"<{self._kind}, {len(self)} ids, {len(self._dead)} tombstones>"
        )

    # ------------------------------------------------------------------ internals

    def _code_maker(self) -> CodeMaker:
        return CodeMaker(self._lists_from if self._requested == "ivf" else None)

    def _new_faiss(self, kind: Literal["flat", "hnsw"]) -> tuple[Any, Any]:
        inner: Any
        if kind == "flat":
            inner = faiss.IndexFlatIP(self._dim)
        else:
            inner = faiss.IndexHNSWFlat(self._dim, self._hnsw_m, faiss.METRIC_INNER_PRODUCT)
            inner.hnsw.efSearch = self._ef_search
        return faiss.IndexIDMap2(inner), inner

    def _rebuild(self, kind: Literal["flat", "hnsw"]) -> None:
        """Rebuild the faiss index as ``kind`` from the live vectors (drops tombstones)."""
        labels = faiss.vector_to_array(self._index.id_map).astype(np.int64, copy=False)
        ntotal = int(self._inner.ntotal)
        index, inner = self._new_faiss(kind)
        if ntotal:
            keep = np.fromiter(
                (int(label) in self._id_of for label in labels), dtype=bool, count=labels.size
            )
            if keep.any():
                vectors = self._inner.reconstruct_n(0, ntotal)
                index.add_with_ids(
                    np.ascontiguousarray(vectors[keep], dtype=np.float32),
                    np.ascontiguousarray(labels[keep]),
                )
        self._index, self._inner, self._kind = index, inner, kind
        self._rows = None
        self._codes = self._code_maker()
        self._layout += 1
        self._dead.clear()
        self._dead_selector = None

    def _maintain(self) -> None:
        if (
            self._requested == "auto"
            and self._kind == "flat"
            and len(self._label_of) > self._hnsw_threshold
        ):
            self._rebuild("hnsw")
        elif self._kind == "hnsw" and len(self._dead) > _TOMBSTONE_RATIO * max(
            int(self._inner.ntotal), 1
        ):
            self._rebuild("hnsw")

    def _drop_labels(self, labels: list[int]) -> None:
        if not labels:
            return
        self._rows = None  # flat: the storage closes the gaps (rows move); HNSW: tombstones
        self._layout += 1
        if self._kind == "flat":
            dropped = np.asarray(labels, dtype=np.int64)
            coded: npt.NDArray[np.int64] | None = None
            if self._codes.coded_rows:  # the rows that go, in order
                row_labels = faiss.vector_to_array(self._index.id_map)
                coded = np.flatnonzero(np.isin(row_labels, dropped)).astype(np.int64)
            removed = self._index.remove_ids(faiss.IDSelectorBatch(dropped))
            if removed != len(labels):  # pragma: no cover - would be a bookkeeping bug
                raise StoreError(f"faiss removed {removed} of {len(labels)} vectors")
            if coded is not None:
                self._codes.remove_rows(coded)
        else:
            self._dead.update(labels)
            self._dead_selector = None

    # ------------------------------------------------------------------ mutations

    def add(self, ids: Sequence[str], vectors: FloatArray) -> None:
        """Add vectors; an id already present gets its vector replaced.

        Args:
            ids: one non-empty string per row, no repeats within the call.
            vectors: shape ``(len(ids), dim)``, finite.

        Raises:
            EmbeddingError: wrong dimension or shape, NaN/infinity, ``len(ids)`` not equal
                to the number of rows, a repeated or non-string id. Nothing is added.
        """
        items = _check_ids(ids)
        array = check_vectors(vectors, self._dim)
        if len(items) != array.shape[0]:
            raise EmbeddingError(f"got {len(items)} ids for {array.shape[0]} vectors")
        if len(set(items)) != len(items):
            seen: set[str] = set()
            first = ""
            for id_ in items:
                if id_ in seen:
                    first = id_
                    break
                seen.add(id_)
            raise EmbeddingError(
                f"{len(items) - len(set(items))} repeated ids in one add() call "
                f"(first: {first!r}); pass each id once"
            )
        if not items:
            return
        with self._lock:
            start = self._next_label
            labels = np.arange(start, start + len(items), dtype=np.int64)
            self._index.add_with_ids(array, labels)
            self._rows = None
            self._next_label = start + len(items)
            old = [self._label_of[i] for i in items if i in self._label_of]
            for id_, label in zip(items, labels.tolist(), strict=True):
                previous = self._label_of.get(id_)
                if previous is not None:
                    del self._id_of[previous]
                self._label_of[id_] = label
                self._id_of[label] = id_
            self._drop_labels(old)
            self._maintain()

    def remove(self, ids: Iterable[str]) -> int:
        """Remove ids; unknown ids are ignored.

        Returns:
            How many ids were removed.

        Raises:
            EmbeddingError: ``ids`` is a single string or holds a non-string.
        """
        items = _check_ids(ids if isinstance(ids, Sequence) else list(ids))
        with self._lock:
            labels: list[int] = []
            for id_ in dict.fromkeys(items):
                label = self._label_of.pop(id_, None)
                if label is not None:
                    del self._id_of[label]
                    labels.append(label)
            self._drop_labels(labels)
            self._maintain()
            return len(labels)

    def clear(self) -> None:
        """Remove every id (keeps ``dim`` and the settings; back to flat for ``"auto"``)."""
        with self._lock:
            self._label_of.clear()
            self._id_of.clear()
            self._kind = "hnsw" if self._requested == "hnsw" else "flat"
            self._index, self._inner = self._new_faiss(self._kind)
            self._rows = None
            self._codes = self._code_maker()
            self._layout += 1
            self._dead.clear()
            self._dead_selector = None

    def vectors(self, ids: Sequence[str]) -> FloatArray:
        """The stored vectors of ``ids``, shape ``(len(ids), dim)``.

        Raises:
            KeyError: an id is not in the index.
            EmbeddingError: ``ids`` is a single string or holds a non-string.
        """
        items = _check_ids(ids)
        with self._lock:
            missing = [i for i in items if i not in self._label_of]
            if missing:
                raise KeyError(f"{len(missing)} ids not in the index (first: {missing[0]!r})")
            if not items:
                return np.empty((0, self._dim), dtype=np.float32)
            labels = np.fromiter(
                (self._label_of[i] for i in items), dtype=np.int64, count=len(items)
            )
            with single_thread():  # OpenMP threads cost more than they save here
                out: FloatArray = self._index.reconstruct_batch(labels)
            return out.reshape(len(items), self._dim)

    def inner_products(self, ids: Sequence[str], query: FloatArray) -> npt.NDArray[np.float64]:
        """The inner product of ``query`` with the stored vector of each of ``ids``.

        For scoring hundreds of candidates at once: :meth:`labels`, then
        :meth:`label_inner_products`.

        Args:
            ids: message ids; those not in the index get NaN.
            query: one vector, shape ``(dim,)``.

        Example:
            >>> index = FaissIndex(2)
            >>> index.add(["a", "b"], np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32))
            >>> index.inner_products(["b", "x"], np.array([0.6, 0.8], dtype=np.float32))
            array([0.80000001,        nan])
        """
        with self._lock:
            return self.label_inner_products(self.labels(ids), query)

    def labels(self, ids: Sequence[str]) -> npt.NDArray[np.int64]:
        """The label of each of ``ids`` (``-1``: not in the index).

        A label names one stored vector: replacing an id's vector gives it a new label, and
        a label is never reused, so a label kept from an earlier call still names the same
        vector while :meth:`live_labels` says so.
        """
        get = self._label_of.get
        return np.fromiter((get(i, -1) for i in ids), dtype=np.int64, count=len(ids))

    def rows(self, ids: Sequence[str]) -> npt.NDArray[np.int64]:
        """The storage row of the vector of each of ``ids`` (``-1``: none).

        For :meth:`row_inner_products`; rows hold while :attr:`layout` is unchanged.
        """
        with self._lock:
            rows: npt.NDArray[np.int64] = self._storage_rows()[self.labels(ids)]
            return rows

    def live_labels(self, labels: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Whether each label still names a vector in the index (``-1``: no)."""
        with self._lock:
            live: npt.NDArray[np.bool_] = self._storage_rows()[labels] >= 0
            live[labels < 0] = False
            return live

    def label_inner_products(
        self, labels: npt.NDArray[np.int64], query: FloatArray
    ) -> npt.NDArray[np.float64]:
        """The inner product of ``query`` with the vector of each label (NaN: not live).

        Args:
            labels: from :meth:`labels`.
            query: one vector, shape ``(dim,)``.

        Raises:
            EmbeddingError: ``query`` has the wrong dimension.
        """
        with self._lock:
            rows = self._storage_rows()[np.where(labels >= 0, labels, -1)]
            return self.row_inner_products(rows, query)

    def row_inner_products(
        self, rows: npt.NDArray[np.int64], query: FloatArray, fill: float = math.nan
    ) -> npt.NDArray[np.float64]:
        """The inner product of ``query`` with the vector in each storage row (``fill``: ``-1``).

        One faiss call reads the stored vectors in place (one thread, no copy; numpy's
        threaded BLAS is avoided: on a busy machine its threads wait for each other for
        milliseconds).

        Args:
            rows: from :meth:`rows`, at the current :attr:`layout`.
            query: one vector, shape ``(dim,)``.
            fill: the score of a ``-1`` row.

        Raises:
            EmbeddingError: ``query`` has the wrong dimension.
        """
        vector = np.ascontiguousarray(query, dtype=np.float32).reshape(-1)
        if vector.shape[0] != self._dim:
            raise EmbeddingError(f"query has dimension {vector.shape[0]}, expected {self._dim}")
        known = rows >= 0
        every = bool(np.logical_and.reduce(known))
        wanted = np.ascontiguousarray(rows if every else rows[known], dtype=np.int64)
        found = np.empty(len(wanted), dtype=np.float32)
        if len(wanted):
            with self._lock:
                _faiss_untyped.fvec_inner_products_by_idx(
                    faiss.swig_ptr(found),
                    faiss.swig_ptr(vector),
                    self._storage().get_xb(),
                    faiss.swig_ptr(wanted),
                    self._dim,
                    1,
                    len(wanted),
                )
        if every:
            return found.astype(np.float64)
        out = np.full(len(rows), fill)
        out[known] = found
        return out

    def _storage(self) -> Any:
        """The faiss ``IndexFlat`` holding the vectors (the HNSW graph's storage for HNSW)."""
        if self._kind == "flat":
            return self._inner
        return faiss.downcast_index(self._inner.storage)

    def _storage_rows(self) -> npt.NDArray[np.int64]:
        """``label -> row`` in :meth:`_storage` (``-1``: not live), kept until a change.

        One spare cell at the end stays ``-1``, so the label ``-1`` maps to ``-1``.
        """
        if self._rows is None:
            labels = faiss.vector_to_array(self._index.id_map).astype(np.int64, copy=False)
            rows = np.full(self._next_label + 1, -1, dtype=np.int64)
            rows[labels] = np.arange(len(labels), dtype=np.int64)
            self._row_labels = labels
            if self._dead:
                rows[np.fromiter(self._dead, dtype=np.int64, count=len(self._dead))] = -1
            self._rows = rows
        return self._rows

    # --------------------------------------------------------------------- search

    def search(self, vectors: FloatArray, k: int) -> tuple[list[list[str]], FloatArray]:
        """Find the ``k`` ids with the highest inner product for each query row.

        Args:
            vectors: queries, shape ``(n, dim)``.
            k: results wanted per query (>= 1).

        Returns:
            ``(ids, scores)``: ``ids[i]`` lists at most ``k`` live ids for row ``i``, best
            first (fewer when the index holds fewer); ``scores`` has shape
            ``(n, min(k, len(self)))``, ``scores[i, :len(ids[i])]`` are their scores and any
            rest of a row (HNSW only, rarely) is ``-inf``.

        Raises:
            EmbeddingError: ``k`` is not a positive int, or bad query vectors.
        """
        k_int = _check_k(k)
        queries = check_vectors(vectors, self._dim)
        nq = queries.shape[0]
        with self._lock:
            if nq == 1:  # one query: no per-row bookkeeping
                labels, found = self._search_one(queries, k_int)
                k_eff = min(k_int, len(self._label_of))
                scores = np.full((1, k_eff), -np.inf, dtype=np.float32)
                scores[0, : len(found)] = found
                return [self.ids_of_labels(labels)], scores
            k_eff = min(k_int, len(self._label_of))
            scores = np.full((nq, k_eff), -np.inf, dtype=np.float32)
            if k_eff == 0 or nq == 0:
                return [[] for _ in range(nq)], scores
            distances, all_labels = self._faiss_search(queries, k_eff)
            id_of = self._id_of
            out: list[list[str]] = []
            for row in range(nq):
                named = [id_of.get(label) for label in all_labels[row].tolist()]
                # -1 (nothing found) and tombstones are skipped
                cols = [col for col, id_ in enumerate(named) if id_ is not None]
                out.append([id_ for id_ in named if id_ is not None])
                scores[row, : len(cols)] = distances[row, cols]
            return out, scores

    def search_labels(
        self, vector: FloatArray, k: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        """The labels of the ``k`` best live vectors for one query, and their scores.

        The same hits, scores and order as :meth:`search` with one query row, as labels
        (see :meth:`labels`) for callers that map them on themselves.

        Args:
            vector: one query, shape ``(1, dim)``.
            k: results wanted (>= 1).

        Returns:
            ``(labels, scores)``, best first; at most ``min(k, len(self))`` of each.

        Raises:
            EmbeddingError: ``k`` is not a positive int, or a bad query vector.
        """
        k_int = _check_k(k)
        query = self._one_query(vector, "search_labels")
        with self._lock:
            return self._search_one(query, k_int)

    def _one_query(self, vector: FloatArray, method: str) -> FloatArray:
        """``vector`` checked to be one query row, shape ``(1, dim)``."""
        query = check_vectors(vector, self._dim)
        if query.shape[0] != 1:
            raise EmbeddingError(f"{method} takes one query row, got {query.shape[0]}")
        return query

    def query_scores(self, vector: FloatArray) -> QueryScores:
        """One query's scores against the index: its best labels and any labels' scores.

        For a caller that wants both the ``k`` best vectors and the scores of other vectors
        (their neighbours) for the same query; see :class:`QueryScores`.

        Args:
            vector: one query, shape ``(1, dim)``.

        Raises:
            EmbeddingError: a bad query vector, or more than one row.
        """
        row = np.ascontiguousarray(self._one_query(vector, "query_scores")[0])
        with self._lock:
            if self._kind == "hnsw" or self._inner.ntotal >= COARSE_FROM:
                return QueryScores(self, row, None, None, None)
            rows = self._storage_rows()
            scores = self._scan(row)
            assert self._row_labels is not None  # set by _storage_rows
            return QueryScores(self, row, scores, rows, self._row_labels)

    def _scan(self, query: FloatArray) -> npt.NDArray[np.float32]:
        """``query``'s inner product with every vector of a flat storage, by row (lock held)."""
        ntotal = int(self._inner.ntotal)
        scores = np.empty(ntotal, dtype=np.float32)
        if ntotal:  # a plain loop in faiss (no OpenMP threads)
            _faiss_untyped.fvec_inner_products_ny(
                faiss.swig_ptr(scores),
                faiss.swig_ptr(query),
                self._inner.get_xb(),
                self._dim,
                ntotal,
            )
        return scores

    def best_labels(
        self, vector: FloatArray, k: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        """The labels of the ``k`` best live vectors for one query, and their scores.

        What :meth:`QueryScores.top` gives. An HNSW index searches its graph
        (:meth:`search_labels`). A flat index scores every vector and keeps the ``k`` best
        through faiss's heap, in storage order (as a faiss search does for ``k`` below
        100). From :data:`COARSE_FROM` vectors it scores only the ``4 * k`` (at least 256)
        whose compact codes score best (:class:`~marsys_mem.retrieval.codes.Codes`: a
        sixteenth of the bytes to read), through the same heap in the same order, which
        gives the same hits in the same order (ties included) whenever every vector
        scoring at least the ``k``-th score is among them. When a candidate at the codes'
        cut scores that much (equal vectors cut apart, say), it scores every vector
        instead, unless the codes are split into lists (an ``"ivf"`` index from
        ``lists_from`` vectors), which search only the lists nearest the query anyway. The
        codes estimate scores (about 0.03 off on MiniLM vectors), so a vector
        of the exact ``k`` best may be missed: on MiniLM vectors of 10k chat messages, one
        of the exact best 100 (near the 100th score) was for 1.5% of the queries. Until
        the codes are made (in the background, see
        :class:`~marsys_mem.retrieval.codes.CodeMaker`; :meth:`build_codes` waits for
        them) it scores every vector.

        Args:
            vector: one query, shape ``(1, dim)``.
            k: results wanted (>= 1).

        Raises:
            EmbeddingError: ``k`` is not a positive int, or a bad query vector.
        """
        k = _check_k(k)
        return self._best_labels(np.ascontiguousarray(self._one_query(vector, "best_labels")[0]), k)

    def _best_labels(
        self, query: FloatArray, k: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        """:meth:`best_labels` for a checked query row (shape ``(dim,)``, contiguous)."""
        with self._lock:
            if self._kind == "hnsw":
                return self.search_labels(query[None, :], k)
            ntotal = int(self._inner.ntotal)
            codes = None
            if ntotal >= COARSE_FROM:
                codes = self._codes.ready(self._stored(), self._layout, self._read_rows)
            if codes is None:  # small, or the codes are being made: score every vector
                best, scores = _heap_top(self._scan(query), None, k)
            else:
                depth = min(max(_COARSE_DEPTH * k, _COARSE_FLOOR), ntotal)
                rows, coded = codes.best_rows(query, depth)
                exact = np.empty(len(rows), dtype=np.float32)
                _faiss_untyped.fvec_inner_products_by_idx(
                    faiss.swig_ptr(exact),
                    faiss.swig_ptr(query),
                    self._inner.get_xb(),
                    faiss.swig_ptr(rows),
                    self._dim,
                    1,
                    len(rows),
                )
                order = rows.argsort()  # the heap takes them in storage order
                best, scores = _heap_top(exact[order], rows[order], k)
                # every row scoring at least the k-th score was among them unless one sits
                # at the codes' cut (a tie of equal vectors, say, with more of it beyond the
                # cut): then every row is scored (exact, as for a small index). Codes split
                # into lists look at some lists only, so they promise no full scan's ties:
                # scoring every vector (70 ms at 1M) would buy nothing there
                cut = coded <= np.minimum.reduce(coded)
                if (
                    not codes.lists
                    and len(rows) < ntotal
                    and len(best)
                    and np.maximum.reduce(exact[cut]) >= np.minimum.reduce(scores)
                ):
                    best, scores = _heap_top(self._scan(query), None, k)
            self._storage_rows()
            assert self._row_labels is not None  # set by _storage_rows
            return self._row_labels[best], scores

    def _candidate_labels(self, query: FloatArray, k: int) -> npt.NDArray[np.int64]:
        """:meth:`QueryScores.candidates` for a checked query row (shape ``(dim,)``)."""
        with self._lock:
            if self._kind == "flat" and self._inner.ntotal >= COARSE_FROM:
                codes = self._codes.ready(self._stored(), self._layout, self._read_rows)
                if codes is not None:
                    rows, _ = codes.best_rows(query, k)
                    self._storage_rows()
                    assert self._row_labels is not None  # set by _storage_rows
                    found: npt.NDArray[np.int64] = self._row_labels[rows]
                    return found
            return self._best_labels(query, k)[0]

    def build_codes(self, *, wait: bool = True) -> bool:
        """Make the codes :meth:`best_labels` scans from :data:`COARSE_FROM` vectors, and wait.

        They are otherwise made in the background when a query first wants them (or the
        storage has grown past four times the rows they were made from), and the queries
        until then score every vector. For benchmarks and tests that want the steady state,
        and (``wait=False``) for an owner that has just loaded many vectors.

        Args:
            wait: wait for codes being made (``False``: start making them if due, and return).

        Returns:
            Whether queries now scan codes (False: an HNSW or small index, codes still being
            made while not waiting, or making them failed, which is logged).
        """
        for _ in range(3 if wait else 1):  # rows moved while the codes were made: made again
            with self._lock:
                if self._kind == "hnsw" or self._inner.ntotal < COARSE_FROM:
                    return False
                if self._codes.ready(self._stored(), self._layout, self._read_rows) is not None:
                    if not self._codes.making:
                        return True
            if not wait:
                return self._codes.coded_rows > 0
            self._codes.wait()
        with self._lock:
            return self._codes.ready(self._stored(), self._layout, self._read_rows) is not None

    def _read_rows(self, rows: npt.NDArray[np.int64] | slice, layout: int) -> FloatArray | None:
        """A copy of stored rows, if the layout is still ``layout`` (for codes being made)."""
        with self._lock:
            if self._layout != layout or self._kind != "flat":
                return None
            found: FloatArray = self._stored()[rows].copy()
            return found

    def _stored(self) -> FloatArray:
        """The flat storage's vectors in place, shape ``(ntotal, dim)`` (lock held)."""
        ntotal = int(self._inner.ntotal)
        vectors = faiss.rev_swig_ptr(self._inner.get_xb(), ntotal * self._dim)
        stored: FloatArray = vectors.reshape(ntotal, self._dim)
        return stored

    def ids_of_labels(self, labels: npt.NDArray[np.int64]) -> list[str]:
        """The id of each live label (from :meth:`search_labels`)."""
        id_of = self._id_of
        return [id_of[label] for label in labels.tolist()]

    def _search_one(
        self, query: FloatArray, k: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        """One checked query row: the best live labels and their scores (lock held)."""
        k_eff = min(k, len(self._label_of))
        if k_eff == 0:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
        with single_thread():
            distances, labels = self._faiss_search(query, k_eff)
        found: npt.NDArray[np.int64] = labels[0]
        scores: npt.NDArray[np.float32] = distances[0]
        if self._kind == "hnsw" or found[-1] < 0:  # skip -1 (nothing found) and tombstones
            id_of = self._id_of
            keep = [col for col, label in enumerate(found.tolist()) if label in id_of]
            if len(keep) < len(found):
                found, scores = found[keep], scores[keep]
        return found, scores

    def _faiss_search(self, queries: FloatArray, k: int) -> tuple[Any, Any]:
        """``(distances, labels)`` from faiss (tombstones filtered for HNSW; lock held)."""
        found: tuple[Any, Any]
        if self._kind == "flat":
            found = self._index.search(queries, k)
            return found
        params = _faiss_untyped.SearchParametersHNSW()
        params.efSearch = max(self._ef_search, k)
        if self._dead:
            if self._dead_selector is None:
                batch = faiss.IDSelectorBatch(
                    np.fromiter(self._dead, dtype=np.int64, count=len(self._dead))
                )
                self._dead_selector = (faiss.IDSelectorNot(batch), batch)
            params.sel = self._dead_selector[0]
        found = self._index.search(queries, k, params=params)
        return found

    # ------------------------------------------------------------------------ files

    def save(self, path: str | os.PathLike[str], *, meta: Mapping[str, Any] | None = None) -> None:
        """Write the index to one file, atomically (temp file, fsync, rename).

        Args:
            path: the file; its folder is created if missing.
            meta: JSON-serialisable facts to store with it, e.g. ``{"embedder": emb.name}``;
                :meth:`load` can require them (``expected_meta``) to detect a stale index.

        Raises:
            TypeError: ``meta`` is not a JSON-serialisable mapping.
            StoreError: the file cannot be written (the old file, if any, is untouched).
        """
        meta_dict = dict(meta or {})
        try:
            json.dumps(meta_dict, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"meta must be JSON-serialisable: {exc}") from exc
        with self._lock:
            index_bytes = faiss.serialize_index(self._index)
            ids = list(self._label_of)
            labels = np.fromiter(
                (self._label_of[i] for i in ids), dtype="<i8", count=len(ids)
            ).tobytes()
            fields = {
                "dim": self._dim,
                "kind": self._kind,
                "requested_kind": self._requested,
                "count": len(ids),
                "next_label": self._next_label,
                "hnsw_threshold": self._hnsw_threshold,
                "hnsw_m": self._hnsw_m,
                "ef_search": self._ef_search,
                "lists_from": self._lists_from,
            }
        sections = [
            ("index", index_bytes.data),
            ("labels", memoryview(labels)),
            ("ids", memoryview(json.dumps(ids).encode())),
        ]
        write_index_file(path, fields, meta_dict, sections)

    async def asave(
        self, path: str | os.PathLike[str], *, meta: Mapping[str, Any] | None = None
    ) -> None:
        """Async twin of :meth:`save` (runs in a worker thread)."""
        await asyncio.to_thread(self.save, path, meta=meta)

    @staticmethod
    def read_header(path: str | os.PathLike[str]) -> dict[str, Any]:
        """The JSON header of a saved index (reads only the header; the payload is unchecked).

        Raises:
            IndexCorruptError: the file is missing or its header is unreadable.
        """
        return read_index_header(path)

    @staticmethod
    def read_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
        """The ``meta`` given to :meth:`save` (reads only the header).

        Raises:
            IndexCorruptError: the file is missing or its header is unreadable.
        """
        meta: dict[str, Any] = FaissIndex.read_header(path)["meta"]
        return meta

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        *,
        expected_dim: int | None = None,
        expected_meta: Mapping[str, Any] | None = None,
    ) -> Self:
        """Load an index written by :meth:`save`, checking it thoroughly.

        Args:
            path: the file.
            expected_dim: if given, the saved ``dim`` must equal it.
            expected_meta: if given, every key in it must be in the saved meta with an equal
                value (other saved keys are ignored), e.g. ``{"embedder": emb.name}``.

        Raises:
            IndexCorruptError: the file is missing, not an index file, truncated, fails its
                checksum, or is stale (another ``dim`` or ``meta``): rebuild the index.
        """
        header, sections = read_index_file(
            path, expected_dim=expected_dim, expected_meta=expected_meta
        )
        try:
            return cls._from_parts(header, sections)
        except IndexCorruptError:
            raise
        except Exception as exc:
            raise IndexCorruptError(
                f"corrupt index file {str(path)!r}: {type(exc).__name__}: {exc}"
            ) from exc

    @classmethod
    async def aload(
        cls,
        path: str | os.PathLike[str],
        *,
        expected_dim: int | None = None,
        expected_meta: Mapping[str, Any] | None = None,
    ) -> Self:
        """Async twin of :meth:`load` (runs in a worker thread)."""
        return await asyncio.to_thread(
            cls.load, path, expected_dim=expected_dim, expected_meta=expected_meta
        )

    @classmethod
    def _from_parts(cls, header: dict[str, Any], sections: Mapping[str, memoryview]) -> Self:
        def section(name: str) -> memoryview:
            if name not in sections:
                raise IndexCorruptError(f"section {name!r} is missing")
            return sections[name]

        index = cls(
            header["dim"],
            header["requested_kind"],
            hnsw_threshold=header["hnsw_threshold"],
            hnsw_m=header["hnsw_m"],
            ef_search=header["ef_search"],
            lists_from=header.get("lists_from", LISTS_FROM),
        )
        raw = faiss.deserialize_index(np.frombuffer(section("index"), dtype=np.uint8))
        if not isinstance(raw, faiss.IndexIDMap2):
            raise IndexCorruptError(f"unexpected faiss index type {type(raw).__name__}")
        inner: Any = faiss.downcast_index(raw.index)
        kind = header["kind"]
        expected_type: Any = faiss.IndexFlatIP if kind == "flat" else faiss.IndexHNSWFlat
        if not isinstance(inner, expected_type) or inner.d != header["dim"]:
            raise IndexCorruptError(
                f"the faiss index ({type(inner).__name__}, d={inner.d}) does not match the "
                f"header (kind={kind!r}, dim={header['dim']})"
            )
        if kind == "hnsw":
            inner.hnsw.efSearch = header["ef_search"]
        labels = np.frombuffer(section("labels"), dtype="<i8").astype(np.int64).tolist()
        ids = json.loads(bytes(section("ids")))
        count = header["count"]
        if not (
            isinstance(ids, list)
            and len(ids) == len(labels) == count
            and all(isinstance(i, str) and i for i in ids)
            and len(set(ids)) == count
            and len(set(labels)) == count
        ):
            raise IndexCorruptError("the id map is inconsistent")
        stored = faiss.vector_to_array(raw.id_map).astype(np.int64).tolist()
        stored_set = set(stored)
        if len(stored_set) != len(stored) or not stored_set.issuperset(labels):
            raise IndexCorruptError("the id map does not match the faiss index")
        if kind == "flat" and len(stored) != count:
            raise IndexCorruptError("the flat index holds vectors with no id")
        if max(stored, default=-1) >= header["next_label"]:
            raise IndexCorruptError("next_label is behind the stored labels")
        index._index, index._inner, index._kind = raw, inner, kind
        index._rows = None
        index._label_of = dict(zip(ids, labels, strict=True))
        index._id_of = dict(zip(labels, ids, strict=True))
        index._dead = stored_set.difference(labels)
        index._next_label = header["next_label"]
        return index
