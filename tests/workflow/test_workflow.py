"""Workflow files: every example runs, bad files fail before anything is written."""

import asyncio
import json
import logging
import re
import shutil
import tempfile
import textwrap
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import marsys_mem.workflow.runner as runner
from marsys_mem.cli.inspect import inspect_store, search_store
from marsys_mem.workflow import (
    AskStep,
    CallAgentStep,
    EndRunStep,
    RunStep,
    SayStep,
    ShareStep,
    Workflow,
    WorkflowError,
    WorkflowRunError,
    arun_workflow,
    detect_kind,
    load_workflow,
    run_workflow,
    validate_config_file,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "workflows"


@pytest.fixture(autouse=True)
def _data_home(tmp_path_factory, monkeypatch):
    """Default stores (no path, no ``--store``) go to a temp data folder, not the user's."""
    monkeypatch.setenv("MARSYS_MEM_HOME", str(tmp_path_factory.mktemp("marsys-home")))


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Single queries on shared CPUs: one torch thread is faster (see DESIGN.md)."""
    try:
        import torch
    except ImportError:  # the embeddings extra is optional
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def write(tmp_path: Path, text: str, name: str = "workflow.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def by_text(facts, needle):
    return [f for f in facts if needle in f.text]


# ---------------------------------------------------------------------------- examples
def test_every_example_is_tested():
    assert sorted(p.name for p in EXAMPLES.glob("*.yaml")) == [
        "chat_llm.yaml",  # tests/workflow/test_workflow_llm.py, against a loopback server
        "long_conversation.yaml",
        "research_team.yaml",
        "support_assistant.yaml",
    ]


def test_packaged_demo_is_the_example_file():
    packaged = ROOT / "marsys_mem" / "data" / "research_team.yaml"
    assert packaged.read_bytes() == (EXAMPLES / "research_team.yaml").read_bytes()


def test_research_team(tmp_path):
    report = run_workflow(EXAMPLES / "research_team.yaml", store_dir=tmp_path / "store")
    assert report.ok, report.to_text()
    assert [(b.name, b.status) for b in report.branches] == [
        ("main", "active"),
        ("market", "merged"),
        ("competitors", "merged"),
        ("regulation", "merged"),
    ]
    assert report.branches[1].parent == "main"
    assert report.branches[1].merged_into == ["main"]
    # the subtree-scoped budget fact reached the forks created after it (late joiners)
    (budget,) = by_text(report.facts, "2M EUR")
    assert budget.scope == "subtree"
    assert set(budget.reached) == {
        "planner@main",
        "market@market",
        "competitors@competitors",
        "regulation@regulation",
    }
    # a global fact reaches everyone at once; a branch fact only its branch until merged
    shared = [f for f in report.facts if f.merged_from is None]
    (standard,) = by_text(shared, "EN 17860")
    assert standard.scope == "global"
    assert len(standard.reached) == 4
    (market,) = by_text(shared, "61,000")
    assert market.reached == ["market@market"]
    # merges bring facts into main; on topic market_size the confident estimate wins
    merged = {f.text: f for f in report.facts if f.merged_from}
    assert merged[market.text].reached == ["planner@main"]
    (weak,) = by_text(list(merged.values()), "45,000")
    assert weak.reached == []
    planner = report.memory("planner", "main")
    texts = [f.text for f in planner.facts]
    assert any("61,000" in t for t in texts)
    assert not any("45,000" in t for t in texts)
    assert {f.source_agent for f in planner.facts} == {
        "planner",
        "market",
        "competitors",
        "regulation",
    }
    assert [(m.child, m.strategy, m.facts) for m in report.merges] == [
        ("market", "summary", 1),
        ("competitors", "facts", 2),
        ("regulation", "summary", 1),
    ]
    # summaries hold the branch's work, not its system prompt
    assert "Estimate the Dutch" in report.merges[0].summary
    assert "You size markets" not in report.merges[0].summary
    # answers come from the facts the planner received
    asks = report.asks
    assert [a.line for a in asks] == [93, 94, 95]
    assert "61,000" in asks[0].answer
    assert asks[0].answer_source == "fact from market@market"
    assert "EN 17860" in asks[1].answer
    assert all(a.facts == 4 and a.context_tokens <= 1600 for a in asks)
    window = planner.window
    assert window is not None
    assert window.tokens <= 1600
    assert window.preview[0].role == "system"
    assert window.preview[0].part == "message"
    assert any(p.part == "shared_facts" for p in window.preview)
    assert any(p.pinned for p in window.preview)
    # the text report shows all of it
    text = report.to_text()
    for needle in (
        "== Branches",
        "└─ regulation",
        "== Facts shared (9)",
        "== Merges",
        "== Questions (3)",
        "✓ '61,000'",
        "planner@main",
    ):
        assert needle in text, needle
    data = json.loads(report.to_json())
    assert data["ok"] is True
    assert data["asks"][0]["expect"] == ["61,000"]


def test_support_assistant_remembers_across_sessions(tmp_path):
    store = tmp_path / "store"
    report = run_workflow(EXAMPLES / "support_assistant.yaml", store_dir=store)
    assert report.ok, report.to_text()
    assert report.sessions == 2
    assistant = report.memory("assistant")
    assert assistant.retention == "persistent"
    assert assistant.stored == assistant.messages == 16  # prompt + 7 turns + ... all in SQLite
    assert assistant.window.dropped > 0  # session 1 left the 8-message window...
    contact, ticket = report.asks[1], report.asks[2]
    assert contact.retrieved >= 1  # ...and came back through retrieval
    assert "maria.lopez@example.com" in contact.answer
    assert any("maria.lopez@example.com" in h.text for h in contact.hits)
    assert "RMA-2291" in ticket.answer
    # triage's session memory did not survive the restart: only its system prompt is left
    triage = report.memory("triage")
    assert triage.retention == "session"
    assert triage.messages == 1
    assert triage.stored is None
    assert report.asks[3].answer is None
    # RAG and episodic recall both find some messages: each is one hit, labelled with its
    # relevance (a probability: several near 1), the one that is the best match marked
    for ask in report.asks:
        assert len({h.text for h in ask.hits}) == len(ask.hits), ask.hits
    text = report.to_text()
    assert "relevance: the chance it is" in text
    assert "  = best match" in text
    assert re.search(r"hit 1:  relevance \d\.\d\d  user: ", text), text

    # a new run appended on the same store starts from everything the first one kept
    # (a plain rerun is idempotent: tests/workflow/test_rerun.py)
    again = run_workflow(EXAMPLES / "support_assistant.yaml", store_dir=store, append=True)
    assert again.memory("assistant").stored == 2 * 16 - 1  # the prompt is not repeated
    summary = inspect_store(store)
    (conv,) = summary.conversations
    assert (conv.agent, conv.branch, conv.messages, conv.runs) == ("assistant", "main", 31, 4)
    assert {i.kind for i in summary.internal} >= {"rag", "episodic"}
    hits, how = search_store(store, "email address of the customer", k=3)
    assert how.startswith("hybrid") or how.startswith("bm25")
    assert any("maria.lopez@example.com" in h.text for h in hits)


def test_long_conversation_is_summarised(tmp_path):
    report = run_workflow(EXAMPLES / "long_conversation.yaml", store_dir=tmp_path / "s")
    assert report.ok, report.to_text()
    assert report.steps == 124
    planner = report.memory("planner")
    assert planner.messages == 163
    window = planner.window
    assert window.strategy == "summarize"
    assert window.tokens <= 600
    assert window.dropped > 100
    assert window.summary
    assert "Stop 1: Lisbon" in window.summary
    assert [p.part for p in window.preview].count("summary") == 1
    assert any(p.pinned and "3000 EUR" in p.text for p in window.preview)
    assert "summary in planner@main" in report.to_text()
    assert report.asks[1].answer == "My sister Clara joins me for the last stop."


def test_examples_run_bm25_only_without_the_embeddings_extra(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(runner, "_EMBEDDER", {"default": None})
    with caplog.at_level(logging.WARNING, logger="marsys_mem.workflow"):
        report = run_workflow(EXAMPLES / "support_assistant.yaml", store_dir=tmp_path / "s")
    assert report.ok, report.to_text()
    assert report.retrieval == "BM25 only"
    assert len(report.notices) == 1
    assert "embeddings extra" in report.notices[0]
    assert "--index-url https://download.pytorch.org/whl/cpu" in report.notices[0]  # resolvable
    assert sum("BM25-only" in r.getMessage() for r in caplog.records) == 1
    assert "note       the embeddings extra" in report.to_text()


# ---------------------------------------------------------------------------- Python API
def test_workflow_built_in_python_runs_in_memory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    wf = Workflow(
        name="py",
        memory={
            "store": {"backend": "memory"},
            "agents": {"scratch": {"retention": "single_run"}},
        },
        agents=[{"name": "lead", "system": "You lead."}, "scratch", "writer"],
        steps=[
            SayStep(agent="lead", text="Write the intro."),
            CallAgentStep(caller="lead", callee="writer", request="Draft", response="Draft v1"),
            ShareStep(agent="writer", fact="The intro is drafted", scope="global"),
            RunStep(agent="scratch", steps=[SayStep(agent="scratch", text="temp note")]),
            SayStep(agent="scratch", text="another note"),
            EndRunStep(agent="scratch"),
            AskStep(agent="lead", question="Is the intro drafted?", expect="drafted"),
        ],
    )
    report = run_workflow(wf)
    assert report.ok
    assert report.store is None
    assert list(tmp_path.iterdir()) == []  # nothing written anywhere
    lead = report.memory("lead")
    assert lead.messages == 4  # prompt, request, agent call, agent response
    roles = [p.role for p in lead.window.preview]
    assert roles == ["system", "system", "user", "assistant", "agent_response"]
    writer = report.memory("writer")
    assert [p.role for p in writer.window.preview][-2:] == ["agent_call", "assistant"]
    assert report.memory("scratch").messages == 0  # single_run: cleared when its run ended
    assert report.asks[0].answer == "The intro is drafted"


def test_repeat_substitutes_and_counts(tmp_path):
    path = write(
        tmp_path,
        """
        memory: {store: {backend: memory}}
        agents: [a]
        steps:
          - repeat:
              times: 5
              items: [x, y]
              steps:
                - say: {agent: a, text: "turn {i} of {n}: {item}"}
        """,
    )
    report = run_workflow(path)
    texts = [p.text for p in report.memory("a").window.preview]
    assert texts == [f"turn {i} of 5: {'xy'[(i - 1) % 2]}" for i in range(1, 6)]
    assert report.steps == 5


async def test_arun_workflow_and_run_workflow_inside_a_loop(tmp_path):
    path = write(
        tmp_path,
        """
        memory: {store: {backend: memory}}
        agents: [a]
        steps: [{say: {agent: a, text: hi}}]
        """,
    )
    report = await arun_workflow(path)
    assert report.memory("a").messages == 1
    report = run_workflow(path)  # a running loop (e.g. Jupyter): runs on a worker thread
    assert report.memory("a").messages == 1


def test_default_store_is_the_user_data_folder_namespaced_by_the_workflow(
    tmp_path, monkeypatch
):
    # formerly .marsys_mem/ next to the workflow file, which wrote into source checkouts
    home = tmp_path / "home"
    monkeypatch.setenv("MARSYS_MEM_HOME", str(home))
    folder = tmp_path / "project"
    folder.mkdir()
    steps = "agents: [a]\nsteps: [{say: {agent: a, text: hi}}]\n"
    persistent = "memory: {defaults: {retention: persistent}}\n"
    path = write(folder, persistent + steps, "wf.yaml")
    report = run_workflow(path)
    assert report.store == str((home / "memory.db").resolve())
    assert report.namespace == "wf"  # the file's stem: the file sets no name
    assert (home / "memory.db").is_file()
    assert sorted(p.name for p in folder.iterdir()) == ["wf.yaml"]
    named = write(folder, "name: team/x\n" + persistent + steps)
    assert run_workflow(named).namespace == "team_x"
    assert sorted(p.name for p in folder.iterdir()) == ["wf.yaml", "workflow.yaml"]
    summary = inspect_store(home)
    assert summary.namespaces == ["team_x", "wf"]
    assert [(c.namespace, c.key, c.messages) for c in summary.conversations] == [
        ("team_x", "a@main", 1),
        ("wf", "a@main", 1),
    ]


def test_memory_config_file_is_relative_to_the_workflow(tmp_path, monkeypatch):
    monkeypatch.setenv("MARSYS_MEM_HOME", str(tmp_path / "home"))
    (tmp_path / "policies").mkdir()
    shutil.copy(ROOT / "examples" / "policies" / "team.yaml", tmp_path / "policies")
    path = write(
        tmp_path,
        """
        memory: {config: policies/team.yaml}
        agents: [researcher, planner]
        steps:
          - say: {agent: researcher, text: "Q4 revenue grew 12%"}
        """,
    )
    report = run_workflow(path)
    # the policy file's store has no path: the user's data folder, not the policy's folder
    assert report.store == str((tmp_path / "home" / "memory.db").resolve())
    assert not (tmp_path / "policies" / ".marsys_mem").exists()
    assert report.memory("researcher").retention == "persistent"
    assert report.memory("researcher").stored == 1
    assert report.memory("planner").window.max_tokens == 6000


def test_facts_are_recorded_in_the_store(tmp_path):
    store = tmp_path / "store"
    run_workflow(EXAMPLES / "research_team.yaml", store_dir=store)
    summary = inspect_store(store)
    assert summary.conversations == []  # every research agent has session retention
    texts = {(f.branch, f.text) for f in summary.facts}
    assert ("regulation", next(t for b, t in texts if "EN 17860" in t)) in texts
    assert any(f.merged_from == "market" and f.branch == "main" for f in summary.facts)


def test_a_failing_step_names_its_line(tmp_path):
    path = write(
        tmp_path,
        """
        memory:
          store: {backend: memory}
          defaults: {context: {max_tokens: 20}}
        agents: [{name: a, system: "A long prompt that cannot fit in twenty tokens at all, ever."}]
        steps:
          - say: {agent: a, text: hi}
          - ask: {agent: a, question: "hi?"}
        """,
    )
    with pytest.raises(
        WorkflowRunError, match=r"workflow.yaml:7: steps\[1\] \(ask a@main\): .*over by"
    ):
        run_workflow(path)


# ---------------------------------------------------------------------------- bad files
BAD = {
    "unknown agent": (
        """
        agents: [planner, researcher]
        steps:
          - say: {agent: planner, text: hi}
          - say:
              agent: resercher
              text: hello
        """,
        "workflow.yaml:5: steps[1].agent: unknown agent 'resercher' (did you mean 'researcher'?)",
    ),
    "unknown branch": (
        """
        agents: [planner]
        steps:
          - say: {agent: planner, text: hi, branch: mian}
        """,
        "workflow.yaml:3: steps[0].branch: unknown branch 'mian' (did you mean 'main'?)",
    ),
    "branch not yet forked": (
        """
        agents: [a]
        steps:
          - say: {agent: a, text: hi, branch: r1}
          - fork: {parent: main, child: r1}
        """,
        "workflow.yaml:3: steps[0].branch: unknown branch 'r1'; branches at this step: main",
    ),
    "merge into a descendant": (
        """
        agents: [planner, r]
        branches:
          - {name: main, agents: [planner]}
        steps:
          - fork: {parent: main, child: r1, agents: [r]}
          - fork: {parent: r1, child: r2, agents: [r]}
          - merge: {child: r1, into: r2}
        """,
        "workflow.yaml:7: steps[2].into: cannot merge 'r1' into 'r2': 'r2' descends from 'r1'",
    ),
    "merge cycle between siblings": (
        """
        agents: [planner, r]
        branches:
          - {name: main, agents: [planner]}
        steps:
          - fork: {parent: main, child: r1, agents: [r]}
          - fork: {parent: main, child: r2, agents: [r]}
          - merge: {child: r1, into: r2}
          - merge: {child: r2, into: r1}
        """,
        "workflow.yaml:8: steps[3].into: cannot merge 'r2' into 'r1': 'r1' was already merged "
        "into 'r2'",
    ),
    "fork of an unknown parent": (
        """
        agents: [a]
        steps:
          - fork: {parent: nope, child: r1}
        """,
        "workflow.yaml:3: steps[0].parent: unknown branch 'nope'",
    ),
    "duplicate branch": (
        """
        agents: [a]
        branches:
          - {name: main, agents: [a]}
          - {name: main, agents: [a]}
        """,
        "workflow.yaml:4: branches[1].name: duplicate branch name 'main' (first defined at line 3)",
    ),
    "fork onto an existing branch": (
        """
        agents: [a]
        steps:
          - fork: {parent: main, child: main}
        """,
        "workflow.yaml:3: steps[0].child: branch 'main' already exists",
    ),
    "branch parent listed later": (
        """
        agents: [a]
        branches:
          - {name: r1, parent: main, agents: [a]}
          - {name: main, agents: [a]}
        """,
        "workflow.yaml:3: branches[0].parent: unknown parent branch 'main' (a parent must be "
        "listed before its children)",
    ),
    "missing config file": (
        """
        memory: {config: policies/nope.yaml}
        agents: [a]
        """,
        "workflow.yaml:1: memory.config: config file not found: ",
    ),
    "bad YAML": (
        """
        agents: [a]
        steps:
          - say: {agent: a, text: "unclosed}
          - say: {agent: a, text: ok}
        """,
        "workflow.yaml:3: invalid YAML: while scanning a quoted scalar (line 3, column 27): "
        "found unexpected end of stream",
    ),
    "wrong field type": (
        """
        agents: [a]
        steps:
          - say: {agent: a, text: hi}
          - repeat:
              times: many
              steps: [{say: {agent: a, text: x}}]
        """,
        "workflow.yaml:5: steps[1].times: Input should be a valid integer, unable to parse string "
        "as an integer (got 'many')",
    ),
    "wrong type in a long-form step": (
        """
        agents: [a]
        steps:
          - {kind: say, agent: a, text: hi, pinned: maybe}
        """,
        "workflow.yaml:3: steps[0].pinned: Input should be a valid boolean",
    ),
    "missing field": (
        """
        agents: [a]
        steps:
          - say: {agent: a}
        """,
        "workflow.yaml:3: steps[0].text: Field required",
    ),
    "unknown field": (
        """
        agents: [a]
        steps:
          - say: {agent: a, text: hi, colour: red}
        """,
        "workflow.yaml:3: steps[0].colour: unknown field; expected one of: agent, text, role, "
        "pinned, name, branch",
    ),
    "unknown step kind": (
        """
        agents: [a]
        steps:
          - sya: {agent: a, text: hi}
        """,
        "workflow.yaml:3: steps[0]: unknown step kind 'sya' (did you mean 'say'?)",
    ),
    "bad inline memory config": (
        """
        memory:
          defaults:
            retention: forever
        agents: [a]
        """,
        "workflow.yaml:3: memory.defaults.retention: Input should be 'single_run', 'session' or "
        "'persistent' (got 'forever')",
    ),
    "ambiguous branch": (
        """
        agents: [a]
        steps:
          - fork: {parent: main, child: r1}
          - say: {agent: a, text: hi}
        """,
        "workflow.yaml:4: steps[1].agent: agent 'a' is on branches main, r1: say which with "
        "branch:",
    ),
    "agent not on the branch": (
        """
        agents: [a, b]
        branches: [{name: main, agents: [a]}]
        steps:
          - say: {agent: b, text: hi, branch: main}
        """,
        "workflow.yaml:4: steps[0].branch: agent 'b' is not on branch 'main' (its agents: a)",
    ),
    "error inside a repeat": (
        """
        agents: [a]
        steps:
          - repeat:
              times: 3
              steps:
                - fork: {parent: main, child: "r{i}"}
                - fork: {parent: main, child: r1}
        """,
        "workflow.yaml:7: steps[0].steps[1].child: branch 'r1' already exists (in repeat "
        "iteration 1/3)",
    ),
    "end_session inside a run": (
        """
        agents: [a]
        steps:
          - run:
              agent: a
              steps: [end_session]
        """,
        "workflow.yaml:5: steps[0].steps[0]: end_session cannot be inside a run block",
    ),
    "not a mapping": ("- just\n- a list\n", "workflow.yaml: a workflow file is a mapping"),
    "no agents": ("name: x\nsteps: []\n", "workflow.yaml:1: agents: Field required"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_workflow_gives_one_clear_error_and_writes_nothing(tmp_path, case):
    text, expected = BAD[case]
    path = write(tmp_path, text)
    store = tmp_path / "store"
    with pytest.raises(WorkflowError) as err:
        run_workflow(path, store_dir=store)
    message = str(err.value)
    assert expected in message
    assert len(message.splitlines()) == 1, message
    assert not store.exists()
    assert not (tmp_path / ".marsys_mem").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["workflow.yaml"]
    with pytest.raises(WorkflowError):
        validate_config_file(path)


def test_json_workflow_errors_have_lines(tmp_path):
    path = tmp_path / "wf.json"
    path.write_text(
        '{\n  "agents": ["a"],\n  "steps": [\n    {"say": {"agent": "b", "text": "x"}}\n  ]\n}\n'
    )
    with pytest.raises(WorkflowError, match=r"wf.json:4: steps\[0\].agent: unknown agent 'b'"):
        load_workflow(path)
    path.write_text('{"agents": ["a"],,}')
    with pytest.raises(WorkflowError, match=r"wf.json:1: invalid JSON"):
        load_workflow(path)


def test_missing_workflow_file(tmp_path):
    with pytest.raises(WorkflowError, match="workflow file not found"):
        run_workflow(tmp_path / "nope.yaml", store_dir=tmp_path / "s")
    assert list(tmp_path.iterdir()) == []


def test_errors_in_a_referenced_config_name_that_file_and_line(tmp_path):
    (tmp_path / "policy.yaml").write_text("version: 1\ndefaults:\n  ttl: soon\n")
    path = write(tmp_path, "memory: {config: policy.yaml}\nagents: [a]\n")
    with pytest.raises(WorkflowError, match=r"policy.yaml:3: defaults.ttl: invalid duration"):
        run_workflow(path)
    assert not (tmp_path / ".marsys_mem").exists()


def test_validate_config_file_detects_the_kind():
    kind, wf = validate_config_file(EXAMPLES / "research_team.yaml")
    assert kind == "workflow"
    assert wf.name == "research_team"
    for policy in ("team.yaml", "support-bot.toml", "ephemeral.json"):
        kind, _config = validate_config_file(ROOT / "examples" / "policies" / policy)
        assert kind == "config"
    assert detect_kind({"agents": ["a"]}) == "workflow"
    assert detect_kind({"agents": {"a": {}}}) == "config"


def test_workflow_schema_documents_steps():
    schema = Workflow.model_json_schema()
    assert {"version", "name", "memory", "transport", "agents", "branches", "steps"} <= set(
        schema["properties"]
    )
    text = json.dumps(schema)
    for kind in (
        "say",
        "tool",
        "call_agent",
        "share",
        "fork",
        "merge",
        "run",
        "end_run",
        "end_session",
        "ask",
        "facts",
        "repeat",
    ):
        assert f'"const": "{kind}"' in text, kind


def test_ask_reports_unmet_expectations(tmp_path):
    path = write(
        tmp_path,
        """
        memory: {store: {backend: memory}}
        agents: [a]
        steps:
          - say: {agent: a, text: "The sky is blue"}
          - ask: {agent: a, question: "What colour is the sky?", expect: [blue, green]}
        """,
    )
    report = run_workflow(path)
    (ask,) = report.asks
    assert ask.found == ["blue"]
    assert ask.missing == ["green"]
    assert not ask.ok
    assert not report.ok
    assert "✗ 'green'" in report.to_text()
    assert "FAILED" in report.to_text()


def test_run_workflow_progress_callback(tmp_path):
    path = write(
        tmp_path,
        """
        memory: {store: {backend: memory}}
        agents: [a]
        steps:
          - run:
              agent: a
              steps: [{say: {agent: a, text: one}}, {say: {agent: a, text: two}}]
        """,
    )
    seen = []
    run_workflow(path, progress=lambda done, total, label: seen.append((done, total, label)))
    assert seen == [
        (0, 3, "say a@main"),
        (1, 3, "say a@main"),
        (1, 3, "say a@main"),
        (2, 3, "say a@main"),
        (3, 3, "run a@main"),
    ]


def test_asyncio_loop_is_not_left_running():
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()


# ---------------------------------------------------------------------------- property
@st.composite
def random_steps(draw):
    """Mostly plausible steps (names that exist), sometimes a wrong name."""
    branches = ["main"]

    def pick(options, wrong):
        if draw(st.integers(0, 24)) == 0:
            return wrong
        return draw(st.sampled_from(options))

    steps = []
    for _ in range(draw(st.integers(0, 10))):
        kind = draw(st.sampled_from(["say", "share", "ask", "fork", "merge", "end_session"]))
        agent = pick(["a", "b"], "zz")
        if kind == "say":
            step = {"agent": agent, "text": "hello"}
        elif kind == "share":
            scope = draw(st.sampled_from(["branch", "subtree", "lineage", "global"]))
            step = {"agent": agent, "fact": f"fact {len(steps)}", "scope": scope}
        elif kind == "ask":
            step = {"agent": agent, "question": "hello?"}
        elif kind == "fork":
            child = pick(
                [f"r{len(branches)}", f"r{len(branches)}"], draw(st.sampled_from(branches))
            )
            step = {"parent": pick(branches, "nope"), "child": child}
            if draw(st.booleans()):
                step["agents"] = draw(st.lists(st.sampled_from(["a", "b"]), max_size=2))
            branches.append(child)
        elif kind == "merge" and len(branches) > 1:
            child = pick(branches[1:], "nope")
            step = {
                "child": child,
                "into": pick([b for b in branches if b != child] or branches, "nope"),
                "strategy": draw(st.sampled_from(["facts", "summary", "messages"])),
            }
        elif kind == "end_session":
            step = {"restart": draw(st.booleans())}
        else:
            kind, step = "say", {"agent": agent, "text": "hi"}
        if kind in ("say", "share", "ask") and draw(st.booleans()):
            step["branch"] = pick(branches, "nope")
        steps.append({kind: step})
    return steps


@settings(max_examples=60, deadline=None)
@given(random_steps())
def test_a_workflow_either_fails_validation_cleanly_or_runs(steps):
    """Validation is complete: what it accepts runs; what it rejects names a line."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = folder / "wf.yaml"
        path.write_text(yaml.safe_dump({"agents": ["a", "b"], "steps": steps}))
        store = folder / "store"
        error: WorkflowError | None = None
        try:
            report = run_workflow(path, store_dir=store)
        except WorkflowError as exc:
            error = exc
        if error is not None:
            assert re.match(r"^\S*wf\.yaml:\d+: \S", str(error)), str(error)
            assert not store.exists()
            assert [p.name for p in folder.iterdir()] == ["wf.yaml"]
        else:
            assert report.steps == len(steps)
            assert store.is_dir()
