"""``inspect`` / ``search`` on damaged and huge rows: skipped and reported, bounded previews."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from marsys_mem import Message
from marsys_mem.cli.main import main as cli
from marsys_mem.model.runs import RunSnapshot
from marsys_mem.store.keys import internal_key
from marsys_mem.store.sqlite import SQLiteStore

KEY = ("default", "a", "main")


def _damage(path: Path, message_id: str, data: str) -> None:
    """Overwrite one stored row's JSON, as a bad disk, an old bug or a hand edit would."""
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE messages SET data = ? WHERE message_id = ?", (data, message_id))
    conn.close()


@pytest.fixture
def damaged(tmp_path: Path) -> Path:
    """A store whose newest row is bad JSON and whose run snapshot does not validate."""
    path = tmp_path / "m.db"
    hello, bad = Message.user("hello there"), Message.user("to be damaged")
    with SQLiteStore(path) as store:
        store.append_messages(KEY, [hello, Message.assistant("general kenobi"), bad])
        store.save_run(RunSnapshot(run_id="r1", agent="a"))
    _damage(path, bad.message_id, '{"role": "user", "content": "cut short')
    with sqlite3.connect(path) as conn:
        conn.execute('UPDATE runs SET data = \'{"run_id": "r1"}\'')
    conn.close()
    (path.parent / "bad_id.txt").write_text(bad.message_id)
    return path


def test_one_invalid_row_is_skipped_and_reported_by_inspect(
    damaged: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 25 item 5: one invalid row made the whole store un-inspectable."""
    bad_id = (damaged.parent / "bad_id.txt").read_text()
    assert cli(["inspect", str(damaged)]) == 0
    out = capsys.readouterr().out
    assert (
        f"2 invalid rows skipped (key default/run, id r1: agent: Field required; "
        f"key default/a@main, id {bad_id}: Invalid JSON: EOF while parsing a string"
    ) in out
    assert "general kenobi" in out  # the newest valid message is the preview
    assert cli(["inspect", str(damaged), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(r["kind"], r["id"]) for r in data["invalid"]] == [("run", "r1"), ("message", bad_id)]
    assert data["conversations"][0]["messages"] == 3  # counted, not hidden


def test_a_message_that_fails_validation_is_skipped_by_search(
    damaged: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with SQLiteStore(damaged) as store:
        store.append_messages(KEY, [Message.user("kenobi again")])
    odd = Message.user("x")
    with SQLiteStore(damaged) as store:
        store.append_messages(KEY, [odd])
    _damage(damaged, odd.message_id, odd.model_dump_json().replace('"pinned":false', '"pinned":9'))
    assert cli(["search", str(damaged), "kenobi", "--mode", "bm25"]) == 0
    out = capsys.readouterr().out
    assert "== 2 hit(s) for 'kenobi'" in out
    assert "2 invalid rows skipped" in out
    assert f"id {odd.message_id}: pinned: Input should be a valid boolean" in out
    assert cli(["search", str(damaged), "kenobi", "--mode", "bm25", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["hits"]) == 2
    assert {r["id"] for r in data["invalid"]} >= {odd.message_id}


def test_hybrid_search_over_a_rag_memory_with_an_invalid_row_falls_back_to_bm25(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The RAG memory loads its key whole: one bad row there failed the whole search."""
    path = tmp_path / "m.db"
    rag = internal_key(KEY, "rag")
    bad = Message.user("x")
    with SQLiteStore(path) as store:
        store.append_messages(KEY, [Message.user("the spare key is under the mat")])
        store.append_messages(rag, [Message.user("the spare key is under the mat"), bad])
    _damage(path, bad.message_id, "not json")
    assert cli(["search", str(path), "spare key", "--mode", "hybrid"]) == 0
    out = capsys.readouterr().out
    assert "== 1 hit(s) for 'spare key' (bm25 (a RAG memory holds rows that do not validate))" in (
        out
    )
    assert (
        f"1 invalid row skipped (key default/a@main#rag, id {bad.message_id}: Invalid JSON" in out
    )


# VmHWM: this process's own peak (ru_maxrss would include the parent's, inherited at exec)
_MEASURE = textwrap.dedent(
    """
    import resource, sys
    from pathlib import Path
    from marsys_mem.cli.main import main
    code = main(["inspect", sys.argv[1]])
    status = Path("/proc/self/status")
    if status.exists():
        hwm = next(line for line in status.read_text().splitlines() if line.startswith("VmHWM"))
        peak = int(hwm.split()[1]) // 1024
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(f"peak-rss-mb={peak}", file=sys.stderr)
    sys.exit(code)
    """
)


@pytest.mark.slow
def test_a_huge_row_is_previewed_without_loading_it(tmp_path: Path) -> None:
    """Issue 25 item 5: a 200 MB row cost 1.4 GB of memory to print 50 characters."""
    path = tmp_path / "m.db"
    with SQLiteStore(path, synchronous="NORMAL") as store:
        store.append_messages(KEY, [Message.user("small"), Message.user("é\n" + "x" * 200_000_000)])
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "2 messages" in done.stdout
    assert "é " + "x" * 40 in done.stdout  # the preview, from the row's first bytes
    peak = int(done.stderr.rsplit("peak-rss-mb=", 1)[1])
    assert peak < 250, f"inspect peaked at {peak} MB for a 200 MB row"  # the row is not loaded
