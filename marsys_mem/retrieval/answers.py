"""Who answers a question about a participant: their own voice, and the turns that answer.

Three cues of a conversation between people, for a hybrid search:

* :func:`in_first_person`: a question about one participant ("What are Kate's
  hobbies?") is answered by her own words ("I love skiing"), so the search looks for it
  as she would say it ("What are my hobbies?"), which the dense side matches better than
  the question without her name ("What are hobbies?").
* :func:`tells_of_self`: a turn in which its speaker tells about themselves ("I", "my")
  answers more questions than one that speaks to the listener ("you", "your": "It's great
  that you prepared everything!").
* :func:`answers_question`: the turn right after another speaker's question is its
  answer, so a candidate whose previous turn is a question from someone else is lent
  more of that question's match than the usual context weight.

English pronouns only; plain regular expressions. Measured on REALTALK
(``benchmarks/bench_realtalk.py``, step "answers").
"""

from __future__ import annotations

import re
from collections.abc import Collection

import numpy as np
import numpy.typing as npt

from marsys_mem.retrieval.bm25 import STOP_WORDS, tokenize
from marsys_mem.retrieval.speakers import normal_word, same_name

__all__ = ["answers_question", "in_first_person", "tells_of_self"]

_QUOTE = "\u2019"
_WORD = re.compile(rf"[^\W\d_][^\W\d_'{_QUOTE}]*(?:['{_QUOTE}][^\W\d_]+)?")
_POSSESSIVE = re.compile(rf"['{_QUOTE}]s?$")

_OBJECT_AFTER = frozenset(
    """to with for about from at by of than like on gave give gives told tell tells asked
    ask asks help helped helps recommend recommended offer offered offers advise advised
    suggest suggested invite invited send sent show showed visit visited call called teach
    taught make made upset bother bothers bothered worry worries worried""".split()
)
"""Words after which a person is the object ("gave Kate" -> "gave me")."""

_ONE = {"does": "do", "doesn't": "don't", "is": "am", "isn't": "am not", "has": "have"}
_ONE |= {"hasn't": "haven't"}
"""A verb before a participant who becomes "I" ("does Kate" -> "do I")."""
_TWO = {"does": "do", "doesn't": "don't", "is": "are", "isn't": "aren't", "has": "have"}
_TWO |= {"hasn't": "haven't", "was": "were", "wasn't": "weren't"}
"""A verb before a pair who becomes "we" ("was Kate and Elise" -> "were we")."""
_THIRD = {"he": "I", "she": "I", "his": "my", "him": "me", "himself": "myself"}
_THIRD |= {"herself": "myself"}
"""Third-person pronouns, which refer to the one participant named."""


def _is_name(word: str, names: Collection[str]) -> bool:
    base = normal_word(_POSSESSIVE.sub("", word) if len(word) > 4 else word)
    return len(base) >= 3 and base not in STOP_WORDS and any(same_name(base, n) for n in names)


def _cased(word: str, start: int) -> str:
    """``word`` capitalised when it starts the query."""
    return word[0].upper() + word[1:] if start == 0 and word != "I" else word


def in_first_person(query: str, names: Collection[str]) -> str | None:
    """``query`` as the one participant it names would ask it, or ``None``.

    The participant's name becomes "I", "me" (after a preposition or a verb such as
    "gave") or "my" (a possessive); "he", "she", "his", "her", "him" become the first
    person too, and the verb before the new subject agrees ("does Kate" -> "do I").
    Two participants joined by "and" become "we", "us" or "our". ``None`` when the
    query names no participant, or several apart (whose voice it is is not clear), or
    when nothing but pronouns and stop words would be left.

    Args:
        query: the question.
        names: the participants' name words, lowercased (matched as
            :func:`~marsys_mem.retrieval.speakers.same_name` does, possessives included).

    Example:
        >>> in_first_person("What are Kate's hobbies?", {"kate"})
        'What are my hobbies?'
        >>> in_first_person("Does Kate like her job?", {"kate"})
        'Do I like my job?'
        >>> in_first_person("What do Elise and Kate have in common?", {"kate", "elise"})
        'What do we have in common?'
        >>> in_first_person("Kate's?", {"kate"}) is None  # nothing else: no query
        True
        >>> in_first_person("What did Kate give Elise?", {"kate", "elise"}) is None
        True
    """
    if not names:
        return None
    words = list(_WORD.finditer(query))
    named = [_is_name(m.group(0), names) for m in words]
    if not any(named):
        return None
    edits: list[tuple[int, int, str]] = []  # (start, end, replacement)
    subjects: list[tuple[int, dict[str, str]]] = []  # (word index, verb agreement)
    singles: set[str] = set()
    pair = False
    i = 0
    while i < len(words):
        if not named[i]:
            i += 1
            continue
        word = words[i].group(0)
        before = words[i - 1].group(0).lower() if i else ""
        if i + 2 < len(words) and words[i + 1].group(0).lower() == "and" and named[i + 2]:
            last = words[i + 2].group(0)
            possessive = bool(_POSSESSIVE.search(last)) and len(last) > 4
            new = "our" if possessive else "us" if before in _OBJECT_AFTER else "we"
            edits.append((words[i].start(), words[i + 2].end(), _cased(new, words[i].start())))
            if new == "we":
                subjects.append((i, _TWO))
            pair = True
            i += 3
            continue
        singles.add(normal_word(_POSSESSIVE.sub("", word)))
        possessive = bool(_POSSESSIVE.search(word)) and len(word) > 4
        new = "my" if possessive else "me" if before in _OBJECT_AFTER else "I"
        edits.append((words[i].start(), words[i].end(), _cased(new, words[i].start())))
        if new == "I":
            subjects.append((i, _ONE))
        i += 1
    if len(singles) + pair > 1:
        return None
    if singles:  # one participant: "she", "her" are her too
        for j, m in enumerate(words):
            low = m.group(0).lower()
            pronoun = _THIRD.get(low)
            if low == "her":
                after = words[j + 1].group(0).lower() if j + 1 < len(words) else ""
                pronoun = "my" if after and after not in STOP_WORDS else "me"
            if pronoun is not None:
                edits.append((m.start(), m.end(), _cased(pronoun, m.start())))
                if pronoun == "I":
                    subjects.append((j, _ONE))
    for j, agree in subjects:
        if j:
            verb = words[j - 1]
            agreed = agree.get(verb.group(0).lower().replace(_QUOTE, "'"))
            if agreed is not None:
                edits.append((verb.start(), verb.end(), _cased(agreed, verb.start())))
    out = query
    for start, end, new in sorted(edits, reverse=True):
        out = out[:start] + new + out[end:]
    return out if tokenize(out) else None  # nothing but pronouns left


_FIRST = re.compile(
    rf"\b(?:i|im|ive|my|me|mine|myself)\b|\bi['{_QUOTE}](?:m|ve|d|ll)\b", re.IGNORECASE
)
_SECOND = re.compile(
    rf"\b(?:you|your|youre|yours|yourself|yourselves|u|ur)\b|\byou['{_QUOTE}](?:re|ve|d|ll)\b",
    re.IGNORECASE,
)


def tells_of_self(text: str) -> float:
    """How much ``text`` speaks of its speaker rather than to the listener.

    1.0 when it says "I", "me", "my" more often than "you", "your"; 0.0 when less often;
    0.5 when as often (none of either included).

    Example:
        >>> tells_of_self("I love skiing, it's my favorite sport")
        1.0
        >>> tells_of_self("It's great that you prepared your ingredients!")
        0.0
        >>> tells_of_self("Lovely weather today"), tells_of_self("I told you so")
        (0.5, 0.5)
    """
    first = len(_FIRST.findall(text))
    second = len(_SECOND.findall(text))
    return 1.0 if first > second else 0.0 if second > first else 0.5


def answers_question(
    asks: npt.NDArray[np.bool_],
    speakers: npt.NDArray[np.intp],
    turns: npt.NDArray[np.intp],
    previous: npt.NDArray[np.intp],
) -> npt.NDArray[np.bool_]:
    """Which turns answer a question: the turn before each is another speaker's question.

    Args:
        asks: per message, whether it asks (:func:`~marsys_mem.retrieval.questions.asks`);
            the last cell stands for "no such turn" and must be ``False``.
        speakers: per message, a number for its speaker (the same number: the same
            speaker; messages of no known speaker share one number).
        turns: positions (in ``asks``) of the turns to test.
        previous: the position of each one's previous turn (the last cell: none).

    Returns:
        Per turn of ``turns``, whether it answers its previous turn's question.

    Example:
        >>> asks = np.array([True, False, True, False, False])  # last: "no such turn"
        >>> speakers = np.array([0, 1, 1, 1, -1])
        >>> answers_question(asks, speakers, np.array([1, 3, 0]), np.array([0, 2, 4])).tolist()
        [True, False, False]
    """
    found: npt.NDArray[np.bool_] = asks[previous] & (speakers[previous] != speakers[turns])
    return found
