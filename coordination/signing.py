"""Authenticated envelopes: an HMAC-SHA256 over every payload, with a per-namespace key.

Without signing, a transport trusts whatever the broker hands it: any client that can
publish on a namespace's topics can forge another coordinator's ``sender`` id and ``seq``
(and so silence that sender's real facts). With a shared secret per namespace, every
payload a transport publishes is sealed and every payload it receives is checked, on the
raw bytes, before anything parses it; unsigned or badly signed payloads are dropped and
counted (``Coordinator.stats["unsigned"]`` / ``["bad_signature"]``).

Wire format (version 1)::

    mm1.<key id>.<MAC>.<body>

``mm1`` names the format (HMAC-SHA256); ``<key id>`` (1-32 of ``A-Z a-z 0-9 _ -``) says
which key signed, so keys can be rotated (:class:`EnvelopeSigner` verifies with the
active key and any ``previous`` ones); ``<MAC>`` is the unpadded base64url HMAC-SHA256 of
``mm1``, the key id, the topic and the body, joined by NUL bytes (43 characters);
``<body>`` is the payload as it was (the JSON envelope). The MAC covers the topic, so a
signed payload replayed onto another branch or namespace does not verify; a payload
replayed on its own topic is an exact duplicate (same sender and ``seq``), which the
coordinator's per-sender ordering drops and counts in ``stats["duplicates"]``.

What it does not do: it does not hide anything (use TLS), and every holder of a
namespace's key can sign as any sender of that namespace. Keep the key per namespace, and
confine each namespace's broker user to its own topics (``examples/mosquitto/``).

Example:
    >>> signer = EnvelopeSigner("a-namespace-secret-of-32-bytes!!", key_id="k1")
    >>> sealed = signer.sign("marsys/t/branch/main/facts", b'{"v":1}')
    >>> sealed[:7]
    b'mm1.k1.'
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
from collections.abc import Mapping
from typing import Final

from marsys_mem.exceptions import ConfigError, SignatureError, SignatureReason

__all__ = [
    "MIN_KEY_BYTES",
    "SIGNATURE_OVERHEAD",
    "SIGNING_KEY_ENV",
    "EnvelopeSigner",
    "SignatureError",
    "SignedWire",
    "as_signer",
]

log = logging.getLogger("marsys_mem.coordination")

SIGNING_KEY_ENV: Final = "MARSYS_MEM_SIGNING_KEY"
"""The environment variable :meth:`EnvelopeSigner.from_env` reads by default."""
MIN_KEY_BYTES: Final = 16
"""Shortest key accepted (bytes; a str key counts its UTF-8 bytes). 32 random bytes is best."""

_VERSION: Final = b"mm1"
_MAC_CHARS: Final = 43  # base64url of 32 bytes, unpadded
_KEY_ID = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
SIGNATURE_OVERHEAD: Final = len(_VERSION) + 1 + 32 + 1 + _MAC_CHARS + 1
"""The most bytes signing adds to a payload (longest key id)."""

Reason = SignatureReason
"""Why a payload was rejected (see :class:`~marsys_mem.exceptions.SignatureError`)."""


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

    def _mac(self, base: hmac.HMAC, topic: bytes, body: bytes) -> bytes:
        h = base.copy()
        h.update(topic)
        h.update(b"\x00")
        h.update(body)
        return base64.urlsafe_b64encode(h.digest())[:_MAC_CHARS]

    def sign(self, topic: str, body: bytes) -> bytes:
        """``body`` sealed for ``topic``: ``mm1.<key id>.<MAC>.<body>``."""
        kid, body = self._active, bytes(body)
        mac = self._mac(self._keys[kid], topic.encode("utf-8", "surrogatepass"), body)
        return b"".join((_VERSION, b".", kid, b".", mac, b".", body))

    def verify(self, topic: str, data: bytes) -> bytes:
        """The body of ``data`` if it was signed for ``topic`` by a known key.

        Checks the raw bytes only (nothing is parsed); the MACs are compared in
        constant time.

        Raises:
            SignatureError: ``reason="unsigned"`` without a ``mm1.`` header,
                ``reason="bad_signature"`` for an unknown key id or a MAC that does
                not match.
        """
        if not data.startswith(b"mm1."):
            raise SignatureError(
                f"unsigned payload on {_short(topic)} ({len(data)} bytes)", reason="unsigned"
            )
        parts = data.split(b".", 3)
        if len(parts) != 4:
            raise SignatureError(
                f"truncated signature header on {_short(topic)}", reason="bad_signature"
            )
        _version, kid, mac, body = parts
        base = self._keys.get(kid)
        if base is None:
            raise SignatureError(
                f"unknown key id {_short(kid.decode('utf-8', 'replace'), 40)} on {_short(topic)}",
                reason="bad_signature",
            )
        expected = self._mac(base, topic.encode("utf-8", "surrogatepass"), body)
        if not hmac.compare_digest(expected, mac):
            raise SignatureError(
                f"bad signature (key id {kid.decode('ascii')!r}) on {_short(topic)}",
                reason="bad_signature",
            )
        return body

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


class SignedWire:
    """A transport's signing side: seals what it publishes, checks what it receives.

    Every publish and receive path of a transport goes through :meth:`seal` and
    :meth:`open` (fact envelopes and any control message alike). :meth:`open` never
    raises: a payload that does not verify is dropped, counted in :attr:`rejected` and
    logged (the 1st, 10th, 100th... of each kind).

    Args:
        signer: the namespace's :class:`EnvelopeSigner`.
        max_payload: the transport's largest body; longer signed payloads are dropped as
            ``oversized`` before any MAC is computed.

    Example:
        >>> wire = SignedWire(EnvelopeSigner("0123456789abcdef"), max_payload=1024)
        >>> wire.open("marsys/t/x", wire.seal("marsys/t/x", b"ok"))
        b'ok'
        >>> wire.open("marsys/t/x", b'{"forged": true}') is None, wire.rejected["unsigned"]
        (True, 1)
    """

    __slots__ = ("limit", "rejected", "signer")

    def __init__(self, signer: EnvelopeSigner, *, max_payload: int) -> None:
        self.signer = signer
        self.limit = max_payload + SIGNATURE_OVERHEAD
        self.rejected: dict[str, int] = {"unsigned": 0, "bad_signature": 0, "oversized": 0}

    def seal(self, topic: str, body: bytes) -> bytes:
        """``body`` signed for ``topic``."""
        return self.signer.sign(topic, body)

    def open(self, topic: str, data: bytes) -> bytes | None:
        """The verified body of ``data``, or ``None`` (dropped and counted)."""
        if len(data) > self.limit:
            self._count("oversized", f"payload of {len(data)} bytes on {_short(topic)}")
            return None
        try:
            return self.signer.verify(topic, data)
        except SignatureError as exc:
            self._count(exc.reason, str(exc))
            return None

    def _count(self, reason: str, detail: str) -> None:
        n = self.rejected[reason] = self.rejected[reason] + 1
        if str(n).rstrip("0") == "1":  # the 1st, 10th, 100th...
            log.warning("dropped %s payload #%d: %s", reason.replace("_", " "), n, detail)
