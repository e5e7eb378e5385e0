"""The conformance suite every :class:`~marsys_mem.store.base.MemoryStore` backend passes.

Subclass :class:`StoreConformance` in a test module and provide a ``store`` fixture that
yields a fresh, empty store (and closes it afterwards)::

    import pytest
    from marsys_mem.testing import StoreConformance

    @pytest.fixture
    def store(tmp_path):
        s = MyStore(tmp_path / "db")
        yield s
        s.close()

    class TestMyStore(StoreConformance):
        pass

Each test method's docstring states the clause of the contract it checks. The async twins
are exercised with :func:`asyncio.run`, so the suite needs pytest and nothing else (no
pytest-asyncio mode or marker).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

from marsys_mem.exceptions import DuplicateMessageError
from marsys_mem.model.messages import Message
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
    SaveRun,
)
from marsys_mem.testing.store_conformance_runs import DurabilityConformance
from marsys_mem.testing.store_data import (
    KEY,
    OTHER_KEY,
    T0,
    _ids,
    _state,
    snapshot_of,
    user_messages,
)

__all__ = ["KEY", "OTHER_KEY", "T0", "StoreConformance", "snapshot_of", "user_messages"]

_BAD_KEYS: list[Any] = [
    None,
    "default/researcher/main",
    ("default", "researcher"),
    ("default", "researcher", "main", "x"),
    ("default", "", "main"),
    ("default", "researcher", None),
    ["default", "researcher", "main"],
    ("default", 1, "main"),
]


class StoreConformance(DurabilityConformance):
    """Tests every :class:`~marsys_mem.store.base.MemoryStore` backend must pass.

    Messages (append, load, delete, keys, duplicates, batches, argument checks) are here;
    runs, retention, fidelity, threads, async twins and closing come from
    :class:`~marsys_mem.testing.store_conformance_runs.DurabilityConformance`.

    A subclass provides the ``store`` fixture (a fresh, empty store); every test method
    here then runs against it.

    Example:
        >>> from marsys_mem.store import InMemoryStore
        >>> class TestInMemory(StoreConformance):
        ...     @pytest.fixture
        ...     def store(self):
        ...         s = InMemoryStore()
        ...         yield s
        ...         s.close()
    """

    # ------------------------------------------------------------------ append / load
    def test_append_then_load_keeps_append_order(self, store: MemoryStore) -> None:
        """Messages come back oldest first, in append order (not timestamp order)."""
        first = user_messages(3, prefix="a")
        second = [
            Message.assistant("late", message_id="b0", timestamp=T0 - timedelta(days=1)),
            Message.user("later", message_id="b1", timestamp=T0 + timedelta(days=1)),
        ]
        store.append_messages(KEY, first)
        store.append_messages(KEY, second)
        assert store.load_messages(KEY) == first + second

    def test_append_accepts_any_iterable(self, store: MemoryStore) -> None:
        """``append_messages`` takes any iterable of messages, a generator included."""
        msgs = user_messages(4)
        store.append_messages(KEY, (m for m in msgs))
        assert store.load_messages(KEY) == msgs

    def test_append_nothing_creates_no_key(self, store: MemoryStore) -> None:
        """Appending an empty list writes nothing and does not create the key."""
        store.append_messages(KEY, [])
        assert store.load_messages(KEY) == []
        assert store.list_keys() == []
        assert store.count_messages(KEY) == 0

    def test_load_unknown_key_is_empty(self, store: MemoryStore) -> None:
        """Loading a key that was never written gives an empty list, not an error."""
        assert store.load_messages(("nobody", "here", "main")) == []

    def test_load_since_is_inclusive(self, store: MemoryStore) -> None:
        """``since`` keeps messages with timestamp >= since, in append order."""
        msgs = user_messages(5)
        store.append_messages(KEY, msgs)
        assert store.load_messages(KEY, since=msgs[2].timestamp) == msgs[2:]
        assert (
            store.load_messages(KEY, since=msgs[2].timestamp + timedelta(microseconds=1))
            == (msgs[3:])
        )
        assert store.load_messages(KEY, since=T0 - timedelta(days=1)) == msgs
        assert store.load_messages(KEY, since=T0 + timedelta(days=1)) == []

    def test_load_last(self, store: MemoryStore) -> None:
        """``last`` keeps the newest n (in append order); 0 gives none; more than stored, all."""
        msgs = user_messages(5)
        store.append_messages(KEY, msgs)
        assert store.load_messages(KEY, last=2) == msgs[3:]
        assert store.load_messages(KEY, last=1) == msgs[4:]
        assert store.load_messages(KEY, last=0) == []
        assert store.load_messages(KEY, last=50) == msgs

    def test_load_since_and_last_combine(self, store: MemoryStore) -> None:
        """``since`` filters first, then ``last`` takes the newest of what is left."""
        msgs = user_messages(6)
        store.append_messages(KEY, msgs)
        assert store.load_messages(KEY, since=msgs[1].timestamp, last=3) == msgs[3:]
        assert store.load_messages(KEY, since=msgs[4].timestamp, last=3) == msgs[4:]

    def test_load_returns_a_fresh_list(self, store: MemoryStore) -> None:
        """Changing the returned list does not change the store."""
        msgs = user_messages(3)
        store.append_messages(KEY, msgs)
        loaded = store.load_messages(KEY)
        loaded.clear()
        assert store.load_messages(KEY) == msgs

    def test_large_append_and_delete(self, store: MemoryStore) -> None:
        """Thousands of messages in one append and ids in one delete (no SQL variable limit)."""
        msgs = user_messages(2500)
        store.append_messages(KEY, msgs)
        assert store.count_messages(KEY) == 2500
        assert store.delete_messages(KEY, ids=[m.message_id for m in msgs[:2000]]) == 2000
        assert store.load_messages(KEY) == msgs[2000:]

    # ------------------------------------------------------------------ delete / count
    def test_delete_by_ids(self, store: MemoryStore) -> None:
        """Deleting by id removes those messages, ignores unknown ids, returns the count."""
        msgs = user_messages(5)
        store.append_messages(KEY, msgs)
        assert store.delete_messages(KEY, ids=["m1", "m3", "nope", "m1"]) == 2
        assert store.load_messages(KEY) == [msgs[0], msgs[2], msgs[4]]
        assert store.delete_messages(KEY, ids=iter(["m0"])) == 1
        assert store.count_messages(KEY) == 2

    def test_delete_no_ids_deletes_nothing(self, store: MemoryStore) -> None:
        """``ids=[]`` is a filter that matches nothing (it is not "delete all")."""
        msgs = user_messages(3)
        store.append_messages(KEY, msgs)
        assert store.delete_messages(KEY, ids=[]) == 0
        assert store.load_messages(KEY) == msgs

    def test_delete_before_is_strict(self, store: MemoryStore) -> None:
        """``before`` deletes messages with timestamp < before (not equal)."""
        msgs = user_messages(5)
        store.append_messages(KEY, msgs)
        assert store.delete_messages(KEY, before=msgs[2].timestamp) == 2
        assert store.load_messages(KEY) == msgs[2:]

    def test_delete_ids_and_before_must_both_match(self, store: MemoryStore) -> None:
        """With ``ids`` and ``before`` a message is deleted only if it matches both."""
        msgs = user_messages(5)
        store.append_messages(KEY, msgs)
        assert store.delete_messages(KEY, ids=["m0", "m3"], before=msgs[2].timestamp) == 1
        assert _ids(store.load_messages(KEY)) == ["m1", "m2", "m3", "m4"]

    def test_delete_all(self, store: MemoryStore) -> None:
        """Neither ``ids`` nor ``before``: the whole key goes, other keys stay."""
        store.append_messages(KEY, user_messages(4))
        other = user_messages(2, prefix="o")
        store.append_messages(OTHER_KEY, other)
        assert store.delete_messages(KEY) == 4
        assert store.load_messages(KEY) == []
        assert store.load_messages(OTHER_KEY) == other
        assert store.delete_messages(KEY) == 0

    def test_deleted_ids_can_be_appended_again(self, store: MemoryStore) -> None:
        """Uniqueness is over what is stored: a deleted id may be appended again, at the end."""
        msgs = user_messages(3)
        store.append_messages(KEY, msgs)
        store.delete_messages(KEY, ids=["m0"])
        store.append_messages(KEY, [msgs[0]])
        assert _ids(store.load_messages(KEY)) == ["m1", "m2", "m0"]

    def test_count_messages(self, store: MemoryStore) -> None:
        """``count_messages`` follows appends and deletes; unknown keys count 0."""
        assert store.count_messages(KEY) == 0
        store.append_messages(KEY, user_messages(7))
        assert store.count_messages(KEY) == 7
        store.delete_messages(KEY, ids=["m0"])
        assert store.count_messages(KEY) == 6
        assert store.count_messages(OTHER_KEY) == 0

    # ------------------------------------------------------------------ keys
    def test_list_keys_sorted_with_namespace_filter(self, store: MemoryStore) -> None:
        """``list_keys`` gives the keys holding messages, sorted; ``namespace`` filters."""
        keys: list[Key] = [
            ("b", "z", "main"),
            ("a", "y", "main"),
            ("b", "a", "fork"),
            ("a", "y", "alt"),
            ("b", "a", "b2"),
        ]
        for i, key in enumerate(keys):
            store.append_messages(key, user_messages(1, prefix=f"k{i}-"))
        assert store.list_keys() == sorted(keys)
        assert store.list_keys("a") == [("a", "y", "alt"), ("a", "y", "main")]
        assert store.list_keys(namespace="b") == [
            ("b", "a", "b2"),
            ("b", "a", "fork"),
            ("b", "z", "main"),
        ]
        assert store.list_keys("nope") == []

    def test_list_keys_unicode_sorted_by_code_point(self, store: MemoryStore) -> None:
        """Keys may hold any non-empty text; they sort as Python sorts strings."""
        keys: list[Key] = [("ns", "é", "main"), ("ns", "Z", "main"), ("ns", "日本", "main")]
        keys.append(("ns", "a\U0001f600", "main"))
        for i, key in enumerate(keys):
            store.append_messages(key, user_messages(1, prefix=f"u{i}-"))
        assert store.list_keys() == sorted(keys)
        for i, key in enumerate(keys):
            assert _ids(store.load_messages(key)) == [f"u{i}-0"]

    def test_keys_disappear_when_emptied(self, store: MemoryStore) -> None:
        """A key whose messages were all deleted (any way) is no longer listed."""
        store.append_messages(KEY, user_messages(2))
        store.append_messages(OTHER_KEY, user_messages(2))
        third: Key = ("default", "critic", "main")
        store.append_messages(third, user_messages(2, start=T0 - timedelta(days=30)))
        store.delete_messages(KEY, ids=["m0", "m1"])
        assert store.list_keys() == sorted([OTHER_KEY, third])
        store.delete_messages(OTHER_KEY)
        store.enforce_retention(third, ttl=timedelta(days=1), now=T0)
        assert store.list_keys() == []

    def test_keys_are_isolated(self, store: MemoryStore) -> None:
        """Keys differing in any part are separate: writes and deletes stay in their key."""
        keys: list[Key] = [
            ("ns", "a", "main"),
            ("ns2", "a", "main"),
            ("ns", "b", "main"),
            ("ns", "a", "fork"),
        ]
        for i, key in enumerate(keys):
            store.append_messages(key, user_messages(i + 1, prefix=f"k{i}-"))
        store.delete_messages(keys[0])
        assert store.load_messages(keys[0]) == []
        for i, key in enumerate(keys[1:], start=1):
            assert store.load_messages(key) == user_messages(i + 1, prefix=f"k{i}-")

    # ------------------------------------------------------------------ duplicates
    def test_duplicate_id_in_same_key_is_rejected(self, store: MemoryStore) -> None:
        """Appending an id already stored under the key raises, naming the id; nothing written."""
        msgs = user_messages(2)
        store.append_messages(KEY, msgs)
        again = Message.user("other text", message_id="m1")
        with pytest.raises(DuplicateMessageError, match="m1"):
            store.append_messages(KEY, [again])
        assert store.load_messages(KEY) == msgs

    def test_duplicate_in_the_middle_writes_nothing(self, store: MemoryStore) -> None:
        """A duplicate in the middle of an append rejects the whole append."""
        msgs = user_messages(2)
        store.append_messages(KEY, msgs)
        batch = [
            *user_messages(3, prefix="new"),
            Message.user("dup", message_id="m0"),
            *user_messages(3, prefix="more"),
        ]
        with pytest.raises(DuplicateMessageError, match="m0"):
            store.append_messages(KEY, batch)
        assert store.load_messages(KEY) == msgs
        assert store.count_messages(KEY) == 2

    def test_duplicate_within_one_append_is_rejected(self, store: MemoryStore) -> None:
        """The same id twice in one append is rejected before anything is written."""
        dup = [Message.user("a", message_id="x"), Message.user("b", message_id="x")]
        with pytest.raises(DuplicateMessageError, match="x"):
            store.append_messages(KEY, dup)
        assert store.list_keys() == []

    def test_conflicting_appends_in_one_batch(self, store: MemoryStore) -> None:
        """Two appends in one ``batch()`` using the same id in one key: the batch fails whole."""
        with pytest.raises(DuplicateMessageError, match="x"):
            store.batch(
                [
                    Append(KEY, (Message.user("a", message_id="x"),)),
                    Append(OTHER_KEY, (Message.user("b", message_id="y"),)),
                    Append(
                        KEY, (Message.user("c", message_id="z"), Message.user("d", message_id="x"))
                    ),
                ]
            )
        assert store.list_keys() == []
        assert store.load_messages(KEY) == []

    def test_same_id_in_different_keys_is_allowed(self, store: MemoryStore) -> None:
        """Ids are unique per key only."""
        m = Message.user("shared", message_id="same")
        for key in (KEY, OTHER_KEY, ("other-ns", "researcher", "main")):
            store.append_messages(key, [m])
        assert store.load_messages(OTHER_KEY) == [m]
        assert store.delete_messages(KEY, ids=["same"]) == 1
        assert store.load_messages(OTHER_KEY) == [m]

    # ------------------------------------------------------------------ batches
    def test_batch_returns_one_result_per_op(self, store: MemoryStore) -> None:
        """``batch`` returns results in op order; later ops see earlier writes of the batch."""
        msgs = user_messages(3)
        snap = snapshot_of("r1")
        results = store.batch(
            [
                Append(KEY, tuple(msgs)),
                Load(KEY, last=2),
                CountMessages(KEY),
                ListKeys(),
                Delete(KEY, ids=("m0",)),
                CountMessages(KEY),
                SaveRun(snap),
                LoadRun("r1"),
                ListRuns(),
                EnforceRetention(KEY, None, 1, T0),
                Load(KEY),
            ]
        )
        assert results == [None, msgs[1:], 3, [KEY], 1, 2, None, snap, ["r1"], 1, msgs[2:]]

    def test_empty_batch(self, store: MemoryStore) -> None:
        """An empty batch returns an empty list."""
        assert store.batch([]) == []
        assert asyncio.run(store.abatch([])) == []

    def test_failed_batch_leaves_store_unchanged(self, store: MemoryStore) -> None:
        """A batch that fails on its last op undoes every earlier op (appends, deletes, runs)."""
        msgs = user_messages(4)
        other = user_messages(3, prefix="o")
        store.append_messages(KEY, msgs)
        store.append_messages(OTHER_KEY, other)
        store.save_run(snapshot_of("r1"))
        third: Key = ("default", "critic", "main")
        keys = [KEY, OTHER_KEY, third]
        before = _state(store, keys, ["r1", "r2"])
        with pytest.raises(DuplicateMessageError):
            store.batch(
                [
                    Append(KEY, tuple(user_messages(2, prefix="n"))),
                    Append(third, tuple(user_messages(2, prefix="t"))),
                    Delete(OTHER_KEY, ids=("o0",)),
                    Delete(KEY, before=msgs[2].timestamp),
                    SaveRun(snapshot_of("r2")),
                    SaveRun(snapshot_of("r1", agent="changed")),
                    EnforceRetention(None, None, 1, T0),
                    Append(OTHER_KEY, (Message.user("dup", message_id="o2"),)),
                ]
            )
        assert _state(store, keys, ["r1", "r2"]) == before
        store.append_messages(KEY, user_messages(1, prefix="after"))  # still works
        assert store.count_messages(KEY) == 5

    def test_invalid_op_in_batch_executes_nothing(self, store: MemoryStore) -> None:
        """A malformed op anywhere in a batch is rejected before any op runs."""
        with pytest.raises(ValueError, match="key"):
            store.batch([Append(KEY, tuple(user_messages(2))), Load(("bad",), None, None)])  # type: ignore[arg-type]
        assert store.list_keys() == []

    # ------------------------------------------------------------------ invalid arguments
    @pytest.mark.parametrize("bad_key", _BAD_KEYS)
    def test_invalid_keys_raise_value_error(self, store: MemoryStore, bad_key: Any) -> None:
        """Every key-taking method rejects a malformed key with ValueError, writing nothing."""
        calls: list[Callable[[], object]] = [
            lambda: store.append_messages(bad_key, user_messages(1)),
            lambda: store.load_messages(bad_key),
            lambda: store.delete_messages(bad_key),
            lambda: store.count_messages(bad_key),
        ]
        if bad_key is not None:  # enforce_retention(None) means "every key"
            calls.append(lambda: store.enforce_retention(bad_key, ttl=timedelta(days=1)))
        for call in calls:
            with pytest.raises(ValueError, match="key"):
                call()
        assert store.list_keys() == []

    def test_invalid_arguments(self, store: MemoryStore) -> None:
        """Wrong types raise TypeError, wrong values ValueError; nothing is written."""
        naive = datetime(2024, 1, 1)
        with pytest.raises(TypeError, match="Message"):
            store.append_messages(KEY, [Message.user("ok"), {"role": "user"}])  # type: ignore[list-item]
        with pytest.raises(ValueError, match="timezone"):
            store.load_messages(KEY, since=naive)
        with pytest.raises(ValueError, match="last"):
            store.load_messages(KEY, last=-1)
        with pytest.raises(ValueError, match="timezone"):
            store.delete_messages(KEY, before=naive)
        with pytest.raises(ValueError, match="timezone"):
            store.enforce_retention(KEY, ttl=timedelta(days=1), now=naive)
        with pytest.raises(ValueError, match="ttl"):
            store.enforce_retention(KEY, ttl=timedelta(0))
        with pytest.raises(ValueError, match="max_messages"):
            store.enforce_retention(KEY, max_messages=0)
        with pytest.raises(TypeError, match="RunSnapshot"):
            store.save_run({"run_id": "r1"})  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="run_id"):
            store.load_run("")
        with pytest.raises(TypeError, match="operation"):
            store.batch([object()])  # type: ignore[list-item]
        assert store.list_keys() == []
        assert store.list_runs() == []
