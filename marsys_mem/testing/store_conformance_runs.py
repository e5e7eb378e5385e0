"""Store conformance, second half: runs, retention, fidelity, threads, async, closing.

:class:`~marsys_mem.testing.StoreConformance` includes these tests; see its module for how
a backend runs the suite.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone

import pytest

from marsys_mem.exceptions import DuplicateMessageError, StoreError
from marsys_mem.model.messages import AgentCall, ImagePart, Message, TextPart, ToolCall
from marsys_mem.store.base import (
    Append,
    CountMessages,
    EnforceRetention,
    Key,
    ListKeys,
    MemoryStore,
)
from marsys_mem.testing.store_data import (
    KEY,
    OTHER_KEY,
    T0,
    _ids,
    snapshot_of,
    user_messages,
)

__all__ = ["DurabilityConformance"]


class DurabilityConformance:
    """Runs, retention, fidelity, concurrency, async twins and lifecycle of a store.

    Part of :class:`~marsys_mem.testing.StoreConformance`; a subclass provides the
    ``store`` fixture (a fresh, empty store).

    Example:
        >>> from marsys_mem.store import InMemoryStore
        >>> class TestDurability(DurabilityConformance):
        ...     @pytest.fixture
        ...     def store(self):
        ...         s = InMemoryStore()
        ...         yield s
        ...         s.close()
    """

    # ------------------------------------------------------------------ runs
    def test_save_and_load_run(self, store: MemoryStore) -> None:
        """A run snapshot round-trips losslessly; ``load_run`` of an unknown id is None."""
        snap = snapshot_of("r1", parent_id="r0")
        store.save_run(snap)
        assert store.load_run("r1") == snap
        assert store.load_run("missing") is None

    def test_save_run_replaces(self, store: MemoryStore) -> None:
        """Saving a run id again replaces the snapshot; it is listed once."""
        store.save_run(snapshot_of("r1"))
        newer = snapshot_of("r1", agent="writer")
        store.save_run(newer)
        assert store.load_run("r1") == newer
        assert store.list_runs() == ["r1"]
        assert store.list_runs(agent="researcher") == []

    def test_list_runs_filters_and_order(self, store: MemoryStore) -> None:
        """``list_runs`` is oldest first (by ``started_at``) and filters by every field given."""
        later = T0 + timedelta(hours=1)
        store.save_run(snapshot_of("late", started_at=later + timedelta(hours=1)))
        store.save_run(snapshot_of("root", started_at=T0))
        store.save_run(snapshot_of("child", parent_id="root", agent="writer", started_at=later))
        store.save_run(snapshot_of("other", namespace="team2", parent_id="root", started_at=later))
        assert store.list_runs() == ["root", "child", "other", "late"]
        assert store.list_runs(agent="researcher") == ["root", "other", "late"]
        assert store.list_runs(namespace="team2") == ["other"]
        assert store.list_runs(parent_id="root") == ["child", "other"]
        assert store.list_runs(namespace="default", parent_id="root") == ["child"]
        assert store.list_runs(namespace="default", agent="writer", parent_id="root") == ["child"]
        assert store.list_runs(agent="nobody") == []

    # ------------------------------------------------------------------ retention
    def _retention_fixture(self, store: MemoryStore, key: Key = KEY) -> list[Message]:
        """Ten messages a day apart, from T0 - 10 days: m0 system, m3 pinned, m5 preserve."""
        start = T0 - timedelta(days=10)
        msgs: list[Message] = []
        for i in range(10):
            ts = start + timedelta(days=i)
            if i == 0:
                msgs.append(Message.system("rules", message_id=f"m{i}", timestamp=ts))
            elif i == 3:
                msgs.append(Message.user("pin", message_id=f"m{i}", timestamp=ts, pinned=True))
            elif i == 5:
                msgs.append(
                    Message.assistant(
                        "keep", message_id=f"m{i}", timestamp=ts, metadata={"preserve": True}
                    )
                )
            else:
                msgs.append(Message.user(f"u{i}", message_id=f"m{i}", timestamp=ts))
        store.append_messages(key, msgs)
        return msgs

    def test_retention_ttl_spares_protected(self, store: MemoryStore) -> None:
        """A ttl deletes messages older than now - ttl, except system / pinned / preserve ones."""
        self._retention_fixture(store)
        # cutoff = T0 - 4 days: m0..m5 are older; m6 (T0 - 4 days) is not (strictly older).
        deleted = store.enforce_retention(KEY, ttl=timedelta(days=4), now=T0)
        assert deleted == 3  # m1, m2, m4
        assert _ids(store.load_messages(KEY)) == ["m0", "m3", "m5", "m6", "m7", "m8", "m9"]
        assert store.enforce_retention(KEY, ttl=timedelta(days=4), now=T0) == 0

    def test_retention_ttl_default_now(self, store: MemoryStore) -> None:
        """Without ``now`` the current time is used."""
        old = Message.user("old", timestamp=datetime.now(UTC) - timedelta(days=2))
        new = Message.user("new")
        store.append_messages(KEY, [old, new])
        assert store.enforce_retention(KEY, ttl=timedelta(days=1)) == 1
        assert store.load_messages(KEY) == [new]

    def test_retention_max_messages_unprotected_first(self, store: MemoryStore) -> None:
        """Over ``max_messages`` the oldest unprotected go first, in append order."""
        self._retention_fixture(store)
        assert store.enforce_retention(KEY, max_messages=5, now=T0) == 5
        assert _ids(store.load_messages(KEY)) == ["m0", "m3", "m5", "m8", "m9"]

    def test_retention_max_messages_then_oldest_protected(self, store: MemoryStore) -> None:
        """When protected messages alone exceed the bound, the oldest protected go too."""
        self._retention_fixture(store)
        assert store.enforce_retention(KEY, max_messages=2, now=T0) == 8
        assert _ids(store.load_messages(KEY)) == ["m3", "m5"]
        assert store.count_messages(KEY) == 2

    def test_retention_ttl_then_max_messages(self, store: MemoryStore) -> None:
        """The ttl applies first, then the count bound, in one call."""
        self._retention_fixture(store)
        deleted = store.enforce_retention(KEY, ttl=timedelta(days=4), max_messages=4, now=T0)
        assert deleted == 6
        assert _ids(store.load_messages(KEY)) == ["m0", "m3", "m5", "m9"]

    def test_retention_all_keys(self, store: MemoryStore) -> None:
        """With no key, retention applies to every key separately."""
        self._retention_fixture(store, KEY)
        self._retention_fixture(store, OTHER_KEY)
        short: Key = ("default", "critic", "main")
        store.append_messages(short, user_messages(2, start=T0 - timedelta(hours=1)))
        deleted = store.enforce_retention(ttl=timedelta(days=4), max_messages=5, now=T0)
        assert deleted == 2 * 5
        for key in (KEY, OTHER_KEY):
            assert _ids(store.load_messages(key)) == ["m0", "m3", "m5", "m8", "m9"]
        assert store.count_messages(short) == 2

    def test_retention_leaves_other_keys(self, store: MemoryStore) -> None:
        """Retention for one key does not touch the others."""
        self._retention_fixture(store, KEY)
        other = self._retention_fixture(store, OTHER_KEY)
        store.enforce_retention(KEY, ttl=timedelta(days=1), max_messages=1, now=T0)
        assert store.count_messages(KEY) == 1
        assert store.load_messages(OTHER_KEY) == other

    def test_retention_without_limits_deletes_nothing(self, store: MemoryStore) -> None:
        """No ttl and no max_messages: nothing to enforce, 0 deleted."""
        msgs = self._retention_fixture(store)
        assert store.enforce_retention(now=T0) == 0
        assert store.enforce_retention(KEY, max_messages=10, ttl=timedelta(days=11), now=T0) == 0
        assert store.load_messages(KEY) == msgs

    def test_bound_applied_in_the_appending_batch(self, store: MemoryStore) -> None:
        """``[Append, EnforceRetention]`` in one batch: the key never holds more than N.

        Writers in several threads append in such batches while a reader samples the
        count: no committed state a reader can see is over the bound, and what is left
        is the newest N, whoever appended them (the bound is counted by the store).
        """
        bound, per_batch, batches, threads = 7, 3, 25, 3
        seen: list[int] = []
        done = threading.Event()

        def write(t: int) -> None:
            for i in range(batches):
                msgs = tuple(user_messages(per_batch, prefix=f"t{t}-{i}-"))
                store.batch([Append(KEY, msgs), EnforceRetention(KEY, None, bound, T0)])

        def read() -> None:
            while not done.is_set():
                seen.append(store.count_messages(KEY))

        reader = threading.Thread(target=read)
        reader.start()
        writers = [threading.Thread(target=write, args=(t,)) for t in range(threads)]
        for w in writers:
            w.start()
        for w in writers:
            w.join()
        done.set()
        reader.join()
        assert seen
        assert max(seen) <= bound
        assert store.count_messages(KEY) == bound
        ids = _ids(store.load_messages(KEY))
        assert [i.rsplit("-", 1)[1] for i in ids][-per_batch:] == ["0", "1", "2"]

    def test_bound_of_a_batch_larger_than_the_bound(self, store: MemoryStore) -> None:
        """Appending more than N at once keeps that batch's newest N (protected last)."""
        store.append_messages(KEY, [Message.system("rules", message_id="s", timestamp=T0)])
        msgs = tuple(user_messages(20))
        results = store.batch([Append(KEY, msgs), EnforceRetention(KEY, None, 5, T0)])
        assert results == [None, 16]
        assert _ids(store.load_messages(KEY)) == ["s", "m16", "m17", "m18", "m19"]
        assert store.count_messages(KEY) == 5
        assert store.enforce_retention(KEY, max_messages=5, now=T0) == 0

    # ------------------------------------------------------------------ fidelity
    def test_lossless_round_trip_of_every_field(self, store: MemoryStore) -> None:
        """Every field of every kind of message comes back equal."""
        ts = datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
        call = ToolCall(id="c1", name="weather", arguments={"city": "Tokyo", "days": [1, 2]})
        msgs = [
            Message.system("You are terse.", message_id="s", timestamp=ts),
            Message.user(
                [TextPart(text="look"), ImagePart(url="https://x.test/a.png", detail="low")],
                message_id="u",
                name="alice",
                images=("data:image/png;base64,AAAA",),
                metadata={"nested": {"a": [1, 2.5, None, True]}, "preserve": False},
                pinned=True,
                timestamp=ts,
            ),
            Message.assistant(None, tool_calls=[call], message_id="a", timestamp=ts),
            Message.tool("72F", tool_call_id="c1", name="weather", message_id="t", timestamp=ts),
            Message.agent_call({"task": "find", "n": 3}, name="planner", message_id="ac"),
            Message.assistant(
                "delegating",
                agent_calls=[AgentCall(id="g1", agent="researcher", request={"q": "Q4"})],
                structured_data={"plan": ["a", "b"], "ok": True},
                message_id="d",
            ),
            Message.agent_response("done \u2713 \U0001f600 \x00 'quotes' \"dq\"", name="r"),
        ]
        store.append_messages(KEY, msgs)
        loaded = store.load_messages(KEY)
        assert loaded == msgs
        for got, want in zip(loaded, msgs, strict=True):
            assert got.model_dump() == want.model_dump()

    def test_timezones(self, store: MemoryStore) -> None:
        """Timestamps in any timezone are stored as the same instant; filters compare instants."""
        tokyo = timezone(timedelta(hours=9))
        local = datetime(2024, 1, 1, 21, 0, tzinfo=tokyo)  # == T0 (12:00 UTC)
        m = Message.user("hi", message_id="tz", timestamp=local)
        store.append_messages(KEY, [m])
        (loaded,) = store.load_messages(KEY)
        assert loaded.timestamp == T0
        assert loaded.timestamp.utcoffset() == timedelta(0)
        assert store.load_messages(KEY, since=local) == [m]
        assert store.load_messages(KEY, since=local + timedelta(microseconds=1)) == []
        assert (
            store.delete_messages(
                KEY, before=datetime(2024, 1, 1, 7, 0, tzinfo=timezone(timedelta(hours=-5)))
            )
            == 0
        )
        assert (
            store.enforce_retention(KEY, ttl=timedelta(hours=1), now=local + timedelta(hours=1))
            == 0
        )
        assert (
            store.enforce_retention(KEY, ttl=timedelta(hours=1), now=local + timedelta(hours=2))
            == 1
        )

    def test_old_and_future_timestamps(self, store: MemoryStore) -> None:
        """Timestamps far in the past and future keep their order and exact value."""
        times = [
            datetime(1, 1, 1, tzinfo=UTC),
            datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
            datetime(1970, 1, 1, tzinfo=UTC),
            datetime(9999, 12, 31, 23, 59, 59, 999998, tzinfo=UTC),
            datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        ]
        msgs = [Message.user(str(i), message_id=f"t{i}", timestamp=t) for i, t in enumerate(times)]
        store.append_messages(KEY, msgs)
        assert store.load_messages(KEY) == msgs
        assert store.load_messages(KEY, since=times[4]) == msgs[4:]
        assert store.load_messages(KEY, since=times[2]) == msgs[2:]
        assert store.delete_messages(KEY, before=times[4]) == 4
        assert store.enforce_retention(KEY, ttl=timedelta.max, now=T0) == 0

    # ------------------------------------------------------------------ concurrency
    def test_threads_appending_concurrently(self, store: MemoryStore) -> None:
        """Appends from several threads are all kept, each thread's order preserved."""
        per_thread, threads = 50, 4

        def work(t: int) -> None:
            for i in range(per_thread):
                store.append_messages(KEY, user_messages(1, prefix=f"t{t}-{i}-"))

        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        ids = _ids(store.load_messages(KEY))
        assert len(ids) == len(set(ids)) == per_thread * threads
        for t in range(threads):
            mine = [i for i in ids if i.startswith(f"t{t}-")]
            assert mine == [f"t{t}-{i}-0" for i in range(per_thread)]

    # ------------------------------------------------------------------ async twins
    def test_async_twins(self, store: MemoryStore) -> None:
        """Every ``a``-prefixed method does what its sync twin does."""
        msgs = user_messages(4)
        snap = snapshot_of("r1")

        async def scenario() -> None:
            await store.aappend_messages(KEY, msgs[:2])
            await asyncio.gather(
                store.aappend_messages(KEY, msgs[2:]),
                store.aappend_messages(OTHER_KEY, user_messages(2, prefix="o")),
            )
            assert await store.aload_messages(KEY) == msgs
            assert await store.aload_messages(KEY, since=msgs[1].timestamp, last=2) == msgs[2:]
            assert await store.adelete_messages(KEY, ids=["m0"]) == 1
            assert await store.adelete_messages(KEY, before=msgs[2].timestamp) == 1
            await store.asave_run(snap)
            assert await store.aload_run("r1") == snap
            assert await store.aload_run("nope") is None
            deleted = await store.aenforce_retention(KEY, max_messages=1, now=T0)
            assert deleted == 1
            assert await store.abatch([CountMessages(KEY), ListKeys()]) == [1, [KEY, OTHER_KEY]]
            assert await store.adelete_messages(OTHER_KEY) == 2
            with pytest.raises(DuplicateMessageError):
                await store.aappend_messages(KEY, msgs[3:])

        asyncio.run(scenario())
        assert store.load_messages(KEY) == msgs[3:]

    # ------------------------------------------------------------------ lifecycle
    def test_closed_store_raises_store_error(self, store: MemoryStore) -> None:
        """After ``close`` every method raises StoreError; ``close`` is idempotent."""
        store.append_messages(KEY, user_messages(1))
        store.close()
        store.close()
        calls: list[Callable[[], object]] = [
            lambda: store.append_messages(KEY, user_messages(1, prefix="x")),
            lambda: store.load_messages(KEY),
            lambda: store.delete_messages(KEY),
            lambda: store.count_messages(KEY),
            lambda: store.list_keys(),
            lambda: store.save_run(snapshot_of("r1")),
            lambda: store.load_run("r1"),
            lambda: store.list_runs(),
            lambda: store.enforce_retention(ttl=timedelta(days=1)),
            lambda: store.batch([ListKeys()]),
            lambda: asyncio.run(store.aload_messages(KEY)),
            lambda: asyncio.run(store.aappend_messages(KEY, user_messages(1, prefix="y"))),
        ]
        for call in calls:
            with pytest.raises(StoreError, match="closed"):
                call()

    def test_context_manager_closes(self, store: MemoryStore) -> None:
        """``with store:`` closes it on exit."""
        with store as entered:
            assert entered is store
            store.append_messages(KEY, user_messages(1))
        assert store.closed
        with pytest.raises(StoreError):
            store.load_messages(KEY)
