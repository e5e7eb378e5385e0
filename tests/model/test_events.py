"""Tests for marsys_mem.model.events: event models and the bounded EventBus."""

import asyncio
import logging
from datetime import datetime

import pytest
from pydantic import ValidationError

from marsys_mem.model.events import (
    EVENT_ADAPTER,
    AddEvent,
    ClearEvent,
    EventBus,
    ForkEvent,
    RemoveEvent,
    SummarizeEvent,
    TrimEvent,
    WindowEvent,
)

ALL_EVENTS = [
    AddEvent(before=0, after=2, message_ids=("m1", "m2"), agent="researcher"),
    RemoveEvent(before=2, after=1, message_ids=("m1",)),
    ClearEvent(before=5, after=1),
    TrimEvent(
        before=9,
        after=4,
        strategy="trim_oldest",
        tokens_before=90,
        tokens_after=40,
        message_ids=("a", "b"),
    ),
    SummarizeEvent(
        before=100,
        after=21,
        strategy="summarize",
        summarized=79,
        tokens_before=5000,
        tokens_after=900,
    ),
    WindowEvent(before=10, after=3, strategy="sliding_window", tokens_before=100, tokens_after=30),
    ForkEvent(before=3, after=3, child="researcher-2"),
]
KINDS = ["add", "remove", "clear", "trim", "summarize", "window", "fork"]


@pytest.fixture
def bus() -> EventBus:
    return EventBus(max_history=50)


def trim(n: int = 0) -> TrimEvent:
    return TrimEvent(
        before=n + 1, after=n, strategy="trim_oldest", tokens_before=10, tokens_after=5
    )


# --------------------------------------------------------------------------- models


@pytest.mark.parametrize(("event", "kind"), list(zip(ALL_EVENTS, KINDS, strict=True)), ids=KINDS)
def test_event_kind_and_round_trip(event, kind):
    assert event.kind == kind
    assert isinstance(event.timestamp, datetime)
    assert event.timestamp.tzinfo is not None
    back = EVENT_ADAPTER.validate_json(EVENT_ADAPTER.dump_json(event))
    assert type(back) is type(event)
    assert back == event


def test_event_fields():
    add, remove, _clear, trim_event, summ, window, fork = ALL_EVENTS
    assert add.message_ids == ("m1", "m2")
    assert add.agent == "researcher"
    assert remove.agent is None
    assert trim_event.strategy == "trim_oldest"
    assert (trim_event.tokens_before, trim_event.tokens_after) == (90, 40)
    assert summ.summarized == 79
    assert window.tokens_after == 30
    assert fork.child == "researcher-2"
    assert ForkEvent(before=0, after=0).child is None
    assert AddEvent(before=0, after=0).message_ids == ()


def test_discriminated_union_picks_model_by_kind():
    ev = EVENT_ADAPTER.validate_python({"kind": "clear", "before": 3, "after": 0})
    assert isinstance(ev, ClearEvent)
    with pytest.raises(ValidationError):
        EVENT_ADAPTER.validate_python({"kind": "explode", "before": 1, "after": 0})


def test_events_frozen_and_strict():
    ev = ClearEvent(before=1, after=0)
    with pytest.raises(ValidationError):
        ev.after = 5  # type: ignore[misc]
    with pytest.raises(ValidationError, match="extra"):
        ClearEvent(before=1, after=0, surprise=True)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="before"):
        ClearEvent(before=-1, after=0)
    with pytest.raises(ValidationError, match="after"):
        AddEvent(before=0, after=-3)
    with pytest.raises(ValidationError, match="strategy"):
        TrimEvent(before=1, after=0, tokens_before=1, tokens_after=0)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="kind"):
        ClearEvent(before=1, after=0, kind="add")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- subscribe


@pytest.mark.parametrize(("event", "kind"), list(zip(ALL_EVENTS, KINDS, strict=True)), ids=KINDS)
def test_subscribe_by_kind_only_gets_that_kind(bus, event, kind):
    seen: list = []
    bus.subscribe(kind, seen.append)
    for ev in ALL_EVENTS:
        bus.publish(ev)
    assert seen == [event]


def test_subscribe_star_gets_everything(bus):
    seen: list = []
    bus.subscribe("*", seen.append)
    for ev in ALL_EVENTS:
        bus.publish(ev)
    assert seen == ALL_EVENTS


def test_handlers_called_in_order_kind_then_star(bus):
    calls: list[str] = []
    bus.subscribe("*", lambda e: calls.append("star"))
    bus.subscribe("trim", lambda e: calls.append("trim-1"))
    bus.subscribe("trim", lambda e: calls.append("trim-2"))
    bus.publish(trim())
    assert sorted(calls) == ["star", "trim-1", "trim-2"]
    assert calls.index("trim-1") < calls.index("trim-2")


def test_unsubscribe(bus):
    seen: list = []
    unsubscribe = bus.subscribe("trim", seen.append)
    bus.publish(trim(1))
    unsubscribe()
    bus.publish(trim(2))
    assert [e.after for e in seen] == [1]
    unsubscribe()  # idempotent
    star_seen: list = []
    unsub_star = bus.subscribe("*", star_seen.append)
    bus.publish(trim(3))
    unsub_star()
    bus.publish(trim(4))
    assert [e.after for e in star_seen] == [3]


def test_unsubscribe_one_of_two_registrations(bus):
    seen: list = []
    first = bus.subscribe("clear", seen.append)
    bus.subscribe("clear", seen.append)
    first()
    bus.publish(ClearEvent(before=1, after=0))
    assert len(seen) == 1


def test_handler_may_unsubscribe_itself_during_publish(bus):
    seen: list = []

    def once(event):
        seen.append(event)
        unsubscribe()

    unsubscribe = bus.subscribe("trim", once)
    bus.publish(trim(1))
    bus.publish(trim(2))
    assert [e.after for e in seen] == [1]


@pytest.mark.parametrize("kind", ["bogus", "ADD", "", "all"])
def test_subscribe_unknown_kind(bus, kind):
    with pytest.raises(ValueError, match="unknown event kind"):
        bus.subscribe(kind, print)  # type: ignore[arg-type]
    assert not bus.wants(kind)


@pytest.mark.parametrize("handler", [None, 42, "print"])
def test_subscribe_non_callable(bus, handler):
    with pytest.raises(TypeError, match="callable"):
        bus.subscribe("trim", handler)
    assert not bus.wants("trim")


def test_wants(bus):
    assert not any(bus.wants(k) for k in KINDS)
    unsub = bus.subscribe("add", print)
    assert bus.wants("add")
    assert not bus.wants("trim")
    unsub()
    assert not bus.wants("add")
    unsub_star = bus.subscribe("*", print)
    assert all(bus.wants(k) for k in KINDS)
    unsub_star()
    assert not any(bus.wants(k) for k in KINDS)


# --------------------------------------------------------------------------- history


def test_history_records_in_order_and_filters(bus):
    for ev in ALL_EVENTS:
        bus.publish(ev)
    assert bus.history() == ALL_EVENTS
    assert list(bus) == ALL_EVENTS
    assert len(bus) == len(ALL_EVENTS)
    assert bus.history("trim") == [ALL_EVENTS[3]]
    assert bus.history("nothing") == []


def test_history_recorded_without_subscribers(bus):
    bus.publish(trim())
    assert len(bus) == 1


def test_history_is_bounded():
    bus = EventBus(max_history=7)
    assert bus.max_history == 7
    events = [trim(i) for i in range(70)]
    for i, ev in enumerate(events):
        bus.publish(ev)
        assert len(bus) == min(i + 1, 7)
    assert len(bus) == 7
    assert bus.history() == events[-7:]  # the oldest were dropped
    assert [e.after for e in bus] == list(range(63, 70))


def test_history_copy_is_independent(bus):
    bus.publish(trim())
    hist = bus.history()
    hist.clear()
    assert len(bus) == 1


def test_max_history_zero_keeps_nothing_but_still_delivers():
    bus = EventBus(max_history=0)
    seen: list = []
    bus.subscribe("*", seen.append)
    bus.publish(trim())
    assert len(bus) == 0
    assert bus.max_history == 0
    assert len(seen) == 1


def test_negative_max_history_rejected():
    with pytest.raises(ValueError, match="max_history"):
        EventBus(max_history=-1)


def test_default_max_history():
    assert EventBus().max_history == 1000


def test_clear_keeps_subscriptions(bus):
    seen: list = []
    bus.subscribe("trim", seen.append)
    bus.publish(trim())
    bus.clear()
    assert len(bus) == 0
    bus.publish(trim())
    assert len(seen) == 2
    assert len(bus) == 1


# --------------------------------------------------------------------------- errors


def test_raising_handler_does_not_propagate(bus, caplog):
    seen: list = []

    def boom(event):
        raise RuntimeError("handler exploded")

    bus.subscribe("trim", boom)
    bus.subscribe("trim", seen.append)
    with caplog.at_level(logging.ERROR, logger="marsys_mem.model.events"):
        bus.publish(trim(1))
        bus.publish(trim(2))
    assert bus.errors == 2
    assert len(seen) == 2  # later handlers still run
    assert len(bus) == 2
    records = [r for r in caplog.records if r.name == "marsys_mem.model.events"]
    assert len(records) == 2
    assert all(r.levelno == logging.ERROR for r in records)
    assert "handler exploded" in caplog.text


def test_errors_start_at_zero():
    assert EventBus().errors == 0


def test_async_handler_without_running_loop_counts_as_error(bus, caplog):
    ran: list = []

    async def handler(event):
        ran.append(event)

    bus.subscribe("trim", handler)
    with caplog.at_level(logging.ERROR, logger="marsys_mem.model.events"):
        bus.publish(trim())  # no running loop: must not raise, must not leak a coroutine
    assert bus.errors == 1
    assert ran == []
    assert "running event loop" in caplog.text


# --------------------------------------------------------------------------- async


async def test_async_handler_scheduled_on_running_loop(bus):
    seen: list = []
    done = asyncio.Event()

    async def handler(event):
        await asyncio.sleep(0)
        seen.append(event)
        done.set()

    bus.subscribe("trim", handler)
    ev = trim()
    bus.publish(ev)
    assert seen == []  # scheduled, not run inline
    await asyncio.wait_for(done.wait(), timeout=2)
    assert seen == [ev]
    assert bus.errors == 0


async def test_sync_and_async_handlers_mixed(bus):
    sync_seen: list = []
    async_seen: list = []

    async def handler(event):
        async_seen.append(event)

    bus.subscribe("*", handler)
    bus.subscribe("clear", sync_seen.append)
    for i in range(5):
        bus.publish(ClearEvent(before=i + 1, after=0))
    assert len(sync_seen) == 5
    for _ in range(5):
        await asyncio.sleep(0)
    assert [e.before for e in async_seen] == [1, 2, 3, 4, 5]


async def test_async_handler_error_is_counted(bus, caplog):
    async def boom(event):
        raise RuntimeError("async handler exploded")

    bus.subscribe("trim", boom)
    with caplog.at_level(logging.ERROR):
        bus.publish(trim())
        for _ in range(3):
            await asyncio.sleep(0)
    assert bus.errors == 1
