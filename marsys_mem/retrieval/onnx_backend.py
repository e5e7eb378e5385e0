"""ONNX Runtime backend of the sentence-transformers embedder: exported once, checked, cached.

:class:`~marsys_mem.retrieval.embeddings.SentenceTransformerEmbedder` runs its model with
ONNX Runtime when the ``onnx`` extra is installed (``onnxruntime``, ``onnx``): a single query
is 2-3x faster than PyTorch's forward pass on one CPU thread, and the process never imports
torch once the export exists.

How the graph is made: the loaded sentence-transformers model (its whole module stack:
transformer, pooling, normalisation) is traced by ``torch.onnx.export`` from the local
weights, once, into a folder of the user's cache (:func:`default_cache_dir`, never inside a
source tree), next to the model's own fast tokenizer (``tokenizer.json``, with the model's
truncation length and padding). Nothing is downloaded. The export is then *checked*: the
texts of :data:`CHECK_TEXTS` (chat messages of 100-200 characters, short questions, an empty
text, accents and emoji, a text longer than the model's window) are embedded by PyTorch and
by the graph, batched and one by one; the smallest cosine similarity is recorded in
``export.json`` with the verdict (``>= AGREEMENT``). The folder is renamed into place
atomically, so a concurrent process sees the old state or the whole export. An export that
failed or disagreed is recorded too, so later loads go straight to PyTorch.

Why not ``SentenceTransformer(..., backend="onnx")``: sentence-transformers loads ONNX
models through ``optimum-onnx``, and its releases (up to 0.1.0) require
``transformers<4.58`` and fail to import under transformers 5 (``get_parameter_dtype`` is
gone), which this project uses. The folder written here is a plain ONNX model plus its
tokenizer, independent of that package.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from marsys_mem.exceptions import EmbeddingError

__all__ = [
    "AGREEMENT",
    "CACHE_DIR_ENV",
    "CHECK_TEXTS",
    "FORMAT",
    "ONNX_INSTALL_HINT",
    "STALE_AFTER",
    "ExportRecord",
    "OnnxModel",
    "can_export",
    "default_cache_dir",
    "export_folder",
    "export_model",
    "length_batches",
    "mark_used",
    "onnx_available",
    "read_record",
]

log = logging.getLogger("marsys_mem.retrieval.onnx_backend")

FloatArray = npt.NDArray[np.float32]

AGREEMENT = 0.999
"""Smallest cosine similarity between the graph's and PyTorch's vectors for the export to
be used (on every text of :data:`CHECK_TEXTS`)."""

FORMAT = 1
"""Version of the export folder's layout (part of its name)."""

CACHE_DIR_ENV = "MARSYS_MEM_HOME"
"""With this variable set, exports live in ``$MARSYS_MEM_HOME/cache/onnx``."""

ONNX_INSTALL_HINT = "install the 'onnx' extra: pip install 'marsys-mem[embeddings,onnx]'"

STALE_AFTER = timedelta(days=7)
"""An export of another version of the same model (other weights, an older
:data:`FORMAT`) unused for this long is deleted when one of the model is loaded or made."""

_RECORD = "export.json"
_GRAPH = "model.onnx"
_TOKENIZER = "tokenizer.json"
# tokenizer output -> graph input (the fast tokenizer's Encoding attribute)
_ENCODING_FIELDS = {
    "input_ids": "ids",
    "attention_mask": "attention_mask",
    "token_type_ids": "type_ids",
}

CHECK_TEXTS: tuple[str, ...] = (
    "Honestly, the printer on floor 3 jammed again and nobody from facilities has answered "
    "the ticket since Tuesday. Can you chase them?",
    "My sister Clara moved to Lisbon in March; she says the rent is lower but the job "
    "market for architects is much tougher than she expected.",
    "I parked the car on level 4 of the garage, right next to the lift, because the "
    "lower floors were full after the concert.",
    "Quick update: the payments team's standup moved to 9:15, and Priya wants the slide "
    "deck for the roadmap review before lunch on Thursday.",
    "Noted. I'll remind you about the quarterly report tomorrow morning, and I added the "
    "dentist appointment to your calendar for Friday at 16:40.",
    "The alerts on db-eu-42 fired again yesterday; disk usage went from 70% to 98% in an "
    "hour, probably the nightly ETL job writing temp files.",
    "Ugh, my phone battery died during the football match so I missed Marco's calls. "
    "Was it about the barbecue on Saturday or the car?",
    "We adopted two goldfish named Biscuit and Mochi! The kids insisted on the names and "
    "now they want a bigger tank for the living room.",
    "Ticket OPS-4471 is about the login timeout bug: sessions expire after 5 minutes "
    "instead of 30 when the user switches tabs.",
    "Fun fact: Dr. Okafor moved her practice to Fischer Street, so the next check-up is "
    "a 10-minute walk instead of a bus ride.",
    "Where did I leave the vehicle?",
    "What's the best way to reach Tomasz?",
    "When is the codename Amber Falcon going live?",
    "ok",
    "",
    "Café crème à Zürich? Ça coûte 5,50 CHF 🎉 — très cher! 東京の天気は晴れです。",
    "numbers 1 2 3, punctuation!?; and URLs: https://example.org/a?b=c#d",
    "A very long message that runs past the model's window. " * 40,
)
"""The texts the export is checked on (realistic messages, questions, edge cases)."""


def onnx_available() -> bool:
    """Whether ONNX Runtime and ``tokenizers`` are installed (what running an export needs).

    Example:
        >>> isinstance(onnx_available(), bool)
        True
    """
    return _has("onnxruntime") and _has("tokenizers")


def can_export() -> bool:
    """Whether an export can be made here: :func:`onnx_available` plus ``onnx`` and torch."""
    return onnx_available() and _has("onnx") and _has("torch")


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def default_cache_dir() -> Path:
    """The folder that holds exported models (created on first export).

    ``$MARSYS_MEM_HOME/cache/onnx`` when that variable is set; else ``$XDG_CACHE_HOME``
    (when absolute) or ``~/.cache``, then ``marsys-mem/onnx``; on macOS
    ``~/Library/Caches/marsys-mem/onnx``, on Windows ``%LOCALAPPDATA%/marsys-mem/cache/onnx``.

    Example:
        >>> default_cache_dir().name
        'onnx'
    """
    home = os.environ.get(CACHE_DIR_ENV)
    if home:
        return Path(home).expanduser().absolute() / "cache" / "onnx"
    if sys.platform == "win32":
        local = os.environ.get("LOCALAPPDATA")
        base = Path(local) if local else Path.home() / "AppData" / "Local"
        return base / "marsys-mem" / "cache" / "onnx"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "marsys-mem" / "onnx"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "marsys-mem" / "onnx"


def export_folder(cache_dir: Path, model_id: str, model_dir: Path | None) -> Path:
    """The folder of one model's export: named after the model and a fingerprint.

    The fingerprint covers :data:`FORMAT` and, for a model on disk, what its files hold
    (each file's relative path and the SHA-256 of its content), not where they are or when
    they were written: reinstalling the same model, in this environment or another, finds
    the same export, and new weights make a new one. The digests of big files are kept in
    ``cache_dir/fingerprints.json`` by path, size and modification time, so the weights are
    read once per install. For a model known only by name, it covers the name.

    Args:
        cache_dir: where exports live (:func:`default_cache_dir`).
        model_id: the model's Hugging Face name or folder path.
        model_dir: the folder the weights are loaded from, when known.

    Example:
        >>> export_folder(Path("/c"), "org/model", None).name.startswith("org--model-")
        True
    """
    digest = hashlib.blake2b(digest_size=8)
    name = model_id
    if model_dir is not None and model_dir.is_dir():
        digest.update(f"{FORMAT}\x00files".encode())
        files = sorted(p for p in model_dir.rglob("*") if _model_file(p, model_dir))
        for path, content in zip(files, _digests(cache_dir, files), strict=True):
            rel = path.relative_to(model_dir).as_posix()
            digest.update(f"\x00{rel}\x00".encode() + content)
        if Path(model_id).is_absolute():  # a folder: its name, wherever it is
            name = Path(model_id).name
    else:
        digest.update(f"{FORMAT}\x00{model_id}".encode())
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name.strip("/").replace("/", "--"))
    slug = slug[-60:].strip("-.") or "model"
    return cache_dir / f"{slug}-{digest.hexdigest()}"


_MEMO = "fingerprints.json"
_MEMO_ABOVE = 1 << 20


def _model_file(path: Path, root: Path) -> bool:
    """A file of the model (not Python's caches, which differ between installs)."""
    parts = path.relative_to(root).parts
    return path.is_file() and "__pycache__" not in parts and path.suffix not in (".pyc", ".pyo")


def _digests(cache_dir: Path, files: Sequence[Path]) -> list[bytes]:
    """SHA-256 of each file's content; those of big files memoised in the cache folder.

    ``fingerprints.json`` maps a file's path to its size, modification time and digest, so
    a big file (the weights) is read once per install, not at every load; a changed size or
    time reads it again. An unreadable memo is rebuilt; one that cannot be written is not
    kept.
    """
    memo_path = cache_dir / _MEMO
    try:
        memo = json.loads(memo_path.read_text(encoding="utf-8"))
        if not isinstance(memo, dict):
            memo = {}
    except (OSError, ValueError):
        memo = {}
    changed = False
    out: list[bytes] = []
    for path in files:
        stat = path.stat()
        key = str(path.resolve())
        seen = memo.get(key)
        if (
            stat.st_size > _MEMO_ABOVE
            and isinstance(seen, list)
            and seen[:2] == [stat.st_size, stat.st_mtime_ns]
            and isinstance(seen[2], str)
            and re.fullmatch(r"[0-9a-f]{64}", seen[2])
        ):
            out.append(bytes.fromhex(seen[2]))
            continue
        with path.open("rb") as f:
            digest = hashlib.file_digest(f, "sha256").digest()
        out.append(digest)
        if stat.st_size > _MEMO_ABOVE:
            memo[key] = [stat.st_size, stat.st_mtime_ns, digest.hex()]
            changed = True
    if changed:
        kept = {k: v for k, v in memo.items() if Path(k).is_file()}
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{_MEMO}-", dir=cache_dir)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(kept, f)
            os.replace(tmp, memo_path)
        except OSError:
            pass
    return out


def _export_name(folder: Path) -> tuple[str, str] | None:
    """``(slug, fingerprint)`` of an export folder's name, or None for anything else."""
    match = re.fullmatch(r"(.+)-([0-9a-f]{16})", folder.name)
    return (match.group(1), match.group(2)) if match else None


def mark_used(folder: Path, *, stale_after: timedelta = STALE_AFTER) -> list[Path]:
    """Record that the export in ``folder`` is used; delete stale ones of the same model.

    The record's modification time is the export's last use. Exports of the same model
    name with another fingerprint (other weights, an older :data:`FORMAT`) not used for
    ``stale_after``, and half-written exports of it as old, are deleted. Nothing else in
    the cache folder is touched; errors (a read-only cache) are ignored.

    Returns:
        The folders deleted.

    Example:
        >>> mark_used(Path("/no/such/cache/model-0123456789abcdef"))
        []
    """
    named = _export_name(folder)
    try:
        os.utime(folder / _RECORD)
    except OSError:
        pass
    if named is None:
        return []
    cutoff = time.time() - stale_after.total_seconds()
    removed: list[Path] = []
    try:
        siblings = list(folder.parent.iterdir())
    except OSError:
        return removed
    for other in siblings:
        if other.name == folder.name or not other.is_dir():
            continue
        parsed = _export_name(other)
        same_model = parsed is not None and parsed[0] == named[0]
        half_written = other.name.startswith(f".{named[0]}-")  # see export_model's mkdtemp
        if not (same_model or half_written):
            continue
        try:
            record = other / _RECORD
            last = (record if record.exists() else other).stat().st_mtime
        except OSError:
            continue
        if last < cutoff:
            shutil.rmtree(other, ignore_errors=True)
            if not other.exists():
                removed.append(other)
    if removed:
        log.info("removed %d stale ONNX export(s) of %s: %s", len(removed), named[0], removed)
    return removed


@dataclass(frozen=True)
class ExportRecord:
    """What ``export.json`` records about an export: the check's verdict and numbers.

    Attributes:
        agrees: the graph's vectors matched PyTorch's (min cosine >= :data:`AGREEMENT`).
        min_cosine: the smallest cosine over the check texts (``None`` when export failed).
        mean_cosine: the mean cosine over the check texts.
        texts: how many texts were compared (each batched and one by one).
        dim: the vector length.
        inputs: the graph's input names, in order.
        error: why the export failed, or ``None``.
        versions: the library versions that made it (torch, onnx, sentence-transformers).
        seconds: how long export and check took.

    Example:
        >>> ExportRecord(agrees=False, error="boom").agrees
        False
    """

    agrees: bool
    min_cosine: float | None = None
    mean_cosine: float | None = None
    texts: int = 0
    dim: int = 0
    inputs: tuple[str, ...] = ()
    error: str | None = None
    versions: tuple[tuple[str, str], ...] = ()
    seconds: float = 0.0


def read_record(folder: Path) -> ExportRecord | None:
    """The record of the export in ``folder``, or ``None`` when there is none (or unreadable).

    Example:
        >>> read_record(Path("/no/such/folder")) is None
        True
    """
    try:
        raw = json.loads((folder / _RECORD).read_text(encoding="utf-8"))
        record = ExportRecord(
            agrees=bool(raw["agrees"]),
            min_cosine=raw.get("min_cosine"),
            mean_cosine=raw.get("mean_cosine"),
            texts=int(raw.get("texts", 0)),
            dim=int(raw.get("dim", 0)),
            inputs=tuple(raw.get("inputs", ())),
            error=raw.get("error"),
            versions=tuple((str(k), str(v)) for k, v in raw.get("versions", [])),
            seconds=float(raw.get("seconds", 0.0)),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if record.agrees and not (
        (folder / _GRAPH).is_file() and (folder / _TOKENIZER).is_file() and record.inputs
    ):
        return None
    return record


class OnnxModel:
    """A checked export, loaded: an ONNX Runtime session and the model's fast tokenizer.

    Texts are tokenized first, sorted by their number of tokens and embedded
    ``batch_size`` at a time, each batch padded only to its own longest text: on real chat
    turns (lengths from 3 to 256 tokens) that sends about 1.04 tokens per real token
    through the model, where sorting by characters (sentence-transformers) sends 1.26 and
    batches in arrival order 3.5 (measured on REALTALK's 8,944 turns).

    Args:
        folder: an export folder (see :func:`export_model`).
        inputs: the graph's input names (from the record).
        num_threads: ONNX Runtime's intra-op threads; ``None``: its default (all cores).

    Raises:
        EmbeddingError: the folder holds no usable graph or tokenizer.

    Example:
        >>> OnnxModel  # doctest: +ELLIPSIS
        <class '...OnnxModel'>
    """

    def __init__(self, folder: Path, inputs: Sequence[str], num_threads: int | None = None) -> None:
        ort: Any = importlib.import_module("onnxruntime")
        tokenizers: Any = importlib.import_module("tokenizers")
        unknown = [name for name in inputs if name not in _ENCODING_FIELDS]
        if unknown:
            raise EmbeddingError(f"the export in {folder} has inputs {unknown} this backend lacks")
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.inter_op_num_threads = 1
        if num_threads is not None:
            options.intra_op_num_threads = num_threads
        options.log_severity_level = 3  # errors only
        try:
            self._session = ort.InferenceSession(
                str(folder / _GRAPH), options, providers=["CPUExecutionProvider"]
            )
            self._tokenizer = tokenizers.Tokenizer.from_file(str(folder / _TOKENIZER))
        except Exception as exc:
            raise EmbeddingError(f"cannot load the ONNX export in {folder}: {exc}") from exc
        padding = self._tokenizer.padding
        self._pad_id = int(padding["pad_id"]) if padding else 0
        self._tokenizer.no_padding()  # each batch is padded here, to its own longest text
        self._inputs = [(name, _ENCODING_FIELDS[name]) for name in inputs]
        self.folder = folder

    def _tokenize(self, texts: Sequence[str]) -> list[Any]:
        if len(texts) == 1:
            # not encode_batch: it lets go of the GIL, and a thread that takes it then
            # (e.g. RAGMemory's work beside the forward pass) holds this one up for as
            # long as it runs; encode keeps the GIL until the session does run (and
            # releases it for the whole forward pass)
            return [self._tokenizer.encode(texts[0])]
        return list(self._tokenizer.encode_batch(list(texts)))

    def token_counts(self, texts: Sequence[str]) -> list[int]:
        """How many tokens the model reads of each text (special tokens included, truncated)."""
        return [len(e.ids) for e in self._tokenize(texts)]

    def encode(self, texts: Sequence[str], batch_size: int) -> FloatArray:
        """Vectors of ``texts`` (rows in the order given), as the graph computes them."""
        encodings = self._tokenize(texts)
        out = np.empty((len(texts), 0), dtype=np.float32)
        for rows in length_batches([len(e.ids) for e in encodings], batch_size):
            width = len(encodings[rows[0]].ids)
            feed = {}
            for name, field in self._inputs:
                pad = self._pad_id if field == "ids" else 0
                array = np.full((len(rows), width), pad, dtype=np.int64)
                for row, i in enumerate(rows):
                    values = getattr(encodings[i], field)
                    array[row, : len(values)] = values
                feed[name] = array
            vectors = self._session.run(None, feed)[0]
            if out.shape[1] == 0:
                out = np.empty((len(texts), vectors.shape[1]), dtype=np.float32)
            out[rows] = vectors
        return out


def length_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Positions grouped into batches of at most ``batch_size``, longest first.

    Sorting by length before batching pads each batch only to its own longest text (ties
    keep their order).

    Args:
        lengths: the length (tokens, or characters) of each text.
        batch_size: most positions per batch (>= 1).

    Example:
        >>> length_batches([3, 9, 1, 9, 4], 2)
        [[1, 3], [4, 0], [2]]
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


class _Graph:  # the traced module: token tensors in, normalised sentence vectors out
    @staticmethod
    def build(st_model: Any, names: Sequence[str]) -> Any:
        torch: Any = importlib.import_module("torch")

        class Graph(torch.nn.Module):  # type: ignore[misc]
            def __init__(self) -> None:
                super().__init__()
                self.model = st_model

            def forward(self, *tensors: Any) -> Any:
                features = dict(zip(names, tensors, strict=True))
                vectors = self.model(features)["sentence_embedding"]
                return torch.nn.functional.normalize(vectors, p=2.0, dim=1)

        return Graph().eval()


def _versions() -> tuple[tuple[str, str], ...]:
    found = []
    for name in ("torch", "onnx", "onnxruntime", "sentence_transformers", "transformers"):
        try:
            found.append((name, str(importlib.import_module(name).__version__)))
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def _write_record(folder: Path, record: ExportRecord) -> None:
    data = asdict(record)
    data["versions"] = [list(v) for v in record.versions]
    data["inputs"] = list(record.inputs)
    (folder / _RECORD).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def _torch_vectors(st_model: Any, texts: Sequence[str], batch_size: int) -> FloatArray:
    raw = st_model.encode(
        list(texts),
        batch_size=batch_size,
        normalize_embeddings=True,
        convert_to_numpy=True,
        show_progress_bar=False,
    )
    return np.asarray(raw, dtype=np.float32)


def _export_into(st_model: Any, tmp: Path, num_threads: int | None) -> ExportRecord:
    """Trace, save tokenizer, check; raises on a model this backend cannot export."""
    torch: Any = importlib.import_module("torch")
    tokenizers: Any = importlib.import_module("tokenizers")
    hf_tokenizer: Any = getattr(st_model, "tokenizer", None)
    backend = getattr(hf_tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise EmbeddingError("the model has no fast (Rust) tokenizer to export")
    features = st_model.preprocess(["an example sentence", "a second, longer example here"])
    names = [k for k in _ENCODING_FIELDS if k in features]
    extra = [k for k, v in features.items() if hasattr(v, "shape") and k not in names]
    if "input_ids" not in names or extra:
        raise EmbeddingError(f"unsupported model inputs {sorted(features)}")
    tokenizer = tokenizers.Tokenizer.from_str(backend.to_str())
    tokenizer.enable_truncation(max_length=int(st_model.max_seq_length))
    pad_id = hf_tokenizer.pad_token_id
    pad_token = hf_tokenizer.pad_token
    tokenizer.enable_padding(pad_id=int(pad_id or 0), pad_token=str(pad_token or "[PAD]"))
    tokenizer.save(str(tmp / _TOKENIZER))
    graph = _Graph.build(st_model, names)
    args = tuple(features[k].to("cpu") for k in names)
    axes = {k: {0: "batch", 1: "tokens"} for k in names}
    axes["embedding"] = {0: "batch"}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer and deprecation notices of the exporter
        torch.onnx.export(
            graph,
            args,
            str(tmp / _GRAPH),
            input_names=names,
            output_names=["embedding"],
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )
    model = OnnxModel(tmp, names, num_threads)
    texts = list(CHECK_TEXTS)
    expected = _torch_vectors(st_model, texts, 8)
    batched = model.encode(texts, 8)
    single = np.vstack([model.encode([t], 1) for t in texts])
    cosines = np.concatenate([(expected * batched).sum(axis=1), (expected * single).sum(axis=1)])
    if not np.isfinite(cosines).all():
        raise EmbeddingError("the exported graph returned NaN or infinity")
    low = float(cosines.min())
    return ExportRecord(
        agrees=low >= AGREEMENT,
        min_cosine=round(low, 7),
        mean_cosine=round(float(cosines.mean()), 7),
        texts=len(texts),
        dim=int(expected.shape[1]),
        inputs=tuple(names),
        versions=_versions(),
    )


def export_model(st_model: Any, folder: Path, *, num_threads: int | None = None) -> ExportRecord:
    """Export a loaded sentence-transformers model into ``folder``, check it, record the verdict.

    Needs torch, onnx, onnxruntime and tokenizers. A model that cannot be exported (no fast
    tokenizer, other inputs, a tracing error) is not an error here: the failure is recorded
    (``agrees=False``, ``error``) so later loads do not try again.

    Args:
        st_model: a loaded ``SentenceTransformer``.
        folder: the export folder (see :func:`export_folder`); written atomically. When
            another process finished the same export first, its record is returned.
        num_threads: ONNX Runtime threads for the check.

    Returns:
        The record written to ``folder/export.json``.
    """
    existing = read_record(folder)
    if existing is not None:
        return existing
    log.warning(
        "exporting the embedding model to ONNX once, into %s (about the size of its weights; "
        "later loads read it from there; MARSYS_MEM_HOME or onnx_cache_dir= moves it, "
        "deleting the folder removes it)",
        folder,
    )
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    start = time.perf_counter()
    try:
        try:
            record = _export_into(st_model, tmp, num_threads)
        except Exception as exc:
            log.warning("ONNX export of the embedding model failed: %r", exc)
            for path in tmp.iterdir():
                path.unlink()
            record = ExportRecord(agrees=False, error=f"{type(exc).__name__}: {exc}"[:500])
        seconds = round(time.perf_counter() - start, 2)
        record = ExportRecord(**{**asdict(record), "seconds": seconds})
        _write_record(tmp, record)
        try:
            os.replace(tmp, folder)
        except OSError:  # another process put its export there first
            found = read_record(folder)
            if found is None:
                raise
            return found
        mark_used(folder)
        return record
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
