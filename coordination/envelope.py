"""What coordinators exchange and report: the wire envelope, deliveries, merge results.

:class:`FactEnvelope` is the payload on the fact topics (pydantic, validated on receipt:
anything else is dropped and counted). On the namespace's control topic coordinators
exchange :data:`ControlMessage` payloads: a sender's :class:`HighWaterMark` (the last
``seq`` it sent) and a receiver's :class:`ResendRequest` (the ``seq`` ranges that did not
arrive), so what a crashed broker lost is sent again. :class:`FactDelivery` is what
``on_fact`` callbacks receive; :class:`MergeResult` what :meth:`Coordinator.merge` returns.

Wire compatibility: ``epoch`` was added to :class:`FactEnvelope` (default 0, so an
envelope without it still parses); coordinators older than it reject envelopes that carry
it (``extra="forbid"``), so upgrade every coordinator of a namespace together.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from marsys_mem.coordination.graph import MergeStrategy
from marsys_mem.model.facts import FactScope, SharedFact
from marsys_mem.model.names import NAME_PATTERN, inbox_key
from marsys_mem.patterns.shared import ConflictRule

__all__ = [
    "CONTROL_ADAPTER",
    "ENVELOPE_ADAPTER",
    "ControlMessage",
    "Envelope",
    "FactCallback",
    "FactDelivery",
    "FactEnvelope",
    "HighWaterMark",
    "MergeResult",
    "ResendRequest",
    "RetractEnvelope",
]

_NAME_PATTERN = NAME_PATTERN  # the one naming rule (marsys_mem.model.names)
_MAX_SEQ = 2**63 - 1
_Seq = Annotated[int, Field(ge=1, le=_MAX_SEQ)]


class FactEnvelope(BaseModel):
    """What a coordinator publishes: one fact, its sender and sequence number, its route.

    ``seq`` numbers each sender's envelopes 1, 2, 3, ... within one ``epoch`` (a number
    drawn anew each time a coordinator starts: a restarted coordinator with the same
    ``sender`` id starts a new sequence that receivers do not take for old duplicates).
    ``branch`` and ``scope`` say where the fact goes (for a share: the fact's own
    ``source_branch`` and ``scope``; for a merge: the target branch, scope ``branch``);
    ``conflict``, when set, is the rule applied to facts on the same ``metadata["topic"]``
    when this one is delivered. ``v`` is the wire-format version.

    Example:
        >>> fact = SharedFact.create("Q4 revenue grew 12%", agent="researcher")
        >>> env = FactEnvelope(namespace="team", sender="c1", epoch=7, seq=1, branch="main",
        ...                    scope="branch", fact=fact)
        >>> FactEnvelope.model_validate_json(env.model_dump_json()) == env
        True
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    v: Literal[1] = 1
    namespace: str = Field(pattern=_NAME_PATTERN)
    sender: str = Field(min_length=1, max_length=128)
    epoch: int = Field(default=0, ge=0, le=_MAX_SEQ)
    seq: int = Field(ge=1, le=_MAX_SEQ)
    branch: str = Field(pattern=_NAME_PATTERN)
    scope: FactScope
    conflict: ConflictRule | None = None
    fact: SharedFact


class RetractEnvelope(BaseModel):
    """A tombstone: the facts ``fact_ids`` are forgotten, everywhere in the namespace.

    It travels in its sender's ``seq`` stream like a fact (ordered after the facts it
    retracts, resent if lost, signed by a signing transport), carries ids only (never the
    text), and makes every receiving coordinator drop those facts from its pool, its
    agents' inboxes and its log, and refuse them if they arrive again.

    Example:
        >>> env = RetractEnvelope(namespace="team", sender="c1", epoch=7, seq=2,
        ...                       branch="main", fact_ids=("f1",))
        >>> ENVELOPE_ADAPTER.validate_json(env.model_dump_json()) == env
        True
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    v: Literal[1] = 1
    kind: Literal["retract"] = "retract"
    namespace: str = Field(pattern=_NAME_PATTERN)
    sender: str = Field(min_length=1, max_length=128)
    epoch: int = Field(default=0, ge=0, le=_MAX_SEQ)
    seq: int = Field(ge=1, le=_MAX_SEQ)
    branch: str = Field(pattern=_NAME_PATTERN)
    fact_ids: tuple[Annotated[str, Field(min_length=1, max_length=128)], ...] = Field(
        min_length=1, max_length=1000
    )


Envelope = FactEnvelope | RetractEnvelope
"""What travels on the fact topics: a fact, or a tombstone retracting facts."""

ENVELOPE_ADAPTER: TypeAdapter[FactEnvelope | RetractEnvelope] = TypeAdapter(Envelope)
"""Validates a fact-topic payload (the two models forbid each other's fields)."""


class HighWaterMark(BaseModel):
    """A sender's note that it has sent every ``seq`` up to ``seq`` in ``epoch``.

    Published now and then while it shares (and, backing off, while it is idle), so that
    a receiver that lost the end of a stream (nothing later arrives to show the gap)
    asks for it again.

    Example:
        >>> mark = HighWaterMark(namespace="team", sender="c1", epoch=7, seq=42)
        >>> CONTROL_ADAPTER.validate_json(mark.model_dump_json()) == mark
        True
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    v: Literal[1] = 1
    kind: Literal["hwm"] = "hwm"
    namespace: str = Field(pattern=_NAME_PATTERN)
    sender: str = Field(min_length=1, max_length=128)
    epoch: int = Field(ge=0, le=_MAX_SEQ)
    seq: int = Field(ge=0, le=_MAX_SEQ)


class ResendRequest(BaseModel):
    """A receiver (``sender``) asks ``to`` to publish again its envelopes in ``ranges``.

    ``ranges`` are inclusive ``(first, last)`` pairs of ``seq`` numbers of ``to``'s
    ``epoch`` (at most 64). The envelopes come back on their own fact topics, to every
    receiver (those that had them drop them as duplicates).

    Example:
        >>> ask = ResendRequest(namespace="team", sender="c2", to="c1", epoch=7,
        ...                     ranges=[(3, 5), (9, 9)])
        >>> CONTROL_ADAPTER.validate_json(ask.model_dump_json()).ranges
        [(3, 5), (9, 9)]
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    v: Literal[1] = 1
    kind: Literal["resend"] = "resend"
    namespace: str = Field(pattern=_NAME_PATTERN)
    sender: str = Field(min_length=1, max_length=128)
    to: str = Field(min_length=1, max_length=128)
    epoch: int = Field(ge=0, le=_MAX_SEQ)
    ranges: list[tuple[_Seq, _Seq]] = Field(min_length=1, max_length=64)

    @model_validator(mode="after")
    def _ordered(self) -> ResendRequest:
        for first, last in self.ranges:
            if first > last:
                raise ValueError(f"a range must have first <= last, got ({first}, {last})")
        return self


ControlMessage = Annotated[HighWaterMark | ResendRequest, Field(discriminator="kind")]
"""A control-topic payload: a :class:`HighWaterMark` or a :class:`ResendRequest`."""

CONTROL_ADAPTER: TypeAdapter[HighWaterMark | ResendRequest] = TypeAdapter(ControlMessage)
"""Validates a control payload (``CONTROL_ADAPTER.validate_json(payload)``)."""


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
        """The agent's inbox key (:func:`~marsys_mem.model.names.inbox_key`)."""
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
