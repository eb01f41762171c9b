"""Worker versioning on a real dev server (docs/deploying.md): a run parked on approval
on version v1 stays there when v2 — whose toolset renames, removes or reshapes (another
argument schema) the tool it waits on — is made current with the `temporal worker
deployment` command; approved, it completes on v1 with one ticket, and a new run starts
on v2 (a `boundloop worker` process). A
budget ledger, which never ends by itself, moves to v2 at its next workflow task, and
so does a session: its next turn, arriving after the deploy, runs on v2 with v2's
toolset (both versions `boundloop worker` processes)."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import timedelta
from pathlib import Path

import openai
import pytest
from temporalio.client import Client, WorkflowHandle

import boundloop
from boundloop import Worker
from boundloop.budgets import set_budget
from boundloop.client import result_of
from boundloop.contracts import (
    WORKFLOW_NAME,
    Decision,
    RunInput,
    RunResult,
    budget_workflow_id,
)
from boundloop.core.budget import BudgetLimits
from boundloop.core.limits import RunSettings
from boundloop.devserver import temporal_binary
from boundloop.scripted.server import ScriptedModelServer
from boundloop.testing import wait_until
from boundloop.tools.demo import DemoDeps, list_tickets
from tests.conftest import DEMO_TOOLS, RUN_TIMEOUT, workflow_task_failures
from tests.scripts import answer, call, resp
from tests.support.tools import tools as test_tools
from tests.test_worker_process import BOUNDLOOP, ROOT, log_has, process, worker_env

TICKET = '{"title": "Printer on fire", "description": "3F", "priority": "high"}'


async def temporal_cli(client: Client, *args: str, check: bool = True) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        temporal_binary(), *args, "--address", client.service_client.config.target_host,
        stdin=asyncio.subprocess.DEVNULL,  # no terminal to confirm at, as in a script
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    assert not check or proc.returncode == 0, (args, out.decode(), err.decode())
    return proc.returncode, out.decode()


DEPLOYING = (ROOT / "docs" / "deploying.md").read_text(encoding="utf-8")


def shown(verb: str, deployment: str, build_id: str) -> list[str]:
    """The rollout's `.venv/bin/temporal worker deployment VERB` line for `build_id`, as
    docs/deploying.md shows it (its deployment `boundloop`), for this deployment: its
    arguments after the program."""
    program = ".venv/bin/temporal"
    line = next(line for line in DEPLOYING.splitlines()
                if line.startswith(f"{program} worker deployment {verb} ")
                and f"--build-id {build_id}" in line)  # the first: v1's, at the first rollout
    args = line.removeprefix(program).split()
    return [deployment if a == "boundloop" else a for a in args]


def test_the_rollout_shows_the_first_version_made_current_and_commands_a_script_can_run(
        ) -> None:
    """The first rollout makes v1 current before any run is picked up; every command
    that asks for confirmation carries `--yes`; `temporal` is the virtualenv's."""
    import sys

    rollout = DEPLOYING[DEPLOYING.index("### A rollout"):DEPLOYING.index("Keep the old")]
    lines = [line.strip() for line in rollout.splitlines()]
    commands = [line for line in lines if "temporal " in line and not line.startswith("#")
                and not line.startswith("--")]
    assert commands and all(c.startswith(".venv/bin/temporal ") for c in commands), commands
    asking = [i for i, line in enumerate(lines) if "set-current-version " in line
              or "set-ramping-version " in line]
    for i in asking:
        command = lines[i] + (" " + lines[i + 1] if lines[i].endswith("\\") else "")
        assert "--yes" in command, command
    first_v1 = lines.index(" ".join([".venv/bin/temporal", *shown(
        "set-current-version", "boundloop", "v1")]))
    assert first_v1 < lines.index(" ".join([".venv/bin/temporal", *shown(
        "set-current-version", "boundloop", "v2")]))
    assert (Path(sys.executable).parent / "temporal").is_file()  # `make setup` installs it


async def make_current(client: Client, deployment: str, build_id: str) -> None:
    """`set-current-version`, once the version's workers have polled (the server knows
    a version from its pollers): the commands docs/deploying.md shows for v1 (the first
    rollout) and v2, with no terminal to confirm at."""
    async def known() -> bool:
        code, _ = await temporal_cli(client, *shown("describe-version", deployment,
                                                    build_id), check=False)
        return code == 0

    await wait_until(known, timeout=60)
    await temporal_cli(client, *shown("set-current-version", deployment, build_id))


async def build_id_of(handle: WorkflowHandle[object, object]) -> str:
    info = (await handle.describe()).raw_description.workflow_execution_info
    return info.versioning_info.deployment_version.build_id


@pytest.mark.parametrize("v2_tools", ["tools", "removed", "reshaped"])
async def test_a_pinned_run_drains_on_its_version_and_new_runs_start_on_the_current(
        temporal: Client, tmp_path: Path, v2_tools: str) -> None:
    """`v2_tools`: tests/support/renamed_tools.py's toolsets."""
    server = ScriptedModelServer([resp(call("create_ticket", TICKET, "t1")),
                                  answer("Ticket opened."), answer("v2 here.")])
    base_url = server.start()
    model = openai.AsyncOpenAI(base_url=base_url, api_key="sk-test-not-real")
    queue = f"ver-{uuid.uuid4().hex[:8]}"
    deployment = f"dep-{uuid.uuid4().hex[:8]}"
    data = tmp_path / "data"
    v2_env = worker_env(tmp_path, BOUNDLOOP_TASK_QUEUE=queue, OPENAI_BASE_URL=base_url,
                        OPENAI_API_KEY="sk-test-not-real",
                        TEMPORAL_ADDRESS=temporal.service_client.config.target_host,
                        BOUNDLOOP_TOOLS=f"tests.support.renamed_tools:{v2_tools}",
                        PYTHONPATH=str(ROOT),
                        BOUNDLOOP_DEPLOYMENT_NAME=deployment, BOUNDLOOP_BUILD_ID="v2")
    inp = RunInput(question="open a ticket", settings=RunSettings(model="scripted-model"),
                   tools=DEMO_TOOLS)
    v1 = Worker(temporal, test_tools, deps=DemoDeps(data_dir=data), model=model,
                task_queue=queue, sticky_timeout=timedelta(seconds=1),
                deployment_name=deployment, build_id="v1")
    log = tmp_path / "v2.log"
    try:
        async with v1:
            # v1 becomes current before the first run.
            await make_current(temporal, deployment, "v1")
            handle: WorkflowHandle[object, object] = await temporal.start_workflow(
                WORKFLOW_NAME, inp, id=f"ver-{uuid.uuid4().hex[:12]}", task_queue=queue,
                result_type=RunResult)

            async def parked() -> bool:
                return bool((await handle.query("status"))["pending"])

            await wait_until(parked, timeout=60)
            assert await build_id_of(handle) == "v1"
            key = f"ver-{uuid.uuid4().hex[:8]}"
            await set_budget(temporal, key, BudgetLimits(tokens=1000), task_queue=queue)
            ledger = temporal.get_workflow_handle(budget_workflow_id(key))
            assert await build_id_of(ledger) == "v1"
            with process([BOUNDLOOP, "worker"], v2_env, log):
                await log_has(log, "worker started")
                await make_current(temporal, deployment, "v2")
                _, listed = await temporal_cli(
                    temporal, "workflow", "list", "--query",
                    f"TemporalWorkerDeploymentVersion='{deployment}:v1'")
                assert handle.id in listed
                await handle.signal("approve", Decision(call_id="t1", approve=True))
                result = await asyncio.wait_for(result_of(handle), timeout=RUN_TIMEOUT)
                new = await temporal.start_workflow(
                    WORKFLOW_NAME, RunInput(question="hi", settings=inp.settings,
                                            tools=["lookup_stock"]),
                    id=f"ver-{uuid.uuid4().hex[:12]}", task_queue=queue,
                    result_type=RunResult)
                second = await asyncio.wait_for(result_of(new), timeout=RUN_TIMEOUT)
                assert await build_id_of(new) == "v2"
                # The ledger's next workflow task (new limits) runs on the current version.
                await set_budget(temporal, key, BudgetLimits(tokens=2000), task_queue=queue)
                assert await build_id_of(ledger) == "v2"
                await ledger.terminate("test over")
    finally:
        server.stop()
    assert result.reason.value == "completed", result
    assert await build_id_of(handle) == "v1"
    assert len(list_tickets(data)) == 1
    assert await workflow_task_failures(handle, temporal) == 0
    assert second.reason.value == "completed" and second.text == "v2 here."


async def test_a_sessions_next_turn_after_a_deploy_runs_on_the_new_version(
        temporal: Client, tmp_path: Path) -> None:
    """Turn 1 on v1; v2 (its toolset adds a read-only tool) made current and v1 stopped;
    turn 2 — the same session, its conversation so far — runs on v2."""
    server = ScriptedModelServer([
        resp(call("lookup_stock", {"sku": "A-001"}, "c1")), answer("A-001: 12."),
        resp(call("lookup_stock", {"sku": "B-002"}, "c2")), answer("B-002: none.")])
    base_url = server.start()
    queue = f"ver-{uuid.uuid4().hex[:8]}"
    deployment = f"dep-{uuid.uuid4().hex[:8]}"

    def env(build_id: str, tools: str) -> dict[str, str]:
        return worker_env(tmp_path, BOUNDLOOP_TASK_QUEUE=queue, OPENAI_BASE_URL=base_url,
                          OPENAI_API_KEY="sk-test-not-real", BOUNDLOOP_TOOLS=tools,
                          TEMPORAL_ADDRESS=temporal.service_client.config.target_host,
                          PYTHONPATH=str(ROOT), BOUNDLOOP_DEPLOYMENT_NAME=deployment,
                          BOUNDLOOP_BUILD_ID=build_id)

    try:
        with process([BOUNDLOOP, "worker"], env("v1", "tests.support.tools:tools"),
                     tmp_path / "v1.log") as v1:
            await log_has(tmp_path / "v1.log", "worker started")
            await make_current(temporal, deployment, "v1")
            session = await boundloop.start_session(
                temporal, tools=DEMO_TOOLS, model="scripted-model",
                task_queue=queue)
            first = await asyncio.wait_for(session.say("A-001?"), timeout=RUN_TIMEOUT)
            assert await build_id_of(session.handle) == "v1"
            with process([BOUNDLOOP, "worker"], env("v2", "tests.support.added_tools:tools"),
                         tmp_path / "v2.log"):
                await log_has(tmp_path / "v2.log", "worker started")
                await make_current(temporal, deployment, "v2")
                v1.kill()  # v1 has drained: nothing is pinned to it
                second = await asyncio.wait_for(session.say("and B-002?"),
                                                timeout=RUN_TIMEOUT)
                turn = temporal.get_workflow_handle(second.workflow_id)
                assert await build_id_of(turn) == "v2"
                assert await build_id_of(session.handle) == "v2"
                await session.end()
    finally:
        server.stop()
    assert (first.reason.value, first.text) == ("completed", "A-001: 12.")
    assert (second.reason.value, second.text) == ("completed", "B-002: none."), second
    assert [e.tool for e in second.events if e.event == "tool_success"] == ["lookup_stock"]
    assert "A-001: 12." in json.dumps(server.requests[-1].body["input"])  # turn 1 kept
    assert await workflow_task_failures(session.handle, temporal) == 0
