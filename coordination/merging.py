"""Merging a branch's memories into another branch (the ``summary`` and ``messages`` strategies).

:meth:`~marsys_mem.coordination.Coordinator.merge` always re-shares the child's facts on
the target branch; with ``strategy="summary"`` or ``"messages"`` it also brings the
child's conversation work over, which is done here:

* ``summary``: the messages the child's agents added since the fork (system prompts left
  out: they are instructions, not findings) are summarised into one system message
  (``name="merge_summary"``, ``metadata["merged_from"]``) appended to the memory of every
  agent of the target branch: a memory block (:func:`~marsys_mem.context.blocks.render_lines`),
  each line of the summary one quoted item under a header saying it is recalled data. Its
  id is derived from the branches and the summary, so the same merge again (a workflow
  rerun on a persistent store) adds nothing an agent already holds.
* ``messages``: each child agent's new messages are appended to the same agent's memory
  on the target branch (messages it already has are skipped); an agent that is not on
  the target branch joins it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from marsys_mem.callables import acall
from marsys_mem.context.blocks import render_lines
from marsys_mem.context.summarize import ExtractiveSummarizer
from marsys_mem.coordination.graph import BranchGraph, MergeStrategy
from marsys_mem.model.messages import Message

if TYPE_CHECKING:
    from marsys_mem.manager import MemoryManager

__all__ = ["merge_memories"]


async def merge_memories(
    manager: MemoryManager,
    graph: BranchGraph,
    child: str,
    into: str,
    strategy: MergeStrategy,
    summarizer: Callable[[list[Message]], Any] | None = None,
) -> tuple[int, str | None]:
    """Bring ``child``'s new messages into ``into`` by ``strategy``.

    Args:
        manager: the agents' memories.
        graph: the branch graph (``messages`` adds agents to ``into``).
        child: the branch merged.
        into: the branch merged into.
        strategy: ``"summary"`` or ``"messages"`` (``"facts"`` does nothing here).
        summarizer: ``list[Message] -> str``, sync or async; default: the manager's, else
            :class:`~marsys_mem.context.summarize.ExtractiveSummarizer`.

    Returns:
        ``(messages appended to the target's memories, the summary or None)``.

    Raises:
        TypeError: the summarizer returned something other than a string.
    """
    count = 0
    summary: str | None = None
    if strategy == "facts":
        return count, summary
    new = {a: manager.memory(a, child).appended() for a in graph.agents(child)}
    if strategy == "summary":
        messages = [m for msgs in new.values() for m in msgs if m.role != "system"]
        if messages:
            summarise = summarizer or manager.summarizer or ExtractiveSummarizer()
            result = await acall(summarise, messages)
            if not isinstance(result, str):
                raise TypeError(f"the summarizer returned {type(result).__name__}, not str")
            summary = result.strip()
        if summary:
            text = render_lines(f"Merged from branch {child}:", summary)
            digest = hashlib.sha256("\x1f".join((child, into, text)).encode()).hexdigest()
            note = Message.system(
                text,
                name="merge_summary",
                metadata={"merged_from": child},
                message_id=f"merge_{digest[:32]}",
            )
            for agent in graph.agents(into):
                target = manager.memory(agent, into)
                if note.message_id not in target:
                    target.add(note)
                    count += 1
        return count, summary
    for agent, msgs in new.items():
        target = manager.memory(agent, into)
        fresh = [m for m in msgs if m.message_id not in target]
        if fresh:
            target.add_many(fresh)
            count += len(fresh)
        if agent not in graph.agents(into):
            graph.add_agent(into, agent)
    return count, summary
