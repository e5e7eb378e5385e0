"""Transports for shared facts: the :class:`Transport` protocol and :class:`InProcessTransport`.

A transport moves opaque payloads (bytes) between coordinators on MQTT-style topics. Fact
topics are ``marsys/<namespace>/branch/<branch>/facts`` (:func:`fact_topic`); a coordinator
subscribes to ``marsys/<namespace>/branch/+/facts`` (:func:`facts_filter`) and to
``marsys/<namespace>/control`` (:func:`control_topic`: high-water marks, resend requests).
Every transport is bound to one namespace and refuses topics outside ``marsys/<namespace>/``,
so no payload crosses namespaces.

:class:`InProcessTransport` talks to an :class:`InProcessBroker` (one per process by default)
with asyncio queues. It mirrors what the MQTT transport guarantees with QoS 1 and a persistent
session: a client that disconnects and reconnects with the same ``client_id`` receives what
was published on its subscriptions while it was away (up to ``max_queued`` payloads).

Errors of the coordination layer::

    MarsysMemError
    └── CoordinationError
        ├── BranchError (ValueError)              bad branch-graph operation
        │   ├── UnknownBranchError                no branch with that name
        │   └── MergeCycleError                   a merge that would close a cycle
        ├── SignatureError (ValueError)           an unsigned or badly signed payload (signing.py)
        └── TransportError (ConnectionError)      connecting, publishing or receiving failed
            └── AuthenticationError (PermissionError)  the broker refused the credentials
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from collections import deque
from collections.abc import AsyncIterator
from types import TracebackType
from typing import TYPE_CHECKING, Final, Protocol, Self, cast, runtime_checkable

from marsys_mem.exceptions import MarsysMemError
from marsys_mem.lifecycle import AsyncClosing
from marsys_mem.model.names import is_name, validate_name

if TYPE_CHECKING:
    from marsys_mem.coordination.signing import EnvelopeSigner, SignedWire

__all__ = [
    "DEFAULT_MAX_PAYLOAD",
    "AuthenticationError",
    "BranchError",
    "CoordinationError",
    "InProcessBroker",
    "InProcessTransport",
    "MergeCycleError",
    "Transport",
    "TransportError",
    "UnknownBranchError",
    "control_topic",
    "fact_topic",
    "facts_filter",
    "namespace_prefix",
    "parse_fact_topic",
    "topic_matches",
    "validate_filter",
    "validate_topic",
]

log = logging.getLogger("marsys_mem.coordination")

DEFAULT_MAX_PAYLOAD: Final = 64 * 1024


# ---------------------------------------------------------------------------- errors
class CoordinationError(MarsysMemError):
    """Root of the coordination layer's errors (branch graph, transports, coordinator)."""


class BranchError(CoordinationError, ValueError):
    """A branch-graph operation that cannot be done; nothing was changed."""


class UnknownBranchError(BranchError):
    """No branch with that name in the graph."""


class MergeCycleError(BranchError):
    """A merge that would close a cycle (see :meth:`BranchGraph.check_merge`)."""


class TransportError(CoordinationError, ConnectionError):
    """Connecting, publishing or receiving failed; the cause is chained as ``__cause__``."""


class AuthenticationError(TransportError, PermissionError):
    """The broker refused the client's credentials (bad username/password, not authorised)."""


# ---------------------------------------------------------------------------- topics
def namespace_prefix(namespace: str) -> str:
    """``marsys/<namespace>/``: every topic of a namespace starts with it."""
    return f"marsys/{validate_name('namespace', namespace)}/"


def fact_topic(namespace: str, branch: str) -> str:
    """The topic facts of ``branch`` are published on.

    Example:
        >>> fact_topic("team-a", "main")
        'marsys/team-a/branch/main/facts'
    """
    return f"{namespace_prefix(namespace)}branch/{validate_name('branch', branch)}/facts"


def facts_filter(namespace: str) -> str:
    """The filter matching the fact topics of every branch of ``namespace``.

    Example:
        >>> facts_filter("team-a")
        'marsys/team-a/branch/+/facts'
    """
    return f"{namespace_prefix(namespace)}branch/+/facts"


def control_topic(namespace: str) -> str:
    """The topic coordinators of ``namespace`` exchange high-water marks and resend requests on.

    Example:
        >>> control_topic("team-a")
        'marsys/team-a/control'
    """
    return f"{namespace_prefix(namespace)}control"


def parse_fact_topic(topic: str) -> tuple[str, str] | None:
    """``(namespace, branch)`` of a fact topic, ``None`` if ``topic`` is not one.

    Example:
        >>> parse_fact_topic("marsys/team-a/branch/r1/facts")
        ('team-a', 'r1')
        >>> parse_fact_topic("marsys/team-a/other") is None
        True
    """
    parts = topic.split("/")
    if len(parts) != 5 or parts[0] != "marsys" or parts[2] != "branch" or parts[4] != "facts":
        return None
    if not is_name(parts[1]) or not is_name(parts[3]):
        return None
    return parts[1], parts[3]


def validate_topic(topic: object) -> str:
    """A topic to publish on: non-empty, no wildcards, no NUL, at most 65535 bytes."""
    if not isinstance(topic, str) or not topic:
        raise ValueError(f"a topic must be a non-empty string, got {topic!r}")
    if "+" in topic or "#" in topic or "\x00" in topic:
        raise ValueError(f"a topic to publish on cannot contain '+', '#' or NUL: {topic!r}")
    if len(topic.encode("utf-8")) > 65535:
        raise ValueError("a topic is at most 65535 bytes")
    return topic


def validate_filter(topic_filter: object) -> str:
    """An MQTT topic filter: ``+`` matches one level, ``#`` (last) the rest."""
    if not isinstance(topic_filter, str) or not topic_filter:
        raise ValueError(f"a topic filter must be a non-empty string, got {topic_filter!r}")
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            raise ValueError(f"'#' must be a whole last level of the filter: {topic_filter!r}")
        if "+" in level and level != "+":
            raise ValueError(f"'+' must be a whole level of the filter: {topic_filter!r}")
    if "\x00" in topic_filter:
        raise ValueError("a topic filter cannot contain NUL")
    return topic_filter


def topic_matches(topic_filter: str, topic: str) -> bool:
    """True if ``topic`` matches the MQTT filter ``topic_filter``.

    Example:
        >>> topic_matches("marsys/a/branch/+/facts", "marsys/a/branch/r1/facts")
        True
        >>> topic_matches("marsys/a/#", "marsys/b/branch/r1/facts")
        False
    """
    return _matches(topic_filter.split("/"), topic.split("/"))


def _matches(flt: list[str] | tuple[str, ...], levels: list[str]) -> bool:
    n = len(levels)
    for i, part in enumerate(flt):
        if part == "#":
            return True
        if i >= n or (part != "+" and part != levels[i]):
            return False
    return len(flt) == n


def _check_in_namespace(namespace: str, topic: str, what: str) -> None:
    prefix = f"marsys/{namespace}/"
    if not topic.startswith(prefix):
        raise ValueError(
            f"{what} {topic!r} is outside this transport's namespace {namespace!r} "
            f"(it must start with {prefix!r})"
        )


def _check_payload(payload: object, max_payload: int) -> bytes:
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise TypeError(f"a payload must be bytes, got {type(payload).__name__}")
    data = bytes(payload)
    if len(data) > max_payload:
        raise ValueError(f"payload of {len(data)} bytes is over the maximum of {max_payload}")
    return data


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


class _Session:
    __slots__ = ("clean", "client_id", "dropped", "filters", "no_local", "pending", "queue")

    def __init__(self, client_id: str, clean: bool, max_queued: int) -> None:
        self.client_id = client_id
        self.clean = clean
        self.no_local = True
        self.filters: dict[str, tuple[str, ...]] = {}
        self.queue: asyncio.Queue[object] | None = None  # set while connected
        self.pending: deque[tuple[str, bytes]] = deque(maxlen=max_queued)
        self.dropped = 0


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
        self._sessions: dict[str, _Session] = {}
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

    def _connect(self, client_id: str, clean: bool, no_local: bool = True) -> _Session:
        session = self._sessions.get(client_id)
        if session is not None and session.queue is not None:
            raise TransportError(f"client id {client_id!r} is already connected to this broker")
        if session is None or clean:
            session = _Session(client_id, clean, self.max_queued)
            self._sessions[client_id] = session
        session.clean = clean
        session.no_local = no_local
        queue: asyncio.Queue[object] = asyncio.Queue()
        for item in session.pending:
            queue.put_nowait(item)
        session.pending.clear()
        session.queue = queue
        return session

    def _disconnect(self, session: _Session) -> None:
        queue, session.queue = session.queue, None
        if queue is not None:
            queue.put_nowait(_CLOSED)
        if session.clean and self._sessions.get(session.client_id) is session:
            del self._sessions[session.client_id]

    def _publish(self, topic: str, payload: bytes, source: _Session | None = None) -> None:
        self.published += 1
        levels = topic.split("/")
        item = (topic, payload)
        for session in self._sessions.values():
            if session is source and session.no_local:
                continue
            for flt in session.filters.values():
                if _matches(flt, levels):
                    if session.queue is not None:
                        session.queue.put_nowait(item)
                    else:
                        if len(session.pending) == session.pending.maxlen:
                            session.dropped += 1
                        session.pending.append(item)
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
            published, and received ones that are unsigned or badly signed are dropped
            and counted in :attr:`rejected`. ``None`` (default): no signing.

    Example:
        >>> import asyncio
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
    ) -> None:
        self.namespace = validate_name("namespace", namespace)
        if max_payload < 1:
            raise ValueError(f"max_payload must be >= 1, got {max_payload}")
        from marsys_mem.coordination.signing import SignedWire, as_signer  # (imports us)

        signer = as_signer(signing_key)
        self._wire = None if signer is None else SignedWire(signer, max_payload=max_payload)
        if client_id is not None and (not isinstance(client_id, str) or not client_id):
            raise ValueError(f"client_id must be a non-empty string, got {client_id!r}")
        self.broker = broker if broker is not None else InProcessBroker.default()
        self.client_id = client_id or f"inproc-{uuid.uuid4().hex[:12]}-{next(_ids)}"
        self.clean_session = (client_id is None) if clean_session is None else clean_session
        self.max_payload = max_payload
        self.no_local = no_local
        self._session: _Session | None = None
        self._queue: asyncio.Queue[object] | None = None

    @property
    def connected(self) -> bool:
        """True between entering and leaving the context."""
        return self._session is not None

    @property
    def rejected(self) -> dict[str, int]:
        """Received payloads dropped by signing: ``unsigned``, ``bad_signature``, ``oversized``."""
        return dict(self._wire.rejected) if self._wire is not None else dict.fromkeys(
            ("unsigned", "bad_signature", "oversized"), 0
        )

    async def __aenter__(self) -> Self:
        if self._session is not None:
            raise CoordinationError("this transport is already connected (not re-entrant)")
        self._session = self.broker._connect(self.client_id, self.clean_session, self.no_local)
        self._queue = self._session.queue
        return self

    async def close(self) -> None:
        """Disconnect (idempotent); a persistent session keeps collecting payloads."""
        session, self._session = self._session, None
        if session is not None:
            self.broker._disconnect(session)

    def _require(self) -> _Session:
        if self._session is None:
            raise TransportError("the transport is not connected: use 'async with transport:'")
        return self._session

    async def publish(self, topic: str, payload: bytes) -> None:
        """Publish ``payload`` on ``topic`` (delivered before this returns)."""
        validate_topic(topic)
        _check_in_namespace(self.namespace, topic, "topic")
        data = _check_payload(payload, self.max_payload)
        if self._wire is not None:
            data = self._wire.seal(topic, data)
        self.broker._publish(topic, data, self._require())

    async def subscribe(self, topic_filter: str) -> None:
        """Receive what is published on topics matching ``topic_filter``."""
        validate_filter(topic_filter)
        _check_in_namespace(self.namespace, topic_filter, "topic filter")
        self._require().filters[topic_filter] = tuple(topic_filter.split("/"))

    async def unsubscribe(self, topic_filter: str) -> None:
        """Stop receiving what matches ``topic_filter``."""
        self._require().filters.pop(topic_filter, None)

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
