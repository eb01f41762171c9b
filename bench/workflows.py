"""The bench's own workflows, for comparison with BoundLoop on the same server.

- `BenchBare`: N trivial activities in sequence: the bare Temporal round trip.
- `BenchBarePair`: N steps of two activities each, the second returning the bench's
  ~4 KB report: bare Temporal doing a step's two round trips with a step's bytes.
- `BenchNaive`: the textbook loop that sends the *whole* conversation to every model
  activity (the real tool activity runs the calls), to measure the history it writes.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from temporalio import activity, workflow

with workflow.unsafe.imports_passed_through():
    import openai

    from bench.peers.report import report
    from boundloop.contracts import TOOL_ACTIVITY, ToolRequest
    from boundloop.core.conversation import Item, function_call_output, user_message
    from boundloop.core.loop import ToolChoice, ToolOutcome
    from boundloop.core.turn import Turn, parse_responses
    from boundloop.tools.registry import Toolset

BARE_WORKFLOW = "BenchBare"
BARE_PAIR_WORKFLOW = "BenchBarePair"
REPORT_ACTIVITY = "bench_report"
NAIVE_WORKFLOW = "BenchNaive"
NOOP_ACTIVITY = "bench_noop"
NAIVE_MODEL_ACTIVITY = "bench_naive_model"


@activity.defn(name=NOOP_ACTIVITY)
async def bench_noop(i: int) -> int:
    return i


@workflow.defn(name=BARE_WORKFLOW)
class BareWorkflow:
    @workflow.run
    async def run(self, n: int) -> int:
        for i in range(n):
            await workflow.execute_activity(
                NOOP_ACTIVITY, i, result_type=int, start_to_close_timeout=timedelta(seconds=30))
        return n


@activity.defn(name=REPORT_ACTIVITY)
async def bench_report(part: int) -> dict[str, Any]:
    return report(part)


@workflow.defn(name=BARE_PAIR_WORKFLOW)
class BarePairWorkflow:
    @workflow.run
    async def run(self, steps: int) -> int:
        timeout = timedelta(seconds=30)
        for i in range(steps):
            await workflow.execute_activity(NOOP_ACTIVITY, i, result_type=int,
                                            start_to_close_timeout=timeout)
            await workflow.execute_activity(REPORT_ACTIVITY, i, result_type=dict,
                                            start_to_close_timeout=timeout)
        return steps


class NaiveModelRequest(BaseModel):
    """The whole conversation, every step."""

    step: int
    model: str
    tools: list[str]
    tool_choice: ToolChoice
    items: list[Item]


class NaiveInput(BaseModel):
    question: str
    model: str
    tools: list[str]
    max_steps: int
    max_result_bytes: int


class NaiveModel:
    """The model activity of the naive loop: same HTTP request as boundloop's."""

    def __init__(self, base_url: str | None, registry: Toolset[Any]) -> None:
        self._client = openai.AsyncOpenAI(api_key="not-needed", base_url=base_url,
                                          max_retries=0)
        self._registry = registry

    @activity.defn(name=NAIVE_MODEL_ACTIVITY)
    async def model(self, req: NaiveModelRequest) -> Turn:
        raw = await self._client.responses.with_raw_response.create(
            model=req.model, input=req.items,  # type: ignore[arg-type]
            tools=self._registry.openai_tools(req.tools, "responses"),  # type: ignore[arg-type]
            tool_choice=req.tool_choice, store=False)
        return parse_responses(json.loads(raw.content))


@workflow.defn(name=NAIVE_WORKFLOW)
class NaiveWorkflow:
    @workflow.run
    async def run(self, inp: NaiveInput) -> int:
        conversation: list[Item] = [user_message(inp.question)]
        wid = workflow.info().workflow_id
        for step in range(1, inp.max_steps + 1):
            choice: ToolChoice = "none" if step == inp.max_steps else "auto"
            turn: Turn = await workflow.execute_activity(
                NAIVE_MODEL_ACTIVITY,
                NaiveModelRequest(step=step, model=inp.model, tools=inp.tools,
                                  tool_choice=choice, items=conversation),
                result_type=Turn, start_to_close_timeout=timedelta(seconds=60))
            conversation.extend(turn.items)
            if not turn.calls or choice == "none":
                return step
            for index, call in enumerate(turn.calls):
                req = ToolRequest(tool=call.name, call_id=call.call_id,
                                  step=step, arguments=json.loads(call.arguments),
                                  idempotency_key=f"{wid}/step-{step}/call-{index}",
                                  max_result_bytes=inp.max_result_bytes)
                outcome: ToolOutcome = await workflow.execute_activity(
                    TOOL_ACTIVITY, req, result_type=ToolOutcome,
                    start_to_close_timeout=timedelta(seconds=30))
                conversation.append(function_call_output(call.call_id,
                                                         outcome.envelope.to_output()))
        return inp.max_steps
