"""The rough edges a newcomer met in the CLI (issue 28), each pinned.

``--version`` (fast: it imports nothing heavy); ``demo --windows`` asking about the week
its tool call names; ``python -m marsys_mem.testing.llm_server --help``; ``inspect``
counting the agents and branches the store really holds (facts included); ``search``
saying when a fact lost a merge; ``demo --store DIR`` naming the inspect command for DIR.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from marsys_mem import __version__
from marsys_mem.cli.demo import build_demo_memory, demo_workflow_path, lost_conflicts
from marsys_mem.cli.inspect import inspect_store, search_store
from marsys_mem.cli.main import main
from marsys_mem.workflow import run_workflow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "workflows"


@pytest.fixture(autouse=True)
def _data_home(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MARSYS_MEM_HOME", str(tmp_path_factory.mktemp("marsys-home")))


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"marsys-mem {__version__}"
    result = subprocess.run(
        [sys.executable, "-m", "marsys_mem", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"marsys-mem {__version__}"


def test_version_imports_nothing_heavy():
    # what the console script runs: --version answers before the commands and the library
    # load (they take seconds on a cold start: numpy, pydantic, the workflow)
    code = (
        "import sys; from marsys_mem.cli.main import main; code = main(['--version']);"
        "heavy = ('numpy', 'pydantic', 'yaml', 'marsys_mem.cli.commands', 'marsys_mem.config',"
        " 'marsys_mem.store', 'marsys_mem.workflow');"
        "print(code, sorted(m for m in heavy if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.splitlines() == [f"marsys-mem {__version__}", "0 []"], result.stdout


def test_demo_windows_tool_calls_name_the_week_asked_about():
    mem = build_demo_memory(60)
    messages = list(mem)
    calls = 0
    for i, m in enumerate(messages):
        for call in m.tool_calls:
            asked = messages[i - 1]
            assert asked.role == "user"
            week = re.search(r"in (\w+) in week (\d+)\?", asked.text)
            assert week is not None, asked.text
            assert call.arguments == {"city": week.group(1), "week": int(week.group(2))}
            calls += 1
    assert calls == 30


def test_llm_server_help_and_bad_port():
    module = [sys.executable, "-m", "marsys_mem.testing.llm_server"]
    shown = subprocess.run([*module, "--help"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "usage: python -m marsys_mem.testing.llm_server" in shown.stdout
    assert "port" in shown.stdout
    bad = subprocess.run([*module, "eighty"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert "expected a port number 0-65535, got 'eighty'" in bad.stderr
    assert "Traceback" not in bad.stderr


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory):
    """The demo's store: its agents keep session memory, so it holds their facts only."""
    store = tmp_path_factory.mktemp("demo") / "store"
    assert main(["demo", "--store", str(store), "--json"]) == 0
    return store


def test_demo_with_a_store_names_the_inspect_command_for_it(capsys, tmp_path):
    store = tmp_path / "my store"
    code, out, _ = run(capsys, "demo", "--store", store)
    assert code == 0, out
    assert f"Its store is kept: marsys-mem inspect '{store}'" in out
    assert "Keep its store with --store DIR" not in out


def test_inspect_counts_what_the_store_holds(capsys, demo_store):
    code, out, _ = run(capsys, "inspect", demo_store)
    assert code == 0
    headline = out.splitlines()[1]
    assert "4 agents, 4 branches, 0 messages, 9 shared facts, 0 runs" in headline, headline
    assert "0 agents" not in out
    # the facts are the agents' shared facts, not attributed to runs the store lacks
    assert "== Shared facts (9)" in out
    assert "recorded by workflow runs" not in out
    summary = inspect_store(demo_store)
    assert summary.agents == ["competitors", "market", "planner", "regulation"]
    assert summary.branches == ["competitors", "main", "market", "regulation"]


def test_search_says_when_a_fact_lost_a_merge(capsys, demo_store):
    code, out, _ = run(capsys, "search", demo_store, "market size", "--min-score", "0")
    assert code == 0
    rows = {line.split()[0]: line for line in out.splitlines()[2:] if line[:1].isdigit()}
    lost = next(line for line in rows.values() if "45,000" in line)
    assert "fact, lost" in lost
    won = next(line for line in rows.values() if "61,000" in line)
    assert "lost" not in won
    rank = lost.split()[0]
    assert f"   #{rank} lost on main to market@market: The Dutch cargo e-bike market" in out

    code, out, _ = run(
        capsys, "search", demo_store, "market size", "--json", "-k", "9", "--min-score", "0"
    )
    hits = {h["text"][:20]: h for h in json.loads(out)["hits"]}
    assert hits["A trade blog puts th"]["lost_to"].startswith("on main to market@market: ")
    assert [h for h in hits.values() if h["lost_to"]] == [hits["A trade blog puts th"]]

    # filtered to the branch it was shared on, it still says it lost the merge into main
    code, out, _ = run(
        capsys, "search", demo_store, "trade blog", "--branch", "competitors", "--min-score", "0"
    )
    assert "fact, lost" in out

    code, out, _ = run(capsys, "inspect", demo_store)
    assert "lost on main to market@market" in out


def test_the_report_and_the_store_agree_on_what_lost(tmp_path):
    with resources.as_file(demo_workflow_path()) as path:
        report = run_workflow(path, store_dir=tmp_path)
    lost = [f for f in report.facts if f.lost_to is not None]
    assert [(f.provenance, f.routed_to, f.lost_to.provenance) for f in lost] == [
        ("competitors@competitors", "main", "market@market")
    ]
    assert not lost[0].reached
    assert "      lost to market@market: The Dutch cargo" in report.to_text()
    (line,) = lost_conflicts(report)
    assert "the competitors -> main merge keeps the higher confidence" in line
    hits, _ = search_store(tmp_path, "trade blog market", k=9, mode="bm25")
    (hit,) = [h for h in hits if h.lost_to]
    assert hit.text == lost[0].text
    assert hit.lost_to == f"on main to market@market: {lost[0].lost_to.text}"
