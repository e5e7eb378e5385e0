"""LangGraph adapters (the ``langgraph`` extra): a checkpointer that stores each message once.

Also a long-term store with hybrid search (:class:`MarsysStore`), and a ``pre_model_hook``
that gives an agent a bounded context window (:func:`marsys_context_hook`).

Example:
    >>> from marsys_mem.integrations.langgraph import MarsysCheckpointer
    >>> from marsys_mem.store import InMemoryStore
    >>> saver = MarsysCheckpointer(InMemoryStore())
    >>> saver.get_tuple({"configurable": {"thread_id": "t1"}}) is None
    True
"""

from marsys_mem.integrations.langgraph.checkpointer import (
    CheckpointerSettings,
    MarsysCheckpointer,
    thread_name,
)
from marsys_mem.integrations.langgraph.hooks import (
    amarsys_context_hook,
    from_langchain,
    marsys_context_hook,
    marsys_window,
)
from marsys_mem.integrations.langgraph.store import MarsysStore

__all__ = [
    "CheckpointerSettings",
    "MarsysCheckpointer",
    "MarsysStore",
    "amarsys_context_hook",
    "from_langchain",
    "marsys_context_hook",
    "marsys_window",
    "thread_name",
]
