"""``Message.from_llm`` / ``from_llm_dict`` read the official SDKs' response objects."""

from __future__ import annotations

import pytest
from anthropic.types import Message as AnthropicMessage
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from marsys_mem import Message, ToolCall
from marsys_mem.exceptions import MessageFormatError

CHAT = {
    "id": "c1",
    "object": "chat.completion",
    "created": 1,
    "model": "gpt-x",
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": None,
                "refusal": None,
                "tool_calls": [
                    {
                        "id": "t1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            },
        }
    ],
    "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
}
ANTHROPIC = {
    "id": "m1",
    "type": "message",
    "role": "assistant",
    "model": "claude-x",
    "content": [
        {"type": "text", "text": "Checking.", "citations": None},
        {"type": "tool_use", "id": "tu1", "name": "weather", "input": {"city": "Oslo"}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 4, "output_tokens": 5},
}
RESPONSE = {
    "id": "r1",
    "object": "response",
    "created_at": 1,
    "model": "gpt-x",
    "status": "completed",
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
    "output": [
        {
            "type": "message",
            "id": "m",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Checking.", "annotations": []}],
        },
        {
            "type": "function_call",
            "id": "fc",
            "call_id": "t1",
            "name": "weather",
            "arguments": '{"city": "Oslo"}',
            "status": "completed",
        },
    ],
}
CALL = ToolCall(id="t1", name="weather", arguments={"city": "Oslo"})


def test_chat_completion_object() -> None:
    msg = Message.from_llm(ChatCompletion.model_validate(CHAT))
    assert msg.role == "assistant"
    assert msg.tool_calls == (CALL,)
    assert msg.metadata["usage"]["total_tokens"] == 3
    assert msg.metadata["finish_reason"] == "tool_calls"
    # the same message as from the wire dict
    assert Message.from_llm_dict(CHAT).tool_calls == msg.tool_calls


def test_anthropic_message_object() -> None:
    obj = AnthropicMessage.model_validate(ANTHROPIC)
    msg = Message.from_llm(obj)
    assert (msg.text, msg.tool_calls) == ("Checking.", (CALL.model_copy(update={"id": "tu1"}),))
    assert msg.metadata["stop_reason"] == "tool_use"
    assert Message.from_llm_dict(obj).text == "Checking."  # from_llm_dict takes objects too


def test_responses_response_and_item_objects() -> None:
    resp = Response.model_validate(RESPONSE)
    msg = Message.from_llm(resp)
    assert (msg.text, msg.tool_calls) == ("Checking.", (CALL,))
    item = Message.from_llm(resp.output[1])
    assert item.role == "assistant"
    assert item.tool_calls == (CALL,)


def test_dicts_still_work_and_other_objects_are_refused() -> None:
    assert Message.from_llm({"role": "user", "content": "hi"}).text == "hi"
    with pytest.raises(MessageFormatError, match="expected a dict, got Message"):
        Message.from_llm(Message.user("already a message"))
    with pytest.raises(MessageFormatError, match="expected a dict, got int"):
        Message.from_llm(3)
