"""The client API answers with boundloop's errors, for runs and sessions alike: a library
user gets `RunNotFound`, `RunEnded`, `RunIdTaken`, `DecisionRefused` (the CLI only prints
them), never Temporal's RPCError."""

from __future__ import annotations

import pytest
from temporalio.client import Client

import boundloop
from boundloop.testing import AgentEnvironment, responses

tools = boundloop.Toolset[None]()


@tools.tool(side_effects=True, needs_approval=True)
def ship(sku: str) -> dict[str, str]:
    """Ship a SKU."""
    return {"shipped": sku}


agent = boundloop.Agent(tools, model="m")


async def test_an_unknown_id_is_run_not_found(temporal: Client) -> None:
    for finding in (boundloop.get_run(temporal, "no-such-run"),
                    boundloop.get_session(temporal, "no-such-session")):
        with pytest.raises(boundloop.RunNotFound, match="no run 'no-such-"):
            await finding  # awaited like `start`: the server is asked at once
    # A Run kept from a handle whose workflow is gone: every call says so.
    run = boundloop.Run(temporal.get_workflow_handle("no-such-run"))
    for attempt in (run.status(), run.approve("c1"), run.cancel(), run.result()):
        with pytest.raises(boundloop.RunNotFound, match="no run 'no-such-"):
            await attempt


async def test_an_ended_run_refuses_decisions_and_cancels_and_ids_are_never_reused(
        temporal: Client) -> None:
    script = [responses.call("ship", {"sku": "A"}, "call_a"),
              responses.answer("shipped", number=2)]
    async with AgentEnvironment(agent, deps=None, script=script, client=temporal) as env:
        run = await env.start("ship A", id=f"errors-{env.agent.task_queue}")
        await env.pending(run, "call_a")
        with pytest.raises(boundloop.DecisionRefused, match="nope"):
            await run.approve("nope")
        await run.approve("call_a")
        result = await env.result(run)
        with pytest.raises(boundloop.RunIdTaken, match="already used"):
            await env.start("again", id=run.id)
        with pytest.raises(boundloop.RunEnded, match="has ended: it takes no more decisions"):
            await run.approve("call_a")
        with pytest.raises(boundloop.RunEnded, match="has ended: it takes no more cancels"):
            await run.cancel()
        assert (await run.status()).status == "completed"  # an ended run still answers
    assert result.reason == "completed"


async def test_a_session_id_is_never_reused_by_a_session_or_a_run(temporal: Client) -> None:
    async with AgentEnvironment(agent, deps=None, script=[], client=temporal) as env:
        wanted = f"errors-session-{env.agent.task_queue}"
        session = await env.agent.session(temporal, id=wanted)
        with pytest.raises(boundloop.RunIdTaken, match=f"'{wanted}' is already used; each "
                                                       "session needs its own"):
            await env.agent.session(temporal, id=wanted)
        with pytest.raises(boundloop.RunIdTaken, match="already used; each run needs"):
            await env.start("squat", id=wanted)
        ended = await session.end()
    assert ended.turns == 0
