"""Where a run's activities go when several workers serve it: real dev servers (eager
activity execution on, the dev server's default, and off), three workers each with a
task queue of its own, the scripted model over HTTP. Counted by the workers' own
conversation caches (`ConversationCache.rebuilds`: model requests whose conversation
was read from the event history) and read from the run's event history."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from boundloop.client import result_of
from boundloop.contracts import MODEL_ACTIVITY, TOOL_ACTIVITY, WORKFLOW_NAME, RunResult, run_input
from boundloop.core.limits import Limits, RunSettings
from boundloop.scripted.server import ScriptedModelServer
from boundloop.testing import dev_server
from tests.conftest import RUN_TIMEOUT
from tests.conftest import test_worker as make_worker
from tests.scripts import answer, call, resp

#: Dev server flags that turn eager activity execution off (on in the dev server).
NO_EAGER = ["--dynamic-config-value", "system.enableActivityEagerExecution=false"]
STEPS = 8
WORKERS = 3


#: A regular activity (so it is routed too), and a short read-only tool run as a local
#: activity in the worker that runs the workflow's tasks (its output cached there).
TOOLS: dict[str, Callable[[int], dict[str, Any]]] = {"huge_remote": lambda i: {"chars": 10 + i},
         "lookup_stock": lambda i: {"sku": f"A-{i:03d}"}}


def script(tag: str, tool: str) -> list[dict[str, Any]]:
    """STEPS steps each calling `tool`, then the answer. Call ids differ between runs
    (the scripted server remembers them)."""
    return [resp(call(tool, TOOLS[tool](i), f"{tag}_c{i}"), rid=f"{tag}_r{i}")
            for i in range(STEPS)] + [answer("done", rid=f"{tag}_end")]


async def run_on_workers(client: Client, tmp: Path, tool: str
                         ) -> tuple[RunResult, list[str], int]:
    """One run on WORKERS workers: its result, the task queue of each scheduled activity
    in order ("model shared", "tool <a worker's own queue>", ...), and the rebuilds from
    history counted by all the workers' caches."""
    tag = uuid.uuid4().hex[:8]
    server = ScriptedModelServer(script(tag, tool))
    base_url = server.start()
    queue = f"route-{tag}"
    # A connection each: workers on one connection may not share a task queue.
    target = client.service_client.config.target_host
    workers = [make_worker(await Client.connect(target, data_converter=client.data_converter),
                           queue, base_url, tmp / "data") for _ in range(WORKERS)]
    settings = RunSettings(model="scripted-model", api="responses", stream=False,
                           limits=Limits(max_steps=STEPS + 2, max_tool_executions=STEPS))
    try:
        async with contextlib.AsyncExitStack() as stack:
            for w in workers:
                await stack.enter_async_context(w)
            handle = await client.start_workflow(
                WORKFLOW_NAME, run_input("route", instructions=None, settings=settings,
                                         tools=[tool]),
                id=f"route-{tag}", task_queue=queue, result_type=RunResult)
            result = await asyncio.wait_for(result_of(handle), RUN_TIMEOUT)
        assert server.violations == []
    finally:
        server.stop()
    queues = []
    async for e in handle.fetch_history_events():
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            a = e.activity_task_scheduled_event_attributes
            kind = {MODEL_ACTIVITY: "model", TOOL_ACTIVITY: "tool"}[a.activity_type.name]
            queues.append(f"{kind} shared" if a.task_queue.name == queue
                          else f"{kind} {a.task_queue.name}")
    assert (result.reason, result.steps, result.tool_executions) == (
        "completed", STEPS + 1, STEPS)
    return result, queues, sum(w.plugin.cache.rebuilds for w in workers)


def after_second_request(queues: list[str]) -> tuple[list[str], list[str]]:
    """(The activities up to the run's second model request, those after it.)"""
    second = [i for i, q in enumerate(queues) if q.startswith("model ")][1]
    return queues[:second + 1], queues[second + 1:]


@pytest.mark.parametrize("tool", TOOLS)
async def test_with_eager_execution_the_run_stays_on_the_shared_queue(
        temporal: Client, tmp_path: Path, tool: str) -> None:
    """The first turn names its worker: the next request (and a regular tool before it)
    goes to that worker's own queue and finds the conversation there, so the run tries
    the shared queue, which eager execution starts on the same worker (the one running
    the workflow's tasks): found again, and the rest of the run stays there."""
    _, queues, rebuilds = await run_on_workers(temporal, tmp_path, tool)

    first, rest = after_second_request(queues)
    holder = first[-1].split()[1]
    assert first[0] == "model shared" and holder != "shared"
    assert {q.split()[1] for q in first[1:]} == {holder}
    assert rest and {q.split()[1] for q in rest} == {"shared"}
    assert rebuilds == 0


@pytest.mark.parametrize(("tool", "bound"), [("huge_remote", 1), ("lookup_stock", 3)])
async def test_without_eager_execution_a_run_rebuilds_a_bounded_number_of_times(
        tmp_path: Path, tool: str, bound: int) -> None:
    """The same run on a server without eager execution: the shared queue sends the tried
    request to any worker, which may not hold the conversation. After one miss, the run
    follows the worker holding it to the end; a local tool's outcome moves the holder to
    the worker running the workflow's tasks, where its output is (one more rebuild
    there). The shared queue alone rebuilds most requests with three workers."""
    async with dev_server(extra_args=NO_EAGER) as client:
        _, queues, rebuilds = await run_on_workers(client, tmp_path, tool)

    assert rebuilds <= bound
    # The run tries the shared queue at most once: once an activity goes to a worker's
    # own queue after it, no later one goes to the shared queue.
    shared = [i for i, q in enumerate(queues) if i and q.endswith(" shared")]
    tried = queues[shared[0]:] if shared else []
    own = [i for i, q in enumerate(tried) if not q.endswith(" shared")]
    assert not own or all(not q.endswith(" shared") for q in tried[own[0]:]), queues


@pytest.mark.parametrize("cached", [True, False])
def test_a_turn_says_whether_it_found_its_conversation_only_when_it_did(cached: bool) -> None:
    """The flag rides in history only on a hit (a Turn is written every step)."""
    from boundloop.core.turn import Turn
    dumped = Turn(items=[], cached=cached).model_dump(mode="json")
    assert ("cached" in dumped) is cached
