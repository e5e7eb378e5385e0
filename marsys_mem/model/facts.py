"""Shared facts: what agents tell each other, with provenance.

A :class:`SharedFact` is immutable and identified by a hash of its normalised text, so the
same fact shared twice (by anyone, with any spacing or case) has the same ``id`` and is
stored once. It carries who shared it, from which branch, when, with what confidence, and
its ``scope``: who should receive it.

Scopes (see ``marsys_mem.coordination``):

* ``branch``: agents of the same branch.
* ``subtree``: the branch and its descendants.
* ``lineage``: the branch's ancestors and descendants.
* ``global``: every agent.

It is the payload of :class:`~marsys_mem.patterns.SharedMemoryPool` and of the coordination
transports (in process and MQTT), validated at each boundary.
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, JsonValue, field_validator

from marsys_mem.model.messages import Message, freeze_json
from marsys_mem.model.names import NAME_PATTERN

__all__ = ["SCOPES", "FactScope", "SharedFact", "fact_id", "fact_message", "fact_of_message"]

FactScope = Literal["branch", "subtree", "lineage", "global"]
SCOPES: tuple[FactScope, ...] = ("branch", "subtree", "lineage", "global")

_SPACE = re.compile(r"\s+")


def fact_id(text: str) -> str:
    """Stable id of a fact's text: sha256 of the case-folded, whitespace-collapsed text."""
    norm = _SPACE.sub(" ", text).strip().casefold()
    return hashlib.sha256(norm.encode("utf-8")).hexdigest()[:32]


class SharedFact(BaseModel):
    """One fact shared by an agent.

    Example:
        >>> f = SharedFact.create("Q4 revenue grew 12%", agent="researcher", branch="r1")
        >>> g = SharedFact.create("  q4 revenue  grew 12% ", agent="analyst", branch="main")
        >>> f.id == g.id, f.scope
        (True, 'branch')
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1, max_length=128)
    text: str = Field(min_length=1, max_length=20_000)
    source_agent: str = Field(pattern=NAME_PATTERN)  # names: marsys_mem.model.names
    source_branch: str = Field(default="main", pattern=NAME_PATTERN)
    scope: FactScope = "branch"
    created_at: AwareDatetime = Field(default_factory=lambda: datetime.now(UTC))
    confidence: float = Field(default=1.0, ge=0.0, le=1.0)
    metadata: dict[str, JsonValue] = Field(default_factory=dict)

    @field_validator("text")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("a fact's text must not be blank")
        return value

    @field_validator("metadata")
    @classmethod
    def _freeze_metadata(cls, value: Any) -> Any:
        return freeze_json(value)

    @classmethod
    def create(
        cls,
        text: str,
        *,
        agent: str,
        branch: str = "main",
        scope: FactScope = "branch",
        confidence: float = 1.0,
        metadata: dict[str, Any] | None = None,
    ) -> SharedFact:
        """A fact whose ``id`` is derived from its text (see :func:`fact_id`)."""
        if not isinstance(text, str):
            raise TypeError(f"a fact's text must be a string, got {type(text).__name__}")
        return cls(
            id=fact_id(text),
            text=text.strip(),
            source_agent=agent,
            source_branch=branch,
            scope=scope,
            confidence=confidence,
            metadata=metadata or {},
        )


def fact_message(fact: SharedFact) -> Message:
    """``fact`` as it is stored under a ``#facts`` key (:func:`~marsys_mem.store.keys.facts_key`).

    A system message with the fact's text, ``message_id`` ``fact_<id>`` (one per fact and
    key), ``name`` its source agent and ``metadata["fact"]`` the whole fact (JSON): what a
    workflow run records and ``marsys-mem inspect``/``search`` read.

    Example:
        >>> fact = SharedFact.create("Budget is 4000 EUR", agent="planner")
        >>> m = fact_message(fact)
        >>> m.message_id == "fact_" + fact.id, fact_of_message(m) == fact
        (True, True)
    """
    return Message.system(
        fact.text,
        message_id=f"fact_{fact.id}",
        name=fact.source_agent,
        metadata={"fact": fact.model_dump(mode="json")},
    )


def fact_of_message(message: Message) -> SharedFact | None:
    """The fact a :func:`fact_message` holds (``None``: not a stored fact, or not valid)."""
    try:
        return SharedFact.model_validate(message.metadata.get("fact"))
    except ValueError:  # pydantic's ValidationError is a ValueError
        return None
