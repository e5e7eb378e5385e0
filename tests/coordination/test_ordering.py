import asyncio

from hypothesis import given
from hypothesis import strategies as st

from marsys_mem.coordination.ordering import SenderOrdering


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
