"""Conformance: listing keys and keeping them apart (:attr:`Capability.KEYS`).

Clauses of :mod:`marsys_mem.store.base`: "Keys are ``(namespace, agent, branch)`` tuples of
non-empty strings"; ``ListKeys``: "Keys that hold messages, sorted (result:
``list[Key]``); optionally one namespace".
"""

from __future__ import annotations

from datetime import timedelta

from marsys_mem.store.base import Key, MemoryStore
from marsys_mem.testing.conformance.data import (
    KEY,
    OTHER_KEY,
    T0,
    THIRD_KEY,
    message_ids,
    user_messages,
)
from marsys_mem.testing.conformance.harness import StoreHarness

__all__ = ["KeysConformance"]


class KeysConformance(StoreHarness):
    """``list_keys`` (sorted, by namespace, only keys holding messages) and key isolation.

    Example:
        >>> import pytest
        >>> from marsys_mem.store import InMemoryStore
        >>> class TestKeys(KeysConformance):
        ...     @pytest.fixture
        ...     def store(self):
        ...         with InMemoryStore() as s:
        ...             yield s
    """

    def test_list_keys_sorted_with_namespace_filter(self, store: MemoryStore) -> None:
        """``ListKeys``: keys that hold messages, sorted; optionally one namespace.

        Checks: tuple order over all keys; ``namespace`` (positional or keyword) filters;
        an unknown namespace gives an empty list.
        """
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
        """Keys are ``(namespace, agent, branch)`` tuples of non-empty strings.

        Checks: any non-empty text works (accents, CJK, astral characters), and keys
        sort as Python sorts strings (by code point).
        """
        keys: list[Key] = [("ns", "é", "main"), ("ns", "Z", "main"), ("ns", "日本", "main")]
        keys.append(("ns", "a\U0001f600", "main"))
        for i, key in enumerate(keys):
            store.append_messages(key, user_messages(1, prefix=f"u{i}-"))
        assert store.list_keys() == sorted(keys)
        for i, key in enumerate(keys):
            assert message_ids(store.load_messages(key)) == [f"u{i}-0"]

    def test_keys_disappear_when_emptied(self, store: MemoryStore) -> None:
        """``list_keys``: keys that hold at least one message, sorted.

        Checks: a key whose messages were all deleted (by ids, whole, or by retention)
        is no longer listed.
        """
        store.append_messages(KEY, user_messages(2))
        store.append_messages(OTHER_KEY, user_messages(2))
        store.append_messages(THIRD_KEY, user_messages(2, start=T0 - timedelta(days=30)))
        store.delete_messages(KEY, ids=["m0", "m1"])
        assert store.list_keys() == sorted([OTHER_KEY, THIRD_KEY])
        store.delete_messages(OTHER_KEY)
        store.enforce_retention(THIRD_KEY, ttl=timedelta(days=1), now=T0)
        assert store.list_keys() == []

    def test_keys_are_isolated(self, store: MemoryStore) -> None:
        """Keys are ``(namespace, agent, branch)`` tuples: each one is its own history.

        Checks: keys differing in any one part are separate; writes and deletes stay in
        their key.
        """
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
