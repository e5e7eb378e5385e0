"""Write the notebooks in this folder from the cell sources below (stored without outputs).

Edit the cells here, then run ``python notebooks/make_notebooks.py``; the notebooks are
written with nbformat, with no outputs and no execution counts, and with stable cell ids
so a regeneration only changes what was edited. ``tests/test_notebooks.py`` executes
every notebook headless and checks that the stored ones carry no outputs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

Cell = tuple[str, str]  # ("md" | "code", source)


def md(source: str) -> Cell:
    """A markdown cell."""
    return ("md", source.strip("\n"))


def code(source: str) -> Cell:
    """A code cell."""
    return ("code", source.strip("\n"))


# ---------------------------------------------------------------------- 01 quickstart
QUICKSTART: list[Cell] = [
    md("""
# marsys-mem quickstart

Every agent keeps a typed, immutable conversation history (`ConversationMemory`) and sends
its LLM a **bounded** context window. No LLM and no network are needed for anything here.

This notebook: build a memory with a tool call, look at it, render it for a provider, then
compare the three context strategies on a long conversation, and finish with a
`MemoryManager` driven by a retention-policy file.
"""),
    code("""
from marsys_mem import ContextPolicy, ConversationMemory, Message, ToolCall

mem = ConversationMemory(
    [
        Message.system("You are a travel planner. Answer briefly and cite tool results."),
        Message.user("Goal: plan a 10-day trip under 4000 EUR.", pinned=True),
    ],
    agent="planner",
)
mem.add(Message.user("Weather in Tokyo next week?"))
call = ToolCall(id="c1", name="weather", arguments={"city": "Tokyo"})
mem.add(Message.assistant("", tool_calls=[call]))
mem.add(Message.tool("Tokyo: 18C, dry", tool_call_id="c1", name="weather"))
mem.add(Message.assistant("Mild and dry: pack a light jacket."))
mem  # the HTML view: roles, tool calls, tokens per message; 📌 marks pinned messages
"""),
    md("""
Messages are immutable and appended. `read()` gives the whole history, `appended()` only
what was added after construction (this run); token totals are kept incrementally.
"""),
    code("""
print(repr(mem))
print(len(mem.read()), "messages,", len(mem.appended()), "appended,", mem.total_tokens, "tokens")
"""),
    md("The same history in a provider's format (tool results keep their `tool_call_id`):"),
    code("""
mem.to_llm_format("openai")[2:5]
"""),
    code("""
anthropic = mem.to_llm_format("anthropic")
print(anthropic["system"])
anthropic["messages"][-3:]
"""),
    md("""
## A long conversation and three context strategies

40 more turns, each with a tool call. The whole history is far bigger than a 400-token
budget.
"""),
    code("""
CITIES = ["Lisbon", "Quito", "Oslo", "Hanoi", "Lima", "Cairo", "Perth", "Seoul"]
for turn in range(40):
    city = CITIES[turn % len(CITIES)]
    mem.add(Message.user(f"What is the weather like in {city} in week {turn}?"))
    call = ToolCall(id=f"w{turn}", name="weather", arguments={"city": city, "week": turn})
    mem.add(Message.assistant("", tool_calls=[call]))
    mem.add(Message.tool(f"{city}: {10 + turn % 15}C, light wind", tool_call_id=call.id))
    mem.add(Message.assistant(f"{city} looks fine in week {turn}; added to the plan."))
mem  # long histories show the first and last rows
"""),
    md("""
**`sliding_window`** (the default) is a view: the history stays whole, only the newest
messages that fit are sent. System and pinned messages are always kept, and a tool call is
never separated from its result.
"""),
    code("""
budget = ContextPolicy(max_tokens=400)
win = mem.context(budget)
assert win.tokens <= 400
assert win.messages[1].pinned  # the goal is pinned: always in the window
print(repr(win))
win
"""),
    md("""
**`summarize`** folds what falls out of the window into one summary message. The default
summariser is offline and extractive; the summary is cached and extended incrementally on
later calls, never recomputed from scratch.
"""),
    code("""
summary_policy = ContextPolicy(max_tokens=400, strategy="summarize", keep_recent=6)
win = mem.context(summary_policy)
print(win.summary.text[:240], "...")
win
"""),
    md("""
Any `list[Message] -> str` callable can summarise, sync or async: this is where an LLM call
goes. Here a deterministic stand-in, awaited with `acontext`:
"""),
    code("""
import asyncio


async def my_llm_summary(messages: list[Message]) -> str:
    \"\"\"Summarise ``messages`` (a real one would prompt an LLM here).\"\"\"
    await asyncio.sleep(0)  # pretend to call a model
    cities = sorted({c for m in messages for c in CITIES if c in m.text})
    return f"{len(messages)} earlier messages; weather checked for {', '.join(cities)}."


fresh = ConversationMemory(mem.read())  # a memory with no cached summary yet
win = await fresh.acontext(summary_policy, summarizer=my_llm_summary)
win.summary.text
"""),
    md("""
**`trim_oldest`** is destructive: what falls out of the window is deleted. A `fork()`
shares the parent's history copy-on-write, so trimming the fork leaves the parent whole.
"""),
    code("""
scratch = mem.fork(agent="scratch")
before = len(scratch)
win = scratch.context(ContextPolicy(max_tokens=400, strategy="trim_oldest"))
print(f"fork: {before} -> {len(scratch)} messages; parent still has {len(mem)}")
"""),
    md("What each strategy sends, against the whole history and the 400-token budget:"),
    code("""
import matplotlib.pyplot as plt

sent = {
    "whole history": mem.total_tokens,
    "sliding_window": mem.context(budget).tokens,
    "summarize": mem.context(summary_policy).tokens,
    "trim_oldest (the fork)": scratch.total_tokens,
}
fig, ax = plt.subplots(figsize=(7, 2.6))
ax.barh(list(sent), list(sent.values()), color=["grey", "C0", "C1", "C2"])
ax.axvline(400, color="red", linestyle="--", label="budget: 400 tokens")
ax.set(xscale="log", xlabel="tokens (log scale)", title="tokens sent per strategy")
ax.invert_yaxis()
ax.legend(loc="lower right")
plt.show()
"""),
    md("A budget too small for what must be kept raises `ContextOverflowError` with the numbers:"),
    code("""
from marsys_mem.exceptions import ContextOverflowError

try:
    mem.context(ContextPolicy(max_tokens=30))
except ContextOverflowError as exc:
    print(exc)
"""),
    md("""
## Retention policies and the MemoryManager

A config file says where memory is stored and how long each agent's memory lives. It is
written to a temporary folder here; a relative store path resolves against the file's
folder.
"""),
    code("""
import shutil
import tempfile
from pathlib import Path

from marsys_mem import MemoryManager

workdir = Path(tempfile.mkdtemp(prefix="marsys-quickstart-"))
config = workdir / "team.yaml"
config.write_text(
    \"\"\"
version: 1
store: {backend: sqlite, path: memory.db}
defaults:
  retention: session
  context: {max_messages: 50, max_tokens: 2000}
agents:
  researcher: {retention: persistent, ttl: 30d, max_stored_messages: 1000}
  scratchpad: {retention: single_run}
\"\"\"
)

with MemoryManager.from_config(config) as manager:
    manager.memory("researcher").add(Message.user("How much did revenue grow in Q4?"))
    with manager.run("researcher") as run:
        run.output(Message.assistant("Q4 revenue grew 12%."))
    manager.memory("planner").add(Message.user("Draft the board summary."))
    window = manager.context_for("researcher")
window
"""),
    md("A new manager on the same file (think: the next process) sees what was persistent:"),
    code("""
with MemoryManager.from_config(config) as manager:
    print("researcher:", [m.text for m in manager.memory("researcher")])
    print("planner:   ", [m.text for m in manager.memory("planner")], "(session memory)")
shutil.rmtree(workdir)
"""),
]

# ---------------------------------------------------------------------- 02 patterns
PATTERNS: list[Cell] = [
    md("""
# Memory patterns

`marsys_mem.patterns` composes on top of the conversation memory:

* `RAGMemory`: searchable messages, dense vectors + BM25, each side's scores standardised
  over the candidates and fused (z-score fusion), with the conversation around each hit.
* `EpisodicMemory`: messages grouped into episodes, recalled by meaning, summarised.
* `HierarchicalMemory`: core / working / archive tiers assembled into one context.
* `SharedMemoryPool`: facts shared between agents, once per agent, with provenance.

Most cells use `HashingEmbedder`: fast, deterministic and offline, but it matches words,
not meaning. One cell uses the packaged all-MiniLM-L6-v2 model to show the difference.
"""),
    code("""
from marsys_mem import ContextPolicy, Message
from marsys_mem.patterns import EpisodicMemory, HierarchicalMemory, RAGMemory, SharedMemoryPool
from marsys_mem.retrieval import HashingEmbedder

embedder = HashingEmbedder()
"""),
    md("""
## RAGMemory

`add` never waits for the embedder (it runs batched in the background); `search` waits for
what is pending, so results are always complete.
"""),
    code("""
NOTES = [
    "My sister Clara lives in Lisbon",
    "I parked the car on level 4 of the airport garage",
    "The quarterly report is due on Friday",
    "My puppy is called Biscuit",
    "Dinner reservation at 8pm at the harbour restaurant",
    "The wifi password at the office is on the whiteboard",
]
rag = RAGMemory(embedder)
rag.add_many(NOTES)
for hit in rag.search("Where did I park the car?", k=2):
    print(f"{hit.score:.3f}  dense={hit.dense_score:.3f}  bm25={hit.bm25_score:.3f}  {hit.text}")
"""),
    md("""
Each hit carries both sides' scores: its cosine and its BM25 score. The fused score puts the
note that shares the query's words (`parked`, `car`) far ahead:
"""),
    code("""
import matplotlib.pyplot as plt
import numpy as np

hits = rag.search("Where did I park the car?", k=len(NOTES))
best_bm25 = max(h.bm25_score for h in hits) or 1.0
rows = np.arange(len(hits))
fig, ax = plt.subplots(figsize=(8, 3))
ax.barh(rows - 0.25, [h.dense_score or 0.0 for h in hits], 0.25, label="dense (cosine)")
ax.barh(rows, [h.bm25_score / best_bm25 for h in hits], 0.25, label="BM25 / best BM25")
ax.barh(rows + 0.25, [h.score for h in hits], 0.25, label="fused (hybrid score)")
ax.set_yticks(rows, [h.text[:40] for h in hits])
ax.invert_yaxis()
ax.set(xlabel="score", title="'Where did I park the car?'")
ax.legend(loc="lower right", fontsize="small")
plt.show()
"""),
    md("""
Hashing vectors only match shared words: a paraphrase with no word in common finds nothing
useful.
"""),
    code("""
[(round(h.score, 3), h.text) for h in rag.search("What is the dog's name?", k=2)]
"""),
    md("""
The default `RAGMemory()` uses the packaged all-MiniLM-L6-v2 model (the `embeddings`
extra) and matches by meaning:
"""),
    code("""
semantic = RAGMemory()  # the packaged MiniLM model: loads once, then embeds on CPU
semantic.add_many(NOTES)
best = semantic.search("What is the dog's name?", k=1)[0]
print(best.text)
assert best.text == "My puppy is called Biscuit"
semantic.close()
"""),
    code("""
rag.close()
"""),
    md("""
## EpisodicMemory

Messages belong to the episode that was open when they were added. Recall finds messages
or whole episodes; each episode gets a summary (offline extractive by default).
"""),
    code("""
episodes = EpisodicMemory(embedder)
trip = episodes.start_episode({"task": "plan trip"})
episodes.add("We booked the hotel in Porto for May 3rd")
episodes.add("The train from Lisbon to Porto leaves at 9am")
report = episodes.start_episode({"task": "quarterly report"})
episodes.add("The quarterly report is due on Friday")
episodes.add("Revenue grew 12% in Q4, driven by the new subscription plan")
episodes.end_episode()

hit = episodes.recall("Which hotel did we book?", k=1)[0]
print(hit.text, "| episode:", hit.message.metadata["episode_id"] == trip.id)
print([m.episode.metadata["task"] for m in episodes.recall_episodes("report due", k=1)])
for episode, summary in episodes.summaries():
    print(f"{episode.metadata['task']!r:20} {summary}")
episodes.close()
"""),
    md("""
## HierarchicalMemory

Important messages (system, pinned, or scored at least `core_threshold`) go to **core**
and are always in context; the newest go to **working** memory; older ones move to the
searchable **archive**, from which `context(query)` retrieves what is relevant.
"""),
    code("""
tiers = HierarchicalMemory(embedder, working_size=3, core_threshold=0.8)
tiers.add(Message.system("You are a travel assistant."))
tiers.add("Remember: I am allergic to peanuts", importance=0.95)
for text in [
    "We booked the hotel in Porto",
    "The flight leaves at 9am",
    "Lovely weather today",
    "Can you find a restaurant for tonight?",
    "Something near the river would be nice",
]:
    tiers.add(text, importance=0.4)

print("core:   ", [m.text for m in tiers.core()])
print("working:", [m.text for m in tiers.working()])
print("archive:", [h.text for h in tiers.archive_search("hotel booking", k=1)])
context = tiers.context("Which hotel did we book?", policy=ContextPolicy(max_tokens=300))
[(m.role, m.text[:70]) for m in context]
"""),
    code("""
tiers.close()
"""),
    md("""
## SharedMemoryPool

Facts carry provenance (agent, branch, time, confidence) and reach each agent once: the
same fact shared twice is stored once. With `conflict="newest"`, facts on the same
`metadata["topic"]` replace each other.
"""),
    code("""
pool = SharedMemoryPool(conflict="newest")
for agent in ["planner", "researcher", "writer"]:
    pool.register(agent)

pool.share_insight("researcher", "Q4 revenue grew 12%", metadata={"topic": "q4-revenue"})
pool.share_insight("writer", "q4 revenue grew 12%")  # same text: stored once
pool.share_insight("researcher", "Q4 revenue grew 13% (restated)", metadata={"topic": "q4-revenue"})
pool.share_insight("planner", "The board meets on Monday")

print([f.text for f in pool.facts_for("writer")])
print(pool.context_for("writer").text)
"""),
]

# ---------------------------------------------------------------------- 03 coordination
COORDINATION: list[Cell] = [
    md("""
# Multi-agent coordination

A planner forks three researcher branches. Each researcher works on its own copy-on-write
fork of the conversation, shares facts with a **scope** (`branch`, `subtree`, `lineage`,
`global`), and the `Coordinator` pushes them to every running agent in scope at once. Then
the planner merges the branches back and answers.

The transport here is `InProcessTransport`; `MqttTransport(host, port, namespace)` is a
drop-in replacement that carries the same facts between processes through a broker.
"""),
    code("""
import contextlib

from marsys_mem import MemoryManager, Message
from marsys_mem.coordination import BranchGraph, Coordinator, InProcessTransport
from marsys_mem.display import report_html

manager = MemoryManager()
graph = BranchGraph()
graph.add_branch("main", agents=["planner", "researcher"])

planner = manager.memory("planner")
planner.add(Message.system("You plan market research and write the final answer."))
planner.add(Message.user("Should we launch in Portugal, Spain or Italy?"))
researcher = manager.memory("researcher")
researcher.add(Message.system("You research one market and report facts."))

stack = contextlib.AsyncExitStack()  # keeps the coordinator running across cells
coord = await stack.enter_async_context(
    Coordinator(graph, manager, InProcessTransport(namespace="notebook"))
)
received = []
coord.on_fact(lambda delivery: received.append((delivery.key, delivery.fact.text)))
coord
"""),
    md("""
Fork one branch per market. Each researcher starts from a fork of its `main` memory: it sees
the shared history, and what it adds stays on its branch.
"""),
    code("""
MARKETS = {"pt": "Portugal", "es": "Spain", "it": "Italy"}
for branch in MARKETS:
    coord.fork("main", branch, agents=["researcher"])
graph  # the HTML view: branches as an indented tree
"""),
    code("""
FINDINGS = {
    "pt": ["Portugal: 10.4M people, e-commerce grew 9% last year", "Lisbon has 3 competitors"],
    "es": ["Spain: 48M people, e-commerce grew 11% last year", "Madrid has 9 competitors"],
    "it": ["Italy: 59M people, e-commerce grew 6% last year", "Milan has 7 competitors"],
}
for branch, notes in FINDINGS.items():
    memory = manager.memory("researcher", branch)
    memory.add(Message.user(f"Research the {MARKETS[branch]} market."))
    for note in notes:
        memory.add(Message.assistant(note))
    # the headline goes to the whole tree (lineage: ancestors and descendants) ...
    await coord.share("researcher", notes[0], branch=branch, scope="lineage")
    # ... the detail stays on the branch
    await coord.share("researcher", notes[1], branch=branch, scope="branch")

on_main, on_es = len(manager.memory("researcher")), len(manager.memory("researcher", "es"))
print(f"researcher: {on_main} messages on main, {on_es} on es (copy-on-write fork)")
print("planner on main received:")
for fact in coord.facts_for("planner"):
    print(f"  {fact.text}  (from {fact.source_agent}@{fact.source_branch}, {fact.scope})")
print("researcher on es received:", [f.text for f in coord.facts_for("researcher", "es")])
"""),
    md("""
A `global` fact reaches every agent on every branch, the running researchers included:
"""),
    code("""
await coord.share("planner", "Budget for the launch is 2M EUR", scope="global")
sorted(key for key, text in received if text.startswith("Budget"))
"""),
    md("""
The shared facts show up in what the planner would send to its LLM, ahead of the
conversation window and within its token budget:
"""),
    code("""
manager.context_for("planner")
"""),
    md("""
## Merging

`merge` re-shares the child's facts on the target branch and, with `strategy="summary"`,
appends one summary of the branch's new messages to the target's memories. A branch that
would make history flow in a circle is refused.
"""),
    code("""
from IPython.display import HTML

results = {}
for branch in ["pt", "es"]:
    results[branch] = await coord.merge(branch, into="main", strategy="summary")
HTML(report_html(results, title="Merge results"))  # any report, one section per branch
"""),
    code("""
from marsys_mem.exceptions import MergeCycleError

coord.fork("it", "it-north")
try:
    await coord.merge("it", into="it-north")
except MergeCycleError as exc:
    print(exc)
graph.close("it-north")
"""),
    md("""
## The branch graph

`BranchGraph.draw()` plots the forks (solid) and merges (dashed), coloured by status. The
graph is a networkx DiGraph underneath (`graph.nx`).
"""),
    code("""
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(7, 5))
graph.draw(ax=ax)
ax.set_title("research team: forks and merges")
plt.show()
"""),
    code("""
print(graph.lineage("it-north"), graph.descendants("main"), graph.merges())
graph
"""),
    md("The planner now answers with the merged summaries and facts in its context:"),
    code("""
planner.add(Message.assistant("Launch in Spain first: biggest market and fastest growth."))
window = manager.context_for("planner")
print(repr(window))
window
"""),
    code("""
await stack.aclose()
manager.close()
coord
"""),
]

# ---------------------------------------------------------------------- 04 retention
RETENTION: list[Cell] = [
    md("""
# Retention policies: what each strategy costs

A growing agent conversation (user question, tool call, tool result, answer per turn), and
for each context policy the tokens the agent would send at every step. Then: how the
retention kinds of a config file decide what survives a session and a restart.
"""),
    code("""
import time
import timeit

import matplotlib.pyplot as plt

from marsys_mem import ContextPolicy, ConversationMemory, Message, ToolCall

TURNS = 150
BUDGET = 1200


def turn_messages(turn: int) -> list[Message]:
    \"\"\"One agent turn: a question, a tool call, its result, an answer.\"\"\"
    city = ["Lisbon", "Quito", "Oslo", "Hanoi", "Lima", "Cairo"][turn % 6]
    call = ToolCall(id=f"t{turn}", name="search_flights", arguments={"to": city, "day": turn})
    return [
        Message.user(f"Turn {turn}: find me a flight to {city} and compare it with last time."),
        Message.assistant("", tool_calls=[call]),
        Message.tool(
            f"3 flights to {city}: 08:10 ({200 + turn} EUR), 13:45, 19:30",
            tool_call_id=call.id,
        ),
        Message.assistant(f"The 08:10 flight to {city} is cheapest at {200 + turn} EUR."),
    ]


POLICIES = {
    "no limit (full history)": None,
    f"sliding_window, {BUDGET} tokens": ContextPolicy(max_tokens=BUDGET),
    "sliding_window, 40 messages": ContextPolicy(max_messages=40),
    f"trim_oldest, {BUDGET} tokens": ContextPolicy(max_tokens=BUDGET, strategy="trim_oldest"),
    f"summarize, {BUDGET} tokens": ContextPolicy(
        max_tokens=BUDGET, strategy="summarize", keep_recent=30
    ),
}
STYLES = ["-", "--", "-.", ":", "-"]
"""),
    code("""
system = Message.system("You are a travel agent. Be brief.")
memories = {name: ConversationMemory([system]) for name in POLICIES}
usage = {name: [] for name in POLICIES}
stored = {name: [] for name in POLICIES}
elapsed = dict.fromkeys(POLICIES, 0.0)

for turn in range(TURNS):
    batch = turn_messages(turn)
    for name, policy in POLICIES.items():
        mem = memories[name]
        mem.add_many(batch)
        start = time.perf_counter()
        tokens = mem.total_tokens if policy is None else mem.context(policy).tokens
        elapsed[name] += time.perf_counter() - start
        usage[name].append(tokens)
        stored[name].append(len(mem))

for name in POLICIES:
    print(
        f"{name:28} last window {usage[name][-1]:6,} tokens, "
        f"{stored[name][-1]:4} messages kept, {1e3 * elapsed[name] / TURNS:.2f} ms per window"
    )
"""),
    code("""
fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
turns = range(1, TURNS + 1)
for name, style in zip(POLICIES, STYLES, strict=True):
    left.plot(turns, usage[name], style, label=name, linewidth=2)
    right.plot(turns, stored[name], style, label=name, linewidth=2)
left.axhline(BUDGET, color="grey", linestyle=":", label=f"budget ({BUDGET} tokens)")
left.set(title="tokens sent to the LLM per turn", xlabel="turn", ylabel="tokens", yscale="log")
right.set(title="messages kept in memory", xlabel="turn", ylabel="messages")
left.legend(fontsize=8)
right.legend(fontsize=8)
fig.tight_layout()
plt.show()
"""),
    md("""
Every bounded policy stays under its budget however long the conversation grows (the two
1200-token lines lie on top of each other). `trim_oldest` also keeps the memory itself
small, because it deletes; `sliding_window` keeps the whole history and only sends the
newest part; `summarize` sends the `keep_recent` newest messages verbatim plus one summary
of everything older, extended incrementally. The last summarize window:
"""),
    code("""
memories[f"summarize, {BUDGET} tokens"].context(POLICIES[f"summarize, {BUDGET} tokens"])
"""),
    md("""
## Window cost does not grow with the history

Token counts are cached per message and the window is found walking back from the newest
message, so building a window costs O(window), not O(history):
"""),
    code("""
sizes = [1_000, 10_000, 50_000]
policy = ContextPolicy(max_tokens=BUDGET)


memories = {}
for size in sizes:
    mem = ConversationMemory([system])
    mem.add_many(m for turn in range(size // 4) for m in turn_messages(turn))
    memories[size] = mem
    mem.context(policy)  # the first call counts every message's tokens once

# Each size is timed in turns, round after round, and keeps its best round: a busy moment
# of the machine then costs every size alike. timeit turns the garbage collector off while
# it times (a full collection walks every object of the process, history included).
best = dict.fromkeys(sizes, float("inf"))
for _ in range(7):
    for size, mem in memories.items():
        seconds = timeit.timeit(lambda: mem.context(policy), number=50)  # noqa: B023
        best[size] = min(best[size], seconds / 50)
per_call = [1e3 * best[size] for size in sizes]
for size, ms in zip(sizes, per_call, strict=True):
    window = memories[size].context(policy)
    print(f"{len(memories[size]):>7,} messages: {ms:.3f} ms per window ({len(window)} messages)")

fig, ax = plt.subplots(figsize=(5, 3))
ax.plot(sizes, per_call, marker="o")
ax.set(
    xscale="log",
    xlabel="history (messages)",
    ylabel="ms per window",
    ylim=(0, None),
    title="window cost vs history size",
)
plt.show()
"""),
    md("""
## Retention kinds: what survives a session and a restart

`single_run` memory ends with the run, `session` memory with `end_session()`, and
`persistent` memory is written to the store (bounded by `ttl` and `max_stored_messages`)
and comes back in the next process. The config lives in a temporary folder.
"""),
    code("""
import shutil
import tempfile
from pathlib import Path

from marsys_mem import MemoryManager, load_config

workdir = Path(tempfile.mkdtemp(prefix="marsys-retention-"))
config_path = workdir / "policies.yaml"
config_path.write_text(
    \"\"\"
version: 1
store: {backend: sqlite, path: memory.db}
defaults:
  retention: session
  context: {max_messages: 50, max_tokens: 2000}
agents:
  archivist: {retention: persistent, max_stored_messages: 40}
  planner: {retention: session}
  scratchpad: {retention: single_run}
\"\"\"
)
config = load_config(config_path)
{name: config.policy_for(name).retention for name in ["archivist", "planner", "scratchpad"]}
"""),
    code("""
AGENTS = ["archivist", "planner", "scratchpad"]
counts = {}
with MemoryManager.from_config(config_path) as manager:
    for agent in AGENTS:
        with manager.run(agent) as run:
            for turn in range(25):
                for message in turn_messages(turn):
                    run.add(message)
            counts.setdefault("during the run", {})[agent] = len(manager.memory(agent))
    counts["after the run"] = {a: len(manager.memory(a)) for a in AGENTS}
    manager.end_session()
    counts["after end_session"] = {a: len(manager.memory(a)) for a in AGENTS}

with MemoryManager.from_config(config_path) as manager:  # the next process
    counts["after a restart"] = {a: len(manager.memory(a)) for a in AGENTS}
    stored = len(manager.store.load_messages(manager.key("archivist")))
print(f"archivist rows in the store: {stored} (max_stored_messages: 40)")
counts
"""),
    code("""
fig, ax = plt.subplots(figsize=(8, 3.5))
stages = list(counts)
width = 0.25
for i, agent in enumerate(AGENTS):
    ax.bar(
        [s + (i - 1) * width for s in range(len(stages))],
        [counts[stage][agent] for stage in stages],
        width,
        label=agent,
    )
ax.set_xticks(range(len(stages)), stages)
ax.set(ylabel="messages in memory", title="what each retention kind keeps")
ax.legend()
plt.show()
shutil.rmtree(workdir)
"""),
]

NOTEBOOKS: dict[str, list[Cell]] = {
    "01_quickstart.ipynb": QUICKSTART,
    "02_memory_patterns.ipynb": PATTERNS,
    "03_multi_agent_coordination.ipynb": COORDINATION,
    "04_retention_policies.ipynb": RETENTION,
}


def build(name: str, cells: list[Cell]) -> nbformat.NotebookNode:
    """A notebook with ``cells``, no outputs, stable ids and the python3 kernel."""
    nb = new_notebook()
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    stem = name.split("_", 1)[0]
    for i, (kind, source) in enumerate(cells):
        cell = new_markdown_cell(source) if kind == "md" else new_code_cell(source)
        cell.id = f"nb{stem}-{i:02d}"
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def main() -> int:
    """Write every notebook; returns the exit code."""
    for name, cells in NOTEBOOKS.items():
        path = HERE / name
        nbformat.write(build(name, cells), path)
        print(f"wrote {path.relative_to(HERE.parent)} ({len(cells)} cells)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
