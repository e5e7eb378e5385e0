"""The :class:`~marsys_mem.llm.base.LLM` protocol over the official ``anthropic`` SDK.

Structured output goes through tool use: the schema is the input schema of one tool the
model is made to call (``tool_choice``), and the call's input is validated with pydantic;
an invalid input is answered with an ``is_error`` tool result and retried once. Timeouts and
retries are the SDK's own (``timeout`` per attempt; ``max_retries`` on connection errors,
408, 409, 429 and 5xx with exponential backoff, honouring ``Retry-After``). Install with
``pip install 'marsys-mem[anthropic]'``.
"""

from __future__ import annotations

import json
import os
from typing import Any, overload

from pydantic import ValidationError

from marsys_mem.exceptions import LLMError, MissingDependencyError
from marsys_mem.llm.base import (
    LLMSettings,
    Prompt,
    SchemaT,
    SDKAdapter,
    SDKClients,
    as_messages,
    check_schema,
    invalid_output,
    parse_structured,
    retry_instruction,
    schema_name,
    unreadable_response,
)
from marsys_mem.model.messages import Message, to_llm_format

try:
    import anthropic
    from anthropic.types import Message as AnthropicMessage
except ModuleNotFoundError as exc:  # pragma: no cover - the extra is installed in CI
    raise MissingDependencyError(
        "AnthropicLLM needs the anthropic SDK: pip install 'marsys-mem[anthropic]'"
    ) from exc

__all__ = ["AnthropicLLM"]

DEFAULT_MAX_TOKENS = 1024
"""``max_tokens`` when none is given (the Messages API requires one)."""


def _api_message(body: object, fallback: str) -> str:
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])[:500]
    return fallback[:500]


class AnthropicLLM(SDKAdapter[anthropic.Anthropic, anthropic.AsyncAnthropic]):
    """Claude through the official ``anthropic`` SDK's Messages API.

    Args:
        model: the model name.
        base_url: another endpoint (a proxy, a gateway); ``None``: Anthropic's.
        api_key: the key; ``None``: ``$ANTHROPIC_API_KEY``.
        timeout: seconds per HTTP attempt.
        max_retries: the SDK's retries on 408/409/429/5xx, timeouts and connection errors.
        temperature: sampling temperature (``None``: the API's default); sent in the body
            as ``temperature`` (the SDK's ``extra_body``: anthropic 2.x has no such argument;
            newer models may reject it).
        max_tokens: most tokens to generate (default 1024).
        client: an ``anthropic.Anthropic`` client to use as it is; ``None``: one is made.
        async_client: likewise, an ``anthropic.AsyncAnthropic`` for :meth:`acomplete`.

    Raises:
        pydantic.ValidationError: a bad setting (named, with its value).
        LLMError: no API key.

    Example:
        >>> llm = AnthropicLLM("claude-haiku-4-5", api_key="sk-ant-...", timeout=30)
        >>> llm.provider, llm.settings.max_tokens
        ('anthropic', 1024)
        >>> llm.close()
    """

    provider = "anthropic"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 2,
        temperature: float | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        client: anthropic.Anthropic | None = None,
        async_client: anthropic.AsyncAnthropic | None = None,
    ) -> None:
        self.settings = LLMSettings(
            model=model,
            base_url=base_url,
            timeout=timeout,
            max_retries=max_retries,
            temperature=temperature,
            max_tokens=max_tokens,
        )
        self.model = model
        key = api_key or os.environ.get("ANTHROPIC_API_KEY")
        if not key and (client is None or async_client is None):
            raise LLMError(
                f"anthropic model {model!r}: no API key (pass api_key= or set ANTHROPIC_API_KEY)",
                provider="anthropic",
                model=model,
                status=None,
            )
        self._api_key = key
        client_settings: dict[str, Any] = {
            "api_key": key,
            "base_url": self.settings.base_url,
            "timeout": self.settings.timeout,
            "max_retries": self.settings.max_retries,
        }
        self.clients = SDKClients(
            lambda: anthropic.Anthropic(**client_settings),
            lambda: anthropic.AsyncAnthropic(**client_settings),
            client,
            async_client,
        )

    # ------------------------------------------------------------------ requests
    def _request(self, messages: list[Message], schema: type[SchemaT] | None) -> dict[str, Any]:
        payload = to_llm_format(messages, "anthropic")
        kw: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.settings.max_tokens or DEFAULT_MAX_TOKENS,
            "messages": payload["messages"],
        }
        if payload.get("system"):
            kw["system"] = payload["system"]
        if self.settings.temperature is not None:  # not a parameter of the SDK since 2.x
            kw["extra_body"] = {"temperature": self.settings.temperature}
        if schema is not None:
            name = schema_name(schema)
            kw["tools"] = [
                {
                    "name": name,
                    "description": f"Record the answer as one {name} object.",
                    "input_schema": schema.model_json_schema(),
                }
            ]
            kw["tool_choice"] = {"type": "tool", "name": name}
        return kw

    def _error(self, exc: anthropic.AnthropicError) -> LLMError:
        where = f"anthropic model {self.model!r}"
        status: int | None = None
        retries = self.settings.max_retries
        if isinstance(exc, anthropic.APITimeoutError):
            detail = (
                f"timed out after {self.settings.timeout:g} s per attempt (max_retries={retries})"
            )
        elif isinstance(exc, anthropic.APIStatusError):
            status = exc.status_code
            detail = f"HTTP {status}: {_api_message(exc.body, exc.message)}"
            if status == 429 or status >= 500:
                detail += f" (after max_retries={retries} with backoff)"
        elif isinstance(exc, anthropic.APIConnectionError):
            url = self.settings.base_url or "the Anthropic API"
            detail = f"cannot connect to {url}: {exc} (max_retries={retries})"
        else:
            detail = f"{type(exc).__name__}: {exc}"
        return LLMError(f"{where}: {detail}", provider="anthropic", model=self.model, status=status)

    def _check(self, resp: AnthropicMessage) -> AnthropicMessage:
        if resp.stop_reason == "refusal":
            raise LLMError(
                f"anthropic model {self.model!r} refused: {self._text(resp)[:200]}",
                provider="anthropic",
                model=self.model,
                status=None,
            )
        return resp

    @staticmethod
    def _text(resp: AnthropicMessage) -> str:
        return "".join(b.text for b in resp.content if b.type == "text")

    @staticmethod
    def _answer(resp: AnthropicMessage, schema: type[SchemaT]) -> tuple[str | None, Any]:
        """The tool_use id and input answering ``schema``, else ``(None, the text)``."""
        name = schema_name(schema)
        for block in resp.content:
            if block.type == "tool_use" and block.name == name:
                return block.id, block.input
        return None, "".join(b.text for b in resp.content if b.type == "text")

    @staticmethod
    def _retry(
        kw: dict[str, Any],
        resp: AnthropicMessage,
        tool_id: str | None,
        schema: type[SchemaT],
        exc: ValidationError,
    ) -> dict[str, Any]:
        note = retry_instruction(schema, exc)
        turn: Any = (
            [{"type": "tool_result", "tool_use_id": tool_id, "is_error": True, "content": note}]
            if tool_id is not None
            else note
        )
        previous = [b.model_dump(mode="json", exclude_none=True) for b in resp.content]
        return {
            **kw,
            "messages": [
                *kw["messages"],
                {"role": "assistant", "content": previous},
                {"role": "user", "content": turn},
            ],
        }

    def _call(self, kw: dict[str, Any]) -> AnthropicMessage:
        try:
            resp: AnthropicMessage = self.clients.sync().messages.create(**kw)
        except anthropic.AnthropicError as exc:
            raise self._error(exc) from exc
        except json.JSONDecodeError as exc:
            raise unreadable_response(self.provider, self.model, exc) from exc
        return self._check(resp)

    async def _acall(self, kw: dict[str, Any]) -> AnthropicMessage:
        try:
            resp: AnthropicMessage = await self.clients.async_().messages.create(**kw)
        except anthropic.AnthropicError as exc:
            raise self._error(exc) from exc
        except json.JSONDecodeError as exc:
            raise unreadable_response(self.provider, self.model, exc) from exc
        return self._check(resp)

    # ------------------------------------------------------------------ the protocol
    @overload
    def complete(self, messages: Prompt, schema: None = None) -> str: ...
    @overload
    def complete(self, messages: Prompt, schema: type[SchemaT]) -> SchemaT: ...
    def complete(self, messages: Prompt, schema: type[SchemaT] | None = None) -> str | SchemaT:
        """The model's answer to ``messages``: text, or a validated ``schema`` instance.

        Raises:
            LLMError: an HTTP error left after the SDK's retries, a timeout, a refusal, or
                a structured answer still invalid after the one retry.
        """
        check_schema(schema)
        kw = self._request(as_messages(messages), schema)
        resp = self._call(kw)
        if schema is None:
            return self._text(resp)
        tool_id, answer = self._answer(resp, schema)
        try:
            return parse_structured(schema, answer)
        except ValidationError as exc:
            retry = self._retry(kw, resp, tool_id, schema, exc)
        _, answer = self._answer(self._call(retry), schema)
        try:
            return parse_structured(schema, answer)
        except ValidationError as exc:
            raise invalid_output("anthropic", self.model, schema, exc) from exc

    @overload
    async def acomplete(self, messages: Prompt, schema: None = None) -> str: ...
    @overload
    async def acomplete(self, messages: Prompt, schema: type[SchemaT]) -> SchemaT: ...
    async def acomplete(
        self, messages: Prompt, schema: type[SchemaT] | None = None
    ) -> str | SchemaT:
        """Async :meth:`complete`."""
        check_schema(schema)
        kw = self._request(as_messages(messages), schema)
        resp = await self._acall(kw)
        if schema is None:
            return self._text(resp)
        tool_id, answer = self._answer(resp, schema)
        try:
            return parse_structured(schema, answer)
        except ValidationError as exc:
            retry = self._retry(kw, resp, tool_id, schema, exc)
        _, answer = self._answer(await self._acall(retry), schema)
        try:
            return parse_structured(schema, answer)
        except ValidationError as exc:
            raise invalid_output("anthropic", self.model, schema, exc) from exc

    def reply(self, messages: Prompt) -> Message:
        """The model's answer as a :class:`Message` (tool calls, usage, model in metadata)."""
        return Message.from_llm(self._call(self._request(as_messages(messages), None)))

    async def areply(self, messages: Prompt) -> Message:
        """Async :meth:`reply`."""
        return Message.from_llm(await self._acall(self._request(as_messages(messages), None)))
