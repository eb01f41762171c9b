"""Cancels and hung tools, through the real workflow on a real dev server.

A cancel in any state ends the run with `cancelled`, counts nothing that did not
finish, and reaches the running tool (docs/durability.md, "Cancels"). A hung sync tool
cannot take the threads the worker's other tools need ("Hung tools").
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from boundloop import search_attributes as sa
from boundloop._ops import list_runs
from boundloop.client import query_status
from boundloop.contracts import RunResult
from boundloop.scripted.server import ScriptedModelServer
from tests.conftest import RunScript
from tests.scripts import answer, call, outputs, resp
from tests.support.tools import marks
from tests.test_cli import cli, env_for
from tests.test_crash import cluster, pending_call, result_of

#: Bound of every wait below (seconds); none is an assertion on time.
WAIT = 40.0


async def until(check: Callable[[], bool], what: str) -> None:
    async def poll() -> None:
        while not check():
            await asyncio.sleep(0.05)
    try:
        await asyncio.wait_for(poll(), WAIT)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def cancel_when(check: Callable[[], bool], what: str,
                ) -> Callable[[WorkflowHandle[Any, Any]], Awaitable[None]]:
    async def during(handle: WorkflowHandle[Any, Any]) -> None:
        await until(check, what)
        await handle.cancel()  # what `temporal workflow cancel` sends
    return during


def assert_cancelled(result: RunResult, *, steps: int) -> None:
    assert (result.reason, result.steps, result.tool_executions) == ("cancelled", steps, 0)
    assert [e.event for e in result.events][-2:] == ["cancel_requested", "stopped:cancelled"]
    assert not any(e.event.startswith(("tool_", "model_failed")) for e in result.events)


async def test_cancel_while_a_sync_tool_runs_stops_it(run_script: RunScript,
                                                      tmp_path: Path) -> None:
    data = tmp_path / "data"
    out = await run_script(
        [resp(call("nap", {"x": "1"}, "c1")), answer("never asked")], tools=["nap"],
        during=cancel_when(lambda: bool(marks(data)), "the tool to start"))
    assert_cancelled(out.result, steps=1)
    await until(lambda: [w for _, w in marks(data)] == ["started", "cancelled"],
                "the tool to see the cancel")
    assert len(out.requests) == 1


async def test_cancel_while_an_async_tool_runs_cancels_it(run_script: RunScript,
                                                          tmp_path: Path) -> None:
    data = tmp_path / "data"
    out = await run_script(
        [resp(call("anap", {"x": "1"}, "c1")), answer("never asked")], tools=["anap"],
        during=cancel_when(lambda: bool(marks(data)), "the tool to start"))
    assert_cancelled(out.result, steps=1)
    await until(lambda: [w for _, w in marks(data)] == ["started", "cancelled"],
                "the tool to be cancelled")


async def test_async_tool_runs_and_returns(run_script: RunScript, tmp_path: Path) -> None:
    """`async def` tools are awaited (they used to run in a thread and fail)."""
    from tests.support import tools

    tools.NAP_SECONDS, before = 0.05, tools.NAP_SECONDS
    try:
        out = await run_script([resp(call("anap", {"x": "1"}, "c1")), answer("ok")],
                               tools=["anap"])
    finally:
        tools.NAP_SECONDS = before
    assert (out.result.reason, out.result.tool_executions) == ("completed", 1)
    assert outputs(out.bodies[1])["c1"]["data"] == {"slept": "1"}


async def test_cancel_while_the_model_request_hangs(run_script: RunScript) -> None:
    model = ScriptedModelServer([answer("late", delay_seconds=30)])
    out = await run_script([], model=model, during=cancel_when(
        lambda: bool(model.requests), "the model request"))
    assert_cancelled(out.result, steps=0)


async def test_cancel_between_model_attempts(run_script: RunScript) -> None:
    """The provider asked to wait 30 s before the next attempt; the cancel comes then."""
    busy = {"status": 503, "headers": {"Retry-After": "30"},
            "body": {"error": {"message": "overloaded", "type": "server_error"}}}

    async def during(handle: WorkflowHandle[Any, Any]) -> None:
        async def timer_started() -> None:
            while not [e async for e in handle.fetch_history_events()
                       if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED]:
                await asyncio.sleep(0.05)
        await asyncio.wait_for(timer_started(), WAIT)
        await handle.cancel()

    out = await run_script([busy, answer("late")], during=during)
    assert_cancelled(out.result, steps=0)
    assert len(out.requests) == 1


async def test_cancel_before_the_first_step(run_script: RunScript) -> None:
    async def during(handle: WorkflowHandle[Any, Any]) -> None:
        await handle.cancel()

    out = await run_script([answer("late", delay_seconds=30)], during=during)
    assert_cancelled(out.result, steps=0)


async def test_cancel_during_an_approval_wait(run_script: RunScript) -> None:
    ticket = {"title": "t", "description": "d", "priority": "low"}

    async def during(handle: WorkflowHandle[Any, Any]) -> None:
        await pending_call(handle)
        await handle.cancel()

    out = await run_script([resp(call("create_ticket", ticket, "c1")), answer("never")],
                           during=during)
    assert_cancelled(out.result, steps=1)
    assert out.tickets() == []


async def test_a_run_cancelled_while_waiting_leaves_nothing_pending(
        run_script: RunScript, temporal: Client, tmp_path: Path) -> None:
    """Issue 19: after `boundloop cancel` of a run waiting for approval, its pending count
    (search attribute, `list`, status query) is 0, and the last
    frame of a `boundloop watch` that followed it shows the end, not the approval table."""
    env = env_for(temporal, tmp_path)
    ticket = {"title": "t", "description": "d", "priority": "low"}
    seen: dict[str, Any] = {}

    async def operator(handle: WorkflowHandle[Any, Any]) -> None:
        await pending_call(handle)
        watching = asyncio.create_task(cli("watch", handle.id, env=env))
        seen["cancel"] = await cli("cancel", handle.id, "--reason", "wrong customer", env=env)
        seen["watch"] = await watching  # ends with the run
        seen["pending"] = (await query_status(handle)).pending  # a worker answers it

    out = await run_script([resp(call("create_ticket", ticket, "c1")), answer("never")],
                           during=operator)
    assert out.result.reason == "cancelled"
    assert seen["cancel"][0] == 0, seen["cancel"]
    code, frame, err = seen["watch"]
    assert code == 3, err  # a stopped run's exit code
    assert "waiting for approval" not in frame and "cancelled" in frame
    desc = await out.handle.describe()
    assert desc.typed_search_attributes.get(sa.PENDING_APPROVALS) == 0
    assert seen["pending"] == []
    rows = [r for r in await list_runs(temporal, None, None, 50)
            if r["workflow_id"] == out.handle.id]
    assert [(r["status"], r["pending_approvals"]) for r in rows] == [("stopped", 0)]
    listed = [wf.id async for wf in temporal.list_workflows(
        f"{sa.PENDING_APPROVALS.name} > 0")]
    assert out.handle.id not in listed


async def test_hung_sync_tools_do_not_starve_the_next_tool(tmp_path: Path) -> None:
    """Two calls of a tool that hangs past its 1 s timeout, 3 attempts each (six threads
    that cannot be stopped), then `echo` on the same worker process: its body runs."""
    async with cluster(tmp_path) as c:
        c.start_worker()
        handle = await c.start_run([
            resp(call("hang", {"x": "1"}, "h1"), call("hang", {"x": "2"}, "h2")),
            resp(call("echo", {"x": "after"}, "e1"), rid="resp_2"),
            answer("done", rid="resp_3"),
        ], tools=["hang", "echo"])
        result = await result_of(handle)

    assert result.reason == "completed"
    assert [(e.tool, e.event) for e in result.events if e.event.startswith("tool_")] == [
        ("hang", "tool_temporary_error"), ("hang", "tool_temporary_error"),
        ("echo", "tool_success")]
    assert outputs(c.model.requests[2].body)["e1"]["data"] == {"echo": "after"}
    assert result.tool_executions == 3
    assert [w for _, w in marks(c.data_dir)] == ["started"] * 6


async def test_boundloop_cancel_with_a_reason(run_script: RunScript, temporal: Client,
                                              tmp_path: Path) -> None:
    """`boundloop cancel RUN --reason TEXT`: the reason is in the event log and the result;
    a bad reason or a run that is not running is refused and changes nothing."""
    env = env_for(temporal, tmp_path)
    data = tmp_path / "data"
    seen: dict[str, tuple[int, str, str]] = {}

    async def operator(handle: WorkflowHandle[Any, Any]) -> None:
        await until(lambda: bool(marks(data)), "the tool to start")
        seen["too_long"] = await cli("cancel", handle.id, "--reason", "x" * 501, env=env)
        seen["ok"] = await cli("cancel", handle.id, "--reason", "wrong customer", env=env)

    out = await run_script([resp(call("nap", {"x": "1"}, "c1")), answer("never")],
                           tools=["nap"], during=operator)
    code, _, err = seen["too_long"]
    assert code == 2 and "--reason" in err and "500 characters" in err
    code, text, err = seen["ok"]
    assert code == 0, err
    assert "cancel requested" in text
    assert (out.result.reason, out.result.cancel_reason) == ("cancelled", "wrong customer")
    assert [(e.event, e.detail) for e in out.result.events][-2:] == [
        ("cancel_requested", "wrong customer"), ("stopped:cancelled", None)]
    code, _, err = await cli("cancel", out.handle.id, env=env)
    said = " ".join(err.split())
    # How it ended, from its stop reason (Temporal's own status of a stopped run: failed).
    assert code == 1 and "has ended: it takes no more cancels (stopped: cancelled;" in said, err
