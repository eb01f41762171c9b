"""History bytes of a multi-turn session, turn by turn (`make bench`, and
tests/test_sessions_history.py).

A session's turns continue the conversation by reference, so each turn adds about the
same number of history bytes however long the conversation already is: the total grows
linearly in turns while the conversation the model reads grows too. Passing the
conversation to each turn would add a copy of it per turn (quadratic total).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

import boundloop
from boundloop.core.limits import Limits
from boundloop.core.reasons import StopReason
from boundloop.core.session import turn_id

#: One turn: a model request that calls lookup_stock, the tool, the answer.
TURN_STEPS = 2


async def chain_bytes(client: Client, workflow_id: str) -> int:
    """History bytes of every run of `workflow_id` (the latest, and each run it continued
    from): the sum of `HistoryEvent.ByteSize()`."""
    total, run_id = 0, None
    while True:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        total += sum(e.ByteSize() for e in history.events)
        first = history.events[0]
        assert first.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED
        run_id = first.workflow_execution_started_event_attributes.continued_execution_run_id
        if not run_id:
            return total


async def session_growth(client: Client, queue: str, model_name: str, turns: int,
                         feed: Callable[[int], None], seconds: float = 60.0,
                         ) -> list[dict[str, Any]]:
    """Run a session of `turns` turns (each fed to the model by `feed(n)`: one
    lookup_stock call, then an answer) and return, after each turn, the history bytes of
    the session and all its turns so far, and the conversation's own bytes."""
    session = await boundloop.start_session(
        client, tools=["lookup_stock"], model=model_name, task_queue=queue,
        limits=Limits(token_threshold=10**9, max_history_bytes=10**7),
        session_limits=boundloop.SessionLimits(max_turns=turns + 1))
    rows: list[dict[str, Any]] = []
    turn_bytes = 0
    for n in range(1, turns + 1):
        feed(n)
        result = await asyncio.wait_for(session.say(f"SKU {n} の在庫は?"), seconds)
        if (result.reason, result.steps) != (StopReason.COMPLETED, TURN_STEPS):
            raise RuntimeError(f"turn {n} ended {result.reason.value} after {result.steps} "
                               "steps")
        assert result.continuation is not None
        turn_bytes += await chain_bytes(client, turn_id(session.id, n))
        rows.append({"turn": n, "history": turn_bytes + await chain_bytes(client, session.id),
                     "conversation": result.continuation.conversation.bytes})
    await asyncio.wait_for(session.end(), seconds)
    return rows


def increments(rows: list[dict[str, Any]], key: str) -> list[int]:
    """Bytes each turn added (the first turn: all it wrote)."""
    values = [r[key] for r in rows]
    return [values[0], *(b - a for a, b in itertools.pairwise(values))]
