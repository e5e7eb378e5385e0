"""A LangGraph checkpointer over a marsys-mem store that stores each message once.

LangGraph's own savers write the whole value of every changed channel at every
checkpoint; for the ``messages`` channel of a chat agent that is the whole conversation,
so storage grows with the square of its length and so does the cost of each turn.
:class:`MarsysCheckpointer` keeps, per thread, one append-only **message log** (every
message stored once, as a marsys-mem :class:`~marsys_mem.model.messages.Message` with the
exact LangChain message beside it) and stores a ``messages`` value as *ranges of log
positions*: appending one message to a conversation of 2,000 costs one message and a few
bytes, not 2,000 messages.

Layout in the :class:`~marsys_mem.store.base.MemoryStore` (``namespace`` defaults to
``"langgraph"``); ``<thread>`` is the thread id escaped into a name
(:func:`thread_name`):

* ``(namespace, <thread>, "messages")``: the message log, one stored message per
  LangChain message (``metadata["seq"]`` its position, ``metadata["lc"]`` the message as
  the checkpointer's serde wrote it);
* ``(namespace, <thread>, "checkpoints")``: one record per thread, checkpoint, channel
  value and pending write, as system messages whose ``structured_data`` holds the record
  (serialised values are base64 of ``serde.dumps_typed``). Every ``put`` and
  ``put_writes`` is one store batch: all of it is written or none.

The checkpointer caches each thread it has read (decoded messages included), so a turn
costs what it adds, not what the thread holds. Before each operation it compares the
newest record of the thread with its cache and reloads the thread when another process
wrote to it. One process should write a thread at a time (as with LangGraph's savers).

Messages are treated as immutable, as LangGraph's reducers treat them: a message object
that is changed in place after a checkpoint is not stored again (replace it, by id, as
``add_messages`` does).
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import hashlib
import os
import random
import threading
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from marsys_mem.exceptions import MissingDependencyError
from marsys_mem.model.messages import Message, ToolCall
from marsys_mem.model.names import is_name, shown, validate_name
from marsys_mem.store.base import Append, Delete, Key, Load, MemoryStore, Op

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
    writes: dict[tuple[str, str], dict[tuple[str, int], tuple[str, str, str, str, str]]] = field(
        default_factory=dict
    )  # (ns, cid) -> (task, idx) -> (task, channel, type, data, path); record id beside
    write_ids: dict[tuple[str, str, str, int], str] = field(default_factory=dict)
    blobs: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    blob_ids: dict[tuple[str, str, str], str] = field(default_factory=dict)
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
    :class:`~marsys_mem.store.SQLiteStore`); sync and async; passes LangGraph's
    ``langgraph-checkpoint-conformance`` suite, base and extended capabilities
    (``copy_thread``, ``prune``, ``delete_for_runs``).

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
        thread = self._load(thread_id, tip)
        self._threads[thread_id] = thread
        return thread

    def _load(self, thread_id: str, tip: str | None) -> _Thread:
        records_key, log_key = self._keys(thread_id)
        records, log = self.store.batch(
            [
                _load_op(records_key),
                _load_op(log_key),
            ]
        )
        thread = _Thread(thread_id, tip=tip)
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
        rec = dict(m.structured_data or {})
        kind = rec.get("k")
        if kind == "thread":
            thread.has_record = True
        elif kind == "fork":
            thread.fork = (str(rec["source"]), int(cast(int, rec["upto"])))
        elif kind == "child":
            thread.children[str(rec["target"])] = int(cast(int, rec["upto"]))
        elif kind == "blob":
            key = (str(rec["ns"]), str(rec["ch"]), str(rec["ver"]))
            thread.blobs[key] = rec
            thread.blob_ids[key] = m.message_id
        elif kind == "ckpt":
            ckpt = _Ckpt(
                ns=str(rec["ns"]),
                id=str(rec["id"]),
                parent=cast("str | None", rec.get("parent")),
                checkpoint=self.serde.loads_typed((str(rec["ct"]), _unb64(str(rec["c"])))),
                metadata=self.serde.loads_typed((str(rec["mt"]), _unb64(str(rec["m"])))),
                record_id=m.message_id,
            )
            thread.add_ckpt(ckpt)
        elif kind == "write":
            ns, cid = str(rec["ns"]), str(rec["cid"])
            task, idx = str(rec["task"]), int(cast(int, rec["idx"]))
            thread.writes.setdefault((ns, cid), {})[(task, idx)] = (
                task,
                str(rec["ch"]),
                str(rec["t"]),
                str(rec["d"]),
                str(rec.get("path", "")),
            )
            thread.write_ids[(ns, cid, task, idx)] = m.message_id

    # ------------------------------------------------------------------ reading
    def _values(self, thread: _Thread, ns: str, versions: ChannelVersions) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for channel, version in versions.items():
            rec = thread.blobs.get((ns, channel, _version(version)))
            if rec is None or rec.get("t") == "empty":
                continue
            if "refs" in rec:
                log = thread.log
                out: builtins.list[Any] = []
                for start, stop in cast(builtins.list[builtins.list[int]], rec["refs"]):
                    out += log[start:stop]  # a C-speed slice, not a loop over messages
                values[channel] = out
            else:
                values[channel] = self.serde.loads_typed((str(rec["t"]), _unb64(str(rec["d"]))))
        return values

    def _tuple(self, thread: _Thread, ckpt: _Ckpt) -> CheckpointTuple:
        writes = thread.writes.get((ckpt.ns, ckpt.id), {})
        ordered = sorted(writes.items(), key=lambda kv: writes_sort_key(kv[1][4], *kv[0]))
        pending: builtins.list[PendingWrite] = [
            (task, channel, self.serde.loads_typed((t, _unb64(d))))
            for (_, _), (task, channel, t, d, _) in ordered
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
        """The checkpoint ``config`` names, or the thread's latest in its namespace."""
        thread_id = self._thread_id(config)
        ns = self._ns(config)
        with self._lock:
            thread = self._thread(thread_id)
            ckpts = thread.ckpts.get(ns, {})
            cid = get_checkpoint_id(config) or thread.latest.get(ns)
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
        return _to_marsys(m, f"s{seq}", meta)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint: new messages once, other changed channels by value."""
        thread_id = self._thread_id(config)
        ns = self._ns(config)
        if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("id"), str):
            raise ValueError(
                f"checkpoint must be a Checkpoint dict with an id, got {shown(checkpoint)}"
            )
        parent = config["configurable"].get("checkpoint_id")
        records_key, log_key = self._keys(thread_id)
        with self._lock:
            thread = self._thread(thread_id)
            values: dict[str, Any] = dict(checkpoint.get("channel_values", {}))
            stored = {k: v for k, v in checkpoint.items() if k != "channel_values"}
            new_messages: dict[int, Any] = {}
            next_seq = thread.next_seq
            records: builtins.list[Message] = []
            replaced: builtins.list[str] = []
            blobs: dict[tuple[str, str, str], tuple[str, dict[str, Any]]] = {}
            last_refs: dict[tuple[str, str], builtins.list[builtins.list[int]]] = {}
            if not thread.has_record:
                records.append(
                    self._record("thread", {"k": "thread", "thread_id": thread_id}, "thread")
                )
            for channel, version in new_versions.items():
                ver = _version(version)
                rec: dict[str, Any] = {"k": "blob", "ns": ns, "ch": channel, "ver": ver}
                value = values.get(channel, _MISSING)
                refs = None
                if value is _MISSING:
                    rec["t"] = "empty"
                elif channel in self.settings.message_channels and isinstance(value, list):
                    refs = self._message_refs(
                        thread,
                        value,
                        new_messages,
                        next_seq,
                        self._bases(thread, ns, parent, channel),
                    )
                if refs is not None:
                    rec["refs"], next_seq = refs
                    last_refs[(ns, channel)] = rec["refs"]
                elif value is not _MISSING:
                    t, d = self.serde.dumps_typed(value)
                    rec["t"], rec["d"] = t, _b64(d)
                key = (ns, channel, ver)
                record_id = "b" + _digest(*key)
                if key in thread.blob_ids:
                    replaced.append(thread.blob_ids[key])
                blobs[key] = (record_id, rec)
                records.append(self._record(record_id, rec, f"{channel} {ver}"))
            md = get_checkpoint_metadata(config, metadata)
            ct, c = self.serde.dumps_typed(stored)
            mt, mdata = self.serde.dumps_typed(md)
            record_id = "c" + _digest(ns, checkpoint["id"])
            if checkpoint["id"] in thread.ckpts.get(ns, {}):
                replaced.append(thread.ckpts[ns][checkpoint["id"]].record_id)
            ckpt_rec = {
                "k": "ckpt",
                "ns": ns,
                "id": checkpoint["id"],
                "parent": parent,
                "run_id": md.get("run_id"),
                "ct": ct,
                "c": _b64(c),
                "mt": mt,
                "m": _b64(mdata),
            }
            records.append(self._record(record_id, ckpt_rec, f"checkpoint {checkpoint['id']}"))
            log = [self._log_message(seq, m) for seq, m in new_messages.items()]
            token, ops = self._new_head(thread_id)
            if replaced:
                ops.append(Delete(records_key, tuple(dict.fromkeys(replaced))))
            if log:
                ops.append(Append(log_key, tuple(log)))
            ops.append(Append(records_key, tuple(records)))
            self.store.batch(ops)
            # the store has it all: now the cache
            for seq, m in new_messages.items():
                _put_at(thread.log, seq, m)
                thread.by_lc_id[m.id] = seq
            thread.next_seq = next_seq
            thread.last_refs.update(last_refs)
            thread.has_record = True
            for key, (rid, rec) in blobs.items():
                thread.blobs[key] = rec
                thread.blob_ids[key] = rid
            thread.add_ckpt(_Ckpt(ns, checkpoint["id"], parent, dict(stored), dict(md), record_id))
            thread.tip = token
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's pending writes for a checkpoint (idempotent per task and index)."""
        thread_id = self._thread_id(config)
        ns = self._ns(config)
        cid = config["configurable"].get("checkpoint_id")
        if not isinstance(cid, str) or not cid:
            raise ValueError(
                f"config['configurable']['checkpoint_id'] is required, got {shown(cid)}"
            )
        records_key, _ = self._keys(thread_id)
        with self._lock:
            thread = self._thread(thread_id)
            existing = thread.writes.get((ns, cid), {})
            records: builtins.list[Message] = []
            replaced: builtins.list[str] = []
            added: dict[tuple[str, int], tuple[str, str, str, str, str]] = {}
            if not thread.has_record:
                records.append(
                    self._record("thread", {"k": "thread", "thread_id": thread_id}, "thread")
                )
            for i, (channel, value) in enumerate(writes):
                idx = WRITES_IDX_MAP.get(channel, i)
                if idx >= 0 and (task_id, idx) in existing:
                    continue
                t, d = self.serde.dumps_typed(value)
                entry = (task_id, channel, t, _b64(d), task_path)
                rid = "w" + _digest(ns, cid, task_id, idx)
                if (ns, cid, task_id, idx) in thread.write_ids:
                    replaced.append(thread.write_ids[(ns, cid, task_id, idx)])
                rec = {
                    "k": "write", "ns": ns, "cid": cid, "task": task_id, "idx": idx,
                    "ch": channel, "t": t, "d": entry[3], "path": task_path,
                }  # fmt: skip
                added[(task_id, idx)] = entry
                records.append(self._record(rid, rec, f"write {channel}"))
            if not records:
                return
            token, ops = self._new_head(thread_id)
            if replaced:
                ops.append(Delete(records_key, tuple(dict.fromkeys(replaced))))
            ops.append(Append(records_key, tuple(records)))
            self.store.batch(ops)
            thread.has_record = True
            target = thread.writes.setdefault((ns, cid), {})
            for (task, idx), entry in added.items():
                target[(task, idx)] = entry
                thread.write_ids[(ns, cid, task, idx)] = "w" + _digest(ns, cid, task, idx)
            thread.tip = token

    # ------------------------------------------------------------------ deleting
    def delete_thread(self, thread_id: str) -> None:
        """Delete a thread: its checkpoints, writes and messages (one batch)."""
        thread_id = self._thread_id({"configurable": {"thread_id": thread_id}}, "thread_id")
        records_key, log_key = self._keys(thread_id)
        with self._lock:
            thread = self._thread(thread_id)
            ops = self._detach(thread)
            ops += [Delete(records_key), Delete(log_key), Delete(self._head_key(thread_id))]
            self.store.batch(ops)
            self._threads.pop(thread_id, None)

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

    def _drop(self, thread: _Thread, gone: set[tuple[str, str]]) -> None:
        """Delete checkpoints ``gone`` ((ns, id)), their writes, and what nothing references."""
        if not gone:
            return
        records_key, log_key = self._keys(thread.thread_id)
        record_ids: builtins.list[str] = []
        for ns, cid in gone:
            record_ids.append(thread.ckpts[ns][cid].record_id)
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
                record_ids.append(thread.blob_ids[key])
            elif "refs" in rec:
                for start, stop in rec["refs"]:
                    kept_seqs.update(range(start, stop))
        log_ids = tuple(
            f"s{seq}" for seq, m in enumerate(thread.log) if m is not None and seq not in kept_seqs
        )
        _, ops = self._new_head(thread.thread_id)
        if log_ids and thread.children:  # forks read these messages: they get their copies
            ops += self._detach(_Thread(thread.thread_id, log=thread.log, children=thread.children))
            record_ids += [_child_record_id(c) for c in thread.children]
        ops.append(Delete(records_key, tuple(dict.fromkeys(record_ids))))
        if log_ids:
            ops.append(Delete(log_key, log_ids))
        self.store.batch(ops)
        self._threads.pop(thread.thread_id, None)

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
                thread = self._thread(thread_id)
                gone = {
                    (ns, cid)
                    for ns, ckpts in thread.ckpts.items()
                    for cid, c in ckpts.items()
                    if c.metadata.get("run_id") in wanted
                }
                self._drop(thread, gone)

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
                thread = self._thread(thread_id)
                gone = {
                    (ns, cid)
                    for ns, ckpts in thread.ckpts.items()
                    for cid in ckpts
                    if cid != thread.latest.get(ns)
                }
                self._drop(thread, gone)

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
        with self._lock:
            if self._thread(target).ckpts:
                raise ValueError(f"target thread {shown(target)} already has checkpoints")
            thread = self._thread(source)
            if not thread.has_record:
                return
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
            _, ops = self._new_head(target)
            token, source_head = self._new_head(source)
            ops += source_head
            ops += [Delete(dst_records), Delete(dst_log), Delete(src_records, (child.message_id,))]
            ops.append(Append(dst_records, (head, fork, *copied)))
            ops.append(Append(src_records, (child,)))
            self.store.batch(ops)
            self._threads.pop(target, None)
            thread.children[target] = upto
            thread.tip = token

    # ------------------------------------------------------------------ versions
    def get_next_version(self, current: str | None, channel: None) -> str:
        """Monotonic string versions with a random tail, so forks never share a version."""
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(current.split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"

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
