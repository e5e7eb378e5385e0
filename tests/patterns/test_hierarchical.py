import asyncio
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from marsys_mem.context.policy import ContextPolicy
from marsys_mem.context.tokens import HeuristicCounter, count_message
from marsys_mem.exceptions import (
    ContextOverflowError,
    DuplicateMessageError,
    EmbeddingError,
    MessageNotFoundError,
    StoreError,
)
from marsys_mem.model.messages import Message, ToolCall
from marsys_mem.patterns.hierarchical import HierarchicalMemory
from marsys_mem.patterns.importance import default_importance
from marsys_mem.patterns.rag import RAGMemory
from marsys_mem.retrieval.embeddings import HashingEmbedder
from marsys_mem.store import InMemoryStore, SQLiteStore

PREFIX = ("ns", "agent")
COUNTER = HeuristicCounter()


def tokens(messages):
    return sum(count_message(COUNTER, m) for m in messages)


@pytest.fixture
def mem():
    m = HierarchicalMemory(HashingEmbedder(), working_size=3)
    yield m
    m.close()


def texts(messages):
    return [m.text for m in messages]


def view(messages):
    """Roles and texts (a snippet message is built afresh, with a new id, on every call)."""
    return [(m.role, m.text) for m in messages]


# --------------------------------------------------------------------- importance


def test_default_importance_heuristic():
    assert default_importance(Message.system("Be terse.")) == 1.0
    assert default_importance(Message.user("whatever", pinned=True)) == 1.0
    assert default_importance(Message.user("x", metadata={"preserve": True})) == 1.0
    assert default_importance(Message.user("hi there", metadata={"importance": 0.42})) == 0.42
    chit = default_importance(Message.user("thanks, cool!"))
    plain = default_importance(Message.user("the weather was nice for a walk in the park"))
    fact = default_importance(Message.user("My sister Clara moved to Lisbon in 2021"))
    remember = default_importance(Message.user("Please remember that my locker code is 4471"))
    assert chit == 0.1
    assert chit < plain < fact < remember
    assert remember >= 0.8 > fact  # default threshold: remember-requests go to core
    decision = default_importance(Message.user("We decided the budget is 4000 EUR"))
    assert decision > plain
    for text in ["", "ok", "Remember! Always! Never! 1 2 3 Alice decided"]:
        assert 0.0 <= default_importance(Message.user(text)) <= 1.0
    # out-of-range or NaN metadata importance is ignored, not trusted
    assert default_importance(Message.user("hey", metadata={"importance": 7})) == 0.1


def test_importance_decides_the_tier(mem):
    sys_id = mem.add(Message.system("You are a travel assistant."))
    core_id = mem.add("Remember: my passport number is X1234567")
    low_id = mem.add("Let's talk about the weather", importance=0.3)
    high_id = mem.add("ok", importance=0.8)  # explicit importance wins over the scorer
    pinned_id = mem.add(Message.user("keep this", pinned=True), importance=0.0)
    assert [m.message_id for m in mem.core()] == [sys_id, core_id, high_id, pinned_id]
    assert [m.message_id for m in mem.working()] == [low_id]
    assert mem.get(low_id).metadata["importance"] == 0.3
    assert mem.get(core_id).metadata["importance"] >= 0.8
    assert mem.tier_of(high_id) == "core"
    assert mem.tier_of("nope") is None
    assert len(mem) == 5
    assert low_id in mem


def test_scorer_is_pluggable():
    seen = []

    def scorer(m):
        seen.append(m.text)
        return 1.0 if "vip" in m.text else 0.0

    with HierarchicalMemory(HashingEmbedder(), scorer=scorer, core_threshold=0.5) as mem:
        mem.add("a vip fact")
        mem.add("Remember: a regular fact 42")  # the default heuristic would make it core
        mem.add("given", importance=0.9)  # the scorer is not consulted
        assert texts(mem.core()) == ["a vip fact", "given"]
        assert texts(mem.working()) == ["Remember: a regular fact 42"]
        assert seen == ["a vip fact", "Remember: a regular fact 42"]


@pytest.mark.parametrize("bad", [-0.1, 1.01, math.nan, math.inf, -math.inf])
def test_bad_importance_is_rejected_and_changes_nothing(mem, bad):
    mem.add("something", importance=0.5)
    before = (mem.core(), mem.working(), len(mem.archive))
    with pytest.raises(ValueError, match=r"importance must be a number in \[0, 1\]"):
        mem.add("another", importance=bad)
    assert (mem.core(), mem.working(), len(mem.archive)) == before
    assert mem.store.count_messages(mem.working_key) == 1
    assert mem.store.count_messages(mem.core_key) == 0


@pytest.mark.parametrize("bad", ["high", True, [0.5]])
def test_importance_of_the_wrong_type(mem, bad):
    with pytest.raises(TypeError, match="importance must be a number"):
        mem.add("x", importance=bad)
    assert len(mem) == 0


@pytest.mark.parametrize("bad", [math.nan, 2.0, -1, "0.5"])
def test_bad_scorer_output_is_rejected(bad):
    with HierarchicalMemory(HashingEmbedder(), scorer=lambda m: bad) as mem:
        with pytest.raises(ValueError, match="scorer"):
            mem.add("hello there")
        assert len(mem) == 0


def test_constructor_validation():
    with pytest.raises(ValueError, match="core_threshold"):
        HierarchicalMemory(None, core_threshold=1.5)
    with pytest.raises(ValueError, match="core_threshold"):
        HierarchicalMemory(None, core_threshold=math.nan)
    with pytest.raises(ValueError, match="working_size"):
        HierarchicalMemory(None, working_size=0)
    with pytest.raises(ValueError, match="key_prefix"):
        HierarchicalMemory(None, key_prefix=("only-one",))
    with pytest.raises(ValueError, match="store key"):
        HierarchicalMemory(None, key_prefix=("ns", ""))
    with pytest.raises(TypeError, match="scorer"):
        HierarchicalMemory(None, scorer=0.5)
    with pytest.raises(TypeError, match="archive"):
        HierarchicalMemory(None, archive=InMemoryStore())


def test_bad_messages_change_nothing(mem):
    mid = mem.add("first", importance=0.1)
    with pytest.raises(DuplicateMessageError):
        mem.add(mem.get(mid))
    with pytest.raises(TypeError, match="Message or a str"):
        mem.add(42)
    with pytest.raises(EmbeddingError, match="max_chars"):
        mem.add("x" * (mem.archive.ingest.max_chars + 1))
    assert texts(mem.working()) == ["first"]
    assert len(mem) == 1


# --------------------------------------------------------------------- overflow


def test_overflow_moves_the_oldest_working_messages_to_the_archive(mem):
    ids = [
        mem.add(text, importance=0.5)
        for text in [
            "We booked the hotel in Porto for May",
            "The dentist appointment is on Tuesday",
            "Lunch was a ramen bowl",
            "The flight leaves at 9am",
            "My laptop battery is dying",
        ]
    ]
    assert [m.message_id for m in mem.working()] == ids[2:]
    assert [m.message_id for m in mem.archive.messages()] == ids[:2]
    assert mem.tier_of(ids[0]) == "archive"
    assert mem.get(ids[0]).text == "We booked the hotel in Porto for May"
    hit = mem.archive_search("which hotel did we book in Porto?", k=1)[0]
    assert hit.id == ids[0]
    assert mem.store.count_messages(mem.working_key) == 3
    assert len(mem) == 5


def test_tool_call_groups_move_together():
    with HierarchicalMemory(HashingEmbedder(), working_size=2) as mem:
        call = ToolCall(id="c1", name="weather", arguments={"city": "Tokyo"})
        a = mem.add(Message.assistant("", tool_calls=[call]), importance=0.2)
        r = mem.add(Message.tool("72F and sunny", tool_call_id="c1", name="weather"), 0.2)
        assert [m.message_id for m in mem.working()] == [a, r]
        u = mem.add("thanks", importance=0.2)
        # the call and its result leave together; no orphan result stays behind
        assert [m.message_id for m in mem.working()] == [u]
        assert set(m.message_id for m in mem.archive.messages()) == {a, r}
        archived_call = mem.archive.get(a)
        assert "weather" in archived_call.text
        assert archived_call.tool_calls == (call,)
        assert mem.archive_search("Tokyo weather", k=2)


def test_tool_results_follow_their_call_into_core():
    with HierarchicalMemory(HashingEmbedder()) as mem:
        call = ToolCall(id="c1", name="lookup", arguments={"id": 7})
        mem.add(Message.assistant("Remember: looking up order 7", tool_calls=[call]))
        result = mem.add(Message.tool("shipped", tool_call_id="c1"), importance=0.1)
        assert mem.tier_of(result) == "core"
        assert [m.role for m in mem.context()] == ["assistant", "tool"]


def test_newest_group_never_leaves_working():
    with HierarchicalMemory(HashingEmbedder(), working_size=1) as mem:
        call = ToolCall(id="c1", name="search", arguments={"q": "x"})
        a = mem.add(Message.assistant("searching", tool_calls=[call]), importance=0.1)
        r = mem.add(Message.tool("result", tool_call_id="c1"), importance=0.1)
        assert [m.message_id for m in mem.working()] == [a, r]  # the newest group stays whole
        n = mem.add("next", importance=0.1)
        assert [m.message_id for m in mem.working()] == [n]


def test_failed_archive_write_changes_nothing(mem):
    for i in range(3):
        mem.add(f"message number {i}", importance=0.1)
    before = mem.working()
    real = mem.store.batch

    def flaky(ops):
        ops = list(ops)
        if any(getattr(op, "key", None) == mem.working_key for op in ops):
            raise StoreError("disk full")
        return real(ops)

    mem.store.batch = flaky  # the working-memory write fails after the archive write
    with pytest.raises(StoreError, match="disk full"):
        mem.add("one too many", importance=0.1)
    del mem.store.batch
    assert mem.working() == before
    assert len(mem.archive) == 0
    assert mem.store.count_messages(mem.archive.key) == 0


# --------------------------------------------------------------------- context


def fill(mem):
    core = mem.add(Message.system("You are a travel assistant."))
    for text in [
        "We booked the hotel in Porto for May",
        "The hotel has a rooftop pool",
        "Hotel breakfast starts at seven",
        "The museum opens at ten",
        "Dinner reservation at eight",
        "Taxi to the airport at noon",
    ]:
        mem.add(text, importance=0.4)
    return core


def test_context_is_core_then_snippets_then_working(mem):
    fill(mem)
    ctx = mem.context("hotel in Porto", k=2)
    assert [m.role for m in ctx] == ["system", "system", "user", "user", "user"]
    assert ctx[0].text == "You are a travel assistant."
    snippet = ctx[1]
    assert snippet.name == "archival_memory"
    assert "We booked the hotel in Porto for May" in snippet.text
    assert len(snippet.metadata["archive_ids"]) == 2
    assert ctx[2:] == mem.working()
    assert [m.role for m in mem.context()] == ["system", "user", "user", "user"]


def test_context_budget_drops_snippets_first_then_oldest_working(mem):
    fill(mem)
    core, working = mem.core(), mem.working()
    full = mem.context("hotel", k=3)
    snippet = full[1]
    assert len(snippet.metadata["archive_ids"]) == 3
    budget = tokens(full)
    assert view(mem.context("hotel", k=3, policy=ContextPolicy(max_tokens=budget))) == view(full)
    # one token less: the lowest-ranked snippet goes first
    fewer = mem.context("hotel", k=3, policy=ContextPolicy(max_tokens=budget - 1))
    assert fewer[1].metadata["archive_ids"] == snippet.metadata["archive_ids"][:2]
    assert fewer[2:] == working
    # no room for any snippet: core + all working
    tight = tokens(core) + tokens(working)
    ctx = mem.context("hotel", k=3, policy=ContextPolicy(max_tokens=tight))
    assert ctx == core + working
    # then the oldest working messages go
    ctx = mem.context("hotel", k=3, policy=ContextPolicy(max_tokens=tight - 1))
    assert ctx == core + working[1:]
    assert tokens(ctx) <= tight - 1
    # only core fits: core is never dropped
    ctx = mem.context("hotel", policy=ContextPolicy(max_tokens=tokens(core)))
    assert ctx == core
    ctx = mem.context("hotel", policy=ContextPolicy(max_messages=2))
    assert ctx == core + working[-1:]


def test_context_raises_when_core_alone_does_not_fit(mem):
    fill(mem)
    need = tokens(mem.core())
    with pytest.raises(ContextOverflowError, match="core memory") as err:
        mem.context(policy=ContextPolicy(max_tokens=need - 1))
    assert err.value.required == need
    assert err.value.limit == need - 1
    mem.add("Remember: the second core message 12", importance=1.0)
    with pytest.raises(ContextOverflowError, match="messages"):
        mem.context(policy=ContextPolicy(max_messages=1))


def test_context_never_sends_an_orphan_tool_result():
    with HierarchicalMemory(HashingEmbedder(), working_size=5) as mem:
        c1 = ToolCall(id="c1", name="weather", arguments={"city": "Oslo"})
        mem.add(Message.assistant("checking", tool_calls=[c1]), importance=0.2)
        mem.add(Message.tool("-3C", tool_call_id="c1"), importance=0.2)
        mem.add("and tomorrow?", importance=0.2)
        working = mem.working()
        assert mem.context() == working
        # budget for the last message only: the call/result pair goes as a unit
        ctx = mem.context(policy=ContextPolicy(max_tokens=tokens(working[-1:])))
        assert ctx == working[-1:]
        # demoting the call leaves its result an orphan in working: it is not sent
        mem.demote(working[0].message_id)
        assert mem.context() == working[2:]


def test_context_bad_input(mem):
    fill(mem)
    with pytest.raises(ValueError, match="query"):
        mem.context("")
    with pytest.raises(ValueError, match="query"):
        mem.archive_search("   ")
    with pytest.raises(ValueError, match="k must be"):
        mem.context("hotel", k=0)
    with pytest.raises(ValueError, match="k must be"):
        mem.archive_search("hotel", k=-1)
    with pytest.raises(TypeError, match="ContextPolicy"):
        mem.context(policy={"max_tokens": 10})


async def test_async_twins(mem):
    await mem.aadd("We booked the hotel in Porto", importance=0.3)
    for i in range(3):
        await mem.aadd(f"filler {i}", importance=0.3)
    hits = await mem.aarchive_search("hotel Porto", k=1)
    assert hits[0].text == "We booked the hotel in Porto"
    ctx, sync = await mem.acontext("hotel", k=1), mem.context("hotel", k=1)
    assert texts(ctx) == texts(sync)
    assert len(ctx) == 4
    await mem.aflush()
    results = await asyncio.gather(*(mem.aadd(f"c{i}", importance=0.3) for i in range(5)))
    assert len(set(results)) == 5
    assert len(mem.working()) == 3


# --------------------------------------------------------------------- promote / demote


def test_promote_and_demote(mem):
    ids = [mem.add(f"note {i} about topic {i}", importance=0.2) for i in range(5)]
    archived, working = ids[0], ids[3]
    assert mem.tier_of(archived) == "archive"
    assert mem.promote(working) == "core"
    assert mem.tier_of(working) == "core"
    assert working not in {m.message_id for m in mem.working()}
    assert mem.promote(archived) == "core"
    assert archived not in mem.archive
    assert mem.tier_of(archived) == "core"
    assert mem.promote(archived) == "core"  # already there: no-op
    assert mem.demote(working) == "working"
    assert mem.working()[-1].message_id == working  # the newest working message
    assert mem.demote(working) == "archive"
    assert mem.tier_of(working) == "archive"
    with pytest.raises(ValueError, match="already in the archive"):
        mem.demote(working)
    sys_id = mem.add(Message.system("rules"))
    with pytest.raises(ValueError, match="stays in core"):
        mem.demote(sys_id)
    with pytest.raises(MessageNotFoundError):
        mem.promote("missing")
    with pytest.raises(MessageNotFoundError):
        mem.demote("missing")
    assert mem.store.count_messages(mem.core_key) == len(mem.core()) == 2
    assert mem.store.count_messages(mem.working_key) == len(mem.working())


def test_demote_to_a_full_working_memory_archives_the_oldest(mem):
    ids = [mem.add(f"working {i}", importance=0.2) for i in range(3)]
    core = mem.add("core fact", importance=0.95)
    assert mem.demote(core) == "working"
    assert [m.message_id for m in mem.working()] == [*ids[1:], core]
    assert mem.tier_of(ids[0]) == "archive"


# --------------------------------------------------------------------- persistence


def open_mem(tmp_path, **kwargs):
    store = SQLiteStore(tmp_path / "mem.db")
    kwargs.setdefault("working_size", 3)
    mem = HierarchicalMemory(
        HashingEmbedder(),
        store=store,
        key_prefix=PREFIX,
        index_path=tmp_path / "archive.index",
        **kwargs,
    )
    return store, mem


def test_persistence_across_a_restart(tmp_path):
    store, mem = open_mem(tmp_path)
    fill(mem)
    promoted = mem.working()[0].message_id
    mem.promote(promoted)
    core, working = mem.core(), mem.working()
    archived = sorted(m.message_id for m in mem.archive.messages())
    ctx = mem.context("hotel", k=2)
    mem.close()
    assert not store.closed  # a given store stays open
    store.close()

    store, mem = open_mem(tmp_path)
    assert mem.core() == core
    assert mem.working() == working
    assert sorted(m.message_id for m in mem.archive.messages()) == archived
    again = mem.context("hotel", k=2)
    n = len(core)
    assert again[:n] == ctx[:n] == core
    assert again[n + 1 :] == ctx[n + 1 :] == working
    assert again[n].text == ctx[n].text
    assert mem.archive_search("hotel in Porto", k=1)[0].text.startswith("We booked the hotel")
    mem.close()
    store.close()


def test_index_rebuilt_after_the_index_file_is_deleted(tmp_path):
    store, mem = open_mem(tmp_path)
    fill(mem)
    mem.close()
    store.close()
    (tmp_path / "archive.index").unlink()
    store, mem = open_mem(tmp_path)
    assert mem.archive_search("hotel in Porto", k=1, min_score=None)[0].text.startswith("We booked")
    mem.close()
    store.close()


def test_reopen_resolves_a_message_left_in_two_tiers(tmp_path):
    store, mem = open_mem(tmp_path)
    w = Message.user("in working and archive", metadata={"importance": 0.2})
    c = Message.user("in core and archive", metadata={"importance": 0.9})
    both = Message.user("in core and working", metadata={"importance": 0.9})
    mem.archive.add_many([w, c])
    mem.close()
    store.append_messages((*PREFIX, "working"), [w, both])
    store.append_messages((*PREFIX, "core"), [c, both])
    store.close()

    store, mem = open_mem(tmp_path)
    assert texts(mem.core()) == ["in core and archive", "in core and working"]
    assert mem.working() == []
    assert texts(mem.archive.messages()) == ["in working and archive"]
    assert store.count_messages((*PREFIX, "working")) == 0
    mem.close()
    store.close()


def test_smaller_working_size_on_reopen_archives_the_excess(tmp_path):
    store, mem = open_mem(tmp_path, working_size=5)
    ids = [mem.add(f"item {i}", importance=0.1) for i in range(5)]
    mem.close()
    store.close()
    store, mem = open_mem(tmp_path, working_size=2)
    assert [m.message_id for m in mem.working()] == ids[3:]
    assert mem.tier_of(ids[0]) == "archive"
    mem.close()
    store.close()


def test_given_archive_is_used_and_left_open():
    archive = RAGMemory(HashingEmbedder(), key=("x", "y", "z"))
    mem = HierarchicalMemory(archive=archive, working_size=1)
    mem.add("first one", importance=0.1)
    mem.add("second one", importance=0.1)
    assert texts(archive.messages()) == ["first one"]
    mem.close()
    mem.close()  # idempotent
    assert not archive.closed
    with pytest.raises(StoreError, match="closed"):
        mem.add("late")
    with pytest.raises(ValueError, match="index_path"):
        HierarchicalMemory(archive=archive, index_path="x.index")
    archive.close()


def test_default_embedder_falls_back_or_uses_the_model(monkeypatch):
    from marsys_mem.patterns import rag as rag_module

    monkeypatch.setattr(rag_module, "default_embedder", lambda: HashingEmbedder(32))
    with HierarchicalMemory() as mem:
        assert mem.archive.embedder is not None
        assert mem.archive.embedder.dim == 32


# --------------------------------------------------------------------- properties

units = st.lists(
    st.tuples(
        st.sampled_from(["plain", "tool", "system"]),
        st.text(alphabet="abcdefgh ", min_size=1, max_size=40).filter(str.strip),
        st.floats(min_value=0.0, max_value=1.0),
    ),
    max_size=12,
)


@given(spec=units, budget=st.integers(min_value=1, max_value=300), size=st.integers(1, 6))
def test_context_always_fits_or_raises_for_core(spec, budget, size):
    mem = HierarchicalMemory(
        archive=RAGMemory(None, background=False), working_size=size, core_threshold=0.9
    )
    try:
        for i, (kind, text, importance) in enumerate(spec):
            if kind == "system":
                mem.add(Message.system(text))
            elif kind == "tool":
                call = ToolCall(id=f"c{i}", name="t")
                mem.add(Message.assistant(text, tool_calls=[call]), importance=importance)
                mem.add(Message.tool(text, tool_call_id=f"c{i}"), importance=importance)
            else:
                mem.add(text, importance=importance)
        assert len(mem.working()) <= max(size, 2)
        core = mem.core()
        query = spec[0][1] if spec else None
        policy = ContextPolicy(max_tokens=budget)
        if tokens(core) > budget:
            with pytest.raises(ContextOverflowError, match="core memory") as err:
                mem.context(query, k=2, policy=policy)
            assert err.value.required == tokens(core)
            return
        ctx = mem.context(query, k=2, policy=policy)
        assert tokens(ctx) <= budget
        assert ctx[: len(core)] == core
        rest = ctx[len(core) :]
        if rest and rest[0].name == "archival_memory":
            rest = rest[1:]
        working = mem.working()
        assert rest == working[len(working) - len(rest) :]  # a suffix of working
        call_ids = {c.id for m in ctx for c in m.tool_calls}
        assert all(m.tool_call_id in call_ids for m in ctx if m.role == "tool")
    finally:
        mem.close()


# --------------------------------------------------------------------- real model


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("sentence_transformers", reason="needs the embeddings extra")
    import torch

    from marsys_mem.retrieval.embeddings import SentenceTransformerEmbedder

    torch.set_num_threads(1)
    emb = SentenceTransformerEmbedder()
    emb.embed(["warm up"])
    return emb


def test_minilm_archive_finds_a_paraphrase(minilm):
    with HierarchicalMemory(minilm, working_size=2) as mem:
        mem.add("My puppy is called Biscuit", importance=0.3)
        for text in [
            "The quarterly report is due on Friday afternoon.",
            "It rained all day, so I stayed home and read a novel.",
            "Let's grab lunch at the new ramen place downtown.",
        ]:
            mem.add(text, importance=0.3)
        assert mem.tier_of(mem.archive.messages()[0].message_id) == "archive"
        hits = mem.archive_search("What is the name of my dog?", k=1)
        assert hits[0].text == "My puppy is called Biscuit"
        ctx = mem.context("What is the name of my dog?", k=1)
        assert "My puppy is called Biscuit" in ctx[0].text


# --------------------------------------------------------------------- remove


def test_remove_from_every_tier_is_durable(tmp_path):
    store, mem = open_mem(tmp_path)
    fill(mem)
    core = mem.add("My passport number is X1234567", importance=0.95)
    archived = mem.archive.messages()[0].message_id
    working = mem.working()[-1].message_id
    assert [mem.tier_of(m) for m in (core, working, archived)] == ["core", "working", "archive"]
    before = len(mem)
    assert mem.remove([core, working, archived, "no-such-id", core]) == 3
    assert len(mem) == before - 3
    assert all(m not in mem for m in (core, working, archived))
    assert mem.remove(core) == 0
    assert all("X1234567" not in m.text for m in mem.context("passport number", k=5))
    mem.close()
    store.close()

    store, mem = open_mem(tmp_path)
    assert len(mem) == before - 3
    assert all(m not in mem for m in (core, working, archived))
    for key in (mem.core_key, mem.working_key, mem.archive.key):
        ids = {m.message_id for m in store.load_messages(key)}
        assert not ids & {core, working, archived}
    mem.close()
    store.close()


def test_remove_changes_nothing_when_the_store_fails(mem):
    fill(mem)
    archived = mem.archive.messages()[0].message_id
    working = mem.working()[0].message_id
    before = (mem.core(), mem.working(), sorted(m.message_id for m in mem.archive.messages()))

    def failing(ops):
        raise StoreError("disk full")

    mem.store.batch = failing  # the core/working transaction fails after the archive removal
    with pytest.raises(StoreError, match="disk full"):
        mem.remove([archived, working])
    del mem.store.batch
    after = (mem.core(), mem.working(), sorted(m.message_id for m in mem.archive.messages()))
    assert after == before
    assert archived in {m.message_id for m in mem.store.load_messages(mem.archive.key)}
    with pytest.raises(TypeError, match=r"ids\[0\] must be a str"):
        mem.remove([None])
    assert mem.tier_of(archived) == "archive"
