"""The front door's operations as agent tools, framework-free: one spec per tool.

Each :class:`ToolSpec` is a tool a model may call (``remember``, ``recall``, ``context``,
``forget``, ``share_fact``): its strict argument model (the JSON schema a framework shows
the model) and how it runs on a :class:`~marsys_mem.front.Memory`, sync and async. Whose
memory is fixed when the tools are made (``user_id``), never chosen by the model. The
LangChain tools (:mod:`marsys_mem.integrations.langgraph.tools`) and the Agents SDK tools
(:mod:`marsys_mem.integrations.agents_tools`) are built from these specs.

Example:
    >>> from marsys_mem.front import Memory
    >>> memory = Memory()
    >>> remember = next(s for s in TOOL_SPECS if s.name == "remember")
    >>> remember.run(memory, "alice", "main", {"content": "I live in Paris"})["role"]
    'user'
    >>> memory.close()
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from marsys_mem.exceptions import MarsysMemError
from marsys_mem.front import MAX_FACT, MAX_TEXT, Memory

__all__ = [
    "TOOL_SPECS",
    "ContextArgs",
    "ForgetArgs",
    "RecallArgs",
    "RememberArgs",
    "ShareFactArgs",
    "ToolSpec",
    "describe",
    "tool_error",
]


def describe(exc: ValidationError) -> str:
    """A pydantic error in one line, each problem as ``field: rule (got value)``."""
    parts = []
    for err in exc.errors(include_url=False):
        field = ".".join(str(p) for p in err["loc"]) or "arguments"
        got = "" if err["type"] == "missing" else f" (got {err.get('input')!r:.80})"
        parts.append(f"{field}: {err['msg']}{got}")
    return "; ".join(parts)


_Id = Annotated[str, Field(min_length=1, max_length=200)]


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class RememberArgs(_Args):
    """Arguments of ``remember``."""

    content: str = Field(
        min_length=1, max_length=MAX_TEXT, description="what to remember, in plain words"
    )


class RecallArgs(_Args):
    """Arguments of ``recall``."""

    query: str = Field(min_length=1, max_length=MAX_TEXT, description="what to look for")
    k: int = Field(default=5, ge=1, le=50, description="how many memories to return")


class ContextArgs(_Args):
    """Arguments of ``context``."""

    query: str | None = Field(
        default=None, max_length=MAX_TEXT, description="also retrieve memories for this"
    )


class ForgetArgs(_Args):
    """Arguments of ``forget``."""

    message_ids: list[_Id] | None = Field(
        default=None, max_length=1000, description="ids of memories to delete (from recall)"
    )
    fact_ids: list[_Id] | None = Field(
        default=None, max_length=1000, description="ids of shared facts to delete"
    )

    @model_validator(mode="after")
    def _some(self) -> ForgetArgs:
        if not self.message_ids and not self.fact_ids:
            raise ValueError("give message_ids or fact_ids (ids from recall or share_fact)")
        return self


class ShareFactArgs(_Args):
    """Arguments of ``share_fact``."""

    text: str = Field(min_length=1, max_length=MAX_FACT, description="the fact")
    scope: Literal["branch", "subtree", "lineage", "global"] = Field(
        default="global", description="which agents receive it"
    )
    topic: str | None = Field(
        default=None, max_length=200, description="facts on one topic supersede each other"
    )


_Sync = Callable[[Memory, str, str, Any], dict[str, Any]]
_Async = Callable[[Memory, str, str, Any], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class ToolSpec:
    """One memory tool: its name, description, argument model and implementations.

    Attributes:
        name: the tool's name, as the model calls it.
        description: what it does, for the model.
        args: the strict pydantic model of its arguments (``extra="forbid"``).
        sync: ``sync(memory, user_id, branch, args)``, the operation.
        async_: its async twin.

    Example:
        >>> [s.name for s in TOOL_SPECS]
        ['remember', 'recall', 'context', 'forget', 'share_fact']
    """

    name: str
    description: str
    args: type[_Args]
    sync: _Sync
    async_: _Async

    def parse(self, arguments: Mapping[str, Any]) -> Any:
        """The validated arguments (``ValueError`` naming the field on a bad one)."""
        try:
            return self.args.model_validate(dict(arguments))
        except ValidationError as exc:
            raise ValueError(describe(exc)) from None

    def run(
        self, memory: Memory, user_id: str, branch: str, arguments: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Validate ``arguments`` and run the tool on ``memory`` for ``user_id``."""
        return self.sync(memory, user_id, branch, self.parse(arguments))

    async def arun(
        self, memory: Memory, user_id: str, branch: str, arguments: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Async twin of :meth:`run`."""
        return await self.async_(memory, user_id, branch, self.parse(arguments))


def tool_error(exc: BaseException) -> str | None:
    """The one-line message a model reads for an anticipated error (``None``: not one)."""
    if isinstance(exc, ValidationError):
        return describe(exc)
    if isinstance(exc, MarsysMemError | ValueError | TypeError | KeyError):
        return str(exc)
    return None


# ---------------------------------------------------------------------------- the tools
def _remember(m: Memory, user: str, branch: str, a: RememberArgs) -> dict[str, Any]:
    return m.remember(a.content, user_id=user, branch=branch)


async def _aremember(m: Memory, user: str, branch: str, a: RememberArgs) -> dict[str, Any]:
    return _remember(m, user, branch, a)


def _recall(m: Memory, user: str, branch: str, a: RecallArgs) -> dict[str, Any]:
    return m.recall(a.query, user_id=user, k=a.k, branch=branch)


async def _arecall(m: Memory, user: str, branch: str, a: RecallArgs) -> dict[str, Any]:
    return _recall(m, user, branch, a)


def _context(m: Memory, user: str, branch: str, a: ContextArgs) -> dict[str, Any]:
    return m.context(a.query, user_id=user, branch=branch)


async def _acontext(m: Memory, user: str, branch: str, a: ContextArgs) -> dict[str, Any]:
    return await m.acontext(a.query, user_id=user, branch=branch)


def _forget(m: Memory, user: str, branch: str, a: ForgetArgs) -> dict[str, Any]:
    return m.forget(user_id=user, message_ids=a.message_ids, fact_ids=a.fact_ids, branch=branch)


async def _aforget(m: Memory, user: str, branch: str, a: ForgetArgs) -> dict[str, Any]:
    return await m.aforget(
        user_id=user, message_ids=a.message_ids, fact_ids=a.fact_ids, branch=branch
    )


def _share(m: Memory, user: str, branch: str, a: ShareFactArgs) -> dict[str, Any]:
    return m.share_fact(a.text, user_id=user, branch=branch, scope=a.scope, topic=a.topic)


async def _ashare(m: Memory, user: str, branch: str, a: ShareFactArgs) -> dict[str, Any]:
    return await m.ashare_fact(a.text, user_id=user, branch=branch, scope=a.scope, topic=a.topic)


TOOL_SPECS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "remember",
        "Save something worth remembering about the user or the task to long-term memory.",
        RememberArgs,
        _remember,
        _aremember,
    ),
    ToolSpec(
        "recall",
        "Search long-term memory; returns the best matching memories with their ids.",
        RecallArgs,
        _recall,
        _arecall,
    ),
    ToolSpec(
        "context",
        "Show the messages and shared facts currently in memory, as the model would see them.",
        ContextArgs,
        _context,
        _acontext,
    ),
    ToolSpec(
        "forget",
        "Delete memories by id (ids from recall) or shared facts by id.",
        ForgetArgs,
        _forget,
        _aforget,
    ),
    ToolSpec(
        "share_fact",
        "Share a fact with the other agents (they see it in their context).",
        ShareFactArgs,
        _share,
        _ashare,
    ),
)
"""The memory tools, in the order frameworks list them."""
