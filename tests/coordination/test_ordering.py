import asyncio
import collections
import itertools
import tracemalloc

from hypothesis import given
from hypothesis import strategies as st

from marsys_mem.coordination.ordering import SenderOrdering, _SeqRanges


@given(st.data())
def test_every_item_released_once_in_sender_order(data):
    # any interleaving, with duplicates, of complete sequences: in order, exactly once
    senders = data.draw(st.lists(st.sampled_from("abc"), min_size=1, max_size=3, unique=True))
    lengths = {s: data.draw(st.integers(1, 30)) for s in senders}
    arrivals = [(s, q) for s in senders for q in range(1, lengths[s] + 1)]
    arrivals += data.draw(st.lists(st.sampled_from(arrivals), max_size=20))  # redeliveries
    rest = list(arrivals)
    for s in senders:
        rest.remove((s, 1))  # each sender's first item comes first: it starts the sequence
    order = [(s, 1) for s in senders] + data.draw(st.permutations(rest))
    out: list[tuple[str, int]] = []
    seq = SenderOrdering(out.append, gap_timeout=60, max_pending=1_000)
    for sender, q in order:
        seq.accept(sender, q, (sender, q))
    for s in senders:
        assert [q for who, q in out if who == s] == list(range(1, lengths[s] + 1))
    assert seq.duplicates == len(order) - len(out)
    assert seq.gaps == 0


def test_overflowing_buffer_skips_the_gap_and_the_gap_is_filled_late():
    out: list[int] = []
    seq = SenderOrdering(out.append, gap_timeout=60, max_pending=3)
    seq.accept("a", 1, 1)
    for q in (3, 4, 5, 6):  # 2 is missing; the 4th early item overflows max_pending=3
        seq.accept("a", q, q)
    assert out == [1, 3, 4, 5, 6]
    assert seq.gaps == 1
    seq.accept("a", 2, 2)  # late, delivered once
    seq.accept("a", 2, 2)
    assert out == [1, 3, 4, 5, 6, 2]
    assert seq.duplicates == 1


async def test_gap_timeout_releases_buffered_items():
    out: list[int] = []
    seq = SenderOrdering(out.append, gap_timeout=0.05, max_pending=100)
    seq.accept("a", 1, 1)
    seq.accept("a", 3, 3)
    assert out == [1]
    await asyncio.sleep(0.15)
    assert out == [1, 3]
    assert seq.gaps == 1
    seq.close()


def test_items_sent_before_the_first_seen_are_released_once():
    out: list[int] = []
    seq = SenderOrdering(out.append, gap_timeout=60, max_pending=100)
    seq.accept("a", 5, 5)  # a receiver that started listening late
    seq.accept("a", 2, 2)
    seq.accept("a", 2, 2)
    seq.accept("a", 6, 6)
    assert out == [5, 2, 6]
    assert seq.duplicates == 1


def test_senders_are_bounded():
    out: list[int] = []
    seq = SenderOrdering(out.append, gap_timeout=60, max_pending=100, max_senders=2)
    for sender in ("a", "b", "c"):
        seq.accept(sender, 1, 1)
    assert len(seq._senders) == 2
    assert "a" not in seq._senders


# ---------------------------------------------------------------------------- repair
class Asks:
    """Records the resend requests a SenderOrdering makes."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, list[tuple[int, int]]]] = []

    def __call__(self, sender: object, ranges: list[tuple[int, int]]) -> None:
        self.calls.append((sender, ranges))


async def test_a_gap_is_asked_for_again_until_it_arrives():
    out: list[int] = []
    asks = Asks()
    seq = SenderOrdering(out.append, gap_timeout=5, max_pending=100, request=asks,
                         resend_after=0.02)
    for q in (1, 2, 5, 7):
        seq.accept("a", q, q)
    await asyncio.sleep(0.07)
    assert len(asks.calls) >= 2  # asked, then asked again
    assert asks.calls[0] == ("a", [(3, 4), (6, 6)])
    for q in (3, 4, 6):
        seq.accept("a", q, q)
    assert out == [1, 2, 3, 4, 5, 6, 7]
    asked = len(asks.calls)
    await asyncio.sleep(0.07)
    assert len(asks.calls) == asked  # nothing missing: no more asking
    assert seq.gaps == 0
    assert seq.requests == asked
    seq.close()


async def test_a_high_water_mark_reveals_a_lost_tail():
    # the last items of a stream were lost: nothing later arrives to show the gap
    out: list[int] = []
    asks = Asks()
    seq = SenderOrdering(out.append, gap_timeout=5, max_pending=100, request=asks,
                         resend_after=0.02)
    seq.accept("a", 1, 1)
    seq.accept("a", 2, 2)
    seq.announce("a", 2)  # nothing missing
    await asyncio.sleep(0.05)
    assert asks.calls == []
    seq.announce("a", 4)
    await asyncio.sleep(0.05)
    assert asks.calls[0] == ("a", [(3, 4)])
    seq.accept("a", 3, 3)
    seq.accept("a", 4, 4)
    seq.accept("a", 4, 4)
    assert out == [1, 2, 3, 4]
    assert seq.duplicates == 1
    seq.close()


async def test_an_unanswered_tail_is_given_up_after_the_gap_timeout():
    out: list[int] = []
    seq = SenderOrdering(out.append, gap_timeout=0.05, max_pending=100, request=Asks(),
                         resend_after=0.01)
    seq.accept("a", 1, 1)
    seq.announce("a", 3)
    await asyncio.sleep(0.15)
    assert seq.gaps == 1
    seq.accept("a", 4, 4)  # the stream goes on after the skipped tail
    seq.accept("a", 2, 2)  # and a late one still arrives once
    seq.accept("a", 2, 2)
    assert out == [1, 4, 2]
    assert seq.duplicates == 1
    seq.close()


async def test_a_mark_below_the_first_item_asks_for_what_was_sent_while_listening():
    # the first item this receiver saw was 5, but the sender had only sent 2 when this
    # receiver heard its mark: 3 and 4 were sent while it listened, and were lost
    out: list[int] = []
    asks = Asks()
    seq = SenderOrdering(out.append, gap_timeout=5, max_pending=100, request=asks,
                         resend_after=0.02)
    seq.accept("a", 5, 5)
    seq.accept("a", 1, 1)  # pre-start: released once
    seq.announce("a", 2)
    await asyncio.sleep(0.05)
    assert asks.calls[:1] == [("a", [(3, 4)])]
    for q in (3, 4, 3, 1):
        seq.accept("a", q, q)
    assert out == [5, 1, 3, 4]
    assert seq.duplicates == 2
    seq.close()


def test_a_mark_from_a_new_sender_starts_its_sequence():
    out: list[int] = []
    seq = SenderOrdering(out.append, gap_timeout=5, max_pending=100)
    seq.announce("a", 10)  # a receiver that starts listening now expects 11 next
    seq.accept("a", 11, 11)
    seq.accept("a", 9, 9)  # sent before: released once
    seq.accept("a", 9, 9)
    assert out == [11, 9]
    assert seq.duplicates == 1


# ---------------------------------------------------------------------------- bounds
def test_skipped_gaps_are_remembered_as_ranges_not_one_entry_per_seq():
    # a stranger's far-apart seq numbers each skip a gap of 100,000: remembered as ranges
    out: list[int] = []
    seq = SenderOrdering(out.append, gap_timeout=60, max_pending=1)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        seq.accept("a", 1, 1)
        for k in range(1, 21):
            seq.accept("a", 1 + k * 100_000, k)
            seq.accept("a", 2 + k * 100_000, k)  # overflows max_pending: the gap is skipped
        grown = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert seq.gaps == 20
    assert seq.remembered <= 20
    assert grown < 1_000_000, f"{grown} bytes for 20 skipped gaps"
    seq.accept("a", 50_000, "late")  # still released once, late
    seq.accept("a", 50_000, "late")
    assert out[-1] == "late"
    assert seq.duplicates == 1


def test_pre_start_items_are_remembered_as_ranges():
    released = collections.Counter()
    seq = SenderOrdering(lambda item: released.update([item]), gap_timeout=60, max_pending=100)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for sender in range(5):
            seq.accept(sender, 1_000_000, "x")
            for q in range(1, 40_001):  # sent before this receiver started listening
                seq.accept(sender, q, "x")
        grown = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert released["x"] == 5 * 40_001
    assert seq.remembered == 5
    assert grown < 1_000_000, f"{grown} bytes for 200,000 pre-start items"


def test_remembered_ranges_are_bounded_and_what_is_dropped_is_counted():
    out: list[int] = []
    seq = SenderOrdering(out.append, gap_timeout=60, max_pending=100, max_remembered=100)
    for sender in range(10):
        seq.accept(sender, 10_000, 0)
        for q in range(1, 1_000, 2):  # fragmented: one range each
            seq.accept(sender, q, q)
    assert seq.remembered <= 100
    assert seq.forgotten == 10 * 500 - seq.remembered
    assert len(out) == 10 * 501  # bounded memory, nothing withheld


def test_buffered_items_are_bounded_over_all_senders():
    out: list[tuple[int, int]] = []
    seq = SenderOrdering(out.append, gap_timeout=60, max_pending=10, max_buffered=20)
    for sender in range(8):
        seq.accept(sender, 1, (sender, 1))
        for q in range(3, 13):  # 2 never arrives: 10 early items each
            seq.accept(sender, q, (sender, q))
            assert seq.buffered <= 20
    assert seq.gaps >= 6
    seq.close()


def test_a_forgotten_sender_releases_what_it_buffered():
    out: list[str] = []
    seq = SenderOrdering(out.append, gap_timeout=60, max_pending=100, max_senders=2)
    seq.accept("a", 1, "a1")
    seq.accept("a", 3, "a3")  # early: waits for a2
    seq.accept("b", 1, "b1")
    seq.accept("b", 1, "b1")  # b is now the most recently heard from
    seq.accept("a", 4, "a4")  # and now a
    seq.accept("c", 1, "c1")  # over max_senders: b (least recent) is forgotten
    assert list(seq._senders) == ["a", "c"]
    seq.accept("d", 1, "d1")  # then a: its early items are released, not dropped
    assert out == ["a1", "b1", "c1", "a3", "a4", "d1"]
    assert seq.evicted == 2
    assert seq.buffered == 0


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 60), st.integers(0, 8)), max_size=60))
def test_seq_ranges_behave_like_a_set(ops):
    ranges, model = _SeqRanges(), set()
    for add, start, length in ops:
        if add:
            ranges.add(start, start + length)
            model.update(range(start, start + length))
        else:
            ranges.remove(start, start + length)
            model.difference_update(range(start, start + length))
        pairs = list(ranges)
        assert all(a < b for a, b in pairs)
        assert all(b1 < a2 for (_, b1), (a2, _) in itertools.pairwise(pairs))
        assert {x for a, b in pairs for x in range(a, b)} == model
        assert all((x in ranges) == (x in model) for x in range(-1, 70))
        holes = ranges.complement(10, 50)
        assert {x for a, b in holes for x in range(a, b)} == set(range(10, 50)) - model


async def test_asks_space_out_while_nothing_arrives():
    # a receiver far behind must not ask for the same gap every resend_after seconds
    asks = Asks()
    seq = SenderOrdering(lambda _: None, gap_timeout=1.0, max_pending=100, request=asks,
                         resend_after=0.01)
    seq.accept("a", 1, 1)
    seq.accept("a", 3, 3)
    await asyncio.sleep(0.4)
    assert 3 <= len(asks.calls) <= 7  # 0.01, 0.02, 0.04, 0.08, 0.16, then every 0.25
    seq.accept("a", 2, 2)  # progress: the next gap is asked for promptly again
    seq.accept("a", 5, 5)
    before = len(asks.calls)
    await asyncio.sleep(0.05)
    assert len(asks.calls) >= before + 2
    seq.close()
