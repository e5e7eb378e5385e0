"""The one retention rule (marsys_mem.store.retention), and every place that applies it.

The same cases run through the Python rule, InMemoryStore and SQLiteStore (whose SQL is
built from the rule's cutoff and order) and must delete exactly the same messages.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marsys_mem.model.messages import Message
from marsys_mem.store import InMemoryStore, MemoryStore, SQLiteStore
from marsys_mem.store.retention import (
    EVICTION_ORDER,
    evict_order,
    evicted,
    is_expired,
    over_bound,
    ttl_cutoff,
)

NOW = datetime(2025, 6, 1, 12, tzinfo=UTC)
KEY = ("default", "a", "main")
OTHER = ("default", "b", "main")


def _msg(i: int, protected: bool, age: int, *, system: bool = False) -> Message:
    ts = NOW - timedelta(seconds=age)
    if system:
        return Message.system(f"s{i}", message_id=f"m{i}", timestamp=ts)
    return Message.user(f"u{i}", message_id=f"m{i}", timestamp=ts, pinned=protected)


# ---------------------------------------------------------------------- the rule itself
def test_ttl_cutoff_is_now_minus_ttl_or_none() -> None:
    assert ttl_cutoff(NOW, None) is None
    assert ttl_cutoff(NOW, timedelta(days=1)) == NOW - timedelta(days=1)
    # a ttl reaching before year 1: nothing is that old (no OverflowError)
    assert ttl_cutoff(NOW, timedelta.max) is None
    assert ttl_cutoff(NOW, timedelta(days=999_999_999)) is None


def test_protected_messages_never_expire() -> None:
    cutoff = NOW - timedelta(hours=1)
    old = NOW - timedelta(days=2)
    assert is_expired(Message.user("x", timestamp=old), cutoff)
    assert not is_expired(Message.user("x", timestamp=NOW), cutoff)
    assert not is_expired(Message.system("x", timestamp=old), cutoff)
    assert not is_expired(Message.user("x", timestamp=old, pinned=True), cutoff)
    assert not is_expired(Message.user("x", timestamp=old, metadata={"preserve": True}), cutoff)
    assert not is_expired(Message.user("x", timestamp=old), None)
    # the boundary: exactly at the cutoff is kept
    assert not is_expired(Message.user("x", timestamp=cutoff), cutoff)


def test_the_bound_evicts_oldest_unprotected_first_then_oldest_protected() -> None:
    assert EVICTION_ORDER == (False, True)
    msgs = [
        _msg(0, False, 0, system=True),
        _msg(1, False, 0),
        _msg(2, True, 0),
        _msg(3, False, 0),
        _msg(4, True, 0),
    ]
    assert evict_order(msgs, 0) == []
    assert evict_order(msgs, 2) == [1, 3]
    assert evict_order(msgs, 4) == [1, 3, 0, 2]
    assert evict_order(msgs, 99) == [1, 3, 0, 2, 4]
    assert evicted(msgs, now=NOW, max_messages=3) == [1, 3]
    assert evicted(msgs, now=NOW, max_messages=1) == [0, 1, 2, 3]
    assert evicted(msgs, now=NOW, max_messages=5) == []


def test_ttl_applies_first_then_the_bound_counts_what_is_left() -> None:
    msgs = [
        _msg(0, True, 10_000),  # protected: never expires
        _msg(1, False, 10_000),  # expired
        _msg(2, False, 10),
        _msg(3, False, 10),
        _msg(4, False, 0),
    ]
    ttl = timedelta(hours=1)
    assert evicted(msgs, now=NOW, ttl=ttl) == [1]
    assert evicted(msgs, now=NOW, ttl=ttl, max_messages=4) == [1]
    assert evicted(msgs, now=NOW, ttl=ttl, max_messages=2) == [1, 2, 3]
    assert evicted(msgs, now=NOW, ttl=timedelta.max, max_messages=4) == [1]  # bound only


def test_headroom_evicts_a_chunk_more_once_over_the_bound() -> None:
    msgs = [_msg(i, False, 0) for i in range(11)]
    assert evicted(msgs, now=NOW, max_messages=10, headroom=4) == [0, 1, 2, 3, 4]
    assert evicted(msgs, now=NOW, max_messages=11, headroom=4) == []  # not over: nothing
    assert evicted(msgs, now=NOW, max_messages=1, headroom=99) == list(range(11))


def test_within_the_bound_and_without_ttl_costs_nothing() -> None:
    class Untouchable(list[Message]):
        def __iter__(self):  # type: ignore[no-untyped-def]
            raise AssertionError("the rule scanned the messages")

        def __getitem__(self, i):  # type: ignore[no-untyped-def]
            raise AssertionError("the rule read a message")

    msgs = Untouchable([_msg(i, False, 0) for i in range(5)])
    assert evicted(msgs, now=NOW, max_messages=5) == []
    assert evicted(msgs, now=NOW, ttl=timedelta.max, max_messages=5) == []
    assert over_bound(6, 5)
    assert not over_bound(5, 5)
    assert not over_bound(10**9, None)


# ---------------------------------------------------------------------- one rule, three places
def _stores() -> list[MemoryStore]:
    return [InMemoryStore(), SQLiteStore(":memory:")]


cases = st.tuples(
    st.lists(
        st.tuples(st.booleans(), st.booleans(), st.integers(0, 5000)), min_size=0, max_size=40
    ),
    st.one_of(st.none(), st.integers(1, 6000).map(lambda s: timedelta(seconds=s))),
    st.one_of(st.none(), st.integers(1, 45)),
)


@settings(max_examples=150, deadline=None)
@given(case=cases, other=st.integers(0, 30))
def test_python_rule_in_memory_store_and_sqlite_delete_the_same_messages(
    case: tuple[list[tuple[bool, bool, int]], timedelta | None, int | None], other: int
) -> None:
    spec, ttl, limit = case
    msgs = [_msg(i, p, age, system=s) for i, (p, s, age) in enumerate(spec)]
    noise = [_msg(1000 + i, i % 3 == 0, i * 200) for i in range(other)]
    gone = evicted(msgs, now=NOW, ttl=ttl, max_messages=limit)
    expected = [m.message_id for i, m in enumerate(msgs) if i not in set(gone)]
    gone_other = evicted(noise, now=NOW, ttl=ttl, max_messages=limit)
    expected_other = [m.message_id for i, m in enumerate(noise) if i not in set(gone_other)]
    for scope in ("key", "all"):
        for store in _stores():
            with store:
                if msgs:
                    store.append_messages(KEY, msgs)
                if noise:
                    store.append_messages(OTHER, noise)
                if scope == "key":
                    deleted = store.enforce_retention(KEY, ttl=ttl, max_messages=limit, now=NOW)
                    assert deleted == len(gone), type(store).__name__
                else:
                    deleted = store.enforce_retention(ttl=ttl, max_messages=limit, now=NOW)
                    assert deleted == len(gone) + len(gone_other), type(store).__name__
                    kept_other = [m.message_id for m in store.load_messages(OTHER)]
                    assert kept_other == expected_other, type(store).__name__
                kept = [m.message_id for m in store.load_messages(KEY)]
                assert kept == expected, type(store).__name__


@pytest.mark.parametrize("make", [InMemoryStore, lambda: SQLiteStore(":memory:")])
def test_a_ttl_reaching_before_year_1_deletes_nothing_in_every_store(make) -> None:
    with make() as store:
        store.append_messages(KEY, [_msg(0, False, 10**9), _msg(1, False, 0)])
        assert store.enforce_retention(KEY, ttl=timedelta.max, now=NOW) == 0
        assert store.enforce_retention(KEY, ttl=timedelta.max, max_messages=1, now=NOW) == 1
        assert [m.message_id for m in store.load_messages(KEY)] == ["m1"]
