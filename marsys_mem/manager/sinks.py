"""The sinks a :class:`~marsys_mem.manager.MemoryManager` gives its agents' memories.

Each managed memory gets one :class:`AgentSink` (or none, when there is nothing to do). The
write path runs one way:
:meth:`ConversationMemory.add <marsys_mem.conversation.ConversationMemory.add>` calls
:meth:`AgentSink.on_append`, which

1. writes the messages to the store (persistent agents, :class:`StoreWriter`): the append
   and the store's retention (``max_stored_messages`` always, ``ttl`` when due) run in ONE
   transaction, so the bound holds across processes; or buffers them
   (``write_through=False``);
2. feeds them to the agent's memory patterns, if any;
3. returns the ids the memory must drop to stay within its policy
   (:class:`MemoryBound`, by the one rule of :mod:`marsys_mem.store.retention`), which the
   memory drops itself after appending, without calling the sink back.

Nothing here reaches back into the memory or the manager.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from marsys_mem.config.models import RetentionPolicy
from marsys_mem.conversation import ConversationMemory
from marsys_mem.model.messages import Message
from marsys_mem.patterns.agent import AgentPatterns
from marsys_mem.store.base import Append, EnforceRetention, Key, MemoryStore, Op
from marsys_mem.store.retention import evicted, is_expired, over_bound, ttl_cutoff

__all__ = ["AgentSink", "MemoryBound", "StoreWriter", "trim_chunk"]


def trim_chunk(limit: int, retention_every: int) -> int:
    """How many messages a full in-process memory drops at once.

    Trimming a :class:`ConversationMemory` costs O(its length), so a full memory drops
    ``chunk`` messages at once (at most ``retention_every``, at most a tenth of the bound)
    rather than one per append: trimming then costs O(1) amortised per append, and the
    memory holds between ``limit - chunk + 1`` and ``limit`` messages, never more.

    Example:
        >>> trim_chunk(100, 100), trim_chunk(50, 25), trim_chunk(3, 100)
        (10, 5, 1)
    """
    return max(1, min(retention_every, limit // 10))


class MemoryBound:
    """Keeps an in-process memory within its policy's ttl and ``max_stored_messages``.

    The rule is :mod:`marsys_mem.store.retention`'s (oldest unprotected first, then the
    oldest protected; protected messages never expire), applied in chunks of
    :func:`trim_chunk` so that trimming costs O(1) amortised. A persistent memory so holds
    the newest part of what its store holds.

    Args:
        policy: the agent's retention policy.
        retention_every: the manager's ``retention_every`` (sizes the chunk).

    Example:
        >>> from marsys_mem.config.models import RetentionPolicy
        >>> bound = MemoryBound(RetentionPolicy(max_stored_messages=3), retention_every=100)
        >>> mem = ConversationMemory([Message.user(str(i)) for i in range(3)])
        >>> drop = bound.evictions(mem, [Message.user("3")], ttl=False)
        >>> [m.text for m in mem if m.message_id in drop]
        ['0']
    """

    def __init__(self, policy: RetentionPolicy, retention_every: int) -> None:
        self.policy = policy
        limit = policy.max_stored_messages
        self.chunk = trim_chunk(limit, retention_every) if limit is not None else 1

    @property
    def active(self) -> bool:
        """Whether the policy bounds the memory at all (a ttl or ``max_stored_messages``)."""
        return self.policy.ttl is not None or self.policy.max_stored_messages is not None

    def evictions(
        self, memory: ConversationMemory, messages: Sequence[Message], *, ttl: bool
    ) -> list[str]:
        """Ids to drop once ``messages`` are appended to ``memory`` (call under its lock).

        O(1) while the memory stays within its bound and the ttl is not due (``ttl``);
        otherwise one pass over the memory, dropping a chunk beyond the bound.
        """
        limit = self.policy.max_stored_messages
        over = over_bound(len(memory) + len(messages), limit)
        if not over and not ttl:
            return []
        combined = [*memory.read(), *messages]
        drop = evicted(
            combined,
            now=datetime.now(UTC),
            ttl=self.policy.ttl if ttl else None,
            max_messages=limit,
            headroom=self.chunk - 1 if over else 0,
        )
        return [combined[i].message_id for i in drop]

    def enforce(self, memory: ConversationMemory) -> list[str]:
        """Ids the policy no longer allows in ``memory`` now (ttl and bound, no chunk)."""
        if not self.active:
            return []
        messages = memory.read()
        drop = evicted(
            messages,
            now=datetime.now(UTC),
            ttl=self.policy.ttl,
            max_messages=self.policy.max_stored_messages,
        )
        return [messages[i].message_id for i in drop]


class StoreWriter:
    """Writes a persistent memory's changes to its store key (or buffers them).

    ``max_stored_messages`` is enforced in the same store transaction as every append: the
    store counts the key's messages inside that transaction, so the bound holds whatever
    other processes wrote to the same key. The ttl is applied when the caller says it is
    due. With ``write_through=False`` appends wait in :attr:`pending` until :meth:`flush`,
    and the buffer keeps only what the store's bound would keep.

    Args:
        store: the store.
        key: the memory's store key.
        policy: the agent's retention policy.
        stored: how many messages the store holds under ``key`` now.
        write_through: write every append at once (else buffer until :meth:`flush`).
        retention_every: the manager's ``retention_every`` (sizes the buffer's slack).

    Example:
        >>> from marsys_mem.config.models import RetentionPolicy
        >>> from marsys_mem.store.memory import InMemoryStore
        >>> store = InMemoryStore()
        >>> writer = StoreWriter(store, ("d", "a", "main"), RetentionPolicy(), 0,
        ...                      write_through=True, retention_every=100)
        >>> writer.append([Message.user("hi")], ttl=False)
        >>> store.count_messages(("d", "a", "main")), writer.stored
        (1, 1)
    """

    def __init__(
        self,
        store: MemoryStore,
        key: Key,
        policy: RetentionPolicy,
        stored: int,
        *,
        write_through: bool,
        retention_every: int,
    ) -> None:
        self.store = store
        self.key = key
        self.policy = policy
        self.write_through = write_through
        self.retention_every = retention_every
        self.pending: list[Message] = []
        self.stored = stored  # messages in the store under key (this process's estimate)

    def write(self, messages: Sequence[Message], *, ttl: bool = False) -> None:
        """Append ``messages`` and apply the bound (and the ttl if ``ttl``) in one transaction."""
        policy = self.policy
        ops: list[Op] = [Append(self.key, tuple(messages))] if messages else []
        limit = policy.max_stored_messages
        due = policy.ttl if ttl else None
        if limit is not None or due is not None:
            # Always with the bound: only the store knows what other processes appended.
            ops.append(EnforceRetention(self.key, due, limit, datetime.now(UTC)))
        if not ops:
            return
        results = self.store.batch(ops)
        self.stored += len(messages)
        if isinstance(ops[-1], EnforceRetention):
            self.stored = max(self.stored - results[-1], 0)

    def append(self, messages: Sequence[Message], *, ttl: bool) -> None:
        """Write ``messages`` now, or buffer them (``write_through=False``)."""
        if self.write_through:
            self.write(messages, ttl=ttl)
        else:
            self.pending.extend(messages)
            self._bound_pending()

    def _bound_pending(self) -> None:
        """Drop buffered messages the store's bound would delete at the next flush.

        The buffer is committed in one transaction, after everything already stored, so
        of its messages at most the newest ``max_stored_messages`` (by the retention rule)
        can survive that flush's retention. Amortised: every ``chunk`` appends.
        """
        limit = self.policy.max_stored_messages
        if limit is None or len(self.pending) <= limit + trim_chunk(limit, self.retention_every):
            return
        # Only the bound: the ttl is the store's business when the buffer is flushed.
        drop = set(evicted(self.pending, now=datetime.now(UTC), max_messages=limit))
        self.pending = [m for i, m in enumerate(self.pending) if i not in drop]

    def delete(self, messages: Sequence[Message]) -> None:
        """Delete ``messages`` (buffered or stored)."""
        ids = {m.message_id for m in messages}
        self.pending = [m for m in self.pending if m.message_id not in ids]
        self.stored -= self.store.delete_messages(self.key, ids=ids)

    def clear(self) -> None:
        """Delete everything under the key, buffered or stored."""
        self.pending.clear()
        self.store.delete_messages(self.key)
        self.stored = 0

    def flush(self, *, retention: bool = False) -> int:
        """Write the buffer (``retention``: and apply ttl and bound); returns net deletions."""
        before = self.stored + len(self.pending)
        pending, self.pending = self.pending, []
        if pending or retention:
            self.write(pending, ttl=retention)
        return before - self.stored


class AgentSink:
    """The :class:`~marsys_mem.conversation.MemorySink` of one managed memory.

    Writes to the store (``writer``, persistent agents), feeds the agent's patterns, and
    returns from :meth:`on_append` the ids the memory must drop to stay within its bound
    (``bound``); the ttl is due every ``retention_every`` appended messages.

    Args:
        bound: the memory's bound.
        writer: the store writer (persistent agents), or ``None``.
        patterns: the agent's patterns, or ``None``.
        retention_every: apply the ttl after this many appended messages.

    Example:
        >>> from marsys_mem.config.models import RetentionPolicy
        >>> bound = MemoryBound(RetentionPolicy(max_stored_messages=2), retention_every=100)
        >>> mem = ConversationMemory(sink=AgentSink(bound, retention_every=100))
        >>> _ = mem.add_many([Message.user(str(i)) for i in range(5)])
        >>> [m.text for m in mem]
        ['3', '4']
    """

    def __init__(
        self,
        bound: MemoryBound,
        writer: StoreWriter | None = None,
        patterns: AgentPatterns | None = None,
        *,
        retention_every: int,
    ) -> None:
        self.bound = bound
        self.writer = writer
        self.patterns = patterns
        self.retention_every = retention_every
        self.since_ttl = 0  # messages appended since the ttl was last applied

    def _ttl_due(self, appended: int) -> bool:
        self.since_ttl += appended
        if self.bound.policy.ttl is None or self.since_ttl < self.retention_every:
            return False
        self.since_ttl = 0
        return True

    def on_append(self, memory: ConversationMemory, messages: Sequence[Message]) -> list[str]:
        """Write / buffer, feed the patterns; returns the ids the bound evicts."""
        ttl = self._ttl_due(len(messages))
        if self.writer is not None:
            self.writer.append(messages, ttl=ttl)
        if self.patterns is not None:
            self.patterns.ingest(messages)
        drop = self.bound.evictions(memory, messages, ttl=ttl)
        if drop:
            self.evicted(memory, messages, drop)
        return drop

    def evicted(
        self, memory: ConversationMemory, appended: Sequence[Message], ids: Sequence[str]
    ) -> None:
        """The memory drops ``ids`` (ttl or bound): so do the patterns of an unstored memory.

        A stored memory's patterns follow the store, whose deletions cascade to their
        stored copies (they catch up before they read).
        """
        if self.patterns is None or self.writer is not None:
            return
        cutoff = ttl_cutoff(datetime.now(UTC), self.bound.policy.ttl)
        wanted = set(ids)
        by_id = {m.message_id: m for m in [*memory.read(), *appended] if m.message_id in wanted}
        expired = [mid for mid, m in by_id.items() if is_expired(m, cutoff)]
        bounded = [mid for mid in by_id if mid not in set(expired)]
        self.patterns.forget(expired, cause="ttl")
        self.patterns.forget(bounded, cause="bound")

    def on_remove(self, memory: ConversationMemory, messages: Sequence[Message]) -> None:
        """Delete them from the store; an unstored memory's patterns drop them too.

        (``trim_oldest`` and ``remove`` come here; a RAG archive keeps its copies.)
        """
        if self.writer is not None:
            self.writer.delete(messages)
        elif self.patterns is not None:
            self.patterns.forget([m.message_id for m in messages], cause="bound")

    def on_clear(self, memory: ConversationMemory) -> None:
        """Delete the key's messages from the store (an unstored memory: from its patterns)."""
        if self.writer is not None:
            self.writer.clear()
        elif self.patterns is not None:
            self.patterns.forget([m.message_id for m in memory.read()], cause="forget")

    def flush(self) -> int:
        """Write buffered appends; returns the messages the store's bound deleted."""
        return self.writer.flush() if self.writer is not None else 0

    def retain(self, memory: ConversationMemory) -> tuple[int, list[str]]:
        """Apply ttl and bound now (call under the memory's lock).

        Returns:
            The number of messages the store deleted (persistent agents) and the ids the
            memory must drop (:meth:`ConversationMemory.evict`).
        """
        self.since_ttl = 0
        stored = self.writer.flush(retention=True) if self.writer is not None else 0
        drop = self.bound.enforce(memory)
        if drop:
            self.evicted(memory, (), drop)
        if self.patterns is not None:
            self.patterns.retain(self.bound.policy.ttl)
        return stored, drop
