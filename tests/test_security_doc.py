"""docs/security.md names the tests that hold each defence: every one of them exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "security.md"
REF = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    }


def test_every_test_the_threat_model_names_exists() -> None:
    refs = REF.findall(DOC.read_text(encoding="utf-8"))
    assert len(refs) >= 40, "the threat model names the tests that hold its defences"
    missing = [
        f"{file}::{name}"
        for file, name in refs
        if not (ROOT / file).is_file() or name not in _tests_in(ROOT / file)
    ]
    assert not missing, f"docs/security.md names tests that do not exist: {missing}"


def test_every_surface_has_a_section() -> None:
    text = DOC.read_text(encoding="utf-8")
    for surface in ("MCP", "Files", "CLI", "Stores", "Coordination", "LangGraph", "context"):
        assert re.search(rf"^### .*{surface}", text, re.MULTILINE), surface
