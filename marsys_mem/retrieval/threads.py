"""Who said what before and after: each message's neighbours in its conversation thread.

A reply such as "Yes! That's the one I told you about" means little on its own; its
meaning lives in the turn before it. :class:`ThreadLinks` keeps, for every indexed message,
the previous and next message of the same *thread* (in the order they were added), so
retrieval can score a message together with its context and consider the turns around a
hit. Removing a message links its neighbours to each other.

The links live in integer arrays (one *slot* per message), so the neighbours of hundreds
of candidates are found with a few array lookups (:meth:`ThreadLinks.slots`,
:meth:`ThreadLinks.walk`, :meth:`ThreadLinks.around_slots`) instead of a Python loop each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["LabelSlots", "SlotMemo", "ThreadLinks", "distinct"]

SlotArray = npt.NDArray[np.intp]

_UNSEEN = np.iinfo(np.intp).max  # a cell of ThreadLinks._first that no position filled


def distinct(values: SlotArray) -> tuple[SlotArray, SlotArray]:
    """The distinct ``values`` (ascending) and where each of ``values`` went among them.

    ``np.unique(values, return_inverse=True)``, by one stable sort: numpy's own hashes
    integers first, which costs more for the few thousand values of a search.

    Example:
        >>> unique, where = distinct(np.array([7, -1, 3, 7]))
        >>> unique.tolist(), where.tolist()
        ([-1, 3, 7], [2, 0, 1, 2])
    """
    order = np.argsort(values, kind="stable")
    ranked = values[order]
    new = np.empty(len(values), dtype=bool)
    new[:1] = True
    np.not_equal(ranked[1:], ranked[:-1], out=new[1:])
    where = np.empty(len(values), dtype=np.intp)
    where[order] = np.cumsum(new) - 1
    return ranked[new], where


class ThreadLinks:
    """Doubly linked threads of message ids, in the order they were added.

    Each linked message has a slot; ``-1`` stands for "no such message" in the slot arrays.
    Not thread-safe: callers serialise access (``RAGMemory`` does).

    Example:
        >>> links = ThreadLinks()
        >>> for mid, thread in [("a", "t1"), ("x", "t2"), ("b", "t1"), ("c", "t1")]:
        ...     links.add(mid, thread)
        >>> links.before("c", 2), links.after("a", 1), links.before("x", 1)
        (['b', 'a'], ['b'], [])
        >>> links.walk(links.slots(["c", "x"]), 1, forward=False).tolist()
        [[2, -1]]
        >>> links.ids_of(links.around_slots(links.slots(["b"]), before=1, after=1))
        ['b', 'a', 'c']
        >>> links.remove("b")
        >>> links.before("c", 2), links.thread_of("c")
        (['a'], 't1')
    """

    __slots__ = (
        "_added",
        "_at",
        "_first",
        "_free",
        "_ids",
        "_mark",
        "_next",
        "_prev",
        "_serial",
        "_slot",
        "_tail",
        "_thread",
        "_thread_no",
        "_thread_nos",
    )

    def __init__(self) -> None:
        self._slot: dict[str, int] = {}  # message -> slot
        self._ids: npt.NDArray[np.object_] = np.full(65, None, dtype=object)  # slot -> message
        self._thread: list[str | None] = []  # slot -> thread
        self._free: list[int] = []
        self._tail: dict[str, int] = {}  # thread -> slot of its last message
        # slot -> previous / next slot in the thread; the last cell stays -1, so that
        # indexing with -1 ("no such message") gives -1 again
        self._prev: SlotArray = np.full(65, -1, dtype=np.intp)
        self._next: SlotArray = np.full(65, -1, dtype=np.intp)
        # slot -> serial number of the add that filled it (a slot reused gets a new one)
        self._serial: npt.NDArray[np.int64] = np.full(65, -1, dtype=np.int64)
        # slot -> number of its thread (numbers are never reused; -1: empty slot)
        self._thread_no: SlotArray = np.full(65, -1, dtype=np.intp)
        self._thread_nos: dict[str, int] = {}  # thread -> its number
        self._added = 0
        # scratch arrays of around_slots and positions, one cell per slot (and the -1
        # cell): allocated and cleared once, not per search (a fresh array the size of
        # the links costs more than the work on it); each call leaves them as it found them
        self._first: SlotArray = np.zeros(0, dtype=np.intp)  # all _UNSEEN
        self._mark: npt.NDArray[np.bool_] = np.zeros(0, dtype=bool)  # all False
        self._at: SlotArray = np.zeros(0, dtype=np.intp)  # any values

    @classmethod
    def of(
        cls, ids: Sequence[str], threads: Sequence[str], linked: Sequence[bool] | None = None
    ) -> ThreadLinks:
        """Links of ``ids`` in this order, as :meth:`add` of each in turn would make them.

        ``threads[i]`` is ``ids[i]``'s thread and ``linked[i]`` its ``linked`` (``None``: all
        linked); ``ids[i]`` gets slot ``i``. One pass in arrays rather than an add per
        message: for the few thousand turns a store's search ranks.

        Raises:
            ValueError: an id is given twice, or the lengths differ.

        Example:
            >>> links = ThreadLinks.of(["a", "b", "c"], ["t1", "t2", "t1"])
            >>> links.before("c", 2), links.thread_of("b")
            (['a'], 't2')
        """
        n = len(ids)
        if len(threads) != n or (linked is not None and len(linked) != n):
            raise ValueError(f"{n} ids, {len(threads)} threads and linked of another length")
        links = cls()
        slot = dict(zip(ids, range(n), strict=True))
        if len(slot) != n:
            raise ValueError("an id is given twice: each message is in one thread once")
        if not n:
            return links
        links._slot = slot
        links._ids = np.array([*ids, None], dtype=object)
        links._thread = list(threads)
        nos = links._thread_nos
        number = np.fromiter((nos.setdefault(t, len(nos)) for t in threads), np.intp, n)
        links._thread_no = np.append(number, -1)
        links._serial = np.append(np.arange(n, dtype=np.int64), -1)
        links._added = n
        links._prev = np.full(n + 1, -1, dtype=np.intp)
        links._next = np.full(n + 1, -1, dtype=np.intp)
        chained = np.arange(n) if linked is None else np.flatnonzero(np.asarray(linked, bool))
        order = chained[np.argsort(number[chained], kind="stable")]  # by thread, then slot
        same = number[order[1:]] == number[order[:-1]]
        links._prev[order[1:][same]] = order[:-1][same]
        links._next[order[:-1][same]] = order[1:][same]
        last = order[np.append(~same, True)]  # each thread's last linked message
        links._tail = {links._thread[i]: i for i in last.tolist()}
        return links

    def __len__(self) -> int:
        return len(self._slot)

    def __contains__(self, mid: object) -> bool:
        return mid in self._slot

    def add(self, mid: str, thread: str, *, slot: int | None = None, linked: bool = True) -> None:
        """Append ``mid`` to the end of ``thread``.

        Args:
            mid: the message.
            thread: its thread.
            slot: the slot to give it (free or new): for a caller that keeps these slots
                equal to another index's (``RAGMemory`` uses BM25's, so that a candidate's
                slot reads its keyword score directly). Default: a free slot, else a new one.
            linked: ``False``: ``mid`` belongs to ``thread`` (:meth:`thread_numbers`) but
                has no neighbours, and the next message added to the thread follows the
                one before it: for a turn read without the turns around it (a store's
                candidate), whose neighbours in this thread would be other turns.

        Raises:
            ValueError: ``mid`` is already linked, or ``slot`` is taken or negative.
        """
        if mid in self._slot:
            raise ValueError(f"message {mid!r} is already in a thread")
        if slot is None:
            slot = self._free[-1] if self._free else len(self._thread)
        elif slot < 0 or (slot < len(self._thread) and self._thread[slot] is not None):
            raise ValueError(f"slot {slot} is taken or negative")
        if slot < len(self._thread):  # a free slot
            if self._free and self._free[-1] == slot:
                self._free.pop()
            else:
                self._free.remove(slot)
        else:
            skipped = range(len(self._thread), slot)  # slots skipped over are free
            self._free[:0] = reversed(skipped)
            self._thread.extend([None] * len(skipped))
            self._thread.append(thread)
            if slot >= len(self._prev) - 1:
                size = max(len(self._prev), slot + 3 - len(self._prev))  # keep a last -1 cell
                grow = np.full(size, -1, dtype=np.intp)
                self._prev = np.concatenate([self._prev[:-1], grow])
                self._next = np.concatenate([self._next[:-1], grow])
                self._ids = np.concatenate([self._ids[:-1], np.full(len(grow), None)])
                self._serial = np.concatenate([self._serial[:-1], grow.astype(np.int64)])
                self._thread_no = np.concatenate([self._thread_no[:-1], grow])
        self._ids[slot] = mid
        self._thread[slot] = thread
        self._serial[slot] = self._added
        self._thread_no[slot] = self._thread_nos.setdefault(thread, len(self._thread_nos))
        self._added += 1
        self._slot[mid] = slot
        self._next[slot] = -1
        if not linked:
            self._prev[slot] = -1
            return
        last = self._tail.get(thread, -1)
        self._prev[slot] = last
        if last >= 0:
            self._next[last] = slot
        self._tail[thread] = slot

    def remove(self, mid: str) -> None:
        """Unlink ``mid`` (its neighbours become each other's); unknown ids are ignored."""
        slot = self._slot.pop(mid, None)
        if slot is None:
            return
        thread = self._thread[slot]
        assert thread is not None
        before = int(self._prev[slot])
        after = int(self._next[slot])
        if before >= 0:
            self._next[before] = after
        if after >= 0:
            self._prev[after] = before
        if self._tail.get(thread) == slot:  # (a message added unlinked never is)
            if before >= 0:
                self._tail[thread] = before
            else:
                del self._tail[thread]
        self._prev[slot] = self._next[slot] = -1
        self._ids[slot] = None
        self._thread[slot] = None
        self._thread_no[slot] = -1
        self._free.append(slot)

    def clear(self) -> None:
        """Forget every message."""
        self._slot.clear()
        self._ids = np.full(65, None, dtype=object)
        self._thread.clear()
        self._free.clear()
        self._tail.clear()
        self._prev = np.full(65, -1, dtype=np.intp)
        self._next = np.full(65, -1, dtype=np.intp)
        self._serial = np.full(65, -1, dtype=np.int64)
        self._thread_no = np.full(65, -1, dtype=np.intp)
        self._thread_nos.clear()

    def thread_of(self, mid: str) -> str | None:
        """The thread of ``mid`` (``None`` if it is not linked)."""
        slot = self._slot.get(mid)
        return None if slot is None else self._thread[slot]

    def before(self, mid: str, n: int) -> list[str]:
        """Up to ``n`` messages before ``mid`` in its thread, nearest first."""
        return self._walk_one(self._prev, mid, n)

    def after(self, mid: str, n: int) -> list[str]:
        """Up to ``n`` messages after ``mid`` in its thread, nearest first."""
        return self._walk_one(self._next, mid, n)

    def around(self, ids: Iterable[str], before: int, after: int) -> list[str]:
        """``ids`` and the messages up to ``before``/``after`` turns around them, deduplicated.

        Unknown ids are kept (with no neighbours).
        """
        out: dict[str, None] = {}
        for mid in ids:
            out[mid] = None
            for other in self._walk_one(self._prev, mid, before):
                out[other] = None
            for other in self._walk_one(self._next, mid, after):
                out[other] = None
        return list(out)

    # ------------------------------------------------------------------ slot arrays
    def slots(self, ids: Sequence[str]) -> SlotArray:
        """The slots of ``ids`` (``-1`` for an id that is not linked)."""
        get = self._slot.get
        return np.fromiter((get(mid, -1) for mid in ids), dtype=np.intp, count=len(ids))

    def ids_of(self, slots: SlotArray) -> list[str]:
        """The message of each slot (of linked messages: not ``-1``)."""
        ids: list[str] = self._ids[slots].tolist()
        return ids

    def serials(self, slots: SlotArray) -> npt.NDArray[np.int64]:
        """Which add filled each slot: a number never given twice (even by :meth:`clear`)."""
        out: npt.NDArray[np.int64] = self._serial[slots]
        return out

    def thread_numbers(self, slots: SlotArray) -> SlotArray:
        """The number of each slot's thread: equal numbers, same thread (``-1``: no message)."""
        out: SlotArray = self._thread_no[slots]
        return out

    @property
    def capacity(self) -> int:
        """One more than the largest slot there can be now."""
        return len(self._prev)

    def walk(self, slots: SlotArray, n: int, *, forward: bool) -> SlotArray:
        """Shape ``(n, len(slots))``: row ``i`` holds the turn ``i + 1`` steps away, or -1."""
        links = self._next if forward else self._prev
        out = np.empty((n, len(slots)), dtype=np.intp)
        cur = slots
        for i in range(n):
            cur = links[cur]
            out[i] = cur
        return out

    def around_slots(self, slots: SlotArray, before: int, after: int) -> SlotArray:
        """:meth:`around` on slots: each linked slot, then its turns before and after, deduplicated.

        The order is :meth:`around`'s (first occurrence); ``-1`` slots are dropped.
        """
        grid = np.concatenate(
            [
                slots[None, :],
                self.walk(slots, before, forward=False),
                self.walk(slots, after, forward=True),
            ]
        ).T.ravel()
        grid = grid[grid >= 0]
        # first occurrences without sorting: each slot's smallest position in the grid
        where = np.arange(len(grid))
        first = self._first
        if len(first) < len(self._prev):
            first = self._first = np.full(len(self._prev), _UNSEEN, dtype=np.intp)
        np.minimum.at(first, grid, where)
        out: SlotArray = grid[first[grid] == where]
        first[out] = _UNSEEN
        return out

    def positions(self, slots: SlotArray) -> tuple[SlotArray, SlotArray]:
        """The linked slots among ``slots`` (sorted, once each), and where each slot went.

        Returns ``(unique, where)``: ``where[i]`` is the position of ``slots[i]`` in
        ``unique``, or ``len(unique)`` for ``-1`` (a spare cell for "no such message").
        """
        size = len(self._prev)
        if 16 * len(slots) < size:  # a few slots of a big index: sorted, not marked
            unique, where = distinct(slots)
            if len(unique) and unique[0] < 0:  # -1 (no message) sorts first: the spare cell
                unique = unique[1:]
                where -= 1
                where[where < 0] = len(unique)
            return unique, where
        mark, at = self._mark, self._at
        if len(mark) < size:
            mark = self._mark = np.zeros(size, dtype=bool)
            at = self._at = np.zeros(size, dtype=np.intp)
        mark[slots] = True
        mark[-1] = False
        unique = mark.nonzero()[0]
        mark[unique] = False
        at[unique] = np.arange(len(unique))
        at[-1] = len(unique)
        return unique, at[slots]

    def _walk_one(self, links: SlotArray, mid: str, n: int) -> list[str]:
        out: list[str] = []
        slot = self._slot.get(mid)
        if slot is None:
            return out
        ids = self._ids
        cur = int(links[slot])
        while cur >= 0 and len(out) < n:
            found = ids[cur]
            assert found is not None
            out.append(found)
            cur = int(links[cur])
        return out


class SlotMemo:
    """An integer looked up once per message by id (a BM25 slot, a vector label), by slot.

    Looking up hundreds of ids in dicts costs about 0.3 us each when the dicts are cold
    (every search); the memo keeps each message's value in an array indexed by its
    :class:`ThreadLinks` slot, valid while the slot holds the same add (its serial) and,
    optionally, while a check passes (a vector label is replaced when the message is
    embedded again). Not thread-safe: callers serialise access.

    Example:
        >>> links = ThreadLinks()
        >>> links.add("a", "t"); links.add("b", "t")
        >>> memo, asked = SlotMemo(), []
        >>> def lookup(ids):
        ...     asked.extend(ids)
        ...     return np.array([ord(i) for i in ids])
        >>> memo.get(links, links.slots(["a", "b"]), lookup).tolist()
        [97, 98]
        >>> memo.get(links, links.slots(["b"]), lookup).tolist(), asked
        ([98], ['a', 'b'])
        >>> links.remove("b"); links.add("c", "t")  # "c" reuses the slot of "b"
        >>> memo.get(links, links.slots(["c"]), lookup).tolist(), asked
        ([99], ['a', 'b', 'c'])
    """

    __slots__ = ("_serial", "_value")

    def __init__(self) -> None:
        self._serial: npt.NDArray[np.int64] = np.full(0, -1, dtype=np.int64)
        self._value: npt.NDArray[np.int64] = np.full(0, -1, dtype=np.int64)

    def get(
        self,
        links: ThreadLinks,
        slots: SlotArray,
        lookup: Callable[[list[str]], npt.NDArray[Any]],
        valid: Callable[[npt.NDArray[np.int64]], npt.NDArray[np.bool_]] | None = None,
    ) -> npt.NDArray[np.int64]:
        """The value of each of ``slots`` (linked slots: not ``-1``).

        Args:
            links: the thread links the slots belong to.
            slots: the slots.
            lookup: the values of message ids (called only for the slots not memoised).
            valid: which memoised values still hold (the others are looked up again).
        """
        if len(self._serial) < links.capacity:
            grow = links.capacity - len(self._serial)
            self._serial = np.concatenate([self._serial, np.full(grow, -1, dtype=np.int64)])
            self._value = np.concatenate([self._value, np.full(grow, -1, dtype=np.int64)])
        serials = links.serials(slots)
        values = self._value[slots]
        fresh = self._serial[slots] == serials
        if valid is not None:
            fresh &= valid(values)
        if not np.logical_and.reduce(fresh):
            stale = ~fresh
            missing = slots[stale]
            found = np.asarray(lookup(links.ids_of(missing)), dtype=np.int64)
            self._value[missing] = found
            self._serial[missing] = serials[stale]
            values[stale] = found
        return values


class LabelSlots:
    """The :class:`ThreadLinks` slot of each vector label, memoised by label.

    A vector label names one stored vector of one message and is never reused (see
    :meth:`~marsys_mem.retrieval.index.FaissIndex.labels`), so a label's slot holds while
    the slot holds the same add (its serial). Mapping a search's labels through this memo
    skips a dict lookup per hit from label to id and from id to slot. Not thread-safe:
    callers serialise access.

    Example:
        >>> links = ThreadLinks()
        >>> links.add("a", "t"); links.add("b", "t")
        >>> memo, asked = LabelSlots(), []
        >>> def ids_of(labels):
        ...     asked.extend(labels.tolist())
        ...     return ["ab"[label] for label in labels.tolist()]
        >>> memo.get(links, np.array([1, 0]), ids_of).tolist()
        [1, 0]
        >>> memo.get(links, np.array([1]), ids_of).tolist(), asked
        ([1], [1, 0])
        >>> links.remove("b"); links.add("b", "t")  # the same id, a new add
        >>> memo.get(links, np.array([1]), ids_of).tolist(), asked
        ([1], [1, 0, 1])
    """

    __slots__ = ("_serial", "_slot")

    def __init__(self) -> None:
        self._slot: SlotArray = np.full(0, -1, dtype=np.intp)
        self._serial: npt.NDArray[np.int64] = np.full(0, -1, dtype=np.int64)

    def get(
        self,
        links: ThreadLinks,
        labels: npt.NDArray[np.int64],
        ids_of: Callable[[npt.NDArray[np.int64]], list[str]],
    ) -> SlotArray:
        """The slot of the message of each label (``-1``: not linked).

        Args:
            links: the thread links the slots belong to.
            labels: live vector labels (``>= 0``).
            ids_of: the message id of each label (called only for the labels not memoised).
        """
        top = int(np.maximum.reduce(labels)) if len(labels) else -1
        if top >= len(self._slot):
            grow = top + 1 - len(self._slot)
            self._slot = np.concatenate([self._slot, np.full(grow, -1, dtype=np.intp)])
            self._serial = np.concatenate([self._serial, np.full(grow, -1, dtype=np.int64)])
        slots = self._slot[labels]
        fresh = (slots >= 0) & (links.serials(slots) == self._serial[labels])
        if not np.logical_and.reduce(fresh):
            stale = ~fresh
            missing = labels[stale]
            found = links.slots(ids_of(missing))
            self._slot[missing] = found
            self._serial[missing] = links.serials(found)
            slots[stale] = found
        return slots
