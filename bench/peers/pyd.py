"""pydantic-ai's Temporal integration (`pydantic-ai-slim[temporal]`): the bench's agent.

A plain `Agent` with the `TemporalDurability` capability, as that integration's
documentation shows: its model requests and tool calls run as Temporal activities.
`create_ticket` requires approval (`requires_approval=True`): the run ends with
`DeferredToolRequests`, the workflow waits for the `approve` signal, then runs again
with the approvals and the message history.
"""

from __future__ import annotations

import json
import os
from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributeKey

with workflow.unsafe.imports_passed_through():
    from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults, Tool
    from pydantic_ai.durable_exec.temporal import PydanticAIWorkflow, TemporalDurability
    from pydantic_ai.exceptions import UsageLimitExceeded
    from pydantic_ai.models.openai import OpenAIResponsesModel, OpenAIResponsesModelSettings
    from pydantic_ai.profiles.openai import openai_model_profile
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.usage import UsageLimits

    from bench.peers.report import report

WORKFLOW = "PeerPydanticAI"
MODEL = "scripted-model"
STATUS = SearchAttributeKey.for_keyword("BoundloopStatus")


def fetch_report(part: int) -> dict[str, Any]:
    """Fetch one part of the inventory report (about 4 KB)."""
    return report(part)


def create_ticket(title: str, description: str, priority: str) -> str:
    """Open a support ticket."""
    return json.dumps({"ticket": f"T-{abs(hash(title)) % 10_000:04d}", "priority": priority})


def _agent(name: str, tool: Tool[None]) -> Agent[None, str | DeferredToolRequests]:
    # The worker's environment names the scripted server, as for the other workers.
    provider = OpenAIProvider(base_url=os.environ.get("OPENAI_BASE_URL"),
                              api_key=os.environ.get("OPENAI_API_KEY", "not-needed"))
    # The scripted model answers as a reasoning model does (reasoning items with encrypted
    # content, sent back with the next request): the profile of one, and the same request
    # shape as boundloop's (nothing stored server-side).
    model = OpenAIResponsesModel(MODEL, provider=provider, profile=openai_model_profile("gpt-5"),
                                 settings=OpenAIResponsesModelSettings(openai_store=False))
    return Agent(model, name=name,
                 instructions="Use the tools to answer.", tools=[tool],
                 output_type=[str, DeferredToolRequests],  # type: ignore[arg-type]
                 capabilities=[TemporalDurability()])


# One agent per tool (an agent's activities are registered with the worker by name).
REPORT_AGENT = _agent("bench_report", Tool(fetch_report))
TICKET_AGENT = _agent("bench_ticket", Tool(create_ticket, requires_approval=True))


@workflow.defn(name=WORKFLOW)
class PeerPydanticAI(PydanticAIWorkflow):
    __pydantic_ai_agents__ = [REPORT_AGENT, TICKET_AGENT]  # noqa: RUF012 (the base's type)

    def __init__(self) -> None:
        self._approved = False

    @workflow.signal
    def approve(self) -> None:
        self._approved = True

    @workflow.run
    async def run(self, inp: dict[str, Any]) -> dict[str, Any]:
        agent = REPORT_AGENT if inp["tool"] == "fetch_report" else TICKET_AGENT
        limits = UsageLimits(request_limit=inp["max_turns"])
        try:
            result = await agent.run(inp["question"], usage_limits=limits)
        except UsageLimitExceeded:
            return {"stopped": "max_turns"}
        if isinstance(result.output, DeferredToolRequests):
            workflow.upsert_search_attributes([STATUS.value_set("waiting_approval")])
            await workflow.wait_condition(lambda: self._approved)
            approvals = {c.tool_call_id: True for c in result.output.approvals}
            result = await agent.run(message_history=result.all_messages(),
                                     deferred_tool_results=DeferredToolResults(
                                         approvals=approvals), usage_limits=limits)
        return {"output": str(result.output)}
