"""Who said what before and after: each message's neighbours in its conversation thread.

A reply such as "Yes! That's the one I told you about" means little on its own; its
meaning lives in the turn before it. :class:`ThreadLinks` keeps, for every indexed message,
the previous and next message of the same *thread* (in the order they were added), so
retrieval can score a message together with its context and consider the turns around a
hit. Removing a message links its neighbours to each other.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["ThreadLinks"]


class ThreadLinks:
    """Doubly linked threads of message ids, in the order they were added.

    Not thread-safe: callers serialise access (``RAGMemory`` does).

    Example:
        >>> links = ThreadLinks()
        >>> for mid, thread in [("a", "t1"), ("x", "t2"), ("b", "t1"), ("c", "t1")]:
        ...     links.add(mid, thread)
        >>> links.before("c", 2), links.after("a", 1), links.before("x", 1)
        (['b', 'a'], ['b'], [])
        >>> links.remove("b")
        >>> links.before("c", 2), links.thread_of("c")
        (['a'], 't1')
    """

    __slots__ = ("_next", "_prev", "_tail", "_thread")

    def __init__(self) -> None:
        self._prev: dict[str, str | None] = {}
        self._next: dict[str, str | None] = {}
        self._tail: dict[str, str] = {}  # thread -> its last message
        self._thread: dict[str, str] = {}  # message -> thread

    def __len__(self) -> int:
        return len(self._thread)

    def __contains__(self, mid: object) -> bool:
        return mid in self._thread

    def add(self, mid: str, thread: str) -> None:
        """Append ``mid`` to the end of ``thread``.

        Raises:
            ValueError: ``mid`` is already linked.
        """
        if mid in self._thread:
            raise ValueError(f"message {mid!r} is already in a thread")
        last = self._tail.get(thread)
        self._prev[mid] = last
        self._next[mid] = None
        if last is not None:
            self._next[last] = mid
        self._tail[thread] = mid
        self._thread[mid] = thread

    def remove(self, mid: str) -> None:
        """Unlink ``mid`` (its neighbours become each other's); unknown ids are ignored."""
        thread = self._thread.pop(mid, None)
        if thread is None:
            return
        before = self._prev.pop(mid)
        after = self._next.pop(mid)
        if before is not None:
            self._next[before] = after
        if after is not None:
            self._prev[after] = before
        elif before is not None:
            self._tail[thread] = before
        else:
            del self._tail[thread]

    def clear(self) -> None:
        """Forget every message."""
        self._prev.clear()
        self._next.clear()
        self._tail.clear()
        self._thread.clear()

    def thread_of(self, mid: str) -> str | None:
        """The thread of ``mid`` (``None`` if it is not linked)."""
        return self._thread.get(mid)

    def before(self, mid: str, n: int) -> list[str]:
        """Up to ``n`` messages before ``mid`` in its thread, nearest first."""
        return self._walk(self._prev, mid, n)

    def after(self, mid: str, n: int) -> list[str]:
        """Up to ``n`` messages after ``mid`` in its thread, nearest first."""
        return self._walk(self._next, mid, n)

    def around(self, ids: Iterable[str], before: int, after: int) -> list[str]:
        """``ids`` and the messages up to ``before``/``after`` turns around them, deduplicated."""
        out: dict[str, None] = {}
        for mid in ids:
            out[mid] = None
            for other in self._walk(self._prev, mid, before):
                out[other] = None
            for other in self._walk(self._next, mid, after):
                out[other] = None
        return list(out)

    @staticmethod
    def _walk(links: dict[str, str | None], mid: str, n: int) -> list[str]:
        out: list[str] = []
        cur = links.get(mid)
        while cur is not None and len(out) < n:
            out.append(cur)
            cur = links.get(cur)
        return out
