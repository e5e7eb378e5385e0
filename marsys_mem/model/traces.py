"""Execution traces: the steps of a run (tool calls, model calls, retrievals), typed.

A :class:`TraceStep` is one step: its ``kind`` and ``name``, when it started and how long
it took (``duration_ms``), its JSON ``arguments`` and ``result``, token ``usage`` and an
``error`` when it failed. A :class:`~marsys_mem.model.runs.RunContext` records steps
(``run.record_tool_call(...)``, ``run.record_step(...)`` or ``with run.step(...)``) and
persists them twice:

* in the run's :class:`~marsys_mem.model.runs.RunSnapshot` (``snapshot.trace``: every
  step of the run, in order), which the store saves, so ``manager.trace(run_id)`` reads
  them back after a restart;
* in the metadata of the run's output messages, under :data:`TRACE_KEY`
  (``metadata["trace"]``): each output message carries the steps recorded since the
  previous output (the steps that led to it), as JSON. :func:`trace_of` reads them back
  as typed steps.

Across a store's runs, :func:`slowest_steps` and :func:`failed_steps` answer "what is
slow" and "which tool calls fail" (they load every matching run snapshot: O(runs)).

Bad input (a negative or non-finite duration, arguments or a result that are not JSON,
negative usage) raises ``pydantic.ValidationError`` (a ``ValueError``) naming the field
and value, and records nothing.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Protocol

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    TypeAdapter,
    field_validator,
)

from marsys_mem.model.messages import Message, freeze_json

__all__ = [
    "TRACE_KEY",
    "RunSource",
    "StepKind",
    "TraceStep",
    "failed_steps",
    "slowest_steps",
    "trace_of",
]

TRACE_KEY = "trace"
"""The metadata key under which an output message carries its steps (a list of JSON objects)."""

StepKind = Literal["tool", "llm", "retrieval", "agent", "custom"]
"""What a step was: a tool call, a model call, a retrieval, a call to another agent, other."""

_Json = Annotated[JsonValue, AfterValidator(freeze_json)]


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _step_id() -> str:
    return "step_" + uuid.uuid4().hex


class TraceStep(BaseModel):
    """One step of a run: a tool call, a model call, a retrieval.

    Frozen and validated: ``duration_ms`` is finite and ``>= 0``; ``arguments``, ``result``
    and ``metadata`` are JSON (no NaN, no sets, no objects); ``usage`` counts are ints
    ``>= 0``. ``error`` is set when the step failed (:attr:`ok` is then ``False``).
    ``run_id`` is filled in by the run that records the step.

    Example:
        >>> step = TraceStep(kind="tool", name="weather", duration_ms=12.5,
        ...                  arguments={"city": "Tokyo"}, result="72F")
        >>> step.ok, step.arguments["city"]
        (True, 'Tokyo')
        >>> TraceStep(kind="tool", name="weather", duration_ms=-1)
        Traceback (most recent call last):
        ...
        pydantic_core._pydantic_core.ValidationError: 1 validation error for TraceStep
        duration_ms
        ...
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    step_id: str = Field(default_factory=_step_id, min_length=1)
    run_id: str | None = None
    kind: StepKind = "tool"
    name: str = Field(min_length=1)
    started_at: AwareDatetime = Field(default_factory=_utcnow)
    duration_ms: float = Field(ge=0)
    arguments: dict[str, _Json] = Field(default_factory=dict)
    result: _Json = None
    error: str | None = None
    tool_call_id: str | None = None
    usage: dict[str, Annotated[int, Field(ge=0, strict=True)]] = Field(default_factory=dict)
    metadata: dict[str, _Json] = Field(default_factory=dict)

    @field_validator("duration_ms")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError(f"duration_ms must be finite, got {value!r}")
        return value

    @field_validator("arguments", "metadata", mode="after")
    @classmethod
    def _freeze(cls, value: dict[str, Any]) -> Any:
        return freeze_json(value)

    @field_validator("started_at")
    @classmethod
    def _to_utc(cls, value: datetime) -> datetime:
        return value.astimezone(UTC)

    @property
    def ok(self) -> bool:
        """Whether the step succeeded (no ``error``)."""
        return self.error is None


_STEPS = TypeAdapter(list[TraceStep])


def trace_of(message: Message) -> list[TraceStep]:
    """The steps ``message`` carries under ``metadata["trace"]`` (``[]`` when none).

    A run's output message carries the steps recorded since the run's previous output.

    Raises:
        pydantic.ValidationError: the metadata is not a list of steps.

    Example:
        >>> from marsys_mem import ConversationMemory
        >>> from marsys_mem.model.runs import RunContext
        >>> run = RunContext(agent="a", memory=ConversationMemory())
        >>> _ = run.record_tool_call("weather", {"city": "Tokyo"}, result="72F", duration_ms=3)
        >>> _ = run.output(Message.assistant("72F in Tokyo"))
        >>> [s.name for s in trace_of(run.messages[-1])]
        ['weather']
    """
    raw = message.metadata.get(TRACE_KEY)
    if raw is None:
        return []
    return _STEPS.validate_python(raw)


class RunSource(Protocol):
    """Where runs are read from: a ``MemoryStore`` (``list_runs`` and ``load_run``)."""

    def list_runs(
        self,
        *,
        namespace: str | None = None,
        agent: str | None = None,
        parent_id: str | None = None,
    ) -> list[str]:
        """Run ids matching the filters, oldest first."""
        ...

    def load_run(self, run_id: str) -> Any:
        """The snapshot of ``run_id`` (with a ``trace``), or ``None``."""
        ...


def _steps(
    source: RunSource, kind: StepKind | None, agent: str | None, namespace: str | None
) -> Iterator[TraceStep]:
    for run_id in source.list_runs(namespace=namespace, agent=agent):
        snap = source.load_run(run_id)
        if snap is None:
            continue
        trace: Iterable[TraceStep] = snap.trace
        for step in trace:
            if kind is None or step.kind == kind:
                yield step


def slowest_steps(
    source: RunSource,
    n: int = 10,
    *,
    kind: StepKind | None = None,
    agent: str | None = None,
    namespace: str | None = None,
) -> list[TraceStep]:
    """The ``n`` slowest steps across ``source``'s runs, slowest first (ties: oldest first).

    Example:
        >>> from marsys_mem import ConversationMemory
        >>> from marsys_mem.model.runs import RunContext
        >>> from marsys_mem.store.memory import InMemoryStore
        >>> store, run = InMemoryStore(), RunContext(agent="a", memory=ConversationMemory())
        >>> _ = run.record_tool_call("fast", duration_ms=1)
        >>> _ = run.record_tool_call("slow", duration_ms=900)
        >>> run.finish(); store.save_run(run.snapshot())
        >>> [s.name for s in slowest_steps(store, 1)]
        ['slow']
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be an int >= 0, got {n!r}")
    steps = list(_steps(source, kind, agent, namespace))
    steps.sort(key=lambda s: -s.duration_ms)  # stable: ties keep run and step order
    return steps[:n]


def failed_steps(
    source: RunSource,
    *,
    kind: StepKind | None = "tool",
    agent: str | None = None,
    namespace: str | None = None,
) -> list[TraceStep]:
    """Steps that failed across ``source``'s runs, in run order (default: tool calls only).

    ``kind=None`` lists failures of every kind.

    Example:
        >>> from marsys_mem import ConversationMemory
        >>> from marsys_mem.model.runs import RunContext
        >>> from marsys_mem.store.memory import InMemoryStore
        >>> store, run = InMemoryStore(), RunContext(agent="a", memory=ConversationMemory())
        >>> _ = run.record_tool_call("fetch", {"url": "x"}, error="TimeoutError: 10s")
        >>> run.finish(); store.save_run(run.snapshot())
        >>> [(s.name, s.error) for s in failed_steps(store)]
        [('fetch', 'TimeoutError: 10s')]
    """
    return [s for s in _steps(source, kind, agent, namespace) if not s.ok]
