"""MCP tools through whole runs: the real workflow on the dev server, the scripted model
over HTTP, and real MCP servers (the tests' own over stdio, and `mcp-server-time`), all
through the public API (`boundloop.Worker(..., mcp_servers=...)`, `boundloop.start(...,
mcp_tools=...)`)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import openai
import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

import boundloop
from boundloop.core.mcp_tools import MCPServerConfig
from boundloop.mcp import MCPServerError
from boundloop.scripted.server import ScriptedModelServer
from boundloop.testing import wait_until
from boundloop.tools.demo import DemoDeps
from tests.conftest import unscoped_key, workflow_task_failures
from tests.scripts import answer, call, outputs, resp
from tests.support import mcp_servers
from tests.support.crash_tools import tools as crash_tools
from tests.support.mcp_servers import rows
from tests.support.tools import tools as test_tools

ROOT = Path(__file__).resolve().parents[1]
WAIT = 60.0  # bound on any single wait


def shop(db: Path, **extra: Any) -> MCPServerConfig:
    return MCPServerConfig(name="shop", command=sys.executable,
                           args=["-m", "tests.support.mcp_servers", "stdio"],
                           env={"MCP_TEST_DB": str(db)}, cwd=ROOT, **extra)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "mcp.sqlite3"
    mcp_servers.connect(path).close()
    return path


@dataclass
class MCPRun:
    run: boundloop.Run
    model: ScriptedModelServer
    declarations: list[boundloop.MCPToolDeclaration]

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [r.body for r in self.model.requests]


@asynccontextmanager
async def mcp_run(temporal: Client, tmp_path: Path, servers: list[MCPServerConfig],
                  turns: list[dict[str, Any]], **start: Any) -> AsyncIterator[MCPRun]:
    """A worker with `servers`, and a run started with the worker's MCP declarations."""
    model = ScriptedModelServer(turns)
    queue = f"mcp-{uuid.uuid4().hex[:8]}"
    client = openai.AsyncOpenAI(base_url=model.start(), api_key="sk-test-not-real")
    try:
        worker = boundloop.Worker(temporal, test_tools, deps=DemoDeps(data_dir=tmp_path),
                                  model=client, task_queue=queue, mcp_servers=servers,
                                  sticky_timeout=timedelta(seconds=1))
        async with worker:
            declared = await asyncio.wait_for(worker.mcp_tools(), WAIT)
            run = await boundloop.start(temporal, "在庫を調べて", tools=[], mcp_tools=declared,
                                        model="scripted-model", task_queue=queue, **start)
            yield MCPRun(run=run, model=model, declarations=declared)
            assert await workflow_task_failures(run.handle, temporal) == 0
    finally:
        model.stop()
    assert model.violations == [], model.violations


async def result(r: MCPRun) -> boundloop.RunResult:
    return await asyncio.wait_for(r.run.result(), WAIT)


async def pending(r: MCPRun) -> list[boundloop.Approval]:
    async def waiting() -> bool:
        return bool(await r.run.pending())
    await wait_until(waiting, timeout=WAIT)
    return await r.run.pending()


def calls_of(db: Path, tool: str) -> list[tuple[Any, ...]]:
    return rows(db, "SELECT key, pid FROM requests WHERE tool = ? ORDER BY id", tool)


def events(res: boundloop.RunResult) -> list[tuple[str, str | None]]:
    return [(e.event, e.tool) for e in res.events if e.event.startswith(("tool_", "approval_",
                                                                         "blocked", "invalid"))]


async def test_read_only_mcp_tool_runs_without_approval(temporal: Client, tmp_path: Path,
                                                        db: Path) -> None:
    async with mcp_run(temporal, tmp_path, [shop(db)], [
        resp(call("shop__lookup", {"sku": "A-001"}, "c1")),
        answer("A-001: 5"),
    ]) as r:
        res = await result(r)
    assert (res.reason, res.tool_executions) == ("completed", 1)
    assert events(res) == [("tool_success", "shop__lookup")]
    out = outputs(r.bodies[1])["c1"]
    assert (out["status"], out["data"]) == ("success",
                                            {"structured": {"sku": "A-001", "stock": 5}})
    # The model got the server's tools as function definitions, from the run's input.
    names = [t["name"] for t in r.bodies[0]["tools"]]
    assert names == [d.name for d in r.declarations] and "shop__lookup" in names
    [(key, _pid)] = calls_of(db, "lookup")
    assert unscoped_key(key) == f"{r.run.id}/step-1/call-0"


async def test_destructive_mcp_tool_waits_for_approval_and_runs_once(
        temporal: Client, tmp_path: Path, db: Path) -> None:
    async with mcp_run(temporal, tmp_path, [shop(db)], [
        resp(call("shop__delete_record", {"record": "r1"}, "c1")),
        answer("deleted"),
    ]) as r:
        [waiting] = await pending(r)
        assert (waiting.tool, waiting.arguments) == ("shop__delete_record", {"record": "r1"})
        assert calls_of(db, "delete_record") == []  # nothing ran while it waited
        await r.run.approve("c1", approver="alice")
        res = await result(r)
    assert (res.reason, res.tool_executions) == ("completed", 1)
    assert events(res) == [("approval_requested", "shop__delete_record"),
                           ("approval_approved", "shop__delete_record"),
                           ("tool_success", "shop__delete_record")]
    assert rows(db, "SELECT record FROM deleted") == [("r1",)]
    assert len(calls_of(db, "delete_record")) == 1
    assert outputs(r.bodies[1])["c1"]["data"] == {"structured": {"result": "deleted r1 as #1"}}
    # Replay needs no MCP server: the run's rules came from its input. (The toolset
    # tests/test_replay.py replays with: a process serves one toolset per queue.)
    history = await r.run.handle.fetch_history()
    replayer = Replayer(workflows=[], data_converter=pydantic_data_converter,
                        plugins=[boundloop.Plugin(crash_tools, deps=None)])
    assert (await replayer.replay_workflow(history)).replay_failure is None


async def test_rejected_destructive_mcp_tool_never_runs(temporal: Client, tmp_path: Path,
                                                        db: Path) -> None:
    async with mcp_run(temporal, tmp_path, [shop(db)], [
        resp(call("shop__delete_record", {"record": "r1"}, "c1")),
        answer("not deleted"),
    ]) as r:
        await pending(r)
        await r.run.reject("c1", reason="keep it")
        res = await result(r)
    assert (res.reason, res.tool_executions) == ("completed", 0)
    assert outputs(r.bodies[1])["c1"]["status"] == "rejected"
    assert calls_of(db, "delete_record") == [] and rows(db, "SELECT * FROM deleted") == []


async def test_invalid_mcp_arguments_go_back_to_the_model_unsent(
        temporal: Client, tmp_path: Path, db: Path) -> None:
    async with mcp_run(temporal, tmp_path, [shop(db)], [
        resp(call("shop__lookup", {"sku": 7}, "c1")),
        resp(call("shop__lookup", {"sku": "A-7"}, "c2")),
        answer("A-7: 3"),
    ]) as r:
        res = await result(r)
    assert (res.reason, res.tool_executions) == ("completed", 1)
    bad = outputs(r.bodies[1])["c1"]
    assert (bad["status"], bad["error_code"]) == ("invalid_input", "INVALID_ARGUMENTS")
    assert "sku: expected string" in bad["message"]
    assert outputs(r.bodies[2])["c2"]["status"] == "success"
    assert len(calls_of(db, "lookup")) == 1  # the invalid call never reached the server


async def test_mcp_is_error_reaches_the_model_as_an_error_envelope(
        temporal: Client, tmp_path: Path, db: Path) -> None:
    async with mcp_run(temporal, tmp_path, [shop(db)], [
        resp(call("shop__fail", {"reason": "out of paper"}, "c1")),
        answer("The tool failed."),
    ]) as r:
        res = await result(r)
    assert (res.reason, res.tool_executions) == ("completed", 1)
    out = outputs(r.bodies[1])["c1"]
    assert (out["status"], out["error_code"], out["retryable"]) == (
        "permanent_error", "MCP_TOOL_ERROR", False)
    assert "out of paper" in out["data"]["text"]


async def test_identical_call_limit_stops_a_model_repeating_an_mcp_call(
        temporal: Client, tmp_path: Path, db: Path) -> None:
    same = {"sku": "A-001"}
    async with mcp_run(temporal, tmp_path, [shop(db)], [
        resp(call("shop__lookup", same, "c1")),
        resp(call("shop__lookup", same, "c2")),
        resp(call("shop__lookup", same, "c3")),
        answer("A-001: 5"),
    ], limits=boundloop.Limits(max_identical_calls=2)) as r:
        res = await result(r)
    assert (res.reason, res.tool_executions) == ("max_identical_calls", 2)
    assert outputs(r.bodies[3])["c3"]["error_code"] == "IDENTICAL_CALL_LIMIT"
    assert len(calls_of(db, "lookup")) == 2


async def test_mcp_server_killed_mid_call_is_retried_on_a_restarted_session(
        temporal: Client, tmp_path: Path, db: Path) -> None:
    async with mcp_run(temporal, tmp_path, [shop(db)], [
        resp(call("shop__sleep", {"seconds": 2}, "c1")),
        answer("slept"),
    ]) as r:
        async def sleeping() -> bool:
            return bool(rows(db, "SELECT pid FROM sleeps"))
        await wait_until(sleeping, timeout=WAIT)
        [(first_pid,)] = rows(db, "SELECT pid FROM sleeps")
        os.kill(first_pid, signal.SIGKILL)
        res = await result(r)
    assert (res.reason, res.tool_executions) == ("completed", 1)
    assert outputs(r.bodies[1])["c1"] == {**outputs(r.bodies[1])["c1"], "status": "success"}
    pids = [pid for _key, pid in calls_of(db, "sleep")]
    keys = {key for key, _pid in calls_of(db, "sleep")}
    # Two attempts, one key; the second on a new server process.
    assert len(pids) == 2 and pids[0] == first_pid and pids[1] != first_pid
    assert {unscoped_key(k) for k in keys} == {f"{r.run.id}/step-1/call-0"}


async def test_a_whole_run_with_mcp_server_time(temporal: Client, tmp_path: Path) -> None:
    time_server = MCPServerConfig(name="time", command=str(Path(sys.executable).parent
                                                           / "mcp-server-time"),
                                  args=["--local-timezone", "UTC"])
    async with mcp_run(temporal, tmp_path, [time_server], [
        resp(call("time__get_current_time", {"timezone": "Asia/Tokyo"}, "c1")),
        answer("It is late in Tokyo."),
    ]) as r:
        res = await result(r)
    assert (res.reason, res.tool_executions) == ("completed", 1)
    out = outputs(r.bodies[1])["c1"]
    assert out["status"] == "success", out
    payload = json.dumps(out["data"])
    assert "Asia/Tokyo" in payload
    assert {d.name for d in r.declarations} >= {"time__get_current_time", "time__convert_time"}
    # mcp-server-time marks its tools read-only: no approval was asked.
    assert not any(e.event.startswith("approval_") for e in res.events)



async def test_mcp_result_over_the_runs_cap_becomes_result_too_large(
        temporal: Client, tmp_path: Path, db: Path) -> None:
    long_sku = "S" * 400  # the answer echoes it: over a 300-byte cap
    async with mcp_run(temporal, tmp_path, [shop(db)], [
        resp(call("shop__lookup", {"sku": long_sku}, "c1")),
        answer("too large"),
    ], limits=boundloop.Limits(max_result_bytes=300)) as r:
        res = await result(r)
    assert (res.reason, res.tool_executions) == ("completed", 1)
    out = outputs(r.bodies[1])["c1"]
    assert out["error_code"] == "RESULT_TOO_LARGE"
    assert len(calls_of(db, "lookup")) == 1


async def test_mcp_call_past_its_timeout_is_retried_then_a_temporary_error(
        temporal: Client, tmp_path: Path, db: Path) -> None:
    slow = shop(db, overrides={"sleep": {"timeout_seconds": 1, "max_attempts": 2}})
    async with mcp_run(temporal, tmp_path, [slow], [
        resp(call("shop__sleep", {"seconds": 30}, "c1")),
        answer("the tool is slow today"),
    ]) as r:
        res = await result(r)
    assert res.reason == "completed"
    out = outputs(r.bodies[1])["c1"]
    assert (out["status"], out["retryable"]) == ("temporary_error", False)
    assert len(calls_of(db, "sleep")) == 2  # the declaration's two attempts


async def test_cancel_during_an_mcp_call_ends_the_run_cancelled(
        temporal: Client, tmp_path: Path, db: Path) -> None:
    async with mcp_run(temporal, tmp_path, [shop(db)], [
        resp(call("shop__sleep", {"seconds": 60}, "c1")),
        answer("never sent"),
    ]) as r:
        async def sleeping() -> bool:
            return bool(rows(db, "SELECT pid FROM sleeps"))
        await wait_until(sleeping, timeout=WAIT)
        await r.run.cancel("wrong shop")
        res = await result(r)
    assert (res.reason, res.tool_executions, res.cancel_reason) == ("cancelled", 0,
                                                                    "wrong shop")
    assert len(r.model.requests) == 1


async def test_a_worker_whose_mcp_server_cannot_start_is_refused_naming_it(
        temporal: Client, tmp_path: Path) -> None:
    """A stdio server whose program does not exist is refused when the worker is built
    (naming the server and the program), not in each run's first call."""
    missing = MCPServerConfig(name="gone", command=str(tmp_path / "no-such-server"),
                              connect_timeout_seconds=10)
    client = openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="sk-test-not-real")
    with pytest.raises(MCPServerError, match=r"'gone': cannot start .*no-such-server"):
        boundloop.Worker(temporal, test_tools, deps=DemoDeps(data_dir=tmp_path),
                         model=client, task_queue=f"mcp-{uuid.uuid4().hex[:8]}",
                         mcp_servers=[missing])


async def test_a_sessions_turns_call_its_mcp_tools(temporal: Client, tmp_path: Path,
                                                   db: Path) -> None:
    """A session's turns carry the agent's MCP declarations as a run does (each turn's
    input is built by the same function as a run's)."""
    model = ScriptedModelServer([resp(call("shop__lookup", {"sku": "A-001"}, "c1")),
                                 answer("A-001: 5")])
    queue = f"mcp-{uuid.uuid4().hex[:8]}"
    client = openai.AsyncOpenAI(base_url=model.start(), api_key="sk-test-not-real")
    try:
        async with boundloop.Worker(temporal, test_tools, deps=DemoDeps(data_dir=tmp_path),
                                    model=client, task_queue=queue, mcp_servers=[shop(db)],
                                    sticky_timeout=timedelta(seconds=1)) as worker:
            declared = await asyncio.wait_for(worker.mcp_tools(), WAIT)
            agent = boundloop.Agent(["lookup_stock"], mcp_tools=declared,
                                    allowed=["shop__lookup"], model="scripted-model",
                                    task_queue=queue)
            session = await agent.session(temporal)
            turn = await asyncio.wait_for(session.say("在庫は？"), WAIT)
            await asyncio.wait_for(session.end(), WAIT)
    finally:
        model.stop()
    assert (turn.reason, turn.tool_executions, turn.text) == ("completed", 1, "A-001: 5")
    [(key, _pid)] = calls_of(db, "lookup")
    assert unscoped_key(key) == f"{session.id}/turn-1/step-1/call-0"
