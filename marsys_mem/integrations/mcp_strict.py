"""Strict MCP tool arguments: unknown names and coerced values refused, in one clean line.

The MCP SDK builds each tool's argument model from the function's signature, lax: an
unknown argument is dropped and ``"yes"`` becomes ``True``. :meth:`StrictTool.of` builds
the same tool from the same signature (still the one source of the constraints and the
descriptions), then makes its argument model strict (``extra="forbid"``, ``strict=True``)
and publishes that model's JSON Schema (``additionalProperties: false``) as the tool's
``inputSchema``; the SDK validates with it before the tool runs. A refused call is a tool
error (``isError``, so the model can correct itself) of one line naming each field and
the value it got (:func:`describe`), never pydantic's multi-line dump and its links.

Example:
    >>> import asyncio
    >>> async def forget(agent: str, everything: bool = False) -> str:
    ...     return f"{agent}: {everything}"
    >>> tool = StrictTool.of(forget)
    >>> tool.parameters["additionalProperties"]
    False
    >>> asyncio.run(tool.run({"agent": "a", "everything": "yes"}, None))
    Traceback (most recent call last):
    ...
    mcp.server.mcpserver.exceptions.ToolError: Error executing tool forget: everything: \
expected true or false, got 'yes'
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from pydantic import ConfigDict, ValidationError

from marsys_mem.model.names import shown

try:
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.server.mcpserver.tools import Tool
    from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase
except ImportError as exc:  # pragma: no cover - the extra is installed in CI
    from marsys_mem.exceptions import MissingDependencyError

    raise MissingDependencyError(
        "the MCP server needs the mcp extra: pip install 'marsys-mem[mcp]'"
    ) from exc

if TYPE_CHECKING:
    from mcp.server.mcpserver import Context

__all__ = ["StrictTool", "describe"]

_STRICT: Final = ConfigDict(extra="forbid", strict=True)
_MAX_SHOWN: Final = 5

_SHOULD: Final = re.compile(r"^(?:Input|String|List|Value|Dictionary|Tuple|Set|Object) should ")

# pydantic's wording where a plainer one helps the model that reads it
_PLAIN: Final = {
    "bool_type": "expected true or false",
    "int_type": "expected an integer",
    "float_type": "expected a number",
    "string_type": "expected a string",
    "list_type": "expected a list",
    "missing": "required",
}


def describe(exc: ValidationError, *, known: tuple[str, ...] = ()) -> str:
    """One line for a ValidationError: ``field: problem, got <value>`` per error, ``; ``.

    Args:
        exc: the error.
        known: the arguments there are (named when an unknown one came).

    Example:
        >>> from pydantic import BaseModel
        >>> class Args(BaseModel, extra="forbid", strict=True):
        ...     k: int
        >>> try:
        ...     Args.model_validate({"k": "3", "evil": 1})
        ... except ValidationError as exc:
        ...     print(describe(exc, known=("k",)))
        k: expected an integer, got '3'; evil: unknown argument (there are: k)
    """
    parts: list[str] = []
    errors = exc.errors(include_url=False, include_context=False)
    for err in errors[:_MAX_SHOWN]:
        field = ".".join(str(p) for p in err["loc"]) or "arguments"
        if err["type"] == "extra_forbidden":
            there = f" (there are: {', '.join(known)})" if known else ""
            parts.append(f"{field}: unknown argument{there}")
            continue
        problem = _PLAIN.get(err["type"], _plain(str(err["msg"])))
        said = err["type"] == "missing" or "got " in problem  # a validator's own message
        got = "" if said else f", got {shown(err.get('input'))}"
        parts.append(f"{field}: {problem}{got}")
    if len(errors) > _MAX_SHOWN:
        parts.append(f"and {len(errors) - _MAX_SHOWN} more")
    return "; ".join(parts)


def _plain(message: str) -> str:
    """Pydantic's message as the rule it states: ``Input should be ...`` -> ``must be ...``.

    Example:
        >>> _plain("List should have at least 1 item after validation, not 0")
        'must have at least 1 item, not 0'
    """
    message = message.removeprefix("Value error, ")
    message = _SHOULD.sub("must ", message, count=1)
    return message.replace(" after validation", "")


class StrictTool(Tool):
    """An MCP SDK tool whose arguments are validated strictly, errors in one line.

    Example:
        >>> def add(a: int, b: int = 1) -> int:
        ...     return a + b
        >>> sorted(StrictTool.of(add).parameters["properties"])
        ['a', 'b']
    """

    @classmethod
    def of(cls, fn: Callable[..., Any], *, name: str | None = None) -> StrictTool:
        """The tool for ``fn`` (as ``MCPServer.tool`` would make it), its arguments strict."""
        tool = cls.from_function(fn, name=name)
        if not isinstance(tool, cls):  # pragma: no cover - from_function builds cls(...)
            raise TypeError(f"Tool.from_function made a {type(tool).__name__}")
        lax = tool.fn_metadata.arg_model
        strict: type[ArgModelBase] = type(
            lax.__name__, (lax,), {"model_config": _STRICT, "__module__": __name__}
        )
        # FuncMetadata reads arg_model live; the published schema is the strict model's
        tool.fn_metadata.arg_model = strict
        tool.parameters = strict.model_json_schema(by_alias=True)
        return tool

    async def run(
        self,
        arguments: dict[str, Any],
        context: Context[Any, Any] | None,
        convert_result: bool = False,
    ) -> Any:
        """Run the tool; refused arguments are a ``ToolError`` of one line (:func:`describe`)."""
        try:
            return await super().run(arguments, context, convert_result)  # type: ignore[arg-type]
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(cause, ValidationError):
                known = tuple(self.parameters.get("properties", {}))
                raise ToolError(
                    f"Error executing tool {self.name}: {describe(cause, known=known)}"
                ) from cause
            raise
