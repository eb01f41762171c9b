"""MCP servers as an operator configures them: `boundloop worker` processes reading
BOUNDLOOP_MCP_CONFIG, `boundloop run` listing the same servers, and a worker killed
with SIGKILL during an approved MCP call."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from temporalio.client import Client

import boundloop
from boundloop.scripted.server import ScriptedModelServer
from boundloop.testing import wait_until
from tests.conftest import unscoped_key
from tests.scripts import answer, call, outputs, resp
from tests.support import mcp_servers
from tests.support.mcp_servers import rows
from tests.test_worker_process import log_has, process, worker_env

ROOT = Path(__file__).resolve().parents[1]
BOUNDLOOP = str(Path(sys.executable).parent / "boundloop")
WAIT = 60.0


def write_config(tmp: Path, db: Path) -> Path:
    path = tmp / "mcp.json"
    path.write_text(json.dumps({"servers": [{
        "name": "shop", "command": sys.executable,
        "args": ["-m", "tests.support.mcp_servers", "stdio"],
        "env": {"MCP_TEST_DB": str(db)}, "cwd": str(ROOT)}]}), encoding="utf-8")
    return path


def setup(tmp: Path, temporal: Client, model: ScriptedModelServer) -> tuple[Path, dict[str, str]]:
    db = tmp / "mcp.sqlite3"
    mcp_servers.connect(db).close()
    env = worker_env(tmp, TEMPORAL_ADDRESS=temporal.service_client.config.target_host,
                     BOUNDLOOP_TASK_QUEUE=f"mcpw-{uuid.uuid4().hex[:8]}",
                     OPENAI_BASE_URL=model.start(), OPENAI_API_KEY="sk-test-not-real",
                     BOUNDLOOP_MCP_CONFIG=str(write_config(tmp, db)))
    return db, env


async def test_boundloop_worker_serves_the_tools_of_its_mcp_config(
        temporal: Client, tmp_path: Path) -> None:
    model = ScriptedModelServer([resp(call("shop__lookup", {"sku": "B-002"}, "c1")),
                                 answer("B-002: 5")])
    db, env = setup(tmp_path, temporal, model)
    try:
        with process([BOUNDLOOP, "worker"], env, tmp_path / "worker.log"):
            await log_has(tmp_path / "worker.log", "worker started")
            # The CLI lists the same servers itself and starts the run with their tools.
            run_env = {k: v for k, v in env.items() if not k.startswith("OPENAI_")}
            done = await asyncio.to_thread(subprocess.run, [
                BOUNDLOOP, "run", "B-002の在庫は？", "--wait", "--json", "--model",
                "scripted-model", "--tools", "shop__lookup"], cwd=ROOT, env=run_env,
                capture_output=True, text=True, timeout=WAIT)
    finally:
        model.stop()
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["reason"], result["tool_executions"]) == ("completed", 1)
    assert [t["name"] for t in model.requests[0].body["tools"]] == ["shop__lookup"]
    assert outputs(model.requests[1].body)["c1"]["data"] == {
        "structured": {"sku": "B-002", "stock": 5}}
    [(key,)] = rows(db, "SELECT key FROM requests WHERE tool = 'lookup'")
    assert unscoped_key(key) == f"{result['workflow_id']}/step-1/call-0"


async def test_boundloop_worker_refuses_a_bad_mcp_config(temporal: Client, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"servers": [{"name": "x"}]}), encoding="utf-8")
    env = worker_env(tmp_path, TEMPORAL_ADDRESS=temporal.service_client.config.target_host,
                     BOUNDLOOP_MCP_CONFIG=str(bad))
    done = await asyncio.to_thread(subprocess.run, [BOUNDLOOP, "worker"], cwd=ROOT, env=env,
                                   capture_output=True, text=True, timeout=WAIT)
    assert done.returncode == 2
    assert "BOUNDLOOP_MCP_CONFIG" in done.stderr and "set exactly one of" in done.stderr


async def test_worker_killed_during_an_approved_mcp_call_does_not_repeat_it(
        temporal: Client, tmp_path: Path) -> None:
    """SIGKILL of the worker after the server committed the side effect, before the
    answer: another worker retries the call with the same idempotency key, and the server
    answers it from its record without a second effect."""
    model = ScriptedModelServer([
        resp(call("shop__archive_record", {"record": "r9", "seconds": 3}, "c1")),
        answer("archived")])
    db, env = setup(tmp_path, temporal, model)
    queue = env["BOUNDLOOP_TASK_QUEUE"]
    try:
        with process([BOUNDLOOP, "worker"], env, tmp_path / "w1.log") as first:
            await log_has(tmp_path / "w1.log", "worker started")
            declared = await asyncio.wait_for(boundloop.list_mcp_tools(
                boundloop.load_mcp_config(Path(env["BOUNDLOOP_MCP_CONFIG"]))), WAIT)
            run = await boundloop.start(temporal, "r9 をアーカイブして", tools=[],
                                        mcp_tools=[d for d in declared
                                                   if d.name == "shop__archive_record"],
                                        model="scripted-model", task_queue=queue)

            async def waiting() -> bool:
                return bool(await run.pending())
            await wait_until(waiting, timeout=WAIT)
            await run.approve("c1", approver="alice")

            async def committed() -> bool:
                return bool(rows(db, "SELECT key FROM effects"))
            await wait_until(committed, timeout=WAIT, interval=0.05)
            os.kill(first.pid, signal.SIGKILL)  # mid-call: the answer is 3 s away
            first.wait(timeout=WAIT)
            with process([BOUNDLOOP, "worker"], env, tmp_path / "w2.log"):
                res = await asyncio.wait_for(run.result(), WAIT)
    finally:
        model.stop()
    assert (res.reason, res.tool_executions) == ("completed", 1)
    [(key, record)] = rows(db, "SELECT key, record FROM effects")
    assert (unscoped_key(key), record) == (f"{run.id}/step-1/call-0", "r9")
    assert rows(db, "SELECT record FROM deleted") == [("r9",)]  # one side effect
    calls = rows(db, "SELECT key FROM requests WHERE tool = 'archive_record'")
    assert calls == [(key,), (key,)]  # the retry carried the same key
    out = outputs(model.requests[1].body)["c1"]
    assert out["data"] == {"structured": {"result": "deleted r9 as #1 (already done)"}}
