"""A session survives kill -9 of its worker mid-turn (real worker processes, SIGKILL):
the waiting `say` gets its turn's RunResult, the side effect happened once, and the next
turn's conversation, rebuilt by a worker that never saw it, holds every earlier output."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import boundloop
from boundloop.core.reasons import StopReason
from boundloop.core.session import turn_id
from tests.conftest import workflow_task_failures
from tests.scripts import call, resp
from tests.test_crash import TICKET, WAIT, approve, cluster, pending_call, until
from tests.test_sessions import answer

TOOLS = ["lookup_stock", "create_ticket"]


async def test_worker_killed_mid_turn_loses_nothing_and_repeats_no_side_effect(
        tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        assert c.client is not None
        for scripted in [resp(call("lookup_stock", {"sku": "B-002"}, "c1"), rid="r1"),
                     answer("B-002: 在庫あり"),
                     resp(call("create_ticket", TICKET, "c2"), rid="r3"),
                     answer("チケットを作成しました"),
                     answer("在庫を確認し、チケットを作成しました")]:
            c.model.append(scripted)
        doomed = c.start_worker(crash_after_ticket_write=True)
        session = await boundloop.start_session(c.client, tools=TOOLS, model="scripted-model",
                                                task_queue=c.queue)
        first = await asyncio.wait_for(session.say("B-002 の在庫は?"), WAIT)
        assert first.reason == StopReason.COMPLETED

        second_turn = asyncio.create_task(asyncio.wait_for(session.say("チケットを"), WAIT))
        turn = c.client.get_workflow_handle(turn_id(session.id, 2))

        async def started() -> bool:
            return (await session.show()).current_turn == turn.id
        await until(started, "turn 2 to start")
        await approve(turn, await pending_call(turn))
        # The worker dies inside create_ticket, right after the row is committed.
        code = await asyncio.wait_for(asyncio.to_thread(doomed.wait), WAIT)
        assert code == 137, "the crash hook did not fire"
        c.start_worker()
        second = await second_turn
        third = await asyncio.wait_for(session.say("まとめて"), WAIT)

        assert second.reason == StopReason.COMPLETED and second.tool_executions == 1
        assert third.reason == StopReason.COMPLETED, third.events
        assert len(c.tickets_of(turn.id)) == 1  # the retry found the first row
        # Each model request was sent once (the crash was in a tool, not a request).
        assert len(c.model.requests) == 5
        last = c.model.requests[4].body["input"]
        outputs = {i["call_id"]: json.loads(i["output"]) for i in last
                   if i.get("type") == "function_call_output"}
        assert set(outputs) == {"c1", "c2"}
        assert outputs["c2"]["data"]["already_existed"] is True
        assert outputs["c2"]["data"]["ticket_id"] == c.tickets_of(turn.id)[0]["id"]
        assert c.model.violations == []
        assert await workflow_task_failures(session.handle) == 0
        shown = await asyncio.wait_for(session.show(), WAIT)
        assert shown.turns == 3 and shown.tool_executions == 2
