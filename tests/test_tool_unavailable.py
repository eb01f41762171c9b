"""A deploy that renames a tool while a run waits to call it: the run stops with
`tool_unavailable` naming the tool once approved, never a workflow task that fails
forever — also when the run has continued as new since it was admitted (real dev server,
real workers, the scripted model over HTTP)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
import pytest_asyncio
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from boundloop import Toolset, Worker
from boundloop.client import decide, query_status, result_of
from boundloop.contracts import WORKFLOW_NAME, Decision, RunInput, RunResult
from boundloop.core.limits import RunSettings
from boundloop.scripted.server import ScriptedModelServer
from boundloop.tools.demo import DemoDeps, list_tickets
from tests.conftest import RUN_TIMEOUT, continue_as_new_server, workflow_task_failures
from tests.scripts import call, resp
from tests.support.tools import tools as test_tools
from tests.test_approvals import pending

TICKET = {"title": "Printer on fire", "description": "3F printer smokes", "priority": "high"}

#: The next version's toolset: create_ticket renamed open_ticket, nothing else changed.
renamed = Toolset[DemoDeps]()


@renamed.tool(side_effects=True, needs_approval=True, terminal=True, cost_units=1)
def open_ticket(title: str, description: str, priority: str) -> dict[str, Any]:
    """Open a support ticket."""
    raise AssertionError("never called: the run asked for create_ticket")


async def test_an_approved_call_of_a_renamed_tool_stops_the_run_naming_it(
        temporal: Client, tmp_path: Path) -> None:
    model = ScriptedModelServer([resp(call("create_ticket", TICKET, "t1"))])
    client = openai.AsyncOpenAI(base_url=model.start(), api_key="sk-test-not-real")
    queue = f"q-{uuid.uuid4().hex[:8]}"
    deps = DemoDeps(data_dir=tmp_path)
    try:
        async with Worker(temporal, test_tools, deps=deps, model=client, task_queue=queue):
            inp = RunInput(question="チケットを作って", tools=["create_ticket"],
                           settings=RunSettings(model="scripted-model"))
            handle = await temporal.start_workflow(
                WORKFLOW_NAME, inp, id=f"renamed-{uuid.uuid4().hex[:12]}", task_queue=queue,
                result_type=RunResult)
            await pending(handle)
        async with Worker(temporal, renamed, deps=deps, model=client, task_queue=queue):
            await asyncio.wait_for(decide(handle, Decision(call_id="t1", approve=True,
                                                           approver="alice")), RUN_TIMEOUT)
            result = await asyncio.wait_for(result_of(handle), RUN_TIMEOUT)
            status = await query_status(handle)
    finally:
        model.stop()
    assert result.reason == "tool_unavailable"
    stop = [e for e in status.events if e.event == "tool_unavailable"]
    assert [(e.tool, e.call_id) for e in stop] == [("create_ticket", "t1")]
    assert list_tickets(tmp_path) == []
    assert len(model.requests) == 1  # no request after the stop
    assert await workflow_task_failures(handle, temporal) == 0


@pytest_asyncio.fixture(scope="module")
async def low_threshold(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Client]:
    async with continue_as_new_server(
            tmp_path_factory.mktemp("can") / "temporal.db", 12) as client:
        yield client


async def test_a_run_continued_as_new_keeps_its_admitted_rules_across_a_rename(
        low_threshold: Client, tmp_path: Path) -> None:
    """The first step's history passes the threshold: the run continues as new before
    asking for create_ticket. The next run decides by the rules it was admitted with, so
    the renamed toolset's worker replays it and the approval ends in `tool_unavailable`."""
    temporal = low_threshold
    model = ScriptedModelServer([resp(call("lookup_stock", {"sku": "A-001"}, "s1")),
                                 resp(call("create_ticket", TICKET, "t1"))])
    client = openai.AsyncOpenAI(base_url=model.start(), api_key="sk-test-not-real")
    queue = f"q-{uuid.uuid4().hex[:8]}"
    deps = DemoDeps(data_dir=tmp_path)
    try:
        async with Worker(temporal, test_tools, deps=deps, model=client, task_queue=queue):
            inp = RunInput(question="在庫を見てチケットを", tools=["lookup_stock", "create_ticket"],
                           settings=RunSettings(model="scripted-model"))
            handle = await temporal.start_workflow(
                WORKFLOW_NAME, inp, id=f"renamed-can-{uuid.uuid4().hex[:12]}",
                task_queue=queue, result_type=RunResult)
            await pending(handle)
        first = temporal.get_workflow_handle(handle.id, run_id=handle.result_run_id)
        kinds = [e.event_type async for e in first.fetch_history_events()]
        assert kinds[-1] == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
        async with Worker(temporal, renamed, deps=deps, model=client, task_queue=queue):
            await handle.signal("approve", Decision(call_id="t1", approve=True))
            result = await asyncio.wait_for(result_of(handle), RUN_TIMEOUT)
    finally:
        model.stop()
    assert result.reason == "tool_unavailable"
    assert [(e.tool, e.call_id) for e in result.events if e.event == "tool_unavailable"] \
        == [("create_ticket", "t1")]
    assert list_tickets(tmp_path) == []
    assert await workflow_task_failures(handle, temporal) == 0
