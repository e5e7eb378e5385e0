"""marsys-mem: memory for multi-agent LLM systems.

Typed, immutable conversation histories; bounded context windows that never split a tool
call from its results and always fit their budget; retention policies; shared facts.

Example:
    >>> from marsys_mem import ConversationMemory, ContextPolicy, Message
    >>> mem = ConversationMemory([Message.system("You are terse.")])
    >>> _ = mem.add(Message.user("Hi"))
    >>> mem.context(ContextPolicy(max_tokens=100)).tokens <= 100
    True
"""

import importlib as _importlib
import typing as _typing

from marsys_mem.config.load import load_config
from marsys_mem.config.models import (
    AgentConfig,
    MemoryConfig,
    RetentionPolicy,
    StoreConfig,
    parse_duration,
)
from marsys_mem.context.policy import ContextPolicy, ContextWindow, Strategy, Summarizer
from marsys_mem.context.summarize import ExtractiveSummarizer
from marsys_mem.context.tokens import (
    CallableCounter,
    HeuristicCounter,
    TiktokenCounter,
    TokenCounter,
    count_message,
    get_counter,
)
from marsys_mem.context.window import abuild_context, build_context
from marsys_mem.conversation import ConversationMemory
from marsys_mem.exceptions import (
    ConfigError,
    ConflictError,
    ContextOverflowError,
    DuplicateMessageError,
    DuplicateToolCallError,
    EmbeddingError,
    IndexCorruptError,
    InvalidNameError,
    MarsysMemError,
    MessageFormatError,
    MessageNotFoundError,
    MissingDependencyError,
    OrphanToolResultError,
    StoreError,
    StoreNotFoundError,
    SummarizerError,
    ToolSequenceError,
    WorkflowError,
    WorkflowRunError,
)
from marsys_mem.manager import MemoryManager
from marsys_mem.model.events import (
    AddEvent,
    ClearEvent,
    EventBus,
    ForkEvent,
    MemoryEvent,
    RemoveEvent,
    SummarizeEvent,
    TrimEvent,
    WindowEvent,
)
from marsys_mem.model.facts import SharedFact
from marsys_mem.model.messages import (
    MESSAGE_LIST_ADAPTER,
    AgentCall,
    ImagePart,
    Message,
    Role,
    TextPart,
    ToolCall,
    to_llm_format,
)
from marsys_mem.model.names import validate_name
from marsys_mem.model.runs import RunContext, RunSnapshot, history
from marsys_mem.retrieval.embeddings import (
    Embedder,
    HashingEmbedder,
    SentenceTransformerEmbedder,
    default_embedder,
)
from marsys_mem.retrieval.index import FaissIndex, VectorIndex
from marsys_mem.retrieval.ingest import EmbeddingQueue
from marsys_mem.store import InMemoryStore, MemoryStore, SQLiteStore

if _typing.TYPE_CHECKING:  # loaded on first use (__getattr__): lower layers need no workflow
    from marsys_mem.front import Memory
    from marsys_mem.workflow import (
        Workflow,
        WorkflowReport,
        arun_workflow,
        load_workflow,
        run_workflow,
    )

__version__ = "0.1.0"

_LAZY = {
    "Memory": "marsys_mem.front",
    **dict.fromkeys(
        ("Workflow", "WorkflowReport", "arun_workflow", "load_workflow", "run_workflow"),
        "marsys_mem.workflow",
    ),
}


def __getattr__(name: str) -> _typing.Any:
    """The workflow names and the front door, imported on first use (PEP 562).

    ``import marsys_mem.patterns`` or ``marsys_mem.coordination`` then loads no workflow
    or CLI code; ``from marsys_mem import run_workflow, Memory`` works as before.
    """
    if name in _LAZY:
        value = getattr(_importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'marsys_mem' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "MESSAGE_LIST_ADAPTER",
    "AddEvent",
    "AgentCall",
    "AgentConfig",
    "CallableCounter",
    "ClearEvent",
    "ConfigError",
    "ConflictError",
    "ContextOverflowError",
    "ContextPolicy",
    "ContextWindow",
    "ConversationMemory",
    "DuplicateMessageError",
    "DuplicateToolCallError",
    "Embedder",
    "EmbeddingError",
    "EmbeddingQueue",
    "EventBus",
    "ExtractiveSummarizer",
    "FaissIndex",
    "ForkEvent",
    "HashingEmbedder",
    "HeuristicCounter",
    "ImagePart",
    "InMemoryStore",
    "IndexCorruptError",
    "InvalidNameError",
    "MarsysMemError",
    "Memory",
    "MemoryConfig",
    "MemoryEvent",
    "MemoryManager",
    "MemoryStore",
    "Message",
    "MessageFormatError",
    "MessageNotFoundError",
    "MissingDependencyError",
    "OrphanToolResultError",
    "RemoveEvent",
    "RetentionPolicy",
    "Role",
    "RunContext",
    "RunSnapshot",
    "SQLiteStore",
    "SentenceTransformerEmbedder",
    "SharedFact",
    "StoreConfig",
    "StoreError",
    "StoreNotFoundError",
    "Strategy",
    "SummarizeEvent",
    "Summarizer",
    "SummarizerError",
    "TextPart",
    "TiktokenCounter",
    "TokenCounter",
    "ToolCall",
    "ToolSequenceError",
    "TrimEvent",
    "VectorIndex",
    "WindowEvent",
    "Workflow",
    "WorkflowError",
    "WorkflowReport",
    "WorkflowRunError",
    "__version__",
    "abuild_context",
    "arun_workflow",
    "build_context",
    "count_message",
    "default_embedder",
    "get_counter",
    "history",
    "load_config",
    "load_workflow",
    "parse_duration",
    "run_workflow",
    "to_llm_format",
    "validate_name",
]
