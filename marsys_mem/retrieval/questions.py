"""Turns that ask: a question repeats the words of what it asks about, and seldom answers it.

In a conversation the turn "What are your plans for New Year's Eve?" matches the query
"What plans did Kevin have for New Year's Eve?" on both sides, better than the answer it
got ("I reserved a sushi place with my family"). On REALTALK's first five chats, 25% of
the evidence turns end with a question mark but 38% of the hybrid top 10 did, so a hybrid
search ranks the turns that ask a little below the turns that tell
(``RAGMemory(question_weight=...)``); a turn after a question still gains from it (the
ranker's context), so the answer is found through the question.
"""

from __future__ import annotations

__all__ = ["QUESTION_MARKS", "asks"]

QUESTION_MARKS = ("?", "\uff1f", "\u061f")
"""What ends a question: the question mark, its full-width form and the Arabic one."""


def asks(text: str) -> bool:
    """Whether ``text`` asks: its last character, spaces aside, is a question mark.

    Example:
        >>> asks("What are your plans for New Year's Eve? "), asks("I booked a table.")
        (True, False)
        >>> asks("Did you go? I did!")  # it ends by telling
        False
    """
    return text.rstrip().endswith(QUESTION_MARKS)
