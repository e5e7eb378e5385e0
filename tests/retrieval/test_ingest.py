"""EmbeddingQueue: cancelling, and what happens to open queues when the interpreter exits.

The exit tests run real child interpreters: what they check (exit code, stderr, what the
exit hook did) only exists at the end of a process.
"""

import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator, Sequence

import numpy as np
import pytest

from marsys_mem.patterns import RAGMemory
from marsys_mem.retrieval.embeddings import HashingEmbedder
from marsys_mem.retrieval.index import FaissIndex
from marsys_mem.retrieval.ingest import EmbeddingQueue
from marsys_mem.store import SQLiteStore

QUEUE_THREAD = "marsys-mem-embedding-queue"


@pytest.fixture(autouse=True)
def no_leaked_queue_threads() -> Iterator[None]:
    before = {t for t in threading.enumerate() if t.name == QUEUE_THREAD}
    yield
    leaked = [t for t in threading.enumerate() if t.name == QUEUE_THREAD and t not in before]
    assert not leaked, f"embedding queue threads left running: {leaked}"


class SlowEmbedder:
    """HashingEmbedder that sleeps per batch (in Python, so a cut-off worker is harmless)."""

    def __init__(self, dim: int = 16, delay: float = 0.05) -> None:
        self.inner = HashingEmbedder(dim)
        self.dim = dim
        self.name = self.inner.name
        self.delay = delay
        self.started = threading.Event()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.started.set()
        time.sleep(self.delay)
        return self.inner.embed(texts)

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed(texts)


def run_child(code: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return result, time.monotonic() - start


SLOW_EMBEDDER = textwrap.dedent(
    """
    import time
    from marsys_mem.retrieval.embeddings import HashingEmbedder

    class SlowEmbedder:
        def __init__(self, dim=16, delay=0.05):
            self.inner = HashingEmbedder(dim)
            self.dim, self.name, self.delay = dim, self.inner.name, delay

        def embed(self, texts):
            time.sleep(self.delay)
            return self.inner.embed(texts)

        async def aembed(self, texts):
            return self.embed(texts)
    """
)


# ------------------------------------------------------------------ cancel


def test_close_with_cancel_drops_the_pending_items_and_counts_them():
    got: list[str] = []
    emb = SlowEmbedder(delay=0.2)
    q = EmbeddingQueue(emb, lambda keys, _v: got.extend(keys), batch_size=10)
    q.submit_many((f"k{i}", f"text {i}") for i in range(1000))
    assert emb.started.wait(5)
    start = time.monotonic()
    q.close(cancel=True)
    assert time.monotonic() - start < 2  # not the ~20 s a drain would take
    assert q.closed
    assert q.pending == 0
    assert 0 < len(got) < 1000  # the batch in flight was delivered, the rest dropped
    assert q.cancelled == 1000 - len(got)
    q.flush(timeout=1)  # nothing left to wait for


def test_close_without_cancel_still_delivers_everything():
    got: list[str] = []
    q = EmbeddingQueue(SlowEmbedder(delay=0.01), lambda keys, _v: got.extend(keys), batch_size=8)
    q.submit_many((f"k{i}", f"text {i}") for i in range(50))
    q.close()
    assert got == [f"k{i}" for i in range(50)]
    assert q.cancelled == 0


def test_at_exit_must_be_callable():
    with pytest.raises(ValueError, match="at_exit must be callable"):
        EmbeddingQueue(HashingEmbedder(8), lambda k, v: None, at_exit="save")  # type: ignore[arg-type]


# ------------------------------------------------------------------ interpreter exit


MODEL_SCRIPT = """
import sys
from marsys_mem.model.messages import Message
from marsys_mem.patterns import HierarchicalMemory, RAGMemory

if sys.argv[1] == "hierarchical":
    mem = HierarchicalMemory()
    rag = mem.archive
    mem.archive_search("load the model before adding")
else:
    mem = rag = RAGMemory()
    mem.search("load the model before adding")
words = "the quarterly planning meeting moved to the large room on the third floor".split()
for i in range(400):
    text = f"note {i}: " + " ".join(words[(i + j) % len(words)] for j in range(60))
    mem.add(Message.user(text))
print("pending", rag.pending, flush=True)
# no close(): the script just ends
"""


@pytest.mark.slow
def test_script_ending_without_close_exits_cleanly_with_the_real_model():
    """Issue 9.1: the worker was inside torch at finalization: abort, exit code 134."""
    for kind in ("hierarchical", "rag", "hierarchical"):
        result = subprocess.run(
            [sys.executable, "-c", MODEL_SCRIPT, kind],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert "terminate called" not in result.stderr, (kind, result.stderr[-2000:])
        assert result.returncode == 0, (kind, result.returncode, result.stderr[-2000:])
        pending = int(result.stdout.split()[-1])
        assert pending > 100, f"{kind}: embeddings were not pending at exit ({pending})"


def test_exit_cancels_a_long_backlog_after_the_batch_in_flight():
    result, elapsed = run_child(
        SLOW_EMBEDDER
        + """
from marsys_mem.retrieval.ingest import EmbeddingQueue

got = []

def report():
    print("delivered", len(got), "cancelled", q.cancelled, "closed", q.closed, flush=True)

q = EmbeddingQueue(SlowEmbedder(delay=0.3), lambda keys, v: got.extend(keys),
                   batch_size=10, at_exit=report)
q.submit_many((f"k{i}", f"text {i}") for i in range(20_000))
time.sleep(0.1)  # the first batch is being embedded
"""
    )
    assert result.returncode == 0, result.stderr
    words = result.stdout.split()
    delivered, cancelled = int(words[1]), int(words[3])
    assert delivered >= 10  # the batch in flight finished: not cut off
    assert delivered + cancelled == 20_000
    assert words[5] == "True"
    assert elapsed < 20  # draining would take 20_000 / 10 * 0.3 s = 10 minutes


def test_exit_waits_no_longer_than_exit_timeout():
    result, elapsed = run_child(
        """
import threading
import marsys_mem.retrieval.ingest as ingest
from marsys_mem.retrieval.embeddings import HashingEmbedder

ingest.EXIT_TIMEOUT = 0.5
stuck = threading.Event()

class Stuck(HashingEmbedder):
    def embed(self, texts):
        stuck.set()
        threading.Event().wait(60)  # a model that never returns (in Python: harmless)
        return super().embed(texts)

q = ingest.EmbeddingQueue(Stuck(8), lambda k, v: None, at_exit=lambda: print("at_exit ran"))
q.submit("a", "text")
stuck.wait(10)
"""
    )
    assert result.returncode == 0, result.stderr
    assert "still busy" in result.stderr
    assert "at_exit ran" in result.stdout
    assert elapsed < 15


def test_submit_after_the_exit_hook_is_embedded_inline():
    """An exit handler that runs after the hook still gets its texts embedded."""
    result, _ = run_child(
        """
import atexit
from marsys_mem.retrieval.embeddings import HashingEmbedder
from marsys_mem.retrieval.ingest import EmbeddingQueue

got = {}

def late_writer():  # registered before the first queue: runs after the queues' hook
    q.submit_many([("late1", "written during exit"), ("late2", "also during exit")])
    q.flush(timeout=5)
    print("late", sorted(k for k in got if k.startswith("late")), "closed", q.closed)

atexit.register(late_writer)
q = EmbeddingQueue(HashingEmbedder(8), lambda keys, v: got.update(zip(keys, v)))
q.submit("early", "text")
"""
    )
    assert result.returncode == 0, result.stderr
    assert "late ['late1', 'late2'] closed True" in result.stdout


def test_closed_queues_are_left_alone_at_exit():
    result, _ = run_child(
        """
from marsys_mem.retrieval.embeddings import HashingEmbedder
from marsys_mem.retrieval.ingest import EmbeddingQueue

q = EmbeddingQueue(HashingEmbedder(8), lambda k, v: None, at_exit=lambda: print("at_exit ran"))
q.submit("a", "text")
q.close()
"""
    )
    assert result.returncode == 0, result.stderr
    assert "at_exit ran" not in result.stdout


def test_rag_with_index_path_saves_what_was_embedded_at_exit(tmp_path):
    """A RAGMemory never closed keeps its finished vectors; the next one embeds the rest."""
    db, idx = tmp_path / "mem.db", tmp_path / "rag.index"
    result, _ = run_child(
        SLOW_EMBEDDER
        + f"""
from marsys_mem.patterns import RAGMemory
from marsys_mem.store import SQLiteStore

mem = RAGMemory(SlowEmbedder(delay=0.05), store=SQLiteStore({str(db)!r}),
                index_path={str(idx)!r}, batch_size=20)
mem.add_many([f"message {{i}} about topic {{i % 13}}" for i in range(3000)])
time.sleep(0.5)
print("pending", mem.pending, flush=True)
"""
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.split()[-1]) > 0  # the exit came with embeddings pending
    emb = HashingEmbedder(16)
    saved = FaissIndex.load(idx, expected_dim=16, expected_meta={"embedder": emb.name})
    store = SQLiteStore(db)
    try:
        stored = [m.message_id for m in store.load_messages(("default", "rag", "main"))]
        assert len(stored) == len(set(stored)) == 3000
        assert 0 < len(saved) < 3000
        assert set(saved.ids()) <= set(stored)
        with RAGMemory(emb, store=store, index_path=idx) as mem:
            mem.flush()
        again = FaissIndex.load(idx, expected_dim=16)
        assert sorted(again.ids()) == sorted(stored)
    finally:
        store.close()
