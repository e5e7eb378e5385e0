"""The coordinator's tuning numbers, validated once: :class:`CoordinatorSettings`.

The same frozen model is the ``settings=`` argument of
:class:`~marsys_mem.coordination.Coordinator` and the ``coordination:`` section of a
policy file (:class:`~marsys_mem.config.MemoryConfig`), so every default is stated here and
nowhere else. Guide: ``docs/guides/coordination.md#tuning``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["CoordinatorSettings"]


class CoordinatorSettings(BaseModel):
    """How a :class:`~marsys_mem.coordination.Coordinator` buffers, orders and repairs facts.

    Args:
        max_payload: largest envelope sent or accepted, in bytes (the transport's own
            limit applies too: the smaller wins).
        max_log: envelopes kept for late joiners and merges.
        gap_timeout: seconds an ordering gap may stay open before it is skipped.
        max_pending: most early envelopes buffered per sender before a gap is skipped.
        resend_after: seconds a gap stays open before the sender is asked to send it
            again, and between asks.
        heartbeat: seconds between high-water marks while sharing (30 s when idle).
        max_outbox: envelopes kept to send again on request (at least the broker's
            per-client queue: what a crashed broker held for a receiver further behind
            cannot be repaired).
        max_outbox_bytes: payload bytes kept for that, at most.
        max_callback_tasks: async calls of one ``on_fact`` callback running at once.
        max_callback_queue: deliveries waiting for one async ``on_fact`` callback; when
            full the oldest is dropped and counted.

    Values are checked strictly (a number where a number belongs, no strings, no
    booleans); a bad one raises :class:`pydantic.ValidationError` naming the field and
    the value, and a policy file's ``coordination:`` section reports it with its line.

    Example:
        >>> fast = CoordinatorSettings(heartbeat=0.1, gap_timeout=2.0)
        >>> fast.heartbeat, fast.max_log
        (0.1, 10000)
        >>> CoordinatorSettings(heartbeat=0)
        Traceback (most recent call last):
        ...
        pydantic_core._pydantic_core.ValidationError: 1 validation error for CoordinatorSettings
        heartbeat
          Input should be greater than 0 [type=greater_than, input_value=0, input_type=int]
        ...
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    max_payload: int = Field(default=64 * 1024, ge=1, le=256 * 2**20)
    max_log: int = Field(default=10_000, ge=1, le=10_000_000)
    gap_timeout: float = Field(default=10.0, gt=0, le=86_400)
    max_pending: int = Field(default=10_000, ge=1, le=10_000_000)
    resend_after: float = Field(default=0.25, gt=0, le=3_600)
    heartbeat: float = Field(default=0.5, gt=0, le=3_600)
    max_outbox: int = Field(default=100_000, ge=1, le=100_000_000)
    max_outbox_bytes: int = Field(default=64 * 2**20, ge=1, le=2**40)
    max_callback_tasks: int = Field(default=16, ge=1, le=10_000)
    max_callback_queue: int = Field(default=1_000, ge=1, le=10_000_000)
