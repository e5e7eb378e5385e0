"""Execution traces: a run's steps, typed, persisted in its snapshot and its output messages."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import pytest
from pydantic import ValidationError

from marsys_mem import ConversationMemory, MemoryConfig, MemoryManager, Message, ToolCall
from marsys_mem.exceptions import MessageNotFoundError
from marsys_mem.model.runs import RunContext
from marsys_mem.model.traces import TRACE_KEY, TraceStep, failed_steps, slowest_steps, trace_of
from marsys_mem.store.memory import InMemoryStore
from marsys_mem.store.sqlite import SQLiteStore


def _config(path: Path) -> MemoryConfig:
    return MemoryConfig.model_validate(
        {
            "store": {"backend": "sqlite", "path": str(path)},
            "agents": {"researcher": {"retention": "persistent"}},
        }
    )


def _tool_loop(manager: MemoryManager) -> str:
    """A run with two tool calls (one fails) and a final answer; returns its run_id."""
    with manager.run("researcher") as run:
        run.input(Message.user("Weather in Tokyo and Paris?"))
        run.record_step(
            "llm", "gpt-x", duration_ms=40, usage={"prompt_tokens": 30, "completion_tokens": 9}
        )
        run.output(
            Message.assistant(
                "",
                tool_calls=[
                    ToolCall(id="c1", name="weather", arguments={"city": "Tokyo"}),
                    ToolCall(id="c2", name="weather", arguments={"city": "Paris"}),
                ],
            )
        )
        with run.step("tool", "weather", arguments={"city": "Tokyo"}, tool_call_id="c1") as s:
            s.result = {"temp_f": 72}
        run.input(Message.tool("72F", tool_call_id="c1", name="weather"))
        with (
            pytest.raises(TimeoutError),
            run.step("tool", "weather", arguments={"city": "Paris"}, tool_call_id="c2"),
        ):
            raise TimeoutError("no answer in 10s")
        run.input(Message.tool("error: timeout", tool_call_id="c2", name="weather"))
        run.record_step("llm", "gpt-x", duration_ms=55.5, usage={"prompt_tokens": 50})
        run.output(Message.assistant("Tokyo is 72F; Paris timed out."))
        return run.run_id


def test_a_traced_run_survives_sqlite_and_reads_back_in_a_new_manager(tmp_path: Path):
    db = tmp_path / "mem.db"
    with MemoryManager(_config(db)) as manager:
        run_id = _tool_loop(manager)

    with MemoryManager(_config(db)) as manager:
        steps = manager.trace(run_id)
        assert [(s.kind, s.name, s.ok) for s in steps] == [
            ("llm", "gpt-x", True),
            ("tool", "weather", True),
            ("tool", "weather", False),
            ("llm", "gpt-x", True),
        ]
        assert all(s.run_id == run_id for s in steps)
        ok, failed = steps[1], steps[2]
        assert ok.arguments == {"city": "Tokyo"}
        assert ok.result == {"temp_f": 72}
        assert ok.tool_call_id == "c1"
        assert ok.duration_ms >= 0
        assert failed.error == "TimeoutError: no answer in 10s"
        assert failed.result is None
        assert steps[3].duration_ms == 55.5
        snap = manager.load_run(run_id)
        assert snap is not None
        assert snap.usage == {"prompt_tokens": 80, "completion_tokens": 9}

        # the messages carry the steps that led to them, also after the restart
        stored = manager.memory("researcher").read()
        first, final = stored[1], stored[-1]
        assert [s.name for s in trace_of(first)] == ["gpt-x"]
        assert [(s.name, s.tool_call_id) for s in trace_of(final)] == [
            ("weather", "c1"),
            ("weather", "c2"),
            ("gpt-x", None),
        ]
        assert trace_of(final) == steps[1:]
        assert trace_of(stored[0]) == []  # the user's message carries nothing
        assert all(TRACE_KEY not in m.metadata for m in stored if m.role in ("user", "tool"))

        # queryable across the store's runs
        assert [s.step_id for s in failed_steps(manager.store)] == [failed.step_id]
        assert failed_steps(manager.store, kind="llm") == []
        slow = slowest_steps(manager.store, 2)
        assert [s.duration_ms for s in slow] == [55.5, 40]
        assert slowest_steps(manager.store, 5, kind="tool", agent="researcher")[0].kind == "tool"
        assert slowest_steps(manager.store, 5, agent="nobody") == []

    # and it is plain JSON in the database
    with sqlite3.connect(db) as conn:
        (data,) = conn.execute("SELECT data FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    assert [s["name"] for s in json.loads(data)["trace"]] == [
        "gpt-x",
        "weather",
        "weather",
        "gpt-x",
    ]


def test_an_unknown_run_has_no_trace(tmp_path: Path):
    with (
        MemoryManager(_config(tmp_path / "m.db")) as manager,
        pytest.raises(MessageNotFoundError, match="run 'nope' is not known"),
    ):
        manager.trace("nope")


def test_a_session_agents_trace_is_kept_in_process():
    with MemoryManager() as manager:
        with manager.run("scratch") as run:
            run.record_tool_call("calc", {"x": 1}, result=2, duration_ms=1.5)
        assert [s.result for s in manager.trace(run.run_id)] == [2]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"duration_ms": -1.0}, "duration_ms"),
        ({"duration_ms": math.nan}, "duration_ms"),
        ({"duration_ms": math.inf}, "duration_ms"),
        ({"arguments": {"when": object()}}, "arguments.when"),
        ({"arguments": {"ids": {1, 2}}}, "arguments.ids"),
        ({"arguments": {"x": math.nan}}, "arguments.x"),
        ({"result": b"bytes"}, "result"),
        ({"usage": {"prompt_tokens": -3}}, "usage.prompt_tokens"),
        ({"usage": {"prompt_tokens": True}}, "usage.prompt_tokens"),
        ({"name": ""}, "name"),
    ],
)
def test_bad_input_is_named_and_records_nothing(fields: dict[str, object], named: str):
    mem = ConversationMemory()
    run = RunContext(agent="a", memory=mem)
    run.record_tool_call("ok", {"a": 1}, duration_ms=1, result="fine")
    call: dict[str, object] = {"kind": "tool", "name": "search", "duration_ms": 2.0} | fields
    with pytest.raises(ValidationError, match=named.replace(".", r"\.")) as info:
        run.record_step(**call)  # type: ignore[arg-type]
    assert named.split(".")[0] in str(info.value)
    assert [s.name for s in run.trace] == ["ok"]
    assert run.usage == {}
    run.output(Message.assistant("done"))
    assert [s.name for s in trace_of(run.messages[-1])] == ["ok"]


def test_a_step_whose_result_is_not_json_records_nothing():
    run = RunContext(agent="a", memory=ConversationMemory())
    with pytest.raises(ValidationError, match="result"), run.step("tool", "t") as s:
        s.result = {1, 2}
    assert run.trace == []


def test_bad_step_arguments_fail_before_the_block_runs():
    run = RunContext(agent="a", memory=ConversationMemory())
    ran = []
    with (
        pytest.raises(ValidationError, match="arguments"),
        run.step("tool", "t", arguments={"f": print}),
    ):
        ran.append(1)
    assert ran == []
    assert run.trace == []


def test_a_step_records_usage_metadata_and_an_error_it_was_given():
    run = RunContext(agent="a", memory=ConversationMemory())
    with run.step("llm", "m", metadata={"model": "x"}) as s:
        s.usage["prompt_tokens"] = 7
        s.metadata["cached"] = True
        s.error = "content_filter"
    (step,) = run.trace
    assert (step.usage, step.metadata, step.error, step.ok) == (
        {"prompt_tokens": 7},
        {"model": "x", "cached": True},
        "content_filter",
        False,
    )
    assert run.usage == {"prompt_tokens": 7}


def test_an_output_that_sets_the_trace_key_itself_is_refused_and_nothing_changes():
    mem = ConversationMemory()
    run = RunContext(agent="a", memory=mem)
    run.record_tool_call("t", duration_ms=1)
    with pytest.raises(ValueError, match=r"metadata\['trace'\] is reserved"):
        run.output(Message.assistant("x", metadata={"trace": "mine"}))
    assert len(mem) == 0
    assert run.messages == []
    run.output(Message.assistant("y"))
    assert [s.name for s in trace_of(run.messages[-1])] == ["t"]


def test_without_steps_an_output_keeps_its_metadata_as_given():
    run = RunContext(agent="a", memory=ConversationMemory())
    run.output({"role": "assistant", "content": "hi", "metadata": {"trace": "mine"}})
    assert run.messages[-1].metadata == {"trace": "mine"}


def test_an_ended_run_records_no_more_steps():
    run = RunContext(agent="a", memory=ConversationMemory())
    run.finish()
    with pytest.raises(RuntimeError, match="has ended"):
        run.record_tool_call("late", duration_ms=1)


def test_trace_steps_round_trip_as_json():
    step = TraceStep(kind="retrieval", name="rag", duration_ms=3, arguments={"q": "x", "k": 5})
    again = TraceStep.model_validate_json(step.model_dump_json())
    assert again == step
    assert again.started_at.tzinfo is not None


def test_slowest_and_failed_steps_over_several_runs():
    store = InMemoryStore()
    for i, agent in enumerate(("a", "b")):
        run = RunContext(agent=agent, memory=ConversationMemory())
        run.record_tool_call("t", duration_ms=10.0 * (i + 1))
        run.record_tool_call("u", duration_ms=5, error=ValueError(f"bad {agent}"))
        run.finish()
        store.save_run(run.snapshot())
    assert [s.duration_ms for s in slowest_steps(store, 3)] == [20.0, 10.0, 5.0]
    assert [s.error for s in failed_steps(store)] == ["ValueError: bad a", "ValueError: bad b"]
    assert [s.error for s in failed_steps(store, agent="b")] == ["ValueError: bad b"]
    assert slowest_steps(store, 0) == []
    with pytest.raises(ValueError, match="n must be an int >= 0, got -1"):
        slowest_steps(store, -1)


def test_sqlite_store_queries_directly(tmp_path: Path):
    store = SQLiteStore(tmp_path / "s.db")
    try:
        run = RunContext(agent="a", memory=ConversationMemory())
        run.record_tool_call("t", {"x": [1, 2]}, result={"ok": True}, duration_ms=2)
        run.finish()
        store.save_run(run.snapshot())
        (step,) = slowest_steps(store)
        assert step.arguments == {"x": [1, 2]}
        assert step.result == {"ok": True}
    finally:
        store.close()
