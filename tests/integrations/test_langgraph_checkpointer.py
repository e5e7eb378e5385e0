"""MarsysCheckpointer against LangGraph itself: its conformance suite and real graphs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.report import CapabilityReport
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph

from marsys_mem.exceptions import MissingDependencyError, StoreError
from marsys_mem.integrations.langgraph import MarsysCheckpointer, thread_name
from marsys_mem.store import InMemoryStore, SQLiteStore

ROOT = Path(__file__).resolve().parents[2]


def _failures(report: CapabilityReport) -> str:
    return json.dumps({k: v.failures for k, v in report.results.items() if v.failures}, indent=1)


# ---------------------------------------------------------------- LangGraph's conformance suite
async def test_conformance_in_memory_store() -> None:
    @checkpointer_test(name="MarsysCheckpointer[InMemoryStore]")
    async def factory() -> AsyncIterator[MarsysCheckpointer]:
        store = InMemoryStore()
        yield MarsysCheckpointer(store)
        store.close()

    report = await validate(factory)
    assert report.passed_all_base(), _failures(report)
    assert report.passed_all(), _failures(report)
    extended = {"copy_thread", "prune", "delete_for_runs"}
    assert all(report.results[name].detected for name in extended)
    assert report.conformance_level() == "FULL"


async def test_conformance_sqlite_store(tmp_path: Path) -> None:
    @checkpointer_test(name="MarsysCheckpointer[SQLiteStore]")
    async def factory() -> AsyncIterator[MarsysCheckpointer]:
        store = SQLiteStore(tmp_path / "lg.db")
        yield MarsysCheckpointer(store)
        store.close()

    report = await validate(factory)
    assert report.passed_all_base(), _failures(report)
    assert report.conformance_level() == "FULL", _failures(report)


# ---------------------------------------------------------------- a real graph
def _reply(state: MessagesState) -> dict[str, Any]:
    last = state["messages"][-1].content
    return {"messages": [AIMessage(f"echo {last} ({len(state['messages'])} seen)")]}


def _graph(saver: MarsysCheckpointer) -> Any:
    builder = StateGraph(MessagesState)
    builder.add_node("reply", _reply)
    builder.add_edge(START, "reply")
    builder.add_edge("reply", END)
    return builder.compile(checkpointer=saver)


def _cfg(thread: str) -> Any:
    return {"configurable": {"thread_id": thread}}


def test_graph_stores_each_message_once() -> None:
    store = InMemoryStore()
    graph = _graph(MarsysCheckpointer(store))
    for i in range(30):
        out = graph.invoke({"messages": [HumanMessage(f"q{i}")]}, _cfg("chat/1"))
    assert len(out["messages"]) == 60
    assert out["messages"][-1].content == "echo q29 (59 seen)"
    log = store.load_messages(("langgraph", thread_name("chat/1"), "messages"))
    assert len(log) == 60  # each message once, however many checkpoints reference it
    assert [m.role for m in log[:2]] == ["user", "assistant"]
    assert log[0].text == "q0"
    assert log[1].text.startswith("echo q0")


def test_message_list_edits_round_trip() -> None:
    saver = MarsysCheckpointer(InMemoryStore())
    graph = _graph(saver)
    for i in range(3):
        graph.invoke({"messages": [HumanMessage(f"q{i}", id=f"h{i}")]}, _cfg("t"))
    before = graph.get_state(_cfg("t")).values["messages"]
    graph.update_state(
        _cfg("t"),
        {"messages": [RemoveMessage(id="h1"), HumanMessage("q0 edited", id="h0")]},
    )
    after = [m.content for m in graph.get_state(_cfg("t")).values["messages"]]
    assert after[0] == "q0 edited"
    assert "q1" not in after
    assert len(after) == len(before) - 1
    # a fresh checkpointer (cold cache) reads the same lists, at every checkpoint
    cold = MarsysCheckpointer(saver.store)
    for tup in saver.list(_cfg("t")):
        again = cold.get_tuple(tup.config)
        assert again is not None
        assert again.checkpoint["channel_values"] == tup.checkpoint["channel_values"]


async def test_async_graph_and_copy_thread() -> None:
    saver = MarsysCheckpointer(InMemoryStore())
    graph = _graph(saver)
    await graph.ainvoke({"messages": [HumanMessage("a")]}, _cfg("src"))
    await saver.acopy_thread("src", "dst")
    await graph.ainvoke({"messages": [HumanMessage("b")]}, _cfg("dst"))
    src = (await graph.aget_state(_cfg("src"))).values["messages"]
    dst = (await graph.aget_state(_cfg("dst"))).values["messages"]
    assert [m.content for m in src] == ["a", "echo a (1 seen)"]
    assert [m.content for m in dst][2:] == ["b", "echo b (3 seen)"]
    with pytest.raises(ValueError, match="already has checkpoints"):
        await saver.acopy_thread("src", "dst")


def test_prune_keeps_the_latest_state_and_drops_unreferenced_messages() -> None:
    store = InMemoryStore()
    saver = MarsysCheckpointer(store)
    graph = _graph(saver)
    for i in range(5):
        graph.invoke({"messages": [HumanMessage(f"q{i}")]}, _cfg("p"))
    graph.update_state(_cfg("p"), {"messages": [RemoveMessage(id="__remove_all__")]})
    saver.prune(["p"])
    assert len(list(saver.list(_cfg("p")))) == 1
    assert graph.get_state(_cfg("p")).values["messages"] == []
    assert store.count_messages(("langgraph", "p", "messages")) == 0
    with pytest.raises(ValueError, match="strategy"):
        saver.prune(["p"], strategy="newest")


def test_resume_in_a_new_process_from_sqlite(tmp_path: Path) -> None:
    db = tmp_path / "threads.db"
    store = SQLiteStore(db)
    graph = _graph(MarsysCheckpointer(store))
    graph.invoke({"messages": [HumanMessage("first")]}, _cfg("user-7"))
    store.close()
    script = textwrap.dedent(
        f"""
        import json, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_langgraph_checkpointer import _graph, _cfg
        from langchain_core.messages import HumanMessage
        from marsys_mem.integrations.langgraph import MarsysCheckpointer
        from marsys_mem.store import SQLiteStore
        store = SQLiteStore({str(db)!r})
        graph = _graph(MarsysCheckpointer(store))
        out = graph.invoke({{"messages": [HumanMessage("second")]}}, _cfg("user-7"))
        print(json.dumps([m.content for m in out["messages"]]))
        store.close()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [
        "first",
        "echo first (1 seen)",
        "second",
        "echo second (3 seen)",
    ]
    # and this process, with a fresh store, sees what the other one wrote
    with SQLiteStore(db) as again:
        state = _graph(MarsysCheckpointer(again)).get_state(_cfg("user-7"))
        assert len(state.values["messages"]) == 4


def test_two_checkpointers_on_one_file_see_each_others_writes(tmp_path: Path) -> None:
    a_store, b_store = SQLiteStore(tmp_path / "x.db"), SQLiteStore(tmp_path / "x.db")
    a, b = _graph(MarsysCheckpointer(a_store)), _graph(MarsysCheckpointer(b_store))
    a.invoke({"messages": [HumanMessage("1")]}, _cfg("t"))
    b.invoke({"messages": [HumanMessage("2")]}, _cfg("t"))  # b reads a's checkpoint
    out = a.invoke({"messages": [HumanMessage("3")]}, _cfg("t"))  # a notices b's
    assert [m.content for m in out["messages"]][::2] == ["1", "2", "3"]
    a_store.close()
    b_store.close()


# ---------------------------------------------------------------- the boundary
def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="namespace"):
        MarsysCheckpointer(InMemoryStore(), namespace="a/b")
    with pytest.raises(ValueError, match=r"message_channels\[1\]"):
        MarsysCheckpointer(InMemoryStore(), message_channels=["messages", ""])
    with pytest.raises(TypeError, match="MemoryStore"):
        MarsysCheckpointer("memory.db")  # type: ignore[arg-type]
    saver = MarsysCheckpointer(InMemoryStore())
    with pytest.raises(ValueError, match="thread_id"):
        saver.get_tuple({"configurable": {}})


def test_thread_names() -> None:
    ids = ["plain", "a/b", "a%2Fb", "#x", "", "x" * 300, "a@b+c", "tab\there"]
    names = [thread_name(t) for t in ids]
    assert len(set(names)) == len(ids)
    assert names[0] == "plain"
    assert all(len(n) <= 256 for n in names)


def test_a_failed_write_changes_nothing() -> None:
    store = InMemoryStore()
    saver = MarsysCheckpointer(store)
    graph = _graph(saver)
    graph.invoke({"messages": [HumanMessage("kept")]}, _cfg("t"))
    before = saver.get_tuple(_cfg("t"))
    store.close()
    with pytest.raises(StoreError):
        graph.invoke({"messages": [HumanMessage("lost")]}, _cfg("t"))
    assert before is not None
    assert [m.content for m in before.checkpoint["channel_values"]["messages"]] == [
        "kept",
        "echo kept (1 seen)",
    ]


def test_missing_langgraph_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['langgraph'] = None\n"
        "from marsys_mem.exceptions import MissingDependencyError\n"
        "try:\n"
        "    import marsys_mem.integrations.langgraph\n"
        "except MissingDependencyError as e:\n"
        "    print(e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert "marsys-mem[langgraph]" in done.stdout, done.stderr
    assert issubclass(MissingDependencyError, ImportError)


# ---------------------------------------------------------------- copy_thread: a copy-on-write fork
def _contents(graph: Any, thread: str) -> list[str]:
    return [m.content for m in graph.get_state(_cfg(thread)).values["messages"]]


def _log_len(store: Any, thread: str) -> int:
    return int(store.count_messages(("langgraph", thread_name(thread), "messages")))


@pytest.mark.parametrize("backing", ["memory", "sqlite"])
def test_copy_thread_references_the_source_log_and_survives_its_deletion(
    backing: str, tmp_path: Path
) -> None:
    store = InMemoryStore() if backing == "memory" else SQLiteStore(tmp_path / "f.db")
    saver = MarsysCheckpointer(store)
    graph = _graph(saver)
    for i in range(20):
        graph.invoke({"messages": [HumanMessage(f"q{i}")]}, _cfg("src"))
    saver.copy_thread("src", "fork")
    assert _log_len(store, "fork") == 0  # no message copied: the fork reads the source's log
    assert _contents(graph, "fork") == _contents(graph, "src")
    graph.invoke({"messages": [HumanMessage("only in the fork")]}, _cfg("fork"))
    assert _log_len(store, "fork") == 2  # what the fork adds is its own
    assert len(_contents(graph, "src")) == 40
    expected = _contents(graph, "fork")
    assert expected[-2] == "only in the fork"
    src_ids = {t.checkpoint["id"] for t in saver.list(_cfg("src"))}
    assert src_ids < {t.checkpoint["id"] for t in saver.list(_cfg("fork"))}  # all copied, + new
    # a cold checkpointer follows the reference too
    assert _contents(_graph(MarsysCheckpointer(store)), "fork") == expected
    saver.delete_thread("src")  # the fork gets its copy, in the same batch
    assert _log_len(store, "fork") == 42
    assert saver.get_tuple(_cfg("src")) is None
    assert _contents(graph, "fork") == expected
    assert _contents(_graph(MarsysCheckpointer(store)), "fork") == expected
    store.close()


def test_pruning_the_source_keeps_the_fork_whole() -> None:
    store = InMemoryStore()
    saver = MarsysCheckpointer(store)
    graph = _graph(saver)
    for i in range(5):
        graph.invoke({"messages": [HumanMessage(f"q{i}")]}, _cfg("p"))
    saver.copy_thread("p", "keep")
    expected = _contents(graph, "keep")
    graph.update_state(_cfg("p"), {"messages": [RemoveMessage(id="__remove_all__")]})
    saver.prune(["p"])  # deletes p's messages: the fork gets its own first
    assert _log_len(store, "p") == 0
    assert _contents(graph, "keep") == expected
    assert _contents(_graph(MarsysCheckpointer(store)), "keep") == expected


def test_fork_of_a_fork_and_deleting_forks() -> None:
    store = InMemoryStore()
    saver = MarsysCheckpointer(store)
    graph = _graph(saver)
    graph.invoke({"messages": [HumanMessage("a")]}, _cfg("a"))
    saver.copy_thread("a", "b")
    graph.invoke({"messages": [HumanMessage("b")]}, _cfg("b"))
    saver.copy_thread("b", "c")
    graph.invoke({"messages": [HumanMessage("c")]}, _cfg("c"))
    expected = _contents(graph, "c")
    assert expected[::2] == ["a", "b", "c"]
    saver.delete_thread("b")  # the middle of the chain: c copies what it read through b
    assert _contents(graph, "c") == expected
    assert _contents(_graph(MarsysCheckpointer(store)), "c") == expected
    saver.delete_thread("c")  # a deleted fork is forgotten by its source...
    saver.delete_thread("a")  # ...so deleting the source writes nothing for it
    assert store.list_keys("langgraph") == []
    with pytest.raises(ValueError, match="source"):
        saver.copy_thread(None, "x")  # type: ignore[arg-type]


# ---------------------------------------------------------------- records: one per checkpoint
class _TopicState(MessagesState):
    topic: str


def _topic_graph(saver: MarsysCheckpointer) -> Any:
    def reply(state: _TopicState) -> dict[str, Any]:
        return {"messages": [AIMessage(f"on {state['topic']}")]}

    builder = StateGraph(_TopicState)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    builder.add_edge("reply", END)
    return builder.compile(checkpointer=saver)


@pytest.mark.parametrize("backing", ["memory", "sqlite"])
def test_pruning_keeps_values_the_latest_checkpoint_reads_from_pruned_ones(
    backing: str, tmp_path: Path
) -> None:
    # `topic` is written once, by the first invoke's checkpoints: pruning those must not
    # lose it (the value moves to a record of its own, in the same batch)
    store = InMemoryStore() if backing == "memory" else SQLiteStore(tmp_path / "t.db")
    saver = MarsysCheckpointer(store)
    graph = _topic_graph(saver)
    graph.invoke({"messages": [HumanMessage("q0")], "topic": "bikes"}, _cfg("t"))
    for i in range(1, 4):
        graph.invoke({"messages": [HumanMessage(f"q{i}")]}, _cfg("t"))
    saver.prune(["t"])
    assert len(list(saver.list(_cfg("t")))) == 1
    for reader in (saver, MarsysCheckpointer(store)):  # warm cache, then cold from the store
        values = _topic_graph(reader).get_state(_cfg("t")).values
        assert values["topic"] == "bikes"
        assert [m.content for m in values["messages"]][-2:] == ["q3", "on bikes"]
    out = graph.invoke({"messages": [HumanMessage("q4")]}, _cfg("t"))
    assert out["messages"][-1].content == "on bikes"
    store.close()


def test_values_read_back_are_fresh_objects() -> None:
    saver = MarsysCheckpointer(InMemoryStore())
    graph = _topic_graph(saver)
    graph.invoke({"messages": [HumanMessage("q")], "topic": "bikes"}, _cfg("t"))
    first = saver.get_tuple(_cfg("t"))
    assert first is not None
    first.checkpoint["channel_versions"].clear()
    first.checkpoint["channel_values"]["topic"] = "changed"
    first.metadata["step"] = 99
    again = saver.get_tuple(_cfg("t"))
    assert again is not None
    assert again.checkpoint["channel_values"]["topic"] == "bikes"
    assert again.checkpoint["channel_versions"]
    assert again.metadata["step"] != 99


def test_bookkeeping_per_turn_is_small() -> None:
    # a turn of _graph is 3 checkpoints, 2 tasks' writes and 2 messages; LangGraph's input
    # (the __start__ value and its write) holds the user message twice more
    store = InMemoryStore()
    graph = _graph(MarsysCheckpointer(store))
    for i in range(20):
        graph.invoke({"messages": [HumanMessage(f"q{i}")]}, _cfg("t"))
    records = store.load_messages(("langgraph", "t", "checkpoints"))
    kinds = [(m.structured_data or {}).get("k") for m in records]
    assert kinds.count("ckpt") == 60
    assert kinds.count("writes") == 40  # one record per task, not one per write
    assert "blob" not in kinds  # a checkpoint's values live in its own record
    per_turn = sum(len(m.model_dump_json()) for m in records) / 20
    assert per_turn < 4500, per_turn  # was ~8,000 bytes (a record per value and per write)


# ---------------------------------------------------------------- the same thread, reopened
def _echo_graph() -> StateGraph[Any]:
    def reply(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(f"you said: {state['messages'][-1].content}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    builder.add_edge("reply", END)
    return builder


def _readme_run(saver: Any) -> list[str]:
    """The README's checkpointer block: two turns on thread user-42."""
    graph = _echo_graph().compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": "user-42"}}
    graph.invoke({"messages": [("user", "hello")]}, config)
    out = graph.invoke({"messages": [("user", "still there?")]}, config)
    return [str(m.content) for m in out["messages"]]


def test_a_rerun_in_the_same_folder_continues_the_thread_as_langgraphs_saver_does(
    tmp_path: Path,
) -> None:
    # why the README block prints 8 messages on its second run: threads.db keeps the
    # thread, and the run continues it (what a checkpointer is for); LangGraph's own
    # SqliteSaver does the same, and a fresh folder prints 4
    runs: dict[str, list[list[str]]] = {"marsys": [], "sqlite": []}
    for _ in range(2):
        with SQLiteStore(tmp_path / "threads.db") as store:
            runs["marsys"].append(_readme_run(MarsysCheckpointer(store)))
            stored = store.load_messages(("langgraph", "user-42", "messages"))
        with SqliteSaver.from_conn_string(str(tmp_path / "langgraph.db")) as saver:
            runs["sqlite"].append(_readme_run(saver))
    turn = ["hello", "you said: hello", "still there?", "you said: still there?"]
    assert runs["marsys"] == runs["sqlite"] == [turn, turn + turn]
    assert len(stored) == 8  # each message once
    with SQLiteStore(tmp_path / "fresh.db") as store:
        assert _readme_run(MarsysCheckpointer(store)) == turn


def test_a_reopened_thread_does_not_duplicate_on_a_re_put_or_a_rerun_by_id(
    tmp_path: Path,
) -> None:
    config: Any = {"configurable": {"thread_id": "t"}}
    with SQLiteStore(tmp_path / "threads.db") as store:
        graph = _echo_graph().compile(checkpointer=MarsysCheckpointer(store))
        graph.invoke({"messages": [HumanMessage("hello", id="m1")]}, config)
    log = ("langgraph", "t", "messages")
    with SQLiteStore(tmp_path / "threads.db") as store:  # another process: nothing cached
        saver = MarsysCheckpointer(store)
        latest = saver.get_tuple(config)
        assert latest is not None
        before = [m.content for m in latest.checkpoint["channel_values"]["messages"]]
        assert before == ["hello", "you said: hello"]
        # the same checkpoint stored again (a retried put) adds nothing
        saver.put(
            latest.parent_config or config,
            latest.checkpoint,
            latest.metadata,
            latest.checkpoint["channel_versions"],
        )
        again = saver.get_tuple(config)
        assert again is not None
        assert again.checkpoint["id"] == latest.checkpoint["id"]
        assert [m.content for m in again.checkpoint["channel_values"]["messages"]] == before
        assert len(store.load_messages(log)) == 2
    with SQLiteStore(tmp_path / "threads.db") as store:
        graph = _echo_graph().compile(checkpointer=MarsysCheckpointer(store))
        # the same input message (same id) again: add_messages replaces it, no second copy
        out = graph.invoke({"messages": [HumanMessage("hello", id="m1")]}, config)
        contents = [m.content for m in out["messages"]]
        assert contents.count("hello") == 1
        assert contents == ["hello", "you said: hello", "you said: you said: hello"]
        assert len(store.load_messages(log)) == 3
