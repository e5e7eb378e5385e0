"""What coordinators exchange and report: the wire envelope, deliveries, merge results.

:class:`FactEnvelope` is the one payload on the wire (pydantic, validated on receipt:
anything else is dropped and counted). :class:`FactDelivery` is what ``on_fact``
callbacks receive; :class:`MergeResult` what :meth:`Coordinator.merge` returns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from marsys_mem.coordination.graph import MergeStrategy
from marsys_mem.facts import FactScope, SharedFact
from marsys_mem.names import NAME_PATTERN
from marsys_mem.patterns.shared import ConflictRule, member_key

__all__ = [
    "FactCallback",
    "FactDelivery",
    "FactEnvelope",
    "MergeResult",
    "inbox_key",
]

_NAME_PATTERN = NAME_PATTERN  # the one naming rule (marsys_mem.names)

inbox_key = member_key
"""The :class:`SharedMemoryPool` member name of an agent on a branch (``member_key``)."""


class FactEnvelope(BaseModel):
    """What a coordinator publishes: one fact, its sender and sequence number, its route.

    ``branch`` and ``scope`` say where the fact goes (for a share: the fact's own
    ``source_branch`` and ``scope``; for a merge: the target branch, scope ``branch``);
    ``conflict``, when set, is the rule applied to facts on the same ``metadata["topic"]``
    when this one is delivered. ``v`` is the wire-format version.

    Example:
        >>> fact = SharedFact.create("Q4 revenue grew 12%", agent="researcher")
        >>> env = FactEnvelope(namespace="team", sender="c1", seq=1, branch="main",
        ...                    scope="branch", fact=fact)
        >>> FactEnvelope.model_validate_json(env.model_dump_json()) == env
        True
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    v: Literal[1] = 1
    namespace: str = Field(pattern=_NAME_PATTERN)
    sender: str = Field(min_length=1, max_length=128)
    seq: int = Field(ge=1, le=2**63 - 1)
    branch: str = Field(pattern=_NAME_PATTERN)
    scope: FactScope
    conflict: ConflictRule | None = None
    fact: SharedFact


@dataclass(frozen=True, slots=True)
class FactDelivery:
    """A fact newly delivered to ``agent`` on ``branch`` (what ``on_fact`` callbacks get).

    Example:
        >>> fact = SharedFact.create("Budget is 4000 EUR", agent="planner")
        >>> FactDelivery("writer", "r1", fact).key
        'writer@r1'
    """

    agent: str
    branch: str
    fact: SharedFact

    @property
    def key(self) -> str:
        """The agent's inbox key (:func:`inbox_key`)."""
        return inbox_key(self.agent, self.branch)


FactCallback = Callable[[FactDelivery], Any]


@dataclass(frozen=True)
class MergeResult:
    """What :meth:`Coordinator.merge` brought into the target branch.

    Example:
        >>> MergeResult("r1", "main", "facts", "newest").messages
        0
    """

    child: str
    into: str
    strategy: MergeStrategy
    conflict: ConflictRule
    facts: tuple[SharedFact, ...] = ()
    messages: int = 0  # messages appended to the target's memories
    summary: str | None = None
