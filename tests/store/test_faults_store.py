"""Fault test: persistent-manager writers on one SQLite file, SIGKILLed at random moments.

Several real writer processes append through a persistent ``MemoryManager`` (write-through,
``max_stored_messages``) to ONE agent's memory in one SQLite file. The parent kills them
with SIGKILL at random moments (while importing, opening, loading or appending) and
starts them again; a reader process samples the stored count the whole time. Each writer
appends a line to its acknowledgement file after ``add`` returns, so an id in that file
is an append that was acknowledged.

The oracle: an ``audit`` table filled by a trigger on ``messages``, installed by the test
before the writers start. The trigger runs inside the writer's own transaction, so the
audit holds exactly the committed inserts, in commit order. Then:

* every acknowledged id was committed (0 lost),
* no id was committed twice (0 applied twice),
* the store holds exactly the newest N committed messages: every acknowledged message
  that is gone was removed by the bound, legitimately,
* the reader never saw more than N rows for the key (the bound across processes, at
  every committed state), and the file opens cleanly and passes ``integrity_check``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from marsys_mem.store import SQLiteStore

BOUND = 40
WRITERS = 3
KILLS_PER_WRITER = 6
KEY = ("default", "team", "main")

CHILD = r"""
import os, sys
from marsys_mem.manager import MemoryManager
from marsys_mem.model.messages import Message

config, writer, incarnation, ack_path = sys.argv[1:5]
fd = os.open(ack_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
manager = MemoryManager.from_config(config)
memory = manager.memory("team")
print("ready", flush=True)
count = int(sys.argv[5]) if len(sys.argv) > 5 else 10**9
for i in range(count):
    mid = f"{writer}.{incarnation}.{i}"
    memory.add(Message.user(f"{writer} says {i}", message_id=mid))
    os.write(fd, (mid + "\n").encode())  # acknowledged: add returned
    assert len(memory) <= BOUND, len(memory)
manager.close()
os.close(fd)
""".replace("BOUND", str(BOUND))

READER = r"""
import os, sqlite3, sys, time
path, stop = sys.argv[1:3]
conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
conn.execute("PRAGMA busy_timeout = 30000")
samples = peak = over = 0
while not os.path.exists(stop):
    n = conn.execute(
        "SELECT count(*) FROM messages WHERE namespace = 'default' AND agent = 'team' "
        "AND branch = 'main'"
    ).fetchone()[0]
    samples += 1
    peak = max(peak, n)
    over += n > BOUND
    time.sleep(0.001)  # leave the CPU to the writers
print(samples, peak, over, flush=True)
""".replace("BOUND", str(BOUND))


def _spawn(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", *args], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
    )


def _kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    if proc.stdout is not None:
        proc.stdout.close()


def test_sigkilled_persistent_writers_lose_nothing_and_keep_the_bound(tmp_path: Path) -> None:
    seed = int(os.environ.get("MARSYS_FAULT_SEED", time.time_ns() % 10**6))
    rng = random.Random(seed)
    db = tmp_path / "mem.db"
    config = tmp_path / "team.json"
    config.write_text(
        json.dumps(
            {
                "version": 1,
                "store": {"backend": "sqlite", "path": "mem.db"},
                "agents": {"team": {"retention": "persistent", "max_stored_messages": BOUND}},
            }
        )
    )
    SQLiteStore(db).close()  # the file exists (and is migrated) before anyone writes
    with sqlite3.connect(db, isolation_level=None) as conn:
        conn.execute("CREATE TABLE audit (id INTEGER PRIMARY KEY, message_id TEXT NOT NULL)")
        conn.execute(
            "CREATE TRIGGER audit_insert AFTER INSERT ON messages "
            "BEGIN INSERT INTO audit (message_id) VALUES (new.message_id); END"
        )
    conn.close()
    stop = tmp_path / "stop"
    reader = _spawn([READER, str(db), str(stop)])
    acks = {w: tmp_path / f"w{w}.acks" for w in range(WRITERS)}
    kills = {"before ready": 0, "while writing": 0}
    started = time.monotonic()
    running: dict[int, tuple[subprocess.Popen[str], int, float, bool]] = {}
    try:
        # Each writer: KILLS_PER_WRITER incarnations killed at a random moment, all writers
        # running at once (they contend for the file's write lock).
        incarnation = dict.fromkeys(range(WRITERS), 0)

        def start(w: int) -> None:
            proc = _spawn([CHILD, str(config), f"w{w}", str(incarnation[w]), str(acks[w])])
            early = rng.random() < 0.25  # sometimes kill during import / open / load
            delay = rng.uniform(0.0, 0.8) if early else rng.uniform(0.02, 0.4)
            running[w] = (proc, incarnation[w], delay, early)

        for w in range(WRITERS):
            start(w)
        spawned = {w: time.monotonic() for w in range(WRITERS)}
        ready_at: dict[int, float] = {}
        while running:
            for w, (proc, _inc, delay, early) in list(running.items()):
                assert proc.poll() is None, f"writer w{w} died on its own: {proc.returncode}"
                if early:
                    due = spawned[w] + delay
                else:
                    if w not in ready_at:
                        assert proc.stdout is not None
                        assert proc.stdout.readline().strip() == "ready"
                        ready_at[w] = time.monotonic()
                    due = ready_at[w] + delay
                if time.monotonic() < due:
                    continue
                _kill(proc)
                kills["before ready" if early else "while writing"] += 1
                del running[w]
                ready_at.pop(w, None)
                incarnation[w] += 1
                if incarnation[w] < KILLS_PER_WRITER:
                    start(w)
                    spawned[w] = time.monotonic()
            time.sleep(0.005)
        # A last incarnation of each writer ends cleanly (close() included).
        finals = []
        for w in range(WRITERS):
            args = [CHILD, str(config), f"w{w}", str(incarnation[w]), str(acks[w]), "30"]
            finals.append(_spawn(args))
        for proc in finals:
            out, _ = proc.communicate(timeout=60)
            assert proc.returncode == 0, out
    finally:
        stop.touch()
        out, _ = reader.communicate(timeout=30)
        for proc, *_ in running.values():
            _kill(proc)
    samples, peak, over = (int(x) for x in out.split())
    elapsed = time.monotonic() - started

    with SQLiteStore(db) as store:  # opens cleanly after all the kills
        assert store.integrity_check() == "ok"
        present = [m.message_id for m in store.load_messages(KEY)]
    with sqlite3.connect(db) as conn:
        committed = [i for (i,) in conn.execute("SELECT message_id FROM audit ORDER BY id")]
    conn.close()
    acked = {w: acks[w].read_text().split() for w in range(WRITERS)}
    all_acked = [i for ids in acked.values() for i in ids]
    committed_set = set(committed)
    lost = [i for i in all_acked if i not in committed_set]
    acked_present = sum(i in set(present) for i in all_acked)
    report = (
        f"seed={seed} writers={WRITERS} kills={kills} acknowledged={len(all_acked)} "
        f"committed={len(committed)} present={len(present)} acknowledged_present={acked_present} "
        f"acknowledged_removed_by_bound={len(all_acked) - acked_present - len(lost)} "
        f"lost={len(lost)} reader_samples={samples} reader_peak={peak} bound={BOUND} "
        f"elapsed={elapsed:.1f}s"
    )
    print(report)
    assert not lost, report  # 0 acknowledged appends lost
    assert len(committed) == len(committed_set), report  # 0 applied twice
    assert present == committed[-BOUND:], report  # exactly the newest N are kept
    assert over == 0, report  # the bound held at every sampled state
    assert peak == BOUND, report  # ... and was reached
    assert samples > 500, report
    for ids in acked.values():  # each writer's acknowledged appends, in commit order
        wanted = set(ids)
        assert [i for i in committed if i in wanted] == ids, report
    assert sum(kills.values()) == WRITERS * KILLS_PER_WRITER


CREATOR = r"""
import sys
from pathlib import Path
from marsys_mem.store import SQLiteStore

folder = Path(sys.argv[1])
print("ready", flush=True)
i = 0
while True:
    SQLiteStore(folder / f"s{i}.db").close()
    i += 1
"""


def test_sigkill_while_creating_stores_never_leaves_a_file_that_will_not_open(
    tmp_path: Path,
) -> None:
    """A store appears at its path complete or not at all, whenever its creator dies.

    A file at the path that is not a marsys-mem database is refused (a 0-byte file
    included), so a creator killed half-way must never leave one there.
    """
    rng = random.Random(int(os.environ.get("MARSYS_FAULT_SEED", time.time_ns() % 10**6)))
    created = leftovers = 0
    for round_ in range(4):
        folder = tmp_path / f"round{round_}"
        folder.mkdir()
        proc = _spawn([CREATOR, str(folder)])
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(0.1, 0.4))
        finally:
            _kill(proc)
        for path in sorted(folder.glob("s*.db")):
            with SQLiteStore(path) as store:  # refused if half-made
                assert store.integrity_check() == "ok"
            created += 1
        leftovers += len(list(folder.glob(".*.creating")))
    print(f"stores created={created} temporary files left by the kills={leftovers}")
    assert created > 0
