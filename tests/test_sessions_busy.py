"""A message sent while a session's turn runs (`SessionLimits.busy`), on the real dev
server: `queue` starts it as the next turn when this one ends; `interrupt` stops the
running turn at its next safe point and the next turn answers both messages; `refuse`
(the default) is tests/test_sessions.py's `test_a_message_during_a_running_turn_is_refused`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

import boundloop
from boundloop.core.reasons import StopReason
from boundloop.core.session import INTERRUPTED, NOT_RUN, SessionLimits
from boundloop.testing import wait_until
from tests.scripts import call, resp
from tests.support.crash_tools import tools as replay_tools
from tests.test_sessions import WAIT, answer, create, outputs_of, session_env


def texts(items: list[dict[str, Any]]) -> list[str]:
    """The user messages of a request's input, in order."""
    out = []
    for item in items:
        if item.get("role") == "user":
            content = item["content"]
            out.append(content if isinstance(content, str) else content[0]["text"])
    return out


async def replays(session: boundloop.Session, turns: int) -> None:
    replayer = Replayer(workflows=[], data_converter=pydantic_data_converter,
                        plugins=[boundloop.Plugin(replay_tools, deps=None)])
    for handle in (session.handle, *(session.turn(n).handle for n in range(1, turns + 1))):
        result = await replayer.replay_workflow(await handle.fetch_history())
        assert result.replay_failure is None, result.replay_failure


async def test_queue_runs_a_message_sent_during_a_turn_as_the_next_turn(
        temporal: Client, tmp_path: Path) -> None:
    script = [resp(create("c1", "t")), answer("filed"), answer("second")]
    async with session_env(temporal, tmp_path, script) as env:
        session = await env.start(session_limits=SessionLimits(busy="queue"))
        first = asyncio.create_task(asyncio.wait_for(session.say("file a ticket"), WAIT))
        run = session.turn(1)

        async def pending() -> bool:
            try:
                return bool(await run.pending())
            except Exception:
                return False

        await wait_until(pending, timeout=WAIT)
        said: list[str] = []
        second = asyncio.create_task(asyncio.wait_for(
            session.say("and tell me when", taken=said.append), WAIT))
        await wait_until(lambda: asyncio.sleep(0, bool(said)), timeout=WAIT)
        assert said == ["queued: it starts a turn when turn 1 ends (1 waiting)"]
        shown = await session.show()
        assert (shown.status, shown.waiting, shown.turns) == ("running", 1, 1)
        assert len(env.server.requests) == 1  # the queued message waits for its turn
        await run.approve("c1")
        one, two = await first, await second
        assert (one.reason, one.text) == (StopReason.COMPLETED, "filed")
        assert (two.reason, two.text) == (StopReason.COMPLETED, "second")
        assert two.workflow_id == session.turn(2).id
        # The second turn's model saw the first turn whole, then the queued message.
        assert texts(env.inputs()[2]) == ["file a ticket", "and tell me when"]
        assert (await session.show()).waiting == 0
        await asyncio.wait_for(session.end(), WAIT)
        await replays(session, 2)


async def test_interrupt_stops_the_turn_at_a_safe_point_and_the_next_turn_gets_both(
        temporal: Client, tmp_path: Path) -> None:
    # The model takes its time proposing a lookup; the new message arrives meanwhile.
    slow = {**resp(call("lookup_stock", {"sku": "A-001"}, "c1")), "delay_seconds": 3.0}
    script = [slow, answer("both answered")]
    async with session_env(temporal, tmp_path, script) as env:
        session = await env.start(session_limits=SessionLimits(busy="interrupt"))
        first = asyncio.create_task(asyncio.wait_for(session.say("stock of A-001?"), WAIT))

        async def asked() -> bool:
            return len(env.server.requests) == 1

        await wait_until(asked, timeout=WAIT)
        said: list[str] = []
        second = asyncio.create_task(asyncio.wait_for(
            session.say("actually, B-002 too", taken=said.append), WAIT))
        one = await first
        assert said[0].startswith("interrupting turn 1: it stops at its next safe point")
        # Stopped after the model answered, before its call ran: nothing executed.
        assert (one.reason, one.cancel_reason, one.tool_executions) == (
            StopReason.CANCELLED, INTERRUPTED, 0)
        two = await second
        assert (two.reason, two.text) == (StopReason.COMPLETED, "both answered")
        second_input = env.inputs()[1]
        assert texts(second_input) == ["stock of A-001?", "actually, B-002 too"]
        assert NOT_RUN in outputs_of(second_input)["c1"]  # every call has its output
        await asyncio.wait_for(session.end(), WAIT)
        await replays(session, 2)
