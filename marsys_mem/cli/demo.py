"""``marsys-mem demo``: the bundled workflow, and one conversation under three strategies.

``marsys-mem demo`` (:func:`workflow_demo`) runs :data:`DEMO_WORKFLOW` (shipped in
``marsys_mem/data/``; the same file as ``examples/workflows/research_team.yaml``) on a
temporary store and prints its report, then the planner's actual context window (what it
would send its LLM), the facts that lost a merge conflict and why, and commands that find
something in a kept store. The embedding model is loaded first and its load time printed
on its own line, so the workflow's timings are the steps' own. ``marsys-mem demo
--windows`` builds one travel-planning conversation (:func:`build_demo_memory`) and prints
the context window each strategy sends under one token budget (:func:`windows_demo`).
"""

from __future__ import annotations

import contextlib
import shlex
import tempfile
import time
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from marsys_mem.cli.output import Output, progress_bar
from marsys_mem.context import ContextPolicy, ContextWindow
from marsys_mem.conversation import ConversationMemory
from marsys_mem.model.messages import Message, ToolCall
from marsys_mem.workflow import WorkflowReport, load_workflow, run_workflow
from marsys_mem.workflow.runner import shared_default_embedder

__all__ = [
    "DEMO_WORKFLOW",
    "SEARCH_HINT",
    "build_demo_memory",
    "demo_workflow_path",
    "lost_conflicts",
    "windows_demo",
    "workflow_demo",
]

DEMO_WORKFLOW = "research_team.yaml"
"""The workflow ``marsys-mem demo`` runs (shipped in ``marsys_mem/data/``; the same file
as ``examples/workflows/research_team.yaml``)."""

_CITIES = ["Tokyo", "Paris", "Lima", "Oslo", "Cairo", "Perth", "Quito", "Seoul"]


def demo_workflow_path() -> Traversable:
    """The bundled demo workflow (an ``importlib.resources`` traversable).

    Example:
        >>> demo_workflow_path().name
        'research_team.yaml'
    """
    return resources.files("marsys_mem").joinpath("data", DEMO_WORKFLOW)


def build_demo_memory(turns: int = 40) -> ConversationMemory:
    """A travel-planning conversation with ``turns`` user turns, half of them tool calls.

    Example:
        >>> len(build_demo_memory(2))  # system, goal, 2 turns (the first with a tool call)
        8
    """
    mem = ConversationMemory(agent="planner")
    mem.add(Message.system("You are a travel planner. Answer briefly and cite tool results."))
    mem.add(Message.user("Goal: plan a 10-day trip under 4000 EUR.", pinned=True))
    for i in range(turns):
        city = _CITIES[i % len(_CITIES)]
        week = i % 52 + 1  # the week asked about is the week the tool is called with
        mem.add(Message.user(f"What is the weather like in {city} in week {week}?"))
        if i % 2 == 0:
            call = ToolCall(id=f"call_{i}", name="weather", arguments={"city": city, "week": week})
            mem.add(Message.assistant(None, tool_calls=[call]))
            mem.add(
                Message.tool(
                    f"{city}: {15 + i % 12}C, light wind", tool_call_id=call.id, name="weather"
                )
            )
        mem.add(
            Message.assistant(
                f"{city} should be mild then, around {15 + i % 12}C; pack a light jacket. "
                f"Flights from Berlin to {city} cost about {180 + 7 * i} EUR."
            )
        )
    return mem


def _print_window(out: Output, title: str, win: ContextWindow) -> None:
    out.print(
        f"\n== {title}: {len(win)} messages, {win.tokens} tokens "
        f"(history {win.history_messages} messages, {win.history_tokens} tokens; "
        f"saved {win.tokens_saved} tokens, dropped {win.dropped})",
        "bold cyan",
    )
    for m in win.messages:
        label = "summary" if m is win.summary else m.role
        flag = " [pinned]" if m.pinned else ""
        body = m.text or ", ".join(f"{c.name}({c.arguments})" for c in m.tool_calls)
        body = " ".join(body.split())
        out.print(f"  {label:>9}{flag}: {body[:96]}{'...' if len(body) > 96 else ''}")


def windows_demo(out: Output, max_tokens: int, turns: int) -> None:
    """One conversation, three context strategies, one budget (``demo --windows``)."""
    out.print(f"marsys-mem demo: a {turns}-turn agent conversation under max_tokens={max_tokens}")
    mem = build_demo_memory(turns)
    _print_window(
        out,
        "sliding_window (a view: the history stays whole)",
        mem.context(ContextPolicy(max_tokens=max_tokens)),
    )
    _print_window(
        out,
        "summarize (older turns folded into one summary message)",
        mem.context(ContextPolicy(max_tokens=max_tokens, strategy="summarize", keep_recent=6)),
    )
    trimmed = mem.fork()
    win = trimmed.context(ContextPolicy(max_tokens=max_tokens, strategy="trim_oldest"))
    _print_window(out, "trim_oldest (destructive: the dropped turns are deleted)", win)
    out.print(
        f"\nafter trim_oldest the fork holds {len(trimmed)} messages; "
        f"the original still holds {len(mem)}."
    )
    out.print(
        "Invariants: system + pinned kept, tool calls never split from results, "
        "every window fits its budget."
    )


SEARCH_HINT = (
    "marsys-mem run examples/workflows/support_assistant.yaml --store DIR2 -q; "
    "marsys-mem search DIR2 'contact email'"
)
"""What the demo suggests for ``search``: the demo's agents keep session memory only (no
messages reach the store), so searching its store finds nothing; this workflow's
assistant is persistent."""

_CLIP = 110


def _clip(text: str, limit: int = _CLIP) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _load_model(out: Output) -> None:
    """Load the packaged embedding model now, and say how long it took (once per process)."""
    started = time.perf_counter()
    embedder = shared_default_embedder()
    if embedder is None:
        out.print("embedding model: none (embeddings extra not installed), retrieval is BM25 only")
        return
    embedder.embed(["warm up"])  # the first call loads the model
    out.print(
        f"loading the embedding model ({embedder.name}): "
        f"{time.perf_counter() - started:.1f} s, once per process "
        "(not part of the workflow timings below)\n"
    )


def _print_agent_window(out: Output, report: WorkflowReport, agent: str, branch: str) -> None:
    """The window ``agent`` would send its LLM now, one clipped line per message."""
    mem = report.memory(agent, branch)
    win = mem.window
    if win is None:
        return
    limit = f"/{win.max_tokens}" if win.max_tokens is not None else ""
    out.print(
        f"\n== What {agent}@{branch} sends its LLM now: {win.messages} messages, "
        f"{win.tokens}{limit} tokens ({win.strategy}; history {win.history_messages} "
        f"messages, {win.history_tokens} tokens)",
        "bold cyan",
    )
    for m in win.preview:
        label = m.role if m.part == "message" else f"{m.role} [{m.part}]"
        out.print(f"   {label:>22}: {_clip(m.text)}")


def lost_conflicts(report: WorkflowReport) -> list[str]:
    """One line per fact that lost a conflict on its topic: the rival that won, and why.

    A fact merged into a branch conflicts with a fact there on the same ``topic``; the
    merge's ``conflict`` rule (``confidence``: the higher wins; ``newest``: the later wins)
    decides. The run says which fact lost to which (:attr:`FactRecord.lost_to
    <marsys_mem.workflow.report.FactRecord.lost_to>`, the same record ``marsys-mem search``
    reads from the store).

    Example:
        >>> from marsys_mem.workflow.report import FactRecord, MergeReport, Timings
        >>> def fact(text, conf, agent, merged_from=None, reached=(), lost_to=None):
        ...     return FactRecord(text=text, source_agent=agent, source_branch=agent,
        ...         scope="branch", routed_to="main", confidence=conf, topic="size",
        ...         merged_from=merged_from, reached=list(reached), lost_to=lost_to)
        >>> won = fact("61k a year", 0.9, "a", "a", ["planner@main"])
        >>> report = WorkflowReport(name="w", transport="inprocess", retrieval="bm25",
        ...     steps=2, timings=Timings(total_s=0, setup_s=0, steps_s=0, finish_s=0),
        ...     merges=[MergeReport(child="b", into="main", strategy="facts",
        ...                         conflict="confidence")],
        ...     facts=[won, fact("45k a year", 0.5, "b", "b", lost_to=won)])
        >>> print(lost_conflicts(report)[0])
        b@b: '45k a year' (confidence 0.5) lost to a@a: '61k a year' (confidence 0.9) \
on topic 'size': the b -> main merge keeps the higher confidence
    """
    rules = {(m.child, m.into): m.conflict for m in report.merges}  # the last merge of a pair wins
    lines = []
    for lost in report.facts:
        winner = lost.lost_to
        if winner is None:
            continue
        if lost.merged_from is not None:
            rule = rules.get((lost.merged_from, lost.routed_to), "newest")
            why = {
                "confidence": "keeps the higher confidence",
                "newest": "keeps the newer fact",
            }.get(rule, f"resolves conflicts by {rule}")
            how = f"the {lost.merged_from} -> {lost.routed_to} merge {why}"
        else:
            how = f"on branch {lost.routed_to}"
        lines.append(
            f"{lost.provenance}: {_clip(lost.text, 60)!r} (confidence {lost.confidence:g}) "
            f"lost to {winner.provenance}: {_clip(winner.text, 60)!r} "
            f"(confidence {winner.confidence:g}) on topic {lost.topic!r}: {how}"
        )
    return lines


def workflow_demo(
    out: Output, *, store: str | None = None, mqtt: str | None = None, as_json: bool = False
) -> int:
    """Run the bundled workflow and print what it shows (``marsys-mem demo``).

    Returns the exit code: 0, or 1 when a question's ``expect`` was not found.
    """
    started = time.perf_counter()
    kept = store
    if not as_json:
        out.print(
            f"marsys-mem demo: running the bundled workflow {DEMO_WORKFLOW} "
            "(also in examples/workflows/)\n"
        )
        _load_model(out)
    with contextlib.ExitStack() as stack:
        path = Path(stack.enter_context(resources.as_file(demo_workflow_path())))
        if store is None:
            store = stack.enter_context(tempfile.TemporaryDirectory(prefix="marsys-mem-demo-"))
        wf = load_workflow(path)
        with progress_bar(f"running {wf.name}", not as_json) as callback:
            report = run_workflow(wf, store_dir=store, mqtt=mqtt, progress=callback)
    if as_json:
        print(report.to_json(), file=out.stream)
        return 0 if report.ok else 1
    out.report(report.to_text())
    _print_agent_window(out, report, "planner", "main")
    lost = lost_conflicts(report)
    if lost:
        out.print(f"\n== Conflicts lost in merges ({len(lost)})", "bold cyan")
        for line in lost:
            out.print(f"   {line}")
    facts = len(report.facts)
    inspect = (
        f"Its store is kept: marsys-mem inspect {shlex.quote(kept)}"
        if kept is not None
        else "Keep its store with --store DIR, then: marsys-mem inspect DIR"
    )
    out.print(
        f"\ndemo finished in {time.perf_counter() - started:.1f} s. {inspect} (its {facts} "
        "shared facts; its agents keep session memory only, so no messages are stored). "
        f"To search stored messages: {SEARCH_HINT}"
    )
    return 0 if report.ok else 1
