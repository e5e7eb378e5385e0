"""Test data for store backends: keys, timestamps, messages and run snapshots.

Used by :class:`~marsys_mem.testing.StoreConformance`; public so a backend's own tests can
build the same data.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from marsys_mem.model.messages import Message
from marsys_mem.model.runs import RunSnapshot
from marsys_mem.store.base import Key, MemoryStore

__all__ = ["KEY", "OTHER_KEY", "T0", "snapshot_of", "user_messages"]

KEY: Key = ("default", "researcher", "main")
"""The key most tests write to."""

OTHER_KEY: Key = ("default", "writer", "main")
"""A second key, to check isolation."""

T0 = datetime(2024, 1, 1, 12, 0, tzinfo=UTC)
"""The timestamp of the first message :func:`user_messages` builds."""


def user_messages(n: int, *, prefix: str = "m", start: datetime = T0) -> list[Message]:
    """``n`` user messages with ids ``{prefix}0..`` and timestamps one minute apart.

    Args:
        n: how many.
        prefix: id and text prefix (ids are ``f"{prefix}{i}"``).
        start: timestamp of the first one.

    Returns:
        The messages, oldest first.
    """
    return [
        Message.user(
            f"{prefix} {i}", message_id=f"{prefix}{i}", timestamp=start + timedelta(minutes=i)
        )
        for i in range(n)
    ]


def snapshot_of(
    run_id: str,
    *,
    agent: str = "researcher",
    namespace: str = "default",
    parent_id: str | None = None,
    started_at: datetime = T0,
) -> RunSnapshot:
    """A small :class:`~marsys_mem.model.runs.RunSnapshot` with one input and one output.

    Args:
        run_id: the run id.
        agent: the agent.
        namespace: the namespace.
        parent_id: the parent run, if any.
        started_at: when the run started.

    Returns:
        The snapshot.
    """
    return RunSnapshot(
        run_id=run_id,
        parent_id=parent_id,
        namespace=namespace,
        agent=agent,
        started_at=started_at,
        ended_at=started_at + timedelta(seconds=5),
        messages=[
            Message.user("Q4 growth?", message_id=f"{run_id}-in", timestamp=started_at),
            Message.assistant("12%", message_id=f"{run_id}-out", timestamp=started_at),
        ],
        usage={"prompt_tokens": 12, "completion_tokens": 3},
        metadata={"tags": ["q4"], "score": 0.5},
    )


def _ids(messages: list[Message]) -> list[str]:
    return [m.message_id for m in messages]


def _state(store: MemoryStore, keys: list[Key], run_ids: list[str]) -> Any:
    """Everything observable about ``keys`` and ``run_ids``, to compare before/after."""
    return (
        store.list_keys(),
        {k: store.load_messages(k) for k in keys},
        {k: store.count_messages(k) for k in keys},
        {r: store.load_run(r) for r in run_ids},
        store.list_runs(),
    )
