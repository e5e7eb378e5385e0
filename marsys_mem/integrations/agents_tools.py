"""The front door as OpenAI Agents SDK function tools (the ``agents`` extra).

:func:`memory_tools` gives ``remember``, ``recall``, ``context``, ``forget`` and
``share_fact`` as ``FunctionTool``s over one :class:`~marsys_mem.front.Memory`, for one
user (fixed when the tools are made, never chosen by the model). Each returns its result
as JSON; a bad argument or an anticipated error is the tool's answer to the model, one
line naming the field, and changes nothing.

Example:
    >>> from marsys_mem.front import Memory
    >>> memory = Memory()
    >>> [t.name for t in memory_tools(memory, user_id="alice")]
    ['remember', 'recall', 'context', 'forget', 'share_fact']
    >>> memory.close()
"""

from __future__ import annotations

import json
from typing import Any

from marsys_mem.exceptions import MissingDependencyError
from marsys_mem.front import Memory
from marsys_mem.integrations.tools import TOOL_SPECS, ToolSpec, tool_error
from marsys_mem.model.names import validate_name

try:
    from agents import FunctionTool
    from agents.tool_context import ToolContext
except ModuleNotFoundError as exc:  # pragma: no cover - the extra is installed in CI
    raise MissingDependencyError(
        "marsys_mem.integrations.agents_tools needs the OpenAI Agents SDK: "
        "pip install 'marsys-mem[agents]'"
    ) from exc

__all__ = ["memory_tools"]


def _tool(spec: ToolSpec, memory: Memory, user_id: str, branch: str) -> FunctionTool:
    async def invoke(_ctx: ToolContext[Any], raw: str) -> str:
        try:
            arguments = json.loads(raw or "{}")
        except json.JSONDecodeError as exc:
            return f"error: the arguments are not JSON ({exc.msg})"
        if not isinstance(arguments, dict):
            return f"error: the arguments must be a JSON object, got {raw!r:.80}"
        try:
            result = await spec.arun(memory, user_id, branch, arguments)
        except Exception as exc:
            message = tool_error(exc)
            if message is None:
                raise
            return f"error: {message}"
        return json.dumps(result, ensure_ascii=False)

    return FunctionTool(
        name=spec.name,
        description=spec.description,
        params_json_schema=spec.args.model_json_schema(),
        on_invoke_tool=invoke,
        strict_json_schema=False,  # optional arguments; the spec validates strictly
    )


def memory_tools(memory: Memory, *, user_id: str, branch: str = "main") -> list[FunctionTool]:
    """Agents SDK function tools over ``memory`` for ``user_id``: the five operations.

    Args:
        memory: the front door the tools use (closing it is the caller's).
        user_id: whose memory (a user's id or an agent's name).
        branch: the branch they work on (default ``main``).

    Returns:
        One ``FunctionTool`` per operation, for ``Agent(tools=...)``.

    Raises:
        TypeError: ``memory`` is not a :class:`Memory`.
        InvalidNameError: a bad ``user_id`` or ``branch`` (named in the message).
    """
    if not isinstance(memory, Memory):
        raise TypeError(f"memory must be a marsys_mem.Memory, got {type(memory).__name__}")
    validate_name("user_id", user_id)
    validate_name("branch", branch)
    return [_tool(spec, memory, user_id, branch) for spec in TOOL_SPECS]
