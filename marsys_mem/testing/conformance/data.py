"""Shared data for the conformance suite: keys, timestamps, messages, run snapshots.

Public so a backend's own tests can build the same data and compare the same state.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from marsys_mem.model.messages import Message
from marsys_mem.model.runs import RunSnapshot
from marsys_mem.store.base import Key, MemoryStore

__all__ = [
    "KEY",
    "OTHER_KEY",
    "T0",
    "THIRD_KEY",
    "append_retention_messages",
    "message_ids",
    "observable_state",
    "snapshot_of",
    "user_messages",
]

KEY: Key = ("default", "researcher", "main")
"""The key most tests write to."""

OTHER_KEY: Key = ("default", "writer", "main")
"""A second key, to check isolation."""

THIRD_KEY: Key = ("default", "critic", "main")
"""A third key, for tests that need one more."""

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

    Example:
        >>> [m.message_id for m in user_messages(2, prefix="x")]
        ['x0', 'x1']
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

    Example:
        >>> snapshot_of("r1", parent_id="r0").parent_id
        'r0'
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


def message_ids(messages: Iterable[Message]) -> list[str]:
    """The ``message_id`` of each message, in order.

    Args:
        messages: the messages.

    Returns:
        Their ids.

    Example:
        >>> message_ids(user_messages(3))
        ['m0', 'm1', 'm2']
    """
    return [m.message_id for m in messages]


def observable_state(store: MemoryStore, keys: Iterable[Key], run_ids: Iterable[str]) -> Any:
    """Everything a caller can observe about ``keys`` and ``run_ids``, to compare before/after.

    Args:
        store: the store.
        keys: the keys whose messages and counts to read.
        run_ids: the runs to load.

    Returns:
        A value that compares equal exactly when the observable state is the same.
    """
    keys, run_ids = list(keys), list(run_ids)
    return (
        store.list_keys(),
        {k: store.load_messages(k) for k in keys},
        {k: store.count_messages(k) for k in keys},
        {r: store.load_run(r) for r in run_ids},
        store.list_runs(),
    )


def append_retention_messages(store: MemoryStore, key: Key = KEY) -> list[Message]:
    """Append ten messages a day apart, from ``T0 - 10 days``, some of them protected.

    ``m0`` is a system message, ``m3`` is pinned and ``m5`` has ``metadata["preserve"]``;
    the rest are plain user messages.

    Args:
        store: the store to append to.
        key: the key.

    Returns:
        The messages appended, oldest first.
    """
    start = T0 - timedelta(days=10)
    msgs: list[Message] = []
    for i in range(10):
        ts = start + timedelta(days=i)
        if i == 0:
            msgs.append(Message.system("rules", message_id=f"m{i}", timestamp=ts))
        elif i == 3:
            msgs.append(Message.user("pin", message_id=f"m{i}", timestamp=ts, pinned=True))
        elif i == 5:
            msgs.append(
                Message.assistant(
                    "keep", message_id=f"m{i}", timestamp=ts, metadata={"preserve": True}
                )
            )
        else:
            msgs.append(Message.user(f"u{i}", message_id=f"m{i}", timestamp=ts))
    store.append_messages(key, msgs)
    return msgs
