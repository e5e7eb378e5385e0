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
