"""Tests for marsys_mem.model.messages: the Message model, provider formats out and in."""

import itertools
import json
import math
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from marsys_mem.exceptions import MarsysMemError, MessageFormatError
from marsys_mem.model.messages import (
    MESSAGE_LIST_ADAPTER,
    AgentCall,
    ImagePart,
    Message,
    TextPart,
    ToolCall,
    to_llm_format,
)

# --------------------------------------------------------------------------- fixtures

PNG_B64 = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
    "+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


@pytest.fixture
def weather_call() -> ToolCall:
    return ToolCall(id="c1", name="weather", arguments={"city": "Tokyo"})


@pytest.fixture
def time_call() -> ToolCall:
    return ToolCall(id="c2", name="time", arguments={"tz": "Asia/Tokyo", "fmt": [24, True]})


@pytest.fixture
def conversation(weather_call: ToolCall, time_call: ToolCall) -> list[Message]:
    return [
        Message.system("You are terse."),
        Message.system("Answer in English."),
        Message.user("What is in this picture?", images=("https://example.com/cat.png",)),
        Message.assistant("", tool_calls=[weather_call, time_call]),
        Message.tool("72F", tool_call_id="c1", name="weather"),
        Message.tool("09:00", tool_call_id="c2", name="time"),
        Message.assistant("It is 72F at 09:00."),
        Message.agent_call("Find Q4 numbers", name="planner"),
        Message.agent_response("Q4 grew 12%.", name="researcher"),
    ]


def full_message() -> Message:
    """A message with every field set to a non-default value."""
    return Message(
        role="assistant",
        content=[TextPart(text="look"), ImagePart(url="https://example.com/a.png", detail="low")],
        message_id="m-1",
        name="bot",
        tool_calls=(ToolCall(id="c1", name="f", arguments={"a": [1, 2.5, None, {"b": "x"}]}),),
        agent_calls=(
            AgentCall(id="a1", agent="researcher", request="Find it"),
            AgentCall(id="a2", agent="writer", request={"task": "draft", "n": 3}),
        ),
        structured_data={"score": 0.25, "tags": ["a", "b"], "ok": True, "none": None},
        images=("https://example.com/b.png", f"data:image/png;base64,{PNG_B64}"),
        metadata={"preserve": False, "nested": {"k": [1, "two"]}, "unicode": "é✓"},
        timestamp=datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC),
        pinned=True,
    )


# --------------------------------------------------------------------------- constructors


@pytest.mark.parametrize(
    ("factory", "role"),
    [
        (lambda: Message.system("s"), "system"),
        (lambda: Message.user("s"), "user"),
        (lambda: Message.assistant("s"), "assistant"),
        (lambda: Message.tool("s", tool_call_id="c1"), "tool"),
        (lambda: Message.agent_call("s", name="planner"), "agent_call"),
        (lambda: Message.agent_response("s"), "agent_response"),
    ],
)
def test_role_constructors(factory, role):
    m = factory()
    assert m.role == role
    assert m.content == "s"
    assert m.pinned is False
    assert m.metadata == {}


def test_assistant_content_defaults_to_none():
    assert Message.assistant().content is None
    assert Message.assistant().text == ""


def test_constructor_fields_are_kept():
    assert Message.tool("72F", tool_call_id="c1", name="weather").tool_call_id == "c1"
    assert Message.agent_call("x", name="planner").name == "planner"


@pytest.mark.parametrize(
    "ctor",
    [Message.system, Message.user, Message.assistant, Message.agent_response],
)
def test_constructors_accept_other_fields_as_keywords(ctor):
    m = ctor("hi", pinned=True, metadata={"k": 1}, name="alice", message_id="fixed")
    assert m.pinned is True
    assert m.metadata == {"k": 1}
    assert m.name == "alice"
    assert m.message_id == "fixed"


def test_tool_and_agent_call_constructors_accept_other_fields():
    t = Message.tool("r", tool_call_id="c1", pinned=True, metadata={"a": "b"}, name="fn")
    assert (t.pinned, t.metadata, t.name) == (True, {"a": "b"}, "fn")
    a = Message.agent_call("r", name="planner", pinned=True, metadata={"x": [1]})
    assert (a.pinned, a.metadata, a.name) == (True, {"x": [1]}, "planner")


def test_assistant_with_tool_calls_and_agent_calls(weather_call):
    m = Message.assistant(
        None, tool_calls=[weather_call], agent_calls=[AgentCall(agent="r", request="go")]
    )
    assert m.tool_calls == (weather_call,)
    assert m.agent_calls[0].agent == "r"
    assert m.agent_calls[0].id.startswith("agent_")


def test_unknown_field_rejected():
    with pytest.raises(ValidationError, match="colour"):
        Message.user("x", colour="red")


def test_message_id_auto_and_unique():
    ids = {Message.user("same").message_id for _ in range(500)}
    assert len(ids) == 500
    assert all(isinstance(i, str) and i for i in ids)


def test_message_id_empty_rejected():
    with pytest.raises(ValidationError, match="message_id"):
        Message.user("x", message_id="")


def test_tool_call_id_auto():
    a, b = ToolCall(name="f"), ToolCall(name="f")
    assert a.id != b.id
    assert a.arguments == {}


# --------------------------------------------------------------------------- immutability


def test_frozen_assignment_raises():
    m = Message.user("hi")
    with pytest.raises(ValidationError, match="frozen"):
        m.content = "changed"  # type: ignore[misc]
    with pytest.raises(ValidationError, match="frozen"):
        m.pinned = True  # type: ignore[misc]
    assert m.content == "hi"
    assert m.pinned is False


def test_parts_and_calls_frozen(weather_call):
    with pytest.raises(ValidationError):
        weather_call.name = "other"  # type: ignore[misc]
    with pytest.raises(ValidationError):
        TextPart(text="a").text = "b"  # type: ignore[misc]


def test_tool_calls_stored_as_tuple(weather_call):
    m = Message.assistant("", tool_calls=[weather_call])
    assert isinstance(m.tool_calls, tuple)
    assert isinstance(m.images, tuple)


def test_metadata_cannot_be_mutated_in_place():
    m = Message.user("x")
    with pytest.raises((TypeError, ValidationError)):
        m.metadata["preserve"] = True
    assert m.is_protected is False


# --------------------------------------------------------------------------- timestamp


def test_timestamp_default_is_utc_and_recent():
    before = datetime.now(UTC)
    m = Message.user("x")
    after = datetime.now(UTC)
    assert m.timestamp.tzinfo is not None
    assert m.timestamp.utcoffset() == timedelta(0)
    assert before <= m.timestamp <= after


def test_timestamp_converted_to_utc():
    tokyo = timezone(timedelta(hours=9))
    ts = datetime(2024, 1, 1, 9, 30, tzinfo=tokyo)
    m = Message.user("x", timestamp=ts)
    assert m.timestamp.utcoffset() == timedelta(0)
    assert m.timestamp == ts  # the same instant
    assert (m.timestamp.year, m.timestamp.month, m.timestamp.day) == (2024, 1, 1)
    assert (m.timestamp.hour, m.timestamp.minute) == (0, 30)
    assert m.model_dump_json().count("2024-01-01T00:30:00") == 1


def test_timestamp_from_iso_string_converted_to_utc():
    m = Message.model_validate({"role": "user", "timestamp": "2024-01-01T09:00:00+09:00"})
    assert m.timestamp == datetime(2024, 1, 1, 0, 0, tzinfo=UTC)
    assert m.timestamp.utcoffset() == timedelta(0)


def test_naive_timestamp_rejected():
    with pytest.raises(ValidationError, match="timestamp"):
        Message.user("x", timestamp=datetime(2024, 1, 1, 12, 0))


# --------------------------------------------------------------------------- JSON round trip


@pytest.mark.parametrize(
    "content",
    [
        "plain text",
        "",
        {"answer": 42, "items": [1, "two", None, {"deep": True}], "pi": 3.14159},
        [TextPart(text="look"), ImagePart(url="https://example.com/x.png", detail="high")],
        [],
        None,
    ],
    ids=["str", "empty-str", "dict", "parts", "empty-list", "none"],
)
def test_json_round_trip_content_shapes(content):
    m = Message.user(content, metadata={"k": "v"}, pinned=True)
    back = Message.model_validate_json(m.model_dump_json())
    assert back == m
    assert back.content == m.content
    assert type(back.content) is type(m.content)


def test_json_round_trip_every_field():
    m = full_message()
    back = Message.model_validate_json(m.model_dump_json())
    assert back == m
    for field in Message.model_fields:
        assert getattr(back, field) == getattr(m, field), field
    assert isinstance(back.content, list)
    assert isinstance(back.content[1], ImagePart)
    assert back.content[1].detail == "low"
    assert back.agent_calls[1].request == {"task": "draft", "n": 3}
    assert back.timestamp.microsecond == 123456


def test_dict_round_trip_every_field():
    m = full_message()
    assert Message.model_validate(m.model_dump()) == m
    assert Message.model_validate(json.loads(m.model_dump_json())) == m


def test_message_list_adapter_round_trip(conversation):
    msgs = [*conversation, full_message()]
    data = MESSAGE_LIST_ADAPTER.dump_json(msgs)
    back = MESSAGE_LIST_ADAPTER.validate_json(data)
    assert back == msgs
    assert [m.message_id for m in back] == [m.message_id for m in msgs]
    assert isinstance(json.loads(data), list)


def test_serialised_json_is_plain_json():
    data = json.loads(full_message().model_dump_json())
    assert data["role"] == "assistant"
    assert data["pinned"] is True
    assert data["tool_calls"][0] == {
        "id": "c1",
        "name": "f",
        "arguments": {"a": [1, 2.5, None, {"b": "x"}]},
    }
    assert data["content"][0] == {"type": "text", "text": "look"}


# Hypothesis: random messages round-trip losslessly.

_json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    _json_scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=6,
)
json_dicts = st.dictionaries(st.text(max_size=6), json_values, max_size=4)
nonempty = st.text(min_size=1, max_size=12)

parts = st.lists(
    st.one_of(
        st.builds(TextPart, text=st.text(max_size=30)),
        st.builds(
            ImagePart,
            url=nonempty,
            detail=st.sampled_from([None, "auto", "low", "high"]),
        ),
    ),
    max_size=4,
)
contents = st.one_of(st.none(), st.text(max_size=50), json_dicts, parts)
tool_calls = st.lists(
    st.builds(ToolCall, id=nonempty, name=nonempty, arguments=json_dicts),
    max_size=3,
    unique_by=lambda c: c.id,
)
agent_calls = st.lists(
    st.builds(AgentCall, id=nonempty, agent=nonempty, request=st.text(max_size=20) | json_dicts),
    max_size=2,
)
timestamps = st.datetimes(
    min_value=datetime(1971, 1, 1),
    max_value=datetime(2200, 1, 1),
    timezones=st.builds(
        timezone, st.integers(-23 * 60, 23 * 60).map(lambda m: timedelta(minutes=m))
    ),
)


@st.composite
def messages(draw) -> Message:
    role = draw(
        st.sampled_from(["system", "user", "assistant", "tool", "agent_call", "agent_response"])
    )
    fields = {
        "role": role,
        "content": draw(contents),
        "agent_calls": draw(agent_calls),
        "structured_data": draw(st.none() | json_dicts),
        "images": tuple(draw(st.lists(nonempty, max_size=3))),
        "metadata": draw(json_dicts),
        "timestamp": draw(timestamps),
        "pinned": draw(st.booleans()),
        "name": draw(st.none() | nonempty),
    }
    if draw(st.booleans()):
        fields["message_id"] = draw(nonempty)
    if role == "assistant":
        fields["tool_calls"] = draw(tool_calls)
    if role == "tool":
        fields["tool_call_id"] = draw(nonempty)
    if role == "agent_call":
        fields["name"] = draw(nonempty)
    return Message(**fields)


@settings(max_examples=60)
@given(messages())
def test_property_json_round_trip(m):
    back = Message.model_validate_json(m.model_dump_json())
    assert back == m
    assert back.model_dump() == m.model_dump()
    assert back.timestamp.utcoffset() == timedelta(0)
    assert back.timestamp == m.timestamp


@settings(max_examples=20)
@given(st.lists(messages(), max_size=3))
def test_property_list_adapter_round_trip(msgs):
    assert MESSAGE_LIST_ADAPTER.validate_json(MESSAGE_LIST_ADAPTER.dump_json(msgs)) == msgs
    assert MESSAGE_LIST_ADAPTER.validate_python(MESSAGE_LIST_ADAPTER.dump_python(msgs)) == msgs


# --------------------------------------------------------------------------- validation


def _error_text(exc_info: pytest.ExceptionInfo[ValidationError]) -> str:
    return str(exc_info.value)


def test_wrong_role_rejected():
    with pytest.raises(ValidationError) as exc_info:
        Message(role="robot", content="x")  # type: ignore[arg-type]
    text = _error_text(exc_info)
    assert "role" in text
    assert "robot" in text
    assert exc_info.value.errors()[0]["loc"] == ("role",)


def test_tool_without_tool_call_id_rejected():
    with pytest.raises(ValidationError, match="tool_call_id"):
        Message(role="tool", content="72F")
    with pytest.raises(ValidationError, match="tool_call_id"):
        Message.tool("72F", tool_call_id="")


def test_tool_call_id_on_non_tool_rejected():
    with pytest.raises(ValidationError, match="tool_call_id"):
        Message.user("x", tool_call_id="c1")


@pytest.mark.parametrize("ctor", [Message.user, Message.system, Message.agent_response])
def test_tool_calls_on_non_assistant_rejected(ctor, weather_call):
    with pytest.raises(ValidationError, match="tool_calls") as exc_info:
        ctor("x", tool_calls=[weather_call])
    assert ctor("x").role in str(exc_info.value)


def test_agent_call_without_name_rejected():
    with pytest.raises(ValidationError, match="name"):
        Message(role="agent_call", content="do it")
    with pytest.raises(ValidationError, match="name"):
        Message.agent_call("do it", name="")


def test_duplicate_tool_call_ids_rejected():
    calls = [ToolCall(id="dup", name="a"), ToolCall(id="dup", name="b")]
    with pytest.raises(ValidationError, match="dup"):
        Message.assistant("", tool_calls=calls)


def test_validation_errors_are_value_errors():
    with pytest.raises(ValueError, match="tool_call_id"):
        Message(role="tool", content="x")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"content": object()},
        {"content": {"x": object()}},
        {"content": {"x": [1, {2, 3}]}},
        {"content": [object()]},
        {"metadata": {"x": object()}},
        {"metadata": {"x": b"bytes"}},
        {"structured_data": {"x": object()}},
        {"images": (object(),)},
    ],
    ids=[
        "content-obj",
        "content-dict-obj",
        "content-set",
        "content-list-obj",
        "metadata-obj",
        "metadata-bytes",
        "structured-obj",
        "images-obj",
    ],
)
def test_non_json_values_rejected(kwargs):
    with pytest.raises(ValidationError):
        Message(role="user", **kwargs)


def test_non_json_tool_arguments_rejected():
    with pytest.raises(ValidationError, match="arguments"):
        ToolCall(name="f", arguments={"x": object()})


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_non_finite_floats_rejected_or_round_trip(value):
    try:
        m = Message.user("x", metadata={"score": value})
    except ValidationError:
        return
    back = Message.model_validate_json(m.model_dump_json())
    got = back.metadata["score"]
    assert isinstance(got, float)
    assert got == value or (math.isnan(value) and math.isnan(got))


def test_image_part_needs_url():
    with pytest.raises(ValidationError, match="url"):
        ImagePart(url="")
    with pytest.raises(ValidationError, match="detail"):
        ImagePart(url="u", detail="ultra")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- equality, views


def test_equality_and_hash_by_id():
    a = Message.user("same")
    b = Message.user("same")
    assert a != b  # different ids
    copy = a.model_copy()
    assert copy == a
    assert hash(copy) == hash(a) == hash(a.message_id)
    assert len({a, b, copy}) == 2
    assert a != "same"
    same_id = Message.user("other content", message_id=a.message_id)
    assert hash(same_id) == hash(a)


def test_equal_after_json_round_trip_and_usable_as_dict_key():
    a = Message.user("x")
    back = Message.model_validate_json(a.model_dump_json())
    assert {a: 1}[back] == 1


@pytest.mark.parametrize(
    ("message", "protected"),
    [
        (Message.system("s"), True),
        (Message.user("u", pinned=True), True),
        (Message.user("u", metadata={"preserve": True}), True),
        (Message.assistant("a", metadata={"preserve": False}), False),
        (Message.user("u"), False),
        (Message.tool("t", tool_call_id="c"), False),
        (Message.agent_call("a", name="p"), False),
    ],
)
def test_is_protected(message, protected):
    assert message.is_protected is protected


def test_text_view():
    assert Message.user("hello").text == "hello"
    assert Message.assistant(None).text == ""
    parts = [TextPart(text="a"), ImagePart(url="https://x/y.png"), TextPart(text="b")]
    assert Message.user(parts).text == "a\nb"
    d = {"b": 1, "a": [1, "é"]}
    text = Message.user(d).text
    assert json.loads(text) == d
    assert Message.user(d).text == Message.user({"a": [1, "é"], "b": 1}).text  # key-order stable


# --------------------------------------------------------------------------- to_llm_format


def test_to_openai_exact(conversation):
    out = to_llm_format(conversation, "openai")
    assert isinstance(out, list)
    # arguments are JSON strings; check them separately, then the exact shapes.
    calls = out[3]["tool_calls"]
    assert all(isinstance(c["function"]["arguments"], str) for c in calls)
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Tokyo"}
    assert json.loads(calls[1]["function"]["arguments"]) == {"tz": "Asia/Tokyo", "fmt": [24, True]}
    for c in calls:
        c["function"]["arguments"] = "<json>"
    assert out == [
        {"role": "system", "content": "You are terse."},
        {"role": "system", "content": "Answer in English."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in this picture?"},
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": "<json>"},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "time", "arguments": "<json>"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "72F"},
        {"role": "tool", "tool_call_id": "c2", "content": "09:00"},
        {"role": "assistant", "content": "It is 72F at 09:00."},
        {"role": "user", "content": "[Request from planner]: Find Q4 numbers"},
        {"role": "assistant", "content": "Q4 grew 12%."},
    ]


def test_to_openai_default_provider(conversation):
    assert to_llm_format(conversation) == to_llm_format(conversation, "openai")


def test_to_openai_content_parts_and_name():
    m = Message.user(
        [TextPart(text="look"), ImagePart(url="https://example.com/p.png")], name="alice"
    )
    assert to_llm_format([m], "openai") == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "https://example.com/p.png"}},
            ],
            "name": "alice",
        }
    ]


def test_to_openai_assistant_text_with_tool_call(weather_call):
    [out] = to_llm_format([Message.assistant("Checking.", tool_calls=[weather_call])], "openai")
    assert out["role"] == "assistant"
    assert out["content"] == "Checking."
    assert out["tool_calls"][0]["id"] == "c1"


def test_to_anthropic_exact(conversation, weather_call, time_call):
    payload = to_llm_format(conversation, "anthropic")
    assert set(payload) == {"system", "messages"}
    system = payload["system"]
    assert system.index("You are terse.") < system.index("Answer in English.")
    assert system.replace("You are terse.", "").replace("Answer in English.", "").strip() == ""
    assert payload["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in this picture?"},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "c1", "name": "weather", "input": {"city": "Tokyo"}},
                {
                    "type": "tool_use",
                    "id": "c2",
                    "name": "time",
                    "input": {"tz": "Asia/Tokyo", "fmt": [24, True]},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": "72F"},
                {"type": "tool_result", "tool_use_id": "c2", "content": "09:00"},
            ],
        },
        {"role": "assistant", "content": "It is 72F at 09:00."},
        {"role": "user", "content": "[Request from planner]: Find Q4 numbers"},
        {"role": "assistant", "content": "Q4 grew 12%."},
    ]
    roles = [m["role"] for m in payload["messages"]]
    assert all(a != b for a, b in itertools.pairwise(roles))  # alternating


def test_to_anthropic_no_system_field_without_system_messages():
    payload = to_llm_format([Message.user("hi")], "anthropic")
    assert payload == {"messages": [{"role": "user", "content": "hi"}]}


def test_to_anthropic_data_uri_becomes_base64_source():
    m = Message.user("see", images=(f"data:image/png;base64,{PNG_B64}",))
    payload = to_llm_format([m], "anthropic")
    assert payload["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "see"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64},
                },
            ],
        }
    ]


def test_to_anthropic_image_part_in_content():
    m = Message.user([ImagePart(url="data:image/jpeg;base64,QUJD")])
    [entry] = to_llm_format([m], "anthropic")["messages"]
    assert entry["content"] == [
        {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "QUJD"}}
    ]


def test_to_anthropic_merges_consecutive_user_messages():
    payload = to_llm_format([Message.user("one"), Message.user("two")], "anthropic")
    assert payload["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
        }
    ]


def test_to_anthropic_text_with_tool_use(weather_call):
    payload = to_llm_format(
        [Message.assistant("Let me check.", tool_calls=[weather_call])], "anthropic"
    )
    assert payload["messages"] == [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "c1", "name": "weather", "input": {"city": "Tokyo"}},
            ],
        }
    ]


def test_to_llm_format_does_not_alias_tool_arguments(weather_call):
    m = Message.assistant("", tool_calls=[weather_call])
    payload = to_llm_format([m], "anthropic")
    payload["messages"][0]["content"][0]["input"]["city"] = "Paris"
    assert m.tool_calls[0].arguments == {"city": "Tokyo"}


@pytest.mark.parametrize("provider", ["gemini", "OpenAI", ""])
def test_unknown_provider_raises(provider):
    with pytest.raises(ValueError, match="provider"):
        to_llm_format([Message.user("x")], provider)  # type: ignore[call-overload]


# --------------------------------------------------------------------------- from_llm_dict


def test_from_openai_chat_completion_response():
    resp = {
        "id": "chatcmpl-123",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "gpt-4o-mini",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_abc",
                            "type": "function",
                            "function": {"name": "weather", "arguments": '{"city": "Tokyo"}'},
                        },
                        {
                            "id": "call_def",
                            "type": "function",
                            "function": {"name": "time", "arguments": ""},
                        },
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
    }
    m = Message.from_llm_dict(resp)
    assert m.role == "assistant"
    assert m.content is None
    assert m.tool_calls == (
        ToolCall(id="call_abc", name="weather", arguments={"city": "Tokyo"}),
        ToolCall(id="call_def", name="time", arguments={}),
    )
    assert m.metadata["model"] == "gpt-4o-mini"
    assert m.metadata["usage"] == {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}
    assert m.metadata["finish_reason"] == "tool_calls"
    assert m.metadata["id"] == "chatcmpl-123"


def test_from_openai_text_response():
    resp = {
        "model": "gpt-4o",
        "choices": [{"message": {"role": "assistant", "content": "Hi!"}, "finish_reason": "stop"}],
    }
    m = Message.from_llm_dict(resp)
    assert (m.role, m.content, m.tool_calls) == ("assistant", "Hi!", ())
    assert m.metadata == {"model": "gpt-4o", "finish_reason": "stop"}


@pytest.mark.parametrize(
    ("data", "role", "text"),
    [
        ({"role": "system", "content": "Be terse."}, "system", "Be terse."),
        ({"role": "user", "content": "Hi", "name": "alice"}, "user", "Hi"),
        ({"role": "assistant", "content": "Hello"}, "assistant", "Hello"),
        ({"role": "tool", "tool_call_id": "c1", "content": "72F"}, "tool", "72F"),
    ],
)
def test_from_openai_message_dicts(data, role, text):
    m = Message.from_llm_dict(data)
    assert m.role == role
    assert m.text == text
    assert m.metadata == {}
    if role == "tool":
        assert m.tool_call_id == "c1"
    if "name" in data:
        assert m.name == "alice"


def test_from_openai_user_with_image_parts():
    m = Message.from_llm_dict(
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
            ],
        }
    )
    assert m.content == [TextPart(text="look"), ImagePart(url="https://x/y.png")]


def test_from_openai_assistant_message_with_dict_arguments():
    m = Message.from_llm_dict(
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c9",
                    "type": "function",
                    "function": {"name": "f", "arguments": {"already": "parsed"}},
                }
            ],
        }
    )
    assert m.tool_calls[0].arguments == {"already": "parsed"}


def test_from_anthropic_response():
    resp = {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-3-5-sonnet",
        "content": [
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Tokyo"}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 20, "output_tokens": 9},
    }
    m = Message.from_llm_dict(resp)
    assert m.role == "assistant"
    assert m.content == "Let me check."
    assert m.tool_calls == (ToolCall(id="toolu_1", name="weather", arguments={"city": "Tokyo"}),)
    assert m.metadata["stop_reason"] == "tool_use"
    assert m.metadata["model"] == "claude-3-5-sonnet"
    assert m.metadata["usage"] == {"input_tokens": 20, "output_tokens": 9}
    assert m.metadata["id"] == "msg_01"


def test_from_anthropic_response_with_only_tool_use_has_no_content():
    resp = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
    }
    m = Message.from_llm_dict(resp)
    assert m.content is None
    assert m.tool_calls[0].id == "t1"


@pytest.mark.parametrize(
    ("inner", "text"),
    [
        ("72F", "72F"),
        ([{"type": "text", "text": "72F"}, {"type": "text", "text": "sunny"}], "72F\nsunny"),
    ],
)
def test_from_anthropic_tool_result(inner, text):
    m = Message.from_llm_dict(
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": inner}],
        }
    )
    assert m.role == "tool"
    assert m.tool_call_id == "toolu_1"
    assert m.text == text


def test_from_anthropic_tool_result_error_flag():
    m = Message.from_llm_dict(
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t", "content": "boom", "is_error": True}
            ],
        }
    )
    assert m.metadata.get("is_error") is True


def test_from_anthropic_base64_image_becomes_data_uri():
    m = Message.from_llm_dict(
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "see"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64},
                },
            ],
        }
    )
    assert m.role == "user"
    assert m.images == (f"data:image/png;base64,{PNG_B64}",)


def _strip_for_compare(m: Message) -> tuple:
    return (m.role, m.text, m.tool_calls, m.tool_call_id)


def test_openai_round_trip(weather_call, time_call):
    msgs = [
        Message.system("You are terse."),
        Message.user("Weather and time in Tokyo?", name="alice"),
        Message.assistant("Checking.", tool_calls=[weather_call, time_call]),
        Message.tool("72F", tool_call_id="c1"),
        Message.tool("09:00", tool_call_id="c2"),
        Message.assistant("72F at 09:00."),
    ]
    back = [Message.from_llm_dict(d) for d in to_llm_format(msgs, "openai")]
    assert [_strip_for_compare(m) for m in back] == [_strip_for_compare(m) for m in msgs]
    assert back[1].name == "alice"


def test_openai_round_trip_image_parts():
    m = Message.user([TextPart(text="look"), ImagePart(url="https://x/y.png")])
    [back] = [Message.from_llm_dict(d) for d in to_llm_format([m], "openai")]
    assert back.content == m.content


def test_anthropic_round_trip(weather_call):
    msgs = [
        Message.system("You are terse."),
        Message.user("Weather in Tokyo?"),
        Message.assistant("Checking.", tool_calls=[weather_call]),
        Message.tool("72F", tool_call_id="c1"),
        Message.assistant("72F."),
        Message.user("And this?", images=(f"data:image/png;base64,{PNG_B64}",)),
    ]
    payload = to_llm_format(msgs, "anthropic")
    back = [Message.system(payload["system"])]
    back += [Message.from_llm_dict(d) for d in payload["messages"]]
    assert [_strip_for_compare(m) for m in back] == [_strip_for_compare(m) for m in msgs]
    assert back[-1].images == msgs[-1].images


@pytest.mark.parametrize(
    ("data", "pattern"),
    [
        (["role", "user"], "dict"),
        ("not a dict", "dict"),
        (None, "dict"),
        ({"content": "hi"}, "role"),
        ({}, "role"),
        ({"role": "robot", "content": "hi"}, "robot"),
        (
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "f", "arguments": "{not json"},
                    }
                ],
            },
            "arguments",
        ),
        ({"choices": [], "model": "gpt"}, "choices"),
        (
            {"type": "message", "role": "assistant", "content": [{"type": "video", "url": "x"}]},
            "video",
        ),
        ({"role": "user", "content": [{"type": "audio", "data": "x"}]}, "audio"),
        ({"role": "tool", "content": "72F"}, "tool_call_id"),
    ],
    ids=[
        "list",
        "str",
        "none",
        "no-role",
        "empty",
        "unknown-role",
        "bad-json-args",
        "empty-choices",
        "unknown-anthropic-block",
        "unknown-openai-part",
        "tool-no-id",
    ],
)
def test_from_llm_dict_malformed(data, pattern):
    with pytest.raises(MessageFormatError, match=pattern) as exc_info:
        Message.from_llm_dict(data)
    assert isinstance(exc_info.value, MarsysMemError)
    assert isinstance(exc_info.value, ValueError)


def test_from_llm_dict_missing_nested_key_is_format_error():
    with pytest.raises(MessageFormatError, match="message"):
        Message.from_llm_dict({"choices": [{"finish_reason": "stop"}]})


def test_from_llm_dict_does_not_mutate_input():
    resp = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "ok"}],
    }
    snapshot = json.dumps(resp, sort_keys=True)
    m = Message.from_llm_dict(resp)
    assert m.text == "ok"
    assert m.metadata["thinking"] == ["hmm"]
    assert json.dumps(resp, sort_keys=True) == snapshot


# --------------------------------------------------------------------------- issue 9: hostile text
BAD = "bad \udc80"  # a lone surrogate: a str Python accepts but UTF-8 cannot encode


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: Message.user(BAD), "content"),
        (lambda: Message.user({"a": [1, {"b": BAD}]}), "content['a'][1]['b']"),
        (lambda: Message.user([TextPart(text=BAD)]), "text"),
        (lambda: Message.user([{"type": "text", "text": BAD}]), "text"),
        (lambda: Message.user([ImagePart(url="https://x/" + BAD)]), "url"),
        (lambda: Message.user("hi", name=BAD), "name"),
        (lambda: Message.user("hi", message_id="id " + BAD), "message_id"),
        (lambda: Message.user("hi", images=["https://x/" + BAD]), "images"),
        (lambda: Message.user("hi", metadata={"k": BAD}), "metadata['k']"),
        (lambda: Message.user("hi", metadata={BAD: 1}), "metadata key"),
        (lambda: Message.user("hi", metadata={"k": {"deep": [BAD]}}), "metadata['k']['deep'][0]"),
        (lambda: Message.user("hi", structured_data={"s": BAD}), "structured_data['s']"),
        (lambda: Message.tool("72F", tool_call_id=BAD), "tool_call_id"),
        (lambda: ToolCall(id=BAD, name="f"), "id"),
        (lambda: ToolCall(name=BAD), "name"),
        (lambda: ToolCall(name="f", arguments={"q": [BAD]}), "arguments['q'][0]"),
        (lambda: ToolCall(name="f", arguments={BAD: 1}), "arguments key"),
        (lambda: AgentCall(agent=BAD, request="r"), "agent"),
        (lambda: AgentCall(agent="a", request=BAD), "request"),
        (lambda: AgentCall(agent="a", request={"r": BAD}), "request['r']"),
    ],
)
def test_a_lone_surrogate_is_rejected_at_construction_naming_the_field(build, field):
    with pytest.raises(ValidationError) as exc_info:
        build()
    text = str(exc_info.value)
    text.encode("utf-8")  # the error itself prints on any stream
    assert "UTF-8" in text or "unicode string" in text
    assert field in text


def test_a_message_dict_with_a_lone_surrogate_is_rejected_before_a_persistent_store(tmp_path):
    from marsys_mem.config.models import MemoryConfig
    from marsys_mem.manager import MemoryManager

    config = MemoryConfig.model_validate(
        {
            "store": {"backend": "sqlite", "path": str(tmp_path / "m.db")},
            "agents": {"a": {"retention": "persistent"}},
        }
    )
    with MemoryManager(config) as manager:
        mem = manager.memory("a")
        mem.add(Message.user("ok"))
        with pytest.raises(ValidationError, match="content is not valid UTF-8"):
            mem.add({"role": "user", "content": BAD})
        with pytest.raises(ValidationError, match=r"metadata\['tags'\]\[0\]"):
            mem.add({"role": "user", "content": "x", "metadata": {"tags": [BAD]}})
        assert [m.text for m in mem.read()] == ["ok"]
        assert [m.text for m in manager.store.load_messages(manager.key("a", "main"))] == ["ok"]


def test_valid_non_ascii_text_is_accepted_and_round_trips():
    m = Message.user(
        "héllo 😀 ключ",
        name="ü",
        metadata={"ключ": ["日本語", "\U0001f600"]},
        structured_data={"é": "ß"},
        tool_call_id=None,
    )
    call = ToolCall(id="c-ü", name="wëather", arguments={"city": "東京"})
    a = Message.assistant("", tool_calls=[call])
    for msg in (m, a):
        assert Message.model_validate_json(msg.model_dump_json()) == msg
    # a surrogate *pair* escaped in JSON decodes to one valid code point
    args = json.loads('{"q": "\\ud83d\\ude00"}')
    assert ToolCall(name="f", arguments=args).arguments["q"] == "\U0001f600"


@pytest.mark.parametrize(
    ("data", "pattern"),
    [
        ({1: "a", "b": 2}, r"keys: \['b', 1\]"),
        ({("t",): 1, None: 2}, "not a provider message"),
        ({"choices": 5}, "choices"),
        ({"choices": ["x"]}, "AttributeError"),
        ({"role": "user", "content": [{"type": "text"}]}, "missing field 'text'"),
        ({"role": "user", "content": BAD}, "content is not valid UTF-8"),
        (
            {"choices": [{"message": {"role": "user", "content": "x"}}], "usage": {"n": math.inf}},
            "metadata: .*Infinity",
        ),
        ({"role": "user", "content": "x", "name": 5}, r"name: .*\(got 5\)"),
        ({"role": "user", "content": [[[[[]]]]]}, "content"),
        ({"role": "user", "content": [{"type": ["unhashable"]}]}, "content"),
        (
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "c", "function": {"name": "f", "arguments": '{"q": "\\udc80"}'}}
                ],
            },
            r"arguments\['q'\] is not valid UTF-8",
        ),
        (
            {
                "role": "assistant",
                "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "[" * 50_000}}],
            },
            "nested too deeply",
        ),
        (
            {"type": "message", "role": "assistant", "content": [{"type": "tool_use", "id": "c"}]},
            "missing field 'name'",
        ),
    ],
)
def test_from_llm_dict_hostile_input_is_a_format_error(data, pattern):
    with pytest.raises(MessageFormatError, match=pattern) as exc_info:
        Message.from_llm_dict(data)
    str(exc_info.value).encode("utf-8")


def test_from_llm_dict_errors_never_repr_a_huge_value():
    huge = "x" * 1_000_000
    cases = [
        {"role": huge},
        {"role": "user", "content": [{"type": huge}]},
        {
            "role": "assistant",
            "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": huge}}],
        },
        {huge: 1, "x" + huge: 2},
        {"role": "assistant", "tool_calls": [{"id": str(i), "name": huge} for i in range(1000)]},
        {str(i): i for i in range(100_000)},
    ]
    for data in cases:
        with pytest.raises(MessageFormatError) as exc_info:
            Message.from_llm_dict(data)
        assert len(str(exc_info.value)) < 2000
