"""Compact codes of a flat index's vectors, for a quick first pass over all of them.

A query against a flat index of 10k MiniLM vectors (384 floats each, 15 MB) spends most of
its time reading them. :class:`Codes` keeps a 4-bit product-quantizer code of each vector
(two dimensions per 4-bit code: 96 bytes for 384 dimensions, a sixteenth of the floats),
scanned by faiss's SIMD "fast scan" kernel; the caller then scores the codes' best
exactly. Measured on 10k MiniLM vectors of chat messages (2 cores, after a forward pass
left the caches cold): 0.34 ms to scan the codes for the best 400, where faiss's 8-bit
scalar codes took 1.0 ms and the float vectors 1.8 ms; scored exactly, those 400 held
the exact best 100 for 98.5% of 396 queries, and 99.985% of the exact best-100 members.

Codes need a codebook trained on the vectors (k-means, ~0.3 s) and every vector coded
(~14 us each), too slow for the query that first wants them: :class:`CodeMaker` makes
them in the background, reading the vectors a chunk at a time under the index's lock (no
copy of the whole storage), and the index scores every vector exactly until they are
ready (and again past :data:`RETRAIN_GROWTH` times the rows they were trained on, when new
codes are made the same way while the old ones serve).

Scanning every code still grows with the rows: 10.7 ms for 1M (96 MB). From ``lists_from``
rows (:data:`LISTS_FROM` for an ``"ivf"`` index) the codes are made split into lists
instead, faiss's ``IndexIVFPQFastScan`` (an inverted file: each vector's code kept in the
list of its nearest of about ``sqrt(rows)`` centroids), and a query scans only the lists
of its :func:`probes_for` nearest centroids: an eighth of the codes. Measured on the 1M
chat turns of ``benchmarks/bench_scale.py`` (MiniLM vectors, 165 questions, one thread):
1,000 lists, 125 probed: 0.977 of the exact best 10 found (ties within 1e-3) in 1.2 ms,
against 0.996 in 6.0 ms scanning every code; probing 40 lists gave 0.913, 84 0.962, 160
0.985 (2.0 ms), 250 0.992 (2.2 ms). Made in 13-21 s in the background at 1M.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import faiss
import numpy as np
import numpy.typing as npt

from marsys_mem.retrieval.ahead import Worker
from marsys_mem.retrieval.embeddings import FloatArray

__all__ = [
    "LISTS_FROM",
    "RETRAIN_GROWTH",
    "CodeMaker",
    "Codes",
    "RowReader",
    "lists_for",
    "probes_for",
]

RowReader = Callable[[npt.NDArray[np.int64] | slice, int], FloatArray | None]
"""Reads stored rows for :meth:`Codes.make`: ``read(rows, layout)`` returns a copy of those
rows, or ``None`` when the storage's layout is no longer ``layout`` (rows moved or went)."""

_log = logging.getLogger(__name__)
_faiss_untyped: Any = faiss  # for the parts faiss's own type stubs leave out

_DIMS_PER_CODE = 2
"""Dimensions per 4-bit sub-quantizer (with 3, the best 400 held the exact best 100 for
only 89% of the queries above; with 2, 98.5%)."""

_TRAIN_ROWS = 1024
"""Vectors the codebook is trained on (spread over the storage): 64 per centroid. As good
as 4,096 on the queries above, and a tenth of the time (0.28 s instead of 3.4 s)."""

_TRAIN_ITERATIONS = 8

_CHUNK = 8192
"""Rows read (and coded) at a time: 12 MB of 384-dimensional vectors."""

RETRAIN_GROWTH = 4
"""New codes are made when the storage holds this many times the rows the codes were
trained on."""

LISTS_FROM = 200_000
"""Rows from which an ``"ivf"`` index's codes are split into lists (below it a scan of
every code costs about 2 ms or less)."""

_PROBE_SHARE = 1 / 8
"""The share of the lists a query scans (see :func:`probes_for`)."""

_LIST_SAMPLES = 40
"""Training vectors per list for the centroids (faiss warns below 39)."""

_maker = Worker("marsys-mem-codes")


def lists_for(rows: int) -> int:
    """How many lists codes of ``rows`` rows are split into: about ``sqrt(rows)``.

    Example:
        >>> lists_for(1_000_000), lists_for(200_000)
        (1000, 447)
    """
    return max(1, round(math.sqrt(rows)))


def probes_for(lists: int) -> int:
    """How many of ``lists`` lists one query scans: an eighth, at least 8.

    Example:
        >>> probes_for(1000), probes_for(447), probes_for(20)
        (125, 56, 8)
    """
    return min(lists, max(8, math.ceil(lists * _PROBE_SHARE)))


class _Moved(Exception):
    """Rows moved or went while codes were made: they are made again."""


class Codes:
    """4-bit product-quantizer codes of a flat storage's vectors, row for row.

    Rows are kept in a plain faiss ``IndexPQ`` (cheap to append to and remove from) and
    scanned through an ``IndexPQFastScan`` made from it (its codes packed for SIMD lookups;
    remade, in ~2 ms at 10k rows, after rows are removed). From ``lists_from`` rows the
    plain codes are an ``IndexIVFPQ`` holding each row under its row number (renumbered
    when rows go) and the scan an ``IndexIVFPQFastScan`` made from it, which looks in
    :func:`probes_for` of its lists. (Rows are not removed from the fast-scan lists
    themselves: in faiss 1.15, rows added to them after a removal get wrong codes.) Not
    thread-safe: the index that owns it serialises access.

    Args:
        index: a trained ``faiss.IndexPQ`` holding the first rows' codes, or a trained
            ``faiss.IndexIVFPQ`` holding them under their row numbers.
        trained_rows: how many rows the storage held when the codebook was trained.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> vectors = rng.standard_normal((700, 16)).astype(np.float32)
        >>> vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        >>> codes = Codes.make(lambda rows, layout: vectors[rows], len(vectors), layout=0)
        >>> codes.rows, codes.lists
        (700, 0)
        >>> rows, scores = codes.best_rows(vectors[3], 5)  # best first, estimates
        >>> bool(3 in rows.tolist())
        True
        >>> more = rng.standard_normal((2000, 16)).astype(np.float32)
        >>> split = Codes.make(lambda rows, layout: more[rows], 2000, layout=0, lists_from=1000)
        >>> split.lists, bool(3 in split.best_rows(more[3], 5)[0].tolist())
        (45, True)
    """

    __slots__ = ("_fast", "_index", "_split", "trained_rows")

    def __init__(self, index: Any, trained_rows: int) -> None:
        self._index = index
        self._split = isinstance(index, faiss.IndexIVF)
        self._fast: Any = None
        self.trained_rows = trained_rows

    @classmethod
    def make(cls, read: RowReader, n: int, layout: int, lists_from: int | None = None) -> Codes:
        """Train a codebook on a sample of the first ``n`` stored rows, and code them.

        Slow (see the module notes): :class:`CodeMaker` runs it in the background.

        Args:
            read: reads rows of the storage (see :data:`RowReader`).
            n: how many rows (the storage holds at least these while ``layout`` holds).
            layout: the storage's layout now.
            lists_from: rows from which the codes are split into :func:`lists_for` lists
                (``None``: never).

        Raises:
            _Moved: the layout changed meanwhile.
        """

        def rows(which: npt.NDArray[np.int64] | slice) -> FloatArray:
            got = read(which, layout)
            if got is None:
                raise _Moved
            return np.ascontiguousarray(got, dtype=np.float32)

        first = rows(slice(0, 1))
        dim = first.shape[1]
        per = _DIMS_PER_CODE if dim % _DIMS_PER_CODE == 0 else 1
        index: Any
        if lists_from is not None and n >= lists_from:
            lists = lists_for(n)
            index = _faiss_untyped.IndexIVFPQ(
                faiss.IndexFlatIP(dim), dim, lists, dim // per, 4, faiss.METRIC_INNER_PRODUCT
            )
            index.by_residual = False  # codes of the vectors themselves, as the plain ones
            index.cp.niter = _TRAIN_ITERATIONS
            index.pq.cp.niter = _TRAIN_ITERATIONS
            samples = min(n, max(_TRAIN_ROWS, _LIST_SAMPLES * lists))
        else:
            index = _faiss_untyped.IndexPQ(dim, dim // per, 4, faiss.METRIC_INNER_PRODUCT)
            index.pq.cp.niter = _TRAIN_ITERATIONS
            samples = min(n, _TRAIN_ROWS)
        index.train(rows(np.linspace(0, n - 1, samples).astype(np.int64)))
        codes = cls(index, n)
        for start in range(0, n, _CHUNK):
            codes._add(rows(slice(start, min(n, start + _CHUNK))))
        return codes

    @property
    def rows(self) -> int:
        """How many rows are coded."""
        return int(self._index.ntotal)

    @property
    def lists(self) -> int:
        """How many lists the codes are split into (0: one plain scan of them all)."""
        return int(self._index.nlist) if self._split else 0

    def _add(self, vectors: FloatArray) -> None:
        """Code ``vectors`` as the next rows."""
        if self._split:
            rows = np.arange(self.rows, self.rows + len(vectors))
            self._index.add_with_ids(vectors, rows)
            if self._fast is not None:
                self._fast.add_with_ids(vectors, rows)
        else:
            self._index.add(vectors)
            if self._fast is not None:
                self._fast.add(vectors)

    def sync(self, vectors: FloatArray) -> None:
        """Code the rows of ``vectors`` (the whole storage) that are not coded yet."""
        fresh = vectors[self.rows :]
        if len(fresh):
            self._add(np.ascontiguousarray(fresh))

    def remove_rows(self, rows: npt.NDArray[np.int64]) -> None:
        """Drop coded rows; the rest close up in order (as a flat storage's rows do)."""
        gone = np.unique(rows[rows < self.rows])
        if not len(gone):
            return
        self._index.remove_ids(faiss.IDSelectorBatch(gone))
        self._fast = None  # repacked from the plain codes when next scanned
        if not self._split:
            return
        lists = self._index.invlists  # each later row's number drops by the rows before it
        for number in range(self.lists):
            size = lists.list_size(number)
            if size:
                ids = faiss.rev_swig_ptr(lists.get_ids(number), size)
                ids -= np.searchsorted(gone, ids)

    def best_rows(
        self, query: FloatArray, k: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        """The rows of the ``k`` best codes for ``query`` (shape ``(dim,)``), and their scores.

        Best first. The scores estimate the inner products (about 0.03 off on MiniLM
        vectors); equal vectors have equal codes, hence equal scores. Split codes look only
        in the lists nearest to ``query``, so they may return fewer than ``k`` rows.
        """
        if self._fast is None:
            if self._split:
                self._fast = _faiss_untyped.IndexIVFPQFastScan(self._index)
                self._fast.nprobe = probes_for(self.lists)
            else:
                self._fast = _faiss_untyped.IndexPQFastScan(self._index)
        scores, rows = self._fast.search(query[None, :], k)
        found: npt.NDArray[np.int64] = rows[0]
        coded: npt.NDArray[np.float32] = scores[0]
        if len(found) and found[-1] < 0:  # fewer rows than k (best first: -1s at the end)
            keep = found >= 0
            found, coded = found[keep], coded[keep]
        return found, coded


class CodeMaker:
    """The :class:`Codes` of one flat storage: those in use, and new ones made in the background.

    The owner calls :meth:`ready` under its lock with a view of its storage and a
    :data:`RowReader` (which takes that lock); the codes are made on a helper thread
    (faiss lets go of the GIL) and taken into use if no row moved or went meanwhile
    (``layout``; rows appended meanwhile are coded on taking them; otherwise they are
    made again). Removals reach the codes in use through :meth:`remove_rows`. Making codes
    that fails is logged once, and the owner scores exactly from then on. Not
    thread-safe: the owner serialises access.

    Args:
        lists_from: rows from which codes are made split into lists (``None``: never; see
            :class:`Codes`).

    Example:
        >>> vectors = np.random.default_rng(0).standard_normal((700, 16)).astype(np.float32)
        >>> read = lambda rows, layout: vectors[rows].copy()
        >>> maker = CodeMaker()
        >>> maker.ready(vectors, 0, read) is None  # started in the background
        True
        >>> maker.wait()
        >>> maker.ready(vectors, 0, read).rows
        700
    """

    __slots__ = ("_codes", "_failed", "_job", "lists_from")

    def __init__(self, lists_from: int | None = None) -> None:
        self.lists_from = lists_from
        self._codes: Codes | None = None
        self._job: tuple[Future[Codes], int] | None = None
        self._failed = False

    def ready(self, vectors: FloatArray, layout: int, read: RowReader) -> Codes | None:
        """The codes of ``vectors`` (all rows coded), or ``None`` while the first are made.

        Starts making codes when there are none, or when the storage has grown past
        :data:`RETRAIN_GROWTH` times the rows they were trained on.

        Args:
            vectors: the whole storage, shape ``(n, dim)``, read now.
            layout: a number that changes whenever stored rows move or go.
            read: reads rows for codes made in the background (see :data:`RowReader`).
        """
        job = self._job
        if job is not None and job[0].done():
            self._job = None
            try:
                made = job[0].result()
            except _Moved:  # made again below
                pass
            except Exception as exc:  # logged; the exact scan serves on
                _log.warning("making codes for the vector index failed: %s", exc)
                self._failed = True
            else:
                if job[1] == layout:  # no row moved since it began: appended rows follow
                    self._codes = made
        codes = self._codes
        n = len(vectors)
        stale = codes is None or n > RETRAIN_GROWTH * codes.trained_rows
        if stale and self._job is None and not self._failed:
            self._job = (_maker.submit(Codes.make, read, n, layout, self.lists_from), layout)
        if codes is not None:
            codes.sync(vectors)
        return codes

    def wait(self) -> None:
        """Wait for the codes being made, if any (their errors are seen by :meth:`ready`)."""
        job = self._job
        if job is not None:
            with contextlib.suppress(Exception):  # ready() sees and logs it
                job[0].result()

    def remove_rows(self, rows: npt.NDArray[np.int64]) -> None:
        """Drop rows from the codes in use (codes being made are dropped when they come)."""
        if self._codes is not None:
            self._codes.remove_rows(rows)

    @property
    def making(self) -> bool:
        """Whether codes are being made (or made and not yet taken by :meth:`ready`)."""
        return self._job is not None

    @property
    def coded_rows(self) -> int:
        """Rows coded by the codes in use (0: none yet)."""
        return 0 if self._codes is None else self._codes.rows
