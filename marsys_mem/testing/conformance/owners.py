"""Conformance: derived records follow their sources (:attr:`Capability.OWNERS`).

Clauses of :mod:`marsys_mem.store.owners`: deleting a message, whatever deletes it,
deletes in the same transaction every record derived only from it (and what was derived
from those); a record with another source left stays; every deletion is logged for
readers (``load_deletions``), key and id only.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from marsys_mem.model.messages import Message
from marsys_mem.store.base import Append, Delete, MemoryStore
from marsys_mem.store.owners import Source, same_id
from marsys_mem.testing.conformance.data import KEY, OTHER_KEY, T0, user_messages
from marsys_mem.testing.conformance.harness import StoreHarness

__all__ = ["OwnersConformance"]

COPIES = ("default", "researcher", "copies")
FACTS = ("default", "facts", "alice")


def _copy(store: MemoryStore, messages: list[Message], into: tuple[str, str, str] = COPIES) -> None:
    """Copies of ``KEY``'s messages, each linked to its source by ``sources``."""
    ids = tuple(m.message_id for m in messages)
    store.batch([Append(into, tuple(messages), sources=same_id(KEY, ids))])


def _copy_key(store: MemoryStore, messages: list[Message]) -> None:
    """Copies of ``KEY``'s messages in a key that holds copies of it (``copies_of``)."""
    store.batch([Append(COPIES, tuple(messages), copies_of=KEY)])


class OwnersConformance(StoreHarness):
    """Cascading deletes through source links, and the deletion log.

    Example:
        >>> import pytest
        >>> from marsys_mem.store import InMemoryStore
        >>> class TestOwners(OwnersConformance):
        ...     @pytest.fixture
        ...     def store(self):
        ...         with InMemoryStore() as s:
        ...             yield s
    """

    def test_delete_by_id_cascades(self, store: MemoryStore) -> None:
        """A record derived only from a deleted message is deleted with it.

        Checks: the copy of the deleted message goes, the others stay; the source key
        and the copy key both lose one.
        """
        msgs = user_messages(3)
        store.append_messages(KEY, msgs)
        _copy(store, msgs)
        assert store.delete_messages(KEY, ids=["m1"]) == 1
        assert [m.message_id for m in store.load_messages(COPIES)] == ["m0", "m2"]

    @pytest.mark.parametrize("how", ["key", "ttl", "bound", "before"])
    def test_every_deletion_cascades(self, store: MemoryStore, how: str) -> None:
        """Deleting a message for any reason deletes what was derived from it.

        Checks: a whole key, the ttl, ``max_messages`` and ``before`` all cascade.
        """
        msgs = user_messages(4)  # timestamps T0 + 0..3 s
        store.append_messages(KEY, msgs)
        _copy(store, msgs)
        if how == "key":
            store.delete_messages(KEY)
        elif how == "ttl":
            store.enforce_retention(KEY, ttl=timedelta(seconds=1), now=T0 + timedelta(seconds=3))
        elif how == "bound":
            store.enforce_retention(KEY, max_messages=1)
        else:
            store.delete_messages(KEY, before=T0 + timedelta(seconds=3))
        left = [m.message_id for m in store.load_messages(KEY)]
        assert [m.message_id for m in store.load_messages(COPIES)] == left

    @pytest.mark.parametrize("how", ["ids", "key", "ttl", "bound"])
    def test_copies_of_a_key_follow_it(self, store: MemoryStore, how: str) -> None:
        """``copies_of``: a key's copies (same ids) go with the messages they copy.

        Checks: by ids, a whole key, the ttl and the bound; a record of the copies' key
        whose id is not in the owner stays; copies appended later are covered too.
        """
        msgs = user_messages(4)
        store.append_messages(KEY, msgs)
        _copy_key(store, msgs[:2])
        store.append_messages(COPIES, [msgs[2], Message.user("own", message_id="x")])
        if how == "ids":
            store.delete_messages(KEY, ids=["m0", "m2"])
        elif how == "key":
            store.delete_messages(KEY)
        elif how == "ttl":
            store.enforce_retention(KEY, ttl=timedelta(seconds=1), now=T0 + timedelta(seconds=3))
        else:
            store.enforce_retention(KEY, max_messages=1)
        left = {m.message_id for m in store.load_messages(KEY)}
        copies = sorted(m.message_id for m in store.load_messages(COPIES))
        assert copies == sorted([*(i for i in ("m0", "m1", "m2") if i in left), "x"])

    def test_copies_of_validated(self, store: MemoryStore) -> None:
        """``copies_of`` must be another key.

        Checks: a key holding copies of itself is refused; nothing is written.
        """
        with pytest.raises(ValueError, match="copies of itself"):
            store.batch([Append(KEY, tuple(user_messages(1)), copies_of=KEY)])
        assert store.count_messages(KEY) == 0

    def test_record_with_another_source_stays(self, store: MemoryStore) -> None:
        """A record stays while one of its sources remains, and goes with the last.

        Checks: a fact learned from two messages of two keys survives the first
        deletion and not the second.
        """
        a, b = user_messages(2)
        store.append_messages(KEY, [a])
        store.append_messages(OTHER_KEY, [b])
        fact = Message.system("User likes tea", message_id="f1")
        sources = (Source(KEY, a.message_id), Source(OTHER_KEY, b.message_id))
        store.batch([Append(FACTS, (fact,), sources=(sources,))])
        store.delete_messages(KEY)
        assert store.count_messages(FACTS) == 1
        store.delete_messages(OTHER_KEY, ids=[b.message_id])
        assert store.count_messages(FACTS) == 0

    def test_cascade_cascades(self, store: MemoryStore) -> None:
        """What was derived from a derived record goes with it (and its vectors).

        Checks: message -> copy -> fact; deleting the message deletes both.
        """
        msgs = user_messages(1)
        store.append_messages(KEY, msgs)
        _copy(store, msgs)
        fact = Message.system("from the copy", message_id="f1")
        store.batch([Append(FACTS, (fact,), sources=((Source(COPIES, "m0"),),))])
        store.delete_messages(KEY)
        assert store.count_messages(COPIES) == 0
        assert store.count_messages(FACTS) == 0
        assert store.list_keys() == []

    def test_unowned_records_and_own_deletes(self, store: MemoryStore) -> None:
        """A record without sources is only its key's; a record's own delete unlinks it.

        Checks: deleting a source does not touch a record appended without sources, nor
        one re-appended without sources after its own deletion.
        """
        msgs = user_messages(2)
        store.append_messages(KEY, msgs)
        _copy(store, msgs[:1])
        store.append_messages(COPIES, [msgs[1]])  # no sources: an archive entry
        store.batch([Delete(COPIES, ("m0",)), Append(COPIES, (msgs[0],))])
        store.delete_messages(KEY)
        assert sorted(m.message_id for m in store.load_messages(COPIES)) == ["m0", "m1"]

    def test_failed_batch_links_nothing(self, store: MemoryStore) -> None:
        """A batch that fails adds no links and logs no deletions.

        Checks: after a failed batch that deleted and appended with sources, deleting
        the source leaves the pre-existing copy alone (it has no sources).
        """
        msgs = user_messages(2)
        store.append_messages(KEY, msgs)
        store.append_messages(COPIES, msgs[:1])
        head = store.load_deletions().cursor
        with pytest.raises(Exception, match="already stored"):
            store.batch(
                [
                    Delete(KEY, ("m1",)),
                    Append(COPIES, (msgs[1],), sources=same_id(KEY, ("m1",))),
                    Append(COPIES, (msgs[0],), sources=same_id(KEY, ("m0",))),
                ]
            )
        assert store.load_deletions(after=head).message_ids == ()
        store.delete_messages(KEY)
        assert [m.message_id for m in store.load_messages(COPIES)] == ["m0"]

    def test_sources_validated(self, store: MemoryStore) -> None:
        """Malformed sources are refused before anything is written.

        Checks: a count that is not one per message, and a non-Source item.
        """
        msgs = user_messages(2)
        with pytest.raises(ValueError, match="one tuple per message"):
            store.batch([Append(COPIES, tuple(msgs), sources=same_id(KEY, ("m0",)))])
        with pytest.raises(TypeError, match=r"sources\[0\]\[0\] must be a Source"):
            store.batch([Append(COPIES, tuple(msgs[:1]), sources=((("k", "m0"),),))])  # type: ignore[arg-type]
        assert store.count_messages(COPIES) == 0

    def test_deletion_log(self, store: MemoryStore) -> None:
        """``load_deletions``: every deleted message, key and id, in order, after a cursor.

        Checks: ``after=None`` gives the head only; cascaded deletions are logged; the
        namespace filter; a later cursor sees only later deletions.
        """
        msgs = user_messages(2)
        store.append_messages(KEY, msgs)
        _copy(store, msgs)
        store.append_messages(("other", "a", "main"), user_messages(1))
        head = store.load_deletions()
        assert head.message_ids == ()
        assert head.complete
        store.delete_messages(KEY, ids=["m0"])
        store.delete_messages(("other", "a", "main"))
        page = store.load_deletions(after=head.cursor)
        assert sorted(zip(page.keys, page.message_ids, strict=True)) == sorted(
            [(KEY, "m0"), (COPIES, "m0"), (("other", "a", "main"), "m0")]
        )
        assert page.complete
        assert page.cursor > head.cursor
        only = store.load_deletions(after=head.cursor, namespace="other")
        assert only.keys == (("other", "a", "main"),)
        assert store.load_deletions(after=page.cursor).message_ids == ()
