"""issue 25 item 4: stored text never sends control sequences to the terminal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from marsys_mem import Message
from marsys_mem.cli.main import main as cli
from marsys_mem.store import SQLiteStore

EVIL = "invoice \x1b]0;PWNED\x07\x1b[2J total \u202egnp.exe"


@pytest.fixture
def store(tmp_path: Path) -> Path:
    path = tmp_path / "memory.db"
    with SQLiteStore(path) as s:
        s.append_messages(("default", "a", "main"), [Message.user(EVIL)])
    return path


@pytest.mark.parametrize("command", [["inspect"], ["search", "--mode", "bm25"]])
def test_human_output_escapes_controls(
    store: Path, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    args = [*command, str(store)] + (["invoice"] if command[0] == "search" else [])
    assert cli(args) == 0
    out = capsys.readouterr().out
    for raw in ("\x1b", "\x07", "\u202e"):
        assert raw not in out
    assert "invoice" in out


def test_json_output_is_unchanged(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["search", "--mode", "bm25", "--json", str(store), "invoice"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert EVIL in [str(v) for v in data["hits"][0].values()]  # the text, exactly


def test_error_lines_escape_controls(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["inspect", str(tmp_path / "no\x1b[2Jstore.db")]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err
    assert "\\x1b[2J" in err
