"""Heartbeats for both activities (docs/durability.md, "Crashes and retries", "Cancels").

A running attempt heartbeats every second, the first time one second after it started:
an attempt that ends sooner (an instant model, a short tool: most of them) sends none,
and each heartbeat is a request the Temporal server persists. The workflow schedules
each activity with a heartbeat timeout, so an attempt whose worker died is detected
within it and retried by Temporal without counting as a failure; and a cancel (the run
was cancelled) reaches the attempt with the next heartbeat's answer: the SDK cancels the
activity's task. A heartbeat at the start would tell the server nothing the activity's
start did not: that the worker was alive then.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from temporalio import activity

#: Seconds before the first heartbeat and between heartbeats (the worker sends them at
#: most this often too); well inside the workflow's 5 s heartbeat timeout.
HEARTBEAT_EVERY = 1.0


@asynccontextmanager
async def heartbeating(details: Callable[[], tuple[Any, ...]] = tuple) -> AsyncIterator[None]:
    """Heartbeat with `details()` every HEARTBEAT_EVERY seconds while the block runs,
    the first after HEARTBEAT_EVERY. A local activity sends none: it has no heartbeat
    timeout (its workflow task's own timeout notices a dead worker)."""
    if activity.info().is_local:
        yield
        return

    async def beat() -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_EVERY)
            activity.heartbeat(*details())

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
