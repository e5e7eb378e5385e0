import subprocess
import sys
import textwrap
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from marsys_mem import ContextWindow, ConversationMemory, MarsysMemError, Message, ToolCall
from marsys_mem.config.load import load_config
from marsys_mem.config.models import MemoryConfig
from marsys_mem.exceptions import MessageNotFoundError
from marsys_mem.manager import MemoryManager
from marsys_mem.store import InMemoryStore, SQLiteStore


def _config(tmp_path: Path, **agents: dict) -> Path:
    import yaml

    data = {
        "version": 1,
        "store": {"backend": "sqlite", "path": "mem.db"},
        "defaults": {"retention": "session", "context": {"max_messages": 50}},
        "agents": agents
        or {
            "researcher": {"retention": "persistent"},
            "planner": {"retention": "session"},
            "scratch": {"retention": "single_run"},
        },
    }
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_defaults_work_with_no_arguments():
    with MemoryManager() as manager:
        mem = manager.memory("a")
        assert manager.memory("a") is mem
        assert manager.memory("a", branch="other") is not mem
        mem.add(Message.user("hi"))
        win = manager.context_for("a")
        assert isinstance(win, ContextWindow)
        assert [m.text for m in win.messages] == ["hi"]
        assert manager.context_for("a", provider="openai") == [{"role": "user", "content": "hi"}]
        assert isinstance(manager.store, InMemoryStore)


def test_memory_uses_the_agents_context_policy(tmp_path):
    path = _config(tmp_path, a={"context": {"max_messages": 2}})
    with MemoryManager.from_config(path) as manager:
        mem = manager.memory("a")
        for i in range(5):
            mem.add(Message.user(f"m{i}"))
        assert [m.text for m in manager.context_for("a").messages] == ["m3", "m4"]


def test_bad_names_are_rejected():
    with MemoryManager() as manager:
        for bad in ("", None, 3):
            with pytest.raises(ValueError, match="agent"):
                manager.memory(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="branch"):
            manager.memory("a", branch="")
        with pytest.raises(TypeError, match="query"):
            manager.context_for("a", query=5)  # type: ignore[arg-type]


def test_persistent_survives_a_new_manager_session_and_single_run_do_not(tmp_path):
    path = _config(tmp_path)
    with MemoryManager.from_config(path) as manager:
        manager.memory("researcher").add(Message.user("keep me"))
        manager.memory("planner").add(Message.user("session only"))
        manager.memory("scratch").add(Message.user("run only"))
    with MemoryManager.from_config(path) as manager:
        assert [m.text for m in manager.memory("researcher").read()] == ["keep me"]
        assert manager.memory("planner").read() == []
        assert manager.memory("scratch").read() == []
        # only the persistent key ever reached the file
        assert manager.store.list_keys() == [("default", "researcher", "main")]


def test_restart_in_a_new_process_sees_exactly_the_persistent_memories(tmp_path):
    path = _config(tmp_path)
    writer = textwrap.dedent(
        f"""
        from marsys_mem import Message
        from marsys_mem.manager import MemoryManager
        manager = MemoryManager.from_config({str(path)!r})
        for agent in ("researcher", "planner", "scratch"):
            manager.memory(agent).add(Message.user(agent + " fact", message_id=agent + "-1"))
        with manager.run("scratch") as run:
            run.input(Message.user("scratch in run"))
        with manager.run("researcher") as run:
            run.output(Message.assistant("researcher answer", message_id="researcher-2"))
        manager.close()
        """
    )
    subprocess.run([sys.executable, "-c", writer], check=True, timeout=120)
    reader = textwrap.dedent(
        f"""
        import json
        from marsys_mem.manager import MemoryManager
        manager = MemoryManager.from_config({str(path)!r})
        out = {{a: [m.message_id for m in manager.memory(a).read()]
               for a in ("researcher", "planner", "scratch")}}
        out["keys"] = manager.store.list_keys()
        print(json.dumps(out))
        manager.close()
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", reader], check=True, capture_output=True, text=True, timeout=120
    )
    import json

    seen = json.loads(result.stdout)
    assert seen["researcher"] == ["researcher-1", "researcher-2"]
    assert seen["planner"] == []
    assert seen["scratch"] == []
    assert seen["keys"] == [["default", "researcher", "main"]]
    # and the raw file holds no session or single_run text at all
    raw = (tmp_path / "mem.db").read_bytes()
    wal = tmp_path / "mem.db-wal"
    raw += wal.read_bytes() if wal.exists() else b""
    assert b"planner fact" not in raw
    assert b"scratch" not in raw


def test_single_run_memory_is_cleared_when_the_run_ends(tmp_path):
    with MemoryManager.from_config(_config(tmp_path)) as manager:
        with manager.run("scratch") as run:
            run.input(Message.user("temp"))
            assert len(manager.memory("scratch")) == 1
        assert manager.memory("scratch").read() == []
        snap = manager.load_run(run.run_id)
        assert snap is not None
        assert [m.text for m in snap.messages] == ["temp"]
        # the snapshot of a non-persistent agent stays in process
        assert manager.store.load_run(run.run_id) is None


def test_end_session_drops_session_memories_and_keeps_persistent(tmp_path):
    with MemoryManager.from_config(_config(tmp_path)) as manager:
        manager.memory("researcher").add(Message.user("r"))
        planner = manager.memory("planner")
        planner.add(Message.user("p"))
        manager.end_session()
        assert len(planner) == 0
        assert manager.memory("planner").read() == []
        assert [m.text for m in manager.memory("researcher").read()] == ["r"]
        manager.start_session()
        assert [m.text for m in manager.memory("researcher").read()] == ["r"]


def test_write_through_is_durable_when_add_returns(tmp_path):
    path = _config(tmp_path)
    manager = MemoryManager.from_config(path)
    manager.memory("researcher").add(Message.user("durable", message_id="d1"))
    with SQLiteStore(tmp_path / "mem.db") as other:
        assert [m.message_id for m in other.load_messages(("default", "researcher", "main"))] == [
            "d1"
        ]
    manager.close()


def test_buffered_writes_reach_the_store_on_flush_and_close(tmp_path):
    path = _config(tmp_path)
    key = ("default", "researcher", "main")
    manager = MemoryManager.from_config(path, write_through=False)
    mem = manager.memory("researcher")
    mem.add_many([Message.user(f"m{i}") for i in range(5)])
    with SQLiteStore(tmp_path / "mem.db") as other:
        assert other.count_messages(key) == 0
        manager.flush()
        assert other.count_messages(key) == 5
        mem.add(Message.user("late"))
        manager.close()
        assert other.count_messages(key) == 6


def test_remove_trim_and_clear_are_mirrored_in_the_store(tmp_path):
    path = _config(tmp_path, r={"retention": "persistent"})
    key = ("default", "r", "main")
    with MemoryManager.from_config(path) as manager:
        mem = manager.memory("r")
        ids = mem.add_many([Message.user(f"m{i}" * 20) for i in range(10)])
        mem.remove(ids[0])
        assert manager.store.count_messages(key) == 9
        from marsys_mem import ContextPolicy

        mem.context(ContextPolicy(max_messages=4, strategy="trim_oldest"))
        assert [m.message_id for m in manager.store.load_messages(key)] == ids[-4:]
        mem.clear()
        assert manager.store.count_messages(key) == 0


def test_a_failing_store_leaves_the_memory_unchanged(tmp_path):
    path = _config(tmp_path, r={"retention": "persistent"})
    manager = MemoryManager.from_config(path)
    mem = manager.memory("r")
    mem.add(Message.user("ok"))
    manager.store.close()  # every later store call fails
    with pytest.raises(MarsysMemError):
        mem.add(Message.user("lost?"))
    assert [m.text for m in mem.read()] == ["ok"]
    manager.closed = True


def test_storage_stays_at_the_bound_over_a_long_run(tmp_path):
    path = _config(tmp_path, r={"retention": "persistent", "max_stored_messages": 50})
    key = ("default", "r", "main")
    with MemoryManager.from_config(path, retention_every=25) as manager:
        mem = manager.memory("r")
        mem.add(Message.system("rules"))
        peak = 0
        for i in range(600):
            mem.add(Message.user(f"message {i}"))
            if i % 10 == 0:
                peak = max(peak, manager.store.count_messages(key))
            assert len(mem) <= 50
        assert peak <= 50
        stored = manager.store.load_messages(key)
        assert len(stored) == 50
        assert stored[0].text == "rules"  # protected messages go last
        assert stored[-1].text == "message 599"
        manager.apply_retention()
        # The memory holds the newest of what the store holds (it drops in chunks of 5).
        kept = [m.message_id for m in mem.read()]
        stored_ids = [m.message_id for m in stored]
        assert 46 <= len(kept) <= 50
        assert kept == [stored_ids[0], *stored_ids[len(stored_ids) - len(kept) + 1 :]]


def test_ttl_is_enforced_in_store_and_memory(tmp_path):
    path = _config(tmp_path, r={"retention": "persistent", "ttl": "1d"})
    key = ("default", "r", "main")
    old = datetime.now(UTC) - timedelta(days=3)
    with MemoryManager.from_config(path) as manager:
        mem = manager.memory("r")
        mem.add(Message.system("rules", timestamp=old))
        mem.add_many([Message.user(f"old {i}", timestamp=old) for i in range(5)])
        mem.add(Message.user("fresh"))
        removed = manager.apply_retention("r")
        assert removed == 5
        assert [m.text for m in manager.store.load_messages(key)] == ["rules", "fresh"]
        assert [m.text for m in mem.read()] == ["rules", "fresh"]


def test_session_memories_are_bounded_too():
    config = MemoryConfig.model_validate(
        {"version": 1, "agents": {"a": {"max_stored_messages": 3}}}
    )
    with MemoryManager(config) as manager:
        mem = manager.memory("a")
        mem.add_many([Message.user(str(i)) for i in range(10)])
        assert [m.text for m in mem.read()] == ["7", "8", "9"]  # bounded as it appends
        assert manager.apply_retention() == 0


def test_run_snapshot_records_messages_usage_and_errors(tmp_path):
    with MemoryManager.from_config(_config(tmp_path)) as manager:
        with manager.run("researcher", metadata={"task": "q4"}) as run:
            run.input(Message.user("Q4 growth?"))
            call = ToolCall(id="c1", name="search", arguments={"q": "q4"})
            run.output(Message.assistant(None, tool_calls=[call]))
            run.input(Message.tool("12%", tool_call_id="c1"))
            run.output(Message.assistant("12%"))
            run.add_usage(prompt_tokens=100, completion_tokens=10)
            run.add_usage(prompt_tokens=50)
        snap = manager.store.load_run(run.run_id)
        assert snap is not None
        assert snap.status == "ok"
        assert snap.usage == {"prompt_tokens": 150, "completion_tokens": 10}
        assert [m.text for m in snap.input_messages] == ["Q4 growth?", "12%"]
        assert [m.role for m in snap.output_messages] == ["assistant", "assistant"]
        assert snap.ended_at is not None
        assert snap.ended_at >= snap.started_at
        assert snap.metadata == {"task": "q4"}

        started = []

        def failing_run() -> None:
            with manager.run("researcher") as failed:
                started.append(failed)
                failed.input(Message.user("x"))
                raise RuntimeError("boom")

        with pytest.raises(RuntimeError, match="boom"):
            failing_run()
        bad = manager.load_run(started[0].run_id)
        assert bad is not None
        assert bad.status == "error"
        assert bad.error == "RuntimeError: boom"
        with pytest.raises(ValueError, match="usage"):
            run.add_usage(prompt_tokens=-1)


def test_run_chains_continue_and_branches_stay_apart(tmp_path):
    with MemoryManager.from_config(_config(tmp_path)) as manager:
        with manager.run("researcher") as root:
            root.input(Message.user("root question"))
            root.output(Message.assistant("root answer"))
        with manager.run("researcher", parent_id=root.run_id) as left:
            assert [m.text for m in left.memory.read()] == ["root question", "root answer"]
            left.input(Message.user("left"))
        with manager.run("researcher", parent_id=root.run_id) as right:
            assert [m.text for m in right.memory.read()] == ["root question", "root answer"]
            right.input(Message.user("right"))
        with manager.run("researcher", parent_id=left.run_id) as deeper:
            deeper.input(Message.user("deeper"))
        texts = [m.text for m in manager.history(deeper.run_id)]
        assert texts == ["root question", "root answer", "left", "deeper"]
        assert "right" not in texts
        assert [m.text for m in manager.history(right.run_id)][-1] == "right"
        # the agent's own memory only saw the root run
        assert [m.text for m in manager.memory("researcher").read()] == [
            "root question",
            "root answer",
        ]
        assert manager.store.list_runs(parent_id=root.run_id) == [left.run_id, right.run_id]
        with pytest.raises(MessageNotFoundError):
            manager.run("researcher", parent_id="nope")


def test_run_chains_of_session_agents_work_in_process(tmp_path):
    with MemoryManager.from_config(_config(tmp_path)) as manager:
        with manager.run("planner") as root:
            root.input(Message.user("plan"))
        with manager.run("planner", parent_id=root.run_id) as child:
            child.output(Message.assistant("done"))
        assert [m.text for m in manager.history(child.run_id)] == ["plan", "done"]
        assert manager.store.load_run(root.run_id) is None


async def test_async_run_and_context(tmp_path):
    async def summarise(messages):
        return "summary of " + str(len(messages))

    config = load_config(_config(tmp_path))
    async with _amanager(config, summarise) as manager:
        async with manager.run("scratch") as run:
            for i in range(30):
                run.input(Message.user(f"turn {i} " * 10))
            from marsys_mem import ContextPolicy

            win = await run.memory.acontext(
                ContextPolicy(max_tokens=200, strategy="summarize", keep_recent=2)
            )
            assert win.summary is not None
            assert win.summary.text.endswith('- "summary of 28"')
        assert manager.memory("scratch").read() == []
        await manager.aflush()


class _amanager:
    def __init__(self, config, summarizer):
        self.manager = MemoryManager(config, summarizer=summarizer)

    async def __aenter__(self):
        return self.manager

    async def __aexit__(self, *exc):
        await self.manager.aclose()


def test_closed_manager_refuses_work():
    manager = MemoryManager()
    manager.close()
    manager.close()  # idempotent
    with pytest.raises(MarsysMemError, match="closed"):
        manager.memory("a")


def test_stored_tool_results_whose_call_expired_still_load(tmp_path):
    path = _config(tmp_path, r={"retention": "persistent"})
    key = ("default", "r", "main")
    with SQLiteStore(tmp_path / "mem.db") as store:
        store.append_messages(key, [Message.tool("orphaned", tool_call_id="gone")])
    with MemoryManager.from_config(path) as manager:
        mem = manager.memory("r")
        assert len(mem) == 1
        assert manager.context_for("r").messages == ()  # orphans are never sent
        with pytest.raises(MarsysMemError):
            mem.add(Message.tool("x", tool_call_id="also-gone"))  # strict again


# ---------------------------------------------------------------------- bounds (issue 9.4)
def _bounded(retention: str, **extra: object) -> MemoryConfig:
    agent = {"retention": retention, "max_stored_messages": 100, **extra}
    return MemoryConfig.model_validate({"version": 1, "agents": {"a": agent}})


@pytest.mark.parametrize("retention", ["session", "single_run", "persistent"])
def test_a_memory_never_holds_more_than_its_bound(retention: str) -> None:
    """A session agent with max_stored_messages: 100 once kept 200,000 messages."""
    with MemoryManager(_bounded(retention)) as manager:
        mem = manager.memory("a")
        mem.add(Message.system("rules"))
        sizes = []
        for i in range(3000):
            mem.add(Message.user(f"message {i}"))
            sizes.append(len(mem))
            assert mem.get_recent(1)[0].text == f"message {i}"
        assert max(sizes) == 100  # never more; drops 10 at once when full (a tenth)
        assert min(sizes[200:]) == 91
        assert mem.read()[0].text == "rules"  # protected messages go last
        # A batch larger than the bound: its newest messages stay, as in the stores.
        ids = mem.add_many([Message.user(f"batch {i}") for i in range(250)])
        assert len(mem) <= 100
        assert [m.message_id for m in mem.read()][-50:] == ids[-50:]
        if retention == "persistent":
            stored = manager.store.load_messages(manager.key("a"))
            assert len(stored) == 100
            assert [m.message_id for m in stored][-99:] == ids[-99:]


def test_session_ttl_is_applied_while_appending() -> None:
    old = datetime.now(UTC) - timedelta(days=3)
    config = MemoryConfig.model_validate(
        {"version": 1, "agents": {"a": {"retention": "session", "ttl": "1d"}}}
    )
    with MemoryManager(config, retention_every=5) as manager:
        mem = manager.memory("a")
        mem.add(Message.system("rules", timestamp=old))
        mem.add_many([Message.user(f"old {i}", timestamp=old) for i in range(3)])
        for i in range(5):
            mem.add(Message.user(f"new {i}"))
        assert [m.text for m in mem.read()] == ["rules"] + [f"new {i}" for i in range(5)]


def test_two_processes_on_one_file_share_the_bound(tmp_path: Path) -> None:
    """Two managers (two connections, as two processes) on one file: the store counts.

    Each manager once counted only its own appends, so the table grew past the bound.
    """
    path = _config(tmp_path, r={"retention": "persistent", "max_stored_messages": 30})
    key = ("default", "r", "main")
    with (
        MemoryManager.from_config(path) as one,
        MemoryManager.from_config(path) as two,
        SQLiteStore(tmp_path / "mem.db") as reader,
    ):
        mems = [one.memory("r"), two.memory("r")]
        counts = []
        for i in range(200):
            mems[i % 2].add(Message.user(f"{i}", message_id=f"id{i}"))
            counts.append(reader.count_messages(key))
        assert max(counts) == 30
        stored = [m.message_id for m in reader.load_messages(key)]
        assert stored == [f"id{i}" for i in range(170, 200)]
        assert reader.integrity_check() == "ok"


def test_buffered_writes_keep_only_what_the_bound_would_keep(tmp_path: Path) -> None:
    path = _config(tmp_path, r={"retention": "persistent", "max_stored_messages": 20})
    key = ("default", "r", "main")
    with MemoryManager.from_config(path, write_through=False) as manager:
        mem = manager.memory("r")
        mem.add(Message.system("rules", message_id="rules"))
        for i in range(2000):
            mem.add(Message.user(f"{i}", message_id=f"id{i}"))
            assert len(manager._sinks[("r", "main")].writer.pending) <= 20 + 2
        assert manager.store.count_messages(key) == 0
        manager.flush()
        stored = [m.message_id for m in manager.store.load_messages(key)]
        assert stored == ["rules"] + [f"id{i}" for i in range(1981, 2000)]


def test_attached_memories_are_bounded_too() -> None:
    config = MemoryConfig.model_validate(
        {"version": 1, "agents": {"a": {"max_stored_messages": 10}}}
    )
    with MemoryManager(config) as manager:
        source = ConversationMemory([Message.user(str(i)) for i in range(50)])
        manager.attach_memory("a", "fork", source.fork())
        mem = manager.memory("a", "fork")
        assert [m.text for m in mem.read()] == [str(i) for i in range(40, 50)]
        mem.add(Message.user("next"))
        assert len(mem) == 10
        assert mem.read()[-1].text == "next"
        assert len(source) == 50  # the fork's parent is untouched


def test_a_bound_may_split_a_tool_call_from_its_result_but_never_sends_an_orphan() -> None:
    """Like the stores, the bound drops the oldest messages one by one; the window
    built from what is left never starts with a tool result whose call is gone."""
    config = MemoryConfig.model_validate(
        {"version": 1, "agents": {"a": {"max_stored_messages": 3}}}
    )
    with MemoryManager(config) as manager:
        mem = manager.memory("a")
        mem.add(Message.system("rules"))
        mem.add(Message.user("weather?"))
        call = ToolCall(id="c1", name="weather", arguments={})
        mem.add(Message.assistant(None, tool_calls=[call]))
        mem.add(Message.tool("72F", tool_call_id="c1", name="weather"))
        mem.add(Message.assistant("It is 72F."))
        assert [m.role for m in mem.read()] == ["system", "tool", "assistant"]
        sent = manager.context_for("a").messages
        assert [m.role for m in sent] == ["system", "assistant"]


@pytest.mark.parametrize("retention", ["session", "persistent"])
def test_the_bound_never_detaches_the_sink_or_calls_it_back(retention: str) -> None:
    """Issue 10: the sink once trimmed the memory from inside ``add``, detaching itself
    (``mem.sink = None``) and calling ``mem.remove`` while that add was still running."""
    with MemoryManager(_bounded(retention)) as manager:
        mem = manager.memory("a")
        sink = mem.sink
        assert sink is not None
        during: list[object] = []
        manager.events.subscribe("remove", lambda _e: during.append(mem.sink))
        for i in range(300):
            mem.add(Message.user(f"message {i}"))
        assert len(during) >= 20  # the bound dropped chunks ...
        assert all(s is sink for s in during)  # ... with the sink in place all along
        assert len(mem) <= 100
        if retention == "persistent":
            assert manager.store.count_messages(manager.key("a")) == 100


def test_a_ttl_reaching_before_year_1_never_overflows_in_process() -> None:
    config = MemoryConfig.model_validate(
        {"version": 1, "agents": {"a": {"retention": "session", "ttl": "999999999d"}}}
    )
    with MemoryManager(config, retention_every=1) as manager:
        mem = manager.memory("a")
        mem.add(Message.user("ancient", timestamp=datetime(1, 1, 2, tzinfo=UTC)))
        mem.add(Message.user("now"))
        assert [m.text for m in mem.read()] == ["ancient", "now"]
        assert manager.apply_retention() == 0


@pytest.mark.parametrize("retention", ["session", "persistent"])
def test_eight_threads_never_push_a_memory_or_its_store_past_the_bound(
    retention: str, tmp_path: Path
) -> None:
    bound = 60
    config = MemoryConfig.model_validate(
        {
            "version": 1,
            "store": {"backend": "sqlite", "path": str(tmp_path / "m.db")},
            "agents": {"a": {"retention": retention, "max_stored_messages": bound}},
        }
    )
    seen: list[int] = []
    errors: list[BaseException] = []
    with MemoryManager(config, retention_every=7) as manager:
        mem = manager.memory("a")
        mem.add(Message.system("rules"))
        key = manager.key("a")
        start = threading.Barrier(9)
        done = threading.Event()

        def write(t: int) -> None:
            try:
                start.wait(30)
                for i in range(150):
                    if i % 10 == 0:
                        mem.add_many([Message.user(f"{t}/{i}/{j}") for j in range(3)])
                    else:
                        mem.add(Message.user(f"{t}/{i}"))
            except BaseException as exc:
                errors.append(exc)

        def sample() -> None:
            start.wait(30)
            while not done.is_set():
                seen.append(len(mem))
                if retention == "persistent":
                    seen.append(manager.store.count_messages(key))

        threads = [threading.Thread(target=write, args=(t,)) for t in range(8)]
        sampler = threading.Thread(target=sample)
        for th in [*threads, sampler]:
            th.start()
        for th in threads:
            th.join(120)
        done.set()
        sampler.join(30)
        assert errors == []
        assert seen
        assert max(seen) <= bound
        assert len(mem) <= bound
        assert mem.read()[0].text == "rules"  # protected: evicted last
        if retention == "persistent":
            stored = [m.message_id for m in manager.store.load_messages(key)]
            assert len(stored) == bound
            in_memory = [m.message_id for m in mem.read()]
            assert in_memory[1:] == stored[len(stored) - len(in_memory) + 1 :]
