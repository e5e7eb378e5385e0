"""A missing optional extra raises MissingDependencyError naming it, from every module.

A fresh interpreter hides every optional dependency (``sys.modules[name] = None``: what
``import name`` meets when the package is not installed) and imports every module of the
package: each either imports or raises ``MissingDependencyError`` whose message says
which extra to install; a bare ``ModuleNotFoundError`` fails the test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# the private helpers of PostgresStore are imported only by marsys_mem.store.postgres,
# after its own check for psycopg
SKIPPED = ("marsys_mem.__main__", "marsys_mem.store.postgres_")

HIDDEN = (
    "openai",
    "anthropic",
    "mcp",
    "agents",
    "langgraph",
    "langchain_core",
    "psycopg",
    "psycopg_pool",
    "greenlet",
)
"""The optional dependencies (of the extras openai, anthropic, mcp, agents, langgraph,
postgres)."""

EXPECTED = {
    "marsys_mem.llm.openai": "openai",
    "marsys_mem.llm.anthropic": "anthropic",
    "marsys_mem.integrations.mcp": "mcp",
    "marsys_mem.integrations.agents": "agents",
    "marsys_mem.integrations.langgraph": "langgraph",
    "marsys_mem.store.postgres": "postgres",
}
"""Modules that need an extra -> the extra their error names."""

PROBE = textwrap.dedent("""
    import importlib, json, pkgutil, sys
    for name in json.loads(sys.argv[1]):
        sys.modules[name] = None  # as if the extra were not installed
    import marsys_mem
    from marsys_mem.exceptions import MissingDependencyError
    skipped = tuple(json.loads(sys.argv[2]))
    found = {}
    for info in pkgutil.walk_packages(marsys_mem.__path__, "marsys_mem."):
        if info.name.startswith(skipped):
            continue
        try:
            importlib.import_module(info.name)
        except MissingDependencyError as exc:
            found[info.name] = ["missing", str(exc)]
        except ImportError as exc:
            found[info.name] = ["bare", f"{type(exc).__name__}: {exc}"]
    print(json.dumps(found))
""")


def test_every_module_names_the_extra_when_the_extras_are_missing() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(HIDDEN), json.dumps(SKIPPED)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, list[str]] = json.loads(done.stdout.strip().splitlines()[-1])
    bare = {name: why for name, (kind, why) in found.items() if kind == "bare"}
    assert not bare, f"bare import errors: {bare}"
    hint = "pip install 'marsys-mem["
    silent = {name: why for name, (_, why) in found.items() if hint not in why}
    assert not silent, f"errors that name no extra: {silent}"
    for name, extra in EXPECTED.items():
        assert name in found, f"{name} imported without its extra"
        assert f"marsys-mem[{extra}]" in found[name][1], found[name]
