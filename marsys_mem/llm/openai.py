"""The :class:`~marsys_mem.llm.base.LLM` protocol over the official ``openai`` SDK.

One adapter, :class:`OpenAILLM`, for OpenAI itself, Azure OpenAI (:meth:`OpenAILLM.azure`)
and every server that speaks the Chat Completions API (``base_url``: vLLM, Ollama,
llama.cpp's server, LM Studio). Install with ``pip install 'marsys-mem[openai]'``.

Timeouts and retries are the SDK's own: ``timeout`` seconds per attempt, ``max_retries``
retries on connection errors, timeouts, 408, 409, 429 and 5xx with exponential backoff and
jitter, honouring the server's ``Retry-After``. What still fails raises
:class:`~marsys_mem.exceptions.LLMError` naming the provider, the model and the HTTP status.
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
    StructuredMode,
    as_messages,
    check_schema,
    invalid_output,
    parse_structured,
    retry_instruction,
    schema_instruction,
    schema_name,
    unreadable_response,
)
from marsys_mem.model.messages import Message, to_llm_format

try:
    import openai
    from openai.types.chat import ChatCompletion
except ModuleNotFoundError as exc:  # pragma: no cover - the extra is installed in CI
    raise MissingDependencyError(
        "OpenAILLM needs the openai SDK: pip install 'marsys-mem[openai]'"
    ) from exc

__all__ = ["OpenAILLM"]


def _api_message(body: object, fallback: str) -> str:
    """The provider's own error message (``{"error": {"message": ...}}``), else the SDK's."""
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])[:500]
    return fallback[:500]


class OpenAILLM(SDKAdapter[openai.OpenAI, openai.AsyncOpenAI]):
    """Chat Completions through the official ``openai`` SDK (OpenAI, Azure, compatible servers).

    Args:
        model: the model name (for Azure, the deployment).
        base_url: an OpenAI-compatible server (``http://localhost:11434/v1`` for Ollama,
            ``http://localhost:8000/v1`` for vLLM, ...); ``None``: OpenAI.
        api_key: the key; ``None``: ``$OPENAI_API_KEY``, or a placeholder when ``base_url``
            is set (local servers ignore it).
        timeout: seconds per HTTP attempt.
        max_retries: the SDK's retries on 408/409/429/5xx, timeouts and connection errors.
        temperature: sampling temperature (``None``: the server's default).
        max_tokens: most tokens to generate (sent as ``max_completion_tokens`` to OpenAI and
            Azure, as ``max_tokens`` to a ``base_url`` server).
        structured: how a ``schema`` is asked for: ``json_schema`` (``response_format`` with
            the schema; OpenAI, vLLM, Ollama, llama.cpp and LM Studio accept it),
            ``json_object`` or ``prompt`` for servers that do not.
        provider: the name errors use (``"openai"``; :meth:`azure` sets ``"azure"``).
        client: an ``openai.OpenAI`` (or ``AzureOpenAI``) client to use as it is (its own
            timeout and retries); ``None``: one is made from the arguments above.
        async_client: likewise, an ``openai.AsyncOpenAI`` for :meth:`acomplete`.

    Raises:
        pydantic.ValidationError: a bad setting (named, with its value).
        LLMError: no API key for OpenAI itself.

    Example:
        >>> llm = OpenAILLM("llama3.2", base_url="http://localhost:11434/v1", timeout=30)
        >>> llm.provider, llm.model, llm.settings.max_retries
        ('openai', 'llama3.2', 2)
        >>> # llm.complete("Say hi")                    -> 'Hi!'
        >>> # llm.complete(messages, schema=MyModel)    -> MyModel(...)
        >>> llm.close()
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 2,
        temperature: float | None = None,
        max_tokens: int | None = None,
        structured: StructuredMode = "json_schema",
        provider: str = "openai",
        client: openai.OpenAI | None = None,
        async_client: openai.AsyncOpenAI | None = None,
    ) -> None:
        self.settings = LLMSettings(
            model=model,
            base_url=base_url,
            timeout=timeout,
            max_retries=max_retries,
            temperature=temperature,
            max_tokens=max_tokens,
            structured=structured,
        )
        self.provider = provider
        self.model = model
        key = api_key or os.environ.get("OPENAI_API_KEY") or ("unused" if base_url else None)
        if key is None and (client is None or async_client is None):
            raise LLMError(
                f"{provider} model {model!r}: no API key (pass api_key= or set OPENAI_API_KEY)",
                provider=provider,
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
            lambda: openai.OpenAI(**client_settings),
            lambda: openai.AsyncOpenAI(**client_settings),
            client,
            async_client,
        )

    @classmethod
    def azure(
        cls,
        deployment: str,
        *,
        endpoint: str,
        api_version: str,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 2,
        temperature: float | None = None,
        max_tokens: int | None = None,
    ) -> OpenAILLM:
        """An adapter for an Azure OpenAI deployment (key: ``$AZURE_OPENAI_API_KEY``).

        Example:
            >>> llm = OpenAILLM.azure("gpt-4o-mini", endpoint="https://x.openai.azure.com",
            ...                       api_version="2024-10-21", api_key="k")
            >>> llm.provider
            'azure'
            >>> llm.close()
        """
        settings = LLMSettings(model=deployment, timeout=timeout, max_retries=max_retries)
        key = api_key or os.environ.get("AZURE_OPENAI_API_KEY")
        if not key:
            raise LLMError(
                f"azure model {deployment!r}: no API key (pass api_key= or set "
                "AZURE_OPENAI_API_KEY)",
                provider="azure",
                model=deployment,
                status=None,
            )
        common: dict[str, Any] = {
            "azure_endpoint": endpoint,
            "api_version": api_version,
            "api_key": key,
            "timeout": settings.timeout,
            "max_retries": settings.max_retries,
        }
        llm = cls(
            deployment,
            timeout=timeout,
            max_retries=max_retries,
            temperature=temperature,
            max_tokens=max_tokens,
            provider="azure",
            api_key=key,
        )
        llm.clients = SDKClients(
            lambda: openai.AzureOpenAI(**common), lambda: openai.AsyncAzureOpenAI(**common)
        )
        return llm

    # ------------------------------------------------------------------ requests
    def _request(self, messages: list[Message], schema: type[SchemaT] | None) -> dict[str, Any]:
        payload: list[dict[str, Any]] = to_llm_format(messages, "openai")
        kw: dict[str, Any] = {"model": self.model, "messages": payload}
        s = self.settings
        if s.temperature is not None:
            kw["temperature"] = s.temperature
        if s.max_tokens is not None:
            kw["max_tokens" if s.base_url else "max_completion_tokens"] = s.max_tokens
        if schema is not None:
            if s.structured == "json_schema":
                kw["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {
                        "name": schema_name(schema),
                        "schema": schema.model_json_schema(),
                    },
                }
            else:
                if s.structured == "json_object":
                    kw["response_format"] = {"type": "json_object"}
                kw["messages"] = [
                    {"role": "system", "content": schema_instruction(schema)},
                    *payload,
                ]
        return kw

    @staticmethod
    def _retry(
        kw: dict[str, Any], answer: str, schema: type[SchemaT], exc: ValidationError
    ) -> dict[str, Any]:
        return {
            **kw,
            "messages": [
                *kw["messages"],
                {"role": "assistant", "content": answer},
                {"role": "user", "content": retry_instruction(schema, exc)},
            ],
        }

    def _error(self, exc: openai.OpenAIError) -> LLMError:
        where = f"{self.provider} model {self.model!r}"
        status: int | None = None
        if isinstance(exc, openai.APITimeoutError):
            detail = (
                f"timed out after {self.settings.timeout:g} s per attempt "
                f"(max_retries={self.settings.max_retries})"
            )
        elif isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            detail = f"HTTP {status}: {_api_message(exc.body, exc.message)}"
            if status == 429 or status >= 500:
                detail += f" (after max_retries={self.settings.max_retries} with backoff)"
        elif isinstance(exc, openai.APIConnectionError):
            url = self.settings.base_url or "the OpenAI API"
            detail = f"cannot connect to {url}: {exc} (max_retries={self.settings.max_retries})"
        else:
            detail = f"{type(exc).__name__}: {exc}"
        return LLMError(
            f"{where}: {detail}", provider=self.provider, model=self.model, status=status
        )

    def _text(self, resp: ChatCompletion) -> str:
        if not resp.choices:
            raise LLMError(
                f"{self.provider} model {self.model!r}: the response has no choices",
                provider=self.provider,
                model=self.model,
                status=None,
            )
        choice = resp.choices[0]
        refusal = getattr(choice.message, "refusal", None)
        if not choice.message.content and refusal:
            raise LLMError(
                f"{self.provider} model {self.model!r} refused: {refusal}",
                provider=self.provider,
                model=self.model,
                status=None,
            )
        return choice.message.content or ""

    def _call(self, kw: dict[str, Any]) -> ChatCompletion:
        try:
            resp: ChatCompletion = self.clients.sync().chat.completions.create(**kw)
        except openai.OpenAIError as exc:
            raise self._error(exc) from exc
        except json.JSONDecodeError as exc:
            raise unreadable_response(self.provider, self.model, exc) from exc
        return resp

    async def _acall(self, kw: dict[str, Any]) -> ChatCompletion:
        try:
            resp: ChatCompletion = await self.clients.async_().chat.completions.create(**kw)
        except openai.OpenAIError as exc:
            raise self._error(exc) from exc
        except json.JSONDecodeError as exc:
            raise unreadable_response(self.provider, self.model, exc) from exc
        return resp

    # ------------------------------------------------------------------ the protocol
    @overload
    def complete(self, messages: Prompt, schema: None = None) -> str: ...
    @overload
    def complete(self, messages: Prompt, schema: type[SchemaT]) -> SchemaT: ...
    def complete(self, messages: Prompt, schema: type[SchemaT] | None = None) -> str | SchemaT:
        """The model's answer to ``messages``: text, or a validated ``schema`` instance.

        An invalid structured answer is retried once, with the validation errors.

        Raises:
            LLMError: an HTTP error left after the SDK's retries, a timeout, a refusal, or
                a structured answer still invalid after the retry.
        """
        check_schema(schema)
        kw = self._request(as_messages(messages), schema)
        text = self._text(self._call(kw))
        if schema is None:
            return text
        try:
            return parse_structured(schema, text)
        except ValidationError as exc:
            retry = self._retry(kw, text, schema, exc)
        text = self._text(self._call(retry))
        try:
            return parse_structured(schema, text)
        except ValidationError as exc:
            raise invalid_output(self.provider, self.model, schema, exc) from exc

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
        text = self._text(await self._acall(kw))
        if schema is None:
            return text
        try:
            return parse_structured(schema, text)
        except ValidationError as exc:
            retry = self._retry(kw, text, schema, exc)
        text = self._text(await self._acall(retry))
        try:
            return parse_structured(schema, text)
        except ValidationError as exc:
            raise invalid_output(self.provider, self.model, schema, exc) from exc

    def reply(self, messages: Prompt) -> Message:
        """The model's answer as a :class:`Message` (tool calls, usage, model in metadata).

        Raises:
            LLMError: as :meth:`complete`.
        """
        return Message.from_llm(self._call(self._request(as_messages(messages), None)))

    async def areply(self, messages: Prompt) -> Message:
        """Async :meth:`reply`."""
        return Message.from_llm(await self._acall(self._request(as_messages(messages), None)))
