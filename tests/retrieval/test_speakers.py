"""Who said it: participants by name and alias, and RAGMemory lifting the named one's turns."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from marsys_mem import Message
from marsys_mem.patterns import RAGMemory
from marsys_mem.retrieval import speakers
from marsys_mem.retrieval.embeddings import HashingEmbedder
from marsys_mem.retrieval.speakers import SpeakerNames, speaker_of

CHAT = [
    ("Emi", "Hi there! I'm Kate, nice to meet you."),
    ("elise", "Hey Kate! I'm Emily."),
    ("Emi", "Hey Emily! How was the bar in Miami?"),
    ("elise", "It was great, thank you Kate."),
    ("Emi", "I made pasta in my Italian cooking class."),
    ("elise", "That looks amazing Kate."),
    ("Emi", "Thanks, Emily!"),
    ("elise", "I went to Miami again with friends."),
]


def learned() -> SpeakerNames:
    names = SpeakerNames()
    for speaker, text in CHAT:
        names.observe(speaker, text)
    return names


def test_aliases_come_from_introductions_and_how_others_address_someone():
    names = learned()
    assert names.aliases() == {"Emi": {"kate"}, "elise": {"emily"}}
    assert names.speakers == ["Emi", "elise"]
    assert "miami" not in names.aliases()["elise"]  # said by both: a place, not a name


def test_named_by_name_alias_possessive_and_spelling():
    names = learned()
    assert names.named("What did Kate cook?") == "Emi"
    assert names.named("Where is Emily\u2019s favourite bar?") == "elise"
    assert names.named("What does Elise like?") == "elise"
    assert names.named("What does elise's friend do?") == "elise"
    assert names.named("Kate and Emily: where did they meet?") is None  # two people
    assert names.named("Where is the bar?") is None  # nobody


def test_fuzzy_spelling_and_names_of_several_words():
    names = SpeakerNames()
    names.observe("Muhhamed", "hello")
    names.observe("Fahim Khan", "hi")
    assert names.named("What does Muhammad study?") == "Muhhamed"
    assert names.named("Where does Khan work?") == "Fahim Khan"
    assert names.named("Where does Fahim work?") == "Fahim Khan"
    assert names.named("Who is Max?") is None  # short names match exactly only


def test_candidates_speakers_count_when_nothing_was_observed():
    names = SpeakerNames()
    assert names.named("What did Maya say?") is None
    assert names.named("What did Maya say?", ["maya", "Omar"]) == "maya"


def test_speaker_of_reads_name_then_agent():
    assert speaker_of(Message.user("x", name="maya")) == "maya"
    assert speaker_of(Message.user("x", metadata={"agent": "planner"})) == "planner"
    assert speaker_of(Message.user("x", metadata={"agent": 3})) is None


@given(st.lists(st.tuples(st.sampled_from(["Ann", "Bob", None]), st.text(max_size=40))))
def test_learning_never_fails_and_names_only_participants(turns):
    names = SpeakerNames()
    for speaker, text in turns:
        names.observe(speaker, text)
    for query in ("What did Ann say?", "Bob?", "", "\u2019s"):
        assert names.named(query) in (None, *[s for s, _ in turns if s])


# ----------------------------------------------------------------------- RAGMemory


def chat_memory(**options: float) -> RAGMemory:
    mem = RAGMemory(HashingEmbedder(64), background=False, **options)  # type: ignore[arg-type]
    turns = [
        ("Vanessa", "I started a pottery class on Saturdays"),
        ("Nicolas", "What about Vanessa's pottery, how is the pottery going?"),
        ("Nicolas", "Vanessa, pottery sounds fun, I tried pottery once"),
        ("Vanessa", "I love it, I made a bowl"),
        ("Nicolas", "I play football on Sundays"),
    ]
    mem.add_many(Message.user(t, name=n) for n, t in turns)
    return mem


def test_a_question_naming_one_participant_lifts_their_turns():
    query = "What does Vanessa do with pottery?"
    with chat_memory(speaker_weight=0.0) as off, chat_memory() as on:
        before = [h.message.name for h in off.search(query, k=5)]
        after = [h.message.name for h in on.search(query, k=5)]
    # BM25 matches the name where Nicolas addresses her: his two turns come first
    assert before[:3] == ["Nicolas", "Nicolas", "Vanessa"]
    assert after.index("Vanessa") < before.index("Vanessa")
    assert after[:4].count("Vanessa") == 2


def test_speaker_weight_is_validated_and_zero_is_off():
    with pytest.raises(ValueError, match="speaker_weight"):
        RAGMemory(None, speaker_weight=-1)
    with chat_memory(speaker_weight=0.0) as mem:
        assert mem.ranking.speaker_weight == 0.0


def test_an_alias_several_speakers_share_names_none_of_them():
    # a big store's speakers share learned aliases ("sunday": "See you Sunday!"); named()
    # compares each distinct name once, for all the speakers it names
    names = SpeakerNames()
    for who in ["Ana", "Ben", "Cleo"]:
        for _ in range(3):
            names.observe(who, "hello", thread=who)
            names.observe("Zed", "See you Sunday", thread=who)
    aliases = names.aliases()
    assert all("sunday" in aliases[who] for who in ["Ana", "Ben", "Cleo"])
    assert names.named("What happened on Sunday?") is None
    assert names.named("What did Cleo do on Sunday?") is None  # Cleo, and all three
    assert names.named("What did Cleo say?") == "Cleo"
    assert names.named("What did Cleo say?", ["Dora"]) == "Cleo"
    assert names.named("Did Dora and Cleo meet?", ["Dora"]) is None


def test_same_name_agrees_with_difflib():
    import difflib

    from marsys_mem.retrieval.speakers import FUZZY, same_name

    words = ["kate", "katie", "kathrine", "muhammad", "muhhamed", "maya", "mayaaaaaa", "max"]
    for word in words:
        for name in words:
            ratio = difflib.SequenceMatcher(None, word, name).ratio()
            fuzzy = min(len(word), len(name)) >= 4 and word[0] == name[0] and ratio >= FUZZY
            assert same_name(word, name) == (word == name or fuzzy)


def _addressed_by_regex(text: str) -> list[str]:
    """What observe counted before it went faster: every match of both patterns, in order."""
    words = []
    for pattern in (speakers._GREETING, speakers._LAST_WORD):
        for found in pattern.finditer(text):
            if found.group(1)[0].isupper():
                words.append(found.group(1))
    return words


# greetings, names, the endings the last word may have, and characters that lower() or
# IGNORECASE treat apart (the Kelvin sign, a long s, a dotted capital I)
_PIECES = st.sampled_from(
    [
        "hi", "Hey", "THANK YOU", "thank  you", "oh", "no", "bye", "Kate", "KATE", "ana",
        "Ana", "Bo", "Zoe", "Émile", "\u212aate", "\u017fam", "\u0130van", " ", "  ", ",",
        ", ", "!", "?", ".", "...", "\n", "\t", "\u00a0", "\u2003", "'", "\u2019", "x",
        "I'm", "I am", "my name is", "call me",
    ]
)  # fmt: skip


@given(st.lists(_PIECES, max_size=12).map("".join))
def test_addressed_words_are_the_patterns_matches(text):
    assert speakers._addressed(text) == _addressed_by_regex(text)
    cued = any(cue in text for cue in speakers._INTRO_CUES)
    assert cued or not speakers._INTRO.search(text)


def test_addressed_words_on_chat_turns():
    texts = [t for _, t in CHAT] + [
        "See you soon, Kate!\n",
        "see you soon,Kate. ?",
        "Kate",
        "bye Ana ,Kate",
        "hello ÉMILE, hi Ana",
        "ok  Kate!!  ",
        "ok Kate\n\n",
    ]
    for text in texts:
        assert speakers._addressed(text) == _addressed_by_regex(text), text
