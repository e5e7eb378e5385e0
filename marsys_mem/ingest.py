"""Background ingest: embedding in batches on a worker thread, off the write path.

Writes must not wait for a model (mem0 and Graphiti put an LLM or an embedder on the write
path and take seconds per message). :class:`EmbeddingQueue` takes ``(key, text)`` pairs,
returns at once, embeds them in batches on a daemon thread with any
:class:`~marsys_mem.embeddings.Embedder`, and hands the vectors to a callback;
``flush()`` waits for what was submitted. :class:`~marsys_mem.patterns.rag.RAGMemory`
feeds its FAISS index this way.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Self

from marsys_mem.embeddings import Embedder, FloatArray, check_vectors
from marsys_mem.exceptions import EmbeddingError

__all__ = ["EmbeddingQueue", "OnVectors"]

log = logging.getLogger("marsys_mem.ingest")


OnVectors = Callable[[list[str], FloatArray], None]
"""The :class:`EmbeddingQueue` callback: ``on_vectors(keys, vectors)``."""


class EmbeddingQueue:
    """Embeds texts in batches on a daemon thread, so adding text never waits for a model.

    :meth:`submit` enqueues ``(key, text)`` and returns at once. The worker takes up to
    ``batch_size`` items at a time, calls ``embedder.embed`` once per batch and hands the
    result to ``on_vectors(keys, vectors)`` (on the worker thread: the callback must be
    thread-safe with respect to your data; :class:`~marsys_mem.index.FaissIndex` is).
    Batches are delivered in submission order. A key submitted again before the worker
    took it is coalesced: it keeps its place and only the latest text is embedded, so the
    keys of one batch are unique. :meth:`flush` waits for everything submitted so far and
    re-raises the first error of the embedder or callback. :meth:`close` delivers what is
    pending and stops the thread.

    An error drops its batch (those keys get no vectors) and the worker carries on.
    When ``max_pending`` items are waiting, :meth:`submit` blocks until the worker catches
    up (back-pressure; not from inside the callback, which never blocks).

    Args:
        embedder: any :class:`Embedder`.
        on_vectors: called as ``on_vectors(keys, vectors)`` with ``vectors.shape ==
            (len(keys), embedder.dim)``.
        batch_size: most texts per ``embed`` call.
        max_pending: most items waiting before :meth:`submit` blocks.

    Raises:
        ValueError: a bad ``batch_size`` or ``max_pending``.

    Example:
        >>> from marsys_mem.embeddings import HashingEmbedder
        >>> got = {}
        >>> with EmbeddingQueue(HashingEmbedder(8), lambda k, v: got.update(zip(k, v))) as q:
        ...     q.submit("a", "hello world")
        ...     q.flush()
        ...     sorted(got), got["a"].shape
        (['a'], (8,))
    """

    def __init__(
        self,
        embedder: Embedder,
        on_vectors: OnVectors,
        *,
        batch_size: int = 64,
        max_pending: int = 100_000,
    ) -> None:
        for arg, value in (("batch_size", batch_size), ("max_pending", max_pending)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{arg} must be an int >= 1, got {value!r}")
        if not callable(on_vectors):
            raise ValueError(f"on_vectors must be callable, got {on_vectors!r}")
        self._embedder = embedder
        self._on_vectors = on_vectors
        self._batch_size = batch_size
        self._max_pending = max_pending
        lock = threading.Lock()
        self._has_items = threading.Condition(lock)  # the worker waits on it
        self._progress = threading.Condition(lock)  # flush() and a blocked submit() wait on it
        self._items: OrderedDict[str, str] = OrderedDict()
        self._submitted = 0  # items enqueued (coalesced ones count once)
        self._done = 0  # items delivered or dropped by an error
        self._error: tuple[BaseException, list[str]] | None = None
        self._closing = False
        self._closed = False
        self._thread = threading.Thread(
            target=self._run, name="marsys-mem-embedding-queue", daemon=True
        )
        self._thread.start()

    @property
    def pending(self) -> int:
        """Items submitted and not delivered yet (including the batch being embedded)."""
        with self._progress:
            return self._submitted - self._done

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._closing

    def submit(self, key: str, text: str) -> None:
        """Enqueue one text; returns at once (unless ``max_pending`` items are waiting).

        Raises:
            EmbeddingError: ``key`` or ``text`` is not a string, or the queue is closed.
        """
        self.submit_many(((key, text),))

    def submit_many(self, items: Iterable[tuple[str, str]]) -> None:
        """Enqueue ``(key, text)`` pairs in order (one lock round-trip for all of them).

        Raises:
            EmbeddingError: a key or text is not a string (nothing is enqueued), or the
                queue is closed.
        """
        batch = list(items)
        for i, pair in enumerate(batch):
            if not (
                isinstance(pair, tuple)
                and len(pair) == 2
                and isinstance(pair[0], str)
                and isinstance(pair[1], str)
            ):
                raise EmbeddingError(f"item {i} must be a (key: str, text: str) pair, got {pair!r}")
        on_worker = threading.current_thread() is self._thread
        with self._has_items:
            for key, text in batch:
                if self._closing:
                    raise EmbeddingError("the embedding queue is closed")
                while len(self._items) >= self._max_pending and not on_worker:
                    self._has_items.notify()  # the items added so far
                    self._progress.wait()
                    if self._closing:
                        raise EmbeddingError("the embedding queue is closed")
                if key in self._items:
                    self._items[key] = text
                else:
                    self._items[key] = text
                    self._submitted += 1
            self._has_items.notify()

    def _run(self) -> None:
        while True:
            with self._has_items:
                while not self._items and not self._closing:
                    self._has_items.wait()
                if not self._items:
                    return
                n = min(self._batch_size, len(self._items))
                batch = [self._items.popitem(last=False) for _ in range(n)]
                self._progress.notify_all()  # room for blocked submitters
            keys = [key for key, _ in batch]
            try:
                vectors = check_vectors(
                    self._embedder.embed([t for _, t in batch]), self._embedder.dim
                )
                if vectors.shape[0] != n:
                    raise EmbeddingError(
                        f"the embedder returned {vectors.shape[0]} rows for {n} texts"
                    )
                self._on_vectors(keys, vectors)
            except Exception as exc:
                with self._progress:
                    if self._error is None:
                        self._error = (exc, keys)
            with self._progress:
                self._done += n
                self._progress.notify_all()

    def _raise_error(self) -> None:
        with self._progress:
            error, self._error = self._error, None
        if error is not None:
            exc, keys = error
            shown = ", ".join(repr(k) for k in keys[:3]) + (", ..." if len(keys) > 3 else "")
            raise EmbeddingError(
                f"embedding a batch of {len(keys)} texts failed (keys {shown}): "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def flush(self, timeout: float | None = None) -> None:
        """Wait until everything submitted before this call is delivered.

        Args:
            timeout: seconds to wait at most; ``None`` waits as long as it takes.

        Raises:
            EmbeddingError: the embedder or the callback failed since the last flush (the
                first error, as ``__cause__``); reported once.
            TimeoutError: ``timeout`` passed first (nothing is lost; flush again).
            RuntimeError: called from inside ``on_vectors`` (it would wait for itself).
        """
        if threading.current_thread() is self._thread:
            raise RuntimeError("flush() called from the on_vectors callback would deadlock")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._progress:
            target = self._submitted
            while self._done < target:
                if deadline is None:
                    self._progress.wait()
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"flush timed out after {timeout}s with {target - self._done} "
                        "texts still pending"
                    )
                self._progress.wait(remaining)
        self._raise_error()

    async def aflush(self, timeout: float | None = None) -> None:
        """Async twin of :meth:`flush` (waits in a worker thread)."""
        await asyncio.to_thread(self.flush, timeout)

    def close(self, timeout: float | None = None) -> None:
        """Deliver what is pending, then stop the worker thread. Idempotent.

        Args:
            timeout: seconds to wait for the worker at most.

        Raises:
            EmbeddingError: an error not yet reported by :meth:`flush`.
            TimeoutError: the worker did not finish within ``timeout``.
        """
        self._close(timeout)
        self._raise_error()

    def _close(self, timeout: float | None) -> None:
        if threading.current_thread() is self._thread:
            raise RuntimeError("close() called from the on_vectors callback would deadlock")
        with self._has_items:
            if self._closed:
                return
            self._closing = True
            self._has_items.notify_all()
            self._progress.notify_all()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the embedding worker did not stop within {timeout}s")
        with self._has_items:
            self._closed = True

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        self._close(None)  # do not mask the exception in flight with an embedding error
        with self._progress:
            error, self._error = self._error, None
        if error is not None:
            log.warning("embedding queue closed with an unreported error: %r", error[0])

    def __repr__(self) -> str:
        state = "closed" if self._closing else "open"
        return f"<EmbeddingQueue {state} pending={self.pending} embedder={self._embedder!r}>"
