"""Unit tests for ConversationMemory: writing, reading, strict tools, forks, events."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone

import pydantic
import pytest

from marsys_mem import (
    ContextPolicy,
    ConversationMemory,
    HeuristicCounter,
    MarsysMemError,
    Message,
    ToolCall,
)
from marsys_mem.context import build_context
from marsys_mem.context.tokens import count_message
from marsys_mem.exceptions import (
    DuplicateMessageError,
    DuplicateToolCallError,
    MessageNotFoundError,
    OrphanToolResultError,
)
from marsys_mem.model import AddEvent, ClearEvent, EventBus, ForkEvent, RemoveEvent, to_llm_format


def recount(mem: ConversationMemory) -> int:
    return sum(count_message(mem.counter, m) for m in mem)


def call(*ids: str, **fields) -> Message:
    return Message.assistant("", tool_calls=[ToolCall(id=i, name="lookup") for i in ids], **fields)


def result(call_id: str, text: str = "ok", **fields) -> Message:
    return Message.tool(text, tool_call_id=call_id, name="lookup", **fields)


def snapshot(mem: ConversationMemory) -> tuple[list[Message], int, list[Message]]:
    return mem.read(), mem.total_tokens, mem.appended()


# ---------------------------------------------------------------------- writing & reading
def test_add_and_store_return_ids() -> None:
    mem = ConversationMemory()
    m1, m2 = Message.user("a"), Message.assistant("b")
    assert mem.add(m1) == m1.message_id
    assert mem.store(m2) == m2.message_id
    assert mem.read() == [m1, m2]
    ids = mem.add_many([Message.user("c"), Message.user("d")])
    assert ids == [m.message_id for m in mem.read()[2:]]
    assert mem.add_many([]) == []


def test_read_vs_appended() -> None:
    initial = [Message.system("sys"), Message.user("hi")]
    mem = ConversationMemory(initial)
    assert mem.read() == initial
    assert mem.appended() == []
    new = Message.user("this run")
    mem.add(new)
    assert mem.read() == [*initial, new]
    assert mem.appended() == [new]
    empty = ConversationMemory()
    empty.add(new)
    assert empty.appended() == [new] == empty.read()


def test_appended_starts_empty_after_fork() -> None:
    parent = ConversationMemory([Message.user("a")])
    parent.add(Message.user("b"))
    child = parent.fork()
    assert child.appended() == []
    assert child.read() == parent.read()
    c = Message.user("c")
    child.add(c)
    assert child.appended() == [c]
    assert len(parent.appended()) == 1


def test_appended_after_removing_an_initial_message() -> None:
    a, b, c = Message.user("a"), Message.user("b"), Message.user("c")
    mem = ConversationMemory([a, b])
    mem.add(c)
    mem.remove(a.message_id)
    assert mem.read() == [b, c]
    assert mem.appended() == [c]


def test_get_get_recent_contains() -> None:
    msgs = [Message.user(str(i)) for i in range(5)]
    mem = ConversationMemory(msgs)
    assert mem.get(msgs[2].message_id) == msgs[2]
    assert mem.get("missing") is None
    assert mem.get_recent(2) == msgs[-2:]
    assert mem.get_recent(0) == []
    assert mem.get_recent(99) == msgs
    with pytest.raises(ValueError, match="n"):
        mem.get_recent(-1)
    assert msgs[0].message_id in mem
    assert "missing" not in mem
    assert 3 not in mem
    assert msgs[0] not in mem  # membership is by id


def test_len_iter_getitem() -> None:
    msgs = [Message.user(str(i)) for i in range(4)]
    mem = ConversationMemory(msgs)
    assert len(mem) == 4
    assert list(mem) == msgs
    assert mem[0] == msgs[0]
    assert mem[-1] == msgs[-1]
    assert mem[-4] == msgs[0]
    assert mem[1:3] == msgs[1:3]
    assert mem[::-1] == msgs[::-1]
    for bad in (4, 100, -5):
        with pytest.raises(IndexError):
            mem[bad]
    assert len(ConversationMemory()) == 0
    with pytest.raises(IndexError):
        ConversationMemory()[0]


def test_getitem_across_fork_segments() -> None:
    base = [Message.user(f"p{i}") for i in range(3)]
    parent = ConversationMemory(base)
    child = parent.fork()
    mid = [Message.user(f"c{i}") for i in range(2)]
    child.add_many(mid)
    grandchild = child.fork()
    top = Message.user("g")
    grandchild.add(top)
    expected = [*base, *mid, top]
    assert [grandchild[i] for i in range(len(expected))] == expected
    assert [grandchild[-i - 1] for i in range(len(expected))] == expected[::-1]
    assert grandchild[1:5] == expected[1:5]
    with pytest.raises(IndexError):
        grandchild[len(expected)]
    with pytest.raises(IndexError):
        grandchild[-len(expected) - 1]


def test_filter() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    msgs = [
        Message.system("s", timestamp=t0),
        Message.user("u1", timestamp=t0 + timedelta(minutes=1)),
        Message.assistant("a1", timestamp=t0 + timedelta(minutes=2)),
        Message.user("u2 long text", timestamp=t0 + timedelta(minutes=3)),
    ]
    mem = ConversationMemory(msgs)
    assert mem.filter(role="user") == [msgs[1], msgs[3]]
    assert mem.filter(role=["user", "system"]) == [msgs[0], msgs[1], msgs[3]]
    assert mem.filter(since=t0 + timedelta(minutes=2)) == msgs[2:]
    assert mem.filter(predicate=lambda m: "long" in m.text) == [msgs[3]]
    assert mem.filter(role="user", since=t0 + timedelta(minutes=2)) == [msgs[3]]
    assert mem.filter() == msgs
    assert mem.filter(role="tool") == []
    with pytest.raises(ValueError, match="timezone"):
        mem.filter(since=datetime(2026, 1, 1))


def test_filter_since_compares_instants_across_timezones() -> None:
    t0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    a = Message.user("a", timestamp=t0)
    b = Message.user("b", timestamp=t0 + timedelta(hours=1))
    mem = ConversationMemory([a, b])
    plus2 = timezone(timedelta(hours=2))
    assert mem.filter(since=datetime(2026, 1, 1, 14, 30, tzinfo=plus2)) == [b]


def test_to_llm_format() -> None:
    msgs = [
        Message.system("be terse"),
        Message.user("weather?"),
        call("c1"),
        result("c1", "72F"),
        Message.agent_call("find Q4", name="planner"),
        Message.agent_response("Q4 up 5%", name="researcher"),
    ]
    mem = ConversationMemory(msgs)
    out = mem.to_llm_format()
    assert out == to_llm_format(msgs, "openai")
    assert out[3] == {"role": "tool", "tool_call_id": "c1", "content": "72F"}
    assert out[4]["role"] == "user"
    assert out[4]["content"].startswith("[Request from planner]")
    assert out[5]["role"] == "assistant"
    assert mem.to_llm_format("anthropic") == to_llm_format(msgs, "anthropic")


def test_repr() -> None:
    mem = ConversationMemory([Message.user("hello")], agent="ana")
    mem.add(Message.user("again"))
    r = repr(mem)
    assert r.startswith("ConversationMemory(")
    assert "agent='ana'" in r
    assert "messages=2" in r
    assert "appended=1" in r
    assert f"tokens={mem.total_tokens}" in r
    assert "agent" not in repr(ConversationMemory())


# ---------------------------------------------------------------------- remove / clear / tokens
def test_remove() -> None:
    msgs = [Message.user(str(i)) for i in range(5)]
    mem = ConversationMemory(msgs)
    removed = mem.remove(msgs[1].message_id, msgs[3].message_id)
    assert removed == [msgs[1], msgs[3]]
    assert mem.read() == [msgs[0], msgs[2], msgs[4]]
    assert mem.total_tokens == recount(mem)
    assert msgs[1].message_id not in mem


def test_remove_unknown_id_removes_nothing() -> None:
    msgs = [Message.user(str(i)) for i in range(3)]
    mem = ConversationMemory(msgs)
    before = snapshot(mem)
    with pytest.raises(MessageNotFoundError, match="nope") as info:
        mem.remove(msgs[0].message_id, "nope")
    assert isinstance(info.value, KeyError)
    assert isinstance(info.value, MarsysMemError)
    assert snapshot(mem) == before


def test_clear() -> None:
    mem = ConversationMemory([Message.system("s"), Message.user("u")])
    mem.add(Message.assistant("a"))
    mem.clear()
    assert len(mem) == 0
    assert mem.read() == []
    assert mem.total_tokens == 0
    assert mem.appended() == []
    m = Message.user("after")
    mem.add(m)
    assert mem.read() == [m]
    assert mem.total_tokens == recount(mem)


def test_clear_keep_system() -> None:
    s1, s2 = Message.system("one"), Message.system("two")
    mem = ConversationMemory([s1, Message.user("u"), s2])
    mem.add(Message.assistant("a", pinned=True))
    mem.clear(keep_system=True)
    assert mem.read() == [s1, s2]
    assert mem.total_tokens == recount(mem)
    only_system = ConversationMemory([s1])
    only_system.clear(keep_system=True)
    assert only_system.read() == [s1]


def test_total_tokens_incremental_and_correct() -> None:
    mem = ConversationMemory([Message.system("sys " * 10)])
    assert mem.total_tokens == recount(mem)
    for i in range(20):
        mem.add(Message.user("x" * (i * 7)))
        assert mem.total_tokens == recount(mem)
    mem.remove(mem[3].message_id, mem[7].message_id)
    assert mem.total_tokens == recount(mem)
    mem.context(ContextPolicy(max_messages=6, strategy="trim_oldest"))
    assert len(mem) == 6
    assert mem.total_tokens == recount(mem)
    mem.clear(keep_system=True)
    assert mem.total_tokens == recount(mem) > 0
    mem.clear()
    assert mem.total_tokens == 0


def test_total_tokens_uses_the_memory_counter() -> None:
    counter = HeuristicCounter(chars_per_token=2, per_message_overhead=0)
    mem = ConversationMemory([Message.user("x" * 10)], counter=counter)
    assert mem.total_tokens == 5
    assert mem.counter is counter


# ---------------------------------------------------------------------- validation
def test_duplicate_message_id_rejected() -> None:
    m = Message.user("once")
    mem = ConversationMemory([m])
    before = snapshot(mem)
    with pytest.raises(DuplicateMessageError, match=m.message_id):
        mem.add(m)
    with pytest.raises(DuplicateMessageError):
        mem.add(Message.user("other text", message_id=m.message_id))
    assert snapshot(mem) == before
    with pytest.raises(DuplicateMessageError):
        ConversationMemory([m, m])


def test_duplicate_id_in_parent_history_rejected_in_child() -> None:
    m = Message.user("shared")
    parent = ConversationMemory([m])
    child = parent.fork()
    with pytest.raises(DuplicateMessageError):
        child.add(m)
    # but a message the parent added after the fork is not in the child
    later = Message.user("parent later")
    parent.add(later)
    assert child.add(later) == later.message_id


def test_strict_tools_orphan_result_rejected() -> None:
    mem = ConversationMemory([Message.user("hi")])
    before = snapshot(mem)
    with pytest.raises(OrphanToolResultError, match="ghost"):
        mem.add(result("ghost"))
    assert snapshot(mem) == before


def test_strict_tools_reused_call_id_and_second_result_rejected() -> None:
    mem = ConversationMemory([call("c1"), result("c1")])
    before = snapshot(mem)
    with pytest.raises(DuplicateToolCallError, match="c1"):
        mem.add(call("c1"))
    with pytest.raises(DuplicateToolCallError, match="c1"):
        mem.add(result("c1", "again"))
    with pytest.raises(DuplicateToolCallError):
        mem.add(call("c2", "c3", "c1"))
    assert snapshot(mem) == before
    # a pending call can still be answered, once
    mem.add(call("c2"))
    mem.add(result("c2"))
    with pytest.raises(DuplicateToolCallError):
        mem.add(result("c2"))


def test_strict_tools_false_allows_orphans_and_reuse() -> None:
    mem = ConversationMemory(strict_tools=False)
    mem.add(result("ghost"))
    mem.add(call("c1"))
    mem.add(call("c1"))
    mem.add(result("c1"))
    mem.add(result("c1", "second"))
    assert len(mem) == 5
    assert mem.total_tokens == recount(mem)


def test_add_many_is_atomic() -> None:
    mem = ConversationMemory([Message.user("start"), call("c0")])
    before = snapshot(mem)
    dup = Message.user("dup")
    bad_batches = [
        ([Message.user("a"), result("ghost"), Message.user("b")], OrphanToolResultError),
        ([Message.user("a"), call("c0"), Message.user("b")], DuplicateToolCallError),
        ([call("x"), result("x"), result("x")], DuplicateToolCallError),
        ([call("y"), call("y")], DuplicateToolCallError),
        ([dup, Message.user("mid"), dup], DuplicateMessageError),
        ([Message.user("a"), mem[0], Message.user("b")], DuplicateMessageError),
        ([result("z"), call("z")], OrphanToolResultError),  # result before its call
        ([Message.user("a"), {"role": "wizard", "content": "b"}], pydantic.ValidationError),
        ([Message.user("a"), "not a message"], TypeError),
    ]
    for batch, error in bad_batches:
        with pytest.raises(error):
            mem.add_many(batch)
        assert snapshot(mem) == before, batch
    # a good batch with calls answered inside it
    ids = mem.add_many([call("x"), result("x"), result("c0")])
    assert len(ids) == 3
    assert len(mem) == 5


def test_add_many_accepts_a_generator() -> None:
    mem = ConversationMemory()
    mem.add_many(Message.user(str(i)) for i in range(3))
    assert [m.text for m in mem] == ["0", "1", "2"]


@pytest.mark.parametrize(
    "bad",
    [
        {"role": "wizard", "content": "x"},
        {"role": "user", "content": "x", "bogus": 1},
        {"role": "tool", "content": "x"},  # no tool_call_id
        {"role": "user", "tool_call_id": "c1"},
        {"role": "user", "content": "x", "timestamp": "2026-01-01T00:00:00"},  # naive
        {"role": "user", "content": "x", "message_id": ""},
        {"content": "no role"},
    ],
)
def test_malformed_dict_rejected_and_memory_unchanged(bad: dict) -> None:
    mem = ConversationMemory([Message.user("keep")])
    before = snapshot(mem)
    with pytest.raises(pydantic.ValidationError):
        mem.add(bad)
    with pytest.raises(pydantic.ValidationError):
        mem.add_many([{"role": "user", "content": "fine"}, bad])
    assert snapshot(mem) == before


def test_valid_dict_accepted() -> None:
    mem = ConversationMemory([{"role": "system", "content": "sys"}])
    mid = mem.add({"role": "user", "content": "hi", "pinned": True})
    m = mem.get(mid)
    assert isinstance(m, Message)
    assert m.text == "hi"
    assert m.pinned
    mem.add({"role": "assistant", "tool_calls": [{"id": "k1", "name": "search"}]})
    mem.add({"role": "tool", "content": "found", "tool_call_id": "k1"})
    assert [m.role for m in mem] == ["system", "user", "assistant", "tool"]
    assert mem.total_tokens == recount(mem)


def test_add_rejects_other_types() -> None:
    mem = ConversationMemory()
    with pytest.raises(TypeError, match="str"):
        mem.add("hello")  # type: ignore[arg-type]
    assert len(mem) == 0


# ---------------------------------------------------------------------- fork (copy-on-write)
def test_fork_sees_parent_history_and_isolates_appends() -> None:
    base = [Message.system("sys"), Message.user("shared")]
    parent = ConversationMemory(base, agent="planner")
    child = parent.fork(agent="researcher")
    assert child.read() == base
    assert child.agent == "researcher"
    assert child.total_tokens == parent.total_tokens
    c = Message.user("child only")
    child.add(c)
    p = Message.user("parent only")
    parent.add(p)
    assert parent.read() == [*base, p]
    assert child.read() == [*base, c]
    assert c.message_id not in parent
    assert p.message_id not in child
    assert parent.get(c.message_id) is None
    assert child.get(p.message_id) is None
    assert child.total_tokens == recount(child)
    assert parent.total_tokens == recount(parent)
    assert parent.fork().agent == "planner"


def test_fork_inherits_settings() -> None:
    counter = HeuristicCounter(chars_per_token=3)
    policy = ContextPolicy(max_messages=3)
    bus = EventBus()
    parent = ConversationMemory(policy=policy, counter=counter, strict_tools=False, events=bus)
    child = parent.fork()
    assert child.policy is policy
    assert child.counter is counter
    assert child.events is bus
    assert child.strict_tools is False
    child.add(result("ghost"))  # allowed: strict_tools=False was inherited


def test_parent_changes_after_fork_do_not_reach_child() -> None:
    msgs = [Message.system("s"), *(Message.user(str(i)) for i in range(6))]
    parent = ConversationMemory(msgs)
    child = parent.fork()
    parent.remove(msgs[2].message_id)
    assert child.read() == msgs
    parent.context(ContextPolicy(max_messages=3, strategy="trim_oldest"))
    assert len(parent) == 3
    assert child.read() == msgs
    parent.clear()
    assert len(parent) == 0
    assert child.read() == msgs
    assert child.total_tokens == recount(child)
    new = Message.user("child goes on")
    child.add(new)
    assert child.read() == [*msgs, new]


def test_child_changes_do_not_reach_parent() -> None:
    msgs = [Message.system("s"), *(Message.user(str(i)) for i in range(6))]
    parent = ConversationMemory(msgs)
    child = parent.fork()
    child.remove(msgs[1].message_id)
    assert parent.read() == msgs
    child.context(ContextPolicy(max_messages=3, strategy="trim_oldest"))
    assert len(child) == 3
    assert parent.read() == msgs
    child.clear(keep_system=True)
    assert child.read() == [msgs[0]]
    assert parent.read() == msgs
    child.clear()
    assert parent.read() == msgs
    assert parent.total_tokens == recount(parent)


def test_forks_of_forks_with_interleaved_appends() -> None:
    root = ConversationMemory([Message.system("root")])
    r1 = Message.user("r1")
    root.add(r1)
    child = root.fork(agent="child")
    c1 = Message.user("c1")
    child.add(c1)
    r2 = Message.user("r2")
    root.add(r2)
    grandchild = child.fork(agent="grand")
    c2 = Message.user("c2")
    child.add(c2)
    g1 = Message.user("g1")
    grandchild.add(g1)
    r3 = Message.user("r3")
    root.add(r3)
    great = grandchild.fork()
    g2 = Message.user("g2")
    grandchild.add(g2)
    x1 = Message.user("x1")
    great.add(x1)

    sys_msg = root[0]
    assert root.read() == [sys_msg, r1, r2, r3]
    assert child.read() == [sys_msg, r1, c1, c2]
    assert grandchild.read() == [sys_msg, r1, c1, g1, g2]
    assert great.read() == [sys_msg, r1, c1, g1, x1]
    for mem in (root, child, grandchild, great):
        assert mem.total_tokens == recount(mem)
        assert [mem.get(m.message_id) for m in mem] == mem.read()
        assert len(mem) == len(mem.read())
    assert grandchild.appended() == [g1, g2]
    assert great.appended() == [x1]
    # removing in the middle generation leaves the others alone
    child.remove(r1.message_id)
    assert child.read() == [sys_msg, c1, c2]
    assert grandchild.read() == [sys_msg, r1, c1, g1, g2]
    assert great.read() == [sys_msg, r1, c1, g1, x1]
    assert root.read() == [sys_msg, r1, r2, r3]


def test_child_answers_call_made_in_parent_before_fork() -> None:
    parent = ConversationMemory([Message.user("go"), call("p1", "p2")])
    child = parent.fork()
    r = result("p1", "child's answer")
    child.add(r)
    assert child.read()[-1] == r
    # the parent can answer the same call on its own branch
    parent.add(result("p1", "parent's answer"))
    with pytest.raises(DuplicateToolCallError):
        child.add(result("p1", "twice"))
    child.add(result("p2"))
    win = child.context(ContextPolicy(max_messages=4))  # from the user turn (start_on="user")
    assert [m.role for m in win.messages] == ["user", "assistant", "tool", "tool"]
    assert [m.text for m in win.messages[2:]] == ["child's answer", "ok"]
    pwin = parent.context(ContextPolicy(max_messages=3))
    assert [m.text for m in pwin.messages] == ["go", "", "parent's answer"]
    # a grandchild sees its parent's answer as already given
    grandchild = child.fork()
    with pytest.raises(DuplicateToolCallError):
        grandchild.add(result("p2"))


def test_child_call_ids_invisible_to_parent() -> None:
    parent = ConversationMemory([Message.user("go")])
    child = parent.fork()
    child.add(call("k"))
    with pytest.raises(OrphanToolResultError):
        parent.add(result("k"))
    parent.add(call("k"))  # not a duplicate on the parent's branch
    parent.add(result("k", "parent"))
    child.add(result("k", "child"))
    assert [m.text for m in child.read()[-2:]] == ["", "child"]


def test_fork_window_uses_only_its_own_branch() -> None:
    parent = ConversationMemory([Message.system("s"), Message.user("a")])
    child = parent.fork()
    for i in range(5):
        parent.add(Message.user(f"parent {i}"))
        child.add(Message.user(f"child {i}"))
    win = child.context(ContextPolicy(max_messages=4))
    assert [m.text for m in win.messages] == ["s", "child 2", "child 3", "child 4"]
    assert win.history_messages == 7
    assert win == build_context(child.read(), ContextPolicy(max_messages=4))


def test_parent_reusing_call_id_after_fork_does_not_change_child() -> None:
    parent = ConversationMemory(strict_tools=False)
    parent.add(call("c"))
    parent.add(result("c"))
    child = parent.fork()
    before = child.context()
    assert [m.role for m in before.messages] == ["assistant", "tool"]
    parent.add(call("c"))  # allowed: strict_tools=False
    after = child.context()
    assert after.messages == before.messages


# ---------------------------------------------------------------------- events
def test_add_events_only_when_subscribed() -> None:
    bus = EventBus()
    mem = ConversationMemory([Message.user("initial")], events=bus, agent="ana")
    mem.add(Message.user("unheard"))
    mem.add_many([Message.user("x"), Message.user("y")])
    assert bus.history("add") == []
    seen: list[AddEvent] = []
    bus.subscribe("add", seen.append)
    m = Message.user("heard")
    mem.add(m)
    batch = [Message.user("b1"), Message.user("b2")]
    mem.add_many(batch)
    mem.add_many([])
    assert len(seen) == 2
    first, second = seen
    assert isinstance(first, AddEvent)
    assert (first.agent, first.before, first.after, first.message_ids) == (
        "ana",
        4,
        5,
        (m.message_id,),
    )
    assert (second.before, second.after) == (5, 7)
    assert second.message_ids == tuple(b.message_id for b in batch)
    assert bus.history("add") == seen


def test_add_events_with_wildcard_subscription() -> None:
    bus = EventBus()
    seen: list = []
    bus.subscribe("*", seen.append)
    mem = ConversationMemory(events=bus)
    mem.add(Message.user("a"))
    assert [e.kind for e in seen] == ["add"]


def test_failed_add_publishes_nothing() -> None:
    bus = EventBus()
    seen: list = []
    bus.subscribe("*", seen.append)
    mem = ConversationMemory([Message.user("a")], events=bus)
    with pytest.raises(OrphanToolResultError):
        mem.add_many([Message.user("b"), result("ghost")])
    assert seen == []


def test_remove_clear_fork_events() -> None:
    bus = EventBus()
    msgs = [Message.system("s"), Message.user("u1"), Message.user("u2")]
    mem = ConversationMemory(msgs, events=bus, agent="ana")
    mem.remove(msgs[1].message_id)
    (rm,) = bus.history("remove")
    assert isinstance(rm, RemoveEvent)
    assert (rm.agent, rm.before, rm.after, rm.message_ids) == ("ana", 3, 2, (msgs[1].message_id,))
    child = mem.fork(agent="ana-2")
    (fk,) = bus.history("fork")
    assert isinstance(fk, ForkEvent)
    assert (fk.agent, fk.child, fk.before, fk.after) == ("ana", "ana-2", 2, 2)
    child.clear(keep_system=True)
    mem.clear()
    cl1, cl2 = bus.history("clear")
    assert isinstance(cl1, ClearEvent)
    assert (cl1.agent, cl1.before, cl1.after) == ("ana-2", 2, 1)
    assert (cl2.agent, cl2.before, cl2.after) == ("ana", 2, 0)
    with pytest.raises(MessageNotFoundError):
        mem.remove("gone")
    assert len(bus.history("remove")) == 1


def test_failing_subscriber_does_not_break_memory() -> None:
    bus = EventBus()

    def boom(event: object) -> None:
        raise RuntimeError("subscriber bug")

    bus.subscribe("add", boom)
    mem = ConversationMemory(events=bus)
    mem.add(Message.user("still added"))
    assert len(mem) == 1
    assert bus.errors == 1


# ---------------------------------------------------------------------- sink (write-through)
class RecordingSink:
    """Records every call; raises on the kinds listed in ``fail``."""

    def __init__(self, fail: tuple[str, ...] = ()) -> None:
        self.calls: list[tuple[str, list[str]]] = []
        self.fail = fail

    def _record(self, kind: str, ids: list[str]) -> None:
        if kind in self.fail:
            raise OSError(f"disk full on {kind}")
        self.calls.append((kind, ids))

    def on_append(self, memory: ConversationMemory, messages) -> None:
        self._record("append", [m.message_id for m in messages])

    def on_remove(self, memory: ConversationMemory, messages) -> None:
        self._record("remove", [m.message_id for m in messages])

    def on_clear(self, memory: ConversationMemory) -> None:
        self._record("clear", [])


def test_sink_mirrors_changes() -> None:
    initial = [Message.system("s"), Message.user("u0")]
    sink = RecordingSink()
    mem = ConversationMemory(initial, sink=sink)
    assert sink.calls == []  # initial messages are not sent
    m1 = Message.user("u1")
    mem.add(m1)
    batch = [Message.user(f"b{i}") for i in range(4)]
    mem.add_many(batch)
    mem.remove(m1.message_id)
    win = mem.context(ContextPolicy(max_messages=3, strategy="trim_oldest"))
    mem.clear(keep_system=True)
    mem.clear()
    assert sink.calls == [
        ("append", [m1.message_id]),
        ("append", [m.message_id for m in batch]),
        ("remove", [m1.message_id]),
        ("remove", list(win.dropped_ids)),
        ("remove", [m.message_id for m in win.messages if m.role != "system"]),
        ("clear", []),
    ]
    assert mem.fork().sink is None


def test_sink_not_called_for_invalid_writes() -> None:
    sink = RecordingSink()
    mem = ConversationMemory([Message.user("a")], sink=sink)
    with pytest.raises(OrphanToolResultError):
        mem.add(result("ghost"))
    with pytest.raises(DuplicateMessageError):
        mem.add_many([Message.user("b"), mem[0]])
    with pytest.raises(MessageNotFoundError):
        mem.remove("nope")
    assert sink.calls == []


@pytest.mark.parametrize("kind", ["append", "remove", "clear"])
def test_failing_sink_leaves_memory_unchanged(kind: str) -> None:
    bus = EventBus()
    seen: list = []
    bus.subscribe("*", seen.append)
    msgs = [Message.system("s"), *(Message.user(str(i)) for i in range(6))]
    mem = ConversationMemory(msgs, sink=RecordingSink(fail=(kind,)), events=bus)
    before = snapshot(mem)
    if kind == "append":
        with pytest.raises(OSError, match="disk full"):
            mem.add(Message.user("x"))
        with pytest.raises(OSError, match="disk full"):
            mem.add_many([Message.user("y"), Message.user("z")])
    elif kind == "remove":
        with pytest.raises(OSError, match="disk full"):
            mem.remove(msgs[2].message_id)
        with pytest.raises(OSError, match="disk full"):
            mem.context(ContextPolicy(max_messages=2, strategy="trim_oldest"))
        with pytest.raises(OSError, match="disk full"):
            mem.clear(keep_system=True)
    else:
        with pytest.raises(OSError, match="disk full"):
            mem.clear()
    assert snapshot(mem) == before
    assert mem.total_tokens == recount(mem)
    assert seen == []


class EvictingSink(RecordingSink):
    """Returns from on_append the ids ``choose(memory, batch)`` says it already dropped."""

    def __init__(self, choose: Callable[[ConversationMemory, list[Message]], list[str]]) -> None:
        super().__init__()
        self.choose = choose

    def on_append(self, memory: ConversationMemory, messages) -> list[str]:  # type: ignore[override]
        super().on_append(memory, messages)
        assert all(m.message_id not in memory for m in messages)  # before the append
        return self.choose(memory, list(messages))


def test_ids_returned_by_on_append_are_dropped_after_the_append_without_a_call_back() -> None:
    """One-way write path: the sink says what to drop; the memory drops it itself."""
    bus = EventBus()
    seen: list = []
    bus.subscribe("*", seen.append)
    msgs = [Message.system("s"), Message.user("u0"), Message.user("u1")]
    sink = EvictingSink(lambda mem, batch: [mem[1].message_id, "not here"])
    mem = ConversationMemory(msgs, sink=sink, events=bus)
    new = Message.user("u2")
    assert mem.add(new) == new.message_id
    assert [m.text for m in mem] == ["s", "u1", "u2"]
    assert sink.calls == [("append", [new.message_id])]  # never on_remove: no call back
    assert [type(e) for e in seen] == [AddEvent, RemoveEvent]
    assert seen[1].message_ids == (msgs[1].message_id,)
    assert (seen[1].before, seen[1].after) == (4, 3)
    # a batch: it may drop the batch's own messages too (a batch larger than a bound)
    sink.choose = lambda mem, batch: [batch[0].message_id]
    ids = mem.add_many([Message.user("b0"), Message.user("b1")])
    assert [m.text for m in mem] == ["s", "u1", "u2", "b1"]
    assert [m.message_id for m in mem.appended()] == [new.message_id, ids[1]]
    assert mem.total_tokens == recount(mem)
    assert [kind for kind, _ in sink.calls] == ["append", "append"]
    # a sink returning None (or an empty collection) drops nothing
    sink.choose = lambda mem, batch: []
    mem.add(Message.user("kept"))
    assert len(mem) == 5
    with pytest.raises(TypeError, match="single str"):
        mem.evict("abc")


# ---------------------------------------------------------------------- threads (issue 9)
@pytest.fixture
def busy_switching():
    """Switch threads every microsecond, so races show up in a short test."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def run_threads(*targets: Callable[[], object], timeout: float = 60.0) -> None:
    """Run ``targets`` at once; fail on any exception in them or on a deadlock."""
    errors: list[BaseException] = []
    start = threading.Barrier(len(targets))  # all at once, not one after the other

    def guarded(fn: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            try:
                start.wait(timeout)
                fn()
            except BaseException as exc:
                errors.append(exc)

        return run

    threads = [threading.Thread(target=guarded(t), daemon=True) for t in targets]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a thread is stuck (deadlock?)"
    assert errors == [], errors


def writer(mem: ConversationMemory, tag: str, n: int, added: list[Message], *, groups_atomic: bool):
    """Adds ``n`` turns: user messages, and every 4th a tool call with its result."""

    def run() -> None:
        for i in range(n):
            if i % 4 == 0:
                c = ToolCall(id=f"{tag}-c{i}", name="lookup", arguments={"i": i})
                group = [Message.assistant("", tool_calls=[c]), result(c.id, "r" * (i % 40))]
                if groups_atomic or i % 8 == 0:
                    mem.add_many(group)
                else:
                    for m in group:
                        mem.add(m)
                added.extend(group)
            else:
                m = Message.user(f"{tag} {i} " + "x" * (i % 97))
                mem.add(m)
                added.append(m)

    return run


def assert_window_valid(win, max_tokens: int) -> None:
    assert win.tokens <= max_tokens
    seen_calls: set[str] = set()
    for m in win.messages:
        seen_calls.update(c.id for c in m.tool_calls)
        if m.role == "tool":  # never an orphan: its call comes earlier in the window
            assert m.tool_call_id in seen_calls


def test_concurrent_adds_keep_every_message_and_the_exact_token_total(busy_switching) -> None:
    mem = ConversationMemory([Message.system("rules")])
    added: list[list[Message]] = [[] for _ in range(8)]
    run_threads(*(writer(mem, f"t{t}", 1500, added[t], groups_atomic=False) for t in range(8)))
    msgs = mem.read()
    every = [m for batch in added for m in batch]
    assert len(mem) == len(msgs) == 1 + len(every)
    assert {m.message_id for m in msgs[1:]} == {m.message_id for m in every}
    assert mem.total_tokens == recount(mem)  # under-counted by 17-56% before the lock
    position = {m.message_id: i for i, m in enumerate(msgs)}
    for batch in added:  # each thread's messages stay in its order
        order = [position[m.message_id] for m in batch]
        assert order == sorted(order)
    for i, m in enumerate(msgs):  # the index agrees with the list
        assert mem.get(m.message_id) is m
        assert mem[i] is m
        for c in m.tool_calls:
            assert mem.call_owner(c.id) == i
            [res] = mem.call_results(c.id)
            assert res > i
            assert msgs[res].tool_call_id == c.id
    win = mem.context(ContextPolicy(max_tokens=2000))
    assert_window_valid(win, 2000)
    assert win.history_tokens == mem.total_tokens


class MirrorSink:
    """Mirrors a memory's ids, as a store would; checks callbacks never interleave."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.busy = False

    def _enter(self) -> None:
        assert not self.busy, "two sink callbacks ran at once"
        self.busy = True

    def on_append(self, memory: ConversationMemory, messages) -> None:
        self._enter()
        self.ids.extend(m.message_id for m in messages)
        self.busy = False

    def on_remove(self, memory: ConversationMemory, messages) -> None:
        self._enter()
        gone = {m.message_id for m in messages}
        self.ids = [i for i in self.ids if i not in gone]
        self.busy = False

    def on_clear(self, memory: ConversationMemory) -> None:
        self._enter()
        self.ids = []
        self.busy = False


def test_concurrent_adds_trims_removes_and_forks_keep_memory_and_sink_in_step(
    busy_switching,
) -> None:
    sink = MirrorSink()
    system = Message.system("rules")
    mem = ConversationMemory([system], sink=sink)
    sink.ids.append(system.message_id)
    added: list[list[Message]] = [[] for _ in range(4)]
    dropped: set[str] = set()
    removed: set[str] = set()
    writers = [writer(mem, f"t{t}", 300, added[t], groups_atomic=True) for t in range(4)]
    done = threading.Event()

    def trimmer() -> None:
        policy = ContextPolicy(max_tokens=3000, strategy="trim_oldest")
        while not done.is_set():
            win = mem.context(policy)
            assert_window_valid(win, 3000)
            assert {m.message_id for m in win.messages}.isdisjoint(win.dropped_ids)
            dropped.update(win.dropped_ids)

    def remover() -> None:
        while not done.is_set():
            recent = mem.get_recent(3)
            if recent and recent[0].role == "user":
                try:
                    removed.update(m.message_id for m in mem.remove(recent[0].message_id))
                except MessageNotFoundError:
                    pass  # trimmed by the other thread in between: fine

    def reader() -> None:
        policy = ContextPolicy(max_tokens=1500)
        while not done.is_set():
            assert_window_valid(mem.context(policy), 1500)
            child = mem.fork()
            base = child.read()
            mine = Message.user("child only")
            child.add(mine)
            assert child.read() == [*base, mine]  # the parent moves on; the fork does not
            assert mine.message_id not in mem
            msgs = mem.read()
            assert len({m.message_id for m in msgs}) == len(msgs)

    def writers_then_stop() -> None:
        try:
            run_threads(*writers)
        finally:
            done.set()

    run_threads(writers_then_stop, trimmer, remover, reader)
    dropped.update(mem.context(ContextPolicy(max_tokens=3000, strategy="trim_oldest")).dropped_ids)
    present = [m.message_id for m in mem.read()]
    everything = {m.message_id for batch in added for m in batch} | {system.message_id}
    assert sink.ids == present  # memory and sink never disagree
    assert mem.total_tokens == recount(mem)
    assert len(set(present)) == len(present)
    assert not set(present) & (dropped | removed)
    assert set(present) | dropped | removed == everything  # nothing lost unreported
    assert "child only" not in {m.text for m in mem.read()}


def test_concurrent_writers_on_a_persistent_bounded_manager_agent(tmp_path, busy_switching) -> None:
    from marsys_mem.config.models import MemoryConfig
    from marsys_mem.manager import MemoryManager
    from marsys_mem.store import SQLiteStore

    config = MemoryConfig.model_validate(
        {
            "store": {"backend": "sqlite", "path": str(tmp_path / "m.db")},
            "agents": {"a": {"retention": "persistent", "max_stored_messages": 150}},
        }
    )
    with MemoryManager(config, retention_every=20) as manager:
        mem = manager.memory("a")  # its sink returns what the bound evicts; add drops it
        added: list[list[Message]] = [[] for _ in range(4)]
        run_threads(*(writer(mem, f"t{t}", 150, added[t], groups_atomic=True) for t in range(4)))
        assert mem.total_tokens == recount(mem)
        assert len(mem) <= 150 + 20 + 2
        manager.apply_retention()
        in_memory = [m.message_id for m in mem.read()]
    with SQLiteStore(tmp_path / "m.db") as store:
        [key] = store.list_keys()
        stored = [m.message_id for m in store.load_messages(key)]
    assert len(stored) <= 150
    everything = {m.message_id for batch in added for m in batch}
    assert set(stored) <= everything
    assert len(set(in_memory)) == len(in_memory)
    # the store got the memory's messages in the memory's order (retention may differ by a
    # message or so at the old end: compare the newest hundred)
    assert stored[-100:] == in_memory[-100:]


@pytest.mark.parametrize("meanwhile", ["add", "add_and_remove", "clear"])
def test_trim_oldest_deletes_only_what_its_window_dropped_when_the_history_moved(
    monkeypatch, meanwhile: str
) -> None:
    """Another writer acts between building a trim_oldest window and applying it."""
    import marsys_mem.conversation as conversation

    msgs = [Message.system("rules"), *(Message.user(f"m{i} " + "x" * 40) for i in range(20))]
    mem = ConversationMemory(msgs)
    late = Message.user("added while the window was built")
    real_build = conversation.build_window

    def build_then_other_writer(*args, **kwargs):
        out = real_build(*args, **kwargs)
        if meanwhile == "clear":
            mem.clear()
        else:
            mem.add(late)
        if meanwhile == "add_and_remove":
            mem.remove(msgs[1].message_id, msgs[18].message_id)
        return out

    monkeypatch.setattr(conversation, "build_window", build_then_other_writer)
    win = mem.context(ContextPolicy(max_messages=6, strategy="trim_oldest"))
    kept = [m.message_id for m in win.messages]
    assert kept == [msgs[0].message_id] + [m.message_id for m in msgs[-5:]]
    present = [m.message_id for m in mem.read()]
    if meanwhile == "clear":
        assert present == []
        assert win.dropped_ids == ()
    elif meanwhile == "add":
        assert present == [*kept, late.message_id]
        assert win.dropped_ids == tuple(m.message_id for m in msgs[1:-5])
    else:  # msgs[18] went meanwhile; msgs[1] too, so this trim did not drop it again
        assert present == [i for i in kept if i != msgs[18].message_id] + [late.message_id]
        assert win.dropped_ids == tuple(m.message_id for m in msgs[2:-5])
    assert mem.total_tokens == recount(mem)


async def test_a_summariser_runs_without_the_lock_so_other_threads_keep_writing() -> None:
    """A slow (LLM) summariser must not block other writers of the memory."""
    mem = ConversationMemory(
        [Message.system("rules"), *(Message.user(f"old {i}") for i in range(30))]
    )
    calls: list[int] = []

    def summariser(messages: list[Message]) -> str:
        calls.append(len(messages))
        other = threading.Thread(target=mem.add, args=(Message.user("from another thread"),))
        other.start()
        other.join(10)
        assert not other.is_alive(), "the add waited for the summariser: lock held"
        return f"summary of {len(messages)}"

    policy = ContextPolicy(max_messages=6, strategy="summarize", keep_recent=4)
    win = mem.context(policy, summarizer=summariser)
    assert win.summary is not None
    assert win.summary.text.splitlines()[1].startswith('- "summary of')
    assert len(mem) == 32  # the other thread's message arrived while summarising
    assert mem.read()[-1].text == "from another thread"
    calls_before = len(calls)

    async def asummariser(messages: list[Message]) -> str:
        return summariser(messages)

    await mem.acontext(policy, summarizer=asummariser)  # the summary is extended, not redone
    assert len(calls) == calls_before + 1
    assert calls[-1] < 10
    assert len(mem) == 33
