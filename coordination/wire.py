"""The wire rules every transport shares: topics, filters, the namespace fence, payload size.

Fact topics are ``marsys/<namespace>/branch/<branch>/facts`` (:func:`fact_topic`); a
coordinator subscribes to ``marsys/<namespace>/branch/+/facts`` (:func:`facts_filter`) and to
``marsys/<namespace>/control`` (:func:`control_topic`: high-water marks, resend requests).
Every transport is bound to one namespace and refuses topics outside ``marsys/<namespace>/``
(:func:`check_in_namespace`), so no payload crosses namespaces; and every transport refuses
a payload that is not bytes or is over its ``max_payload`` (:func:`check_payload`).

These checks are written once, here, and used by
:class:`~marsys_mem.coordination.InProcessTransport`,
:class:`~marsys_mem.coordination.MqttTransport` and the coordinator. The module depends
on nothing else in the coordination package (the one naming rule comes from
:mod:`marsys_mem.model.names`).

Example:
    >>> topic = fact_topic("team-a", "r1")
    >>> topic_matches(facts_filter("team-a"), topic), parse_fact_topic(topic)
    (True, ('team-a', 'r1'))
    >>> check_in_namespace("team-b", topic, "topic")
    Traceback (most recent call last):
    ...
    ValueError: topic 'marsys/team-a/branch/r1/facts' is outside this transport's namespace ...
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from marsys_mem.config.coordination import CoordinatorSettings
from marsys_mem.model.names import is_name, validate_name

__all__ = [
    "DEFAULT_MAX_PAYLOAD",
    "check_in_namespace",
    "check_payload",
    "control_topic",
    "fact_topic",
    "facts_filter",
    "levels_match",
    "namespace_prefix",
    "parse_fact_topic",
    "topic_matches",
    "validate_filter",
    "validate_topic",
]

DEFAULT_MAX_PAYLOAD: Final = CoordinatorSettings().max_payload
"""The largest payload a transport publishes unless told otherwise (bytes; the default of
:attr:`CoordinatorSettings.max_payload`)."""


# ---------------------------------------------------------------------------- topics
def namespace_prefix(namespace: str) -> str:
    """``marsys/<namespace>/``: every topic of a namespace starts with it.

    Example:
        >>> namespace_prefix("team-a")
        'marsys/team-a/'
    """
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
    """A topic to publish on: non-empty, no wildcards, no NUL, at most 65535 bytes.

    Raises:
        ValueError: the topic breaks one of these rules.
    """
    if not isinstance(topic, str) or not topic:
        raise ValueError(f"a topic must be a non-empty string, got {topic!r}")
    if "+" in topic or "#" in topic or "\x00" in topic:
        raise ValueError(f"a topic to publish on cannot contain '+', '#' or NUL: {topic!r}")
    if len(topic.encode("utf-8")) > 65535:
        raise ValueError("a topic is at most 65535 bytes")
    return topic


def validate_filter(topic_filter: object) -> str:
    """An MQTT topic filter: ``+`` matches one level, ``#`` (last) the rest.

    Raises:
        ValueError: a wildcard that is not a whole level, ``#`` not last, or a NUL.
    """
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
    return levels_match(topic_filter.split("/"), topic.split("/"))


def levels_match(filter_levels: Sequence[str], topic_levels: Sequence[str]) -> bool:
    """:func:`topic_matches` on filter and topic already split at ``/`` (a broker's hot path).

    Example:
        >>> levels_match(("marsys", "a", "#"), ["marsys", "a", "control"])
        True
    """
    n = len(topic_levels)
    for i, part in enumerate(filter_levels):
        if part == "#":
            return True
        if i >= n or (part != "+" and part != topic_levels[i]):
            return False
    return len(filter_levels) == n


# ---------------------------------------------------------------------------- checks
def check_in_namespace(namespace: str, topic: str, what: str) -> None:
    """Refuse a topic (or filter) outside ``marsys/<namespace>/``.

    Args:
        namespace: the transport's namespace.
        topic: the topic or topic filter to check.
        what: how the error names it (``"topic"``, ``"topic filter"``).

    Raises:
        ValueError: ``topic`` does not start with ``marsys/<namespace>/``.

    Example:
        >>> check_in_namespace("t", "marsys/t/control", "topic") is None
        True
    """
    prefix = f"marsys/{namespace}/"
    if not topic.startswith(prefix):
        raise ValueError(
            f"{what} {topic!r} is outside this transport's namespace {namespace!r} "
            f"(it must start with {prefix!r})"
        )


def check_payload(payload: object, max_payload: int) -> bytes:
    """``payload`` as ``bytes``, if it is bytes-like and at most ``max_payload`` bytes.

    Raises:
        TypeError: ``payload`` is not ``bytes``, ``bytearray`` or ``memoryview``.
        ValueError: it is longer than ``max_payload``.

    Example:
        >>> check_payload(bytearray(b"hi"), 16)
        b'hi'
    """
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise TypeError(f"a payload must be bytes, got {type(payload).__name__}")
    data = bytes(payload)
    if len(data) > max_payload:
        raise ValueError(f"payload of {len(data)} bytes is over the maximum of {max_payload}")
    return data
