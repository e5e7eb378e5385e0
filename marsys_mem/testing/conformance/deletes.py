"""Conformance: deleting and counting messages (:attr:`Capability.DELETES`).

Clauses of :mod:`marsys_mem.store.base`: ``Delete``: "Delete messages of ``key`` by id
and/or older than ``before`` (result: count). Both given: a message must match both.
Neither given: delete all the key's messages"; ``count_messages``: "Messages stored under
``key``".
"""

from __future__ import annotations

from marsys_mem.store.base import MemoryStore
from marsys_mem.testing.conformance.data import KEY, OTHER_KEY, message_ids, user_messages
from marsys_mem.testing.conformance.harness import StoreHarness

__all__ = ["DeletesConformance"]


class DeletesConformance(StoreHarness):
    """Delete by ids, by ``before``, by both, or the whole key; counts follow.

    Example:
        >>> import pytest
        >>> from marsys_mem.store import InMemoryStore
        >>> class TestDeletes(DeletesConformance):
        ...     @pytest.fixture
        ...     def store(self):
        ...         with InMemoryStore() as s:
        ...             yield s
    """

    def test_delete_by_ids(self, store: MemoryStore) -> None:
        """``delete_messages``: delete by ids; returns count.

        Checks: those messages go, unknown and repeated ids are ignored, the count is
        of messages deleted; any iterable of ids works.
        """
        msgs = user_messages(5)
        store.append_messages(KEY, msgs)
        assert store.delete_messages(KEY, ids=["m1", "m3", "nope", "m1"]) == 2
        assert store.load_messages(KEY) == [msgs[0], msgs[2], msgs[4]]
        assert store.delete_messages(KEY, ids=iter(["m0"])) == 1
        assert store.count_messages(KEY) == 2

    def test_delete_no_ids_deletes_nothing(self, store: MemoryStore) -> None:
        """``Delete``: delete messages of ``key`` by id.

        Checks: ``ids=[]`` is a filter that matches nothing (it is not "delete all").
        """
        msgs = user_messages(3)
        store.append_messages(KEY, msgs)
        assert store.delete_messages(KEY, ids=[]) == 0
        assert store.load_messages(KEY) == msgs

    def test_delete_before_is_strict(self, store: MemoryStore) -> None:
        """``delete_messages``: delete by timestamp < ``before``.

        Checks: a message whose timestamp equals ``before`` stays.
        """
        msgs = user_messages(5)
        store.append_messages(KEY, msgs)
        assert store.delete_messages(KEY, before=msgs[2].timestamp) == 2
        assert store.load_messages(KEY) == msgs[2:]

    def test_delete_ids_and_before_must_both_match(self, store: MemoryStore) -> None:
        """``Delete``: both given: a message must match both.

        Checks: of two ids, only the one older than ``before`` is deleted.
        """
        msgs = user_messages(5)
        store.append_messages(KEY, msgs)
        assert store.delete_messages(KEY, ids=["m0", "m3"], before=msgs[2].timestamp) == 1
        assert message_ids(store.load_messages(KEY)) == ["m1", "m2", "m3", "m4"]

    def test_delete_all(self, store: MemoryStore) -> None:
        """``Delete``: neither given: delete all the key's messages.

        Checks: the whole key goes, other keys stay; deleting again counts 0.
        """
        store.append_messages(KEY, user_messages(4))
        other = user_messages(2, prefix="o")
        store.append_messages(OTHER_KEY, other)
        assert store.delete_messages(KEY) == 4
        assert store.load_messages(KEY) == []
        assert store.load_messages(OTHER_KEY) == other
        assert store.delete_messages(KEY) == 0

    def test_deleted_ids_can_be_appended_again(self, store: MemoryStore) -> None:
        """Within a key ``message_id`` is unique (among the messages stored).

        Checks: a deleted id may be appended again, and goes at the end.
        """
        msgs = user_messages(3)
        store.append_messages(KEY, msgs)
        store.delete_messages(KEY, ids=["m0"])
        store.append_messages(KEY, [msgs[0]])
        assert message_ids(store.load_messages(KEY)) == ["m1", "m2", "m0"]

    def test_count_messages(self, store: MemoryStore) -> None:
        """``count_messages``: messages stored under ``key``.

        Checks: the count follows appends and deletes; unknown keys count 0.
        """
        assert store.count_messages(KEY) == 0
        store.append_messages(KEY, user_messages(7))
        assert store.count_messages(KEY) == 7
        store.delete_messages(KEY, ids=["m0"])
        assert store.count_messages(KEY) == 6
        assert store.count_messages(OTHER_KEY) == 0

    def test_large_append_and_delete(self, store: MemoryStore) -> None:
        """``Delete``: delete messages of ``key`` by id (result: count).

        Checks: thousands of messages in one append and ids in one delete (no limit on
        the number of SQL variables or similar).
        """
        msgs = user_messages(2500)
        store.append_messages(KEY, msgs)
        assert store.count_messages(KEY) == 2500
        assert store.delete_messages(KEY, ids=[m.message_id for m in msgs[:2000]]) == 2000
        assert store.load_messages(KEY) == msgs[2000:]
