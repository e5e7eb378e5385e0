"""Conformance: malformed arguments are rejected, writing nothing (:attr:`Capability.VALIDATION`).

Clauses of :mod:`marsys_mem.store.base`: "Keys are ``(namespace, agent, branch)`` tuples of
non-empty strings"; ``batch``: "ValueError, TypeError: a malformed op (nothing executed)".
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

from marsys_mem.model.messages import Message
from marsys_mem.store.base import MemoryStore
from marsys_mem.testing.conformance.data import KEY, user_messages
from marsys_mem.testing.conformance.harness import StoreHarness

__all__ = ["BAD_KEYS", "ValidationConformance"]

BAD_KEYS: list[Any] = [
    None,
    "default/researcher/main",
    ("default", "researcher"),
    ("default", "researcher", "main", "x"),
    ("default", "", "main"),
    ("default", "researcher", None),
    ["default", "researcher", "main"],
    ("default", 1, "main"),
]
"""Values that are not keys: each key-taking method rejects them with ValueError."""


class ValidationConformance(StoreHarness):
    """Malformed keys and arguments raise ValueError / TypeError and change nothing.

    Example:
        >>> import pytest
        >>> from marsys_mem.store import InMemoryStore
        >>> class TestValidation(ValidationConformance):
        ...     @pytest.fixture
        ...     def store(self):
        ...         with InMemoryStore() as s:
        ...             yield s
    """

    @pytest.mark.parametrize("bad_key", BAD_KEYS)
    def test_invalid_keys_raise_value_error(self, store: MemoryStore, bad_key: Any) -> None:
        """Keys are ``(namespace, agent, branch)`` tuples of non-empty strings.

        Checks: every key-taking method rejects a malformed key with ValueError naming
        the key, and writes nothing (``enforce_retention(None)`` means "every key").
        """
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
        """``batch``: ValueError, TypeError: a malformed op (nothing executed).

        Checks: wrong types raise TypeError, wrong values ValueError, each naming the
        argument (naive datetimes, negative ``last``, a zero ttl or bound, a dict for a
        snapshot, an empty run id, an unknown op); nothing is written.
        """
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
