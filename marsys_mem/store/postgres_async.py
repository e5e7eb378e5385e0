"""PostgresStore's async I/O: a :class:`psycopg_pool.AsyncConnectionPool` per event loop.

The async twins of :class:`~marsys_mem.store.postgres.PostgresStore` run the very batch code
of the sync API (its SQL, transactions, retries, lock and statement timeouts, error
mapping) on the event loop, through :mod:`marsys_mem.store.greenlets`: :class:`AsyncIO` is
the store's I/O seen from that code (a connection from the async pool, ``sleep``, a pool
check), and :class:`SyncFacade` an :class:`psycopg.AsyncConnection` whose ``execute``
looks sync (each call awaits on the loop). No thread is involved.

A pool belongs to the event loop it was opened on (its connections and workers are that
loop's), so :class:`AsyncPools` keeps one per loop, opened on first use (``asyncio.run``
makes a new loop per call), closed when the store closes or when the loop's teardown
cancels its tasks, whichever comes first.

Example:
    >>> pools = AsyncPools("postgresql://localhost/none", min_size=0, max_size=2,
    ...                    kwargs={}, timeout=1.0, reconnect_timeout=1.0)
    >>> pools.close()  # nothing opened yet: nothing to close
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolClosed

from marsys_mem.store.greenlets import await_only

__all__ = ["AsyncIO", "AsyncPools", "SyncFacade"]

AsyncConnection = psycopg.AsyncConnection[tuple[Any, ...]]


class _Cursor:
    """An executed :class:`psycopg.AsyncCursor` whose fetches look sync."""

    def __init__(self, cursor: psycopg.AsyncCursor[tuple[Any, ...]]) -> None:
        self._cursor = cursor

    @property
    def rowcount(self) -> int:
        """Rows the statement touched (as ``psycopg.Cursor.rowcount``)."""
        return self._cursor.rowcount

    def fetchone(self) -> tuple[Any, ...] | None:
        """The next row, or ``None``."""
        return await_only(self._cursor.fetchone())

    def fetchall(self) -> list[tuple[Any, ...]]:
        """The remaining rows."""
        return await_only(self._cursor.fetchall())

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self.fetchall())


class SyncFacade:
    """An async connection seen by sync-style code run by ``run_sync_style``.

    It offers what the store's batch code uses of a :class:`psycopg.Connection`:
    ``execute`` (its result's ``fetchone``, ``fetchall``, ``rowcount`` and iteration),
    ``info``, ``closed`` and ``broken``.

    Example:
        >>> SyncFacade.__name__
        'SyncFacade'
    """

    def __init__(self, conn: AsyncConnection) -> None:
        self._conn = conn

    def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None) -> _Cursor:
        """Run one statement on the event loop; its cursor (already fetched)."""
        return _Cursor(await_only(self._conn.execute(query, params, prepare=prepare)))

    @property
    def info(self) -> psycopg.ConnectionInfo:
        """The connection's :class:`psycopg.ConnectionInfo` (``backend_pid``, ...)."""
        return self._conn.info

    @property
    def closed(self) -> bool:
        """Whether the connection is closed."""
        return self._conn.closed

    @property
    def broken(self) -> bool:
        """Whether the connection was lost."""
        return self._conn.broken


class AsyncIO:
    """The I/O of the store's batch code on the event loop (inside ``run_sync_style``).

    Example:
        >>> AsyncIO.__name__
        'AsyncIO'
    """

    def __init__(self, pool: AsyncConnectionPool[AsyncConnection], tasks: set[Any]) -> None:
        self._pool = pool
        self._tasks = tasks

    @contextmanager
    def connection(self, timeout: float) -> Iterator[SyncFacade]:
        """A connection of the loop's pool, given back (reset) at exit, as the sync pool's."""
        manager = self._pool.connection(timeout=timeout)
        conn = await_only(manager.__aenter__())
        try:
            yield SyncFacade(conn)
        except BaseException:
            if not await_only(manager.__aexit__(*sys.exc_info())):
                raise
        else:
            await_only(manager.__aexit__(None, None, None))

    @staticmethod
    def sleep(seconds: float) -> None:
        """Wait on the event loop (other tasks run meanwhile)."""
        await_only(asyncio.sleep(seconds))

    def check_pool(self) -> None:
        """After a lost connection: drop the pool's dead idle connections (a task)."""
        task = asyncio.get_running_loop().create_task(_check_quietly(self._pool))
        self._tasks.add(task)  # a reference until it is done
        task.add_done_callback(self._tasks.discard)


async def _check_quietly(pool: AsyncConnectionPool[AsyncConnection]) -> None:
    try:
        await pool.check()
    except Exception:  # a closed pool, or the server still down: retried later
        return


async def _close_at_teardown(pool: AsyncConnectionPool[AsyncConnection]) -> None:
    """Wait until the loop's teardown cancels every task (``asyncio.run``), then close ``pool``.

    The pool's workers catch a cancellation that lands while they run a maintenance task
    and wait for more work: cancelled alone, they would keep ``asyncio.run`` from ever
    returning. Closing the pool sends them their stop and closes its connections.
    """
    try:
        await asyncio.get_running_loop().create_future()
    finally:
        await pool.close(timeout=1.0)


class AsyncPools:
    """One :class:`AsyncConnectionPool` per event loop, opened on first use.

    Example:
        >>> AsyncPools.__name__
        'AsyncPools'
    """

    def __init__(self, dsn: str, **settings: Any) -> None:
        self._dsn = dsn
        self._settings = settings
        self._lock = threading.Lock()
        self._pools: dict[asyncio.AbstractEventLoop, AsyncConnectionPool[AsyncConnection]] = {}
        self._closed = False
        self.tasks: set[Any] = set()

    async def get(self) -> AsyncConnectionPool[AsyncConnection]:
        """The running loop's pool (opened now if it has none).

        Raises:
            PoolClosed: :meth:`close` was called.
        """
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._closed:
                raise PoolClosed("the store is closed")
            for old in [lp for lp in self._pools if lp.is_closed()]:
                del self._pools[old]  # its connections close when collected
            pool = self._pools.get(loop)
            if pool is None:
                pool = AsyncConnectionPool(
                    self._dsn, open=False, name="marsys-mem-async", **self._settings
                )
                self._pools[loop] = pool
                opening = True
            else:
                opening = False
        if opening:
            await pool.open(wait=False)
            guard = loop.create_task(_close_at_teardown(pool), name="marsys-mem-async-pool-guard")
            self.tasks.add(guard)
            guard.add_done_callback(self.tasks.discard)
        return pool

    def close(self) -> None:
        """Close every pool whose loop can still run its closing; forget the others."""
        with self._lock:
            self._closed = True
            pools, self._pools = self._pools, {}
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        for loop, pool in pools.items():
            if loop.is_closed():
                continue
            if loop is running:  # closed from sync code inside a coroutine: finish as a task
                task = loop.create_task(pool.close())
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
            elif loop.is_running():  # another thread's loop
                asyncio.run_coroutine_threadsafe(pool.close(), loop)
            else:
                loop.run_until_complete(pool.close())
