"""MarsysSession with the OpenAI Agents SDK's real ``Runner``.

The model is scripted: a small implementation of the SDK's ``Model`` interface that returns
prepared Responses output items (the SDK's own types) and records the input items the
runner sent it, so each test sees exactly what a real model would have been given. The
tools are real ``function_tool``s that the runner executes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import (
    Agent,
    Model,
    ModelResponse,
    RunConfig,
    Runner,
    Usage,
    function_tool,
    set_tracing_disabled,
)
from agents.memory import Session, SessionSettings
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
)

from marsys_mem import ContextPolicy, MemoryManager, Message
from marsys_mem.config import MemoryConfig
from marsys_mem.context.blocks import parse_block
from marsys_mem.exceptions import (
    DuplicateToolCallError,
    InvalidNameError,
    MessageFormatError,
    OrphanToolResultError,
    StoreError,
)
from marsys_mem.integrations.agents import ITEM_KEY, MarsysSession
from marsys_mem.testing.provider_rules import responses_violations

set_tracing_disabled(True)  # no trace export (no network, no API key)


# ---------------------------------------------------------------------- the scripted model
def say(text: str, item_id: str = "msg_1") -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id=item_id,
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


def call(call_id: str, city: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        id="fc_" + call_id,
        type="function_call",
        call_id=call_id,
        name="weather",
        arguments=json.dumps({"city": city}),
        status="completed",
    )


def reasoning(item_id: str = "rs_1") -> ResponseReasoningItem:
    return ResponseReasoningItem(
        id=item_id, type="reasoning", summary=[], encrypted_content="enc:" + item_id
    )


class ScriptedModel(Model):
    """Returns the prepared turns in order; records every input the runner sends."""

    def __init__(self, *turns: list[Any]) -> None:
        self.turns = list(turns)
        self.inputs: list[list[dict[str, Any]]] = []

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
        items = [{"role": "user", "content": input}] if isinstance(input, str) else input
        self.inputs.append(json.loads(json.dumps(items)))
        if not self.turns:
            raise AssertionError("the scripted model ran out of turns")
        return ModelResponse(output=self.turns.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("these tests do not stream")


@function_tool
def weather(city: str) -> str:
    """The weather in a city.

    Args:
        city: the city.
    """
    return f"72F in {city}"


def agent_with(model: ScriptedModel) -> Agent[Any]:
    return Agent(name="assistant", instructions="Be terse.", model=model, tools=[weather])


def kinds(items: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    """(type, call_id or text) of each item, for compact assertions."""
    out = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            content = item["content"]
            text = content if isinstance(content, str) else content[0].get("text")
            out.append((kind, text))
        else:
            out.append((kind, item.get("call_id")))
    return out


def assert_pairs_whole(items: list[dict[str, Any]]) -> None:
    """Every function_call_output follows the function_call it answers."""
    calls: set[str] = set()
    for item in items:
        if item.get("type") == "function_call":
            calls.add(item["call_id"])
        elif item.get("type") == "function_call_output":
            assert item["call_id"] in calls, f"orphan output {item['call_id']} in {kinds(items)}"


@pytest.fixture
def manager() -> Iterator[MemoryManager]:
    with MemoryManager() as m:
        yield m


def persistent_config(db: Path, **agent: Any) -> MemoryConfig:
    return MemoryConfig.model_validate(
        {
            "store": {"backend": "sqlite", "path": str(db)},
            "agents": {"assistant": {"retention": "persistent", **agent}},
        }
    )


# ---------------------------------------------------------------------- the Runner
async def test_is_an_agents_sdk_session(manager: MemoryManager):
    session = MarsysSession("user-1", manager)
    assert isinstance(session, Session)
    assert session.session_id == "user-1"
    assert session.memory is manager.memory("assistant", branch="user-1")


async def test_two_runs_share_one_session(manager: MemoryManager):
    model = ScriptedModel([say("Hi! How can I help?")], [say("You said hello.", "msg_2")])
    session = MarsysSession("user-1", manager)
    first = await Runner.run(agent_with(model), "hello", session=session)
    assert first.final_output == "Hi! How can I help?"
    second = await Runner.run(agent_with(model), "what did I say?", session=session)
    assert second.final_output == "You said hello."
    # the second run's model saw the first run's items, then the new input
    assert kinds(model.inputs[1]) == [
        ("message", "hello"),
        ("message", "Hi! How can I help?"),
        ("message", "what did I say?"),
    ]
    # and the SDK items round-trip exactly (ids, status, annotations kept)
    assert model.inputs[1][1] == say("Hi! How can I help?").model_dump(
        mode="json", exclude_unset=True
    )
    memory = manager.memory("assistant", branch="user-1")
    assert [m.role for m in memory] == ["user", "assistant", "user", "assistant"]
    assert memory[1].text == "Hi! How can I help?"


async def test_limit_never_splits_a_tool_call_from_its_output(manager: MemoryManager):
    model = ScriptedModel(
        [call("c1", "Tokyo")],  # the runner runs the tool and calls the model again
        [say("72F in Tokyo.")],
        [say("Glad to help.", "msg_2")],
    )
    session = MarsysSession("user-1", manager)
    await Runner.run(agent_with(model), "Weather in Tokyo?", session=session)
    stored = await session.get_items()
    assert kinds(stored) == [
        ("message", "Weather in Tokyo?"),
        ("function_call", "c1"),
        ("function_call_output", "c1"),
        ("message", "72F in Tokyo."),
    ]
    # limit=2 would be [output, message]: the SDK's own sessions return that orphan
    # (openai-agents #4322); here the slice reaches back to the call.
    settings = RunConfig(session_settings=SessionSettings(limit=2))
    await Runner.run(agent_with(model), "Thanks!", session=session, run_config=settings)
    sent = model.inputs[-1]
    assert kinds(sent) == [
        ("function_call", "c1"),
        ("function_call_output", "c1"),
        ("message", "72F in Tokyo."),
        ("message", "Thanks!"),
    ]
    assert_pairs_whole(sent)
    for limit in range(8):
        assert_pairs_whole(await session.get_items(limit=limit))


async def test_parallel_calls_and_reasoning_come_back_together(manager: MemoryManager):
    model = ScriptedModel(
        [reasoning(), call("a", "Tokyo"), call("b", "Paris")],
        [say("Tokyo and Paris: 72F.")],
    )
    session = MarsysSession("user-1", manager, session_settings=SessionSettings(limit=3))
    assert session.session_settings is not None
    await Runner.run(agent_with(model), "Tokyo and Paris?", session=session)
    everything = await session.get_items(limit=100)
    assert kinds(everything) == [
        ("message", "Tokyo and Paris?"),
        ("reasoning", None),
        ("function_call", "a"),
        ("function_call", "b"),
        ("function_call_output", "a"),
        ("function_call_output", "b"),
        ("message", "Tokyo and Paris: 72F."),
    ]
    # the default limit (3) would start inside the call group: both calls come along,
    # and the reasoning item that led to them
    tail = await session.get_items()
    assert kinds(tail) == kinds(everything)[1:]
    assert tail[0]["encrypted_content"] == "enc:rs_1"
    assert kinds(await session.get_items(limit=1)) == [("message", "Tokyo and Paris: 72F.")]
    assert await session.get_items(limit=0) == []


async def test_persistent_agent_survives_a_new_manager_and_process(tmp_path: Path):
    db = tmp_path / "memory.db"
    model = ScriptedModel([call("c1", "Oslo")], [say("Cold in Oslo.")])
    with MemoryManager(persistent_config(db)) as manager:
        session = MarsysSession("user-7", manager)
        await Runner.run(agent_with(model), "Weather in Oslo?", session=session)
        before = await session.get_items()
    assert len(before) == 4

    with MemoryManager(persistent_config(db)) as manager:  # a new manager, same file
        session = MarsysSession("user-7", manager)
        assert await session.get_items() == before
        model = ScriptedModel([say("You asked about Oslo.", "msg_2")])
        await Runner.run(agent_with(model), "What did I ask?", session=session)
        assert model.inputs[0][:4] == before

    script = textwrap.dedent(
        f"""
        import asyncio, json
        from marsys_mem import MemoryManager
        from marsys_mem.config import MemoryConfig
        from marsys_mem.integrations.agents import MarsysSession
        config = MemoryConfig.model_validate({{
            "store": {{"backend": "sqlite", "path": {str(db)!r}}},
            "agents": {{"assistant": {{"retention": "persistent"}}}}}})
        with MemoryManager(config) as manager:
            items = asyncio.run(MarsysSession("user-7", manager).get_items(limit=2))
        print(json.dumps(items))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert kinds(json.loads(done.stdout)) == [
        ("message", "What did I ask?"),
        ("message", "You asked about Oslo."),
    ]


async def test_session_retention_ends_with_the_managers_session(manager: MemoryManager):
    session = MarsysSession("user-1", manager)
    await session.add_items([{"role": "user", "content": "hello"}])
    manager.end_session()
    assert await session.get_items() == []


async def test_an_output_whose_call_was_evicted_is_left_out(tmp_path: Path):
    config = persistent_config(tmp_path / "m.db", max_stored_messages=4)
    with MemoryManager(config, retention_every=1) as manager:
        session = MarsysSession("s", manager)
        await session.add_items(
            [
                {"role": "user", "content": "one"},
                {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "72F"},
                {"role": "assistant", "content": "two"},
                {"role": "user", "content": "three"},
                {"role": "user", "content": "four"},
            ]
        )
        memory = session.memory
        assert len(memory) <= 4
        items = await session.get_items()
        assert_pairs_whole(items)
        assert ("function_call_output", "c1") not in kinds(items)
        assert kinds(items)[-2:] == [("message", "three"), ("message", "four")]


# ---------------------------------------------------------------------- compaction mode
def summary_lines(item: dict[str, Any]) -> list[str]:
    """The summariser's lines, read back from the summary block (quoted data)."""
    block = parse_block(item["content"])
    assert block.header.startswith("Summary of earlier conversation")
    return [i.text for i in block.items]


async def test_summarize_mode_returns_the_compacted_window(manager: MemoryManager):
    seen: list[list[Message]] = []

    def summarizer(messages: list[Message]) -> str:
        seen.append(messages)
        return "Earlier: the user asked about Tokyo weather (72F)."

    # start_on="any": the window may open on the function call (the Responses API takes it);
    # the default, start_on="user", keeps the whole last exchange (see the next test)
    policy = ContextPolicy(
        max_tokens=150, strategy="summarize", keep_recent=2, start_on="any", summary_max_tokens=50
    )
    session = MarsysSession("user-1", manager, policy=policy, summarizer=summarizer)
    model = ScriptedModel(
        [call("c1", "Tokyo")],
        [say("72F in Tokyo. " + "It is a mild day. " * 10)],
        [say("Noted.", "msg_2")],
    )
    await Runner.run(agent_with(model), "Weather in Tokyo?", session=session)
    await Runner.run(agent_with(model), "And tomorrow?", session=session)
    sent = model.inputs[-1]
    assert (sent[0]["type"], sent[0]["role"]) == ("message", "system")
    assert summary_lines(sent[0]) == ["Earlier: the user asked about Tokyo weather (72F)."]
    assert sent[-1] == {"role": "user", "content": "And tomorrow?"}
    assert_pairs_whole(sent)
    assert seen  # the summariser ran
    # the full history stays in memory: compaction is a view
    assert len(await MarsysSession("user-1", manager).get_items()) == 6
    assert len(sent) < 5


async def test_summarize_mode_starts_on_a_user_turn_by_default(manager: MemoryManager):
    policy = ContextPolicy(max_tokens=150, strategy="summarize", keep_recent=2)
    session = MarsysSession("user-2", manager, policy=policy, summarizer=lambda ms: "Earlier.")
    model = ScriptedModel(
        [call("c1", "Tokyo")],
        [say("72F in Tokyo. " + "It is a mild day. " * 10)],
        [call("c2", "Oslo")],
        [say("5C in Oslo.", "msg_3")],
        [say("Noted.", "msg_4")],
    )
    await Runner.run(agent_with(model), "Weather in Tokyo?", session=session)
    await Runner.run(agent_with(model), "And in Oslo?", session=session)
    await Runner.run(agent_with(model), "Thanks", session=session)
    sent = model.inputs[-1]
    assert (sent[0]["type"], sent[0]["role"]) == ("message", "system")
    assert summary_lines(sent[0]) == ["Earlier."]
    assert sent[1] == {"role": "user", "content": "And in Oslo?"}  # not the function call
    assert sent[-1] == {"role": "user", "content": "Thanks"}
    assert_pairs_whole(sent)
    assert not responses_violations(sent)


# ---------------------------------------------------------------------- the other methods
async def test_items_round_trip_exactly_and_pop_clear(manager: MemoryManager):
    items: list[Any] = [
        {"role": "developer", "content": "Be terse."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        reasoning().model_dump(mode="json", exclude_unset=True),
        say("hello").model_dump(mode="json", exclude_unset=True),
        {"type": "message", "role": "user", "content": [{"type": "input_file", "file_id": "f1"}]},
        {
            "type": "web_search_call",
            "id": "ws_1",
            "status": "completed",
            "action": {"type": "search", "query": "q"},
        },
    ]
    session = MarsysSession("user-1", manager)
    await session.add_items(items)
    assert await session.get_items() == items
    memory = session.memory
    assert memory[0].role == "system"
    assert memory[4].role == "user"
    assert memory[4].metadata[ITEM_KEY] == items[4]  # kept, though it has no text
    assert await session.pop_item() == items[-1]
    assert await session.get_items() == items[:-1]
    await session.clear_session()
    assert await session.get_items() == []
    assert await session.pop_item() is None


async def test_pop_deletes_from_the_store(tmp_path: Path):
    db = tmp_path / "m.db"
    with MemoryManager(persistent_config(db)) as manager:
        session = MarsysSession("s", manager)
        await session.add_items(
            [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
        )
        assert (await session.pop_item()) == {"role": "user", "content": "b"}
    with MemoryManager(persistent_config(db)) as manager:
        assert await MarsysSession("s", manager).get_items() == [{"role": "user", "content": "a"}]
        await MarsysSession("s", manager).clear_session()
    with MemoryManager(persistent_config(db)) as manager:
        assert await MarsysSession("s", manager).get_items() == []


async def test_returned_items_are_copies(manager: MemoryManager):
    session = MarsysSession("s", manager)
    await session.add_items([{"role": "user", "content": "a"}])
    (item,) = await session.get_items()
    item["content"] = "changed"
    assert await session.get_items() == [{"role": "user", "content": "a"}]


# ---------------------------------------------------------------------- bad input
def test_bad_arguments_name_the_field(manager: MemoryManager):
    with pytest.raises(InvalidNameError, match="session_id"):
        MarsysSession("a/b", manager)
    with pytest.raises(InvalidNameError, match="agent"):
        MarsysSession("s", manager, agent="")
    with pytest.raises(TypeError, match="manager must be a MemoryManager"):
        MarsysSession("s", object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="policy must be a ContextPolicy"):
        MarsysSession("s", manager, policy={"max_tokens": 10})  # type: ignore[arg-type]


@pytest.mark.parametrize("limit", [-1, 1.5, "3", True])
async def test_bad_limit_is_refused(manager: MemoryManager, limit: Any):
    with pytest.raises(ValueError, match=r"limit must be None or an int >= 0, got"):
        await MarsysSession("s", manager).get_items(limit=limit)


async def test_bad_items_change_nothing(manager: MemoryManager):
    session = MarsysSession("s", manager)
    await session.add_items([{"role": "user", "content": "kept"}])
    good = {"role": "user", "content": "never added"}
    with pytest.raises(ValueError, match="items must be a list of JSON objects"):
        await session.add_items([good, "not a dict"])  # type: ignore[list-item]
    with pytest.raises(MessageFormatError, match=r"items\[1\] \('message'\): .*NaN"):
        await session.add_items([good, {"role": "user", "content": float("nan")}])
    with pytest.raises(MessageFormatError, match=r"items\[1\] \('function_call_output'\).*call_id"):
        await session.add_items([good, {"type": "function_call_output", "output": "x"}])
    with pytest.raises(OrphanToolResultError, match="nope"):
        await session.add_items(
            [good, {"type": "function_call_output", "call_id": "nope", "output": "x"}]
        )
    assert await session.get_items() == [{"role": "user", "content": "kept"}]


def test_the_example_runs_offline(tmp_path: Path):
    example = Path(__file__).resolve().parents[2] / "examples" / "agents_sdk" / "session_demo.py"
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    done = subprocess.run(
        [sys.executable, str(example), "--store", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env=env,
    )
    assert "run 2: You asked about Tokyo" in done.stdout
    assert "function_call(call_1)\n     function_call_output(call_1)" in done.stdout
    assert (tmp_path / "memory.db").exists()


async def test_pop_and_clear_forget_from_the_agents_memory_patterns(tmp_path: Path):
    # one path (MemoryManager.forget): a popped or cleared item leaves the RAG index too
    config = persistent_config(tmp_path / "m.db", patterns={"embedder": "hashing", "rag": {"k": 5}})
    with MemoryManager(config) as manager:
        session = MarsysSession("s", manager)
        await session.add_items(
            [
                {"role": "user", "content": "my passport number is X1234567"},
                {"role": "user", "content": "the van is blue"},
            ]
        )
        patterns = manager.patterns("assistant", "s")
        assert patterns is not None
        assert patterns.rag is not None
        rag = patterns.rag

        def held() -> list[str]:
            return sorted(m.text for m in rag.messages())

        assert held() == ["my passport number is X1234567", "the van is blue"]
        assert await session.pop_item() == {"role": "user", "content": "the van is blue"}
        assert held() == ["my passport number is X1234567"]
        await session.clear_session()
        assert held() == []
        assert await session.get_items() == []
    with MemoryManager(config) as manager:  # and from the RAG pattern's store key
        manager.memory("assistant", "s")
        patterns = manager.patterns("assistant", "s")
        assert patterns is not None
        assert patterns.rag is not None
        assert patterns.rag.messages() == []


def test_manager_forget_checks_its_arguments(manager: MemoryManager):
    mid = manager.memory("assistant").add(Message.user("keep me"))
    with pytest.raises(ValueError, match="either message_ids"):
        manager.forget("assistant")
    with pytest.raises(ValueError, match="either message_ids"):
        manager.forget("assistant", message_ids=[mid], everything=True)
    with pytest.raises(ValueError, match="'nope'"):
        manager.forget("assistant", message_ids=[mid, "nope"])
    with pytest.raises(ValueError, match="one string"):
        manager.forget("assistant", message_ids=mid)
    assert [m.text for m in manager.memory("assistant")] == ["keep me"]  # nothing removed


# ---------------------------------------------------------------------- half pairs, close
async def test_a_popped_output_leaves_no_orphan_call_in_any_listing(manager: MemoryManager):
    model = ScriptedModel(
        [reasoning(), call("c1", "Tokyo")],
        [say("72F in Tokyo.")],
        [say("Anything else?", "msg_2")],
    )
    session = MarsysSession("user-1", manager)
    await Runner.run(agent_with(model), "Weather in Tokyo?", session=session)
    assert kinds(await session.get_items())[-1] == ("message", "72F in Tokyo.")
    assert (await session.pop_item() or {}).get("type", "message") == "message"
    assert (await session.pop_item() or {}).get("type") == "function_call_output"
    # the call is still stored, but no listing returns it without its output (nor the
    # reasoning item that led to it: the Responses API rejects both)
    stored = [m.metadata[ITEM_KEY].get("type") for m in session.memory.read()]
    assert stored == [None, "reasoning", "function_call"]
    assert await session.get_items(limit=1) == []
    assert kinds(await session.get_items()) == [("message", "Weather in Tokyo?")]
    for limit in range(4):
        items = await session.get_items(limit=limit)
        assert not responses_violations(items), items
    # and the next run through the SDK sends none of it
    await Runner.run(agent_with(model), "Thanks", session=session)
    sent = model.inputs[-1]
    assert kinds(sent) == [("message", "Weather in Tokyo?"), ("message", "Thanks")]
    assert not responses_violations(sent)
    # a window (policy) follows the same rule
    windowed = MarsysSession("user-1", manager, policy=ContextPolicy(max_tokens=4000))
    assert ("function_call", "c1") not in kinds(await windowed.get_items())


async def test_a_parallel_call_without_output_is_left_out(manager: MemoryManager):
    session = MarsysSession("user-1", manager)
    await session.add_items(
        [
            {"role": "user", "content": "Tokyo and Paris?"},
            call("a", "Tokyo").model_dump(mode="json", exclude_unset=True),
            call("b", "Paris").model_dump(mode="json", exclude_unset=True),
            {"type": "function_call_output", "call_id": "a", "output": "72F"},
            {"type": "function_call_output", "call_id": "b", "output": "64F"},
        ]
    )
    await session.pop_item()  # b's output
    assert kinds(await session.get_items()) == [
        ("message", "Tokyo and Paris?"),
        ("function_call", "a"),
        ("function_call_output", "a"),
    ]
    assert kinds(await session.get_items(limit=1)) == [  # a's output reaches back to a's call
        ("function_call", "a"),
        ("function_call_output", "a"),
    ]


async def test_strict_tools_false_lets_a_scripted_block_run_twice(tmp_path: Path):
    # the README's offline block: the same call id "c1" in a persistent session, twice
    config = persistent_config(tmp_path / "agents.db", max_stored_messages=10000)
    turn: list[Any] = [
        {"role": "user", "content": "Where did I park?"},
        {"type": "function_call", "call_id": "c1", "name": "notes", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "level 4"},
        {"role": "assistant", "content": "On level 4."},
    ]
    for run in range(2):
        with MemoryManager(config) as manager:
            session = MarsysSession("user-42", manager, strict_tools=False)
            await session.add_items(turn)
            assert kinds(await session.get_items(limit=2)) == [
                ("function_call", "c1"),
                ("function_call_output", "c1"),
                ("message", "On level 4."),
            ]
            items = await session.get_items()
            assert len(items) == 4 * (run + 1)
            assert_pairs_whole(items)
            assert not responses_violations(items)
    with MemoryManager(config) as manager:  # the default refuses a reused call id
        strict = MarsysSession("user-42", manager)
        with pytest.raises(DuplicateToolCallError, match="'c1'"):
            await strict.add_items(turn)
        assert len(await strict.get_items()) == 8  # nothing of it was added
        assert strict.memory.strict_tools  # the memory's own rule is left as it was


async def test_close_is_idempotent_and_leaves_the_items_and_the_manager(manager: MemoryManager):
    session = MarsysSession("user-1", manager)
    await session.add_items([{"role": "user", "content": "hello"}])
    assert not session.closed
    session.close()
    session.close()
    assert session.closed
    assert "closed" in repr(session)
    for use in (
        session.get_items(),
        session.add_items([{"role": "user", "content": "x"}]),
        session.pop_item(),
        session.clear_session(),
    ):
        with pytest.raises(StoreError, match="'user-1' is closed"):
            await use
    with pytest.raises(RuntimeError):  # what the SDK's own sessions raise once closed
        _ = session.memory
    assert await MarsysSession("user-1", manager).get_items() == [
        {"role": "user", "content": "hello"}
    ]


def test_session_settings_are_kept_as_the_sdks_sessions_keep_them(manager: MemoryManager):
    assert MarsysSession("s", manager).session_settings == SessionSettings()
    given = MarsysSession("s", manager, session_settings={"limit": 3})
    assert given.session_settings == SessionSettings(limit=3)
    with pytest.raises(TypeError, match="limitt"):
        MarsysSession("s", manager, session_settings={"limitt": 3})
