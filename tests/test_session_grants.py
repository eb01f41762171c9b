"""Approvals remembered for the rest of a session, on the real dev server through the
scripted model: a turn's grant for the session approves its later turns' calls it covers
(within each turn's policy); a grant for the run, another session, or a call its `when`
does not meet asks again."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

import boundloop
import boundloop.client
import boundloop.testing
from boundloop.client import approval
from boundloop.contracts import (
    SESSION_WORKFLOW,
    WORKFLOW_NAME,
    RunResult,
    SessionInput,
    run_input,
)
from boundloop.core.limits import RunSettings
from boundloop.core.reasons import StopReason
from boundloop.core.rules import Grant
from boundloop.core.session import SessionState, TurnOf
from tests.conftest import DEMO_TOOLS
from tests.scripts import call, resp
from tests.test_cli import cli, env_for
from tests.test_sessions import WAIT, answer, session_env


def ticket(call_id: str, priority: str = "low") -> dict[str, Any]:
    return resp(call("create_ticket", {"title": "t", "description": "d",
                                       "priority": priority}, call_id))


async def turn_waits(session: boundloop.Session, number: int,
                     turn: asyncio.Task[RunResult]) -> bool:
    """Whether turn `number` asks for an approval (True) or ends without asking."""
    run = session.turn(number)

    async def decided() -> bool:
        if turn.done():
            return True
        try:
            return bool(await run.pending())
        except Exception:  # the turn's workflow has not started yet
            return False
    await boundloop.testing.wait_until(decided, timeout=WAIT)
    return not turn.done()


def asked(result: RunResult) -> list[str | None]:
    return [e.call_id for e in result.events if e.event == "approval_requested"]


def covered(result: RunResult) -> list[str | None]:
    return [e.call_id for e in result.events if e.event == "approval_remembered"]


async def test_a_grant_for_the_session_approves_later_turns_and_a_grant_for_the_run_does_not(
        temporal: Client, tmp_path: Path) -> None:
    script = [ticket("c1"), answer("filed 1"),    # turn 1: remembered for the run only
              ticket("c2"), answer("filed 2"),    # turn 2: asks again; for the session
              ticket("c3"), answer("filed 3"),    # turn 3: covered, runs without asking
              ticket("c4", "high"), answer("filed 4"),  # turn 4: `when` not met: asks
              ticket("c5"), answer("filed 5")]    # another session: asks
    async with session_env(temporal, tmp_path, script) as env:
        session = await env.start()
        first = asyncio.create_task(session.say("file one"))
        assert await turn_waits(session, 1, first)
        await session.turn(1).approve("c1", approver="alice", remember=True)
        one = await asyncio.wait_for(first, timeout=WAIT)
        assert one.session_grants == [] and (await session.show()).grants == []

        second = asyncio.create_task(session.say("file another"))
        assert await turn_waits(session, 2, second)
        # Refused in itself: a scope without `remember`.
        with pytest.raises(boundloop.InvalidDecision, match="only accepted with `remember`"):
            approval("c2", scope="session")
        env_cli = env_for(temporal, tmp_path)
        code, _, err = await cli("approve", session.turn(2).id, "c2", "--as", "alice",
                                 "--remember", "--for", "all", env=env_cli)
        assert code != 0 and "must be 'run' or 'session'" in err
        code, out, err = await cli("approve", session.turn(2).id, "c2", "--as", "alice",
                                   "--remember", "--for", "session", "--when",
                                   'priority == "low"', env=env_cli)
        assert code == 0, err
        two = await asyncio.wait_for(second, timeout=WAIT)
        code, out, err = await cli("session", "show", session.id, env=env_cli)
        assert code == 0 and ('remembered for the session: create_ticket when priority == '
                              '"low" (approved by alice on `c2`)') in out, (out, err)
        assert [g.text for g in two.session_grants] == ['create_ticket when priority == "low"']
        shown = await session.show()
        assert [(g.tool, g.approver, g.call_id, g.scope) for g in shown.grants] == [
            ("create_ticket", "alice", "c2", "session")]

        third = asyncio.create_task(session.say("and one more"))
        assert not await turn_waits(session, 3, third)
        three = third.result()
        assert (three.reason, asked(three), covered(three)) == (
            StopReason.COMPLETED, [], ["c3"])
        assert any(e.event == "approval_inherited" for e in three.events)

        fourth = asyncio.create_task(session.say("an urgent one"))
        assert await turn_waits(session, 4, fourth)  # priority high: not covered
        await session.turn(4).approve("c4", approver="alice")
        four = await asyncio.wait_for(fourth, timeout=WAIT)
        assert (asked(four), covered(four)) == (["c4"], [])

        other = await env.start()
        fifth = asyncio.create_task(other.say("file one"))
        assert await turn_waits(other, 1, fifth)  # the grant is the first session's
        await other.turn(1).approve("c5", approver="alice")
        five = await asyncio.wait_for(fifth, timeout=WAIT)
        assert (asked(five), covered(five)) == (["c5"], [])
        assert (await other.show()).grants == []
        await session.end()
        await other.end()


async def test_a_run_started_with_grants_in_its_input_still_asks(temporal: Client,
                                                                tmp_path: Path) -> None:
    # A starter writing a session's grant into a run's input (as if it were a turn of
    # "sess-x") gets nothing from it: a turn takes grants only from its parent session.
    forged = TurnOf(session_id="sess-x", turn=2, grants=[Grant(
        tool="create_ticket", approver="alice", call_id="c0", scope="session")])
    async with session_env(temporal, tmp_path, [ticket("c1"), answer("filed")]) as env:
        inp = run_input("file one", instructions=None,
                        settings=RunSettings(model="scripted-model"), tools=DEMO_TOOLS,
                        turn=forged)
        handle = await temporal.start_workflow(WORKFLOW_NAME, inp, id=f"forged-{env.queue}",
                                               task_queue=env.queue, result_type=RunResult)
        run = boundloop.client.Run(handle)

        async def decided() -> bool:  # asks, or ends without asking
            st = await run.status()
            return bool(st.pending) or st.status in ("completed", "stopped")
        await boundloop.testing.wait_until(decided, timeout=WAIT)
        st = await run.status()
        assert [a.call_id for a in st.pending] == ["c1"] and st.grants == []
        await run.approve("c1", approver="alice")
        result = await asyncio.wait_for(handle.result(), timeout=WAIT)
    assert (asked(result), covered(result)) == (["c1"], [])
    assert not any(e.event == "approval_inherited" for e in result.events)


async def test_a_session_started_with_grants_in_its_state_still_asks(
        temporal: Client, tmp_path: Path) -> None:
    # Only continue-as-new hands a session's grants on: a starter's are dropped.
    state = SessionState(idle_since=datetime.now(UTC).isoformat(), grants=[Grant(
        tool="create_ticket", approver="alice", call_id="c0", scope="session")])
    async with session_env(temporal, tmp_path, [ticket("c1"), answer("filed")]) as env:
        inp = SessionInput(settings=RunSettings(model="scripted-model"), tools=DEMO_TOOLS,
                           state=state)
        sid = f"forged-session-{env.queue}"
        await temporal.start_workflow(SESSION_WORKFLOW, inp, id=sid, task_queue=env.queue)
        session = await boundloop.client.get_session(temporal, sid)
        assert (await session.show()).grants == []
        first = asyncio.create_task(session.say("file one"))
        asks = await turn_waits(session, 1, first)
        if not asks:
            first.result()  # a failed `say` raises its reason here
        assert asks
        await session.turn(1).approve("c1", approver="alice")
        result = await asyncio.wait_for(first, timeout=WAIT)
        await session.end()
    assert (asked(result), covered(result)) == (["c1"], [])
