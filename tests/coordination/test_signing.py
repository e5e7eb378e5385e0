"""Signed envelopes (issue 9 item 8): forged, tampered, replayed and unsigned payloads.

Every behaviour test runs in process and through a real mosquitto broker. The regression:
without signing, a raw client that forges another coordinator's sender id with a higher
``seq`` silenced every later real fact of that sender (5 of 5 trials, 0 of 5 facts
delivered); with ``signing_key=`` the forgery is dropped and counted, and the real facts
all arrive.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from marsys_mem.config import CoordinatorSettings
from marsys_mem.coordination import (
    SIGNING_KEY_ENV,
    BranchGraph,
    Coordinator,
    EnvelopeSigner,
    FactEnvelope,
    InProcessBroker,
    InProcessTransport,
    MqttTransport,
    fact_topic,
)
from marsys_mem.coordination.signing import SIGNATURE_OVERHEAD, SignedWire, as_signer
from marsys_mem.exceptions import ConfigError, CoordinationError, SignatureError
from marsys_mem.model.facts import SharedFact
from marsys_mem.patterns.shared import SharedMemoryPool

KEY = "team-secret-0123456789abcdef-xyz"  # a test key, not a real secret
OTHER_KEY = b"another-namespace-key-0123456789"
TOPIC = "marsys/team/branch/main/facts"


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Wait until ``predicate()`` holds; False if it did not within ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.005)
    return True


class Net:
    """Transports of one kind (in process or MQTT) on one broker."""

    def __init__(self, kind: str, broker: Any) -> None:
        self.kind = kind
        self.broker = broker

    def transport(self, ns: str, **kwargs: Any) -> Any:
        if self.kind == "inprocess":
            return InProcessTransport(self.broker, namespace=ns, **kwargs)
        kwargs.setdefault("protocol", self.broker.protocol)
        return MqttTransport(
            self.broker.host, self.broker.port, ns,
            client_id=f"sig-{uuid.uuid4().hex[:16]}", reconnect_min=0.05, reconnect_max=0.5,
            **kwargs,
        )


@pytest.fixture(params=["inprocess", "mqtt"])
def net(request: pytest.FixtureRequest) -> Net:
    if request.param == "inprocess":
        return Net("inprocess", InProcessBroker())
    return Net("mqtt", request.getfixturevalue("mqtt_broker"))


@pytest.fixture
def ns() -> str:
    return f"sig-{uuid.uuid4().hex[:10]}"


def graph() -> BranchGraph:
    g = BranchGraph()
    g.add_branch("main", agents=["writer"])
    g.fork("main", "r1", agents=["researcher"])
    return g


def forged(ns: str, sender: str, seq: int, text: str = "forged", branch: str = "main") -> bytes:
    fact = SharedFact.create(text, agent="writer", branch=branch)
    env = FactEnvelope(namespace=ns, sender=sender, seq=seq, branch=branch, scope="branch",
                       fact=fact)
    return env.model_dump_json().encode()


def texts(pool: SharedMemoryPool, key: str = "writer") -> list[str]:
    return [f.text for f in pool.facts_for(key)]


# ---------------------------------------------------------------------------- the regression
async def test_a_forged_sender_with_a_higher_seq_cannot_silence_the_real_one(net, ns):
    # issue 9 item 8: before, 0 of the 5 real facts after the forgery arrived (5 of 5 trials)
    pool_b = SharedMemoryPool()
    a = Coordinator(graph(), transport=net.transport(ns, signing_key=KEY), sender_id="coord-A",
                    pool=SharedMemoryPool(), settings=CoordinatorSettings(gap_timeout=0.05))
    b = Coordinator(graph(), transport=net.transport(ns, signing_key=KEY), sender_id="coord-B",
                    pool=pool_b, settings=CoordinatorSettings(gap_timeout=0.05))
    attacker = net.transport(ns)  # a raw client on the namespace's topics, without the key
    wrong_key = net.transport(ns, signing_key=OTHER_KEY)  # signs, with another namespace's key
    async with a, b, attacker, wrong_key:
        await a.share("writer", "real 0")
        assert await until(lambda: texts(pool_b) == ["real 0"])
        await attacker.publish(fact_topic(ns, "main"), forged(ns, "coord-A", 1_000_000))
        await wrong_key.publish(fact_topic(ns, "main"), forged(ns, "coord-A", 2_000_000))
        assert await until(lambda: b.stats["unsigned"] == 1 and b.stats["bad_signature"] == 1)
        await asyncio.sleep(0.2)  # past gap_timeout: a forged seq would have moved coord-A on
        for i in range(1, 6):
            await a.share("writer", f"real {i}")
        assert await until(lambda: len(texts(pool_b)) >= 6), texts(pool_b)
        await asyncio.sleep(0.05)
        assert texts(pool_b) == [f"real {i}" for i in range(6)]
        stats = b.stats
        assert stats["received"] == 6  # the forgeries never reached the coordinator
        assert stats["delivered"] == 6
        assert stats["duplicates"] == 0
        assert stats["gaps"] == 0
        assert b.error is None


async def test_a_tampered_captured_payload_does_not_verify(net, ns):
    pool_b = SharedMemoryPool()
    a = Coordinator(graph(), transport=net.transport(ns, signing_key=KEY), sender_id="coord-A",
                    pool=SharedMemoryPool())
    b = Coordinator(graph(), transport=net.transport(ns, signing_key=KEY), pool=pool_b)
    spy = net.transport(ns)  # sees the raw signed bytes on the wire
    captured: list[tuple[str, bytes]] = []

    async def listen() -> None:
        async for item in spy.messages():
            captured.append(item)

    async with a, b, spy:
        await spy.subscribe(f"marsys/{ns}/#")
        task = asyncio.get_running_loop().create_task(listen())
        await a.share("writer", "the budget is 4000 EUR")
        assert await until(lambda: len(captured) == 1 and len(texts(pool_b)) == 1)
        topic, sealed = captured[0]
        assert sealed.startswith(b"mm2.k1.")
        assert b'"the budget is 4000 EUR"' in sealed  # signed, not encrypted
        tampered = [
            sealed.replace(b"4000 EUR", b"9000 EUR"),
            sealed.replace(b'"seq":1', b'"seq":7'),
            sealed.replace(b"mm2.k1.", b"mm2.k2."),  # a key id nobody has
            sealed[:60] + bytes([sealed[60] ^ 1]) + sealed[61:],  # one bit of the MAC
            sealed[: sealed.rindex(b".", 0, 90)],  # the header alone
            sealed[:7] + b"9" + sealed[8:],  # another signing time
            b"mm1." + sealed[4:],  # the old format, without a signing time
        ]
        for payload in tampered:
            await spy.publish(topic, payload)
        assert await until(lambda: b.stats["bad_signature"] == len(tampered))
        assert texts(pool_b) == ["the budget is 4000 EUR"]
        assert b.stats["received"] == 1
        task.cancel()


async def test_a_replayed_signed_payload_is_refused_or_does_not_verify(net, ns):
    # the MAC binds the topic: replaying onto another branch fails; replaying on the same
    # topic is a copy of a nonce already seen, dropped by the replay guard (issue 25 item 7)
    pool_b = SharedMemoryPool()
    a = Coordinator(graph(), transport=net.transport(ns, signing_key=KEY), sender_id="coord-A",
                    pool=SharedMemoryPool())
    b = Coordinator(graph(), transport=net.transport(ns, signing_key=KEY), pool=pool_b)
    spy = net.transport(ns)
    captured: list[tuple[str, bytes]] = []

    async def listen() -> None:
        async for item in spy.messages():
            captured.append(item)

    async with a, b, spy:
        await spy.subscribe(f"marsys/{ns}/#")
        task = asyncio.get_running_loop().create_task(listen())
        await a.share("writer", "once only")
        assert await until(lambda: len(captured) == 1 and b.stats["delivered"] == 1)
        topic, sealed = captured[0]
        for _ in range(3):
            await spy.publish(topic, sealed)
        await spy.publish(fact_topic(ns, "r1"), sealed)
        assert await until(lambda: b.stats["replayed"] == 3 and b.stats["bad_signature"] == 1)
        assert b.stats["duplicates"] == 0  # never reached the coordinator
        assert texts(pool_b) == ["once only"]
        assert pool_b.facts_for("researcher@r1") == []
        assert b.stats["delivered"] == 1
        task.cancel()


async def test_signed_and_unsigned_coordinators_do_not_mix(net, ns):
    # a namespace signs everywhere or nowhere: each side drops the other's payloads, counted
    signed_pool, plain_pool = SharedMemoryPool(), SharedMemoryPool()
    signed = Coordinator(graph(), transport=net.transport(ns, signing_key=KEY), pool=signed_pool)
    plain = Coordinator(graph(), transport=net.transport(ns), pool=plain_pool)
    async with signed, plain:
        await signed.share("writer", "from the signed one")
        await plain.share("writer", "from the plain one")
        assert await until(lambda: signed.stats["unsigned"] == 1 and plain.stats["malformed"] == 1)
        assert texts(signed_pool) == ["from the signed one"]
        assert texts(plain_pool) == ["from the plain one"]
        assert signed.stats["received"] == 0


async def test_own_echoes_are_still_ignored_when_signed_over_mqtt_3_1_1(mqtt_broker, ns):
    net = Net("mqtt", mqtt_broker)
    pool_a, pool_b = SharedMemoryPool(), SharedMemoryPool()
    a = Coordinator(graph(), transport=net.transport(ns, signing_key=KEY, protocol="3.1.1"),
                    pool=pool_a)
    b = Coordinator(graph(), transport=net.transport(ns, signing_key=KEY, protocol="3.1.1"),
                    pool=pool_b)
    async with a, b:
        for i in range(3):
            await a.share("writer", f"fact {i}")
        assert await until(lambda: b.stats["received"] == 3 and a.stats["received"] == 3)
        assert texts(pool_a) == texts(pool_b) == [f"fact {i}" for i in range(3)]
        assert a.stats["duplicates"] == 0
        assert a.stats["unsigned"] == a.stats["bad_signature"] == 0


async def test_an_oversized_signed_payload_is_dropped_before_the_mac(net, ns):
    b = Coordinator(graph(), transport=net.transport(ns, signing_key=KEY, max_payload=4096),
                    pool=SharedMemoryPool(), settings=CoordinatorSettings(max_payload=1024))
    big = net.transport(ns, signing_key=KEY, max_payload=1024 * 1024)
    async with b, big:
        await big.publish(fact_topic(ns, "main"), b"x" * (4096 + SIGNATURE_OVERHEAD + 1))
        await big.publish(fact_topic(ns, "main"), b"y" * 1500)  # verifies; too big for b
        assert await until(lambda: b.stats["oversized"] == 2)
        assert b.transport.rejected == {"unsigned": 0, "bad_signature": 0, "oversized": 1,
                                        "stale": 0, "replayed": 0}
        assert b.stats["received"] == 1


async def test_signing_limits_the_body_not_the_signed_payload(net, ns):
    # a body exactly at max_payload still goes out: the signature is on top of it
    pool_b = SharedMemoryPool()
    a = Coordinator(graph(), transport=net.transport(ns, signing_key=KEY), pool=SharedMemoryPool(),
                    settings=CoordinatorSettings(max_payload=2048))
    b = Coordinator(graph(), transport=net.transport(ns, signing_key=KEY), pool=pool_b,
                    settings=CoordinatorSettings(max_payload=2048))
    async with a, b:
        overhead = len(a._envelope(SharedFact.create("z", agent="writer"), "main", "branch")[1])
        text = "z" * (2048 - overhead - 8)  # (timestamps vary by a few bytes)
        await a.share("writer", text)
        assert await until(lambda: texts(pool_b) == [text])


# ---------------------------------------------------------------------------- the signer
def test_sign_and_verify_round_trip_and_every_tamper_fails():
    signer = EnvelopeSigner(KEY)
    sealed = signer.sign(TOPIC, b'{"v":1,"x":"a.b.c"}')
    assert signer.verify(TOPIC, sealed) == b'{"v":1,"x":"a.b.c"}'
    header_len = len(sealed) - len(b'{"v":1,"x":"a.b.c"}')
    stamp = sealed.split(b".")[2]
    for i in range(len(sealed)):
        flipped = sealed[:i] + bytes([sealed[i] ^ 0x01]) + sealed[i + 1:]
        with pytest.raises(SignatureError) as info:
            signer.verify(TOPIC, flipped)
        assert info.value.reason == ("unsigned" if i < 4 else "bad_signature"), i
    assert header_len == len(b"mm2.k1.") + len(stamp) + 1 + 16 + 1 + 43 + 1
    assert len(stamp) == 13  # milliseconds since 1970
    for topic in ("marsys/team/branch/r1/facts", "marsys/other/branch/main/facts", ""):
        with pytest.raises(SignatureError, match="bad signature"):
            signer.verify(topic, sealed)
    with pytest.raises(SignatureError, match="bad signature"):
        EnvelopeSigner(OTHER_KEY).verify(TOPIC, sealed)
    for unsigned in (b"", b"{}", b"mm2", b"mm3.k1.x.y", b"MM2.k1.", b"\xff" * 10):
        with pytest.raises(SignatureError, match="unsigned") as info:
            signer.verify(TOPIC, unsigned)
        assert info.value.reason == "unsigned"
    for bad in (b"mm2.", b"mm2.k1", b"mm2.k1.abc", b"mm2..x.y", b"mm2.\xff.x.y",
                b"mm2.k1.12x.AAAAAAAAAAAAAAAA.m.b", b"mm2.k1.1.short.m.b",
                b"mm1.k1." + b"A" * 43 + b".{}"):  # the old format: no signing time
        with pytest.raises(SignatureError) as info:
            signer.verify(TOPIC, bad)
        assert info.value.reason == "bad_signature"


def test_signature_errors_belong_to_the_library_hierarchy():
    assert issubclass(SignatureError, CoordinationError)
    assert issubclass(SignatureError, ValueError)
    with pytest.raises(SignatureError) as info:
        EnvelopeSigner(KEY).verify(
            "t/" + "x" * 10_000, b"mm2." + b"k" * 10_000 + b".1.AAAAAAAAAAAAAAAA.m.b"
        )
    assert len(str(info.value)) < 300  # never the whole value


def test_key_rotation_accepts_previous_keys_and_signs_with_the_new_one():
    old = EnvelopeSigner(KEY, key_id="2025-06")
    new = EnvelopeSigner(OTHER_KEY, key_id="2025-07", previous={"2025-06": KEY})
    assert new.verify(TOPIC, old.sign(TOPIC, b"x")) == b"x"
    assert new.sign(TOPIC, b"x").startswith(b"mm2.2025-07.")
    assert new.key_ids == ("2025-07", "2025-06")
    with pytest.raises(SignatureError, match="unknown key id"):
        old.verify(TOPIC, new.sign(TOPIC, b"x"))
    # the same key id under another key is a bad signature, not a silent accept
    impostor = EnvelopeSigner(OTHER_KEY, key_id="2025-06")
    with pytest.raises(SignatureError, match="bad signature"):
        new.verify(TOPIC, impostor.sign(TOPIC, b"x"))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"key": "short"}, "the signing key is 5 bytes; at least 16"),
        ({"key": b""}, "is 0 bytes"),
        ({"key": 1234567890123456789}, "bytes or str, got int"),
        ({"key": None}, "bytes or str, got NoneType"),
        ({"key": "\udc80" * 20}, "UTF-8"),
        ({"key": KEY, "key_id": ""}, "key_id must be 1-32"),
        ({"key": KEY, "key_id": "a.b"}, "key_id must be 1-32"),
        ({"key": KEY, "key_id": "x" * 33}, "key_id must be 1-32"),
        ({"key": KEY, "key_id": 7}, "key_id must be 1-32"),
        ({"key": KEY, "previous": {"k1": OTHER_KEY}}, "key id 'k1' is given twice"),
        ({"key": KEY, "previous": {"old": "tiny"}}, "the key 'old' is 4 bytes"),
    ],
)
def test_bad_keys_raise_config_errors_that_never_show_the_key(kwargs, match):
    with pytest.raises(ConfigError, match=match) as info:
        EnvelopeSigner(**kwargs)
    for key in (kwargs["key"], *(kwargs.get("previous") or {}).values()):
        if isinstance(key, str) and len(key) >= 4:
            assert key not in str(info.value)


def test_the_key_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(SIGNING_KEY_ENV, raising=False)
    with pytest.raises(ConfigError, match=SIGNING_KEY_ENV):
        EnvelopeSigner.from_env()
    monkeypatch.setenv(SIGNING_KEY_ENV, KEY)
    from_env = EnvelopeSigner.from_env(key_id="ops")
    assert EnvelopeSigner(KEY, key_id="ops").verify(TOPIC, from_env.sign(TOPIC, b"b")) == b"b"
    monkeypatch.setenv("TEAM_B_KEY", "too short")
    with pytest.raises(ConfigError, match="9 bytes"):
        EnvelopeSigner.from_env("TEAM_B_KEY")


def test_the_repr_and_transports_never_show_the_key():
    signer = EnvelopeSigner(KEY, previous={"old": OTHER_KEY})
    assert KEY not in repr(signer)
    assert OTHER_KEY.decode() not in repr(signer)
    assert repr(signer) == "EnvelopeSigner(key_id='k1', accepts=['k1', 'old'])"
    transport = MqttTransport("127.0.0.1", 1883, "team", client_id="c", signing_key=KEY)
    assert KEY not in repr(transport)
    assert as_signer(signer) is signer
    assert as_signer(None) is None
    assert InProcessTransport(namespace="team").rejected == {
        "unsigned": 0, "bad_signature": 0, "oversized": 0, "stale": 0, "replayed": 0,
    }


def test_signed_wire_logs_a_bounded_number_of_warnings(caplog):
    wire = SignedWire(EnvelopeSigner(KEY), max_payload=64)
    with caplog.at_level(logging.WARNING, logger="marsys_mem.coordination"):
        for _ in range(1000):
            assert wire.open(TOPIC, b"{}") is None
        assert wire.open(TOPIC, b"mm2." + b"x" * 200) is None
    assert wire.rejected == {"unsigned": 1000, "bad_signature": 0, "oversized": 1,
                             "stale": 0, "replayed": 0}
    assert len(caplog.records) == 5  # unsigned #1, #10, #100, #1000; oversized #1
