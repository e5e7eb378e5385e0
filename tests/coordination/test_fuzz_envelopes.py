"""Fuzzing the wire: the envelope parser, the signature check and a coordinator's receive path.

Whatever arrives (arbitrary bytes, arbitrary JSON, envelopes with one field gone wrong,
signed or not, tampered or not), the answer is a clear library error or a success, never
a raw exception, and never over 1 s per input. Through a coordinator: each payload is
either delivered (a valid envelope for this namespace and topic) or dropped and counted
in exactly one of ``malformed`` / ``oversized`` / ``unsigned`` / ``bad_signature`` /
``stale`` / ``replayed``, and the coordinator keeps working.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from marsys_mem.config import CoordinatorSettings
from marsys_mem.coordination import (
    BranchGraph,
    Coordinator,
    EnvelopeSigner,
    FactEnvelope,
    InProcessBroker,
    InProcessTransport,
    MqttTransport,
    fact_topic,
)
from marsys_mem.coordination.signing import SIGNATURE_OVERHEAD, SignedWire
from marsys_mem.coordination.wire import parse_fact_topic
from marsys_mem.exceptions import SignatureError
from marsys_mem.model.facts import SharedFact
from marsys_mem.model.names import is_name
from marsys_mem.patterns.shared import SharedMemoryPool

NS = "fuzz"
KEY = "fuzzing-key-0123456789abcdef-xyz"  # a test key, not a real secret
MAX_PAYLOAD = 4096
DROPS = ("malformed", "oversized", "unsigned", "bad_signature", "stale", "replayed")
FUZZ = settings(
    max_examples=120,
    deadline=None,  # we time each input ourselves (the first ones pay for imports)
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# ---------------------------------------------------------------------------- strategies
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=20,
)
names = st.text(  # valid by the library's one naming rule (checked again by is_name)
    st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters="/+#@"),
    min_size=1, max_size=12,
).filter(is_name)


@st.composite
def valid_envelopes(draw: st.DrawFn) -> dict[str, Any]:
    branch = draw(st.sampled_from(["main", "r1"]) | names)
    text = draw(st.text(min_size=1, max_size=60).filter(str.strip))
    fact = SharedFact.create(
        text, agent=draw(st.sampled_from(["writer", "planner"]) | names), branch=branch,
        scope=draw(st.sampled_from(["branch", "subtree", "lineage", "global"])),
        confidence=draw(st.floats(0.0, 1.0)),
        metadata=draw(st.dictionaries(st.text(max_size=8), json_scalars, max_size=3)),
    )
    env = FactEnvelope(namespace=NS, sender=draw(names), seq=draw(st.integers(1, 2**63 - 1)),
                       branch=branch, scope=fact.scope, fact=fact,
                       conflict=draw(st.sampled_from([None, "newest", "confidence", "keep_both"])))
    return json.loads(env.model_dump_json())


FIELDS = ["v", "namespace", "sender", "seq", "branch", "scope", "conflict", "fact"]
FACT_FIELDS = ["id", "text", "source_agent", "source_branch", "scope", "created_at",
               "confidence", "metadata"]
EDGE_VALUES = [None, "", " ", 0, -1, 2**63, 2**64, 1e308, -0.0, [], {}, "\u202e", "x" * 300,
               True, "2024-13-45T99:99:99Z", "main/evil", "#", "+", "fuzz\x00"]


@st.composite
def mutated_envelopes(draw: st.DrawFn) -> tuple[str, bytes]:
    """A valid envelope with one thing wrong (or nothing), serialised in one of several ways.

    Returns the topic the envelope belongs on, and the payload.
    """
    env = draw(valid_envelopes())
    topic = fact_topic(NS, env["branch"])
    where = draw(st.sampled_from(["top", "fact", "none"]))
    target, fields = (env, FIELDS) if where == "top" else (env["fact"], FACT_FIELDS)
    if where != "none":
        field = draw(st.sampled_from(fields))
        action = draw(st.sampled_from(["set", "edge", "drop", "add"]))
        if action == "set":
            target[field] = draw(json_values)
        elif action == "edge":
            target[field] = draw(st.sampled_from(EDGE_VALUES))
        elif action == "drop":
            target.pop(field, None)
        else:
            target[draw(st.text(max_size=8))] = draw(json_values)
    ascii_only = draw(st.booleans())
    return topic, json.dumps(env, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


nested = st.integers(1, 3000).map(lambda n: b'{"fact":' * n + b"1" + b"}" * n) | st.integers(
    1, 3000
).map(lambda n: b"[" * n + b"]" * n)
any_json = json_values.map(lambda v: json.dumps(v).encode())
not_envelopes = (
    st.binary(max_size=600)
    | any_json
    | nested
    | st.binary(min_size=MAX_PAYLOAD - 10, max_size=MAX_PAYLOAD + 10)
)
payloads = not_envelopes | mutated_envelopes().map(lambda pair: pair[1])


# ---------------------------------------------------------------------------- helpers
def timed(fn: Any, *args: Any) -> Any:
    start = time.perf_counter()
    try:
        return fn(*args)
    finally:
        elapsed = time.perf_counter() - start
        assert elapsed < 1.0, f"{elapsed:.2f}s for one input"


def accepted_by_parser(topic: str, body: bytes) -> bool:
    """Independently of the coordinator: a valid envelope for NS on this topic?"""
    try:
        env = FactEnvelope.model_validate_json(body)
    except ValidationError:
        return False
    return len(body) <= MAX_PAYLOAD and env.namespace == NS and parse_fact_topic(topic) == (
        NS, env.branch,
    )


def graph() -> BranchGraph:
    g = BranchGraph()
    g.add_branch("main", agents=["writer", "planner"])
    g.fork("main", "r1", agents=["researcher"])
    return g


async def receive_one(topic: str, payload: bytes, *, signed: bool) -> dict[str, int]:
    """Publish ``payload`` raw to a fresh coordinator; its stats once handled, then a check."""
    broker = InProcessBroker()
    pool = SharedMemoryPool()
    coord = Coordinator(
        graph(), pool=pool, settings=CoordinatorSettings(max_payload=MAX_PAYLOAD),
        transport=InProcessTransport(broker, namespace=NS, max_payload=MAX_PAYLOAD,
                                     signing_key=KEY if signed else None),
    )
    raw = InProcessTransport(broker, namespace=NS, max_payload=2**20)
    async with coord, raw:
        await raw.publish(topic, payload)
        async with asyncio.timeout(1.0):
            while coord.stats["received"] + sum(coord.transport.rejected.values()) < 1:
                await asyncio.sleep(0)
        stats = coord.stats
        # still working: a real envelope from another sender is delivered after it
        check = FactEnvelope(namespace=NS, sender="fuzz-liveness-check", seq=1, branch="main",
                             scope="branch", fact=SharedFact.create("check", agent="writer"))
        body = check.model_dump_json().encode()
        sealed = EnvelopeSigner(KEY).sign(fact_topic(NS, "main"), body) if signed else body
        await raw.publish(fact_topic(NS, "main"), sealed)
        async with asyncio.timeout(1.0):
            while "check" not in [f.text for f in pool.facts_for("writer")]:
                await asyncio.sleep(0)
        assert coord.error is None
        assert coord.running
    return stats


def check_outcome(stats: dict[str, int], accepted: bool) -> None:
    drops = {k: stats[k] for k in DROPS if stats[k]}
    event("delivered" if accepted else f"dropped as {', '.join(drops)}")
    assert stats["errors"] == 0
    if accepted:
        assert drops == {}, drops
    else:
        assert sum(drops.values()) == 1, drops
        assert stats["delivered"] == 0


topics = st.sampled_from([fact_topic(NS, "main"), fact_topic(NS, "r1")]) | names.map(
    lambda b: fact_topic(NS, b)
)


@st.composite
def wire_inputs(draw: st.DrawFn) -> tuple[str, bytes]:
    """``(topic, payload)``: envelopes mostly on their own topic, anything on any topic."""
    if draw(st.booleans()):
        own_topic, payload = draw(mutated_envelopes())
        topic = draw(st.sampled_from([own_topic] * 4) | topics)
    else:
        topic, payload = draw(topics), draw(not_envelopes)
    return topic, payload


# ---------------------------------------------------------------------------- the parser
@FUZZ
@given(payload=payloads)
def test_the_envelope_parser_answers_every_payload_with_a_model_or_a_validation_error(payload):
    try:
        env = timed(FactEnvelope.model_validate_json, payload)
    except ValidationError:
        return
    # what parses serialises again, identically
    again = timed(env.model_dump_json)
    assert FactEnvelope.model_validate_json(again) == env


@FUZZ
@given(payload=payloads, topic=topics, key_id=st.sampled_from(["k1", "k2"]), flip=st.integers())
def test_the_signature_check_answers_every_payload_with_a_body_or_a_signature_error(
    payload, topic, key_id, flip
):
    signer = EnvelopeSigner(KEY, previous={"k2": KEY[::-1]})
    assert timed(signer.verify, topic, EnvelopeSigner(KEY, key_id="k1").sign(topic, payload)) \
        == payload
    other = EnvelopeSigner(KEY[::-1], key_id=key_id).sign(topic, payload)
    for data, verifies in ((payload, False), (other, key_id == "k2")):
        try:
            body = timed(signer.verify, topic, data)
        except SignatureError as exc:
            error: SignatureError | None = exc
        else:
            error = None
            assert data.startswith(b"mm2.k2.")
            assert body == payload
        assert (error is None) == verifies
        if error is not None:
            assert error.reason in ("unsigned", "bad_signature")
            assert len(str(error)) < 300
    sealed = signer.sign(topic, payload)
    i = flip % len(sealed)
    tampered = sealed[:i] + bytes([sealed[i] ^ 0x20]) + sealed[i + 1:]
    with pytest.raises(SignatureError):
        timed(signer.verify, topic, tampered)
    wire = SignedWire(signer, max_payload=MAX_PAYLOAD)
    opened = timed(wire.open, topic, sealed)
    assert opened == (payload if len(sealed) <= MAX_PAYLOAD + SIGNATURE_OVERHEAD else None)


# ---------------------------------------------------------------------------- receive path
@FUZZ
@given(wire=wire_inputs())
def test_a_coordinator_delivers_or_drops_and_counts_every_payload(wire):
    topic, payload = wire
    stats = timed(asyncio.run, receive_one(topic, payload, signed=False))
    check_outcome(stats, accepted_by_parser(topic, payload))


@FUZZ
@given(wire=wire_inputs(), how=st.sampled_from(["signed", "signed", "raw", "tampered"]),
       flip=st.integers(min_value=0))
def test_a_signing_coordinator_delivers_or_drops_and_counts_every_payload(wire, how, flip):
    topic, payload = wire
    sealed = EnvelopeSigner(KEY).sign(topic, payload)
    if how == "signed":
        data = sealed
    elif how == "tampered":
        i = flip % len(sealed)
        data = sealed[:i] + bytes([sealed[i] ^ 0x01]) + sealed[i + 1:]
    else:
        data = payload
    stats = timed(asyncio.run, receive_one(topic, data, signed=True))
    accepted = how == "signed" and accepted_by_parser(topic, payload)
    check_outcome(stats, accepted)
    if how != "signed":
        assert stats["received"] == 0  # nothing unverified reached the coordinator
        assert sum(stats[k] for k in ("unsigned", "bad_signature", "oversized")) == 1


# ---------------------------------------------------------------------------- over MQTT
HOSTILE = [
    b"", b"{}", b"null", b"\xff\xfe\xfd", b"mm1.", b"mm1.k1.", b"mm1.k1." + b"A" * 43 + b".{}",
    b"mm2.", b"mm2.k1.", b"mm2.k1.1.AAAAAAAAAAAAAAAA." + b"A" * 43 + b".{}",
    b"mm2.k1.99999999999999999999.AAAAAAAAAAAAAAAA." + b"A" * 43 + b".{}",
    b'{"v":1,"namespace":"fuzz","sender":"x","seq":1e999}', b"[" * 2000 + b"]" * 2000,
    b'{"v":1,' * 500, json.dumps({"text": "\udc80"}).encode(), b"\x00" * 100, b"x" * 5000,
]


async def test_hostile_payloads_through_a_real_broker_are_counted(mqtt_broker):
    # the MQTT receive path (the paho callback) checks signatures too: nothing raises there
    def transport(**kwargs: Any) -> MqttTransport:
        return MqttTransport(mqtt_broker.host, mqtt_broker.port, NS,
                             client_id=f"fuzz-{time.monotonic_ns()}", protocol=mqtt_broker.protocol,
                             clean_session=True, **kwargs)

    plain_pool, signed_pool = SharedMemoryPool(), SharedMemoryPool()
    plain = Coordinator(graph(), transport=transport(max_payload=MAX_PAYLOAD), pool=plain_pool)
    signed = Coordinator(graph(), transport=transport(max_payload=MAX_PAYLOAD, signing_key=KEY),
                         pool=signed_pool)
    raw = transport(max_payload=2**20)
    async with plain, signed, raw:
        start = time.perf_counter()
        for payload in HOSTILE:
            await raw.publish(fact_topic(NS, "main"), payload)
        await plain.share("writer", "still here")
        async with asyncio.timeout(10):
            while not (plain.stats["received"] >= len(HOSTILE)
                       and sum(signed.transport.rejected.values()) >= len(HOSTILE) + 1):
                await asyncio.sleep(0.01)
        assert time.perf_counter() - start < len(HOSTILE)
        assert plain.stats["malformed"] + plain.stats["oversized"] == len(HOSTILE)
        assert signed.stats["received"] == 0
        assert signed_pool.facts_for("writer") == []
        assert signed.stats["unsigned"] + signed.stats["bad_signature"] \
            + signed.stats["oversized"] == len(HOSTILE) + 1  # + plain's unsigned fact
        assert plain.error is None
        assert signed.error is None
