"""OpenAI Responses API items in and out: ``Message.from_llm_dict`` and ``"responses"``.

The item shapes are the ones the ``openai`` package's own types dump (checked against its
``ResponseInputItemParam`` adapter where it is installed: the ``agents`` extra brings it).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.responses import (
    Response,
    ResponseFunctionToolCall,
    ResponseInputItemParam,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
)
from openai.types.responses.response_reasoning_item import Summary
from pydantic import TypeAdapter

from marsys_mem import ConversationMemory, Message, ToolCall
from marsys_mem.exceptions import MessageFormatError
from marsys_mem.model.messages import ImagePart, TextPart, to_llm_format
from marsys_mem.model.responses import chat_from_responses, is_responses_dict

INPUT_ITEMS = TypeAdapter(list[ResponseInputItemParam])


def _output_message(text: str, item_id: str = "msg_1") -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id=item_id,
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


def _function_call(call_id: str, name: str, args: dict[str, Any]) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        id="fc_" + call_id,
        type="function_call",
        call_id=call_id,
        name=name,
        arguments=json.dumps(args),
        status="completed",
    )


def _reasoning() -> ResponseReasoningItem:
    return ResponseReasoningItem(
        id="rs_1",
        type="reasoning",
        summary=[Summary(type="summary_text", text="look up the weather")],
        encrypted_content="opaque==",
    )


def _response(*output: Any) -> dict[str, Any]:
    """A whole Responses API response as the openai client dumps it."""
    response = Response.model_validate(
        {
            "id": "resp_1",
            "object": "response",
            "created_at": 1.0,
            "model": "gpt-4.1",
            "status": "completed",
            "output": [o.model_dump(mode="json", exclude_unset=True) for o in output],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": 10,
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens": 5,
                "output_tokens_details": {"reasoning_tokens": 2},
                "total_tokens": 15,
            },
        }
    )
    return response.model_dump(mode="json", exclude_unset=True)


# ---------------------------------------------------------------------- in
def test_output_message_item_is_an_assistant_message_not_an_anthropic_error():
    # The first-hour bug: this was "'output_text' is not a known Anthropic block".
    item = _output_message("Hello there").model_dump(mode="json", exclude_unset=True)
    m = Message.from_llm_dict(item)
    assert (m.role, m.content) == ("assistant", "Hello there")
    assert m.metadata["id"] == "msg_1"
    assert m.metadata["status"] == "completed"


def test_whole_response_becomes_one_assistant_message():
    data = _response(
        _reasoning(),
        _output_message("Checking."),
        _function_call("call_a", "weather", {"city": "Tokyo"}),
        _function_call("call_b", "weather", {"city": "Paris"}),
    )
    m = Message.from_llm_dict(data)
    assert m.role == "assistant"
    assert m.text == "Checking."
    assert m.tool_calls == (
        ToolCall(id="call_a", name="weather", arguments={"city": "Tokyo"}),
        ToolCall(id="call_b", name="weather", arguments={"city": "Paris"}),
    )
    assert m.metadata["id"] == "resp_1"
    assert m.metadata["model"] == "gpt-4.1"
    assert m.metadata["usage"]["total_tokens"] == 15
    # reasoning is kept verbatim and goes out again in front of the message's items
    (kept,) = m.metadata["responses_items"]
    assert kept["type"] == "reasoning"
    assert kept["encrypted_content"] == "opaque=="
    items = to_llm_format([m], "responses")
    assert [i["type"] for i in items] == ["reasoning", "message", "function_call", "function_call"]
    assert items[0] == data["output"][0]
    INPUT_ITEMS.validate_python(items)


def test_function_call_and_output_keep_their_call_id():
    call = _function_call("call_1", "weather", {"city": "Tokyo"}).model_dump(
        mode="json", exclude_unset=True
    )
    m = Message.from_llm_dict(call)
    assert m.role == "assistant"
    assert m.content is None
    assert m.tool_calls == (ToolCall(id="call_1", name="weather", arguments={"city": "Tokyo"}),)
    out = Message.from_llm_dict(
        {"type": "function_call_output", "call_id": "call_1", "output": "72F"}
    )
    assert (out.role, out.tool_call_id, out.text) == ("tool", "call_1", "72F")
    # the pair is linked like any tool call in a memory
    mem = ConversationMemory([Message.user("Weather?"), m, out])
    assert mem.call_owner("call_1") == 1


def test_input_messages_parts_and_roles():
    m = Message.from_llm_dict(
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "What is this?"},
                {
                    "type": "input_image",
                    "image_url": "https://example.com/cat.png",
                    "detail": "low",
                },
            ],
        }
    )
    assert m.role == "user"
    assert m.content == [
        TextPart(text="What is this?"),
        ImagePart(url="https://example.com/cat.png"),
    ]
    dev = Message.from_llm_dict({"role": "developer", "content": "Be terse."})
    assert (dev.role, dev.text, dev.metadata["responses_role"]) == (
        "system",
        "Be terse.",
        "developer",
    )
    assert to_llm_format([dev], "responses") == [
        {"type": "message", "role": "developer", "content": "Be terse."}
    ]
    refusal = Message.from_llm_dict(
        {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]}
    )
    assert refusal.content is None
    assert refusal.metadata["refusal"] == "No."


def test_function_call_output_with_parts():
    out = Message.from_llm_dict(
        {
            "type": "function_call_output",
            "call_id": "c1",
            "output": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
        }
    )
    assert out.text == "a\nb"


def test_other_items_are_kept_verbatim():
    search = {
        "type": "web_search_call",
        "id": "ws_1",
        "status": "completed",
        "action": {"type": "search", "query": "weather tokyo"},
    }
    m = Message.from_llm_dict(search)
    assert m.role == "assistant"
    assert m.content is None
    assert to_llm_format([m], "responses") == [search]


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"type": "function_call", "name": "f", "arguments": "{}"}, "missing field 'call_id'"),
        (
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{oops"},
            "not valid JSON",
        ),
        (
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"},
            "arguments",
        ),
        ({"type": "function_call_output", "output": "x"}, "missing field 'call_id'"),
        ({"type": "function_call_output", "call_id": "c", "output": 3}, "output must be"),
        ({"object": "response", "output": "nope"}, "output must be a list"),
        (
            {"type": "message", "role": "robot", "content": [{"type": "input_text", "text": "x"}]},
            "role 'robot'",
        ),
        (
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_file", "file_id": "f"}],
            },
            "content[0].type 'input_file' is not supported",
        ),
    ],
)
def test_malformed_items_name_the_field(data: dict[str, Any], says: str):
    with pytest.raises(MessageFormatError, match=None) as info:
        Message.from_llm_dict(data)
    assert says in str(info.value)


def test_detection_leaves_chat_and_anthropic_alone():
    assert not is_responses_dict({"role": "user", "content": "hi"})
    assert not is_responses_dict({"choices": []})
    assert not is_responses_dict({"type": "message", "content": [{"type": "text", "text": "x"}]})
    assert is_responses_dict({"object": "response", "output": []})
    assert is_responses_dict({"type": "reasoning", "id": "rs", "summary": []})
    anthropic = Message.from_llm_dict(
        {"type": "message", "role": "assistant", "content": [{"type": "text", "text": "hi"}]}
    )
    assert anthropic.text == "hi"
    assert chat_from_responses({"output": []}) == ({"role": "assistant", "content": None}, {})


# ---------------------------------------------------------------------- out
def test_conversation_out_as_input_items():
    call = ToolCall(id="c1", name="weather", arguments={"city": "Tokyo"})
    messages = [
        Message.system("You are terse."),
        Message.user("Weather in Tokyo?"),
        Message.assistant("Checking.", tool_calls=[call]),
        Message.tool("72F", tool_call_id="c1", name="weather"),
        Message.assistant("72F in Tokyo."),
        Message.agent_call("Summarise", name="planner"),
        Message.user([TextPart(text="Look:"), ImagePart(url="https://example.com/a.png")]),
    ]
    items = to_llm_format(messages, "responses")
    assert items == [
        {"type": "message", "role": "system", "content": "You are terse."},
        {"type": "message", "role": "user", "content": "Weather in Tokyo?"},
        {"type": "message", "role": "assistant", "content": "Checking."},
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "weather",
            "arguments": '{"city": "Tokyo"}',
        },
        {"type": "function_call_output", "call_id": "c1", "output": "72F"},
        {"type": "message", "role": "assistant", "content": "72F in Tokyo."},
        {"type": "message", "role": "user", "content": "[Request from planner]: Summarise"},
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Look:"},
                {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "auto"},
            ],
        },
    ]
    INPUT_ITEMS.validate_python(items)  # what the openai client accepts as input
    assert ConversationMemory(messages).to_llm_format("responses") == items


def test_unknown_provider_names_responses():
    with pytest.raises(ValueError, match="'responses'"):
        to_llm_format([], "gemini")  # type: ignore[call-overload]


# ---------------------------------------------------------------------- round trips
ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=12)
texts = st.text(min_size=1, max_size=40).filter(lambda s: s.strip() == s and s)
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-1000, 1000), st.text(max_size=10))
arguments = st.dictionaries(st.text(max_size=8), json_scalars, max_size=4)


@st.composite
def single_item_messages(draw: st.DrawFn) -> Message:
    """Messages that map to exactly one Responses item (so the way back is exact)."""
    kind = draw(st.sampled_from(["system", "user", "assistant", "call", "tool"]))
    if kind == "call":
        return Message.assistant(
            None, tool_calls=[ToolCall(id=draw(ids), name=draw(ids), arguments=draw(arguments))]
        )
    if kind == "tool":
        return Message.tool(draw(texts), tool_call_id=draw(ids))
    return Message(role=kind, content=draw(texts))


def _same(a: Message, b: Message) -> bool:
    keep = ("role", "content", "tool_calls", "tool_call_id")
    return all(getattr(a, k) == getattr(b, k) for k in keep)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(single_item_messages(), max_size=8))
def test_messages_round_trip_through_items(messages: list[Message]):
    items = to_llm_format(messages, "responses")
    assert len(items) == len(messages)
    back = [Message.from_llm_dict(i) for i in items]
    assert all(_same(a, b) for a, b in zip(messages, back, strict=True))
    # and the items themselves come out again unchanged
    assert to_llm_format(back, "responses") == items


@settings(max_examples=60, deadline=None)
@given(st.lists(ids, min_size=1, max_size=4, unique=True), st.one_of(st.none(), texts))
def test_response_output_round_trips(call_ids: list[str], text: str | None):
    output: list[Any] = [_reasoning()]
    if text is not None:
        output.append(_output_message(text))
    output.extend(_function_call(c, "lookup", {"q": c}) for c in call_ids)
    data = _response(*output)
    items = to_llm_format([Message.from_llm_dict(data)], "responses")
    # every item comes back: the same types, call ids, names and arguments, in order
    assert [i["type"] for i in items] == [o["type"] for o in data["output"]]
    for got, sent in zip(items, data["output"], strict=True):
        if sent["type"] == "function_call":
            assert (got["call_id"], got["name"], json.loads(got["arguments"])) == (
                sent["call_id"],
                sent["name"],
                json.loads(sent["arguments"]),
            )
        elif sent["type"] == "message":
            assert got["content"] == sent["content"][0]["text"]
        else:
            assert got == sent


# ---------------------------------------------------------------------- fuzz
anything = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)
part = st.one_of(
    st.fixed_dictionaries(
        {"type": st.sampled_from(sorted(["input_text", "output_text", "refusal", "input_image"]))},
        optional={"text": anything, "refusal": anything, "image_url": anything},
    ),
    anything,
)
responses_item = st.one_of(
    st.fixed_dictionaries(
        {"type": st.just("message")},
        optional={
            "role": anything | st.sampled_from(["user", "assistant", "developer"]),
            "content": st.lists(part, max_size=3) | anything,
            "id": anything,
        },
    ),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["function_call", "function_call_output", "reasoning", "x"])},
        optional={
            "call_id": anything,
            "name": anything,
            "arguments": anything,
            "output": anything | st.lists(part, max_size=2),
        },
    ),
)
whole_response = st.fixed_dictionaries(
    {"object": st.just("response"), "output": st.lists(responses_item, max_size=3) | anything},
    optional={"id": anything, "model": anything, "usage": anything},
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(responses_item, whole_response))
def test_fuzz_items_give_a_message_or_a_clear_error(data: dict[str, Any]):
    start = time.perf_counter()
    try:
        m = Message.from_llm_dict(data)
    except MessageFormatError as exc:
        error = str(exc)
        assert error
    else:
        assert Message.model_validate_json(m.model_dump_json()) == m
        to_llm_format([m], "responses")
    assert time.perf_counter() - start < 1.0
