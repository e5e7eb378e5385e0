"""The ONNX Runtime backend: export once, check against PyTorch, cache, fall back; query cache.

Real exports of the packaged all-MiniLM-L6-v2 into temporary cache folders, real ONNX
Runtime sessions, real PyTorch for the comparison; no mocks of either.
"""

import json
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from marsys_mem.exceptions import EmbeddingError, MissingDependencyError
from marsys_mem.patterns import RAGMemory
from marsys_mem.retrieval import onnx_backend
from marsys_mem.retrieval.embeddings import (
    HashingEmbedder,
    QueryEmbedder,
    SentenceTransformerEmbedder,
    embed_query,
)
from marsys_mem.retrieval.ingest import EmbeddingQueue
from marsys_mem.retrieval.onnx_backend import default_cache_dir, export_folder, read_record

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

# realistic chat messages (100-200 characters) and questions, none of them in CHECK_TEXTS
TEXTS = [
    "I spent the afternoon cycling with Nadia along the river; we stopped for falafel at "
    "the place on Keller Lane and got soaked on the way back.",
    "Can someone look at WEB-2208? It is blocking the mobile team, and the release train "
    "leaves on Wednesday whether we are ready or not.",
    "My aunt is visiting from Tallinn in October, so I need to clear the spare room and "
    "finally fix the wobbly bed frame before she arrives.",
    "The movie we saw was weird, especially the ending: half the cinema laughed and the "
    "other half looked like they wanted their money back.",
    "Here are the notes from your call with Jonas Lindqvist: budget approved, hiring plan "
    "postponed to Q3, and the migration gets two more engineers.",
    "Which language is Kenji studying?",
    "When does the search team meet now?",
    "Thanks!",
]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("onnx-cache")


@pytest.fixture(scope="module")
def torch_emb() -> SentenceTransformerEmbedder:
    emb = SentenceTransformerEmbedder(backend="torch", num_threads=1, cache_size=0)
    emb.load()
    return emb


@pytest.fixture(scope="module")
def onnx_emb(cache_dir) -> SentenceTransformerEmbedder:
    emb = SentenceTransformerEmbedder(num_threads=1, cache_size=0, onnx_cache_dir=cache_dir)
    emb.load()
    return emb


def test_auto_picks_onnx_and_exports_once_into_the_cache(onnx_emb, cache_dir):
    assert onnx_emb.backend == "auto"
    assert onnx_emb.active_backend == "onnx"
    assert onnx_emb.onnx_exported
    folders = [p for p in cache_dir.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert len(folders) == 1
    assert sorted(p.name for p in folders[0].iterdir()) == [
        "export.json",
        "model.onnx",
        "tokenizer.json",
    ]
    assert not [p for p in cache_dir.iterdir() if p.name.startswith(".")]  # no temp left
    record = json.loads((folders[0] / "export.json").read_text())
    assert record["agrees"] is True
    assert record["min_cosine"] >= onnx_backend.AGREEMENT
    assert record["texts"] == len(onnx_backend.CHECK_TEXTS)
    assert record["dim"] == 384
    assert onnx_emb.onnx_record == read_record(folders[0])


def test_onnx_vectors_agree_with_torch(onnx_emb, torch_emb):
    a, b = onnx_emb.embed(TEXTS), torch_emb.embed(TEXTS)
    assert a.shape == b.shape == (len(TEXTS), 384)
    assert cosines(a, b).min() >= 0.999
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, rtol=1e-5)
    # one by one (no padding) gives the same vectors as a batch
    single = np.vstack([onnx_emb.embed([t]) for t in TEXTS])
    assert cosines(single, a).min() >= 0.9999
    assert onnx_emb.name == torch_emb.name  # interchangeable for a saved index


def test_second_load_uses_the_cached_export(onnx_emb, cache_dir):
    (folder,) = [p for p in cache_dir.iterdir() if p.is_dir() and not p.name.startswith(".")]
    stamp = (folder / "model.onnx").stat().st_mtime_ns
    again = SentenceTransformerEmbedder(num_threads=1, onnx_cache_dir=cache_dir)
    again.load()
    assert again.active_backend == "onnx"
    assert not again.onnx_exported
    assert (folder / "model.onnx").stat().st_mtime_ns == stamp
    np.testing.assert_allclose(again.embed(TEXTS[:3]), onnx_emb.embed(TEXTS[:3]), atol=1e-6)


def test_a_cached_export_loads_without_torch(onnx_emb, cache_dir):
    code = (
        "import sys; from marsys_mem.retrieval.embeddings import SentenceTransformerEmbedder;"
        f"e = SentenceTransformerEmbedder(onnx_cache_dir={str(cache_dir)!r}); "
        "v = e.embed(['hello there']);"
        "print(e.active_backend, e.onnx_exported, v.shape, 'torch' in sys.modules)"
    )
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert out.stdout.split() == ["onnx", "False", "(1,", "384)", "False"]


def test_without_onnxruntime_auto_falls_back_and_onnx_refuses(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    auto = SentenceTransformerEmbedder(num_threads=1, onnx_cache_dir=tmp_path)
    v = auto.embed(["Weather in Paris?"])
    assert auto.active_backend == "torch"
    assert v.shape == (1, 384)
    assert list(tmp_path.iterdir()) == []  # nothing exported
    strict = SentenceTransformerEmbedder(backend="onnx", onnx_cache_dir=tmp_path)
    with pytest.raises(MissingDependencyError, match=r"marsys-mem\[embeddings,onnx\]"):
        strict.load()
    assert not strict.loaded


def test_a_disagreeing_export_is_recorded_and_not_used(monkeypatch, tmp_path, torch_emb):
    # a bar no export can pass: the real export and check run, and must record a refusal
    monkeypatch.setattr(onnx_backend, "AGREEMENT", 1.5)
    auto = SentenceTransformerEmbedder(num_threads=1, onnx_cache_dir=tmp_path)
    v = auto.embed(TEXTS[:2])
    assert auto.active_backend == "torch"
    assert auto.onnx_exported
    record = auto.onnx_record
    assert record is not None
    assert not record.agrees
    assert 0.999 <= record.min_cosine <= 1.0 + 1e-6
    np.testing.assert_allclose(v, torch_emb.embed(TEXTS[:2]), atol=1e-6)
    # the verdict is kept: the next load does not export again, and goes to torch
    monkeypatch.setattr(onnx_backend, "AGREEMENT", 0.999)
    later = SentenceTransformerEmbedder(num_threads=1, onnx_cache_dir=tmp_path)
    later.load()
    assert later.active_backend == "torch"
    assert not later.onnx_exported
    strict = SentenceTransformerEmbedder(backend="onnx", onnx_cache_dir=tmp_path)
    with pytest.raises(EmbeddingError, match="differ from PyTorch"):
        strict.load()


def test_export_folder_names_model_and_fingerprint(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights.bin").write_bytes(b"1234")
    first = export_folder(tmp_path / "c", "org/model", model)
    assert first.parent == tmp_path / "c"
    assert first.name.startswith("org--model-")
    assert export_folder(tmp_path / "c", "org/model", model) == first
    (model / "weights.bin").write_bytes(b"12345")  # new weights: another export
    assert export_folder(tmp_path / "c", "org/model", model) != first


def test_default_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("MARSYS_MEM_HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / "cache" / "onnx"
    monkeypatch.delenv("MARSYS_MEM_HOME")
    if sys.platform.startswith("linux"):
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
        assert default_cache_dir() == tmp_path / "xdg" / "marsys-mem" / "onnx"
        monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
        assert default_cache_dir() == Path.home() / ".cache" / "marsys-mem" / "onnx"


def test_bad_backend_is_rejected():
    with pytest.raises(ValueError, match="backend must be one of"):
        SentenceTransformerEmbedder(backend="tensorrt")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="query_cache_size"):
        SentenceTransformerEmbedder(query_cache_size=-1)


# ------------------------------------------------------------------ query cache


def test_query_cache_hits_misses_and_bound(cache_dir, onnx_emb):
    emb = SentenceTransformerEmbedder(query_cache_size=2, onnx_cache_dir=cache_dir)
    assert isinstance(emb, QueryEmbedder)
    a = emb.embed_query("where is my passport?")
    assert a.shape == (1, 384)
    np.testing.assert_allclose(a, onnx_emb.embed(["where is my passport?"]), atol=1e-6)
    emb.embed_query("who has my drill?")
    again = emb.embed_query("where is my passport?")  # hit, now most recent
    np.testing.assert_array_equal(again, a)
    assert (emb.query_hits, emb.query_misses) == (1, 2)
    emb.embed_query("when is the plumber coming?")  # evicts the drill
    emb.embed_query("who has my drill?")  # miss again
    emb.embed_query("where is my passport?")  # evicted by the drill: miss
    assert (emb.query_hits, emb.query_misses) == (1, 5)
    assert len(emb._queries) == 2
    again[0, 0] = 99.0  # the caller's copy: the cache is not changed
    assert emb.embed_query("who has my drill?")[0, 0] != 99.0
    # queries do not use (or fill) the text cache, and texts do not evict queries
    assert emb.encoded == 0
    emb.embed([f"message {i}" for i in range(50)])
    emb.embed_query("who has my drill?")
    assert emb.query_hits == 3
    emb.cache_clear()
    assert (emb.query_hits, emb.query_misses, len(emb._queries)) == (0, 0, 0)


def test_query_cache_zero_disables_it(cache_dir):
    emb = SentenceTransformerEmbedder(query_cache_size=0, onnx_cache_dir=cache_dir)
    emb.embed_query("same")
    emb.embed_query("same")
    assert (emb.query_hits, emb.query_misses) == (0, 2)
    with pytest.raises(EmbeddingError, match="must be a str"):
        emb.embed_query(b"bytes")  # type: ignore[arg-type]


def test_rag_search_goes_through_the_query_cache(cache_dir):
    emb = SentenceTransformerEmbedder(onnx_cache_dir=cache_dir)
    with RAGMemory(emb) as mem:
        mem.add_many(TEXTS[:5])
        first = mem.search("who is visiting from Tallinn?", k=2, mode="dense")
        misses = emb.query_misses
        second = mem.search("who is visiting from Tallinn?", k=2, mode="dense")
        assert emb.query_misses == misses
        assert emb.query_hits == 1
        assert [h.id for h in first] == [h.id for h in second]
        assert "Tallinn" in first[0].message.text


def test_embed_query_falls_back_to_embed():
    emb = HashingEmbedder(16)
    np.testing.assert_array_equal(embed_query(emb, "a b"), emb.embed(["a b"]))


# ------------------------------------------------------------------ queue batching


class Recorder:
    def __init__(self) -> None:
        self.inner = HashingEmbedder(8)
        self.batches: list[int] = []
        self.dim = 8
        self.name = "recorder"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.batches.append(len(texts))
        return self.inner.embed(texts)

    async def aembed(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed(texts)


@pytest.fixture(autouse=True)
def no_leaked_queue_threads() -> Iterator[None]:
    before = set(threading.enumerate())
    yield
    leaked = [
        t
        for t in threading.enumerate()
        if t.name == "marsys-mem-embedding-queue" and t not in before
    ]
    assert not leaked


def test_queue_lingers_to_fill_batches_from_one_by_one_submits():
    rec = Recorder()
    with EmbeddingQueue(rec, lambda k, v: None, batch_size=16, linger=2.0) as q:
        for i in range(40):
            q.submit(f"k{i}", f"text {i}")
        q.flush()
    # without lingering the worker would start on the first text alone
    assert sum(rec.batches) == 40
    assert rec.batches[:2] == [16, 16]


def test_flush_does_not_wait_for_a_lingering_batch():
    rec = Recorder()
    with EmbeddingQueue(rec, lambda k, v: None, batch_size=64, linger=10.0) as q:
        q.submit("k", "one text")
        start = time.monotonic()
        q.flush()
        assert time.monotonic() - start < 5.0  # not the 10 s linger
        assert rec.batches == [1]


def test_close_does_not_wait_for_a_lingering_batch():
    rec = Recorder()
    q = EmbeddingQueue(rec, lambda k, v: None, batch_size=64, linger=10.0)
    q.submit("k", "one text")
    start = time.monotonic()
    q.close()
    assert time.monotonic() - start < 5.0
    assert rec.batches == [1]


@pytest.mark.parametrize("linger", [-1, 11, "0.1", True])
def test_queue_rejects_bad_linger(linger):
    with pytest.raises(ValueError, match="linger"):
        EmbeddingQueue(HashingEmbedder(8), lambda k, v: None, linger=linger)


def test_unwritable_cache_dir_falls_back_to_torch(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")  # the cache folder cannot be made, even as root
    emb = SentenceTransformerEmbedder(num_threads=1, onnx_cache_dir=blocker / "onnx")
    assert emb.embed(["hello"]).shape == (1, 384)
    assert emb.active_backend == "torch"
    strict = SentenceTransformerEmbedder(backend="onnx", onnx_cache_dir=blocker / "onnx")
    with pytest.raises(EmbeddingError, match="cannot write the ONNX export"):
        strict.load()
