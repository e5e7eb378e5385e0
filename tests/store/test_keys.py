"""The one store-key scheme (store/keys.py): internal keys, their parsing, legacy keys."""

import pytest

from marsys_mem import Message
from marsys_mem.exceptions import InvalidNameError
from marsys_mem.store import InMemoryStore, SQLiteStore
from marsys_mem.store.base import Append
from marsys_mem.store.keys import FACTS_AGENT, TIERS, facts_key, internal_key, parse_key, stored_key
from marsys_mem.store.keys import validate_key as names_validate_key


def test_internal_keys_keep_the_old_spellings():
    key = ("team", "alice", "r1")
    assert internal_key(key, "rag") == ("team", "alice", "r1#rag")
    assert internal_key(key, "episodes") == ("team", "alice#r1#episodes", "episodes")
    assert [internal_key(key, "tiers", t) for t in TIERS] == [
        ("team", "alice#r1#tiers", "core"),
        ("team", "alice#r1#tiers", "working"),
        ("team", "alice#r1#tiers", "archive"),
    ]
    assert facts_key("team", "r1") == ("team", FACTS_AGENT, "r1") == ("team", "#facts", "r1")


def test_internal_key_rejects_bad_kind_and_part():
    with pytest.raises(ValueError, match="kind must be one of"):
        internal_key(("d", "a", "main"), "facts")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="part of a tiers key"):
        internal_key(("d", "a", "main"), "tiers")
    with pytest.raises(ValueError, match="part of a rag key must be None"):
        internal_key(("d", "a", "main"), "rag", "core")


@pytest.mark.parametrize(
    ("key", "kind", "agent", "branch", "part"),
    [
        (("d", "alice", "main"), "conversation", "alice", "main", None),
        (("d", "alice", "main#rag"), "rag", "alice", "main", None),
        (("d", "alice#r1#episodes", "episodes"), "episodes", "alice", "r1", None),
        (("d", "alice#r1#tiers", "archive"), "tiers", "alice", "r1", "archive"),
        (("d", "#facts", "r1"), "facts", None, "r1", None),
    ],
)
def test_parse_key_reads_every_kind(key, kind, agent, branch, part):
    info = parse_key(key)
    assert (info.kind, info.namespace, info.agent, info.branch, info.part) == (
        kind,
        "d",
        agent,
        branch,
        part,
    )
    assert info.key == key
    assert names_validate_key(info.key) == key  # the parsed key is usable with a store


@pytest.mark.parametrize(
    "key",
    [
        ("d", "alice", "main#rag#rag"),
        ("d", "alice#r1#tiers", "episodes"),
        ("d", "alice#r1#episodes", "core"),
        ("d", "alice#r1#other", "core"),
        ("d", "a#b#c#tiers", "core"),
        ("d", "#facts", "a#b"),
        ("d", "alice", "a@b"),
        ("d/x", "alice", "main"),
        ("d", "alice"),
        "d/alice/main",
    ],
)
def test_parse_key_rejects_what_no_helper_builds(key):
    with pytest.raises(InvalidNameError, match="store key"):
        parse_key(key)


def test_stores_accept_internal_keys_only_from_the_helpers(tmp_path):
    with SQLiteStore(tmp_path / "m.db") as store:
        built = internal_key(("d", "alice", "main"), "rag")
        store.append_messages(built, [Message.user("mine")])
        with pytest.raises(InvalidNameError, match="store key branch"):
            store.load_messages(("d", "alice", "main#rag"))
        [listed] = store.list_keys()
        assert listed == ("d", "alice", "main#rag")
        assert [m.text for m in store.load_messages(listed)] == ["mine"]
        assert [m.text for m in store.load_messages(parse_key(listed).key)] == ["mine"]


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_keys_written_before_the_rule_stay_readable(tmp_path, backend):
    """A store holding a key whose names break today's rule: listed, readable, deletable."""
    store = InMemoryStore() if backend == "memory" else SQLiteStore(tmp_path / "m.db")
    with store:
        # written as an older version did: it checked only for non-empty strings
        store._batch([Append(("d", "bob@example.com", "main"), (Message.user("old"),))])
        [legacy] = store.list_keys()
        assert legacy == ("d", "bob@example.com", "main")
        assert [m.text for m in store.load_messages(legacy)] == ["old"]
        with pytest.raises(InvalidNameError):
            store.load_messages(("d", "bob@example.com", "main"))  # spelled by hand
        assert store.delete_messages(legacy) == 1
        assert store.list_keys() == []
    assert stored_key(("d", "a", "main")) == ("d", "a", "main")


