"""Transports for shared facts: the :class:`Transport` protocol and :class:`InProcessTransport`.

A transport moves opaque payloads (bytes) between coordinators on MQTT-style topics. The
topic scheme and the checks every transport makes (the namespace fence, payload size) are
in :mod:`marsys_mem.coordination.wire`. Every transport is bound to one namespace and
refuses topics outside ``marsys/<namespace>/``, so no payload crosses namespaces.

:class:`InProcessTransport` talks to an :class:`InProcessBroker` (one per process by default)
with asyncio queues. It mirrors what the MQTT transport guarantees with QoS 1 and a persistent
session: a client that disconnects and reconnects with the same ``client_id`` receives what
was published on its subscriptions while it was away (up to ``max_queued`` payloads).

The errors of the coordination layer (:class:`CoordinationError` and below) are in
:mod:`marsys_mem.exceptions`, with the rest of the library's.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from collections import deque
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Final, Protocol, Self, cast, runtime_checkable

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
    levels_match,
    validate_filter,
    validate_topic,
)
from marsys_mem.exceptions import (
    CoordinationError,
    TransportError,
)
from marsys_mem.lifecycle import AsyncClosing
from marsys_mem.model.names import validate_name

__all__ = ["BrokerSession", "InProcessBroker", "InProcessTransport", "Transport"]

log = logging.getLogger("marsys_mem.coordination")


# ---------------------------------------------------------------------------- protocol
@runtime_checkable
class Transport(Protocol):
    """Moves payloads between coordinators on MQTT-style topics (a Protocol).

    A transport is an async context manager: entering connects, leaving closes. Delivery
    is at least once (QoS 1): a payload may arrive twice, never reordered for one
    publisher on a stable connection; the coordinator dedupes and orders facts. Whether a
    client's own publishes come back to it depends on the transport (not with MQTT 5 or
    in process by default); the coordinator ignores its own.

    Attributes:
        namespace: the namespace whose topics (``marsys/<namespace>/...``) it may use.
        max_payload: the largest payload :meth:`publish` sends.

    Example:
        >>> isinstance(InProcessTransport(InProcessBroker()), Transport)
        True
    """

    namespace: str
    max_payload: int

    async def __aenter__(self) -> Self:
        """Connect."""
        ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close."""
        ...

    async def publish(self, topic: str, payload: bytes) -> None:
        """Send ``payload`` on ``topic``; returns when the broker has accepted it."""
        ...

    async def subscribe(self, topic_filter: str) -> None:
        """Receive what is published on topics matching ``topic_filter``."""
        ...

    def messages(self) -> AsyncIterator[tuple[str, bytes]]:
        """``(topic, payload)`` of each message received, until the transport closes."""
        ...


# ---------------------------------------------------------------------------- in process
_CLOSED: Final = object()


class BrokerSession:
    """One client's session on an :class:`InProcessBroker` (what MQTT calls a session).

    Made by :meth:`InProcessBroker.connect`; it outlives a disconnect unless it is clean.

    Attributes:
        client_id: the client's id (unique on its broker).
        clean: forget the session when the client disconnects.
        no_local: do not deliver the client's own publishes back to it.
        filters: the subscribed topic filters, each with its levels (split at ``/``).
        queue: where deliveries go while the client is connected (``None`` while it is not).
        pending: what arrived while it was disconnected (bounded: the oldest dropped first).
        dropped: how many payloads were dropped from :attr:`pending`.
        resumed: the last connect resumed this session (what MQTT calls *session present*).

    Example:
        >>> session = InProcessBroker().connect("c1", clean=True)
        >>> session.subscribe("marsys/t/#")
        >>> session.client_id, list(session.filters), session.connected
        ('c1', ['marsys/t/#'], True)
    """

    __slots__ = (
        "clean",
        "client_id",
        "dropped",
        "filters",
        "no_local",
        "pending",
        "queue",
        "resumed",
    )

    def __init__(self, client_id: str, clean: bool, max_queued: int) -> None:
        self.client_id = client_id
        self.clean = clean
        self.no_local = True
        self.filters: dict[str, tuple[str, ...]] = {}
        self.queue: asyncio.Queue[object] | None = None  # set while connected
        self.pending: deque[tuple[str, bytes]] = deque(maxlen=max_queued)
        self.dropped = 0
        self.resumed = False

    @property
    def connected(self) -> bool:
        """True while its client is connected."""
        return self.queue is not None

    def subscribe(self, topic_filter: str) -> None:
        """Receive what is published on topics matching ``topic_filter`` (validated)."""
        self.filters[validate_filter(topic_filter)] = tuple(topic_filter.split("/"))

    def unsubscribe(self, topic_filter: str) -> None:
        """Stop receiving what matches ``topic_filter`` (nothing if it was not subscribed)."""
        self.filters.pop(topic_filter, None)

    def deliver(self, item: tuple[str, bytes]) -> None:
        """Hand ``(topic, payload)`` to the client, or keep it until the client reconnects."""
        if self.queue is not None:
            self.queue.put_nowait(item)
            return
        if len(self.pending) == self.pending.maxlen:
            self.dropped += 1
        self.pending.append(item)


class InProcessBroker:
    """An in-process message broker: MQTT topic filters, QoS-1-like persistent sessions.

    Transports bound to the same broker talk to each other. A session survives a
    disconnect unless it was clean: what is published on its filters meanwhile is queued
    (at most ``max_queued`` payloads, the oldest dropped first and counted in
    :attr:`dropped`) and handed over when the same ``client_id`` connects again.
    Single event loop only.

    Args:
        max_queued: most payloads queued for one disconnected session.

    Example:
        >>> broker = InProcessBroker()
        >>> broker.sessions
        []
    """

    _default: InProcessBroker | None = None

    def __init__(self, *, max_queued: int = 10_000) -> None:
        if max_queued < 1:
            raise ValueError(f"max_queued must be >= 1, got {max_queued}")
        self.max_queued = max_queued
        self._sessions: dict[str, BrokerSession] = {}
        self.published = 0

    @classmethod
    def default(cls) -> InProcessBroker:
        """The process-wide broker that transports use when given none."""
        if cls._default is None:
            cls._default = cls()
        return cls._default

    @property
    def sessions(self) -> list[str]:
        """Client ids with a session (connected or not)."""
        return list(self._sessions)

    @property
    def dropped(self) -> int:
        """Payloads dropped because a disconnected session's queue was full."""
        return sum(s.dropped for s in self._sessions.values())

    def connect(self, client_id: str, *, clean: bool, no_local: bool = True) -> BrokerSession:
        """Connect a client: its session, resumed unless ``clean`` (what it missed is queued).

        Args:
            client_id: the client's id; a second live connection with it is refused.
            clean: start a fresh session and forget it on :meth:`disconnect`.
            no_local: do not deliver the client's own publishes back to it.

        Raises:
            TransportError: a client with this id is already connected.
        """
        session = self._sessions.get(client_id)
        if session is not None and session.queue is not None:
            raise TransportError(f"client id {client_id!r} is already connected to this broker")
        resumed = session is not None and not clean
        if session is None or clean:
            session = BrokerSession(client_id, clean, self.max_queued)
            self._sessions[client_id] = session
        session.resumed = resumed
        session.clean = clean
        session.no_local = no_local
        queue: asyncio.Queue[object] = asyncio.Queue()
        for item in session.pending:
            queue.put_nowait(item)
        session.pending.clear()
        session.queue = queue
        return session

    def disconnect(self, session: BrokerSession) -> None:
        """Disconnect ``session``'s client: its iterator ends; a clean session is forgotten."""
        queue, session.queue = session.queue, None
        if queue is not None:
            queue.put_nowait(_CLOSED)
        if session.clean and self._sessions.get(session.client_id) is session:
            del self._sessions[session.client_id]

    def publish(self, topic: str, payload: bytes, *, source: BrokerSession | None = None) -> None:
        """Deliver ``payload`` to every session subscribed to ``topic`` (each at most once).

        Args:
            topic: the topic (not checked here: transports check it before publishing).
            payload: the bytes, delivered as they are.
            source: the publishing client's session (skipped if it set ``no_local``).
        """
        self.published += 1
        levels = topic.split("/")
        item = (topic, payload)
        for session in self._sessions.values():
            if session is source and session.no_local:
                continue
            for flt in session.filters.values():
                if levels_match(flt, levels):
                    session.deliver(item)
                    break

    def __repr__(self) -> str:
        connected = sum(1 for s in self._sessions.values() if s.queue is not None)
        return f"InProcessBroker(sessions={len(self._sessions)}, connected={connected})"


_ids = itertools.count(1)


class InProcessTransport(AsyncClosing):
    """The default transport: asyncio queues through an :class:`InProcessBroker`.

    Args:
        broker: the broker (default: the process-wide :meth:`InProcessBroker.default`).
        namespace: the namespace whose topics this transport may use.
        client_id: a stable id makes a persistent session: reconnecting with it delivers
            what was missed. Default: a fresh id and a clean session.
        clean_session: forget the session on close (default: ``client_id is None``).
        max_payload: largest payload :meth:`publish` accepts.
        no_local: do not deliver this transport's own publishes back to it (like MQTT 5's
            *No Local*; the default).
        signing_key: the namespace's key (or an
            :class:`~marsys_mem.coordination.EnvelopeSigner`): payloads are signed when
            published, and received ones that are unsigned, badly signed, stale or
            replayed are dropped and counted in :attr:`rejected`. ``None`` (default): no
            signing.
        replay_window: how fresh signed payloads must be (default
            :class:`~marsys_mem.coordination.ReplayWindow`); only with ``signing_key``.

    Example:
        >>> import asyncio
        >>> from marsys_mem.coordination.wire import fact_topic
        >>> async def demo():
        ...     broker = InProcessBroker()
        ...     a = InProcessTransport(broker, namespace="t")
        ...     b = InProcessTransport(broker, namespace="t")
        ...     async with a, b:
        ...         await b.subscribe("marsys/t/#")
        ...         await a.publish(fact_topic("t", "main"), b"hello")
        ...         async for topic, payload in b.messages():
        ...             return topic, payload
        >>> asyncio.run(demo())
        ('marsys/t/branch/main/facts', b'hello')
    """

    def __init__(
        self,
        broker: InProcessBroker | None = None,
        *,
        namespace: str = "default",
        client_id: str | None = None,
        clean_session: bool | None = None,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        no_local: bool = True,
        signing_key: EnvelopeSigner | bytes | str | None = None,
        replay_window: ReplayWindow | None = None,
    ) -> None:
        self.namespace = validate_name("namespace", namespace)
        if max_payload < 1:
            raise ValueError(f"max_payload must be >= 1, got {max_payload}")
        self._wire = signed_wire(signing_key, max_payload, replay_window)
        if client_id is not None and (not isinstance(client_id, str) or not client_id):
            raise ValueError(f"client_id must be a non-empty string, got {client_id!r}")
        self.broker = broker if broker is not None else InProcessBroker.default()
        self.client_id = client_id or f"inproc-{uuid.uuid4().hex[:12]}-{next(_ids)}"
        self.clean_session = (client_id is None) if clean_session is None else clean_session
        self.max_payload = max_payload
        self.no_local = no_local
        self._session: BrokerSession | None = None
        self._queue: asyncio.Queue[object] | None = None

    @property
    def connected(self) -> bool:
        """True between entering and leaving the context."""
        return self._session is not None

    @property
    def rejected(self) -> dict[str, int]:
        """Received payloads dropped by signing (:data:`~.signing.REJECTIONS`), by reason."""
        return rejected_counts(self._wire)

    async def __aenter__(self) -> Self:
        if self._session is not None:
            raise CoordinationError("this transport is already connected (not re-entrant)")
        self._session = self.broker.connect(
            self.client_id, clean=self.clean_session, no_local=self.no_local
        )
        if self._wire is not None and not self._session.resumed:
            self._wire.fresh_session()
        self._queue = self._session.queue
        return self

    async def close(self) -> None:
        """Disconnect (idempotent); a persistent session keeps collecting payloads."""
        session, self._session = self._session, None
        if session is not None:
            self.broker.disconnect(session)

    def _require(self) -> BrokerSession:
        if self._session is None:
            raise TransportError("the transport is not connected: use 'async with transport:'")
        return self._session

    async def publish(self, topic: str, payload: bytes) -> None:
        """Publish ``payload`` on ``topic`` (delivered before this returns)."""
        validate_topic(topic)
        check_in_namespace(self.namespace, topic, "topic")
        data = check_payload(payload, self.max_payload)
        if self._wire is not None:
            data = self._wire.seal(topic, data)
        self.broker.publish(topic, data, source=self._require())

    async def subscribe(self, topic_filter: str) -> None:
        """Receive what is published on topics matching ``topic_filter``."""
        validate_filter(topic_filter)
        check_in_namespace(self.namespace, topic_filter, "topic filter")
        self._require().subscribe(topic_filter)

    async def unsubscribe(self, topic_filter: str) -> None:
        """Stop receiving what matches ``topic_filter``."""
        self._require().unsubscribe(topic_filter)

    def messages(self) -> AsyncIterator[tuple[str, bytes]]:
        """``(topic, payload)`` of each message, until the transport closes.

        What arrived before the close is still yielded.
        """
        queue = self._queue
        if queue is None or self._session is None:
            raise TransportError("the transport is not connected: use 'async with transport:'")
        return self._iterate(queue, self._wire)

    @staticmethod
    async def _iterate(
        queue: asyncio.Queue[object], wire: SignedWire | None = None
    ) -> AsyncIterator[tuple[str, bytes]]:
        while True:
            item = queue.get_nowait() if not queue.empty() else await queue.get()
            if item is _CLOSED:
                return
            topic, payload = cast("tuple[str, bytes]", item)
            if wire is not None:
                body = wire.open(topic, payload)  # never raises: bad ones are counted
                if body is None:
                    continue
                payload = body
            yield topic, payload

    def __repr__(self) -> str:
        state = "connected" if self._session is not None else "closed"
        return (
            f"InProcessTransport(namespace={self.namespace!r}, client_id={self.client_id!r}, "
            f"{state})"
        )
