"""Checking and planning a workflow before anything runs.

:func:`prepare_workflow` plays the workflow's topology on a bare
:class:`~marsys_mem.coordination.BranchGraph` (no store, no transport): it resolves every
step's branch, expands ``repeat`` blocks, loads a referenced retention-policy file, and
raises one :class:`~marsys_mem.workflow.models.WorkflowError` listing every problem, one
per line, each naming the file, the line and the field: an unknown agent or branch, a
fork of an unknown parent, a duplicate branch, a merge cycle, a missing config file, a
``memory.agents`` entry that names no agent of the workflow.

A file is checked in one pass (:func:`check_workflow_data`): the field errors pydantic
finds and the errors of the topology come together. Steps that are themselves invalid
are skipped when the topology is played, and what they would have created (a forked
branch, a declared agent) is not reported again as unknown.

Settings that are valid but probably not meant (``persistent`` retention with the
in-memory store: nothing survives the process) are warnings
(:attr:`PreparedWorkflow.warnings`, :func:`config_warnings`); ``marsys-mem validate``
prints them and exits 0, or 2 with ``--strict``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import TypeAdapter, ValidationError

from marsys_mem.config.files import short_repr
from marsys_mem.config.load import load_config_file
from marsys_mem.config.models import LLMConfig, MemoryConfig
from marsys_mem.config.report import (
    MAX_ERRORS,
    MoreErrors,
    Problem,
    is_file,
    more_errors,
    raise_errors,
    shown_path,
)
from marsys_mem.config.sourcemap import (
    LocatedError,
    PathPart,
    SourceMap,
    did_you_mean,
    format_path,
    locate,
    located_errors,
)
from marsys_mem.coordination.graph import BranchGraph
from marsys_mem.exceptions import BranchError, WorkflowError
from marsys_mem.llm.factory import llm_problems
from marsys_mem.workflow.models import (
    UNION_TAGS,
    AgentSpec,
    BranchSpec,
    MemoryFile,
    MemorySpec,
    RepeatStep,
    Workflow,
    WorkflowOrigin,
    normalize_agent,
    normalize_step,
    validate_step,
    workflow_schema,
)
from marsys_mem.workflow.trust import store_warning

__all__ = [
    "PlannedStep",
    "PreparedWorkflow",
    "check_workflow_data",
    "config_warnings",
    "prepare_workflow",
]

_MAX_EXPANDED = 200_000
_T = TypeVar("_T")


def config_warnings(
    config: MemoryConfig,
    *,
    data: Any = None,
    lines: SourceMap | None = None,
    file: str | None = None,
    prefix: tuple[PathPart, ...] = (),
    agents: Sequence[str] | None = None,
) -> list[str]:
    """Valid settings that probably do not do what was meant, one line each.

    Today: ``persistent`` retention with the in-memory store (``store.backend: memory``,
    the default of a config file without ``store``): nothing is written to disk and the
    memory is gone when the process ends. ``agents``: check these agents' policies
    (default: the defaults and every agent the config names). ``data``, ``lines``,
    ``file`` and ``prefix`` locate the warnings in the file they came from.

    Example:
        >>> cfg = MemoryConfig.model_validate({"defaults": {"retention": "persistent"}})
        >>> config_warnings(cfg)[0].split(":")[0]
        'defaults.retention'
    """
    if config.store.backend != "memory":
        return []
    located: list[tuple[PathPart, ...]] = []
    names = list(config.agents) if agents is None else list(agents)
    if agents is None and config.defaults.is_persistent:
        located.append(("defaults", "retention"))
    for name in names:
        override = config.agents.get(name)
        if override is not None and override.retention == "persistent":
            located.append(("agents", name, "retention"))
        elif agents is not None and override is None and config.defaults.is_persistent:
            if ("defaults", "retention") not in located:
                located.append(("defaults", "retention"))
    src = data if data is not None else config.model_dump(mode="json")
    out = []
    for path in located:
        where = locate(src, (*prefix, *path), lines, file=file)
        out.append(
            f"{where}: 'persistent' with the in-memory store (store.backend 'memory') "
            "keeps nothing once the process ends; use store: {backend: sqlite, path: ...}"
        )
    return out


# ---------------------------------------------------------------------------- planning
@dataclass(slots=True)
class PlannedStep:
    """One step ready to run: its source path, its branches resolved, its block's steps.

    ``path`` is the step's place in the file (``("steps", 3)``); ``branches`` maps each
    agent role of the step (``agent``, ``caller``, ``callee``) to its resolved branch;
    ``iteration`` is ``"2/30"`` inside a ``repeat``.
    """

    path: tuple[PathPart, ...]
    step: Any
    branches: dict[str, str] = field(default_factory=dict)
    children: list[PlannedStep] = field(default_factory=list)
    iteration: str | None = None

    @property
    def kind(self) -> str:
        """The step's kind."""
        return str(self.step.kind)

    def label(self) -> str:
        """A short description: ``say planner@main``."""
        s = self.step
        if self.kind == "call_agent":
            return (
                f"call_agent {s.caller}@{self.branches['caller']} -> "
                f"{s.callee}@{self.branches['callee']}"
            )
        if self.kind == "fork":
            return f"fork {s.parent} -> {s.child}"
        if self.kind == "merge":
            return f"merge {s.child} -> {s.into}"
        if self.kind == "end_session":
            return "end_session" + (" (restart)" if s.restart else "")
        if self.kind == "facts":
            who = s.subject or (f"{s.agent}@{self.branches.get('agent', '?')}" if s.agent else "")
            return f"facts {who}".rstrip()
        agent = getattr(s, "agent", None)
        return f"{self.kind} {agent}@{self.branches.get('agent', '?')}" if agent else self.kind


@dataclass
class PreparedWorkflow:
    """A validated workflow: its resolved memory config and its plan of steps.

    ``initial`` is the starting topology as ``(branch, parent, agents)``; ``plan`` the
    steps with repeats expanded; ``count`` the number of steps to play; ``warnings``
    settings that are valid but probably not meant (one line each, with file and line);
    ``llm`` the model ``ask`` steps call (the workflow's ``llm:``, else the memory
    config's; ``None``: asks stay offline); ``llm_where`` the location of its fields in
    the file it came from (``{"api_key_env": "wf.yaml:5: llm.api_key_env"}``).
    """

    workflow: Workflow
    config: MemoryConfig
    config_explicit_store: bool
    initial: list[tuple[str, str | None, list[str]]]
    plan: list[PlannedStep]
    count: int
    warnings: list[str] = field(default_factory=list)
    llm: LLMConfig | None = None
    llm_where: dict[str, str] = field(default_factory=dict)


@dataclass
class _Invalid:
    """Stands for an item of the file that did not validate (its error is reported).

    ``creates``: branch names it might have created; ``children``: the valid steps of an
    invalid ``run`` / ``repeat`` block, still checked.
    """

    creates: set[str] = field(default_factory=set)
    children: list[Any] = field(default_factory=list)
    kind: str = "invalid"


class _Failed(Exception):
    """A step cannot be planned; ``error`` is ``None`` when it was reported already."""

    def __init__(self, error: LocatedError | None = None) -> None:
        super().__init__(str(error))
        self.error = error


class _TooMany(Exception):
    """Enough errors for one report."""


class _Checker:
    """Plays the workflow on a bare BranchGraph to find every error before anything runs."""

    def __init__(
        self,
        wf: Workflow,
        *,
        bad_agents: Collection[str] = (),
        bad_branches: Collection[str] = (),
    ) -> None:
        self.wf = wf
        origin = wf.origin
        self.data = wf.file_data()
        self.lines = origin.lines if origin is not None else None
        self.file = origin.name if origin is not None else None
        self.agents = [a.name for a in wf.agents if isinstance(a, AgentSpec)]
        self.graph = BranchGraph()
        self.runs: list[tuple[str, str]] = []
        self.count = 0
        self.iteration: str | None = None
        self.errors: list[LocatedError] = []
        self.reported: set[Any] = set()
        self.bad_agents = set(bad_agents)  # declared but invalid: not "unknown" again
        self.bad_branches = set(bad_branches)  # never created because of an error
        self._homes: dict[str, list[str]] = {}

    # ------------------------------------------------------------------ errors
    def error(self, path: Sequence[PathPart], message: str) -> LocatedError:
        """The error at ``path``, located in the file."""
        return LocatedError(self.wf.locate(path), message)

    def fail(self, path: Sequence[PathPart], message: str) -> _Failed:
        """The error at ``path`` (``None`` inside when already reported there)."""
        key: Any = tuple(path) if self.iteration else (tuple(path), message)
        if key in self.reported:
            return _Failed(None)
        self.reported.add(key)
        if self.iteration:
            message += f" (in repeat iteration {self.iteration})"
        return _Failed(self.error(path, message))

    def record(self, failed: _Failed) -> None:
        if failed.error is not None:
            self.errors.append(failed.error)
            if len(self.errors) > MAX_ERRORS:
                raise _TooMany

    def attempt(self, check: Callable[[], _T]) -> _T | None:
        """``check()``, or ``None`` with its error recorded."""
        try:
            return check()
        except _Failed as failed:
            self.record(failed)
            return None

    # ------------------------------------------------------------------ names
    def agent(self, path: Sequence[PathPart], name: str) -> str:
        if name not in self.agents:
            if name in self.bad_agents:
                raise _Failed(None)
            self.bad_agents.add(name)  # said once, not once per step or repeat iteration
            raise self.fail(
                path,
                f"unknown agent {short_repr(name)}{did_you_mean(name[:100], self.agents)}; "
                f"the workflow's agents are: {_listing(self.agents)}",
            )
        return name

    def known_agents(self, path: tuple[PathPart, ...], names: Sequence[str]) -> list[str]:
        """``names`` that are agents of the workflow; an error recorded for each other."""
        known = []
        for j, name in enumerate(names):
            try:
                known.append(self.agent((*path, j), name))
            except _Failed as failed:
                self.record(failed)
        return known

    def branch(self, path: Sequence[PathPart], name: str) -> str:
        if name not in self.graph:
            if name in self.bad_branches:
                raise _Failed(None)
            known = self.graph.branches
            raise self.fail(
                path,
                f"unknown branch {short_repr(name)}{did_you_mean(name[:100], known)}; "
                f"branches at this step: {_listing(known)}",
            )
        return name

    def homes(self, agent: str) -> list[str]:
        """The active branches ``agent`` is on (else all it is on); cached per topology."""
        found = self._homes.get(agent)
        if found is None:
            g = self.graph
            on = [b for b in g.branches if agent in g.agents(b)]
            found = [b for b in on if g.status(b) == "active"] or on
            self._homes[agent] = found
        return found

    def home(self, path: tuple[PathPart, ...], role: str, agent: str, explicit: str | None) -> str:
        """The branch of ``agent`` for this step (explicit, the run block's, or its only one)."""
        self.agent((*path, role), agent)
        g = self.graph
        if explicit is not None:
            field_name = "callee_branch" if role == "callee" else "branch"
            self.branch((*path, field_name), explicit)
            if agent not in g.agents(explicit):
                raise self.fail(
                    (*path, field_name),
                    f"agent {agent!r} is not on branch {explicit!r} "
                    f"(its agents: {_listing(g.agents(explicit))})",
                )
            return explicit
        for run_agent, run_branch in reversed(self.runs):
            if run_agent == agent:
                return run_branch
        active = self.homes(agent)
        if len(active) == 1:
            return active[0]
        if not active:
            if self.bad_branches:  # it was probably meant to be on one of those
                raise _Failed(None)
            raise self.fail(
                (*path, role), f"agent {agent!r} is on no branch: add it to a branch or a fork"
            )
        raise self.fail(
            (*path, role),
            f"agent {agent!r} is on branches {_listing(active)}: "
            f"say which with {'callee_branch' if role == 'callee' else 'branch'}:",
        )

    # ------------------------------------------------------------------ topology
    def initial(self) -> list[tuple[str, str | None, list[str]]]:
        wf = self.wf
        seen_agents: dict[str, int] = {}
        for i, a in enumerate(wf.agents):
            if not isinstance(a, AgentSpec):
                continue
            if a.name in seen_agents:
                self.record(self.fail(("agents", i, "name"), f"duplicate agent name {a.name!r}"))
            seen_agents[a.name] = i
        specs = wf.branches or [BranchSpec(name="main", agents=list(self.agents))]
        out: list[tuple[str, str | None, list[str]]] = []
        declared = {b.name for b in specs if isinstance(b, BranchSpec)}
        for i, b in enumerate(specs):
            if not isinstance(b, BranchSpec):
                continue
            path: tuple[PathPart, ...] = ("branches", i)
            if b.name in self.graph:
                first = next(
                    j for j, s in enumerate(specs) if isinstance(s, BranchSpec) and s.name == b.name
                )
                line = self.lines.line(("branches", first)) if self.lines else None
                also = f" (first defined at line {line})" if line else ""
                self.record(self.fail((*path, "name"), f"duplicate branch name {b.name!r}{also}"))
                continue
            agents = self.known_agents((*path, "agents"), b.agents)
            if b.parent is None:
                self.graph.add_branch(b.name, agents=agents)
            else:
                if b.parent not in self.graph:
                    if b.parent not in self.bad_branches:
                        later = " (a parent must be listed before its children)"
                        hint = (
                            later
                            if b.parent in declared
                            else did_you_mean(b.parent, list(declared))
                        )
                        self.record(
                            self.fail(
                                (*path, "parent"), f"unknown parent branch {b.parent!r}{hint}"
                            )
                        )
                    self.bad_branches.add(b.name)
                    continue
                self.graph.fork(b.parent, b.name, agents=agents)
            self._homes.clear()
            out.append((b.name, b.parent, agents))
        return out

    # ------------------------------------------------------------------ steps
    def plan(
        self, steps: Sequence[Any], path: tuple[PathPart, ...], in_run: bool
    ) -> list[PlannedStep]:
        out: list[PlannedStep] = []
        for i, step in enumerate(steps):
            self.plan_one(step, (*path, i), in_run, out)
        return out

    def plan_one(
        self, step: Any, here: tuple[PathPart, ...], in_run: bool, out: list[PlannedStep]
    ) -> None:
        """Plan ``step`` into ``out``; an error is recorded and the step skipped."""
        if isinstance(step, _Invalid):
            self.bad_branches |= step.creates
            out.extend(self.plan(step.children, (*here, "steps"), in_run))
            return
        try:
            if step.kind == "repeat":
                self.repeat(step, here, in_run, out)
            else:
                out.append(self.step(step, here, in_run))
        except _Failed as failed:
            self.record(failed)
            if step.kind == "fork":
                self.bad_branches.add(step.child)

    def repeat(
        self, step: RepeatStep, path: tuple[PathPart, ...], in_run: bool, out: list[PlannedStep]
    ) -> None:
        outer = self.iteration
        inner = (*path, "steps")
        templates: list[tuple[tuple[PathPart, ...], Any, Any]] = [
            ((*inner, j), s, _template(s)) for j, s in enumerate(step.steps)
        ]
        times, items = step.times, step.items
        try:
            for i in range(1, times + 1):
                values = {
                    "{i}": str(i),
                    "{n}": str(times),
                    "{item}": items[(i - 1) % len(items)] if items else "",
                }
                self.iteration = f"{i}/{times} of {outer}" if outer else f"{i}/{times}"
                for here, s, template in templates:
                    if template is not None:
                        data, keys = template
                        data = {**data, **{k: _sub(data[k], values) for k in keys}}
                        try:
                            s = validate_step(data)
                        except ValidationError as exc:
                            self.record(self.fail(here, _substitution_error(exc)))
                            s = _Invalid(creates=_created_branches(data))
                    self.plan_one(s, here, in_run, out)
        finally:
            self.iteration = outer

    def step(self, s: Any, path: tuple[PathPart, ...], in_run: bool) -> PlannedStep:
        self.count += 1
        if self.count > _MAX_EXPANDED:
            self.record(self.fail(path, f"more than {_MAX_EXPANDED} steps after expanding repeats"))
            raise _TooMany
        p = PlannedStep(path=path, step=s, iteration=self.iteration)
        g = self.graph
        kind = s.kind
        if kind in ("say", "tool", "share", "ask", "end_run"):
            p.branches["agent"] = self.home(path, "agent", s.agent, s.branch)
            if kind == "end_run" and (s.agent, p.branches["agent"]) in self.runs:
                raise self.fail(
                    path, f"end_run inside the run block of {s.agent!r}: the block ends the run"
                )
        elif kind == "call_agent":
            caller = self.attempt(lambda: self.home(path, "caller", s.caller, s.branch))
            callee_branch = s.callee_branch
            if (
                callee_branch is None
                and caller is not None
                and s.callee in self.agents
                and s.callee in g.agents(caller)
            ):
                callee_branch = caller
            callee = self.attempt(lambda: self.home(path, "callee", s.callee, callee_branch))
            if caller is None or callee is None:
                raise _Failed(None)
            p.branches["caller"], p.branches["callee"] = caller, callee
        elif kind == "fork":
            parent = self.attempt(lambda: self.branch((*path, "parent"), s.parent))
            if s.child in g:
                raise self.fail((*path, "child"), f"branch {s.child!r} already exists")
            agents = None
            if s.agents is not None:
                agents = self.known_agents((*path, "agents"), s.agents)
            if parent is None:
                raise _Failed(None)
            try:
                g.fork(parent, s.child, agents=agents)
            except BranchError as exc:
                raise self.fail((*path, "child"), str(exc)) from None
            self._homes.clear()
        elif kind == "merge":
            child = self.attempt(lambda: self.branch((*path, "child"), s.child))
            into = self.attempt(lambda: self.branch((*path, "into"), s.into))
            if child is None or into is None:
                raise _Failed(None)
            try:
                g.merge(child, into, strategy=s.strategy, conflict=s.conflict)
            except BranchError as exc:
                raise self.fail((*path, "into"), str(exc)) from None
            if s.strategy == "messages":
                for agent in g.agents(child):
                    g.add_agent(into, agent)
            self._homes.clear()
        elif kind == "facts":
            if s.agent is not None:
                p.branches["agent"] = self.home(path, "agent", s.agent, s.branch)
            elif s.branch is not None:
                raise self.fail((*path, "branch"), "branch is only used with agent")
        elif kind == "end_session":
            if in_run:
                raise self.fail(path, "end_session cannot be inside a run block")
        elif kind == "run":
            branch = self.attempt(lambda: self.home(path, "agent", s.agent, s.branch))
            if branch is not None:
                p.branches["agent"] = branch
                self.runs.append((s.agent, branch))
            try:
                p.children = self.plan(s.steps, (*path, "steps"), True)
            finally:
                if branch is not None:
                    self.runs.pop()
            if branch is None:
                raise _Failed(None)
        return p


def _listing(names: Sequence[str], most: int = 10) -> str:
    """``a, b, c`` (``none`` when empty), at most ``most`` names and then how many in all."""
    if not names:
        return "none"
    shown = ", ".join(names[:most])
    return shown if len(names) <= most else f"{shown}, ... ({len(names)} in all)"


def _template(step: Any) -> tuple[dict[str, Any], list[str]] | None:
    """The step as data and its fields holding ``{i}``/``{n}``/``{item}``, if any.

    ``None``: nothing to substitute, the step is reused as it is.
    """
    if isinstance(step, _Invalid) or step.kind == "repeat" or _holds_invalid(step):
        return None  # a nested repeat substitutes its own values; a broken block is reported
    data: dict[str, Any] = step.model_dump(mode="python")
    keys = [k for k, v in data.items() if _has_placeholder(v)]
    return (data, keys) if keys else None


def _holds_invalid(step: Any) -> bool:
    """A block salvaged from an invalid file, with an invalid step somewhere inside."""
    inner = getattr(step, "steps", None) or ()
    return any(isinstance(s, _Invalid) or _holds_invalid(s) for s in inner)


def _has_placeholder(value: Any) -> bool:
    if isinstance(value, str):
        return "{i}" in value or "{n}" in value or "{item}" in value
    if isinstance(value, dict):
        return any(_has_placeholder(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_has_placeholder(v) for v in value)
    return False


def _sub(value: Any, values: dict[str, str]) -> Any:
    """``value`` with ``{i}``, ``{n}`` and ``{item}`` replaced in every string."""
    if isinstance(value, str):
        if "{" in value:
            for key, text in values.items():
                value = value.replace(key, text)
        return value
    if isinstance(value, dict):
        return {k: _sub(v, values) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_sub(v, values) for v in value]
    return value


def _substitute(step: Any, values: dict[str, str]) -> Any:
    """``step`` with ``{i}``, ``{n}`` and ``{item}`` replaced in every string.

    A nested ``repeat`` is left alone: inside it, its own values apply.
    """
    template = _template(step)
    if template is None:
        return step
    return validate_step(_sub(template[0], values))


def _substitution_error(exc: ValidationError) -> str:
    err = exc.errors(include_url=False)[0]
    loc = format_path(p for p in err["loc"] if p not in UNION_TAGS)
    msg = err["msg"].removeprefix("Value error, ")
    return f"invalid after substituting the repeat's values: {loc + ': ' if loc else ''}{msg}"


def _created_branches(raw: Any, depth: int = 0) -> set[str]:
    """Branch names a (possibly invalid) piece of a file would fork."""
    out: set[str] = set()
    if depth > 64:
        return out
    if isinstance(raw, dict):
        body = raw.get("fork") if len(raw) == 1 else raw if raw.get("kind") == "fork" else None
        if isinstance(body, dict) and isinstance(body.get("child"), str):
            out.add(body["child"])
        for value in raw.values():
            out |= _created_branches(value, depth + 1)
    elif isinstance(raw, list):
        for value in raw:
            out |= _created_branches(value, depth + 1)
    return out


def _size(steps: Sequence[Any]) -> int:
    """How many steps ``steps`` play with repeats expanded (capped just past the limit)."""
    total = 0
    for s in steps:
        if isinstance(s, _Invalid):
            n = _size(s.children)
        elif s.kind == "repeat":
            n = _size(s.steps) * s.times
        elif s.kind == "run":
            n = 1 + _size(s.steps)
        else:
            n = 1
        total = min(total + n, _MAX_EXPANDED + 1)
    return total


def _overflow(steps: Sequence[Any], path: tuple[PathPart, ...]) -> tuple[PathPart, ...] | None:
    """Where the steps grow past the limit (the outermost step that alone does), if they do."""
    if _size(steps) <= _MAX_EXPANDED:
        return None
    for i, s in enumerate(steps):
        if _size([s]) > _MAX_EXPANDED:
            return (*path, i)
    return path


# ---------------------------------------------------------------------------- checking
_AGENT_ADAPTER: TypeAdapter[Any] = TypeAdapter(AgentSpec)
_MEMORY_ADAPTER: TypeAdapter[Any] = TypeAdapter(MemorySpec)


def _salvage(data: dict[Any, Any]) -> tuple[Workflow, bool, set[str], set[str]] | None:
    """The parts of an invalid workflow file that validate, to check the topology too.

    Returns the partial workflow, whether its memory is valid, the names of agents
    declared by invalid items, and the branch names that invalid items would create;
    ``None`` where the agents or branches themselves cannot be read.
    """
    raw_agents, raw_branches = data.get("agents"), data.get("branches", [])
    raw_steps = data.get("steps", [])
    if not isinstance(raw_agents, list) or not isinstance(raw_branches, list):
        return None
    if not isinstance(raw_steps, list):
        raw_steps = []
    agents: list[Any] = []
    bad_agents: set[str] = set()
    for item in raw_agents:
        try:
            agents.append(_AGENT_ADAPTER.validate_python(normalize_agent(item)))
        except ValidationError:
            agents.append(_Invalid())
            name = normalize_agent(item)
            if isinstance(name, dict) and isinstance(name.get("name"), str):
                bad_agents.add(name["name"])
    if not any(isinstance(a, AgentSpec) for a in agents):
        return None  # every step would name an unknown agent: nothing more to learn
    branches: list[Any] = []
    bad_branches: set[str] = set()
    for item in raw_branches:
        try:
            branches.append(BranchSpec.model_validate(item))
        except ValidationError:
            branches.append(_Invalid())
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                bad_branches.add(item["name"])
    steps = _salvage_steps(raw_steps, 0)
    try:
        memory = _MEMORY_ADAPTER.validate_python(data.get("memory", {}))
    except ValidationError:
        memory = None
    wf = Workflow.model_construct(
        name=str(data.get("name", "workflow")),
        agents=agents,
        branches=branches,
        steps=steps,
        memory=memory if memory is not None else MemoryConfig(),
    )
    return wf, memory is not None, bad_agents, bad_branches


def _salvage_steps(raw: list[Any], depth: int) -> list[Any]:
    out: list[Any] = []
    for item in raw:
        try:
            out.append(validate_step(item))
            continue
        except ValidationError:
            pass
        try:
            norm = normalize_step(item)
        except ValueError:
            norm = None
        block: Any = _Invalid(creates=_created_branches(item))
        if isinstance(norm, dict) and norm.get("kind") in ("run", "repeat") and depth < 32:
            inner_raw = norm.get("steps")
            inner = _salvage_steps(inner_raw, depth + 1) if isinstance(inner_raw, list) else []
            shell = {**norm, "steps": [] if norm["kind"] == "run" else ["end_session"]}
            try:
                valid = validate_step(shell)
                if inner or norm["kind"] == "run":  # a repeat needs a step to repeat
                    block = valid.model_copy(update={"steps": inner})
            except ValidationError:
                block.children = inner
        out.append(block)
    return out


def check_workflow_data(data: Any, lines: SourceMap | None, path: Path) -> Workflow:
    """Validate a parsed workflow file fully and plan it (nothing is written).

    Every error of the file is reported at once: one :class:`WorkflowError` with one
    line per error, in file order.

    Raises:
        WorkflowError: the data is not a valid workflow.
    """
    if not isinstance(data, dict):
        got = "an empty file" if data is None else type(data).__name__
        raise WorkflowError(
            f"{path}: a workflow file is a mapping (version, agents, steps), got {got}"
        )
    if "name" not in data:
        data = {**data, "name": path.stem}
    file = str(path)
    origin = WorkflowOrigin(path.resolve(), file, data, lines)
    try:  # the source marks its llm: and memory: sections as read from a file
        wf = Workflow.model_validate(data, context={"source": path.resolve()})
    except ValidationError as exc:
        errors: list[Problem] = []
        errors += located_errors(
            exc,
            data,
            lines,
            file=file,
            tags=UNION_TAGS,
            schema=workflow_schema(),
            limit=MAX_ERRORS + 1,
        )
        errors += more_errors(exc)
        salvaged = _salvage(data)
        if salvaged is not None:
            partial, memory_ok, bad_agents, bad_branches = salvaged
            partial = partial.with_origin(origin)
            _, more = _check(
                partial, memory_ok=memory_ok, bad_agents=bad_agents, bad_branches=bad_branches
            )
            errors += more
        raise_errors(errors, file, error=WorkflowError)
        raise  # pragma: no cover - raise_errors raised
    wf = wf.with_origin(origin)
    prepare_workflow(wf)  # semantic checks now: a loaded workflow can run
    return wf


def _check(
    workflow: Workflow,
    *,
    memory_ok: bool = True,
    bad_agents: Collection[str] = (),
    bad_branches: Collection[str] = (),
) -> tuple[PreparedWorkflow | None, list[Problem]]:
    """Check everything; the plan when there is no error, and the errors."""
    checker = _Checker(workflow, bad_agents=bad_agents, bad_branches=bad_branches)
    errors: list[Problem] = []
    warnings: list[str] = []
    config: MemoryConfig | None = None
    explicit_store = False
    initial: list[tuple[str, str | None, list[str]]] = []
    plan: list[PlannedStep] = []
    memory = workflow.memory
    source: tuple[Any, SourceMap | None, str | None, tuple[PathPart, ...]] = (
        checker.data,
        checker.lines,
        checker.file,
        ("memory",),
    )
    if isinstance(memory, MemoryFile):
        ref = memory.config
        path = ref if ref.is_absolute() else workflow.base_dir / ref
        try:
            if not is_file(path):
                raise checker.fail(
                    ("memory", "config"), f"config file not found: {shown_path(path)}"
                )
            loaded = load_config_file(path, error=WorkflowError)
        except _Failed as failed:
            if failed.error is not None:
                errors.append(failed.error)
        except WorkflowError as exc:
            errors.extend(str(exc).splitlines())
        else:
            config, cdata, clines = loaded.config, loaded.data, loaded.lines
            explicit_store = isinstance(cdata, dict) and "store" in cdata
            source = (cdata, clines, str(path), ())
            warnings += _policy_warnings(checker, config, cdata, clines, str(path))
    elif memory_ok:
        config = memory
        explicit_store = "store" in memory.model_fields_set
        for name in memory.agents:
            if name not in checker.agents and name not in checker.bad_agents:
                errors.append(
                    checker.error(
                        ("memory", "agents", name),
                        f"no agent {short_repr(name)} in this workflow"
                        f"{did_you_mean(name[:100], checker.agents)}; "
                        f"its policy would apply to no one (agents: {_listing(checker.agents)})",
                    )
                )
    if config is not None and explicit_store:
        data, lines, file, prefix = source
        warnings += config_warnings(
            config, data=data, lines=lines, file=file, prefix=prefix, agents=checker.agents
        )
        folder = _file_folder(workflow, config)
        if folder is not None:
            where = locate(data, (*prefix, "store", "path"), lines, file=file)
            outside = store_warning(config.store, folder, str(where))
            if outside is not None:
                warnings.append(outside)
    try:
        initial = checker.initial()
        overflow = _overflow(workflow.steps, ("steps",))
        if overflow is not None:
            checker.record(
                checker.fail(
                    overflow,
                    f"more than {_MAX_EXPANDED} steps after expanding repeats "
                    f"({_MAX_EXPANDED} at most)",
                )
            )
        else:
            plan = checker.plan(workflow.steps, ("steps",), False)
    except _TooMany:
        errors.append(MoreErrors(None))
    llm = _llm_of(workflow, config)
    if llm is not None:
        errors += _llm_errors(workflow, llm, checker, source)
    elif config is not None:
        errors += _extractors_without_llm(config, checker.agents, source)
    errors = [*checker.errors, *errors]
    if errors or config is None:
        return None, errors
    prepared = PreparedWorkflow(
        workflow, config, explicit_store, initial, plan, checker.count, warnings, llm
    )
    if llm is not None and llm.source is not None:
        data, lines, file, prefix = source
        if workflow.llm is not None:
            data, lines, file, prefix = checker.data, checker.lines, checker.file, ()
        prepared.llm_where = {
            name: str(locate(data, (*prefix, "llm", name), lines, file=file))
            for name in ("api_key_env", "base_url")
        }
    return prepared, []


def _file_folder(workflow: Workflow, config: MemoryConfig) -> Path | None:
    """The folder of the file that named the store: the policy file, else the workflow file.

    ``None`` for a workflow built in code with an inline config: trusted code.
    """
    if config.source is not None:
        return config.source.parent
    return workflow.origin.path.parent if workflow.origin is not None else None


def _llm_of(workflow: Workflow, config: MemoryConfig | None) -> LLMConfig | None:
    """The model ask steps call: the workflow's ``llm:``, else the memory config's."""
    if workflow.llm is not None:
        return workflow.llm
    return config.llm if config is not None else None


def _extractors_without_llm(
    config: MemoryConfig,
    agents: Sequence[str],
    source: tuple[Any, SourceMap | None, str | None, tuple[PathPart, ...]],
) -> list[Problem]:
    """``patterns.facts.extractor: llm`` with no ``llm:`` to call: one error per setting."""
    data, lines, file, prefix = source
    out: list[Problem] = []
    seen: set[tuple[PathPart, ...]] = set()
    for agent in agents:
        facts = config.policy_for(agent).patterns.facts
        if facts is None or facts.extractor != "llm":
            continue
        own = config.agents.get(agent)
        where: tuple[PathPart, ...] = ("defaults",)
        if own is not None and isinstance(own.patterns, dict) and "facts" in own.patterns:
            where = ("agents", agent)
        path = (*prefix, *where, "patterns", "facts", "extractor")
        if path in seen:
            continue
        seen.add(path)
        out.append(
            LocatedError(
                locate(data, path, lines, file=file),
                "extractor 'llm' needs a model: add an llm: section (provider, model, "
                "base_url, api_key_env) to the workflow or its memory config, or use "
                "extractor: offline",
            )
        )
    return out


def _llm_errors(
    workflow: Workflow,
    llm: LLMConfig,
    checker: _Checker,
    source: tuple[Any, SourceMap | None, str | None, tuple[PathPart, ...]],
) -> list[Problem]:
    """What would stop the model from being called (SDK missing, key not set), located."""
    data, lines, file, prefix = source
    if workflow.llm is not None:
        data, lines, file, prefix = checker.data, checker.lines, checker.file, ()
    return [
        LocatedError(locate(data, (*prefix, "llm", name), lines, file=file), message)
        for name, message in llm_problems(llm)
    ]


def _policy_warnings(
    checker: _Checker, config: MemoryConfig, data: Any, lines: SourceMap | None, file: str
) -> list[str]:
    """Policies of a referenced config file that look like misspelled workflow agents.

    A shared policy file may name agents of other workflows: only a name close to an
    agent of this workflow that has no policy of its own is reported.
    """
    out = []
    unlisted = [a for a in checker.agents if a not in config.agents]
    for name in config.agents:
        hint = did_you_mean(name[:100], unlisted) if name not in checker.agents else ""
        if hint:
            where = locate(data, ("agents", name), lines, file=file)
            out.append(
                f"{where}: no agent {short_repr(name)} in the workflow{hint}; "
                "that agent gets the defaults"
            )
    return out


def prepare_workflow(workflow: Workflow) -> PreparedWorkflow:
    """Check ``workflow`` fully and plan it (memory config resolved, repeats expanded).

    Computed once per workflow (:meth:`Workflow.memo
    <marsys_mem.workflow.models.Workflow.memo>`). Nothing is written.

    Raises:
        WorkflowError: every problem found, one per line: unknown agents or branches,
            forks of unknown parents, duplicate branches, merge cycles, a missing or
            invalid config file, ``memory.agents`` entries for no agent of the workflow.
    """
    return workflow.memo(_prepare)


def _prepare(workflow: Workflow) -> PreparedWorkflow:
    prepared, errors = _check(workflow)
    origin = workflow.origin
    raise_errors(errors, origin.name if origin is not None else None, error=WorkflowError)
    assert prepared is not None
    return prepared
