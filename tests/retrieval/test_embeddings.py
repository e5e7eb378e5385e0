import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence

import numpy as np
import pytest

from marsys_mem.exceptions import EmbeddingError, MissingDependencyError
from marsys_mem.retrieval.embeddings import (
    PACKAGED_MODEL_NAME,
    Embedder,
    HashingEmbedder,
    SentenceTransformerEmbedder,
    check_vectors,
    default_embedder,
    embeddings_available,
)
from marsys_mem.retrieval.ingest import EmbeddingQueue

QUEUE_THREAD = "marsys-mem-embedding-queue"


def queue_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == QUEUE_THREAD]


@pytest.fixture(autouse=True)
def no_leaked_queue_threads() -> Iterator[None]:
    before = set(queue_threads())
    yield
    leaked = [t for t in queue_threads() if t not in before]
    assert not leaked, f"embedding queue threads left running: {leaked}"


# ------------------------------------------------------------------ check_vectors


def test_check_vectors_converts_to_contiguous_float32():
    v = np.asfortranarray(np.ones((3, 4), dtype=np.float64))
    out = check_vectors(v, 4)
    assert out.dtype == np.float32
    assert out.flags.c_contiguous
    assert out.shape == (3, 4)
    assert check_vectors(np.zeros((0, 4)), 4).shape == (0, 4)


@pytest.mark.parametrize(
    ("vectors", "match"),
    [
        (np.ones(4), r"2-D .*v\[None, :\]"),
        (np.ones((2, 2, 4)), "2-D"),
        (np.ones((2, 3)), "dimension 3, expected 4"),
        (np.array([[0, 0, 0, np.nan]]), "1 of 1 vectors hold NaN"),
        (np.array([[1, 1, 1, 1], [0, 0, np.inf, 0]]), r"first: row 1"),
        ([["a", "b", "c", "d"]], "numeric"),
    ],
)
def test_check_vectors_rejects(vectors, match):
    with pytest.raises(EmbeddingError, match=match):
        check_vectors(vectors, 4)


def test_embedding_error_is_value_error():
    with pytest.raises(ValueError, match="dimension"):
        check_vectors(np.ones((1, 3)), 4)


# ------------------------------------------------------------------ HashingEmbedder


def test_hashing_shapes_dtype_and_unit_rows():
    emb = HashingEmbedder(32)
    v = emb.embed(["Hello world", "the quick brown fox jumps", "a"])
    assert v.shape == (3, 32)
    assert v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, rtol=1e-6)
    assert emb.embed([]).shape == (0, 32)
    assert emb.dim == 32
    assert isinstance(emb, Embedder)


def test_hashing_is_lowercased_and_word_based():
    emb = HashingEmbedder(128)
    a, b, c = emb.embed(["Cats like FISH!", "cats like fish", "stock markets fell today"])
    assert float(a @ b) == pytest.approx(1.0, abs=1e-6)
    assert float(a @ c) < 0.5


def test_hashing_empty_texts_map_to_one_fixed_unit_vector():
    emb = HashingEmbedder(16)
    v = emb.embed(["", "   ", "?!..", "word"])
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(v[0], v[1])
    np.testing.assert_array_equal(v[0], v[2])
    assert np.count_nonzero(v[0]) == 1
    assert not np.array_equal(v[0], v[3])


def test_hashing_ngram_and_name():
    unigrams = HashingEmbedder(64, ngram=(1, 1))
    bigrams = HashingEmbedder(64, ngram=(1, 2))
    assert unigrams.name != bigrams.name
    assert HashingEmbedder(64).name == bigrams.name
    assert HashingEmbedder(63).name != bigrams.name
    # word order only matters with bigrams
    x, y = unigrams.embed(["dog bites man", "man bites dog"])
    assert float(x @ y) == pytest.approx(1.0, abs=1e-6)
    x, y = bigrams.embed(["dog bites man", "man bites dog"])
    assert float(x @ y) < 0.99


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dim": 0}, "dim"),
        ({"dim": True}, "dim"),
        ({"dim": 2.0}, "dim"),
        ({"ngram": (0, 1)}, "ngram"),
        ({"ngram": (2, 1)}, "ngram"),
        ({"ngram": [1, 2]}, "ngram"),
    ],
)
def test_hashing_rejects_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HashingEmbedder(**kwargs)


def test_embed_rejects_a_bare_string_and_non_strings():
    emb = HashingEmbedder(8)
    with pytest.raises(EmbeddingError, match=r"not one string: use \[text\]"):
        emb.embed("hello")
    with pytest.raises(EmbeddingError, match=r"texts\[1\] is int"):
        emb.embed(["ok", 3])  # type: ignore[list-item]


async def test_hashing_aembed_matches_embed():
    emb = HashingEmbedder(16)
    np.testing.assert_array_equal(await emb.aembed(["a b", "c"]), emb.embed(["a b", "c"]))


def test_hashing_is_deterministic_across_processes():
    texts = ["Hello world", "Déjà vu: ünïcode text", "", "numbers 123 and 4.5"]
    here = HashingEmbedder(64).embed(texts)
    code = (
        "import json, sys; from marsys_mem.retrieval.embeddings import HashingEmbedder;"
        "texts = json.loads(sys.argv[1]);"
        "print(json.dumps(HashingEmbedder(64).embed(texts).tolist()))"
    )
    import json

    for seed in ("1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run(
            [sys.executable, "-c", code, json.dumps(texts)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        there = np.array(json.loads(out.stdout), dtype=np.float32)
        np.testing.assert_array_equal(here, there)


# ------------------------------------------------------- SentenceTransformerEmbedder


@pytest.fixture(scope="module", params=["torch", "onnx"])
def minilm(request, tmp_path_factory) -> SentenceTransformerEmbedder:
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    emb = SentenceTransformerEmbedder(
        num_threads=1, backend=request.param, onnx_cache_dir=tmp_path_factory.mktemp("onnx")
    )
    emb.load()
    assert emb.active_backend == request.param
    return emb


def test_minilm_dim_name_and_unit_rows(minilm):
    assert minilm.dim == 384
    assert minilm.name == f"sentence-transformers:{PACKAGED_MODEL_NAME}"
    assert minilm.loaded
    v = minilm.embed(["A sentence.", ""])
    assert v.shape == (2, 384)
    assert v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, rtol=1e-5)
    assert minilm.embed([]).shape == (0, 384)
    assert isinstance(minilm, Embedder)


def test_minilm_is_semantic(minilm):
    query, weather, stocks = minilm.embed(
        [
            "How is the weather in Paris?",
            "Paris forecast: sunny and warm",
            "The stock market fell 3%",
        ]
    )
    assert float(query @ weather) > float(query @ stocks) + 0.2


def test_minilm_cache_counts_hits(minilm):
    minilm.cache_clear()
    texts = ["first text for the cache", "second text for the cache"]
    first = minilm.embed(texts)
    assert (minilm.encoded, minilm.cache_hits) == (2, 0)
    again = minilm.embed([texts[1], texts[0], texts[1], "a third text"])
    assert (minilm.encoded, minilm.cache_hits) == (3, 3)
    np.testing.assert_array_equal(again[0], first[1])
    np.testing.assert_array_equal(again[1], first[0])
    np.testing.assert_array_equal(again[2], first[1])
    # a duplicate inside one call is embedded once
    minilm.cache_clear()
    minilm.embed(["same", "same", "same"])
    assert (minilm.encoded, minilm.cache_hits) == (1, 2)


def test_minilm_batch_equals_one_by_one(minilm):
    texts = [
        "short",
        "a somewhat longer sentence about memory for multi-agent systems",
        "Paris forecast: sunny and warm",
        "",
        "numbers 1 2 3 and punctuation!?",
    ]
    minilm.cache_clear()
    batch = minilm.embed(texts)
    minilm.cache_clear()
    single = np.vstack([minilm.embed([t]) for t in texts])
    np.testing.assert_allclose(batch, single, atol=1e-5)


async def test_minilm_aembed(minilm):
    v = await minilm.aembed(["hello there"])
    np.testing.assert_array_equal(v, minilm.embed(["hello there"]))


def test_minilm_lru_cache_evicts_oldest():
    emb = SentenceTransformerEmbedder(cache_size=2)
    calls: list[list[str]] = []

    def fake_encode(texts: list[str]) -> np.ndarray:
        calls.append(texts)
        return HashingEmbedder(384).embed(texts)

    emb._encode = fake_encode  # type: ignore[method-assign]
    emb.embed(["a", "b"])
    emb.embed(["a"])  # a is now most recent
    emb.embed(["c"])  # evicts b
    emb.embed(["a", "b"])
    assert calls == [["a", "b"], ["c"], ["b"]]
    assert (emb.encoded, emb.cache_hits) == (4, 2)


def test_minilm_cache_size_zero_disables_cache():
    emb = SentenceTransformerEmbedder(cache_size=0)
    emb._encode = lambda texts: HashingEmbedder(384).embed(texts)  # type: ignore[method-assign]
    emb.embed(["a"])
    emb.embed(["a"])
    assert (emb.encoded, emb.cache_hits) == (2, 0)
    assert not emb._cache


def test_sentence_transformer_embedder_is_lazy():
    emb = SentenceTransformerEmbedder()
    assert not emb.loaded
    assert emb.dim == 384  # known for the default model without loading it
    assert isinstance(emb, Embedder)
    assert not emb.loaded


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"cache_size": -1}, "cache_size"),
        ({"num_threads": 0}, "num_threads"),
    ],
)
def test_sentence_transformer_rejects_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SentenceTransformerEmbedder(**kwargs)


def test_missing_extra_names_the_extra_and_cpu_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    with pytest.raises(MissingDependencyError) as info:
        SentenceTransformerEmbedder()
    message = str(info.value)
    assert "marsys-mem[embeddings]" in message
    assert "pip install 'torch==2.13.0+cpu'" in message
    assert isinstance(info.value, ImportError)
    assert not embeddings_available()
    assert default_embedder() is None


def test_missing_extra_at_load_time(monkeypatch):
    # torch: a cached ONNX export would run without sentence-transformers
    emb = SentenceTransformerEmbedder(backend="torch")
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    with pytest.raises(MissingDependencyError, match=r"torch==2\.13\.0\+cpu"):
        emb.embed(["x"])


def test_unknown_model_is_not_downloaded(tmp_path):
    emb = SentenceTransformerEmbedder("marsys-mem-tests/no-such-model")
    assert emb.name == "sentence-transformers:marsys-mem-tests/no-such-model"
    with pytest.raises(MissingDependencyError, match="offline"):
        emb.load()


def test_model_folder_name_is_its_path(tmp_path):
    emb = SentenceTransformerEmbedder(tmp_path)
    assert emb.name == f"sentence-transformers:{tmp_path.resolve()}"
    with pytest.raises(MissingDependencyError):
        emb.load()


def test_default_embedder_is_minilm_when_installed():
    emb = default_embedder()
    assert isinstance(emb, SentenceTransformerEmbedder)
    assert emb.name == f"sentence-transformers:{PACKAGED_MODEL_NAME}"
    assert embeddings_available()


# ----------------------------------------------------------------- EmbeddingQueue


class Recorder:
    """Wraps an embedder, recording batches; can block or fail on demand."""

    def __init__(self, dim: int = 16) -> None:
        self.inner = HashingEmbedder(dim)
        self.batches: list[list[str]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()
        self.fail_on: str | None = None

    @property
    def dim(self) -> int:
        return self.inner.dim

    @property
    def name(self) -> str:
        return "recorder"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.started.set()
        self.gate.wait(10)
        self.batches.append(list(texts))
        if self.fail_on is not None and self.fail_on in texts:
            raise RuntimeError(f"cannot embed {self.fail_on}")
        return self.inner.embed(texts)

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed(texts)


class Sink:
    def __init__(self) -> None:
        self.keys: list[str] = []
        self.vectors: list[np.ndarray] = []
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, keys: list[str], vectors: np.ndarray) -> None:
        with self.lock:
            self.calls += 1
            self.keys.extend(keys)
            self.vectors.extend(vectors)


def test_queue_delivers_all_keys_in_order_in_batches():
    rec, sink = Recorder(), Sink()
    texts = {f"k{i}": f"text number {i}" for i in range(200)}
    with EmbeddingQueue(rec, sink, batch_size=16) as q:
        for key, text in texts.items():
            q.submit(key, text)
        q.flush()
        assert q.pending == 0
    assert sink.keys == list(texts)
    assert all(1 <= len(b) <= 16 for b in rec.batches)
    assert sum(len(b) for b in rec.batches) == 200
    expected = HashingEmbedder(16).embed(list(texts.values()))
    np.testing.assert_array_equal(np.stack(sink.vectors), expected)


def test_queue_flush_waits_and_times_out():
    rec, sink = Recorder(), Sink()
    rec.gate.clear()
    q = EmbeddingQueue(rec, sink, batch_size=4)
    try:
        q.submit("a", "alpha")
        assert rec.started.wait(5)
        with pytest.raises(TimeoutError, match="1 texts still pending"):
            q.flush(timeout=0.05)
        assert q.pending == 1
        assert sink.keys == []
        threading.Timer(0.05, rec.gate.set).start()
        q.flush()
        assert sink.keys == ["a"]
        assert q.pending == 0
    finally:
        rec.gate.set()
        q.close()


def test_queue_coalesces_a_key_submitted_twice_while_waiting():
    rec, sink = Recorder(), Sink()
    rec.gate.clear()
    with EmbeddingQueue(rec, sink, batch_size=8) as q:
        q.submit("first", "blocks the worker")
        assert rec.started.wait(5)
        q.submit("k", "old text")
        q.submit("other", "x")
        q.submit("k", "new text")
        assert q.pending == 3
        rec.gate.set()
        q.flush()
    assert sink.keys == ["first", "k", "other"]
    assert rec.batches[1] == ["new text", "x"]


def test_queue_embedder_error_surfaces_once_and_worker_continues():
    rec, sink = Recorder(), Sink()
    rec.fail_on = "boom"
    with EmbeddingQueue(rec, sink, batch_size=1) as q:
        q.submit("ok1", "fine")
        q.submit("bad", "boom")
        q.submit("ok2", "also fine")
        with pytest.raises(EmbeddingError, match=r"1 texts failed \(keys 'bad'\)") as info:
            q.flush()
        assert isinstance(info.value.__cause__, RuntimeError)
        q.flush()  # reported once
        q.submit("ok3", "after the error")
        q.flush()
    assert sink.keys == ["ok1", "ok2", "ok3"]


def test_queue_callback_error_surfaces():
    def on_vectors(keys: list[str], vectors: np.ndarray) -> None:
        raise KeyError("index is gone")

    q = EmbeddingQueue(HashingEmbedder(8), on_vectors)
    q.submit("a", "x")
    with pytest.raises(EmbeddingError, match="KeyError") as info:
        q.flush()
    assert isinstance(info.value.__cause__, KeyError)
    q.close()


def test_queue_bad_embedder_output_surfaces():
    class WrongRows(Recorder):
        def embed(self, texts: Sequence[str]) -> np.ndarray:
            return np.ones((len(texts) + 1, self.dim), dtype=np.float32)

    with EmbeddingQueue(WrongRows(), Sink()) as q:
        q.submit("a", "x")
        with pytest.raises(EmbeddingError, match="2 rows for 1 texts"):
            q.flush()


def test_queue_unreported_error_raised_by_close():
    rec = Recorder()
    rec.fail_on = "boom"
    q = EmbeddingQueue(rec, Sink())
    q.submit("bad", "boom")
    with pytest.raises(EmbeddingError, match="bad"):
        q.close()
    q.close()  # idempotent, nothing left to report


def test_queue_exit_with_exception_does_not_mask_it(caplog):
    rec = Recorder()
    rec.fail_on = "boom"

    def body() -> None:
        with EmbeddingQueue(rec, Sink()) as q:
            q.submit("bad", "boom")
            raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        body()
    assert "unreported error" in caplog.text


def test_queue_close_drains_is_idempotent_and_stops_thread():
    rec, sink = Recorder(), Sink()
    q = EmbeddingQueue(rec, sink, batch_size=3)
    thread = q._thread
    assert thread in threading.enumerate()
    for i in range(10):
        q.submit(str(i), f"text {i}")
    q.close()
    assert sink.keys == [str(i) for i in range(10)]
    assert q.closed
    assert not thread.is_alive()
    assert thread not in threading.enumerate()
    q.close()
    with pytest.raises(EmbeddingError, match="closed"):
        q.submit("late", "text")
    q.flush()  # nothing pending: returns


def test_queue_submit_validation_enqueues_nothing():
    sink = Sink()
    with EmbeddingQueue(HashingEmbedder(8), sink) as q:
        with pytest.raises(EmbeddingError, match="item 1"):
            q.submit_many([("a", "x"), ("b", 3)])  # type: ignore[list-item]
        with pytest.raises(EmbeddingError, match="item 0"):
            q.submit(None, "x")  # type: ignore[arg-type]
        assert q.pending == 0
        q.submit("", "")  # any str is accepted
        q.flush()
    assert sink.keys == [""]


def test_queue_back_pressure_blocks_submit_until_room():
    rec, sink = Recorder(), Sink()
    rec.gate.clear()
    with EmbeddingQueue(rec, sink, batch_size=1, max_pending=2) as q:
        q.submit("0", "taken by the worker")
        assert rec.started.wait(5)
        q.submit("1", "a")
        q.submit("2", "b")
        done = threading.Event()

        def blocked() -> None:
            q.submit("3", "c")
            done.set()

        t = threading.Thread(target=blocked)
        t.start()
        assert not done.wait(0.1)
        rec.gate.set()
        assert done.wait(5)
        t.join()
        q.flush()
    assert sink.keys == ["0", "1", "2", "3"]


def test_queue_flush_inside_callback_is_reported():
    holder: dict[str, EmbeddingQueue] = {}

    def on_vectors(keys: list[str], vectors: np.ndarray) -> None:
        holder["q"].flush()

    with EmbeddingQueue(HashingEmbedder(8), on_vectors) as q:
        holder["q"] = q
        q.submit("a", "x")
        with pytest.raises(EmbeddingError, match="deadlock"):
            q.flush()


def test_queue_concurrent_submitters():
    sink = Sink()
    with EmbeddingQueue(HashingEmbedder(8), sink, batch_size=32) as q:

        def worker(n: int) -> None:
            for i in range(250):
                q.submit(f"{n}-{i}", f"text {n} {i}")

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        q.flush()
    assert sorted(sink.keys) == sorted(f"{n}-{i}" for n in range(4) for i in range(250))
    for n in range(4):  # each submitter's order is kept
        mine = [k for k in sink.keys if k.startswith(f"{n}-")]
        assert mine == [f"{n}-{i}" for i in range(250)]


async def test_queue_aflush():
    sink = Sink()
    with EmbeddingQueue(HashingEmbedder(8), sink) as q:
        q.submit("a", "x")
        await q.aflush()
    assert sink.keys == ["a"]
    await asyncio.sleep(0)


def test_queue_rejects_bad_settings():
    with pytest.raises(ValueError, match="batch_size"):
        EmbeddingQueue(HashingEmbedder(8), Sink(), batch_size=0)
    with pytest.raises(ValueError, match="max_pending"):
        EmbeddingQueue(HashingEmbedder(8), Sink(), max_pending=0)
    with pytest.raises(ValueError, match="callable"):
        EmbeddingQueue(HashingEmbedder(8), None)  # type: ignore[arg-type]


def test_queue_feeds_minilm(minilm):
    sink = Sink()
    with EmbeddingQueue(minilm, sink, batch_size=8) as q:
        q.submit_many((f"k{i}", f"sentence {i} about cats") for i in range(20))
        q.flush()
    assert sink.keys == [f"k{i}" for i in range(20)]
    np.testing.assert_allclose(
        np.stack(sink.vectors),
        minilm.embed([f"sentence {i} about cats" for i in range(20)]),
        atol=1e-6,
    )
