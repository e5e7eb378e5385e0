"""Fault: SIGKILL of a process while a persistent RAGMemory embeds in the background.

A writer process adds messages to ``RAGMemory(store=SQLiteStore(path), index_path=...)``
with the real MiniLM model and prints the ids of every ``add_many`` that returned
(acknowledged: durable in the store). The test SIGKILLs it while the background queue is
embedding (``pending`` > 0, a batch inside torch), twice: the second writer is killed
while it is also repairing the index the first left stale. A third process opens the same
files, lets the index catch up and reports what it finds. Every acknowledged message must
be in the store once, in the saved index once, and found by dense and keyword search.
"""

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

WRITER = r"""
import json, random, sys, time
from marsys_mem.retrieval.embeddings import default_embedder
from marsys_mem.patterns import RAGMemory
from marsys_mem.store import SQLiteStore

db, idx, first = sys.argv[1], sys.argv[2], int(sys.argv[3])
WORDS = ("amber basil cedar delta ember fjord garnet harbor indigo juniper kestrel lagoon "
         "marble nectar orchid pepper quartz raven saffron tundra umber velvet willow "
         "xenon yarrow zephyr anchor beacon canyon dune").split()

def text(i):
    rng = random.Random(i)
    return f"entry {i} " + " ".join(rng.choice(WORDS) for _ in range(10))

emb = default_embedder()
emb.embed(["load the model first, so the worker starts embedding at once"])
mem = RAGMemory(emb, store=SQLiteStore(db), index_path=idx)  # queues the index repair
print(json.dumps({"open": len(mem), "pending": mem.pending}), flush=True)
i = first
while i < first + 5000:  # far more than the test lets it write
    ids = mem.add_many([text(j) for j in range(i, i + 10)])
    print(json.dumps({"acked": ids, "pending": mem.pending}), flush=True)
    i += 10
    if i - first == 100:
        mem.flush()  # a saved index that the kill then leaves stale
    time.sleep(0.01)  # faster than the model embeds, so the backlog grows
"""

VERIFIER = r"""
import json, random, sys
from marsys_mem.retrieval.embeddings import default_embedder
from marsys_mem.retrieval.index import FaissIndex
from marsys_mem.patterns import RAGMemory
from marsys_mem.store import SQLiteStore

db, idx, acked_file = sys.argv[1], sys.argv[2], sys.argv[3]
acked = json.loads(open(acked_file).read())
store = SQLiteStore(db)
stored = [m.message_id for m in store.load_messages(("default", "rag", "main"))]
emb = default_embedder()
mem = RAGMemory(emb, store=store, index_path=idx)
mem.flush()  # the index catches up and is saved
saved = FaissIndex.load(idx).ids()
texts = {m.message_id: m.text for m in mem.messages()}
sample = acked[-20:] + random.Random(0).sample(acked, min(30, len(acked)))
dense_found = sum(
    mem.search(texts[mid], k=1, mode="dense")[0].message.message_id == mid
    for mid in sample if mid in texts
)
bm25_found = sum(
    any(h.message.message_id == mid for h in mem.search(texts[mid], k=3, mode="bm25"))
    for mid in acked if mid in texts
)
print(json.dumps({
    "stored": len(stored), "stored_distinct": len(set(stored)),
    "acked_in_store": len(set(acked) & set(stored)),
    "saved": len(saved), "saved_distinct": len(set(saved)),
    "saved_equals_store": set(saved) == set(stored),
    "memory": len(mem), "failed": len(mem.failed),
    "dense_sample": len(sample), "dense_found": dense_found, "bm25_found": bm25_found,
}))
mem.close()
store.close()
"""


def write_then_kill(db: Path, idx: Path, first: int, kill_after: int) -> tuple[list[str], int]:
    """Run a writer; SIGKILL it once ``kill_after`` adds were acknowledged with a backlog.

    Returns the acknowledged ids and the backlog (``pending``) it reported last.
    """
    lines: queue.Queue[str | None] = queue.Queue()
    acked: list[str] = []
    pending = 0
    with subprocess.Popen(
        [sys.executable, "-c", WRITER, str(db), str(idx), str(first)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        deadline = time.monotonic() + 90
        try:
            while True:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
                if line is None:
                    assert proc.stderr is not None
                    pytest.fail(f"the writer exited early: {proc.stderr.read()[-2000:]}")
                event = json.loads(line)
                acked.extend(event.get("acked", []))
                pending = event["pending"]
                if len(acked) >= kill_after and pending >= 20:
                    os.kill(proc.pid, signal.SIGKILL)  # embedding in flight
                    break
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)
            reader.join(30)
    assert proc.returncode == -signal.SIGKILL
    return acked, pending


def test_sigkill_during_background_embedding_loses_nothing(tmp_path):
    db, idx = tmp_path / "mem.db", tmp_path / "rag.index"
    acked1, pending1 = write_then_kill(db, idx, first=0, kill_after=200)
    assert idx.exists()  # the writer saved an index before it was killed
    acked2, pending2 = write_then_kill(db, idx, first=100_000, kill_after=50)
    acked = acked1 + acked2
    acked_file = tmp_path / "acked.json"
    acked_file.write_text(json.dumps(acked))

    result = subprocess.run(
        [sys.executable, "-c", VERIFIER, str(db), str(idx), str(acked_file)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.splitlines()[-1])
    print(
        f"\nSIGKILL during background embedding: 2 kills (backlogs {pending1}, {pending2}); "
        f"acknowledged {len(acked)}, recovered {got['acked_in_store']} in the store, "
        f"{got['saved']} vectors for {got['stored']} stored messages; "
        f"dense search found {got['dense_found']}/{got['dense_sample']}, "
        f"keyword search {got['bm25_found']}/{len(acked)}"
    )
    assert len(set(acked)) == len(acked)
    assert got["acked_in_store"] == len(acked)  # 0 acknowledged messages lost
    assert got["stored"] == got["stored_distinct"] == got["memory"]  # 0 applied twice
    assert got["saved"] == got["saved_distinct"] == got["stored"]  # one vector each
    assert got["saved_equals_store"]
    assert got["failed"] == 0
    assert got["dense_found"] == got["dense_sample"]
    assert got["bm25_found"] == len(acked)
