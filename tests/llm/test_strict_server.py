"""The loopback server is as strict as the real APIs: it refuses what they refuse (issue 29)."""

from __future__ import annotations

import anthropic
import openai
import pytest

from marsys_mem import ContextPolicy, ConversationMemory, Message, ToolCall
from marsys_mem.testing.llm_server import (
    Reply,
    ScriptedServer,
    anthropic_message,
    chat_completion,
)


def test_an_assistant_first_messages_request_gets_anthropics_400() -> None:
    with ScriptedServer() as srv:
        srv.queue(Reply(body=anthropic_message({"type": "text", "text": "never sent"})))
        client = anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as err:
            client.messages.create(
                model="claude-test",
                max_tokens=10,
                messages=[{"role": "assistant", "content": "Hello!"},
                          {"role": "user", "content": "hi"}],
            )
        assert err.value.status_code == 400
        assert err.value.body == {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": 'messages: first message must use the "user" role',
            },
        }
        assert len(srv.replies) == 1  # the queued reply was not used
        ok = client.messages.create(
            model="claude-test", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
        assert ok.content[0].text == "never sent"  # type: ignore[union-attr]


def test_a_window_of_a_long_history_is_accepted_where_the_old_one_was_refused() -> None:
    mem = ConversationMemory([Message.system("Be terse.")])
    for i in range(8):
        mem.add(Message.user(f"question {i} " + "words " * 10))
        mem.add(Message.assistant("", tool_calls=[ToolCall(id=f"c{i}", name="f")]))
        mem.add(Message.tool("result " * 10, tool_call_id=f"c{i}"))
        mem.add(Message.assistant(f"answer {i} " + "words " * 10))
    with ScriptedServer() as srv:
        client = anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0)
        old = mem.context(ContextPolicy(max_messages=4, start_on="any"))
        with pytest.raises(anthropic.BadRequestError, match="first message must use the"):
            client.messages.create(model="m", max_tokens=5, **old.to_llm_format("anthropic"))
        srv.queue(Reply(body=anthropic_message({"type": "text", "text": "ok"})))
        new = mem.context(ContextPolicy(max_messages=5))
        out = client.messages.create(model="m", max_tokens=5, **new.to_llm_format("anthropic"))
        assert out.content[0].text == "ok"  # type: ignore[union-attr]


def test_openai_refusals_have_openais_error_shape() -> None:
    with ScriptedServer() as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "q"},
                          {"role": "tool", "tool_call_id": "c1", "content": "72F"}],
            )
        assert err.value.status_code == 400
        assert err.value.body == {
            "message": "Invalid parameter: messages with role 'tool' must be a response to a "
            "preceeding message with 'tool_calls'.",
            "type": "invalid_request_error",
            "param": "messages.[1].role",
            "code": None,
        }
        with pytest.raises(openai.BadRequestError, match="No tool call found"):
            client.responses.create(
                model="m",
                input=[{"type": "function_call_output", "call_id": "c1", "output": "72F"}],
            )
        srv.queue(Reply(body=chat_completion("fine")))
        ok = client.chat.completions.create(
            model="m", messages=[{"role": "assistant", "content": "Hi!"},
                                 {"role": "user", "content": "q"}],
        )  # Chat Completions takes an assistant-first list
        assert ok.choices[0].message.content == "fine"


def test_strict_false_accepts_anything() -> None:
    with ScriptedServer(strict=False) as srv:
        srv.queue(Reply(body=anthropic_message({"type": "text", "text": "taken"})))
        client = anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0)
        out = client.messages.create(
            model="m", max_tokens=5, messages=[{"role": "assistant", "content": "Hello!"}]
        )
        assert out.content[0].text == "taken"  # type: ignore[union-attr]
