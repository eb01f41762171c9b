"""Continue-as-new with a low suggestion threshold: no change visible to the model or
the operator, and the conversation is rebuilt across runs from history alone."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from temporalio.client import Client

from boundloop.activities.conversation import ConversationCache
from boundloop.client import result_of, stream_items
from boundloop.contracts import (
    WORKFLOW_NAME,
    RunInput,
    RunResult,
    StreamEvent,
    StreamItem,
    StreamResult,
    TextDelta,
)
from boundloop.core.limits import Limits, RunSettings
from boundloop.scripted.server import ScriptedModelServer
from tests.conftest import continue_as_new_server
from tests.conftest import test_worker as make_worker
from tests.scripts import answer, call, resp

STEPS = 8


@pytest_asyncio.fixture(scope="module")
async def low_threshold(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Client]:
    async with continue_as_new_server(
            tmp_path_factory.mktemp("can") / "temporal.db", 12) as client:
        yield client


def script() -> list[dict[str, Any]]:
    turns = [resp(call("lookup_stock", {"sku": f"A-{i:03d}"}, f"c{i}"), rid=f"r{i}")
             for i in range(1, STEPS)]
    return [*turns, answer("done")]


async def run(client: Client, tmp_path: Path, cache: int) -> tuple[
        RunResult, list[Any], list[str], ConversationCache]:
    server = ScriptedModelServer(script())
    queue = f"can-{uuid.uuid4().hex[:8]}"
    base_url = server.start()
    # A step to spare: the answer comes while the model may still call tools (completed).
    limits = Limits(max_steps=STEPS + 1, max_tool_executions=STEPS)
    inp = RunInput(question="many steps", tools=["lookup_stock"],
                   settings=RunSettings(model="m", limits=limits))
    try:
        async with make_worker(client, queue, base_url, tmp_path, cache=cache) as worker:
            handle = await client.start_workflow(WORKFLOW_NAME, inp, id=f"can-{queue}",
                                                 task_queue=queue, result_type=RunResult)
            result = await result_of(handle)
            query = f"WorkflowId = '{handle.id}'"
            runs = [wf.run_id async for wf in client.list_workflows(query)]
    finally:
        server.stop()
    assert server.violations == []
    return result, [r.body["input"] for r in server.requests], runs, worker.plugin.cache


async def test_continue_as_new_changes_nothing_the_model_or_operator_sees(
        low_threshold: Client, tmp_path: Path) -> None:
    result, inputs, runs, _ = await run(low_threshold, tmp_path, 512)
    assert len(runs) > 1, "the low threshold should have caused continue-as-new"
    assert (result.reason, result.steps, result.tool_executions) == ("completed", STEPS,
                                                                   STEPS - 1)
    assert [e.step for e in result.events if e.event == "model_requested"] == list(
        range(1, STEPS + 1))
    # Each request carries the whole conversation so far, in order, across runs.
    for i, items in enumerate(inputs):
        assert len(items) == 1 + 2 * i


async def test_conversation_rebuilt_across_runs_from_history_only(
        low_threshold: Client, tmp_path: Path) -> None:
    _, cached_inputs, _, warm = await run(low_threshold, tmp_path / "a", 512)
    uncached, inputs, runs, cold = await run(low_threshold, tmp_path / "b", 0)
    assert len(runs) > 1
    # Step 1 has nothing to rebuild; every later step of the cold run reads history.
    assert (warm.hits, cold.hits, cold.misses) == (STEPS - 1, 0, STEPS - 1)
    assert uncached.reason == "completed"
    assert inputs == cached_inputs


async def test_the_stream_is_handed_over_to_the_next_run(
        low_threshold: Client, tmp_path: Path) -> None:
    """A reader that follows the run from its start reads one stream across every run of
    the chain: each event once, in order, offsets without a gap, then the result."""
    server = ScriptedModelServer(script())
    queue = f"can-{uuid.uuid4().hex[:8]}"
    limits = Limits(max_steps=STEPS + 1, max_tool_executions=STEPS)
    inp = RunInput(question="many steps", tools=["lookup_stock"],
                   settings=RunSettings(model="m", limits=limits))
    items: list[StreamItem] = []
    try:
        async with make_worker(low_threshold, queue, server.start(), tmp_path):
            handle = await low_threshold.start_workflow(
                WORKFLOW_NAME, inp, id=f"can-{queue}", task_queue=queue,
                result_type=RunResult)

            async def read() -> None:
                async for item in stream_items(handle):
                    items.append(item)
            await asyncio.wait_for(read(), 120)
            result = await result_of(handle)
            runs = [wf.run_id async for wf in low_threshold.list_workflows(
                f"WorkflowId = '{handle.id}'")]
    finally:
        server.stop()
    assert len(runs) > 1, "the low threshold should have caused continue-as-new"
    assert [i.offset for i in items] == list(range(len(items)))
    assert [i.event for i in items if isinstance(i, StreamEvent)] == result.events
    assert "".join(i.text for i in items if isinstance(i, TextDelta)) == "done"
    assert isinstance(items[-1], StreamResult) and items[-1].result == result
