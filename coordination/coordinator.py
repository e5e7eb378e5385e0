"""Coordinator: shared facts pushed to running agents, per branch scope, exactly once, in order.

``await coord.share(agent, text, branch=..., scope=...)`` delivers a fact at once to the
local agents in scope and publishes it to every coordinator of the namespace, which
delivers it into the inbox of each agent whose branch is in scope. Each agent gets each
fact exactly once, in each sender's order; nothing acknowledged is lost when a broker
crashes; what strangers publish cannot grow a coordinator's state without bound.

Guide (guarantees, inbox keys, merges): ``docs/guides/coordination.md#how-a-fact-travels``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self, cast, get_args

from pydantic import ValidationError
from pydantic_core import to_json

from marsys_mem.config.coordination import CoordinatorSettings
from marsys_mem.conversation import ConversationMemory
from marsys_mem.coordination.callbacks import (
    CallbackQueue,
    CallbackStats,
)
from marsys_mem.coordination.envelope import (
    CONTROL_ADAPTER,
    ENVELOPE_ADAPTER,
    Envelope,
    FactCallback,
    FactDelivery,
    FactEnvelope,
    HighWaterMark,
    MergeResult,
    ResendRequest,
    RetractEnvelope,
)
from marsys_mem.coordination.graph import BranchGraph, BranchInfo, GraphChange, MergeStrategy
from marsys_mem.coordination.merging import merge_memories
from marsys_mem.coordination.ordering import SenderOrdering
from marsys_mem.coordination.repair import Outbox, heartbeats
from marsys_mem.coordination.transport import InProcessTransport, Transport
from marsys_mem.coordination.wire import (
    control_topic,
    fact_topic,
    facts_filter,
    parse_fact_topic,
)
from marsys_mem.exceptions import (
    BranchError,
    CoordinationError,
    TransportError,
    UnknownBranchError,
)
from marsys_mem.lifecycle import AsyncClosing
from marsys_mem.model.facts import FactScope, SharedFact
from marsys_mem.model.messages import Message
from marsys_mem.model.names import inbox_key
from marsys_mem.patterns.shared import ConflictRule, SharedMemoryPool

if TYPE_CHECKING:
    from marsys_mem.manager import MemoryManager

__all__ = ["Coordinator", "attach_memory"]

log = logging.getLogger("marsys_mem.coordination")

_STRATEGIES: tuple[str, ...] = get_args(MergeStrategy)
_RULES: tuple[str, ...] = get_args(ConflictRule)
_STAT_KEYS = (
    "received",
    "delivered",
    "duplicates",
    "skipped",
    "malformed",
    "oversized",
    "gaps",
    "errors",
    "control",
    "retracted",
)
_HEARTBEAT_MAX = 30.0  # seconds between high-water marks when idle
_last_epoch = 0


def _new_epoch() -> int:
    """A number for this coordinator start: microseconds since 1970, unique in the process."""
    global _last_epoch
    _last_epoch = max(time.time_ns() // 1000, _last_epoch + 1)
    return _last_epoch


@dataclass(frozen=True, slots=True)
class _Targets:
    """The agents a (branch, scope) route reaches: ``(agent, branch)`` pairs and inbox keys."""

    members: tuple[tuple[str, str], ...]
    keys: tuple[str, ...]

    def subset(self, positions: Iterable[int]) -> _Targets:
        """The members at ``positions`` only."""
        picked = list(positions)
        return _Targets(tuple(self.members[i] for i in picked), tuple(self.keys[i] for i in picked))


def attach_memory(
    manager: MemoryManager, agent: str, branch: str, memory: ConversationMemory
) -> None:
    """Give ``manager`` the memory of ``agent`` on ``branch`` (a fork's copy-on-write view).

    A branch memory that already exists is left as it is (with a warning).
    """
    try:
        manager.attach_memory(agent, branch, memory)
    except ValueError:
        log.warning("%s already has a memory on %s: fork not attached", agent, branch)


class Coordinator(AsyncClosing):
    """Shares facts between the agents of a :class:`BranchGraph`, in process or over MQTT.

    Args:
        graph: the branch graph (scopes and membership come from it).
        manager: the :class:`~marsys_mem.MemoryManager` holding the agents' memories
            (forks and merges of messages need it; facts only need a pool).
        transport: a :class:`~marsys_mem.coordination.Transport`; default: an
            :class:`InProcessTransport` on the process-wide broker.
        namespace: the namespace (default: the transport's; must agree with it).
        pool: where facts are delivered (default: ``manager.shared`` if the manager has
            one, else a new :class:`SharedMemoryPool`).
        sender_id: this coordinator's unique id on the wire (default: random).
        settings: the tuning numbers (payload size, log, ordering gaps, resends,
            heartbeat, outbox, callback limits): a
            :class:`~marsys_mem.config.coordination.CoordinatorSettings` or a mapping
            validated into one; default: its defaults. A policy file's ``coordination:``
            section is the same model (``manager.config.coordination``).

    Example:
        >>> import asyncio
        >>> graph = BranchGraph()
        >>> _ = graph.add_branch("main", agents=["planner", "writer"])
        >>> _ = graph.fork("main", "research", agents=["researcher"])
        >>> async def demo():
        ...     async with Coordinator(graph, pool=SharedMemoryPool()) as coord:
        ...         await coord.share("researcher", "Q4 revenue grew 12%",
        ...                           branch="research", scope="lineage")
        ...         return coord.facts_for("writer"), coord.facts_for("researcher", "research")
        >>> writer, researcher = asyncio.run(demo())
        >>> [f.text for f in writer], [f.source_branch for f in researcher]
        (['Q4 revenue grew 12%'], ['research'])
    """

    def __init__(
        self,
        graph: BranchGraph,
        manager: MemoryManager | None = None,
        transport: Transport | None = None,
        *,
        namespace: str | None = None,
        pool: SharedMemoryPool | None = None,
        sender_id: str | None = None,
        settings: CoordinatorSettings | Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(graph, BranchGraph):
            raise TypeError(f"graph must be a BranchGraph, got {type(graph).__name__}")
        if settings is None:
            settings = CoordinatorSettings()
        elif isinstance(settings, Mapping):
            settings = CoordinatorSettings.model_validate(settings)  # names field and value
        elif not isinstance(settings, CoordinatorSettings):
            raise TypeError(
                f"settings must be a CoordinatorSettings, got {type(settings).__name__}"
            )
        if transport is None:
            transport = InProcessTransport(
                namespace=namespace or "default", max_payload=settings.max_payload
            )
        if namespace is not None and namespace != transport.namespace:
            raise ValueError(
                f"namespace {namespace!r} differs from the transport's {transport.namespace!r}"
            )
        if pool is None:
            shared = getattr(manager, "shared", None)
            pool = shared if isinstance(shared, SharedMemoryPool) else SharedMemoryPool()
        if not isinstance(pool, SharedMemoryPool):
            raise TypeError(f"pool must be a SharedMemoryPool, got {type(pool).__name__}")
        if sender_id is not None and not (isinstance(sender_id, str) and 0 < len(sender_id) <= 128):
            raise ValueError(f"sender_id must be 1-128 characters, got {sender_id!r}")
        self.graph = graph
        self.manager = manager
        self.transport = transport
        self.namespace = transport.namespace
        self.pool = pool
        self.settings = settings
        self.max_payload = min(settings.max_payload, transport.max_payload)
        self.sender_id = sender_id or f"coord-{uuid.uuid4().hex}"
        self.epoch = _new_epoch()  # this start's sequence: (sender_id, epoch, seq) is unique
        # How every envelope this coordinator sends begins (field order is the model's):
        # our own facts echoed back by the broker (MQTT 3.1.1 has no "no local") are
        # dropped on this prefix, before the JSON is parsed.
        self._echo_prefix = (
            b'{"v":1,"namespace":'
            + to_json(self.namespace)
            + b',"sender":'
            + to_json(self.sender_id)
            + b","
        )
        self.error: BaseException | None = None  # why receiving stopped, if it did
        self._stats = dict.fromkeys(_STAT_KEYS, 0)
        self._seq = 0
        self._log: OrderedDict[tuple[str, int, int], FactEnvelope] = OrderedDict()
        self._order: SenderOrdering[tuple[str, int], Envelope] = SenderOrdering(
            self._deliver,
            gap_timeout=settings.gap_timeout,
            max_pending=settings.max_pending,
            request=self._ask_resend,
            resend_after=settings.resend_after,
        )
        self._control_topic = control_topic(self.namespace)
        self._outbox = Outbox(
            self.transport.publish,
            max_size=settings.max_outbox,
            max_bytes=settings.max_outbox_bytes,
            quiet=settings.resend_after / 2,
        )
        self._topics: dict[str, str] = {}  # fact topic by branch (branches we share on)
        self._asking: set[tuple[str, int]] = set()  # senders with a resend request in flight
        self._control_tasks: set[asyncio.Task[None]] = set()
        self._beat: asyncio.Task[None] | None = None
        self._callbacks: list[tuple[CallbackQueue, str | None, str | None]] = []
        self._callback_agents: set[str] | None = set()  # None: some callback takes every agent
        self._callback_stats = CallbackStats()
        self._retired: list[CallbackQueue] = []  # unsubscribed, a call still running
        self._targets_cache: dict[tuple[str | None, str], _Targets] = {}
        self._cache_version = -1
        self._entered = False
        self._receiver: asyncio.Task[None] | None = None
        self._unsubscribe_graph = graph.subscribe(self._on_graph_change)

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> Self:
        if self._entered:
            raise CoordinationError("this Coordinator is already running (not re-entrant)")
        self._entered = True
        self.error = None
        try:
            await self.transport.__aenter__()
        except BaseException:
            self._entered = False
            raise
        try:
            await self.transport.subscribe(facts_filter(self.namespace))
            await self.transport.subscribe(self._control_topic)
        except BaseException:
            self._entered = False
            await self.transport.__aexit__(None, None, None)
            raise
        loop = asyncio.get_running_loop()
        self._receiver = loop.create_task(
            self._receive(self.transport.messages()), name=f"coordinator-{self.sender_id}"
        )
        self._beat = loop.create_task(
            heartbeats(
                lambda: self._seq,
                self._send_mark,
                interval=self.settings.heartbeat,
                max_interval=max(self.settings.heartbeat, _HEARTBEAT_MAX),
            ),
            name=f"heartbeat-{self.sender_id}",
        )
        return self

    async def close(self) -> None:
        """Close the transport, deliver what it had already received, stop (idempotent).

        Payloads the transport received (and, over MQTT, acknowledged) before closing are
        still delivered, so nothing acknowledged is lost; async callbacks get a second to
        finish.
        """
        if not self._entered:
            return
        self._entered = False
        receiver, self._receiver = self._receiver, None
        beat, self._beat = self._beat, None
        control = [beat, *self._control_tasks] if beat is not None else list(self._control_tasks)
        for task in control:
            task.cancel()
        if control:
            await asyncio.wait(control)
        await self._outbox.close()
        try:
            await self.transport.__aexit__(None, None, None)
        finally:
            if receiver is not None:
                # the transport's message iterator ends after what it already holds
                _done, pending = await asyncio.wait({receiver}, timeout=5.0)
                if pending:
                    receiver.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await receiver
            self._order.close()
            queues = [queue for queue, _agent, _branch in self._callbacks] + self._retired
            self._retired = []
            if queues:  # a second, all together, for the async callbacks to finish
                await asyncio.gather(*(q.close(timeout=1.0) for q in queues))

    @property
    def running(self) -> bool:
        """True inside ``async with``."""
        return self._entered

    @property
    def gap_timeout(self) -> float:
        """Seconds an ordering gap may stay open before it is skipped."""
        return self._order.gap_timeout

    @property
    def max_pending(self) -> int:
        """Most early envelopes buffered per sender before a gap is skipped."""
        return self._order.max_pending

    @property
    def stats(self) -> dict[str, int]:
        """Counters: received, delivered, duplicates, skipped, malformed, oversized, gaps, errors.

        ``received``: fact payloads from the wire; ``delivered``: facts put in an agent's
        inbox; ``duplicates``: envelopes seen before (dropped); ``skipped``: deliveries an
        inbox refused (it had the fact, or the fact lost a conflict); ``gaps``: ordering
        gaps skipped after ``gap_timeout``; ``errors``: failing callbacks. Repair:
        ``control``: control payloads received (high-water marks, resend requests);
        ``resend_requests``: requests this coordinator made; ``resent``: envelopes it
        published again for others. Bounds: ``evicted``: senders forgotten (over 10,000
        tracked; their buffered envelopes are delivered first); ``forgotten``: remembered
        ``seq`` ranges dropped (over 100,000). Async ``on_fact`` callbacks:
        ``callbacks_queued`` (waiting now), ``callbacks_in_flight`` (running now),
        ``callbacks_max_in_flight`` (the most that ever ran at once), ``callbacks_dropped``
        (the oldest waiting ones dropped when a queue was full, or left at close). With a signing
        transport (``signing_key=``), ``unsigned``, ``bad_signature``, ``stale`` (signed
        outside the replay window, or before this receiver's session began) and
        ``replayed`` (a copy of a signed payload already accepted: a replay, or a QoS 1
        redelivery) count what it dropped before ``received`` (and ``oversized`` includes
        what it dropped unverified).
        """
        rejected: dict[str, int] = getattr(self.transport, "rejected", None) or {}
        callbacks = self._callback_stats
        return {
            **self._stats,
            "errors": self._stats["errors"] + callbacks.errors,
            **callbacks.as_stats(),
            "duplicates": self._order.duplicates,
            "gaps": self._order.gaps,
            "resend_requests": self._order.requests,
            "resent": self._outbox.resent,
            "evicted": self._order.evicted,
            "forgotten": self._order.forgotten,
            "oversized": self._stats["oversized"] + rejected.get("oversized", 0),
            "unsigned": rejected.get("unsigned", 0),
            "bad_signature": rejected.get("bad_signature", 0),
            "stale": rejected.get("stale", 0),
            "replayed": rejected.get("replayed", 0),
        }

    def _require_running(self) -> None:
        if not self._entered:
            raise CoordinationError("the Coordinator is not running: use 'async with coord:'")

    # ------------------------------------------------------------------ callbacks
    def on_fact(
        self,
        callback: FactCallback,
        *,
        agent: str | None = None,
        branch: str | None = None,
        max_tasks: int | None = None,
        max_queue: int | None = None,
    ) -> Callable[[], None]:
        """Call ``callback(FactDelivery)`` whenever a fact reaches an agent.

        Filtered by ``agent`` / ``branch`` if given; sync or async callbacks. A sync
        callback runs on the receive path; async calls run in at most ``max_tasks`` tasks
        with at most ``max_queue`` deliveries waiting (defaults: the coordinator settings'
        ``max_callback_tasks`` / ``max_callback_queue``); when full the oldest waiting
        delivery is dropped, counted in ``stats["callbacks_dropped"]``. Returns an
        unsubscribe function (what is still waiting is dropped). Exceptions in callbacks
        are logged and counted in ``stats["errors"]``.

        Raises:
            TypeError: ``callback`` is not callable.
            ValueError: ``max_tasks`` or ``max_queue`` is not an int >= 1.
        """
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {type(callback).__name__}")
        queue = CallbackQueue(
            callback,
            self._callback_stats,
            max_tasks=self.settings.max_callback_tasks if max_tasks is None else max_tasks,
            max_queue=self.settings.max_callback_queue if max_queue is None else max_queue,
        )
        entry = (queue, agent, branch)
        self._callbacks.append(entry)
        self._index_callbacks()

        def unsubscribe() -> None:
            if entry in self._callbacks:
                self._callbacks.remove(entry)
                self._index_callbacks()
                queue.clear()
                self._retired = [q for q in (*self._retired, queue) if q.busy]

        return unsubscribe

    def _index_callbacks(self) -> None:
        """Which agents have callbacks, so deliveries to the others skip ``_notify``."""
        wanted = {agent for _queue, agent, _branch in self._callbacks}
        self._callback_agents = None if None in wanted else cast("set[str]", wanted)

    def _notify(self, agent: str, branch: str, fact: SharedFact) -> None:
        delivery: FactDelivery | None = None
        for queue, want_agent, want_branch in list(self._callbacks):
            if (want_agent is not None and want_agent != agent) or (
                want_branch is not None and want_branch != branch
            ):
                continue
            if delivery is None:
                delivery = FactDelivery(agent, branch, fact)
            queue.submit(delivery)  # never raises: failures are logged and counted

    # ------------------------------------------------------------------ reading
    def facts_for(self, agent: str, branch: str = "main") -> list[SharedFact]:
        """The facts delivered to ``agent`` on ``branch``, in delivery order."""
        return self.pool.facts_for(inbox_key(agent, branch))

    def context_for(self, agent: str, branch: str = "main") -> Message | None:
        """``agent``'s facts on ``branch`` as one system message (``None`` if none)."""
        return self.pool.context_for(inbox_key(agent, branch))

    def facts(self, branch: str | None = None) -> list[SharedFact]:
        """Facts in this coordinator's log (optionally only those routed to ``branch``)."""
        return [e.fact for e in self._log.values() if branch is None or e.branch == branch]

    # ------------------------------------------------------------------ routing
    def _targets(self, branch: str, scope: str) -> _Targets:
        graph = self.graph
        if graph.version != self._cache_version:
            self._targets_cache.clear()
            self._cache_version = graph.version
        # a branch this process does not know routes like every other unknown one: one
        # cache entry for all of them, however many names arrive from the wire
        key = (branch if branch in graph else None, scope)
        targets = self._targets_cache.get(key)
        if targets is None:
            try:
                branches = graph.branches_in_scope(branch, scope)  # type: ignore[arg-type]
            except UnknownBranchError:
                # a branch this process does not know (yet): logged for when it does
                branches = graph.branches if scope == "global" else []
            members = tuple((agent, b) for b in branches for agent in graph.agents(b))
            targets = _Targets(members, tuple(inbox_key(a, b) for a, b in members))
            self._targets_cache[key] = targets
        return targets

    def _deliver_to(self, env: FactEnvelope, targets: _Targets) -> int:
        pool, fact, stats = self.pool, env.fact, self._stats
        saved = pool.conflict
        if env.conflict is not None:
            pool.conflict = env.conflict
        try:
            results = pool.deliver_many(targets.keys, fact)  # one lock for all
        finally:
            pool.conflict = saved
        delivered = results.count(True)
        stats["delivered"] += delivered
        stats["skipped"] += len(results) - delivered
        if self._callbacks and delivered:
            wanted = self._callback_agents
            for (agent, branch), ok in zip(targets.members, results, strict=True):
                if ok and (wanted is None or agent in wanted):
                    self._notify(agent, branch, fact)
        return delivered

    def _deliver(self, env: Envelope) -> None:
        if isinstance(env, RetractEnvelope):
            self._retract_here(env.fact_ids)
            return
        if self.pool.is_retracted(env.fact.id):
            return  # forgotten: a resend or late copy does not bring it back
        log_ = self._log
        log_[(env.sender, env.epoch, env.seq)] = env
        if len(log_) > self.settings.max_log:
            log_.popitem(last=False)
        self._deliver_to(env, self._targets(env.branch, env.scope))

    def _on_graph_change(self, change: GraphChange) -> None:
        """New members (a branch, a fork, a joining agent) receive the facts in their scope."""
        if change.kind not in ("add_branch", "fork", "add_agent") or not change.agents:
            return
        members = {(a, change.branch) for a in change.agents}
        for env in list(self._log.values()):
            targets = self._targets(env.branch, env.scope)
            mine = [i for i, m in enumerate(targets.members) if m in members]
            if mine:
                self._deliver_to(env, targets.subset(mine))

    # ------------------------------------------------------------------ ordering
    def _retract_here(self, fact_ids: Iterable[str]) -> list[SharedFact]:
        """Drop facts from the pool, every inbox and the log (for late joiners too)."""
        ids = set(fact_ids)
        removed = self.pool.retract(ids)
        for k in [k for k, e in self._log.items() if e.fact.id in ids]:
            del self._log[k]
        if self.manager is not None and not self.manager.closed:
            try:  # the records in its store go too: a restart does not bring them back
                self.manager.forget_shared(sorted(ids))
            except Exception:
                log.exception("forgetting retracted facts in the store failed")
        self._stats["retracted"] += len(removed)
        return removed

    async def retract(self, fact_ids: Iterable[str], *, branch: str = "main") -> list[SharedFact]:
        """Forget shared facts here and in every coordinator of the namespace.

        Local agents lose them when this returns; a tombstone (ids only, in this sender's
        ordered stream, signed with a signing transport) makes every other coordinator
        drop them and refuse them if they arrive again. Returns the facts dropped here.

        Raises:
            ValueError: no ids, or more than 1,000.
            TransportError: publishing failed (they are already gone here).
        """
        self._require_running()
        ids = tuple(dict.fromkeys(fact_ids))
        if not ids or len(ids) > 1000:
            raise ValueError(f"fact_ids: give 1 to 1000 ids, got {len(ids)}")
        removed = [f for f in self.pool.facts() if f.id in set(ids)]
        env = RetractEnvelope(
            namespace=self.namespace,
            sender=self.sender_id,
            epoch=self.epoch,
            seq=self._seq + 1,
            branch=branch,
            fact_ids=ids,
        )
        await self._send(env, env.model_dump_json().encode("utf-8"))
        return removed

    def _accept(self, env: Envelope) -> None:
        """Deliver ``env`` once, in its sender's order (buffering early arrivals)."""
        self._order.accept((env.sender, env.epoch), env.seq, env)

    # ------------------------------------------------------------------ repair
    def _ask_resend(self, stream: tuple[str, int], ranges: list[tuple[int, int]]) -> None:
        """Ask ``stream``'s sender to publish ``ranges`` again (one request in flight each)."""
        if not self._entered or stream in self._asking:
            return
        sender, epoch = stream
        try:
            ask = ResendRequest(
                namespace=self.namespace,
                sender=self.sender_id,
                to=sender,
                epoch=epoch,
                ranges=ranges,
            )
        except ValueError:  # pragma: no cover - the ranges come from validated envelopes
            log.exception("cannot ask %s to resend %s", sender, ranges[:3])
            return
        self._asking.add(stream)
        task = asyncio.get_running_loop().create_task(self._publish_control(ask))
        self._control_tasks.add(task)
        task.add_done_callback(self._control_tasks.discard)
        task.add_done_callback(lambda _t: self._asking.discard(stream))

    async def _send_mark(self, seq: int) -> None:
        mark = HighWaterMark(
            namespace=self.namespace, sender=self.sender_id, epoch=self.epoch, seq=seq
        )
        await self.transport.publish(self._control_topic, mark.model_dump_json().encode())

    async def _publish_control(self, message: ResendRequest) -> None:
        try:
            await self.transport.publish(self._control_topic, message.model_dump_json().encode())
        except (TransportError, ValueError) as exc:
            log.debug("publishing a resend request failed: %s", exc)

    def _handle_control(self, payload: bytes) -> None:
        """A high-water mark or a resend request from another coordinator. Never raises."""
        stats = self._stats
        stats["control"] += 1
        if len(payload) > self.max_payload:
            stats["oversized"] += 1
            return
        try:
            message = CONTROL_ADAPTER.validate_json(payload)
        except ValueError as exc:
            stats["malformed"] += 1
            log.warning("dropped a malformed control payload: %.200s", exc)
            return
        if message.namespace != self.namespace:
            stats["malformed"] += 1
            log.warning("dropped a control payload of namespace %.100r", message.namespace)
            return
        if message.sender == self.sender_id:
            return  # our own (MQTT 3.1.1 echoes), or an earlier start of ours
        if isinstance(message, HighWaterMark):
            self._order.announce((message.sender, message.epoch), message.seq)
        elif message.to == self.sender_id and message.epoch == self.epoch:
            self._outbox.request(message.ranges)

    # ------------------------------------------------------------------ receiving
    async def _receive(self, messages: AsyncIterator[tuple[str, bytes]]) -> None:
        try:
            async for topic, payload in messages:
                self._handle(topic, payload)
        except asyncio.CancelledError:
            raise
        except TransportError as exc:
            self.error = exc
            log.error("coordinator %s stopped receiving: %s", self.sender_id, exc)
        except Exception as exc:  # pragma: no cover - _handle never raises
            self.error = exc
            log.exception("coordinator %s stopped receiving", self.sender_id)

    def _handle(self, topic: str, payload: bytes) -> None:
        """One payload from the wire: validate, dedupe, order, deliver. Never raises."""
        if topic == self._control_topic:
            self._handle_control(payload)
            return
        stats = self._stats
        stats["received"] += 1
        if payload.startswith(self._echo_prefix):
            return  # our own, delivered locally when it was shared
        if len(payload) > self.max_payload:
            stats["oversized"] += 1
            log.warning(
                "dropped an oversized payload on %r (%d bytes > %d)",
                topic,
                len(payload),
                self.max_payload,
            )
            return
        try:
            env = ENVELOPE_ADAPTER.validate_json(payload)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            stats["malformed"] += 1
            errors = exc.error_count() if isinstance(exc, ValidationError) else 1
            log.warning("dropped a malformed payload on %r (%d errors): %.200s", topic, errors, exc)
            return
        if env.namespace != self.namespace or parse_fact_topic(topic) != (
            self.namespace,
            env.branch,
        ):
            stats["malformed"] += 1
            log.warning("dropped an envelope whose namespace/branch do not match topic %r", topic)
            return
        if env.sender == self.sender_id:
            return  # our own, delivered locally when it was shared
        try:
            self._accept(env)
        except Exception:
            stats["errors"] += 1
            log.exception("delivering a fact from %s failed", env.sender)

    # ------------------------------------------------------------------ sharing
    def _envelope(
        self,
        fact: SharedFact,
        branch: str,
        scope: FactScope,
        conflict: ConflictRule | None = None,
    ) -> tuple[FactEnvelope, bytes]:
        env = FactEnvelope(
            namespace=self.namespace,
            sender=self.sender_id,
            epoch=self.epoch,
            seq=self._seq + 1,
            branch=branch,
            scope=scope,
            conflict=conflict,
            fact=fact,
        )
        payload = env.model_dump_json().encode("utf-8")
        if len(payload) > self.max_payload:
            raise ValueError(
                f"the fact's envelope is {len(payload)} bytes, over max_payload "
                f"{self.max_payload}: share a shorter fact"
            )
        return env, payload

    def _check_branch(self, branch: str) -> None:
        if branch not in self.graph:
            self.graph.info(branch)  # raises UnknownBranchError with the known names
        if self.graph.status(branch) == "closed":
            raise BranchError(f"branch {branch!r} is closed")

    async def _send(self, env: Envelope, payload: bytes) -> None:
        self._seq = env.seq
        self._accept(env)  # local agents get it now
        topic = self._topics.get(env.branch)
        if topic is None:  # one str per branch, shared by every envelope the outbox keeps
            topic = self._topics[env.branch] = fact_topic(self.namespace, env.branch)
        self._outbox.add(env.seq, topic, payload)  # kept to send again if a receiver asks
        await self.transport.publish(topic, payload)

    async def share(
        self,
        agent: str,
        fact: str | SharedFact,
        *,
        branch: str | None = None,
        scope: FactScope | None = None,
        confidence: float = 1.0,
        metadata: dict[str, Any] | None = None,
    ) -> SharedFact:
        """Share ``fact`` from ``agent``: every agent whose branch is in scope receives it.

        ``fact`` is a text (made into a :class:`SharedFact` on ``branch``, default
        ``"main"``, with ``scope``, default ``"branch"``) or a ready :class:`SharedFact`
        (shared as it is; ``branch``/``scope`` must then match it or be left out). Local
        agents have it when this returns; remote coordinators once the transport
        delivered it (over MQTT: acknowledged by the broker when this returns).

        Raises:
            UnknownBranchError: the branch is not in the graph.
            BranchError: the branch is closed.
            ValueError: a bad fact, or an envelope over ``max_payload``.
            TransportError: publishing failed.
        """
        self._require_running()
        if isinstance(fact, SharedFact):
            if (
                agent != fact.source_agent
                or (branch is not None and branch != fact.source_branch)
                or (scope is not None and scope != fact.scope)
            ):
                raise ValueError(
                    "a SharedFact is shared as it is: agent/branch/scope must match its "
                    f"source_agent/source_branch/scope ({fact.source_agent!r}, "
                    f"{fact.source_branch!r}, {fact.scope!r})"
                )
            shared = fact
        elif isinstance(fact, str):
            shared = SharedFact.create(
                fact,
                agent=agent,
                branch=branch or "main",
                scope=scope or "branch",
                confidence=confidence,
                metadata=metadata,
            )
        else:
            raise TypeError(f"fact must be a str or a SharedFact, got {type(fact).__name__}")
        self._check_branch(shared.source_branch)
        env, payload = self._envelope(shared, shared.source_branch, shared.scope)
        await self._send(env, payload)
        return shared

    # ------------------------------------------------------------------ membership
    def join(self, agent: str, branch: str = "main") -> list[SharedFact]:
        """Add ``agent`` to ``branch``; it receives the facts already in its scope.

        Returns the agent's facts on that branch.
        """
        self.graph.add_agent(branch, agent)  # the graph listener delivers the backlog
        return self.facts_for(agent, branch)

    def leave(self, agent: str, branch: str = "main") -> None:
        """Remove ``agent`` from ``branch`` and drop its inbox there."""
        self.graph.remove_agent(branch, agent)
        self.pool.forget(inbox_key(agent, branch))

    def fork(self, parent: str, child: str, agents: Iterable[str] | None = None) -> BranchInfo:
        """Fork ``child`` from ``parent`` (agents default to the parent's).

        Each agent that is also on ``parent`` starts from a copy-on-write fork of its
        parent-branch memory (``ConversationMemory.fork``): what it adds on ``child`` is
        invisible to ``parent`` and to siblings. A persistent agent whose memory on
        ``child`` the store already holds (a restarted process, a workflow rerun) resumes
        that memory instead of forking again. The child's agents receive the facts
        already in their scope.
        """
        self.graph.info(parent)  # raises UnknownBranchError
        members = self.graph.agents(parent) if agents is None else list(agents)
        on_parent = set(self.graph.agents(parent))
        parents: dict[str, ConversationMemory] = {}
        if self.manager is not None:
            parents = {a: self.manager.memory(a, parent) for a in members if a in on_parent}
        info = self.graph.fork(parent, child, agents=members)
        if self.manager is not None:
            manager = self.manager
            for agent, memory in parents.items():
                if manager.policy(agent).is_persistent and manager.store.count_messages(
                    manager.key(agent, child)
                ):
                    manager.memory(agent, child)  # the stored branch, resumed
                else:
                    attach_memory(manager, agent, child, memory.fork(agent=agent))
        return info

    # ------------------------------------------------------------------ merging
    async def merge(
        self,
        child: str,
        into: str,
        *,
        strategy: MergeStrategy = "facts",
        conflict: ConflictRule = "newest",
        summarizer: Callable[[list[Message]], Any] | None = None,
    ) -> MergeResult:
        """Merge branch ``child`` into ``into`` (then ``child`` is ``merged``).

        * Facts (always): the facts routed to ``child`` (shared there or merged into it)
          are re-shared on ``into`` with scope ``branch``, tagged
          ``metadata["merged_from"]``; facts on the same ``metadata["topic"]`` are resolved
          by ``conflict`` (``newest`` / ``confidence`` / ``keep_both``).
        * ``strategy="summary"``: the child's agents' new messages (added since the fork)
          are summarised (``summarizer``, sync or async; default
          :class:`~marsys_mem.context.summarize.ExtractiveSummarizer`) into one system message
          appended to the memory of every agent of ``into``.
        * ``strategy="messages"``: each child agent's new messages are appended to the
          same agent's memory on ``into`` (an agent not on ``into`` joins it).

        Raises:
            UnknownBranchError, BranchError, MergeCycleError: see
                :meth:`BranchGraph.check_merge`.
            ValueError: unknown strategy or rule; summary/messages without a manager.
        """
        self._require_running()
        if strategy not in _STRATEGIES:
            raise ValueError(f"strategy must be one of {_STRATEGIES}, got {strategy!r}")
        if conflict not in _RULES:
            raise ValueError(f"conflict must be one of {_RULES}, got {conflict!r}")
        self.graph.check_merge(child, into)
        manager = self.manager
        if strategy != "facts" and manager is None:
            raise ValueError(f"strategy {strategy!r} needs a manager (the agents' memories)")
        # facts: one envelope per distinct fact routed to the child
        chosen: dict[str, SharedFact] = {}
        for env in self._log.values():
            if env.branch == child:
                chosen.pop(env.fact.id, None)
                chosen[env.fact.id] = env.fact
        merged = [
            SharedFact.model_validate(
                {**f.model_dump(), "metadata": {**f.metadata, "merged_from": child}}
            )
            for f in chosen.values()
        ]
        for fact in merged:
            env, payload = self._envelope(fact, into, "branch", conflict)
            await self._send(env, payload)
        count, summary = 0, None
        if manager is not None and strategy != "facts":
            count, summary = await merge_memories(
                manager, self.graph, child, into, strategy, summarizer
            )
        self.graph.merge(child, into, strategy=strategy, conflict=conflict)
        return MergeResult(child, into, strategy, conflict, tuple(merged), count, summary)

    def __repr__(self) -> str:
        state = "running" if self._entered else "stopped"
        return (
            f"Coordinator(namespace={self.namespace!r}, transport={type(self.transport).__name__}, "
            f"branches={len(self.graph)}, {state})"
        )
