"""Deterministic stand-ins for the model-backed callables, for tests and notebooks.

A summariser is any callable ``list[Message] -> str`` (sync or async). These fakes need
no model and no network, return the same text for the same input, and say what they saw,
so a test can assert on the summary and on how often it was asked for one.
"""

from __future__ import annotations

from collections.abc import Sequence

from marsys_mem.model.messages import Message

__all__ = ["AsyncFakeSummarizer", "fake_summarizer"]


def fake_summarizer(messages: Sequence[Message]) -> str:
    """Summarise deterministically: the count, then ``role: first words`` per message.

    A previous summary (a message with ``metadata["summary"] = True``) is carried over as
    is, so incremental summaries visibly extend the earlier one.

    Args:
        messages: the messages to summarise, oldest first.

    Returns:
        ``"Summary of N messages: role: first three words | ..."``.

    Example:
        >>> fake_summarizer([Message.user("Weather in Tokyo today?"), Message.assistant("72F")])
        'Summary of 2 messages: user: Weather in Tokyo | assistant: 72F'
    """
    parts: list[str] = []
    for m in messages:
        if m.metadata.get("summary") is True:
            parts.append(m.text)
        else:
            parts.append(f"{m.role}: {' '.join(m.text.split()[:3])}")
    return f"Summary of {len(messages)} messages: " + " | ".join(parts)


class AsyncFakeSummarizer:
    """An async summariser that returns :func:`fake_summarizer`'s text and counts calls.

    Attributes:
        calls: how many times it was called.
        seen: the message lists it was called with, in call order.

    Example:
        >>> import asyncio
        >>> summarize = AsyncFakeSummarizer()
        >>> asyncio.run(summarize([Message.user("hello there")]))
        'Summary of 1 messages: user: hello there'
        >>> summarize.calls
        1
    """

    def __init__(self) -> None:
        self.calls = 0
        self.seen: list[list[Message]] = []

    async def __call__(self, messages: Sequence[Message]) -> str:
        """Summarise ``messages`` (see :func:`fake_summarizer`) and record the call."""
        self.calls += 1
        self.seen.append(list(messages))
        return fake_summarizer(messages)

    def __repr__(self) -> str:
        return f"AsyncFakeSummarizer(calls={self.calls})"
