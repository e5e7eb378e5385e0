"""Unit tests for ContextPolicy, ContextWindow, build_context and ConversationMemory.context."""

from __future__ import annotations

import gc
import itertools

import pydantic
import pytest

from marsys_mem import (
    ContextPolicy,
    ContextWindow,
    ConversationMemory,
    HeuristicCounter,
    Message,
    ToolCall,
)
from marsys_mem.context import CallableCounter, abuild_context, build_context
from marsys_mem.context.blocks import parse_block
from marsys_mem.context.tokens import count_message
from marsys_mem.exceptions import ContextOverflowError, SummarizerError
from marsys_mem.model import EventBus, SummarizeEvent, TrimEvent, WindowEvent, to_llm_format


def said(message: Message) -> str:
    """What the summariser wrote, read back from the summary block."""
    return "\n".join(item.text for item in parse_block(message.text).items)

COUNTER = HeuristicCounter()


def users(n: int, size: int = 40, start: int = 0) -> list[Message]:
    """``n`` user messages of ``size`` characters: 14 tokens each at size 40."""
    return [Message.user(f"{i:04d}".ljust(size, "x")) for i in range(start, start + n)]


def tool_turn(call_ids: list[str], *, text: str = "r" * 40, **fields) -> list[Message]:
    calls = [ToolCall(id=c, name="lookup", arguments={"q": c}) for c in call_ids]
    return [
        Message.assistant("", tool_calls=calls, **fields),
        *(Message.tool(text, tool_call_id=c, name="lookup") for c in call_ids),
    ]


def texts(win: ContextWindow) -> list[str]:
    return [m.text for m in win.messages]


def recount(messages) -> int:
    return sum(count_message(COUNTER, m) for m in messages)


class CountingSummarizer:
    """Deterministic fake that records what it was asked to summarise."""

    def __init__(self) -> None:
        self.calls: list[list[Message]] = []

    def __call__(self, messages: list[Message]) -> str:
        self.calls.append(list(messages))
        fresh = [m for m in messages if not m.metadata.get("summary")]
        return f"summary#{len(self.calls)} of {len(fresh)}"


# ---------------------------------------------------------------------- ContextPolicy
def _field_named(exc: pydantic.ValidationError, name: str) -> bool:
    return any(name in err["loc"] or name in err["msg"] for err in exc.errors())


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_messages": 0}, "max_messages"),
        ({"max_messages": -3}, "max_messages"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"strategy": "summarize", "keep_recent": -1}, "keep_recent"),
        ({"strategy": "summarize", "summary_max_tokens": 0}, "summary_max_tokens"),
        ({"keep_recent": 5}, "keep_recent"),
        ({"strategy": "trim_oldest", "keep_recent": 0}, "keep_recent"),
        ({"summary_max_tokens": 10}, "summary_max_tokens"),
        ({"strategy": "trim_oldest", "summary_max_tokens": 10}, "summary_max_tokens"),
        ({"strategy": "summarize", "max_tokens": 100, "summary_max_tokens": 100},
         "summary_max_tokens"),
        ({"strategy": "summarize", "max_tokens": 100, "summary_max_tokens": 250},
         "summary_max_tokens"),
        ({"strategy": "newest_first"}, "strategy"),
        ({"max_msgs": 3}, "max_msgs"),
    ],
)
def test_policy_validation_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(pydantic.ValidationError) as info:
        ContextPolicy(**kwargs)
    assert _field_named(info.value, field), info.value.errors()


def test_policy_unknown_token_counter_is_a_validation_error() -> None:
    with pytest.raises(pydantic.ValidationError, match="bogus"):
        ContextPolicy(token_counter="bogus")


def test_policy_unknown_token_counter_names_the_field() -> None:
    with pytest.raises(pydantic.ValidationError) as info:
        ContextPolicy(token_counter="bogus")
    assert _field_named(info.value, "token_counter"), info.value.errors()


def test_policy_unknown_tiktoken_encoding_is_a_validation_error() -> None:
    with pytest.raises(pydantic.ValidationError):
        ContextPolicy(token_counter="tiktoken:no_such_encoding")


def test_policy_valid_values_and_defaults() -> None:
    p = ContextPolicy()
    assert (p.max_messages, p.max_tokens, p.strategy, p.keep_recent) == (
        None, None, "sliding_window", None)
    assert p.summary_reserve is None
    s = ContextPolicy(strategy="summarize", max_tokens=4000, keep_recent=0)
    assert s.summary_reserve == 1000
    small = ContextPolicy(strategy="summarize", max_tokens=3, summary_max_tokens=2)
    assert small.summary_reserve == 2
    assert ContextPolicy(strategy="summarize", summary_max_tokens=7).summary_reserve == 7
    assert ContextPolicy(token_counter="heuristic").token_counter == "heuristic"
    with pytest.raises(pydantic.ValidationError):
        p.max_tokens = 5  # frozen


# ---------------------------------------------------------------------- limits
def test_stricter_limit_wins_messages() -> None:
    msgs = users(10)
    win = build_context(msgs, ContextPolicy(max_messages=3, max_tokens=10_000))
    assert texts(win) == [m.text for m in msgs[-3:]]
    assert win.dropped == 7
    assert win.tokens == 3 * 14


def test_stricter_limit_wins_tokens() -> None:
    msgs = users(10)
    win = build_context(msgs, ContextPolicy(max_messages=9, max_tokens=2 * 14 + 13))
    assert texts(win) == [m.text for m in msgs[-2:]]
    assert win.tokens == 28 <= 41
    exact = build_context(msgs, ContextPolicy(max_messages=9, max_tokens=3 * 14))
    assert len(exact) == 3
    assert exact.tokens == 42


def test_no_limits_keeps_everything() -> None:
    msgs = [Message.system("sys"), *users(5)]
    win = build_context(msgs)
    assert list(win.messages) == msgs
    assert win.dropped == 0
    assert win.tokens == win.history_tokens == recount(msgs)
    assert win.tokens_saved == 0


def test_system_and_pinned_messages_always_kept() -> None:
    pinned = Message.user("remember: budget 4000 EUR", pinned=True)
    preserved = Message.assistant("noted", metadata={"preserve": True})
    msgs = [Message.system("sys"), pinned, preserved, *users(10)]
    win = build_context(msgs, ContextPolicy(max_messages=5))
    assert win.messages[:3] == (msgs[0], pinned, preserved)
    assert texts(win)[3:] == [m.text for m in msgs[-2:]]


def test_tool_group_kept_or_dropped_together() -> None:
    turn = tool_turn(["a", "b"])  # 3 messages
    msgs = [*users(2), *turn, Message.assistant("done")]
    # start_on="any": room for 3: the group (3 messages) does not fit next to "done", so it
    # goes whole
    win = build_context(msgs, ContextPolicy(max_messages=3, start_on="any"))
    assert [m.role for m in win.messages] == ["assistant"]
    assert texts(win) == ["done"]
    win = build_context(msgs, ContextPolicy(max_messages=4, start_on="any"))
    assert win.messages == (*turn, msgs[-1])
    # start_on="user" (the default): the newest user turn comes with its whole exchange
    win = build_context(msgs, ContextPolicy(max_messages=5))
    assert win.messages == (msgs[1], *turn, msgs[-1])
    with pytest.raises(ContextOverflowError, match="newest user turn") as err:
        build_context(msgs, ContextPolicy(max_messages=4))
    assert (err.value.required, err.value.limit, err.value.unit) == (5, 4, "messages")


def test_window_never_starts_with_a_tool_result() -> None:
    msgs = [*users(3), *tool_turn(["c1"])]
    win = build_context(msgs, ContextPolicy(max_messages=2, start_on="any"))
    assert [m.role for m in win.messages] == ["assistant", "tool"]
    win = build_context(msgs, ContextPolicy(max_messages=3))  # start_on="user"
    assert [m.role for m in win.messages] == ["user", "assistant", "tool"]


def test_pinned_tool_result_keeps_its_call_and_siblings() -> None:
    a, r1, r2 = tool_turn(["x", "y"])
    r2 = Message.tool("pinned result", tool_call_id="y", pinned=True)
    msgs = [a, r1, r2, *users(6)]
    win = build_context(msgs, ContextPolicy(max_messages=5))
    assert win.messages[:3] == (a, r1, r2)
    assert len(win) == 5


def test_unrelated_message_inside_a_pinned_group_is_not_protected() -> None:
    call = Message.assistant("", tool_calls=[ToolCall(id="c1", name="t")], pinned=True)
    between = Message.user("unrelated, not pinned")
    result = Message.tool("res", tool_call_id="c1")
    newer = users(3)
    win = build_context([call, between, result, *newer], ContextPolicy(max_messages=4))
    # the pinned group (2) + the 2 newest messages; "between" is older than both
    assert list(win.messages) == [call, result, *newer[-2:]]


def test_orphan_tool_results_are_never_sent() -> None:
    orphan = Message.tool("lost", tool_call_id="nobody", pinned=True)
    msgs = [Message.system("s"), orphan, *users(2)]
    win = build_context(msgs)
    assert orphan not in win.messages
    assert win.dropped == 1
    mem = ConversationMemory(msgs, strict_tools=False)
    assert orphan not in mem.context().messages


# ---------------------------------------------------------------------- overflow
def test_overflow_on_protected_tokens_has_the_numbers() -> None:
    sys_msg = Message.system("s" * 400)  # 104 tokens
    with pytest.raises(ContextOverflowError) as info:
        build_context([sys_msg, *users(3)], ContextPolicy(max_tokens=50))
    err = info.value
    assert (err.required, err.limit, err.unit, err.over) == (104, 50, "tokens", 54)
    for number in ("104", "50", "54"):
        assert number in str(err)
    assert isinstance(err, ValueError)


def test_overflow_on_protected_messages_has_the_numbers() -> None:
    msgs = [Message.system("a"), Message.system("b"), Message.user("c", pinned=True), *users(2)]
    with pytest.raises(ContextOverflowError) as info:
        build_context(msgs, ContextPolicy(max_messages=2))
    err = info.value
    assert (err.required, err.limit, err.unit, err.over) == (3, 2, "messages", 1)
    assert "3" in str(err)
    assert "2" in str(err)


def test_overflow_when_newest_turn_does_not_fit() -> None:
    msgs = [*users(2), *tool_turn(["a", "b", "c"])]  # newest turn: 4 messages
    with pytest.raises(ContextOverflowError) as info:
        build_context(msgs, ContextPolicy(max_messages=3))
    assert (info.value.required, info.value.limit, info.value.unit) == (4, 3, "messages")
    big = Message.user("y" * 400)  # 104 tokens
    with pytest.raises(ContextOverflowError) as info:
        build_context([*users(2), big], ContextPolicy(max_tokens=100))
    assert (info.value.required, info.value.limit, info.value.unit) == (104, 100, "tokens")
    assert "104" in str(info.value)
    assert "over by 4" in str(info.value)


def test_orphan_after_the_newest_turn_does_not_hide_its_overflow() -> None:
    big = Message.user("y" * 400)  # 104 tokens
    orphan = Message.tool("late", tool_call_id="ghost")
    with pytest.raises(ContextOverflowError) as info:
        build_context([*users(2), big, orphan], ContextPolicy(max_tokens=100))
    assert (info.value.required, info.value.unit) == (104, "tokens")


def test_overflow_leaves_trim_oldest_memory_unchanged() -> None:
    mem = ConversationMemory([Message.system("s" * 400), *users(5)])
    before, tokens = mem.read(), mem.total_tokens
    with pytest.raises(ContextOverflowError):
        mem.context(ContextPolicy(max_tokens=60, strategy="trim_oldest"))
    assert mem.read() == before
    assert mem.total_tokens == tokens


def test_token_cache_not_stale_after_model_copy() -> None:
    """A copy with new content must not reuse the original's cached count."""
    small = Message.user("hi")
    ConversationMemory([small])  # counts (and caches) the small message
    big = small.model_copy(update={"content": "x" * 4000, "message_id": "big"})
    with pytest.raises(ContextOverflowError):
        build_context([big], ContextPolicy(max_tokens=100))


# ---------------------------------------------------------------------- summarize
def _summarize_policy(**kw) -> ContextPolicy:
    return ContextPolicy(strategy="summarize", **kw)


def test_summarize_calls_summariser_only_for_new_messages() -> None:
    fake = CountingSummarizer()
    history = [Message.system("rules"), *users(30)]
    mem = ConversationMemory(history, summarizer=fake)
    policy = _summarize_policy(keep_recent=5)

    first = mem.context(policy)
    assert len(fake.calls) == 1
    assert fake.calls[0] == history[1:26]  # the 25 dropped messages, no system message
    assert first.summarized == 25
    assert first.summary is not None
    assert said(first.summary) == "summary#1 of 25"
    assert list(first.messages) == [history[0], first.summary, *history[-5:]]
    assert first.dropped == 25

    second = mem.context(policy)  # nothing new: the cached summary
    assert len(fake.calls) == 1
    assert second.summarized == 0
    assert second.summary is not None
    assert said(second.summary) == "summary#1 of 25"

    more = users(10, start=100)
    mem.add_many(more)
    third = mem.context(policy)
    assert len(fake.calls) == 2
    request = fake.calls[1]
    head = request[0]
    assert head.role == "system"
    assert head.metadata["summary"] is True
    assert head.text == "summary#1 of 25"
    assert request[1:] == [*history[-5:], *more[:5]]  # only the newly dropped
    assert third.summarized == 10
    assert third.summary is not None
    assert said(third.summary) == "summary#2 of 10"
    assert third.summary.metadata["summary"] is True
    assert list(third.messages) == [history[0], third.summary, *more[-5:]]


def test_summarize_nothing_dropped_means_no_summary_and_no_call() -> None:
    fake = CountingSummarizer()
    mem = ConversationMemory(users(3))
    win = mem.context(_summarize_policy(max_messages=10), summarizer=fake)
    assert fake.calls == []
    assert win.summary is None
    assert len(win) == 3


def test_summarize_history_that_exactly_fits_is_not_summarised() -> None:
    fake = CountingSummarizer()
    msgs = [Message.system("s"), *users(4)]
    win = build_context(msgs, _summarize_policy(max_messages=5), summarizer=fake)
    assert list(win.messages) == msgs
    assert win.summary is None
    assert fake.calls == []
    tokens = recount(msgs)
    win = build_context(msgs, _summarize_policy(max_tokens=tokens), summarizer=fake)
    assert list(win.messages) == msgs
    assert fake.calls == []


def test_summarize_respects_max_messages_with_the_summary() -> None:
    fake = CountingSummarizer()
    msgs = [Message.system("s"), *users(12)]
    win = build_context(msgs, _summarize_policy(max_messages=5), summarizer=fake)
    assert len(win) == 5
    assert win.messages[0] == msgs[0]
    assert win.messages[1] is win.summary
    assert list(win.messages[2:]) == msgs[-3:]
    assert fake.calls == [msgs[1:10]]
    assert win.dropped == 9


def test_summary_placed_after_leading_system_messages() -> None:
    sys1, sys2 = Message.system("one"), Message.system("two")
    msgs = [sys1, sys2, *users(10)]
    win = build_context(msgs, _summarize_policy(keep_recent=3), summarizer=CountingSummarizer())
    assert win.messages[0] == sys1
    assert win.messages[1] == sys2
    summary = win.messages[2]
    assert summary is win.summary
    assert summary.role == "system"
    assert summary.metadata["summary"] is True
    assert list(win.messages[3:]) == msgs[-3:]


def test_summary_too_long_is_cut_to_summary_max_tokens() -> None:
    def verbose(messages: list[Message]) -> str:
        return "word " * 2000

    msgs = users(40)
    policy = _summarize_policy(max_tokens=300, summary_max_tokens=50)
    win = build_context(msgs, policy, summarizer=verbose)
    assert win.summary is not None
    assert count_message(COUNTER, win.summary) <= 50
    assert said(win.summary).endswith("…")
    assert len(said(win.summary)) > 60  # cut, not emptied (the block header costs ~27)
    assert win.tokens <= 300
    assert win.tokens == recount(win.messages)


def test_summary_default_reserve_is_a_quarter_of_max_tokens() -> None:
    win = build_context(users(40), _summarize_policy(max_tokens=400),
                        summarizer=lambda ms: "z" * 5000)
    assert win.summary is not None
    assert count_message(COUNTER, win.summary) <= 100
    assert win.tokens <= 400


def test_default_summariser_is_the_extractive_one() -> None:
    msgs = [Message.user(f"The budget for project {i} is {i}000 EUR.") for i in range(20)]
    win = build_context(msgs, _summarize_policy(keep_recent=4))
    assert win.summary is not None
    assert win.summary.text.startswith("Summary of earlier conversation (recalled from memory")
    mem = ConversationMemory(msgs)
    assert mem.context(_summarize_policy(keep_recent=4)).summary.text == win.summary.text


def test_summariser_that_raises_leaves_memory_unchanged() -> None:
    def broken(messages: list[Message]) -> str:
        raise RuntimeError("model down")

    bus = EventBus()
    mem = ConversationMemory([Message.system("s"), *users(20)], events=bus)
    before, tokens = mem.read(), mem.total_tokens
    policy = _summarize_policy(keep_recent=4)
    with pytest.raises(SummarizerError, match="model down") as info:
        mem.context(policy, summarizer=broken)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert mem.read() == before
    assert mem.total_tokens == tokens
    assert bus.history("summarize") == []
    # nothing was cached as summarised: a working summariser gets every dropped message
    fake = CountingSummarizer()
    win = mem.context(policy, summarizer=fake)
    assert fake.calls == [before[1:17]]
    assert win.summarized == 16


def test_summariser_returning_non_str_raises() -> None:
    mem = ConversationMemory(users(10))
    with pytest.raises(SummarizerError, match="int"):
        mem.context(_summarize_policy(keep_recent=2), summarizer=lambda ms: 42)
    with pytest.raises(SummarizerError):
        build_context(users(10), _summarize_policy(keep_recent=2), summarizer=lambda ms: None)
    # and the failed attempt cached nothing
    fake = CountingSummarizer()
    mem.context(_summarize_policy(keep_recent=2), summarizer=fake)
    assert len(fake.calls) == 1
    assert len(fake.calls[0]) == 8


async def test_async_summariser_with_acontext_and_abuild_context() -> None:
    seen: list[list[Message]] = []

    async def asummary(messages: list[Message]) -> str:
        seen.append(messages)
        return f"async summary of {len(messages)}"

    msgs = [Message.system("s"), *users(10)]
    policy = _summarize_policy(keep_recent=3)
    win = await abuild_context(msgs, policy, summarizer=asummary)
    assert win.summary is not None
    assert said(win.summary) == "async summary of 7"
    assert list(win.messages) == [msgs[0], win.summary, *msgs[-3:]]

    mem = ConversationMemory(msgs, summarizer=asummary)
    win2 = await mem.acontext(policy)
    assert win2.summary is not None
    assert said(win2.summary) == "async summary of 7"
    # a sync summariser works with acontext too
    fake = CountingSummarizer()
    win3 = await ConversationMemory(msgs).acontext(policy, summarizer=fake)
    assert win3.summary is not None
    assert len(fake.calls) == 1


async def test_async_summariser_errors_in_acontext() -> None:
    async def broken(messages: list[Message]) -> str:
        raise ValueError("nope")

    async def not_text(messages: list[Message]) -> object:
        return ["list"]

    mem = ConversationMemory(users(10))
    before = mem.read()
    with pytest.raises(SummarizerError, match="nope"):
        await mem.acontext(_summarize_policy(keep_recent=2), summarizer=broken)
    with pytest.raises(SummarizerError, match="list"):
        await mem.acontext(_summarize_policy(keep_recent=2), summarizer=not_text)
    assert mem.read() == before


def test_async_summariser_with_sync_context_raises() -> None:
    async def asummary(messages: list[Message]) -> str:
        return "never"

    mem = ConversationMemory(users(10))
    with pytest.raises(SummarizerError, match="acontext"):
        mem.context(_summarize_policy(keep_recent=2), summarizer=asummary)
    with pytest.raises(SummarizerError, match="abuild_context"):
        build_context(users(10), _summarize_policy(keep_recent=2), summarizer=asummary)
    gc.collect()  # an un-awaited coroutine would warn here (warnings are errors)
    assert mem.read() == mem.read()


def test_summarize_event_published_with_counts() -> None:
    bus = EventBus()
    mem = ConversationMemory([Message.system("s"), *users(20)], events=bus, agent="ana")
    win = mem.context(_summarize_policy(keep_recent=5), summarizer=CountingSummarizer())
    (event,) = bus.history("summarize")
    assert isinstance(event, SummarizeEvent)
    assert event.agent == "ana"
    assert event.summarized == 15 == win.summarized
    assert event.before == 21
    assert event.after == len(win) == 7
    assert event.tokens_before == mem.total_tokens == win.history_tokens
    assert event.tokens_after == win.tokens
    mem.context(_summarize_policy(keep_recent=5), summarizer=CountingSummarizer())
    assert len(bus.history("summarize")) == 1  # cached: no new summarising


def test_window_event_only_when_subscribed() -> None:
    bus = EventBus()
    mem = ConversationMemory(users(5), events=bus)
    mem.context(ContextPolicy(max_messages=2))
    assert bus.history("window") == []
    seen: list[WindowEvent] = []
    bus.subscribe("window", seen.append)
    win = mem.context(ContextPolicy(max_messages=2))
    (event,) = seen
    assert (event.before, event.after, event.strategy) == (5, 2, "sliding_window")
    assert (event.tokens_before, event.tokens_after) == (win.history_tokens, win.tokens)


# ---------------------------------------------------------------------- trim_oldest
def test_trim_oldest_deletes_dropped_messages_and_publishes() -> None:
    bus = EventBus()
    history = [Message.system("s"), *users(20)]
    mem = ConversationMemory(history, events=bus, agent="bob")
    tokens_before = mem.total_tokens
    win = mem.context(ContextPolicy(max_messages=5, strategy="trim_oldest"))
    kept = [history[0], *history[-4:]]
    assert list(win.messages) == kept
    assert mem.read() == kept
    assert mem.total_tokens == recount(kept)
    assert win.dropped == 16
    assert win.summary is None
    removed_ids = tuple(m.message_id for m in history[1:17])
    assert win.dropped_ids == removed_ids
    (event,) = bus.history("trim")
    assert isinstance(event, TrimEvent)
    assert event.agent == "bob"
    assert event.message_ids == removed_ids
    assert (event.before, event.after) == (21, 5)
    assert (event.tokens_before, event.tokens_after) == (tokens_before, mem.total_tokens)
    assert event.strategy == "trim_oldest"
    # a second call with nothing to drop deletes nothing and publishes nothing
    again = mem.context(ContextPolicy(max_messages=5, strategy="trim_oldest"))
    assert list(again.messages) == kept
    assert again.dropped == 0
    assert len(bus.history("trim")) == 1


def test_trim_oldest_in_build_context_is_a_view() -> None:
    msgs = users(10)
    copy = list(msgs)
    win = build_context(msgs, ContextPolicy(max_messages=3, strategy="trim_oldest"))
    assert msgs == copy
    assert len(win) == 3
    assert win.strategy == "trim_oldest"


def test_trim_oldest_keeps_tool_groups_and_drops_orphans_from_memory() -> None:
    orphan = Message.tool("stray", tool_call_id="ghost")
    turn = tool_turn(["k1", "k2"])
    mem = ConversationMemory([*users(3), orphan, *turn], strict_tools=False)
    win = mem.context(ContextPolicy(max_messages=3, strategy="trim_oldest", start_on="any"))
    assert list(win.messages) == turn
    assert mem.read() == turn
    assert "ghost" not in {m.tool_call_id for m in mem}


# ---------------------------------------------------------------------- ContextWindow
def test_context_window_fields() -> None:
    msgs = [Message.system("be terse"), *users(6), *tool_turn(["w1"])]
    win = build_context(msgs, ContextPolicy(max_messages=4))
    assert len(win) == 4
    assert list(win) == list(win.messages)
    assert win.history_messages == len(msgs)
    assert win.history_tokens == recount(msgs)
    assert win.tokens == recount(win.messages)
    assert win.tokens_saved == win.history_tokens - win.tokens > 0
    assert win.to_llm_format() == to_llm_format(win.messages, "openai")
    assert win.to_llm_format("openai")[-1] == {
        "role": "tool", "tool_call_id": "w1", "content": "r" * 40}
    anthropic = win.to_llm_format("anthropic")
    assert anthropic == to_llm_format(win.messages, "anthropic")
    assert anthropic["system"] == "be terse"
    with pytest.raises(ValueError, match="provider"):
        win.to_llm_format("gemini")  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        win.tokens = 3  # type: ignore[misc]


def test_tokens_saved_negative_when_summary_costs_more() -> None:
    win = build_context(
        [Message.user("a"), Message.user("b")],
        _summarize_policy(keep_recent=1),
        summarizer=lambda ms: "a long summary " * 20,
    )
    assert win.summary is not None
    assert win.tokens_saved < 0


def test_memory_counter_and_policy_counter() -> None:
    words = CallableCounter(lambda s: len(s.split()), per_message_overhead=0, key="words-ctx")
    mem = ConversationMemory([Message.user("one two three"), Message.user("four five")],
                             counter=words)
    assert mem.total_tokens == 5
    win = mem.context(ContextPolicy(max_tokens=2))
    assert [m.text for m in win.messages] == ["four five"]
    assert win.tokens == 2
    # the policy's counter overrides the memory's
    win = mem.context(ContextPolicy(token_counter="heuristic"))
    assert win.tokens == recount(mem.read()) == win.history_tokens


# ---------------------------------------------------------------------- cost: O(window)
class ProbedMemory(ConversationMemory):
    """Counts every message the window builder reads by position or iteration."""

    reads = 0

    def __getitem__(self, position):  # type: ignore[override]
        if isinstance(position, int):
            ProbedMemory.reads += 1
        return super().__getitem__(position)

    def __iter__(self):  # type: ignore[override]
        for m in super().__iter__():
            ProbedMemory.reads += 1
            yield m


@pytest.fixture(scope="module")
def big_history() -> list[Message]:
    head = [Message.system("you are an analyst"), Message.user("keep this", pinned=True)]
    body = []
    for i in range(20_000):
        if i % 100 == 50:
            body.extend(tool_turn([f"big{i}"], text="t" * 12))
        else:
            body.append(Message.user(f"message {i}"))
    return head + body


@pytest.mark.parametrize("strategy", ["sliding_window", "summarize"])
def test_second_window_costs_o_window_not_o_history(
    big_history: list[Message], strategy: str
) -> None:
    ids = itertools.count()
    counted: list[int] = []

    def count_fn(text: str) -> int:
        counted.append(next(ids))
        return len(text) // 4

    counter = CallableCounter(count_fn, key=("probe", object()))  # fresh cache key
    mem = ProbedMemory(big_history, counter=counter, summarizer=CountingSummarizer())
    n = len(mem)
    assert n > 20_000
    kw = {"keep_recent": 40} if strategy == "summarize" else {}
    policy = ContextPolicy(strategy=strategy, max_messages=50, **kw)
    first = mem.context(policy)
    window = len(first)
    assert window <= 50

    mem.add(Message.user("one more"))
    ProbedMemory.reads = 0
    counts_before = len(counted)
    second = mem.context(policy)
    assert len(second) <= 50
    assert second.history_messages == n + 1
    # a scan of the history would read > 20 000 messages; the window is 50
    assert ProbedMemory.reads < 20 * window, ProbedMemory.reads
    assert len(counted) - counts_before < 2 * window
    if strategy == "summarize":
        assert second.summarized <= 2  # only what fell out since the first call


def test_window_with_policy_counter_costs_o_window(big_history: list[Message]) -> None:
    mem = ProbedMemory(big_history, counter=HeuristicCounter(chars_per_token=3))
    policy = ContextPolicy(max_messages=50, token_counter="heuristic")
    mem.context(policy)
    mem.add(Message.user("one more"))
    ProbedMemory.reads = 0
    mem.context(policy)
    assert ProbedMemory.reads < 20 * 50, ProbedMemory.reads
