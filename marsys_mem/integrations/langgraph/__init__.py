"""LangGraph adapters (the ``langgraph`` extra): a checkpointer that stores each message once.

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

__all__ = [
    "CheckpointerSettings",
    "MarsysCheckpointer",
    "thread_name",
]
