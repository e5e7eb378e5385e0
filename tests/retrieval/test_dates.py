from datetime import UTC, datetime

import pytest

from marsys_mem.retrieval.dates import Period, asks_when, mentions_time, query_period


@pytest.mark.parametrize(
    ("query", "period"),
    [
        ("What broke on Maya's car in July 2023?", Period(2023, 7)),
        ("what did she cook in march?", Period(None, 3)),
        ("Anything from early Sept. 2022?", Period(2022, 9)),
        ("What happened back in 2021?", Period(2021, None)),
        ("Notes of 2024-05-08 please", Period(2024, 5, 8)),
        ("news from around December, 2020", Period(2020, 12)),
    ],
)
def test_query_period(query, period):
    assert query_period(query) == period


@pytest.mark.parametrize(
    "query",
    ["Which band does Maya like?", "May I ask where Jonas lives?", "in 3000 years", "2024-13-40"],
)
def test_no_period(query):
    assert query_period(query) is None


def test_period_contains():
    july = Period(2023, 7)
    assert july.contains(datetime(2023, 7, 1, tzinfo=UTC))
    assert not july.contains(datetime(2023, 8, 1, tzinfo=UTC))
    assert not july.contains(datetime(2022, 7, 1, tzinfo=UTC))
    assert Period(None, 7).contains(datetime(2019, 7, 31, tzinfo=UTC))
    assert Period(2023, None).contains(datetime(2023, 1, 1, tzinfo=UTC))
    assert not Period(2023, 5, 8).contains(datetime(2023, 5, 9, tzinfo=UTC))


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("When did Maya adopt the dog?", True),
        ("what date was the recital", True),
        ("How long ago did they move?", True),
        ("Do you remember when did we meet", True),
        ("Where does Maya live?", False),
        ("Whenever you can, send the file", False),
    ],
)
def test_asks_when(query, expected):
    assert asks_when(query) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("We went to the shelter on Saturday", True),
        ("Finally, last night! The ending wrecked me", True),
        ("Had my interview this morning", True),
        ("Ever since the storm in 2015 I stay ashore", True),
        ("I've had the tickets since March", True),
        ("Lovely, tell her congratulations!", False),
        ("The monday.com board is a mess", True),
    ],
)
def test_mentions_time(text, expected):
    assert mentions_time(text) is expected
