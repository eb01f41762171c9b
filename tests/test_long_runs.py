"""Runs as long as the work: what continue-as-new hands over does not grow with the run,
and every whole-run guarantee still sees every earlier call (boundloop.core.carry).

A dev server that suggests continue-as-new every few steps makes a few hundred steps a
long chain of Temporal runs; each `WorkflowExecutionContinuedAsNew` event's input is
measured against the bound.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from boundloop import Plugin
from boundloop.client import decide, query_status, result_of
from boundloop.contracts import (
    EARLIER_CALLS_ACTIVITY,
    WORKFLOW_NAME,
    Decision,
    RunInput,
    RunResult,
)
from boundloop.core import carry
from boundloop.core.limits import Limits, Policy, RunSettings
from boundloop.scripted.server import ScriptedModelServer
from tests.conftest import continue_as_new_server, workflow_task_failures
from tests.conftest import test_worker as make_worker
from tests.scripts import answer, call, resp
from tests.support.tools import tools

#: Steps of the long run: the most that fit the test's time with a continue-as-new every
#: few steps (about 70 Temporal runs).
LONG = 300
#: The bound of this run shape's carried input: the filter (FILTER_BITS, base64), the
#: newest EVENTS_KEPT events (at most 250 bytes each here), the stream's newest items
#: (STREAM_KEPT_BYTES of payloads, base64 in their wire form), and what does not depend
#: on the steps at all: settings, tool declarations, one step's segment and outputs.
BOUND = (carry.FILTER_BITS // 6 + carry.EVENTS_KEPT * 250
         + carry.STREAM_KEPT_BYTES * 3 // 2 + carry.PUBLISHERS_KEPT * 100 + 10_000)


@pytest_asyncio.fixture(scope="module")
async def frequent(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Client]:
    async with continue_as_new_server(
            tmp_path_factory.mktemp("long") / "temporal.db", 30) as client:
        yield client


def sku(i: int) -> str:
    return f"{chr(65 + (i // 1000) % 26)}-{i % 1000:03d}"


def lookups(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [resp(call("lookup_stock", {"sku": sku(i)}, f"c{i}"), rid=f"r{i}")
            for i in range(start, start + n)]


@dataclass
class Chain:
    result: RunResult
    #: Per Temporal run, first to last: (events in its history, bytes of the input it
    #: handed on, or None for the last), and its history.
    runs: list[tuple[int, int | None]]
    histories: list[Any]
    server: ScriptedModelServer


async def run_chain(client: Client, tmp_path: Path, turns: list[dict[str, Any]],
                    limits: Limits, api: str = "responses", policy: Policy | None = None,
                    tools: list[str] | None = None,
                    during: Callable[[WorkflowHandle[Any, Any]], Awaitable[None]] | None = None,
                    ) -> Chain:
    server = ScriptedModelServer(turns)
    queue = f"long-{uuid.uuid4().hex[:8]}"
    inp = RunInput(question="look up each part", tools=tools or ["lookup_stock"],
                   settings=RunSettings(model="m", api=api,  # type: ignore[arg-type]
                                        limits=limits, policy=policy or Policy()))
    try:
        async with make_worker(client, queue, server.start(), tmp_path):
            handle = await client.start_workflow(WORKFLOW_NAME, inp, id=f"long-{queue}",
                                                 task_queue=queue, result_type=RunResult)
            if during is not None:
                await during(handle)
            result = await asyncio.wait_for(result_of(handle), 300)
    finally:
        server.stop()
    assert await workflow_task_failures(handle, client) == 0
    runs: list[tuple[int, int | None]] = []
    histories = []
    first = [wf.run_id async for wf in client.list_workflows(f"WorkflowId = '{handle.id}'")]
    nexts: dict[str, str] = {}
    sizes: dict[str, tuple[int, int | None]] = {}
    for run_id in first:
        h = client.get_workflow_handle(handle.id, run_id=run_id)
        history = await h.fetch_history()
        carried = None
        for event in history.events:
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
                attrs = event.workflow_execution_continued_as_new_event_attributes
                carried = sum(len(p.data) for p in attrs.input.payloads)
                nexts[run_id] = attrs.new_execution_run_id
        sizes[run_id] = (len(history.events), carried)
        histories.append(history)
    # The first run: the one no run continued into; follow the chain from it.
    run: str | None = next(r for r in first if r not in set(nexts.values()))
    while run is not None:
        runs.append(sizes[run])
        run = nexts.get(run)
    return Chain(result=result, runs=runs, histories=histories, server=server)


def earlier_lookups(chain: Chain) -> int:
    """Local activities of `earlier_calls` in the chain's histories."""
    found = 0
    for history in chain.histories:
        for event in history.events:
            if event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
                data = event.marker_recorded_event_attributes.details.get("data")
                if data is not None and EARLIER_CALLS_ACTIVITY.encode() in data.payloads[0].data:
                    found += 1
    return found


async def test_a_long_run_carries_a_bounded_input_at_every_continue_as_new(
        frequent: Client, tmp_path: Path) -> None:
    limits = Limits(max_steps=LONG + 2, max_tool_executions=LONG, token_threshold=10**9,
                    max_history_bytes=10**8, deadline_seconds=3600.0)
    chain = await run_chain(frequent, tmp_path, [*lookups(LONG), answer("done")], limits)
    result = chain.result
    assert (result.reason, result.steps, result.tool_executions) == ("completed", LONG + 1,
                                                                   LONG)
    carried = [c for _, c in chain.runs if c is not None]
    assert len(carried) > 20, "the low threshold should have continued as new often"
    for size in carried:
        assert size <= BOUND, (size, BOUND)
    # Not growing: once its windows are full (the first runs), every run hands over the
    # same, give or take one step's records.
    later = carried[len(carried) // 2:]
    assert max(later) - min(later) <= 2_000, carried
    # History per Temporal run: bounded by the server's suggestion (30 events) plus one
    # step's events and the run's start and end.
    assert max(events for events, _ in chain.runs) <= 30 + 20
    # The event log shows its newest events after one standing for the older ones.
    first = result.events[0]
    assert first.event.startswith(carry.DROPPED)
    dropped = int(first.event.removeprefix(carry.DROPPED))
    assert result.events[-1].event == "stopped:completed"
    # Every step logs model_requested, model_returned and its tool's result; plus the
    # start, the answer and the stop.
    assert dropped + len(result.events) - 1 == 3 * LONG + 2 + 3
    # The model attempts no longer carried are summed in one record: totals still add up.
    assert result.model_attempts[0].outcome.startswith(carry.EARLIER_ATTEMPTS)
    assert sum(a.input_tokens + a.output_tokens
               for a in result.model_attempts) == result.total_tokens
    # Every request carried the whole conversation, in order, across the runs.
    inputs = [r.body["input"] for r in chain.server.requests]
    assert [len(i) for i in inputs] == [1 + 2 * n for n in range(LONG + 1)]
    # Each run of the chain replays without nondeterminism.
    replayer = Replayer(workflows=[], data_converter=pydantic_data_converter,
                        plugins=[Plugin(tools, deps=None)])
    for history in chain.histories:
        assert (await replayer.replay_workflow(history)).replay_failure is None


#: Calls between an early call and its repeat: several Temporal runs apart.
BETWEEN = 40


async def test_the_identical_call_limit_sees_a_call_made_several_runs_before(
        frequent: Client, tmp_path: Path) -> None:
    """sku(0) is called at step 1 and again after BETWEEN other calls (its second call,
    allowed), then a third time: blocked, though the first call's run is long gone."""
    turns = [*lookups(1), *lookups(BETWEEN, start=1),
             resp(call("lookup_stock", {"sku": sku(0)}, "again-1"), rid="ra1"),
             *lookups(BETWEEN, start=BETWEEN + 1),
             resp(call("lookup_stock", {"sku": sku(0)}, "again-2"), rid="ra2"),
             answer("stopped repeating")]
    limits = Limits(max_steps=2 * BETWEEN + 10, max_tool_executions=2 * BETWEEN + 10,
                    token_threshold=10**9, max_history_bytes=10**8,
                    max_identical_calls=2, deadline_seconds=3600.0)
    chain = await run_chain(frequent, tmp_path, turns, limits)
    assert len(chain.runs) > 10
    result = chain.result
    assert result.reason == "max_identical_calls"
    blocked = [e for e in result.events if e.event == "blocked_identical"]
    assert [e.call_id for e in blocked] == ["again-2"]
    # Both repeats were looked up in the earlier runs (the filter said maybe).
    assert earlier_lookups(chain) >= 2


async def test_a_call_id_reused_several_runs_later_is_still_a_protocol_error(
        frequent: Client, tmp_path: Path) -> None:
    turns = [*lookups(BETWEEN),
             resp(call("lookup_stock", {"sku": sku(500)}, "c1"), rid="reused"),
             answer("never asked")]
    limits = Limits(max_steps=BETWEEN + 5, max_tool_executions=BETWEEN + 5,
                    token_threshold=10**9, max_history_bytes=10**8, deadline_seconds=3600.0)
    chain = await run_chain(frequent, tmp_path, turns, limits)
    assert len(chain.runs) > 5
    result = chain.result
    assert result.reason == "protocol_error"
    assert [e.call_id for e in result.events if e.event == "duplicate_call_id"] == ["c1"]
    assert "reused call id 'c1'" in result.text
    assert earlier_lookups(chain) >= 1


async def test_a_call_a_human_rejected_several_runs_before_is_refused_without_asking(
        frequent: Client, tmp_path: Path) -> None:
    """A ticket rejected at step 1; BETWEEN lookups later (many Temporal runs on) the
    model asks for the same ticket: refused as rejected, never asked again."""
    ticket = {"title": "B-002 補充依頼", "description": "在庫0", "priority": "high"}
    turns = [resp(call("create_ticket", ticket, "t1"), rid="rt1"), *lookups(BETWEEN),
             resp(call("create_ticket", ticket, "t2"), rid="rt2"), answer("gave up")]

    async def reject(handle: WorkflowHandle[Any, Any]) -> None:
        for _ in range(600):
            status = await query_status(handle)
            if status.pending:
                await decide(handle, Decision(call_id="t1", approve=False, approver="alice",
                                              run=status.run,
                                              fingerprint=status.pending[0].fingerprint))
                return
            await asyncio.sleep(0.1)
        raise AssertionError("no approval was asked")

    limits = Limits(max_steps=BETWEEN + 5, max_tool_executions=BETWEEN + 5,
                    token_threshold=10**9, max_history_bytes=10**8, deadline_seconds=3600.0)
    chain = await run_chain(frequent, tmp_path, turns, limits,
                            tools=["lookup_stock", "create_ticket"], during=reject)
    assert len(chain.runs) > 5
    result = chain.result
    assert result.reason == "max_identical_calls"
    assert [e.call_id for e in result.events if e.event == "refused_rejected_again"] == ["t2"]
    assert not [e for e in result.events if e.event == "approval_requested"
                and e.call_id == "t2"]
    assert earlier_lookups(chain) >= 1
