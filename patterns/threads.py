"""Cross-thread recall: what a subject said in their other conversations.

A *thread* is one conversation, the messages of one store key ``(namespace, agent,
branch)``: an agent's branch, a session kept on its own branch, a run's memory. A *subject*
is whom the conversation is with (the user the agent talks to, as in
``patterns.facts.subject``). :class:`CrossThreadRecall` keeps which threads belong to which
subject and finds, for a query, the relevant messages of a subject's *other* threads
(Oasis ``CrossThreadSearch``), so an agent talking to Alice today can use what she said
to another agent, or in last week's session, without reading it all.

Threads and subjects:

* a thread belongs to at most one subject (linking it to a second one raises
  ``ValueError``), so a search for one subject can never return another's messages;
* links are written to the store (one pinned system record per thread under
  :func:`~marsys_mem.store.keys.subject_threads_key` ``(namespace, "#threads", subject)``)
  and read back by the next process; no conversation key can spell it.

Messages are not copied: the caller (``MemoryManager``) gives each thread's current
messages (:data:`ThreadSource`) when a subject is searched, and they are indexed in a
:class:`~marsys_mem.patterns.rag.RAGMemory` per subject, made on the first search for it
and brought in line with the threads at every search (new messages added, messages a
thread no longer holds removed). Nothing is indexed for subjects nobody searches, and
appends never wait for it. System messages and messages without text are not indexed.

Ranking is the RAGMemory's hybrid retrieval (dense + BM25, reciprocal rank fusion); a hit
must also be about the query: its cosine to the query (``ThreadHit.score``) at least
``min_score``. The gate is on the cosine, not on the fused score, because a rank-fused
score says how a message ranks among the others (the best dense match of an unrelated
query still scores 0.6), not whether it is relevant. ``benchmarks/bench_threads.py``
(packaged MiniLM, paraphrased questions about facts stated in other threads, top 4): at
the default 0.3 the answer comes back for 62% of the questions with 0.6 other messages,
and a question about nothing the subject said gets 0.33 hits; 0.25 gives 85% / 1.15 /
0.67, 0.35 gives 49% / 0.31 / 0.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from marsys_mem.context.blocks import BlockItem
from marsys_mem.exceptions import MarsysMemError, StoreError
from marsys_mem.lifecycle import Closing
from marsys_mem.model.messages import Message
from marsys_mem.model.names import validate_name
from marsys_mem.patterns.rag import RAGMemory
from marsys_mem.retrieval.embeddings import Embedder
from marsys_mem.retrieval.scoring import check_query, finite_number, positive_int
from marsys_mem.store.base import MemoryStore
from marsys_mem.store.keys import SUBJECT_THREADS_AGENT, subject_threads_key

__all__ = ["CrossThreadRecall", "Thread", "ThreadHit", "ThreadSource"]

log = logging.getLogger("marsys_mem.patterns.threads")

Thread = tuple[str, str]
"""A thread: ``(agent, branch)`` in the recall's namespace."""

ThreadSource = Callable[[str, str], Sequence[Message] | None]
"""Gives a thread's current messages, oldest first: ``source(agent, branch)``.

Return every message the thread holds now (the index drops what is no longer there), or
``None`` when nothing changed since the last call (the index keeps what it has).
"""

_SNIPPET_CHARS = 300


def _normal(text: str) -> str:
    return " ".join(text.split()).casefold()


@dataclass(frozen=True, slots=True)
class ThreadHit:
    """A message recalled from another thread of the subject.

    Attributes:
        message: the message.
        agent: the agent of the thread it is in.
        branch: the branch of that thread.
        score: its cosine similarity to the query (the gate, see the module docs).

    Example:
        >>> hit = ThreadHit(Message.user("I moved to Oslo"), "support", "s1", 0.7)
        >>> hit.source, hit.item().speaker, hit.item().text
        ('support@s1', 'user', 'I moved to Oslo')
    """

    message: Message
    agent: str
    branch: str
    score: float

    @property
    def source(self) -> str:
        """``agent@branch`` of the thread (names contain no ``@``: unambiguous)."""
        return f"{self.agent}@{self.branch}"

    def item(self) -> BlockItem:
        """The hit as a block item: where it came from and when, who said what (shortened)."""
        return BlockItem.from_message(
            self.message, source=self.source, when=True, max_chars=_SNIPPET_CHARS
        )

    def render(self) -> str:
        """The hit's line in a block (see :mod:`marsys_mem.context.blocks`)."""
        return self.item().render()


class CrossThreadRecall(Closing):
    """Which threads belong to which subject, and search across a subject's threads.

    Args:
        embedder: the embedder of the per-subject indexes (its cosine is the relevance gate).
        store: where links are kept (``None``: in this process only). Not closed here.
        namespace: the namespace of the threads and links.

    Example:
        >>> from marsys_mem.retrieval.embeddings import HashingEmbedder
        >>> recall = CrossThreadRecall(HashingEmbedder())
        >>> recall.link("alice", "support", "monday")
        True
        >>> _ = recall.link("alice", "sales", "main")
        >>> threads = {("support", "monday"): [Message.user("My dog Rex hates the vet")],
        ...            ("sales", "main"): [Message.user("Which plan fits a team of five?")]}
        >>> hits = recall.search("alice", "the dog Rex and the vet", lambda a, b: threads[(a, b)],
        ...                      exclude=("sales", "main"), min_score=0.2)
        >>> [(h.source, h.message.text) for h in hits]
        [('support@monday', 'My dog Rex hates the vet')]
        >>> recall.close()
    """

    def __init__(
        self,
        embedder: Embedder,
        *,
        store: MemoryStore | None = None,
        namespace: str = "default",
    ) -> None:
        if store is not None and not isinstance(store, MemoryStore):
            raise TypeError(f"store must be a MemoryStore, got {type(store).__name__}")
        if not callable(getattr(embedder, "embed", None)):
            raise TypeError(f"embedder must be an Embedder, got {embedder!r}")
        self.embedder = embedder
        self.store = store
        self.namespace = validate_name("namespace", namespace)
        self._lock = threading.RLock()
        self._subject_of: dict[Thread, str] = {}
        self._threads: dict[str, list[Thread]] = {}
        self._indexes: dict[str, RAGMemory] = {}
        self._where: dict[str, dict[str, Thread]] = {}  # subject -> message id -> thread
        self._closed = False
        if store is not None:
            self._load()

    # ------------------------------------------------------------------ links
    def _load(self) -> None:
        assert self.store is not None
        for key in self.store.list_keys(self.namespace):
            if key[1] != SUBJECT_THREADS_AGENT:
                continue
            subject = key[2]
            for m in self.store.load_messages(key):
                agent, branch = m.metadata.get("agent"), m.metadata.get("branch")
                if not isinstance(agent, str) or not isinstance(branch, str):
                    log.warning("CrossThreadRecall: skipping unreadable link %s", m.message_id)
                    continue
                self._remember(subject, (agent, branch))

    def _remember(self, subject: str, thread: Thread) -> None:
        self._subject_of[thread] = subject
        self._threads.setdefault(subject, []).append(thread)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("CrossThreadRecall is closed")

    @staticmethod
    def _link_id(thread: Thread) -> str:
        return f"thread:{thread[0]}@{thread[1]}"

    def link(self, subject: str, agent: str, branch: str = "main") -> bool:
        """Record that the thread ``(agent, branch)`` is a conversation with ``subject``.

        Durable when it returns (with a store). Linking again is a no-op.

        Returns:
            ``True`` if the link is new.

        Raises:
            InvalidNameError: ``subject``, ``agent`` or ``branch`` is not a name.
            ValueError: the thread already belongs to another subject.
        """
        self._check_open()
        validate_name("subject", subject)
        thread = (validate_name("agent", agent), validate_name("branch", branch))
        with self._lock:
            owner = self._subject_of.get(thread)
            if owner == subject:
                return False
            if owner is not None:
                raise ValueError(
                    f"thread {agent}@{branch} already belongs to subject {owner!r}, not "
                    f"{subject!r}: a thread is a conversation with one subject (unlink it first)"
                )
            if self.store is not None:
                record = Message.system(
                    f"{agent}@{branch}",
                    message_id=self._link_id(thread),
                    pinned=True,  # exempt from ttl retention, like facts
                    metadata={"agent": agent, "branch": branch},
                )
                self.store.append_messages(subject_threads_key(self.namespace, subject), [record])
            self._remember(subject, thread)
            return True

    def unlink(self, subject: str, agent: str, branch: str = "main") -> bool:
        """Remove the thread from ``subject`` (and its messages from the subject's index).

        Returns:
            ``True`` if it was linked.
        """
        self._check_open()
        validate_name("subject", subject)
        thread = (validate_name("agent", agent), validate_name("branch", branch))
        with self._lock:
            if self._subject_of.get(thread) != subject:
                return False
            if self.store is not None:
                key = subject_threads_key(self.namespace, subject)
                self.store.delete_messages(key, [self._link_id(thread)])
            del self._subject_of[thread]
            self._threads[subject].remove(thread)
            self._drop_thread(subject, thread)
            return True

    def subject_of(self, agent: str, branch: str = "main") -> str | None:
        """The subject the thread belongs to (``None``: not linked)."""
        return self._subject_of.get((agent, branch))

    def threads(self, subject: str) -> list[Thread]:
        """The threads linked to ``subject``, in the order they were linked."""
        validate_name("subject", subject)
        with self._lock:
            return list(self._threads.get(subject, ()))

    def subjects(self) -> list[str]:
        """Every subject with at least one thread, sorted."""
        with self._lock:
            return sorted(s for s, threads in self._threads.items() if threads)

    # ------------------------------------------------------------------ index
    def _index(self, subject: str) -> RAGMemory:
        index = self._indexes.get(subject)
        if index is None:
            index = RAGMemory(self.embedder, mode="hybrid")
            self._indexes[subject] = index
            self._where[subject] = {}
        return index

    def _drop_thread(self, subject: str, thread: Thread) -> None:
        where = self._where.get(subject)
        if not where:
            return
        gone = [mid for mid, t in where.items() if t == thread]
        self._remove(subject, gone)

    def _remove(self, subject: str, ids: list[str]) -> None:
        if ids:
            self._indexes[subject].remove(ids)
            where = self._where[subject]
            for mid in ids:
                del where[mid]

    def _sync(self, subject: str, thread: Thread, messages: Sequence[Message]) -> None:
        """Bring the index in line with ``messages``, the thread's current messages."""
        index = self._index(subject)
        where = self._where[subject]
        present = {m.message_id for m in messages}
        self._remove(
            subject, [mid for mid, t in where.items() if t == thread and mid not in present]
        )
        new = [
            m
            for m in messages
            if m.message_id not in where
            and m.role != "system"
            and m.text.strip()
            and len(m.text) <= index.ingest.max_chars
        ]
        new = list({m.message_id: m for m in new}.values())
        if new:
            index.add_many(new)
            for m in new:
                where[m.message_id] = thread

    def search(
        self,
        subject: str,
        query: str,
        source: ThreadSource,
        *,
        exclude: Thread | None = None,
        exclude_ids: Iterable[str] = (),
        exclude_texts: Iterable[str] = (),
        k: int = 4,
        min_score: float | None = 0.3,
    ) -> list[ThreadHit]:
        """The ``k`` messages of ``subject``'s threads that best match ``query``, best first.

        Args:
            subject: whose threads to search.
            query: the search text.
            source: gives each thread's messages (see :data:`ThreadSource`).
            exclude: the current thread: never searched.
            exclude_ids: message ids never returned (what the context already holds).
            exclude_texts: texts never returned (compared ignoring case and spacing).
            k: how many hits at most.
            min_score: drop hits whose cosine to the query is below it (``None``: keep all).

        Raises:
            InvalidNameError: ``subject`` is not a name.
            ValueError: an empty query, ``k <= 0`` or a bad ``min_score``.
        """
        self._check_open()
        validate_name("subject", subject)
        check_query(query)
        k = positive_int("k", k)
        if min_score is not None:
            min_score = finite_number("min_score", min_score)
        skip_ids = set(exclude_ids)
        seen_texts = {_normal(t) for t in exclude_texts}
        with self._lock:
            threads = [t for t in self._threads.get(subject, ()) if t != exclude]
            if not threads:
                return []
            for thread in threads:
                messages = source(*thread)
                if messages is not None:
                    self._sync(subject, thread, messages)
            index = self._index(subject)
            where = dict(self._where[subject])
            if not where:
                return []
            depth = min(len(index), 4 * k + len(skip_ids))
            found = index.search(query, depth, None)  # gated on the cosine below
        hits: list[ThreadHit] = []
        for hit in found:
            cosine = hit.dense_score if hit.dense_score is not None else 0.0
            if min_score is not None and cosine < min_score:
                continue
            thread_of = where.get(hit.id)
            if thread_of is None or thread_of == exclude or hit.id in skip_ids:
                continue
            text = _normal(hit.text)
            if text in seen_texts:
                continue
            seen_texts.add(text)
            hits.append(ThreadHit(hit.message, thread_of[0], thread_of[1], cosine))
            if len(hits) == k:
                break
        return hits

    def forget_subject(self, subject: str) -> int:
        """Drop every link of ``subject`` (store included) and its index; returns the count.

        The threads' own messages are untouched (they are conversations, not copies).
        """
        self._check_open()
        validate_name("subject", subject)
        with self._lock:
            threads = self._threads.pop(subject, [])
            if self.store is not None and threads:
                self.store.delete_messages(subject_threads_key(self.namespace, subject))
            for thread in threads:
                self._subject_of.pop(thread, None)
            index = self._indexes.pop(subject, None)
            self._where.pop(subject, None)
        if index is not None:
            index.close()
        return len(threads)

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Close the indexes (the store is left open). Idempotent."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            indexes, self._indexes = list(self._indexes.values()), {}
        for index in indexes:
            try:
                index.close()
            except MarsysMemError:
                log.exception("closing a cross-thread index failed")

    def __repr__(self) -> str:
        return (
            f"CrossThreadRecall(namespace={self.namespace!r}, subjects={len(self._threads)}, "
            f"threads={len(self._subject_of)})"
        )
