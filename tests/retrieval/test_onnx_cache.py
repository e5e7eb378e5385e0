"""The ONNX export cache: keyed by what the model holds, announced once, stale copies removed.

A reinstall of the same model (new paths, new modification times) finds its export; other
weights make another; exports of other versions of a model unused for ``STALE_AFTER`` are
deleted when one of the model is loaded. Real files, a real export of the packaged model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from datetime import timedelta
from pathlib import Path

import pytest

from marsys_mem.retrieval import onnx_backend
from marsys_mem.retrieval.onnx_backend import STALE_AFTER, export_folder, mark_used

DAY = 86_400.0


def make_model(root: Path, weights: bytes = b"w" * 3_000_000) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text('{"dim": 384}')
    (root / "model.safetensors").write_bytes(weights)
    (root / "1_Pooling").mkdir()
    (root / "1_Pooling" / "config.json").write_text("{}")
    return root


def test_a_reinstalled_model_finds_its_export(tmp_path: Path) -> None:
    first = make_model(tmp_path / "venv1" / "pkg" / "model")
    second = tmp_path / "venv2" / "pkg" / "model"
    shutil.copytree(first, second)  # another environment, other paths and mtimes
    later = time.time() + 3600
    for path in second.rglob("*"):
        os.utime(path, (later, later))
    (second / "__pycache__").mkdir()  # Python's caches differ between installs
    (second / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\x00")
    cache = tmp_path / "cache"
    assert export_folder(cache, "org/model", first) == export_folder(cache, "org/model", second)
    # a folder model is named by the folder, wherever it is
    by_path = export_folder(cache, str(first), first)
    assert by_path == export_folder(cache, str(second), second)
    assert by_path.name.startswith("model-")


def test_other_weights_make_another_export(tmp_path: Path) -> None:
    model = make_model(tmp_path / "model")
    cache = tmp_path / "cache"
    before = export_folder(cache, "org/model", model)
    weights = bytearray((model / "model.safetensors").read_bytes())
    weights[1_500_000] ^= 1  # one byte anywhere
    (model / "model.safetensors").write_bytes(bytes(weights))
    changed = export_folder(cache, "org/model", model)
    assert changed != before
    (model / "config.json").write_text('{"dim": 768}')
    assert len({before, changed, export_folder(cache, "org/model", model)}) == 3


def test_the_weights_digest_is_kept_by_size_and_time(tmp_path: Path) -> None:
    model = make_model(tmp_path / "model")
    cache = tmp_path / "cache"
    first = export_folder(cache, "org/model", model)
    memo = json.loads((cache / "fingerprints.json").read_text())
    weights = str((model / "model.safetensors").resolve())
    assert list(memo) == [weights]  # the big file only; small files are read each time
    size, mtime_ns, digest = memo[weights]
    assert size == 3_000_000
    assert digest == hashlib.sha256((model / "model.safetensors").read_bytes()).hexdigest()
    # a memo entry is trusted while size and time match (as make and rsync trust them)
    memo[weights] = [size, mtime_ns, "0" * 64]
    (cache / "fingerprints.json").write_text(json.dumps(memo))
    assert export_folder(cache, "org/model", model) != first
    os.utime(model / "model.safetensors", ns=(mtime_ns, mtime_ns + 1))  # touched: read again
    assert export_folder(cache, "org/model", model) == first
    (cache / "fingerprints.json").write_text("not json")  # unreadable: rebuilt
    assert export_folder(cache, "org/model", model) == first
    shutil.rmtree(model)
    other = make_model(tmp_path / "other", b"x" * 2_000_000)
    export_folder(cache, "org/other", other)
    assert weights not in json.loads((cache / "fingerprints.json").read_text())  # pruned


def export_at(cache: Path, name: str, age_days: float, *, record: bool = True) -> Path:
    folder = cache / name
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(b"graph")
    stamp = time.time() - age_days * DAY
    if record:
        (folder / "export.json").write_text("{}")
        os.utime(folder / "export.json", (stamp, stamp))
    os.utime(folder, (stamp, stamp))
    return folder


def test_loading_an_export_removes_stale_exports_of_the_same_model(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    current = export_at(cache, "org--model-" + "a" * 16, 30)
    old_version = export_at(cache, "org--model-" + "b" * 16, 8)
    recent_version = export_at(cache, "org--model-" + "c" * 16, 1)  # another env uses it
    half_written = export_at(cache, ".org--model-" + "d" * 16 + "-x1y2", 9, record=False)
    other_model = export_at(cache, "other--model-" + "e" * 16, 100)
    (cache / "notes.txt").write_text("not an export")
    assert STALE_AFTER == timedelta(days=7)
    removed = mark_used(current)
    assert sorted(removed) == sorted([old_version, half_written])
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [current.name, recent_version.name, other_model.name, "notes.txt"]
    )
    # the one loaded is marked used now: a later load of another version keeps it a week
    assert time.time() - (current / "export.json").stat().st_mtime < 60
    assert mark_used(recent_version) == []
    assert mark_used(recent_version, stale_after=timedelta(0)) == [current]


def test_a_read_only_or_missing_cache_is_no_error(tmp_path: Path) -> None:
    assert mark_used(tmp_path / "nothing-0123456789abcdef") == []
    assert mark_used(tmp_path / "not an export name") == []


def test_the_first_export_says_where_it_goes_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from marsys_mem.retrieval.embeddings import (
        SentenceTransformerEmbedder,
        _packaged_model_path,
    )

    packaged = _packaged_model_path()
    if packaged is None:
        pytest.skip("the packaged model is not installed")
    # two installs of the packaged model, as two environments would have them
    installs = [tmp_path / "env1" / "model", tmp_path / "env2" / "model"]
    for target in installs:
        shutil.copytree(packaged, target)
    cache = tmp_path / "cache"
    stale = export_at(cache, "model-" + "f" * 16, 30)  # an export of an older version
    caplog.set_level(logging.INFO, logger="marsys_mem.retrieval")
    first = SentenceTransformerEmbedder(installs[0], onnx_cache_dir=cache, num_threads=1)
    first.load()
    assert first.active_backend == "onnx"
    assert first.onnx_exported
    announced = [
        r for r in caplog.records if r.levelno == logging.WARNING and "ONNX" in r.getMessage()
    ]
    assert len(announced) == 1
    (folder,) = [p for p in cache.iterdir() if p.is_dir()]
    assert str(folder) in announced[0].getMessage()
    assert not stale.exists()  # removed when the new export was made
    caplog.clear()
    again = SentenceTransformerEmbedder(installs[1], onnx_cache_dir=cache, num_threads=1)
    again.load()
    assert again.active_backend == "onnx"
    assert not again.onnx_exported  # the reinstall reused the export
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [p.name for p in cache.iterdir() if p.is_dir()] == [folder.name]
    assert onnx_backend.read_record(folder) is not None
