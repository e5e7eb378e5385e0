r"""Summarisers for the ``summarize`` context strategy.

A summariser is any callable ``list[Message] -> str`` (sync or async). When a previous
summary exists it comes first in the list, as a system message with
``metadata["summary"] = True``, so a summariser can extend it instead of starting again.

:class:`ExtractiveSummarizer` is the offline default: no model, deterministic. It keeps the
sentences that carry the conversation's most frequent content words, in their original
order, one bullet per sentence with who said it. An LLM summariser is a small function::

    async def llm_summary(messages: list[Message]) -> str:
        prompt = "Summarise, keeping names, numbers and decisions:\n" + "\n".join(
            f"{m.role}: {m.text}" for m in messages)
        return await my_llm(prompt)
"""

from __future__ import annotations

import json
import re
from collections import Counter

from marsys_mem.model.messages import Message

__all__ = ["SUMMARY_HEADER", "ExtractiveSummarizer"]

_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_'-]*")
_STOP = frozenset(
    """a an the and or but if then so to of in on at by for with from as is are was were be been
    being it its this that these those i you he she we they me him her us them my your his our
    their what which who whom do does did have has had not no yes can could will would shall
    should may might must just about into over than too very there here when where why how all
    any some such only own same also please thanks thank hi hello ok okay""".split()
)
SUMMARY_HEADER = "Summary of earlier conversation:"
"""The first line of an extractive summary (and the header of every summary block)."""


def _speaker(m: Message) -> str:
    if m.role == "agent_call":
        return f"{m.name} (request)"
    return f"{m.role} ({m.name})" if m.name and m.role != "tool" else m.role


def _lines(m: Message, max_line: int) -> list[tuple[str, str, float]]:
    """Candidate summary lines of one message: ``(line, scored body, bonus)``."""
    who = _speaker(m)
    out: list[tuple[str, str, float]] = []
    for call in m.tool_calls:
        args = json.dumps(call.arguments, ensure_ascii=False, sort_keys=True)[:max_line]
        out.append((f"{who} called {call.name}({args})", f"{call.name} {args}", 1.0))
    for agent_call in m.agent_calls:
        req = agent_call.request
        text = (req if isinstance(req, str) else json.dumps(req, ensure_ascii=False))[:max_line]
        out.append((f"{who} asked {agent_call.agent}: {text}", f"{agent_call.agent} {text}", 1.0))
    text = m.text
    if m.role == "tool":
        label = f"tool {m.name}" if m.name else "tool"
        snippet = " ".join(text.split())[:max_line]
        if snippet:
            out.append((f"{label} returned: {snippet}", snippet, 1.0))
        return out
    for sentence in _SENTENCE.split(text):
        sentence = " ".join(sentence.split())[:max_line]
        if len(sentence) >= 3:
            out.append((f"{who}: {sentence}", sentence, 0.0))
    return out


def _previous(m: Message, max_line: int) -> list[tuple[str, str, float]]:
    """Lines of a previous summary: its bullets, or its sentences if it is prose."""
    bullets = [line[2:] for line in m.text.splitlines() if line.startswith("- ")]
    if not bullets:
        bullets = [
            f"earlier: {' '.join(p.split())[:max_line]}"
            for p in _SENTENCE.split(m.text)
            if len(p.strip()) >= 3 and p.strip() != SUMMARY_HEADER
        ]
    return [(line, line.split(": ", 1)[-1], 1.0) for line in bullets]


def _words(text: str) -> list[str]:
    return [w for w in (x.lower() for x in _WORD.findall(text)) if w not in _STOP]


class ExtractiveSummarizer:
    """Offline, deterministic summariser: keeps the most informative sentences.

    Sentences are scored by the frequency, across everything being summarised, of their
    content words (stop words ignored), normalised by length; the best ones are kept in
    conversation order until ``max_sentences`` or ``max_chars`` is reached. Lines of a
    previous summary compete with the new ones, so the summary stays bounded however long
    the conversation grows.

    Args:
        max_sentences: most bullet lines in the summary.
        max_chars: most characters in the summary.
        max_line: longest single line (longer sentences are cut).
        max_messages: when given more messages than this (a first call over a long
            history), an evenly spaced sample of them is read, so the cost stays bounded;
            a previous summary is always read.

    Example:
        >>> s = ExtractiveSummarizer(max_sentences=2)
        >>> print(s([Message.user("Budget is 4000 EUR. Hi!"),
        ...          Message.assistant("Noted: the budget is 4000 EUR.")]))
        Summary of earlier conversation:
        - user: Budget is 4000 EUR.
        - assistant: Noted: the budget is 4000 EUR.
    """

    def __init__(
        self,
        max_sentences: int = 12,
        max_chars: int = 2000,
        max_line: int = 240,
        max_messages: int = 2000,
    ) -> None:
        if max_sentences < 1 or max_chars < 40 or max_line < 20:
            raise ValueError("need max_sentences >= 1, max_chars >= 40 and max_line >= 20")
        self.max_sentences = max_sentences
        self.max_chars = max_chars
        self.max_line = max_line
        self.max_messages = max(1, max_messages)

    def _sample(self, messages: list[Message]) -> list[Message]:
        if len(messages) <= self.max_messages:
            return messages
        head = [m for m in messages[:1] if m.metadata.get("summary") is True]
        rest = messages[len(head) :]
        step = len(rest) / self.max_messages
        return head + [rest[int(i * step)] for i in range(self.max_messages)]

    def __call__(self, messages: list[Message]) -> str:
        """Summarise ``messages`` (a previous summary may come first)."""
        candidates: list[tuple[str, str, float]] = []
        for m in self._sample(messages):
            if m.role == "system" and m.metadata.get("summary") is True:
                candidates.extend(_previous(m, self.max_line))
            else:
                candidates.extend(_lines(m, self.max_line))
        if not candidates:
            return ""
        freq: Counter[str] = Counter()
        tokenised = [_words(body) for _, body, _ in candidates]
        for words in tokenised:
            freq.update(set(words))
        scored = []
        for i, words in enumerate(tokenised):
            score = candidates[i][2]
            if words:
                score += sum(freq[w] for w in words) / (len(words) ** 0.5)
                score += 0.5 * sum(1 for w in words if any(c.isdigit() for c in w))
            scored.append((score, i))
        scored.sort(key=lambda t: (-t[0], t[1]))
        chosen: list[int] = []
        chosen_words: list[set[str]] = []
        size = len(SUMMARY_HEADER)
        for _, i in scored:
            line = candidates[i][0]
            if len(chosen) >= self.max_sentences:
                break
            if size + len(line) + 3 > self.max_chars:
                continue
            word_set = set(tokenised[i])
            if any(_similar(word_set, other) for other in chosen_words):
                continue  # near-duplicate of a line already kept
            chosen.append(i)
            chosen_words.append(word_set)
            size += len(line) + 3
        chosen.sort()
        return "\n".join([SUMMARY_HEADER, *(f"- {candidates[i][0]}" for i in chosen)])


def _similar(a: set[str], b: set[str]) -> bool:
    """Jaccard similarity above 0.8 (identical lines included)."""
    if not a and not b:
        return True
    return len(a & b) / len(a | b) > 0.8
