"""Context windows: token counting, policies, the trimming strategies, summaries, composition.

Imports only the model layer. ``build_context`` turns a message history into the bounded
window an LLM is sent; ``ConversationMemory.context`` is the usual way in.
"""

from marsys_mem.context.summarize import ExtractiveSummarizer
from marsys_mem.context.tokens import HeuristicCounter, TokenCounter, count_message, get_counter
from marsys_mem.context.window import (
    ContextPolicy,
    ContextWindow,
    Strategy,
    Summarizer,
    abuild_context,
    build_context,
)

__all__ = [
    "ContextPolicy",
    "ContextWindow",
    "ExtractiveSummarizer",
    "HeuristicCounter",
    "Strategy",
    "Summarizer",
    "TokenCounter",
    "abuild_context",
    "build_context",
    "count_message",
    "get_counter",
]
