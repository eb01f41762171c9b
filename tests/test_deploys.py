"""Deploys without worker versioning while a run waits for approval on `create_ticket`,
with real worker processes on a real dev server.

- A next release that renames, removes or reshapes `create_ticket`: the approved run
  stops with `tool_unavailable` naming it, no workflow task fails, `status` says so.
- One that also schedules an extra activity before each approval wait (no patch): the
  run's workflow task fails; `boundloop approve` exits 6, saying the decision is
  recorded and waits for a healthy worker; once the old release is back, the run
  completes, the decision applied once."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowHandle

from boundloop.budgets import set_budget
from boundloop.client import query_status, result_of
from boundloop.contracts import WORKFLOW_NAME, RunInput, RunResult
from boundloop.core.budget import BudgetLimits
from boundloop.core.limits import Limits, RunSettings
from boundloop.scripted.server import ScriptedModelServer
from boundloop.testing import wait_until
from boundloop.tools.demo import list_tickets
from tests.conftest import DEMO_TOOLS, RUN_TIMEOUT, workflow_task_failures
from tests.scripts import answer, call, resp
from tests.test_cli import env_for
from tests.test_replay_check import TICKET, as_deploying_shows, cli
from tests.test_worker_process import BOUNDLOOP, ROOT, log_has, process, worker_env

#: `boundloop worker` with the next release's workflow code checked out.
NEXT_RELEASE_WORKER = [sys.executable, "-m", "tests.support.next_release", "worker"]


@contextmanager
def deployed(command: list[str], env: dict[str, str], log: Path,
             ) -> Iterator[subprocess.Popen[bytes]]:
    """A worker process, stopped with SIGTERM (as a deploy stops it) when the block ends."""
    with process(command, env, log) as worker:
        yield worker
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)


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
        with deployed([BOUNDLOOP, "worker"], env, tmp_path / "v1.log"):
            await log_has(tmp_path / "v1.log", "worker started")
            handle = await temporal.start_workflow(
                WORKFLOW_NAME, inp, id=f"dep-{uuid.uuid4().hex[:12]}", task_queue=queue,
                result_type=RunResult)
            await parked(handle)
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
    arguments (tests/support/renamed_tools.py). With a shared budget, replay sizes each
    request's reservation from the tools the run was admitted with (it read the new
    worker's toolset: a rename failed every workflow task with KeyError)."""
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
    assert list_tickets(tmp_path / "data") == []
    assert await workflow_task_failures(handle, temporal) == 0
    assert len(server.requests) == 1  # nothing asked of the model after the stop
