"""MarsysStore: LangGraph long-term memory (``BaseStore``) on a marsys-mem store.

LangGraph agents keep long-term memories in a ``BaseStore``: items under hierarchical
namespaces (``("users", "alice", "memories")``), each a JSON object under a key, found by
``get``, by ``search`` (filters on the values, and natural-language ``query``), and by
``list_namespaces``. :class:`MarsysStore` is one, backed by any
:class:`~marsys_mem.store.MemoryStore` (``SQLiteStore`` for durable memory):

* **Durable and atomic.** Every item is one message under one store key (``key``, by
  default ``("langgraph", "store", "items")``), with the item in its metadata and its
  indexed text as content. A batch's writes (puts, deletes, refreshed TTLs) go to the
  store in ONE transaction (delete the old versions, append the new ones); if the store
  fails, nothing changes, in the store or in memory. A new ``MarsysStore`` on the same
  store reads the items back.
* **Search.** ``search(query=...)`` ranks with marsys-mem's retrieval
  (:class:`~marsys_mem.patterns.rag.RAGMemory`): by default hybrid (dense embeddings +
  BM25, fused; scores calibrated, a probability of relevance that means the same for
  every query: :mod:`~marsys_mem.retrieval.calibration`), with the packaged
  all-MiniLM-L6-v2 (the
  ``embeddings`` extra; BM25 only without it). LangGraph's own ``index`` config works as
  it is (``{"dims": 1536, "embed": ..., "fields": [...]}``, ``embed`` a LangChain
  ``Embeddings``, a sync or async function or a ``"provider:model"`` string), and then
  the store scores as LangGraph's do: the cosine similarity (``mode="dense"``; pass
  ``mode="hybrid"`` to keep BM25). What is embedded follows LangGraph's rules: each text
  at the ``fields`` paths (default ``["$"]``, the whole value) is one entry and an item
  scores as its best one; a put's ``index`` (a list of paths, or ``False``: not
  searchable by query, still found by filters, after the ranked hits). The index is
  derived data, rebuilt from the store when a ``MarsysStore`` opens (embedding runs in
  the background; a search waits for it).
* **Filters** on values: exact matches, nested objects, and ``$eq``, ``$ne``, ``$gt``,
  ``$gte``, ``$lt``, ``$lte``, as LangGraph's own stores do.
* **TTL** (minutes, as in LangGraph): an item expires ``ttl`` minutes after it was last
  written or, with ``refresh_ttl`` (the default), read. Expired items are never returned or
  listed; :meth:`MarsysStore.sweep_ttl` deletes them from the store, and so does the
  first batch after ``ttl_config["sweep_interval_minutes"]`` has passed since the last sweep.

Within a batch, reads (get, search, list) see the state before the batch's writes; of
several puts to one item the last wins, as in LangGraph's stores.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import importlib.util
import json
import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from marsys_mem.callables import is_async_callable, run_blocking
from marsys_mem.exceptions import EmbeddingError, MissingDependencyError
from marsys_mem.lifecycle import Closing
from marsys_mem.model.messages import Message
from marsys_mem.patterns.rag import RAGMemory
from marsys_mem.retrieval.embeddings import Embedder
from marsys_mem.retrieval.scoring import SearchMode
from marsys_mem.store.base import Append, Delete, Key, MemoryStore, validate_key
from marsys_mem.store.memory import InMemoryStore

try:
    from langchain_core.embeddings import Embeddings
    from langgraph.store.base import (
        BaseStore,
        GetOp,
        InvalidNamespaceError,
        Item,
        ListNamespacesOp,
        MatchCondition,
        Op,
        PutOp,
        Result,
        SearchItem,
        SearchOp,
        TTLConfig,
        get_text_at_path,
        tokenize_path,
    )
    from langgraph.store.base.embed import ensure_embeddings
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingDependencyError(
        f"MarsysStore needs LangGraph ({exc}): pip install 'marsys-mem[langgraph]'"
    ) from exc

__all__ = ["MarsysStore"]

_MARK = "langgraph_store"
"""Metadata key marking a message as a stored item (its value: the record format)."""
_FORMAT = 1
_OPERATORS = frozenset({"$eq", "$ne", "$gt", "$gte", "$lt", "$lte"})
_MAX_INDEX_CHARS = 100_000


class _TTLSettings(BaseModel):
    """LangGraph's ``TTLConfig``, checked (its TypedDict is not checkable by pydantic here)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    refresh_on_read: bool = True
    omit_expired: bool = True
    default_ttl: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    sweep_interval_minutes: float | None = Field(default=None, gt=0, allow_inf_nan=False)


ItemKey = tuple[tuple[str, ...], str]


def _now() -> datetime:
    return datetime.now(UTC)


def _item_id(namespace: tuple[str, ...], key: str) -> str:
    """The stable message id of an item (the same for every version of it)."""
    raw = json.dumps([list(namespace), key], ensure_ascii=False)
    return "lgs-" + hashlib.sha256(raw.encode("utf-8")).hexdigest()[:40]


def _plain(value: Any) -> Any:
    """A JSON value as plain dicts and lists (messages keep metadata frozen)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class _Record:
    """One stored item, as this store keeps it in memory."""

    namespace: tuple[str, ...]
    key: str
    value: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    ttl: float | None  # minutes
    expires_at: datetime | None
    texts: tuple[str, ...]  # what the search index holds, one entry each (() = not searchable)
    message_id: str

    @property
    def text(self) -> str:
        """The indexed texts as one (the stored message's content)."""
        return "\n".join(self.texts)

    def live(self, now: datetime) -> bool:
        return self.expires_at is None or self.expires_at > now

    def item(self) -> Item:
        return Item(
            value=copy.deepcopy(self.value),
            key=self.key,
            namespace=self.namespace,
            created_at=self.created_at,
            updated_at=self.updated_at,
        )

    def hit(self, score: float | None) -> SearchItem:
        return SearchItem(
            namespace=self.namespace,
            key=self.key,
            value=copy.deepcopy(self.value),
            created_at=self.created_at,
            updated_at=self.updated_at,
            score=score,
        )

    def to_message(self) -> Message:
        meta = {
            _MARK: _FORMAT,
            "namespace": list(self.namespace),
            "key": self.key,
            "value": self.value,
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
            "ttl": self.ttl,
            "expires_at": self.expires_at.isoformat() if self.expires_at else None,
            "indexed": bool(self.texts),
        }
        if len(self.texts) > 1:  # one entry each in the search index (LangGraph's fields)
            meta["texts"] = list(self.texts)
        return Message.user(
            self.text or None,
            message_id=self.message_id,
            metadata=meta,
            timestamp=self.updated_at,
        )

    @classmethod
    def from_message(cls, m: Message) -> _Record | None:
        meta = m.metadata
        if meta.get(_MARK) != _FORMAT:
            return None
        expires = meta.get("expires_at")
        ttl = meta.get("ttl")
        texts: tuple[str, ...] = ()
        if meta.get("indexed"):
            kept = meta.get("texts")
            is_list = isinstance(kept, list | tuple) and all(isinstance(t, str) for t in kept)
            texts = tuple(kept) if is_list else (m.text,)  # type: ignore[arg-type]
        return cls(
            namespace=tuple(str(p) for p in meta["namespace"]),  # type: ignore[union-attr]
            key=str(meta["key"]),
            value=_plain(meta["value"]),
            created_at=datetime.fromisoformat(str(meta["created_at"])),
            updated_at=datetime.fromisoformat(str(meta["updated_at"])),
            ttl=float(ttl) if isinstance(ttl, int | float) else None,
            expires_at=datetime.fromisoformat(expires) if isinstance(expires, str) else None,
            texts=texts,
            message_id=m.message_id,
        )


# ---------------------------------------------------------------------- validation
def _check_namespace(field: str, namespace: object, *, empty_ok: bool) -> tuple[str, ...]:
    if not isinstance(namespace, tuple):
        raise InvalidNamespaceError(
            f"{field} must be a tuple of strings, got {type(namespace).__name__} {namespace!r}"
        )
    if not namespace and not empty_ok:
        raise InvalidNamespaceError(f"{field} cannot be empty")
    for label in namespace:
        if label == "*" and field.endswith("path"):
            continue
        if not isinstance(label, str) or not label:
            raise InvalidNamespaceError(
                f"{field}: every label must be a non-empty string, got {label!r} in {namespace!r}"
            )
        if "." in label or "\x00" in label:
            raise InvalidNamespaceError(
                f"{field}: label {label!r} in {namespace!r} contains '.' or a NUL byte"
            )
    return namespace


def _check_count(field: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{field} must be an int >= {minimum}, got {value!r}")


def _check_filter(field: str, flt: object) -> None:
    """Raise ValueError naming the place of an unknown ``$`` operator."""
    if isinstance(flt, Mapping):
        for k, v in flt.items():
            if not isinstance(k, str):
                raise ValueError(f"{field}: filter keys must be strings, got {k!r}")
            if k.startswith("$") and k not in _OPERATORS:
                raise ValueError(
                    f"{field}: unknown operator {k!r}; use one of {sorted(_OPERATORS)}"
                )
            _check_filter(f"{field}.{k}", v)


def _normalized_value(op: PutOp) -> dict[str, Any]:
    """The JSON form of a put's value (what is stored and returned), or ValueError."""
    where = f"PutOp(namespace={op.namespace!r}, key={op.key!r})"
    if not isinstance(op.value, Mapping):
        raise ValueError(f"{where}: value must be a mapping or None, got {type(op.value).__name__}")
    for k in op.value:
        if not isinstance(k, str):
            raise ValueError(f"{where}: value keys must be strings, got {k!r}")
    try:
        text = json.dumps(dict(op.value), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: value must be JSON-serialisable: {exc}") from exc
    result: dict[str, Any] = json.loads(text)
    return result


def _validate(op: object) -> None:
    """Boundary checks for one op; raise with the field and value named."""
    if isinstance(op, GetOp):
        _check_namespace("GetOp.namespace", op.namespace, empty_ok=False)
        if not isinstance(op.key, str):
            raise ValueError(f"GetOp.key must be a string, got {op.key!r}")
    elif isinstance(op, PutOp):
        # (a root label "langgraph" is refused by BaseStore.put, and passes in a batch, as
        # in LangGraph's own stores: LangGraph writes there itself)
        _check_namespace("PutOp.namespace", op.namespace, empty_ok=False)
        if not isinstance(op.key, str):
            raise ValueError(f"PutOp.key must be a string, got {op.key!r}")
        if op.value is not None:
            _normalized_value(op)
        if op.index is not None and op.index is not False:
            if not isinstance(op.index, list) or not all(
                isinstance(p, str) and p for p in op.index
            ):
                raise ValueError(
                    f"PutOp.index must be None, False or a list of paths, got {op.index!r}"
                )
        ttl = op.ttl
        if ttl is not None and (
            isinstance(ttl, bool)
            or not isinstance(ttl, int | float)
            or not math.isfinite(ttl)
            or ttl <= 0
        ):
            raise ValueError(f"PutOp.ttl must be None or minutes > 0, got {ttl!r}")
    elif isinstance(op, SearchOp):
        _check_namespace("SearchOp.namespace_prefix", op.namespace_prefix, empty_ok=True)
        if op.filter is not None and not isinstance(op.filter, Mapping):
            raise ValueError(f"SearchOp.filter must be a mapping or None, got {op.filter!r}")
        _check_filter("SearchOp.filter", op.filter)
        _check_count("SearchOp.limit", op.limit, 0)
        _check_count("SearchOp.offset", op.offset, 0)
        if op.query is not None and not isinstance(op.query, str):
            raise ValueError(f"SearchOp.query must be a string or None, got {op.query!r}")
    elif isinstance(op, ListNamespacesOp):
        for i, cond in enumerate(op.match_conditions or ()):
            if not isinstance(cond, MatchCondition) or cond.match_type not in (
                "prefix",
                "suffix",
            ):
                raise ValueError(
                    f"ListNamespacesOp.match_conditions[{i}] must be a MatchCondition with "
                    f"match_type 'prefix' or 'suffix', got {cond!r}"
                )
            _check_namespace(
                f"ListNamespacesOp.match_conditions[{i}].path", cond.path, empty_ok=True
            )
        if op.max_depth is not None:
            _check_count("ListNamespacesOp.max_depth", op.max_depth, 1)
        _check_count("ListNamespacesOp.limit", op.limit, 0)
        _check_count("ListNamespacesOp.offset", op.offset, 0)
    else:
        raise TypeError(
            f"unknown store operation {type(op).__name__}: expected GetOp, PutOp, SearchOp "
            "or ListNamespacesOp"
        )


# ---------------------------------------------------------------------- matching
def _compare(actual: Any, wanted: Any) -> bool:
    """LangGraph's filter semantics: exact, nested objects, and ``$`` operators."""
    if isinstance(wanted, Mapping):
        if any(k.startswith("$") for k in wanted):
            return all(_operator(actual, k, v) for k, v in wanted.items())
        if not isinstance(actual, Mapping):
            return False
        return all(_compare(actual.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, list | tuple):
        return (
            isinstance(actual, list | tuple)
            and len(actual) == len(wanted)
            and all(_compare(a, w) for a, w in zip(actual, wanted, strict=True))
        )
    return bool(actual == wanted)


def _operator(actual: Any, operator: str, operand: Any) -> bool:
    if operator == "$eq":
        return bool(actual == operand)
    if operator == "$ne":
        return bool(actual != operand)
    try:
        a, b = float(actual), float(operand)
    except (TypeError, ValueError):
        return False  # a missing or non-numeric field never compares
    if operator == "$gt":
        return a > b
    if operator == "$gte":
        return a >= b
    if operator == "$lt":
        return a < b
    return a <= b  # $lte (the operators were validated)


def _matches(namespace: tuple[str, ...], cond: MatchCondition) -> bool:
    path = cond.path
    if len(namespace) < len(path):
        return False
    pairs = (
        zip(namespace, path, strict=False)
        if cond.match_type == "prefix"
        else zip(reversed(namespace), reversed(path), strict=False)
    )
    return all(p == "*" or n == p for n, p in pairs)


# ---------------------------------------------------------------------- LangGraph's embed
class _IndexEmbedder:
    """LangGraph's ``index["embed"]`` as a marsys-mem :class:`Embedder`.

    ``embed`` is what LangGraph's stores take: a LangChain ``Embeddings``, a sync or async
    function from texts to vectors, or a ``"provider:model"`` string that LangChain's
    ``init_embeddings`` resolves (LangGraph's ``ensure_embeddings`` does the resolving).
    Vectors are checked against ``dims`` and L2-normalised; queries go through the
    model's ``embed_query``.
    """

    def __init__(self, embed: object, dims: int) -> None:
        self._async_only = not isinstance(embed, str | Embeddings) and is_async_callable(embed)
        try:
            self.embeddings: Embeddings = ensure_embeddings(embed)  # type: ignore[arg-type]
        except ImportError as exc:
            raise MissingDependencyError(
                f"index.embed {embed!r} needs LangChain to resolve it ({exc}): "
                "pip install langchain and the provider's package (langchain-openai, ...)"
            ) from exc
        except ValueError as exc:
            if isinstance(embed, str) and importlib.util.find_spec("langchain") is None:
                raise MissingDependencyError(f"index.embed: {exc}") from exc
            raise ValueError(f"index.embed: {exc}") from exc
        self._dim = dims
        label = embed if isinstance(embed, str) else getattr(embed, "__qualname__", None)
        label = label or type(self.embeddings).__name__
        self._name = f"langchain:{label}:dims={dims}"

    @property
    def dim(self) -> int:
        """``index["dims"]``."""
        return self._dim

    @property
    def name(self) -> str:
        """``langchain:<model or function>:dims=<dims>``."""
        return self._name

    def _vectors(self, raw: object, count: int) -> npt.NDArray[np.float32]:
        try:
            vectors = np.asarray(raw, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise EmbeddingError(
                f"index.embed returned something that is not vectors: {exc}"
            ) from exc
        if vectors.shape != (count, self._dim):
            raise EmbeddingError(
                f"index.embed returned vectors of shape {vectors.shape}, expected "
                f"({count}, {self._dim}) (index.dims is {self._dim})"
            )
        if not np.isfinite(vectors).all():
            raise EmbeddingError("index.embed returned NaN or infinity")
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        unit: npt.NDArray[np.float32] = np.divide(
            vectors, norms, out=np.zeros_like(vectors), where=norms > 0
        )
        return unit

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Vectors of ``texts`` (``embed_documents``), unit length, ``(len(texts), dims)``."""
        items = list(texts)
        if not items:
            return np.zeros((0, self._dim), dtype=np.float32)
        if self._async_only:
            raw = run_blocking(self.embeddings.aembed_documents(items))
        else:
            raw = self.embeddings.embed_documents(items)
        return self._vectors(raw, len(items))

    async def aembed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Async twin of :meth:`embed` (``aembed_documents``)."""
        items = list(texts)
        if not items:
            return np.zeros((0, self._dim), dtype=np.float32)
        return self._vectors(await self.embeddings.aembed_documents(items), len(items))

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        """The vector of one search query (``embed_query``), shape ``(1, dims)``."""
        if self._async_only:
            raw = run_blocking(self.embeddings.aembed_query(text))
        else:
            raw = self.embeddings.embed_query(text)
        return self._vectors([raw], 1)


# ---------------------------------------------------------------------- the store
class MarsysStore(BaseStore, Closing):
    """LangGraph ``BaseStore`` over a marsys-mem store, with hybrid search and TTL.

    Args:
        store: the :class:`~marsys_mem.store.MemoryStore` items are kept in (default: a new
            ``InMemoryStore``, closed with this store). A given store is not closed.
        key: the store key ``(namespace, agent, branch)`` holding the items.
        embedder: a marsys-mem :class:`~marsys_mem.retrieval.embeddings.Embedder`,
            ``"default"`` (the packaged MiniLM if installed, else BM25 only) or ``None``
            (BM25 only).
        index: LangGraph's index config, as its stores take it: ``embed`` (a LangChain
            ``Embeddings``, a sync or async function from texts to vectors, or a
            ``"provider:model"`` string resolved by LangChain's ``init_embeddings``;
            instead of ``embedder``), ``dims`` (its vector length; required with
            ``embed``) and ``fields`` (the paths embedded for search, default ``["$"]``;
            each path's text is one entry, and an item scores as its best one).
        mode: ``"hybrid"`` (dense + BM25, fused; calibrated scores) or ``"dense"``
            (the cosine similarity, as LangGraph's stores score); default: ``"dense"``
            with ``index["embed"]`` (a LangGraph config behaves as in LangGraph),
            ``"hybrid"`` otherwise.
        ttl_config: LangGraph's ``TTLConfig`` (``default_ttl``, ``refresh_on_read``,
            ``sweep_interval_minutes``).
        clock: returns the current time (timezone-aware); for tests.

    Example:
        >>> from marsys_mem.retrieval.embeddings import HashingEmbedder
        >>> store = MarsysStore(embedder=HashingEmbedder())
        >>> store.put(("users", "alice"), "food", {"text": "Alice loves spicy ramen"})
        >>> store.put(("users", "alice"), "city", {"text": "Alice lives in Lisbon"})
        >>> store.get(("users", "alice"), "city").value
        {'text': 'Alice lives in Lisbon'}
        >>> hit = store.search(("users",), query="where does alice live", limit=1)[0]
        >>> hit.key, hit.score > 0
        ('city', True)
        >>> store.list_namespaces()
        [('users', 'alice')]
        >>> store.close()
    """

    supports_ttl = True

    def __init__(
        self,
        store: MemoryStore | None = None,
        *,
        key: Key = ("langgraph", "store", "items"),
        embedder: Embedder | Literal["default"] | None = "default",
        index: Mapping[str, Any] | None = None,
        mode: SearchMode | None = None,
        ttl_config: TTLConfig | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        if store is not None and not isinstance(store, MemoryStore):
            raise TypeError(f"store must be a MemoryStore, got {type(store).__name__}")
        self.key: Key = validate_key(key)
        fields: list[str] = ["$"]
        self.index_config: dict[str, Any] | None = None
        """LangGraph's index config as given (``embed`` resolved), or ``None``."""
        if index is not None:
            if not isinstance(index, Mapping):
                raise ValueError(
                    f"index must be a mapping (LangGraph's IndexConfig), got {index!r}"
                )
            unknown = sorted(set(index) - {"fields", "dims", "embed"})
            if unknown:
                raise ValueError(
                    f"index: unknown or unsupported keys {unknown}; MarsysStore takes "
                    "LangGraph's 'embed', 'dims' and 'fields'"
                )
            given = index.get("fields")
            if given is not None:
                if not isinstance(given, list) or not all(isinstance(p, str) and p for p in given):
                    raise ValueError(f"index.fields must be a list of paths, got {given!r}")
                fields = list(given) or ["$"]
            self.index_config = {**index, "fields": fields}
            if index.get("embed") is not None:
                dims = index.get("dims")
                if isinstance(dims, bool) or not isinstance(dims, int) or dims < 1:
                    raise ValueError(
                        f"index.dims must be the embed model's vector length (an int >= 1) "
                        f"when index.embed is given, got {dims!r}"
                    )
                if embedder != "default":
                    raise ValueError(
                        "give the embedding model once: index['embed'] (LangGraph's way) or "
                        f"embedder=... (a marsys-mem Embedder), not both (embedder={embedder!r})"
                    )
                resolved = _IndexEmbedder(index["embed"], dims)
                embedder = resolved
                self.index_config["embed"] = resolved.embeddings
                mode = "dense" if mode is None else mode
        if mode is not None and mode not in ("hybrid", "dense"):
            raise ValueError(f"mode must be 'hybrid' or 'dense', got {mode!r}")
        self._fields = [(p, p if p == "$" else tokenize_path(p)) for p in fields]
        if ttl_config is not None:
            if not isinstance(ttl_config, Mapping):
                raise ValueError(f"ttl_config must be a TTLConfig mapping, got {ttl_config!r}")
            try:
                _TTLSettings.model_validate(dict(ttl_config))
            except ValidationError as exc:
                raise ValueError(f"ttl_config is invalid: {exc}") from exc
        self.ttl_config = ttl_config
        self._clock = clock or _now
        self._owns_store = store is None
        self.store: MemoryStore = store if store is not None else InMemoryStore()
        self._lock = threading.RLock()
        self._items: dict[tuple[str, ...], dict[str, _Record]] = {}
        self._closed = False
        self._last_sweep = self._clock()
        self._rag = RAGMemory(embedder, max_chars=_MAX_INDEX_CHARS, mode=mode or "hybrid")
        self._entries: dict[str, tuple[str, ...]] = {}  # item message id -> its index entries
        self._owner: dict[str, str] = {}  # index entry -> item message id
        try:
            self._load()
        except BaseException:
            self._rag.close()
            raise

    def _load(self) -> None:
        records = [r for r in map(_Record.from_message, self.store.load_messages(self.key)) if r]
        for r in records:
            self._items.setdefault(r.namespace, {})[r.key] = r
        self._index([r for r in records if r.texts])

    # ------------------------------------------------------------------ the search index
    def _index(self, records: Iterable[_Record]) -> None:
        """Add each record's texts to the search index, one entry per text."""
        entries: list[Message] = []
        for r in records:
            ids = tuple(f"{r.message_id}.{i}" for i in range(len(r.texts)))
            self._entries[r.message_id] = ids
            for entry, text in zip(ids, r.texts, strict=True):
                self._owner[entry] = r.message_id
                entries.append(Message.user(text, message_id=entry))
        if entries:
            self._rag.add_many(entries)

    def _unindex(self, message_ids: Iterable[str]) -> None:
        gone = [e for mid in message_ids for e in self._entries.pop(mid, ())]
        for entry in gone:
            del self._owner[entry]
        if gone:
            self._rag.remove(gone)

    # ------------------------------------------------------------------ BaseStore
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Execute ``ops``: reads first (on the state before), then every write at once.

        Raises:
            InvalidNamespaceError, ValueError, TypeError: a malformed op (nothing done).
            StoreError: the backing store failed (nothing changed).
        """
        ops = list(ops)
        if self._closed:
            raise RuntimeError("MarsysStore is closed")
        for op in ops:
            _validate(op)
        with self._lock:
            now = self._clock()
            results: list[Result] = []
            touched: dict[ItemKey, _Record] = {}
            puts: dict[ItemKey, PutOp] = {}
            for op in ops:
                if isinstance(op, GetOp):
                    results.append(self._get(op, now, touched))
                elif isinstance(op, SearchOp):
                    results.append(self._search(op, now, touched))
                elif isinstance(op, ListNamespacesOp):
                    results.append(self._list_namespaces(op, now))
                else:
                    assert isinstance(op, PutOp)
                    puts[(op.namespace, op.key)] = op
                    results.append(None)
            self._write(puts, touched, now)
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Async twin of :meth:`batch` (runs in a worker thread)."""
        return await asyncio.to_thread(self.batch, list(ops))

    # ------------------------------------------------------------------ reads
    def _live(self, namespace: tuple[str, ...], key: str, now: datetime) -> _Record | None:
        r = self._items.get(namespace, {}).get(key)
        return r if r is not None and r.live(now) else None

    @staticmethod
    def _touch(r: _Record, refresh: bool, now: datetime, touched: dict[ItemKey, _Record]) -> None:
        if refresh and r.ttl is not None:
            touched[(r.namespace, r.key)] = replace(r, expires_at=now + timedelta(minutes=r.ttl))

    def _get(self, op: GetOp, now: datetime, touched: dict[ItemKey, _Record]) -> Item | None:
        r = self._live(op.namespace, op.key, now)
        if r is None:
            return None
        self._touch(r, op.refresh_ttl, now, touched)
        return r.item()

    def _candidates(self, op: SearchOp, now: datetime) -> list[_Record]:
        prefix = op.namespace_prefix
        n = len(prefix)
        out = [
            r
            for ns, records in self._items.items()
            if ns[:n] == prefix
            for r in records.values()
            if r.live(now)
            and (not op.filter or all(_compare(r.value.get(k), v) for k, v in op.filter.items()))
        ]
        out.sort(key=lambda r: (r.updated_at, r.namespace, r.key), reverse=True)
        return out

    def _ranked(self, query: str, wanted: dict[str, _Record], need: int) -> list[tuple[str, float]]:
        """Ids of ``wanted`` records ranked for ``query`` (best first), at least ``need``.

        A record scores as its best entry (LangGraph's rule for items with several fields).
        """
        indexed = sum(1 for mid in wanted if mid in self._entries)
        if not indexed or not query.strip():
            return []
        k = max(need, 16)
        while True:
            # every item ranked, whatever its score (LangGraph's stores return them all)
            hits = self._rag.search(query, min(k, len(self._rag)), None)
            ranked: dict[str, float] = {}
            for h in hits:
                mid = self._owner.get(h.id)
                if mid is not None and mid in wanted and mid not in ranked:
                    # dense: the cosine, as LangGraph's stores score; hybrid: calibrated
                    dense = self._rag.mode == "dense" and h.dense_score is not None
                    ranked[mid] = h.dense_score if dense else h.score  # type: ignore[assignment]
            if len(ranked) >= min(need, indexed) or len(hits) < k or k >= len(self._rag):
                return list(ranked.items())
            k *= 4

    def _search(
        self, op: SearchOp, now: datetime, touched: dict[ItemKey, _Record]
    ) -> list[SearchItem]:
        candidates = self._candidates(op, now)
        end = op.offset + op.limit
        if op.query:
            by_id = {r.message_id: r for r in candidates}
            ranked = self._ranked(op.query, by_id, end)
            seen = {mid for mid, _ in ranked}
            ordered: list[tuple[_Record, float | None]] = [
                (by_id[mid], score) for mid, score in ranked
            ]
            ordered += [(r, None) for r in candidates if r.message_id not in seen]
        else:
            ordered = [(r, None) for r in candidates]
        page = ordered[op.offset : end]
        for r, _ in page:
            self._touch(r, op.refresh_ttl, now, touched)
        return [r.hit(score) for r, score in page]

    def _list_namespaces(self, op: ListNamespacesOp, now: datetime) -> list[tuple[str, ...]]:
        found = [
            ns
            for ns, records in self._items.items()
            if any(r.live(now) for r in records.values())
            and all(_matches(ns, c) for c in op.match_conditions or ())
        ]
        if op.max_depth is not None:
            found = list({ns[: op.max_depth] for ns in found})
        return sorted(found)[op.offset : op.offset + op.limit]

    # ------------------------------------------------------------------ writes
    def _index_texts(
        self, value: dict[str, Any], index: Literal[False] | list[str] | None
    ) -> tuple[str, ...]:
        """The texts of ``value`` at the index paths, one per match (LangGraph's rule)."""
        if index is False:
            return ()
        paths = self._fields if index is None else [(p, tokenize_path(p)) for p in index]
        texts = [t for _, path in paths for t in get_text_at_path(value, path) if t.strip()]
        return tuple(t[:_MAX_INDEX_CHARS] for t in texts)

    def _record(self, op: PutOp, now: datetime) -> _Record:
        value = _normalized_value(op)
        old = self._items.get(op.namespace, {}).get(op.key)
        created = old.created_at if old is not None and old.live(now) else now
        ttl = float(op.ttl) if op.ttl is not None else None
        return _Record(
            namespace=op.namespace,
            key=op.key,
            value=value,
            created_at=created,
            updated_at=now,
            ttl=ttl,
            expires_at=now + timedelta(minutes=ttl) if ttl is not None else None,
            texts=self._index_texts(value, op.index),
            message_id=old.message_id if old is not None else _item_id(op.namespace, op.key),
        )

    def _expired(self, now: datetime) -> list[_Record]:
        return [r for records in self._items.values() for r in records.values() if not r.live(now)]

    def _write(
        self, puts: dict[ItemKey, PutOp], touched: dict[ItemKey, _Record], now: datetime
    ) -> None:
        """Apply puts, deletes and refreshed TTLs: one store transaction, then memory."""
        new: dict[ItemKey, _Record | None] = {}
        for ik, op in puts.items():
            new[ik] = None if op.value is None else self._record(op, now)
        for ik, r in touched.items():
            new.setdefault(ik, r)
        interval = (self.ttl_config or {}).get("sweep_interval_minutes")
        if interval is not None and now - self._last_sweep >= timedelta(minutes=interval):
            for r in self._expired(now):
                new.setdefault((r.namespace, r.key), None)
            self._last_sweep = now
        self._commit(new)

    def _commit(self, new: Mapping[ItemKey, _Record | None]) -> None:
        """Write ``new`` (None: delete) to the store in one transaction, then to memory."""
        stored = {
            ik: old for ik in new if (old := self._items.get(ik[0], {}).get(ik[1])) is not None
        }
        gone = tuple(old.message_id for old in stored.values())
        added = tuple(r.to_message() for r in new.values() if r is not None)
        if not gone and not added:
            return
        ops: list[Append | Delete] = []
        if gone:
            ops.append(Delete(self.key, ids=gone))
        if added:
            ops.append(Append(self.key, added))
        self.store.batch(ops)  # all or nothing: memory changes only after this
        self._unindex(
            old.message_id
            for ik, old in stored.items()
            if old.texts and ((r := new[ik]) is None or r.texts != old.texts)
        )
        fresh: list[_Record] = []
        for (ns, key), r in new.items():
            old = stored.get((ns, key))
            if r is None:
                records = self._items.get(ns)
                if records is not None:
                    records.pop(key, None)
                    if not records:
                        del self._items[ns]
                continue
            self._items.setdefault(ns, {})[key] = r
            if r.texts and (old is None or old.texts != r.texts):
                fresh.append(r)
        self._index(fresh)

    # ------------------------------------------------------------------ TTL
    def sweep_ttl(self) -> int:
        """Delete expired items from the store (one transaction); returns how many."""
        if self._closed:
            raise RuntimeError("MarsysStore is closed")
        with self._lock:
            now = self._clock()
            expired = self._expired(now)
            self._commit({(r.namespace, r.key): None for r in expired})
            self._last_sweep = now
        return len(expired)

    async def asweep_ttl(self) -> int:
        """Async twin of :meth:`sweep_ttl`."""
        return await asyncio.to_thread(self.sweep_ttl)

    # ------------------------------------------------------------------ lifecycle
    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def close(self) -> None:
        """Stop the search index; close the backing store if this store made it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._rag.close()
        if self._owns_store:
            self.store.close()

    def __len__(self) -> int:
        """Items held (expired ones not yet swept included)."""
        return sum(len(records) for records in self._items.values())

    def __repr__(self) -> str:
        backing = type(self.store).__name__
        return f"MarsysStore(items={len(self)}, key={self.key!r}, store={backing})"
