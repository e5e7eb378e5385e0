"""AnthropicLLM: the real ``anthropic`` SDK client against a scripted Messages API server."""

from __future__ import annotations

import time
from typing import Any

import pytest
from pydantic import BaseModel

from marsys_mem import Message
from marsys_mem.exceptions import LLMError
from marsys_mem.llm import LLM
from marsys_mem.llm.anthropic import AnthropicLLM

FAST_RETRY = {"retry-after-ms": "10"}


class Fact(BaseModel):
    subject: str
    text: str


def make(server: Any, **kw: Any) -> AnthropicLLM:
    return AnthropicLLM("claude-test", base_url=server.url, api_key="k", **kw)


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


def tool(inp: Any, tid: str = "toolu_1") -> dict[str, Any]:
    return {"type": "tool_use", "id": tid, "name": "Fact", "input": inp}


def test_text_with_system_and_wire_format(server: Any) -> None:
    server.queue(server.Reply(body=server.anthropic_message(text("Hello "), text("there"))))
    with make(server, temperature=0.1) as llm:
        assert isinstance(llm, LLM)
        out = llm.complete([Message.system("Be terse."), Message.user("Hi")])
    assert out == "Hello there"
    [req] = server.requests
    assert req.path == "/v1/messages"
    assert "anthropic-version" in req.headers
    assert "k" in (req.headers.get("x-api-key"), req.headers.get("authorization", "")[7:])
    assert req.body["system"] == "Be terse."
    assert req.body["messages"] == [{"role": "user", "content": "Hi"}]
    assert req.body["max_tokens"] == 1024
    assert req.body["temperature"] == 0.1


def test_structured_output_through_forced_tool_use(server: Any) -> None:
    body = server.anthropic_message(tool({"subject": "ana", "text": "tea"}), stop_reason="tool_use")
    server.queue(server.Reply(body=body))
    with make(server) as llm:
        assert llm.complete("x", schema=Fact) == Fact(subject="ana", text="tea")
    req = server.requests[0].body
    assert req["tool_choice"] == {"type": "tool", "name": "Fact"}
    assert req["tools"][0]["input_schema"] == Fact.model_json_schema()


def test_invalid_tool_input_then_valid_retry(server: Any) -> None:
    server.queue(
        server.Reply(
            body=server.anthropic_message(tool({"subject": "ana"}), stop_reason="tool_use")
        ),
        server.Reply(
            body=server.anthropic_message(
                tool({"subject": "ana", "text": "tea"}, "toolu_2"), stop_reason="tool_use"
            )
        ),
    )
    with make(server) as llm:
        assert llm.complete("x", schema=Fact).text == "tea"
    retry = server.requests[1].body["messages"]
    assert retry[-2]["role"] == "assistant"
    assert retry[-2]["content"][0]["type"] == "tool_use"
    result = retry[-1]["content"][0]
    assert (result["type"], result["tool_use_id"], result["is_error"]) == (
        "tool_result",
        "toolu_1",
        True,
    )
    assert "text: Field required" in result["content"]


def test_malformed_json_text_then_valid_retry(server: Any) -> None:
    server.queue(
        server.Reply(body=server.anthropic_message(text('{"subject": "ana", "text": '))),
        server.Reply(body=server.anthropic_message(text('{"subject": "ana", "text": "tea"}'))),
    )
    with make(server) as llm:
        assert llm.complete("x", schema=Fact).subject == "ana"
    assert server.requests[1].body["messages"][-1]["role"] == "user"


def test_invalid_twice_raises(server: Any) -> None:
    bad = server.anthropic_message(tool({"subject": 1}), stop_reason="tool_use")
    server.queue(server.Reply(body=bad), server.Reply(body=bad))
    with make(server) as llm, pytest.raises(LLMError, match="not a valid Fact after one retry"):
        llm.complete("x", schema=Fact)


def test_429_then_success(server: Any) -> None:
    err = server.anthropic_error("rate limited", "rate_limit_error")
    server.queue(
        server.Reply(429, err, headers=FAST_RETRY),
        server.Reply(body=server.anthropic_message(text("ok"))),
    )
    with make(server) as llm:
        assert llm.complete("hi") == "ok"
    assert len(server.requests) == 2


def test_500_and_overloaded_after_retries(server: Any) -> None:
    server.queue(
        server.Reply(500, server.anthropic_error("boom"), headers=FAST_RETRY),
        server.Reply(
            529, server.anthropic_error("Overloaded", "overloaded_error"), headers=FAST_RETRY
        ),
    )
    with make(server, max_retries=1) as llm, pytest.raises(LLMError) as info:
        llm.complete("hi")
    assert (info.value.provider, info.value.model, info.value.status) == (
        "anthropic",
        "claude-test",
        529,
    )
    assert "anthropic model 'claude-test': HTTP 529: Overloaded" in str(info.value)


def test_timeout(server: Any) -> None:
    server.queue(server.Reply(body=server.anthropic_message(text("late")), delay=2.0))
    start = time.monotonic()
    with make(server, timeout=0.3, max_retries=0) as llm, pytest.raises(LLMError) as info:
        llm.complete("hi")
    assert time.monotonic() - start < 1.5
    assert "timed out after 0.3 s" in str(info.value)


async def test_async_twin_and_reply(server: Any) -> None:
    server.queue(
        server.Reply(500, server.anthropic_error("boom"), headers=FAST_RETRY),
        server.Reply(body=server.anthropic_message(tool({"subject": "a", "text": "b"}))),
        server.Reply(body=server.anthropic_message(text("fine"))),
    )
    async with make(server) as llm:
        assert (await llm.acomplete("x", schema=Fact)).text == "b"
        msg = await llm.areply("y")
    assert msg.text == "fine"
    assert msg.metadata["usage"] == {"input_tokens": 10, "output_tokens": 3}


def test_no_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(LLMError, match="no API key"):
        AnthropicLLM("claude-test")


def test_a_response_body_that_is_not_json_is_an_llm_error(server: Any) -> None:
    server.queue(
        server.Reply(200, '{"id": "x", "content": [', headers={"content-type": "application/json"})
    )
    with make(server) as llm, pytest.raises(LLMError) as info:
        llm.complete("hello")
    assert info.value.provider == "anthropic"
    assert info.value.model == "claude-test"
    assert "not valid JSON" in str(info.value)
