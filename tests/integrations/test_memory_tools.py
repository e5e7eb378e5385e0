"""The front door's ready-made agent tools, driven by each framework's own tool-calling path.

LangGraph: ``create_react_agent`` with LangChain's fake chat model scripted to call the
tools; its ``ToolNode`` runs them. Agents SDK: the real ``Runner`` with a ``Model`` that
returns function calls; the runner executes the ``FunctionTool``s. Both check what the
model was given back and what the memory holds afterwards.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from agents import Agent, Model, ModelResponse, Runner, Usage, set_tracing_disabled
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.prebuilt import create_react_agent
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from marsys_mem import Memory
from marsys_mem.exceptions import InvalidNameError
from marsys_mem.integrations import agents_tools
from marsys_mem.integrations.langgraph import tools as lc_tools

set_tracing_disabled(True)  # no trace export (no network, no API key)

deprecated_agent = pytest.mark.filterwarnings(
    "ignore::langgraph.warnings.LangGraphDeprecatedSinceV10"
)


# ---------------------------------------------------------------------- LangGraph
class ToolCallingModel(FakeMessagesListChatModel):
    """LangChain's scripted chat model, accepting the tools the agent binds."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def _calls(*calls: tuple[str, dict[str, Any]]) -> AIMessage:
    return AIMessage(
        "",
        tool_calls=[
            {"id": f"call_{i}_{name}", "name": name, "args": args}
            for i, (name, args) in enumerate(calls)
        ],
    )


def _answers(messages: list[Any]) -> dict[str, str]:
    return {m.tool_call_id: str(m.content) for m in messages if isinstance(m, ToolMessage)}


@deprecated_agent
def test_langgraph_agent_remembers_recalls_and_shares() -> None:
    memory = Memory()
    memory.remember("hello", user_id="writer")  # another agent, to receive the fact
    model = ToolCallingModel(
        responses=[
            _calls(("remember", {"content": "My sister Clara lives in Lisbon"})),
            _calls(("recall", {"query": "Where does Clara live?", "k": 1})),
            _calls(("share_fact", {"text": "Clara lives in Lisbon"}), ("remember", {})),
            AIMessage("Clara lives in Lisbon."),
        ]
    )
    agent = create_react_agent(model, lc_tools.memory_tools(memory, user_id="alice"))
    out = agent.invoke({"messages": [HumanMessage("Remember my sister Clara lives in Lisbon")]})
    answers = _answers(out["messages"])
    recall = json.loads(answers["call_0_recall"])
    assert [h["text"] for h in recall["hits"]] == ["My sister Clara lives in Lisbon"]
    shared = json.loads(answers["call_0_share_fact"])
    assert shared["delivered_to"] == ["alice", "writer"]
    assert answers["call_1_remember"] == "content: Field required"  # one line, the field
    assert out["messages"][-1].content == "Clara lives in Lisbon."
    texts = [m["content"] for m in memory.messages(user_id="alice")]
    assert texts == ["My sister Clara lives in Lisbon"]  # the bad call changed nothing
    writer = [m["content"] for m in memory.context(user_id="writer")["messages"]]
    assert any("Clara lives in Lisbon" in t for t in writer)
    memory.close()


@deprecated_agent
async def test_langgraph_async_agent_forgets() -> None:
    memory = Memory()
    mid = memory.remember("I live in Paris", user_id="alice")["id"]
    model = ToolCallingModel(
        responses=[
            _calls(("forget", {"message_ids": [mid]}), ("recall", {"query": "  "})),
            _calls(("context", {})),
            AIMessage("Forgotten."),
        ]
    )
    agent = create_react_agent(model, lc_tools.memory_tools(memory, user_id="alice"))
    out = await agent.ainvoke({"messages": [HumanMessage("Forget where I live")]})
    answers = _answers(out["messages"])
    assert json.loads(answers["call_0_forget"])["removed"] == 1
    assert "query" in answers["call_1_recall"]
    assert json.loads(answers["call_0_context"])["messages"] == []
    assert memory.messages(user_id="alice") == []
    await memory.aclose()


def test_langchain_tools_refuse_a_bad_user() -> None:
    with Memory() as memory:
        with pytest.raises(InvalidNameError, match="user_id"):
            lc_tools.memory_tools(memory, user_id="a/b")
        with pytest.raises(TypeError, match="memory must be"):
            lc_tools.memory_tools(object(), user_id="alice")  # type: ignore[arg-type]


# ---------------------------------------------------------------------- Agents SDK
def _say(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="msg_1",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        id="fc_" + call_id,
        type="function_call",
        call_id=call_id,
        name=name,
        arguments=json.dumps(arguments),
        status="completed",
    )


class ScriptedModel(Model):
    """Returns the prepared turns in order; records the tool outputs the runner sends."""

    def __init__(self, *turns: list[Any]) -> None:
        self.turns = list(turns)
        self.outputs: dict[str, str] = {}
        self.tools: list[str] = []

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[Any],
        model_settings: Any,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: Any,
        **kwargs: Any,
    ) -> ModelResponse:
        self.tools = [t.name for t in tools]
        for item in [] if isinstance(input, str) else input:
            data = item if isinstance(item, dict) else item.model_dump()
            if data.get("type") == "function_call_output":
                self.outputs[data["call_id"]] = data["output"]
        return ModelResponse(output=self.turns.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("these tests do not stream")


async def test_agents_sdk_runner_calls_the_memory_tools() -> None:
    memory = Memory()
    memory.remember("hello", user_id="writer")
    model = ScriptedModel(
        [_call("c1", "remember", {"content": "I am vegetarian"})],
        [
            _call("c2", "recall", {"query": "Am I vegetarian?", "k": 2}),
            _call("c3", "share_fact", {"text": "The user is vegetarian", "scope": "global"}),
            _call("c4", "recall", {"query": "x", "k": 0}),
            _call("c5", "forget", {"message_ids": "not-a-list"}),
        ],
        [_say("Noted: vegetarian.")],
    )
    agent = Agent(
        name="assistant",
        instructions="Use memory.",
        model=model,
        tools=agents_tools.memory_tools(memory, user_id="alice"),
    )
    result = await Runner.run(agent, "I am vegetarian, remember that.")
    assert result.final_output == "Noted: vegetarian."
    assert model.tools == ["remember", "recall", "context", "forget", "share_fact"]
    out = model.outputs
    assert json.loads(out["c1"])["role"] == "user"
    assert [h["text"] for h in json.loads(out["c2"])["hits"]] == ["I am vegetarian"]
    assert json.loads(out["c3"])["delivered_to"] == ["alice", "writer"]
    assert out["c4"].startswith("error: k:")
    assert out["c5"].startswith("error: message_ids:")
    assert [m["content"] for m in memory.messages(user_id="alice")] == ["I am vegetarian"]
    writer = await memory.acontext(user_id="writer")
    assert any("The user is vegetarian" in m["content"] for m in writer["messages"])
    await memory.aclose()
