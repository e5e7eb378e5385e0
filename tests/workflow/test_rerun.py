"""Rerunning a workflow on the same store is idempotent; ``append`` makes a new run.

Issue 28: a second run of a workflow with a persistent agent on the same store appended
everything again (16 -> 31 messages, ``search`` returning each hit twice), and unnamed
Python workflows shared one namespace where facts got "restated 3x" across unrelated runs.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from marsys_mem import MemoryManager
from marsys_mem.cli.inspect import inspect_store, search_store
from marsys_mem.cli.main import main
from marsys_mem.config.models import MemoryConfig
from marsys_mem.store.sqlite import SQLiteStore
from marsys_mem.testing.llm_server import ScriptedServer, echo_chat
from marsys_mem.workflow import Workflow, run_workflow
from marsys_mem.workflow.runner import workflow_namespace

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "examples" / "workflows" / "support_assistant.yaml"


@pytest.fixture(autouse=True)
def _data_home(tmp_path, monkeypatch):
    monkeypatch.setenv("MARSYS_MEM_HOME", str(tmp_path / "home"))


def _contents(db: Path) -> dict[tuple[str, str, str], list[tuple[str, str]]]:
    """Every key's messages as (id, text), and every run id (episodes included)."""
    with SQLiteStore(db, read_only=True) as store:
        out = {
            key: [(m.message_id, m.text) for m in store.load_messages(key)]
            for key in store.list_keys()
        }
        for ns in {k[0] for k in out}:
            out[(ns, "#runs", "")] = sorted((r, "") for r in store.list_runs(namespace=ns))
        return out


def test_rerunning_the_support_example_appends_nothing(tmp_path, capsys):
    store = tmp_path / "store"
    first = run_workflow(SUPPORT, store_dir=store)
    before = _contents(store / "memory.db")
    assert first.memory("assistant").stored == 16
    assert first.replayed == 0

    second = run_workflow(SUPPORT, store_dir=store)
    assert second.ok, second.to_text()
    assert second.memory("assistant").stored == 16
    assert second.replayed == 15  # every message a step writes (the system prompt is config)
    assert "15 messages written by an earlier run of this workflow" in second.to_text()
    assert _contents(store / "memory.db") == before  # the same messages, ids and runs

    summary = inspect_store(store)
    assert (summary.messages, summary.runs) == (16, 2)
    hits, _ = search_store(store, "contact email", k=5, mode="bm25")
    texts = [h.text for h in hits]
    assert len(texts) == len(set(texts)), texts  # each message once

    # an explicit new run appends (CLI --append, Python append=True)
    assert main(["run", str(SUPPORT), "--store", str(store), "-q", "--append"]) == 0
    capsys.readouterr()
    assert inspect_store(store).messages == 31
    third = run_workflow(SUPPORT, store_dir=store, append=True)
    assert third.memory("assistant").stored == 46
    assert third.replayed == 0


PERSISTENT = """
name: rerun_everything
memory:
  store: {backend: sqlite, path: mem.db}
  defaults:
    retention: persistent
    patterns: {embedder: hashing, rag: {k: 2}, facts: {subject: ana, debounce: 0}}
agents: [{name: lead, system: You lead.}, writer]
branches:
  - {name: main, agents: [lead, writer]}
steps:
  - say: {agent: lead, text: "Ana lives in Oslo."}
  - tool: {agent: lead, name: search, arguments: {q: oslo}, result: {found: 2}}
  - fork: {parent: main, child: draft, agents: [writer]}
  - say: {agent: writer, branch: draft, text: "Draft one."}
  - share: {agent: writer, branch: draft, fact: "The draft is done", scope: lineage}
  - merge: {child: draft, into: main, strategy: summary}
  - repeat:
      times: 2
      steps:
        - say: {agent: lead, text: "same text twice"}
        - say: {agent: lead, text: "same text twice"}
  - call_agent: {caller: lead, callee: writer, request: "Polish it", response: "Polished"}
  - run:
      agent: lead
      steps:
        - say: {agent: lead, text: "inside a run block"}
  - facts: {subject: ana, add: ["Ana likes tea", "Ana has a cat"], expect: tea}
  - end_session: {restart: true}
  - say: {agent: lead, text: "after the restart"}
  - ask: {agent: lead, question: "Where does Ana live?", expect: Oslo}
"""


def test_every_step_kind_is_idempotent_on_a_persistent_store(tmp_path):
    path = tmp_path / "wf.yaml"
    path.write_text(textwrap.dedent(PERSISTENT).lstrip())
    first = run_workflow(path)
    assert first.ok, first.to_text()
    before = _contents(tmp_path / "mem.db")
    # the prompt, 2 said, a tool call and its result, the merge summary, 2 calls, 4 repeated
    assert len(before[("default", "lead", "main")]) == 13
    stated = {f.text: f.reinforcements for s in first.subject_facts for f in s.facts}
    assert stated["Ana likes tea"] == 0

    for _ in range(2):
        again = run_workflow(path)
        assert again.ok, again.to_text()
        assert again.replayed > 0
        assert _contents(tmp_path / "mem.db") == before
        # nothing restated: the facts step's facts were not touched again
        assert not [f for s in again.subject_facts for f in s.facts if f.reinforcements]
        (check,) = again.fact_checks
        assert check.added == []
        assert check.ok

    run_workflow(path, append=True)
    after = _contents(tmp_path / "mem.db")
    assert len(after[("default", "lead", "main")]) > len(before[("default", "lead", "main")])


def test_an_ask_with_a_model_is_recorded_once(tmp_path):
    with ScriptedServer(echo_chat) as server:
        path = tmp_path / "wf.yaml"
        path.write_text(
            textwrap.dedent(
                f"""
                name: chat
                llm: {{model: m, base_url: '{server.url}/v1'}}
                memory:
                  store: {{backend: sqlite, path: mem.db}}
                  defaults: {{retention: persistent}}
                agents: [assistant]
                steps:
                  - say: {{agent: assistant, text: "I live in Lisbon."}}
                  - ask: {{agent: assistant, question: "Where do I live?", expect_sent: Lisbon}}
                """
            ).lstrip()
        )
        for _ in range(2):
            report = run_workflow(path)
            assert report.ok, report.to_text()
            assert report.asks[0].answer == "You said: Where do I live?"
        assert len(server.requests) == 2  # the model is asked on every run
    with SQLiteStore(tmp_path / "mem.db", read_only=True) as store:
        texts = [m.text for m in store.load_messages(("default", "assistant", "main"))]
    assert texts == ["I live in Lisbon.", "Where do I live?", "You said: Where do I live?"]


def _facts_workflow(fact: str) -> Workflow:
    return Workflow.model_validate(
        {
            "memory": {"defaults": {"patterns": {"embedder": "hashing"}}},
            "agents": ["a"],
            "steps": [{"facts": {"subject": "sam", "add": [fact], "expect": fact}}],
        }
    )


def test_an_unnamed_python_workflow_gets_a_namespace_of_its_own(tmp_path):
    tea, cats = _facts_workflow("Sam drinks tea"), _facts_workflow("Sam has two cats")
    assert workflow_namespace(tea) != workflow_namespace(cats)
    assert workflow_namespace(tea) == workflow_namespace(_facts_workflow("Sam drinks tea"))
    reports = [run_workflow(tea) for _ in range(3)] + [run_workflow(cats)]
    assert reports[0].store == reports[3].store  # the user's default store, shared
    assert reports[0].namespace == workflow_namespace(tea) != reports[3].namespace
    # the tea facts were stated once, never restated by the reruns
    learned = [f for s in reports[0].subject_facts for f in s.facts]
    assert [(f.text, f.reinforcements) for f in learned] == [("Sam drinks tea", 0)]
    for rerun in reports[1:3]:
        assert rerun.subject_facts == []
        assert rerun.fact_checks[0].added == []
        assert [f.text for f in rerun.fact_checks[0].known] == ["Sam drinks tea"]
    # the cats workflow sees only its own fact
    assert [f.text for f in reports[3].fact_checks[0].known] == ["Sam has two cats"]


def test_a_run_replayed_under_its_id_keeps_one_episode():
    config = MemoryConfig.model_validate(
        {"defaults": {"patterns": {"embedder": "hashing", "episodic": {"k": 2}}}}
    )
    with MemoryManager(config) as manager:
        for text in ("first", "second"):
            with manager.run("a", run_id="run-1") as run:
                run.add({"role": "user", "content": text})
        episodic = manager.patterns("a").episodic
        assert episodic is not None
        (episode,) = episodic.episodes()
        assert episode.metadata["run_id"] == "run-1"
        assert episode.ended_at is not None
        with manager.run("a") as run:  # a run without an id: a new episode
            run.add({"role": "user", "content": "third"})
        assert len(episodic.episodes()) == 2


TRIMMED = """
name: trimmed
memory:
  store: {backend: sqlite, path: mem.db}
  defaults:
    retention: persistent
    context: {max_messages: 4, strategy: trim_oldest}
agents: [a]
steps:
  - repeat:
      times: 6
      steps:
        - say: {agent: a, text: "message {i}"}
  - ask: {agent: a, question: "Which message came last?", expect_sent: "message 6"}
  - say: {agent: a, text: "the end"}
"""


def test_a_rerun_never_brings_back_what_was_trimmed_or_forgotten(tmp_path):
    path = tmp_path / "wf.yaml"
    path.write_text(textwrap.dedent(TRIMMED).lstrip())
    key = ("default", "a", "main")

    def texts() -> list[str]:
        with SQLiteStore(tmp_path / "mem.db", read_only=True) as store:
            return [m.text for m in store.load_messages(key)]

    assert run_workflow(path).ok
    kept = texts()
    assert kept == ["message 4", "message 5", "message 6", "the end"]  # trim_oldest deleted
    config = MemoryConfig.model_validate(
        {"store": {"backend": "sqlite", "path": str(tmp_path / "mem.db")},
         "defaults": {"retention": "persistent"}}
    )
    with MemoryManager(config) as manager:
        (gone,) = [m.message_id for m in manager.memory("a") if m.text == "message 5"]
        manager.forget("a", message_ids=[gone])
    for _ in range(2):
        report = run_workflow(path)
        assert report.ok, report.to_text()
        assert texts() == ["message 4", "message 6", "the end"]
