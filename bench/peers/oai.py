"""Temporal's OpenAI Agents integration (`temporalio-openai-agents`): the bench's agent.

One `Agent` on the scripted model; its tools are Temporal activities
(`activity_as_tool`), as that integration's documentation says to do for tools with I/O.
`create_ticket` needs approval (the Agents SDK's `needs_approval`): the run stops with
an interruption, the workflow waits for the `approve` signal, then resumes the run from
its `RunState`.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.common import SearchAttributeKey

with workflow.unsafe.imports_passed_through():
    from agents import Agent, MaxTurnsExceeded, ModelSettings, Runner
    from temporalio.openai_agents.workflow import activity_as_tool

    from bench.peers.report import report_json

WORKFLOW = "PeerOpenAIAgents"
MODEL = "scripted-model"
#: The keyword the bench counts parked runs by (the dev server registers it).
STATUS = SearchAttributeKey.for_keyword("BoundloopStatus")


@activity.defn
async def fetch_report(part: int) -> str:
    """Fetch one part of the inventory report (about 4 KB)."""
    return report_json(part)


@activity.defn
async def create_ticket(title: str, description: str, priority: str) -> str:
    """Open a support ticket."""
    return json.dumps({"ticket": f"T-{abs(hash(title)) % 10_000:04d}", "priority": priority})


ACTIVITIES = [fetch_report, create_ticket]


def _agent(tool: str) -> Agent[Any]:
    timeout = timedelta(seconds=10)
    if tool == "fetch_report":
        tools = [activity_as_tool(fetch_report, start_to_close_timeout=timeout)]
    else:
        ticket = activity_as_tool(create_ticket, start_to_close_timeout=timeout)
        ticket.needs_approval = True  # type: ignore[attr-defined]
        tools = [ticket]
    # The same request shape as boundloop's: nothing stored server-side, the reasoning's
    # encrypted content sent back with each request.
    settings = ModelSettings(store=False, response_include=["reasoning.encrypted_content"])
    return Agent(name="bench", instructions="Use the tools to answer.", model=MODEL,
                 tools=tools, model_settings=settings)


@workflow.defn(name=WORKFLOW)
class PeerOpenAIAgents:
    def __init__(self) -> None:
        self._approved = False

    @workflow.signal
    def approve(self) -> None:
        self._approved = True

    @workflow.run
    async def run(self, inp: dict[str, Any]) -> dict[str, Any]:
        agent = _agent(inp["tool"])
        try:
            result = await Runner.run(agent, input=inp["question"], max_turns=inp["max_turns"])
        except MaxTurnsExceeded:
            return {"stopped": "max_turns"}
        if result.interruptions:
            workflow.upsert_search_attributes([STATUS.value_set("waiting_approval")])
            await workflow.wait_condition(lambda: self._approved)
            state = result.to_state()
            for item in result.interruptions:
                state.approve(item)
            result = await Runner.run(agent, state)
        return {"output": str(result.final_output)}
