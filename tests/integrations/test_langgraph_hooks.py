"""marsys_context_hook: a LangGraph agent's model gets a bounded window, tool groups whole."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.tools import tool
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import create_react_agent
from pydantic import Field, ValidationError

from marsys_mem.context import ContextPolicy, count_message, get_counter
from marsys_mem.exceptions import ContextOverflowError
from marsys_mem.integrations.langgraph.hooks import (
    amarsys_context_hook,
    from_langchain,
    marsys_context_hook,
    marsys_window,
)

# create_react_agent is deprecated in LangGraph 1.x (moved to langchain.agents) but still
# the prebuilt agent most users run; its pre_model_hook is what this module plugs into.
deprecated_agent = pytest.mark.filterwarnings(
    "ignore::langgraph.warnings.LangGraphDeprecatedSinceV10"
)


def _tokens(window: list[BaseMessage]) -> int:
    counter = get_counter(None)
    return sum(count_message(counter, m) for m in from_langchain(window))


def _check_window(window: list[BaseMessage], max_tokens: int | None = None) -> None:
    """No orphan tool results (so no leading one), every call answered, within budget."""
    called: set[str] = set()
    answered: set[str] = set()
    rest = [m for m in window if not isinstance(m, SystemMessage)]
    assert not rest or not isinstance(rest[0], ToolMessage)
    for m in window:
        if isinstance(m, AIMessage):
            called |= {c["id"] for c in m.tool_calls if c["id"]}
        if isinstance(m, ToolMessage):
            assert m.tool_call_id in called, f"orphan tool result {m.tool_call_id}"
            answered.add(m.tool_call_id)
    assert called <= answered | _unanswered(window)
    if max_tokens is not None:
        assert _tokens(window) <= max_tokens


def _unanswered(window: list[BaseMessage]) -> set[str]:
    """Calls whose results are not in the history at all (the newest, in flight)."""
    last = window[-1] if window else None
    if isinstance(last, AIMessage):
        return {c["id"] for c in last.tool_calls if c["id"]}
    return set()


def _history(turns: int, tools_per_turn: int = 2) -> list[BaseMessage]:
    out: list[BaseMessage] = [SystemMessage("You are a weather bot.", id="sys")]
    for t in range(turns):
        out.append(HumanMessage(f"weather in city {t} please, in detail", id=f"h{t}"))
        calls = [
            {"id": f"c{t}-{j}", "name": "weather", "args": {"city": f"city {t}-{j}"}}
            for j in range(tools_per_turn)
        ]
        out.append(AIMessage("", id=f"a{t}", tool_calls=calls))
        out += [
            ToolMessage(f"sunny, {20 + j} degrees", tool_call_id=c["id"], id=f"t{t}-{j}")
            for j, c in enumerate(calls)
        ]
        out.append(AIMessage(f"It is sunny in city {t}.", id=f"f{t}"))
    return out


# ---------------------------------------------------------------------- the window
def test_window_keeps_tool_groups_whole_and_the_objects_themselves() -> None:
    history = _history(6)
    for max_messages in range(2, 20):
        window = marsys_window(history, ContextPolicy(max_messages=max_messages, start_on="any"))
        assert len(window) <= max_messages
        assert window[0] is history[0]  # the system message always stays
        assert all(any(m is h for h in history) for m in window)  # the same objects
        _check_window(window)
    # start_on="any": the newest messages that fit, wherever they start
    window = marsys_window(history, ContextPolicy(max_messages=4, start_on="any"))
    assert [m.id for m in window] == ["sys", "f5"]  # a 4-message group never fits in 3 slots
    window = marsys_window(history, ContextPolicy(max_messages=5, start_on="any"))
    assert [m.id for m in window] == ["sys", "a5", "t5-0", "t5-1", "f5"]
    # the default, start_on="user": the newest user turn with all that follows, or an error
    with pytest.raises(ContextOverflowError, match="newest user turn"):
        marsys_window(history, ContextPolicy(max_messages=5))
    window = marsys_window(history, ContextPolicy(max_messages=6))
    assert [m.id for m in window] == ["sys", "h5", "a5", "t5-0", "t5-1", "f5"]
    window = marsys_window(history, ContextPolicy(max_messages=10))
    assert [m.id for m in window] == ["sys", "h5", "a5", "t5-0", "t5-1", "f5"]  # not "f4" first


def test_window_fits_the_token_budget() -> None:
    history = _history(20)
    for budget in (40, 60, 100, 250, 1000):
        window = marsys_window(history, ContextPolicy(max_tokens=budget, start_on="any"))
        _check_window(window, budget)
        try:
            window = marsys_window(history, ContextPolicy(max_tokens=budget))
        except ContextOverflowError:
            assert budget < 100  # the newest user turn and its exchange do not fit
            continue
        _check_window(window, budget)
        assert isinstance(window[1], HumanMessage)
    with pytest.raises(ContextOverflowError):
        marsys_window(history, ContextPolicy(max_tokens=3))


def test_conversion_of_tool_calls_and_results() -> None:
    ai = AIMessage("", tool_calls=[{"id": "c1", "name": "weather", "args": {"city": "Oslo"}}])
    converted = from_langchain(
        [
            SystemMessage("sys"),
            ("human", "hi"),
            ai,
            ToolMessage("cold", tool_call_id="c1", name="weather"),
            {"role": "assistant", "content": [{"type": "text", "text": "It is cold."}]},
        ]
    )
    assert [m.role for m in converted] == ["system", "user", "assistant", "tool", "assistant"]
    assert converted[2].tool_calls[0].id == "c1"
    assert converted[2].tool_calls[0].arguments == {"city": "Oslo"}
    assert converted[3].tool_call_id == "c1"
    assert converted[3].name == "weather"
    assert converted[4].text == "It is cold."
    with pytest.raises(ValueError, match=r"messages\[0\] is not a LangChain message"):
        from_langchain([42])


def test_summarize_adds_one_system_summary_and_fits() -> None:
    history = _history(10)
    policy = ContextPolicy(max_tokens=200, strategy="summarize", keep_recent=5)
    window = marsys_window(history, policy)
    summaries = [m for m in window if isinstance(m, SystemMessage) and m.id != "sys"]
    assert len(summaries) == 1
    assert summaries[0].content
    _check_window(window, 200)


def test_hook_arguments_are_checked() -> None:
    with pytest.raises(ValidationError, match="max_tokens"):
        marsys_context_hook({"max_tokens": 0})
    with pytest.raises(ValueError, match="messages_key must be a non-empty string"):
        marsys_context_hook(ContextPolicy(max_messages=3), messages_key="")

    async def summarize(messages: Any) -> str:
        return "s"

    with pytest.raises(ValueError, match="use amarsys_context_hook"):
        marsys_context_hook(ContextPolicy(max_messages=3), summarizer=summarize)
    with pytest.raises(KeyError, match="no 'history'"):
        marsys_context_hook(ContextPolicy(max_messages=3), messages_key="history")({"messages": []})


turn = st.tuples(st.integers(0, 3), st.integers(1, 60))


@settings(max_examples=80, deadline=None)
@given(st.lists(turn, min_size=1, max_size=12), st.integers(30, 400))
def test_any_history_gets_a_valid_window(turns: list[tuple[int, int]], budget: int) -> None:
    history: list[BaseMessage] = [SystemMessage("sys", id="sys")]
    for t, (tools, words) in enumerate(turns):
        history.append(HumanMessage("word " * words, id=f"h{t}"))
        calls = [{"id": f"c{t}-{j}", "name": "f", "args": {}} for j in range(tools)]
        if calls:
            history.append(AIMessage("", id=f"a{t}", tool_calls=calls))
            history += [ToolMessage("r " * words, tool_call_id=c["id"]) for c in calls]
        history.append(AIMessage("done", id=f"f{t}"))
    try:
        window = marsys_window(history, ContextPolicy(max_tokens=budget))
    except ContextOverflowError:
        return  # the newest turn alone does not fit: said, with the numbers
    _check_window(window, budget)


# ---------------------------------------------------------------------- a real agent
class RecordingModel(FakeMessagesListChatModel):
    """A scripted chat model that records every message list it is sent."""

    seen: list[list[BaseMessage]] = Field(default_factory=list)

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        self.seen.append(list(messages))
        return super()._generate(messages, *args, **kwargs)

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"It is sunny in {city}, " + "with a long and detailed forecast " * 5


def _script(calls: int) -> list[AIMessage]:
    steps = [
        AIMessage(
            "",
            tool_calls=[
                {"id": f"call{i}a", "name": "weather", "args": {"city": f"Town{i}"}},
                {"id": f"call{i}b", "name": "weather", "args": {"city": f"Village{i}"}},
            ],
        )
        for i in range(calls)
    ]
    return [*steps, AIMessage("All sunny.")]


@deprecated_agent
def test_react_agent_model_gets_a_bounded_window_without_orphans() -> None:
    budget = 150
    model = RecordingModel(responses=_script(6))
    # one question and a long tool loop: with start_on="user" the whole loop would have to
    # fit (ContextOverflowError); a model that takes windows opening on a tool call (OpenAI)
    # can use start_on="any"
    policy = ContextPolicy(max_tokens=budget, start_on="any")
    agent = create_react_agent(model, [weather], pre_model_hook=marsys_context_hook(policy))
    out = agent.invoke(
        {"messages": [SystemMessage("You forecast."), HumanMessage("Weather everywhere?")]}
    )
    assert len(model.seen) == 7  # one model call per step
    assert len(out["messages"]) == 2 + 6 * 3 + 1  # the state keeps the whole history
    for window in model.seen:
        _check_window(window, budget)
        assert isinstance(window[0], SystemMessage)
    assert len(model.seen[-1]) < len(out["messages"]) - 1  # the late calls were trimmed
    state_ids = {m.id for m in out["messages"]}
    assert all(m.id in state_ids for w in model.seen for m in w)  # ids preserved


@deprecated_agent
async def test_async_agent_with_an_async_summarizer() -> None:
    summaries: list[int] = []

    async def summarize(messages: list[Any]) -> str:
        summaries.append(len(messages))
        return f"Earlier: {len(messages)} messages about the weather."

    model = RecordingModel(responses=_script(4))
    hook = amarsys_context_hook(
        ContextPolicy(max_tokens=220, strategy="summarize", keep_recent=4, start_on="any"),
        summarizer=summarize,
    )
    agent = create_react_agent(model, [weather], pre_model_hook=hook)
    await agent.ainvoke({"messages": [HumanMessage("Weather?")]})
    assert summaries  # something fell out of the window and was summarised
    last = model.seen[-1]
    assert any(isinstance(m, SystemMessage) and "Earlier:" in str(m.content) for m in last)
    for window in model.seen:
        _check_window(window, 220)


class _State(TypedDict):
    messages: Annotated[list[BaseMessage], add_messages]


def test_trim_oldest_rewrites_the_state_in_a_state_graph() -> None:
    hook = marsys_context_hook(ContextPolicy(max_messages=6, strategy="trim_oldest"))
    model = RecordingModel(responses=[AIMessage(f"answer {i}") for i in range(10)])

    def call_model(state: _State) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(_State)
    builder.add_node("trim", hook)
    builder.add_node("model", call_model)
    builder.add_edge(START, "trim")
    builder.add_edge("trim", "model")
    graph = builder.compile()
    history = _history(3)
    out = graph.invoke({"messages": history})
    assert [m.id for m in model.seen[0]] == ["sys", "h2", "a2", "t2-0", "t2-1", "f2"]
    assert [m.id for m in out["messages"][:-1]] == ["sys", "h2", "a2", "t2-0", "t2-1", "f2"]
    assert out["messages"][-1].content == "answer 0"
