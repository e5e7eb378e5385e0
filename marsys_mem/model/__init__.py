"""The data model: messages and formats, shared facts, runs, events, names, search settings.

The public home of these names (``from marsys_mem.model import AddEvent, RunContext``):
``marsys_mem`` itself exports only :class:`Message` and :class:`ToolCall` of them.

Near the bottom of the package: it imports nothing from marsys-mem but ``exceptions`` and
``callables``.
"""

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
from marsys_mem.model.names import inbox_key, validate_name
from marsys_mem.model.ranking import Ingest, Ranking
from marsys_mem.model.runs import RunContext, RunSnapshot, history
from marsys_mem.model.traces import TraceStep, trace_of

__all__ = [
    "MESSAGE_LIST_ADAPTER",
    "AddEvent",
    "AgentCall",
    "ClearEvent",
    "EventBus",
    "ForkEvent",
    "ImagePart",
    "Ingest",
    "MemoryEvent",
    "Message",
    "Ranking",
    "RemoveEvent",
    "Role",
    "RunContext",
    "RunSnapshot",
    "SharedFact",
    "SummarizeEvent",
    "TextPart",
    "ToolCall",
    "TraceStep",
    "TrimEvent",
    "WindowEvent",
    "history",
    "inbox_key",
    "to_llm_format",
    "trace_of",
    "validate_name",
]
