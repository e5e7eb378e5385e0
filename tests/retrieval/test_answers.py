"""Who answers a question about a participant: their voice, turns about themselves, answers."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from marsys_mem.retrieval.answers import answers_question, in_first_person, tells_of_self

NAMES = {"kate", "elise", "nicolas"}


@pytest.mark.parametrize(
    ("query", "voiced"),
    [
        ("What are Kate's hobbies?", "What are my hobbies?"),
        ("What are Kate\u2019s hobbies?", "What are my hobbies?"),
        ("What foods doesn't Nicolas like?", "What foods don't I like?"),
        ("Does Kate like her job?", "Do I like my job?"),
        ("Is Kate happy with her salary?", "Am I happy with my salary?"),
        ("Where has Elise traveled?", "Where have I traveled?"),
        ("Did Nicolas break into his neighbour's house?", "Did I break into my neighbour's house?"),
        ("Kate went where?", "I went where?"),
        ("Who gave Kate the book?", "Who gave me the book?"),
        ("Who did Kate tell about her trip?", "Who did I tell about my trip?"),
        ("Why is Kate sad? Did she lose him?", "Why am I sad? Did I lose me?"),  # one voice
        ("What do Elise and Kate have in common?", "What do we have in common?"),
        ("Was Elise and Kate's trip fun?", "Was our trip fun?"),
        ("What happened to Kate and Elise?", "What happened to us?"),
        ("Which cities has Katie visited?", "Which cities have I visited?"),  # a close spelling
    ],
)
def test_a_question_about_one_participant_is_asked_in_their_voice(query, voiced):
    assert in_first_person(query, NAMES) == voiced


@pytest.mark.parametrize(
    "query",
    [
        "What did Kate give Elise?",  # two people apart: whose voice is not clear
        "Where is Maya now?",  # no participant named
        "Kate?",  # nothing but the name
        "What does Kate's?",  # nothing but stop words and pronouns
    ],
)
def test_no_voice_when_it_is_not_one_participant_or_nothing_is_left(query):
    assert in_first_person(query, NAMES) is None


def test_no_names_no_voice():
    assert in_first_person("What are Kate's hobbies?", ()) is None


def test_stop_words_are_never_names():
    assert in_first_person("What will you bring?", {"will"}) is None


@given(st.text(max_size=60))
def test_any_text_gives_a_string_or_none(text):
    voiced = in_first_person(text, NAMES)
    assert voiced is None or isinstance(voiced, str)


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("I love skiing, it's my favorite sport", 1.0),
        ("I\u2019m planning a cooking class", 1.0),
        ("It's great that you prepared your ingredients!", 0.0),
        ("How about you? Have you been?", 0.0),
        ("Lovely weather today", 0.5),
        ("I told you so", 0.5),
        ("", 0.5),
    ],
)
def test_a_turn_tells_of_its_speaker_when_it_says_i_more_than_you(text, score):
    assert tells_of_self(text) == score


@given(st.text(max_size=60))
def test_tells_of_self_is_one_of_three_values(text):
    assert tells_of_self(text) in (0.0, 0.5, 1.0)


def test_a_turn_answers_when_the_previous_turn_is_another_speakers_question():
    # messages: 0 Kevin asks, 1 Elise tells, 2 Elise asks, 3 Elise tells, 4 Kevin tells,
    # 5 a turn of no known speaker; the last cell is "no such turn"
    asks = np.array([True, False, True, False, False, True, False])
    speakers = np.array([0, 1, 1, 1, 0, -1, -1])
    turns = np.array([1, 3, 4, 0, 4, 5])
    previous = np.array([0, 2, 3, 6, 5, 4])
    found = answers_question(asks, speakers, turns, previous)
    # Elise after Kevin's question; Elise after her own question; Kevin after a telling
    # turn; no previous turn; Kevin after an unknown speaker's question; after a telling
    assert found.tolist() == [True, False, False, False, True, False]
    assert found.dtype == np.bool_


# ----------------------------------------------------------------------- the ranker
def test_rank_in_context_lends_an_answer_more_of_the_question_it_answers():
    from marsys_mem.model.ranking import Ranking
    from marsys_mem.retrieval.scoring import rank_in_context

    # messages: 0 a question that matches, 1 its answer, 2 a turn of the same strength
    # as the answer after a telling turn (3); the last column: no such turn
    own = np.array([[0.9, 0.2, 0.2, 0.1, 0.0], [4.0, 0.0, 0.0, 0.0, 0.0]])
    grid = np.array([[0, 1, 2], [4, 0, 3]])  # candidates, and the turn before each
    ranking = Ranking(context_turns=1, reply_weight=0, thread_weight=0)
    answers = np.array([False, True, False])
    _, plain = rank_in_context(own, np.ones(5, bool), grid, None, ranking)
    order, lent = rank_in_context(own, np.ones(5, bool), grid, None, ranking, answers)
    assert order.tolist() == [0, 1, 2]
    assert lent[1] > plain[1]  # the answer gained
    off = ranking.replace(answer_weight=0.0)
    assert rank_in_context(own, np.ones(5, bool), grid, None, off, answers)[1].tolist() == (
        plain.tolist()
    )


def test_cue_scores_add_the_share_of_telling_of_self():
    from marsys_mem.model.ranking import Ranking
    from marsys_mem.retrieval.scoring import cue_scores

    ranking = Ranking(question_weight=0.0, self_weight=0.2)
    order, adjusted, norm = cue_scores(
        np.array([1.0, 0.95, 0.5]), ranking, of_self=np.array([0.0, 1.0, 0.5])
    )
    assert norm == pytest.approx(1.2)
    assert order.tolist() == [1, 0, 2]
    assert adjusted.tolist() == pytest.approx([1.15 / 1.2, 1.0 / 1.2, 0.6 / 1.2])


# ----------------------------------------------------------------------- RAGMemory
TURNS = [
    ("Kate", "How is your new job going?"),
    ("Elise", "Honestly great, the team at the bakery is lovely"),
    ("Kate", "I love my job at the bakery too"),
    ("Elise", "You should see your bakery job, your bakery job!"),
]


def chat_memory(**options: object):
    from marsys_mem import Message
    from marsys_mem.patterns import RAGMemory
    from marsys_mem.retrieval.embeddings import HashingEmbedder

    mem = RAGMemory(HashingEmbedder(64), background=False, **options)  # type: ignore[arg-type]
    mem.add_many(Message.user(t, name=n) for n, t in TURNS)
    return mem


def test_a_question_about_a_participant_is_searched_in_their_voice():
    with chat_memory() as on, chat_memory(first_person=False) as off:
        assert on._content("How is Elise's job going?") == "How is my job going?"
        assert off._content("How is Elise's job going?") == "How is job going?"
        # two apart: no one voice, the names are taken out
        assert on._content("Did Kate visit Elise?") == "Did visit?"
    with chat_memory(strip_names=False) as kept:
        assert kept._content("How is Elise's job going?") == "How is Elise's job going?"


def test_the_answer_to_another_speakers_question_gains_from_it():
    query = "How is the new job going?"
    plain = {"self_weight": 0.0, "question_weight": 0.0}
    with chat_memory(answer_weight=0.0, **plain) as off, chat_memory(**plain) as on:
        before = {h.text: h.fused for h in off.search(query, k=4, min_score=None)}
        after = {h.text: h.fused for h in on.search(query, k=4, min_score=None)}
    answer, other = TURNS[1][1], TURNS[3][1]  # after Kate's question; after a telling turn
    assert after[answer] - after[other] > before[answer] - before[other]


def test_whether_a_turn_asks_is_worked_out_again_when_its_message_changes():
    """The answer cue keeps whether each message asks, by thread slot: when the last two
    turns (statements) are removed and a question and its answer are added in their freed
    slots, the question is read afresh, and the turns rank exactly as in a memory that
    held these messages from the start."""
    from marsys_mem import Message
    from marsys_mem.patterns import RAGMemory
    from marsys_mem.retrieval.embeddings import HashingEmbedder

    query = "How is the new job going?"
    plain = {"self_weight": 0.0, "question_weight": 0.0}
    now = [
        *TURNS[:2],
        ("Kate", "And how is the new job going for your sister?"),
        ("Elise", "Her new job is going well, she says"),
    ]
    fresh = RAGMemory(HashingEmbedder(64), background=False, **plain)  # type: ignore[arg-type]
    with chat_memory(**plain) as mem, fresh:
        mem.search(query, k=4, min_score=None)  # each turn's flag worked out
        mem.remove([m.message_id for m in reversed(mem.messages()[2:])])
        mem.add_many(Message.user(t, name=n) for n, t in now[2:])  # into the freed slots
        fresh.add_many(Message.user(t, name=n) for n, t in now)
        want = {h.text: h.fused for h in fresh.search(query, k=4, min_score=None)}
        got = {h.text: h.fused for h in mem.search(query, k=4, min_score=None)}
    assert got == pytest.approx(want)


def test_a_turn_telling_of_its_speaker_ranks_above_one_speaking_to_the_listener():
    query = "bakery job"
    plain = {"answer_weight": 0.0, "question_weight": 0.0}
    with chat_memory(self_weight=0.0, **plain) as off, chat_memory(self_weight=1.0, **plain) as on:
        before = [h.text for h in off.search(query, k=4, min_score=None)]
        after = [h.text for h in on.search(query, k=4, min_score=None)]
    mine, yours = TURNS[2][1], TURNS[3][1]
    assert before.index(yours) < before.index(mine)  # more of the query's words
    assert after.index(mine) < after.index(yours)


@pytest.mark.parametrize("field", ["answer_weight", "self_weight"])
def test_the_weights_are_validated_and_named(field):
    from marsys_mem.patterns import RAGMemory

    with pytest.raises(ValueError, match=field):
        RAGMemory(None, **{field: -0.1})
    with pytest.raises(ValueError, match=field):
        RAGMemory(None, **{field: float("nan")})


def test_the_notes_preset_has_none_of_these_cues():
    from marsys_mem.model.ranking import Ranking

    notes, conversation = Ranking.of("notes"), Ranking()
    assert (notes.first_person, notes.answer_weight, notes.self_weight) == (False, 0.0, 0.0)
    assert (conversation.first_person, conversation.answer_weight) == (True, 0.15)
    assert conversation.self_weight == 0.1
