"""Fresh signed envelopes (issue 25 item 7b): captured payloads cannot be replayed.

The regression: a signed envelope captured off the broker and republished to a receiver
that started later was accepted (the MAC was valid and the new receiver had no ordering
state for its sender). Now every signed payload carries its signing time and a nonce,
under the MAC: receivers refuse what was signed outside their :class:`ReplayWindow` or
before their broker session began (``stale``), and copies of what they accepted within
it (``replayed``), both counted in ``Coordinator.stats``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import aiomqtt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from marsys_mem.coordination import (
    BranchGraph,
    Coordinator,
    EnvelopeSigner,
    FactEnvelope,
    InProcessBroker,
    InProcessTransport,
    MqttTransport,
    ReplayWindow,
    fact_topic,
)
from marsys_mem.coordination.signing import ReplayGuard, SignedWire
from marsys_mem.exceptions import SignatureError
from marsys_mem.model.facts import SharedFact
from marsys_mem.patterns.shared import SharedMemoryPool

KEY = "team-secret-0123456789abcdef-xyz"  # a test key, not a real secret


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def graph() -> BranchGraph:
    g = BranchGraph()
    g.add_branch("main", agents=["writer"])
    return g


def texts(pool: SharedMemoryPool) -> list[str]:
    return [f.text for f in pool.facts_for("writer")]


def envelope(ns: str, sender: str, seq: int, text: str) -> bytes:
    fact = SharedFact.create(text, agent="writer")
    return FactEnvelope(namespace=ns, sender=sender, epoch=1, seq=seq, branch="main",
                        scope="branch", fact=fact).model_dump_json().encode()


class Mqtt:
    """Signing transports and a raw aiomqtt client on the session's real broker."""

    def __init__(self, broker: Any, protocol: str | None = None) -> None:
        self.broker = broker
        self.ns = f"replay-{uuid.uuid4().hex[:10]}"
        # the amqtt fallback speaks MQTT 3.1.1 only
        self.protocol = protocol if broker.protocol == "5" and protocol else broker.protocol

    def transport(self, **kwargs: Any) -> MqttTransport:
        kwargs.setdefault("client_id", f"replay-{uuid.uuid4().hex[:12]}")
        kwargs.setdefault("signing_key", KEY)
        return MqttTransport(self.broker.host, self.broker.port, self.ns,
                             protocol=self.protocol, reconnect_min=0.05,
                             reconnect_max=0.5, **kwargs)

    def raw(self) -> aiomqtt.Client:
        v5 = self.protocol == "5"
        return aiomqtt.Client(
            self.broker.host, self.broker.port, identifier=f"raw-{uuid.uuid4().hex[:12]}",
            protocol=aiomqtt.ProtocolVersion.V5 if v5 else aiomqtt.ProtocolVersion.V311,
        )


async def capture(net: Mqtt, text: str) -> tuple[str, bytes]:
    """A coordinator shares ``text``; a raw client on the broker captures the signed bytes."""
    async with net.raw() as spy:
        await spy.subscribe(f"marsys/{net.ns}/branch/+/facts", qos=1)
        sender = Coordinator(graph(), transport=net.transport(), sender_id="coord-A",
                             pool=SharedMemoryPool())
        async with sender:
            await sender.share("writer", text)
            async with asyncio.timeout(10):
                async for message in spy.messages:
                    return message.topic.value, bytes(message.payload)
    raise AssertionError("nothing captured")  # pragma: no cover


# ---------------------------------------------------------------------------- the regression
@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
async def test_a_captured_envelope_replayed_to_a_receiver_started_later_is_refused(
    mqtt_broker, protocol
):
    # before: the later receiver delivered "wire 2M EUR" (1 of 1 probes)
    net = Mqtt(mqtt_broker, protocol)
    topic, sealed = await capture(net, "wire 2M EUR to DE00 1234")
    assert sealed.startswith(b"mm2.k1.")
    await asyncio.sleep(0.6)  # the capture is now older than the receiver's max_skew
    pool = SharedMemoryPool()
    window = ReplayWindow(max_skew=0.3)  # default 10 s; short to keep the test fast
    receiver = Coordinator(graph(), transport=net.transport(replay_window=window), pool=pool)
    async with receiver, net.raw() as attacker:
        assert receiver.transport.session_present is False
        for _ in range(3):
            await attacker.publish(topic, sealed, qos=1)
        await until(lambda: receiver.stats["stale"] == 3)
        assert texts(pool) == []
        assert receiver.stats["received"] == 0
        assert receiver.stats["replayed"] == 0
        assert receiver.error is None


async def test_with_the_default_window_a_later_receiver_refuses_a_minute_old_payload(
    mqtt_broker,
):
    net = Mqtt(mqtt_broker)
    pool = SharedMemoryPool()
    receiver = Coordinator(graph(), transport=net.transport(), pool=pool)
    signer = EnvelopeSigner(KEY)
    topic = fact_topic(net.ns, "main")
    async with receiver, net.raw() as publisher:
        old = signer.sign(topic, envelope(net.ns, "coord-A", 1, "a minute old"),
                          at=time.time() - 60)  # as a capture made a minute ago would be
        fresh = signer.sign(topic, envelope(net.ns, "coord-A", 2, "fresh"))
        await publisher.publish(topic, old, qos=1)
        await publisher.publish(topic, fresh, qos=1)
        await until(lambda: texts(pool) == ["fresh"])
        assert receiver.stats["stale"] == 1


# ---------------------------------------------------------------------------- within a run
async def test_a_running_receiver_refuses_copies_then_expired_payloads(mqtt_broker):
    net = Mqtt(mqtt_broker)
    pool = SharedMemoryPool()
    window = ReplayWindow(max_age=1.0)
    receiver = Coordinator(graph(), transport=net.transport(replay_window=window), pool=pool)
    signer = EnvelopeSigner(KEY)
    topic = fact_topic(net.ns, "main")
    sealed = signer.sign(topic, envelope(net.ns, "coord-A", 1, "once"))
    async with receiver, net.raw() as attacker:
        for _ in range(3):
            await attacker.publish(topic, sealed, qos=1)
        await until(lambda: receiver.stats["replayed"] == 2)
        assert texts(pool) == ["once"]
        await asyncio.sleep(1.1)  # past max_age: the nonce is forgotten, the time refuses it
        await attacker.publish(topic, sealed, qos=1)
        await until(lambda: receiver.stats["stale"] == 1)
        assert texts(pool) == ["once"]
        assert receiver.stats["received"] == 1


async def test_a_sender_clock_ahead_within_max_skew_is_accepted_beyond_it_refused(mqtt_broker):
    net = Mqtt(mqtt_broker)
    pool = SharedMemoryPool()
    receiver = Coordinator(graph(), transport=net.transport(), pool=pool)
    signer = EnvelopeSigner(KEY)
    topic = fact_topic(net.ns, "main")
    async with receiver, net.raw() as publisher:
        ahead = signer.sign(topic, envelope(net.ns, "coord-A", 1, "5 s ahead"),
                            at=time.time() + 5)
        future = signer.sign(topic, envelope(net.ns, "coord-A", 2, "an hour ahead"),
                             at=time.time() + 3600)
        await publisher.publish(topic, ahead, qos=1)
        await publisher.publish(topic, future, qos=1)
        await until(lambda: receiver.stats["stale"] == 1 and texts(pool) == ["5 s ahead"])


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
async def test_a_resumed_persistent_session_still_gets_what_was_queued(mqtt_broker, protocol):
    # the broker kept the session (CONNACK session present): what it queued while the
    # receiver was away is older than the new connection, and still accepted
    net = Mqtt(mqtt_broker, protocol)
    client_id = f"replay-persist-{uuid.uuid4().hex[:10]}"
    first = Coordinator(graph(), transport=net.transport(client_id=client_id),
                        pool=SharedMemoryPool())
    async with first:
        pass  # subscribed; the session stays on the broker
    sender = Coordinator(graph(), transport=net.transport(), pool=SharedMemoryPool())
    async with sender:
        for i in range(3):
            await sender.share("writer", f"queued {i}")
    await asyncio.sleep(0.5)
    pool = SharedMemoryPool()
    window = ReplayWindow(max_skew=0.1)
    again = Coordinator(graph(), transport=net.transport(client_id=client_id,
                                                         replay_window=window), pool=pool)
    async with again:
        assert again.transport.session_present is True
        await until(lambda: len(texts(pool)) == 3)
        assert texts(pool) == [f"queued {i}" for i in range(3)]
        assert again.stats["stale"] == again.stats["replayed"] == 0


async def test_away_longer_than_max_age_drops_what_was_queued_as_stale(mqtt_broker):
    net = Mqtt(mqtt_broker)
    client_id = f"replay-away-{uuid.uuid4().hex[:10]}"
    window = ReplayWindow(max_age=0.5)
    first = Coordinator(graph(), transport=net.transport(client_id=client_id),
                        pool=SharedMemoryPool())
    async with first:
        pass
    sender = Coordinator(graph(), transport=net.transport(), pool=SharedMemoryPool())
    async with sender:
        await sender.share("writer", "queued long ago")
    await asyncio.sleep(0.8)
    pool = SharedMemoryPool()
    again = Coordinator(graph(), transport=net.transport(client_id=client_id,
                                                         replay_window=window), pool=pool)
    async with again:
        await until(lambda: again.stats["stale"] == 1)
        assert texts(pool) == []


# ---------------------------------------------------------------------------- in process
async def test_in_process_sessions_follow_the_same_rules():
    broker = InProcessBroker()
    ns = "replay-inproc"
    signer = EnvelopeSigner(KEY)
    topic = fact_topic(ns, "main")
    window = ReplayWindow(max_skew=0.1)
    raw = InProcessTransport(broker, namespace=ns)
    persistent = InProcessTransport(broker, namespace=ns, client_id="p1", clean_session=False,
                                    signing_key=KEY, replay_window=window)
    async with persistent:
        await persistent.subscribe(f"marsys/{ns}/#")
    async with raw:
        await raw.publish(topic, signer.sign(topic, b"queued", at=time.time() - 1))
    pool = SharedMemoryPool()
    later = Coordinator(graph(), pool=pool, transport=InProcessTransport(
        broker, namespace=ns, signing_key=KEY, replay_window=window))
    resumed = InProcessTransport(broker, namespace=ns, client_id="p1", clean_session=False,
                                 signing_key=KEY, replay_window=window)
    async with later, resumed, raw:
        old = signer.sign(topic, envelope(ns, "coord-A", 1, "old"), at=time.time() - 1)
        await raw.publish(topic, old)
        await until(lambda: later.stats["stale"] == 1)
        assert texts(pool) == []
        async for item in resumed.messages():  # queued before it came back: delivered
            assert item == (topic, b"queued")
            break


# ---------------------------------------------------------------------------- the guard
@settings(max_examples=100, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.floats(0, 5), st.floats(-20, 5), st.integers(0, 30)), max_size=60
    ),
    max_remembered=st.integers(1, 20),
)
def test_the_guard_accepts_each_nonce_once_and_only_inside_the_window(ops, max_remembered):
    # each op: advance the clock, then check a payload signed at now + offset with a nonce
    # (a replay repeats both: they are under one MAC)
    now = [1_000_000.0]
    window = ReplayWindow(max_age=10, max_skew=2, max_remembered=max_remembered)
    guard = ReplayGuard(window, clock=lambda: now[0])
    guard.fresh_session()
    start = now[0]
    accepted: set[bytes] = set()
    pairs: set[tuple[float, bytes]] = set()
    for advance, offset, n in ops:
        now[0] += advance
        signed_at = now[0] + offset
        nonce = b"n%d" % n
        reason = None
        try:
            guard.check(signed_at, nonce, "t")
        except SignatureError as exc:
            reason = exc.reason
        if reason is not None:
            assert reason == "stale" or (reason == "replayed" and nonce in accepted)
            continue
        assert (signed_at, nonce) not in pairs  # never twice
        assert now[0] - 10 <= signed_at <= now[0] + 2
        assert signed_at > start - 2  # not before the session began (less max_skew)
        accepted.add(nonce)
        pairs.add((signed_at, nonce))
        assert guard.remembered <= max_remembered


def test_a_full_guard_forgets_the_oldest_and_refuses_what_was_signed_before_it():
    now = [1_000.0]
    guard = ReplayGuard(ReplayWindow(max_remembered=100), clock=lambda: now[0])
    for i in range(10_000):
        now[0] += 0.001
        guard.check(now[0], b"%d" % i, "t")
    assert guard.remembered == 100
    with pytest.raises(SignatureError, match="before this receiver's session") as info:
        guard.check(1_000.001, b"0", "t")  # the first one, forgotten: refused all the same
    assert info.value.reason == "stale"


def test_the_signed_time_is_under_the_mac():
    signer = EnvelopeSigner(KEY)
    topic = "marsys/t/branch/main/facts"
    sealed = signer.sign(topic, b"{}", at=1_700_000_000.0)
    assert sealed.split(b".")[2] == b"1700000000000"
    moved = sealed.replace(b"1700000000000", b"1700000099000")
    with pytest.raises(SignatureError, match="bad signature"):
        signer.verify(topic, moved)
    assert signer.unseal(topic, sealed).signed_at == 1_700_000_000.0
    assert signer.sign(topic, b"{}") != signer.sign(topic, b"{}")  # a new nonce each time
    with pytest.raises(ValueError, match="at must be a time from 1970 on, got -1"):
        signer.sign(topic, b"{}", at=-1)


def test_an_old_mm1_payload_is_refused_with_a_clear_reason():
    wire = SignedWire(EnvelopeSigner(KEY), max_payload=1024)
    assert wire.open("marsys/t/x", b"mm1.k1." + b"A" * 43 + b".{}") is None
    assert wire.rejected["bad_signature"] == 1
    with pytest.raises(SignatureError, match=r"mm1 payload .* upgrade every coordinator"):
        EnvelopeSigner(KEY).verify("marsys/t/x", b"mm1.k1." + b"A" * 43 + b".{}")


@pytest.mark.parametrize(
    ("kwargs", "field", "value"),
    [
        ({"max_age": 0}, "max_age", "0"),
        ({"max_age": "300"}, "max_age", "'300'"),
        ({"max_skew": -1}, "max_skew", "-1"),
        ({"max_skew": True}, "max_skew", "True"),
        ({"max_remembered": 0}, "max_remembered", "0"),
        ({"max_remembered": 1.5}, "max_remembered", "1.5"),
        ({"window": 5}, "window", "5"),
    ],
)
def test_bad_windows_name_the_field_and_value(kwargs, field, value):
    with pytest.raises(ValidationError) as info:
        ReplayWindow(**kwargs)
    text = str(info.value)
    assert field in text
    assert f"input_value={value}" in text


def test_a_replay_window_needs_a_signing_key_and_the_right_type():
    with pytest.raises(ValueError, match="replay_window needs a signing_key"):
        InProcessTransport(namespace="t", replay_window=ReplayWindow())
    with pytest.raises(TypeError, match="replay_window must be a ReplayWindow, got dict"):
        MqttTransport("127.0.0.1", 1883, "t", client_id="c", signing_key=KEY,
                      replay_window={"max_age": 5})  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="frozen"):
        ReplayWindow().max_age = 1  # type: ignore[misc]
