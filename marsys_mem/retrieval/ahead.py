"""Work started ahead on a helper thread, which the caller takes over if it has not begun.

A search spends most of its time in the model's forward pass, and ONNX Runtime and PyTorch
let go of the GIL for it, leaving the other core idle. :class:`WorkAhead` puts the work
that does not need the query's vector (the keyword side, the query's time cues) on a
helper thread just before the forward pass, so it is done by the time the vector is.

A job runs exactly once, on whichever thread gets to it first: the helper, or the caller
asking for its result. So a caller never waits for a helper that is late (busy with
another memory's job, or the query vector came from a cache): it runs the job itself.

One helper thread serves the whole process (jobs are short; a second caller that finds it
busy runs its own job). Its thread is a ``concurrent.futures`` worker: it ends when the
interpreter exits, and submitting during shutdown falls back to running in the caller.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Generic, TypeVar

__all__ = ["WorkAhead", "Worker"]

T = TypeVar("T")


class Worker:
    """One background thread for one purpose, started when first used.

    A ``concurrent.futures`` worker: it ends when the interpreter exits (after its current
    job), and :meth:`submit` raises ``RuntimeError`` during shutdown.

    Args:
        name: the thread's name prefix.

    Example:
        >>> Worker("example").submit(sum, [1, 2, 3]).result()
        6
    """

    __slots__ = ("_lock", "_name", "_pool")

    def __init__(self, name: str) -> None:
        self._name = name
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., T], /, *args: Any) -> Future[T]:
        """Run ``fn(*args)`` on the thread, after the jobs before it."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self._name)
            pool = self._pool
        return pool.submit(fn, *args)


_helper = Worker("marsys-mem-ahead")


class WorkAhead(Generic[T]):
    """A job that a helper thread may run ahead of time; :meth:`result` runs it if not.

    Args:
        job: what to run, without arguments; its exception is raised by :meth:`result`.

    Example:
        >>> ahead = WorkAhead.start(lambda: 6 * 7)
        >>> ahead.result()
        42
        >>> WorkAhead(lambda: "not started: the caller runs it").result()
        'not started: the caller runs it'
    """

    __slots__ = ("_claim", "_done", "_error", "_job", "_value")

    def __init__(self, job: Callable[[], T]) -> None:
        self._job: Callable[[], T] | None = job
        self._claim = threading.Lock()  # held by the thread that runs the job, for good
        self._done = threading.Event()
        self._value: T | None = None
        self._error: BaseException | None = None

    @classmethod
    def start(cls, job: Callable[[], T]) -> WorkAhead[T]:
        """Hand ``job`` to the helper thread (or to nobody, during shutdown) and return."""
        ahead = cls(job)
        try:
            _helper.submit(ahead._run)
        except RuntimeError:  # the interpreter is shutting down: the caller will run it
            pass
        return ahead

    def _run(self) -> None:
        if not self._claim.acquire(blocking=False):
            return  # the other thread has it
        job, self._job = self._job, None
        assert job is not None
        try:
            self._value = job()
        except BaseException as exc:  # handed to the caller by result()
            self._error = exc
        finally:
            self._done.set()

    def result(self) -> T:
        """The job's value: running it here unless it has begun elsewhere, then waiting.

        Raises:
            BaseException: whatever the job raised.
        """
        self._run()
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]
