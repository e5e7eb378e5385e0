import random

import pytest

from marsys_mem.retrieval.threads import ThreadLinks


def test_neighbours_follow_insertion_order_per_thread():
    links = ThreadLinks()
    for mid, thread in [("a", "t1"), ("x", "t2"), ("b", "t1"), ("y", "t2"), ("c", "t1")]:
        links.add(mid, thread)
    assert links.before("c", 5) == ["b", "a"]
    assert links.after("a", 5) == ["b", "c"]
    assert links.after("x", 1) == ["y"]
    assert links.before("a", 3) == []
    assert links.after("c", 3) == []
    assert links.before("zzz", 2) == []
    assert len(links) == 5
    assert "y" in links
    assert "zzz" not in links
    assert links.thread_of("y") == "t2"
    assert links.thread_of("zzz") is None


def test_around_collects_neighbours_once_in_order():
    links = ThreadLinks()
    for mid in "abcde":
        links.add(mid, "t")
    assert links.around(["c", "d"], before=1, after=1) == ["c", "b", "d", "e"]
    assert links.around(["a"], before=0, after=2) == ["a", "b", "c"]


def test_duplicate_add_is_rejected_and_changes_nothing():
    links = ThreadLinks()
    links.add("a", "t")
    with pytest.raises(ValueError, match="'a'"):
        links.add("a", "u")
    assert links.thread_of("a") == "t"
    assert len(links) == 1


def test_removal_relinks_the_neighbours_and_the_tail():
    links = ThreadLinks()
    for mid in "abc":
        links.add(mid, "t")
    links.remove("b")
    assert links.before("c", 2) == ["a"]
    assert links.after("a", 2) == ["c"]
    links.remove("c")  # the tail: the next message follows a
    links.add("d", "t")
    assert links.before("d", 3) == ["a"]
    links.remove("a")
    links.remove("d")
    links.remove("nope")  # unknown: ignored
    assert len(links) == 0
    links.add("e", "t")  # the emptied thread starts again
    assert links.before("e", 1) == []
    links.clear()
    assert len(links) == 0
    assert links.before("e", 1) == []


def test_random_adds_and_removes_match_a_list_model():
    rng = random.Random(3)
    links = ThreadLinks()
    model: dict[str, list[str]] = {"t1": [], "t2": [], "t3": []}
    for step in range(2000):
        live = [m for ms in model.values() for m in ms]
        if live and rng.random() < 0.4:
            mid = rng.choice(live)
            links.remove(mid)
            for ms in model.values():
                if mid in ms:
                    ms.remove(mid)
        else:
            thread = rng.choice(list(model))
            mid = f"m{step}"
            links.add(mid, thread)
            model[thread].append(mid)
    for ms in model.values():
        for i, mid in enumerate(ms):
            assert links.before(mid, 3) == ms[max(0, i - 3) : i][::-1]
            assert links.after(mid, 3) == ms[i + 1 : i + 4]


def test_a_given_slot_is_taken_free_or_new_and_skipped_slots_become_free():
    links = ThreadLinks()
    links.add("a", "t", slot=100)  # far past the end: the arrays grow, 0..99 are free
    links.add("b", "t")
    links.add("c", "u", slot=5)  # a free slot in the middle
    assert links.slots(["a", "c"]).tolist() == [100, 5]
    assert links.before("b", 2) == ["a"]
    assert links.capacity > 100
    assert links.walk(links.slots(["a"]), 1, forward=True).tolist() == [links.slots(["b"]).tolist()]
    for bad in (100, 5, -1):
        with pytest.raises(ValueError, match="taken or negative"):
            links.add("d", "t", slot=bad)
    assert "d" not in links
    links.remove("c")
    links.add("d", "t", slot=5)  # freed again: taken again
    assert links.slots(["d"]).tolist() == [5]
    used = {int(s) for s in links.slots(["a", "b", "d"])}
    for i in range(200):  # the default fills the rest without touching a used slot
        links.add(f"n{i}", "t")
    assert len({int(s) for s in links.slots([f"n{i}" for i in range(200)])} | used) == 203


def test_rag_memory_keeps_thread_slots_equal_to_bm25_slots():
    """RAGMemory links each message in BM25's slot, through adds and removals, so a
    candidate's thread slot reads its keyword score."""
    from marsys_mem.patterns import RAGMemory

    rng = random.Random(5)
    with RAGMemory(None) as mem:
        live: list[str] = []
        for i in range(400):
            if live and rng.random() < 0.35:
                mem.remove(live.pop(rng.randrange(len(live))))
            else:
                live.append(mem.add(f"message {i} about topic{rng.randrange(9)}",
                                    metadata={"thread": f"t{rng.randrange(4)}"}))
        assert mem._links.slots(live).tolist() == mem._bm25.slots(live).tolist()


def test_a_message_added_unlinked_is_in_its_thread_with_no_neighbours():
    """``add(linked=False)``: a turn read without the turns around it (a store's
    candidate): same thread number, no neighbours, and the thread's links go past it."""
    links = ThreadLinks()
    links.add("a", "t")
    links.add("x", "t", linked=False)
    links.add("b", "t")
    links.add("y", "u", linked=False)
    assert links.before("x", 3) == []
    assert links.after("x", 3) == []
    assert links.before("b", 3) == ["a"]
    assert links.after("a", 1) == ["b"]
    numbers = links.thread_numbers(links.slots(["a", "x", "b", "y"])).tolist()
    assert numbers[0] == numbers[1] == numbers[2] != numbers[3]
    assert links.around(["x"], 2, 2) == ["x"]
    links.remove("x")  # the thread's tail stays "b"
    links.add("c", "t")
    assert links.before("c", 2) == ["b", "a"]
    links.remove("y")  # a thread of unlinked messages only: nothing to unlink
    links.add("z", "u")
    assert links.before("z", 1) == []


def test_positions_are_the_same_for_a_few_slots_of_a_big_index_as_for_many():
    """A few slots of a big index are sorted (numpy's unique, without its hashing), many
    are marked in an index-wide array: both give the distinct linked slots, ascending, and
    where each slot went (``len(unique)``: the spare cell for -1)."""
    import numpy as np

    links = ThreadLinks()
    for i in range(3000):
        links.add(f"m{i}", f"t{i % 7}")
    rng = np.random.default_rng(4)
    for n in (1, 5, 40, 150, 2000, 9000):  # below and above a sixteenth of the capacity
        slots = rng.integers(-1, 3000, size=n)
        slots[: n // 3] = slots[n // 3 : 2 * (n // 3)]  # repeats
        slots[-1] = -1  # no such message
        unique, where = links.positions(slots)
        expected = np.unique(slots[slots >= 0])
        assert unique.tolist() == expected.tolist()
        spare = np.append(unique, -1)
        assert spare[where].tolist() == slots.tolist()


def test_links_made_at_once_equal_links_added_one_by_one() -> None:
    rng = random.Random(5)
    for n in (0, 1, 2, 40, 300):
        ids = [f"m{i}" for i in rng.sample(range(10 * n + 1), n)]
        threads = [rng.choice("abcde") for _ in ids]
        linked = [rng.random() > 0.3 for _ in ids]
        for chain in (None, linked):
            made = ThreadLinks.of(ids, threads, chain)
            added = ThreadLinks()
            for i, mid in enumerate(ids):
                added.add(mid, threads[i], linked=True if chain is None else chain[i])
            slots = added.slots(ids)
            assert made.slots(ids).tolist() == slots.tolist()
            for back in (False, True):
                assert made.walk(slots, 3, forward=back).tolist() == (
                    added.walk(slots, 3, forward=back).tolist()
                )
            assert made.thread_numbers(slots).tolist() == added.thread_numbers(slots).tolist()
            # and later adds and removals go on the same way
            for links in (made, added):
                links.add("new", "a")
                links.remove(ids[0]) if ids else None
            assert made.before("new", 4) == added.before("new", 4)


def test_links_made_at_once_refuse_an_id_twice() -> None:
    with pytest.raises(ValueError, match="twice"):
        ThreadLinks.of(["a", "b", "a"], ["t", "t", "t"])
    with pytest.raises(ValueError, match="length"):
        ThreadLinks.of(["a"], ["t", "u"])
