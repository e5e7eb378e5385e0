"""What a workflow run did: memories, context windows, facts, answers and timings.

:func:`~marsys_mem.workflow.run_workflow` returns a :class:`WorkflowReport` (a pydantic
model): ``report.to_text()`` is the readable report the CLI prints, ``report.to_dict()`` /
``report.to_json()`` the same data for programs (``marsys-mem run --json``).
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field

from marsys_mem.display import report_html

if TYPE_CHECKING:
    from marsys_mem.context.policy import ContextPolicy, ContextWindow
    from marsys_mem.model.facts import SharedFact
    from marsys_mem.model.messages import Message
    from marsys_mem.patterns.user_facts import Fact

__all__ = [
    "AskReport",
    "BranchReport",
    "FactRecord",
    "FactsReport",
    "HitReport",
    "KindTiming",
    "LearnedFact",
    "MemoryReport",
    "MergeReport",
    "SlowStep",
    "SubjectFacts",
    "Timings",
    "WindowMessage",
    "WindowReport",
    "WorkflowReport",
    "clip",
    "describe",
]

WindowPart = Literal["message", "summary", "shared_facts", "user_facts", "core_memory", "retrieval"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


_BLOCK_PARTS = {"shared_facts", "user_facts", "core_memory", "retrieval"}


def clip(text: str, limit: int) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def describe(m: Message) -> str:
    """A one-line description of what a message without text does (its calls)."""
    if m.tool_calls:
        return "; ".join(f"{c.name}({json.dumps(c.arguments)})" for c in m.tool_calls)
    if m.agent_calls:
        return "; ".join(f"-> {c.agent}: {c.request}" for c in m.agent_calls)
    return ""


class FactRecord(_Model):
    """A fact shared (or merged) during the run, with its provenance.

    Example:
        >>> FactRecord(text="Q4 grew 12%", source_agent="r", source_branch="r1",
        ...            scope="lineage", routed_to="r1").provenance
        'r@r1'
    """

    text: str
    source_agent: str
    source_branch: str
    scope: str
    routed_to: str = Field(description="The branch the fact was shared on or merged into.")
    confidence: float = 1.0
    topic: str | None = None
    merged_from: str | None = None
    reached: list[str] = Field(default_factory=list, description="agent@branch in scope.")
    lost_to: FactRecord | None = Field(
        default=None,
        description="The fact that won a conflict on its topic on routed_to (a merge's "
        "conflict rule kept it): this one reached nobody there.",
    )

    @property
    def provenance(self) -> str:
        """``agent@branch`` of whoever shared it."""
        return f"{self.source_agent}@{self.source_branch}"

    @classmethod
    def of_fact(cls, fact: SharedFact, routed_to: str, reached: Iterable[str] = ()) -> FactRecord:
        """The record of ``fact``, shared on (or merged into) ``routed_to``."""
        topic = fact.metadata.get("topic")
        merged = fact.metadata.get("merged_from")
        return cls(
            text=fact.text,
            source_agent=fact.source_agent,
            source_branch=fact.source_branch,
            scope="branch" if merged else fact.scope,
            routed_to=routed_to,
            confidence=fact.confidence,
            topic=str(topic) if topic is not None else None,
            merged_from=str(merged) if merged is not None else None,
            reached=list(reached),
        )


class WindowMessage(_Model):
    """One message of a context window, shortened for reading.

    Example:
        >>> WindowMessage(role="user", text="hi").part
        'message'
    """

    role: str
    text: str
    part: WindowPart = "message"
    name: str | None = None
    pinned: bool = False


class WindowReport(_Model):
    """The context window an agent would send: its size, what was dropped, the summary.

    Example:
        >>> WindowReport(messages=3, tokens=40, max_tokens=100, strategy="sliding_window",
        ...              dropped=0, history_messages=3, history_tokens=40).summary is None
        True
    """

    messages: int
    tokens: int
    max_tokens: int | None = None
    max_messages: int | None = None
    strategy: str
    dropped: int
    history_messages: int
    history_tokens: int
    summary: str | None = None
    preview: list[WindowMessage] = Field(default_factory=list)

    @classmethod
    def of_window(cls, win: ContextWindow, policy: ContextPolicy) -> WindowReport:
        """Report ``win``, built under ``policy``, with a preview of each message."""
        preview = []
        for m in win.messages:
            block = m.metadata.get("block")
            part: WindowPart = "message"
            if block in _BLOCK_PARTS:
                part = cast("WindowPart", block)
            elif win.summary is not None and m is win.summary:
                part = "summary"
            preview.append(
                WindowMessage(
                    role=m.role,
                    text=clip(m.text or describe(m), 160),
                    part=part,
                    name=m.name,
                    pinned=m.pinned,
                )
            )
        return cls(
            messages=len(win.messages),
            tokens=win.tokens,
            max_tokens=policy.max_tokens,
            max_messages=policy.max_messages,
            strategy=win.strategy,
            dropped=win.dropped,
            history_messages=win.history_messages,
            history_tokens=win.history_tokens,
            summary=win.summary.text if win.summary is not None else None,
            preview=preview,
        )


class MemoryReport(_Model):
    """One agent's memory on one branch at the end of the run.

    ``messages``: in the agent's memory now; ``stored``: in the store (persistent agents
    with a SQLite store, else ``None``); ``facts``: the facts it received.

    Example:
        >>> MemoryReport(agent="planner", branch="main", retention="session",
        ...              messages=2).key
        'planner@main'
    """

    agent: str
    branch: str
    retention: str
    messages: int
    stored: int | None = None
    window: WindowReport | None = None
    window_error: str | None = None
    facts: list[FactRecord] = Field(default_factory=list)

    @property
    def key(self) -> str:
        """``agent@branch``."""
        return f"{self.agent}@{self.branch}"


class HitReport(_Model):
    """A stored message the memory search found for a question (once, whichever pattern).

    ``score``: its calibrated relevance, the chance it is relevant (0-1), so several hits
    can be near 1 and the best match is not always hit 1.

    Example:
        >>> HitReport(rank=1, score=0.8, role="user", text="Order 4417").rank
        1
    """

    rank: int
    score: float
    role: str
    text: str


class AskReport(_Model):
    """The answer to an ``ask`` step: what the agent sent, and what answered it.

    Offline (no ``llm:``), ``answer`` is the piece of evidence (a fact, a retrieved
    message, a message of the window) that best matches the question (BM25, plus meaning
    when the agent has an embedder): the best match, not a composed answer. With an
    ``llm:``, ``answer`` is the model's (``model``: ``provider:model``; ``duration_ms`` and
    ``usage`` of the call); ``error`` says why a call failed (the answer is then ``None``).
    ``found`` / ``missing``: the ``expect`` strings present / absent in the answer (all
    missing when there is no answer); ``found_sent`` / ``missing_sent``: the
    ``expect_sent`` strings present / absent in what the agent sent. ``ok`` is true when
    none is missing and no call failed.

    Example:
        >>> AskReport(step="steps[3]", agent="a", branch="main", question="Q?",
        ...           context_messages=2, context_tokens=20, ok=True).ok
        True
    """

    step: str
    line: int | None = None
    agent: str
    branch: str
    question: str
    answer: str | None = None
    answer_source: str | None = None
    context_messages: int
    context_tokens: int
    facts: int = 0
    user_facts: int = Field(default=0, description="Facts in the window's user facts block.")
    retrieved: int = Field(default=0, description="Snippets in the window's retrieval block.")
    hits: list[HitReport] = Field(default_factory=list)
    expect: list[str] = Field(default_factory=list)
    found: list[str] = Field(default_factory=list)
    missing: list[str] = Field(default_factory=list)
    expect_sent: list[str] = Field(default_factory=list)
    found_sent: list[str] = Field(default_factory=list)
    missing_sent: list[str] = Field(default_factory=list)
    model: str | None = Field(default=None, description="provider:model when a model answered.")
    duration_ms: float | None = None
    usage: dict[str, int] = Field(default_factory=dict)
    error: str | None = Field(default=None, description="Why the model call failed.")
    ok: bool = True


class LearnedFact(_Model):
    """A fact about a subject, as the fact memory holds it at the end of the run.

    ``valid`` is false for a fact a later one superseded (``superseded_by``: its text).

    Example:
        >>> LearnedFact(text="User lives in Oslo", category="identity",
        ...             confidence=0.7).valid
        True
    """

    text: str
    category: str
    confidence: float
    slot: str | None = None
    reinforcements: int = 0
    valid: bool = True
    superseded_by: str | None = None

    @classmethod
    def of_fact(cls, fact: Fact, superseded_by: str | None = None) -> LearnedFact:
        """The report of ``fact`` (``superseded_by``: the text of the fact replacing it)."""
        return cls(
            text=fact.text,
            category=fact.category,
            confidence=round(fact.confidence, 4),
            slot=fact.slot,
            reinforcements=fact.reinforcements,
            valid=fact.is_valid,
            superseded_by=superseded_by,
        )


class SubjectFacts(_Model):
    """The facts about one subject learned (added, restated or superseded) during the run.

    Example:
        >>> SubjectFacts(subject="user").facts
        []
    """

    subject: str
    facts: list[LearnedFact] = Field(default_factory=list)


class FactsReport(_Model):
    """What a ``facts`` step found: the subject's facts, search hits, expectations.

    ``added``: what each stated fact did (``added``, ``reinforced`` or ``superseded``,
    then its text); ``known``: the subject's valid facts after the step; ``hits``: the
    search for ``query``, best first (score, text).

    Example:
        >>> FactsReport(step="steps[4]", subject="user", ok=True).known
        []
    """

    step: str
    line: int | None = None
    subject: str
    added: list[str] = Field(default_factory=list)
    known: list[LearnedFact] = Field(default_factory=list)
    query: str | None = None
    hits: list[HitReport] = Field(default_factory=list)
    expect: list[str] = Field(default_factory=list)
    found: list[str] = Field(default_factory=list)
    missing: list[str] = Field(default_factory=list)
    ok: bool = True


class MergeReport(_Model):
    """What one ``merge`` step brought into its target branch.

    Example:
        >>> MergeReport(child="r1", into="main", strategy="facts", conflict="newest").facts
        0
    """

    child: str
    into: str
    strategy: str
    conflict: str
    facts: int = 0
    messages: int = 0
    summary: str | None = None


class BranchReport(_Model):
    """A branch of the final graph.

    Example:
        >>> BranchReport(name="main", agents=["planner"], status="active").parent is None
        True
    """

    name: str
    parent: str | None = None
    agents: list[str] = Field(default_factory=list)
    status: str
    merged_into: list[str] = Field(default_factory=list)


class KindTiming(_Model):
    """Time spent in the steps of one kind.

    Example:
        >>> KindTiming(kind="say", count=3, seconds=0.001).count
        3
    """

    kind: str
    count: int
    seconds: float


class SlowStep(_Model):
    """One of the slowest steps.

    Example:
        >>> SlowStep(step="steps[4]", label="ask planner@main", seconds=1.5).seconds
        1.5
    """

    step: str
    label: str
    seconds: float


class Timings(_Model):
    """Wall-clock seconds: setup (store, transport), steps, finishing (report, flush).

    Example:
        >>> Timings(total_s=1.0, setup_s=0.1, steps_s=0.8, finish_s=0.1).total_s
        1.0
    """

    total_s: float
    setup_s: float
    steps_s: float
    finish_s: float
    by_kind: list[KindTiming] = Field(default_factory=list)
    slowest: list[SlowStep] = Field(default_factory=list)


class WorkflowReport(_Model):
    """Everything a workflow run produced, ready to read (``to_text``) or process.

    Example:
        >>> report = WorkflowReport(name="empty", transport="inprocess",
        ...                         retrieval="none", steps=0,
        ...                         timings=Timings(total_s=0, setup_s=0, steps_s=0, finish_s=0))
        >>> report.ok, report.to_dict()["name"]
        (True, 'empty')
    """

    name: str
    description: str = ""
    source: str | None = None
    store: str | None = Field(default=None, description="SQLite file, or None (in memory).")
    namespace: str = "default"
    transport: str
    retrieval: str = Field(description="How retrieval ran: the embedder, or BM25 only.")
    steps: int
    sessions: int = 1
    branches: list[BranchReport] = Field(default_factory=list)
    memories: list[MemoryReport] = Field(default_factory=list)
    facts: list[FactRecord] = Field(default_factory=list)
    merges: list[MergeReport] = Field(default_factory=list)
    asks: list[AskReport] = Field(default_factory=list)
    fact_checks: list[FactsReport] = Field(default_factory=list)
    subject_facts: list[SubjectFacts] = Field(
        default_factory=list, description="Facts learned during the run, per subject."
    )
    llm: str | None = Field(default=None, description="provider:model ask steps called.")
    timings: Timings
    notices: list[str] = Field(default_factory=list)
    replayed: int = Field(
        default=0,
        description=(
            "Messages the steps would write that an earlier run of this workflow wrote: not "
            "written again, even where deleted since (a rerun is idempotent)."
        ),
    )
    ok: bool = Field(
        default=True,
        description="Every ask and facts step found what it expected; no model call failed.",
    )

    def _repr_html_(self) -> str:
        return report_html(self)

    def memory(self, agent: str, branch: str = "main") -> MemoryReport:
        """The report of ``agent`` on ``branch``.

        Raises:
            KeyError: no such memory in the report.
        """
        for m in self.memories:
            if m.agent == agent and m.branch == branch:
                return m
        raise KeyError(f"no memory of {agent!r} on branch {branch!r} in this report")

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return self.model_dump(mode="json")

    def to_json(self, indent: int | None = 2) -> str:
        """The report as a JSON document."""
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False)

    def to_text(self, *, width: int = 100) -> str:
        """A readable report (what ``marsys-mem run`` prints)."""
        return "\n".join(_text_lines(self, width))


# ---------------------------------------------------------------------------- text
def _seconds(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _tree(branches: list[BranchReport]) -> list[tuple[str, BranchReport]]:
    by_parent: dict[str | None, list[BranchReport]] = {}
    names = {b.name for b in branches}
    for b in branches:
        parent = b.parent if b.parent in names else None
        by_parent.setdefault(parent, []).append(b)
    out: list[tuple[str, BranchReport]] = []

    def walk(parent: str | None, prefix: str) -> None:
        kids = by_parent.get(parent, [])
        for i, b in enumerate(kids):
            last = i == len(kids) - 1
            if parent is None:
                out.append(("", b))
                walk(b.name, "")
            else:
                out.append((prefix + ("└─ " if last else "├─ "), b))
                walk(b.name, prefix + ("   " if last else "│  "))

    walk(None, "")
    return out


def _text_lines(r: WorkflowReport, width: int) -> list[str]:
    lines = [f"== {r.name}"]
    if r.description:
        lines += textwrap.wrap(
            " ".join(r.description.split()), width, initial_indent="   ", subsequent_indent="   "
        )
    t = r.timings
    store = f"{r.store} (sqlite, namespace {r.namespace})" if r.store else "in memory"
    lines += [
        f"   store      {store}",
        f"   transport  {r.transport}",
        f"   retrieval  {r.retrieval}",
        *([f"   llm        {r.llm}"] if r.llm else []),
        f"   ran        {r.steps} steps, {r.sessions} session{'s' if r.sessions != 1 else ''}"
        f" in {_seconds(t.total_s)} (setup {_seconds(t.setup_s)}, steps {_seconds(t.steps_s)},"
        f" report {_seconds(t.finish_s)})",
    ]
    if r.replayed:
        lines.append(
            f"   rerun      {r.replayed} message{'s' if r.replayed != 1 else ''} written by an "
            "earlier run of this workflow: not written again (--append: a new run)"
        )
    for notice in r.notices:
        lines.append(f"   note       {notice}")

    if r.branches:
        lines += ["", "== Branches"]
        rows = _tree(r.branches)
        pad = max(len(prefix + b.name) for prefix, b in rows)
        for prefix, b in rows:
            status = b.status + (f" into {', '.join(b.merged_into)}" if b.merged_into else "")
            lines.append(
                f"   {(prefix + b.name).ljust(pad)}  {status:<22} {', '.join(b.agents) or '-'}"
            )

    if r.memories:
        lines += ["", "== Memories: what each agent would send to its LLM now"]
        keyw = max(12, *(len(m.key) for m in r.memories))
        lines.append(
            f"   {'agent@branch'.ljust(keyw)}  {'retention':<10} {'msgs':>5} {'stored':>6}"
            f"  {'window':>6} {'tokens':>11} {'dropped':>7} {'facts':>5}  strategy"
        )
        summaries = []
        for m in r.memories:
            stored = "-" if m.stored is None else str(m.stored)
            w = m.window
            if w is None:
                lines.append(
                    f"   {m.key.ljust(keyw)}  {m.retention:<10} {m.messages:>5} {stored:>6}"
                    f"  window error: {m.window_error}"
                )
                continue
            budget = f"{w.tokens}/{w.max_tokens}" if w.max_tokens else str(w.tokens)
            lines.append(
                f"   {m.key.ljust(keyw)}  {m.retention:<10} {m.messages:>5} {stored:>6}"
                f"  {w.messages:>6} {budget:>11} {w.dropped:>7} {len(m.facts):>5}  {w.strategy}"
            )
            if w.summary:
                summaries.append((m.key, w.summary))
        for key, summary in summaries:
            lines += textwrap.wrap(
                f"summary in {key}: {clip(summary, 3 * width)}",
                width,
                initial_indent="   ",
                subsequent_indent="      ",
            )

    if r.facts:
        lines += ["", f"== Facts shared ({len(r.facts)})"]
        for f in r.facts:
            extra = [f"confidence {f.confidence:g}"] if f.confidence != 1 else []
            if f.topic:
                extra.append(f"topic {f.topic}")
            how = (
                f"merged from {f.merged_from} into {f.routed_to}"
                if f.merged_from
                else (f"{f.scope} of {f.routed_to}")
            )
            lines.append(
                f"   {f.provenance} -> {how}: {clip(f.text, width - 30)}"
                + (f" ({', '.join(extra)})" if extra else "")
            )
            if f.reached:
                lines.append(f"      reached {clip(', '.join(f.reached), width - 14)}")
            if f.lost_to is not None:
                won = f.lost_to
                room = width - 24 - len(won.provenance)
                lines.append(f"      lost to {won.provenance}: {clip(won.text, room)}")

    if r.merges:
        lines += ["", "== Merges"]
        for mg in r.merges:
            lines.append(
                f"   {mg.child} -> {mg.into} ({mg.strategy}, conflicts: {mg.conflict}): "
                f"{mg.facts} fact{'s' if mg.facts != 1 else ''}, {mg.messages} message"
                f"{'s' if mg.messages != 1 else ''}"
            )
            if mg.summary:
                lines.append(f"      summary: {clip(mg.summary, width - 16)}")

    if r.asks:
        lines += ["", f"== Questions ({len(r.asks)})"]
        if any(a.hits for a in r.asks):
            lines += [
                "   (hit: a stored message the memory search found; relevance: the chance it is",
                "   relevant, 0-1, several can be near 1; best match: what answers best of the",
                "   hits, the window and the shared facts)",
            ]
        for a in r.asks:
            where = f"{a.step}" + (f", line {a.line}" if a.line else "")
            lines.append(f"   {a.agent}@{a.branch} [{where}]: {a.question}")
            if a.model is not None:
                if a.error is not None:
                    lines.append(f"      error:  {clip(a.error, 3 * width)}")
                else:
                    used = ", ".join(f"{k} {v}" for k, v in a.usage.items() if "tokens" in k)
                    took = _seconds((a.duration_ms or 0) / 1000)
                    lines.append(f"      answer: {clip(a.answer or '', width - 14)}")
                    used = f" ({used})" if used else ""
                    lines.append(f"      model:  {a.model} in {took}{used}")
            elif a.answer:
                src = f"  ({a.answer_source})" if a.answer_source else ""
                lines.append(f"      best match: {clip(a.answer, width - 18)}{src}")
            else:
                lines.append("      best match: (nothing in memory matches)")
            lines.append(
                f"      sent:   {a.context_messages} messages, {a.context_tokens} tokens "
                f"({a.facts} fact{'s' if a.facts != 1 else ''}, "
                + (f"{a.user_facts} user facts, " if a.user_facts else "")
                + f"{a.retrieved} retrieved)"
            )
            for h in a.hits[:3]:
                best = (
                    "  = best match"
                    if a.model is None and a.answer is not None and h.text == clip(a.answer, 300)
                    else ""
                )
                lines.append(
                    f"      hit {h.rank}:  relevance {h.score:.2f}  {h.role}: "
                    f"{clip(h.text, 60)}{best}"
                )
            if a.expect:
                marks = "  ".join(("✓ " if e in a.found else "✗ ") + repr(e) for e in a.expect)
                none = "" if a.answer is not None else "  (no answer)"
                lines.append(f"      expect: {marks}{none}")
            if a.expect_sent:
                marks = "  ".join(
                    ("✓ " if e in a.found_sent else "✗ ") + repr(e) for e in a.expect_sent
                )
                lines.append(f"      expect_sent: {marks}")

    if r.fact_checks:
        lines += ["", f"== Fact checks ({len(r.fact_checks)})"]
        for c in r.fact_checks:
            where = f"{c.step}" + (f", line {c.line}" if c.line else "")
            lines.append(f"   {c.subject} [{where}]: {len(c.known)} valid facts")
            for added in c.added:
                lines.append(f"      {clip(added, width - 6)}")
            if c.query:
                lines.append(f"      query: {clip(c.query, width - 13)}")
                for h in c.hits[:3]:
                    text = clip(h.text, 70)
                    lines.append(f"      hit {h.rank}:  relevance {h.score:.2f}  {text}")
            if c.expect:
                marks = "  ".join(("✓ " if e in c.found else "✗ ") + repr(e) for e in c.expect)
                lines.append(f"      expect: {marks}")

    if r.subject_facts:
        count = sum(len(s.facts) for s in r.subject_facts)
        lines += ["", f"== Facts learned ({count})"]
        for subject in r.subject_facts:
            lines.append(f"   {subject.subject}:")
            for lf in subject.facts:
                state = f"confidence {lf.confidence:g}" + (
                    f", restated {lf.reinforcements}x" if lf.reinforcements else ""
                )
                if not lf.valid:
                    state = "superseded" + (
                        f" by {clip(lf.superseded_by, 40)!r}" if lf.superseded_by else ""
                    )
                lines.append(f"      {clip(lf.text, width - 40)} ({lf.category}; {state})")

    if t.by_kind:
        lines += ["", "== Timings"]
        kinds = ", ".join(f"{k.kind} {k.count}x {_seconds(k.seconds)}" for k in t.by_kind)
        lines.append(f"   {clip(kinds, width - 3)}")
        if t.slowest:
            slow = ", ".join(f"{s.label} {_seconds(s.seconds)}" for s in t.slowest)
            lines.append(f"   slowest: {clip(slow, width - 12)}")
    failed = [a for a in r.asks if not a.ok]
    errors = [a for a in failed if a.error is not None]
    checks = [c for c in r.fact_checks if not c.ok]
    lines.append("")
    if failed or checks:
        parts = []
        if len(failed) > len(errors):
            parts.append(f"{len(failed) - len(errors)} question(s) did not find what they expected")
        if errors:
            parts.append(f"{len(errors)} model call(s) failed")
        if checks:
            parts.append(f"{len(checks)} facts step(s) did not find what they expected")
        lines.append("FAILED: " + "; ".join(parts))
    else:
        lines.append("ok")
    return lines
