"""Two processes writing one LangGraph thread through MarsysCheckpointer (issue 25 item 8).

Each process runs a real graph (``MessagesState``, one node that answers the newest user
message) 30 times on the same thread of the same store: a SQLite file, or a PostgreSQL
schema. Whatever the interleaving, every invoke that returned is in the thread's final
state, and every invoke that did not return failed with :class:`ConflictError` naming the
thread; a writer that retries on it gets every turn in.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START, MessagesState, StateGraph

from marsys_mem.exceptions import ConflictError
from marsys_mem.integrations.langgraph import MarsysCheckpointer
from marsys_mem.store import InMemoryStore, SQLiteStore
from marsys_mem.store.base import MemoryStore
from marsys_mem.testing.postgres import PostgresServer

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
INVOKES = 30
_schemas = itertools.count()
THREAD = "shared-thread"

WORKER = textwrap.dedent(
    """
    import json, sys, time
    from langchain_core.messages import HumanMessage
    from langgraph.graph import END, START, MessagesState, StateGraph
    from marsys_mem.exceptions import ConflictError
    from marsys_mem.integrations.langgraph import MarsysCheckpointer

    kind, where, thread, tag, n, retry, start_at, out = sys.argv[1:9]
    if kind == "sqlite":
        from marsys_mem.store import SQLiteStore
        store = SQLiteStore(where)
    else:
        from marsys_mem.store.postgres import PostgresStore
        store = PostgresStore(where)

    def reply(state):  # answers the newest user turn not answered yet
        answered = {m.content for m in state["messages"] if m.type == "ai"}
        last = [m for m in state["messages"]
                if m.type == "human" and "re:" + m.id not in answered][-1]
        return {"messages": [("ai", "re:" + last.id)]}

    graph = (StateGraph(MessagesState).add_node("reply", reply)
             .add_edge(START, "reply").add_edge("reply", END)
             .compile(checkpointer=MarsysCheckpointer(store)))
    config = {"configurable": {"thread_id": thread}}
    while time.time() < float(start_at):
        time.sleep(0.005)
    results = []
    for i in range(int(n)):
        mid = f"{tag}-{i}"
        for attempt in range(200):
            try:
                graph.invoke({"messages": [HumanMessage(mid, id=mid)]}, config)
            except ConflictError as exc:
                results.append({"id": mid, "ok": False, "type": "ConflictError",
                                "error": str(exc)})
                if retry == "retry":
                    continue
            except Exception as exc:
                results.append({"id": mid, "ok": False, "type": type(exc).__name__,
                                "error": str(exc)})
            else:
                results.append({"id": mid, "ok": True})
            break
    store.close()
    with open(out, "w") as f:
        json.dump(results, f)
    """
)


@pytest.fixture
def postgres_dsn(postgres_server: PostgresServer) -> str:
    """A DSN whose search_path is a new, empty schema."""
    return postgres_server.create_schema(f"lg_concurrent{next(_schemas)}")


def _run_two(kind: str, where: str, tmp_path: Path, retry: bool) -> list[dict[str, Any]]:
    """Run two writer processes at once; every result line of both."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start_at = time.time() + 6.0  # both are importing langgraph by then: they start together
    procs = []
    for tag in ("p1", "p2"):
        out = tmp_path / f"{tag}.json"
        args = [kind, where, THREAD, tag, str(INVOKES), "retry" if retry else "once", str(start_at)]
        procs.append(
            (
                out,
                subprocess.Popen(
                    [sys.executable, str(script), *args, str(out)],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                ),
            )
        )
    results: list[dict[str, Any]] = []
    for out, proc in procs:
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stdout + stderr
        results += json.loads(out.read_text())
    return results


def _final_state(store: MemoryStore) -> list[Any]:
    saver = MarsysCheckpointer(store)
    saved = saver.get_tuple({"configurable": {"thread_id": THREAD}})
    assert saved is not None
    return list(saved.checkpoint["channel_values"]["messages"])


def _check(results: list[dict[str, Any]], messages: list[Any], retry: bool) -> None:
    ok = [r["id"] for r in results if r["ok"]]
    failed = [r for r in results if not r["ok"]]
    humans = [m.id for m in messages if isinstance(m, HumanMessage)]
    replies = [m.content for m in messages if isinstance(m, AIMessage)]
    lost = [i for i in ok if i not in humans or f"re:{i}" not in replies]
    assert not lost, f"{len(lost)} of {len(ok)} successful invokes are not in the state: {lost}"
    for r in failed:  # a lost race is said, clearly: which thread, what to do
        assert r["type"] == "ConflictError", r
        assert f"thread '{THREAD}'" in r["error"], r
        assert "run it again" in r["error"], r
    assert len(set(humans)) == len(humans), "a retried turn is in the state twice"
    if retry:
        assert sorted(ok) == sorted(f"p{p}-{i}" for p in (1, 2) for i in range(INVOKES))
        assert len(replies) == 2 * INVOKES


@pytest.mark.parametrize("retry", [False, True], ids=["once", "retry"])
def test_two_processes_sqlite(tmp_path: Path, retry: bool) -> None:
    path = tmp_path / "lg.db"
    SQLiteStore(path).close()  # created before the race: both open an existing store
    results = _run_two("sqlite", str(path), tmp_path, retry)
    with SQLiteStore(path) as store:
        _check(results, _final_state(store), retry)


def test_two_processes_postgres(tmp_path: Path, postgres_dsn: str) -> None:
    from marsys_mem.store.postgres import PostgresStore

    PostgresStore(postgres_dsn).close()  # the schema's tables exist before the race
    results = _run_two("postgres", postgres_dsn, tmp_path, retry=True)
    with PostgresStore(postgres_dsn) as store:
        _check(results, _final_state(store), retry=True)


# ---------------------------------------------------------------- one race, step by step
def _graph(saver: MarsysCheckpointer, during: list[Any] | None = None) -> Any:
    """The workers' graph; ``during``: callables run (once each) inside the next node."""

    def reply(state: MessagesState) -> dict[str, Any]:
        while during:
            during.pop(0)()
        answered = {m.content for m in state["messages"] if isinstance(m, AIMessage)}
        last = [
            m
            for m in state["messages"]
            if isinstance(m, HumanMessage) and f"re:{m.id}" not in answered
        ][-1]
        return {"messages": [AIMessage(f"re:{last.id}")]}

    builder = StateGraph(MessagesState).add_node("reply", reply)
    return builder.add_edge(START, "reply").add_edge("reply", END).compile(checkpointer=saver)


def _turn(graph: Any, mid: str) -> None:
    """One turn; each checkpoint stored before the next step (a deterministic order)."""
    graph.invoke({"messages": [HumanMessage(mid, id=mid)]}, CONFIG, durability="sync")


CONFIG: Any = {"configurable": {"thread_id": THREAD}}


@pytest.mark.parametrize("savers", ["one checkpointer", "two checkpointers"])
@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_a_run_overtaken_by_another_writer_raises(
    tmp_path: Path, backend: str, savers: str
) -> None:
    """Writer B completes a turn while A's node runs: A's invoke fails, B's turn stays.

    B runs in another thread of this process, through the same checkpointer or a second
    one on the same store (as another process would). A's retry then gets in too.
    """
    opened = InMemoryStore() if backend == "memory" else SQLiteStore(tmp_path / "lg.db")
    with opened as store:
        saver_a = MarsysCheckpointer(store)
        saver_b = saver_a if savers == "one checkpointer" else MarsysCheckpointer(store)
        during: list[Any] = []
        graph_a, graph_b = _graph(saver_a, during), _graph(saver_b)
        _turn(graph_a, "a-0")

        def b_writes() -> None:
            errors: list[BaseException] = []

            def b_turn() -> None:
                try:
                    _turn(graph_b, "b-0")
                except BaseException as exc:
                    errors.append(exc)

            worker = threading.Thread(target=b_turn)
            worker.start()
            worker.join()
            assert not errors, errors

        during.append(b_writes)
        with pytest.raises(ConflictError, match=f"thread '{THREAD}'.*run it again") as caught:
            _turn(graph_a, "a-1")
        assert "was not stored" in str(caught.value)
        contents = [m.content for m in _final_state(store)]
        assert contents == ["a-0", "re:a-0", "a-1", "b-0", "re:b-0"]  # B's turn is kept
        _turn(graph_a, "a-1")  # the retry: the same message id, answered now
        assert [m.content for m in _final_state(store)] == [*contents, "re:a-1"]


def test_time_travel_after_another_writer_is_not_a_conflict(tmp_path: Path) -> None:
    """A run from a checkpoint named by id forks the thread, whoever wrote since."""
    with SQLiteStore(tmp_path / "lg.db") as store:
        saver_a, saver_b = MarsysCheckpointer(store), MarsysCheckpointer(store)
        graph_a, graph_b = _graph(saver_a), _graph(saver_b)
        _turn(graph_a, "a-0")
        first = saver_a.get_tuple(CONFIG)
        assert first is not None
        _turn(graph_a, "a-1")
        _turn(graph_b, "b-0")
        graph_a.invoke({"messages": [HumanMessage("a-2", id="a-2")]}, first.config)
        assert [m.content for m in _final_state(store)] == ["a-0", "re:a-0", "a-2", "re:a-2"]


async def test_conformance_postgres_store(postgres_dsn: str) -> None:
    """LangGraph's conformance suite, the checkpointer on a PostgreSQL store."""
    from langgraph.checkpoint.conformance import checkpointer_test, validate

    from marsys_mem.store.postgres import PostgresStore

    @checkpointer_test(name="MarsysCheckpointer[PostgresStore]")
    async def factory() -> AsyncIterator[MarsysCheckpointer]:
        store = PostgresStore(postgres_dsn)
        saver = MarsysCheckpointer(store)
        for old in {t.config["configurable"]["thread_id"] for t in saver.list(None)}:
            saver.delete_thread(old)  # each of the suite's tests starts on an empty store
        yield saver
        store.close()

    report = await validate(factory)
    failures = {k: v.failures for k, v in report.results.items() if v.failures}
    assert report.passed_all_base(), failures
    assert report.conformance_level() == "FULL", failures


async def test_concurrent_async_runs_in_one_process(tmp_path: Path) -> None:
    """Ten ``ainvoke`` of one thread at once, one checkpointer: every turn is in, once.

    Each run is retried on ``ConflictError`` (what a lost race raises).
    """
    with SQLiteStore(tmp_path / "lg.db") as store:
        graph = _graph(MarsysCheckpointer(store))

        async def turn(mid: str) -> None:
            while True:
                try:
                    await graph.ainvoke({"messages": [HumanMessage(mid, id=mid)]}, CONFIG)
                except ConflictError:
                    continue
                return

        await asyncio.gather(*(turn(f"x-{i}") for i in range(10)))
        results = [{"id": f"x-{i}", "ok": True} for i in range(10)]
        messages = _final_state(store)
        _check(results, messages, retry=False)
        assert len(messages) == 20
