"""Time in queries and messages: what a question asks about, and which turns say when.

Two cues help retrieval with time questions:

* :func:`query_period`: a question that names a period ("in July 2023", "in March",
  "back in 2022", "on 2023-05-08") is about messages sent then; the period is matched
  against the message timestamps (a month without a year matches that month of any year).
* :func:`asks_when` and :func:`mentions_time`: a "when did ..." question is answered by a
  turn that says when ("on Saturday", "last night", "this morning", "in 2017"), so such
  turns are preferred among equally good matches.

English only; plain regular expressions, no parsing library.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

__all__ = ["Period", "asks_when", "mentions_time", "query_period"]

_MONTHS = {
    name: i + 1
    for i, name in enumerate(
        "january february march april may june july august september october november "
        "december".split()
    )
}
_MONTH_ABBR = {name[:3]: num for name, num in _MONTHS.items() if name != "may"} | {"sept": 9}
_MONTH_RE = "|".join([*_MONTHS, *(f"{a}\\.?" for a in sorted(_MONTH_ABBR, key=len)[::-1])])
_ISO = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")
_MONTH_YEAR = re.compile(
    rf"\b(?:in|during|of|from|around|early|late|mid)[- ]+(?:({_MONTH_RE})"
    rf"(?:,? +(\d{{4}}))?|(\d{{4}}))\b",
    re.IGNORECASE,
)
_WHEN = re.compile(
    r"^\s*(?:when\b|what (?:date|day|time|year|month)\b|how long ago\b|on what (?:date|day)\b)"
    r"|\bwhen (?:did|was|were|is|will|does|do)\b",
    re.IGNORECASE,
)
_TIME_WORDS = re.compile(
    r"\b(?:yesterday|today|tonight|tomorrow|this (?:morning|afternoon|evening|week|weekend)"
    r"|last (?:night|week|weekend|month|year|summer|winter|spring|autumn|monday|tuesday|"
    r"wednesday|thursday|friday|saturday|sunday)|next (?:week|month|year)|ago|"
    r"(?:on |last |this |next )?(?:mondays?|tuesdays?|wednesdays?|thursdays?|fridays?|"
    r"saturdays?|sundays?)|(?:in |since )(?:" + _MONTH_RE + r")|(?:19|20)\d{2}|"
    r"\d{4}-\d{2}-\d{2}|first of (?:next|the) month)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class Period:
    """A period a query names: a year, a month (of a year, or of any year), or a day.

    Example:
        >>> from datetime import UTC, datetime
        >>> p = query_period("What broke on Maya's car in July 2023?")
        >>> p, p.contains(datetime(2023, 7, 14, tzinfo=UTC))
        (Period(year=2023, month=7, day=None), True)
        >>> p.contains(datetime(2024, 7, 14, tzinfo=UTC))
        False
    """

    year: int | None
    month: int | None
    day: int | None = None

    def contains(self, when: datetime) -> bool:
        """Whether ``when`` falls in the period."""
        if self.year is not None and when.year != self.year:
            return False
        if self.month is not None and when.month != self.month:
            return False
        return self.day is None or when.day == self.day


def query_period(query: str) -> Period | None:
    """The period ``query`` asks about ("in July 2023", "in March", "in 2022", an ISO date).

    Example:
        >>> query_period("what did she cook in march?"), query_period("plans for 2024-05-08")
        (Period(year=None, month=3, day=None), Period(year=2024, month=5, day=8))
        >>> query_period("Which band does Maya like?") is None
        True
    """
    iso = _ISO.search(query)
    if iso is not None:
        year, month, day = (int(g) for g in iso.groups())
        if 1 <= month <= 12 and 1 <= day <= 31:
            return Period(year, month, day)
    found = _MONTH_YEAR.search(query)
    if found is None:
        return None
    month_name, year_text, year_only = found.groups()
    if year_only is not None:
        year = int(year_only)
        return Period(year, None) if 1900 <= year <= 2100 else None
    key = month_name.lower().rstrip(".")
    month = _MONTHS.get(key) or _MONTH_ABBR.get(key) or _MONTH_ABBR[key[:3]]
    return Period(int(year_text) if year_text else None, month)


def asks_when(query: str) -> bool:
    """Whether ``query`` asks for a time ("When did ...", "What date ...", "how long ago").

    Example:
        >>> asks_when("When did Maya adopt the dog?"), asks_when("Where does Maya live?")
        (True, False)
    """
    return _WHEN.search(query) is not None


def mentions_time(text: str) -> bool:
    """Whether ``text`` says when something happened ("on Saturday", "last night", "2017").

    Example:
        >>> mentions_time("We went to the shelter on Saturday"), mentions_time("Lovely!")
        (True, False)
    """
    return _TIME_WORDS.search(text) is not None
