"""Token counting.

A :class:`TokenCounter` counts the tokens one :class:`~marsys_mem.model.messages.Message` costs
in a prompt. Counts are cached on the (immutable) message per counter, keyed by the
counter's ``cache_key``, so counting a message twice is a dictionary lookup: use
:func:`count_message` rather than calling ``counter.count`` directly.

Counters here:

* :class:`HeuristicCounter`: about 4 characters a token, a fixed overhead per message, a
  fixed estimate per image. No dependency; the default.
* :class:`CallableCounter`: wraps any ``str -> int`` function (a tokenizer you already have).
* :class:`TiktokenCounter`: OpenAI's tiktoken, when it and its encoding are available.

:func:`get_counter` turns the config-file spelling (``"heuristic"``,
``"tiktoken:cl100k_base"``) into a counter.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable
from typing import Any, Protocol, runtime_checkable

from marsys_mem.exceptions import MissingDependencyError
from marsys_mem.model.messages import ImagePart, Message, content_text

__all__ = [
    "CallableCounter",
    "HeuristicCounter",
    "TiktokenCounter",
    "TokenCounter",
    "count_message",
    "count_messages",
    "get_counter",
]


@runtime_checkable
class TokenCounter(Protocol):
    """Counts the prompt tokens of a message.

    Implementations must be deterministic and return the same count for the same message,
    since counts are cached. ``cache_key`` identifies the counter's configuration.
    """

    @property
    def cache_key(self) -> Hashable:
        """A hashable value that is equal for counters that count identically."""
        ...

    def count(self, message: Message) -> int:
        """Tokens the message costs in a prompt (content, calls, overhead)."""
        ...

    def count_text(self, text: str) -> int:
        """Tokens of a bare string."""
        ...


def count_message(counter: TokenCounter, message: Message) -> int:
    """Count ``message`` with ``counter``, caching the result on the message."""
    # Counts live in the message's private slot (never serialised, not part of equality).
    # Declaring a PrivateAttr would cost ~15 us per message construction in pydantic.
    cache: dict[Any, int] | None = message.__pydantic_private__
    key = counter.cache_key
    if cache is None:
        cache = {}
        object.__setattr__(message, "__pydantic_private__", cache)
    else:
        n = cache.get(key)
        if n is not None:
            return n
    n = cache[key] = counter.count(message)
    return n


def count_messages(counter: TokenCounter, messages: list[Message]) -> int:
    """Sum of :func:`count_message` over ``messages``."""
    return sum(count_message(counter, m) for m in messages)


def _extra_text(message: Message) -> str:
    """Everything besides the content that reaches the prompt, as text."""
    parts: list[str] = []
    if message.name:
        parts.append(message.name)
    if message.tool_call_id:
        parts.append(message.tool_call_id)
    for call in message.tool_calls:
        parts.append(call.id)
        parts.append(call.name)
        parts.append(json.dumps(call.arguments, ensure_ascii=False))
    for agent_call in message.agent_calls:
        parts.append(agent_call.agent)
        req = agent_call.request
        parts.append(req if isinstance(req, str) else json.dumps(req, ensure_ascii=False))
    if message.structured_data is not None:
        parts.append(json.dumps(message.structured_data, ensure_ascii=False))
    return " ".join(parts)


def _image_count(message: Message) -> int:
    n = len(message.images)
    if isinstance(message.content, list):
        n += sum(1 for p in message.content if isinstance(p, ImagePart))
    return n


class _TextCounterBase:
    """Shared message logic: text tokens + per-message overhead + images."""

    per_message_overhead: int
    image_tokens: int

    def count_text(self, text: str) -> int:  # pragma: no cover - overridden
        raise NotImplementedError

    def count(self, message: Message) -> int:
        content = message.content
        if isinstance(content, str):
            n = self.count_text(content)
        else:
            n = self.count_text(content_text(content))
        if (
            message.name
            or message.tool_calls
            or message.tool_call_id
            or message.agent_calls
            or message.structured_data is not None
        ):
            n += self.count_text(_extra_text(message))
        if message.images or isinstance(content, list):
            n += self.image_tokens * _image_count(message)
        return n + self.per_message_overhead


class HeuristicCounter(_TextCounterBase):
    """About ``chars_per_token`` characters a token, plus a per-message overhead.

    Good to within ~20% of real BPE tokenizers for English text; needs nothing installed.

    Args:
        chars_per_token: characters counted as one token (default 4).
        per_message_overhead: tokens added for each message's role and framing (default 4).
        image_tokens: fixed estimate for each image (default 85, a low-detail image).

    Example:
        >>> HeuristicCounter().count(Message.user("x" * 40))
        14
    """

    def __init__(
        self, chars_per_token: float = 4.0, per_message_overhead: int = 4, image_tokens: int = 85
    ) -> None:
        if chars_per_token <= 0:
            raise ValueError(f"chars_per_token must be > 0, got {chars_per_token}")
        if per_message_overhead < 0 or image_tokens < 0:
            raise ValueError("per_message_overhead and image_tokens must be >= 0")
        self.chars_per_token = float(chars_per_token)
        self.per_message_overhead = per_message_overhead
        self.image_tokens = image_tokens
        self.cache_key: Hashable = (
            "heuristic",
            self.chars_per_token,
            per_message_overhead,
            image_tokens,
        )

    def count(self, message: Message) -> int:
        """Tokens of the message (a fast path for plain text messages)."""
        content = message.content
        if (
            type(content) is str
            and message.structured_data is None
            and not (
                message.name
                or message.tool_calls
                or message.tool_call_id
                or message.agent_calls
                or message.images
            )
        ):
            chars = len(content)
            text = int(-(-chars // self.chars_per_token)) if chars else 0
            return text + self.per_message_overhead
        return super().count(message)

    def count_text(self, text: str) -> int:
        """``ceil(len(text) / chars_per_token)``."""
        if not text:
            return 0
        return int(-(-len(text) // self.chars_per_token))

    def __repr__(self) -> str:
        return (
            f"HeuristicCounter(chars_per_token={self.chars_per_token}, "
            f"per_message_overhead={self.per_message_overhead}, image_tokens={self.image_tokens})"
        )


class CallableCounter(_TextCounterBase):
    """A counter built from any ``str -> int`` function.

    Args:
        fn: returns the token count of a string.
        per_message_overhead: tokens added per message (default 4).
        image_tokens: fixed estimate per image (default 85).
        key: cache key; defaults to the function and the settings.

    Example:
        >>> words = CallableCounter(lambda s: len(s.split()), per_message_overhead=0)
        >>> words.count(Message.user("three short words"))
        3
    """

    def __init__(
        self,
        fn: Callable[[str], int],
        *,
        per_message_overhead: int = 4,
        image_tokens: int = 85,
        key: Hashable | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        self._fn = fn
        self.per_message_overhead = per_message_overhead
        self.image_tokens = image_tokens
        # The key holds the function itself (not its id, which Python reuses once freed).
        self.cache_key: Hashable = (
            key if key is not None else ("callable", fn, per_message_overhead, image_tokens)
        )

    def count_text(self, text: str) -> int:
        """Calls the wrapped function; the result must be a non-negative int."""
        n = self._fn(text)
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"token function returned {n!r}; expected an int >= 0")
        return n


class TiktokenCounter(_TextCounterBase):
    """Counts with OpenAI's tiktoken.

    Args:
        encoding: an encoding name (``"cl100k_base"``, ``"o200k_base"``) or a
            ``tiktoken.Encoding`` object.
        per_message_overhead: tokens added per message (OpenAI documents 3-4).
        image_tokens: fixed estimate per image.

    Raises:
        MissingDependencyError: tiktoken is not installed, or the encoding cannot be loaded
            (tiktoken downloads encodings on first use; offline machines need them cached).

    Example:
        With the encoding available (downloaded once by tiktoken, or already cached)::

            counter = TiktokenCounter("cl100k_base")
            counter.count_text("hello world")  # 2
    """

    def __init__(
        self,
        encoding: Any = "cl100k_base",
        *,
        per_message_overhead: int = 4,
        image_tokens: int = 85,
    ) -> None:
        try:
            import tiktoken  # noqa: PLC0415 (optional dependency: tiktoken, in the dev extra)
        except ImportError as exc:
            raise MissingDependencyError(
                "TiktokenCounter needs tiktoken: pip install tiktoken (or 'marsys-mem[dev]')"
            ) from exc
        if isinstance(encoding, str):
            try:
                encoding = tiktoken.get_encoding(encoding)
            except Exception as exc:  # network errors, unknown names, corrupt cache
                raise MissingDependencyError(
                    f"tiktoken encoding {encoding!r} is not available ({type(exc).__name__}: "
                    f"{exc}); set TIKTOKEN_CACHE_DIR to a folder holding it, or pass a "
                    "tiktoken.Encoding"
                ) from exc
        self._enc = encoding
        self.per_message_overhead = per_message_overhead
        self.image_tokens = image_tokens
        self.cache_key: Hashable = ("tiktoken", encoding.name, per_message_overhead, image_tokens)

    def count_text(self, text: str) -> int:
        """Exact BPE token count (special tokens are counted as plain text)."""
        return len(self._enc.encode(text, disallowed_special=()))


def get_counter(spec: str | TokenCounter | None = None) -> TokenCounter:
    """Resolve a counter from its config spelling.

    ``None`` or ``"heuristic"`` give :class:`HeuristicCounter`; ``"tiktoken"`` or
    ``"tiktoken:<encoding>"`` give :class:`TiktokenCounter`; a counter is returned as is.

    Raises:
        ValueError: an unknown spelling.
    """
    if spec is None or spec == "heuristic":
        return _DEFAULT
    if isinstance(spec, str):
        if spec == "tiktoken":
            return TiktokenCounter()
        if spec.startswith("tiktoken:"):
            return TiktokenCounter(spec.split(":", 1)[1])
        raise ValueError(
            f"unknown token counter {spec!r}; use 'heuristic' or 'tiktoken[:encoding]'"
        )
    if isinstance(spec, TokenCounter):
        return spec
    raise TypeError(f"expected a TokenCounter or its name, got {type(spec).__name__}")


_DEFAULT = HeuristicCounter()
