"""Every ```python block of README.md runs as written, pasted into a file.

Each block runs in a fresh interpreter, in a temp folder holding a copy of the repo's
``examples/`` (so relative paths such as ``examples/policies/team.yaml`` work and nothing
is written into the checkout), with ``MARSYS_MEM_HOME`` (the default store folder) inside
that temp folder. A block that must not run is preceded by ``<!-- not-run: reason -->``;
those stay rare (see ``MAX_NOT_RUN``). A failure names the block's line in README.md.

Blocks that talk to a model (the LLM adapters' chat loop, ``examples/llm/chat_loop.py``)
reach a scripted OpenAI-compatible server on loopback
(:mod:`marsys_mem.testing.llm_server`, answering deterministically) through
``OPENAI_BASE_URL`` in their environment (``OPENAI_API_KEY`` is emptied: no block may
reach OpenAI itself): no network, no model.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from marsys_mem.testing.llm_server import ScriptedServer, echo_chat

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_NOT_RUN = 3
TIMEOUT_S = 300

_FENCE = re.compile(r"^```(\S*)\s*$")
_NOT_RUN = re.compile(r"^<!--\s*not-run:\s*(?P<reason>.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    line: int  # 1-based line of the opening fence
    code: str
    not_run: str | None  # the reason, when marked not-run


def python_blocks(text: str) -> list[Block]:
    """The ```python blocks of ``text``, each with its line and its not-run marker."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        lang, start = m.group(1), i
        end = start + 1
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        if end == len(lines):
            raise AssertionError(f"README.md:{start + 1}: code block never closed")
        if lang == "python":
            prev = start - 1
            while prev >= 0 and not lines[prev].strip():
                prev -= 1
            marker = _NOT_RUN.match(lines[prev]) if prev >= 0 else None
            reason = marker.group("reason") if marker else None
            code = "\n".join(lines[start + 1 : end]) + "\n"
            blocks.append(Block(line=start + 1, code=code, not_run=reason))
        i = end + 1
    return blocks


BLOCKS = python_blocks(README.read_text(encoding="utf-8"))


def test_the_readme_has_python_blocks_and_few_are_not_run():
    assert len(BLOCKS) >= 5
    skipped = [b for b in BLOCKS if b.not_run is not None]
    for b in skipped:
        assert b.not_run, f"README.md:{b.line}: a not-run marker needs a reason"
    assert len(skipped) <= MAX_NOT_RUN, [f"README.md:{b.line}" for b in skipped]


def test_the_block_parser_finds_lines_and_markers():
    text = "x\n```python\na = 1\n```\n\n<!-- not-run: needs a key -->\n```python\nb\n```\n"
    assert python_blocks(text) == [
        Block(line=2, code="a = 1\n", not_run=None),
        Block(line=7, code="b\n", not_run="needs a key"),
    ]


@pytest.fixture(scope="module")
def llm_server() -> Iterator[ScriptedServer]:
    """A scripted OpenAI-compatible server on loopback (echoes the last user message)."""
    with ScriptedServer(echo_chat) as srv:
        yield srv


def _env(tmp_path: Path, server: ScriptedServer) -> dict[str, str]:
    return {
        **os.environ,
        "MARSYS_MEM_HOME": str(tmp_path / "home"),
        "PYTHONWARNINGS": "error::RuntimeWarning",  # e.g. a coroutine never awaited
        "OPENAI_BASE_URL": f"{server.url}/v1",
        # empty: blocks that switch to a real OpenAI model when a key is set stay offline
        # (the Agents SDK block); OpenAILLM with a base_url needs no key
        "OPENAI_API_KEY": "",
    }


@pytest.mark.parametrize(
    "block",
    [b for b in BLOCKS if b.not_run is None],
    ids=lambda b: f"README.md:{b.line}",
)
def test_readme_block_runs(block: Block, tmp_path: Path, llm_server: ScriptedServer):
    examples = tmp_path / "examples"
    shutil.copytree(ROOT / "examples", examples)
    before = sorted(examples.rglob("*"))
    script = tmp_path / f"readme_line_{block.line}.py"
    script.write_text(block.code, encoding="utf-8")
    env = _env(tmp_path, llm_server)
    try:
        proc = subprocess.run(
            [sys.executable, script.name],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"README.md:{block.line}: the block ran past {TIMEOUT_S} s")
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
        pytest.fail(
            f"README.md:{block.line}: the python block exits {proc.returncode} when run "
            f"as a file:\n{tail}",
            pytrace=False,
        )
    # nothing lands in examples/ (stores go to MARSYS_MEM_HOME or a folder the block names)
    after = sorted(examples.rglob("*"))
    assert after == before, (
        f"README.md:{block.line}: wrote into examples/: "
        f"{[str(p.relative_to(tmp_path)) for p in after if p not in before]}"
    )


def test_the_chat_loop_example_runs_against_the_scripted_server(
    tmp_path: Path, llm_server: ScriptedServer
):
    before = len(llm_server.requests)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "llm" / "chat_loop.py")],
        cwd=tmp_path,
        env=_env(tmp_path, llm_server),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    sent = llm_server.requests[before:]
    assert [r.path for r in sent] == ["/v1/chat/completions"] * 5  # one call per turn
    assert "You said: Where do I live, and what do I like?" in proc.stdout
    # facts learned in the background, the move kept beside the home it will replace
    learned = proc.stdout.split("learned:", 1)[1]
    for fact in ("User's name is Ana", "User lives in Porto", "User likes green tea"):
        assert fact in learned
    assert "skipped=6" in learned  # "ok" and the assistant's answers: no extractor call
