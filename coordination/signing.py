"""Authenticated, fresh envelopes: an HMAC-SHA256 over every payload and its signing time.

With a shared secret per namespace, every payload a transport publishes is sealed
(``mm2.<key id>.<time>.<nonce>.<MAC>.<body>``, the MAC over the topic too) and every payload
it receives is checked on the raw bytes before anything parses it; unsigned, forged, stale
or replayed payloads are dropped and counted. Signing does not encrypt (use TLS).

Guide (wire format, freshness, limits):
``docs/guides/coordination.md#signed-envelopes-the-wire-format``.

Example:
    >>> signer = EnvelopeSigner("a-namespace-secret-of-32-bytes!!", key_id="k1")
    >>> sealed = signer.sign("marsys/t/branch/main/facts", b'{"v":1}')
    >>> sealed[:7]
    b'mm2.k1.'
    >>> signer.verify("marsys/t/branch/main/facts", sealed)
    b'{"v":1}'
    >>> signer.verify("marsys/t/branch/r1/facts", sealed)
    Traceback (most recent call last):
    ...
    marsys_mem.exceptions.SignatureError: bad signature (key id 'k1') on 'marsys/t/...'
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Final, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from marsys_mem.exceptions import ConfigError, SignatureError, SignatureReason

__all__ = [
    "MIN_KEY_BYTES",
    "REJECTIONS",
    "SIGNATURE_OVERHEAD",
    "SIGNING_KEY_ENV",
    "EnvelopeSigner",
    "ReplayGuard",
    "ReplayWindow",
    "Sealed",
    "SignedWire",
    "as_signer",
    "rejected_counts",
    "signed_wire",
]

log = logging.getLogger("marsys_mem.coordination")

SIGNING_KEY_ENV: Final = "MARSYS_MEM_SIGNING_KEY"
"""The environment variable :meth:`EnvelopeSigner.from_env` reads by default."""
MIN_KEY_BYTES: Final = 16
"""Shortest key accepted (bytes; a str key counts its UTF-8 bytes). 32 random bytes is best."""

_VERSION: Final = b"mm2"
_OLD_VERSION: Final = b"mm1."  # no signing time: refused
_MAC_CHARS: Final = 43  # base64url of 32 bytes, unpadded
_NONCE_BYTES: Final = 12
_NONCE_CHARS: Final = 16  # base64url of 12 bytes
_TIME_DIGITS: Final = 15  # milliseconds since 1970: 13 digits until the year 2286
_KEY_ID = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
SIGNATURE_OVERHEAD: Final = (
    len(_VERSION) + 1 + 32 + 1 + _TIME_DIGITS + 1 + _NONCE_CHARS + 1 + _MAC_CHARS + 1
)
"""The most bytes signing adds to a payload (longest key id)."""

Reason = SignatureReason
"""Why a payload was rejected (see :class:`~marsys_mem.exceptions.SignatureError`)."""
REJECTIONS: Final = ("unsigned", "bad_signature", "oversized", "stale", "replayed")
"""What a signing transport counts in ``rejected``, in this order."""


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}...({len(text)} chars)"


def _key_bytes(key: object, what: str) -> bytes:
    if isinstance(key, str):
        try:
            data = key.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ConfigError(f"{what} must be encodable as UTF-8") from exc
    elif isinstance(key, bytes | bytearray | memoryview):
        data = bytes(key)
    else:
        raise ConfigError(f"{what} must be bytes or str, got {type(key).__name__}")
    if len(data) < MIN_KEY_BYTES:
        # never show the key itself, not even a part of it
        raise ConfigError(
            f"{what} is {len(data)} bytes; at least {MIN_KEY_BYTES} are needed "
            "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return data


def _key_id(key_id: object) -> bytes:
    if not isinstance(key_id, str) or not _KEY_ID.match(key_id):
        raise ConfigError(
            f"key_id must be 1-32 characters of A-Z, a-z, 0-9, '_' or '-', got {_short(key_id)}"
        )
    return key_id.encode("ascii")


class Sealed(NamedTuple):
    """A verified payload: its body, when it was signed, its nonce (:meth:`EnvelopeSigner.unseal`).

    Example:
        >>> Sealed(b"{}", 1700000000.0, b"AAAAAAAAAAAAAAAA").signed_at
        1700000000.0
    """

    body: bytes
    signed_at: float  # seconds since 1970 (millisecond precision)
    nonce: bytes


class ReplayWindow(BaseModel):
    """How fresh a signed payload must be to be accepted (a frozen, validated settings model).

    Attributes:
        max_age: seconds after its signing time a payload is still accepted (transit,
            queueing and clock skew included). A receiver with a persistent session that
            was away longer than this drops what the broker queued for it meanwhile as
            ``stale`` (what the senders still keep comes again through the resend
            protocol, freshly signed).
        max_skew: seconds a sender's clock may be ahead of (or behind) the receiver's: a
            payload signed further ahead is refused, and so is one signed more than this
            before the receiver's broker session began (a capture replayed to a receiver
            started later). Keep hosts in sync (NTP) and this small.
        max_remembered: nonces remembered to refuse copies within the window; when full
            the oldest is forgotten and payloads signed before it are refused as
            ``stale``.

    Example:
        >>> ReplayWindow().max_age, ReplayWindow().max_skew
        (300.0, 10.0)
        >>> ReplayWindow(max_age=0)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        pydantic_core._pydantic_core.ValidationError: 1 validation error for ReplayWindow
        max_age
          Input should be greater than 0 [type=greater_than, input_value=0, input_type=int]
        ...
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    max_age: float = Field(default=300.0, gt=0, le=366 * 24 * 3600)
    max_skew: float = Field(default=10.0, ge=0, le=24 * 3600)
    max_remembered: int = Field(default=100_000, ge=1, le=10_000_000)


class ReplayGuard:
    """A receiver's memory of what it accepted: refuses stale payloads and copies.

    Args:
        window: the :class:`ReplayWindow`.
        clock: seconds since 1970 (default :func:`time.time`; a wall clock, since signing
            times cross hosts).

    Example:
        >>> guard = ReplayGuard(ReplayWindow(max_age=60), clock=lambda: 1000.0)
        >>> guard.check(990.0, b"n1", "t")
        >>> guard.check(990.0, b"n1", "t")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        marsys_mem.exceptions.SignatureError: replayed payload on 't' (signed 10.0s ago, seen ...
        >>> guard.check(900.0, b"n2", "t")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        marsys_mem.exceptions.SignatureError: stale payload on 't' (signed 100.0s ago, over ...
    """

    __slots__ = ("_seen", "clock", "floor", "window")

    def __init__(
        self, window: ReplayWindow | None = None, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.window = ReplayWindow() if window is None else window
        self.clock = clock
        self.floor = 0.0  # payloads signed at or before this are refused
        self._seen: OrderedDict[bytes, float] = OrderedDict()  # nonce -> signed at

    @property
    def remembered(self) -> int:
        """Nonces remembered now."""
        return len(self._seen)

    def fresh_session(self) -> None:
        """The broker holds nothing older for us: refuse what was signed before now - skew."""
        self.floor = max(self.floor, self.clock() - self.window.max_skew)

    def check(self, signed_at: float, nonce: bytes, topic: str) -> None:
        """Accept (and remember) a verified payload, or refuse it.

        Raises:
            SignatureError: ``reason="stale"`` outside the window, ``reason="replayed"``
                for a nonce already accepted.
        """
        window, seen = self.window, self._seen
        now = self.clock()
        oldest = now - window.max_age
        while seen and next(iter(seen.values())) < oldest:  # expired: refused as stale anyway
            seen.popitem(last=False)
        why = None
        if signed_at < oldest:
            why = f"signed {now - signed_at:.1f}s ago, over max_age {window.max_age:g}s"
        elif signed_at > now + window.max_skew:
            why = f"signed {signed_at - now:.1f}s ahead, over max_skew {window.max_skew:g}s"
        elif signed_at <= self.floor:
            why = (
                f"signed {now - signed_at:.1f}s ago, before this receiver's session "
                f"began (less max_skew {window.max_skew:g}s)"
            )
        if why is not None:
            raise SignatureError(f"stale payload on {_short(topic)} ({why})", reason="stale")
        if nonce in seen:
            raise SignatureError(
                f"replayed payload on {_short(topic)} (signed {now - signed_at:.1f}s ago, "
                "seen before)",
                reason="replayed",
            )
        seen[nonce] = signed_at
        if len(seen) > window.max_remembered:
            _nonce, forgotten = seen.popitem(last=False)
            self.floor = max(self.floor, forgotten)


class EnvelopeSigner:
    """Signs and verifies transport payloads with HMAC-SHA256 (one namespace's shared key).

    Args:
        key: the namespace's secret (bytes, or a str taken as its UTF-8 bytes); at least
            :data:`MIN_KEY_BYTES` bytes.
        key_id: names the key on the wire (1-32 of ``A-Z a-z 0-9 _ -``).
        previous: older keys by key id, still accepted when verifying (key rotation:
            roll the new key out everywhere as ``previous``, then make it the active one).

    Example:
        >>> signer = EnvelopeSigner(b"0123456789abcdef0123456789abcdef", key_id="2025-06")
        >>> rotated = EnvelopeSigner(b"another-32-byte-secret-for-later", key_id="2025-07",
        ...                          previous={"2025-06": b"0123456789abcdef0123456789abcdef"})
        >>> rotated.verify("marsys/t/x", signer.sign("marsys/t/x", b"hello"))
        b'hello'
        >>> rotated.key_ids
        ('2025-07', '2025-06')
    """

    __slots__ = ("_active", "_keys")

    def __init__(
        self,
        key: bytes | str,
        *,
        key_id: str = "k1",
        previous: Mapping[str, bytes | str] | None = None,
    ) -> None:
        active = _key_id(key_id)
        keys: dict[bytes, hmac.HMAC] = {}
        keys[active] = self._base(active, _key_bytes(key, "the signing key"))
        for old_id, old_key in (previous or {}).items():
            kid = _key_id(old_id)
            if kid in keys:
                raise ConfigError(f"key id {old_id!r} is given twice")
            keys[kid] = self._base(kid, _key_bytes(old_key, f"the key {old_id!r}"))
        self._active = active
        self._keys = keys

    @staticmethod
    def _base(key_id: bytes, key: bytes) -> hmac.HMAC:
        """An HMAC already keyed and fed the format and key id: copied per payload."""
        return hmac.new(key, _VERSION + b"\x00" + key_id + b"\x00", hashlib.sha256)

    @classmethod
    def from_env(cls, var: str = SIGNING_KEY_ENV, *, key_id: str = "k1") -> EnvelopeSigner:
        """A signer with the key in the environment variable ``var``.

        Raises:
            ConfigError: the variable is not set, or the key in it is too short.
        """
        value = os.environ.get(var)
        if value is None:
            raise ConfigError(f"the environment variable {var} (the signing key) is not set")
        return cls(value, key_id=key_id)

    @property
    def key_id(self) -> str:
        """The id of the key new payloads are signed with."""
        return self._active.decode("ascii")

    @property
    def key_ids(self) -> tuple[str, ...]:
        """Every key id accepted when verifying (the active one first)."""
        return tuple(k.decode("ascii") for k in self._keys)

    def _mac(self, base: hmac.HMAC, stamp: bytes, nonce: bytes, topic: bytes, body: bytes) -> bytes:
        h = base.copy()
        for part in (stamp, nonce, topic):
            h.update(part)
            h.update(b"\x00")
        h.update(body)
        return base64.urlsafe_b64encode(h.digest())[:_MAC_CHARS]

    def sign(self, topic: str, body: bytes, *, at: float | None = None) -> bytes:
        """``body`` sealed for ``topic``: ``mm2.<key id>.<time>.<nonce>.<MAC>.<body>``.

        Args:
            topic: the topic it will be published on (covered by the MAC).
            body: the payload.
            at: the signing time (seconds since 1970; default: now).
        """
        kid, body = self._active, bytes(body)
        when = time.time() if at is None else at
        if not 0 <= when < 10**_TIME_DIGITS / 1000:
            raise ValueError(f"at must be a time from 1970 on, got {when!r}")
        stamp = str(int(when * 1000)).encode("ascii")
        nonce = base64.urlsafe_b64encode(os.urandom(_NONCE_BYTES))
        mac = self._mac(self._keys[kid], stamp, nonce, topic.encode("utf-8", "surrogatepass"), body)
        return b".".join((_VERSION, kid, stamp, nonce, mac, body))

    def verify(self, topic: str, data: bytes) -> bytes:
        """The body of ``data`` if it was signed for ``topic`` by a known key.

        Checks the raw bytes only (nothing is parsed); the MACs are compared in
        constant time. Freshness is not checked here (see :class:`SignedWire`).

        Raises:
            SignatureError: ``reason="unsigned"`` without a ``mm2.`` header,
                ``reason="bad_signature"`` for a malformed header, an unknown key id, a
                MAC that does not match, or the old format ``mm1`` (no signing time).
        """
        return self.unseal(topic, data).body

    def unseal(self, topic: str, data: bytes) -> Sealed:
        """What :meth:`verify` checks, with the signing time and nonce of ``data``.

        Example:
            >>> signer = EnvelopeSigner("0123456789abcdef")
            >>> sealed = signer.unseal("marsys/t/x", signer.sign("marsys/t/x", b"hi", at=1.5))
            >>> sealed.body, sealed.signed_at, len(sealed.nonce)
            (b'hi', 1.5, 16)

        Raises:
            SignatureError: as :meth:`verify`.
        """
        if not data.startswith(b"mm2."):
            if data.startswith(_OLD_VERSION):
                raise SignatureError(
                    f"an mm1 payload (no signing time, from an older marsys-mem) on "
                    f"{_short(topic)}: upgrade every coordinator of the namespace",
                    reason="bad_signature",
                )
            raise SignatureError(
                f"unsigned payload on {_short(topic)} ({len(data)} bytes)", reason="unsigned"
            )
        parts = data.split(b".", 5)
        if len(parts) != 6:
            raise SignatureError(
                f"truncated signature header on {_short(topic)}", reason="bad_signature"
            )
        _version, kid, stamp, nonce, mac, body = parts
        if not (0 < len(stamp) <= _TIME_DIGITS and stamp.isdigit()) or len(nonce) != _NONCE_CHARS:
            raise SignatureError(
                f"malformed signature header on {_short(topic)}", reason="bad_signature"
            )
        base = self._keys.get(kid)
        if base is None:
            raise SignatureError(
                f"unknown key id {_short(kid.decode('utf-8', 'replace'), 40)} on {_short(topic)}",
                reason="bad_signature",
            )
        expected = self._mac(base, stamp, nonce, topic.encode("utf-8", "surrogatepass"), body)
        if not hmac.compare_digest(expected, mac):
            raise SignatureError(
                f"bad signature (key id {kid.decode('ascii')!r}) on {_short(topic)}",
                reason="bad_signature",
            )
        return Sealed(body, int(stamp) / 1000, nonce)

    def __repr__(self) -> str:  # never the keys
        return f"EnvelopeSigner(key_id={self.key_id!r}, accepts={list(self.key_ids)!r})"


def as_signer(value: EnvelopeSigner | bytes | str | None) -> EnvelopeSigner | None:
    """``signing_key=`` of a transport as a signer: a signer, a key, or ``None`` (off).

    Example:
        >>> as_signer(None) is None
        True
        >>> as_signer("0123456789abcdef").key_id
        'k1'
    """
    if value is None or isinstance(value, EnvelopeSigner):
        return value
    return EnvelopeSigner(value)


def signed_wire(
    signing_key: EnvelopeSigner | bytes | str | None,
    max_payload: int,
    replay_window: ReplayWindow | None = None,
) -> SignedWire | None:
    """A transport's :class:`SignedWire` from its ``signing_key=`` and ``replay_window=``.

    Example:
        >>> signed_wire(None, 1024) is None
        True
        >>> signed_wire("0123456789abcdef", 1024, ReplayWindow(max_age=60)).guard.window.max_age
        60.0

    Raises:
        TypeError: ``replay_window`` is not a :class:`ReplayWindow`.
        ValueError: a ``replay_window`` without a ``signing_key``.
    """
    if replay_window is not None and not isinstance(replay_window, ReplayWindow):
        raise TypeError(f"replay_window must be a ReplayWindow, got {type(replay_window).__name__}")
    signer = as_signer(signing_key)
    if signer is None:
        if replay_window is not None:
            raise ValueError(
                "replay_window needs a signing_key (only signed payloads carry a time)"
            )
        return None
    return SignedWire(signer, max_payload=max_payload, window=replay_window)


def rejected_counts(wire: SignedWire | None) -> dict[str, int]:
    """What ``wire`` dropped, by reason (:data:`REJECTIONS`); all 0 without signing.

    Example:
        >>> rejected_counts(None)["stale"]
        0
    """
    return dict(wire.rejected) if wire is not None else dict.fromkeys(REJECTIONS, 0)


class SignedWire:
    """A transport's signing side: seals what it publishes, checks what it receives.

    Every publish and receive path of a transport goes through :meth:`seal` and
    :meth:`open` (fact envelopes and any control message alike). :meth:`open` never
    raises: a payload that does not verify, or is not fresh (its :class:`ReplayGuard`),
    is dropped, counted in :attr:`rejected` and logged (the 1st, 10th, 100th... of each
    kind).

    Args:
        signer: the namespace's :class:`EnvelopeSigner`.
        max_payload: the transport's largest body; longer signed payloads are dropped as
            ``oversized`` before any MAC is computed.
        window: how fresh payloads must be (default :class:`ReplayWindow`).

    Example:
        >>> wire = SignedWire(EnvelopeSigner("0123456789abcdef"), max_payload=1024)
        >>> sealed = wire.seal("marsys/t/x", b"ok")
        >>> wire.open("marsys/t/x", sealed), wire.open("marsys/t/x", sealed)
        (b'ok', None)
        >>> wire.open("marsys/t/x", b'{"forged": true}') is None, wire.rejected
        (True, {'unsigned': 1, 'bad_signature': 0, 'oversized': 0, 'stale': 0, 'replayed': 1})
    """

    __slots__ = ("guard", "limit", "rejected", "signer")

    def __init__(
        self, signer: EnvelopeSigner, *, max_payload: int, window: ReplayWindow | None = None
    ) -> None:
        self.signer = signer
        self.limit = max_payload + SIGNATURE_OVERHEAD
        self.guard = ReplayGuard(window)
        self.rejected: dict[str, int] = dict.fromkeys(REJECTIONS, 0)

    def seal(self, topic: str, body: bytes) -> bytes:
        """``body`` signed for ``topic``, now."""
        return self.signer.sign(topic, body)

    def fresh_session(self) -> None:
        """The broker started a new session for this client: nothing older can be due."""
        self.guard.fresh_session()

    def open(self, topic: str, data: bytes) -> bytes | None:
        """The verified, fresh body of ``data``, or ``None`` (dropped and counted)."""
        if len(data) > self.limit:
            self._count("oversized", f"payload of {len(data)} bytes on {_short(topic)}")
            return None
        try:
            sealed = self.signer.unseal(topic, data)
            self.guard.check(sealed.signed_at, sealed.nonce, topic)
        except SignatureError as exc:
            self._count(exc.reason, str(exc))
            return None
        return sealed.body

    def _count(self, reason: str, detail: str) -> None:
        n = self.rejected[reason] = self.rejected[reason] + 1
        if str(n).rstrip("0") == "1":  # the 1st, 10th, 100th...
            log.warning("dropped %s payload #%d: %s", reason.replace("_", " "), n, detail)
