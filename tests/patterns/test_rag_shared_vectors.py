"""RAGMemory with vectors in its store: each message embedded once, every memory catches up."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from marsys_mem.exceptions import EmbeddingError
from marsys_mem.model.messages import Message
from marsys_mem.patterns import RAGMemory
from marsys_mem.retrieval.embeddings import HashingEmbedder
from marsys_mem.store import InMemoryStore, SQLiteStore

KEY = ("ns", "rag", "main")


class CountingEmbedder(HashingEmbedder):
    """A HashingEmbedder that records every text it embeds."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__(dim)
        self.texts: list[str] = []
        self._count_lock = threading.Lock()

    def embed(self, texts):  # type: ignore[no-untyped-def]
        with self._count_lock:
            self.texts.extend(texts)
        return super().embed(texts)


# A second process: the same RAGMemory on the same SQLite file, driven line by line.
CHILD = textwrap.dedent(
    """
    import json, sys, threading
    from marsys_mem.patterns import RAGMemory
    from marsys_mem.retrieval.embeddings import HashingEmbedder
    from marsys_mem.store import SQLiteStore

    class Counting(HashingEmbedder):
        texts = []
        def embed(self, texts):
            Counting.texts.extend(texts)
            return super().embed(texts)

    store = SQLiteStore(sys.argv[1])
    mem = RAGMemory(Counting(64), store=store, key=("ns", "rag", "main"))
    print(json.dumps({"ready": len(mem)}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "add":
            out = mem.add_many(cmd["texts"])
            mem.flush()
        elif cmd["op"] == "search":
            out = [h.text for h in mem.search(cmd["query"], cmd["k"], None, mode="dense")]
        elif cmd["op"] == "embedded":
            out = list(Counting.texts)
        else:
            break
        print(json.dumps(out), flush=True)
    mem.close()
    store.close()
    """
)


class Child:
    """A RAGMemory in another process on the same store file."""

    def __init__(self, db: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(db)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._read() == {"ready": 0}

    def _read(self) -> Any:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the child process died (exit code {self.proc.poll()})"
        return json.loads(line)

    def call(self, **cmd: Any) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def test_two_processes_share_vectors_without_re_embedding(tmp_path: Path) -> None:
    """Each process finds the other's messages after one catch-up, embedding only its own."""
    db = tmp_path / "shared.db"
    SQLiteStore(db).close()
    child = Child(db)
    emb = CountingEmbedder()
    store = SQLiteStore(db)
    try:
        with RAGMemory(emb, store=store, key=KEY) as mem:
            theirs = [f"the child wrote note {i} about topic {i * 7}" for i in range(10)]
            child.call(op="add", texts=theirs)
            # one search: the child's ten messages are found, with the child's vectors
            hit = mem.search("the child wrote note 3 about topic 21", 1, None, mode="dense")[0]
            assert hit.text == theirs[3]
            assert len(mem) == 10
            assert emb.texts == ["the child wrote note 3 about topic 21"]  # only the query

            ours = ["the parent parked the car on level 4", "the parent likes green tea"]
            mem.add_many(ours)
            mem.flush()  # the vectors are in the store once flush returns
            found = child.call(op="search", query="the parent parked the car on level 4", k=1)
            assert found == [ours[0]]
            embedded_by_child = child.call(op="embedded")
            assert sorted(embedded_by_child) == sorted([*theirs, found[0]])  # + its query

            # a deletion by one process is seen by the other's next catch-up
            mem.remove(mem.search("green tea", k=1)[0].id)
            texts = child.call(op="search", query="the parent likes green tea", k=20)
            assert ours[1] not in texts
            assert len(texts) == 11
        assert sorted(emb.texts[1:]) == sorted([*ours, "green tea"])  # never a child's text
        assert store.integrity_check() == "ok"
        assert len(store.load_vectors(KEY, emb.name)) == 11
    finally:
        child.close()
        store.close()


def test_memories_on_one_store_embed_each_message_once() -> None:
    """Two memories on one InMemoryStore: a stored vector is reused, a missing one made."""
    store = InMemoryStore()
    a_emb, b_emb = CountingEmbedder(), CountingEmbedder()
    with (
        RAGMemory(a_emb, store=store, key=KEY) as a,
        RAGMemory(b_emb, store=store, key=KEY) as b,
    ):
        a.add_many(["octopuses have three hearts", "the offsite is next quarter"])
        a.flush()
        assert b.search("octopus hearts", k=1)[0].text == "octopuses have three hearts"
        assert b_emb.texts == ["octopus hearts"]
        # a message appended straight to the store has no vector: the first memory to
        # catch up embeds and stores it, the other one then reuses that vector
        store.append_messages(KEY, [Message.user("the spare key is under the flowerpot")])
        assert b.search("spare key", k=1)[0].text == "the spare key is under the flowerpot"
        assert b_emb.texts[-2:] == ["the spare key is under the flowerpot", "spare key"]
        assert a.search("spare key", k=1)[0].text == "the spare key is under the flowerpot"
        assert a_emb.texts[-1] == "spare key"
        assert "the spare key is under the flowerpot" not in a_emb.texts
        assert a.refresh() == (0, 0)


def test_inline_adds_store_message_and_vector_in_one_transaction() -> None:
    """background=False: the message and its vector are written by one batch."""
    store = InMemoryStore()
    emb = CountingEmbedder()
    with RAGMemory(emb, store=store, key=KEY, background=False) as mem:
        ids = mem.add_many(["alpha beta", "gamma delta"])
        page = store.load_vectors(KEY, emb.name)
        assert list(page.message_ids) == ids
        np.testing.assert_array_equal(
            page.vectors, HashingEmbedder(64).embed(["alpha beta", "gamma delta"])
        )


def test_reopening_reads_stored_vectors_and_catches_up_after_its_cursor(tmp_path: Path) -> None:
    """A memory opened on a store full of vectors embeds nothing; later ones arrive by cursor."""
    with SQLiteStore(tmp_path / "m.db") as store:
        first = CountingEmbedder()
        with RAGMemory(first, store=store, key=KEY) as mem:
            mem.add_many([f"message number {i}" for i in range(50)])
        again = CountingEmbedder()
        with RAGMemory(again, store=store, key=KEY) as mem:
            assert again.texts == []
            before = mem._shared_vectors.vector_cursor
            with RAGMemory(CountingEmbedder(), store=store, key=KEY) as other:
                other.add("a late message")
            assert mem.refresh() == (1, 0)
            assert mem._shared_vectors.vector_cursor > before
            assert mem.search("a late message", 1, None, mode="dense")[0].text == "a late message"
            assert again.texts == ["a late message"]  # the query only


def test_vectors_of_another_dimension_under_the_same_name_are_logged_not_used(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A misbehaving embedder (one name, two dimensions): errors logged, search still works."""
    store = InMemoryStore()
    emb = CountingEmbedder()
    with RAGMemory(emb, store=store, key=KEY) as mem:
        mem.add("the first message")
    liar = CountingEmbedder(dim=8)
    liar._name = emb.name
    with caplog.at_level(logging.ERROR, logger="marsys_mem.patterns.rag"):
        with RAGMemory(liar, store=store, key=KEY) as mem:
            mem.add("the second message")
            hits = mem.search("the second message", 2, None, mode="dense")
            assert hits[0].text == "the second message"
            assert len(hits) == 2  # its own vectors, not the store's 64-D ones
    assert "64-D vectors under the name of this 8-D embedder" in caplog.text
    assert "could not store" in caplog.text
    assert len(store.load_vectors(KEY, emb.name)) == 1  # only the first, 64-D


class BoomEmbedder(CountingEmbedder):
    """Fails on texts containing 'boom' (a model that cannot embed them, here)."""

    def embed(self, texts):  # type: ignore[no-untyped-def]
        if any("boom" in t for t in texts):
            raise RuntimeError("model crashed")
        return super().embed(texts)


def test_a_vector_another_memory_stored_heals_a_local_failure() -> None:
    """A message this memory failed to embed gets the vector another memory stored."""
    store = InMemoryStore()
    with (
        RAGMemory(BoomEmbedder(), store=store, key=KEY) as a,
        RAGMemory(CountingEmbedder(), store=store, key=KEY) as b,
    ):
        mid = a.add("the boom box is in the attic")
        with pytest.raises(EmbeddingError, match="model crashed"):
            a.flush()
        assert mid in a.failed
        assert b.search("attic", 1, None, mode="dense")[0].id == mid  # b embeds and stores it
        hits = a.search("where is the box?", 1, None, mode="dense")
        assert hits[0].id == mid  # found by its (adopted) vector
        assert a.failed == {}
        a.flush()  # nothing left to report
