"""The front door as LangChain tools, for LangGraph agents (as LangMem's memory tools are).

:func:`memory_tools` gives ``remember``, ``recall``, ``context``, ``forget`` and
``share_fact`` as ``StructuredTool``s over one :class:`~marsys_mem.front.Memory`, for one
user (fixed when the tools are made, never chosen by the model). A bad argument or an
anticipated error comes back to the model as the tool's answer, one line naming the field.

Example:
    >>> from marsys_mem.front import Memory
    >>> memory = Memory()
    >>> tools = {t.name: t for t in memory_tools(memory, user_id="alice")}
    >>> tools["remember"].invoke({"content": "I live in Paris"})["role"]
    'user'
    >>> [h["text"] for h in tools["recall"].invoke({"query": "Where do I live?"})["hits"]]
    ['I live in Paris']
    >>> memory.close()
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from marsys_mem.exceptions import MissingDependencyError
from marsys_mem.front import Memory
from marsys_mem.integrations.tools import TOOL_SPECS, ToolSpec, describe, tool_error
from marsys_mem.model.names import validate_name

try:
    from langchain_core.tools import StructuredTool, ToolException
except ImportError as exc:  # pragma: no cover - the extra is installed in CI
    raise MissingDependencyError(
        "the LangChain memory tools need the langgraph extra: pip install 'marsys-mem[langgraph]'"
    ) from exc

__all__ = ["memory_tools"]


def _invalid(exc: Exception) -> str:
    """LangChain's argument check failed: one line naming the field, never pydantic's dump."""
    return describe(exc) if isinstance(exc, ValidationError) else str(exc)


def _tool(spec: ToolSpec, memory: Memory, user_id: str, branch: str) -> StructuredTool:
    def run(**arguments: Any) -> dict[str, Any]:
        try:
            return spec.run(memory, user_id, branch, arguments)
        except Exception as exc:
            message = tool_error(exc)
            if message is None:
                raise
            raise ToolException(message) from exc

    async def arun(**arguments: Any) -> dict[str, Any]:
        try:
            return await spec.arun(memory, user_id, branch, arguments)
        except Exception as exc:
            message = tool_error(exc)
            if message is None:
                raise
            raise ToolException(message) from exc

    return StructuredTool.from_function(
        func=run,
        coroutine=arun,
        name=spec.name,
        description=spec.description,
        args_schema=spec.args,
        infer_schema=False,
        handle_tool_error=True,  # a ToolException's message is the model's answer
        handle_validation_error=_invalid,
    )


def memory_tools(memory: Memory, *, user_id: str, branch: str = "main") -> list[StructuredTool]:
    """LangChain tools over ``memory`` for ``user_id``: the front door's five operations.

    Args:
        memory: the front door the tools use (closing it is the caller's).
        user_id: whose memory (a user's id or an agent's name).
        branch: the branch they work on (default ``main``).

    Returns:
        One ``StructuredTool`` per operation, sync and async (``invoke`` / ``ainvoke``).

    Raises:
        TypeError: ``memory`` is not a :class:`Memory`.
        InvalidNameError: a bad ``user_id`` or ``branch`` (named in the message).
    """
    if not isinstance(memory, Memory):
        raise TypeError(f"memory must be a marsys_mem.Memory, got {type(memory).__name__}")
    validate_name("user_id", user_id)
    validate_name("branch", branch)
    return [_tool(spec, memory, user_id, branch) for spec in TOOL_SPECS]
