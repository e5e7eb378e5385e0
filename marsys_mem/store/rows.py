"""Stored message rows read one by one: each valid or with why not, huge ones read in part.

Inspection (``marsys-mem inspect`` / ``search``) reads rows with
:meth:`~marsys_mem.store.sqlite.SQLiteStore.read_rows`: a row that does not validate (bad
JSON, a message the model refuses) comes back as a :class:`StoredRow` with its ``error``
instead of failing the whole read, and a row larger than a bound is not loaded at all: its
first bytes are read (SQLite incremental blob I/O) and :func:`head_preview` takes the role
and the beginning of the text from them.
"""

from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass
from datetime import datetime

from pydantic import ValidationError

from marsys_mem.model.messages import Message

__all__ = ["StoredRow", "error_reason", "head_preview"]

_REASON_LIMIT = 200


@dataclass(frozen=True, slots=True)
class StoredRow:
    """One stored message row: the message, or what was readable and why it is not valid.

    Attributes:
        seq: the row's position in the store (its cursor).
        message_id: the id the row is stored under.
        timestamp: the time the row is stored under.
        size: the row's JSON, in bytes.
        message: the validated message; ``None`` when invalid or not loaded (too large).
        role: the role (from the message, or read from the head of a large row).
        head_text: the beginning of the text of a row too large to load (else ``None``).
        error: why the row does not validate (``None``: valid, or not loaded).

    Example:
        >>> from datetime import UTC, datetime
        >>> row = StoredRow(1, "m1", datetime(2026, 1, 1, tzinfo=UTC), 2, error="bad JSON")
        >>> row.valid, row.preview
        (False, '')
    """

    seq: int
    message_id: str
    timestamp: datetime
    size: int
    message: Message | None = None
    role: str | None = None
    head_text: str | None = None
    error: str | None = None

    @property
    def valid(self) -> bool:
        """Whether the row is readable: a valid message, or the head of a large one."""
        return self.error is None

    @property
    def preview(self) -> str:
        """The beginning of the text (whole when the row was loaded), or ``""``."""
        if self.message is not None:
            return self.message.text
        return self.head_text or ""


def error_reason(exc: Exception) -> str:
    """A one-line reason for a row that failed to validate (the first error, bounded).

    Example:
        >>> try:
        ...     Message.model_validate_json('{"role": "user", "pinned": "maybe"}')
        ... except ValidationError as exc:
        ...     print(error_reason(exc))
        pinned: Input should be a valid boolean, unable to interpret input
    """
    if isinstance(exc, ValidationError):
        errors = exc.errors(include_url=False, include_input=False)
        first = errors[0] if errors else None
        if first is None:
            reason = str(exc)
        else:
            where = ".".join(str(p) for p in first["loc"])
            reason = f"{where}: {first['msg']}" if where else str(first["msg"])
            if len(errors) > 1:
                reason += f" (and {len(errors) - 1} more)"
    else:
        reason = str(exc)
    reason = " ".join(reason.split())
    return reason if len(reason) <= _REASON_LIMIT else reason[: _REASON_LIMIT - 3] + "..."


_HEAD = re.compile(r'\s*\{\s*"role"\s*:\s*"(?P<role>[a-z_]{1,32})"\s*,\s*"content"\s*:\s*')
_UTF8 = codecs.getincrementaldecoder("utf-8")
_TAIL_ESCAPE = re.compile(r"(\\+)(u[0-9a-fA-F]{0,3})?$")


def head_preview(head: bytes) -> tuple[str, str]:
    r"""``(role, text)``: the role and the beginning of the text, from a row's first bytes.

    ``head`` is the start of a message's JSON (as the store writes it: ``role`` first,
    then ``content``); the text is the content string's beginning, unescaped (a
    non-string content gives ``""``).

    Raises:
        ValueError: ``head`` does not start like a stored message.

    Example:
        >>> head_preview(b'{"role":"user","content":"a long text\\nthat goes on an')
        ('user', 'a long text\nthat goes on an')
    """
    try:
        text = _UTF8().decode(head, final=False)  # a character cut at the end is dropped
    except UnicodeDecodeError as exc:
        raise ValueError(f"the row is not UTF-8 text ({exc.reason})") from exc
    found = _HEAD.match(text)
    if found is None:
        raise ValueError("the row does not start like a stored message (role, content)")
    rest = text[found.end() :]
    if not rest.startswith('"'):
        return found["role"], ""
    body = rest[1:]
    end = _string_end(body)
    body = body[:end] if end is not None else _whole_escapes(body)
    try:
        value = json.loads(f'"{body}"')
    except json.JSONDecodeError as exc:
        raise ValueError(f"the row's content is not a valid JSON string ({exc.msg})") from exc
    value = str(value)
    if value and "\ud800" <= value[-1] <= "\udbff":  # half of a pair cut at the end
        value = value[:-1]
    return found["role"], value


def _string_end(body: str) -> int | None:
    """Where the JSON string ``body`` (after its opening quote) ends, if it does here."""
    i = 0
    while True:
        quote = body.find('"', i)
        if quote < 0:
            return None
        slashes = len(body[:quote]) - len(body[:quote].rstrip("\\"))
        if slashes % 2 == 0:
            return quote
        i = quote + 1


def _whole_escapes(body: str) -> str:
    r"""``body`` without an escape cut in half at its end (``\`` or ``\u12``)."""
    tail = _TAIL_ESCAPE.search(body)
    if tail is None or len(tail[1]) % 2 == 0:
        return body
    return body[: tail.start()] + tail[1][:-1]
