"""IVFFlat lists kept trained as a PostgreSQL store grows (pgvector).

An IVFFlat index sorts a model's vectors into lists around centroids trained on the
vectors there when it is built; built over a handful it fits nothing, and as the store
grows its lists grow long (a probe scans more) and stop fitting what is stored.
:class:`IvfUpkeep` is how a :class:`~marsys_mem.store.postgres.PostgresStore` opened with
:class:`~marsys_mem.model.hnsw.IvfSettings` keeps them fitting without anybody calling
``rebuild_vector_index``:

* the store tells it how many vectors of each model every committed batch wrote
  (:meth:`IvfUpkeep.wrote`); at a model's first write, and every
  :meth:`~marsys_mem.model.hnsw.IvfSettings.check_every` vectors after that, it looks on
  a thread of its own (the writer does not wait);
* a look takes the database's training lock (a session advisory lock, tried: a look that
  finds another host training gives up, that host trains), counts the model's vectors,
  reads what its lists were trained on (the index's comment) and, when
  :meth:`~marsys_mem.model.hnsw.IvfSettings.due`, builds the index again beside the old
  one and swaps them (:func:`~marsys_mem.store.postgres_search.rebuild_index`);
* an IVFFlat index built before its count was kept gets the count of now, untrained;
  an HNSW index is left alone (``rebuild_vector_index`` switches kinds).

``rebuild_vector_index`` and ``bulk_load`` take the same lock, waiting for it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import psycopg
from psycopg import sql

from marsys_mem.model.hnsw import IvfSettings
from marsys_mem.store.postgres_search import (
    TRAINED_ON,
    SearchSetup,
    count_vectors,
    index_name,
    rebuild_index,
    trained_on,
)

__all__ = ["TRAINING_LOCK", "IvfUpkeep", "training_lock"]

log = logging.getLogger("marsys_mem.store.postgres")

Connection = psycopg.Connection[tuple[Any, ...]]

TRAINING_LOCK = 0x4D4D4956  # pg_advisory_lock id while an index is trained ("MMIV")


@contextmanager
def training_lock(conn: Connection, *, wait: bool = True) -> Iterator[bool]:
    """Hold the database's training lock on ``conn`` (autocommit); whether it was taken.

    ``wait=False``: try once, and yield ``False`` if another session holds it.
    """
    if wait:
        conn.execute("SELECT pg_advisory_lock(%s)", (TRAINING_LOCK,))
        taken = True
    else:
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", (TRAINING_LOCK,)).fetchone()
        taken = bool(row and row[0])
    try:
        yield taken
    finally:
        if taken and not conn.closed:
            conn.execute("SELECT pg_advisory_unlock(%s)", (TRAINING_LOCK,))


class IvfUpkeep:
    """Trains a growing store's IVFFlat lists again when they are due, one host at a time.

    Args:
        connect: opens a new autocommit connection to the store's database (a context
            manager that closes it).

    Example:
        >>> from contextlib import nullcontext
        >>> upkeep = IvfUpkeep(lambda: nullcontext())
        >>> upkeep.wrote(SearchSetup("public"), {"minilm": 10})  # HNSW: nothing to keep
        >>> upkeep.close()
    """

    def __init__(self, connect: Callable[[], AbstractContextManager[Connection]]) -> None:
        self._connect = connect
        self._lock = threading.Lock()
        self._pending: dict[str, int] = {}  # vectors written per model since the last look
        self._thread: threading.Thread | None = None
        self._conn: Connection | None = None  # the look's connection (closing cancels it)
        self._closed = False

    def wrote(self, setup: SearchSetup, counts: Mapping[str, int]) -> None:
        """After a committed batch: the vectors it wrote by model; a look starts when due.

        At a model's first write here, and once :meth:`IvfSettings.check_every` more of
        its vectors were written, a thread looks (:meth:`run`), unless one is looking.
        """
        index = setup.index
        if (
            not counts
            or not isinstance(index, IvfSettings)
            or setup.deferred
            or (index.train_at is None and index.retrain_at is None)
        ):
            return
        every = index.check_every()
        with self._lock:
            if self._closed:
                return
            for model, n in counts.items():
                self._pending[model] = self._pending.get(model, every) + n
            due = [model for model, n in self._pending.items() if n >= every]
            if not due or (self._thread is not None and self._thread.is_alive()):
                return
            for model in due:
                self._pending[model] = 0
            self._thread = threading.Thread(
                target=self._look, args=(setup, due), name="marsys-mem-ivf-upkeep", daemon=True
            )
            self._thread.start()

    def _look(self, setup: SearchSetup, models: list[str]) -> None:
        try:
            self.run(setup, models)
        except Exception as exc:  # a thread of its own: say why, the next look tries again
            if not self._closed:
                log.warning("IVFFlat upkeep of %s failed: %s", ", ".join(models), exc)

    def run(
        self, setup: SearchSetup, models: list[str] | None = None, *, wait: bool = False
    ) -> list[str]:
        """Look now: train the lists of each model (of ``models``; ``None``: all) that is due.

        ``wait``: wait for another host's training to end (else give up to it).

        Returns:
            The models whose index was built.
        """
        index = setup.index
        if not isinstance(index, IvfSettings):
            return []
        with self._connect() as conn:
            with self._lock:
                if self._closed:
                    return []
                self._conn = conn
            try:
                with training_lock(conn, wait=wait) as taken:
                    return self._train_due(conn, setup, index, models) if taken else []
            finally:
                with self._lock:
                    self._conn = None

    def _train_due(
        self, conn: Connection, setup: SearchSetup, index: IvfSettings, models: list[str] | None
    ) -> list[str]:
        trained = []
        rows = conn.execute("SELECT model, dim FROM marsys_vector_models ORDER BY model")
        for model, dim in rows.fetchall():
            if self._closed:
                break
            if models is not None and model not in models:
                continue
            method, count = trained_on(conn, str(model))
            if method not in (None, "ivfflat"):
                continue  # another kind's index: rebuild_vector_index switches kinds
            vectors = count_vectors(conn, str(model))
            if method is not None and count is None:  # built before counts were kept
                conn.execute(
                    sql.SQL("COMMENT ON INDEX {} IS {}").format(
                        sql.Identifier(index_name(str(model))),
                        sql.Literal(f"{TRAINED_ON}{vectors}"),
                    )
                )
                continue
            if not index.due(vectors, count):
                continue
            log.info(
                "training the IVFFlat lists of %r on %d vectors (were: %s)",
                model,
                vectors,
                "none" if count is None else count,
            )
            rebuild_index(conn, setup, str(model), int(dim))
            trained.append(str(model))
        return trained

    def close(self, timeout: float = 10.0) -> None:
        """Stop: cancel a training under way (its half-built index is dropped next time)."""
        with self._lock:
            self._closed = True
            conn, thread = self._conn, self._thread
        if conn is not None:
            try:
                conn.cancel_safe()
            except psycopg.Error:  # already gone
                pass
        if thread is not None:
            thread.join(timeout)
