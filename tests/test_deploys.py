"""Deploys without worker versioning while a run waits for approval on `create_ticket`,
with real worker processes on a real dev server.

- A next release that renames, removes or reshapes `create_ticket`: the approved run
  stops with `tool_unavailable` naming it, no workflow task fails, `status` says so.
- One that changes `create_ticket`'s arguments compatibly (an optional argument with a
  default, a wider `priority`): the approved call runs, one ticket.
- One that stops asking for approval before `create_ticket`, deployed while the run's
  model request is in flight: the run still asks, nothing runs until it is approved.
- One that also schedules an extra activity before each approval wait (no patch): the
  run's workflow task fails; `boundloop approve` exits 6, saying the decision is
  recorded and waits for a healthy worker; once the old release is back, the run
  completes, the decision applied once.
- Tool idempotency keys are the run's own: a new run under a reused workflow id
  creates its own ticket; a reset run keeps its keys (no second ticket)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHandle

from boundloop.budgets import set_budget
from boundloop.client import query_status, result_of
from boundloop.contracts import TOOL_ACTIVITY, WORKFLOW_NAME, RunInput, RunResult, RunStatus
from boundloop.core.budget import BudgetLimits
from boundloop.core.limits import Limits, RunSettings
from boundloop.scripted.server import ScriptedModelServer
from boundloop.testing import wait_until
from boundloop.tools.demo import list_tickets
from tests.conftest import DEMO_TOOLS, RUN_TIMEOUT, workflow_task_failures
from tests.scripts import answer, call, outputs, resp
from tests.test_cli import env_for
from tests.test_replay_check import TICKET, as_deploying_shows, cli
from tests.test_worker_process import BOUNDLOOP, ROOT, log_has, process, worker_env

#: `boundloop worker` with the next release's workflow code checked out.
NEXT_RELEASE_WORKER = [sys.executable, "-m", "tests.support.next_release", "worker"]
#: The Temporal CLI an operator resets a run with.
TEMPORAL = str(Path(sys.executable).parent / "temporal")


@contextmanager
def deployed(command: list[str], env: dict[str, str], log: Path,
             ) -> Iterator[subprocess.Popen[bytes]]:
    """A worker process, stopped with SIGTERM (as a deploy stops it) when the block ends."""
    with process(command, env, log) as worker:
        yield worker
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)


async def parked_on_v1(temporal: Client, env: dict[str, str], queue: str, tmp_path: Path,
                       inp: RunInput) -> WorkflowHandle[object, RunResult]:
    """A run started on the first release's worker (`env`), waiting for approval when
    that worker is stopped as a deploy stops it."""
    with deployed([BOUNDLOOP, "worker"], env, tmp_path / "v1.log"):
        await log_has(tmp_path / "v1.log", "worker started")
        handle = await temporal.start_workflow(
            WORKFLOW_NAME, inp, id=f"dep-{uuid.uuid4().hex[:12]}", task_queue=queue,
            result_type=RunResult)
        await parked(handle)
    return handle


async def parked(handle: WorkflowHandle[object, RunResult]) -> None:
    async def waiting() -> bool:
        return bool((await query_status(handle)).pending)

    await wait_until(waiting, timeout=60)


async def test_a_decision_for_a_stuck_run_is_recorded_and_applied_once_the_old_code_is_back(
        temporal: Client, tmp_path: Path) -> None:
    server = ScriptedModelServer([resp(call("create_ticket", TICKET, "t1")),
                                  answer("Ticket opened.")])
    queue = f"dep-{uuid.uuid4().hex[:8]}"
    env = worker_env(tmp_path, BOUNDLOOP_TASK_QUEUE=queue, OPENAI_BASE_URL=server.start(),
                     OPENAI_API_KEY="sk-test-not-real", PYTHONPATH=str(ROOT),
                     TEMPORAL_ADDRESS=temporal.service_client.config.target_host,
                     BOUNDLOOP_TOOLS="tests.support.tools:tools")
    next_release = {**env, "BOUNDLOOP_TOOLS": "tests.support.renamed_tools:tools"}
    cli_env = env_for(temporal, tmp_path)
    inp = RunInput(question="open a ticket", settings=RunSettings(model="scripted-model"),
                   tools=DEMO_TOOLS)
    try:
        handle = await parked_on_v1(temporal, env, queue, tmp_path, inp)
        with deployed(NEXT_RELEASE_WORKER, next_release, tmp_path / "v2.log"):
            await log_has(tmp_path / "v2.log", "worker started")
            # No workflow task has failed yet: the status query is the first to replay
            # the run on the new code. One line and the stuck exit code, no traceback.
            code, out, err = await cli("status", handle.id, env=cli_env)
            assert code == 6 and "Traceback" not in err, (out, err)
            assert "could not replay" in err and "replay-check" in err, err
            code, out, err = await cli("approve", handle.id, "t1", env=cli_env)
            said = " ".join(err.split())
            assert code == 6, (out, err)
            assert "workflow task failing since" in said and "Nondeterminism" in said
            assert "The decision is recorded in the run's history and waits for a healthy " \
                   "worker" in said
            # The update given up is retrieved: asyncio reports nothing at exit.
            assert "never retrieved" not in err and "Traceback" not in err, err
            # Asked again (the operator is not sure): recorded again, applied once below.
            code, out, err = await cli("reject", handle.id, "t1", "--reason", "no", env=cli_env)
            assert code == 6 and "decision is recorded" in " ".join(err.split()), (out, err)
            assert "never retrieved" not in err, err
            # A signed decision needs the call as the run shows it: nothing is sent.
            code, out, err = await cli("keys", "new", "alice", "--dir", str(tmp_path),
                                       env=cli_env)
            assert code == 0, err
            code, out, err = await cli("approve", handle.id, "t1", "--as", "alice", "--key",
                                       str(tmp_path / "alice.key"), env=cli_env)
            assert code == 6 and "nothing was sent" in " ".join(err.split()), (out, err)
            assert await workflow_task_failures(handle, temporal) > 0
        with deployed([BOUNDLOOP, "worker"], env, tmp_path / "v1-again.log"):
            result = await asyncio.wait_for(result_of(handle), timeout=RUN_TIMEOUT)
    finally:
        server.stop()
    assert result.reason.value == "completed", result
    assert len(list_tickets(tmp_path / "data")) == 1
    decided = [(e.event, e.detail) for e in result.events if e.event.startswith("approval_")
               and e.event != "approval_requested"]
    assert decided == [("approval_approved", "by operator")]


@pytest.mark.parametrize(("toolset", "budget"), [
    ("tools", False), ("removed", False), ("reshaped", False), ("tools", True)])
async def test_a_changed_tool_stops_the_approved_run_with_a_typed_reason(
        temporal: Client, tmp_path: Path, toolset: str, budget: bool) -> None:
    """`tools` renames create_ticket, `removed` drops it, `reshaped` changes its
    arguments so that the approved call no longer fits them (tests/support/renamed_tools.py;
    the event names the mismatch; a compatible change runs the call, below). With a
    shared budget, replay sizes each request's reservation from the tools the run was
    admitted with (it read the new worker's toolset: a rename failed every workflow task
    with KeyError)."""
    server = ScriptedModelServer([resp(call("create_ticket", TICKET, "t1"))])
    queue = f"dep-{uuid.uuid4().hex[:8]}"
    env = worker_env(tmp_path, BOUNDLOOP_TASK_QUEUE=queue, OPENAI_BASE_URL=server.start(),
                     OPENAI_API_KEY="sk-test-not-real", PYTHONPATH=str(ROOT),
                     TEMPORAL_ADDRESS=temporal.service_client.config.target_host,
                     BOUNDLOOP_TOOLS="tests.support.tools:tools")
    cli_env = env_for(temporal, tmp_path)
    key = f"dep-{uuid.uuid4().hex[:8]}" if budget else None
    inp = RunInput(question="open a ticket", tools=DEMO_TOOLS, settings=RunSettings(
        model="scripted-model", budget=key,
        limits=Limits(max_output_tokens=1024) if budget else Limits()))
    try:
        with deployed([BOUNDLOOP, "worker"], env, tmp_path / "v1.log"):
            await log_has(tmp_path / "v1.log", "worker started")
            if key is not None:
                await set_budget(temporal, key, BudgetLimits(tokens=1_000_000),
                                 task_queue=queue)
            handle = await temporal.start_workflow(
                WORKFLOW_NAME, inp, id=f"dep-{uuid.uuid4().hex[:12]}", task_queue=queue,
                result_type=RunResult)
            await parked(handle)
        v2 = {**env, "BOUNDLOOP_TOOLS": f"tests.support.renamed_tools:{toolset}"}
        with deployed([BOUNDLOOP, "worker"], v2, tmp_path / "v2.log"):
            await log_has(tmp_path / "v2.log", "worker started")
            code, out, err = await cli("approve", handle.id, "t1", env=cli_env)
            assert code == 0 and "t1: approved" in out, (out, err)
            result = await asyncio.wait_for(result_of(handle), timeout=RUN_TIMEOUT)
            code, out, err = await cli("status", handle.id, env=cli_env)
    finally:
        server.stop()
    assert result.reason.value == "tool_unavailable", result
    assert code == 3, (out, err)
    named = [line for line in out.splitlines() if "tool_unavailable · create_ticket" in line]
    assert len(named) == 1, out
    if toolset == "tools":  # renamed: what docs/deploying.md shows
        as_deploying_shows("boundloop status dep-3b1f6e0c2a97", (out + err).splitlines(),
                           handle.id, "dep-3b1f6e0c2a97")
    mismatch = ("create_ticket's arguments changed since the run was admitted, and this "
                "call no longer fits them: severity: Field required; priority: Extra inputs "
                "are not permitted")
    if toolset == "reshaped":  # the mismatch named, as docs/deploying.md shows it
        as_deploying_shows("boundloop status dep-8e2b5f1a6d04", (out + err).splitlines(),
                           handle.id, "dep-8e2b5f1a6d04")
        assert named[0].endswith(f" · {mismatch}"), named
    assert [e.detail for e in result.events if e.event == "tool_unavailable"] == [
        mismatch if toolset == "reshaped" else "create_ticket is not served here"]
    assert list_tickets(tmp_path / "data") == []
    assert await workflow_task_failures(handle, temporal) == 0
    assert len(server.requests) == 1  # nothing asked of the model after the stop


def release_env(temporal: Client, tmp_path: Path, base_url: str,
                queue: str) -> dict[str, str]:
    """The first release's `boundloop worker` environment: the scripted model, the dev
    server, the tests' toolset (create_ticket asks for approval)."""
    return worker_env(tmp_path, BOUNDLOOP_TASK_QUEUE=queue, OPENAI_BASE_URL=base_url,
                      OPENAI_API_KEY="sk-test-not-real", PYTHONPATH=str(ROOT),
                      TEMPORAL_ADDRESS=temporal.service_client.config.target_host,
                      BOUNDLOOP_TOOLS="tests.support.tools:tools")


async def decided(handle: WorkflowHandle[object, RunResult]) -> RunStatus:
    """The run's status once it waits for a decision or has ended (whichever comes)."""
    async def settled() -> bool:
        status = await query_status(handle)
        return bool(status.pending) or status.status in ("completed", "stopped")

    await wait_until(settled, timeout=RUN_TIMEOUT)
    return await query_status(handle)


@pytest.mark.parametrize("toolset", [
    "tools",
    "predicate",
])
@pytest.mark.parametrize("stop", ["kill", "term"])
async def test_a_deploy_during_the_model_request_never_loosens_the_runs_approval(
        temporal: Client, tmp_path: Path, toolset: str, stop: str) -> None:
    """v1 serves create_ticket asking for approval; the run's first model request is in
    flight (the scripted server holds its answer) when v1 is killed and v2 takes over,
    whose toolset declares create_ticket with needs_approval=False, or with a predicate
    that asks for no call (tests/support/loosened_tools.py). The model's create_ticket
    call is decided on v2: it still waits for approval, nothing is created until it is
    approved (before STRICTER_APPROVALS the worker's own rule decided: v2 created the
    ticket at once). v1 is killed, or stopped as a deploy stops it (SIGTERM: the SDK
    fails the attempt in flight with WorkerShutdown, a lost worker like a kill, never a
    counted failure: the run ended model_error at once)."""
    released = threading.Event()  # the held answer goes out when the test lets it go
    held = resp(call("create_ticket", TICKET, "t1"), delay_seconds=RUN_TIMEOUT)
    server = ScriptedModelServer([held, resp(call("create_ticket", TICKET, "t1")),
                                  answer("Ticket opened.")], sleep=released.wait)
    queue = f"dep-{uuid.uuid4().hex[:8]}"
    env = release_env(temporal, tmp_path, server.start(), queue)
    loosened = {**env, "BOUNDLOOP_TOOLS": f"tests.support.loosened_tools:{toolset}"}
    cli_env = env_for(temporal, tmp_path)
    inp = RunInput(question="open a ticket", settings=RunSettings(model="scripted-model"),
                   tools=DEMO_TOOLS)
    try:
        with process([BOUNDLOOP, "worker"], env, tmp_path / "v1.log") as v1:
            await log_has(tmp_path / "v1.log", "worker started")
            handle = await temporal.start_workflow(
                WORKFLOW_NAME, inp, id=f"dep-{uuid.uuid4().hex[:12]}", task_queue=queue,
                result_type=RunResult)

            async def in_flight() -> bool:
                return len(server.requests) == 1

            await wait_until(in_flight, timeout=RUN_TIMEOUT)
            # Stopped with the request out: the run sends it again, not counted.
            if stop == "kill":
                v1.kill()
            else:
                v1.send_signal(signal.SIGTERM)
            v1.wait(timeout=60)
        released.set()  # v1 is gone: its request's answer reaches no one
        with deployed([BOUNDLOOP, "worker"], loosened, tmp_path / "v2.log"):
            await log_has(tmp_path / "v2.log", "worker started")
            status = await decided(handle)
            assert [a.call_id for a in status.pending] == ["t1"], status
            assert [(e.event, e.tool) for e in status.events
                    if e.event == "approval_requested"] == [
                ("approval_requested", "create_ticket")], status.events
            assert list_tickets(tmp_path / "data") == []  # nothing ran before the decision
            assert [r.turn_index for r in server.requests] == [0, 1]
            code, out, err = await cli("approve", handle.id, "t1", env=cli_env)
            assert code == 0 and "t1: approved" in out, (out, err)
            result = await asyncio.wait_for(result_of(handle), timeout=RUN_TIMEOUT)
    finally:
        released.set()
        server.stop()
    assert result.reason.value == "completed", result
    assert [t["title"] for t in list_tickets(tmp_path / "data")] == ["Printer on fire"]
    assert [(e.event, e.detail) for e in result.events if e.event.startswith("approval_")] \
        == [("approval_requested", None), ("approval_approved", "by operator")]
    assert await workflow_task_failures(handle, temporal) == 0


@pytest.mark.parametrize("toolset", ["tools", "widened"])
async def test_a_compatible_argument_change_runs_the_approved_call(
        temporal: Client, tmp_path: Path, toolset: str) -> None:
    """v2's create_ticket takes an optional `notify` with a default (`tools`) or a wider
    `priority` (`widened`), tests/support/compatible_tools.py: the call approved under it
    still fits, so it runs, once, in the demo store (before, any other schema digest
    stopped the run with tool_unavailable)."""
    server = ScriptedModelServer([resp(call("create_ticket", TICKET, "t1")),
                                  answer("Ticket opened.")])
    queue = f"dep-{uuid.uuid4().hex[:8]}"
    env = release_env(temporal, tmp_path, server.start(), queue)
    v2 = {**env, "BOUNDLOOP_TOOLS": f"tests.support.compatible_tools:{toolset}"}
    cli_env = env_for(temporal, tmp_path)
    inp = RunInput(question="open a ticket", settings=RunSettings(model="scripted-model"),
                   tools=DEMO_TOOLS)
    try:
        handle = await parked_on_v1(temporal, env, queue, tmp_path, inp)
        with deployed([BOUNDLOOP, "worker"], v2, tmp_path / "v2.log"):
            await log_has(tmp_path / "v2.log", "worker started")
            code, out, err = await cli("approve", handle.id, "t1", env=cli_env)
            assert code == 0 and "t1: approved" in out, (out, err)
            result = await asyncio.wait_for(result_of(handle), timeout=RUN_TIMEOUT)
    finally:
        server.stop()
    assert result.reason.value == "completed", result
    assert result.tool_executions == 1
    tickets = list_tickets(tmp_path / "data")
    assert [(t["title"], t["priority"]) for t in tickets] == [("Printer on fire", "high")]
    # v2's create_ticket ran it: the model got v2's result (with the default filled in).
    data = outputs(server.requests[1].body)["t1"]["data"]
    assert (data["ticket_id"], data["already_existed"]) == (tickets[0]["id"], False)
    if toolset == "tools":
        assert data["notified"] is False
    assert not [e for e in result.events if e.event == "tool_unavailable"]
    assert await workflow_task_failures(handle, temporal) == 0


def key_of(run: WorkflowHandle[object, RunResult], step: int = 1, call: int = 0) -> str:
    """A tool call's idempotency key in the run (RUN_SCOPED_KEYS)."""
    return f"{run.id}/{run.first_execution_run_id}/step-{step}/call-{call}"


async def approved(handle: WorkflowHandle[object, RunResult],
                   cli_env: dict[str, str]) -> RunResult:
    """The run's result after it parks on t1 and `boundloop approve` approves it."""
    await parked(handle)
    code, out, err = await cli("approve", handle.id, "t1", env=cli_env)
    assert code == 0 and "t1: approved" in out, (out, err)
    return await asyncio.wait_for(result_of(handle), timeout=RUN_TIMEOUT)


async def test_a_new_run_under_a_reused_workflow_id_never_shares_a_tool_key(
        temporal: Client, tmp_path: Path) -> None:
    """Run A under workflow id X creates a ticket and completes; run B, started under X
    with the same scripted call, creates its own (before RUN_SCOPED_KEYS both calls had
    the key `X/step-1/call-0`: the store answered B with A's ticket, already_existed)."""
    ticket = resp(call("create_ticket", TICKET, "t1"))
    server = ScriptedModelServer([ticket, answer("Ticket opened."),
                                  ticket, answer("Ticket opened.")])
    queue = f"dep-{uuid.uuid4().hex[:8]}"
    env = release_env(temporal, tmp_path, server.start(), queue)
    cli_env = env_for(temporal, tmp_path)
    inp = RunInput(question="open a ticket", settings=RunSettings(model="scripted-model"),
                   tools=DEMO_TOOLS)
    workflow_id = f"dep-{uuid.uuid4().hex[:12]}"
    results: list[RunResult] = []
    runs: list[WorkflowHandle[object, RunResult]] = []
    try:
        with deployed([BOUNDLOOP, "worker"], env, tmp_path / "v1.log"):
            await log_has(tmp_path / "v1.log", "worker started")
            for _ in range(2):
                runs.append(await temporal.start_workflow(
                    WORKFLOW_NAME, inp, id=workflow_id, task_queue=queue,
                    result_type=RunResult))
                results.append(await approved(runs[-1], cli_env))
    finally:
        server.stop()
    assert [r.reason.value for r in results] == ["completed", "completed"], results
    assert runs[0].first_execution_run_id != runs[1].first_execution_run_id
    tickets = list_tickets(tmp_path / "data")
    assert [t["idempotency_key"] for t in tickets] == [key_of(runs[0]), key_of(runs[1])]
    # Each run's model was told of its own new ticket.
    told = [outputs(server.requests[i].body)["t1"]["data"] for i in (1, 3)]
    assert [(d["ticket_id"], d["already_existed"]) for d in told] == [
        (tickets[0]["id"], False), (tickets[1]["id"], False)]


def reset_point(events: list[HistoryEvent]) -> int:
    """The workflow task that scheduled the run's tool activity (create_ticket): a reset
    to it runs that task again, the tool after it."""
    [scheduled] = [e.activity_task_scheduled_event_attributes for e in events
                   if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                   and e.activity_task_scheduled_event_attributes.activity_type.name
                   == TOOL_ACTIVITY]
    return int(scheduled.workflow_task_completed_event_id)


async def test_a_reset_run_keeps_its_tool_keys_and_creates_no_second_ticket(
        temporal: Client, tmp_path: Path) -> None:
    """A run whose create_ticket ran is reset (`temporal workflow reset`) to the workflow
    task that scheduled it: the new run keeps the first execution run id, so the tool
    runs again with the same key and the store returns the first ticket."""
    server = ScriptedModelServer([resp(call("create_ticket", TICKET, "t1")),
                                  answer("Ticket opened."), answer("Ticket opened.")])
    queue = f"dep-{uuid.uuid4().hex[:8]}"
    env = release_env(temporal, tmp_path, server.start(), queue)
    cli_env = env_for(temporal, tmp_path)
    inp = RunInput(question="open a ticket", settings=RunSettings(model="scripted-model"),
                   tools=DEMO_TOOLS)
    try:
        with deployed([BOUNDLOOP, "worker"], env, tmp_path / "v1.log"):
            await log_has(tmp_path / "v1.log", "worker started")
            handle = await temporal.start_workflow(
                WORKFLOW_NAME, inp, id=f"dep-{uuid.uuid4().hex[:12]}", task_queue=queue,
                result_type=RunResult)
            first = await approved(handle, cli_env)
            assert first.reason.value == "completed", first
            assert len(list_tickets(tmp_path / "data")) == 1
            events = [e async for e in handle.fetch_history_events()]
            proc = await asyncio.create_subprocess_exec(
                TEMPORAL, "workflow", "reset", "--workflow-id", handle.id,
                "--run-id", str(handle.first_execution_run_id),
                "--event-id", str(reset_point(events)), "--reason", "test: run it again",
                "--address", temporal.service_client.config.target_host,
                "--namespace", temporal.namespace,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
            assert proc.returncode == 0, (out, err)
            reset = temporal.get_workflow_handle(handle.id, result_type=RunResult)
            again = await asyncio.wait_for(reset.result(), timeout=RUN_TIMEOUT)
            described = await reset.describe()
    finally:
        server.stop()
    assert described.run_id != handle.first_execution_run_id  # a new run...
    started = (await reset.fetch_history()).events[0]
    assert started.workflow_execution_started_event_attributes.first_execution_run_id \
        == handle.first_execution_run_id  # ...of the same first execution
    assert again.reason.value == "completed", again
    # Temporal re-applied the approval (an update after the reset point) to the new run.
    assert [e.event for e in again.events if e.event.startswith("approval_")] == [
        "approval_requested", "approval_approved"]
    tickets = list_tickets(tmp_path / "data")
    assert [t["idempotency_key"] for t in tickets] == [key_of(handle)]
    # The reset run's create_ticket ran again, with the same key: the first ticket.
    assert len(server.requests) == 3
    data = outputs(server.requests[2].body)["t1"]["data"]
    assert (data["ticket_id"], data["already_existed"]) == (tickets[0]["id"], True)


async def test_a_model_request_on_a_worker_without_a_tool_of_the_run_names_the_tool(
        temporal: Client, tmp_path: Path) -> None:
    """Mid-way through a deploy without versioning: the run's workflow task on a worker
    of the first release (every tool), its model request taken by a worker of the next
    one (its own process), whose toolset lacks `lookup_stock`. The request is not sent;
    each attempt fails as `tool_not_served`, naming the tool, that worker and its task
    queue (counted and retried: another worker of the queue may serve it), and the run
    stops model_error with that event, not a bare "model activity failed"."""
    import openai
    from temporalio.plugin import SimplePlugin
    from temporalio.worker import WorkerConfig

    from boundloop import Worker
    from boundloop.tools.demo import DemoDeps
    from boundloop.tools.demo import tools as demo_tools

    server = ScriptedModelServer([answer("In stock.")])
    base_url = server.start()
    model = openai.AsyncOpenAI(base_url=base_url, api_key="sk-test-not-real")
    queue = f"mix-{uuid.uuid4().hex[:8]}"
    class WorkflowsOnly(SimplePlugin):
        def configure_worker(self, config: WorkerConfig) -> WorkerConfig:
            return {**super().configure_worker(config), "no_remote_activities": True}

    # The first release runs the workflow (and its local activities), no model request.
    first = Worker(temporal, demo_tools, deps=DemoDeps(data_dir=tmp_path / "data"),
                   model=model, task_queue=queue, own_task_queue=False,
                   plugins=[WorkflowsOnly("workflows-only")])
    env = {**worker_env(tmp_path), "PYTHONPATH": str(ROOT),
           "TEMPORAL_ADDRESS": temporal.service_client.config.target_host}
    log = tmp_path / "next.log"
    inp = RunInput(question="How many A-001 are in stock?",
                   settings=RunSettings(model="scripted-model"), tools=DEMO_TOOLS)
    try:
        with process([sys.executable, "-m", "tests.support.model_only_release", queue,
                      base_url], env, log):
            await log_has(log, "worker started")
            async with first:
                handle = await temporal.start_workflow(
                    WORKFLOW_NAME, inp, id=f"mix-{uuid.uuid4().hex[:12]}", task_queue=queue,
                    result_type=RunResult)
                result = await asyncio.wait_for(result_of(handle), timeout=RUN_TIMEOUT)
    finally:
        server.stop()
    assert result.reason == "model_error"
    named = (f"on task queue {queue!r} serves no tool named 'lookup_stock', which the run "
             "was admitted with: the request was not sent")
    failed = [e for e in result.events if e.event.startswith(("model_retried:",
                                                              "model_failed:"))]
    assert [e.event for e in failed] == [*["model_retried:tool_not_served"] * 3,
                                         "model_failed:tool_not_served"], failed
    assert all(named in (e.detail or "") for e in failed), failed
    assert server.requests == []
