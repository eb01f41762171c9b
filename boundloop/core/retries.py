"""Retries the workflow counts itself: pure, no Temporal, no I/O.

Temporal's retry policy only re-runs attempts lost to our own infrastructure (a worker
killed or wedged: heartbeat or start-to-close timeout), without limit but within the
run's deadline. Failures of the provider or of the tool itself are returned to the
workflow, which decides here whether another attempt is due and after how long, so a
crashed worker never uses up an attempt (docs/durability.md, "Crashes and retries").
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

GiveUp = Literal["exhausted", "deadline"]


class Backoff(BaseModel):
    """How many failures an operation may have and how long to wait between them."""

    model_config = ConfigDict(frozen=True)

    max_attempts: int
    initial_seconds: float
    coefficient: float = 2.0
    maximum_seconds: float = 30.0


#: A model request: 4 attempts, 1 s, 2 s, 4 s apart (a provider's Retry-After wins).
MODEL_BACKOFF = Backoff(max_attempts=4, initial_seconds=1.0)
#: The first wait of a tool that declares no retry policy of its own (MCP tools too).
TOOL_INITIAL_SECONDS = 0.5


def tool_backoff(max_attempts: int, initial_seconds: float, coefficient: float = 2.0,
                 maximum_seconds: float | None = None) -> Backoff:
    """A tool's own retry policy (its `retry`); without a maximum interval, Temporal's
    default: 100 x the initial one."""
    return Backoff(max_attempts=max_attempts, initial_seconds=initial_seconds,
                   coefficient=coefficient,
                   maximum_seconds=maximum_seconds or 100 * initial_seconds)


#: A tool's attempts unless it declares a retry policy: three, 0.5 s and 1 s apart.
TOOL_BACKOFF = tool_backoff(3, TOOL_INITIAL_SECONDS)


def next_delay(backoff: Backoff, failures: int, requested: float | None,
               seconds_left: float) -> float | GiveUp:
    """Seconds to wait before the next attempt after `failures` failed attempts, or why
    none is due: the attempts are used up (`exhausted`), or the wait would reach the
    run's deadline (`deadline`, with `seconds_left` of it). `requested` is the delay the
    failure asked for (a provider's Retry-After)."""
    if failures >= backoff.max_attempts:
        return "exhausted"
    delay = requested if requested is not None else min(
        backoff.initial_seconds * backoff.coefficient ** (failures - 1), backoff.maximum_seconds)
    delay = max(delay, 0.0)
    return delay if delay < seconds_left else "deadline"
