"""``marsys-mem demo``: the bundled workflow, and one conversation under three strategies.

``marsys-mem demo`` runs :data:`DEMO_WORKFLOW` (shipped in ``marsys_mem/data/``; the same
file as ``examples/workflows/research_team.yaml``) on a temporary store and prints its
report. ``marsys-mem demo --windows`` builds one travel-planning conversation
(:func:`build_demo_memory`) and prints the context window each strategy sends under one
token budget (:func:`windows_demo`).
"""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable

from marsys_mem.cli.output import Output
from marsys_mem.context import ContextPolicy, ContextWindow
from marsys_mem.conversation import ConversationMemory
from marsys_mem.model.messages import Message, ToolCall

__all__ = ["DEMO_WORKFLOW", "build_demo_memory", "demo_workflow_path", "windows_demo"]

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
        mem.add(Message.user(f"What is the weather like in {city} in week {i % 52 + 1}?"))
        if i % 2 == 0:
            call = ToolCall(id=f"call_{i}", name="weather", arguments={"city": city, "week": i})
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
