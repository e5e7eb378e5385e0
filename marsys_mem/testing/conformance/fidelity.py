"""Conformance: what is stored comes back equal (:attr:`Capability.FIDELITY`).

Clause of :mod:`marsys_mem.store.base`: ``MemoryStore`` is "Durable storage for messages
and run snapshots": a message comes back as it was appended, every field and every
timestamp (any timezone, any year) included, and filters compare instants.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from marsys_mem.model.messages import AgentCall, ImagePart, Message, TextPart, ToolCall
from marsys_mem.store.base import MemoryStore
from marsys_mem.testing.conformance.data import KEY, T0
from marsys_mem.testing.conformance.harness import StoreHarness

__all__ = ["FidelityConformance"]


class FidelityConformance(StoreHarness):
    """Lossless round trips: every message field, timezones, extreme timestamps.

    Example:
        >>> import pytest
        >>> from marsys_mem.store import InMemoryStore
        >>> class TestFidelity(FidelityConformance):
        ...     @pytest.fixture
        ...     def store(self):
        ...         with InMemoryStore() as s:
        ...             yield s
    """

    def test_lossless_round_trip_of_every_field(self, store: MemoryStore) -> None:
        """``MemoryStore``: durable storage for messages, as they were appended.

        Checks: every field of every kind of message (parts, images, tool and agent
        calls, structured data, nested metadata, odd characters) comes back equal.
        """
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
        """``Load``: ``since``: only messages with timestamp >= since (an instant).

        Checks: timestamps in any timezone are stored as the same instant (returned in
        UTC); ``since``, ``before`` and ``ttl`` compare instants.
        """
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
        """``MemoryStore``: durable storage for messages, timestamps exact.

        Checks: timestamps from year 1 to 9999 (microseconds included) keep their order
        and exact value; filters and the largest ttl still work at the extremes.
        """
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
