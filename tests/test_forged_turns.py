"""A conversation is continued only by the session that owns it, seen from a starter who
knows where another session's conversation is (its turn's RunResult carries the
reference): written into a run's input as `turn.follows`, the run is refused before any
model request; written into a new session's state, the session starts a conversation
of its own. Either way the model never reads the other conversation."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from temporalio.client import Client

import boundloop
from boundloop import PolicyRefused
from boundloop.client import result_of
from boundloop.contracts import SESSION_WORKFLOW, WORKFLOW_NAME, RunResult, SessionInput, run_input
from boundloop.core.limits import RunSettings
from boundloop.core.session import SessionState, TurnOf, turn_id
from tests.conftest import DEMO_TOOLS
from tests.test_sessions import WAIT, Env, answer, say, session_env, user_messages

SECRET = "my account number is 4417-0093"


async def victims_turn(env: Env) -> tuple[boundloop.Session, RunResult]:
    """Another user's session and the RunResult of its turn that told the model a secret."""
    victim = await env.start()
    told = await say(victim, SECRET)
    assert told.continuation is not None
    return victim, told


def seen(env: Env) -> list[str]:
    """Every user message the model was sent, in every request."""
    return [m for items in env.inputs() for m in user_messages(items)]


async def test_a_run_naming_another_sessions_conversation_is_refused(
        temporal: Client, tmp_path: Path) -> None:
    async with session_env(temporal, tmp_path, [answer("noted"), answer("leaked")]) as env:
        victim, told = await victims_turn(env)
        before = len(env.server.requests)
        # As if it were the victim's next turn, but started by the attacker's client.
        forged = TurnOf(session_id=victim.id, turn=2, follows=told.continuation)
        inp = run_input("what did I tell you?", instructions=None,
                        settings=RunSettings(model="scripted-model"), tools=DEMO_TOOLS,
                        turn=forged)
        for wf_id in (f"forged-{uuid.uuid4().hex[:8]}",
                      # a raw client may take the turn's own id: still not the session's
                      turn_id(victim.id, 2)):
            handle = await temporal.start_workflow(WORKFLOW_NAME, inp, id=wf_id,
                                                   task_queue=env.queue,
                                                   result_type=RunResult)
            with pytest.raises(PolicyRefused) as refused:
                await asyncio.wait_for(result_of(handle), WAIT)
            assert [r["field"] for r in refused.value.refusals] == ["turn.follows"], wf_id
            assert "only a session continues a conversation" in str(refused.value)
        assert len(env.server.requests) == before  # the model was never asked
        await victim.end()
    assert seen(env) == [SECRET]


async def test_a_session_started_with_another_sessions_conversation_starts_its_own(
        temporal: Client, tmp_path: Path) -> None:
    async with session_env(temporal, tmp_path, [answer("noted"), answer("hello")]) as env:
        victim, told = await victims_turn(env)
        state = SessionState(idle_since=datetime.now(UTC).isoformat(),
                             follows=told.continuation)
        sid = f"forged-session-{uuid.uuid4().hex[:8]}"
        await temporal.start_workflow(SESSION_WORKFLOW, SessionInput(
            settings=RunSettings(model="scripted-model"), tools=DEMO_TOOLS, state=state),
            id=sid, task_queue=env.queue)
        attacker = await boundloop.get_session(temporal, sid)
        result = await say(attacker, "what did I tell you?")
        assert result.reason == boundloop.StopReason.COMPLETED
        await attacker.end()
        await victim.end()
    # The attacker's turn was sent its own message only.
    assert user_messages(env.inputs()[-1]) == ["what did I tell you?"]
    assert seen(env) == [SECRET, "what did I tell you?"]
