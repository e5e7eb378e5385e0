"""Background ingest: embedding in batches on a worker thread, off the write path.

Writes must not wait for a model (mem0 and Graphiti put an LLM or an embedder on the write
path and take seconds per message). :class:`EmbeddingQueue` takes ``(key, text)`` pairs,
returns at once, embeds them in batches on a daemon thread with any
:class:`~marsys_mem.retrieval.embeddings.Embedder`, and hands the vectors to a callback;
``flush()`` waits for what was submitted. :class:`~marsys_mem.patterns.rag.RAGMemory`
feeds its FAISS index this way.

Interpreter exit: a program may end without closing its queues. A daemon worker that is
still inside torch when the interpreter finalizes is killed mid-call, and the process
aborts ("terminate called without an active exception", exit code 134). So every open
queue is in one registry, and one :mod:`atexit` hook (registered when the first queue is
made) stops them all before finalization: it **cancels** what is still pending, waits for
the batches being embedded (at most :data:`EXIT_TIMEOUT` seconds for all queues together,
so exit never hangs on a long backlog), then calls each queue's ``at_exit`` callback.
The hook runs after the threading module has joined the program's non-daemon threads,
so no thread of the program is cut off mid-``submit``; a ``submit`` that comes later
(from another exit handler) is embedded inline, in the caller's thread.

Why cancel rather than drain: draining a backlog of 100k texts would hold the exit for
minutes. Nothing is lost by cancelling: an in-memory index dies with the process anyway,
and :class:`~marsys_mem.patterns.rag.RAGMemory` with a store and an ``index_path`` keeps
every message in the store (durable when ``add`` returned); its ``at_exit`` saves the
vectors done so far (atomically: the old file or the new one, never a mix), and the next
``RAGMemory`` on that store embeds only the messages the saved index lacks.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Self

import numpy as np

from marsys_mem.exceptions import EmbeddingError
from marsys_mem.retrieval.embeddings import (
    Embedder,
    FloatArray,
    check_vectors,
    length_batches,
    text_lengths,
)

__all__ = ["EXIT_TIMEOUT", "LINGER_SPAN", "EmbeddingQueue", "OnVectors"]

log = logging.getLogger("marsys_mem.retrieval.ingest")


OnVectors = Callable[[list[str], FloatArray], None]
"""The :class:`EmbeddingQueue` callback: ``on_vectors(keys, vectors)``."""

EXIT_TIMEOUT = 30.0
"""Seconds the exit hook waits, for all open queues together, for the batches being embedded.

A batch of 64 short texts takes MiniLM about a second on a free core, but 5-10 s on two
cores shared by several busy processes (measured), and longer texts take longer: the
margin is wide because the alternative is an abort. A worker still busy when the time is
up is left running and logged (the process may then abort as it finalizes)."""

LINGER_SPAN = 20
"""The longest wait for a burst of texts to end, in ``linger`` periods (1 s by default)."""

_live: weakref.WeakSet[EmbeddingQueue] = weakref.WeakSet()  # open queues
_live_lock = threading.Lock()
_hook_registered = False


def _unregister(queue: EmbeddingQueue) -> None:
    with _live_lock:
        _live.discard(queue)


class EmbeddingQueue:
    """Embeds texts in batches on a daemon thread, so adding text never waits for a model.

    :meth:`submit` enqueues ``(key, text)`` and returns at once. The worker takes what is
    waiting (up to ``window`` texts), composes it into batches of at most ``batch_size``
    texts of similar length (:func:`~marsys_mem.retrieval.embeddings.text_lengths`: the
    embedder's token counts when it has them), calls ``embedder.embed`` once per batch and
    hands the window's vectors to ``on_vectors(keys, vectors)`` in one call, in submission
    order (on the worker thread: the callback must be thread-safe with respect to your
    data; :class:`~marsys_mem.retrieval.index.FaissIndex` is). Windows are delivered in
    submission order. A key submitted again before the worker took it is coalesced: it
    keeps its place and only the latest text is embedded, so the keys of one window are
    unique. :meth:`flush` waits for everything submitted so far and re-raises the first
    error of the embedder or callback. :meth:`close` delivers what is pending and stops
    the thread.

    Why windows: a model pads every text of a batch to the batch's longest. Real messages
    range from "ok" to paragraphs, so batches cut in arrival order are mostly padding (on
    REALTALK's chat turns 3.5 tokens run per real token; length-sorted across all the
    texts, 1.04), and the model ran at a third of its speed on them.

    Batching: texts often arrive one at a time (a conversation, ``RAGMemory.add`` in a loop).
    A worker that embedded whatever was there would run the model on batches of one or two,
    at a fraction of its batch throughput, and one that took the first ``batch_size`` of a
    burst would pad them in arrival order. So the worker lingers while texts keep coming:
    until they pause for ``linger`` seconds, the window is full, or :data:`LINGER_SPAN`
    lingers have passed; never while a :meth:`flush` (or :meth:`close`) is waiting.

    An error drops its batch (those keys get no vectors; the rest of the window is
    delivered) and the worker carries on.
    When ``max_pending`` items are waiting, :meth:`submit` blocks until the worker catches
    up (back-pressure; not from inside the callback, which never blocks).

    A queue still open when the interpreter exits is cancelled (see the module docs): the
    pending items are dropped (:attr:`cancelled` counts them, with the rest of the window
    being embedded), the batch being embedded is finished and delivered, then ``at_exit``
    is called, so the process exits cleanly.

    Args:
        embedder: any :class:`Embedder`.
        on_vectors: called as ``on_vectors(keys, vectors)`` with ``vectors.shape ==
            (len(keys), embedder.dim)``.
        batch_size: most texts per ``embed`` call.
        window: most waiting texts taken at once and composed into batches by length;
            ``None``: 32 batches. Larger windows waste less padding, and deliver later.
        max_pending: most items waiting before :meth:`submit` blocks.
        linger: seconds the worker waits for a batch to fill up (0: never waits).
        at_exit: called with no arguments if the queue is still open at interpreter exit,
            after its worker stopped (e.g. to save what ``on_vectors`` built); an error it
            raises is logged.

    Raises:
        ValueError: a bad ``batch_size``, ``max_pending`` or ``linger``.

    Example:
        >>> from marsys_mem.retrieval.embeddings import HashingEmbedder
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
        linger: float = 0.05,
        at_exit: Callable[[], object] | None = None,
        window: int | None = None,
    ) -> None:
        if window is None and isinstance(batch_size, int):
            window = 32 * batch_size
        for arg, value in (
            ("batch_size", batch_size),
            ("max_pending", max_pending),
            ("window", window),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{arg} must be an int >= 1, got {value!r}")
        if not isinstance(linger, int | float) or isinstance(linger, bool) or not 0 <= linger <= 10:
            raise ValueError(f"linger must be a number of seconds in [0, 10], got {linger!r}")
        if not callable(on_vectors):
            raise ValueError(f"on_vectors must be callable, got {on_vectors!r}")
        if at_exit is not None and not callable(at_exit):
            raise ValueError(f"at_exit must be callable or None, got {at_exit!r}")
        self._embedder = embedder
        self._on_vectors = on_vectors
        self._at_exit = at_exit
        self._batch_size = batch_size
        self._window = max(window, batch_size)
        self._max_pending = max_pending
        self._linger = float(linger)
        self._flushers = 0  # flush() calls waiting: the worker does not linger for them
        lock = threading.Lock()
        self._has_items = threading.Condition(lock)  # the worker waits on it
        self._progress = threading.Condition(lock)  # flush() and a blocked submit() wait on it
        self._items: OrderedDict[str, str] = OrderedDict()
        self._submitted = 0  # items enqueued (coalesced ones count once)
        self._done = 0  # items delivered, dropped by an error, or cancelled
        self._cancelled = 0  # items dropped unembedded by a cancel
        self._error: tuple[BaseException, list[str]] | None = None
        self._closing = False
        self._cancelling = False  # cancelled: the worker drops the rest of its window
        self._closed = False
        self._exiting = False  # stopped by the exit hook: later submits run inline
        self._pid = os.getpid()
        self._thread = threading.Thread(
            target=self._run, name="marsys-mem-embedding-queue", daemon=True
        )
        self._thread.start()
        self._register()

    @property
    def pending(self) -> int:
        """Items submitted and not delivered yet (including the batch being embedded)."""
        with self._progress:
            return self._submitted - self._done

    @property
    def cancelled(self) -> int:
        """Items dropped without being embedded, by ``close(cancel=True)`` or at exit."""
        with self._progress:
            return self._cancelled

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called (or the queue was stopped at exit)."""
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
        with self._has_items:
            inline = self._exiting
            if not inline:
                self._enqueue_locked(batch)
        if inline:
            self._embed_inline(batch)

    def _enqueue_locked(self, batch: list[tuple[str, str]]) -> None:
        on_worker = threading.current_thread() is self._thread
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

    def _embed_inline(self, batch: list[tuple[str, str]]) -> None:
        """After the exit hook stopped the worker: embed in the caller's thread."""
        latest = list(OrderedDict(batch).items())  # coalesce, as the worker would
        with self._progress:
            self._submitted += len(latest)
        self._deliver(latest, cancellable=False)

    def _run(self) -> None:
        while True:
            with self._has_items:
                while not self._items and not self._closing:
                    self._has_items.wait()
                if not self._items:
                    return
                self._linger_locked()
                n = min(self._window, len(self._items))
                batch = [self._items.popitem(last=False) for _ in range(n)]
                self._progress.notify_all()  # room for blocked submitters
            self._deliver(batch)

    def _linger_locked(self) -> None:
        """Wait (lock held, released while waiting) for more texts while they keep coming.

        A lone text waits at most ``linger`` s for company. Texts that keep arriving (a
        chat's history, ``add`` in a loop) are waited for until they pause for ``linger``
        s, the window is full, or :data:`LINGER_SPAN` lingers have passed, so the window
        is composed from the whole burst instead of its first batch in arrival order.
        """
        full = min(self._window, self._max_pending)
        if len(self._items) >= full or self._linger <= 0:
            return
        now = time.monotonic()
        cap = now + LINGER_SPAN * self._linger
        deadline = now + self._linger
        seen = self._submitted
        while len(self._items) < full and not self._closing and not self._flushers:
            remaining = min(deadline, cap) - time.monotonic()
            if remaining <= 0:
                return
            self._has_items.wait(remaining)
            if self._submitted != seen:  # more came: wait for the next pause
                seen = self._submitted
                deadline = time.monotonic() + self._linger

    def _deliver(self, window: list[tuple[str, str]], *, cancellable: bool = True) -> None:
        """Embed a window in batches of similar lengths; hand its vectors to ``on_vectors``.

        An error drops its batch and is kept for flush(); a cancel (``cancellable``) drops
        the batches not started yet.
        """
        n = len(window)
        texts = [t for _, t in window]
        embedder = self._embedder
        try:
            lengths = text_lengths(embedder, texts)
        except Exception:  # the embedder fails: the batches below report it
            lengths = [len(t) for t in texts]
        vectors: FloatArray | None = None
        done: list[int] = []
        attempted = 0
        for rows in length_batches(lengths, self._batch_size):
            if cancellable and self._cancelling:
                break
            attempted += len(rows)
            try:
                got = check_vectors(embedder.embed([texts[i] for i in rows]), embedder.dim)
                if got.shape[0] != len(rows):
                    raise EmbeddingError(
                        f"the embedder returned {got.shape[0]} rows for {len(rows)} texts"
                    )
            except Exception as exc:
                self._keep_error(exc, [window[i][0] for i in rows])
                continue
            if vectors is None:
                vectors = np.empty((n, got.shape[1]), dtype=np.float32)
            vectors[rows] = got
            done.extend(rows)
        if done:
            assert vectors is not None
            done.sort()  # submission order
            try:
                self._on_vectors([window[i][0] for i in done], vectors[done])
            except Exception as exc:
                self._keep_error(exc, [window[i][0] for i in done])
        with self._progress:
            self._cancelled += n - attempted
            self._done += n
            self._progress.notify_all()

    def _keep_error(self, exc: BaseException, keys: list[str]) -> None:
        with self._progress:
            if self._error is None:
                self._error = (exc, keys)

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
            self._flushers += 1
            if self._done < target:  # a lingering worker goes now (an idle one sleeps on)
                self._has_items.notify()
            try:
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
            finally:
                self._flushers -= 1
        self._raise_error()

    async def aflush(self, timeout: float | None = None) -> None:
        """Async twin of :meth:`flush` (waits in a worker thread)."""
        await asyncio.to_thread(self.flush, timeout)

    def close(self, timeout: float | None = None, *, cancel: bool = False) -> None:
        """Deliver what is pending (or drop it), then stop the worker thread. Idempotent.

        Args:
            timeout: seconds to wait for the worker at most.
            cancel: drop the pending items instead of embedding them (the batch being
                embedded is still delivered); :attr:`cancelled` counts them.

        Raises:
            EmbeddingError: an error not yet reported by :meth:`flush`.
            TimeoutError: the worker did not finish within ``timeout``.
        """
        self._close(timeout, cancel=cancel)
        self._raise_error()

    def _cancel_locked(self) -> int:
        """Drop the pending items and tell the worker to stop; returns how many."""
        n = len(self._items)
        self._items.clear()
        self._cancelling = True
        self._cancelled += n
        self._done += n  # flush() does not wait for them
        self._closing = True
        self._has_items.notify_all()
        self._progress.notify_all()
        return n

    def _close(self, timeout: float | None, *, cancel: bool = False) -> None:
        if threading.current_thread() is self._thread:
            raise RuntimeError("close() called from the on_vectors callback would deadlock")
        with self._has_items:
            if self._closed:
                return
            if cancel:
                self._cancel_locked()
            self._closing = True
            self._has_items.notify_all()
            self._progress.notify_all()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the embedding worker did not stop within {timeout}s")
        with self._has_items:
            self._closed = True
        _unregister(self)

    def _register(self) -> None:
        """Join the registry of open queues; the first queue registers the exit hook."""
        global _hook_registered
        with _live_lock:
            _live.add(self)
            if not _hook_registered:
                atexit.register(self._stop_open_queues)
                _hook_registered = True

    @classmethod
    def _stop_open_queues(cls) -> None:
        """The exit hook: cancel every open queue of this process, wait, run ``at_exit``."""
        pid = os.getpid()
        with _live_lock:
            # a forked child has no workers
            queues = [q for q in _live if q._pid == pid]  # noqa: SLF001 (same class)
        deadline = time.monotonic() + EXIT_TIMEOUT
        for q in queues:
            q._begin_exit()  # noqa: SLF001 (same class)
        for q in queues:
            q._finish_exit(deadline)  # noqa: SLF001 (same class)

    def _begin_exit(self) -> None:
        """Exit hook, step 1 (all queues first): cancel, so every worker winds down at once."""
        with self._has_items:
            self._exiting = True
            n = self._cancel_locked()
        if n:
            log.info("interpreter exit: %d texts not embedded yet were cancelled", n)

    def _finish_exit(self, deadline: float) -> None:
        """Exit hook, step 2: wait for the batch in flight until ``deadline``, run ``at_exit``."""
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            log.warning(
                "interpreter exit: the embedding worker is still busy after %ss "
                "(marsys_mem.retrieval.ingest.EXIT_TIMEOUT); the process may abort",
                EXIT_TIMEOUT,
            )
        else:
            with self._has_items:
                self._closed = True
        _unregister(self)
        if self._at_exit is not None:
            try:
                self._at_exit()
            except Exception:
                log.exception("interpreter exit: the embedding queue's at_exit callback failed")

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
