"""In-process store: dictionaries behind a lock, all-or-nothing batches.

:class:`InMemoryStore` keeps, per key, the messages in append order and the set of their
ids. A batch never touches the committed state while it runs: every operation works on a
draft of the keys it affects (appends collect a pending tail, deletions work on a private
copy of the key's list), and the drafts are swapped in only when every operation of the
batch has succeeded. A failed batch leaves the store exactly as it was.

Messages are immutable, so the store keeps the objects it is given (no copies, no
serialisation): an append costs O(messages appended), a load O(messages returned).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from marsys_mem.exceptions import DuplicateMessageError, StoreError
from marsys_mem.model.messages import Message
from marsys_mem.model.runs import RunSnapshot
from marsys_mem.store.base import (
    Append,
    CountMessages,
    Delete,
    EnforceRetention,
    Key,
    ListKeys,
    ListRuns,
    Load,
    LoadRun,
    MemoryStore,
    Op,
    SaveRun,
)
from marsys_mem.store.retention import evicted

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


class _State:
    """The committed contents of an :class:`InMemoryStore` (read and swapped by batches)."""

    __slots__ = ("ids", "messages", "runs")

    def __init__(self) -> None:
        self.messages: dict[Key, list[Message]] = {}
        self.ids: dict[Key, set[str]] = {}
        self.runs: dict[str, RunSnapshot] = {}


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

    def keys(self) -> set[Key]:
        keys = set(self.state.messages)
        keys.update(self.drafts)
        return keys

    def run_map(self) -> dict[str, RunSnapshot]:
        return self.runs if self.runs is not None else self.state.runs

    # ------------------------------------------------------------------ batch
    def run(self, ops: Sequence[Op]) -> list[Any]:
        results = [self.execute(op) for op in ops]
        self.commit()
        return results

    def commit(self) -> None:
        messages, ids = self.state.messages, self.state.ids
        for key, d in self.drafts.items():
            if d.messages is not None and d.ids is not None:
                if d.messages:
                    messages[key], ids[key] = d.messages, d.ids
                else:
                    messages.pop(key, None)
                    ids.pop(key, None)
            elif d.tail:
                if key in messages:
                    messages[key].extend(d.tail)
                    ids[key].update(d.tail_ids)
                else:
                    messages[key], ids[key] = d.tail, d.tail_ids
        if self.runs is not None:
            self.state.runs = self.runs

    def execute(self, op: Op) -> Any:
        if isinstance(op, Append):
            return self.append(op)
        if isinstance(op, Load):
            return self.load(op)
        if isinstance(op, Delete):
            return self.delete(op)
        if isinstance(op, CountMessages):
            return self.count(op.key)
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

    def load(self, op: Load) -> list[Message]:
        messages = self.current(op.key)
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
            self.draft(op.key).replace(kept)
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
        tx.draft(key).replace([m for i, m in enumerate(messages) if i not in gone])
    return len(drop)
