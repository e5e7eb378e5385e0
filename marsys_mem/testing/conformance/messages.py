"""Conformance: appending and loading messages (:attr:`Capability.MESSAGES`).

Clauses of :mod:`marsys_mem.store.base`: "Within a key, messages keep the order they were
appended in and ``message_id`` is unique"; ``load_messages``: "A key's messages, oldest
first (``since``: timestamp >= since; ``last``: newest n)".
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest

from marsys_mem.exceptions import DuplicateMessageError
from marsys_mem.model.messages import Message
from marsys_mem.store.base import MemoryStore
from marsys_mem.testing.conformance.data import KEY, OTHER_KEY, T0, user_messages
from marsys_mem.testing.conformance.harness import StoreHarness

__all__ = ["MessagesConformance"]


class MessagesConformance(StoreHarness):
    """Append, load (``since``, ``last``), order and unique ids per key.

    Example:
        >>> import pytest
        >>> from marsys_mem.store import InMemoryStore
        >>> class TestMessages(MessagesConformance):
        ...     @pytest.fixture
        ...     def store(self):
        ...         with InMemoryStore() as s:
        ...             yield s
    """

    def test_append_then_load_keeps_append_order(self, store: MemoryStore) -> None:
        """Within a key, messages keep the order they were appended in.

        Checks: messages come back oldest first, in append order (not timestamp order).
        """
        first = user_messages(3, prefix="a")
        second = [
            Message.assistant("late", message_id="b0", timestamp=T0 - timedelta(days=1)),
            Message.user("later", message_id="b1", timestamp=T0 + timedelta(days=1)),
        ]
        store.append_messages(KEY, first)
        store.append_messages(KEY, second)
        assert store.load_messages(KEY) == first + second

    def test_append_accepts_any_iterable(self, store: MemoryStore) -> None:
        """``append_messages``: append messages to ``key``, atomically.

        Checks: it takes any iterable of messages, a generator included.
        """
        msgs = user_messages(4)
        store.append_messages(KEY, (m for m in msgs))
        assert store.load_messages(KEY) == msgs

    def test_append_nothing_creates_no_key(self, store: MemoryStore) -> None:
        """``list_keys``: keys that hold at least one message, sorted.

        Checks: appending an empty list writes nothing and does not create the key.
        """
        store.append_messages(KEY, [])
        assert store.load_messages(KEY) == []
        assert store.list_keys() == []
        assert store.count_messages(KEY) == 0

    def test_load_unknown_key_is_empty(self, store: MemoryStore) -> None:
        """``load_messages``: a key's messages, oldest first.

        Checks: a key that was never written gives an empty list, not an error.
        """
        assert store.load_messages(("nobody", "here", "main")) == []

    def test_load_since_is_inclusive(self, store: MemoryStore) -> None:
        """``Load``: ``since``: only messages with timestamp >= since.

        Checks: the bound is inclusive and the result stays in append order.
        """
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
        """``Load``: ``last``: only the newest ``last``.

        Checks: the newest n in append order; 0 gives none; more than stored gives all.
        """
        msgs = user_messages(5)
        store.append_messages(KEY, msgs)
        assert store.load_messages(KEY, last=2) == msgs[3:]
        assert store.load_messages(KEY, last=1) == msgs[4:]
        assert store.load_messages(KEY, last=0) == []
        assert store.load_messages(KEY, last=50) == msgs

    def test_load_since_and_last_combine(self, store: MemoryStore) -> None:
        """``Load``: ``since`` and ``last`` together.

        Checks: ``since`` filters first, then ``last`` takes the newest of what is left.
        """
        msgs = user_messages(6)
        store.append_messages(KEY, msgs)
        assert store.load_messages(KEY, since=msgs[1].timestamp, last=3) == msgs[3:]
        assert store.load_messages(KEY, since=msgs[4].timestamp, last=3) == msgs[4:]

    def test_load_returns_a_fresh_list(self, store: MemoryStore) -> None:
        """``load_messages``: a key's messages, oldest first.

        Checks: changing the returned list does not change the store.
        """
        msgs = user_messages(3)
        store.append_messages(KEY, msgs)
        loaded = store.load_messages(KEY)
        loaded.clear()
        assert store.load_messages(KEY) == msgs

    def test_duplicate_id_in_same_key_is_rejected(self, store: MemoryStore) -> None:
        """Within a key ``message_id`` is unique.

        Checks: appending an id already stored under the key raises DuplicateMessageError
        naming the id, and writes nothing.
        """
        msgs = user_messages(2)
        store.append_messages(KEY, msgs)
        again = Message.user("other text", message_id="m1")
        with pytest.raises(DuplicateMessageError, match="m1"):
            store.append_messages(KEY, [again])
        assert store.load_messages(KEY) == msgs

    def test_duplicate_in_the_middle_writes_nothing(self, store: MemoryStore) -> None:
        """``append_messages``: append messages to ``key``, atomically.

        Checks: a duplicate in the middle of an append rejects the whole append.
        """
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
        """Within a key ``message_id`` is unique.

        Checks: the same id twice in one append is rejected before anything is written.
        """
        dup = [Message.user("a", message_id="x"), Message.user("b", message_id="x")]
        with pytest.raises(DuplicateMessageError, match="x"):
            store.append_messages(KEY, dup)
        assert store.list_keys() == []

    def test_same_id_in_different_keys_is_allowed(self, store: MemoryStore) -> None:
        """Within a key ``message_id`` is unique.

        Checks: ids are unique per key only; deleting one copy leaves the others.
        """
        m = Message.user("shared", message_id="same")
        for key in (KEY, OTHER_KEY, ("other-ns", "researcher", "main")):
            store.append_messages(key, [m])
        assert store.load_messages(OTHER_KEY) == [m]
        assert store.delete_messages(KEY, ids=["same"]) == 1
        assert store.load_messages(OTHER_KEY) == [m]

    def test_load_around_walks_each_thread(self, store: MemoryStore) -> None:
        """``LoadAround``: the ids and ``before`` / ``after`` turns of their thread, key order.

        Checks: neighbours come from the id's thread only (``metadata["thread"]``, other
        threads interleaved), stop at the thread's ends, are returned once each in the
        key's order; messages without a thread share one; ``thread=None`` walks the key;
        another field names the thread; a non-string thread value compares as JSON text;
        unknown ids and other keys give nothing; bad arguments are refused by name.
        """
        threads = ["a", "b", "a", None, "a", "b", "a", 7, None, "a", 7]
        msgs = [
            Message.user(
                f"turn {i}",
                message_id=f"w{i}",
                metadata={} if t is None else {"thread": t, "topic": "x" if i % 2 else "y"},
            )
            for i, t in enumerate(threads)
        ]
        store.append_messages(KEY, msgs)
        store.append_messages(OTHER_KEY, [Message.user("elsewhere", message_id="w4")])

        def ids(*args: object, **kw: object) -> list[str]:
            return [m.message_id for m in store.load_around(KEY, *args, **kw)]  # type: ignore[arg-type]

        assert ids(["w4"], 1, 1) == ["w2", "w4", "w6"]
        assert ids(["w4"], 5, 0) == ["w0", "w2", "w4"]
        assert ids(["w0", "w9"], 1, 1) == ["w0", "w2", "w6", "w9"]
        assert ids(["w1"], 2, 3) == ["w1", "w5"]
        assert ids(["w8"], 1, 1) == ["w3", "w8"]  # no thread: one thread of their own
        assert ids(["w7"], 0, 1) == ["w7", "w10"]  # 7: a number
        assert ids(["w4"], 1, 1, thread=None) == ["w3", "w4", "w5"]
        assert ids(["w4"], 1, 1, thread="topic") == ["w2", "w4", "w6"]
        assert ids(["nope"], 2, 2) == []
        assert ids([], 2, 2) == []
        assert store.load_around(("nobody", "here", "main"), ["w4"], 1, 1) == []
        assert store.load_around(KEY, ["w4"], 1, 1) == [msgs[2], msgs[4], msgs[6]]
        bad_cases: list[tuple[Callable[[], object], str]] = [
            (lambda: store.load_around(KEY, ["w4"], -1, 1), "before"),
            (lambda: store.load_around(KEY, ["w4"], 1, True), "after"),
            (lambda: store.load_around(KEY, [""], 1, 1), r"ids\[0\]"),
            (lambda: store.load_around(KEY, ["w4"], 1, 1, thread=""), "thread"),
        ]
        for bad, field in bad_cases:
            with pytest.raises((ValueError, TypeError), match=field):
                bad()
