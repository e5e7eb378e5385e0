"""Tests for marsys_mem.context.summarize: the offline ExtractiveSummarizer."""

import os
import subprocess
import sys

import pytest

from marsys_mem.context.summarize import ExtractiveSummarizer
from marsys_mem.model.messages import AgentCall, Message, ToolCall

HEADER = "Summary of earlier conversation:"

TOPICS = [
    "Tokyo",
    "budget",
    "flights",
    "hotel",
    "museum",
    "train",
    "ramen",
    "weather",
    "visa",
    "insurance",
    "luggage",
    "sushi",
]


def bullets(summary: str) -> list[str]:
    return [line[2:] for line in summary.splitlines() if line.startswith("- ")]


def assert_bounded(summary: str, s: ExtractiveSummarizer) -> None:
    assert len(summary) <= s.max_chars
    lines = summary.splitlines()
    assert lines[0] == HEADER
    assert all(line.startswith("- ") for line in lines[1:])
    assert len(lines) - 1 <= s.max_sentences


def long_conversation(n: int, offset: int = 0) -> list[Message]:
    msgs = []
    for i in range(offset, offset + n):
        topic = TOPICS[i % len(TOPICS)]
        msgs.append(
            Message.user(
                f"Question {i}: what about the {topic} for day {i}? "
                f"I really care about the {topic}. Also note item number {i * 7}."
            )
        )
        msgs.append(
            Message.assistant(
                f"For day {i} the {topic} is handled. The {topic} costs {100 + i} EUR in total. "
                "Anything else I can help with today?"
            )
        )
    return msgs


@pytest.fixture
def trip() -> list[Message]:
    return [
        Message.user("I want to book a trip to Tokyo in May. My budget is 4000 EUR."),
        Message.assistant(
            "",
            tool_calls=[
                ToolCall(id="c1", name="flights", arguments={"to": "Tokyo", "month": "May"})
            ],
        ),
        Message.tool("3 flights found, cheapest 850 EUR", tool_call_id="c1", name="flights"),
        Message.assistant("The cheapest flight to Tokyo costs 850 EUR. Shall I book it?"),
    ]


# --------------------------------------------------------------------------- basics


def test_summary_shape(trip):
    s = ExtractiveSummarizer()
    out = s(trip)
    assert out.startswith(HEADER + "\n")
    assert_bounded(out, s)
    assert "Tokyo" in out
    assert "4000 EUR" in out


def test_keeps_tool_call_and_tool_result_lines(trip):
    out = ExtractiveSummarizer()(trip)
    lines = bullets(out)
    call = [line for line in lines if "called flights(" in line]
    result = [line for line in lines if "flights returned" in line]
    assert len(call) == 1
    assert '"to": "Tokyo"' in call[0]
    assert call[0].startswith("assistant")
    assert result == ["tool flights returned: 3 flights found, cheapest 850 EUR"]


def test_agent_calls_and_speakers():
    msgs = [
        Message.agent_call("Check hotel prices in Tokyo.", name="planner"),
        Message.assistant(
            "Delegating the hotel search.",
            name="concierge",
            agent_calls=[AgentCall(agent="researcher", request="Hotel prices in Tokyo")],
        ),
    ]
    lines = bullets(ExtractiveSummarizer()(msgs))
    assert "planner (request): Check hotel prices in Tokyo." in lines
    assert "assistant (concierge) asked researcher: Hotel prices in Tokyo" in lines
    assert "assistant (concierge): Delegating the hotel search." in lines


def test_sentences_kept_in_conversation_order(trip):
    lines = bullets(ExtractiveSummarizer()(trip))
    order = ["user:", "assistant called", "tool flights", "assistant:"]
    positions = [next(i for i, line in enumerate(lines) if line.startswith(p)) for p in order]
    assert positions == sorted(positions)


@pytest.mark.parametrize(
    "msgs",
    [[], [Message.user("ok")], [Message.assistant(None)], [Message.user("")]],
    ids=["empty", "too-short", "none-content", "empty-content"],
)
def test_nothing_to_summarise_gives_empty_string(msgs):
    assert ExtractiveSummarizer()(msgs) == ""


def test_long_sentences_are_cut_to_max_line():
    s = ExtractiveSummarizer(max_line=30)
    out = s([Message.user("word " * 100), Message.tool("z" * 500, tool_call_id="c")])
    for line in bullets(out):
        body = line.split(": ", 1)[1]
        assert len(body) <= 30


def test_duplicate_sentences_appear_once():
    msgs = [Message.user("The budget is 4000 EUR.") for _ in range(5)]
    lines = bullets(ExtractiveSummarizer()(msgs))
    assert lines == ["user: The budget is 4000 EUR."]


# --------------------------------------------------------------------------- determinism


def test_deterministic_across_calls_and_instances():
    msgs = long_conversation(30)
    a = ExtractiveSummarizer(max_sentences=8)(msgs)
    b = ExtractiveSummarizer(max_sentences=8)(msgs)
    s = ExtractiveSummarizer(max_sentences=8)
    assert a == b == s(msgs) == s(list(msgs))


def test_deterministic_across_hash_seeds():
    code = (
        "from marsys_mem.model.messages import Message\n"
        "from marsys_mem.context.summarize import ExtractiveSummarizer\n"
        "topics = ['alpha beta', 'gamma delta', 'beta gamma', 'delta alpha', 'epsilon zeta']\n"
        "msgs = [Message.user(f'Note {i}: {t} matters. The {t} value is {i}.')"
        " for i, t in enumerate(topics * 6)]\n"
        "print(ExtractiveSummarizer(max_sentences=6)(msgs))\n"
    )
    outs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
        )
        outs.add(proc.stdout)
    assert len(outs) == 1
    assert outs.pop().startswith(HEADER)


# --------------------------------------------------------------------------- bounds


@pytest.mark.parametrize(
    ("max_sentences", "max_chars"), [(1, 2000), (5, 2000), (12, 400), (50, 300), (3, 40)]
)
def test_bounded_for_long_inputs(max_sentences, max_chars):
    s = ExtractiveSummarizer(max_sentences=max_sentences, max_chars=max_chars)
    out = s(long_conversation(200))
    assert_bounded(out, s)


def test_default_bounds_long_input():
    s = ExtractiveSummarizer()
    out = s(long_conversation(300))
    assert_bounded(out, s)
    assert len(bullets(out)) == 12


def test_frequent_topic_wins():
    msgs = [Message.user(f"The Tokyo budget is tight, note {i}.") for i in range(10)]
    msgs.append(Message.user("Random unrelated aside about gardening tools."))
    lines = bullets(ExtractiveSummarizer(max_sentences=3)(msgs))
    assert len(lines) == 3
    assert all("Tokyo budget" in line for line in lines)


# --------------------------------------------------------------------------- incremental


def as_summary(text: str) -> Message:
    return Message.system(text, metadata={"summary": True})


def test_extends_previous_summary(trip):
    s = ExtractiveSummarizer()
    first = s(trip)
    new = [
        Message.user("Please also reserve a hotel near Shinjuku station."),
        Message.assistant("Hotel Gracery in Shinjuku is reserved for May 3 to May 10."),
    ]
    second = s([as_summary(first), *new])
    assert_bounded(second, s)
    assert "4000 EUR" in second  # from the previous summary
    assert "flights returned" in second  # a previous tool line
    assert "Shinjuku" in second  # from the new messages
    assert len(bullets(second)) == len(set(bullets(second)))  # no duplicated lines
    # the previous summary's lines are not re-prefixed with a speaker
    assert not any(line.startswith("system") for line in bullets(second))


def test_resummarising_a_summary_is_stable(trip):
    s = ExtractiveSummarizer()
    first = s(trip)
    assert s([as_summary(first)]) == first


def test_non_summary_system_message_is_summarised_as_text():
    s = ExtractiveSummarizer()
    out = s([Message.system("Always answer in French."), Message.user("Bonjour, ca va?")])
    assert "system: Always answer in French." in out


def test_stays_bounded_over_many_incremental_calls():
    s = ExtractiveSummarizer(max_sentences=6, max_chars=600)
    summary = ""
    sizes = []
    for step in range(60):
        batch = long_conversation(2, offset=step * 2)
        msgs = [as_summary(summary), *batch] if summary else batch
        summary = s(msgs)
        assert_bounded(summary, s)
        sizes.append(len(summary))
    assert max(sizes) <= 600
    assert len(bullets(summary)) >= 1


def test_prose_previous_summary_is_not_discarded():
    s = ExtractiveSummarizer()
    prev = as_summary("The user has a budget of 4000 EUR for the Tokyo trip.")
    out = s([prev, Message.user("Please find a hotel near the station.")])
    assert "4000 EUR" in out


# --------------------------------------------------------------------------- constructor


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_sentences": 0},
        {"max_sentences": -1},
        {"max_chars": 39},
        {"max_chars": 0},
        {"max_line": 19},
        {"max_line": 0},
    ],
)
def test_constructor_validation(kwargs):
    with pytest.raises(ValueError, match="max_"):
        ExtractiveSummarizer(**kwargs)


def test_constructor_limits_accepted():
    s = ExtractiveSummarizer(max_sentences=1, max_chars=40, max_line=20)
    assert (s.max_sentences, s.max_chars, s.max_line) == (1, 40, 20)
    out = s([Message.user("Tiny note here.")])
    assert_bounded(out, s)
