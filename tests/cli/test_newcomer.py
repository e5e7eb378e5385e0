"""The rough edges a newcomer met in the CLI (issue 28), each pinned.

``--version``; ``demo --windows`` asking about the week its tool call names;
``python -m marsys_mem.testing.llm_server --help``; ``inspect`` counting the agents and
branches the store really holds (facts included); ``search`` saying when a fact lost a
merge.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from marsys_mem import __version__
from marsys_mem.cli.demo import build_demo_memory
from marsys_mem.cli.main import main

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
