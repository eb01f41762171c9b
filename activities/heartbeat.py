"""Heartbeats for both activities (docs/durability.md, "Crashes and retries", "Cancels").

A running attempt heartbeats every second. The workflow schedules each activity with a
heartbeat timeout, so an attempt whose worker died is detected within it and retried by
Temporal without counting as a failure; and a cancel (the run was cancelled) reaches the
attempt with the next heartbeat's answer: the SDK cancels the activity's task.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from temporalio import activity

#: Seconds between heartbeats (the worker sends them at most this often too).
HEARTBEAT_EVERY = 1.0


@asynccontextmanager
async def heartbeating(details: Callable[[], tuple[Any, ...]] = tuple) -> AsyncIterator[None]:
    """Heartbeat with `details()` every HEARTBEAT_EVERY seconds while the block runs."""

    async def beat() -> None:
        while True:
            activity.heartbeat(*details())
            await asyncio.sleep(HEARTBEAT_EVERY)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
