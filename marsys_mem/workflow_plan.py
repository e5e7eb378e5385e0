"""Checking and planning a workflow before anything runs.

:func:`prepare_workflow` plays the workflow's topology on a bare
:class:`~marsys_mem.coordination.BranchGraph` (no store, no transport): it resolves every
step's branch, expands ``repeat`` blocks, loads a referenced retention-policy file, and
raises a :class:`~marsys_mem.workflow_models.WorkflowError` naming the file, the line and
the field at the first problem: an unknown agent or branch, a fork of an unknown parent,
a duplicate branch, a merge cycle, a missing config file.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from marsys_mem.config_files import read_text
from marsys_mem.coordination.graph import BranchGraph
from marsys_mem.coordination.transport import BranchError
from marsys_mem.exceptions import ConfigError
from marsys_mem.retention import MemoryConfig, StoreConfig
from marsys_mem.sourcemap import PathPart, SourceMap, load_with_lines, locate, locate_errors
from marsys_mem.workflow_models import (
    _STEP_ADAPTER,
    _TAGS,
    BranchSpec,
    MemoryFile,
    RepeatStep,
    Workflow,
    WorkflowError,
    _suggest,
)

__all__ = ["PlannedStep", "PreparedWorkflow", "ProgressCallback", "prepare_workflow"]

_MAX_EXPANDED = 200_000

ProgressCallback = Callable[[int, int, str], None]
"""``progress(done, total, label)``: ``done`` steps of ``total`` are finished; ``label``
says what runs now (called when a step starts, when it waits for embeddings, and when
it ends)."""


def _read_text(path: Path, what: str) -> str:
    try:  # bounded size, UTF-8 checked (bad bytes reported with their offset)
        return read_text(path, what=what)
    except ConfigError as exc:
        raise WorkflowError(str(exc)) from None


def _parse(path: Path, what: str) -> tuple[Any, SourceMap]:
    text = _read_text(path, what)
    try:
        return load_with_lines(text, name=str(path))
    except ConfigError as exc:
        raise WorkflowError(str(exc)) from None


def _load_memory_config(path: Path, where: str) -> MemoryConfig:
    """A retention-policy file, validated with file/line/field errors."""
    if not path.is_file():
        raise WorkflowError(f"{where}config file not found: {path}")
    data, lines = _parse(path, "config file")
    if path.suffix.lower() == ".toml":
        from marsys_mem.retention import load_config

        try:
            return load_config(path)
        except ConfigError as exc:
            raise WorkflowError(str(exc)) from None
    config = _validate_config_data(data, lines, path)
    config._source = path.resolve()
    return config


def _validate_config_data(data: Any, lines: SourceMap | None, path: Path | None) -> MemoryConfig:
    file = str(path) if path is not None else None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise WorkflowError(f"{file}: a config file is a mapping, got {type(data).__name__}")
    try:
        return MemoryConfig.model_validate(data)
    except ValidationError as exc:
        raise WorkflowError("\n".join(locate_errors(exc, data, lines, file=file))) from None


# ---------------------------------------------------------------------------- planning
@dataclass
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
        agent = getattr(s, "agent", None)
        return f"{self.kind} {agent}@{self.branches.get('agent', '?')}" if agent else self.kind


@dataclass
class PreparedWorkflow:
    """A validated workflow: its resolved memory config and its plan of steps.

    ``initial`` is the starting topology as ``(branch, parent, agents)``; ``plan`` the
    steps with repeats expanded; ``count`` the number of steps to play.
    """

    workflow: Workflow
    config: MemoryConfig
    config_explicit_store: bool
    initial: list[tuple[str, str | None, list[str]]]
    plan: list[PlannedStep]
    count: int


class _Checker:
    """Plays the workflow on a bare BranchGraph to find errors before anything runs."""

    def __init__(self, wf: Workflow) -> None:
        self.wf = wf
        self.data = wf._raw if wf._raw is not None else wf.model_dump(mode="json")
        self.lines = wf._lines
        self.file = wf._display
        self.agents = [a.name for a in wf.agents]
        self.graph = BranchGraph()
        self.runs: list[tuple[str, str]] = []
        self.count = 0
        self.iteration: str | None = None

    def fail(self, path: Sequence[PathPart], message: str) -> WorkflowError:
        where = locate(self.data, path, self.lines, file=self.file, tags=_TAGS)
        text = f"{where}: {message}" if str(where) else message
        if self.iteration:
            text += f" (in repeat iteration {self.iteration})"
        return WorkflowError(text)

    def agent(self, path: Sequence[PathPart], name: str) -> str:
        if name not in self.agents:
            raise self.fail(
                path,
                f"unknown agent {name!r}{_suggest(name, self.agents)}; "
                f"the workflow's agents are: {', '.join(self.agents)}",
            )
        return name

    def branch(self, path: Sequence[PathPart], name: str) -> str:
        if name not in self.graph:
            known = self.graph.branches
            raise self.fail(
                path,
                f"unknown branch {name!r}{_suggest(name, known)}; "
                f"branches at this step: {', '.join(known) or 'none'}",
            )
        return name

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
                    f"(its agents: {', '.join(g.agents(explicit)) or 'none'})",
                )
            return explicit
        for run_agent, run_branch in reversed(self.runs):
            if run_agent == agent:
                return run_branch
        on = [b for b in g.branches if agent in g.agents(b)]
        active = [b for b in on if g.status(b) == "active"] or on
        if len(active) == 1:
            return active[0]
        if not active:
            raise self.fail(
                (*path, role), f"agent {agent!r} is on no branch: add it to a branch or a fork"
            )
        raise self.fail(
            (*path, role),
            f"agent {agent!r} is on branches {', '.join(active)}: "
            f"say which with {'callee_branch' if role == 'callee' else 'branch'}:",
        )

    # ------------------------------------------------------------------ topology
    def initial(self) -> list[tuple[str, str | None, list[str]]]:
        wf = self.wf
        seen_agents: dict[str, int] = {}
        for i, a in enumerate(wf.agents):
            if a.name in seen_agents:
                raise self.fail(("agents", i, "name"), f"duplicate agent name {a.name!r}")
            seen_agents[a.name] = i
        specs = wf.branches or [BranchSpec(name="main", agents=list(self.agents))]
        out: list[tuple[str, str | None, list[str]]] = []
        declared = {b.name for b in specs}
        for i, b in enumerate(specs):
            path: tuple[PathPart, ...] = ("branches", i)
            if b.name in self.graph:
                first = next(j for j, s in enumerate(specs) if s.name == b.name)
                line = self.lines.line(("branches", first)) if self.lines else None
                also = f" (first defined at line {line})" if line else ""
                raise self.fail((*path, "name"), f"duplicate branch name {b.name!r}{also}")
            for j, agent in enumerate(b.agents):
                self.agent((*path, "agents", j), agent)
            if b.parent is None:
                self.graph.add_branch(b.name, agents=b.agents)
            else:
                if b.parent not in self.graph:
                    later = " (a parent must be listed before its children)"
                    raise self.fail(
                        (*path, "parent"),
                        f"unknown parent branch {b.parent!r}"
                        f"{later if b.parent in declared else _suggest(b.parent, list(declared))}",
                    )
                self.graph.fork(b.parent, b.name, agents=b.agents)
            out.append((b.name, b.parent, list(b.agents)))
        return out

    # ------------------------------------------------------------------ steps
    def plan(
        self, steps: Sequence[Any], path: tuple[PathPart, ...], in_run: bool
    ) -> list[PlannedStep]:
        out: list[PlannedStep] = []
        for i, step in enumerate(steps):
            here = (*path, i)
            if step.kind == "repeat":
                out.extend(self.repeat(step, here, in_run))
                continue
            out.append(self.step(step, here, in_run))
        return out

    def repeat(
        self, step: RepeatStep, path: tuple[PathPart, ...], in_run: bool
    ) -> list[PlannedStep]:
        out: list[PlannedStep] = []
        outer = self.iteration
        try:
            for i in range(1, step.times + 1):
                item = step.items[(i - 1) % len(step.items)] if step.items else ""
                values = {"{i}": str(i), "{n}": str(step.times), "{item}": item}
                self.iteration = f"{i}/{step.times}" + (f" of {outer}" if outer else "")
                subs = [_substitute(s, values) for s in step.steps]
                planned = self.plan(subs, (*path, "steps"), in_run)
                for p in planned:
                    p.iteration = p.iteration or self.iteration
                out.extend(planned)
        finally:
            self.iteration = outer
        return out

    def step(self, s: Any, path: tuple[PathPart, ...], in_run: bool) -> PlannedStep:
        self.count += 1
        if self.count > _MAX_EXPANDED:
            raise self.fail(path, f"more than {_MAX_EXPANDED} steps after expanding repeats")
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
            p.branches["caller"] = caller = self.home(path, "caller", s.caller, s.branch)
            callee_branch = s.callee_branch
            if callee_branch is None and s.callee in self.agents and s.callee in g.agents(caller):
                callee_branch = caller
            p.branches["callee"] = self.home(path, "callee", s.callee, callee_branch)
        elif kind == "fork":
            self.branch((*path, "parent"), s.parent)
            if s.child in g:
                raise self.fail((*path, "child"), f"branch {s.child!r} already exists")
            for j, agent in enumerate(s.agents or []):
                self.agent((*path, "agents", j), agent)
            try:
                g.fork(s.parent, s.child, agents=s.agents)
            except BranchError as exc:
                raise self.fail((*path, "child"), str(exc)) from None
        elif kind == "merge":
            self.branch((*path, "child"), s.child)
            self.branch((*path, "into"), s.into)
            try:
                g.merge(s.child, s.into, strategy=s.strategy, conflict=s.conflict)
            except BranchError as exc:
                raise self.fail((*path, "into"), str(exc)) from None
            if s.strategy == "messages":
                for agent in g.agents(s.child):
                    g.add_agent(s.into, agent)
        elif kind == "end_session":
            if in_run:
                raise self.fail(path, "end_session cannot be inside a run block")
        elif kind == "run":
            p.branches["agent"] = branch = self.home(path, "agent", s.agent, s.branch)
            self.runs.append((s.agent, branch))
            try:
                p.children = self.plan(s.steps, (*path, "steps"), True)
            finally:
                self.runs.pop()
        return p


def _substitute(step: Any, values: dict[str, str]) -> Any:
    """``step`` with ``{i}``, ``{n}`` and ``{item}`` replaced in every string.

    A nested ``repeat`` is left alone: inside it, its own values apply.
    """
    if step.kind == "repeat":
        return step

    def sub(value: Any) -> Any:
        if isinstance(value, str):
            for key, text in values.items():
                value = value.replace(key, text)
            return value
        if isinstance(value, dict):
            return {k: sub(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [sub(v) for v in value]
        return value

    return _STEP_ADAPTER.validate_python(sub(step.model_dump(mode="python")))


def prepare_workflow(workflow: Workflow) -> PreparedWorkflow:
    """Check ``workflow`` fully and plan it (memory config resolved, repeats expanded).

    Cached on the workflow. Nothing is written.

    Raises:
        WorkflowError: an unknown agent or branch, a fork of an unknown parent, a
            duplicate branch, a merge cycle, a missing or invalid config file.
    """
    cached = workflow._prepared
    if isinstance(cached, PreparedWorkflow):
        return cached
    checker = _Checker(workflow)
    memory = workflow.memory
    explicit_store = False
    if isinstance(memory, MemoryFile):
        ref = memory.config
        path = ref if ref.is_absolute() else workflow.base_dir / ref
        if not path.is_file():
            raise checker.fail(("memory", "config"), f"config file not found: {path}")
        config = _load_memory_config(path, "")
        explicit_store = _has_store(path)
    else:
        config = memory
        explicit_store = "store" in memory.model_fields_set
    initial = checker.initial()
    plan = checker.plan(workflow.steps, ("steps",), False)
    prepared = PreparedWorkflow(workflow, config, explicit_store, initial, plan, checker.count)
    workflow._prepared = prepared
    return prepared


def _has_store(path: Path) -> bool:
    data, _ = _parse(path, "config file")
    return isinstance(data, dict) and "store" in data


def _store_config(prepared: PreparedWorkflow, store_dir: str | Path | None) -> MemoryConfig:
    """The config with the store the run uses (see :func:`run_workflow`)."""
    config = prepared.config
    if store_dir is not None:
        path = (Path(store_dir) / "memory.db").resolve()
    elif prepared.config_explicit_store:
        if config.store.backend != "sqlite":
            return config
        path = config.store.resolved_path(config.base_dir or prepared.workflow.base_dir)
        path = path.resolve()
    else:
        path = (prepared.workflow.base_dir / ".marsys_mem" / "memory.db").resolve()
    store = StoreConfig(backend="sqlite", path=path, namespace=config.store.namespace)
    updated = config.model_copy(update={"store": store})
    updated._source = config.source
    return updated
