"""LoadAround reads exactly the turns RAGMemory's ranker walks: a property test per backend.

The reference is the ranker's own structure, :class:`~marsys_mem.retrieval.threads.ThreadLinks`
(linked in the key's order, by ``RAGMemory._thread_of``'s rule): for every stored id, the
``before`` turns before it and ``after`` turns after it in its thread.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marsys_mem.model.messages import Message
from marsys_mem.retrieval.threads import ThreadLinks
from marsys_mem.store import InMemoryStore, MemoryStore, SQLiteStore
from marsys_mem.store.base import ScoreAround
from marsys_mem.store.postgres import PostgresStore
from marsys_mem.testing.postgres import PostgresServer

_keys = itertools.count()
_THREADS = st.one_of(st.none(), st.sampled_from(["a", "b", "c"]), st.integers(0, 2))


def _reference(messages: list[Message], ids: list[str], before: int, after: int) -> list[str]:
    links = ThreadLinks()
    for m in messages:
        value = m.metadata.get("thread")
        links.add(m.message_id, "" if value is None else f"#{value}")
    picked: set[str] = set()
    for mid in ids:
        if mid in links:
            picked.update([mid, *links.before(mid, before), *links.after(mid, after)])
    return [m.message_id for m in messages if m.message_id in picked]


@pytest.fixture(scope="module", params=["memory", "sqlite", "postgres"])
def backend(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MemoryStore]:
    if request.param == "memory":
        store: MemoryStore = InMemoryStore()
    elif request.param == "sqlite":
        store = SQLiteStore(Path(tmp_path_factory.mktemp("around")) / "store.db")
    else:
        server: PostgresServer = request.getfixturevalue("pgvector_server")
        store = PostgresStore(server.create_schema("around"), max_size=2)
    yield store
    store.close()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    threads=st.lists(_THREADS, min_size=1, max_size=30),
    picks=st.lists(st.integers(0, 35), max_size=6),
    before=st.integers(0, 4),
    after=st.integers(0, 4),
)
def test_load_around_is_the_rankers_neighbourhood(
    backend: MemoryStore, threads: list[object], picks: list[int], before: int, after: int
) -> None:
    key = ("around", f"k{next(_keys)}", "main")
    messages = [
        Message.user(f"t{i}", message_id=f"m{i}", metadata={} if t is None else {"thread": t})
        for i, t in enumerate(threads)
    ]
    backend.append_messages(key, messages)
    ids = [f"m{i}" for i in picks]  # ids past the key's end are unknown: ignored
    got = [m.message_id for m in backend.load_around(key, ids, before, after)]
    assert got == _reference(messages, ids, before, after)


def test_nul_characters_neither_fail_an_append_nor_split_a_thread(backend: MemoryStore) -> None:
    """The thread index reads every stored message: a NUL in a text or a thread is fine."""
    key = ("around", f"k{next(_keys)}", "main")
    messages = [
        Message.user("a\x00b", message_id="n0", metadata={"thread": "x\x00"}),
        Message.user("other", message_id="n1", metadata={"thread": "y"}),
        Message.user("c\\u0000d", message_id="n2", metadata={"thread": "x\x00"}),
    ]
    backend.append_messages(key, messages)
    assert backend.load_around(key, ["n2"], 1, 0) == [messages[0], messages[2]]


@pytest.fixture(scope="module")
def searching(pgvector_server: PostgresServer) -> Iterator[PostgresStore]:
    """A PostgresStore that searches (pgvector): it runs ScoreAround."""
    store = PostgresStore(pgvector_server.create_schema("score_around"), max_size=2)
    assert store.supports_search
    yield store
    store.close()


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    threads=st.lists(_THREADS, min_size=1, max_size=30),
    picks=st.lists(st.integers(0, 35), max_size=6),
    alone=st.lists(st.integers(0, 35), max_size=6),
    before=st.integers(0, 4),
    after=st.integers(0, 4),
)
def test_score_around_reads_the_alone_ids_without_their_turns(
    searching: PostgresStore,
    threads: list[object],
    picks: list[int],
    alone: list[int],
    before: int,
    after: int,
) -> None:
    """``ScoreAround(alone=...)``: the ids' neighbourhoods and the alone ids' own rows."""
    key = ("around", f"k{next(_keys)}", "main")
    messages = [
        Message.user(f"t{i}", message_id=f"m{i}", metadata={} if t is None else {"thread": t})
        for i, t in enumerate(threads)
    ]
    searching.append_messages(key, messages)
    ids = [f"m{i}" for i in picks]
    lone = [f"m{i}" for i in alone]
    op = ScoreAround(key, tuple(ids), "none", np.ones(4, dtype=np.float32), before, after)
    rows = searching.batch([replace(op, alone=tuple(lone))])[0]
    known = {m.message_id for m in messages}
    wanted = set(_reference(messages, ids, before, after)) | {m for m in lone if m in known}
    assert [r.message_id for r in rows] == [
        m.message_id for m in messages if m.message_id in wanted
    ]
    assert all(r.cosine is None for r in rows)  # no vector of that model
    assert [r.position for r in rows] == sorted(r.position for r in rows)


def test_score_around_names_a_bad_alone_id(searching: PostgresStore) -> None:
    vector = np.ones(4, dtype=np.float32)
    op = ScoreAround(("a", "b", "c"), ("m1",), "none", vector, alone=("m2", ""))
    with pytest.raises(ValueError, match=r"alone\[1\]"):
        searching.batch([op])
    with pytest.raises(TypeError, match="alone must be a tuple"):
        searching.batch([replace(op, alone=["m2"])])
