"""Crashes with real processes: approvals and side effects survive kill -9.

Each test starts its own Temporal dev server (a SQLite file in tmp_path), the scripted
model server, and worker *processes* (`python -m boundloop.worker.main`), then kills one of them
with SIGKILL. What must hold: no approval is lost, no side effect is repeated, no model
request is repeated, and the RunResult is the one an uncrashed run gives.

Workers serve tests/support/crash_tools.py and start with a 1 s sticky schedule-to-start
timeout (the worker setting BOUNDLOOP_STICKY_TIMEOUT_SECONDS):
a decision sent after a crash first goes to the dead worker's sticky queue, and would
otherwise wait Temporal's default 10 s before any other worker may take it.

`Cluster` is also used by `tests/make_histories.py` to record the crash-and-resume history.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.client import Client, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.contrib.pydantic import pydantic_data_converter

from boundloop import search_attributes as sa
from boundloop.client import decide, query_status
from boundloop.client import result_of as client_result_of
from boundloop.contracts import (
    MODEL_ACTIVITY,
    TOOL_ACTIVITY,
    WORKFLOW_NAME,
    Decision,
    RunResult,
    run_input,
)
from boundloop.core.limits import Limits, Policy, RunSettings
from boundloop.devserver import DevServer
from boundloop.scripted.server import ScriptedModelServer
from boundloop.testing import free_port
from boundloop.tools.demo import list_tickets
from tests.conftest import workflow_task_failures
from tests.scripts import answer, call, outputs, resp
from tests.support.crash_tools import CRASH_AFTER_WRITE_ENV

ROOT = Path(__file__).resolve().parent.parent
DEMO_TOOLS = ["lookup_stock", "search_docs", "create_ticket"]
TICKET = {"title": "Printer on fire", "description": "3F printer smokes", "priority": "high"}
CRASH_TOOLS = "tests.support.crash_tools:tools"
#: Every wait in these tests is bounded by this (seconds); none is an assertion on time.
WAIT = 40.0


# --- the harness ----------------------------------------------------------------------


class Cluster:
    """One dev server, one scripted model server, worker processes on one task queue."""

    def __init__(self, tmp: Path, *, tools_target: str = CRASH_TOOLS, queue: str | None = None,
                 server_flags: Sequence[str] = ()) -> None:
        self.tmp = tmp
        self.data_dir = tmp / "data"
        self.server = DevServer(tmp / "temporal", port=free_port(), ui_port=None,
                                extra_flags=server_flags)
        self.model = ScriptedModelServer([])
        self.queue = queue or f"crash-{uuid.uuid4().hex[:8]}"
        self.tools_target = tools_target
        self.workers: list[subprocess.Popen[bytes]] = []
        self.client: Client | None = None
        self._base_url = ""

    async def start(self) -> Cluster:
        self.server.start()
        self._base_url = self.model.start()
        self.client = await self.connect()
        return self

    async def connect(self) -> Client:
        return await Client.connect(self.server.address, data_converter=pydantic_data_converter)

    def close(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.model.stop()
        self.server.stop()

    # workers

    def start_worker(self, *, crash_after_ticket_write: bool = False, cli: bool = False,
                     policy_file: Path | None = None) -> subprocess.Popen[bytes]:
        """`python -m boundloop.worker.main`, or with `cli` the operator's `boundloop worker`
        (`policy_file`: its BOUNDLOOP_POLICY)."""
        env = {k: v for k, v in os.environ.items()
               if k not in ("BOUNDLOOP_TOOLS", CRASH_AFTER_WRITE_ENV)}
        env.update({
            "TEMPORAL_ADDRESS": self.server.address,
            "BOUNDLOOP_TASK_QUEUE": self.queue,
            "OPENAI_BASE_URL": self._base_url,
            "OPENAI_API_KEY": "sk-test-not-real",
            "BOUNDLOOP_DATA_DIR": str(self.data_dir),
            "BOUNDLOOP_STICKY_TIMEOUT_SECONDS": "1",
            "BOUNDLOOP_TOOLS": self.tools_target,
            "PYTHONPATH": str(ROOT),  # `boundloop worker` imports the tests' toolset too
        })
        if crash_after_ticket_write:
            env[CRASH_AFTER_WRITE_ENV] = "1"
        if policy_file is not None:
            env["BOUNDLOOP_POLICY"] = str(policy_file)
        log = (self.tmp / f"worker-{len(self.workers)}.log").open("ab")
        command = ([str(Path(sys.executable).parent / "boundloop"), "worker"] if cli
                   else [sys.executable, "-m", "boundloop.worker.main"])
        proc = subprocess.Popen(command, cwd=ROOT, env=env,
                                stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.workers.append(proc)
        return proc

    @staticmethod
    def kill(proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL, as a crash would: nothing is flushed, nothing is told to the server."""
        assert proc.poll() is None, "the worker was already gone"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    # runs

    async def start_run(self, turns: list[dict[str, Any]], *, workflow_id: str | None = None,
                        tools: list[str] | None = None, limits: Limits | None = None,
                        question: str = "チケットを作って", policy: Policy | None = None,
                        tenant: str | None = None) -> WorkflowHandle[Any, RunResult]:
        """Append the run's turns to the model script and start the workflow (`tenant`: its
        BoundloopTenant search attribute). Runs of one cluster must run one after the
        other (the script is one shared sequence)."""
        assert self.client is not None
        for turn in turns:
            self.model.append(turn)
        settings = RunSettings(model="scripted-model", limits=limits or Limits(),
                               policy=policy or Policy())
        inp = run_input(question, instructions=None, settings=settings,
                        tools=tools if tools is not None else DEMO_TOOLS)
        return await self.client.start_workflow(
            WORKFLOW_NAME, inp, id=workflow_id or f"crash-{uuid.uuid4().hex[:12]}",
            task_queue=self.queue, result_type=RunResult,
            search_attributes=None if tenant is None else TypedSearchAttributes(
                [SearchAttributePair(sa.TENANT, tenant)]))

    def tickets_of(self, workflow_id: str) -> list[dict[str, Any]]:
        return [t for t in list_tickets(self.data_dir)
                if t["idempotency_key"].startswith(f"{workflow_id}/")]


@asynccontextmanager
async def cluster(tmp: Path, *, tools_target: str = CRASH_TOOLS,
                  queue: str | None = None, server_flags: Sequence[str] = (),
                  ) -> AsyncIterator[Cluster]:
    c = Cluster(tmp, tools_target=tools_target, queue=queue, server_flags=server_flags)
    try:
        yield await c.start()
    finally:
        c.close()


async def until(predicate: Callable[[], Awaitable[bool]], what: str,
                timeout: float = WAIT) -> None:
    end = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        if asyncio.get_running_loop().time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def wait_recorded_waiting(handle: WorkflowHandle[Any, Any]) -> None:
    """Until the server has recorded that the run waits for approval (the search
    attribute is written by the same workflow task that records the pending approval)."""
    async def recorded() -> bool:
        desc = await handle.describe()
        return desc.typed_search_attributes.get(sa.STATUS) == "waiting_approval"
    await until(recorded, "the run to wait for approval")


async def pending_call(handle: WorkflowHandle[Any, Any]) -> str:
    await wait_recorded_waiting(handle)
    status = await asyncio.wait_for(query_status(handle), WAIT)
    assert len(status.pending) == 1
    return status.pending[0].call_id


async def approve(handle: WorkflowHandle[Any, Any], call_id: str) -> None:
    result = await asyncio.wait_for(
        decide(handle, Decision(call_id=call_id, approve=True, approver="alice")), WAIT)
    assert result == "approved"


async def result_of(handle: WorkflowHandle[Any, RunResult]) -> RunResult:
    return await asyncio.wait_for(client_result_of(handle), WAIT)



def comparable(r: RunResult) -> dict[str, Any]:
    """Everything of a RunResult except the ids of the run itself and its processing
    time (a clock's reading, never the same twice)."""
    return r.model_dump(exclude={"workflow_id", "run_id", "processing_seconds"})


def ticket_script(prefix: str) -> list[dict[str, Any]]:
    """Look up stock, then ask for a ticket (approval), then answer: 3 steps."""
    return [
        resp(call("lookup_stock", {"sku": "B-002"}, f"{prefix}_stock"), rid=f"{prefix}_r1"),
        resp(call("create_ticket", TICKET, f"{prefix}_ticket"), rid=f"{prefix}_r2"),
        answer("チケットを作成しました。", rid=f"{prefix}_r3"),
    ]


# --- the cases ------------------------------------------------------------------------


async def test_worker_killed_while_waiting_for_approval_loses_nothing(tmp_path: Path) -> None:
    """Case 1: kill -9 while the run waits; a new worker takes the approval; one ticket,
    and the RunResult equals that of the same script run without a crash."""
    async with cluster(tmp_path) as c:
        first = c.start_worker()
        baseline = await c.start_run(ticket_script("same"))
        await approve(baseline, await pending_call(baseline))
        expected = await result_of(baseline)
        assert expected.reason == "completed"
        baseline_requests = len(c.model.requests)

        handle = await c.start_run(ticket_script("same"))
        call_id = await pending_call(handle)
        c.kill(first)
        c.start_worker(cli=True)
        await approve(handle, call_id)
        crashed = await result_of(handle)

        assert comparable(crashed) == comparable(expected)
        assert len(c.tickets_of(handle.id)) == 1
        assert len(c.model.requests) == 2 * baseline_requests
        assert c.model.violations == []
        assert await workflow_task_failures(handle) == 0


async def test_crash_after_ticket_write_retry_finds_the_first_row(tmp_path: Path) -> None:
    """Case 2: the worker dies inside create_ticket after the row is committed; the
    retry on a new worker returns that row (`already_existed: true`), once."""
    async with cluster(tmp_path) as c:
        doomed = c.start_worker(crash_after_ticket_write=True)
        handle = await c.start_run([
            resp(call("create_ticket", TICKET, "c1")),
            answer("作成済みです。"),
        ], limits=Limits(tool_timeout_seconds=3.0))
        await approve(handle, await pending_call(handle))
        code = await asyncio.wait_for(asyncio.to_thread(doomed.wait), WAIT)
        assert code == 137, "the crash hook did not fire"
        assert len(c.tickets_of(handle.id)) == 1

        c.start_worker()
        result = await result_of(handle)

        assert (result.reason, result.tool_executions) == ("completed", 1)
        assert len(c.tickets_of(handle.id)) == 1
        assert len(c.model.requests) == 2
        second = c.model.requests[1].body["input"]
        answers = [i for i in second if i.get("type") == "function_call_output"]
        assert [a["call_id"] for a in answers] == ["c1"]
        envelope = outputs(c.model.requests[1].body)["c1"]
        assert envelope["status"] == "success"
        assert envelope["data"]["already_existed"] is True
        assert envelope["data"]["ticket_id"] == c.tickets_of(handle.id)[0]["id"]
        assert c.model.violations == []
        assert await workflow_task_failures(handle) == 0


async def test_server_killed_while_waiting_for_approval_keeps_it(tmp_path: Path) -> None:
    """Case 3: kill -9 the dev server while the run waits; restart it on the same
    database file and port; the approval still waits and the run completes once."""
    async with cluster(tmp_path) as c:
        c.start_worker()
        handle = await c.start_run(ticket_script("srv"))
        call_id = await pending_call(handle)
        c.server.kill()
        c.server.start()  # same port, same database file; the client and worker reconnect
        status = await asyncio.wait_for(query_status(handle), WAIT)
        assert [a.call_id for a in status.pending] == [call_id]

        await approve(handle, call_id)
        result = await result_of(handle)

        assert (result.reason, result.steps, result.tool_executions) == ("completed", 3, 2)
        assert len(c.tickets_of(handle.id)) == 1
        assert len(c.model.requests) == 3
        assert c.model.violations == []


async def test_worker_killed_during_tool_does_not_ask_the_model_again(tmp_path: Path) -> None:
    """Case 4: the model answered with a call, the tool is running, the worker dies. A
    new worker retries the tool; the model gets exactly one request per step."""
    async with cluster(tmp_path) as c:
        first = c.start_worker()
        handle = await c.start_run([
            resp(call("hold", {"x": "1"}, "c1")),
            answer("done"),
        ], tools=["hold"])
        entered = c.data_dir / "hold-entered"

        async def tool_running() -> bool:
            return entered.exists()

        await until(tool_running, "the tool to start")
        c.kill(first)
        (c.data_dir / "hold-release").touch()
        c.start_worker()
        result = await result_of(handle)

        assert (result.reason, result.steps, result.tool_executions) == ("completed", 2, 1)
        assert result.text == "done"
        assert [r.turn_index for r in c.model.requests] == [0, 1]
        keys = entered.read_text(encoding="utf-8").split()
        assert len(keys) == 2 and len(set(keys)) == 1, "one call, retried with the same key"
        assert outputs(c.model.requests[1].body)["c1"]["data"] == {"held": "1"}
        assert c.model.violations == []
        assert await workflow_task_failures(handle) == 0


async def test_worker_killed_four_times_during_one_model_request_still_completes(
        tmp_path: Path) -> None:
    """Case 5: kill -9 the worker four times while the same model request is in flight
    (4 is the model request's whole retry budget). Lost attempts are not provider
    failures: the fifth attempt is answered and the run completes normally."""
    async with cluster(tmp_path) as c:
        held = answer("never delivered", delay_seconds=WAIT)  # its worker dies first
        worker = c.start_worker()
        handle = await c.start_run([held, held, held, held, answer("在庫があります。")],
                                   limits=Limits(model_timeout_seconds=3.0))
        for kills in range(1, 5):
            async def arrived(n: int = kills) -> bool:
                return len(c.model.requests) >= n

            await until(arrived, f"model attempt {kills}")
            c.kill(worker)
            worker = c.start_worker()
        result = await result_of(handle)

        assert (result.reason, result.steps, result.text) == ("completed", 1, "在庫があります。")
        assert not [e.event for e in result.events if e.event.startswith("model_failed")]
        assert len(c.model.requests) == 5
        assert len({r.headers.get("idempotency-key") for r in c.model.requests}) == 1
        assert c.model.violations == []
        assert await workflow_task_failures(handle) == 0


async def test_worker_killed_during_every_tool_attempt_is_not_a_tool_failure(
        tmp_path: Path) -> None:
    """Case 6: kill -9 the worker in each of the tool's 3 attempts. A lost attempt is
    not a failure of the tool: the fourth attempt returns, the model gets its result."""
    async with cluster(tmp_path) as c:
        worker = c.start_worker()
        handle = await c.start_run([resp(call("hold", {"x": "1"}, "c1")), answer("done")],
                                   tools=["hold"])
        entered = c.data_dir / "hold-entered"

        def attempts() -> int:
            return len(entered.read_text(encoding="utf-8").split()) if entered.exists() else 0

        for kills in range(1, 4):
            async def started(n: int = kills) -> bool:
                return attempts() >= n

            await until(started, f"tool attempt {kills}")
            c.kill(worker)
            worker = c.start_worker()
        (c.data_dir / "hold-release").touch()
        result = await result_of(handle)

        assert (result.reason, result.steps, result.tool_executions) == ("completed", 2, 1)
        envelope = outputs(c.model.requests[1].body)["c1"]
        assert (envelope["status"], envelope["data"]) == ("success", {"held": "1"})
        keys = entered.read_text(encoding="utf-8").split()
        assert len(keys) == 4 and len(set(keys)) == 1, "one call, retried with the same key"
        assert c.model.violations == []
        assert await workflow_task_failures(handle) == 0


# --- two workers: the one holding the conversation is killed ----------------------------


def _scheduled(events: list[Any]) -> list[tuple[str, str, int]]:
    """(activity type, task queue, scheduled event id) of each scheduled activity."""
    return [(e.activity_task_scheduled_event_attributes.activity_type.name,
             e.activity_task_scheduled_event_attributes.task_queue.name, e.event_id)
            for e in events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]


def first_ticket_script(prefix: str) -> list[dict[str, Any]]:
    """Ask for a ticket in the first turn (approval), then answer: 2 steps."""
    return [
        resp(call("create_ticket", TICKET, f"{prefix}_ticket"), rid=f"{prefix}_r1"),
        answer("チケットを作成しました。", rid=f"{prefix}_r2"),
    ]


async def test_holding_worker_killed_with_two_workers_shared_queue_takes_over(
        tmp_path: Path) -> None:
    """Two workers. After a run's first model turn its steps go to the worker that holds
    its conversation (its own task queue: the first request found nothing in a cache,
    so nothing says the shared queue would reach it); kill -9 that worker while the run
    waits for approval. The approved tool waits only its bounded schedule-to-start on
    the dead worker's queue, then the shared queue's worker runs it once and rebuilds the
    conversation from history: no failure counted, one ticket, one model request per
    step, the uncrashed result."""
    async with cluster(tmp_path) as c:
        workers = {p.pid: p for p in (c.start_worker(), c.start_worker())}
        baseline = await c.start_run(first_ticket_script("two"))
        await approve(baseline, await pending_call(baseline))
        expected = await result_of(baseline)

        handle = await c.start_run(first_ticket_script("two"))
        call_id = await pending_call(handle)
        before = (await handle.fetch_history()).events
        acts = _scheduled(before)
        assert [(name, queue == c.queue) for name, queue, _ in acts] == [(MODEL_ACTIVITY, True)]
        started = {e.activity_task_started_event_attributes.scheduled_event_id:
                   e.activity_task_started_event_attributes.identity for e in before
                   if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED}
        holder_pid = int(started[acts[0][2]].split("@")[0])  # the SDK's identity: pid@host
        c.kill(workers.pop(holder_pid))

        await approve(handle, call_id)
        crashed = await result_of(handle)

        assert comparable(crashed) == comparable(expected)
        assert not [e.event for e in crashed.events if e.event.startswith("model_failed")]
        assert len(c.tickets_of(handle.id)) == 1
        assert len(c.model.requests) == 4
        events = (await handle.fetch_history()).events
        after = _scheduled(events)[1:]
        holder_queue = after[0][1]
        assert holder_queue.startswith(f"{c.queue}/worker-")
        assert [(name, queue) for name, queue, _ in after[:2]] == [
            (TOOL_ACTIVITY, holder_queue), (TOOL_ACTIVITY, c.queue)]
        timed_out = [e.activity_task_timed_out_event_attributes for e in events
                     if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT]
        assert [(t.scheduled_event_id, t.failure.timeout_failure_info.timeout_type)
                for t in timed_out] == [(after[0][2], TimeoutType.TIMEOUT_TYPE_SCHEDULE_TO_START)]
        assert c.model.violations == []
        assert await workflow_task_failures(handle) == 0
