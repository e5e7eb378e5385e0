"""Fuzz ``Message.from_llm_dict`` (the provider-response parser) and ``Message.model_validate``.

Every input must give a clear library error (``MessageFormatError`` from ``from_llm_dict``,
pydantic's ``ValidationError`` from ``model_validate``) or a Message that serialises and
round-trips, never a raw exception, and never take over a second. The inputs are random
JSON-like values and provider-shaped dicts (OpenAI and Anthropic messages and responses)
with random values in every slot: wrong types, non-str keys, lone surrogates, deep nesting.
"""

from __future__ import annotations

import json
import time
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from marsys_mem.exceptions import MessageFormatError
from marsys_mem.model.messages import Message

LIMIT_S = 1.0
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Text with, now and then, a lone surrogate (which UTF-8 cannot encode) somewhere in it.
text = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["user", "assistant", "tool", "system", "text", "image_url", "tool_use"]),
    st.builds(lambda a, b: a + "\udc80" + b, st.text(max_size=5), st.text(max_size=5)),
    st.sampled_from(["\ud800", "ok \udfff", "ключ", "😀"]),
)
scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),  # NaN and Infinity included: not JSON
    text,
)
key = st.one_of(text, st.integers(-3, 3), st.none())
anything = st.recursive(
    scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(key, inner, max_size=4),
        st.tuples(inner, inner),
    ),
    max_leaves=20,
)
role = st.one_of(st.sampled_from(["user", "assistant", "tool", "system", "agent_call"]), anything)


def _args(draw: st.DrawFn) -> Any:
    return draw(
        st.one_of(
            anything,
            st.builds(json.dumps, st.dictionaries(text, scalar, max_size=3)),
            st.sampled_from(["{not json", "[" * 5000, '{"a": "\\udc80"}', "1e999", "{}"]),
        )
    )


@st.composite
def openai_tool_call(draw: st.DrawFn) -> Any:
    fn = draw(st.fixed_dictionaries({}, optional={"name": anything, "arguments": st.just(None)}))
    if draw(st.booleans()):
        fn["arguments"] = _args(draw)
    call = draw(st.fixed_dictionaries({}, optional={"id": anything, "type": anything}))
    call["function"] = draw(st.one_of(st.just(fn), anything))
    return call


openai_part = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": anything}),
    st.fixed_dictionaries(
        {
            "type": st.just("image_url"),
            "image_url": st.one_of(anything, st.fixed_dictionaries({"url": anything})),
        }
    ),
    st.dictionaries(key, anything, max_size=3),
    anything,
)
openai_message = st.fixed_dictionaries(
    {"role": role},
    optional={
        "content": st.one_of(anything, st.lists(openai_part, max_size=3)),
        "name": anything,
        "tool_calls": st.one_of(st.lists(openai_tool_call(), max_size=3), anything),
        "tool_call_id": anything,
        "refusal": anything,
    },
)
openai_response = st.fixed_dictionaries(
    {
        "choices": st.one_of(
            st.lists(
                st.fixed_dictionaries(
                    {"message": st.one_of(openai_message, anything)},
                    optional={"finish_reason": anything, "index": anything},
                ),
                max_size=2,
            ),
            anything,
        )
    },
    optional={"id": anything, "model": anything, "usage": anything},
)
anthropic_block = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": anything}),
    st.fixed_dictionaries(
        {"type": st.just("tool_use"), "id": anything, "name": anything, "input": anything}
    ),
    st.fixed_dictionaries(
        {"type": st.just("tool_result"), "tool_use_id": anything},
        optional={"content": anything, "is_error": anything},
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("image"),
            "source": st.one_of(
                anything,
                st.fixed_dictionaries(
                    {"type": st.just("base64"), "media_type": anything, "data": anything}
                ),
            ),
        }
    ),
    st.fixed_dictionaries({"type": st.just("thinking")}, optional={"thinking": anything}),
    anything,
)
anthropic_message = st.fixed_dictionaries(
    {"content": st.one_of(st.lists(anthropic_block, max_size=3), anything)},
    optional={
        "type": st.just("message"),
        "role": role,
        "id": anything,
        "model": anything,
        "usage": anything,
        "stop_reason": anything,
    },
)
provider_dict = st.one_of(
    openai_message,
    openai_response,
    anthropic_message,
    st.dictionaries(key, anything, max_size=5),
    anything,
)


def _check_error_message(exc: BaseException) -> None:
    """A clear error: printable on any UTF-8 stream and bounded in size."""
    message = str(exc)
    message.encode("utf-8")  # raises if the message itself carries a lone surrogate
    assert message
    assert len(message) <= 2000, len(message)


def _check_message(m: Message) -> None:
    """A message that was accepted is safe downstream: it serialises and round-trips."""
    raw = m.model_dump_json()
    raw.encode("utf-8")
    assert Message.model_validate_json(raw) == m


@FUZZ
@given(provider_dict)
def test_from_llm_dict_gives_message_or_format_error(data: Any) -> None:
    start = time.perf_counter()
    try:
        m = Message.from_llm_dict(data)
    except MessageFormatError as exc:
        _check_error_message(exc)
    else:
        _check_message(m)
    assert time.perf_counter() - start < LIMIT_S


tool_call = st.fixed_dictionaries(
    {"name": st.one_of(text, anything)},
    optional={"id": st.one_of(text, anything), "arguments": st.dictionaries(text, anything)},
)
FIELDS = {  # each field: values of the right shape (with hostile text in them) or anything
    "role": role,
    "content": st.one_of(text, anything, st.lists(openai_part, max_size=3)),
    "name": st.one_of(text, anything),
    "message_id": st.one_of(text, anything),
    "tool_calls": st.one_of(st.lists(tool_call, max_size=2), anything),
    "agent_calls": st.lists(
        st.fixed_dictionaries({"agent": st.one_of(text, anything), "request": anything}),
        max_size=2,
    ),
    "structured_data": st.one_of(st.dictionaries(text, anything, max_size=3), anything),
    "images": st.one_of(st.lists(text, max_size=2), anything),
    "metadata": st.one_of(st.dictionaries(text, anything, max_size=3), anything),
    "pinned": anything,
    "timestamp": anything,
}


@st.composite
def message_dict(draw: st.DrawFn) -> dict[str, Any]:
    """A valid user/assistant message dict with one or two fields replaced by fuzz."""
    data: dict[str, Any] = {"role": draw(st.sampled_from(["user", "assistant"])), "content": "hi"}
    for field in draw(st.lists(st.sampled_from(sorted(FIELDS)), min_size=1, max_size=2)):
        data[field] = draw(FIELDS[field])
    return data


@FUZZ
@given(message_dict())
def test_model_validate_gives_message_or_validation_error(data: dict[str, Any]) -> None:
    start = time.perf_counter()
    try:
        m = Message.model_validate(data)
    except ValidationError:
        pass
    else:
        _check_message(m)
    assert time.perf_counter() - start < LIMIT_S
