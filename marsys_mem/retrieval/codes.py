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
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import faiss
import numpy as np
import numpy.typing as npt

from marsys_mem.retrieval.ahead import Worker
from marsys_mem.retrieval.embeddings import FloatArray

__all__ = ["RETRAIN_GROWTH", "CodeMaker", "Codes", "RowReader"]

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

_maker = Worker("marsys-mem-codes")


class _Moved(Exception):
    """Rows moved or went while codes were made: they are made again."""


class Codes:
    """4-bit product-quantizer codes of a flat storage's vectors, row for row.

    Rows are kept in a plain faiss ``IndexPQ`` (cheap to append to and remove from) and
    scanned through an ``IndexPQFastScan`` made from it (its codes packed for SIMD
    lookups; remade, in ~2 ms at 10k rows, after rows are removed). Not thread-safe: the
    index that owns it serialises access.

    Args:
        plain: a trained ``faiss.IndexPQ`` holding the first rows' codes.
        trained_rows: how many rows the storage held when the codebook was trained.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> vectors = rng.standard_normal((700, 16)).astype(np.float32)
        >>> vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        >>> codes = Codes.make(lambda rows, layout: vectors[rows], len(vectors), layout=0)
        >>> codes.rows
        700
        >>> rows, scores = codes.best_rows(vectors[3], 5)  # best first, estimates
        >>> bool(3 in rows.tolist())
        True
    """

    __slots__ = ("_fast", "_plain", "trained_rows")

    def __init__(self, plain: Any, trained_rows: int) -> None:
        self._plain = plain
        self._fast: Any = None
        self.trained_rows = trained_rows

    @classmethod
    def make(cls, read: RowReader, n: int, layout: int) -> Codes:
        """Train a codebook on a sample of the first ``n`` stored rows, and code them.

        Slow (see the module notes): :class:`CodeMaker` runs it in the background.

        Args:
            read: reads rows of the storage (see :data:`RowReader`).
            n: how many rows (the storage holds at least these while ``layout`` holds).
            layout: the storage's layout now.

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
        plain = _faiss_untyped.IndexPQ(dim, dim // per, 4, faiss.METRIC_INNER_PRODUCT)
        plain.pq.cp.niter = _TRAIN_ITERATIONS
        plain.train(rows(np.linspace(0, n - 1, min(n, _TRAIN_ROWS)).astype(np.int64)))
        for start in range(0, n, _CHUNK):
            plain.add(rows(slice(start, min(n, start + _CHUNK))))
        return cls(plain, n)

    @property
    def rows(self) -> int:
        """How many rows are coded."""
        return int(self._plain.ntotal)

    def sync(self, vectors: FloatArray) -> None:
        """Code the rows of ``vectors`` (the whole storage) that are not coded yet."""
        fresh = vectors[self.rows :]
        if len(fresh):
            fresh = np.ascontiguousarray(fresh)
            self._plain.add(fresh)
            if self._fast is not None:
                self._fast.add(fresh)

    def remove_rows(self, rows: npt.NDArray[np.int64]) -> None:
        """Drop coded rows; the rest close up in order (as a flat storage's rows do)."""
        rows = rows[rows < self.rows]
        if len(rows):
            self._plain.remove_ids(faiss.IDSelectorBatch(rows))
            self._fast = None  # repacked from the plain codes when next scanned

    def best_rows(
        self, query: FloatArray, k: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        """The rows of the ``k`` best codes for ``query`` (shape ``(dim,)``), and their scores.

        Best first. The scores estimate the inner products (about 0.03 off on MiniLM
        vectors); equal vectors have equal codes, hence equal scores.
        """
        if self._fast is None:
            self._fast = _faiss_untyped.IndexPQFastScan(self._plain)
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

    __slots__ = ("_codes", "_failed", "_job")

    def __init__(self) -> None:
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
            self._job = (_maker.submit(Codes.make, read, n, layout), layout)
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
