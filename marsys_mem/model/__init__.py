"""The data model: messages and their provider formats, shared facts, runs, events, names.

The bottom layer of the package: it imports nothing from marsys-mem but ``exceptions``.
"""

from marsys_mem.model.events import EventBus, MemoryEvent
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
from marsys_mem.model.runs import RunSnapshot, history
from marsys_mem.model.traces import TraceStep, trace_of

__all__ = [
    "MESSAGE_LIST_ADAPTER",
    "AgentCall",
    "EventBus",
    "ImagePart",
    "MemoryEvent",
    "Message",
    "Role",
    "RunSnapshot",
    "SharedFact",
    "TextPart",
    "ToolCall",
    "TraceStep",
    "history",
    "inbox_key",
    "to_llm_format",
    "trace_of",
    "validate_name",
]
