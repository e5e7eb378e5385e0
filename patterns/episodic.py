"""EpisodicMemory: messages grouped into episodes, recalled by meaning, summarised per episode.

An *episode* is a span of activity (a session, a task, a conversation) with its own
metadata. :meth:`EpisodicMemory.start_episode` opens one (ending the previous one),
:meth:`~EpisodicMemory.add` puts messages into the open episode (opening one if there is
none), and :meth:`~EpisodicMemory.recall` finds messages by meaning across episodes, or
within one. Retrieval is a :class:`~marsys_mem.patterns.rag.RAGMemory` (dense + BM25
hybrid), so a question that paraphrases a message finds it; every stored message carries
``metadata["episode_id"]``.

:meth:`~EpisodicMemory.summaries` gives one summary per episode, computed by the
summariser (default :class:`~marsys_mem.context.summarize.ExtractiveSummarizer`; any
``list[Message] -> str`` callable, sync or async). A summary is cached with a fingerprint
of the episode's message ids and recomputed only when the episode changed.

Persistence (everything goes through one :class:`~marsys_mem.store.MemoryStore`):

* messages live under the key ``(namespace, agent, "episodes")``, written through by the
  RAGMemory (durable when :meth:`~EpisodicMemory.add` returns);
* each episode is a run snapshot (:class:`~marsys_mem.model.runs.RunSnapshot`, ``run_id`` = the
  episode id, ``branch="episodes"``, ``status`` ``running`` while open, ``ok`` once ended),
  whose ``metadata`` holds the episode's metadata and its cached summary. Snapshots are
  replaced in place when an episode ends or its summary changes, so nothing grows with the
  number of messages.

A new ``EpisodicMemory`` on the same store and key sees the same episodes, messages and
summaries; the newest episode still open becomes the current one again. Messages whose
episode snapshot is missing (a crash between the two writes) get their episode rebuilt
from the messages on open.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, JsonValue

from marsys_mem.callables import acall, call_sync
from marsys_mem.context.summarize import ExtractiveSummarizer
from marsys_mem.exceptions import StoreError, SummarizerError
from marsys_mem.lifecycle import Closing
from marsys_mem.model.messages import Message
from marsys_mem.model.runs import RunSnapshot
from marsys_mem.patterns.rag import RAGMemory
from marsys_mem.retrieval.calibration import DEFAULT_MIN_SCORE
from marsys_mem.retrieval.embeddings import Embedder
from marsys_mem.retrieval.scoring import ScoredMessage, check_query, positive_int
from marsys_mem.store.base import Key, MemoryStore, SaveRun, validate_key
from marsys_mem.store.memory import InMemoryStore

__all__ = ["Episode", "EpisodeMatch", "EpisodicMemory"]

EPISODE_BRANCH = "episodes"
"""Branch of the store key (and of the run snapshots) that episodic memory uses."""

_KIND = "marsys_mem.episode"
EpisodeSummarizer = Callable[[list[Message]], "str | Awaitable[str]"]


def _utcnow() -> datetime:
    return datetime.now(UTC)


class Episode(BaseModel):
    """One episode: a snapshot of its state when it was read (episodes are not live views).

    Attributes:
        id: the episode id (also the ``run_id`` of its snapshot in the store).
        metadata: what :meth:`EpisodicMemory.start_episode` was given.
        started_at: when it was started.
        ended_at: when it was ended (``None`` while it is open).
        message_ids: its messages' ids, in the order they were added.
        summary: its cached summary (``None`` until :meth:`EpisodicMemory.summaries`
            computed one, or when it changed since).

    Example:
        >>> ep = Episode(id="e1", metadata={"task": "trip"})
        >>> ep.is_open, ep.message_ids
        (True, ())
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1)
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    started_at: AwareDatetime = Field(default_factory=_utcnow)
    ended_at: AwareDatetime | None = None
    message_ids: tuple[str, ...] = ()
    summary: str | None = None

    @property
    def is_open(self) -> bool:
        """True while the episode has not been ended."""
        return self.ended_at is None


@dataclass(frozen=True, slots=True)
class EpisodeMatch:
    """An episode found by :meth:`EpisodicMemory.recall_episodes`.

    Attributes:
        episode: the episode.
        score: the score of its best hit.
        hits: its messages that matched, best first.

    Example:
        >>> m = EpisodeMatch(Episode(id="e1"), score=0.5)
        >>> m.episode.id, m.hits
        ('e1', ())
    """

    episode: Episode
    score: float
    hits: tuple[ScoredMessage, ...] = ()


@dataclass(slots=True)
class _State:
    """The mutable bookkeeping behind one :class:`Episode`."""

    id: str
    metadata: dict[str, Any]
    started_at: datetime
    ended_at: datetime | None = None
    message_ids: list[str] = field(default_factory=list)
    summary: str | None = None
    summary_of: str | None = None  # fingerprint of the message ids the summary covers

    _digest: Any = field(default_factory=lambda: hashlib.blake2b(digest_size=16), init=False)

    def append(self, message_id: str) -> None:
        self.message_ids.append(message_id)
        self._digest.update(message_id.encode("utf-8", "surrogatepass") + b"\x00")

    def drop(self, gone: set[str]) -> bool:
        """Remove the ids in ``gone``; the fingerprint is recomputed. True if any was here."""
        kept = [mid for mid in self.message_ids if mid not in gone]
        if len(kept) == len(self.message_ids):
            return False
        self.message_ids = []
        self._digest = hashlib.blake2b(digest_size=16)
        for mid in kept:
            self.append(mid)
        return True

    def fingerprint(self) -> str:
        """A hash of the message ids, kept incrementally (appends; :meth:`drop` rebuilds it)."""
        return str(self._digest.hexdigest())

    def cached_summary(self) -> str | None:
        if self.summary is not None and self.summary_of == self.fingerprint():
            return self.summary
        return None

    def episode(self) -> Episode:
        return Episode(
            id=self.id,
            metadata=json.loads(json.dumps(self.metadata)),
            started_at=self.started_at,
            ended_at=self.ended_at,
            message_ids=tuple(self.message_ids),
            summary=self.cached_summary(),
        )


def _check_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """A JSON-safe deep copy of ``metadata`` (string keys, no NaN/Infinity)."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise TypeError(f"metadata must be a mapping, got {type(metadata).__name__}")
    for k in metadata:
        if not isinstance(k, str):
            raise TypeError(f"metadata keys must be strings, got {k!r}")
    try:
        copied: dict[str, Any] = json.loads(json.dumps(dict(metadata), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"metadata must be JSON (str keys; no NaN/Infinity; lists, dicts, str, numbers, "
            f"bool, None): {exc}"
        ) from exc
    return copied


def _check_summary(result: object) -> str:
    if not isinstance(result, str):
        raise SummarizerError(f"the summariser returned {type(result).__name__}, not str")
    return result


class EpisodicMemory(Closing):
    """Messages grouped into episodes, recalled by meaning, summarised per episode.

    Args:
        embedder: an :class:`~marsys_mem.retrieval.embeddings.Embedder`, ``"default"`` (the packaged
            all-MiniLM-L6-v2 if installed, else keyword search only) or ``None`` (keyword
            search only).
        store: where messages and episodes persist (default: a private
            :class:`~marsys_mem.store.InMemoryStore`). The memory does not close a store
            it was given.
        namespace: first part of the store key.
        agent: second part of the store key (and the ``agent`` of the episode snapshots).
        summarizer: ``list[Message] -> str``, sync or async (default
            :class:`~marsys_mem.context.summarize.ExtractiveSummarizer`). An async one needs
            :meth:`asummaries`.
        index_path: where the RAGMemory saves its vector index (rebuilt from the store if
            missing or corrupt).
        rag_options: more keyword arguments for the
            :class:`~marsys_mem.patterns.rag.RAGMemory` (``mode``, ``dense_weight``, ...).

    Thread-safe. Messages get ``metadata["episode_id"]`` (replacing any such key they had).

    Example:
        >>> from marsys_mem.retrieval.embeddings import HashingEmbedder
        >>> mem = EpisodicMemory(HashingEmbedder())
        >>> trip = mem.start_episode({"task": "plan trip"})
        >>> _ = mem.add("We booked the hotel in Porto for May 3rd")
        >>> work = mem.start_episode({"task": "quarterly report"})
        >>> _ = mem.add("The quarterly report is due on Friday")
        >>> hit = mem.recall("Which hotel did we book?", k=1)[0]
        >>> hit.text, hit.message.metadata["episode_id"] == trip.id
        ('We booked the hotel in Porto for May 3rd', True)
        >>> [m.episode.metadata["task"] for m in mem.recall_episodes("report due", k=1)]
        ['quarterly report']
        >>> [(ep.metadata["task"], len(ep.message_ids)) for ep, _ in mem.summaries()]
        [('plan trip', 1), ('quarterly report', 1)]
        >>> mem.close()
    """

    def __init__(
        self,
        embedder: Embedder | Literal["default"] | None = "default",
        *,
        store: MemoryStore | None = None,
        namespace: str = "default",
        agent: str = "episodic",
        summarizer: EpisodeSummarizer | None = None,
        index_path: str | Path | None = None,
        rag_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.key: Key = validate_key((namespace, agent, EPISODE_BRANCH))
        if store is not None and not isinstance(store, MemoryStore):
            raise TypeError(f"store must be a MemoryStore, got {type(store).__name__}")
        if summarizer is not None and not callable(summarizer):
            raise TypeError(f"summarizer must be callable, got {type(summarizer).__name__}")
        options = dict(rag_options or {})
        for reserved in ("store", "key", "index_path"):
            if reserved in options:
                raise ValueError(f"rag_options may not set {reserved!r}: EpisodicMemory sets it")
        self.namespace = namespace
        self.agent = agent
        self.summarizer: EpisodeSummarizer = summarizer or ExtractiveSummarizer()
        self._own_store = store is None
        self.store: MemoryStore = store if store is not None else InMemoryStore()
        self._lock = threading.RLock()
        self._episodes: dict[str, _State] = {}
        self._current: str | None = None
        self._closed = False
        try:
            self.rag = RAGMemory(
                embedder, store=self.store, key=self.key, index_path=index_path, **options
            )
        except BaseException:
            if self._own_store:
                self.store.close()
            raise
        try:
            self._load()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ persistence
    def _snapshot(self, state: _State) -> RunSnapshot:
        return RunSnapshot(
            run_id=state.id,
            namespace=self.namespace,
            agent=self.agent,
            branch=EPISODE_BRANCH,
            status="running" if state.ended_at is None else "ok",
            started_at=state.started_at,
            ended_at=state.ended_at,
            metadata={
                "kind": _KIND,
                "episode_metadata": state.metadata,
                "summary": state.summary,
                "summary_of": state.summary_of,
            },
        )

    def _save(self, states: Iterable[_State]) -> None:
        ops = [SaveRun(self._snapshot(s)) for s in states]
        if ops:
            self.store.batch(ops)

    def _load(self) -> None:
        """Read the episode snapshots and group the stored messages by episode."""
        states: list[_State] = []
        for run_id in self.store.list_runs(namespace=self.namespace, agent=self.agent):
            snap = self.store.load_run(run_id)
            if snap is None or snap.branch != EPISODE_BRANCH or snap.metadata.get("kind") != _KIND:
                continue
            meta = snap.metadata
            raw = meta.get("episode_metadata")
            summary, summary_of = meta.get("summary"), meta.get("summary_of")
            states.append(
                _State(
                    id=snap.run_id,
                    metadata=dict(raw) if isinstance(raw, dict) else {},
                    started_at=snap.started_at,
                    ended_at=snap.ended_at,
                    summary=summary if isinstance(summary, str) else None,
                    summary_of=summary_of if isinstance(summary_of, str) else None,
                )
            )
        by_id = {s.id: s for s in states}
        rebuilt: dict[str, _State] = {}
        for m in self.rag.messages():
            eid = m.metadata.get("episode_id")
            if not isinstance(eid, str) or not eid:
                continue  # not written by an EpisodicMemory: searchable, in no episode
            state = by_id.get(eid)
            if state is None:  # its snapshot was never saved (crash between the writes)
                state = by_id[eid] = rebuilt[eid] = _State(eid, {}, m.timestamp)
            state.append(m.message_id)
        if rebuilt:
            self._save(rebuilt.values())
        ordered = sorted(by_id.values(), key=lambda s: s.started_at)  # stable: store order
        with self._lock:
            self._episodes = {s.id: s for s in ordered}
            open_ids = [s.id for s in ordered if s.ended_at is None]
            self._current = open_ids[-1] if open_ids else None

    # ------------------------------------------------------------------ episodes
    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("EpisodicMemory is closed")

    def start_episode(
        self, metadata: Mapping[str, Any] | None = None, *, episode_id: str | None = None
    ) -> Episode:
        """End the current episode (if any) and start a new one with ``metadata``.

        ``episode_id``: the new episode's id (default: a random one). An episode of that
        id that exists already is reopened (its messages kept, ``metadata`` replacing its
        own) rather than started again: a run replayed under the same id (a workflow
        rerun) leaves one episode, not one more each time.

        Raises:
            ValueError, TypeError: metadata that is not a JSON object, or an empty
                ``episode_id`` (nothing changed).
        """
        self._check_open()
        meta = _check_metadata(metadata)
        if episode_id is not None and (not isinstance(episode_id, str) or not episode_id):
            raise ValueError(f"episode_id must be a non-empty string, got {episode_id!r}")
        with self._lock:
            now = _utcnow()
            known = self._episodes.get(episode_id) if episode_id is not None else None
            if known is not None:
                new = replace(known, metadata=meta, ended_at=None)
            else:
                new = _State(episode_id or uuid.uuid4().hex, meta, now)
            changed = [new]
            ended: _State | None = None
            if self._current is not None and self._current != new.id:
                ended = replace(self._episodes[self._current], ended_at=now)
                changed.insert(0, ended)
            self._save(changed)  # both snapshots in one transaction
            if ended is not None:
                self._episodes[ended.id].ended_at = now
            if known is not None:
                known.metadata, known.ended_at = meta, None
            else:
                self._episodes[new.id] = new
            self._current = new.id
            return self._episodes[new.id].episode()

    def end_episode(self) -> Episode | None:
        """End the current episode; returns it (``None`` if no episode was open)."""
        self._check_open()
        with self._lock:
            if self._current is None:
                return None
            cur = self._episodes[self._current]
            now = _utcnow()
            self._save([replace(cur, ended_at=now)])  # the snapshot only: memory follows
            cur.ended_at = now
            self._current = None
            return cur.episode()

    @property
    def current(self) -> Episode | None:
        """The open episode that :meth:`add` writes to (``None`` if there is none)."""
        with self._lock:
            return None if self._current is None else self._episodes[self._current].episode()

    def episodes(self) -> list[Episode]:
        """Every episode, oldest first."""
        with self._lock:
            return [s.episode() for s in self._episodes.values()]

    def get_episode(self, episode_id: str) -> Episode:
        """The episode ``episode_id``.

        Raises:
            KeyError: no such episode.
        """
        with self._lock:
            return self._state(episode_id).episode()

    def _state(self, episode_id: object) -> _State:
        state = self._episodes.get(episode_id) if isinstance(episode_id, str) else None
        if state is None:
            raise KeyError(f"no episode {episode_id!r} in this EpisodicMemory")
        return state

    def messages(self, episode_id: str | None = None) -> list[Message]:
        """The messages of ``episode_id`` (default: the current episode), in order.

        Raises:
            KeyError: no such episode.
        """
        self.sync()
        with self._lock:
            if episode_id is None:
                if self._current is None:
                    return []
                episode_id = self._current
            ids = list(self._state(episode_id).message_ids)
        return [self.rag.get(mid) for mid in ids if mid in self.rag]

    def __len__(self) -> int:
        """Number of episodes."""
        return len(self._episodes)

    # ------------------------------------------------------------------ writing
    def add(self, message: Message | str, **fields: Any) -> str:
        """Add a message to the current episode (starting one if none is open).

        A str becomes ``Message.user(text, **fields)``; with a Message, ``fields`` update a
        copy. The stored message carries ``metadata["episode_id"]``. Returns its id.

        Raises:
            EmbeddingError: the message has no text or is too long (nothing changed).
            DuplicateMessageError: its id is already stored (nothing changed).
        """
        self._check_open()
        if isinstance(message, str):
            base = Message.user(message, **fields)
        elif isinstance(message, Message):
            base = message.model_copy(update=fields) if fields else message
        else:
            raise TypeError(f"expected a Message or a str, got {type(message).__name__}")
        with self._lock:
            state: _State | None = None
            if self._current is not None:
                state = self._episodes[self._current]
            fresh = state is None
            if state is None:  # registered only once the message is stored
                state = _State(uuid.uuid4().hex, {}, _utcnow())
            stored = base.model_copy(update={"metadata": {**base.metadata, "episode_id": state.id}})
            mid = self.rag.add(stored)
            state.append(mid)
            if fresh:
                self._episodes[state.id] = state
                self._current = state.id
                self._save([state])  # if this fails, the next open rebuilds the episode
            return mid

    async def aadd(self, message: Message | str, **fields: Any) -> str:
        """Async twin of :meth:`add` (runs in a worker thread)."""
        return await asyncio.to_thread(self.add, message, **fields)

    def sync(self) -> list[str]:
        """Drop what was deleted from the store (cascades, other processes); returns ids.

        Episodes that lost a message lose their cached summary, as with :meth:`remove`.
        """
        if self._closed:
            return []
        gone = self.rag.sync()
        if gone:
            with self._lock:
                self._drop_locked(set(gone))
        return gone

    def _drop_locked(self, gone: set[str]) -> None:
        """Episodes lose ``gone`` and, where they had any, their cached summary."""
        changed = [state for state in self._episodes.values() if state.drop(gone)]
        for state in changed:
            state.summary = state.summary_of = None
        # if this write fails, the stale summary no longer matches its episode's
        # fingerprint when read back, so it is never served
        self._save(changed)

    def remove(self, ids: str | Iterable[str]) -> int:
        """Delete messages by id, from the store too; returns how many were removed.

        For privacy requests: the messages leave the store, the retrieval indexes and
        their episodes, and the cached summary of every episode that lost a message is
        dropped from its snapshot (it may quote them; :meth:`summaries` computes a new one).
        Episodes themselves stay, even when empty. Unknown ids are ignored.

        Raises:
            TypeError: ``ids`` is not a str or an iterable of str (``ids[i]`` named);
                nothing changed.

        Example:
            >>> from marsys_mem.retrieval.embeddings import HashingEmbedder
            >>> mem = EpisodicMemory(HashingEmbedder())
            >>> keep, drop = mem.add("Lunch at noon"), mem.add("My PIN is 1234")
            >>> mem.remove([drop, "unknown"]), [m.text for m in mem.messages()]
            (1, ['Lunch at noon'])
            >>> mem.close()
        """
        self._check_open()
        if isinstance(ids, str):
            wanted = [ids]
        elif isinstance(ids, Iterable) and not isinstance(ids, bytes | Mapping):
            wanted = list(ids)
        else:
            raise TypeError(f"ids must be a str or an iterable of str, got {type(ids).__name__}")
        for i, mid in enumerate(wanted):
            if not isinstance(mid, str):
                raise TypeError(f"ids[{i}] must be a str, got {type(mid).__name__} {mid!r}")
        with self._lock:
            self._check_open()
            present = [mid for mid in dict.fromkeys(wanted) if mid in self.rag]
            if not present:
                return 0
            removed = self.rag.remove(present)  # the store first: durable when it returns
            self._drop_locked(set(present))
            return removed

    # ------------------------------------------------------------------ recall
    def _recall_filter(self, episode_id: str | None) -> dict[str, Any] | None:
        if episode_id is None:
            return None
        with self._lock:
            self._state(episode_id)
        return {"episode_id": episode_id}

    def recall(
        self,
        query: str,
        k: int = 5,
        *,
        episode_id: str | None = None,
        min_score: float | None = DEFAULT_MIN_SCORE,
    ) -> list[ScoredMessage]:
        """Messages that match ``query`` by meaning (and keywords), best first.

        Args:
            query: the question or cue.
            k: how many messages at most.
            episode_id: search only this episode.
            min_score: drop hits whose calibrated score is below it (see
                :class:`~marsys_mem.patterns.rag.ScoredMessage`); ``None``: keep all.

        Raises:
            ValueError: an empty query or ``k <= 0``.
            KeyError: an unknown ``episode_id``.
        """
        self.sync()
        self._check_open()
        check_query(query)
        positive_int("k", k)
        meta = self._recall_filter(episode_id)
        return self.rag.search(query, k, min_score, metadata=meta)

    async def arecall(
        self,
        query: str,
        k: int = 5,
        *,
        episode_id: str | None = None,
        min_score: float | None = DEFAULT_MIN_SCORE,
    ) -> list[ScoredMessage]:
        """Async twin of :meth:`recall`."""
        self._check_open()
        check_query(query)
        positive_int("k", k)
        meta = self._recall_filter(episode_id)
        return await self.rag.asearch(query, k, min_score, metadata=meta)

    def recall_episodes(
        self, query: str, k: int = 3, *, min_score: float | None = DEFAULT_MIN_SCORE
    ) -> list[EpisodeMatch]:
        """The ``k`` episodes whose messages best match ``query``, ranked by their best hit.

        Raises:
            ValueError: an empty query or ``k <= 0``.
        """
        self.sync()
        self._check_open()
        check_query(query)
        positive_int("k", k)
        depth = max(4 * k, 20)
        while True:
            hits = self.rag.search(query, depth, min_score)
            matches = self._group(hits, k)
            if len(matches) >= k or len(hits) < depth or depth >= len(self.rag):
                return matches
            depth = min(4 * depth, len(self.rag))

    async def arecall_episodes(
        self, query: str, k: int = 3, *, min_score: float | None = DEFAULT_MIN_SCORE
    ) -> list[EpisodeMatch]:
        """Async twin of :meth:`recall_episodes` (runs in a worker thread)."""
        return await asyncio.to_thread(self.recall_episodes, query, k, min_score=min_score)

    def _group(self, hits: list[ScoredMessage], k: int) -> list[EpisodeMatch]:
        groups: dict[str, list[ScoredMessage]] = {}
        for hit in hits:  # best first: the first hit of an episode is its best
            eid = hit.message.metadata.get("episode_id")
            if isinstance(eid, str) and eid in self._episodes:
                groups.setdefault(eid, []).append(hit)
        with self._lock:
            return [
                EpisodeMatch(self._episodes[eid].episode(), found[0].score, tuple(found))
                for eid, found in list(groups.items())[:k]
                if eid in self._episodes
            ]

    # ------------------------------------------------------------------ summaries
    def _todo(self, episode_id: str | None) -> list[tuple[_State, str, list[str]]]:
        """Episodes to summarise: ``(state, fingerprint, message ids)`` of the stale ones."""
        with self._lock:
            states = (
                list(self._episodes.values()) if episode_id is None else [self._state(episode_id)]
            )
            return [
                (s, s.fingerprint(), list(s.message_ids))
                for s in states
                if s.cached_summary() is None
            ]

    def _apply(self, done: list[tuple[_State, str, str]]) -> None:
        """Cache computed summaries (in memory and in the store)."""
        if not done:
            return
        with self._lock:
            for state, fingerprint, text in done:
                state.summary, state.summary_of = text, fingerprint
            self._save(state for state, _, _ in done)

    def _results(self, episode_id: str | None) -> list[tuple[Episode, str]]:
        with self._lock:
            states = (
                list(self._episodes.values()) if episode_id is None else [self._state(episode_id)]
            )
            return [(s.episode(), s.summary or "") for s in states]

    def _inputs(self, ids: list[str]) -> list[Message]:
        return [self.rag.get(mid) for mid in ids if mid in self.rag]

    def summaries(self, episode_id: str | None = None) -> list[tuple[Episode, str]]:
        """One ``(episode, summary)`` per episode, oldest first (or only ``episode_id``).

        Summaries are cached: the summariser runs only for episodes that changed since
        their summary was made (also across restarts: summaries are stored). An episode
        with no messages has the summary ``""``.

        Raises:
            SummarizerError: the summariser failed, returned no str, or is async (use
                :meth:`asummaries`). Summaries finished before the failure are kept.
            KeyError: an unknown ``episode_id``.
        """
        self.sync()
        self._check_open()
        done: list[tuple[_State, str, str]] = []
        try:
            for state, fingerprint, ids in self._todo(episode_id):
                messages = self._inputs(ids)
                text = self._call_sync(messages) if messages else ""
                done.append((state, fingerprint, text))
        finally:
            self._apply(done)
        return self._results(episode_id)

    async def asummaries(self, episode_id: str | None = None) -> list[tuple[Episode, str]]:
        """Async twin of :meth:`summaries`; the summariser may be sync or async."""
        self._check_open()
        done: list[tuple[_State, str, str]] = []
        try:
            for state, fingerprint, ids in self._todo(episode_id):
                messages = self._inputs(ids)
                text = await self._call_async(messages) if messages else ""
                done.append((state, fingerprint, text))
        finally:
            await asyncio.to_thread(self._apply, done)
        return self._results(episode_id)

    def _call_sync(self, messages: list[Message]) -> str:
        result = call_sync(
            self.summarizer,
            messages,
            what="the summariser",
            use="asummaries()",
            error=SummarizerError,
        )
        return _check_summary(result)

    async def _call_async(self, messages: list[Message]) -> str:
        result = await acall(
            self.summarizer, messages, what="the summariser", error=SummarizerError
        )
        return _check_summary(result)

    # ------------------------------------------------------------------ lifecycle
    def flush(self, timeout: float | None = None) -> None:
        """Wait for pending embeddings and save the vector index (if ``index_path``)."""
        self._check_open()
        self.rag.flush(timeout)

    async def aflush(self, timeout: float | None = None) -> None:
        """Async twin of :meth:`flush`."""
        await asyncio.to_thread(self.flush, timeout)

    def close(self) -> None:
        """Flush and close the RAGMemory (and the store, if this memory made it). Idempotent.

        The current episode stays open in the store: a new memory on the same store resumes
        it. Call :meth:`end_episode` first to end it.
        """
        if self._closed:
            return
        self._closed = True
        try:
            rag = getattr(self, "rag", None)
            if rag is not None:
                rag.close()
        finally:
            if self._own_store:
                self.store.close()

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def __repr__(self) -> str:
        return (
            f"EpisodicMemory(episodes={len(self._episodes)}, messages={len(self.rag)}, "
            f"current={self._current!r})"
        )
