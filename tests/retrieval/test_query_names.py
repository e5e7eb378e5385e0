"""A hybrid search looks for the question's content: the participants' names taken out."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from marsys_mem import Message
from marsys_mem.patterns import RAGMemory
from marsys_mem.retrieval.embeddings import HashingEmbedder
from marsys_mem.retrieval.query_names import without_names

NAMES = {"kate", "elise", "muhhamed"}


@pytest.mark.parametrize(
    ("query", "content"),
    [
        ("What are Kate's hobbies?", "What are hobbies?"),
        ("What are Kate\u2019s hobbies?", "What are hobbies?"),
        ("Which cities have both Kate and Elise been to?", "Which cities have both and been to?"),
        ("What does Muhammad study?", "What does study?"),  # a spelling of a name
        ("Where did KATE go?", "Where did go?"),
        ("Where is the bar?", "Where is the bar?"),  # no name: as it is
        ("Kate?", "Kate?"),  # nothing but a name: as it is
        ("Kate and Elise!", "Kate and Elise!"),
        ("Katherine's car", "Katherine's car"),  # another name, not a spelling of one
    ],
)
def test_names_and_their_possessives_and_spellings_are_taken_out(query, content):
    assert without_names(query, NAMES) == content


def test_stop_words_and_short_words_stay_even_when_they_are_names():
    assert without_names("Will Kate come?", {"will", "kate"}) == "Will come?"
    assert without_names("Did Al call Kate?", {"al", "kate"}) == "Did Al call?"
    assert without_names("Where did Kate go?", set()) == "Where did Kate go?"


@given(st.text(max_size=60), st.sets(st.sampled_from(sorted(NAMES)), max_size=3))
def test_content_is_never_empty_and_never_longer(query, names):
    content = without_names(query, names)
    assert len(content) <= len(query)
    assert content == query or any(c.isalnum() for c in content)
    assert without_names(content, names) == content  # nothing left to take out


# ----------------------------------------------------------------------- RAGMemory
TURNS = [
    ("Vanessa", "I joined a pottery class and made a bowl"),
    ("Nicolas", "What about Vanessa? Vanessa, how are you, Vanessa?"),
    ("Nicolas", "Good night Vanessa"),
    ("Vanessa", "Good night Nicolas"),
    ("Nicolas", "I play football on Sundays"),
    ("Vanessa", "Thanks Nicolas, and you Nicolas?"),
]


def chat_memory(**options: object) -> RAGMemory:
    mem = RAGMemory(HashingEmbedder(64), background=False, **options)  # type: ignore[arg-type]
    mem.add_many(Message.user(t, name=n) for n, t in TURNS)
    return mem


def test_the_participant_is_left_to_the_speaker_cue_and_the_content_finds_the_turn():
    query = "What class did Vanessa join?"
    with chat_memory(strip_names=False) as kept, chat_memory() as stripped:
        assert kept._content(query) == query
        assert stripped._content(query) == "What class did I join?"  # in her voice
        before = {h.text: h for h in kept.search(query, k=6, min_score=None)}
        after = stripped.search(query, k=6, min_score=None)
    # the turn that only says her name matched the query on the keyword side; now not
    name_only = TURNS[1][1]
    assert (before[name_only].bm25_score or 0.0) > 0
    assert all(not h.bm25_score for h in after if h.text == name_only)
    assert after[0].text == TURNS[0][1]  # her own turn answers


def test_the_speaker_cue_still_reads_the_name_of_the_query_as_asked():
    query = "Good night to Vanessa?"
    with chat_memory(speaker_weight=0.0) as off, chat_memory() as on:
        assert off._content(query) == query  # no speaker cue: the names stay
        assert on._content(query) == "Good night to me?"
        first = on.search(query, k=1, min_score=None)[0]
    assert first.message.name == "Vanessa"  # her own good night, lifted by the cue


def test_one_side_alone_searches_the_query_as_asked():
    with chat_memory() as mem:
        hits = mem.search("Vanessa", k=1, mode="bm25", min_score=None)
        assert hits[0].text == TURNS[1][1]
        hits = mem.search("Vanessa", k=1, mode="dense", min_score=None)
        assert "Vanessa" in hits[0].text


def test_strip_names_is_an_option_and_a_strict_bool():
    with chat_memory(strip_names=False) as mem:
        assert mem.ranking.strip_names is False
    with pytest.raises(ValueError, match=r"strip_names[\s\S]*input_value=0"):
        chat_memory(strip_names=0)


def test_the_names_of_the_many_people_of_a_shared_memory_stay():
    """Six people, none with a fifth of the messages: a name tells conversations apart."""
    people = ["Anna", "Boris", "Carla", "Dmitri", "Elena", "Farid"]
    with RAGMemory(HashingEmbedder(64), background=False) as mem:
        mem.add_many(Message.user(f"hello number {i}", name=people[i % 6]) for i in range(36))
        assert mem._content("What did Anna cook?") == "What did Anna cook?"
        mem.add_many(Message.user(f"more from Anna {i}", name="Anna") for i in range(10))
        assert mem._content("What did Anna cook?") == "What did I cook?"  # now 16 of 46
