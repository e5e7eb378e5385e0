"""Issue 29: windows start on a user turn, and every provider form passes the provider's rules.

* A hypothesis property: random well-formed histories (tool calls, parallel calls, pinned
  and system messages, agent calls, summaries) under random policies, for every strategy
  and the paths that build windows (``build_context``, ``ConversationMemory.context``,
  ``MemoryManager.context_for``, ``MarsysSession`` with a policy, the LangGraph
  ``marsys_window``): either ``ContextOverflowError`` with a justified requirement, or a
  window that starts on a user turn, keeps the newest user turn and all after it, fits the
  budget, and whose Anthropic, Chat Completions and Responses forms pass
  :mod:`marsys_mem.testing.provider_rules`.
* The measured case as a regression test: 20 random tool-using conversations x 5 budgets x
  2 strategies, no window starts with an assistant message (126 of 200 did on 85cf284).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marsys_mem import (
    ContextPolicy,
    ContextWindow,
    ConversationMemory,
    MemoryManager,
    Message,
    ToolCall,
)
from marsys_mem.config import MemoryConfig
from marsys_mem.context import build_context
from marsys_mem.context.blocks import parse_block
from marsys_mem.context.tokens import count_message, get_counter
from marsys_mem.exceptions import ContextOverflowError
from marsys_mem.model.messages import is_user_turn, to_llm_format
from marsys_mem.testing.provider_rules import (
    anthropic_violations,
    assert_accepted,
    chat_violations,
    responses_violations,
)


def said(message: Message) -> str:
    """What the summariser wrote, read back from the summary block."""
    return "\n".join(item.text for item in parse_block(message.text).items)

SETTINGS = settings(
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    deadline=None,
    max_examples=60,
)
WORDS = "alpha beta gamma budget Tokyo weather report growth plan tool result 42 q4".split()


def _text(rng: random.Random, size: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(size))


# ---------------------------------------------------------------------- histories
def conversation(seed: int, turns: int, *, pins: bool = True, prefix: str = "") -> list[Message]:
    """A well-formed history: system messages, then turns of a user (or agent call) followed
    by assistant work (tool groups with 1-3 parallel calls, every call answered, results in
    any order, now and then a user or pinned system message between a call and its results),
    an assistant or agent answer; messages after the first user turn pinned at random.
    """
    rng = random.Random(seed)
    msgs: list[Message] = [Message.system("You are terse. " + _text(rng, rng.randint(0, 8)))]
    if rng.random() < 0.3:
        msgs.append(Message.assistant("Hello! How can I help?"))  # a greeting before any user
    calls = 0

    def pin() -> dict[str, Any]:
        if not pins:
            return {}
        r = rng.random()
        if r < 0.05:
            return {"pinned": True}
        if r < 0.07:
            return {"metadata": {"preserve": True}}
        return {}

    for t in range(turns):
        if rng.random() < 0.2:
            msgs.append(Message.agent_call(_text(rng, rng.randint(1, 20)), name="planner", **pin()))
        else:
            msgs.append(Message.user(_text(rng, rng.randint(1, 30)), **(pin() if t else {})))
        if rng.random() < 0.1:
            msgs.append(Message.user(""))  # an empty user message: no turn
        for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
            ids = []
            for _ in range(rng.randint(1, 3)):
                calls += 1
                ids.append(f"{prefix}c{calls}")
            tool_calls = [ToolCall(id=i, name="lookup", arguments={"q": i}) for i in ids]
            msgs.append(Message.assistant(_text(rng, rng.randint(0, 6)), tool_calls=tool_calls,
                                          **pin()))
            rng.shuffle(ids)
            for k, cid in enumerate(ids):
                if k and rng.random() < 0.08:
                    msgs.append(rng.choice([
                        Message.user("and meanwhile? " + _text(rng, 3)),
                        Message.system("note: " + _text(rng, 3), pinned=True),
                    ]))
                msgs.append(Message.tool(_text(rng, rng.randint(0, 60)), tool_call_id=cid,
                                         name="lookup", **pin()))
        if rng.random() < 0.25:
            msgs.append(Message.agent_response(_text(rng, rng.randint(1, 30)), **pin()))
        else:
            msgs.append(Message.assistant(_text(rng, rng.randint(1, 40)), **pin()))
        if rng.random() < 0.1:
            msgs.append(Message.system("rules: " + _text(rng, 4), **pin()))
    return msgs


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[Message], ContextPolicy]:
    seed = draw(st.integers(0, 2**32 - 1))
    history = conversation(seed, draw(st.integers(1, 12)))
    strategy = draw(st.sampled_from(["sliding_window", "trim_oldest", "summarize"]))
    total = sum(count_message(get_counter(None), m) for m in history)
    max_tokens = draw(st.one_of(st.none(), st.integers(20, max(21, total + 20))))
    max_messages = draw(st.one_of(st.none(), st.integers(2, len(history) + 2)))
    kw: dict[str, Any] = {}
    if strategy == "summarize":
        kw["keep_recent"] = draw(st.one_of(st.none(), st.integers(0, 12)))
    return history, ContextPolicy(
        strategy=strategy, max_tokens=max_tokens, max_messages=max_messages, **kw
    )


# ---------------------------------------------------------------------- the model
def _protected(history: list[Message]) -> set[int]:
    """System / pinned / preserve messages, with their tool-call groups, and the user turn a
    first pinned non-user message brings along."""
    owner = {c.id: i for i, m in enumerate(history) for c in m.tool_calls}
    results: dict[int, list[int]] = {}
    for i, m in enumerate(history):
        if m.tool_call_id is not None:
            results.setdefault(owner[m.tool_call_id], []).append(i)
    out: set[int] = set()
    for i, m in enumerate(history):
        if m.is_protected:
            caller = owner[m.tool_call_id] if m.tool_call_id is not None else i
            out |= {caller, *results.get(caller, [])}
    first = min((p for p in out if history[p].role != "system"), default=None)
    if first is not None and not is_user_turn(history[first]):
        anchor = max((k for k in range(first) if is_user_turn(history[k])), default=None)
        if anchor is not None:
            out.add(anchor)
    return out


def _inside_a_tool_group(history: list[Message]) -> set[int]:
    """Positions strictly between a tool call and its last result: a window cannot start
    there (the results after them need their call, which is before them)."""
    owner = {c.id: i for i, m in enumerate(history) for c in m.tool_calls}
    last: dict[int, int] = {}
    for i, m in enumerate(history):
        if m.tool_call_id is not None:
            last[owner[m.tool_call_id]] = i
    return {k for caller, end in last.items() for k in range(caller + 1, end)}


def _must(history: list[Message], protected: set[int]) -> set[int]:
    """What a window must hold: the protected messages, the newest user turn where a window
    can start (not one between a tool call and its results) and everything after it."""
    inside = _inside_a_tool_group(history)
    newest = max(
        (i for i, m in enumerate(history) if is_user_turn(m) and i not in inside),
        default=len(history),
    )
    return protected | set(range(newest, len(history)))


def check_forms(messages: list[Message] | tuple[Message, ...]) -> None:
    """Every provider form of a window passes the provider's rules."""
    assert_accepted("anthropic", to_llm_format(messages, "anthropic"))
    assert_accepted("openai", to_llm_format(messages, "openai"))
    assert_accepted("responses", to_llm_format(messages, "responses"))


def check_window(history: list[Message], policy: ContextPolicy, win: ContextWindow) -> None:
    body = [m for m in win.messages if m is not win.summary]
    opener = next((m for m in win.messages if m.role != "system"), None)
    assert opener is not None, [m.role for m in win.messages]
    assert is_user_turn(opener), [m.role for m in win.messages]
    ids = {m.message_id for m in body}
    protected = _protected(history)
    for i in _must(history, protected):
        assert history[i].message_id in ids, f"message {i} ({history[i].role}) was dropped"
    counter = get_counter(policy.token_counter)
    assert win.tokens == sum(count_message(counter, m) for m in win.messages)
    if policy.max_tokens is not None:
        assert win.tokens <= policy.max_tokens
    if policy.max_messages is not None:
        assert len(win) <= policy.max_messages
    if policy.strategy != "summarize":
        assert win.summary is None
    check_forms(win.messages)


def check_overflow(
    history: list[Message], policy: ContextPolicy, err: ContextOverflowError
) -> None:
    assert err.required > err.limit
    must = _must(history, _protected(history))
    counter = get_counter(policy.token_counter)
    reserve_t = policy.summary_reserve or 0 if policy.strategy == "summarize" else 0
    reserve_m = 1 if policy.strategy == "summarize" else 0
    tokens = sum(count_message(counter, history[i]) for i in must) + reserve_t
    fits_t = policy.max_tokens is None or tokens <= policy.max_tokens
    fits_m = policy.max_messages is None or len(must) + reserve_m <= policy.max_messages
    assert not (fits_t and fits_m), (err, tokens, len(must))


def attempt(fn: Any, *args: Any, **kw: Any) -> tuple[Any, ContextOverflowError | None]:
    try:
        return fn(*args, **kw), None
    except ContextOverflowError as err:
        return None, err


# ---------------------------------------------------------------------- properties
@SETTINGS
@given(case=cases())
def test_windows_start_on_a_user_turn_and_pass_every_providers_rules(
    case: tuple[list[Message], ContextPolicy],
) -> None:
    history, policy = case
    summarizer = lambda ms: f"{len(ms)} earlier messages"  # noqa: E731
    win, err = attempt(build_context, history, policy, summarizer=summarizer)
    mem = ConversationMemory(history)
    mwin, merr = attempt(mem.context, policy, summarizer=summarizer)
    if err is not None:
        check_overflow(history, policy, err)
        assert merr is not None
        assert mem.read() == history
        return
    assert merr is None
    check_window(history, policy, win)
    check_window(history, policy, mwin)
    assert [m.message_id if m is not win.summary else "S" for m in win.messages] == [
        m.message_id if m is not mwin.summary else "S" for m in mwin.messages]
    if policy.strategy == "trim_oldest":
        assert mem.read() == list(mwin.messages)
        again = mem.context(policy)  # a trimmed memory windows again the same way
        assert again.messages == mwin.messages
    if policy.strategy == "summarize":  # the cached summary, extended by one more exchange
        mem.add(Message.user("one more question"))
        mem.add(Message.assistant("one more answer"))
        more, err2 = attempt(mem.context, policy, summarizer=summarizer)
        if err2 is None:
            check_window(mem.read(), policy, more)


@SETTINGS
@given(case=cases())
def test_context_for_and_the_integrations_pass_every_providers_rules(
    case: tuple[list[Message], ContextPolicy],
) -> None:
    history, policy = case
    config = MemoryConfig.model_validate(
        {"version": 1, "defaults": {"context": policy.model_dump(exclude_none=True)}}
    )
    with MemoryManager(config) as manager:
        mem = manager.memory("agent")
        for m in history:
            mem.add(m)
        try:
            forms = {p: manager.context_for("agent", provider=p) for p in
                     ("anthropic", "openai", "responses")}
        except ContextOverflowError:
            forms = {}
        for api, payload in forms.items():
            assert_accepted(api, payload)  # type: ignore[arg-type]
        if forms:
            first = forms["openai"]
            opener = next(m for m in first if m["role"] != "system")
            assert opener["role"] == "user"
    _check_session(history, policy)
    _check_langgraph(history, policy)


def _check_session(history: list[Message], policy: ContextPolicy) -> None:
    """MarsysSession with a policy: its items pass the Responses rules."""
    agents = pytest.importorskip("marsys_mem.integrations.agents")
    with MemoryManager() as manager:
        session = agents.MarsysSession("s1", manager, agent="agent", policy=policy)
        mem = session.memory
        for m in history:
            mem.add(m)
        try:
            items = asyncio.run(session.get_items())
        except ContextOverflowError:
            return
        found = responses_violations(list(items))
        assert not found, found
        opener = next(i for i in items if i.get("role") not in ("system", "developer"))
        assert opener.get("type", "message") == "message"
        assert opener.get("role") == "user"


def _check_langgraph(history: list[Message], policy: ContextPolicy) -> None:
    """The LangGraph window (marsys_window): its messages, read back, pass every rule."""
    hooks = pytest.importorskip("marsys_mem.integrations.langgraph.hooks")
    lcm = pytest.importorskip("langchain_core.messages")
    originals: list[Any] = []
    for m in history:  # pins have no LangChain form: only system messages are protected
        if m.role == "system":
            originals.append(lcm.SystemMessage(m.text))
        elif m.role in ("user", "agent_call"):
            text = m.text if m.role == "user" else f"[Request from {m.name}]: {m.text}"
            originals.append(lcm.HumanMessage(text))
        elif m.role == "tool":
            originals.append(lcm.ToolMessage(m.text, tool_call_id=m.tool_call_id))
        else:
            calls = [{"id": c.id, "name": c.name, "args": dict(c.arguments)}
                     for c in m.tool_calls]
            originals.append(lcm.AIMessage(m.text, tool_calls=calls))
    try:
        window = hooks.marsys_window(originals, policy)
    except ContextOverflowError:
        return
    opener = next(m for m in window if not isinstance(m, lcm.SystemMessage))
    assert isinstance(opener, lcm.HumanMessage)
    check_forms(hooks.from_langchain(window))


# ---------------------------------------------------------------------- the measured case
def tool_conversation(seed: int) -> list[Message]:
    """A tool-using conversation like the issue's measurement: no pins, 6-14 turns."""
    return conversation(seed, random.Random(seed).randint(6, 14), pins=False, prefix="m")


@pytest.mark.parametrize("strategy", ["sliding_window", "summarize"])
def test_no_window_starts_with_an_assistant_message(strategy: str) -> None:
    """20 conversations x 5 budgets: every window opens on a user turn (126 of 200 windows
    opened on an assistant message on 85cf284, with the old default)."""
    opened_on_assistant = overflowed = windows = 0
    for seed in range(20):
        history = tool_conversation(seed)
        for budget in (150, 300, 600, 1200, 2400):
            policy = ContextPolicy(max_tokens=budget, strategy=strategy)
            win, err = attempt(ConversationMemory(history).context, policy)
            if err is not None:
                overflowed += 1
                assert "newest" in str(err)
                continue
            windows += 1
            opener = next(m for m in win.messages if m.role != "system")
            opened_on_assistant += opener.role in ("assistant", "agent_response")
            check_window(history, policy, win)
    assert opened_on_assistant == 0
    assert windows + overflowed == 100
    assert windows >= 80, (windows, overflowed)


def test_the_old_rule_still_opens_on_assistant_messages_and_anthropic_refuses_them() -> None:
    """With ``start_on="any"`` (the old behaviour) the measurement comes back, and the
    validator refuses those windows as Anthropic does."""
    refused = 0
    for seed in range(20):
        history = tool_conversation(seed)
        for budget in (150, 300, 600):
            win, err = attempt(build_context, history,
                               ContextPolicy(max_tokens=budget, start_on="any"))
            if err is None and anthropic_violations(win.to_llm_format("anthropic")):
                refused += 1
    assert refused > 10


# ---------------------------------------------------------------------- the rule, by example
def test_start_on_user_drops_the_assistant_messages_before_the_oldest_user_turn() -> None:
    call = ToolCall(id="c1", name="f")
    msgs = [
        Message.system("s"),
        Message.user("u1"),
        Message.assistant("", tool_calls=[call]),
        Message.tool("r", tool_call_id="c1"),
        Message.assistant("a1"),
        Message.user("u2"),
        Message.assistant("a2"),
    ]
    win = build_context(msgs, ContextPolicy(max_messages=5))
    assert [m.text for m in win.messages] == ["s", "u2", "a2"]
    win = build_context(msgs, ContextPolicy(max_messages=5, start_on="any"))
    assert [m.text for m in win.messages] == ["s", "a1", "u2", "a2"]  # the old window
    summed = build_context(msgs, ContextPolicy(max_messages=5, strategy="summarize"),
                           summarizer=lambda ms: " | ".join(m.role for m in ms))
    assert summed.summary is not None
    assert said(summed.summary) == "user | assistant | tool | assistant"  # folded in
    assert [m.role for m in summed.messages] == ["system", "system", "user", "assistant"]


def test_the_newest_user_turn_must_fit_or_the_error_says_by_how_much() -> None:
    calls = [ToolCall(id=f"c{i}", name="f") for i in range(3)]
    msgs = [Message.user("question"), Message.assistant("", tool_calls=calls),
            *(Message.tool("r" * 40, tool_call_id=c.id) for c in calls), Message.assistant("ok")]
    with pytest.raises(ContextOverflowError) as err:
        build_context(msgs, ContextPolicy(max_messages=5))
    assert (err.value.required, err.value.limit, err.value.over) == (6, 5, 1)
    assert "newest user turn" in str(err.value)
    counter = get_counter(None)
    need = sum(count_message(counter, m) for m in msgs)
    with pytest.raises(ContextOverflowError) as err:
        build_context(msgs, ContextPolicy(max_tokens=need - 1))
    assert (err.value.required, err.value.unit) == (need, "tokens")
    assert len(build_context(msgs, ContextPolicy(max_tokens=need))) == 6


def test_keep_recent_never_cuts_into_the_newest_user_turn() -> None:
    msgs = [Message.user(f"q{i}") if i % 3 == 0 else Message.assistant(f"a{i}")
            for i in range(9)]
    win = build_context(msgs, ContextPolicy(strategy="summarize", keep_recent=0),
                        summarizer=lambda ms: "earlier")
    assert win.summary is not None
    assert said(win.summary) == "earlier"
    assert [m.text for m in win.messages][1:] == ["q6", "a7", "a8"]


def test_a_pinned_assistant_message_brings_the_user_turn_before_it() -> None:
    msgs = [Message.system("s"), Message.user("plan please"),
            Message.assistant("THE PLAN", pinned=True),
            *(m for i in range(5) for m in (Message.user(f"q{i}"), Message.assistant(f"a{i}")))]
    win = build_context(msgs, ContextPolicy(max_messages=6))
    assert [m.text for m in win.messages] == ["s", "plan please", "THE PLAN", "q4", "a4"]
    check_forms(win.messages)
    lone = [Message.assistant("pinned greeting", pinned=True), Message.user("hi")]
    win = build_context(lone, ContextPolicy(max_messages=2))  # nothing before it to bring
    assert [m.text for m in win.messages] == ["pinned greeting", "hi"]


def test_a_history_with_no_user_turn_is_windowed_as_with_any() -> None:
    msgs = [Message.system("s"), *(Message.assistant(f"a{i}") for i in range(6))]
    for strategy in ("sliding_window", "summarize"):
        policy = ContextPolicy(max_messages=4, strategy=strategy)  # type: ignore[arg-type]
        old = build_context(msgs, policy.model_copy(update={"start_on": "any"}),
                            summarizer=lambda ms: "x")
        win = build_context(msgs, policy, summarizer=lambda ms: "x")
        assert win.messages[-2:] == old.messages[-2:]
        assert len(win) == len(old) == 4
    assert len(build_context(msgs, ContextPolicy(max_messages=40))) == 7


def test_agent_calls_open_a_turn_tool_results_and_empty_user_messages_do_not() -> None:
    assert is_user_turn(Message.agent_call("go", name="lead"))
    assert not is_user_turn(Message.tool("r", tool_call_id="c1"))
    assert not is_user_turn(Message.user(""))
    msgs = [Message.agent_call("research X", name="lead"), Message.assistant("done"),
            Message.user(""), Message.assistant("more")]
    win = build_context(msgs, ContextPolicy(max_messages=4))
    assert win.messages[0].role == "agent_call"


def test_start_on_is_validated_and_in_the_config_schema() -> None:
    with pytest.raises(ValueError, match="start_on"):
        ContextPolicy(start_on="assistant")  # type: ignore[arg-type]
    config = MemoryConfig.model_validate(
        {"version": 1, "defaults": {"context": {"max_messages": 5, "start_on": "any"}}}
    )
    assert config.policy_for("x").context.start_on == "any"


# ---------------------------------------------------------------------- the validators
def test_the_provider_forms_put_tool_results_right_after_their_call() -> None:
    call = [ToolCall(id="c1", name="f"), ToolCall(id="c2", name="f")]
    msgs = [Message.user("q"), Message.assistant("", tool_calls=call),
            Message.tool("1", tool_call_id="c2"), Message.user("meanwhile"),
            Message.system("pinned note", pinned=True), Message.tool("2", tool_call_id="c1")]
    check_forms(msgs)
    user_turn = to_llm_format(msgs, "anthropic")["messages"][2]["content"]
    assert [b["type"] for b in user_turn] == ["tool_result", "tool_result", "text"]
    assert [m["role"] for m in to_llm_format(msgs, "openai")] == [
        "user", "assistant", "tool", "tool", "user", "system"]


def test_the_validators_refuse_what_the_apis_refuse() -> None:
    assert [v.message for v in anthropic_violations(
        {"messages": [{"role": "assistant", "content": "hi"}]})] == [
        'messages: first message must use the "user" role']
    two_users = {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}
    assert "alternate" in anthropic_violations(two_users)[0].message
    orphan = {"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": "x"}]}]}
    assert "unexpected `tool_use_id`" in anthropic_violations(orphan)[0].message
    unanswered = {"messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f",
                                           "input": {}}]},
        {"role": "user", "content": "next"}]}
    assert "without `tool_result`" in anthropic_violations(unanswered)[0].message
    late = [{"role": "user", "content": "q"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "user", "content": "between"},
            {"role": "tool", "tool_call_id": "c1", "content": "r"}]
    messages = [v.message for v in chat_violations(late)]
    assert any("did not have response messages: c1" in m for m in messages)
    assert any("must be a response to a preceeding message" in m for m in messages)
    assert responses_violations([{"type": "function_call", "call_id": "c1", "name": "f",
                                  "arguments": "{}"}])[0].message == (
        "No tool output found for function call c1.")


def test_a_user_turn_between_a_call_and_its_results_is_no_place_to_start() -> None:
    """Found by the property in CI: the newest user message sits between a tool call and its
    last result, so a window that started on it would send the result without its call. The
    window starts on the user turn before the call, or the error counts from there."""
    call = ToolCall(id="c1", name="lookup", arguments={})
    history = [
        Message.system("be terse"),
        Message.user("what is the weather in Tokyo and Lisbon"),
        Message.assistant("", tool_calls=[call]),
        Message.user("and meanwhile?"),
        Message.tool("sunny", tool_call_id="c1", name="lookup"),
        Message.assistant("sunny in both"),
    ]
    win = build_context(history, ContextPolicy(max_messages=6))
    assert [m.role for m in win.messages] == ["system", "user", "assistant", "user", "tool",
                                              "assistant"]
    check_forms(win.messages)
    with pytest.raises(ContextOverflowError) as err:
        build_context(history, ContextPolicy(max_messages=4))
    assert (err.value.required, err.value.limit) == (6, 4)
