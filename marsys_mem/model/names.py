"""Names of agents, branches and namespaces: the one naming rule, and inbox keys.

**One rule for every name** (agent, branch, namespace), checked by :func:`validate_name`
wherever a name comes in: the manager, the stores, the branch graph, the transports, the
workflow files and the wire. A name is 1-256 characters of valid Unicode (no lone
surrogates) without ``/`` and ``+`` (MQTT topic levels and wildcards), ``#`` (the mark of
internal keys, also an MQTT wildcard), ``@`` (the separator of inbox keys), control
characters (``U+0000``-``U+001F``, ``U+007F``-``U+009F``), or invisible and bidi format
characters (zero-width, direction marks and overrides, line and paragraph separators),
which would let two different names look alike. :data:`NAME_PATTERN` is the same rule as
a regular expression, for pydantic fields and JSON Schema.

**Inbox keys.** The shared-fact inbox of an agent on a branch is :func:`inbox_key`:
``agent`` on ``main``, ``agent@branch`` elsewhere. Names cannot contain ``@``, so the
spelling is unambiguous (:func:`parse_inbox_key` inverts it).

Example:
    >>> validate_name("branch", "research-1")
    'research-1'
    >>> inbox_key("writer", "r1"), parse_inbox_key("writer@r1")
    ('writer@r1', ('writer', 'r1'))
"""

from __future__ import annotations

import functools
import re
from typing import Final

from marsys_mem.exceptions import InvalidNameError

__all__ = [
    "MAX_NAME_LENGTH",
    "NAME_PATTERN",
    "inbox_key",
    "is_name",
    "parse_inbox_key",
    "shown",
    "validate_name",
]

MAX_NAME_LENGTH: Final = 256
# controls; and the invisible or direction-changing format characters that make two names
# look alike or reorder text around them: zero-width (U+200B-U+200D, U+2060-U+2064,
# U+FEFF), marks and bidi controls (U+061C, U+200E-U+200F, U+202A-U+202E, U+2066-U+2069),
# U+180E, and the line / paragraph separators (U+2028-U+2029)
_FORBIDDEN = (
    r"/+#@\x00-\x1f\x7f-\x9f\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064"
    r"\u2066-\u2069\ufeff"
)
NAME_PATTERN: Final = rf"^[^{_FORBIDDEN}]{{1,256}}$"
"""The naming rule as a regular expression (for pydantic ``Field(pattern=...)``).

Python's :mod:`re` also needs the lone-surrogate check of :func:`is_name`; pydantic
rejects lone surrogates in every string on its own.
"""

_NAME = re.compile(rf"[^{_FORBIDDEN}]{{1,256}}")
_RESERVED = "/+#@"
_SHOWN = 60


def shown(value: object) -> str:
    """A short repr of ``value`` for error messages (never the whole of a huge value).

    Example:
        >>> shown("x" * 100)
        "'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'... (100 characters)"
    """
    if isinstance(value, str):
        text = value if len(value) <= _SHOWN else value[:_SHOWN]
        shown = repr(str(text))
        return shown + f"... ({len(value)} characters)" if len(value) > _SHOWN else shown
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."


def _why_not(value: object) -> str:
    """Why ``value`` is not a name (for the error message)."""
    if not isinstance(value, str):
        return f"a {type(value).__name__}, not a string"
    if not value:
        return "it is empty"
    if len(value) > MAX_NAME_LENGTH:
        return f"{len(value)} characters"
    if _NAME.fullmatch(value) is None:
        bad = next(c for c in value if c in _RESERVED or not _NAME.fullmatch(c))
        return f"it contains {bad!r}"
    return "it contains a lone surrogate, not valid Unicode"


def is_name(value: object) -> bool:
    """Whether ``value`` follows the naming rule.

    Example:
        >>> is_name("researcher"), is_name("a@b"), is_name(""), is_name("x" * 257)
        (True, False, False, False)
    """
    return isinstance(value, str) and 0 < len(value) <= MAX_NAME_LENGTH and _valid(str(value))


@functools.lru_cache(maxsize=4096)  # keys are at most 256 characters: bounded memory
def _valid(value: str) -> bool:
    if _NAME.fullmatch(value) is None:
        return False
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True


def validate_name(kind: str, value: object) -> str:
    """Check a name (agent, branch, namespace): 1-256 characters, no ``/+#@`` or controls.

    Args:
        kind: what the name is, for the message (``"agent"``, ``"branch"``, ...).
        value: the name to check.

    Returns:
        ``value``, unchanged.

    Raises:
        InvalidNameError: ``value`` breaks the rule (the message names ``kind`` and shows
            ``value``, truncated).

    Example:
        >>> validate_name("agent", "researcher")
        'researcher'
    """
    if is_name(value):
        assert isinstance(value, str)
        return value
    raise InvalidNameError(
        f"{kind} must be 1-256 characters without '/', '+', '#', '@', control or "
        f"invisible characters, got {shown(value)} ({_why_not(value)})"
    )


# ---------------------------------------------------------------------------- inboxes
def inbox_key(agent: str, branch: str = "main") -> str:
    """The shared-fact inbox of ``agent`` on ``branch``: ``agent`` on main, else ``agent@branch``.

    Both are checked names, so no other pair spells the same inbox.

    Raises:
        InvalidNameError: ``agent`` or ``branch`` is not a name.

    Example:
        >>> inbox_key("writer"), inbox_key("writer", "r1")
        ('writer', 'writer@r1')
    """
    validate_name("agent", agent)
    validate_name("branch", branch)
    return agent if branch == "main" else f"{agent}@{branch}"


def parse_inbox_key(key: str) -> tuple[str, str]:
    """``(agent, branch)`` of an inbox key (the inverse of :func:`inbox_key`).

    Raises:
        InvalidNameError: ``key`` is not an inbox key.

    Example:
        >>> parse_inbox_key("writer"), parse_inbox_key("writer@r1")
        (('writer', 'main'), ('writer', 'r1'))
    """
    if not isinstance(key, str):
        raise InvalidNameError(f"an inbox key must be a string, got {shown(key)}")
    agent, sep, branch = key.partition("@")
    if sep and branch == "main":
        raise InvalidNameError(f"the inbox key of an agent on main has no '@main': {shown(key)}")
    return validate_name("agent", agent), validate_name("branch", branch) if sep else "main"
