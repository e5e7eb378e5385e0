"""Runs in the model layer: RunContext writes to any RunMemory; history follows run chains."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from marsys_mem import ConversationMemory, Message
from marsys_mem.exceptions import MessageNotFoundError
from marsys_mem.model import RunContext, RunSnapshot, history
from marsys_mem.model.messages import content_text, freeze_json
from marsys_mem.model.runs import RunMemory


class ListMemory:
    """The smallest RunMemory: a list that hands out ids."""

    def __init__(self) -> None:
        self.items: list[Message] = []

    def add(self, message: Message | Mapping[str, Any]) -> str:
        m = message if isinstance(message, Message) else Message.model_validate(message)
        self.items.append(m)
        return m.message_id

    def __getitem__(self, position: int) -> Message:
        return self.items[position]


def test_a_run_writes_to_any_run_memory():
    memory: RunMemory = ListMemory()
    run = RunContext(agent="a", memory=memory)
    run.input({"role": "user", "content": "hi"})
    run.output(Message.assistant("hello"))
    snap = run.snapshot()
    assert [m.text for m in snap.input_messages] == ["hi"]
    assert [m.text for m in snap.output_messages] == ["hello"]
    assert isinstance(memory, ListMemory)
    assert [m.text for m in memory.items] == ["hi", "hello"]


def test_a_run_keeps_its_memory_type():
    mem = ConversationMemory()
    run = RunContext(agent="a", memory=mem)
    assert run.memory is mem
    run.add(Message.user("q"))
    assert [m.text for m in run.memory.read()] == ["q"]


class Runs:
    def __init__(self, *snaps: RunSnapshot) -> None:
        self.snaps = {s.run_id: s for s in snaps}

    def load_run(self, run_id: str) -> RunSnapshot | None:
        return self.snaps.get(run_id)


def test_history_follows_the_chain_and_names_a_missing_run():
    root = RunSnapshot(run_id="r1", agent="a", messages=[Message.user("one")])
    child = RunSnapshot(run_id="r2", agent="a", parent_id="r1", messages=[Message.user("two")])
    assert [m.text for m in history(Runs(root, child), "r2")] == ["one", "two"]
    with pytest.raises(MessageNotFoundError, match="'r1'"):
        history(Runs(child), "r2")


def test_history_rejects_a_cycle():
    a = RunSnapshot(run_id="a", agent="x", parent_id="b")
    b = RunSnapshot(run_id="b", agent="x", parent_id="a")
    with pytest.raises(ValueError, match="cycle"):
        history(Runs(a, b), "a")


def test_freeze_json_and_content_text_are_public():
    frozen = freeze_json({"k": [1, {"j": 2}]})
    with pytest.raises(TypeError):
        frozen["k"] = 3
    with pytest.raises(ValueError, match="NaN"):
        freeze_json({"x": float("nan")})
    assert content_text(None) == ""
    assert content_text("plain") == "plain"
    assert content_text({"b": 1, "a": 2}) == '{"a": 2, "b": 1}'
