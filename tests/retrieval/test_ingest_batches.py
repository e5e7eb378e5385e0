"""Batches composed to waste no padding: the queue's windows, the rebuild path, the ONNX model.

A model pads each batch to its longest text; real messages range from "ok" to paragraphs.
The embedding queue takes what is waiting (a window), sorts it by length (the embedder's
token counts when it has them) and cuts batches of similar lengths, while still delivering
in submission order.
"""

import itertools
import threading
from collections.abc import Sequence

import numpy as np
import pytest

from marsys_mem.model.messages import Message
from marsys_mem.patterns import RAGMemory
from marsys_mem.retrieval.embeddings import HashingEmbedder, length_batches, text_lengths
from marsys_mem.retrieval.ingest import EmbeddingQueue
from marsys_mem.store import InMemoryStore

TEXTS = [("word " * n).strip() for n in (1, 40, 3, 25, 2, 60, 7, 30, 1, 12, 45, 5)] * 5


class Recorder:
    """HashingEmbedder recording each call's texts; can hold the worker; may count tokens."""

    def __init__(self, *, tokens: bool = False, fail_on: str | None = None) -> None:
        self.inner = HashingEmbedder(16)
        self.dim, self.name = 16, "recorder"
        self.batches: list[list[str]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()
        self.fail_on = fail_on
        if tokens:  # a "tokenizer" that disagrees with characters: counts the letter x
            self.token_counts = lambda texts: [t.count("x") for t in texts]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.started.set()
        self.gate.wait(10)
        self.batches.append(list(texts))
        if self.fail_on is not None and self.fail_on in texts:
            raise RuntimeError("cannot embed that")
        return self.inner.embed(texts)

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed(texts)


def collect() -> tuple[list[str], list[np.ndarray], object]:
    keys: list[str] = []
    vectors: list[np.ndarray] = []

    def sink(k: list[str], v: np.ndarray) -> None:
        keys.extend(k)
        vectors.extend(v)

    return keys, vectors, sink


def sorted_across(batches: list[list[str]], length) -> bool:  # type: ignore[no-untyped-def]
    """Each batch's shortest text is at least as long as the next batch's longest."""
    return all(min(map(length, a)) >= max(map(length, b)) for a, b in itertools.pairwise(batches))


def test_length_batches_longest_first_ties_in_order():
    assert length_batches([1, 5, 5, 2], 3) == [[1, 2, 3], [0]]
    assert length_batches([], 4) == []


def test_text_lengths_are_token_counts_when_the_embedder_has_them():
    assert text_lengths(HashingEmbedder(8), ["ab", "abcd"]) == [2, 4]
    assert text_lengths(Recorder(tokens=True), ["xx", "abcdx"]) == [2, 1]


def test_a_window_is_cut_into_batches_of_similar_length_and_delivered_in_order():
    rec = Recorder()
    rec.gate.clear()
    keys, vectors, sink = collect()
    with EmbeddingQueue(rec, sink, batch_size=8) as q:  # type: ignore[arg-type]
        q.submit("first", "holds the worker")
        assert rec.started.wait(5)
        q.submit_many((f"k{i}", t) for i, t in enumerate(TEXTS))  # waiting together
        rec.gate.set()
        q.flush()
    window = rec.batches[1:]
    assert all(len(b) <= 8 for b in window)
    assert sum(len(b) for b in window) == len(TEXTS)
    assert sorted_across(window, len)
    assert keys == ["first"] + [f"k{i}" for i in range(len(TEXTS))]  # submission order
    expected = HashingEmbedder(16).embed(["holds the worker", *TEXTS])
    np.testing.assert_array_equal(np.stack(vectors), expected)


def test_batches_follow_the_embedders_token_counts():
    rec = Recorder(tokens=True)
    rec.gate.clear()
    texts = [f"{'x' * (i % 7)}{'y' * (50 - i)}" for i in range(40)]  # chars and x disagree
    keys, _, sink = collect()
    with EmbeddingQueue(rec, sink, batch_size=5) as q:  # type: ignore[arg-type]
        q.submit("first", "x")
        assert rec.started.wait(5)
        q.submit_many((f"k{i}", t) for i, t in enumerate(texts))
        rec.gate.set()
        q.flush()
    assert sorted_across(rec.batches[1:], lambda t: t.count("x"))
    assert keys == ["first"] + [f"k{i}" for i in range(40)]


def test_a_failing_batch_drops_only_its_texts():
    rec = Recorder(fail_on="word " * 59 + "word")
    keys, _, sink = collect()
    q = EmbeddingQueue(rec, sink, batch_size=4)  # type: ignore[arg-type]
    rec.gate.clear()
    q.submit("first", "x")
    assert rec.started.wait(5)
    q.submit_many((f"k{i}", t) for i, t in enumerate(TEXTS[:12]))
    rec.gate.set()
    with pytest.raises(Exception, match="4 texts failed"):
        q.flush()
    q.close()
    failed = {f"k{i}" for i in range(12) for b in rec.batches if TEXTS[i] in b and rec.fail_on in b}
    assert len(failed) == 4
    assert set(keys) == {"first"} | {f"k{i}" for i in range(12)} - failed


def test_window_bounds_how_much_is_taken_at_once():
    rec = Recorder()
    rec.gate.clear()
    keys, _, sink = collect()
    with EmbeddingQueue(rec, sink, batch_size=2, window=4) as q:  # type: ignore[arg-type]
        q.submit("first", "x")
        assert rec.started.wait(5)
        q.submit_many((f"k{i}", t) for i, t in enumerate(TEXTS[:10]))
        rec.gate.set()
        q.flush()
    # windows of 4: [k0..k3] [k4..k7] [k8, k9], each sorted inside
    assert [len(b) for b in rec.batches[1:]] == [2, 2, 2, 2, 2]
    assert set(rec.batches[1] + rec.batches[2]) == set(TEXTS[:4])
    assert keys == ["first"] + [f"k{i}" for i in range(10)]


def test_cancel_drops_the_rest_of_the_window_and_counts_it():
    rec = Recorder()
    rec.gate.clear()
    keys, _, sink = collect()
    q = EmbeddingQueue(rec, sink, batch_size=2)  # type: ignore[arg-type]
    q.submit_many((f"k{i}", t) for i, t in enumerate(TEXTS))
    assert rec.started.wait(5)
    threading.Timer(0.1, rec.gate.set).start()
    q.close(cancel=True)
    assert 0 < len(keys) < len(TEXTS)
    assert len(keys) + q.cancelled == len(TEXTS)
    assert q.pending == 0


def test_window_is_validated():
    with pytest.raises(ValueError, match="window"):
        EmbeddingQueue(HashingEmbedder(8), lambda k, v: None, window=0)


def test_rebuilding_from_a_store_embeds_in_batches_of_similar_length():
    store, key = InMemoryStore(), ("default", "rag", "main")
    store.append_messages(key, [Message.user(t) for t in TEXTS])
    rec = Recorder()
    with RAGMemory(rec, store=store, key=key, background=False, batch_size=8) as mem:  # type: ignore[arg-type]
        assert len(mem) == len(TEXTS)
        assert mem.pending == 0
        hit = mem.search("word", k=1, mode="dense")
        assert hit
    assert all(len(b) <= 8 for b in rec.batches)
    assert sorted_across(rec.batches[:-1], len)  # the last call embedded the query


def test_minilm_token_counts_agree_across_backends():
    pytest.importorskip("sentence_transformers")
    from marsys_mem.retrieval.embeddings import SentenceTransformerEmbedder, embeddings_available
    from marsys_mem.retrieval.onnx_backend import onnx_available

    if not embeddings_available():
        pytest.skip("the embeddings extra is not installed")
    texts = ["ok", "", "Café crème à Zürich? 🎉", "a very long message " * 100]
    counts = {}
    for backend in ("torch", "onnx"):
        emb = SentenceTransformerEmbedder(backend=backend, cache_size=0, num_threads=1)
        if backend == "onnx" and not onnx_available():
            continue
        counts[backend] = emb.token_counts(texts)
    assert counts["torch"][:2] == [3, 2]  # [CLS] ok [SEP]; [CLS] [SEP]
    assert counts["torch"][3] == 256  # truncated to the model's window
    assert counts.get("onnx", counts["torch"]) == counts["torch"]


def test_a_burst_of_single_submits_is_composed_as_one_window():
    rec = Recorder()
    keys, _, sink = collect()
    with EmbeddingQueue(rec, sink, batch_size=8, linger=0.5) as q:  # type: ignore[arg-type]
        for i, text in enumerate(TEXTS):  # one by one, faster than the linger
            q.submit(f"k{i}", text)
        assert rec.started.wait(10)  # no flush: the worker went when the burst paused
        q.flush()
    assert sum(len(b) for b in rec.batches) == len(TEXTS)
    assert sorted_across(rec.batches, len)  # all of it sorted, not the first 8 as they came
    assert keys == [f"k{i}" for i in range(len(TEXTS))]
