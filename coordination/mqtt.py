"""MqttTransport: shared facts through a real MQTT broker (aiomqtt, MQTT 3.1.1, QoS 1).

Guarantees, with a broker that keeps sessions (mosquitto, with ``persistence true`` if they
must survive a broker restart):

* **At least once, nothing acknowledged lost.** Every publish is QoS 1: :meth:`publish`
  returns when the broker acknowledged it (PUBACK). While the connection is down, publishes
  wait and are sent after the reconnect; a publish whose acknowledgement was lost with the
  connection is sent again (so a receiver may see it twice: the coordinator dedupes).
* **Persistent session.** With ``clean_session=False`` (the default) and a stable
  ``client_id``, the broker keeps this client's subscriptions and queues what is published
  on them while it is away (MQTT 5: for ``session_expiry`` seconds); reconnecting delivers
  it. Two live transports must never share a ``client_id`` (the broker would disconnect
  one for the other, over and over).
* **MQTT 5 by default**, subscribing with *No Local*: the broker does not send a client's
  own publishes back to it (half the traffic of a coordinator that also listens).
  ``protocol="3.1.1"`` for brokers without MQTT 5 (own publishes then come back; the
  coordinator ignores them).
* **Automatic reconnect** in a background task, with exponential backoff (plus jitter)
  from ``reconnect_min`` to ``reconnect_max`` seconds. Subscriptions are renewed.
* **Clear errors.** aiomqtt/paho errors are wrapped at the boundary
  (``raise TransportError(...) from exc``); refused credentials raise
  :class:`~marsys_mem.coordination.AuthenticationError`, also when they stop working on a
  reconnect (pending publishes then fail with it). A payload over ``max_payload`` raises
  ``ValueError`` before anything is sent; topics outside ``marsys/<namespace>/`` too.
* **Optional signing.** With ``signing_key`` (the namespace's shared secret), every payload
  is signed with its time (HMAC-SHA256, :mod:`~marsys_mem.coordination.signing`) and
  received payloads that are unsigned, badly signed, stale or replayed are dropped before
  anything parses them, counted in :attr:`MqttTransport.rejected`. Each connect on which
  the broker has no session for this client (CONNACK *session present* unset) refuses
  payloads signed before it (less the window's ``max_skew``): nothing older can be due.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from typing import Any, Final, Literal, Self, cast

import aiomqtt
import paho.mqtt.client as mqtt
from paho.mqtt.client import MQTT_CLEAN_START_FIRST_ONLY
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from marsys_mem.coordination.signing import (
    EnvelopeSigner,
    ReplayWindow,
    SignedWire,
    rejected_counts,
    signed_wire,
)
from marsys_mem.coordination.wire import (
    DEFAULT_MAX_PAYLOAD,
    check_in_namespace,
    check_payload,
    validate_filter,
    validate_topic,
)
from marsys_mem.exceptions import AuthenticationError, CoordinationError, TransportError
from marsys_mem.lifecycle import AsyncClosing
from marsys_mem.model.names import validate_name

__all__ = ["MqttTransport"]

log = logging.getLogger("marsys_mem.coordination.mqtt")

_CLOSED: Final = object()
# CONNACK refusals that mean "wrong credentials": MQTT 3.1.1 codes 4 and 5, and the
# MQTT 5 reason codes paho maps them to (134 bad user name or password, 135 not authorized)
_AUTH_CODES: Final = frozenset({4, 5, 134, 135})


def _rc_value(rc: object) -> int | None:
    value = getattr(rc, "value", rc)
    return value if isinstance(value, int) else None


class _Client(aiomqtt.Client):
    """aiomqtt's client, telling :attr:`on_session` whether the broker resumed a session."""

    on_session: Callable[[bool], None] | None = None

    def _on_connect(
        self,
        client: mqtt.Client,
        userdata: Any,
        flags: mqtt.ConnectFlags,
        reason_code: ReasonCode,
        properties: Properties | None = None,
    ) -> None:
        if reason_code == mqtt.CONNACK_ACCEPTED and self.on_session is not None:
            self.on_session(bool(flags.session_present))  # before any message is handed on
        super()._on_connect(client, userdata, flags, reason_code, properties)


class _Connection:
    """One connected aiomqtt client and the publishes waiting for its acknowledgements."""

    __slots__ = ("client", "lost", "waiting")

    def __init__(self, client: aiomqtt.Client) -> None:
        self.client = client
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting: set[asyncio.Timeout] = set()


class MqttTransport(AsyncClosing):
    """A :class:`~marsys_mem.coordination.Transport` over MQTT (aiomqtt), QoS 1.

    Args:
        host: the broker's host name or address.
        port: the broker's port.
        namespace: the namespace whose topics (``marsys/<namespace>/...``) it may use.
        client_id: the MQTT client id; stable across restarts of the same agent group so
            that its persistent session finds it again. Unique among live clients.
        username: user name, if the broker requires one.
        password: password, if the broker requires one.
        tls: ``True`` for TLS with the system's CAs, an ``ssl.SSLContext`` for your own
            settings, ``None``/``False`` for plain TCP.
        keepalive: seconds between keepalive pings (a dead broker is noticed within ~1.5x).
        max_payload: largest payload :meth:`publish` sends (bytes).
        reconnect_min: first reconnect delay (seconds), doubled after each failure.
        reconnect_max: longest reconnect delay (seconds).
        clean_session: ``False`` (default): a persistent session; ``True``: the broker
            forgets this client's subscriptions and queue when it disconnects.
        connect_timeout: how long entering the context keeps trying to connect before it
            raises :class:`~marsys_mem.coordination.TransportError`.
        publish_timeout: how long :meth:`publish` may wait (for a reconnect and for the
            acknowledgement) before it raises ``TransportError``; ``None`` waits as long
            as the transport is open.
        max_inflight: most unacknowledged QoS 1 publishes on the wire at once.
        protocol: ``"5"`` (default) or ``"3.1.1"``.
        session_expiry: MQTT 5: seconds the broker keeps a persistent session after a
            disconnect (default: one week).
        signing_key: the namespace's shared key (bytes/str, or an
            :class:`~marsys_mem.coordination.EnvelopeSigner`): every payload is signed,
            and received payloads that are unsigned or badly signed are dropped and
            counted in :attr:`rejected`. ``None`` (default): no signing.
        replay_window: how fresh signed payloads must be (default
            :class:`~marsys_mem.coordination.ReplayWindow`); only with ``signing_key``.

    Example:
        >>> transport = MqttTransport("127.0.0.1", 1883, "team-a", client_id="planner-1")
        >>> transport
        MqttTransport('127.0.0.1:1883', namespace='team-a', client_id='planner-1', closed)
        >>> async def main():  # doctest: +SKIP
        ...     async with transport:
        ...         await transport.subscribe("marsys/team-a/branch/+/facts")
        ...         await transport.publish("marsys/team-a/branch/main/facts", b"{}")
    """

    def __init__(
        self,
        host: str,
        port: int = 1883,
        namespace: str = "default",
        *,
        client_id: str,
        username: str | None = None,
        password: str | None = None,
        tls: ssl.SSLContext | bool | None = None,
        keepalive: int = 30,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        reconnect_min: float = 0.1,
        reconnect_max: float = 5.0,
        clean_session: bool = False,
        connect_timeout: float = 10.0,
        publish_timeout: float | None = None,
        max_inflight: int = 100,
        protocol: Literal["5", "3.1.1"] = "5",
        session_expiry: int = 7 * 24 * 3600,
        signing_key: EnvelopeSigner | bytes | str | None = None,
        replay_window: ReplayWindow | None = None,
    ) -> None:
        if not isinstance(host, str) or not host:
            raise ValueError(f"host must be a non-empty string, got {host!r}")
        if not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"port must be 1-65535, got {port!r}")
        if not isinstance(client_id, str) or not 0 < len(client_id) <= 128:
            raise ValueError(f"client_id must be 1-128 characters, got {client_id!r}")
        if password is not None and username is None:
            raise ValueError("a password needs a username")
        if max_payload < 1:
            raise ValueError(f"max_payload must be >= 1, got {max_payload}")
        if not 0 < reconnect_min <= reconnect_max:
            raise ValueError("need 0 < reconnect_min <= reconnect_max")
        if keepalive < 1 or max_inflight < 1 or connect_timeout < 0:
            raise ValueError("keepalive and max_inflight must be >= 1, connect_timeout >= 0")
        if publish_timeout is not None and publish_timeout <= 0:
            raise ValueError("publish_timeout must be > 0 or None")
        if protocol not in ("5", "3.1.1"):
            raise ValueError(f"protocol must be '5' or '3.1.1', got {protocol!r}")
        if not 0 <= session_expiry <= 0xFFFFFFFF:
            raise ValueError("session_expiry must be 0..4294967295 seconds")
        self.host = host
        self.port = port
        self.namespace = validate_name("namespace", namespace)
        self.client_id = client_id
        self.username = username
        self._password = password
        if tls is True:
            self._tls: ssl.SSLContext | None = ssl.create_default_context()
        elif tls is False or tls is None:
            self._tls = None
        elif isinstance(tls, ssl.SSLContext):
            self._tls = tls
        else:
            raise TypeError(f"tls must be a bool or an ssl.SSLContext, got {type(tls).__name__}")
        self.keepalive = keepalive
        self.max_payload = max_payload
        self.reconnect_min = reconnect_min
        self.reconnect_max = reconnect_max
        self.clean_session = clean_session
        self.connect_timeout = connect_timeout
        self.publish_timeout = publish_timeout
        self.max_inflight = max_inflight
        self.protocol = protocol
        self.session_expiry = session_expiry
        self._wire: SignedWire | None = signed_wire(signing_key, max_payload, replay_window)
        self.reconnects = 0  # successful reconnects since entering
        self.session_present: bool | None = None  # did the last CONNACK resume a session
        self._filters: list[str] = []
        self._entered = False
        self._closing = False
        self._fatal: TransportError | None = None
        self._conn: _Connection | None = None
        self._connected = asyncio.Event()
        self._incoming: asyncio.Queue[object] = asyncio.Queue()
        self._supervisor: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ state
    @property
    def connected(self) -> bool:
        """True while a connection to the broker is up."""
        conn = self._conn
        return conn is not None and not conn.lost.done()

    @property
    def address(self) -> str:
        """``host:port``."""
        return f"{self.host}:{self.port}"

    @property
    def rejected(self) -> dict[str, int]:
        """Received payloads dropped by signing (:data:`~.signing.REJECTIONS`), by reason."""
        return rejected_counts(self._wire)

    # ------------------------------------------------------------------ connecting
    def _make_client(self) -> aiomqtt.Client:
        incoming, wire = self._incoming, self._wire

        class _Forward(asyncio.Queue[aiomqtt.Message]):
            """aiomqtt's message queue, forwarding straight into this transport's queue.

            One queue outlives reconnects, so nothing received is lost when a
            connection (and its aiomqtt client) is replaced.
            """

            def put_nowait(self, item: aiomqtt.Message) -> None:
                topic, payload = item.topic.value, bytes(item.payload)
                if wire is not None:
                    body = wire.open(topic, payload)  # never raises: bad ones are counted
                    if body is None:
                        return
                    payload = body
                incoming.put_nowait((topic, payload))

        v5 = self.protocol == "5"
        properties: Properties | None = None
        if v5:
            properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            properties.SessionExpiryInterval = 0 if self.clean_session else self.session_expiry
        client = _Client(
            self.host,
            self.port,
            identifier=self.client_id,
            username=self.username,
            password=self._password,
            protocol=aiomqtt.ProtocolVersion.V5 if v5 else aiomqtt.ProtocolVersion.V311,
            clean_session=None if v5 else self.clean_session,
            clean_start=self.clean_session if v5 else MQTT_CLEAN_START_FIRST_ONLY,
            properties=properties,
            keepalive=self.keepalive,
            tls_context=self._tls,
            queue_type=_Forward,
            max_inflight_messages=self.max_inflight,
            timeout=max(self.connect_timeout, 1.0),
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
        )
        client.pending_calls_threshold = 1_000_000  # queued publishes are expected here
        client.on_session = self._on_session
        return client

    def _on_session(self, present: bool) -> None:
        """CONNACK: without a session on the broker, nothing signed before now can be due."""
        self.session_present = present
        if not present and self._wire is not None:
            self._wire.fresh_session()

    async def _connect_once(self) -> _Connection:
        client = self._make_client()
        try:
            await client.__aenter__()
        except aiomqtt.MqttCodeError as exc:  # a refused CONNACK (MqttConnectError)
            if _rc_value(exc.rc) in _AUTH_CODES:
                raise AuthenticationError(
                    f"MQTT broker at {self.address} refused client {self.client_id!r}: {exc} "
                    f"(check username/password{'' if self.username else '; none was given'})"
                ) from exc
            raise TransportError(
                f"MQTT broker at {self.address} refused the connection: {exc}"
            ) from exc
        except aiomqtt.MqttError as exc:
            raise TransportError(f"cannot connect to MQTT broker at {self.address}: {exc}") from exc
        conn = _Connection(client)
        try:
            for topic_filter in self._filters:
                await self._subscribe_on(conn, topic_filter)
        except BaseException:
            await self._close_client(client)
            raise
        return conn

    async def _subscribe_on(self, conn: _Connection, topic_filter: str) -> None:
        try:
            if self.protocol == "5":
                options = SubscribeOptions(qos=1, noLocal=True)
                codes = await conn.client.subscribe(topic_filter, options=options)
            else:
                codes = await conn.client.subscribe(topic_filter, qos=1)
        except aiomqtt.MqttError as exc:
            raise TransportError(f"subscribing to {topic_filter!r} failed: {exc}") from exc
        for code in codes:
            value = _rc_value(code)
            if value is not None and value >= 0x80:
                raise TransportError(
                    f"MQTT broker at {self.address} refused the subscription {topic_filter!r} "
                    f"(reason code {value})"
                )

    @staticmethod
    async def _close_client(client: aiomqtt.Client) -> None:
        with contextlib.suppress(Exception, asyncio.TimeoutError):
            await asyncio.wait_for(client.__aexit__(None, None, None), timeout=2.0)

    def _delay(self, delay: float) -> float:
        return delay * (0.8 + 0.4 * random.random())  # noqa: S311 (reconnect jitter, not crypto)

    async def _initial_connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.connect_timeout
        delay = self.reconnect_min
        while True:
            try:
                return await self._connect_once()
            except AuthenticationError:
                raise
            except TransportError:
                if loop.time() + delay > deadline:
                    raise
            await asyncio.sleep(self._delay(delay))
            delay = min(delay * 2, self.reconnect_max)

    async def __aenter__(self) -> Self:
        if self._entered:
            raise CoordinationError("this MqttTransport is already connected (not re-entrant)")
        self._entered = True
        self._closing = False
        self._fatal = None
        self._incoming = asyncio.Queue()
        self._connected = asyncio.Event()
        try:
            self._conn = await self._initial_connect()
        except BaseException:
            self._entered = False
            raise
        self._connected.set()
        self._supervisor = asyncio.get_running_loop().create_task(
            self._supervise(), name=f"mqtt-supervisor-{self.client_id}"
        )
        return self

    def _lost(self, conn: _Connection) -> None:
        """Mark ``conn`` dead: wake the publishes waiting on it (they publish again)."""
        if conn.lost.done():
            return
        conn.lost.set_result(None)
        if self._conn is conn:
            self._connected.clear()
        now = asyncio.get_running_loop().time()
        for cm in list(conn.waiting):
            cm.reschedule(now)

    async def _supervise(self) -> None:
        """Watch the connection; when it drops, reconnect with backoff (until closed)."""
        while True:
            conn = self._conn
            if conn is None:
                return
            try:
                # nothing is ever queued on the client itself (_Forward): this only ends
                # when the connection does
                async for _ in conn.client.messages:
                    pass  # pragma: no cover
            except aiomqtt.MqttError as exc:
                log.warning("MQTT connection to %s lost: %s", self.address, exc)
            self._lost(conn)
            await self._close_client(conn.client)
            delay = self.reconnect_min
            while not self._closing:
                try:
                    new = await self._connect_once()
                except AuthenticationError as exc:
                    log.error("%s", exc)
                    self._fail(exc)
                    return
                except TransportError as exc:
                    log.info(
                        "reconnect to %s failed (%s); next try in %.2fs", self.address, exc, delay
                    )
                    await asyncio.sleep(self._delay(delay))
                    delay = min(delay * 2, self.reconnect_max)
                    continue
                self._conn = new
                self.reconnects += 1
                self._connected.set()
                log.info("reconnected to MQTT broker at %s", self.address)
                break
            else:
                return

    def _fail(self, exc: TransportError) -> None:
        self._fatal = exc
        self._connected.set()  # wake the waiting publishes: they raise
        self._incoming.put_nowait(exc)

    async def close(self) -> None:
        """Disconnect cleanly (idempotent). A persistent session stays on the broker."""
        if not self._entered:
            return
        self._closing = True
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None:
            supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await supervisor
        conn, self._conn = self._conn, None
        if conn is not None:
            self._lost(conn)
            await self._close_client(conn.client)
        self._connected.set()
        self._incoming.put_nowait(_CLOSED)
        self._entered = False

    # ------------------------------------------------------------------ using
    def _check_usable(self) -> None:
        if self._fatal is not None:
            raise type(self._fatal)(str(self._fatal)) from self._fatal
        if not self._entered or self._closing:
            raise TransportError("the transport is closed: use 'async with transport:'")

    async def _connection(self) -> _Connection:
        while True:
            self._check_usable()
            conn = self._conn
            if conn is not None and not conn.lost.done():
                return conn
            await self._connected.wait()
            if self._conn is None or self._conn.lost.done():
                await asyncio.sleep(0)  # the event was set to wake us on close/failure

    async def publish(self, topic: str, payload: bytes) -> None:
        """Publish ``payload`` on ``topic`` with QoS 1; returns once the broker acknowledged.

        Waits through reconnects (up to ``publish_timeout``).

        Raises:
            ValueError: a bad topic, one outside the namespace, or a payload over
                ``max_payload`` (nothing is sent).
            TransportError: the transport is closed, failed permanently, or the timeout
                passed.
        """
        validate_topic(topic)
        check_in_namespace(self.namespace, topic, "topic")
        data = check_payload(payload, self.max_payload)
        if self._wire is not None:
            data = self._wire.seal(topic, data)
        self._check_usable()
        if self.publish_timeout is None:
            await self._publish(topic, data)
            return
        try:
            async with asyncio.timeout(self.publish_timeout):
                await self._publish(topic, data)
        except TimeoutError as exc:
            raise TransportError(
                f"publish to {topic!r} not acknowledged within {self.publish_timeout}s"
            ) from exc

    async def _publish(self, topic: str, data: bytes) -> None:
        while True:
            conn = await self._connection()
            cm: asyncio.Timeout | None = None
            try:
                async with asyncio.timeout(None) as cm:
                    conn.waiting.add(cm)
                    try:
                        await conn.client.publish(topic, data, qos=1, timeout=math.inf)
                    finally:
                        conn.waiting.discard(cm)
                return
            except TimeoutError:
                if cm is None or not cm.expired():
                    raise
                # the connection dropped before the PUBACK: send again on the next one
            except aiomqtt.MqttError as exc:
                # e.g. "not connected": wait (briefly) for the supervisor to see the loss
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(conn.lost), timeout=1.0)
                if not conn.lost.done():
                    raise TransportError(f"publish to {topic!r} failed: {exc}") from exc

    async def subscribe(self, topic_filter: str) -> None:
        """Subscribe (QoS 1) to ``topic_filter``; renewed on every reconnect.

        Raises:
            ValueError: a bad filter or one outside the namespace.
            TransportError: the broker refused it, or the transport is closed.
        """
        validate_filter(topic_filter)
        check_in_namespace(self.namespace, topic_filter, "topic filter")
        self._check_usable()
        if topic_filter not in self._filters:
            self._filters.append(topic_filter)
        conn = self._conn
        if conn is None or conn.lost.done():
            return  # subscribed when the connection is back
        try:
            await self._subscribe_on(conn, topic_filter)
        except TransportError:
            if not conn.lost.done():
                self._filters.remove(topic_filter)
                raise

    def messages(self) -> AsyncIterator[tuple[str, bytes]]:
        """``(topic, payload)`` of each message received, across reconnects, until closed.

        What arrived before the close is still yielded.

        Raises:
            TransportError: the connection failed permanently (e.g. credentials refused
                on a reconnect).
        """
        if not self._entered:
            raise TransportError("the transport is closed: use 'async with transport:'")
        return self._iterate(self._incoming)

    @staticmethod
    async def _iterate(queue: asyncio.Queue[object]) -> AsyncIterator[tuple[str, bytes]]:
        while True:
            item = queue.get_nowait() if not queue.empty() else await queue.get()
            if item is _CLOSED:
                queue.put_nowait(_CLOSED)  # other iterators end too
                return
            if isinstance(item, TransportError):
                queue.put_nowait(item)
                raise type(item)(str(item)) from item
            yield cast("tuple[str, bytes]", item)

    def __repr__(self) -> str:
        state = "connected" if self.connected else ("reconnecting" if self._entered else "closed")
        return (
            f"MqttTransport({self.address!r}, namespace={self.namespace!r}, "
            f"client_id={self.client_id!r}, {state})"
        )
