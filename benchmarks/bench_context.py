"""Context windows and appends: marsys-mem against langchain-core's ``trim_messages``.

Run it (about 1 minute on a 2-core machine; ``--quick``: about 30 s)::

    pip install langchain-core && python benchmarks/bench_context.py
    python benchmarks/bench_context.py --quick

langchain-core is only needed by this script; it is not a dependency of marsys-mem.

What it measures, on the same synthetic conversation (a system message, user/assistant
turns, and tool-call groups: an assistant message with ``tool_calls`` followed by its tool
results) of 100, 1k, 10k and 100k messages, under ``max_tokens=8000``. Turns are generated
newest first, so the histories share their newest turns and the windows at 1k, 10k and
100k are the same messages: only the length of the history differs.

* ``ConversationMemory.context`` with ``sliding_window``: ours, on an indexed history
  (O(window)).
* ``langchain_core.messages.trim_messages`` on the same messages converted to langchain
  messages (``SystemMessage``, ``HumanMessage``, ``AIMessage`` with ``tool_calls``,
  ``ToolMessage``), with ``strategy="last"``, ``include_system=True``,
  ``allow_partial=False``, ``start_on="human"``. Its token counter applies exactly our
  ``HeuristicCounter`` rule to each message (checked message by message), so both sides
  count the same tokens, and both windows are printed (messages, tokens). It recounts the
  list on every call: that is the point.
* ``summarize``, second call: ours, the summary cached and no new messages. The first call
  uses a cheap stand-in summariser, since only the cached call is timed.
* ``build_context`` on a plain Python list: ours, indexing the list on every call, so it
  costs O(history); shown to make the difference with the indexed memory visible.
* Appends: ``ConversationMemory.add`` of prebuilt, never-counted messages, in messages/s,
  next to a plain ``list.append`` of the same messages (the floor; all that langchain's
  deprecated ``InMemoryChatMessageHistory.add_message`` does).

Each time is the median per call of several samples (``time.perf_counter``; a few warm-up
calls; fast calls looped within a sample; the garbage collector paused while sampling, as
``timeit`` does). Samples are taken round-robin over every op and size, so the machine's
noise falls evenly on all of them. Ratio = trim_messages time / ours (above 1: ours is
faster). A "Targets" section says PASS/FAIL for each goal of the issue.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import platform
import pstats
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

try:
    from langchain_core import __version__ as LC_VERSION
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
        trim_messages,
    )
except ImportError:
    sys.exit(
        "This benchmark compares against langchain-core, which is not installed.\n"
        "Install it (for the benchmark only; marsys-mem does not need it):\n\n"
        "    pip install langchain-core\n"
    )

import marsys_mem
from marsys_mem import ContextPolicy, ConversationMemory, HeuristicCounter, Message, ToolCall
from marsys_mem.context import build_context

SIZES = (100, 1_000, 10_000, 100_000)
MAX_TOKENS = 8000
O_WINDOW_MARGIN = 1.25  # 100k may cost at most this times the 1k time (timing noise)
TARGET_SPEEDUP = 50.0
TARGET_APPENDS = 200_000.0

_WORDS = (
    "the agent plans a search for quarterly revenue growth in tokyo and reports numbers "
    "memory context window token budget tool result weather forecast summary user asks "
    "assistant answers research branch planner finds facts shares insight data table "
    "latency throughput index message history retention policy vector recall episode"
).split()


# ---------------------------------------------------------------------- the conversation
def _text(rng: random.Random, lo: int, hi: int) -> str:
    """Sentences of random words, between ``lo`` and ``hi`` characters long."""
    target = rng.randint(lo, hi)
    out: list[str] = []
    size = 0
    while size < target:
        sentence = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 14)))
        sentence = sentence.capitalize() + rng.choice(".?!")
        out.append(sentence)
        size += len(sentence) + 1
    return " ".join(out)[:target]


def _turn(i: int, seed: int) -> list[Message]:
    """Turn ``i`` counted from the newest (0): a chat turn, or about one in four a tool turn.

    A tool turn is: user, assistant with one or two tool calls, one tool result per call,
    assistant answer. The content depends only on ``(seed, i)``.
    """
    rng = random.Random(seed * 1_000_003 + i)
    if rng.random() < 0.25:
        calls = [
            ToolCall(
                id=f"call_{i}_{k}",
                name="search",
                arguments={"query": _text(rng, 10, 40), "limit": rng.randint(1, 9)},
            )
            for k in range(rng.choice((1, 1, 2)))
        ]
        return [
            Message.user(_text(rng, 40, 240)),
            Message.assistant("", tool_calls=calls),
            *(Message.tool(_text(rng, 150, 900), tool_call_id=c.id, name="search") for c in calls),
            Message.assistant(_text(rng, 80, 500)),
        ]
    return [Message.user(_text(rng, 20, 300)), Message.assistant(_text(rng, 60, 700))]


def make_conversation(n: int, *, seed: int = 7, system: bool = True) -> list[Message]:
    """``n`` messages: a system message, then user/assistant turns and tool-call groups.

    Turns are generated newest first, so every size shares the same newest turns: the
    windows at 1k, 10k and 100k messages are the same messages, and only the length of the
    history differs. Short user messages right after the system message make the length
    exactly ``n``; the history ends on a complete turn.
    """
    turns: list[list[Message]] = []
    count = 1 if system else 0
    while True:
        turn = _turn(len(turns), seed)
        if count + len(turn) > n:
            break
        turns.append(turn)
        count += len(turn)
    rng = random.Random(seed)
    msgs: list[Message] = []
    if system:
        msgs.append(Message.system("You are a careful research assistant. " + _text(rng, 80, 200)))
    msgs.extend(Message.user(_text(rng, 20, 120)) for _ in range(n - count))
    for turn in reversed(turns):
        msgs.extend(turn)
    assert len(msgs) == n
    return msgs


def to_langchain(msgs: Sequence[Message]) -> list[BaseMessage]:
    """The same conversation as langchain messages."""
    out: list[BaseMessage] = []
    for m in msgs:
        if m.role == "system":
            out.append(SystemMessage(m.text))
        elif m.role == "user":
            out.append(HumanMessage(m.text))
        elif m.role == "assistant":
            calls = [
                {"name": c.name, "args": dict(c.arguments), "id": c.id, "type": "tool_call"}
                for c in m.tool_calls
            ]
            out.append(AIMessage(m.text, tool_calls=calls))
        elif m.role == "tool":
            assert m.tool_call_id is not None
            out.append(ToolMessage(m.text, tool_call_id=m.tool_call_id, name=m.name))
        else:  # pragma: no cover - the generator makes no other roles
            raise ValueError(m.role)
    return out


# ---------------------------------------------------------------------- same token rule
_HEURISTIC = HeuristicCounter()
_CPT = _HEURISTIC.chars_per_token
_OVERHEAD = _HEURISTIC.per_message_overhead


def _ceil_tokens(text: str) -> int:
    return int(-(-len(text) // _CPT)) if text else 0


def lc_message_tokens(msg: BaseMessage) -> int:
    """Our ``HeuristicCounter`` rule, applied to one langchain message (text content only)."""
    content = msg.content
    n = _ceil_tokens(content if isinstance(content, str) else json.dumps(content))
    parts: list[str] = []
    if msg.name:
        parts.append(msg.name)
    tool_call_id = getattr(msg, "tool_call_id", None)
    if tool_call_id:
        parts.append(tool_call_id)
    for call in getattr(msg, "tool_calls", None) or ():
        parts.extend((call["id"] or "", call["name"], json.dumps(call["args"], ensure_ascii=False)))
    if parts:
        n += _ceil_tokens(" ".join(parts))
    return n + _OVERHEAD


def lc_token_counter(messages: list[BaseMessage]) -> int:
    """List counter for ``trim_messages``: the heuristic summed over the messages."""
    return sum(lc_message_tokens(m) for m in messages)


def lc_trim(lc_msgs: list[BaseMessage]) -> list[BaseMessage]:
    return trim_messages(
        lc_msgs,
        max_tokens=MAX_TOKENS,
        token_counter=lc_token_counter,
        strategy="last",
        include_system=True,
        allow_partial=False,
        start_on="human",
    )


def stand_in_summary(messages: list[Message]) -> str:
    """A cheap summariser: bullets from the last 12 messages, at most ~2000 characters.

    Shaped like the default ``ExtractiveSummarizer``'s output, but its cost does not grow
    with the history, so the first ``summarize`` call times marsys-mem's own work (the
    extractive one reads every message: seconds on a 100k history, and only once).
    """
    lines = ["Summary of earlier conversation:"]
    lines += [f"- {m.role}: {m.text[:150]}" for m in messages[-12:] if m.text]
    return "\n".join(lines)[:2000]


# ---------------------------------------------------------------------- timing
@dataclass
class Op:
    """One timed operation: ``fn`` called ``number`` times per sample."""

    fn: Callable[[], object]
    number: int = 1
    samples: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        """Median seconds per call."""
        return statistics.median(self.samples)


def calibrate(op: Op, *, warmup: int, min_sample: float) -> None:
    """Warm ``op`` up and pick how many calls make one sample last ``min_sample``."""
    for _ in range(warmup):
        op.fn()
    t0 = time.perf_counter()
    op.fn()
    once = time.perf_counter() - t0
    op.number = max(1, min(10_000, int(min_sample / once) if once > 0 else 10_000))


def sample(op: Op) -> None:
    """Add one sample (seconds per call) to ``op``."""
    fn, number = op.fn, op.number
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    op.samples.append((time.perf_counter() - t0) / number)


def measure_round_robin(ops: Sequence[Op], *, repeats: int) -> None:
    """``repeats`` rounds, each taking one sample of every op, the garbage collector paused.

    Interleaving spreads the machine's noise evenly over the ops (and history sizes), so
    their medians can be compared with each other.
    """
    gc.collect()
    gc.freeze()  # the histories are long-lived: keep them out of later collections
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            for op in ops:
                sample(op)
                gc.collect(0)  # between samples: drop what the calls left, cheaply
    finally:
        if was_enabled:
            gc.enable()


def function_calls(fn: Callable[[], object]) -> int:
    """Python function calls made by one call of ``fn`` (deterministic work measure)."""
    prof = cProfile.Profile()
    prof.runcall(fn)
    return int(pstats.Stats(prof).total_calls)  # type: ignore[attr-defined]


def fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def fmt_rate(per_s: float) -> str:
    return f"{per_s / 1e3:,.0f}k msg/s" if per_s < 1e6 else f"{per_s / 1e6:.2f}M msg/s"


# ---------------------------------------------------------------------- one history size
@dataclass
class Case:
    """One history size: its ops, window checks and one-off numbers."""

    size: int
    sliding: Op
    trim: Op
    summarize: Op
    listed: Op
    check: str
    sliding_calls: int
    summarize_first: float


def prepare(n: int) -> Case:
    """Build the history of ``n`` messages on both sides and check the windows agree."""
    msgs = make_conversation(n)
    lc_msgs = to_langchain(msgs)
    mem = ConversationMemory(msgs)
    counter = HeuristicCounter()

    # Same tokens on both sides, message by message.
    for m, lm in zip(msgs, lc_msgs, strict=True):
        ours_t, theirs_t = counter.count(m), lc_message_tokens(lm)
        if ours_t != theirs_t:
            raise AssertionError(f"token rule differs: {ours_t} vs {theirs_t} for {m!r}")

    sliding_policy = ContextPolicy(max_tokens=MAX_TOKENS)
    summarize_policy = ContextPolicy(max_tokens=MAX_TOKENS, strategy="summarize")

    win = mem.context(sliding_policy)
    lc_win = lc_trim(lc_msgs)
    lc_tokens = lc_token_counter(lc_win)
    list_win = build_context(msgs, sliding_policy, counter=counter)
    assert [m.message_id for m in list_win] == [m.message_id for m in win]
    assert win.tokens <= MAX_TOKENS
    assert lc_tokens <= MAX_TOKENS
    # The first summarize call summarises everything before the window, once; later calls
    # with no new messages reuse the cached summary.
    sum_mem = ConversationMemory(msgs)
    summarizer = stand_in_summary
    t0 = time.perf_counter()
    sum_win = sum_mem.context(summarize_policy, summarizer=summarizer)
    summarize_first = time.perf_counter() - t0
    again = sum_mem.context(summarize_policy, summarizer=summarizer)
    assert again.summarized == 0
    kept = [m.message_id for m in sum_win if m is not sum_win.summary]
    assert [m.message_id for m in again if m is not again.summary] == kept

    check = (
        f"{n:>7,} msgs ({mem.total_tokens:,} tokens): "
        f"marsys-mem sliding_window {len(win)} msgs / {win.tokens} tokens; "
        f"trim_messages {len(lc_win)} msgs / {lc_tokens} tokens; "
        f"summarize {len(sum_win)} msgs / {sum_win.tokens} tokens "
        f"(summary covers {sum_win.summarized:,} msgs)"
    )
    return Case(
        size=n,
        sliding=Op(lambda: mem.context(sliding_policy)),
        trim=Op(lambda: lc_trim(lc_msgs)),
        summarize=Op(lambda: sum_mem.context(summarize_policy, summarizer=summarizer)),
        listed=Op(lambda: build_context(msgs, sliding_policy, counter=counter)),
        check=check,
        sliding_calls=function_calls(lambda: mem.context(sliding_policy)),
        summarize_first=summarize_first,
    )


def ops_of(case: Case) -> list[Op]:
    return [case.sliding, case.trim, case.summarize, case.listed]


# ---------------------------------------------------------------------- appends
def bench_appends(batch: int, runs: int) -> tuple[float, float, float]:
    """Median messages/s of ``ConversationMemory.add`` and of a plain ``list.append``.

    Every run appends fresh, never-counted messages to a new memory (``add`` validates
    ids and tool links, indexes the message and counts and caches its tokens). The list
    append of the same messages is the floor: it is all that langchain-core's (deprecated)
    ``InMemoryChatMessageHistory.add_message`` does. Also returns the share of a CPU this
    process got while appending (CPU time / wall time): well below 1, the box was busy.
    """
    batches = [make_conversation(batch, seed=100 + r, system=False) for r in range(runs + 1)]
    ours: list[float] = []
    floor: list[float] = []
    cpu = wall = 0.0
    was_enabled = gc.isenabled()
    for r, prebuilt in enumerate(batches):
        mem = ConversationMemory()
        add = mem.add
        plain: list[Message] = []
        append = plain.append
        gc.collect(0)
        gc.disable()
        try:
            c0, t0 = time.process_time(), time.perf_counter()
            for m in prebuilt:
                add(m)
            t_ours = time.perf_counter() - t0
            c_ours = time.process_time() - c0
            t0 = time.perf_counter()
            for m in prebuilt:
                append(m)
            t_floor = time.perf_counter() - t0
        finally:
            if was_enabled:
                gc.enable()
        assert len(mem) == batch
        if r:  # run 0 is the warm-up
            ours.append(batch / t_ours)
            floor.append(batch / t_floor)
            cpu += c_ours
            wall += t_ours
    return statistics.median(ours), statistics.median(floor), cpu / wall


# ---------------------------------------------------------------------- main
def machine_info() -> str:
    return (
        f"Python {platform.python_version()} ({platform.python_implementation()}), "
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.2f} at the start; "
        f"marsys-mem {marsys_mem.__version__}, langchain-core {LC_VERSION}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples (about 30 s)")
    parser.add_argument(
        "--sizes",
        type=lambda s: tuple(int(x) for x in s.split(",")),
        default=SIZES,
        help="comma-separated history sizes (default: 100,1000,10000,100000)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        warmup, repeats, min_sample, append_batch, append_runs = 1, 5, 0.01, 10_000, 3
    else:
        warmup, repeats, min_sample, append_batch, append_runs = 3, 11, 0.05, 20_000, 9

    info = machine_info()
    started = time.perf_counter()
    cases = [prepare(n) for n in args.sizes]
    ops = [op for case in cases for op in ops_of(case)]
    for op in ops:
        calibrate(op, warmup=warmup, min_sample=min_sample)
    measure_round_robin(ops, repeats=repeats)
    ours_rate, floor_rate, cpu_share = bench_appends(append_batch, append_runs)

    print(f"# marsys-mem context windows vs langchain-core trim_messages (max_tokens={MAX_TOKENS})")
    print()
    print(info)
    print(
        f"Per call: median of {repeats} samples, taken round-robin over all ops and sizes "
        f"({warmup} warm-up calls; fast calls looped to >= {min_sample * 1e3:.0f} ms per "
        "sample). Ratio = trim_messages time / ours (above 1: ours is faster)."
    )
    print()
    print("Windows (same messages, same token rule on both sides):")
    for case in cases:
        print(f"- {case.check}")
    print()
    print("| history size | op | marsys-mem | langchain trim_messages | ratio |")
    print("|---:|---|---:|---:|---:|")
    for case in cases:
        trim = case.trim.median
        rows = [
            ("sliding_window: ConversationMemory.context", case.sliding.median, trim),
            ("summarize, 2nd call (cached summary): ConversationMemory.context",
             case.summarize.median, None),
            ("sliding_window on a plain list: build_context (O(history))",
             case.listed.median, trim),
        ]  # fmt: skip
        for op, ours, theirs in rows:
            theirs_s = fmt_time(theirs) if theirs is not None else "n/a"
            ratio = f"{theirs / ours:,.1f}x" if theirs is not None else "n/a"
            print(f"| {case.size:,} | {op} | {fmt_time(ours)} | {theirs_s} | {ratio} |")
    print()
    print(
        f"Appends: ConversationMemory.add of prebuilt Messages: {fmt_rate(ours_rate)} "
        f"({1e6 / ours_rate:.2f} µs/msg; median of {append_runs} runs of {append_batch:,} "
        f"fresh messages). Floor, plain list.append of the same messages (all that langchain's "
        f"deprecated InMemoryChatMessageHistory.add_message does): {fmt_rate(floor_rate)} "
        f"({1e6 / floor_rate:.3f} µs/msg). This process got {cpu_share:.0%} of a CPU while "
        "appending (CPU time / wall time)."
    )
    print(
        "summarize, 1st call (one call; it collects every message before the window for the "
        "summariser, here a stand-in that reads 12 of them; not in the table): "
        + ", ".join(f"{c.size:,}: {fmt_time(c.summarize_first)}" for c in cases)
    )
    print(
        "Python function calls per ConversationMemory.context(sliding_window) call "
        "(deterministic work measure): "
        + ", ".join(f"{c.size:,}: {c.sliding_calls:,}" for c in cases)
    )
    print()

    by_size = {c.size: c for c in cases}
    print("## Targets")
    if 1_000 in by_size and 100_000 in by_size:
        small, big = by_size[1_000], by_size[100_000]
        t1k, t100k = small.sliding.median, big.sliding.median
        ok = t100k <= O_WINDOW_MARGIN * t1k
        print(
            f"- {'PASS' if ok else 'FAIL'}: a window from 100k messages costs no more than "
            f"from 1k (O(window)): {fmt_time(t100k)} vs {fmt_time(t1k)} = {t100k / t1k:.2f}x "
            f"(allowed <= {O_WINDOW_MARGIN}x for timing noise; function calls "
            f"{big.sliding_calls:,} vs {small.sliding_calls:,})"
        )
        speedup = big.trim.median / t100k
        ok = speedup >= TARGET_SPEEDUP
        print(
            f"- {'PASS' if ok else 'FAIL'}: at 100k messages, >= {TARGET_SPEEDUP:.0f}x faster "
            f"than trim_messages: {speedup:,.1f}x"
        )
    else:
        print("- SKIP: the window targets need history sizes 1000 and 100000 (see --sizes)")
    ok = ours_rate >= TARGET_APPENDS
    print(
        f"- {'PASS' if ok else 'FAIL'}: appending prebuilt Messages >= "
        f"{TARGET_APPENDS / 1e3:.0f}k msg/s: {fmt_rate(ours_rate)}"
    )
    print()
    print(f"(total run time {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
