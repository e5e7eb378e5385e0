"""What a question asks about: the question without the names of the conversation's participants.

In a chat between two people a question names a participant ("What are Kate's hobbies?",
"Which cities have Kate and Elise both been to?"), but the turns that answer it seldom
say that name: they are the participant's own words ("I love skiing"). Both retrievers
match the name where it *is* said: BM25 on the turns that address her ("What about
Kate?"), and the dense side even more on such short turns, whose embedding is mostly the
name. So a hybrid search looks for the question's content, :func:`without_names` the names
of the conversation's participants (:data:`PARTICIPANT_SHARE`), and who it is about is
left to the speaker cue (:class:`~marsys_mem.retrieval.speakers.SpeakerNames`,
``RAGMemory(speaker_weight=...)``), which lifts the named participant's own turns.

On REALTALK (``benchmarks/bench_realtalk.py``), searching both sides without the names
found an evidence turn in the top 10 for 81.0% of the tune chats' questions (77.1% with
the names) and 73.0% of the report chats' (71.6%).
"""

from __future__ import annotations

import re
from collections.abc import Collection

from marsys_mem.retrieval.bm25 import STOP_WORDS, tokenize
from marsys_mem.retrieval.speakers import normal_word, same_name

__all__ = ["PARTICIPANT_SHARE", "without_names"]

PARTICIPANT_SHARE = 0.2
"""The share of a memory's messages a speaker must have written for their name to be taken
out of a query: the participants of a conversation of a few people. In a memory shared by
many conversations a name tells them apart (``benchmarks/bench_recall.py``: 14 speakers at
1k messages, none over 11% of them; taking their names out lowered its hybrid recall@10 over
all its questions from 0.876 to 0.867 at 1k messages and from 0.873 to 0.530 at 10k), so it
stays."""

_QUOTE = "\u2019"
_WORD = re.compile(rf"[^\W\d_][^\W\d_'{_QUOTE}]*(?:['{_QUOTE}][^\W\d_]+)?")
_SPACES = re.compile(r"\s+")
_BEFORE_MARK = re.compile(r"\s+(?=[?!.,;:])")


def without_names(query: str, names: Collection[str]) -> str:
    r"""``query`` without its words that are one of ``names`` (possessives included).

    A word is a name as :class:`~marsys_mem.retrieval.speakers.SpeakerNames` matches them:
    3 letters or more, exactly or as a close spelling
    (:func:`~marsys_mem.retrieval.speakers.same_name`); English stop words are kept
    ("will", "may"). When nothing but names, stop words and punctuation would be left,
    the query is returned as it is.

    Args:
        query: the question.
        names: the names to take out, lowercased (e.g.
            :meth:`~marsys_mem.retrieval.speakers.SpeakerNames.name_words`).

    Returns:
        The query without the names, its spaces collapsed.

    Example:
        >>> without_names("Which cities have both, Kate and Elise, been to?", {"kate", "elise"})
        'Which cities have both, and, been to?'
        >>> without_names("What are Kate\u2019s hobbies?", {"kate"})
        'What are hobbies?'
        >>> without_names("Kate?", {"kate"})  # nothing else: as it is
        'Kate?'
    """
    if not names:
        return query
    found = False

    def drop(match: re.Match[str]) -> str:
        nonlocal found
        word = normal_word(match.group(0))
        if len(word) < 3 or word in STOP_WORDS:
            return match.group(0)
        if any(same_name(word, name) for name in names):
            found = True
            return ""
        return match.group(0)

    content = _WORD.sub(drop, query)
    if not found:
        return query
    content = _BEFORE_MARK.sub("", _SPACES.sub(" ", content)).strip()
    return content if tokenize(content) else query
