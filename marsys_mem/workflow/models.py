"""The workflow file format: pydantic models for agents, branches, transport and steps.

See :mod:`marsys_mem.workflow` for the format and for loading and running workflows; this
module holds the models (``marsys-mem schema --workflow`` prints their JSON Schema) and
the two workflow errors.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Self, TypeAlias, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    GetJsonSchemaHandler,
    JsonValue,
    PrivateAttr,
    Tag,
    TypeAdapter,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from marsys_mem.config.files import short_repr
from marsys_mem.config.models import LLMConfig, MemoryConfig
from marsys_mem.config.schema_forms import AlsoAccepts
from marsys_mem.config.sourcemap import Located, PathPart, SourceMap, did_you_mean, locate
from marsys_mem.coordination.graph import MergeStrategy
from marsys_mem.model.facts import FactScope
from marsys_mem.model.names import NAME_PATTERN
from marsys_mem.patterns.shared import ConflictRule
from marsys_mem.patterns.user_facts import FactCategory

__all__ = [
    "STEP_KINDS",
    "UNION_TAGS",
    "AgentSpec",
    "AskStep",
    "BranchSpec",
    "CallAgentStep",
    "EndRunStep",
    "EndSessionStep",
    "FactSpec",
    "FactsStep",
    "ForkStep",
    "InProcessSettings",
    "MemoryFile",
    "MemorySpec",
    "MergeStep",
    "MqttSettings",
    "MqttTransportSpec",
    "RepeatStep",
    "RunStep",
    "SayStep",
    "ShareStep",
    "Step",
    "ToolStep",
    "TransportSpec",
    "Workflow",
    "WorkflowOrigin",
    "normalize_agent",
    "normalize_step",
    "validate_step",
    "workflow_schema",
]

STEP_KINDS: tuple[str, ...] = (
    "say",
    "tool",
    "call_agent",
    "share",
    "fork",
    "merge",
    "run",
    "end_run",
    "end_session",
    "ask",
    "facts",
    "repeat",
)
"""Every step kind, as written in workflow files."""

UNION_TAGS: frozenset[str] = frozenset(
    (*STEP_KINDS, "memory_inline", "memory_file", "transport_inprocess", "transport_mqtt")
)
"""The discriminator tags of the format's unions (step kinds, memory and transport forms).

Pydantic puts them in error paths (``steps.3.say.agent``); they are not in the file, so
:func:`~marsys_mem.config.sourcemap.locate` skips them (``tags=UNION_TAGS``)."""

_NAME = NAME_PATTERN  # the one naming rule (marsys_mem.model.names)
_T = TypeVar("_T")


# ---------------------------------------------------------------------------- models
class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class AgentSpec(_Model):
    """An agent of the workflow: its name and, optionally, its system prompt.

    In a file an agent is a name (``- researcher``) or a mapping.

    Example:
        >>> AgentSpec(name="planner", system="You plan.").system
        'You plan.'
    """

    name: str = Field(pattern=_NAME, description="Unique agent name (no '@', '/', '#', '+').")
    system: str | None = Field(default=None, description="System prompt added to its memory.")


def normalize_agent(value: object) -> object:
    """An agent as files write it: ``- researcher`` is ``- {name: researcher}``.

    Example:
        >>> normalize_agent("researcher")
        {'name': 'researcher'}
    """
    return {"name": value} if isinstance(value, str) else value


class BranchSpec(_Model):
    """A branch that exists when the workflow starts.

    Example:
        >>> BranchSpec(name="r1", agents=["researcher"], parent="main").parent
        'main'
    """

    name: str = Field(pattern=_NAME)
    agents: list[str] = Field(default_factory=list)
    parent: str | None = Field(default=None, description="Forked from this (earlier) branch.")


class MemoryFile(_Model):
    """``memory: {config: policy.yaml}``: a retention-policy file, relative to the workflow.

    Example:
        >>> MemoryFile(config="policies/team.yaml").config.name
        'team.yaml'
    """

    config: Path


def _memory_tag(value: object) -> str:
    if isinstance(value, MemoryFile) or (isinstance(value, dict) and "config" in value):
        return "memory_file"
    return "memory_inline"


MemorySpec: TypeAlias = Annotated[
    Annotated[MemoryConfig, Tag("memory_inline")] | Annotated[MemoryFile, Tag("memory_file")],
    Discriminator(_memory_tag),
]


class MqttSettings(_Model):
    """Where the MQTT broker is (``transport: {mqtt: {...}}``).

    ``namespace`` defaults to the memory config's store namespace.

    Example:
        >>> MqttSettings(host="localhost").port
        1883
    """

    host: str = Field(min_length=1)
    port: int = Field(default=1883, ge=1, le=65535)
    namespace: str | None = Field(default=None, pattern=_NAME)
    username: str | None = None
    password: str | None = None
    client_id: str | None = Field(default=None, min_length=1, max_length=128)
    protocol: Literal["5", "3.1.1"] = "5"
    tls: bool = False
    connect_timeout: float = Field(default=10.0, gt=0, description="Seconds to keep trying.")
    signing_key_env: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$",
        description=(
            "Environment variable holding the namespace's signing key: every envelope is "
            "signed (HMAC-SHA256) and unsigned or forged ones are dropped. The key never "
            "sits in the file."
        ),
    )


class MqttTransportSpec(_Model):
    """``transport: {mqtt: {host: ..., port: ...}}``.

    Example:
        >>> MqttTransportSpec(mqtt=MqttSettings(host="broker")).mqtt.host
        'broker'
    """

    mqtt: MqttSettings


InProcessSettings = Literal["inprocess"]
"""``transport: inprocess`` (the default): facts travel through an in-process broker."""


def _transport_tag(value: object) -> str:
    if isinstance(value, MqttTransportSpec) or isinstance(value, dict):
        return "transport_mqtt"
    return "transport_inprocess"


TransportSpec: TypeAlias = Annotated[
    Annotated[InProcessSettings, Tag("transport_inprocess")]
    | Annotated[MqttTransportSpec, Tag("transport_mqtt")],
    Discriminator(_transport_tag),
]


class SayStep(_Model):
    """A message in an agent's memory: the user speaks to it, or it speaks.

    Example:
        >>> SayStep(agent="planner", text="Plan the trip", pinned=True).role
        'user'
    """

    kind: Literal["say"] = "say"
    agent: str
    text: str
    role: Literal["user", "assistant", "system"] = "user"
    pinned: bool = False
    name: str | None = Field(default=None, description="Speaker name (e.g. a user's).")
    branch: str | None = None


class ToolStep(_Model):
    """The agent calls a tool: an assistant tool call and the tool's result.

    Example:
        >>> ToolStep(agent="r", name="search", arguments={"q": "Q4"}, result="12%").name
        'search'
    """

    kind: Literal["tool"] = "tool"
    agent: str
    name: str = Field(min_length=1)
    arguments: dict[str, JsonValue] = Field(default_factory=dict)
    result: JsonValue
    text: str | None = Field(default=None, description="What the agent says with the call.")
    call_id: str | None = Field(default=None, min_length=1)
    branch: str | None = None


class CallAgentStep(_Model):
    """One agent asks another: both memories record the request and the response.

    Example:
        >>> CallAgentStep(caller="planner", callee="writer", request="Draft it",
        ...               response="Done").callee
        'writer'
    """

    kind: Literal["call_agent"] = "call_agent"
    caller: str
    callee: str
    request: str
    response: str
    branch: str | None = Field(default=None, description="The caller's branch.")
    callee_branch: str | None = None


class ShareStep(_Model):
    """The agent shares a fact; agents whose branch is in ``scope`` receive it.

    Example:
        >>> ShareStep(agent="r", fact="Q4 grew 12%", scope="lineage", topic="q4").scope
        'lineage'
    """

    kind: Literal["share"] = "share"
    agent: str
    fact: str = Field(min_length=1)
    scope: FactScope = "branch"
    branch: str | None = None
    confidence: float = Field(default=1.0, ge=0.0, le=1.0)
    topic: str | None = Field(default=None, description="Facts on one topic conflict.")


class ForkStep(_Model):
    """Fork ``child`` from ``parent`` (agents default to the parent's).

    Example:
        >>> ForkStep(parent="main", child="r1", agents=["researcher"]).child
        'r1'
    """

    kind: Literal["fork"] = "fork"
    parent: str
    child: str = Field(pattern=_NAME)
    agents: list[str] | None = None


class MergeStep(_Model):
    """Merge branch ``child`` into ``into`` (facts always; ``summary``/``messages`` too).

    Example:
        >>> MergeStep(child="r1", into="main", strategy="summary").conflict
        'newest'
    """

    kind: Literal["merge"] = "merge"
    child: str
    into: str
    strategy: MergeStrategy = "facts"
    conflict: ConflictRule = "newest"


class EndRunStep(_Model):
    """End the agent's current run (single_run memory is cleared, persistent flushed).

    Example:
        >>> EndRunStep(agent="scratchpad").kind
        'end_run'
    """

    kind: Literal["end_run"] = "end_run"
    agent: str
    branch: str | None = None


class EndSessionStep(_Model):
    """End the session: every run ends, session memories are dropped.

    ``restart: true`` also closes the memory manager and opens a new one on the same
    store, as a new process would: what survives comes from the store.

    Example:
        >>> EndSessionStep(restart=True).restart
        True
    """

    kind: Literal["end_session"] = "end_session"
    restart: bool = False


def _as_list(value: object) -> object:
    return [value] if isinstance(value, str) else value


class AskStep(_Model):
    """Ask an agent a question: what would it send to its LLM, and what answers it?

    Without an ``llm:`` section no LLM is called: the report shows the context window
    built for the question (``context_for(agent, query=question)``), the retrieval hits,
    the facts, and the best-matching piece of that evidence as the answer.

    With ``llm:`` the question is a turn of the conversation: it is added to the agent's
    memory as a user message, the agent's context window for it (the bounded window and
    its blocks) is sent to the model, and the answer is recorded as the agent's assistant
    message, the call (model, duration, token usage) in the run's execution trace. A call
    that fails (HTTP error, rate limit, timeout, after the SDK's retries) is reported in
    the ask's ``error`` and the run goes on; the memory keeps the question.

    ``expect``: strings that must appear in the answer (the model's, or offline the best
    match), checked case-insensitively; with no answer (the call failed, or nothing in
    memory matches) every one of them fails. ``expect_sent``: strings that must appear in
    what the agent sends its LLM (the context window built for the question), whatever
    the answer: that memory brought them back.

    Example:
        >>> step = AskStep(agent="planner", question="Q4 growth?", expect="12%",
        ...                expect_sent=["revenue"])
        >>> step.expect, step.expect_sent
        (['12%'], ['revenue'])
    """

    kind: Literal["ask"] = "ask"
    agent: str
    question: str = Field(min_length=1)
    branch: str | None = None
    expect: Annotated[list[str], BeforeValidator(_as_list), AlsoAccepts({"type": "string"})] = (
        Field(
            default_factory=list,
            description=(
                "Strings the answer must contain (case-insensitive): the model's answer, or "
                "offline the best-matching evidence. No answer (a failed call, nothing "
                "matches) fails them all."
            ),
        )
    )
    expect_sent: Annotated[
        list[str], BeforeValidator(_as_list), AlsoAccepts({"type": "string"})
    ] = Field(
        default_factory=list,
        description=(
            "Strings the context window sent for the question must contain "
            "(case-insensitive), whatever the answer."
        ),
    )


class FactSpec(_Model):
    """A fact stated in a ``facts`` step: a string, or a mapping with these fields.

    ``slot``: the attribute it sets (``home``, ``name``); a later fact with the same slot
    and another text invalidates it (see :class:`~marsys_mem.patterns.user_facts.FactMemory`).

    Example:
        >>> FactSpec(text="User lives in Oslo", category="identity", slot="home").confidence
        0.9
    """

    text: str = Field(min_length=1, max_length=2000)
    category: FactCategory = "other"
    slot: str | None = Field(default=None, min_length=1, max_length=200)
    confidence: float = Field(default=0.9, ge=0.0, le=1.0)


def _fact_spec(value: object) -> object:
    return {"text": value} if isinstance(value, str) else value


class FactsStep(_Model):
    """What the fact memory knows about a subject: state facts, search them, check them.

    The durable facts about a user (or an agent, a team) that agents with
    ``patterns.facts`` learn from the conversation in the background, as mem0 or Letta's
    core memory keep them. The step first waits for pending extraction, so what it shows
    is deterministic. ``add``: facts stated explicitly (no extraction; a restatement
    reinforces, a new value for a ``slot`` supersedes the old one). ``query``: a hybrid
    search whose hits the report lists. ``expect``: strings that must appear among the
    subject's valid facts (case-insensitive). ``subject``: default the ``agent``'s
    ``patterns.facts.subject``, else ``user``.

    Example:
        >>> step = FactsStep(subject="alice", add=["Alice lives in Oslo"], expect="Oslo")
        >>> step.add[0].text, step.expect
        ('Alice lives in Oslo', ['Oslo'])
    """

    kind: Literal["facts"] = "facts"
    subject: str | None = Field(default=None, pattern=_NAME)
    agent: str | None = Field(default=None, description="Its subject is the default one.")
    branch: str | None = None
    add: list[
        Annotated[
            FactSpec,
            BeforeValidator(_fact_spec),
            AlsoAccepts({"type": "string", "minLength": 1}),
        ]
    ] = Field(default_factory=list)
    query: str | None = Field(default=None, min_length=1)
    k: int = Field(default=5, ge=1, le=100, description="Most search hits to report.")
    expect: Annotated[list[str], BeforeValidator(_as_list), AlsoAccepts({"type": "string"})] = (
        Field(default_factory=list)
    )


class RunStep(_Model):
    """A block of steps inside one ``MemoryManager.run`` of ``agent``.

    Example:
        >>> RunStep(agent="r", steps=[SayStep(agent="r", text="hi")]).steps[0].kind
        'say'
    """

    kind: Literal["run"] = "run"
    agent: str
    branch: str | None = None
    steps: list[Step] = Field(default_factory=list)


class RepeatStep(_Model):
    """Play ``steps`` ``times`` times; ``{i}`` (1-based), ``{n}`` and ``{item}`` are replaced.

    ``{item}`` cycles through ``items``.

    Example:
        >>> RepeatStep(times=3, items=["a", "b"], steps=[SayStep(agent="x", text="{item}")]).times
        3
    """

    kind: Literal["repeat"] = "repeat"
    times: int = Field(ge=1, le=100_000)
    items: list[str] | None = Field(default=None, min_length=1)
    steps: list[Step] = Field(min_length=1)


def normalize_step(value: object) -> object:
    """A step as files write it, in its long form ``{kind: KIND, fields...}``.

    ``- end_session``, ``- say: {...}`` and ``- {kind: say, ...}`` are the same step.

    Raises:
        ValueError: not a step: an unknown kind (with the closest known one) or a mapping
            of more than one kind.

    Example:
        >>> normalize_step({"say": {"agent": "a", "text": "hi"}})
        {'kind': 'say', 'agent': 'a', 'text': 'hi'}
    """
    if isinstance(value, str):
        if value in STEP_KINDS:
            return {"kind": value}
        raise ValueError(f"unknown step {short_repr(value)}{_closest_kind(value)}")
    if isinstance(value, dict) and "kind" not in value:
        if len(value) == 1:
            (key,) = value
            body = value[key]
            if key in STEP_KINDS and (body is None or isinstance(body, dict)):
                return {"kind": key, **(body or {})}
            if key not in STEP_KINDS:
                raise ValueError(_unknown_kind(key))
        raise ValueError(
            "a step is '- KIND: {fields}' or '- {kind: KIND, fields}' "
            f"with KIND one of {', '.join(STEP_KINDS)}"
        )
    if isinstance(value, dict) and value.get("kind") not in STEP_KINDS:
        raise ValueError(_unknown_kind(value.get("kind")))
    return value


def _closest_kind(kind: object) -> str:
    return did_you_mean(str(kind)[:100], STEP_KINDS)


def _unknown_kind(kind: object) -> str:
    return (
        f"unknown step kind {short_repr(kind)}{_closest_kind(kind)}; "
        f"expected one of {', '.join(STEP_KINDS)}"
    )


class _StepForms:
    """JSON Schema of a step as files write it: ``- KIND: {fields}``, ``- {kind: KIND, ...}``.

    Pydantic would describe only the long form (``kind`` optional, so an editor could
    not tell the kinds apart), never the short form every example uses.
    """

    def __get_pydantic_json_schema__(
        self, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        inner = handler(core_schema)
        mapping: dict[str, str] = inner.get("discriminator", {}).get("mapping", {})
        if set(mapping) != set(STEP_KINDS):  # pragma: no cover - pydantic changed its output
            return inner
        bare = [k for k in STEP_KINDS if not _required(_STEP_MODELS[k])]
        forms: list[JsonSchemaValue] = [{"type": "string", "enum": bare}]
        for kind in STEP_KINDS:
            body: JsonSchemaValue = {"$ref": mapping[kind]}
            if kind in bare:
                body = {"anyOf": [body, {"type": "null"}]}
            forms.append(
                {
                    "type": "object",
                    "properties": {kind: body},
                    "required": [kind],
                    "additionalProperties": False,
                }
            )
        for kind in STEP_KINDS:
            forms.append({"allOf": [{"$ref": mapping[kind]}, {"required": ["kind"]}]})
        return {"oneOf": forms}


def _required(model: type[BaseModel]) -> list[str]:
    return [name for name, f in model.model_fields.items() if f.is_required()]


_STEP_MODELS: dict[str, type[BaseModel]] = {
    m.model_fields["kind"].default: m
    for m in (
        SayStep,
        ToolStep,
        CallAgentStep,
        ShareStep,
        ForkStep,
        MergeStep,
        RunStep,
        EndRunStep,
        EndSessionStep,
        AskStep,
        FactsStep,
        RepeatStep,
    )
}

Step: TypeAlias = Annotated[
    Annotated[
        SayStep
        | ToolStep
        | CallAgentStep
        | ShareStep
        | ForkStep
        | MergeStep
        | RunStep
        | EndRunStep
        | EndSessionStep
        | AskStep
        | FactsStep
        | RepeatStep,
        Field(discriminator="kind"),
    ],
    BeforeValidator(normalize_step),
    _StepForms(),
]
"""One step of a workflow (a discriminated union on ``kind``)."""

RunStep.model_rebuild()
RepeatStep.model_rebuild()
_STEP_ADAPTER: TypeAdapter[Any] = TypeAdapter(Step)


def validate_step(data: object) -> Any:
    """One step, validated as files write it (short or long form); the step model.

    Raises:
        pydantic.ValidationError: not a valid step.

    Example:
        >>> validate_step({"fork": {"parent": "main", "child": "r1"}}).child
        'r1'
    """
    return _STEP_ADAPTER.validate_python(data)


@dataclass(frozen=True)
class WorkflowOrigin:
    """The file a workflow was read from, so that its errors point into it.

    Attributes:
        path: the file, resolved (relative paths in the workflow resolve against its
            folder).
        name: the file as it was given (how error messages name it).
        data: the data parsed from the file, before validation (error paths index it).
        lines: the line of every item of ``data`` (``None``: not known, as for TOML).

    Example:
        >>> WorkflowOrigin(Path("/work/wf.yaml"), "wf.yaml", {"agents": ["a"]}).name
        'wf.yaml'
    """

    path: Path
    name: str
    data: Any
    lines: SourceMap | None = None


class Workflow(_Model):
    """A whole workflow file: memory, transport, agents, branches and steps.

    ``name`` also names the store namespace a run uses when the memory config names no
    store (the file's stem when a file sets no name). A workflow built in Python without
    a name gets a namespace derived from its content (``workflow-`` and a hash of its
    fields, :func:`~marsys_mem.workflow.runner.workflow_namespace`): rerunning it finds
    its own earlier run, and unrelated unnamed workflows never share a namespace.

    Example:
        >>> wf = Workflow.model_validate({
        ...     "name": "hello",
        ...     "agents": ["planner", {"name": "writer", "system": "You write."}],
        ...     "steps": [{"say": {"agent": "planner", "text": "Outline the report"}},
        ...               {"call_agent": {"caller": "planner", "callee": "writer",
        ...                               "request": "Draft it", "response": "Draft v1"}},
        ...               {"ask": {"agent": "writer", "question": "What did I draft?"}}],
        ... })
        >>> [s.kind for s in wf.steps], wf.transport
        (['say', 'call_agent', 'ask'], 'inprocess')
    """

    version: Literal[1] = 1
    name: str = Field(
        default="workflow",
        min_length=1,
        description="The workflow's name; also its store namespace when no store is named.",
    )
    description: str = ""
    memory: MemorySpec = Field(default_factory=MemoryConfig)
    transport: TransportSpec = "inprocess"
    llm: LLMConfig | None = Field(
        default=None,
        description="The model ask steps call (overrides the memory config's llm).",
    )
    agents: list[
        Annotated[
            AgentSpec,
            BeforeValidator(normalize_agent),
            AlsoAccepts({"type": "string", "pattern": _NAME}),
        ]
    ] = Field(min_length=1)
    branches: list[BranchSpec] = Field(default_factory=list)
    steps: list[Step] = Field(default_factory=list)
    _origin: WorkflowOrigin | None = PrivateAttr(default=None)
    _memo: dict[Callable[[Workflow], Any], Any] = PrivateAttr(default_factory=dict)

    @property
    def origin(self) -> WorkflowOrigin | None:
        """The file this workflow was read from (``None`` for one built in Python)."""
        return self._origin

    @property
    def source(self) -> Path | None:
        """The file this workflow was loaded from, if any."""
        return self._origin.path if self._origin is not None else None

    @property
    def base_dir(self) -> Path:
        """The workflow file's folder (relative paths resolve against it), else the cwd."""
        return self._origin.path.parent if self._origin is not None else Path.cwd()

    def with_origin(self, origin: WorkflowOrigin) -> Workflow:
        """This workflow as read from ``origin``: its errors point into that file.

        A shallow copy, like :meth:`model_copy`.

        Example:
            >>> wf = Workflow(agents=[AgentSpec(name="a")])
            >>> origin = WorkflowOrigin(Path("/tmp/wf.yaml"), "wf.yaml", {"agents": ["a"]})
            >>> wf.with_origin(origin).locate(("agents", 0)).file
            'wf.yaml'
        """
        copy: Workflow = self.model_copy()
        copy._origin = origin
        return copy

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy (see pydantic); what :meth:`memo` computed for this workflow is not kept."""
        copy: Self = super().model_copy(update=update, deep=deep)
        copy._memo = {}
        return copy

    def file_data(self) -> Any:
        """The data error paths index: the parsed file, else this workflow as JSON data."""
        if self._origin is not None:
            return self._origin.data
        return self.memo(_json_data)

    def locate(self, path: Sequence[PathPart]) -> Located:
        """Where ``path`` (a field path such as ``("steps", 3, "agent")``) is in the file.

        Example:
            >>> wf = Workflow(agents=[AgentSpec(name="a")], steps=[EndSessionStep()])
            >>> str(wf.locate(("steps", 0, "kind")))
            'steps[0].kind'
        """
        origin = self._origin
        lines = origin.lines if origin is not None else None
        file = origin.name if origin is not None else None
        return locate(self.file_data(), path, lines, file=file, tags=UNION_TAGS)

    def memo(self, compute: Callable[[Workflow], _T]) -> _T:
        """``compute(self)``, computed once per workflow (a workflow never changes).

        The planner keeps its plan here (:func:`~marsys_mem.workflow.prepare_workflow`).
        An exception is not kept: the next call computes again.

        Example:
            >>> calls = []
            >>> def agents(w: Workflow) -> int:
            ...     calls.append(w.name)
            ...     return len(w.agents)
            >>> wf = Workflow(agents=[AgentSpec(name="a")])
            >>> wf.memo(agents), wf.memo(agents), calls
            (1, 1, ['workflow'])
        """
        if compute not in self._memo:
            self._memo[compute] = compute(self)
        value: _T = self._memo[compute]
        return value


def _json_data(workflow: Workflow) -> Any:
    return workflow.model_dump(mode="json")


@functools.cache
def workflow_schema() -> dict[str, Any]:
    """The workflow format's JSON Schema (``marsys-mem schema --workflow``)."""
    return Workflow.model_json_schema()
