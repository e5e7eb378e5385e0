"""The wire rules shared by every transport (coordination.wire) and the in-process broker."""

from __future__ import annotations

import asyncio

import pytest

from marsys_mem.coordination import transport, wire
from marsys_mem.coordination.transport import BrokerSession, InProcessBroker
from marsys_mem.exceptions import TransportError


def test_the_wire_rules_have_one_home():
    for name in (
        "DEFAULT_MAX_PAYLOAD",
        "control_topic",
        "fact_topic",
        "facts_filter",
        "namespace_prefix",
        "parse_fact_topic",
        "topic_matches",
        "validate_filter",
        "validate_topic",
    ):
        assert name in wire.__all__
        assert name not in transport.__all__  # no re-export: one home per name


def test_check_in_namespace_refuses_other_namespaces():
    wire.check_in_namespace("a", "marsys/a/branch/main/facts", "topic")
    with pytest.raises(ValueError, match="outside this transport's namespace 'a'"):
        wire.check_in_namespace("a", "marsys/ab/branch/main/facts", "topic")
    with pytest.raises(ValueError, match="topic filter 'marsys/#'"):
        wire.check_in_namespace("a", "marsys/#", "topic filter")


def test_check_payload_takes_bytes_like_up_to_the_limit():
    assert wire.check_payload(memoryview(b"abc"), 3) == b"abc"
    with pytest.raises(TypeError, match="must be bytes, got str"):
        wire.check_payload("abc", 10)
    with pytest.raises(ValueError, match="4 bytes is over the maximum of 3"):
        wire.check_payload(b"abcd", 3)


@pytest.mark.parametrize(
    ("flt", "topic", "expected"),
    [
        ("a/+/c", "a/b/c", True),
        ("a/#", "a", True),
        ("a/#", "a/b/c", True),
        ("a/+", "a/b/c", False),
        ("a/b", "a/b/c", False),
        ("a/b/c", "a/b", False),
    ],
)
def test_levels_match_is_topic_matches_on_split_levels(flt, topic, expected):
    assert wire.levels_match(flt.split("/"), topic.split("/")) is expected
    assert wire.topic_matches(flt, topic) is expected


async def test_broker_public_session_api():
    broker = InProcessBroker(max_queued=2)
    a = broker.connect("a", clean=True)
    b = broker.connect("b", clean=False)
    assert isinstance(b, BrokerSession)
    assert b.connected
    b.subscribe("marsys/t/#")
    with pytest.raises(TransportError, match="already connected"):
        broker.connect("b", clean=False)
    broker.publish("marsys/t/x", b"1", source=a)
    assert b.queue is not None
    assert await asyncio.wait_for(b.queue.get(), 1) == ("marsys/t/x", b"1")
    broker.disconnect(b)
    assert not b.connected
    for n in range(3):  # queued while away, the oldest dropped past max_queued
        broker.publish("marsys/t/x", str(n).encode())
    assert b.dropped == broker.dropped == 1
    again = broker.connect("b", clean=False)
    assert again is b
    assert [again.queue.get_nowait() for _ in range(2)] == [
        ("marsys/t/x", b"1"),
        ("marsys/t/x", b"2"),
    ]
    broker.disconnect(a)
    assert "a" not in broker.sessions  # a clean session is forgotten


def test_broker_session_subscribe_validates_the_filter():
    session = InProcessBroker().connect("c", clean=True)
    with pytest.raises(ValueError, match="'#' must be a whole last level"):
        session.subscribe("marsys/#/x")
    session.subscribe("marsys/t/+")
    session.unsubscribe("marsys/t/+")
    session.unsubscribe("never-subscribed")
    assert session.filters == {}
