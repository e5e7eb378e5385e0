"""Turns that ask rank a little below the turns that tell (RAGMemory's question_weight)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from marsys_mem import Message
from marsys_mem.patterns import RAGMemory
from marsys_mem.retrieval.embeddings import HashingEmbedder
from marsys_mem.retrieval.questions import asks


@pytest.mark.parametrize(
    ("text", "asked"),
    [
        ("What are your plans for New Year's Eve?", True),
        ("Really?  \n", True),
        ("\u4f60\u53bb\u54ea\u91cc\uff1f", True),  # full-width
        ("I booked a sushi place for New Year's Eve.", False),
        ("Did you go? I went!", False),  # it ends by telling
        ("", False),
    ],
)
def test_a_turn_asks_when_it_ends_with_a_question_mark(text, asked):
    assert asks(text) is asked


@given(st.text(max_size=40))
def test_asks_reads_only_the_end(text):
    assert asks(text) == asks(text + "  ") == text.rstrip().endswith(("?", "\uff1f", "\u061f"))


TURNS = [
    ("Kevin", "What plans for New Year's Eve do you have?"),
    ("Elise", "My plans for New Year's Eve: a family dinner."),
    ("Kevin", "Nice, I booked a table."),
    ("Elise", "I like the beach."),
]


def chat_memory(**options: object) -> RAGMemory:
    mem = RAGMemory(HashingEmbedder(64), background=False, **options)  # type: ignore[arg-type]
    mem.add_many(Message.user(t, name=n) for n, t in TURNS)
    return mem


def test_the_answer_outranks_the_question_that_repeats_the_query():
    query = "What plans for New Year's Eve?"
    alone = {"answer_weight": 0.0, "self_weight": 0.0}  # the question cue alone
    with chat_memory(question_weight=0.0, **alone) as off, chat_memory(**alone) as on:
        before = [h.text for h in off.search(query, k=2, min_score=None)]
        after = [h.text for h in on.search(query, k=2, min_score=None)]
    assert before == [TURNS[0][1], TURNS[1][1]]  # the question echoes every word
    assert after == [TURNS[1][1], TURNS[0][1]]


def test_question_weight_is_validated_and_zero_is_off():
    with pytest.raises(ValueError, match="question_weight"):
        RAGMemory(None, question_weight=-0.1)
    with pytest.raises(ValueError, match="question_weight"):
        RAGMemory(None, question_weight=float("nan"))
    with chat_memory(question_weight=0.0) as mem:
        assert mem.ranking.question_weight == 0.0


def test_scores_stay_in_ranking_order_with_the_cue():
    with chat_memory() as mem:
        hits = mem.search("plans beach New Year", k=4, min_score=None)
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True)
