"""marsys-mem: memory for multi-agent LLM systems.

Typed, immutable conversation histories; bounded context windows that never split a tool
call from its results and always fit their budget; retention policies; shared facts.

The top level holds what the quickstart and the guides start from. Everything else has one
home in its subpackage: messages' parts, events and runs in :mod:`marsys_mem.model`; token
counters, summarisers and ``build_context`` in :mod:`marsys_mem.context`; embedders and
indexes in :mod:`marsys_mem.retrieval`; the memory patterns in :mod:`marsys_mem.patterns`;
branches and the coordinator in :mod:`marsys_mem.coordination`; every exception but the
base in :mod:`marsys_mem.exceptions`.

Example:
    >>> from marsys_mem import ConversationMemory, ContextPolicy, Message
    >>> mem = ConversationMemory([Message.system("You are terse.")])
    >>> _ = mem.add(Message.user("Hi"))
    >>> mem.context(ContextPolicy(max_tokens=100)).tokens <= 100
    True
"""

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:  # each loaded on first use (__getattr__)
    from marsys_mem.config.load import load_config
    from marsys_mem.config.models import (
        AgentConfig,
        MemoryConfig,
        RetentionPolicy,
        StoreConfig,
    )
    from marsys_mem.context.policy import ContextPolicy, ContextWindow
    from marsys_mem.context.tokens import HeuristicCounter
    from marsys_mem.conversation import ConversationMemory
    from marsys_mem.exceptions import MarsysMemError
    from marsys_mem.front import Memory
    from marsys_mem.manager import MemoryManager
    from marsys_mem.model.messages import Message, ToolCall
    from marsys_mem.store import InMemoryStore, MemoryStore, SQLiteStore
    from marsys_mem.workflow import (
        Workflow,
        WorkflowReport,
        arun_workflow,
        load_workflow,
        run_workflow,
    )

__version__ = "0.1.0"

# every top-level name and the module it lives in: ``import marsys_mem`` loads none of them
# (``marsys-mem --version`` stays fast, a lower layer loads no workflow or CLI code)
_LAZY = {
    "load_config": "marsys_mem.config.load",
    **dict.fromkeys(
        ("AgentConfig", "MemoryConfig", "RetentionPolicy", "StoreConfig"),
        "marsys_mem.config.models",
    ),
    "ContextPolicy": "marsys_mem.context.policy",
    "ContextWindow": "marsys_mem.context.policy",
    "HeuristicCounter": "marsys_mem.context.tokens",
    "ConversationMemory": "marsys_mem.conversation",
    "MarsysMemError": "marsys_mem.exceptions",
    "Memory": "marsys_mem.front",
    "MemoryManager": "marsys_mem.manager",
    "Message": "marsys_mem.model.messages",
    "ToolCall": "marsys_mem.model.messages",
    **dict.fromkeys(("InMemoryStore", "MemoryStore", "SQLiteStore"), "marsys_mem.store"),
    **dict.fromkeys(
        ("Workflow", "WorkflowReport", "arun_workflow", "load_workflow", "run_workflow"),
        "marsys_mem.workflow",
    ),
}


def __getattr__(name: str) -> _typing.Any:
    """The top-level names, each imported on first use (PEP 562).

    ``import marsys_mem.patterns`` or ``marsys_mem.coordination`` then loads no workflow
    or CLI code; ``from marsys_mem import run_workflow, Memory`` loads them.
    """
    if name in _LAZY:
        value = getattr(_importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'marsys_mem' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "AgentConfig",
    "ContextPolicy",
    "ContextWindow",
    "ConversationMemory",
    "HeuristicCounter",
    "InMemoryStore",
    "MarsysMemError",
    "Memory",
    "MemoryConfig",
    "MemoryManager",
    "MemoryStore",
    "Message",
    "RetentionPolicy",
    "SQLiteStore",
    "StoreConfig",
    "ToolCall",
    "Workflow",
    "WorkflowReport",
    "__version__",
    "arun_workflow",
    "load_config",
    "load_workflow",
    "run_workflow",
]
