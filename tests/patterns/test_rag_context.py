"""RAGMemory's hybrid ranking in context: threads, replies, time cues, sessions."""

import itertools
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from marsys_mem.model.messages import Message
from marsys_mem.patterns import RAGMemory
from marsys_mem.retrieval.embeddings import HashingEmbedder
from marsys_mem.retrieval.scoring import diversify, fuse_scores
from marsys_mem.store import SQLiteStore

FILLER = [
    "Good morning! How was your weekend?",
    "The coffee machine on the third floor is broken again.",
    "It rained all day, so I stayed home and read a novel.",
    "Let's grab lunch at the new ramen place downtown.",
    "My laptop battery drains really fast these days.",
    "We should plan the team offsite for next quarter.",
]
ASK = "Was it the beagle with the floppy ears from the photo?"
REPLY = "Yes! That's the one I told you about, asleep on my jumper now."


def _msg(text: str, thread: str, **fields) -> Message:
    return Message.user(text, metadata={"thread": thread}, **fields)


def _fill(mem: RAGMemory) -> tuple[str, str]:
    mem.add_many([_msg(t, "other") for t in FILLER[:3]])
    ask = mem.add(_msg(ASK, "t1", name="jonas"))
    mem.add(_msg(FILLER[3], "other"))  # another thread's turn comes in between
    reply = mem.add(_msg(REPLY, "t1", name="maya"))
    mem.add_many([_msg(t, "other") for t in FILLER[4:]])
    return ask, reply


def test_a_reply_is_found_through_the_turn_it_answers():
    with RAGMemory(HashingEmbedder(), background=False) as mem:
        ask, reply = _fill(mem)
        hits = mem.search("beagle floppy ears", k=2)
        assert [h.id for h in hits] == [ask, reply]
        # each hit still carries its own scores: the reply shares no word with the query
        assert hits[1].bm25_score == 0.0
        assert hits[1].text == REPLY
        assert all(0.0 <= h.score <= 1.0 for h in hits)
    with RAGMemory(
        HashingEmbedder(),
        background=False,
        context_weight=0.0,
        reply_weight=0.0,
        thread_weight=0.0,
        answer_weight=0.0,  # nor as the answer to the question
        self_weight=0.0,  # nor as a turn that tells of its speaker, among the non-matches
    ) as mem:
        ask, reply = _fill(mem)
        assert reply not in [h.id for h in mem.search("beagle floppy ears", k=2)]


def test_no_context_turns_means_no_reply_either():
    results = []
    for reply_weight in (0.0, 0.25, 1.0):
        with RAGMemory(
            HashingEmbedder(), background=False, context_turns=0, reply_weight=reply_weight
        ) as mem:
            _fill(mem)
            hits = mem.search("beagle floppy ears", k=6)
            results.append([(h.text, h.score, h.dense_score, h.bm25_score) for h in hits])
    assert results[0] == results[1] == results[2]


def test_context_follows_the_thread_not_the_insertion_order():
    with RAGMemory(HashingEmbedder(), background=False, thread_key=None) as mem:
        _ask, reply = _fill(mem)  # one shared thread: the reply's previous turn is filler
        assert reply not in [h.id for h in mem.search("beagle floppy ears", k=2)]


def test_removing_the_context_turn_relinks_the_thread():
    with RAGMemory(HashingEmbedder(), background=False) as mem:
        ask, reply = _fill(mem)

        def score_of_reply() -> float:
            hits = mem.search("beagle floppy ears", k=len(mem), min_score=None)
            return next(h.fused or 0.0 for h in hits if h.id == reply)  # the ranking's score

        before = score_of_reply()
        mem.remove(ask)
        other = mem.add(_msg("the beagle with the floppy ears", "elsewhere"))  # to match
        assert score_of_reply() < before / 2
        again = mem.add(_msg("The beagle with floppy ears, remember?", "t1"))
        later = mem.add(_msg("Of course I do!", "t1"))
        ids = [h.id for h in mem.search("beagle floppy ears", k=4)]
        assert set(ids[:2]) == {again, other}
        # t1 is now reply -> again -> later: both neighbours of `again` come next
        assert set(ids[2:]) == {reply, later}


def test_threads_are_rebuilt_from_the_store(tmp_path):
    store = SQLiteStore(tmp_path / "mem.db")
    try:
        with RAGMemory(HashingEmbedder(), store=store, background=False) as mem:
            ask, reply = _fill(mem)
        with RAGMemory(HashingEmbedder(), store=store, background=False) as mem:
            assert [h.id for h in mem.search("beagle floppy ears", k=2)] == [ask, reply]
    finally:
        store.close()


def test_a_period_in_the_query_prefers_messages_sent_then():
    march = datetime(2023, 3, 14, 10, tzinfo=UTC)
    july = march + timedelta(days=120)
    text = "The car broke down again, this time it was the {}."
    for weight, first in ((0.0, "alternator"), (1.0, "clutch")):
        with RAGMemory(HashingEmbedder(), background=False, time_weight=weight) as mem:
            mem.add_many([_msg(t, "other") for t in FILLER])
            mem.add(_msg(text.format("alternator"), "a", timestamp=march))
            mem.add(_msg(text.format("clutch"), "b", timestamp=july))
            hits = mem.search("Did the alternator of the car break down in July 2023?", k=2)
            assert first in hits[0].text
            assert all(h.score <= 1.0 + 1e-9 for h in hits)


def test_a_when_question_prefers_turns_that_say_when():
    for weight, expected in (
        (0.0, "we got the puppy from the shelter"),
        (1.0, "on Saturday we got the puppy"),
    ):
        with RAGMemory(
            HashingEmbedder(),
            background=False,
            when_weight=weight,
            context_weight=0.0,
            reply_weight=0.0,
        ) as mem:
            mem.add_many([_msg(t, "other") for t in FILLER])
            mem.add(_msg("we got the puppy from the shelter, so cute", "a"))
            mem.add(_msg("on Saturday we got the puppy, the shelter was busy", "b"))
            hit = mem.search("When did they get the puppy from the shelter?", k=1)[0]
            assert hit.text.startswith(expected)


TRIP = [
    ("Back from Lisbon! Amazing food, terrible sunburn.", "maya"),
    ("You're back! How was the weather?", "jonas"),
    ("Hot every day. I fell asleep on the beach on day two.", "maya"),
    ("Ouch. Did you get to see the trams?", "jonas"),
    ("Rode the old tram twice, then walked up to the castle.", "maya"),
]
LOOK_ALIKE = "Lisbon? That's so far! Good for Maya though."


def _trip_and_look_alikes(mem: RAGMemory) -> list[str]:
    """Five chats that mention Maya and Lisbon once, and Maya's own trip thread."""
    for i in range(5):
        chat = [*FILLER[: i + 1], LOOK_ALIKE, *FILLER[i + 1 :]]
        mem.add_many([_msg(t, f"t{i}", name=f"p{i}") for t in chat])
    return mem.add_many([_msg(text, "trip", name=name) for text, name in TRIP])


def test_the_thread_the_query_is_about_outranks_look_alike_lines():
    query = "What did Maya say about her trip to Lisbon?"
    # the keyword side alone: each look-alike line matches both names and is shorter than
    # Maya's own turn, but her thread matches the query over three turns (the speaker cue
    # off: it lifts Maya's own turns on its own, below)
    opts = {"background": False, "dense_weight": 0.0, "context_weight": 0.0, "reply_weight": 0.0}
    opts |= {"answer_weight": 0.0, "self_weight": 0.0}  # the thread and speaker cues alone
    with RAGMemory(HashingEmbedder(), thread_weight=0.0, speaker_weight=0.0, **opts) as mem:
        trip = _trip_and_look_alikes(mem)
        assert mem.search(query, k=1, min_score=None)[0].text == LOOK_ALIKE
    with RAGMemory(HashingEmbedder(), thread_weight=0.0, **opts) as mem:  # "Maya" names her
        trip = _trip_and_look_alikes(mem)
        assert mem.search(query, k=1, min_score=None)[0].message.name == "maya"
    opts["speaker_weight"] = 0.0
    for weight, expected in ((0.5, [0]), (2.0, [0, 4, 2])):
        with RAGMemory(HashingEmbedder(), thread_weight=weight, **opts) as mem:
            trip = _trip_and_look_alikes(mem)
            hits = mem.search(query, k=len(expected), min_score=None)
            assert [h.id for h in hits] == [trip[i] for i in expected]
            assert all(0.0 <= h.score <= 1.0 for h in hits)
            # each hit carries its own BM25 score, not its thread's
            own = {h.id: h.bm25_score for h in mem.search(query, 20, None, mode="bm25")}
            assert hits[0].bm25_score == pytest.approx(own[trip[0]])


def test_thread_weight_changes_nothing_when_all_messages_share_a_thread():
    query = "What did Maya say about her trip to Lisbon?"
    results = []
    for weight in (0.0, 0.2, 5.0):
        with RAGMemory(
            HashingEmbedder(), background=False, thread_key=None, thread_weight=weight
        ) as mem:
            _trip_and_look_alikes(mem)
            hits = mem.search(query, k=8)
            results.append([(h.text, h.score, h.dense_score, h.bm25_score) for h in hits])
    assert results[0] == results[1] == results[2]


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("context_turns", -1),
        ("context_turns", 9),
        ("context_turns", 1.5),
        ("context_weight", -0.1),
        ("reply_weight", float("nan")),
        ("diversity", -1),
        ("time_weight", "high"),
        ("when_weight", -2),
        ("thread_weight", -0.5),
        ("thread_weight", float("inf")),
        ("fusion", "max"),
    ],
)
def test_bad_options_name_the_field(option, value):
    with pytest.raises(ValueError, match=option if option != "fusion" else "fusion"):
        RAGMemory(HashingEmbedder(), background=False, **{option: value})


def test_thread_key_must_be_a_string():
    with pytest.raises(ValueError, match="thread_key"):
        RAGMemory(HashingEmbedder(), background=False, thread_key=3)  # type: ignore[arg-type]


def test_minmax_fusion_scales_both_sides_to_the_candidates():
    fused = fuse_scores(
        [("a", 0.9), ("b", 0.5), ("c", 0.1)],
        [("c", 4.0), ("b", 2.0)],
        {"a": 0.9, "b": 0.5, "c": 0.1},
        {"a": 0.0, "b": 2.0, "c": 4.0},
        fusion="minmax",
        dense_weight=1.0,
        bm25_weight=1.0,
    )
    scores = {mid: s for mid, s, _, _ in fused}
    assert scores == pytest.approx({"a": 0.5, "b": 0.5, "c": 0.5})
    one = {"fusion": "minmax", "dense_weight": 1.0, "bm25_weight": 1.0}
    fused = fuse_scores([("a", 0.9)], [], {"a": 0.9}, {"a": 0.0}, **one)  # type: ignore[arg-type]
    assert fused[0][1] == 0.5  # a lone candidate: its cosine is the best (1.0), BM25 none (0.0)
    fused = fuse_scores([("a", -0.2)], [], {"a": -0.2}, {"a": 0.0}, **one)  # type: ignore[arg-type]
    assert fused[0][1] == 0.0  # nothing matched on either side


def test_zscore_fusion_keeps_a_one_sided_standout_on_top():
    # "x" alone holds the query's rare word (BM25 8.0, all others 0) but its cosine is the
    # weakest; the 60 others' cosines spread evenly from 0.40 to 0.70. Alone on a side
    # among n candidates, x stands out there by sqrt(n - 1) deviations (here 7.8)
    cos = {f"c{i}": 0.40 + 0.005 * i for i in range(61)}
    cos["x"] = 0.35
    dense = sorted(cos.items(), key=lambda kv: -kv[1])
    bm25 = {mid: 0.0 for mid in cos}
    bm25["x"] = 8.0
    weights = {"dense_weight": 1.5, "bm25_weight": 1.0}
    z = fuse_scores(dense, [("x", 8.0)], cos, bm25, fusion="zscore", **weights)  # type: ignore[arg-type]
    assert z[0][0] == "x"
    assert z[0][1] == 1.0
    assert min(s for _, s, _, _ in z) == 0.0
    # min-max weighs the spread of the cosines like the one keyword match: x sinks
    weights["dense_weight"] = 2.5
    mm = fuse_scores(dense, [("x", 8.0)], cos, bm25, fusion="minmax", **weights)  # type: ignore[arg-type]
    assert [mid for mid, *_ in mm].index("x") > 10
    # the standard scores: mean of both sides' z, then rescaled to [0, 1]
    ids = [mid for mid, *_ in z]
    d = np.array([cos[m] for m in ids])
    b = np.array([bm25[m] for m in ids])
    raw = (1.5 * (d - d.mean()) / d.std() + (b - b.mean()) / b.std()) / 2.5
    expected = (raw - raw.min()) / (raw.max() - raw.min())
    assert [s for _, s, _, _ in z] == pytest.approx(expected.tolist())
    # one candidate: 1.0 if it matched on either side, else 0.0; all equal: all 0.0
    one = fuse_scores([("a", 0.2)], [], {"a": 0.2}, {"a": 0.0}, fusion="zscore")
    assert one[0][1] == 1.0
    none = fuse_scores([("a", -0.2)], [], {"a": -0.2}, {"a": 0.0}, fusion="zscore")
    assert none[0][1] == 0.0
    tie = fuse_scores([("a", 0.5), ("b", 0.5)], [], {"a": 0.5, "b": 0.5}, {}, fusion="zscore")
    assert [s for _, s, _, _ in tie] == [0.0, 0.0]


def test_diversify_spreads_groups_and_keeps_scores_sorted():
    ranked = [(f"s1-{i}", 1.0 - i / 100, None, None) for i in range(5)]
    ranked.append(("s2-0", 0.9, None, None))
    out = diversify(ranked, lambda mid: mid[:2], 0.1)
    assert [c[0] for c in out][:3] == ["s1-0", "s2-0", "s1-1"]
    assert sorted(c[0] for c in out) == sorted(c[0] for c in ranked)
    assert all(a[1] >= b[1] for a, b in itertools.pairwise(out))
    assert diversify(ranked, lambda mid: mid[:2], 0.0) == ranked


def test_the_keyword_side_worked_out_beside_the_model_gives_the_same_ranking():
    """search() works out the keyword hits and time cues on a helper thread while the
    query is embedded; ranked with them or without, a query gets the same hits, and cues
    read before the memory changed are not used (the new message is found)."""
    with RAGMemory(HashingEmbedder(), background=False) as mem:
        _fill(mem)
        mem.add_many([_msg(f"{t} (day {i})", f"s{i % 3}") for i, t in
                      enumerate(FILLER * 5)])
        queries = [ASK, "Which ramen place for lunch?", "battery of the laptop last week",
                   "when did it rain?", "offsite next quarter"]
        for query in queries:
            qvec = mem._embed_query(query)
            depth = mem._depth(10, None)
            cues = mem._query_cues(query, depth)
            with mem._lock:
                ahead = mem._search_locked(query, qvec, 10, None, "hybrid", None, cues)
                alone = mem._search_locked(query, qvec, 10, None, "hybrid", None, None)
            assert [(h.id, h.score) for h in ahead] == [(h.id, h.score) for h in alone]
            assert [h.id for h in mem.search(query, 10, None)] == [h.id for h in alone]
        query = "zebra crossing near the stadium"
        stale = mem._query_cues(query, mem._depth(5, None))
        assert stale.bm25 == []
        new = mem.add(_msg("The zebra crossing near the stadium is repainted.", "s9"))
        assert not stale.current(mem._bm25, mem._depth(5, None))
        with mem._lock:
            hits = mem._search_locked(query, mem._embed_query(query), 5, None, "hybrid",
                                      None, stale)
        assert hits[0].id == new
