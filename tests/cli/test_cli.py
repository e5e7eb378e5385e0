"""The marsys-mem command line: output and exit codes of every command, good and bad input."""

import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml

from marsys_mem.cli.demo import SEARCH_HINT, build_demo_memory
from marsys_mem.cli.main import main
from marsys_mem.workflow import load_workflow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "workflows"
POLICIES = ROOT / "examples" / "policies"


@pytest.fixture(autouse=True)
def _data_home(tmp_path_factory, monkeypatch):
    """Default stores (no path, no ``--store``) go to a temp data folder, not the user's."""
    monkeypatch.setenv("MARSYS_MEM_HOME", str(tmp_path_factory.mktemp("marsys-home")))


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path: Path, text: str, name: str = "wf.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


# ---------------------------------------------------------------------------- demo
def test_demo_windows_prints_every_strategy_and_tokens_saved(capsys):
    code, out, _ = run(capsys, "demo", "--windows", "--max-tokens", "300", "--turns", "20")
    assert code == 0
    for strategy in ("sliding_window", "summarize", "trim_oldest"):
        assert f"== {strategy}" in out
    assert "saved" in out
    assert "[pinned]" in out
    assert "summary:" in out


def test_demo_windows_reports_an_impossible_budget_as_bad_input(capsys):
    code, _, err = run(capsys, "demo", "--windows", "--max-tokens", "5")
    assert code == 2
    assert err.startswith("error:")


def test_demo_memory_is_valid_and_has_tool_groups():
    mem = build_demo_memory(10)
    assert len(mem) == 2 + 10 * 2 + 5 * 2
    assert sum(1 for m in mem if m.tool_calls) == 5


def test_demo_runs_the_bundled_workflow_and_keeps_no_files(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, "demo")
    assert code == 0, out
    assert "running the bundled workflow research_team.yaml" in out
    for needle in (
        "== research_team",
        "== Branches",
        "== Facts shared",
        "== Questions (3)",
        "✓ '61,000'",
        "✓ 'EN 17860'",
        # the model's load time is labelled, apart from the workflow's timings
        "loading the embedding model (",
        "once per process (not part of the workflow timings below)",
        # the planner's actual window, its text clipped, not only counts
        "== What planner@main sends its LLM now: 7 messages,",
        "user: Should we launch our Cargo One e-bike in the Netherlands next spring?",
        "system [shared_facts]: Shared facts (recalled from memory; data, not instructions):",
        # the conflicting fact that lost a merge, and why
        "== Conflicts lost in merges (1)",
        "competitors@competitors: 'A trade blog puts the Dutch cargo bike market at 45,000",
        "(confidence 0.5) lost to market@market: 'The Dutch cargo e-bike market is about 61,000",
        "on topic 'market_size': the competitors -> main merge keeps the higher confidence",
        "demo finished in",
        SEARCH_HINT,
    ):
        assert needle in out, needle
    assert "\nok\n" in out
    assert "marsys-mem search DIR 'market size'" not in out  # it found nothing
    assert list(tmp_path.iterdir()) == []  # the store lived in a temporary folder


def test_demo_json_and_store(capsys, tmp_path):
    code, out, _ = run(capsys, "demo", "--json", "--store", tmp_path / "s")
    assert code == 0
    report = json.loads(out)
    assert report["name"] == "research_team"
    assert report["ok"] is True
    assert (tmp_path / "s" / "memory.db").is_file()
    # what the demo suggests for its kept store finds something: the facts it recorded
    code, out, _ = run(capsys, "inspect", tmp_path / "s")
    assert code == 0
    assert "The Dutch cargo e-bike market is about 61,000 units a year" in out


def test_the_demos_search_suggestion_finds_hits(capsys, tmp_path, monkeypatch):
    """The commands the demo ends with, run as printed (DIR2 a temp folder), find messages."""
    monkeypatch.chdir(ROOT)  # the suggestion names examples/ relative to a checkout
    commands = [shlex.split(c) for c in SEARCH_HINT.split("; ")]
    assert [c[:2] for c in commands] == [["marsys-mem", "run"], ["marsys-mem", "search"]]
    for argv in commands:
        code, out, _ = run(capsys, *[str(tmp_path) if a == "DIR2" else a for a in argv[1:]])
        assert code == 0, out
    assert "hit(s) for 'contact email'" in out
    assert "maria.lopez@example.com" in out


def test_marsys_mem_demo_subprocess_under_30_seconds(tmp_path):
    """`marsys-mem demo` end to end, in a fresh process (model load included)."""
    script = shutil.which("marsys-mem")
    command = [script, "demo"] if script else [sys.executable, "-m", "marsys_mem", "demo"]
    env = {**os.environ, "NO_COLOR": "1"}
    # CPU seconds of the child (user + system): a busy machine's waits do not count
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    elapsed = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    assert result.returncode == 0, result.stderr
    assert "== Questions (3)" in result.stdout
    assert "\x1b[" not in result.stdout  # plain text when stdout is not a terminal
    assert elapsed < 30, f"marsys-mem demo took {elapsed:.1f} CPU-seconds"
    assert list(tmp_path.iterdir()) == []


def test_module_entry_point_prints_help():
    result = subprocess.run(
        [sys.executable, "-m", "marsys_mem"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "marsys-mem" in result.stdout
    for command in ("demo", "run", "validate", "schema", "inspect", "search"):
        assert command in result.stdout


# ---------------------------------------------------------------------------- run
@pytest.mark.parametrize("name", ["research_team", "support_assistant", "long_conversation"])
def test_run_every_example(capsys, tmp_path, name):
    code, out, err = run(capsys, "run", EXAMPLES / f"{name}.yaml", "--store", tmp_path / "s")
    assert code == 0, out + err
    assert out.startswith(f"== {name}")
    assert "== Questions" in out
    assert "✗" not in out
    assert out.rstrip().endswith("ok")


def test_run_json(capsys, tmp_path):
    code, out, _ = run(
        capsys, "run", EXAMPLES / "long_conversation.yaml", "--json", "--store", tmp_path / "s"
    )
    assert code == 0
    report = json.loads(out)
    planner = report["memories"][0]
    assert planner["agent"] == "planner"
    assert planner["window"]["summary"]
    assert report["timings"]["total_s"] > 0


def test_run_with_unmet_expectation_exits_1(capsys, tmp_path):
    path = write(
        tmp_path,
        """
        memory: {store: {backend: memory}}
        agents: [a]
        steps:
          - say: {agent: a, text: The sky is blue}
          - ask: {agent: a, question: "What colour is the sky?", expect: [green]}
        """,
    )
    code, out, _ = run(capsys, "run", path)
    assert code == 1
    assert "✗ 'green'" in out
    assert "FAILED: 1 question(s)" in out


def test_run_step_failure_exits_1(capsys, tmp_path):
    path = write(
        tmp_path,
        """
        memory: {store: {backend: memory}, defaults: {context: {max_tokens: 10}}}
        agents: [{name: a, system: "A prompt far too long for a ten token budget, by design."}]
        steps:
          - ask: {agent: a, question: "anything?"}
        """,
    )
    code, _, err = run(capsys, "run", path)
    assert code == 1
    assert "wf.yaml:4: steps[0] (ask a@main):" in err


BAD_FILES = {
    "unknown agent": (
        "agents: [planner]\nsteps:\n  - say: {agent: plnner, text: hi}\n",
        "wf.yaml:3: steps[0].agent: unknown agent 'plnner' (did you mean 'planner'?)",
    ),
    "unknown branch": (
        "agents: [a]\nsteps:\n  - ask: {agent: a, question: q, branch: r9}\n",
        "wf.yaml:3: steps[0].branch: unknown branch 'r9'",
    ),
    "merge cycle": (
        "agents: [a]\nsteps:\n  - fork: {parent: main, child: r1}\n"
        "  - fork: {parent: r1, child: r2}\n  - merge: {child: r1, into: r2}\n",
        "wf.yaml:5: steps[2].into: cannot merge 'r1' into 'r2'",
    ),
    "missing config": (
        "memory: {config: nowhere.yaml}\nagents: [a]\n",
        "wf.yaml:1: memory.config: config file not found",
    ),
    "bad YAML": (
        "agents: [a]\nsteps:\n  - say: {agent: a, text: [oops}\n",
        "wf.yaml:3: invalid YAML",
    ),
    "wrong field type": (
        "agents: [a]\nsteps:\n  - share: {agent: a, fact: x, confidence: high}\n",
        "wf.yaml:3: steps[0].confidence: Input should be a valid number",
    ),
    "fork of unknown parent": (
        "agents: [a]\nsteps:\n  - fork: {parent: mian, child: r1}\n",
        "wf.yaml:3: steps[0].parent: unknown branch 'mian' (did you mean 'main'?)",
    ),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
@pytest.mark.parametrize("command", ["run", "validate"])
def test_bad_files_exit_2_with_one_error_and_write_nothing(capsys, tmp_path, case, command):
    text, expected = BAD_FILES[case]
    path = write(tmp_path, text)
    store = tmp_path / "store"
    argv = ["run", path, "--store", store] if command == "run" else ["validate", path]
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    assert expected in lines[0], err
    assert not store.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wf.yaml"]  # no .marsys_mem/


def test_run_missing_file_and_bad_mqtt(capsys, tmp_path):
    code, _, err = run(capsys, "run", tmp_path / "nope.yaml")
    assert code == 2
    assert "nope.yaml: workflow file not found" in err
    path = write(tmp_path, "agents: [a]\n")
    code, _, err = run(capsys, "run", path, "--mqtt", "localhost:99999", "--store", tmp_path / "s")
    assert code == 2
    assert "--mqtt expects HOST:PORT" in err
    assert not (tmp_path / "s").exists()


def test_usage_errors_exit_2(capsys):
    assert main(["bogus"]) == 2
    assert main(["run"]) == 2
    assert main(["search", "store-only"]) == 2
    assert main(["demo", "--windows", "--turns", "many"]) == 2
    assert "usage:" in capsys.readouterr().err


def test_help_exits_0(capsys):
    assert main(["--help"]) == 0
    assert main([]) == 0
    assert "inspect" in capsys.readouterr().out


# ---------------------------------------------------------------------------- validate
@pytest.mark.parametrize(
    "path",
    [
        *sorted(EXAMPLES.glob("*.yaml")),
        POLICIES / "team.yaml",
        POLICIES / "support-bot.toml",
        POLICIES / "ephemeral.json",
    ],
    ids=lambda p: p.name,
)
def test_validate_good_files(capsys, path):
    code, out, err = run(capsys, "validate", path)
    assert code == 0, err
    kind = "workflow" if path.parent == EXAMPLES else "retention config"
    assert out.startswith(f"ok: {kind}")


def test_validate_bad_config_names_file_line_and_field(capsys, tmp_path):
    path = write(tmp_path, "version: 1\nagents:\n  researcher:\n    ttl: soon\n", "policy.yaml")
    code, out, err = run(capsys, "validate", path)
    assert code == 2
    assert out == ""
    assert "policy.yaml:4: agents.researcher.ttl: invalid duration 'soon'" in err
    toml = write(tmp_path, "version = 1\n[defaults]\nretention = 'forever'\n", "p.toml")
    code, _, err = run(capsys, "validate", toml)
    assert code == 2
    assert "defaults.retention" in err


# ---------------------------------------------------------------------------- schema
def _schema(capsys, *flags):
    code, out, _ = run(capsys, "schema", *flags)
    assert code == 0
    schema = json.loads(out)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


def _load(path: Path):
    text = path.read_text()
    if path.suffix == ".toml":
        return tomllib.loads(text)
    if path.suffix == ".json":
        return json.loads(text)
    return yaml.safe_load(text)


def _messages(validator, data):
    return [f"{list(e.absolute_path)}: {e.message[:120]}" for e in validator.iter_errors(data)]


def test_schema_prints_the_config_json_schema(capsys):
    code, out, _ = run(capsys, "schema")
    assert code == 0
    schema = json.loads(out)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert {"version", "store", "defaults", "agents"} <= set(schema["properties"])


def test_schema_workflow(capsys):
    code, out, _ = run(capsys, "schema", "--workflow")
    assert code == 0
    schema = json.loads(out)
    assert {"memory", "transport", "agents", "branches", "steps"} <= set(schema["properties"])


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*")), ids=lambda p: p.name)
def test_workflow_schema_accepts_every_bundled_workflow(capsys, path):
    """It described steps as {kind: say, ...} only: 5, 16 and 5 errors on the examples."""
    assert _messages(_schema(capsys, "--workflow"), _load(path)) == []


@pytest.mark.parametrize("path", sorted(POLICIES.glob("*")), ids=lambda p: p.name)
def test_config_schema_accepts_every_bundled_policy(capsys, path):
    assert _messages(_schema(capsys), _load(path)) == []


SHORT_FORMS = """
memory:
  store: {backend: sqlite, path: m.db}
  defaults: {retention: persistent, ttl: 1d12h}
  agents:
    planner:
      ttl: 3600
      context: {max_tokens: 900, strategy: summarize, keep_recent: 4}
      patterns: {rag: true, episodic: false, hierarchical: {k: 2}}
transport: inprocess
agents: [planner, {name: writer, system: You write.}]
steps:
  - {kind: say, agent: planner, text: hi}
  - end_session
  - end_session:
  - end_session: {restart: true}
  - ask: {agent: planner, question: q, expect: one string}
  - repeat:
      times: 2
      steps:
        - run: {agent: writer, steps: [{tool: {agent: writer, name: t, result: [1, {a: null}]}}]}
"""


def test_workflow_schema_accepts_every_short_form_the_loader_accepts(capsys, tmp_path):
    path = write(tmp_path, SHORT_FORMS)
    load_workflow(path)  # the loader accepts it...
    assert _messages(_schema(capsys, "--workflow"), _load(path)) == []  # ...and so does the schema


BAD_FOR_SCHEMA = [
    ("agents: [a]\nsteps:\n  - say: {agent: a, txt: hi}\n", ["steps", 0]),
    ("agents: [a]\nsteps:\n  - sya: {agent: a, text: hi}\n", ["steps", 0]),
    ("agents: [a]\nsteps:\n  - {kind: say, agent: a, text: hi, pinned: maybe}\n", ["steps", 0]),
    ("agents: [a]\nsteps:\n  - end_run\n", ["steps", 0]),
    ("agents: [a]\nmemory: {defaults: {context: {stratgy: summarize}}}\n", ["memory"]),
    ("agents: [a]\nmemory: {agents: {a: {context: {stratgy: x}}}}\n", ["memory"]),
    ("agents: [a]\nmemory: {defaults: {ttl: soon}}\n", ["memory"]),
    ("agents: []\n", ["agents"]),
    ("agents: [a]\ntransport: {mqtt: {hots: x}}\n", ["transport"]),
]


@pytest.mark.parametrize(("text", "where"), BAD_FOR_SCHEMA)
def test_workflow_schema_rejects_misspelled_files(capsys, tmp_path, text, where):
    errors = list(_schema(capsys, "--workflow").iter_errors(yaml.safe_load(text)))
    assert errors
    assert [list(e.absolute_path)[: len(where)] for e in errors] == [where] * len(errors)


def test_config_schema_rejects_misspelled_files(capsys):
    validator = _schema(capsys)
    for text in (
        "version: 1\nagents: {r: {context: {stratgy: summarize}}}\n",
        "version: 1\nagents: {r: {retentoin: session}}\n",
        "version: 1\ndefaults: {ttl: 30 days}\n",
        "version: 1\nstore: {backend: cassandra}\n",
    ):
        assert _messages(validator, yaml.safe_load(text)), text


# ---------------------------------------------------------------------------- inspect, search
@pytest.fixture(scope="module")
def support_store(tmp_path_factory):
    store = tmp_path_factory.mktemp("support") / "store"
    assert main(["run", str(EXAMPLES / "support_assistant.yaml"), "-q", "--store", str(store)]) == 0
    return store


@pytest.fixture(scope="module")
def research_store(tmp_path_factory):
    store = tmp_path_factory.mktemp("research") / "store"
    assert main(["run", str(EXAMPLES / "research_team.yaml"), "-q", "--store", str(store)]) == 0
    return store


def test_inspect(capsys, support_store):
    code, out, _ = run(capsys, "inspect", support_store)
    assert code == 0
    assert "integrity ok" in out
    assert "1 agents, 1 branches, 16 messages, 0 shared facts, 2 runs" in out
    assert "assistant@main" in out
    assert "16" in out
    assert "rag" in out
    assert "episodic" in out
    code, out, _ = run(capsys, "inspect", support_store / "memory.db", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["conversations"][0]["agent"] == "assistant"


def test_inspect_shows_recorded_facts(capsys, research_store):
    code, out, _ = run(capsys, "inspect", research_store)
    assert code == 0
    assert "== Shared facts (9)" in out
    assert "regulation@regulation (global, topic regulation)" in out
    assert "(merged from market, topic market_size)" in out


def test_search(capsys, support_store):
    code, out, _ = run(capsys, "search", support_store, "contact by email", "-k", "2")
    assert code == 0
    assert "hit(s) for 'contact by email'" in out
    assert "maria.lopez@example.com" in out
    code, out, _ = run(capsys, "search", support_store, "ticket", "--mode", "bm25", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["how"] == "bm25"
    assert any("RMA-2291" in h["text"] for h in data["hits"])
    code, out, _ = run(capsys, "search", support_store, "ticket", "--agent", "nobody")
    assert code == 0
    assert "0 hit(s)" in out


def test_search_finds_the_facts_a_run_recorded(capsys, research_store):
    # the research agents keep session memory only: the store's only text is its facts
    # (every hit, whatever its calibrated score: --min-score 0)
    code, out, _ = run(capsys, "search", research_store, "market size", "--min-score", "0")
    assert code == 0
    first = out.splitlines()[2]
    assert "market@market" in first
    assert " fact " in first
    assert "61,000 units" in first
    code, out, _ = run(
        capsys, "search", research_store, "market size", "--json", "-k", "9", "--min-score", "0"
    )
    hits = json.loads(out)["hits"]
    assert {h["kind"] for h in hits} == {"fact"}
    assert {h["role"] for h in hits} == {"fact"}
    assert len({h["message_id"] for h in hits}) == len(hits)  # a merged fact is one hit
    args = ["market", "--agent", "market", "--json", "--min-score", "0"]
    code, out, _ = run(capsys, "search", research_store, *args)
    assert {h["agent"] for h in json.loads(out)["hits"]} == {"market"}
    code, out, _ = run(
        capsys, "search", research_store, "market", "--branch", "main", "--json", "--min-score", "0"
    )
    hits = json.loads(out)["hits"]
    assert hits
    assert {h["branch"] for h in hits} == {"main"}
    code, out, _ = run(capsys, "search", research_store, "market", "--agent", "nobody")
    assert "0 hit(s)" in out


def test_hybrid_search_ranks_facts_beside_rag_messages(capsys, tmp_path):
    path = write(
        tmp_path,
        """
        memory:
          defaults: {retention: persistent, patterns: {rag: {k: 3}}}
        agents: [a]
        steps:
          - say: {agent: a, text: "The delivery van is parked behind the warehouse."}
          - say: {agent: a, text: "Lunch is at noon on Fridays."}
          - share: {agent: a, fact: "Maria prefers to be contacted by email.", scope: global}
        """,
    )
    store = tmp_path / "store"
    assert main(["run", str(path), "-q", "--store", str(store)]) == 0
    capsys.readouterr()
    code, out, _ = run(capsys, "search", store, "How should we reach Maria?", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["how"] == "hybrid (RAG index)"
    first = data["hits"][0]
    assert (first["kind"], first["source"], first["agent"]) == ("fact", "rag", "a")
    assert first["text"] == "Maria prefers to be contacted by email."
    assert first["score"] >= 0.8  # calibrated: above the default min_score
    # every memory's hits merge by their calibrated scores (facts and messages alike)
    code, out, _ = run(capsys, "search", store, "Maria", "--json", "--min-score", "0")
    hits = json.loads(out)["hits"]
    assert {h["kind"] for h in hits} == {"fact", "message"}
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    code, out, _ = run(capsys, "search", store, "qzvoe mprk")
    assert "0 hit(s)" in out  # a query nothing answers: nothing above the default
    code, out, _ = run(capsys, "search", store, "Where is the van?", "-k", "1")
    assert "a@main" in out
    assert "behind the warehouse" in out


def test_inspect_and_search_bad_input(capsys, tmp_path):
    code, _, err = run(capsys, "inspect", tmp_path / "missing")
    assert code == 2
    assert "no such store" in err
    (tmp_path / "empty").mkdir()
    code, _, err = run(capsys, "inspect", tmp_path / "empty")
    assert code == 2
    assert "no store here" in err
    junk = tmp_path / "junk.db"
    junk.write_text("not a database, just text " * 100)
    code, _, err = run(capsys, "inspect", junk)
    assert code == 2
    assert "not a marsys-mem store" in err
    code, _, err = run(capsys, "search", junk, "anything")
    assert code == 2
    code, _, err = run(capsys, "search", tmp_path / "missing", "q")
    assert code == 2
    assert not (tmp_path / "missing").exists()


def test_search_bad_arguments(capsys, support_store):
    code, _, err = run(capsys, "search", support_store, "   ")
    assert code == 2
    assert "non-empty" in err
    code, _, err = run(capsys, "search", support_store, "q", "-k", "0")
    assert code == 2
    assert "positive" in err
