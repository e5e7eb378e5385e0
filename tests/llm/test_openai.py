"""OpenAILLM: the real ``openai`` SDK client against a scripted Chat Completions server."""

from __future__ import annotations

import time
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from marsys_mem import Message
from marsys_mem.exceptions import LLMError
from marsys_mem.llm import LLM
from marsys_mem.llm.openai import OpenAILLM

FAST_RETRY = {"retry-after-ms": "10"}  # the SDK honours the server's delay: tests stay fast


class Fact(BaseModel):
    subject: str
    text: str
    confidence: float


def make(server: Any, **kw: object) -> OpenAILLM:
    kw.setdefault("max_retries", 2)
    return OpenAILLM("local-model", base_url=f"{server.url}/v1", **kw)  # type: ignore[arg-type]


def test_text_completion_sends_the_wire_format(server: Any) -> None:
    server.queue(server.Reply(body=server.chat_completion("Hi there!")))
    with make(server, temperature=0.2, max_tokens=50) as llm:
        assert isinstance(llm, LLM)
        out = llm.complete([Message.system("Be terse."), Message.user("Hello")])
    assert out == "Hi there!"
    [req] = server.requests
    assert req.path == "/v1/chat/completions"
    assert req.body["model"] == "local-model"
    assert req.body["messages"] == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Hello"},
    ]
    assert req.body["temperature"] == 0.2
    assert req.body["max_tokens"] == 50
    assert req.headers["authorization"] == "Bearer unused"  # local servers ignore the key


def test_structured_output_uses_json_schema(server: Any) -> None:
    server.queue(
        server.Reply(
            body=server.chat_completion(
                '{"subject": "ana", "text": "likes tea", "confidence": 0.9}'
            )
        )
    )
    with make(server) as llm:
        fact = llm.complete("What did Ana say?", schema=Fact)
    assert fact == Fact(subject="ana", text="likes tea", confidence=0.9)
    fmt = server.requests[0].body["response_format"]
    assert fmt["type"] == "json_schema"
    assert fmt["json_schema"]["name"] == "Fact"
    assert fmt["json_schema"]["schema"] == Fact.model_json_schema()


def test_malformed_json_then_a_valid_retry(server: Any) -> None:
    server.queue(
        server.Reply(
            body=server.chat_completion('{"subject": "ana", "text": "likes tea"')
        ),  # cut off
        server.Reply(
            body=server.chat_completion(
                '```json\n{"subject": "ana", "text": "t", "confidence": 1}\n```'
            )
        ),
    )
    with make(server) as llm:
        fact = llm.complete("x", schema=Fact)
    assert fact.confidence == 1.0
    first, retry = server.requests
    assert retry.body["messages"][: len(first.body["messages"])] == first.body["messages"]
    assert retry.body["messages"][-2] == {
        "role": "assistant",
        "content": '{"subject": "ana", "text": "likes tea"',
    }
    assert "not valid JSON for the Fact schema" in retry.body["messages"][-1]["content"]


def test_invalid_twice_raises_naming_provider_and_model(server: Any) -> None:
    server.queue(
        server.Reply(body=server.chat_completion("not json")),
        server.Reply(body=server.chat_completion('{"subject": "ana"}')),
    )
    with make(server) as llm, pytest.raises(LLMError) as info:
        llm.complete("x", schema=Fact)
    msg = str(info.value)
    assert "openai model 'local-model'" in msg
    assert "not a valid Fact after one retry" in msg
    assert info.value.status is None
    assert isinstance(info.value.__cause__, ValidationError)
    assert len(server.requests) == 2


def test_429_then_success_uses_the_sdk_retry(server: Any) -> None:
    server.queue(
        server.Reply(
            429,
            server.openai_error("Rate limit reached", "rate_limit_exceeded"),
            headers=FAST_RETRY,
        ),
        server.Reply(
            429,
            server.openai_error("Rate limit reached", "rate_limit_exceeded"),
            headers=FAST_RETRY,
        ),
        server.Reply(body=server.chat_completion("ok after backoff")),
    )
    with make(server) as llm:
        assert llm.complete("hi") == "ok after backoff"
    assert len(server.requests) == 3
    assert server.requests[1].headers["x-stainless-retry-count"] == "1"


def test_500_after_retries_names_provider_model_and_status(server: Any) -> None:
    server.queue(
        *[server.Reply(500, server.openai_error("upstream exploded"), headers=FAST_RETRY)] * 3
    )
    with make(server, max_retries=2) as llm, pytest.raises(LLMError) as info:
        llm.complete("hi")
    err = info.value
    assert (err.provider, err.model, err.status) == ("openai", "local-model", 500)
    assert "openai model 'local-model': HTTP 500: upstream exploded" in str(err)
    assert "max_retries=2" in str(err)
    assert len(server.requests) == 3


def test_400_is_not_retried(server: Any) -> None:
    server.queue(
        server.Reply(400, server.openai_error("bad request: messages", "invalid_request_error"))
    )
    with make(server) as llm, pytest.raises(LLMError, match="HTTP 400") as info:
        llm.complete("hi")
    assert info.value.status == 400
    assert len(server.requests) == 1


def test_timeout(server: Any) -> None:
    server.queue(server.Reply(body=server.chat_completion("too late"), delay=2.0))
    start = time.monotonic()
    with make(server, timeout=0.3, max_retries=0) as llm, pytest.raises(LLMError) as info:
        llm.complete("hi")
    assert time.monotonic() - start < 1.5
    assert info.value.status is None
    assert "openai model 'local-model': timed out after 0.3 s" in str(info.value)


def test_connection_refused_names_the_server() -> None:
    llm = OpenAILLM("m", base_url="http://127.0.0.1:9/v1", max_retries=0, timeout=2)
    with llm, pytest.raises(LLMError, match=r"cannot connect to http://127\.0\.0\.1:9/v1"):
        llm.complete("hi")


def test_refusal_is_an_error(server: Any) -> None:
    server.queue(server.Reply(body=server.chat_completion(None, refusal="I can't help with that.")))
    with make(server) as llm, pytest.raises(LLMError, match="refused: I can't help"):
        llm.complete("x", schema=Fact)


def test_reply_returns_a_message_with_tool_calls(server: Any) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
    server.queue(server.Reply(body=server.chat_completion(None, tool_calls=[call])))
    with make(server) as llm:
        msg = llm.reply("Weather?")
    assert msg.tool_calls[0].name == "weather"
    assert msg.metadata["usage"]["total_tokens"] == 13


def test_json_object_mode_puts_the_schema_in_the_prompt(server: Any) -> None:
    server.queue(
        server.Reply(body=server.chat_completion('{"subject": "a", "text": "b", "confidence": 0}'))
    )
    with make(server, structured="json_object") as llm:
        llm.complete("x", schema=Fact)
    body = server.requests[0].body
    assert body["response_format"] == {"type": "json_object"}
    assert body["messages"][0]["role"] == "system"
    assert '"confidence"' in body["messages"][0]["content"]


async def test_async_twin_with_429_then_structured(server: Any) -> None:
    server.queue(
        server.Reply(429, server.openai_error("slow down"), headers=FAST_RETRY),
        server.Reply(body=server.chat_completion("nope")),
        server.Reply(
            body=server.chat_completion('{"subject": "a", "text": "b", "confidence": 0.5}')
        ),
    )
    async with make(server) as llm:
        fact = await llm.acomplete([Message.user("x")], schema=Fact)
    assert fact.confidence == 0.5
    assert len(server.requests) == 3


def test_bad_settings_name_field_and_value() -> None:
    with pytest.raises(ValidationError, match="timeout") as info:
        OpenAILLM("m", base_url="http://x/v1", timeout=-1)
    assert "-1" in str(info.value)
    with pytest.raises(ValidationError, match="structured"):
        OpenAILLM("m", base_url="http://x/v1", structured="xml")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="schema must be a pydantic BaseModel subclass"):
        OpenAILLM("m", base_url="http://x/v1").complete("x", schema=dict)  # type: ignore[type-var]


def test_no_api_key_for_openai_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(LLMError, match="no API key"):
        OpenAILLM("gpt-4o-mini")


def test_summarizer_plugs_into_the_summarize_strategy(server: Any) -> None:
    from marsys_mem import ContextPolicy, ConversationMemory
    from marsys_mem.llm import LLMSummarizer

    server.queue(server.Reply(body=server.chat_completion("Ana lives in Oslo and likes tea.")))
    mem = ConversationMemory([Message.system("Be terse.")])
    for i in range(12):
        mem.add(Message.user(f"Fact number {i}: Ana lives in Oslo and likes tea. " * 3))
    with make(server) as llm:
        win = mem.context(
            ContextPolicy(max_tokens=200, strategy="summarize", keep_recent=2),
            summarizer=LLMSummarizer(llm),
        )
    assert win.summary is not None
    assert "Ana lives in Oslo" in str(win.summary)
    sent = server.requests[0].body["messages"]
    assert sent[0]["role"] == "system"
    assert 'user: "Fact number 0' in sent[1]["content"]


def test_a_response_body_that_is_not_json_is_an_llm_error(server: Any) -> None:
    server.queue(
        server.Reply(200, '{"id": "x", "choices": [', headers={"content-type": "application/json"})
    )
    with make(server) as llm, pytest.raises(LLMError) as info:
        llm.complete("hello")
    assert info.value.provider == "openai"
    assert info.value.model == "local-model"
    assert "not valid JSON" in str(info.value)


async def test_async_a_response_body_that_is_not_json_is_an_llm_error(server: Any) -> None:
    server.queue(server.Reply(200, "<html>oops", headers={"content-type": "application/json"}))
    async with make(server) as llm:
        with pytest.raises(LLMError, match="not valid JSON"):
            await llm.acomplete("hello")
