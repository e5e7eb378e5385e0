"""Runs: one agent invocation, its messages, and chains of runs.

A :class:`RunContext` is what ``MemoryManager.run(agent)`` yields: it has a ``run_id``, an
optional ``parent_id`` (the run it continues), the memory it writes to, token usage and
an error slot. When the run ends a :class:`RunSnapshot` is saved through the store.

Chains: a run started with ``parent_id`` continues where its parent left off. Its memory
starts from :func:`history` of the parent (the messages of every run on the chain, root
first), and two runs with the same parent form two branches that do not see each other.

Traces: a run records its steps (tool calls, model calls, retrievals: timings, arguments,
results, usage, errors) as typed :class:`~marsys_mem.model.traces.TraceStep` objects with
:meth:`RunContext.record_tool_call`, :meth:`RunContext.record_step` or
``with run.step(...)``. They are saved in ``RunSnapshot.trace`` and carried by the run's
output messages under ``metadata["trace"]`` (see :mod:`marsys_mem.model.traces`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Generic, Literal, Protocol

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, JsonValue
from typing_extensions import TypeVar

from marsys_mem.exceptions import MessageNotFoundError
from marsys_mem.model.messages import Message
from marsys_mem.model.traces import TRACE_KEY, StepKind, TraceStep

__all__ = [
    "RunContext",
    "RunLoader",
    "RunMemory",
    "RunSnapshot",
    "RunStatus",
    "StepRecorder",
    "history",
]

RunStatus = Literal["running", "ok", "error"]
_OUTPUT_ROLES = frozenset(("assistant", "agent_response"))


def _utcnow() -> datetime:
    return datetime.now(UTC)


class RunSnapshot(BaseModel):
    """What one run did, as saved by the store.

    ``messages`` are the messages the run added, in order; ``input_ids`` marks which of
    them were inputs (everything not written by the agent itself: user, system, tool,
    agent_call messages); the rest are outputs. ``trace`` holds the run's steps, in the
    order they were recorded.

    Example:
        >>> snap = RunSnapshot(run_id="r1", agent="researcher",
        ...                    messages=[Message.user("hi"), Message.assistant("hello")])
        >>> [m.text for m in snap.output_messages]
        ['hello']
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str = Field(min_length=1)
    parent_id: str | None = None
    namespace: str = "default"
    agent: str = Field(min_length=1)
    branch: str = "main"
    status: RunStatus = "ok"
    started_at: AwareDatetime = Field(default_factory=_utcnow)
    ended_at: AwareDatetime | None = None
    messages: list[Message] = Field(default_factory=list)
    input_ids: list[str] | None = None
    usage: dict[str, int] = Field(default_factory=dict)
    error: str | None = None
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    trace: list[TraceStep] = Field(default_factory=list)

    def _is_input(self, m: Message) -> bool:
        if self.input_ids is not None:
            return m.message_id in self.input_ids
        return m.role not in _OUTPUT_ROLES

    @property
    def input_messages(self) -> list[Message]:
        """Messages that came into the run."""
        return [m for m in self.messages if self._is_input(m)]

    @property
    def output_messages(self) -> list[Message]:
        """Messages the agent produced."""
        return [m for m in self.messages if not self._is_input(m)]


class RunMemory(Protocol):
    """What a run writes to: a ``ConversationMemory``, or anything that appends like one.

    A protocol (structural): the model layer names what it needs from a memory rather than
    importing ``ConversationMemory``, which sits above it.

    Example:
        >>> class ListMemory(list):
        ...     def add(self, message):
        ...         self.append(message)
        ...         return message.message_id
        >>> run = RunContext(agent="a", memory=ListMemory())
        >>> run.input(Message.user("hi")) == run.memory[-1].message_id
        True
    """

    def add(self, message: Message | Mapping[str, Any]) -> str:
        """Append ``message``; returns its id."""
        ...

    def __getitem__(self, position: int) -> Message:
        """The message at ``position`` (``-1``: the newest)."""
        ...


MemoryT = TypeVar("MemoryT", bound=RunMemory, default=RunMemory, covariant=True)
"""The memory type of a :class:`RunContext` (``RunContext[ConversationMemory]``)."""


class RunContext(Generic[MemoryT]):
    """A live run: records the messages added through it, usage and errors.

    Use :meth:`add` (or :meth:`input` / :meth:`output`) so the run knows its messages;
    they also go to ``memory``, any :class:`RunMemory` (usually a ``ConversationMemory``;
    the class is generic in it, so ``run.memory`` keeps the type it was given).

    Example:
        >>> from marsys_mem import ConversationMemory
        >>> run = RunContext(agent="researcher", memory=ConversationMemory())
        >>> _ = run.input(Message.user("Q4 growth?"))
        >>> _ = run.output(Message.assistant("12%"))
        >>> run.add_usage(prompt_tokens=12, completion_tokens=3)
        >>> snap = run.snapshot()
        >>> len(snap.messages), snap.usage["prompt_tokens"], snap.parent_id is None
        (2, 12, True)
    """

    def __init__(
        self,
        *,
        agent: str,
        memory: MemoryT,
        parent_id: str | None = None,
        run_id: str | None = None,
        namespace: str = "default",
        branch: str = "main",
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        self.run_id = run_id or "run_" + uuid.uuid4().hex
        self.parent_id = parent_id
        self.agent = agent
        self.memory = memory
        self.namespace = namespace
        self.branch = branch
        self.metadata: dict[str, Any] = dict(metadata or {})
        self.started_at = _utcnow()
        self.ended_at: datetime | None = None
        self.usage: dict[str, int] = {}
        self.error: str | None = None
        self.status: RunStatus = "running"
        self._messages: list[Message] = []
        self._inputs: list[str] = []
        self._trace: list[TraceStep] = []
        self._attached = 0  # steps before this index are carried by an output message

    def add(self, message: Message | Mapping[str, Any], *, is_input: bool | None = None) -> str:
        """Add a message to the memory and to this run; returns its id.

        ``is_input`` defaults to "not written by the agent" (not assistant/agent_response).
        An output message carries the steps recorded since the previous output under
        ``metadata["trace"]`` (a key the message must not set itself then).

        Raises:
            ValueError: an output message that would carry steps already has
                ``metadata["trace"]``.
        """
        m = message if isinstance(message, Message) else Message.model_validate(message)
        output = not is_input if is_input is not None else m.role in _OUTPUT_ROLES
        pending = self._trace[self._attached :] if output else []
        if pending:
            if TRACE_KEY in m.metadata:
                raise ValueError(
                    f"message {m.message_id!r}: metadata[{TRACE_KEY!r}] is reserved for the "
                    f"run's trace ({len(pending)} step(s) to attach), got "
                    f"{m.metadata[TRACE_KEY]!r:.80}"
                )
            steps = [s.model_dump(mode="json") for s in pending]
            m = m.model_copy(update={"metadata": {**m.metadata, TRACE_KEY: steps}})
        mid = self.memory.add(m)
        m = self.memory[-1]
        self._messages.append(m)
        self._attached = len(self._trace) if output else self._attached
        if not output:
            self._inputs.append(mid)
        return mid

    def record(self, message: Message, *, is_input: bool | None = None) -> str:
        """Count ``message``, which the memory already holds, as one of this run's.

        Nothing is written to the memory: a replayed step (a workflow rerun on the same
        store finds the message it would add) still belongs to the run's snapshot.
        ``is_input`` as for :meth:`add`. Returns the message's id.

        Example:
            >>> run = RunContext(agent="a", memory=[])
            >>> run.record(Message.user("hi", message_id="m1"))
            'm1'
            >>> [m.message_id for m in run.snapshot().messages], run.memory
            (['m1'], [])
        """
        output = not is_input if is_input is not None else message.role in _OUTPUT_ROLES
        self._messages.append(message)
        if not output:
            self._inputs.append(message.message_id)
        return message.message_id

    def input(self, message: Message | Mapping[str, Any]) -> str:
        """Add an input message (a request, a tool result)."""
        return self.add(message, is_input=True)

    def output(self, message: Message | Mapping[str, Any]) -> str:
        """Add an output message (what the agent produced)."""
        return self.add(message, is_input=False)

    def add_usage(self, **counts: int) -> None:
        """Accumulate token usage, e.g. ``add_usage(prompt_tokens=120, completion_tokens=30)``."""
        for key, value in counts.items():
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"usage {key} must be an int >= 0, got {value!r}")
            self.usage[key] = self.usage.get(key, 0) + value

    # ------------------------------------------------------------------ trace
    def _check_running(self) -> None:
        if self.ended_at is not None:
            raise RuntimeError(f"run {self.run_id!r} has ended: it records no more steps")

    def record_step(
        self,
        kind: StepKind,
        name: str,
        *,
        duration_ms: float,
        arguments: Mapping[str, Any] | None = None,
        result: Any = None,
        error: str | BaseException | None = None,
        tool_call_id: str | None = None,
        usage: Mapping[str, int] | None = None,
        started_at: datetime | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> TraceStep:
        """Record one step of this run; returns it.

        ``usage`` (token counts) is also added to the run's :attr:`usage`. ``error`` may
        be the exception itself (recorded as ``"Type: message"``).

        Raises:
            pydantic.ValidationError: a bad field (negative duration, arguments or result
                that are not JSON, negative usage), named with its value; nothing is
                recorded.
            RuntimeError: the run has ended.
        """
        self._check_running()
        fields: dict[str, Any] = {
            "run_id": self.run_id,
            "kind": kind,
            "name": name,
            "duration_ms": duration_ms,
            "arguments": {} if arguments is None else arguments,
            "result": result,
            "error": f"{type(error).__name__}: {error}"
            if isinstance(error, BaseException)
            else error,
            "tool_call_id": tool_call_id,
            "usage": {} if usage is None else usage,
            "metadata": {} if metadata is None else metadata,
        }
        if started_at is not None:
            fields["started_at"] = started_at
        step = TraceStep.model_validate(fields)
        for key, value in step.usage.items():
            self.usage[key] = self.usage.get(key, 0) + value
        self._trace.append(step)
        return step

    def record_tool_call(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        result: Any = None,
        duration_ms: float = 0.0,
        error: str | BaseException | None = None,
        tool_call_id: str | None = None,
        started_at: datetime | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> TraceStep:
        """Record a tool call (a ``kind="tool"`` step); see :meth:`record_step`."""
        return self.record_step(
            "tool",
            name,
            duration_ms=duration_ms,
            arguments=arguments,
            result=result,
            error=error,
            tool_call_id=tool_call_id,
            started_at=started_at,
            metadata=metadata,
        )

    @contextmanager
    def step(
        self,
        kind: StepKind,
        name: str,
        *,
        arguments: Mapping[str, Any] | None = None,
        tool_call_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Iterator[StepRecorder]:
        """Time a step: ``with run.step("tool", "search", arguments={...}) as s:``.

        Set ``s.result`` (and ``s.usage``, ``s.metadata``) inside the block. An exception
        leaving the block is recorded as the step's error and re-raised. The arguments
        are checked before the block runs.

        Raises:
            pydantic.ValidationError: bad arguments (before the block runs) or a result
                that is not JSON (at the end of the block); nothing is recorded.
            RuntimeError: the run has ended.

        Example:
            >>> from marsys_mem import ConversationMemory
            >>> run = RunContext(agent="a", memory=ConversationMemory())
            >>> with run.step("tool", "add", arguments={"a": 1, "b": 2}) as s:
            ...     s.result = 1 + 2
            >>> run.trace[0].result, run.trace[0].duration_ms >= 0
            (3, True)
        """
        self._check_running()
        TraceStep(name=name, kind=kind, duration_ms=0, arguments=dict(arguments or {}))
        recorder = StepRecorder(metadata)
        started_at = _utcnow()
        start = time.perf_counter()
        error: BaseException | None = None
        try:
            yield recorder
        except BaseException as exc:
            error = exc
            raise
        finally:
            self.record_step(
                kind,
                name,
                duration_ms=(time.perf_counter() - start) * 1000.0,
                arguments=arguments,
                result=recorder.result if error is None else None,
                error=error if error is not None else recorder.error,
                tool_call_id=tool_call_id,
                usage=recorder.usage,
                started_at=started_at,
                metadata=recorder.metadata,
            )

    @property
    def trace(self) -> list[TraceStep]:
        """The steps recorded in this run, in order."""
        return list(self._trace)

    @property
    def messages(self) -> list[Message]:
        """Messages added through this run, in order."""
        return list(self._messages)

    def finish(self, error: BaseException | None = None) -> None:
        """Mark the run ended (``error``: the exception that ended it)."""
        self.ended_at = _utcnow()
        if error is not None:
            self.status = "error"
            self.error = f"{type(error).__name__}: {error}"
        else:
            self.status = "ok"

    def snapshot(self) -> RunSnapshot:
        """The run as a :class:`RunSnapshot` (what the store saves)."""
        return RunSnapshot(
            run_id=self.run_id,
            parent_id=self.parent_id,
            namespace=self.namespace,
            agent=self.agent,
            branch=self.branch,
            status=self.status,
            started_at=self.started_at,
            ended_at=self.ended_at,
            messages=list(self._messages),
            input_ids=list(self._inputs),
            usage=dict(self.usage),
            error=self.error,
            metadata=self.metadata,
            trace=list(self._trace),
        )

    def __repr__(self) -> str:
        return (
            f"RunContext(run_id={self.run_id!r}, parent_id={self.parent_id!r}, "
            f"agent={self.agent!r}, status={self.status!r}, messages={len(self._messages)})"
        )


class StepRecorder:
    """What ``with run.step(...) as s`` yields: set the step's outcome inside the block.

    Example:
        >>> s = StepRecorder()
        >>> s.result = {"hits": 3}
        >>> s.usage["prompt_tokens"] = 40
    """

    def __init__(self, metadata: Mapping[str, Any] | None = None) -> None:
        self.result: Any = None
        self.error: str | None = None
        self.usage: dict[str, int] = {}
        self.metadata: dict[str, Any] = dict(metadata or {})


class RunLoader(Protocol):
    """Anything with ``load_run(run_id)``: a store, or a ``MemoryManager``."""

    def load_run(self, run_id: str) -> RunSnapshot | None:
        """The snapshot of ``run_id``, or ``None``."""
        ...


def history(store: RunLoader, run_id: str) -> list[Message]:
    """The conversation up to the end of ``run_id``: its chain's messages, root first.

    Raises:
        MessageNotFoundError: a run on the chain is not in the store.
        ValueError: the parent chain has a cycle.
    """
    chain: list[RunSnapshot] = []
    seen: set[str] = set()
    current: str | None = run_id
    while current is not None:
        if current in seen:
            raise ValueError(f"run chain of {run_id!r} has a cycle at {current!r}")
        seen.add(current)
        snap = store.load_run(current)
        if snap is None:
            raise MessageNotFoundError(f"run {current!r} is not in the store")
        chain.append(snap)
        current = snap.parent_id
    return [m for snap in reversed(chain) for m in snap.messages]
