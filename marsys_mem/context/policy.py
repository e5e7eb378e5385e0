"""Context policies and windows: how much of a history an agent may send, and what it sent.

:class:`ContextPolicy` is the configuration (limits and strategy, validated, frozen);
:class:`ContextWindow` is the result of applying one to a history (the messages and what
they cost). The builder that turns one into the other is :mod:`marsys_mem.context.window`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from marsys_mem.context.blocks import BlockRole
from marsys_mem.display import MAX_CHARS, MAX_ROWS, window_html
from marsys_mem.model.messages import Message, Provider, to_llm_format

__all__ = ["ContextPolicy", "ContextWindow", "StartOn", "Strategy", "Summarizer"]

Strategy = Literal["sliding_window", "trim_oldest", "summarize"]
StartOn = Literal["user", "any"]
"""Where a window's history may start: on a user turn (the default), or on any message."""
Summarizer = Callable[[list[Message]], "str | Awaitable[str]"]
"""A ``list[Message] -> str`` callable, sync or async."""


def _check_encoding_name(name: str) -> None:
    """Reject an encoding tiktoken does not know (when tiktoken is installed)."""
    try:
        import tiktoken  # noqa: PLC0415 (optional dependency: tiktoken, in the dev extra)
    except ImportError:
        return
    known = tiktoken.list_encoding_names()
    if name not in known:
        raise ValueError(f"unknown tiktoken encoding {name!r}; known: {', '.join(known)}")


class ContextPolicy(BaseModel):
    """How much of a history an agent may send, and what happens to the rest.

    Args:
        max_messages: most messages in the window (system, pinned and summary included).
        max_tokens: most tokens in the window, by the counter.
        strategy: ``sliding_window`` (view), ``trim_oldest`` (destructive) or ``summarize``.
        keep_recent: ``summarize`` only: most recent messages kept verbatim; older ones are
            summarised even when they would fit.
        summary_max_tokens: ``summarize`` only: tokens reserved for the summary message
            (default: a quarter of ``max_tokens``); a longer summary is cut to fit.
        token_counter: ``"heuristic"`` or ``"tiktoken[:encoding]"``; ``None`` uses the
            memory's counter.
        start_on: ``"user"`` (default): after the system messages and the summary, the window
            starts on a user turn (a ``user`` or ``agent_call`` message; tool results are not
            one), as Anthropic requires and every chat model expects. The messages before the
            oldest user turn that fits are dropped too (with ``summarize``, folded into the
            summary); no user turn is ever invented. The newest user turn and everything
            after it must fit, or :class:`~marsys_mem.exceptions.ContextOverflowError` says
            by how much (``keep_recent`` never cuts into it). If the first pinned message is
            not a user turn, the latest user turn before it is kept with it. A history with no
            user turn (before the newest turn that fits) is windowed as with ``"any"``
            rather than emptied. ``"any"``: the newest messages that fit, wherever they start
            (LangChain ``trim_messages``' ``start_on=None``).
        block_role: the role of the memory blocks ``MemoryManager.context_for`` adds (shared
            and user facts, core memory, retrieved and cross-thread recall). ``"system"``
            (default): the blocks stay out of the conversation's turns (Anthropic: in the
            ``system`` field), and their stored text has no authority there because it is
            quoted data under a "not instructions" header (see
            :mod:`marsys_mem.context.blocks`). ``"user"``: each block is a user message
            before the window (Anthropic merges it into the first user turn), for models
            or deployments that keep the system prompt to the developer's own text.

    Example:
        >>> policy = ContextPolicy(max_messages=50, max_tokens=8000)
        >>> policy.strategy
        'sliding_window'
        >>> ContextPolicy(max_tokens=4000, strategy="summarize", keep_recent=20).keep_recent
        20
        >>> policy.start_on, ContextPolicy(max_messages=5, start_on="any").start_on
        ('user', 'any')
        >>> policy.block_role, ContextPolicy(block_role="user").block_role
        ('system', 'user')
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_messages: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    strategy: Strategy = "sliding_window"
    keep_recent: int | None = Field(default=None, ge=0)
    summary_max_tokens: int | None = Field(default=None, ge=1)
    token_counter: str | None = None
    start_on: StartOn = "user"
    block_role: BlockRole = "system"

    @model_validator(mode="after")
    def _check(self) -> ContextPolicy:
        if self.strategy != "summarize":
            for name in ("keep_recent", "summary_max_tokens"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"{name} only applies to strategy 'summarize', not {self.strategy!r}"
                    )
        if (
            self.summary_max_tokens is not None
            and self.max_tokens is not None
            and self.summary_max_tokens >= self.max_tokens
        ):
            raise ValueError(
                f"summary_max_tokens ({self.summary_max_tokens}) must be less than "
                f"max_tokens ({self.max_tokens})"
            )
        return self

    @field_validator("token_counter")
    @classmethod
    def _check_counter_name(cls, value: str | None) -> str | None:
        if value is None or value in ("heuristic", "tiktoken"):
            return value
        if value.startswith("tiktoken:") and len(value) > len("tiktoken:"):
            _check_encoding_name(value.split(":", 1)[1])
            return value  # the encoding itself is loaded when the counter is first used
        raise ValueError(
            f"unknown token counter {value!r}; use 'heuristic', 'tiktoken' or 'tiktoken:<encoding>'"
        )

    @property
    def summary_reserve(self) -> int | None:
        """Tokens reserved for the summary (``None``: unbounded)."""
        if self.summary_max_tokens is not None:
            return self.summary_max_tokens
        if self.max_tokens is not None:
            return max(1, self.max_tokens // 4)
        return None


@dataclass(frozen=True, slots=True)
class ContextWindow:
    """The messages an agent would send, and what it cost.

    Attributes:
        messages: the window, oldest first (summary included, where it sits).
        tokens: tokens of ``messages`` by the policy's counter.
        dropped: history messages not in the window.
        summary: the summary message, if the strategy produced one.
        strategy: the strategy used.
        history_messages: messages in the whole history.
        history_tokens: tokens of the whole history.
        summarized: messages newly passed to the summariser by this call.

    Example:
        >>> from marsys_mem import ConversationMemory, Message
        >>> mem = ConversationMemory([Message.system("Be terse."), Message.user("Hi")])
        >>> win = mem.context(ContextPolicy(max_messages=2))
        >>> len(win), win.dropped
        (2, 0)
    """

    messages: tuple[Message, ...]
    tokens: int
    dropped: int
    summary: Message | None
    strategy: Strategy
    history_messages: int
    history_tokens: int
    summarized: int = 0
    dropped_ids: tuple[str, ...] = field(default=(), repr=False)

    @property
    def tokens_saved(self) -> int:
        """History tokens minus window tokens (negative if a summary costs more)."""
        return self.history_tokens - self.tokens

    def __len__(self) -> int:
        return len(self.messages)

    def __iter__(self) -> Any:
        return iter(self.messages)

    def to_llm_format(self, provider: Provider = "openai") -> Any:
        """The window in a provider's format (see :func:`~marsys_mem.model.to_llm_format`)."""
        return to_llm_format(self.messages, provider)

    def __html_view__(self, *, max_rows: int = MAX_ROWS, max_chars: int = MAX_CHARS) -> str:
        """The window as bounded HTML (the :class:`~marsys_mem.display.HtmlViewable` protocol)."""
        return window_html(self, max_rows=max_rows, max_chars=max_chars)

    def _repr_html_(self) -> str:
        return self.__html_view__()

    def __repr__(self) -> str:
        summary = ", summary=True" if self.summary is not None else ""
        return (
            f"ContextWindow(strategy={self.strategy!r}, messages={len(self.messages)}, "
            f"tokens={self.tokens}, dropped={self.dropped}, history_messages="
            f"{self.history_messages}, history_tokens={self.history_tokens}{summary})"
        )
