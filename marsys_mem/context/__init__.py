"""Context windows: token counting, policies, the trimming strategies, summaries, composition.

Imports only the layers below it (display, model). ``build_context`` turns a message history
into the bounded window an LLM is sent; ``ConversationMemory.context`` is the usual way in,
through the seam :func:`build_window` / :func:`abuild_window` (a :class:`HistoryIndex`, a
cached :class:`SummaryState`, a :class:`WindowBuild` back).

Modules: ``tokens`` (counters), ``policy`` (:class:`ContextPolicy`, :class:`ContextWindow`),
``window`` (the builder), ``summarize`` (the offline summariser), ``compose`` (memory blocks
plus the conversation window, under one budget), ``blocks`` (how a memory block renders
stored text: quoted data, provenance outside it).
"""

from marsys_mem.context.blocks import BlockItem, BlockRole, parse_block
from marsys_mem.context.compose import Block, BudgetSplit, ContextSource, aassemble, assemble
from marsys_mem.context.policy import ContextPolicy, ContextWindow, StartOn, Strategy, Summarizer
from marsys_mem.context.summarize import ExtractiveSummarizer
from marsys_mem.context.tokens import (
    CallableCounter,
    HeuristicCounter,
    TiktokenCounter,
    TokenCounter,
    count_message,
    get_counter,
)
from marsys_mem.context.window import (
    HistoryIndex,
    SummaryState,
    WindowBuild,
    abuild_context,
    abuild_window,
    build_context,
    build_window,
    latest_before,
)

__all__ = [
    "Block",
    "BlockItem",
    "BlockRole",
    "BudgetSplit",
    "CallableCounter",
    "ContextPolicy",
    "ContextSource",
    "ContextWindow",
    "ExtractiveSummarizer",
    "HeuristicCounter",
    "HistoryIndex",
    "StartOn",
    "Strategy",
    "Summarizer",
    "SummaryState",
    "TiktokenCounter",
    "TokenCounter",
    "WindowBuild",
    "aassemble",
    "abuild_context",
    "abuild_window",
    "assemble",
    "build_context",
    "build_window",
    "count_message",
    "get_counter",
    "latest_before",
    "parse_block",
]
