"""Workflow definitions: agents, their memory, the branch topology and a script of steps.

A workflow file (YAML or JSON; or a :class:`Workflow` built in Python) describes a
multi-agent experiment; :func:`run_workflow` plays it against real memory and returns a
:class:`~marsys_mem.workflow.report.WorkflowReport`. Everything is validated before anything
is written, every error of a file reported at once with its file, line and field; a file is
not trusted with secrets (:mod:`marsys_mem.workflow.trust`).

Guides: ``docs/guides/workflows.md`` and ``docs/reference/workflow-file.md`` (every field).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from marsys_mem.config.load import load_config_file
from marsys_mem.config.models import MemoryConfig
from marsys_mem.config.report import raise_errors, read_data
from marsys_mem.config.sourcemap import LocatedError, locate
from marsys_mem.exceptions import WorkflowError, WorkflowRunError
from marsys_mem.llm.factory import llm_problems
from marsys_mem.llm.trust import FileTrust
from marsys_mem.workflow.models import (
    STEP_KINDS,
    AgentSpec,
    AskStep,
    BranchSpec,
    CallAgentStep,
    EndRunStep,
    EndSessionStep,
    FactSpec,
    FactsStep,
    ForkStep,
    InProcessSettings,
    MemoryFile,
    MergeStep,
    MqttSettings,
    MqttTransportSpec,
    RepeatStep,
    RunStep,
    SayStep,
    ShareStep,
    Step,
    ToolStep,
    Workflow,
)
from marsys_mem.workflow.plan import (
    PlannedStep,
    PreparedWorkflow,
    check_workflow_data,
    config_warnings,
    prepare_workflow,
)
from marsys_mem.workflow.report import WorkflowReport
from marsys_mem.workflow.runner import ProgressCallback, WorkflowRunner
from marsys_mem.workflow.trust import llm_findings, store_warning

__all__ = [
    "STEP_KINDS",
    "AgentSpec",
    "AskStep",
    "BranchSpec",
    "CallAgentStep",
    "EndRunStep",
    "EndSessionStep",
    "FactSpec",
    "FactsStep",
    "FileCheck",
    "FileTrust",
    "ForkStep",
    "InProcessSettings",
    "MemoryFile",
    "MergeStep",
    "MqttSettings",
    "MqttTransportSpec",
    "PlannedStep",
    "PreparedWorkflow",
    "ProgressCallback",
    "RepeatStep",
    "RunStep",
    "SayStep",
    "ShareStep",
    "Step",
    "ToolStep",
    "Workflow",
    "WorkflowError",
    "WorkflowReport",
    "WorkflowRunError",
    "arun_workflow",
    "check_file",
    "detect_kind",
    "load_workflow",
    "parse_mqtt",
    "prepare_workflow",
    "run_workflow",
    "validate_config_file",
]

log = logging.getLogger("marsys_mem.workflow")


def detect_kind(data: object) -> Literal["workflow", "config"]:
    """Whether parsed file data is a workflow or a retention-policy config.

    Example:
        >>> detect_kind({"steps": []}), detect_kind({"defaults": {}})
        ('workflow', 'config')
    """
    if isinstance(data, dict):
        if {"steps", "memory", "branches", "transport", "name"} & set(data):
            return "workflow"
        if isinstance(data.get("agents"), list):
            return "workflow"
    return "config"


def load_workflow(path: str | Path) -> Workflow:
    """Load a workflow file (YAML or JSON) and validate it fully (nothing is written).

    Raises:
        WorkflowError: the file is missing, does not parse, or is invalid; the message
            lists every error, one per line, each naming the file, the line and the field.
    """
    path = Path(path)
    data, lines = read_data(path, "workflow file", error=WorkflowError)
    return check_workflow_data(data, lines, path)


def validate_config_file(path: str | Path) -> tuple[Literal["workflow", "config"], Any]:
    """Validate a workflow or a retention-policy file (detected from its content).

    Returns ``("workflow", Workflow)`` or ``("config", MemoryConfig)``.

    Raises:
        WorkflowError: missing, unparsable or invalid; every error, with file, line and
            field.
    """
    result = check_file(path)
    return result.kind, result.value


@dataclass(frozen=True)
class FileCheck:
    r"""What :func:`check_file` found: the file's kind, its validated value, and warnings.

    ``warnings`` are settings that are valid but probably not meant, one line each with
    the file and the line, and what the file may not do under the trust given
    (:mod:`marsys_mem.workflow.trust`: a key variable or server not allowed, which
    ``run`` refuses; a store path outside the file's folder).

    Example:
        >>> import pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "policy.yaml"
        >>> _ = path.write_text("store: {backend: memory}\ndefaults: {retention: persistent}\n")
        >>> result = check_file(path)
        >>> result.kind, result.warnings[0].split(": ", 2)[1]
        ('config', 'defaults.retention')
    """

    kind: Literal["workflow", "config"]
    value: Workflow | MemoryConfig
    warnings: list[str] = field(default_factory=list)


def check_file(path: str | Path, *, trust: FileTrust | None = None) -> FileCheck:
    """Validate a workflow or a retention-policy file; its value and its warnings.

    ``trust``: what the user allows files (default: :meth:`FileTrust.from_env`); what the
    file's ``llm:`` may not do under it is a warning.

    Raises:
        WorkflowError: missing, unparsable or invalid; every error, one per line, with
            file, line and field.
    """
    path = Path(path)
    trust = FileTrust.from_env() if trust is None else trust
    data, lines = read_data(path, "file", error=WorkflowError)
    if path.suffix.lower() != ".toml" and detect_kind(data) == "workflow":
        wf = check_workflow_data(data, lines, path)
        prepared = prepare_workflow(wf)
        found = llm_findings(prepared.llm, trust, prepared.llm_where)
        return FileCheck("workflow", wf, [*prepared.warnings, *found])
    loaded = load_config_file(path, where=f"{path}: ", error=WorkflowError)

    def where(*field: str) -> str:
        return str(locate(loaded.data, field, loaded.lines, file=str(path)))

    if loaded.config.llm is not None:
        problems = [
            LocatedError(locate(loaded.data, ("llm", name), loaded.lines, file=str(path)), msg)
            for name, msg in llm_problems(loaded.config.llm)
        ]
        raise_errors(problems, str(path), error=WorkflowError)
    warnings = config_warnings(loaded.config, data=loaded.data, lines=loaded.lines, file=str(path))
    outside = store_warning(loaded.config.store, path.parent, where("store", "path"))
    warnings += [outside] if outside is not None else []
    warnings += llm_findings(
        loaded.config.llm, trust, {f: where("llm", f) for f in ("api_key_env", "base_url")}
    )
    return FileCheck("config", loaded.config, warnings)


def parse_mqtt(value: str | MqttSettings) -> MqttSettings:
    """``HOST:PORT`` (or ``HOST``, port 1883) as :class:`MqttSettings`.

    Raises:
        WorkflowError: not ``HOST[:PORT]`` with a port 1-65535.

    Example:
        >>> parse_mqtt("localhost:1884").port
        1884
    """
    if isinstance(value, MqttSettings):
        return value
    host, sep, port = str(value).rpartition(":")
    if not sep:
        host, port = str(value), "1883"
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise WorkflowError(f"--mqtt expects HOST:PORT (port 1-65535), got {value!r}")
    return MqttSettings(host=host, port=int(port))


# ---------------------------------------------------------------------------- running
def _prepare_any(workflow: str | Path | Workflow) -> PreparedWorkflow:
    if isinstance(workflow, Workflow):
        return prepare_workflow(workflow)
    return prepare_workflow(load_workflow(workflow))


async def arun_workflow(
    workflow: str | Path | Workflow,
    *,
    store_dir: str | Path | None = None,
    mqtt: str | MqttSettings | None = None,
    progress: ProgressCallback | None = None,
    trust: FileTrust | None = None,
    strict: bool = False,
    append: bool = False,
) -> WorkflowReport:
    """Async twin of :func:`run_workflow`."""
    prepared = _prepare_any(workflow)
    trust = FileTrust.from_env() if trust is None else trust
    refused = llm_findings(prepared.llm, trust, prepared.llm_where)
    if refused:  # before anything is written or sent
        raise WorkflowError("\n".join(refused))
    warnings = prepared.warnings if store_dir is None else []
    if strict and warnings:
        count = len(warnings)
        raise WorkflowError(
            "\n".join([*warnings, f"{count} warning{'s' if count > 1 else ''} (strict)"])
        )
    for warning in warnings:
        log.warning("%s", warning)
    settings = parse_mqtt(mqtt) if mqtt is not None else None
    runner = WorkflowRunner(
        prepared, store_dir=store_dir, mqtt=settings, progress=progress, trust=trust, append=append
    )
    return await runner.run()


def run_workflow(
    workflow: str | Path | Workflow,
    *,
    store_dir: str | Path | None = None,
    mqtt: str | MqttSettings | None = None,
    progress: ProgressCallback | None = None,
    trust: FileTrust | None = None,
    strict: bool = False,
    append: bool = False,
) -> WorkflowReport:
    """Validate and run a workflow; return its report.

    A rerun on the same store is idempotent: the messages, runs and stated facts of its
    steps have ids derived from the workflow and the step, and what the store already
    holds is kept, not appended again (a persistent agent ends with the same messages
    after one run or five). ``append=True`` makes the run a new one, appended.

    Args:
        workflow: a workflow file (YAML or JSON) or a :class:`Workflow`.
        store_dir: folder of the SQLite store (``memory.db``). Default: the store the
            memory config names, else the user's data folder
            (:func:`~marsys_mem.config.models.default_store_path`, ``$MARSYS_MEM_HOME``),
            in a namespace named after the workflow (its ``name``, else the file's stem;
            an unnamed :class:`Workflow` built in Python: one derived from its content,
            see :func:`~marsys_mem.workflow.runner.workflow_namespace`); never next to
            the workflow file.
        mqtt: ``HOST:PORT`` or :class:`MqttSettings`: share facts through this broker
            instead of the workflow's transport.
        progress: ``progress(done, total, label)`` after each step.
        trust: what the user allows files (default: :meth:`FileTrust.from_env`): a file's
            ``llm:`` naming another key variable than the provider's, or sending a key
            to another server than the provider's own API, is refused unless allowed
            (a :class:`Workflow` built in Python is trusted code).
        strict: the workflow's warnings (a store path outside the file's folder, ...)
            are errors: nothing runs.
        append: a new run on the store, its messages appended to what earlier runs of
            the workflow left (default: a rerun appends nothing the store holds).

    Works inside a running event loop too (Jupyter): the workflow then runs on a
    worker thread.

    Raises:
        WorkflowError: the workflow is invalid, refused by the trust boundary, or has
            warnings with ``strict`` (nothing was written or sent).
        MarsysMemError: running it failed (a store or transport error).
    """
    coro = arun_workflow(
        workflow,
        store_dir=store_dir,
        mqtt=mqtt,
        progress=progress,
        trust=trust,
        strict=strict,
        append=append,
    )
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    ctx = contextvars.copy_context()
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="marsys-workflow") as pool:
        return pool.submit(ctx.run, asyncio.run, coro).result()
