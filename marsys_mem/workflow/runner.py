"""Playing a validated workflow against real memory (see :mod:`marsys_mem.workflow`).

:class:`WorkflowRunner` owns one :class:`~marsys_mem.MemoryManager` (the store the run
uses), one :class:`~marsys_mem.coordination.BranchGraph` and one
:class:`~marsys_mem.coordination.Coordinator` (in-process broker of its own, or MQTT). It
plays the steps in order and builds the :class:`~marsys_mem.workflow.report.WorkflowReport`.
With an ``llm:`` (the workflow's, else its memory config's) it also owns the model adapter
(:func:`~marsys_mem.llm.factory.make_llm`): ``ask`` steps call it, and the manager's fact
extraction (``extractor: llm``) uses it; it is closed when the run ends.

Reruns are idempotent: every message a step writes has an id derived from the store
namespace, the workflow's name, the step (its place in the file, its repeat iteration and
its fields) and the agent, and every run an id derived from the agent, its branch and how
many runs it had before; a message the agent's memory already holds (a persistent agent
rerun on the same store) is not appended again, it counts as the run's own, and a run's
snapshot replaces the earlier one of the same id. Facts stated by a ``facts`` step carry
such an id as their source and are not restated either. ``append=True`` (``marsys-mem run
--append``) mixes a fresh tag into every id: the rerun is a new run, appended.

Facts shared during the run are also written to a SQLite store under the reserved agent
name ``#facts`` (one key per branch, one system message per fact with the fact's JSON in
``metadata["fact"]``), so ``marsys-mem inspect`` can show them later. A fact that lost a
conflict on its topic there (a merge's ``conflict`` rule kept another) also carries
``metadata["lost_to"]`` (:data:`LOST_TO`: the winner's id, text, agent and branch), so
``marsys-mem search`` and ``inspect`` say so. They are a record:
the facts agents receive live in the manager's shared pool, in process.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from marsys_mem.config.models import MemoryConfig, StoreConfig, default_store_path
from marsys_mem.config.sourcemap import format_path
from marsys_mem.conversation import ConversationMemory
from marsys_mem.coordination import (
    BranchGraph,
    Coordinator,
    EnvelopeSigner,
    InProcessBroker,
    InProcessTransport,
    MqttTransport,
    Transport,
)
from marsys_mem.exceptions import LLMError, MarsysMemError, WorkflowRunError
from marsys_mem.llm.base import LLM
from marsys_mem.llm.factory import make_llm
from marsys_mem.llm.trust import FileTrust
from marsys_mem.manager import MemoryManager
from marsys_mem.model.facts import SharedFact
from marsys_mem.model.messages import AgentCall, Message, ToolCall
from marsys_mem.model.names import MAX_NAME_LENGTH, inbox_key, is_name
from marsys_mem.model.runs import RunContext
from marsys_mem.patterns.user_facts import FactCandidate, FactMemory
from marsys_mem.retrieval.embeddings import INSTALL_HINT, Embedder, default_embedder
from marsys_mem.store.base import Key
from marsys_mem.store.keys import FACTS_AGENT, facts_key
from marsys_mem.workflow.evidence import best_evidence, gather_evidence
from marsys_mem.workflow.models import MqttSettings, MqttTransportSpec, Workflow
from marsys_mem.workflow.plan import PlannedStep, PreparedWorkflow
from marsys_mem.workflow.report import (
    AskReport,
    BranchReport,
    FactRecord,
    FactsReport,
    HitReport,
    KindTiming,
    LearnedFact,
    MemoryReport,
    MergeReport,
    SlowStep,
    SubjectFacts,
    Timings,
    WindowReport,
    WorkflowReport,
    clip,
)

__all__ = [
    "FACTS_AGENT",
    "LOST_TO",
    "ProgressCallback",
    "WorkflowRunner",
    "shared_default_embedder",
    "workflow_namespace",
]

LOST_TO = "lost_to"
"""The metadata key of a recorded fact that lost a conflict on its branch (the winner)."""

ProgressCallback = Callable[[int, int, str], None]
"""``progress(done, total, label)``: ``done`` steps of ``total`` are finished; ``label``
says what runs now (called when a step starts, when it waits for embeddings, and when
it ends)."""

log = logging.getLogger("marsys_mem.workflow")

_NOT_IN_NAME = re.compile(r"[/+#@\x00-\x1f\x7f-\x9f\ud800-\udfff]")


_EMBEDDER: dict[str, Embedder | None] = {}


def shared_default_embedder() -> Embedder | None:
    """The packaged embedder, created once per process (``None`` without the extra).

    Every workflow run of the process shares it, so the model loads once.
    """
    if "default" not in _EMBEDDER:
        _EMBEDDER["default"] = default_embedder()
    return _EMBEDDER["default"]


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
        # no store anywhere: the user's data folder (as a policy file without a path),
        # never next to the workflow file, namespaced by the workflow
        path = default_store_path().resolve()
        namespace = workflow_namespace(prepared.workflow)
        store = StoreConfig(backend="sqlite", path=path, namespace=namespace)
        return config.model_copy(update={"store": store})
    store = StoreConfig(backend="sqlite", path=path, namespace=config.store.namespace)
    return config.model_copy(update={"store": store})  # keeps the config's source


def workflow_namespace(workflow: Workflow) -> str:
    """The store namespace of a workflow run whose workflow names no store.

    The workflow's ``name`` when it sets one, else the file's stem; characters a name may
    not hold become ``_``. A :class:`Workflow` built in Python without a name gets a
    namespace derived from its content (``workflow-`` and 12 hex digits of a hash of its
    fields): the same workflow reruns in the same namespace (idempotent), and unrelated
    unnamed workflows never share one, so their messages and facts never mix.

    Example:
        >>> workflow_namespace(Workflow.model_validate({"name": "team/a", "agents": ["a"]}))
        'team_a'
        >>> a, b = (Workflow.model_validate({"agents": [x]}) for x in ("a", "b"))
        >>> workflow_namespace(a) == workflow_namespace(a.model_copy()) != workflow_namespace(b)
        True
        >>> workflow_namespace(a).startswith("workflow-")
        True
    """
    name = workflow.name
    if "name" not in workflow.model_fields_set:
        if workflow.source is not None:
            name = workflow.source.stem
        else:
            digest = hashlib.sha256(workflow.model_dump_json().encode()).hexdigest()
            return f"workflow-{digest[:12]}"
    name = _NOT_IN_NAME.sub("_", name)[:MAX_NAME_LENGTH]
    return name if is_name(name) else "workflow"


def _invalid_response(model: str, exc: Exception) -> str:
    """The error of a call whose response could not be read."""
    return f"{model}: the response could not be read ({type(exc).__name__}: {clip(str(exc), 300)})"


def _usage(raw: object) -> dict[str, int]:
    """The token counts of a response's usage (nested details left out)."""
    if not isinstance(raw, Mapping):
        return {}
    return {
        str(k): v
        for k, v in raw.items()
        if isinstance(v, int) and not isinstance(v, bool) and v >= 0
    }


def _items(message: Message) -> int:
    return sum(1 for line in message.text.splitlines() if line.startswith("- "))


class WorkflowRunner:
    """Runs one :class:`~marsys_mem.workflow.PreparedWorkflow` once.

    Args:
        prepared: the checked workflow (:func:`~marsys_mem.workflow.prepare_workflow`).
        store_dir: folder for ``memory.db`` (overrides the config's store).
        mqtt: broker settings (override the workflow's transport).
        progress: ``progress(done, total, label)`` after each step.
        trust: what the user allows a file's ``llm:`` (default: the user-level
            :meth:`~marsys_mem.llm.trust.FileTrust.from_env`).
        append: a new run whatever the store holds (fresh message and run ids);
            default: a rerun on the same store appends nothing it already holds.

    Example:
        >>> from marsys_mem.workflow import Workflow, prepare_workflow
        >>> wf = Workflow.model_validate({
        ...     "memory": {"store": {"backend": "memory"}},
        ...     "agents": ["a"], "steps": [{"say": {"agent": "a", "text": "hi"}}]})
        >>> report = asyncio.run(WorkflowRunner(prepare_workflow(wf)).run())
        >>> report.memory("a").messages
        1
    """

    def __init__(
        self,
        prepared: PreparedWorkflow,
        *,
        store_dir: str | Path | None = None,
        mqtt: MqttSettings | None = None,
        progress: ProgressCallback | None = None,
        trust: FileTrust | None = None,
        append: bool = False,
    ) -> None:
        self.prepared = prepared
        self.trust = trust
        self.append = append
        self._tag = uuid.uuid4().hex if append else ""  # mixed into every stable id
        self._runs_started: dict[tuple[str, str], int] = {}
        self._written: dict[str, dict[str, Message]] = {}  # run id -> what it wrote before
        self._replayed = 0
        self.workflow = prepared.workflow
        self.config = _store_config(prepared, store_dir)
        transport = self.workflow.transport
        self.mqtt = mqtt or (transport.mqtt if isinstance(transport, MqttTransportSpec) else None)
        self.progress = progress
        self.system = {a.name: a.system for a in self.workflow.agents if a.system}
        self.namespace = self.config.store.namespace
        if self.mqtt is not None and self.mqtt.namespace:
            self.namespace = self.mqtt.namespace
        self.notices: list[str] = []
        self.retrieval = self._retrieval()
        self.graph = BranchGraph()
        self.manager: MemoryManager | None = None
        self.coord: Coordinator | None = None
        self._prompted: dict[tuple[str, str], ConversationMemory] = {}
        self._implicit: dict[tuple[str, str], tuple[Any, RunContext]] = {}
        self._explicit: list[tuple[str, str, RunContext]] = []
        self._fact_log: list[tuple[str, SharedFact]] = []
        self._unsaved: list[tuple[str, SharedFact]] = []
        self._facts: list[FactRecord] = []
        self._shared_facts: list[SharedFact] = []
        self._merges: list[MergeReport] = []
        self._asks: list[AskReport] = []
        self._fact_checks: list[FactsReport] = []
        self._facts_used = any(
            self.config.policy_for(a.name).patterns.learns_facts for a in self.workflow.agents
        )
        self.llm_config = prepared.llm
        self.llm: LLM | None = None
        self._started = datetime.now(UTC)
        self._timings: list[tuple[PlannedStep, float]] = []
        self._done = 0
        self._sessions = 1

    # ------------------------------------------------------------------ setup
    def _retrieval(self) -> str:
        agents = [a.name for a in self.workflow.agents]
        spellings = {
            p.patterns.embedder
            for p in (self.config.policy_for(a) for a in agents)
            if p.patterns.any
        }
        if not spellings:
            return "none (no agent enables rag, episodic or hierarchical patterns)"
        parts = []
        if "default" in spellings:
            emb = shared_default_embedder()
            if emb is None:
                notice = (
                    "the embeddings extra is not installed: retrieval is BM25-only "
                    f"({INSTALL_HINT})"
                )
                log.warning("marsys-mem: %s", notice)
                self.notices.append(notice)
                parts.append("BM25 only")
            else:
                parts.append(f"{emb.name.split(':', 1)[-1]} embeddings + BM25")
        if "hashing" in spellings:
            parts.append("hashing embedder (not semantic) + BM25")
        if "none" in spellings:
            parts.append("BM25 only (embedder: none)")
        return "; ".join(parts)

    def _new_manager(self) -> MemoryManager:
        # share the loaded model between the runs of this process
        return MemoryManager(self.config, embedder=_EMBEDDER.get("default"), llm=self.llm)

    def _transport(self) -> Transport:
        m = self.mqtt
        if m is None:
            return InProcessTransport(InProcessBroker(), namespace=self.namespace)
        return MqttTransport(
            m.host,
            m.port,
            self.namespace,
            client_id=m.client_id or f"marsys-wf-{uuid.uuid4().hex[:16]}",
            username=m.username,
            password=m.password,
            tls=m.tls or None,
            clean_session=True,
            protocol=m.protocol,
            connect_timeout=m.connect_timeout,
            signing_key=(EnvelopeSigner.from_env(m.signing_key_env) if m.signing_key_env else None),
        )

    def _transport_name(self) -> str:
        m = self.mqtt
        if m is None:
            return "inprocess"
        return f"mqtt://{m.host}:{m.port} (namespace {self.namespace})"

    # ------------------------------------------------------------------ stable ids
    def _stable_id(self, prefix: str, *parts: str) -> str:
        """An id derived from the namespace, the workflow, the run's tag and ``parts``.

        The same on every rerun of the same workflow on the same store (unless
        ``append``), so what a step wrote is recognised instead of appended again.
        """
        text = "\x1f".join((self.namespace, self.workflow.name, self._tag, *parts))
        return f"{prefix}_{hashlib.sha256(text.encode()).hexdigest()[:32]}"

    def _step_id(self, p: PlannedStep, agent: str, branch: str, part: str) -> str:
        """The id of one message a step writes: its place, iteration, fields and agent."""
        fields = p.step.model_dump_json()
        where = format_path(p.path) + (f"#{p.iteration}" if p.iteration else "")
        return self._stable_id("wf", where, fields, agent, branch, part)

    def _new_run_id(self, agent: str, branch: str) -> str:
        """The id of the agent's next run on ``branch`` (its count so far, made stable).

        The messages an earlier run of that id wrote (its saved snapshot) are kept aside:
        a rerun never writes them again, even those deleted since (trimmed by
        ``trim_oldest``, expired, forgotten).
        """
        count = self._runs_started.get((agent, branch), 0) + 1
        self._runs_started[(agent, branch)] = count
        run_id = self._stable_id("run", agent, branch, str(count))
        earlier = self._manager.load_run(run_id)
        if earlier is not None:
            self._written[run_id] = {m.message_id: m for m in earlier.messages}
        return run_id

    @property
    def _manager(self) -> MemoryManager:
        assert self.manager is not None
        return self.manager

    @property
    def _coord(self) -> Coordinator:
        assert self.coord is not None
        return self.coord

    # ------------------------------------------------------------------ memories and runs
    def _mem(self, agent: str, branch: str) -> ConversationMemory:
        """The agent's memory on the branch; a new one starts with its system prompt.

        The prompt is the new memory's *initial* message (configuration, not something
        the run appended), so merges that summarise a branch's new messages skip it.
        """
        slot = (agent, branch)
        known = self._prompted.get(slot)
        if known is not None:  # forgotten whenever the manager may drop memories
            return known
        manager = self._manager
        current = {(a, b): m for a, b, m in manager.memories()}.get(slot)
        prompt = self.system.get(agent)
        if current is None and prompt:
            policy = manager.policy(agent)
            key = manager.key(agent, branch)
            if not policy.is_persistent or manager.store.count_messages(key) == 0:
                mem = ConversationMemory(
                    [Message.system(prompt)],
                    policy=policy.context,
                    counter=manager.counter,
                    summarizer=manager.summarizer,
                    events=manager.events,
                    agent=agent,
                )
                manager.attach_memory(agent, branch, mem)
                self._prompted[slot] = mem
                return mem
        mem = current if current is not None else manager.memory(agent, branch)
        if prompt and not any(m.role == "system" and m.text == prompt for m in mem):
            mem.add(Message.system(prompt))
        self._prompted[slot] = mem
        return mem

    def _run_for(self, agent: str, branch: str) -> RunContext:
        for a, b, ctx in reversed(self._explicit):
            if (a, b) == (agent, branch):
                return ctx
        found = self._implicit.get((agent, branch))
        if found is None:
            self._mem(agent, branch)
            run_id = self._new_run_id(agent, branch)
            scope = self._manager.run(agent, branch=branch, run_id=run_id)
            found = (scope, scope.__enter__())
            self._implicit[(agent, branch)] = found
        return found[1]

    def _add(self, agent: str, branch: str, *messages: Message) -> None:
        """Add ``messages`` through the agent's run; one written before is not added again.

        A rerun on the same store finds a persistent agent's messages there (their ids are
        stable), or in the snapshot of the earlier run of the same id when they have been
        deleted since (trimmed, expired, forgotten: never brought back): each counts as
        this run's message, and nothing is appended.
        """
        mem = self._mem(agent, branch)
        run = self._run_for(agent, branch)
        earlier = self._written.get(run.run_id, {})
        for message in messages:
            held = mem.get(message.message_id) or earlier.get(message.message_id)
            if held is None:
                run.add(message)
            else:
                run.record(held)
                self._replayed += 1

    def _end_run(self, agent: str, branch: str, error: BaseException | None = None) -> None:
        found = self._implicit.pop((agent, branch), None)
        if found is not None:
            scope = found[0]
            try:
                scope.__exit__(type(error) if error else None, error, None)
            finally:
                self._ran(agent, branch)

    def _ran(self, agent: str, branch: str) -> None:
        """A run ended: a single_run memory may be gone (found again on next use)."""
        self._prompted.pop((agent, branch), None)

    def _end_runs(self, error: BaseException | None = None) -> None:
        for agent, branch in list(self._implicit):
            self._end_run(agent, branch, error)

    # ------------------------------------------------------------------ facts
    def _record_fact(self, fact: SharedFact, routed_to: str, scope: str) -> None:
        self._facts.append(FactRecord.of_fact(fact, routed_to, []))
        self._shared_facts.append(fact)
        self._unsaved.append((routed_to, fact))

    def _reach(self) -> list[FactRecord]:
        """The fact records, each with ``reached`` and ``lost_to``.

        ``reached``: the inboxes that hold the fact now; ``lost_to``: the fact that won a
        conflict on its topic where it was routed (:meth:`_lost_to`).
        """
        holders: dict[str, list[tuple[str, str]]] = {}
        for branch in self.graph.branches:
            for agent in self.graph.agents(branch):
                for f in self._manager.shared.facts_for(inbox_key(agent, branch)):
                    holders.setdefault(f.id, []).append((agent, branch))
        out = []
        for record, fact in zip(self._facts, self._shared_facts, strict=True):
            if record.merged_from is not None:
                branches = {record.routed_to}
            else:
                branches = set(
                    self.graph.branches_in_scope(record.routed_to, record.scope)  # type: ignore[arg-type]
                )
            reached = [f"{a}@{b}" for a, b in holders.get(fact.id, []) if b in branches]
            winner = self._lost_to(record.routed_to, fact)
            lost_to = None if winner is None else FactRecord.of_fact(winner, record.routed_to)
            out.append(record.model_copy(update={"reached": reached, "lost_to": lost_to}))
        return out

    def _lost_to(self, branch: str, fact: SharedFact) -> SharedFact | None:
        """The fact ``fact`` lost to on ``branch``: a conflict on its topic kept the other.

        Lost: no agent of ``branch`` holds it while one holds another fact on its topic
        (a merge's ``conflict`` rule, or the pool's, chose that one).
        """
        topic = fact.metadata.get("topic")
        if topic is None or branch not in self.graph:
            return None
        shared = self._manager.shared
        inboxes = [inbox_key(a, branch) for a in self.graph.agents(branch)]
        if not inboxes or any(shared.has(box, fact.id) for box in inboxes):
            return None
        for box in inboxes:
            for other in shared.facts_for(box):
                if other.id != fact.id and other.metadata.get("topic") == topic:
                    return other
        return None

    def _persist_facts(self) -> None:
        """Write the facts shared so far to a durable store (``#facts`` keys)."""
        pending, self._unsaved = self._unsaved, []
        if not pending or not self.config.store.is_durable or self.manager is None:
            return
        store = self.manager.store
        by_branch: dict[str, list[SharedFact]] = {}
        for branch, fact in pending:
            by_branch.setdefault(branch, []).append(fact)
        for branch, facts in by_branch.items():
            key: Key = facts_key(self.namespace, branch)  # agent: FACTS_AGENT
            have = {m.message_id for m in store.load_messages(key)}
            new: list[Message] = []
            for f in facts:
                mid = f"fact_{f.id}"
                if mid in have:
                    continue
                have.add(mid)
                metadata: dict[str, Any] = {"fact": f.model_dump(mode="json")}
                winner = self._lost_to(branch, f)
                if winner is not None:
                    metadata[LOST_TO] = {
                        "id": winner.id,
                        "text": winner.text,
                        "agent": winner.source_agent,
                        "branch": winner.source_branch,
                    }
                new.append(
                    Message.system(f.text, message_id=mid, name=f.source_agent, metadata=metadata)
                )
            if new:
                store.append_messages(key, new)

    # ------------------------------------------------------------------ run
    async def run(self) -> WorkflowReport:
        """Play every step; return the report.

        Raises:
            WorkflowRunError: a step failed (the message names its file, line and step).
            MarsysMemError: the store or the transport failed.
        """
        start = time.perf_counter()
        self._started = datetime.now(UTC)
        error: BaseException | None = None
        if self.llm_config is not None:
            # LLMError: its SDK or key is missing, or a file's llm: is not allowed
            self.llm = make_llm(self.llm_config, trust=self.trust)
        try:
            self.manager = self._new_manager()
        except BaseException:
            await self._close_llm()
            raise
        try:
            self.coord = Coordinator(
                self.graph,
                self.manager,
                self._transport(),
                settings=self.manager.config.coordination,
            )
            await self.coord.__aenter__()
            try:
                self._initial()
                setup = time.perf_counter()
                for planned in self.prepared.plan:
                    await self._step(planned)
                steps_end = time.perf_counter()
                report = await self._report(start, setup, steps_end)
                self._end_runs()
                self._persist_facts()
                return report
            except BaseException as exc:
                error = exc
                raise
            finally:
                self._end_runs(error)
                await self._coord.close()
        finally:
            if error is not None:
                try:
                    self._persist_facts()
                except MarsysMemError:
                    log.exception("could not record the shared facts")
            try:
                self._manager.close()
            finally:
                await self._close_llm()

    async def _close_llm(self) -> None:
        aclose = getattr(self.llm, "aclose", None)
        if aclose is not None:
            await aclose()

    def _initial(self) -> None:
        coord = self._coord
        for name, parent, agents in self.prepared.initial:
            if parent is None:
                self.graph.add_branch(name, agents=agents)
            else:
                for agent in self.graph.agents(parent):
                    self._mem(agent, parent)
                coord.fork(parent, name, agents=agents)
            for agent in agents:
                self._mem(agent, name)

    def _tell(self, label: str) -> None:
        if self.progress is not None:
            self.progress(self._done, self.prepared.count, label)

    async def _step(self, p: PlannedStep) -> None:
        began = time.perf_counter()
        if p.kind != "run":
            self._tell(p.label())
        try:
            await self._play(p)
        except WorkflowRunError:
            raise
        except (MarsysMemError, ValueError, TypeError, KeyError) as exc:
            raise WorkflowRunError(f"{self._where(p)} ({p.label()}): {exc}") from exc
        if p.kind != "run":
            self._timings.append((p, time.perf_counter() - began))
        self._done += 1
        self._tell(p.label())

    def _where(self, p: PlannedStep) -> str:
        where = str(self.workflow.locate(p.path))
        return where + (f" (repeat iteration {p.iteration})" if p.iteration else "")

    async def _play(self, p: PlannedStep) -> None:
        s = p.step
        kind = p.kind
        if kind == "say":
            factory = {
                "user": Message.user,
                "assistant": Message.assistant,
                "system": Message.system,
            }[s.role]
            branch = p.branches["agent"]
            extra: dict[str, Any] = {"pinned": s.pinned} if s.pinned else {}
            if s.name:
                extra["name"] = s.name
            extra["message_id"] = self._step_id(p, s.agent, branch, "said")
            self._add(s.agent, branch, factory(s.text, **extra))
        elif kind == "tool":
            branch = p.branches["agent"]
            call_id = s.call_id or "call_" + self._step_id(p, s.agent, branch, "call")[3:27]
            call = ToolCall(id=call_id, name=s.name, arguments=s.arguments)
            result = (
                s.result if isinstance(s.result, str) else json.dumps(s.result, ensure_ascii=False)
            )
            self._add(
                s.agent,
                branch,
                Message.assistant(
                    s.text,
                    tool_calls=[call],
                    message_id=self._step_id(p, s.agent, branch, "tool_call"),
                ),
                Message.tool(
                    result,
                    tool_call_id=call.id,
                    name=s.name,
                    message_id=self._step_id(p, s.agent, branch, "tool_result"),
                ),
            )
        elif kind == "call_agent":
            caller, callee = p.branches["caller"], p.branches["callee"]
            call_msg = Message.assistant(
                None,
                agent_calls=[AgentCall(agent=s.callee, request=s.request)],
                message_id=self._step_id(p, s.caller, caller, "request"),
            )
            self._add(
                s.caller,
                caller,
                call_msg,
                Message.agent_response(
                    s.response,
                    name=s.callee,
                    message_id=self._step_id(p, s.caller, caller, "response"),
                ),
            )
            self._add(
                s.callee,
                callee,
                Message.agent_call(
                    s.request,
                    name=s.caller,
                    message_id=self._step_id(p, s.callee, callee, "request"),
                ),
                Message.assistant(
                    s.response, message_id=self._step_id(p, s.callee, callee, "response")
                ),
            )
        elif kind == "share":
            branch = p.branches["agent"]
            self._mem(s.agent, branch)
            fact = await self._coord.share(
                s.agent,
                s.fact,
                branch=branch,
                scope=s.scope,
                confidence=s.confidence,
                metadata={"topic": s.topic} if s.topic else None,
            )
            self._record_fact(fact, branch, s.scope)
        elif kind == "fork":
            for agent in self.graph.agents(s.parent):
                self._mem(agent, s.parent)
            info = self._coord.fork(s.parent, s.child, agents=s.agents)
            for agent in info.agents:
                self._mem(agent, s.child)
        elif kind == "merge":
            for agent in self.graph.agents(s.child):
                self._mem(agent, s.child)
            for agent in self.graph.agents(s.into):
                self._mem(agent, s.into)
            merged = await self._coord.merge(
                s.child, s.into, strategy=s.strategy, conflict=s.conflict
            )
            for fact in merged.facts:
                self._record_fact(fact, s.into, "branch")
            self._merges.append(
                MergeReport(
                    child=s.child,
                    into=s.into,
                    strategy=s.strategy,
                    conflict=s.conflict,
                    facts=len(merged.facts),
                    messages=merged.messages,
                    summary=merged.summary,
                )
            )
        elif kind == "end_run":
            self._end_run(s.agent, p.branches["agent"])
        elif kind == "end_session":
            await self._end_session(restart=s.restart)
        elif kind == "run":
            await self._run_block(p)
        elif kind == "ask":
            await self._ask(p)
        elif kind == "facts":
            await self._facts_step(p)
        else:  # pragma: no cover - repeats are expanded by the planner
            raise AssertionError(f"unexpected step kind {kind!r}")

    async def _run_block(self, p: PlannedStep) -> None:
        agent, branch = p.step.agent, p.branches["agent"]
        self._end_run(agent, branch)  # the block is a run of its own
        self._mem(agent, branch)
        run_id = self._new_run_id(agent, branch)
        async with self._manager.run(agent, branch=branch, run_id=run_id) as ctx:
            self._explicit.append((agent, branch, ctx))
            try:
                for child in p.children:
                    await self._step(child)
            finally:
                self._explicit.pop()
        self._ran(agent, branch)

    async def _end_session(self, *, restart: bool) -> None:
        self._end_runs()
        self._manager.end_session()
        self._prompted.clear()
        self._sessions += 1
        if not restart:
            return
        self._persist_facts()
        await self._coord.close()
        self._manager.close()
        self.graph = BranchGraph.from_dict(self.graph.to_dict())
        self.manager = self._new_manager()
        self.coord = Coordinator(
            self.graph,
            self.manager,
            self._transport(),
            settings=self.manager.config.coordination,
        )
        await self.coord.__aenter__()

    # ------------------------------------------------------------------ ask
    async def _ask(self, p: PlannedStep) -> None:
        s = p.step
        agent, branch = s.agent, p.branches["agent"]
        manager = self._manager
        self._mem(agent, branch)
        if self.llm is not None:  # a real turn: the question is part of the conversation
            question_id = self._step_id(p, agent, branch, "question")
            self._add(agent, branch, Message.user(s.question, message_id=question_id))
        hits = []
        patterns = manager.patterns(agent, branch)
        if patterns is not None:
            self._tell(f"{p.label()}: embedding (the first time also loads the model)")
            await asyncio.to_thread(patterns.flush)  # embeddings done: deterministic hits
            seen: set[str] = set()
            for h in patterns.search_all(s.question):  # RAG and episodic may both find one
                if h.message.message_id not in seen:
                    seen.add(h.message.message_id)
                    hits.append(h)
        win = await manager.acontext_for(agent, query=s.question, branch=branch)
        call: dict[str, Any] = {}
        if self.llm is not None:
            answer_id = self._step_id(p, agent, branch, "answer")
            answer, source, call = await self._call_model(agent, branch, s.question, win, answer_id)
        else:
            facts = manager.shared.facts_for(inbox_key(agent, branch))
            candidates = gather_evidence(facts, hits, win.messages)
            embedder = self._answer_embedder(agent)
            answer, source = await asyncio.to_thread(
                best_evidence, s.question, candidates, embedder
            )
            if answer is None and hits:
                answer, source = hits[0].message.text, f"retrieved {hits[0].message.role} message"
        # expect: in the answer (none: all missing); expect_sent: in the window sent
        said = answer.casefold() if answer is not None else None
        found = [e for e in s.expect if said is not None and e.casefold() in said]
        missing = [e for e in s.expect if e not in found]
        sent = "\n".join(m.text for m in win.messages).casefold()
        found_sent = [e for e in s.expect_sent if e.casefold() in sent]
        missing_sent = [e for e in s.expect_sent if e not in found_sent]
        blocks = {m.metadata.get("block"): m for m in win.messages if m.metadata.get("block")}
        line = self.workflow.locate(p.path).line
        self._asks.append(
            AskReport(
                step=format_path(p.path) + (f" #{p.iteration}" if p.iteration else ""),
                line=line,
                agent=agent,
                branch=branch,
                question=s.question,
                answer=answer,
                answer_source=source,
                context_messages=len(win.messages),
                context_tokens=win.tokens,
                facts=_items(blocks["shared_facts"]) if "shared_facts" in blocks else 0,
                user_facts=_items(blocks["user_facts"]) if "user_facts" in blocks else 0,
                retrieved=_items(blocks["retrieval"]) if "retrieval" in blocks else 0,
                hits=[
                    HitReport(
                        rank=i,
                        score=round(h.score, 4),
                        role=h.message.role,
                        text=clip(h.message.text, 300),
                    )
                    for i, h in enumerate(hits, 1)
                ],
                expect=list(s.expect),
                found=found,
                missing=missing,
                expect_sent=list(s.expect_sent),
                found_sent=found_sent,
                missing_sent=missing_sent,
                **call,
                ok=not missing and not missing_sent and call.get("error") is None,
            )
        )

    def _model_name(self) -> str | None:
        cfg = self.llm_config
        return f"{cfg.provider}:{cfg.model}" if cfg is not None else None

    async def _call_model(
        self, agent: str, branch: str, question: str, win: Any, answer_id: str
    ) -> tuple[str | None, str | None, dict[str, Any]]:
        """Send the window to the model; record its answer and the call in the run's trace.

        Returns the answer, its source and the call's report fields (``error`` when the
        call failed: the window's question stays in memory, no answer is recorded). The
        answer is recorded as message ``answer_id``; on a rerun that finds it in memory,
        the model is asked again and its new answer reported, the first one kept.
        """
        llm = self.llm
        assert llm is not None
        name = self._model_name() or "llm"
        run = self._run_for(agent, branch)
        arguments = {"question": question, "messages": len(win.messages), "tokens": win.tokens}
        started = datetime.now(UTC)
        began = time.perf_counter()
        reply: Message | None = None
        text: str | None
        try:
            areply = getattr(llm, "areply", None)
            if areply is not None:
                reply = await areply(win.messages)
                text = reply.text
            else:
                text = await llm.acomplete(win.messages)
        except (MarsysMemError, ValueError) as exc:
            # LLMError: HTTP status, timeout, connection; a response that is not JSON
            # (ValueError) or not a message (MessageFormatError): the call failed too
            error = str(exc) if isinstance(exc, LLMError) else _invalid_response(name, exc)
            ms = (time.perf_counter() - began) * 1000.0
            run.record_step(
                "llm",
                name,
                duration_ms=ms,
                arguments=arguments,
                error=error,
                started_at=started,
            )
            return None, None, {"model": name, "duration_ms": round(ms, 3), "error": error}
        ms = (time.perf_counter() - began) * 1000.0
        usage = _usage(reply.metadata.get("usage") if reply is not None else None)
        run.record_step(
            "llm",
            name,
            duration_ms=ms,
            arguments=arguments,
            result=clip(text or "", 2000),
            usage=usage,
            started_at=started,
        )
        answer = reply if reply is not None else Message.assistant(text or "")
        self._add(agent, branch, answer.model_copy(update={"message_id": answer_id}))
        fields = {"model": name, "duration_ms": round(ms, 3), "usage": usage}
        return text, f"model {name}", fields

    # ------------------------------------------------------------------ facts
    def _fact_memory(self, agent: str | None) -> FactMemory:
        """The manager's fact memory (made with the agent's, or the first learner's, embedder)."""
        spelling = self.config.defaults.patterns.embedder
        names = [agent] if agent is not None else [a.name for a in self.workflow.agents]
        for name in names:
            patterns = self.config.policy_for(name).patterns
            if agent is not None or patterns.learns_facts:
                spelling = patterns.embedder
                break
        return self._manager.fact_memory(spelling)

    def _subject(self, subject: str | None, agent: str | None) -> str:
        if subject is not None:
            return subject
        if agent is not None:
            facts = self.config.policy_for(agent).patterns.facts
            if facts is not None:
                return facts.subject
        return "user"

    def _wait_for_extraction(self) -> None:
        manager = self._manager
        for agent, branch, _mem in manager.memories():
            patterns = manager.patterns(agent, branch)
            if patterns is not None and patterns.extraction is not None:
                patterns.flush()

    async def _facts_step(self, p: PlannedStep) -> None:
        s = p.step
        self._facts_used = True
        if s.agent is not None:
            self._mem(s.agent, p.branches["agent"])
        await asyncio.to_thread(self._wait_for_extraction)
        memory = self._fact_memory(s.agent)
        subject = self._subject(s.subject, s.agent)
        added: list[str] = []
        if s.add:
            # a fact this step stated in an earlier run of the workflow is not restated
            stated = {
                sid for f in memory.facts(subject, include_invalid=True) for sid in f.source_ids
            }
            candidates = [
                FactCandidate(
                    text=f.text,
                    category=f.category,
                    slot=f.slot,
                    confidence=f.confidence,
                    source_ids=(source,),
                )
                for i, f in enumerate(s.add)
                if (source := self._step_id(p, subject, "facts", str(i))) not in stated
            ]
            changes = await asyncio.to_thread(memory.add_many, candidates, subject)
            added = [f"{c.action}: {c.fact.text}" for c in changes]
        known = memory.facts(subject)
        hits = []
        if s.query is not None:
            found = await asyncio.to_thread(memory.search, s.query, s.k, None, subject=subject)
            hits = [
                HitReport(rank=h.rank, score=round(h.score, 4), role="fact", text=clip(h.text, 300))
                for h in found
            ]
        haystack = "\n".join(f.text for f in known).casefold()
        present = [e for e in s.expect if e.casefold() in haystack]
        missing = [e for e in s.expect if e not in present]
        self._fact_checks.append(
            FactsReport(
                step=format_path(p.path) + (f" #{p.iteration}" if p.iteration else ""),
                line=self.workflow.locate(p.path).line,
                subject=subject,
                added=added,
                known=[LearnedFact.of_fact(f) for f in known],
                query=s.query,
                hits=hits,
                expect=list(s.expect),
                found=present,
                missing=missing,
                ok=not missing,
            )
        )

    def _learned(self) -> list[SubjectFacts]:
        """The facts added, restated or superseded since the run started, per subject."""
        if not self._facts_used:
            return []
        memory = self._fact_memory(None)
        since = self._started
        out = []
        for subject in memory.subjects():
            facts = []
            for f in memory.facts(subject, include_invalid=True):
                touched = (f.created_at, f.reinforced_at, f.invalid_at or f.created_at)
                if max(touched) < since:
                    continue
                replaced = None
                if f.superseded_by is not None:
                    try:
                        replaced = memory.get(f.superseded_by).text
                    except MarsysMemError:
                        replaced = None
                facts.append(LearnedFact.of_fact(f, replaced))
            if facts:
                out.append(SubjectFacts(subject=subject, facts=facts))
        return out

    def _answer_embedder(self, agent: str) -> Embedder | None:
        """The embedder to rank answers by meaning: the agent's, if it is semantic."""
        patterns = self.config.policy_for(agent).patterns
        if patterns.any and patterns.embedder == "default":
            return shared_default_embedder()
        return None

    # ------------------------------------------------------------------ report
    async def _report(self, start: float, setup: float, steps_end: float) -> WorkflowReport:
        manager = self._manager
        await asyncio.to_thread(manager.flush)
        learned = await asyncio.to_thread(self._learned)
        memories: list[MemoryReport] = []
        seen: set[tuple[str, str]] = set()
        slots = [(a, b) for b in self.graph.branches for a in self.graph.agents(b)]
        slots += [(a, b) for a, b, _m in manager.memories() if (a, b) not in slots]
        for agent, branch in slots:
            if (agent, branch) in seen or agent.startswith("#"):
                continue
            seen.add((agent, branch))
            memories.append(await self._memory_report(agent, branch))
        branches = []
        merges = self.graph.merges()
        for name in self.graph.branches:
            info = self.graph.info(name)
            branches.append(
                BranchReport(
                    name=name,
                    parent=info.parent,
                    agents=list(info.agents),
                    status=info.status,
                    merged_into=[into for child, into in merges if child == name],
                )
            )
        end = time.perf_counter()
        store = self.config.store
        return WorkflowReport(
            name=self.workflow.name,
            description=self.workflow.description,
            source=str(self.workflow.source) if self.workflow.source else None,
            store=str(store.resolved_path(self.config.base_dir))
            if store.backend == "sqlite"
            else None,
            namespace=self.namespace,
            transport=self._transport_name(),
            retrieval=self.retrieval,
            steps=self._done,
            sessions=self._sessions,
            branches=branches,
            memories=memories,
            facts=self._reach(),
            merges=list(self._merges),
            asks=list(self._asks),
            fact_checks=list(self._fact_checks),
            subject_facts=learned,
            llm=self._model_name(),
            timings=self._timing_report(start, setup, steps_end, end),
            notices=list(self.notices),
            replayed=self._replayed,
            ok=all(a.ok for a in self._asks) and all(c.ok for c in self._fact_checks),
        )

    async def _memory_report(self, agent: str, branch: str) -> MemoryReport:
        manager = self._manager
        mem = self._mem(agent, branch)
        policy = manager.policy(agent)
        stored = None
        if policy.is_persistent and self.config.store.is_durable:
            stored = manager.store.count_messages(manager.key(agent, branch))
        facts = [
            FactRecord.of_fact(f, branch if f.metadata.get("merged_from") else f.source_branch, [])
            for f in manager.shared.facts_for(inbox_key(agent, branch))
        ]
        window = None
        error = None
        try:
            win = await manager.acontext_for(agent, branch=branch)
        except MarsysMemError as exc:
            error = str(exc)
        else:
            window = WindowReport.of_window(win, mem.policy)
        return MemoryReport(
            agent=agent,
            branch=branch,
            retention=policy.retention,
            messages=len(mem),
            stored=stored,
            window=window,
            window_error=error,
            facts=facts,
        )

    def _timing_report(self, start: float, setup: float, steps_end: float, end: float) -> Timings:
        by_kind: dict[str, list[float]] = {}
        for p, seconds in self._timings:
            by_kind.setdefault(p.kind, []).append(seconds)
        slowest = sorted(self._timings, key=lambda t: -t[1])[:3]
        return Timings(
            total_s=round(end - start, 4),
            setup_s=round(setup - start, 4),
            steps_s=round(steps_end - setup, 4),
            finish_s=round(end - steps_end, 4),
            by_kind=[
                KindTiming(kind=k, count=len(v), seconds=round(sum(v), 4))
                for k, v in by_kind.items()
            ],
            slowest=[
                SlowStep(step=format_path(p.path), label=p.label(), seconds=round(sec, 4))
                for p, sec in slowest
            ],
        )
