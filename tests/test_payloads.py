"""Oversized payloads through the real workflow on a real dev server.

No activity input or result, continue-as-new input or workflow result may pass
Temporal's payload limit: a setting that would need one is refused before the run
starts, a tool's body never runs again because its result was too large to return,
and continue-as-new carries tool outputs by reference (docs/durability.md,
"Oversized payloads").
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
import pytest_asyncio
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from boundloop.activities.admission import Admissions
from boundloop.activities.conversation import ConversationCache
from boundloop.activities.model import ModelActivities
from boundloop.client import result_of
from boundloop.contracts import TOOL_ACTIVITY, WORKFLOW_NAME, RunInput, RunResult, ToolRequest
from boundloop.core.envelope import success
from boundloop.core.limits import MAX_RESULT_BYTES, PAYLOAD_LIMIT_BYTES, Limits, RunSettings
from boundloop.core.loop import ToolOutcome
from boundloop.scripted.server import ScriptedModelServer
from boundloop.settings import Settings
from boundloop.tools import catalog
from boundloop.tools.demo import DemoDeps
from boundloop.tools.registry import ToolContext
from boundloop.worker.main import build_worker
from boundloop.worker.plugin import pass_boundloop_through
from boundloop.workflows.loop import BoundLoopWorkflow
from tests.conftest import RUN_TIMEOUT, RunScript, continue_as_new_server, workflow_task_failures
from tests.scripts import answer, call, outputs, resp
from tests.support.tools import counted, executions
from tests.support.tools import tools as test_tools
from tests.test_cli import cli, env_for

#: The tool result of the reproduction: 2.5 MB, over the payload limit by itself.
OVER_THE_LIMIT = 2_500_000


def data_size_for(envelope_bytes: int) -> int:
    """`counted`'s `size` whose success envelope is exactly `envelope_bytes` long."""
    return envelope_bytes - success({"text": ""}).output_bytes()


# --- the result cap is refused when it cannot fit ---------------------------------------


async def test_result_cap_over_the_payload_limit_is_refused_before_start(
        tmp_path: Path) -> None:
    code, _out, err = await cli(
        "run", "hi", "--limits", '{"max_result_bytes": 3000000, "max_history_bytes": 8000000}',
        env=env_for(None, tmp_path))  # no server: refused before anything connects
    assert code == 2
    assert "invalid run settings" in err and "max_result_bytes" in err
    assert str(MAX_RESULT_BYTES) in err  # the largest value allowed


# --- a large result never re-runs the tool ----------------------------------------------


async def test_result_over_the_largest_cap_runs_the_tool_once(run_script: RunScript) -> None:
    out = await run_script([
        resp(call("counted", {"size": OVER_THE_LIMIT, "tag": "a"}, "c1")), answer("too big")],
        tools=["counted"],
        limits=Limits(max_result_bytes=MAX_RESULT_BYTES, max_history_bytes=8_000_000))
    assert executions(out.data_dir) == 1
    assert (out.result.reason, out.result.tool_executions) == ("completed", 1)
    got = outputs(out.bodies[1])["c1"]
    assert got["error_code"] == "RESULT_TOO_LARGE" and "data" not in got


async def test_result_as_large_as_the_largest_cap_crosses_temporal_once(
        run_script: RunScript) -> None:
    size = data_size_for(MAX_RESULT_BYTES)
    out = await run_script([
        resp(call("counted", {"size": size, "tag": "a"}, "c1")), answer("got it")],
        tools=["counted"],
        limits=Limits(max_result_bytes=MAX_RESULT_BYTES, max_history_bytes=8_000_000))
    assert executions(out.data_dir) == 1
    assert (out.result.reason, out.result.tool_executions) == ("completed", 1)
    got = outputs(out.bodies[1])["c1"]
    assert got["status"] == "success" and len(got["data"]["text"]) == size


async def test_tool_result_over_the_payload_limit_is_not_retried_and_names_the_tool(
        temporal: Client, tmp_path: Path) -> None:
    """A tool activity whose result passes the limit anyway (a worker that does not cap,
    e.g. an older build): the SDK fails the completion with `PayloadsTooLarge`; the body
    must not run again, and the run stops with `result_limit` naming the tool."""

    @activity.defn(name=TOOL_ACTIVITY)
    async def uncapped_tool(req: ToolRequest) -> ToolOutcome:
        ctx = ToolContext(deps=DemoDeps(data_dir=tmp_path), idempotency_key=req.idempotency_key,
                          workflow_id="", call_id=req.call_id, step=req.step,
                          max_result_bytes=req.max_result_bytes)
        data = counted(ctx, **req.arguments)
        return ToolOutcome(envelope=success(data))  # not capped

    server = ScriptedModelServer([
        resp(call("counted", {"size": OVER_THE_LIMIT, "tag": "a"}, "c1")), answer("unused")])
    queue = f"q-{uuid.uuid4().hex[:8]}"
    model = ModelActivities(openai.AsyncOpenAI(base_url=server.start(), api_key="sk-x"),
                            test_tools, ConversationCache())
    inp = RunInput(question="q", tools=["counted"], settings=RunSettings(
        model="m", limits=Limits(max_result_bytes=MAX_RESULT_BYTES)))
    # A worker built by hand: its task queue's toolset is registered by hand too.
    catalog.register(queue, catalog.Served(test_tools))
    try:
        async with Worker(temporal, task_queue=queue, workflows=[BoundLoopWorkflow],
                          activities=[model.model_request, uncapped_tool,
                                      Admissions(None, test_tools, {}).admit_run],
                          workflow_runner=pass_boundloop_through(SandboxedWorkflowRunner())):
            handle = await temporal.start_workflow(
                WORKFLOW_NAME, inp, id=f"test-{queue}", task_queue=queue,
                result_type=RunResult)
            result = await asyncio.wait_for(result_of(handle), timeout=RUN_TIMEOUT)
    finally:
        catalog.unregister(queue, catalog.Served(test_tools))
        server.stop()
    assert executions(tmp_path) == 1
    assert (result.reason, result.tool_executions) == ("result_limit", 1)
    [event] = [e for e in result.events if e.event == "payload_too_large:tool_result"]
    assert (event.tool, event.call_id) == ("counted", "c1")
    assert await workflow_task_failures(handle) == 0


# --- continue-as-new carries references -------------------------------------------------

#: The reproduction: 11 calls per turn of a tool returning 200,000 bytes.
CALLS_PER_TURN, RESULT_SIZE = 11, 200_000
REPRODUCTION = Limits(max_result_bytes=204_800, max_history_bytes=40_000_000,
                      max_tool_executions=100, max_steps=10, token_threshold=10_000_000)


def many_large_results() -> list[dict[str, Any]]:
    """Every turn calls the tool 11 times; the last turn's calls (sent with tool_choice
    "none") never run, so the run ends with `max_steps`."""
    return [resp(*[call("counted", {"size": RESULT_SIZE, "tag": f"{step}-{i}"},
                        f"c{step}-{i}") for i in range(CALLS_PER_TURN)], rid=f"r{step}")
            for step in range(1, REPRODUCTION.max_steps + 1)]


async def continue_as_new_inputs(client: Client, workflow_id: str, run_id: str) -> list[int]:
    """Payload bytes of each continue-as-new input of the chain that starts at `run_id`."""
    sizes: list[int] = []
    while True:
        last = None
        async for event in client.get_workflow_handle(
                workflow_id, run_id=run_id).fetch_history_events():
            last = event
        if last is None or (last.event_type
                            != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW):
            return sizes
        attrs = last.workflow_execution_continued_as_new_event_attributes
        sizes.append(sum(p.ByteSize() for p in attrs.input.payloads))
        run_id = attrs.new_execution_run_id


@pytest.mark.parametrize("cache", ["warm", "cold"])
async def test_continue_as_new_with_large_unsent_outputs_carries_references(
        run_script: RunScript, temporal: Client, cache: str) -> None:
    # cold: no cache, so every request rebuilds the conversation from the histories and
    # the references carried across continue-as-new resolve from the run before.
    out = await run_script(many_large_results(), tools=["counted"], limits=REPRODUCTION,
                           cache=0 if cache == "cold" else 512)
    r = out.result
    steps = REPRODUCTION.max_steps
    executed = CALLS_PER_TURN * (steps - 1)
    assert (r.reason, r.steps, r.tool_executions) == ("max_steps", steps, executed)
    assert executions(out.data_dir) == executed
    # run_script checked every run of the chain for failed workflow tasks.
    sizes = await continue_as_new_inputs(temporal, out.handle.id,
                                         out.handle.result_run_id or "")
    assert sizes, "the history should have grown past Temporal's continue-as-new suggestion"
    assert max(sizes) < PAYLOAD_LIMIT_BYTES // 10  # references, not 2.2 MB of outputs
    # The last request carries every output in full, in order, across the runs.
    last = outputs(out.bodies[-1])
    assert len(last) == executed
    assert all(len(env["data"]["text"]) == RESULT_SIZE for env in last.values())


# --- carried state that outgrows a payload -----------------------------------------------


@pytest_asyncio.fixture(scope="module")
async def eager_continue_as_new(
        tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Client]:
    """A dev server that suggests continue-as-new after 12 history events."""
    async with continue_as_new_server(
            tmp_path_factory.mktemp("eager") / "temporal.db", 12) as client:
        yield client


async def test_carried_state_over_the_payload_limit_stops_with_history_limit(
        eager_continue_as_new: Client, tmp_path: Path) -> None:
    """The carried state keeps its newest events with their call ids (the model chooses
    them, any length): with 300,000-character ids it outgrows one payload after a few
    steps. The run must stop
    with a typed reason instead of failing the continue-as-new workflow task forever."""
    client = eager_continue_as_new
    long_id = "x" * 300_000
    script = [resp(call("lookup_stock", {"sku": f"A-{i:03d}"}, f"c{i}-{long_id}"),
                   rid=f"r{i}") for i in range(1, 11)]
    server = ScriptedModelServer(script)
    queue = f"q-{uuid.uuid4().hex[:8]}"
    settings = Settings(OPENAI_BASE_URL=server.start(), BOUNDLOOP_TASK_QUEUE=queue,
                        BOUNDLOOP_DATA_DIR=tmp_path)
    limits = Limits(max_steps=10, max_tool_executions=10, max_history_bytes=40_000_000,
                    token_threshold=10_000_000)
    inp = RunInput(question="q", tools=["lookup_stock"],
                   settings=RunSettings(model="m", limits=limits))
    try:
        async with build_worker(client, settings):
            handle = await client.start_workflow(WORKFLOW_NAME, inp, id=f"test-{queue}",
                                                 task_queue=queue, result_type=RunResult)
            result = await asyncio.wait_for(result_of(handle), timeout=RUN_TIMEOUT)
    finally:
        server.stop()
    assert result.reason == "history_limit"
    assert [e.event for e in result.events[-2:]] == ["payload_too_large:carried_state",
                                                     "stopped:history_limit"]
    assert await workflow_task_failures(handle, client) == 0, "a workflow task failed"
    sizes = await continue_as_new_inputs(client, handle.id, handle.result_run_id or "")
    assert sizes and max(sizes) <= PAYLOAD_LIMIT_BYTES  # the earlier runs did continue
