"""Cross-thread recall: how ``patterns.threads.min_score`` trades answers for noise.

Run it (about a minute on 2 cores with the packaged MiniLM)::

    python benchmarks/bench_threads.py
    python benchmarks/bench_threads.py --subjects 30 --threads 4 --seed 5

Each subject (``--subjects``) talks in ``--threads`` threads (one agent each); every thread
holds two facts the subject states (the statements of ``bench_facts.py``: home, employer,
job, drink, sister, dog) inside chit-chat and short answers. Questions paraphrase one
stated fact (no shared value: "Which city is the user based in?"); each is asked with
:meth:`CrossThreadRecall.search` (``k=4``) for the subject, as from a new thread. For each
``min_score``: how often the statement that answers it comes back (*answer recalled*),
how many other messages come with it, and how many hits questions about nothing the
subject said get (*unrelated*). Only the embedder's cosine gates; ranking is RAGMemory's
hybrid retrieval.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_facts import CHITCHAT, SLOTS, TRIVIAL

from marsys_mem import Message
from marsys_mem.patterns.threads import CrossThreadRecall
from marsys_mem.retrieval.embeddings import HashingEmbedder, default_embedder

UNRELATED = [
    "What is the capital of Australia?",
    "How do I reset my router?",
    "Explain quantum computing simply.",
    "Book a table for two tonight.",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--subjects", type=int, default=12)
    parser.add_argument("--threads", type=int, default=3)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--hashing", action="store_true", help="HashingEmbedder, no model")
    args = parser.parse_args()
    embedder = None if args.hashing else default_embedder()
    if embedder is None:
        embedder = HashingEmbedder()
    rng = random.Random(args.seed)
    recall = CrossThreadRecall(embedder)
    threads: dict[tuple[str, str], list[Message]] = {}
    questions: list[tuple[str, str, str]] = []  # subject, question, id of the answer
    for u in range(args.subjects):
        subject = f"user-{u:03d}"
        for t in range(args.threads):
            messages = []
            for slot in rng.sample(SLOTS, 2):
                stated = Message.user(slot.say(rng.choice(slot.values)))
                messages += [
                    Message.user(rng.choice(CHITCHAT)),
                    Message.assistant("Sure, here is what I suggest."),
                    stated,
                    Message.assistant(rng.choice(TRIVIAL)),
                ]
                questions.append((subject, slot.question, stated.message_id))
            threads[(f"agent-{t}", subject)] = messages
            recall.link(subject, f"agent-{t}", subject)

    def source(agent: str, branch: str) -> list[Message]:
        return threads[(agent, branch)]

    subjects = sorted({s for s, _, _ in questions})
    t0 = time.perf_counter()
    for s in subjects:  # index every subject once (embedding), outside the timings
        recall.search(s, "warm up", source, min_score=None)
    index_s = time.perf_counter() - t0
    print(
        f"{args.subjects} subjects x {args.threads} threads, {len(questions)} questions, "
        f"{sum(map(len, threads.values()))} messages, embedder {type(embedder).__name__}, "
        f"seed {args.seed}; indexed in {index_s:.1f} s"
    )
    print("\n| min_score | answer recalled (top 4) | other hits / question | hits / unrelated |")
    print("|---:|---:|---:|---:|")
    times: list[float] = []
    for threshold in (0.2, 0.25, 0.3, 0.35, 0.4):
        found = noise = 0
        for subject, question, answer in questions:
            t0 = time.perf_counter()
            hits = recall.search(subject, question, source, k=4, min_score=threshold)
            times.append(time.perf_counter() - t0)
            found += any(h.message.message_id == answer for h in hits)
            noise += sum(h.message.message_id != answer for h in hits)
        unrelated = sum(
            len(recall.search(s, q, source, k=4, min_score=threshold))
            for s in subjects
            for q in UNRELATED
        )
        mark = " (default)" if threshold == 0.3 else ""
        print(
            f"| {threshold}{mark} | {found / len(questions):.2f} | "
            f"{noise / len(questions):.2f} | {unrelated / (len(subjects) * len(UNRELATED)):.2f} |"
        )
    print(
        f"\n    search p50 {statistics.median(times) * 1e3:.2f} ms (index sync included; the "
        "questions repeat for each threshold, so most query embeddings come from the cache)"
    )
    recall.close()


if __name__ == "__main__":
    main()
