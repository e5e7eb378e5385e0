"""Every ```python block of README.md and of the docs runs as written, twice, pasted into a file.

Each block gets a fresh temp folder, as a reader's empty folder, with ``MARSYS_MEM_HOME``
(the default store folder) and ``TMPDIR`` (``tempfile.gettempdir()``, where blocks keep
their files) inside it, and runs there in a fresh interpreter twice: the second run finds
whatever the first left (files, stores), as a reader who runs a block again would, and must
exit 0 and print the same output, so a block that is not idempotent (a store that grows, an
id that collides) fails. A block must leave nothing in the folder it runs in (stores go to
the data folder or the temp folder). Only a block that says it runs ``from the repository
root`` may read the checkout's ``examples/`` (it gets a copy, and must not write into it). A
block that must not run is preceded by ``<!-- not-run: reason -->``; those stay rare (see
``MAX_NOT_RUN``). A failure names the block's file and line.

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
# the docs' own pages (docs/notebooks links the notebooks folder, which has no blocks)
DOCS = sorted(p for p in (ROOT / "docs").rglob("*.md") if "notebooks" not in p.parts)
MAX_NOT_RUN = 3
FROM_ROOT = "from the repository root"  # what a block that reads examples/ says
RUNS = 2
TIMEOUT_S = 300

# what may differ between two runs of an idempotent block: ids, clock times, durations
_VOLATILE = (
    (re.compile(r"\b[0-9a-f]{32}\b|\b[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}\b"), "<id>"),
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:[+-]\d\d:\d\d|Z)?"), "<time>"),
    (re.compile(r"\d[\d,]*(?:\.\d+)?\s?(?:µs|us|ms|s)\b"), "<duration>"),
)
_FENCE = re.compile(r"^```(\S*)\s*$")
_NOT_RUN = re.compile(r"^<!--\s*not-run:\s*(?P<reason>.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    line: int  # 1-based line of the opening fence
    code: str
    not_run: str | None  # the reason, when marked not-run
    file: str = "README.md"  # relative to the repository root

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def python_blocks(text: str, file: str = "README.md") -> list[Block]:
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
            raise AssertionError(f"{file}:{start + 1}: code block never closed")
        if lang == "python":
            prev = start - 1
            while prev >= 0 and not lines[prev].strip():
                prev -= 1
            marker = _NOT_RUN.match(lines[prev]) if prev >= 0 else None
            reason = marker.group("reason") if marker else None
            code = "\n".join(lines[start + 1 : end]) + "\n"
            blocks.append(Block(line=start + 1, code=code, not_run=reason, file=file))
        i = end + 1
    return blocks


BLOCKS = [
    block
    for path in (README, *DOCS)
    for block in python_blocks(
        path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix()
    )
]


def test_the_readme_and_the_docs_have_python_blocks_and_few_are_not_run():
    assert len([b for b in BLOCKS if b.file == "README.md"]) >= 2
    assert len(BLOCKS) >= 20
    assert {b.file for b in BLOCKS} >= {"README.md", "docs/getting-started.md"}
    skipped = [b for b in BLOCKS if b.not_run is not None]
    for b in skipped:
        assert b.not_run, f"{b.where}: a not-run marker needs a reason"
    assert len(skipped) <= MAX_NOT_RUN, [b.where for b in skipped]


def test_the_block_parser_finds_lines_and_markers():
    text = "x\n```python\na = 1\n```\n\n<!-- not-run: needs a key -->\n```python\nb\n```\n"
    assert python_blocks(text, "docs/x.md") == [
        Block(line=2, code="a = 1\n", not_run=None, file="docs/x.md"),
        Block(line=7, code="b\n", not_run="needs a key", file="docs/x.md"),
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
        "TMPDIR": str(tmp_path / "tmp"),  # tempfile.gettempdir(): where blocks keep files
        "PYTHONWARNINGS": "error::RuntimeWarning",  # e.g. a coroutine never awaited
        "OPENAI_BASE_URL": f"{server.url}/v1",
        # empty: blocks that switch to a real OpenAI model when a key is set stay offline
        # (the Agents SDK block); OpenAILLM with a base_url needs no key
        "OPENAI_API_KEY": "",
    }


def _run(block: Block, tmp_path: Path, env: dict[str, str], attempt: int) -> str:
    """Run ``block`` as a file in ``tmp_path``; its output, or a failure naming the block."""
    script = tmp_path / f"block_line_{block.line}.py"
    script.write_text(block.code, encoding="utf-8")
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
        pytest.fail(f"{block.where}: run {attempt} ran past {TIMEOUT_S} s")
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
        pytest.fail(
            f"{block.where}: the python block exits {proc.returncode} on run {attempt} "
            f"of {RUNS} (run as a file in a fresh folder"
            f"{', after a first run there' if attempt > 1 else ''}):\n{tail}",
            pytrace=False,
        )
    return stable(proc.stdout)


def stable(output: str) -> str:
    """``output`` with ids, clock times and durations masked (they differ run to run)."""
    for pattern, mask in _VOLATILE:
        output = pattern.sub(mask, output)
    return output


def test_stable_masks_ids_times_and_durations_only():
    out = "id 82f17c7bfaae4ed094e5e10f27b29f1d at 2026-11-27T13:45:20.936+00:00 took 4.6 s, 12 ms"
    assert stable(out) == "id <id> at <time> took <duration>, <duration>"
    assert stable("8 messages, 401 tokens, score 0.81") == "8 messages, 401 tokens, score 0.81"


def test_a_block_that_reads_the_checkout_says_it_runs_from_the_repository_root():
    for block in BLOCKS:
        if re.search(r"[\"']examples/", block.code) and block.not_run is None:  # a path
            assert FROM_ROOT in block.code, (
                f"{block.where}: reads the checkout's examples/ without saying "
                f"'# {FROM_ROOT}' (a reader in another folder gets 'file not found')"
            )


@pytest.mark.parametrize(
    "block",
    [b for b in BLOCKS if b.not_run is None],
    ids=lambda b: b.where,
)
def test_block_runs_twice_alike(block: Block, tmp_path: Path, llm_server: ScriptedServer):
    # a reader's own folder holds nothing of ours; the repository root holds examples/
    examples = tmp_path / "examples"
    if FROM_ROOT in block.code:
        shutil.copytree(ROOT / "examples", examples)
    before = sorted(examples.rglob("*"))
    (tmp_path / "tmp").mkdir()
    env = _env(tmp_path, llm_server)
    outputs = [_run(block, tmp_path, env, attempt) for attempt in range(1, RUNS + 1)]
    assert outputs[1] == outputs[0], (
        f"{block.where}: the block prints something else when run again in the same "
        f"folder (not idempotent):\n--- first run\n{outputs[0][-2000:]}"
        f"\n--- second run\n{outputs[1][-2000:]}"
    )
    # nothing lands in examples/ or beside the block (stores go to MARSYS_MEM_HOME or the
    # temp folder): a reader's folder stays as it was
    after = sorted(examples.rglob("*"))
    assert after == before, (
        f"{block.where}: wrote into examples/: "
        f"{[str(p.relative_to(tmp_path)) for p in after if p not in before]}"
    )
    ours = {f"block_line_{block.line}.py", "home", "tmp", "examples"}
    left = sorted(p.name for p in tmp_path.iterdir() if p.name not in ours)
    assert not left, f"{block.where}: left files in the folder it ran in: {left}"


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
