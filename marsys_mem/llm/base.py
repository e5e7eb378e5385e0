"""The completion protocol every adapter speaks, its settings, and the helpers they share.

:class:`LLM` is one small protocol: ``complete(messages, schema=None)`` returns the model's
text, or, given a pydantic model class as ``schema``, an instance of it (structured output,
validated, one retry on invalid JSON); ``acomplete`` is its async twin. The adapters
(:mod:`marsys_mem.llm.openai`, :mod:`marsys_mem.llm.anthropic`) implement it over the
official SDKs; anything else with these two methods is an :class:`LLM` too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any, Generic, Literal, Protocol, Self, TypeVar, overload, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from marsys_mem.exceptions import LLMError
from marsys_mem.model.messages import Message

__all__ = [
    "LLM",
    "LLMSettings",
    "Prompt",
    "SDKAdapter",
    "SDKClients",
    "SchemaT",
    "StructuredMode",
    "as_messages",
    "check_schema",
    "invalid_output",
    "parse_structured",
    "retry_instruction",
    "schema_instruction",
    "schema_name",
    "unreadable_response",
]

SchemaT = TypeVar("SchemaT", bound=BaseModel)
Prompt = str | Sequence[Message]
"""What a completion takes: a list of messages, or one string (sent as a user message)."""
StructuredMode = Literal["json_schema", "json_object", "prompt"]


class _SyncClosable(Protocol):
    def close(self) -> None: ...


class _AsyncClosable(Protocol):
    async def close(self) -> None: ...


SyncT = TypeVar("SyncT", bound=_SyncClosable)
AsyncT = TypeVar("AsyncT", bound=_AsyncClosable)


class SDKClients(Generic[SyncT, AsyncT]):
    """An adapter's sync and async SDK clients: made on first use, closed only if made here.

    Args:
        make_sync: builds the sync client (called at most once, on first use).
        make_async: builds the async client.
        sync: a client to use instead (left open unless ``owned``).
        async_: an async client to use instead (left open unless ``owned``).
        owned: whether given clients are this adapter's to close (a factory that builds
            them, such as ``OpenAILLM.azure``, says so).

    Example:
        >>> class Client:
        ...     closed = False
        ...     def close(self) -> None:
        ...         self.closed = True
        >>> class AsyncClient:
        ...     async def close(self) -> None: ...
        >>> clients = SDKClients(Client, AsyncClient)
        >>> made = clients.sync()
        >>> clients.close(); made.closed
        True
    """

    def __init__(
        self,
        make_sync: Callable[[], SyncT],
        make_async: Callable[[], AsyncT],
        sync: SyncT | None = None,
        async_: AsyncT | None = None,
        *,
        owned: bool = False,
    ) -> None:
        self._make_sync, self._make_async = make_sync, make_async
        self._sync, self._async = sync, async_
        self._owns_sync = sync is None or owned
        self._owns_async = async_ is None or owned

    def sync(self) -> SyncT:
        """The sync client (made now if needed)."""
        if self._sync is None:
            self._sync = self._make_sync()
        return self._sync

    def async_(self) -> AsyncT:
        """The async client (made now if needed)."""
        if self._async is None:
            self._async = self._make_async()
        return self._async

    def close(self) -> None:
        """Close the sync client if this adapter made (or owns) it."""
        if self._sync is not None and self._owns_sync:
            self._sync.close()
            self._sync = None

    async def aclose(self) -> None:
        """Close both clients this adapter made (or owns)."""
        self.close()
        if self._async is not None and self._owns_async:
            await self._async.close()
            self._async = None


class SDKAdapter(Generic[SyncT, AsyncT]):
    """Base of the SDK adapters: their clients, closing, and the context managers.

    Subclasses set ``self.clients`` (an :class:`SDKClients`) in ``__init__``.

    Example:
        >>> issubclass(SDKAdapter, object)
        True
    """

    clients: SDKClients[SyncT, AsyncT]

    def close(self) -> None:
        """Close the sync HTTP client this adapter made (a given client is left open)."""
        self.clients.close()

    async def aclose(self) -> None:
        """Close both HTTP clients this adapter made."""
        await self.clients.aclose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


@runtime_checkable
class LLM(Protocol):
    """A chat model: messages in, text (or a validated pydantic object) out.

    Example:
        >>> class Echo:  # anything with these two methods is an LLM
        ...     def complete(self, messages, schema=None):
        ...         return as_messages(messages)[-1].text
        ...     async def acomplete(self, messages, schema=None):
        ...         return self.complete(messages, schema)
        >>> isinstance(Echo(), LLM), Echo().complete("hello")
        (True, 'hello')
    """

    @overload
    def complete(self, messages: Prompt, schema: None = None) -> str: ...
    @overload
    def complete(self, messages: Prompt, schema: type[SchemaT]) -> SchemaT: ...
    def complete(self, messages: Prompt, schema: type[SchemaT] | None = None) -> str | SchemaT:
        """The model's answer: text, or an instance of ``schema``."""
        ...

    @overload
    async def acomplete(self, messages: Prompt, schema: None = None) -> str: ...
    @overload
    async def acomplete(self, messages: Prompt, schema: type[SchemaT]) -> SchemaT: ...
    async def acomplete(
        self, messages: Prompt, schema: type[SchemaT] | None = None
    ) -> str | SchemaT:
        """Async :meth:`complete`."""
        ...


class LLMSettings(BaseModel):
    """An adapter's settings, validated at construction (errors name the field and value).

    Args:
        model: the model (or Azure deployment) name.
        base_url: the API's base URL (an OpenAI-compatible server: vLLM, Ollama,
            llama.cpp, LM Studio); ``None``: the provider's own.
        timeout: seconds per HTTP attempt (the SDK's ``timeout``).
        max_retries: retries on connection errors, timeouts, 408, 409, 429 and 5xx, with
            the SDK's exponential backoff and jitter, honouring ``Retry-After`` (the SDK's
            ``max_retries``).
        temperature: sampling temperature; ``None``: the provider's default.
        max_tokens: most tokens to generate; ``None``: the provider's default (Anthropic,
            which requires one: 1024).
        structured: how a ``schema`` is asked for (OpenAI-compatible servers):
            ``json_schema`` (``response_format`` with the schema), ``json_object`` (JSON
            mode, the schema in the prompt) or ``prompt`` (the schema in the prompt only).

    Example:
        >>> LLMSettings(model="gpt-4o-mini", timeout=30).max_retries
        2
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(min_length=1)
    base_url: str | None = Field(default=None, min_length=1)
    timeout: float = Field(default=60.0, gt=0)
    max_retries: int = Field(default=2, ge=0, le=10)
    temperature: float | None = Field(default=None, ge=0, le=2)
    max_tokens: int | None = Field(default=None, ge=1)
    structured: StructuredMode = "json_schema"


def as_messages(messages: Prompt) -> list[Message]:
    """The messages of a prompt: a string is one user message.

    Raises:
        TypeError: neither a string nor a sequence of :class:`Message`.
        ValueError: no messages.

    Example:
        >>> [m.role for m in as_messages("hi")]
        ['user']
    """
    if isinstance(messages, str):
        return [Message.user(messages)]
    out = list(messages)
    for i, m in enumerate(out):
        if not isinstance(m, Message):
            raise TypeError(f"messages[{i}] must be a Message, got {type(m).__name__}")
    if not out:
        raise ValueError("messages is empty: nothing to send to the model")
    return out


def check_schema(schema: object) -> None:
    """Reject a ``schema`` that is not a pydantic model class (before any request).

    Raises:
        TypeError: naming the value.
    """
    if schema is not None and not (isinstance(schema, type) and issubclass(schema, BaseModel)):
        raise TypeError(f"schema must be a pydantic BaseModel subclass or None, got {schema!r}")


def schema_name(schema: type[BaseModel]) -> str:
    """The schema's name as the APIs accept it (``[A-Za-z0-9_-]``, 1-64 characters).

    Example:
        >>> from pydantic import BaseModel
        >>> class Fact(BaseModel):
        ...     text: str
        >>> schema_name(Fact)
        'Fact'
    """
    return re.sub(r"[^A-Za-z0-9_-]", "_", schema.__name__)[:64] or "answer"


_FENCE = re.compile(r"^\s*```(?:json)?\s*\n?(.*?)\n?\s*```\s*$", re.DOTALL)


def parse_structured(schema: type[SchemaT], answer: str | dict[str, Any]) -> SchemaT:
    r"""Validate a model's answer (JSON text, or an already parsed dict) against ``schema``.

    A JSON answer wrapped in a Markdown code fence (as local models often send) is unwrapped.

    Raises:
        pydantic.ValidationError: invalid JSON, or JSON that does not fit the schema.

    Example:
        >>> from pydantic import BaseModel
        >>> class Fact(BaseModel):
        ...     text: str
        >>> parse_structured(Fact, '```json\n{"text": "likes tea"}\n```').text
        'likes tea'
    """
    if isinstance(answer, str):
        fenced = _FENCE.match(answer)
        return schema.model_validate_json(fenced.group(1) if fenced else answer)
    return schema.model_validate(answer)


def retry_instruction(schema: type[BaseModel], error: ValidationError) -> str:
    """What the model is told after an invalid structured answer (the one retry)."""
    problems = "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '(answer)'}: {e['msg']}"
        for e in error.errors(include_url=False)[:5]
    )
    return (
        f"Your answer was not valid JSON for the {schema_name(schema)} schema ({problems}). "
        "Answer again with only one JSON object that matches the schema:\n"
        + json.dumps(schema.model_json_schema())
    )


def schema_instruction(schema: type[BaseModel]) -> str:
    """The system instruction that asks for the schema (``json_object`` / ``prompt`` modes)."""
    return (
        "Answer with only one JSON object (no prose, no code fence) matching this JSON "
        "Schema:\n" + json.dumps(schema.model_json_schema())
    )


def invalid_output(
    provider: str, model: str, schema: type[BaseModel], error: ValidationError
) -> LLMError:
    """The error for a structured answer still invalid after the retry."""
    first = error.errors(include_url=False)[0]
    where = ".".join(str(p) for p in first["loc"]) or "(answer)"
    return LLMError(
        f"{provider} model {model!r}: the answer is not a valid {schema_name(schema)} after "
        f"one retry ({error.error_count()} errors; {where}: {first['msg']})",
        provider=provider,
        model=model,
        status=None,
    )


def unreadable_response(provider: str, model: str, error: ValueError) -> LLMError:
    """The error for an HTTP response whose body is not the JSON the SDK expects."""
    return LLMError(
        f"{provider} model {model!r}: the server's response is not valid JSON ({error})",
        provider=provider,
        model=model,
        status=None,
    )
