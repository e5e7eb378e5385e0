"""Tests for marsys_mem.context.tokens: counters, caching, get_counter."""

import json
import math

import pytest
import tiktoken

from marsys_mem.context.tokens import (
    CallableCounter,
    HeuristicCounter,
    TiktokenCounter,
    TokenCounter,
    count_message,
    count_messages,
    get_counter,
)
from marsys_mem.exceptions import MarsysMemError, MissingDependencyError
from marsys_mem.model.messages import AgentCall, ImagePart, Message, TextPart, ToolCall


def words(text: str) -> int:
    return len(text.split())


@pytest.fixture
def byte_encoding() -> tiktoken.Encoding:
    """A real tiktoken encoding: one token per byte, plus one merge (b"ab")."""
    ranks = {bytes([i]): i for i in range(256)}
    ranks[b"ab"] = 256
    return tiktoken.Encoding(
        name="bytes-test",
        pat_str=r"\S+|\s+",
        mergeable_ranks=ranks,
        special_tokens={"<|end|>": 257},
    )


# --------------------------------------------------------------------------- HeuristicCounter


@pytest.mark.parametrize(
    ("text", "expected"),
    [("", 0), ("a", 1), ("abcd", 1), ("abcde", 2), ("x" * 40, 10), ("x" * 41, 11)],
)
def test_heuristic_count_text_is_ceil_chars_over_4(text, expected):
    assert HeuristicCounter().count_text(text) == expected
    assert expected == math.ceil(len(text) / 4)


def test_heuristic_count_message_adds_overhead():
    assert HeuristicCounter().count(Message.user("x" * 40)) == 14
    assert HeuristicCounter().count(Message.user("")) == 4
    assert HeuristicCounter().count(Message.assistant(None)) == 4
    assert HeuristicCounter(per_message_overhead=0).count(Message.user("x" * 41)) == 11
    assert HeuristicCounter(per_message_overhead=7).count(Message.user("x" * 8)) == 9


@pytest.mark.parametrize(
    ("cpt", "n_chars", "expected"), [(2.5, 5, 2), (2.5, 6, 3), (1, 7, 7), (3, 10, 4)]
)
def test_heuristic_custom_chars_per_token(cpt, n_chars, expected):
    c = HeuristicCounter(chars_per_token=cpt, per_message_overhead=0)
    assert c.count_text("y" * n_chars) == expected
    assert c.count(Message.user("y" * n_chars)) == expected


def test_heuristic_images_counted_at_image_tokens():
    m = Message.user("x" * 8, images=("https://a/1.png", "https://a/2.png"))
    assert HeuristicCounter().count(m) == 2 + 2 * 85 + 4
    assert HeuristicCounter(image_tokens=10).count(m) == 2 + 2 * 10 + 4
    assert HeuristicCounter(image_tokens=0).count(m) == 2 + 4


def test_heuristic_image_parts_in_content_counted():
    m = Message.user(
        [TextPart(text="x" * 8), ImagePart(url="https://a/1.png"), ImagePart(url="data:,x")],
        images=("https://a/2.png",),
    )
    assert HeuristicCounter(image_tokens=100, per_message_overhead=0).count(m) == 2 + 300


def test_heuristic_dict_content_counted_as_json():
    content = {"answer": "x" * 30}
    m = Message.user(content)
    text = m.text
    assert HeuristicCounter(per_message_overhead=0).count(m) == math.ceil(len(text) / 4)


def test_heuristic_tool_call_arguments_counted():
    c = HeuristicCounter(per_message_overhead=0)
    short = Message.assistant("", tool_calls=[ToolCall(id="c1", name="f", arguments={"q": "a"})])
    long = Message.assistant(
        "", tool_calls=[ToolCall(id="c1", name="f", arguments={"q": "a" + "z" * 400})]
    )
    args_json = json.dumps({"q": "a"})
    assert c.count(short) >= math.ceil(len(args_json) / 4)
    assert c.count(long) - c.count(short) == 100  # 400 more characters of arguments


def test_heuristic_tool_result_and_agent_calls_counted():
    c = HeuristicCounter(per_message_overhead=0)
    bare = Message.assistant("hi")
    with_agent = Message.assistant("hi", agent_calls=[AgentCall(agent="r", request="q" * 80)])
    assert c.count(with_agent) - c.count(bare) >= 20
    with_data = Message.assistant("hi", structured_data={"k": "v" * 80})
    assert c.count(with_data) - c.count(bare) >= 20
    tool = Message.tool("72F", tool_call_id="call_" + "9" * 40)
    assert c.count(tool) > c.count_text("72F")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"chars_per_token": 0},
        {"chars_per_token": -1.5},
        {"per_message_overhead": -1},
        {"image_tokens": -1},
    ],
)
def test_heuristic_parameters_validated(kwargs):
    with pytest.raises(ValueError, match="must be"):
        HeuristicCounter(**kwargs)


def test_heuristic_is_a_token_counter_with_stable_key():
    c = HeuristicCounter()
    assert isinstance(c, TokenCounter)
    assert c.cache_key == HeuristicCounter().cache_key
    assert c.cache_key != HeuristicCounter(per_message_overhead=5).cache_key
    assert c.cache_key != HeuristicCounter(image_tokens=1).cache_key
    assert c.cache_key != HeuristicCounter(chars_per_token=3).cache_key
    hash(c.cache_key)
    assert "HeuristicCounter(" in repr(c)


# --------------------------------------------------------------------------- CallableCounter


def test_callable_counter_counts_words():
    c = CallableCounter(words, per_message_overhead=0)
    assert c.count(Message.user("three short words")) == 3
    assert c.count_text("one two") == 2
    assert CallableCounter(words).count(Message.user("a b c")) == 3 + 4
    assert isinstance(c, TokenCounter)


def test_callable_counter_images():
    c = CallableCounter(words, per_message_overhead=0, image_tokens=50)
    assert c.count(Message.user("a b", images=("u",))) == 2 + 50


@pytest.mark.parametrize("bad", [-1, 2.5, "3", None, [1]])
def test_callable_counter_bad_return_value(bad):
    c = CallableCounter(lambda _s: bad)
    with pytest.raises(ValueError, match="expected an int"):
        c.count_text("x")
    with pytest.raises(ValueError, match="token function returned"):
        c.count(Message.user("x"))


def test_callable_counter_needs_callable():
    with pytest.raises(TypeError, match="callable"):
        CallableCounter(42)  # type: ignore[arg-type]


def test_callable_counter_explicit_key():
    assert CallableCounter(words, key="words").cache_key == "words"


# --------------------------------------------------------------------------- caching


def test_count_message_caches_per_cache_key():
    calls: list[str] = []

    def fn(text: str) -> int:
        calls.append(text)
        return len(text)

    counter = CallableCounter(fn, per_message_overhead=0, key="len")
    m = Message.user("hello")
    assert count_message(counter, m) == 5
    n = len(calls)
    assert n >= 1
    for _ in range(5):
        assert count_message(counter, m) == 5
    assert len(calls) == n  # cached: the function was not called again

    # a second counter with the same key reuses the cached count
    same = CallableCounter(fn, per_message_overhead=0, key="len")
    assert count_message(same, m) == 5
    assert len(calls) == n

    # a different key counts afresh
    other = CallableCounter(fn, per_message_overhead=0, key="len-2")
    assert count_message(other, m) == 5
    assert len(calls) > n

    # a different message counts afresh
    before = len(calls)
    assert count_message(counter, Message.user("hello")) == 5
    assert len(calls) > before


def test_cache_not_serialised_nor_part_of_equality():
    m = Message.user("x" * 40)
    count_message(HeuristicCounter(), m)
    back = Message.model_validate_json(m.model_dump_json())
    assert back == m
    assert "heuristic" not in m.model_dump_json()
    assert count_message(HeuristicCounter(), back) == 14


def test_heuristic_counters_with_different_settings_do_not_share_cache():
    m = Message.user("x" * 40, images=("https://a/1.png",))
    default = HeuristicCounter()
    more_overhead = HeuristicCounter(per_message_overhead=10)
    no_images = HeuristicCounter(image_tokens=0)
    three = HeuristicCounter(chars_per_token=2)
    assert count_message(default, m) == 10 + 85 + 4
    assert count_message(more_overhead, m) == 10 + 85 + 10
    assert count_message(no_images, m) == 10 + 0 + 4
    assert count_message(three, m) == 20 + 85 + 4
    # and the first count is still the first counter's
    assert count_message(default, m) == 10 + 85 + 4


def test_callable_counters_with_different_overhead_do_not_share_cache():
    m = Message.user("a b c")
    assert count_message(CallableCounter(words, per_message_overhead=0), m) == 3
    assert count_message(CallableCounter(words, per_message_overhead=10), m) == 13


def test_callable_counters_with_different_image_tokens_do_not_share_cache():
    m = Message.user("a b", images=("https://a/1.png",))
    assert count_message(CallableCounter(words, image_tokens=0), m) == 2 + 0 + 4
    assert count_message(CallableCounter(words, image_tokens=1000), m) == 2 + 1000 + 4


def test_callable_counter_key_survives_function_id_reuse():
    m = Message.user("one two three")
    stale = []
    for i in range(50):
        counter = CallableCounter(lambda _s, i=i: i, per_message_overhead=0)
        got = count_message(counter, m)
        if got != i:
            stale.append((i, got))
        del counter
    assert stale == []


def test_model_copy_with_update_is_counted_afresh():
    c = HeuristicCounter()
    m = Message.user("x" * 40)
    assert count_message(c, m) == 14
    bigger = m.model_copy(update={"content": "x" * 400})
    assert count_message(c, bigger) == c.count(bigger) == 104


def test_count_messages_sums():
    c = HeuristicCounter()
    msgs = [Message.user("x" * 40), Message.assistant("y" * 4), Message.system("")]
    assert count_messages(c, msgs) == 14 + 5 + 4
    assert count_messages(c, []) == 0


# --------------------------------------------------------------------------- TiktokenCounter


def test_tiktoken_counter_with_real_encoding(byte_encoding):
    c = TiktokenCounter(byte_encoding, per_message_overhead=3)
    assert c.count_text("hello world") == 11  # one token per byte
    assert c.count_text("abab") == 2  # the b"ab" merge applies
    assert c.count_text("") == 0
    assert c.count_text("é") == 2  # two UTF-8 bytes
    assert c.count(Message.user("hello")) == 5 + 3
    assert c.cache_key == ("tiktoken", "bytes-test", 3, 85)
    assert isinstance(c, TokenCounter)


def test_tiktoken_counts_special_tokens_as_text(byte_encoding):
    c = TiktokenCounter(byte_encoding)
    assert c.count_text("<|end|>") == len("<|end|>")


def test_tiktoken_counter_message_parts(byte_encoding):
    c = TiktokenCounter(byte_encoding, per_message_overhead=0, image_tokens=7)
    m = Message.user([TextPart(text="ab ab"), ImagePart(url="u")])
    assert c.count(m) == 3 + 7  # "ab", " ", "ab" + one image
    call = Message.assistant("", tool_calls=[ToolCall(id="c1", name="f", arguments={})])
    assert c.count(call) > 0


def test_tiktoken_counter_caches_with_count_message(byte_encoding):
    c = TiktokenCounter(byte_encoding, per_message_overhead=0)
    h = HeuristicCounter(per_message_overhead=0)
    m = Message.user("hello world")
    assert count_message(c, m) == 11
    assert count_message(h, m) == 3
    assert count_message(c, m) == 11


def test_tiktoken_unavailable_encoding_raises_missing_dependency(monkeypatch, tmp_path):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    with pytest.raises(MissingDependencyError, match="some-unavailable-encoding") as exc_info:
        TiktokenCounter("some-unavailable-encoding")
    assert isinstance(exc_info.value, ImportError)
    assert isinstance(exc_info.value, MarsysMemError)
    assert "TIKTOKEN_CACHE_DIR" in str(exc_info.value)


# --------------------------------------------------------------------------- get_counter


@pytest.mark.parametrize("spec", [None, "heuristic"])
def test_get_counter_heuristic(spec):
    c = get_counter(spec)
    assert isinstance(c, HeuristicCounter)
    assert c.count(Message.user("x" * 40)) == 14


def test_get_counter_returns_counter_instance_unchanged(byte_encoding):
    h = HeuristicCounter(per_message_overhead=1)
    assert get_counter(h) is h
    t = TiktokenCounter(byte_encoding)
    assert get_counter(t) is t
    cc = CallableCounter(words)
    assert get_counter(cc) is cc


def test_get_counter_tiktoken_spelling(monkeypatch, tmp_path):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    with pytest.raises(MissingDependencyError, match="some-unavailable-encoding"):
        get_counter("tiktoken:some-unavailable-encoding")


@pytest.mark.parametrize("spec", ["bogus", "Heuristic", "tiktok", ""])
def test_get_counter_unknown_name(spec):
    with pytest.raises(ValueError, match="unknown token counter"):
        get_counter(spec)


@pytest.mark.parametrize("spec", [42, 3.5, object()])
def test_get_counter_wrong_type(spec):
    with pytest.raises(TypeError, match="TokenCounter"):
        get_counter(spec)  # type: ignore[arg-type]
