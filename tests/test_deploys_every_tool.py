"""Deploys without worker versioning that take a tool away from an open run, for every
kind of tool a run needs — a read-only tool that runs as a local activity, an MCP tool,
a tool the model is only told about — with real worker processes on a real dev server:
the run finishes, or stops with `tool_unavailable` naming the tool; no model activity
fails, no workflow task fails. Each run is parked on an approval while the old release
is stopped and the next one started, then approved."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from boundloop.client import result_of
from boundloop.contracts import (
    MODEL_ACTIVITY,
    TOOL_ACTIVITY,
    WORKFLOW_NAME,
    RunInput,
    RunResult,
)
from boundloop.core.limits import Policy, RunSettings
from boundloop.core.mcp_tools import MCPServerConfig
from boundloop.core.rules import ArgumentRule
from boundloop.mcp.pool import list_mcp_tools
from boundloop.scripted.server import ScriptedModelServer
from tests.conftest import RUN_TIMEOUT, workflow_task_failures
from tests.scripts import answer, call, resp
from tests.support import mcp_servers
from tests.support.mcp_servers import rows
from tests.support.tools import marks
from tests.test_cli import env_for
from tests.test_deploys import deployed, parked
from tests.test_replay_check import cli
from tests.test_worker_process import BOUNDLOOP, ROOT, log_has, worker_env

#: transfer has side effects and asks (a rule of the run): the run waits on it.
ASK_TRANSFER = Policy(rules=[ArgumentRule(tool="transfer", action="ask")])
TRANSFER = {"amount": 5, "to": "acct-1"}


def v1_env(tmp_path: Path, temporal: Client, model: ScriptedModelServer,
           **extra: str) -> dict[str, str]:
    return worker_env(tmp_path, BOUNDLOOP_TASK_QUEUE=f"dep-{uuid.uuid4().hex[:8]}",
                      OPENAI_BASE_URL=model.start(), OPENAI_API_KEY="sk-test-not-real",
                      PYTHONPATH=str(ROOT), BOUNDLOOP_TOOLS="tests.support.tools:tools",
                      TEMPORAL_ADDRESS=temporal.service_client.config.target_host, **extra)


def tool_names(body: dict[str, Any]) -> list[str]:
    return [t["name"] for t in body.get("tools", [])]


async def park_deploy_approve(
        temporal: Client, tmp: Path, inp: RunInput, v1: dict[str, str],
        v2: dict[str, str], call_id: str) -> tuple[WorkflowHandle[Any, RunResult], RunResult]:
    """The run parks on `call_id`'s approval on a v1 worker; v1 stops, v2 starts; the
    call is approved through the CLI; the run's handle and result."""
    with deployed([BOUNDLOOP, "worker"], v1, tmp / "v1.log"):
        await log_has(tmp / "v1.log", "worker started")
        handle = await temporal.start_workflow(
            WORKFLOW_NAME, inp, id=f"dep-{uuid.uuid4().hex[:12]}",
            task_queue=v1["BOUNDLOOP_TASK_QUEUE"], result_type=RunResult)
        await parked(handle)
    with deployed([BOUNDLOOP, "worker"], v2, tmp / "v2.log"):
        await log_has(tmp / "v2.log", "worker started")
        code, out, err = await cli("approve", handle.id, call_id, env=env_for(temporal, tmp))
        assert code == 0, (out, err)
        return handle, await asyncio.wait_for(result_of(handle), timeout=RUN_TIMEOUT)


@pytest.mark.parametrize("toolset", ["lookup_renamed", "lookup_removed"])
@pytest.mark.parametrize("then", ["called", "listed"])
async def test_a_read_only_tool_taken_away_by_a_deploy_stops_the_run_only_if_called(
        temporal: Client, tmp_path: Path, toolset: str, then: str) -> None:
    """lookup_stock (read-only, 10 s: a local activity) is renamed or removed while the
    run waits on a transfer. Approved, the transfer runs once; the next request still
    describes lookup_stock as the run was admitted with it (the model activity built
    every definition from the new worker's toolset and failed, four attempts, then
    `model_error`). Called: `tool_unavailable` naming it, nothing ran; not called: the
    run completes."""
    second = (resp(call("lookup_stock", {"sku": "A-001"}, "s1")) if then == "called"
              else answer("Sent 5 to acct-1."))
    model = ScriptedModelServer([resp(call("transfer", TRANSFER, "x1")), second])
    env = v1_env(tmp_path, temporal, model)
    inp = RunInput(question="send 5 to acct-1, then check A-001",
                   tools=["transfer", "lookup_stock"],
                   settings=RunSettings(model="scripted-model", policy=ASK_TRANSFER))
    v2 = {**env, "BOUNDLOOP_TOOLS": f"tests.support.renamed_tools:{toolset}"}
    try:
        handle, result = await park_deploy_approve(temporal, tmp_path, inp, env, v2, "x1")
    finally:
        model.stop()
    assert [w for _, w in marks(tmp_path / "data")] == ["transfer 5.0 to acct-1"]
    assert len(model.requests) == 2
    # The model is told of lookup_stock, with the schema the run was admitted with.
    first, after = (r.body for r in model.requests)
    assert tool_names(after) == tool_names(first) == ["transfer", "lookup_stock"]
    assert after["tools"][1]["parameters"] == first["tools"][1]["parameters"]
    assert not any(e.event.startswith("model_failed:") for e in result.events), result.events
    if then == "called":
        assert result.reason.value == "tool_unavailable", result
        assert [(e.tool, e.call_id) for e in result.events
                if e.event == "tool_unavailable"] == [("lookup_stock", "s1")]
        # lookup_stock's call went to a local activity: no activity was scheduled after
        # the second model request (the transfer's may be scheduled twice: first on the
        # stopped worker's own queue, then on the shared one).
        scheduled = [e.activity_task_scheduled_event_attributes.activity_type.name
                     async for e in handle.fetch_history_events()
                     if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
        assert scheduled[-1] == MODEL_ACTIVITY and TOOL_ACTIVITY in scheduled, scheduled
    else:
        assert (result.reason.value, result.text) == ("completed", "Sent 5 to acct-1.")
    assert await workflow_task_failures(handle, temporal) == 0


def mcp_config(tmp: Path, db: Path, name: str, **server: Any) -> Path:
    path = tmp / name
    path.write_text(json.dumps({"servers": [{
        "name": "shop", "command": sys.executable,
        "args": ["-m", "tests.support.mcp_servers", "stdio"],
        "env": {"MCP_TEST_DB": str(db)}, "cwd": str(ROOT), **server}]}), encoding="utf-8")
    return path


@pytest.mark.parametrize("deploy", ["server removed", "tool no longer listed"])
async def test_an_approved_mcp_tool_whose_server_a_deploy_dropped_stops_the_run_naming_it(
        temporal: Client, tmp_path: Path, deploy: str) -> None:
    """shop__delete_record (destructive: asks) waits for approval; the next release has
    no shop server, or one allowed only `lookup`. Approved, the run stops with
    `tool_unavailable` naming it and nothing reaches a server (the call failed as an
    unexpected tool error, three attempts, then `tool_error`)."""
    db = tmp_path / "mcp.sqlite3"
    mcp_servers.connect(db).close()
    model = ScriptedModelServer([resp(call("shop__delete_record", {"record": "r-1"}, "d1"))])
    env = v1_env(tmp_path, temporal, model,
                 BOUNDLOOP_MCP_CONFIG=str(mcp_config(tmp_path, db, "v1.json")))
    declared = await list_mcp_tools([MCPServerConfig.model_validate(
        json.loads(Path(env["BOUNDLOOP_MCP_CONFIG"]).read_text("utf-8"))["servers"][0])])
    inp = RunInput(question="delete r-1", tools=["shop__delete_record"], mcp_tools=declared,
                   settings=RunSettings(model="scripted-model"))
    v2 = dict(env)
    if deploy == "server removed":
        del v2["BOUNDLOOP_MCP_CONFIG"]
    else:
        v2["BOUNDLOOP_MCP_CONFIG"] = str(mcp_config(tmp_path, db, "v2.json",
                                                    tools=["lookup"]))
    try:
        handle, result = await park_deploy_approve(temporal, tmp_path, inp, env, v2, "d1")
    finally:
        model.stop()
    assert result.reason.value == "tool_unavailable", result
    assert [(e.tool, e.call_id) for e in result.events if e.event == "tool_unavailable"] \
        == [("shop__delete_record", "d1")]
    assert rows(db, "SELECT key FROM requests WHERE tool = 'delete_record'") == []
    assert len(model.requests) == 1
    assert await workflow_task_failures(handle, temporal) == 0
