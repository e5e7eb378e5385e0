"""Importance scoring: how much a message deserves to stay in core memory.

:class:`~marsys_mem.patterns.hierarchical.HierarchicalMemory` keeps messages scoring at
or above its ``core_threshold`` in core memory. The score comes from the caller
(``add(message, importance=0.9)``) or from a :data:`Scorer`; :func:`default_importance`
is the offline heuristic that ships (no model): explicit requests to remember, decisions,
numbers and names raise it, chit-chat lowers it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from marsys_mem.model.messages import Message

__all__ = ["Scorer", "check_importance", "default_importance"]

Scorer = Callable[[Message], float]
"""Scores a message's importance in ``[0, 1]``."""


_REMEMBER = re.compile(
    r"\b(remember|don'?t forget|do not forget|keep in mind|note that|important|always|never)\b",
    re.IGNORECASE,
)
_DECISION = re.compile(
    r"\b(decided|decision|agreed|approved|we will|we'll|going with|chose|chosen|must|"
    r"deadline|budget|confirmed)\b",
    re.IGNORECASE,
)
_DIGIT = re.compile(r"\d")
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_CAPITALISED = re.compile(r"^[A-Z][a-z]+$")
_CHITCHAT = frozenset(
    """hi hello hey thanks thank you ok okay cool nice great lol sure yes no yep nope bye
    goodbye cheers good morning afternoon evening night np welcome sounds haha wow""".split()
)


def _has_name(text: str) -> bool:
    """A capitalised word that does not start its sentence (a rough proper-noun test)."""
    for sentence in _SENTENCE.split(text):
        words = [w.strip(".,;:!?\"'()[]") for w in sentence.split()]
        if any(_CAPITALISED.match(w) and w != "I" for w in words[1:]):
            return True
    return False


def default_importance(message: Message) -> float:
    """A simple, offline importance heuristic in ``[0, 1]``.

    * system and pinned messages (and ``metadata["preserve"]``): ``1.0``;
    * a valid ``metadata["importance"]`` already on the message: that value;
    * otherwise start at ``0.3`` and add ``0.5`` for an explicit request to remember
      ("remember", "don't forget", "important", "always", "never", ...), ``0.2`` for a
      decision or commitment ("decided", "agreed", "deadline", "budget", "must", ...),
      ``0.15`` for numbers and ``0.1`` for a name (a capitalised word inside a sentence);
      capped at ``1.0``;
    * short chit-chat (only greeting/acknowledgement words, or three words or fewer with
      none of the above): ``0.1``.

    With the default ``core_threshold=0.8``, "remember ..." with a number or a decision
    goes to core; facts with names and numbers stay in working memory.

    Example:
        >>> default_importance(Message.system("You are terse."))
        1.0
        >>> default_importance(Message.user("Remember: my locker code is 4471"))
        0.95
        >>> default_importance(Message.user("We decided to ship the release on Friday"))
        0.6
        >>> default_importance(Message.user("thanks!"))
        0.1
    """
    if message.is_protected:
        return 1.0
    given = message.metadata.get("importance")
    if (
        isinstance(given, int | float)
        and not isinstance(given, bool)
        and math.isfinite(given)
        and 0.0 <= given <= 1.0
    ):
        return float(given)
    text = message.text
    words = [w.strip(".,;:!?\"'()") for w in text.lower().split()]
    words = [w for w in words if w]
    score = 0.3
    signal = False
    if _REMEMBER.search(text):
        score += 0.5
        signal = True
    if _DECISION.search(text):
        score += 0.2
        signal = True
    if _DIGIT.search(text):
        score += 0.15
        signal = True
    if _has_name(text):
        score += 0.1
        signal = True
    if words and not signal and (all(w in _CHITCHAT for w in words) or len(words) <= 3):
        return 0.1
    return round(min(score, 1.0), 4)


def check_importance(value: object, what: str) -> float:
    """``value`` as a float in ``[0, 1]``, or a clear error naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number in [0, 1], got {value!r}")
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{what} must be a number in [0, 1], got {value!r}")
    return float(value)
