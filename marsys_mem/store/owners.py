"""Ownership: every derived record names the messages it came from; deletions cascade.

In the transaction that deletes a message, whatever deletes it, every backend drops the
message's own source links, deletes each record left with no source (and, in turn, what
was derived from it), and logs the deletion (key and id, never text) so every reader, in
this process or another, drops what it cached before it reads. A record appended without
sources is owned by its key alone.

Guide: ``docs/guides/retention-and-stores.md#ownership-rules-for-backends``.

Example:
    >>> from marsys_mem.model.messages import Message
    >>> from marsys_mem.store import InMemoryStore
    >>> from marsys_mem.store.base import Append
    >>> store = InMemoryStore()
    >>> chat, rag = ("d", "alice", "main"), ("d", "alice", "notes")
    >>> msg = Message.user("my PIN is 1234")
    >>> store.append_messages(chat, [msg])
    >>> head = store.load_deletions().cursor
    >>> _ = store.batch([Append(rag, (msg,), sources=((Source(chat, msg.message_id),),))])
    >>> store.delete_messages(chat, [msg.message_id])
    1
    >>> store.count_messages(rag)
    0
    >>> [k[2] for k in store.load_deletions(after=head).keys]
    ['main', 'notes']
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from marsys_mem.store.keys import Key

__all__ = ["DELETION_LOG_SIZE", "DeletionFeed", "DeletionPage", "Source", "same_id"]

DELETION_LOG_SIZE: Final = 100_000
"""How many of the newest deletions a store's deletion log keeps (ids only)."""


@dataclass(frozen=True, slots=True)
class Source:
    """A message a derived record came from: the key it is stored under and its id.

    Example:
        >>> Source(("d", "alice", "main"), "m1").message_id
        'm1'
    """

    key: Key
    message_id: str


def same_id(owner: Key, message_ids: tuple[str, ...]) -> tuple[tuple[Source, ...], ...]:
    """``sources=`` for copies of messages of ``owner`` that keep their ids (one each).

    Example:
        >>> same_id(("d", "a", "main"), ("m1",))[0][0].key
        ('d', 'a', 'main')
    """
    return tuple((Source(owner, mid),) for mid in message_ids)


@dataclass(frozen=True, slots=True)
class DeletionPage:
    """Deletions after a cursor: ``keys[i]`` lost message ``message_ids[i]``.

    Attributes:
        keys: the key of each deleted message, in deletion order.
        message_ids: the id of each deleted message.
        cursor: pass it as ``after`` to read only later deletions.
        complete: ``False`` when the log no longer reaches back to the ``after`` given
            (older entries were pruned): the reader must reload what it holds.
    """

    keys: tuple[Key, ...]
    message_ids: tuple[str, ...]
    cursor: int
    complete: bool = True

    def __len__(self) -> int:
        return len(self.message_ids)

    @classmethod
    def of_rows(
        cls, rows: Sequence[Sequence[object]], *, head: int, after: int, first: object
    ) -> DeletionPage:
        """The page a backend read: ``rows`` of ``(cursor, namespace, agent, branch, id)``.

        ``head``: the log's newest cursor; ``first``: its oldest (``None``: empty log).
        """
        complete = first is None or after >= int(str(first)) - 1
        return cls(
            tuple((str(r[1]), str(r[2]), str(r[3])) for r in rows),
            tuple(str(r[4]) for r in rows),
            max(head, after),
            complete,
        )


class DeletionFeed:
    """A reader's place in a store's deletion log: what its cache must drop since last time.

    Made before the cache first reads the store (so no deletion falls between), then
    :meth:`poll` before each read. ``load`` is the store's ``load_deletions``.

    Example:
        >>> from marsys_mem.model.messages import Message
        >>> from marsys_mem.store import InMemoryStore
        >>> store = InMemoryStore()
        >>> store.append_messages(("d", "a", "main"), [Message.user("x", message_id="m1")])
        >>> feed = DeletionFeed(store.load_deletions, "d")
        >>> _ = store.delete_messages(("d", "a", "main"))
        >>> feed.poll()
        ({('d', 'a', 'main'): ['m1']}, True)
        >>> feed.poll()
        ({}, True)
    """

    def __init__(self, load: Callable[..., DeletionPage], namespace: str | None = None) -> None:
        self._load = load
        self.namespace = namespace
        self.cursor = load().cursor

    def poll(self) -> tuple[dict[Key, list[str]], bool]:
        """Deletions since the last poll, by key, and whether the log reached back that far.

        ``False``: older deletions were pruned from the log; the reader must reload.
        """
        page = self._load(self.cursor, namespace=self.namespace)
        self.cursor = page.cursor
        gone: dict[Key, list[str]] = {}
        for key, mid in zip(page.keys, page.message_ids, strict=True):
            gone.setdefault(key, []).append(mid)
        return gone, page.complete
