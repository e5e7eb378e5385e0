"""Store keys: conversations, and the internal keys of pattern data and run facts.

Besides conversations ``(namespace, agent, branch)``, a store holds the
memory patterns of each agent and the facts of workflow runs under keys only this module
builds (:func:`internal_key`, :func:`facts_key`) and reads back (:func:`parse_key`):

* conversation: ``(ns, agent, branch)``, the agent's messages;
* ``rag``: ``(ns, agent, "<branch>#rag")``, its RAG memory;
* ``episodes``: ``(ns, "<agent>#<branch>#episodes", "episodes")``, its episodic memory;
* ``tiers``: ``(ns, "<agent>#<branch>#tiers", tier)``, its hierarchical memory (``tier``:
  ``core``, ``working`` or ``archive``);
* ``facts``: ``(ns, "#facts", branch)``, the facts a workflow run recorded;
* ``user_facts``: ``(ns, "#user-facts", subject)``, what a FactMemory learned about a subject
  (:func:`subject_facts_key`);
* ``threads``: ``(ns, "#threads", subject)``, the conversations held with a subject
  (:func:`subject_threads_key`, for cross-thread recall).

These spellings are a stored format (changing one needs a store migration). They
cannot be forged from names: every internal spelling contains ``#``, which no name may
contain, and a store accepts a key part that is not a name only when this module built it
(or the store itself returned it from ``list_keys``). A plain string such as
``"main#rag"`` passed as a branch is rejected everywhere with :class:`InvalidNameError`.

Example:
    >>> internal_key(("team", "alice", "main"), "rag")
    ('team', 'alice', 'main#rag')
    >>> parse_key(("team", "alice", "main#rag")).kind
    'rag'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, get_args

from marsys_mem.exceptions import InvalidNameError
from marsys_mem.model.names import MAX_NAME_LENGTH, is_name, shown, validate_name

__all__ = [
    "FACTS_AGENT",
    "SUBJECT_FACTS_AGENT",
    "SUBJECT_THREADS_AGENT",
    "TIERS",
    "InternalKind",
    "Key",
    "KeyInfo",
    "KeyKind",
    "facts_key",
    "internal_key",
    "parse_key",
    "stored_key",
    "subject_facts_key",
    "subject_threads_key",
    "validate_key",
]

Key = tuple[str, str, str]
"""A store key: ``(namespace, agent, branch)``."""

FACTS_AGENT: Final = "#facts"
"""The agent part of the keys holding the facts of workflow runs (:func:`facts_key`)."""

InternalKind = Literal["rag", "episodes", "tiers"]
"""The memory-pattern data :func:`internal_key` builds keys for."""

SUBJECT_FACTS_AGENT: Final = "#user-facts"
"""The agent part of the keys holding facts about a subject (:func:`subject_facts_key`)."""

SUBJECT_THREADS_AGENT: Final = "#threads"
"""The agent part of the keys listing a subject's conversations (:func:`subject_threads_key`)."""

KeyKind = Literal["conversation", "rag", "episodes", "tiers", "facts", "user_facts", "threads"]
"""What a store key holds (:attr:`KeyInfo.kind`)."""

TIERS: Final = ("core", "working", "archive")
"""The tiers of hierarchical memory (the branch part of a ``tiers`` key)."""

_MARK = "#"
_PARTS = ("namespace", "agent", "branch")


class _Internal(str):
    """A key part that is not a name: built here, or returned by a store's ``list_keys``.

    Only this module makes them, so user input (a plain ``str``) can never pass for one.
    """

    __slots__ = ()


def _names(key: object, what: str = "key") -> Key:
    """``key`` as a tuple of three names (``what`` names it in errors)."""
    if not isinstance(key, tuple) or len(key) != 3:
        raise InvalidNameError(
            f"a {what} is a (namespace, agent, branch) tuple of names, got {shown(key)}"
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
        raise ValueError(f"kind must be one of {get_args(InternalKind)}, got {shown(kind)}")
    need = f"one of {TIERS}" if kind == "tiers" else "None"
    raise ValueError(f"part of a {kind} key must be {need}, got {shown(part)}")


def facts_key(namespace: str, branch: str) -> Key:
    """The store key of the facts a workflow run recorded on ``branch``.

    Example:
        >>> facts_key("d", "main")
        ('d', '#facts', 'main')
    """
    validate_name("namespace", namespace)
    validate_name("branch", branch)
    return (namespace, _Internal(FACTS_AGENT), branch)


def subject_facts_key(namespace: str, subject: str) -> Key:
    """The store key of the facts a :class:`~marsys_mem.patterns.FactMemory` holds on ``subject``.

    No agent name can spell it (``#`` is reserved), so a conversation never shares it.

    Example:
        >>> subject_facts_key("d", "alice")
        ('d', '#user-facts', 'alice')
    """
    validate_name("namespace", namespace)
    validate_name("subject", subject)
    return (namespace, _Internal(SUBJECT_FACTS_AGENT), subject)


def subject_threads_key(namespace: str, subject: str) -> Key:
    """The store key listing the conversations (threads) held with ``subject``.

    Example:
        >>> subject_threads_key("d", "alice")
        ('d', '#threads', 'alice')
    """
    validate_name("namespace", namespace)
    validate_name("subject", subject)
    return (namespace, _Internal(SUBJECT_THREADS_AGENT), subject)


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """What a store key holds and whose it is (:func:`parse_key`).

    Attributes:
        key: the key, usable with any store (internal parts accepted).
        kind: ``conversation``, ``rag``, ``episodes``, ``tiers``, ``facts``, ``user_facts``
            or ``threads``.
        namespace: the namespace.
        agent: whose data it is (``None`` for ``facts``, ``user_facts`` and ``threads``).
        branch: the branch of the conversation it belongs to (the subject for
            ``user_facts`` and ``threads``).
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
    if agent == SUBJECT_FACTS_AGENT and is_name(branch):
        built = subject_facts_key(namespace, branch)
        return KeyInfo(built, "user_facts", namespace, None, branch)
    if agent == SUBJECT_THREADS_AGENT and is_name(branch):
        built = subject_threads_key(namespace, branch)
        return KeyInfo(built, "threads", namespace, None, branch)
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
        f"a store key is a (namespace, agent, branch) tuple of names, got {shown(key)}"
    )


def _key_part(value: object) -> bool:
    if value.__class__ is str:
        return 0 < len(value) <= MAX_NAME_LENGTH and is_name(value)
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
