"""Names of agents, branches and namespaces, and the internal keys built from them.

**One rule for every name** (agent, branch, namespace), checked by :func:`validate_name`
wherever a name comes in: the manager, the stores, the branch graph, the transports, the
workflow files and the wire. A name is 1-256 characters of valid Unicode (no lone
surrogates) without ``/`` and ``+`` (MQTT topic levels and wildcards), ``#`` (the mark of
internal keys, also an MQTT wildcard), ``@`` (the separator of inbox keys) or control
characters (``U+0000``-``U+001F``, ``U+007F``-``U+009F``). :data:`NAME_PATTERN` is the
same rule as a regular expression, for pydantic fields and JSON Schema.

**Internal keys.** Besides conversations ``(namespace, agent, branch)``, a store holds the
memory patterns of each agent and the facts of workflow runs under keys only this module
builds (:func:`internal_key`, :func:`facts_key`) and reads back (:func:`parse_key`):

* conversation: ``(ns, agent, branch)``, the agent's messages;
* ``rag``: ``(ns, agent, "<branch>#rag")``, its RAG memory;
* ``episodes``: ``(ns, "<agent>#<branch>#episodes", "episodes")``, its episodic memory;
* ``tiers``: ``(ns, "<agent>#<branch>#tiers", tier)``, its hierarchical memory (``tier``:
  ``core``, ``working`` or ``archive``);
* ``facts``: ``(ns, "#facts", branch)``, the facts a workflow run recorded.

The spellings are those of earlier versions, so existing stores read as before. They
cannot be forged from names: every internal spelling contains ``#``, which no name may
contain, and a store accepts a key part that is not a name only when this module built it
(or the store itself returned it from ``list_keys``). A plain string such as
``"main#rag"`` passed as a branch is rejected everywhere with :class:`InvalidNameError`.

**Inbox keys.** The shared-fact inbox of an agent on a branch is :func:`inbox_key`:
``agent`` on ``main``, ``agent@branch`` elsewhere. Names cannot contain ``@``, so the
spelling is unambiguous (:func:`parse_inbox_key` inverts it).

Example:
    >>> validate_name("branch", "research-1")
    'research-1'
    >>> internal_key(("team", "alice", "main"), "rag")
    ('team', 'alice', 'main#rag')
    >>> parse_key(("team", "alice", "main#rag")).kind
    'rag'
    >>> inbox_key("writer", "r1"), parse_inbox_key("writer@r1")
    ('writer@r1', ('writer', 'r1'))
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Final, Literal, get_args

from marsys_mem.exceptions import InvalidNameError

__all__ = [
    "FACTS_AGENT",
    "MAX_NAME_LENGTH",
    "NAME_PATTERN",
    "TIERS",
    "InternalKind",
    "KeyInfo",
    "KeyKind",
    "facts_key",
    "inbox_key",
    "internal_key",
    "is_name",
    "parse_inbox_key",
    "parse_key",
    "stored_key",
    "validate_key",
    "validate_name",
]

Key = tuple[str, str, str]
"""``(namespace, agent, branch)`` (the same alias as :data:`marsys_mem.store.base.Key`)."""

MAX_NAME_LENGTH: Final = 256
NAME_PATTERN: Final = r"^[^/+#@\x00-\x1f\x7f-\x9f]{1,256}$"
"""The naming rule as a regular expression (for pydantic ``Field(pattern=...)``).

Python's :mod:`re` also needs the lone-surrogate check of :func:`is_name`; pydantic
rejects lone surrogates in every string on its own.
"""

FACTS_AGENT: Final = "#facts"
"""The agent part of the keys holding the facts of workflow runs (:func:`facts_key`)."""

InternalKind = Literal["rag", "episodes", "tiers"]
"""The memory-pattern data :func:`internal_key` builds keys for."""

KeyKind = Literal["conversation", "rag", "episodes", "tiers", "facts"]
"""What a store key holds (:attr:`KeyInfo.kind`)."""

TIERS: Final = ("core", "working", "archive")
"""The tiers of hierarchical memory (the branch part of a ``tiers`` key)."""

_NAME = re.compile(r"[^/+#@\x00-\x1f\x7f-\x9f]{1,256}")
_RESERVED = "/+#@"
_MARK = "#"
_SHOWN = 60
_PARTS = ("namespace", "agent", "branch")


class _Internal(str):
    """A key part that is not a name: built here, or returned by a store's ``list_keys``.

    Only this module makes them, so user input (a plain ``str``) can never pass for one.
    """

    __slots__ = ()


def _shown(value: object) -> str:
    """A short repr of ``value`` for error messages (never the whole of a huge value)."""
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
        f"{kind} must be 1-256 characters without '/', '+', '#', '@' or control "
        f"characters, got {_shown(value)} ({_why_not(value)})"
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
        raise InvalidNameError(f"an inbox key must be a string, got {_shown(key)}")
    agent, sep, branch = key.partition("@")
    if sep and branch == "main":
        raise InvalidNameError(f"the inbox key of an agent on main has no '@main': {_shown(key)}")
    return validate_name("agent", agent), validate_name("branch", branch) if sep else "main"


# ---------------------------------------------------------------------------- store keys
def _names(key: object, what: str = "key") -> Key:
    """``key`` as a tuple of three names (``what`` names it in errors)."""
    if not isinstance(key, tuple) or len(key) != 3:
        raise InvalidNameError(
            f"a {what} is a (namespace, agent, branch) tuple of names, got {_shown(key)}"
        )
    for part, value in zip(_PARTS, key, strict=True):
        validate_name(f"{what} {part}", value)
    return key


def internal_key(key: Key, kind: InternalKind, part: str | None = None) -> Key:
    """The store key of ``kind`` data of the conversation ``key``.

    Args:
        key: ``(namespace, agent, branch)`` of the agent's conversation (names).
        kind: ``rag``, ``episodes`` or ``tiers``.
        part: the tier for ``tiers`` (one of :data:`TIERS`); ``None`` otherwise.

    Raises:
        InvalidNameError: a part of ``key`` is not a name.
        ValueError: an unknown ``kind``, or a ``part`` that does not fit it.

    Example:
        >>> internal_key(("d", "alice", "main"), "tiers", "core")
        ('d', 'alice#main#tiers', 'core')
        >>> internal_key(("d", "alice", "main"), "episodes")
        ('d', 'alice#main#episodes', 'episodes')
    """
    namespace, agent, branch = _names(key)
    if kind == "rag" and part is None:
        return (namespace, agent, _Internal(f"{branch}{_MARK}rag"))
    if kind == "episodes" and part is None:
        return (namespace, _Internal(f"{agent}{_MARK}{branch}{_MARK}episodes"), "episodes")
    if kind == "tiers" and part in TIERS:
        assert part is not None
        return (namespace, _Internal(f"{agent}{_MARK}{branch}{_MARK}tiers"), part)
    if kind not in get_args(InternalKind):
        raise ValueError(f"kind must be one of {get_args(InternalKind)}, got {_shown(kind)}")
    need = f"one of {TIERS}" if kind == "tiers" else "None"
    raise ValueError(f"part of a {kind} key must be {need}, got {_shown(part)}")


def facts_key(namespace: str, branch: str) -> Key:
    """The store key of the facts a workflow run recorded on ``branch``.

    Example:
        >>> facts_key("d", "main")
        ('d', '#facts', 'main')
    """
    validate_name("namespace", namespace)
    validate_name("branch", branch)
    return (namespace, _Internal(FACTS_AGENT), branch)


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """What a store key holds and whose it is (:func:`parse_key`).

    Attributes:
        key: the key, usable with any store (internal parts accepted).
        kind: ``conversation``, ``rag``, ``episodes``, ``tiers`` or ``facts``.
        namespace: the namespace.
        agent: whose data it is (``None`` for ``facts``).
        branch: the branch of the conversation it belongs to.
        part: the tier of a ``tiers`` key (else ``None``).

    Example:
        >>> info = parse_key(("d", "alice#r1#tiers", "working"))
        >>> info.kind, info.agent, info.branch, info.part
        ('tiers', 'alice', 'r1', 'working')
        >>> info.conversation
        ('d', 'alice', 'r1')
    """

    key: Key
    kind: KeyKind
    namespace: str
    agent: str | None
    branch: str
    part: str | None = None

    @property
    def conversation(self) -> Key | None:
        """The key of the conversation this data belongs to (``None`` for facts)."""
        if self.agent is None:
            return None
        return (self.namespace, self.agent, self.branch)


def parse_key(key: object) -> KeyInfo:
    """Read a store key: a conversation, or one of the internal keys this module builds.

    Raises:
        InvalidNameError: ``key`` is neither (the message names the first bad part).

    Example:
        >>> parse_key(("d", "alice", "main")).kind
        'conversation'
        >>> parse_key(("d", "#facts", "r1")).branch
        'r1'
    """
    if not isinstance(key, tuple) or len(key) != 3 or not all(isinstance(p, str) for p in key):
        return _parse_fail(key)
    namespace, agent, branch = (str(p) for p in key)
    if not is_name(namespace):
        return _parse_fail(key)
    if is_name(agent) and is_name(branch):
        return KeyInfo((namespace, agent, branch), "conversation", namespace, agent, branch)
    if agent == FACTS_AGENT and is_name(branch):
        return KeyInfo(facts_key(namespace, branch), "facts", namespace, None, branch)
    if is_name(agent) and branch.endswith(f"{_MARK}rag") and is_name(branch[:-4]):
        base = (namespace, agent, branch[:-4])
        return KeyInfo(internal_key(base, "rag"), "rag", namespace, agent, branch[:-4])
    pieces = agent.split(_MARK)
    if len(pieces) == 3 and is_name(pieces[0]) and is_name(pieces[1]):
        owner, home, what = pieces
        base = (namespace, owner, home)
        if what == "episodes" and branch == "episodes":
            return KeyInfo(internal_key(base, "episodes"), "episodes", namespace, owner, home)
        if what == "tiers" and branch in TIERS:
            built = internal_key(base, "tiers", branch)
            return KeyInfo(built, "tiers", namespace, owner, home, branch)
    return _parse_fail(key)


def _parse_fail(key: object) -> KeyInfo:
    _names(key, "store key")  # raises, naming the first part that is not a name
    raise AssertionError("unreachable")  # pragma: no cover


def validate_key(key: object) -> Key:
    """Check a store key: a tuple of three names, where only internal parts may be other.

    Internal parts are those :func:`internal_key` / :func:`facts_key` / :func:`parse_key`
    built, or a store's ``list_keys`` returned (:func:`stored_key`); a plain string that
    is not a name is rejected, so a name can never address another key's data.

    Raises:
        InvalidNameError: not a 3-tuple, or a part that is neither a name nor internal.

    Example:
        >>> validate_key(("d", "alice", "main"))
        ('d', 'alice', 'main')
        >>> validate_key(internal_key(("d", "alice", "main"), "rag"))
        ('d', 'alice', 'main#rag')
    """
    if isinstance(key, tuple) and len(key) == 3:
        namespace, agent, branch = key
        if _key_part(namespace) and _key_part(agent) and _key_part(branch):  # fast path
            return key
        for part, value in zip(_PARTS, key, strict=True):
            if not _key_part(value):
                validate_name(f"store key {part}", value)
    raise InvalidNameError(
        f"a store key is a (namespace, agent, branch) tuple of names, got {_shown(key)}"
    )


def _key_part(value: object) -> bool:
    if value.__class__ is str:
        return 0 < len(value) <= MAX_NAME_LENGTH and _valid(value)
    return isinstance(value, _Internal) or is_name(value)


def stored_key(key: Key) -> Key:
    """A key read back from a store, marked so that the store accepts it again.

    Stores call this on what ``list_keys`` returns: internal keys, and keys written
    before the naming rule, stay readable and deletable. Parts that are names stay plain.
    """
    namespace, agent, branch = key
    return (
        namespace if is_name(namespace) else _Internal(namespace),
        agent if is_name(agent) else _Internal(agent),
        branch if is_name(branch) else _Internal(branch),
    )
