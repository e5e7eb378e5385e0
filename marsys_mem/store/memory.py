"""In-process store: dictionaries behind a lock, all-or-nothing batches.

:class:`InMemoryStore` keeps, per key, the messages in append order and the set of their
ids. A batch never touches the committed state while it runs: every operation works on a
draft of the keys it affects (appends collect a pending tail, deletions work on a private
copy of the key's list), and the drafts are swapped in only when every operation of the
batch has succeeded. A failed batch leaves the store exactly as it was.

Messages are immutable, so the store keeps the objects it is given (no copies, no
serialisation): an append costs O(messages appended), a load O(messages returned).

Vectors (:mod:`marsys_mem.store.vectors`) are written to the committed state as the batch
runs, with an undo log that a failed batch replays backwards (the store lock keeps every
reader out meanwhile). Messages and vectors share one store-wide counter, their cursor.
"""

from __future__ import annotations

import bisect
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from marsys_mem.exceptions import DuplicateMessageError, MessageNotFoundError, StoreError
from marsys_mem.model.messages import Message
from marsys_mem.model.runs import RunSnapshot
from marsys_mem.store.base import (
    Append,
    CountMessages,
    Delete,
    EnforceRetention,
    ExpectLast,
    Key,
    ListKeys,
    ListRuns,
    Load,
    LoadAfter,
    LoadAround,
    LoadDeletions,
    LoadRun,
    LoadVectors,
    MemoryStore,
    Op,
    PutVectors,
    SaveRun,
    conflict_error,
    messages_around,
)
from marsys_mem.store.owners import DELETION_LOG_SIZE, DeletionPage
from marsys_mem.store.retention import evicted
from marsys_mem.store.vectors import MessagePage, VectorPage, empty_vectors

__all__ = ["InMemoryStore"]


class _Draft:
    """The state of one key during a batch, over the committed list (never mutated).

    Until something is deleted the draft only collects appended messages in ``tail``;
    the first deletion materialises a private copy of the whole list.
    """

    __slots__ = ("base", "base_ids", "ids", "messages", "tail", "tail_ids")

    def __init__(self, base: list[Message], base_ids: set[str]) -> None:
        self.base = base
        self.base_ids = base_ids
        self.tail: list[Message] = []
        self.tail_ids: set[str] = set()
        self.messages: list[Message] | None = None  # the private copy, once materialised
        self.ids: set[str] | None = None

    def __contains__(self, message_id: str) -> bool:
        if self.ids is not None:
            return message_id in self.ids
        return message_id in self.base_ids or message_id in self.tail_ids

    def __len__(self) -> int:
        if self.messages is not None:
            return len(self.messages)
        return len(self.base) + len(self.tail)

    def view(self) -> Sequence[Message]:
        """Current messages, oldest first (read only)."""
        if self.messages is not None:
            return self.messages
        return self.base + self.tail if self.tail else self.base

    def append(self, messages: Iterable[Message]) -> None:
        if self.messages is not None and self.ids is not None:
            for m in messages:
                self.messages.append(m)
                self.ids.add(m.message_id)
        else:
            for m in messages:
                self.tail.append(m)
                self.tail_ids.add(m.message_id)

    def replace(self, kept: list[Message]) -> None:
        """Make ``kept`` the key's messages (a deletion)."""
        self.messages = kept
        self.ids = {m.message_id for m in kept}
        self.tail = []
        self.tail_ids = set()


_Row = tuple[Key, str, npt.NDArray[np.float32]]


class _ModelVectors:
    """One model's vectors: rows by cursor (write order) and the cursor of each message.

    ``seqs`` is sorted and may hold cursors of rows since deleted (skipped on reading,
    dropped by :meth:`compact`), so a deletion costs O(1) and a catch-up O(rows after it).
    """

    __slots__ = ("dim", "rows", "seqs", "where")

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.seqs: list[int] = []
        self.rows: dict[int, _Row] = {}
        self.where: dict[tuple[Key, str], int] = {}

    def compact(self) -> None:
        if len(self.seqs) > 2 * len(self.rows) + 64:
            self.seqs = [s for s in self.seqs if s in self.rows]


Record = tuple[Key, str]
"""A stored message (or derived record): its key and id."""


class _State:
    """The committed contents of an :class:`InMemoryStore` (read and swapped by batches).

    Ownership (:mod:`marsys_mem.store.owners`): ``owners`` maps a derived record to its
    sources, ``derived`` a source to the records derived from it; ``deletions`` is the
    log, whose first entry has cursor ``deletions_first``.
    """

    __slots__ = (
        "copies",
        "deletions",
        "deletions_first",
        "derived",
        "ids",
        "messages",
        "owners",
        "runs",
        "seq",
        "seqs",
        "vectors",
    )

    def __init__(self) -> None:
        self.messages: dict[Key, list[Message]] = {}
        self.ids: dict[Key, set[str]] = {}
        self.runs: dict[str, RunSnapshot] = {}
        self.seq = 0  # the last cursor handed out (messages and vectors share it)
        self.seqs: dict[Key, dict[str, int]] = {}  # key -> message id -> its cursor
        self.vectors: dict[str, _ModelVectors] = {}
        self.copies: dict[Key, set[Key]] = {}  # key -> the keys holding copies of it
        self.owners: dict[Record, set[Record]] = {}
        self.derived: dict[Record, set[Record]] = {}
        self.deletions: deque[Record] = deque()
        self.deletions_first = 1


class InMemoryStore(MemoryStore):
    """A :class:`~marsys_mem.store.base.MemoryStore` in process memory (nothing survives it).

    Thread-safe (one lock around each batch) and all-or-nothing: a batch works on drafts of
    the keys it touches and commits them only when every operation succeeded.

    Example:
        >>> from marsys_mem.model.messages import Message
        >>> store = InMemoryStore()
        >>> key = ("default", "researcher", "main")
        >>> store.append_messages(key, [Message.user("hi"), Message.assistant("hello")])
        >>> [m.text for m in store.load_messages(key, last=1)]
        ['hello']
        >>> store.count_messages(key), store.list_keys()
        (2, [('default', 'researcher', 'main')])
    """

    supports_vectors: ClassVar[bool] = True

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = _State()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self._state.messages)} keys"
        return f"InMemoryStore({state})"

    # ------------------------------------------------------------------ core
    def _batch(self, ops: Sequence[Op]) -> list[Any]:
        with self._lock:
            if self.closed:
                raise StoreError("InMemoryStore is closed")
            return _Transaction(self._state).run(ops)

    def close(self) -> None:
        """Drop everything and refuse further calls (``StoreError``). Idempotent."""
        with self._lock:
            self.closed = True
            self._state = _State()


class _Transaction:
    """One batch against an :class:`InMemoryStore`'s state; run with the store's lock held."""

    def __init__(self, state: _State) -> None:
        self.state = state
        self.drafts: dict[Key, _Draft] = {}
        self.runs: dict[str, RunSnapshot] | None = None  # a private copy once written
        self.new_seqs: dict[Key, dict[str, int]] = {}  # cursors of appended messages
        self.undo: list[tuple[str, str, int, _Row | None]] = []  # vector writes, to revert
        self.undo_links: list[tuple[bool, Record, Record]] = []  # (added, record, source)
        self.logged = 0  # deletions this batch appended to the log
        self.undo_copies: list[tuple[Key, Key]] = []  # (owner, key) registered by this batch

    # ------------------------------------------------------------------ state access
    def draft(self, key: Key) -> _Draft:
        found = self.drafts.get(key)
        if found is None:
            base = self.state.messages.get(key)
            base_ids = self.state.ids.get(key)
            found = _Draft(base if base is not None else [], base_ids or set())
            self.drafts[key] = found
        return found

    def current(self, key: Key) -> Sequence[Message]:
        found = self.drafts.get(key)
        if found is not None:
            return found.view()
        return self.state.messages.get(key, [])

    def count(self, key: Key) -> int:
        """Messages under ``key`` as this batch sees them (O(1))."""
        found = self.drafts.get(key)
        if found is not None:
            return len(found)
        return len(self.state.messages.get(key, ()))

    def last_id(self, key: Key) -> str | None:
        """The id of ``key``'s newest message as this batch sees it (O(1))."""
        found = self.drafts.get(key)
        if found is None:
            messages: Sequence[Message] = self.state.messages.get(key, ())
        elif found.messages is not None:
            messages = found.messages
        else:
            messages = found.tail or found.base
        return messages[-1].message_id if messages else None

    def keys(self) -> set[Key]:
        keys = set(self.state.messages)
        keys.update(self.drafts)
        return keys

    def run_map(self) -> dict[str, RunSnapshot]:
        return self.runs if self.runs is not None else self.state.runs

    # ------------------------------------------------------------------ batch
    def run(self, ops: Sequence[Op]) -> list[Any]:
        try:
            results = [self.execute(op) for op in ops]
        except BaseException:
            self.revert()
            raise
        self.commit()
        return results

    def revert(self) -> None:
        """Undo this batch's vector writes and link changes, newest first."""
        for _ in range(self.logged):
            self.state.deletions.pop()
        for owner, key in self.undo_copies:
            self.state.copies[owner].discard(key)
        for added, record, source in reversed(self.undo_links):
            if added:
                self._unlink(record, source)
            else:
                self._link(record, source)
        vectors = self.state.vectors
        for action, model, seq, row in reversed(self.undo):
            mv = vectors[model]
            if action == "model":
                del vectors[model]
            elif action == "add":
                key, mid, _ = mv.rows.pop(seq)
                del mv.where[(key, mid)]
                if mv.seqs and mv.seqs[-1] == seq:
                    mv.seqs.pop()
            else:  # "del": put the row back where it was
                assert row is not None
                mv.rows[seq] = row
                mv.where[(row[0], row[1])] = seq

    def commit(self) -> None:
        messages, ids = self.state.messages, self.state.ids
        for key, new in self.new_seqs.items():
            self.state.seqs.setdefault(key, {}).update(new)
        for model in {model for _, model, _, _ in self.undo}:
            found = self.state.vectors.get(model)
            if found is not None:
                found.compact()
        for key, d in self.drafts.items():
            if d.messages is not None and d.ids is not None:  # a deletion: forget cursors
                seqs = self.state.seqs.get(key, {})
                self.state.seqs[key] = {mid: seqs[mid] for mid in d.ids}
            if d.messages is not None and d.ids is not None:
                if d.messages:
                    messages[key], ids[key] = d.messages, d.ids
                else:
                    messages.pop(key, None)
                    ids.pop(key, None)
                    self.state.seqs.pop(key, None)
            elif d.tail:
                if key in messages:
                    messages[key].extend(d.tail)
                    ids[key].update(d.tail_ids)
                else:
                    messages[key], ids[key] = d.tail, d.tail_ids
        if self.runs is not None:
            self.state.runs = self.runs
        log = self.state.deletions
        while len(log) > DELETION_LOG_SIZE:
            log.popleft()
            self.state.deletions_first += 1

    def execute(self, op: Op) -> Any:
        if isinstance(op, Append):
            return self.append(op)
        if isinstance(op, Load):
            return self.load(op)
        if isinstance(op, LoadAround):
            return messages_around(self.current(op.key), op)
        if isinstance(op, Delete):
            return self.delete(op)
        if isinstance(op, CountMessages):
            return self.count(op.key)
        if isinstance(op, ExpectLast):
            found = self.last_id(op.key)
            if found != op.message_id:
                raise conflict_error(op, found)
            return None
        if isinstance(op, ListKeys):
            return sorted(
                k
                for k in self.keys()
                if self.current(k) and (op.namespace is None or k[0] == op.namespace)
            )
        if isinstance(op, SaveRun):
            if self.runs is None:
                self.runs = dict(self.state.runs)
            self.runs[op.snapshot.run_id] = op.snapshot
            return None
        if isinstance(op, LoadRun):
            return self.run_map().get(op.run_id)
        if isinstance(op, ListRuns):
            return self.list_runs(op)
        if isinstance(op, EnforceRetention):
            return self.retention(op)
        if isinstance(op, LoadAfter):
            return self.load_after(op)
        if isinstance(op, PutVectors):
            return self.put_vectors(op)
        if isinstance(op, LoadVectors):
            return self.load_vectors(op)
        if isinstance(op, LoadDeletions):
            return self.load_deletions(op)
        raise TypeError(f"unknown store operation {op!r}")  # pragma: no cover

    def append(self, op: Append) -> None:
        if not op.messages:
            return
        d = self.draft(op.key)
        for m in op.messages:
            if m.message_id in d:
                raise DuplicateMessageError(
                    f"message_id {m.message_id!r} is already stored under {op.key}"
                )
        d.append(op.messages)
        new = self.new_seqs.setdefault(op.key, {})
        for m in op.messages:
            self.state.seq += 1
            new[m.message_id] = self.state.seq
        if op.copies_of is not None:
            holders = self.state.copies.setdefault(op.copies_of, set())
            if op.key not in holders:
                holders.add(op.key)
                self.undo_copies.append((op.copies_of, op.key))
        for m, refs in zip(op.messages, op.sources, strict=False):
            for ref in refs:
                source = (ref.key, ref.message_id)
                record = (op.key, m.message_id)
                if record not in self.state.derived.get(source, ()):
                    self._link(record, source)
                    self.undo_links.append((True, record, source))

    # ------------------------------------------------------------------ ownership
    def _link(self, record: Record, source: Record) -> None:
        self.state.owners.setdefault(record, set()).add(source)
        self.state.derived.setdefault(source, set()).add(record)

    def _unlink(self, record: Record, source: Record) -> None:
        for table, a, b in (
            (self.state.owners, record, source),
            (self.state.derived, source, record),
        ):
            found = table.get(a)
            if found is not None:
                found.discard(b)
                if not found:
                    del table[a]

    def cascade(self, key: Key, message_ids: Iterable[str]) -> None:
        """Log the deletion of ``message_ids`` from ``key`` and delete what loses its sources."""
        state = self.state
        frontier = [(key, mid) for mid in message_ids]
        while frontier:
            doomed: dict[Key, set[str]] = {}
            for record in frontier:
                state.deletions.append(record)
                self.logged += 1
                for holder in state.copies.get(record[0], ()):
                    doomed.setdefault(holder, set()).add(record[1])
                if not state.owners and not state.derived:
                    continue
                for source in list(state.owners.get(record, ())):
                    self._unlink(record, source)
                    self.undo_links.append((False, record, source))
                for child in list(state.derived.get(record, ())):
                    self._unlink(child, record)
                    self.undo_links.append((False, child, record))
                    if child not in state.owners:  # its last source went
                        doomed.setdefault(child[0], set()).add(child[1])
            frontier = []
            for k, ids in doomed.items():
                messages = self.current(k)
                gone = [m.message_id for m in messages if m.message_id in ids]
                if gone:
                    self.drop_vectors(k, gone)
                    self.draft(k).replace([m for m in messages if m.message_id not in ids])
                    frontier += [(k, mid) for mid in gone]

    def load_deletions(self, op: LoadDeletions) -> DeletionPage:
        state = self.state
        head = state.deletions_first + len(state.deletions) - 1
        if op.after is None:
            return DeletionPage((), (), head)
        complete = op.after >= state.deletions_first - 1
        start = max(op.after - state.deletions_first + 1, 0)
        keys: list[Key] = []
        mids: list[str] = []
        for i in range(start, len(state.deletions)):
            k, mid = state.deletions[i]
            if op.namespace is None or k[0] == op.namespace:
                keys.append(k)
                mids.append(mid)
        return DeletionPage(tuple(keys), tuple(mids), max(head, op.after), complete)

    # ------------------------------------------------------------------ vectors
    def seq_of(self, key: Key, message_id: str) -> int:
        new = self.new_seqs.get(key)
        if new is not None and message_id in new:
            return new[message_id]
        return self.state.seqs[key][message_id]

    def load_after(self, op: LoadAfter) -> MessagePage:
        messages = self.current(op.key)
        start = len(messages)
        while start > 0 and self.seq_of(op.key, messages[start - 1].message_id) > op.after:
            start -= 1
        new = list(messages[start:])
        cursor = self.seq_of(op.key, new[-1].message_id) if new else op.after
        return MessagePage(new, cursor, len(messages))

    def has_message(self, key: Key, message_id: str) -> bool:
        found = self.drafts.get(key)
        if found is not None:
            return message_id in found
        return message_id in self.state.ids.get(key, ())

    def put_vectors(self, op: PutVectors) -> int:
        dim = int(op.vectors.shape[1])
        mv = self.state.vectors.get(op.model)
        if mv is not None and mv.dim != dim:
            raise ValueError(
                f"vectors of model {op.model!r} are {mv.dim}-D in this store, got {dim}-D"
            )
        for mid in op.message_ids:
            if not self.has_message(op.key, mid):
                raise MessageNotFoundError(
                    f"put_vectors: no message {mid!r} is stored under {op.key}"
                )
        if mv is None:
            mv = self.state.vectors[op.model] = _ModelVectors(dim)
            self.undo.append(("model", op.model, 0, None))
        self.drop_vectors(op.key, op.message_ids, (op.model,))
        vectors = op.vectors.copy()  # the store's own rows, whatever the caller does later
        vectors.flags.writeable = False
        for i, mid in enumerate(op.message_ids):
            self.state.seq += 1
            seq = self.state.seq
            mv.rows[seq] = (op.key, mid, vectors[i])
            mv.where[(op.key, mid)] = seq
            mv.seqs.append(seq)
            self.undo.append(("add", op.model, seq, None))
        return len(op.message_ids)

    def drop_vectors(
        self, key: Key, message_ids: Iterable[str], models: Iterable[str] | None = None
    ) -> None:
        """Delete the vectors of ``message_ids`` under ``key`` (a cascade or a rewrite)."""
        vectors = self.state.vectors
        if not vectors:
            return
        mids = list(message_ids)
        for model in list(vectors) if models is None else models:
            mv = vectors.get(model)
            if mv is None or not mv.rows:
                continue
            for mid in mids:
                seq = mv.where.pop((key, mid), None)
                if seq is not None:
                    self.undo.append(("del", model, seq, mv.rows.pop(seq)))

    def load_vectors(self, op: LoadVectors) -> VectorPage:
        mv = self.state.vectors.get(op.model)
        if mv is None:
            return VectorPage((), (), empty_vectors(0), op.after)
        keys: list[Key] = []
        mids: list[str] = []
        rows: list[npt.NDArray[np.float32]] = []
        cursor = op.after
        for seq in mv.seqs[bisect.bisect_right(mv.seqs, op.after) :]:
            row = mv.rows.get(seq)
            if row is None or (op.key is not None and row[0] != op.key):
                continue
            keys.append(row[0])
            mids.append(row[1])
            rows.append(row[2])
            cursor = seq
            if op.limit is not None and len(rows) >= op.limit:
                break
        array = np.stack(rows) if rows else empty_vectors(mv.dim)
        return VectorPage(tuple(keys), tuple(mids), array, cursor)

    def load(self, op: Load) -> list[Message]:
        messages = self.current(op.key)
        if op.ids is not None:
            wanted = frozenset(op.ids)
            messages = [m for m in messages if m.message_id in wanted]
        if op.since is None and op.last is not None:  # the tail only: O(last), not O(key)
            return list(messages[max(len(messages) - op.last, 0) :]) if op.last else []
        if op.since is not None:
            since = op.since
            selected = [m for m in messages if m.timestamp >= since]
        else:
            selected = list(messages)
        if op.last is not None:
            selected = selected[-op.last :] if op.last else []
        return selected

    def delete(self, op: Delete) -> int:
        messages = self.current(op.key)
        if not messages:
            return 0
        if op.ids is None and op.before is None:
            kept: list[Message] = []
        else:
            ids = frozenset(op.ids) if op.ids is not None else None
            before = op.before
            kept = [
                m
                for m in messages
                if not (
                    (ids is None or m.message_id in ids)
                    and (before is None or m.timestamp < before)
                )
            ]
        removed = len(messages) - len(kept)
        if removed:
            left = {m.message_id for m in kept}
            gone = [m.message_id for m in messages if m.message_id not in left]
            if self.state.vectors:
                self.drop_vectors(op.key, gone)
            self.draft(op.key).replace(kept)
            self.cascade(op.key, gone)
        return removed

    def list_runs(self, op: ListRuns) -> list[str]:
        runs = [
            s
            for s in self.run_map().values()
            if (op.namespace is None or s.namespace == op.namespace)
            and (op.agent is None or s.agent == op.agent)
            and (op.parent_id is None or s.parent_id == op.parent_id)
        ]
        runs.sort(key=lambda s: s.started_at)  # stable: ties stay in first-save order
        return [s.run_id for s in runs]

    def retention(self, op: EnforceRetention) -> int:
        if op.ttl is None and op.max_messages is None:
            return 0
        keys = [op.key] if op.key is not None else sorted(self.keys())
        return sum(_retain(self, key, op.ttl, op.max_messages, op.now) for key in keys)


def _retain(
    tx: _Transaction,
    key: Key,
    ttl: timedelta | None,
    max_messages: int | None,
    now: datetime,
) -> int:
    """Apply the retention rule (:mod:`marsys_mem.store.retention`) to one key.

    Returns the number deleted. Checking a key that is within its bound costs O(1) (no
    ttl) or O(messages) (ttl).
    """
    if ttl is None and (max_messages is None or tx.count(key) <= max_messages):
        return 0
    messages = tx.current(key)
    drop = evicted(messages, now=now, ttl=ttl, max_messages=max_messages)
    if drop:
        gone = set(drop)
        ids = [messages[i].message_id for i in drop]
        tx.drop_vectors(key, ids)
        tx.draft(key).replace([m for i, m in enumerate(messages) if i not in gone])
        tx.cascade(key, ids)
    return len(drop)
