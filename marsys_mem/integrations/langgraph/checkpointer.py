"""A LangGraph checkpointer over a marsys-mem store that stores each message once.

:class:`MarsysCheckpointer` keeps one append-only message log per thread and stores a
``messages`` value as ranges of log positions, so a turn costs what it adds, not the
whole conversation. Every ``put`` and ``put_writes`` is one atomic store batch, and
several writers of one thread never lose a turn silently: a run that continues from a
checkpoint another writer has extended raises
:class:`~marsys_mem.exceptions.ConflictError` and stores nothing.

Guide: ``docs/guides/integrations.md#how-the-checkpointer-stores-a-thread``.
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import hashlib
import os
import random
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from marsys_mem.exceptions import ConflictError, MissingDependencyError
from marsys_mem.model.messages import Message, ToolCall
from marsys_mem.model.names import is_name, shown, validate_name
from marsys_mem.store.base import Append, Delete, ExpectLast, Key, Load, MemoryStore, Op

try:
    from langchain_core.messages import BaseMessage
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        PendingWrite,
        get_checkpoint_id,
        get_checkpoint_metadata,
        writes_sort_key,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
except ImportError as exc:  # pragma: no cover - exercised without the extra only
    raise MissingDependencyError(
        f"MarsysCheckpointer needs langgraph ({exc}): pip install 'marsys-mem[langgraph]'"
    ) from exc

__all__ = ["CheckpointerSettings", "MarsysCheckpointer", "thread_name"]

_LOG = "messages"
_RECORDS = "checkpoints"
_HEAD = "head"
_ESCAPED = frozenset("/+#@%")
_MAX_ESCAPED = 200
_ATTEMPTS = 100  # store batches retried after another writer's (each retry: one commit)
_MAX_READS = 64  # latest checkpoints remembered per thread (runs in flight in this process)


def thread_name(thread_id: str) -> str:
    """The store name of a LangGraph thread id: escaped, or hashed when long.

    ``/``, ``+``, ``#``, ``@``, ``%`` and control characters become ``%XX`` (so distinct
    ids stay distinct); an empty id, or one whose escaped form is over 200 characters,
    becomes ``%%`` and a SHA-256 digest (no escaped form contains ``%%``).

    Example:
        >>> thread_name("user-42"), thread_name("a/b")
        ('user-42', 'a%2Fb')
        >>> thread_name("x" * 300)[:6]
        '%%0d4e'
    """
    out = "".join(
        f"%{ord(c):02X}" if c in _ESCAPED or (ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F) else c
        for c in thread_id
    )
    if not out or len(out) > _MAX_ESCAPED or not is_name(out):
        return "%%" + hashlib.sha256(thread_id.encode("utf-8", "surrogatepass")).hexdigest()
    return out


class CheckpointerSettings(BaseModel):
    """The settings of a :class:`MarsysCheckpointer`, validated at construction.

    Attributes:
        namespace: the store namespace of all threads (a name).
        message_channels: channels whose values, when lists of LangChain messages with
            ids, are stored as references into the thread's message log.

    Example:
        >>> CheckpointerSettings(namespace="chat").message_channels
        ('messages',)
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str = "langgraph"
    message_channels: tuple[str, ...] = Field(default=("messages",))

    @field_validator("namespace")
    @classmethod
    def _name(cls, value: str) -> str:
        return validate_name("namespace", value)

    @field_validator("message_channels")
    @classmethod
    def _channels(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for i, channel in enumerate(value):
            if not channel:
                raise ValueError(f"message_channels[{i}] must be a non-empty string")
        return value


# ---------------------------------------------------------------------------- records
def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"))


def _plain(value: object) -> bool:
    """Whether ``value`` survives a JSON round trip exactly (types included)."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return True
    if kind is float:
        return cast(float, value) - cast(float, value) == 0  # finite: no nan, no inf
    if kind is list:
        return all(_plain(v) for v in cast(list[Any], value))
    if kind is dict:
        return all(type(k) is str and _plain(v) for k, v in cast(dict[Any, Any], value).items())
    return False


def _encode(serde: SerializerProtocol, value: Any) -> dict[str, Any]:
    """A value as record fields: ``{"j": value}`` when plain JSON, else the serde's bytes."""
    if _plain(value):
        return {"j": value}
    t, d = serde.dumps_typed(value)
    return {"t": t, "d": _b64(d)}


def _copy(value: Any) -> Any:
    """A fresh, mutable copy of a JSON value (callers may change what they read).

    Stored records come back frozen (``FrozenDict``, ``FrozenList``): these become a plain
    ``dict`` and ``list`` again, as written.
    """
    if isinstance(value, list):
        return [_copy(v) for v in value]
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return value


def _decode(serde: SerializerProtocol, rec: dict[str, Any]) -> Any:
    """The value of :func:`_encode`'s fields (a fresh object each time)."""
    if "j" in rec:
        return _copy(rec["j"])
    return serde.loads_typed((str(rec["t"]), _unb64(str(rec["d"]))))


def _digest(*parts: object) -> str:
    text = "\x1f".join(str(p) for p in parts)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


def _ranges(seqs: Sequence[int]) -> list[list[int]]:
    """``[start, stop)`` runs of consecutive log positions."""
    out: list[list[int]] = []
    for seq in seqs:
        if out and out[-1][1] == seq:
            out[-1][1] = seq + 1
        else:
            out.append([seq, seq + 1])
    return out


_Write = tuple[str, str, dict[str, Any], str]  # task, channel, encoded value, task path
_Built = tuple[builtins.list[Op], Callable[[], object]]  # a write's ops, and its cache update


@dataclass
class _Ckpt:
    ns: str
    id: str
    parent: str | None
    checkpoint: dict[str, Any]
    metadata: dict[str, Any]
    record_id: str


@dataclass
class _Thread:
    """What the checkpointer knows of one thread (a cache of its two store keys)."""

    thread_id: str
    tip: str | None = None
    ckpts: dict[str, dict[str, _Ckpt]] = field(default_factory=dict)
    latest: dict[str, str] = field(default_factory=dict)
    writes: dict[tuple[str, str], dict[tuple[str, int], _Write]] = field(default_factory=dict)
    write_ids: dict[tuple[str, str, str, int], str] = field(default_factory=dict)  # -> record
    blobs: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    blob_ids: dict[tuple[str, str, str], str] = field(default_factory=dict)  # -> its record
    log: list[Any] = field(default_factory=list)  # index: log position; None: deleted
    by_lc_id: dict[str, int] = field(default_factory=dict)
    next_seq: int = 0
    last_refs: dict[tuple[str, str], list[list[int]]] = field(default_factory=dict)
    fork: tuple[str, int] | None = None  # (source thread, positions below it read from there)
    children: dict[str, int] = field(default_factory=dict)  # forks of this thread -> upto
    has_record: bool = False

    def add_ckpt(self, ckpt: _Ckpt) -> None:
        self.ckpts.setdefault(ckpt.ns, {})[ckpt.id] = ckpt
        if ckpt.id >= self.latest.get(ckpt.ns, ""):
            self.latest[ckpt.ns] = ckpt.id


def _version(value: object) -> str:
    return str(value)


# ---------------------------------------------------------------------------- saver
class MarsysCheckpointer(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer that stores each message of a thread once.

    Works over any marsys-mem store (:class:`~marsys_mem.store.InMemoryStore`,
    :class:`~marsys_mem.store.SQLiteStore`, :class:`~marsys_mem.store.PostgresStore`);
    sync and async; passes LangGraph's
    ``langgraph-checkpoint-conformance`` suite, base and extended capabilities
    (``copy_thread``, ``prune``, ``delete_for_runs``).

    Concurrent writers of a thread: every invoke that returns is in the thread's state; one
    that lost the race to another writer raises :class:`~marsys_mem.exceptions.ConflictError`
    (see the module's docstring), and is safe to run again.

    Args:
        store: where checkpoints and messages live.
        namespace: the store namespace for all threads (default ``"langgraph"``).
        message_channels: channels stored as message references (default ``messages``).
        serde: LangGraph serializer for other channel values, metadata and writes.

    Raises:
        ValueError: a setting is not valid (the message names it and its value).

    Example:
        >>> from langgraph.graph import END, START, MessagesState, StateGraph
        >>> from marsys_mem.store import InMemoryStore
        >>> def reply(state):
        ...     return {"messages": [("ai", f"heard {len(state['messages'])}")]}
        >>> builder = StateGraph(MessagesState).add_node("reply", reply)
        >>> graph = builder.add_edge(START, "reply").add_edge("reply", END).compile(
        ...     checkpointer=MarsysCheckpointer(InMemoryStore()))
        >>> config = {"configurable": {"thread_id": "t1"}}
        >>> _ = graph.invoke({"messages": [("user", "hi")]}, config)
        >>> graph.invoke({"messages": [("user", "again")]}, config)["messages"][-1].content
        'heard 3'
    """

    def __init__(
        self,
        store: MemoryStore,
        *,
        namespace: str = "langgraph",
        message_channels: Iterable[str] = ("messages",),
        serde: SerializerProtocol | None = None,
    ) -> None:
        if not isinstance(store, MemoryStore):
            raise TypeError(f"store must be a MemoryStore, got {type(store).__name__}")
        try:
            self.settings = CheckpointerSettings(
                namespace=namespace, message_channels=tuple(message_channels)
            )
        except ValidationError as exc:
            raise ValueError(f"MarsysCheckpointer: {exc}") from None
        super().__init__(serde=serde)
        self.store = store
        self._lock = threading.RLock()
        self._threads: dict[str, _Thread] = {}
        # per thread: (ns, checkpoint id) handed out as the latest (get_tuple without an id)
        # or just written, with how many runs continue from it (see put)
        self._reads: dict[str, dict[tuple[str, str | None], int]] = {}

    # ------------------------------------------------------------------ keys, config
    def _keys(self, thread_id: str) -> tuple[Key, Key]:
        name = thread_name(thread_id)
        ns = self.settings.namespace
        return (ns, name, _RECORDS), (ns, name, _LOG)

    def _head_key(self, thread_id: str) -> Key:
        return (self.settings.namespace, thread_name(thread_id), _HEAD)

    def _new_head(self, thread_id: str) -> tuple[str, builtins.list[Op]]:
        """A fresh head token and the ops that make it the thread's head (one message)."""
        token = "h" + os.urandom(12).hex()
        key = self._head_key(thread_id)
        return token, [Delete(key), Append(key, (Message.system("head", message_id=token),))]

    @staticmethod
    def _thread_id(config: RunnableConfig | None, what: str = "config") -> str:
        conf = (config or {}).get("configurable") or {}
        value = conf.get("thread_id")
        if value is None or isinstance(value, bool):
            raise ValueError(f"{what}['configurable']['thread_id'] is required, got {shown(value)}")
        return value if isinstance(value, str) else str(value)

    @staticmethod
    def _ns(config: RunnableConfig) -> str:
        value = config["configurable"].get("checkpoint_ns", "")
        if not isinstance(value, str):
            raise ValueError(f"checkpoint_ns must be a string, got {shown(value)}")
        return value

    # ------------------------------------------------------------------ loading
    def _tip(self, thread_id: str) -> str | None:
        """The thread's head token, rewritten by every write (O(1) in every store)."""
        head = self.store.load_messages(self._head_key(thread_id))
        return head[-1].message_id if head else None

    def _thread(self, thread_id: str) -> _Thread:
        """The cached thread, reloaded when the store's newest record is not the cache's."""
        tip = self._tip(thread_id)
        cached = self._threads.get(thread_id)
        if cached is not None and cached.tip == tip:
            return cached
        thread = self._load(thread_id)
        self._threads[thread_id] = thread
        return thread

    def _load(self, thread_id: str) -> _Thread:
        """The thread as stored: its head, records and log read in one snapshot."""
        records_key, log_key = self._keys(thread_id)
        head, records, log = self.store.batch(
            [
                Load(self._head_key(thread_id), last=1),
                _load_op(records_key),
                _load_op(log_key),
            ]
        )
        thread = _Thread(thread_id, tip=head[-1].message_id if head else None)
        for m in log:
            meta = m.metadata
            seq = int(meta["seq"])
            value = self.serde.loads_typed((str(meta["lc_type"]), _unb64(str(meta["lc"]))))
            _put_at(thread.log, seq, value)
            lc_id = meta.get("lc_id")
            if isinstance(lc_id, str):
                thread.by_lc_id[lc_id] = seq
        for m in records:
            self._apply_record(thread, m)
        if thread.fork is not None:  # a copy-on-write fork: positions below upto are the source's
            source_id, upto = thread.fork
            source = self._thread(source_id)
            borrowed = source.log[:upto]
            borrowed += [None] * (upto - len(borrowed))
            thread.log = borrowed + thread.log[upto:]
            for lc_id, seq in source.by_lc_id.items():
                if seq < upto:
                    thread.by_lc_id.setdefault(lc_id, seq)
        thread.next_seq = len(thread.log)
        return thread

    def _apply_record(self, thread: _Thread, m: Message) -> None:
        rec: dict[str, Any] = dict(m.structured_data or {})
        kind = rec.get("k")
        if kind == "thread":
            thread.has_record = True
        elif kind == "fork":
            thread.fork = (str(rec["source"]), int(cast(int, rec["upto"])))
        elif kind == "child":
            thread.children[str(rec["target"])] = int(cast(int, rec["upto"]))
        elif kind == "blob":  # a blob whose checkpoint was deleted while others need it
            key = (str(rec["ns"]), str(rec["ch"]), str(rec["v"]))
            thread.blobs[key] = rec
            thread.blob_ids[key] = m.message_id
        elif kind == "ckpt":
            ns, cid = str(rec["ns"]), str(rec["id"])
            checkpoint = _decode(self.serde, rec["c"])
            checkpoint["id"] = cid
            for channel, blob in cast(dict[str, dict[str, Any]], rec.get("b", {})).items():
                key = (ns, channel, str(blob["v"]))
                thread.blobs[key] = blob
                thread.blob_ids[key] = m.message_id
            ckpt = _Ckpt(
                ns=ns,
                id=cid,
                parent=cast("str | None", rec.get("parent")),
                checkpoint=checkpoint,
                metadata=_decode(self.serde, rec["m"]),
                record_id=m.message_id,
            )
            thread.add_ckpt(ckpt)
        elif kind == "writes":
            ns, cid, task = str(rec["ns"]), str(rec["cid"]), str(rec["task"])
            path = str(rec.get("path", ""))
            target = thread.writes.setdefault((ns, cid), {})
            for idx, channel, value in cast(builtins.list[builtins.list[Any]], rec["w"]):
                target[(task, int(idx))] = (task, str(channel), value, path)
                thread.write_ids[(ns, cid, task, int(idx))] = m.message_id

    # ------------------------------------------------------------------ reading
    def _values(self, thread: _Thread, ns: str, versions: ChannelVersions) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for channel, version in versions.items():
            rec = thread.blobs.get((ns, channel, _version(version)))
            if rec is None or "e" in rec:
                continue
            if "refs" in rec:
                log = thread.log
                out: builtins.list[Any] = []
                for start, stop in cast(builtins.list[builtins.list[int]], rec["refs"]):
                    out += log[start:stop]  # a C-speed slice, not a loop over messages
                values[channel] = out
            else:
                values[channel] = _decode(self.serde, rec)
        return values

    def _tuple(self, thread: _Thread, ckpt: _Ckpt) -> CheckpointTuple:
        writes = thread.writes.get((ckpt.ns, ckpt.id), {})
        ordered = sorted(writes.items(), key=lambda kv: writes_sort_key(kv[1][3], *kv[0]))
        pending: builtins.list[PendingWrite] = [
            (task, channel, _decode(self.serde, value)) for _, (task, channel, value, _) in ordered
        ]
        base = ckpt.checkpoint
        checkpoint = cast(
            Checkpoint,
            {
                **base,
                "channel_versions": dict(base.get("channel_versions", {})),
                "versions_seen": {k: dict(v) for k, v in base.get("versions_seen", {}).items()},
                "channel_values": self._values(thread, ckpt.ns, base.get("channel_versions", {})),
            },
        )

        def conf(cid: str) -> RunnableConfig:
            return {
                "configurable": {
                    "thread_id": thread.thread_id,
                    "checkpoint_ns": ckpt.ns,
                    "checkpoint_id": cid,
                }
            }

        return CheckpointTuple(
            config=conf(ckpt.id),
            checkpoint=checkpoint,
            metadata=cast(CheckpointMetadata, dict(ckpt.metadata)),
            parent_config=conf(ckpt.parent) if ckpt.parent else None,
            pending_writes=pending,
        )

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names, or the thread's latest in its namespace.

        The latest is remembered as what a run continues from (see :meth:`put`); a
        checkpoint named by id is one a run forks from (time travel).
        """
        thread_id = self._thread_id(config)
        ns = self._ns(config)
        with self._lock:
            thread = self._thread(thread_id)
            ckpts = thread.ckpts.get(ns, {})
            requested = get_checkpoint_id(config)
            cid = requested or thread.latest.get(ns)
            if requested:
                self._reads.get(thread_id, {}).pop((ns, requested), None)
            else:
                self._note_read(thread_id, ns, cid, +1)
            ckpt = ckpts.get(cid) if cid else None
            return self._tuple(thread, ckpt) if ckpt is not None else None

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first, by thread, namespace, id, metadata and ``before``."""
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)):
            raise ValueError(f"limit must be an int or None, got {shown(limit)}")
        return iter(self._list(config, filter, before, limit))

    def _list(
        self,
        config: RunnableConfig | None,
        filter_: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> builtins.list[CheckpointTuple]:
        conf = (config or {}).get("configurable") or {}
        ns_filter = conf.get("checkpoint_ns")
        cid_filter = conf.get("checkpoint_id")
        before_id = get_checkpoint_id(before) if before else None
        out: builtins.list[CheckpointTuple] = []
        with self._lock:
            ids = [self._thread_id(config)] if config else self._all_thread_ids()
            for thread_id in ids:
                thread = self._thread(thread_id)
                found = [
                    c
                    for ns, ckpts in thread.ckpts.items()
                    if ns_filter is None or ns == ns_filter
                    for c in ckpts.values()
                    if (not cid_filter or c.id == cid_filter)
                    and (not before_id or c.id < before_id)
                    and (not filter_ or all(c.metadata.get(k) == v for k, v in filter_.items()))
                ]
                found.sort(key=lambda c: c.id, reverse=True)
                for ckpt in found:
                    if limit is not None and len(out) >= limit:
                        return out
                    out.append(self._tuple(thread, ckpt))
        return out

    def _all_thread_ids(self) -> builtins.list[str]:
        ids: builtins.list[str] = []
        for ns, name, branch in self.store.list_keys(self.settings.namespace):
            if branch != _RECORDS:
                continue
            known = [t for t in self._threads if thread_name(t) == name]
            if known:
                ids.append(known[0])
                continue
            for m in self.store.load_messages((ns, name, branch)):
                record = m.structured_data or {}
                if record.get("k") == "thread":
                    ids.append(str(record["thread_id"]))
                    break
        return ids

    # ------------------------------------------------------------------ writing
    def _record(self, record_id: str, record: dict[str, Any], label: str) -> Message:
        return Message.system(label, message_id=record_id, structured_data=record)

    def _message_refs(
        self,
        thread: _Thread,
        value: builtins.list[Any],
        new: dict[int, Any],
        next_seq: int,
        bases: Iterable[builtins.list[builtins.list[int]] | None],
    ) -> tuple[builtins.list[builtins.list[int]], int] | None:
        """Log ranges of ``value``'s messages; unseen ones go to ``new`` (not the cache).

        ``bases`` are the refs of lists ``value`` probably extends (its parent's, the last
        stored): when one is a prefix of ``value`` (the same message objects, compared at C
        speed), only the suffix is looked at, so a turn costs what it adds. ``None``: not a
        list of messages with ids (store it by value).
        """
        log = thread.log
        prefix: builtins.list[builtins.list[int]] = []
        start = 0
        for base in bases:
            if not base:
                continue
            pos = 0
            for a, b in base:
                if value[pos : pos + b - a] != log[a:b]:
                    break
                pos += b - a
            else:
                prefix, start = [list(r) for r in base], pos
                break
        suffix = value[start:] if start else value
        if not _is_message_list(suffix):
            return None
        seqs: builtins.list[int] = []
        pending_ids: dict[str, int] = {}
        for m in suffix:
            lc_id = m.id
            seq = pending_ids.get(lc_id)
            if seq is None:
                seq = thread.by_lc_id.get(lc_id)
                if seq is not None:
                    known = log[seq]
                    if known is not m and known != m:
                        seq = None
            if seq is None:
                seq = next_seq
                next_seq += 1
                new[seq] = m
                pending_ids[lc_id] = seq
            seqs.append(seq)
        refs = _ranges(seqs)
        if prefix and refs and prefix[-1][1] == refs[0][0]:
            prefix[-1][1] = refs.pop(0)[1]
        return prefix + refs, next_seq

    @staticmethod
    def _bases(
        thread: _Thread, ns: str, parent: str | None, channel: str
    ) -> builtins.list[builtins.list[builtins.list[int]] | None]:
        """Refs a new value of ``channel`` likely extends: its parent's, then the last stored."""
        out: builtins.list[builtins.list[builtins.list[int]] | None] = []
        ckpt = thread.ckpts.get(ns, {}).get(parent) if parent else None
        if ckpt is not None:
            version = ckpt.checkpoint.get("channel_versions", {}).get(channel)
            if version is not None:
                rec = thread.blobs.get((ns, channel, _version(version)))
                out.append(rec.get("refs") if rec else None)
        out.append(thread.last_refs.get((ns, channel)))
        return out

    def _log_message(self, seq: int, m: Any) -> Message:
        type_, data = self.serde.dumps_typed(m)
        meta = {"seq": seq, "lc_id": m.id, "lc_type": type_, "lc": _b64(data)}
        return _to_marsys(m, _log_id(seq), meta)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint: new messages once, other changed channels by value.

        One record holds the checkpoint, its metadata and the channel values it changed
        (``new_versions``); a message channel's value is ranges of log positions.

        Raises:
            ConflictError: the parent is a checkpoint this checkpointer handed out as the
                thread's latest (or wrote), and another writer has written a newer one
                since: storing this one would drop that writer's turn. Nothing is stored.
        """
        thread_id = self._thread_id(config)
        ns = self._ns(config)
        if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("id"), str):
            raise ValueError(
                f"checkpoint must be a Checkpoint dict with an id, got {shown(checkpoint)}"
            )
        cid = checkpoint["id"]
        parent = config["configurable"].get("checkpoint_id")
        with self._lock:
            continues = self._reads.get(thread_id, {}).get((ns, parent), 0) > 0

            def build(thread: _Thread) -> _Built:
                latest = thread.latest.get(ns)
                if continues and latest != parent:
                    raise self._lost_race(thread_id, ns, parent, latest, cid)
                return self._put_ops(thread, ns, checkpoint, config, metadata, new_versions)

            self._commit(thread_id, build)
            if continues:
                self._note_read(thread_id, ns, parent, -1)
            self._note_read(thread_id, ns, cid, +1)  # the run goes on from here
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": cid,
            }
        }

    @staticmethod
    def _lost_race(
        thread_id: str, ns: str, parent: str | None, latest: str | None, cid: str
    ) -> ConflictError:
        return ConflictError(
            f"thread {shown(thread_id)} (checkpoint_ns {shown(ns)}) was written by another "
            f"writer after this run read it at checkpoint {shown(parent)}: its latest "
            f"checkpoint is now {shown(latest)}. This run's checkpoint {shown(cid)} was not "
            "stored, so no turn is lost; run it again (it starts from the latest state), or "
            "let one writer at a time write a thread"
        )

    def _put_ops(
        self,
        thread: _Thread,
        ns: str,
        checkpoint: Checkpoint,
        config: RunnableConfig,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> _Built:
        """The ops of :meth:`put` on ``thread`` as read, and what they do to its cache."""
        thread_id = thread.thread_id
        cid = checkpoint["id"]
        parent = config["configurable"].get("checkpoint_id")
        records_key, log_key = self._keys(thread_id)
        values: dict[str, Any] = dict(checkpoint.get("channel_values", {}))
        stored = {k: v for k, v in checkpoint.items() if k not in ("channel_values", "id")}
        new_messages: dict[int, Any] = {}
        next_seq = thread.next_seq
        records: builtins.list[Message] = []
        embedded: dict[str, dict[str, Any]] = {}
        last_refs: dict[tuple[str, str], builtins.list[builtins.list[int]]] = {}
        if not thread.has_record:
            records.append(
                self._record("thread", {"k": "thread", "thread_id": thread_id}, "thread")
            )
        for channel, version in new_versions.items():
            ver = _version(version)
            value = values.get(channel, _MISSING)
            if value is _MISSING:
                # an emptied channel reads as absent: a record only to hide an old value
                if (ns, channel, ver) in thread.blobs:
                    embedded[channel] = {"v": ver, "e": 1}
                continue
            refs = None
            if channel in self.settings.message_channels and isinstance(value, list):
                refs = self._message_refs(
                    thread,
                    value,
                    new_messages,
                    next_seq,
                    self._bases(thread, ns, parent, channel),
                )
            if refs is not None:
                embedded[channel] = {"v": ver, "refs": refs[0]}
                next_seq = refs[1]
                last_refs[(ns, channel)] = refs[0]
            else:
                embedded[channel] = {"v": ver, **_encode(self.serde, value)}
        md = get_checkpoint_metadata(config, metadata)
        record_id = _ckpt_record_id(ns, cid)
        ckpt_rec: dict[str, Any] = {
            "k": "ckpt",
            "ns": ns,
            "id": cid,
            "parent": parent,
            "c": _encode(self.serde, stored),
            "m": _encode(self.serde, md),
        }
        if embedded:
            ckpt_rec["b"] = embedded
        records.append(self._record(record_id, ckpt_rec, "checkpoint"))
        log = [self._log_message(seq, m) for seq, m in new_messages.items()]
        token, ops = self._new_head(thread_id)
        old = thread.ckpts.get(ns, {}).get(cid)
        if old is not None:  # the same checkpoint again: its record is replaced
            names = checkpoint.get("channel_versions", {}).items()
            also = {(ns, ch, _version(v)) for ch, v in names}
            ops += self._rehome(thread, {old.record_id}, also, new_versions=embedded)
            ops.append(Delete(records_key, (old.record_id,)))
        if log:
            ops.append(Append(log_key, tuple(log)))
        ops.append(Append(records_key, tuple(records)))

        def done() -> None:  # the store has it all: now the cache
            for seq, m in new_messages.items():
                _put_at(thread.log, seq, m)
                thread.by_lc_id[m.id] = seq
            thread.next_seq = next_seq
            thread.last_refs.update(last_refs)
            thread.has_record = True
            for channel, blob in embedded.items():
                key = (ns, channel, blob["v"])
                thread.blobs[key] = blob
                thread.blob_ids[key] = record_id
            stored["id"] = cid
            thread.add_ckpt(_Ckpt(ns, cid, parent, stored, dict(md), record_id))
            thread.tip = token

        return ops, done

    # ------------------------------------------------------------------ committing
    def _commit(self, thread_id: str, build: Callable[[_Thread], _Built | None]) -> None:
        """Write what ``build`` makes of the thread as stored, in one batch (compare-and-set).

        ``build`` gets the thread and returns the ops and what to do to the cache once
        they are committed (``None``: nothing to write). The batch begins with
        ``ExpectLast(head, tip)``: when another writer (another process, or another
        checkpointer on the same store) wrote the thread since it was read, nothing is
        written; the thread is read again and ``build`` decides again on what is stored.
        """
        head = self._head_key(thread_id)
        for _ in range(_ATTEMPTS):
            thread = self._thread(thread_id)
            try:
                built = build(thread)
                if built is None:
                    return
                ops, done = built
                try:
                    self.store.batch([ExpectLast(head, thread.tip), *ops])
                except ConflictError:  # another writer got there first: read it again
                    self._threads.pop(thread_id, None)
                    continue
            except BaseException:
                self._threads.pop(thread_id, None)  # build may have changed the cache
                raise
            done()
            return
        raise ConflictError(
            f"thread {shown(thread_id)}: {_ATTEMPTS} writes in a row lost to other writers "
            "of the thread; nothing of this one was stored: try again"
        )

    def _note_read(self, thread_id: str, ns: str, cid: str | None, delta: int) -> None:
        """Count one more (or one fewer) run of this process continuing from ``cid``."""
        reads = self._reads.setdefault(thread_id, {})
        n = reads.pop((ns, cid), 0) + delta  # re-inserted: the newest last
        if n > 0:
            reads[(ns, cid)] = n
        while len(reads) > _MAX_READS:
            del reads[next(iter(reads))]

    def _rehome(
        self,
        thread: _Thread,
        gone: set[str],
        also: set[tuple[str, str, str]] | None = None,
        *,
        new_versions: dict[str, dict[str, Any]] | None = None,
    ) -> builtins.list[Op]:
        """Ops that keep the blobs held by records ``gone`` as records of their own.

        A checkpoint's record holds the values it changed; later checkpoints read them too,
        so deleting the record (a pruned or replaced checkpoint) re-homes each blob that a
        checkpoint kept (or ``also``) still names, unless ``new_versions`` (the channels of
        the record replacing it) holds the same version.
        """
        needed: set[tuple[str, str, str]] = set(also or ())
        for ns, ckpts in thread.ckpts.items():
            for ckpt in ckpts.values():
                if ckpt.record_id in gone:
                    continue
                for channel, version in ckpt.checkpoint.get("channel_versions", {}).items():
                    needed.add((ns, channel, _version(version)))
        records: builtins.list[Message] = []
        for key, rid in thread.blob_ids.items():
            ns, channel, ver = key
            new = (new_versions or {}).get(channel)
            if rid in gone and key in needed and not (new is not None and new["v"] == ver):
                rec = {"k": "blob", "ns": ns, "ch": channel, **thread.blobs[key], "v": ver}
                records.append(self._record(_blob_record_id(*key), rec, "channel value"))
                thread.blob_ids[key] = _blob_record_id(*key)
        if not records:
            return []
        records_key, _ = self._keys(thread.thread_id)
        ids = tuple(m.message_id for m in records)
        return [Delete(records_key, ids), Append(records_key, tuple(records))]

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's pending writes for a checkpoint (idempotent per task and index).

        A task's writes for a checkpoint are one record; a second call for the same task
        rewrites it with what it adds.
        """
        thread_id = self._thread_id(config)
        ns = self._ns(config)
        cid = config["configurable"].get("checkpoint_id")
        if not isinstance(cid, str) or not cid:
            raise ValueError(
                f"config['configurable']['checkpoint_id'] is required, got {shown(cid)}"
            )
        records_key, _ = self._keys(thread_id)
        encoded = [
            (WRITES_IDX_MAP.get(channel, i), channel, _encode(self.serde, value))
            for i, (channel, value) in enumerate(writes)
        ]

        def build(thread: _Thread) -> _Built | None:
            existing = thread.writes.get((ns, cid), {})
            added: dict[tuple[str, int], _Write] = {
                (task_id, idx): (task_id, channel, value, task_path)
                for idx, channel, value in encoded
                if not (idx >= 0 and (task_id, idx) in existing)
            }
            if not added:
                return None
            merged = {k: w for k, w in existing.items() if k[0] == task_id}
            merged.update(added)
            old = {
                rid
                for task, idx in merged
                if (rid := thread.write_ids.get((ns, cid, task, idx))) is not None
            }
            rid = _writes_record_id(ns, cid, task_id)
            rec = {
                "k": "writes", "ns": ns, "cid": cid, "task": task_id, "path": task_path,
                "w": [[idx, w[1], w[2]] for (_, idx), w in merged.items()],
            }  # fmt: skip
            records = [self._record(rid, rec, "writes")]
            if not thread.has_record:
                records.insert(
                    0, self._record("thread", {"k": "thread", "thread_id": thread_id}, "thread")
                )
            token, ops = self._new_head(thread_id)
            if old:
                ops.append(Delete(records_key, tuple(sorted(old))))
            ops.append(Append(records_key, tuple(records)))

            def done() -> None:
                thread.has_record = True
                target = thread.writes.setdefault((ns, cid), {})
                for (task, idx), w in merged.items():
                    target[(task, idx)] = (w[0], w[1], w[2], task_path)
                    thread.write_ids[(ns, cid, task, idx)] = rid
                thread.tip = token

            return ops, done

        with self._lock:
            self._commit(thread_id, build)

    # ------------------------------------------------------------------ deleting
    def delete_thread(self, thread_id: str) -> None:
        """Delete a thread: its checkpoints, writes and messages (one batch)."""
        thread_id = self._thread_id({"configurable": {"thread_id": thread_id}}, "thread_id")
        records_key, log_key = self._keys(thread_id)

        def build(thread: _Thread) -> _Built:
            ops = self._detach(thread)
            ops += [Delete(records_key), Delete(log_key), Delete(self._head_key(thread_id))]
            return ops, lambda: self._threads.pop(thread_id, None)

        with self._lock:
            self._commit(thread_id, build)
            self._reads.pop(thread_id, None)

    def _detach(self, thread: _Thread) -> builtins.list[Op]:
        """Ops that make ``thread``'s forks own their messages and forget it as their source.

        Each fork gets a copy of the messages it reads from ``thread`` (copy-on-delete: the
        one time a fork costs its length), and ``thread``'s source forgets it as a fork.
        """
        ops: builtins.list[Op] = []
        for child_id, upto in thread.children.items():
            child_records, child_log = self._keys(child_id)
            copies = tuple(
                self._log_message(seq, m)
                for seq, m in enumerate(thread.log[:upto])
                if m is not None
            )
            ops += self._new_head(child_id)[1]
            ops.append(Delete(child_records, ("fork",)))
            if copies:
                ops.append(Append(child_log, copies))
            self._threads.pop(child_id, None)
        if thread.fork is not None:
            source_id = thread.fork[0]
            if self._tip(source_id) is not None:
                source_records, _ = self._keys(source_id)
                token, head_ops = self._new_head(source_id)
                ops += head_ops
                ops.append(Delete(source_records, (_child_record_id(thread.thread_id),)))
                source = self._threads.get(source_id)
                if source is not None:  # keep the source's cache: it only lost a fork
                    source.children.pop(thread.thread_id, None)
                    source.tip = token
        return ops

    def _drop(self, thread_id: str, select: Callable[[_Thread], set[tuple[str, str]]]) -> None:
        """Delete the checkpoints ``select`` picks ((ns, id)) and what only they used (one batch).

        Their writes go, and the messages and values no kept checkpoint references.
        """
        with self._lock:
            self._commit(thread_id, lambda thread: self._drop_ops(thread, select(thread)))

    def _drop_ops(self, thread: _Thread, gone: set[tuple[str, str]]) -> _Built | None:
        if not gone:
            return None
        records_key, log_key = self._keys(thread.thread_id)
        gone_records = {thread.ckpts[ns][cid].record_id for ns, cid in gone}
        record_ids: builtins.list[str] = sorted(gone_records)
        for ns, cid in gone:
            record_ids.extend(
                thread.write_ids[(ns, cid, task, idx)]
                for task, idx in thread.writes.get((ns, cid), {})
            )
        kept_blobs: set[tuple[str, str, str]] = set()
        for ns, ckpts in thread.ckpts.items():
            for cid, ckpt in ckpts.items():
                if (ns, cid) in gone:
                    continue
                for channel, version in ckpt.checkpoint.get("channel_versions", {}).items():
                    kept_blobs.add((ns, channel, _version(version)))
        kept_seqs: set[int] = set()
        for key, rec in thread.blobs.items():
            if key not in kept_blobs:
                if thread.blob_ids[key].startswith("b"):  # a blob's own record (else: a ckpt's)
                    record_ids.append(thread.blob_ids[key])
            elif "refs" in rec:
                for start, stop in rec["refs"]:
                    kept_seqs.update(range(start, stop))
        log = thread.log
        log_ids = tuple(
            _log_id(seq) for seq, m in enumerate(log) if m is not None and seq not in kept_seqs
        )
        _, ops = self._new_head(thread.thread_id)
        if log_ids and thread.children:  # forks read these messages: they get their copies
            ops += self._detach(_Thread(thread.thread_id, log=thread.log, children=thread.children))
            record_ids += [_child_record_id(c) for c in thread.children]
        ops.append(Delete(records_key, tuple(dict.fromkeys(record_ids))))
        ops += self._rehome(thread, gone_records)  # what kept checkpoints read from gone ones
        if log_ids:
            ops.append(Delete(log_key, log_ids))
        return ops, lambda: self._threads.pop(thread.thread_id, None)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) whose metadata ``run_id`` is given."""
        if isinstance(run_ids, str):
            raise ValueError(
                f"run_ids must be a sequence of run ids, not one string {shown(run_ids)}"
            )
        wanted = set(run_ids)
        if not wanted:
            return
        with self._lock:
            for thread_id in self._all_thread_ids():
                self._drop(
                    thread_id,
                    lambda thread: {
                        (ns, cid)
                        for ns, ckpts in thread.ckpts.items()
                        for cid, c in ckpts.items()
                        if c.metadata.get("run_id") in wanted
                    },
                )

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest``: keep each namespace's newest checkpoint; ``delete``: everything."""
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"strategy must be 'keep_latest' or 'delete', got {shown(strategy)}")
        if isinstance(thread_ids, str):
            raise ValueError(
                f"thread_ids must be a sequence of ids, not one string {shown(thread_ids)}"
            )
        with self._lock:
            for thread_id in thread_ids:
                if strategy == "delete":
                    self.delete_thread(thread_id)
                    continue
                self._drop(
                    thread_id,
                    lambda thread: {
                        (ns, cid)
                        for ns, ckpts in thread.ckpts.items()
                        for cid in ckpts
                        if cid != thread.latest.get(ns)
                    },
                )

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Fork a thread: copy its checkpoints and writes; its messages by reference.

        The new thread reads the source's message log below the source's current length
        (one small ``fork`` record, whatever the thread's length); its own new messages go
        to its own log. Deleting or pruning the source first gives the fork its own copy of
        those messages, in the same store batch, so the fork never breaks.

        Raises:
            ValueError: the target thread already has checkpoints (nothing is written).
        """
        source = self._thread_id({"configurable": {"thread_id": source_thread_id}}, "source")
        target = self._thread_id({"configurable": {"thread_id": target_thread_id}}, "target")
        src_records, _ = self._keys(source)
        dst_records, dst_log = self._keys(target)

        def build(thread: _Thread) -> _Built | None:
            dst = self._thread(target)
            if dst.ckpts:
                raise ValueError(f"target thread {shown(target)} already has checkpoints")
            if not thread.has_record:
                return None
            records = self.store.load_messages(src_records)
            copied = [
                m
                for m in records
                if (m.structured_data or {}).get("k") not in ("thread", "fork", "child")
            ]
            upto = thread.next_seq
            head = self._record("thread", {"k": "thread", "thread_id": target}, "thread")
            fork = self._record("fork", {"k": "fork", "source": source, "upto": upto}, "fork")
            child = self._record(
                _child_record_id(target), {"k": "child", "target": target, "upto": upto}, "child"
            )
            ops: builtins.list[Op] = [ExpectLast(self._head_key(target), dst.tip)]
            ops += self._new_head(target)[1]
            token, source_head = self._new_head(source)
            ops += source_head
            ops += [Delete(dst_records), Delete(dst_log), Delete(src_records, (child.message_id,))]
            ops.append(Append(dst_records, (head, fork, *copied)))
            ops.append(Append(src_records, (child,)))

            def done() -> None:
                self._threads.pop(target, None)
                thread.children[target] = upto
                thread.tip = token

            return ops, done

        with self._lock:
            self._commit(source, build)

    # ------------------------------------------------------------------ versions
    def get_next_version(self, current: str | None, channel: None) -> str:
        """Monotonic string versions with a random tail, so forks never share a version.

        ``0000000042.1f3a9c07``: 10 zero-padded digits (they order as strings, also after
        the 32-digit versions LangGraph's own savers write) and 8 random hex digits.
        """
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(current.split(".")[0])
        return f"{current_v + 1:010}.{random.getrandbits(32):08x}"

    # ------------------------------------------------------------------ async twins
    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Async twin of :meth:`get_tuple` (runs in a worker thread)."""
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Async twin of :meth:`list`."""
        items = await asyncio.to_thread(
            lambda: list(self.list(config, filter=filter, before=before, limit=limit))
        )
        for item in items:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Async twin of :meth:`put`."""
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Async twin of :meth:`put_writes`."""
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        """Async twin of :meth:`delete_thread`."""
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Async twin of :meth:`delete_for_runs`."""
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Async twin of :meth:`copy_thread`."""
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Async twin of :meth:`prune`."""
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)


_MISSING = object()


def _load_op(key: Key) -> Op:
    return Load(key)


def _log_id(seq: int) -> str:
    """The id of log position ``seq`` (zero-padded: the store's index grows at its end)."""
    return f"s{seq:09d}"


def _ckpt_record_id(ns: str, cid: str) -> str:
    """``c``, the namespace's digest, the checkpoint id (time-ordered ids: appends at the end)."""
    return "c" + _digest(ns)[:8] + cid


def _writes_record_id(ns: str, cid: str, task: str) -> str:
    return "w" + _digest(ns)[:8] + cid + "/" + _digest(ns, cid, task)[:16]


def _blob_record_id(ns: str, channel: str, version: str) -> str:
    return "b" + _digest(ns, channel, version)


def _child_record_id(target: str) -> str:
    return "f" + _digest(target)


def _put_at(log: list[Any], seq: int, value: Any) -> None:
    """``log[seq] = value``, growing ``log`` with ``None`` (deleted positions) as needed."""
    if seq >= len(log):
        log.extend([None] * (seq + 1 - len(log)))
    log[seq] = value


def _is_message_list(value: object) -> bool:
    return isinstance(value, list) and all(
        isinstance(m, BaseMessage) and isinstance(m.id, str) and m.id for m in value
    )


_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}


def _to_marsys(m: Any, message_id: str, meta: dict[str, Any]) -> Message:
    """A marsys-mem message for a LangChain one (readable by marsys-mem's tools)."""
    role = _ROLES.get(getattr(m, "type", ""), "assistant")
    content = m.content if isinstance(m.content, str) else _text_parts(m.content)
    fields: dict[str, Any] = {"message_id": message_id, "metadata": meta}
    name = getattr(m, "name", None)
    if isinstance(name, str) and name:
        fields["name"] = name
    if role == "tool":
        fields["tool_call_id"] = getattr(m, "tool_call_id", None)
    calls = getattr(m, "tool_calls", None) or []
    if role == "assistant" and calls:
        try:
            fields["tool_calls"] = tuple(
                ToolCall(id=c["id"], name=c["name"], arguments=c.get("args") or {}) for c in calls
            )
        except (KeyError, TypeError, ValidationError):
            pass
    try:
        return Message(role=role, content=content, **fields)
    except ValidationError:
        return Message(role="assistant" if role == "assistant" else "user", content=content,
                       message_id=message_id, metadata=meta)  # fmt: skip


def _text_parts(content: Any) -> str:
    if isinstance(content, list):
        return " ".join(
            p if isinstance(p, str) else str(p.get("text", "")) if isinstance(p, dict) else ""
            for p in content
        )
    return str(content)
