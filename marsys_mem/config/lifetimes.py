"""How long each kind of an agent's data lives under its policy, in words a user can read.

One statement of the ownership rule (:mod:`marsys_mem.store.owners`) per kind of record,
for ``marsys-mem validate``: what the conversation keeps, and that every record derived
from a message follows it unless the policy names an archive with its own bound and ttl.

Example:
    >>> from marsys_mem.config.models import RetentionPolicy
    >>> policy = RetentionPolicy.model_validate(
    ...     {"retention": "persistent", "ttl": "30d", "max_stored_messages": 10000,
    ...      "patterns": {"rag": True}})
    >>> for kind, text in lifetimes(policy):
    ...     print(f"{kind}: {text}")
    conversation: stored; each message for 30d, the newest 10,000 kept
    rag entries: as long as their message (ttl, bound, forget)
"""

from __future__ import annotations

from datetime import timedelta

from marsys_mem.config.models import RetentionPolicy

__all__ = ["lifetimes", "shown_duration"]

_FOLLOWS = "as long as their message (ttl, bound, forget)"


def shown_duration(value: timedelta) -> str:
    """``value`` as the policy files write it (``30d``, ``1d12h``, ``90s``).

    Example:
        >>> shown_duration(timedelta(days=1, hours=12)), shown_duration(timedelta(seconds=90))
        ('1d12h', '1m30s')
    """
    seconds = int(value.total_seconds())
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def _conversation(policy: RetentionPolicy) -> str:
    scope = {
        "persistent": "stored",
        "session": "until the session ends",
        "single_run": "until the run ends",
    }[policy.retention]
    limits = []
    if policy.ttl is not None:
        limits.append(f"each message for {shown_duration(policy.ttl)}")
    if policy.max_stored_messages is not None:
        limits.append(f"the newest {policy.max_stored_messages:,} kept")
    return "; ".join([scope, ", ".join(limits)]) if limits else scope


def lifetimes(policy: RetentionPolicy) -> list[tuple[str, str]]:
    """``(kind, how long it lives)`` for the conversation and each enabled pattern."""
    found = [("conversation", _conversation(policy))]
    patterns = policy.patterns
    rag = patterns.rag
    if rag is not None:
        if rag.keep == "archive":
            ttl = rag.ttl if rag.ttl is not None else policy.ttl
            limits = [f"each entry for {shown_duration(ttl)}"] if ttl is not None else []
            if rag.max_stored_messages is not None:
                limits.append(f"the newest {rag.max_stored_messages:,} kept")
            bound = ", ".join(limits) or "no bound"
            found.append(
                ("rag entries", f"an archive beyond the conversation: {bound}; forget reaches it")
            )
        else:
            found.append(("rag entries", _FOLLOWS))
    if patterns.episodic is not None:
        found.append(("episodes", f"entries {_FOLLOWS}; a summary is redone without them"))
    if patterns.hierarchical is not None:
        found.append(("tiers", _FOLLOWS))
    if patterns.learns_facts:
        found.append(("learned facts", "while one of the messages they were learned from remains"))
    return found
