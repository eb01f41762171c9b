"""Identical calls and the other stop reasons, through the real workflow."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio.client import WorkflowExecutionStatus, WorkflowHandle

from boundloop.client import query_status
from boundloop.core.limits import Limits, Policy, Price
from tests.conftest import RunScript
from tests.scripts import answer, call, chat, chat_call, outputs, resp, tool_messages


async def test_identical_calls_blocked_then_final_answer(run_script: RunScript) -> None:
    out = await run_script([
        resp(call("lookup_stock", '{"sku":"A-001"}', "c1")),
        resp(call("lookup_stock", '{ "sku" : "A-001" }', "c2")),
        resp(call("lookup_stock", '{"sku":\n"A-001"}', "c3")),
        answer("A-001は12個です。"),
    ], limits=Limits(max_steps=6))
    r = out.result
    assert (r.reason, r.tool_executions, r.steps) == ("max_identical_calls", 2, 4)
    assert r.text == "A-001は12個です。"
    blocked = outputs(out.bodies[3])["c3"]
    assert blocked["status"] == "blocked" and blocked["error_code"] == "IDENTICAL_CALL_LIMIT"
    assert out.bodies[3]["tool_choice"] == "none"
    fps = {e.fingerprint for e in r.events if e.fingerprint}
    assert len(fps) == 1


async def test_identical_keys_in_other_order_are_identical(run_script: RunScript) -> None:
    out = await run_script([
        resp(call("search_docs", '{"query":"返品","limit":2}', "c1")),
        resp(call("search_docs", '{"limit": 2, "query": "\\u8fd4\\u54c1"}', "c2")),
        answer("ok"),
    ], limits=Limits(max_identical_calls=1))
    assert out.result.reason == "max_identical_calls"
    assert out.result.tool_executions == 1
    assert outputs(out.bodies[2])["c2"]["error_code"] == "IDENTICAL_CALL_LIMIT"


async def test_per_tool_limit_blocks_and_forces_final(run_script: RunScript) -> None:
    out = await run_script([
        resp(call("echo", {"x": "1"}, "c1"), call("echo", {"x": "2"}, "c2")),
        resp(call("echo", {"x": "3"}, "c3")),
        answer("done"),
    ], tools=["echo"])
    r = out.result
    assert (r.reason, r.tool_executions) == ("max_tools", 2)
    assert outputs(out.bodies[2])["c3"]["error_code"] == "TOOL_CALL_LIMIT"
    assert out.bodies[2]["tool_choice"] == "none"


async def test_terminal_result_forces_tool_choice_none(run_script: RunScript) -> None:
    out = await run_script([resp(call("finish", {"x": "ok"}, "c1")), answer("finished")],
                           tools=["finish"])
    assert (out.result.reason, out.result.text) == ("completed", "finished")
    assert [b["tool_choice"] for b in out.bodies] == ["auto", "none"]


async def test_tool_cost_budget_stops_before_running(run_script: RunScript) -> None:
    out = await run_script([
        resp(call("echo", {"x": "1"}, "c1")),
        resp(call("echo", {"x": "2"}, "c2")),
    ], tools=["echo"], limits=Limits(tool_cost_budget=3))
    assert (out.result.reason, out.result.tool_executions, out.result.cost_units) == (
        "budget_limit", 1, 2)


async def test_usd_budget_stops(run_script: RunScript) -> None:
    out = await run_script(
        [resp(call("lookup_stock", {"sku": "A-001"}, "c1")), answer("never")],
        limits=Limits(usd_budget=0.0001),
        policy=Policy(prices={"scripted-model": Price(input_usd_per_mtok=1000.0,
                                                      output_usd_per_mtok=1000.0)}))
    r = out.result
    assert (r.reason, r.tool_executions) == ("budget_limit", 0)
    assert r.cost_usd is not None and r.cost_usd >= 0.0001


async def test_deadline_stops_the_run(run_script: RunScript) -> None:
    out = await run_script([
        resp(call("lookup_stock", {"sku": "A-001"}, "c1"), delay_seconds=1.2),
        answer("never"),
    ], limits=Limits(deadline_seconds=1.0))
    assert (out.result.reason, out.result.tool_executions) == ("deadline", 0)


async def test_slow_model_retries_cut_by_the_deadline_report_deadline(
        run_script: RunScript) -> None:
    slow = resp(call("lookup_stock", {"sku": "A-001"}, "c1"), delay_seconds=1.5)
    out = await run_script([slow, slow, slow], allow_violations=True,
                           limits=Limits(model_timeout_seconds=1.0, deadline_seconds=2.5))
    assert (out.result.reason, out.result.tool_executions) == ("deadline", 0)


async def test_transient_failure_gives_temporary_error_and_goes_on(
        run_script: RunScript) -> None:
    out = await run_script([resp(call("flaky", {"x": "1"}, "c1")), answer("sorry")],
                           tools=["flaky"])
    assert (out.result.reason, out.result.tool_executions) == ("completed", 1)
    env = outputs(out.bodies[1])["c1"]
    assert env["status"] == "temporary_error" and env["retryable"] is False


async def test_declared_failure_goes_back_to_the_model(run_script: RunScript) -> None:
    out = await run_script([resp(call("declared", {"x": "42"}, "c1")), answer("no order")],
                           tools=["declared"])
    assert out.result.reason == "completed"
    env = outputs(out.bodies[1])["c1"]
    assert (env["status"], env["error_code"]) == ("not_found", "NO_SUCH_ORDER")


async def test_unknown_tool_reported_when_policy_says_so(run_script: RunScript) -> None:
    out = await run_script([resp(call("delete_all", {}, "c1"),
                                 call("lookup_stock", {"sku": "A-001"}, "c2")),
                            answer("ok")], policy=Policy(unknown_tool="report"))
    assert (out.result.reason, out.result.tool_executions) == ("completed", 1)
    assert outputs(out.bodies[1])["c1"]["error_code"] == "UNKNOWN_TOOL"


async def test_approval_timeout(run_script: RunScript) -> None:
    out = await run_script([resp(call("create_ticket", {
        "title": "t", "description": "d", "priority": "low"}, "c1"))],
        limits=Limits(approval_timeout_seconds=1.0))
    assert (out.result.reason, out.result.tool_executions) == ("approval_timeout", 0)
    assert out.tickets() == []


async def test_cancel_gives_cancelled(run_script: RunScript) -> None:
    async def cancel_when_waiting(handle: WorkflowHandle[Any, Any]) -> None:
        for _ in range(200):
            status = await query_status(handle)
            if status.pending:
                break
            await asyncio.sleep(0.05)
        await handle.cancel()

    out = await run_script([resp(call("create_ticket", {
        "title": "t", "description": "d", "priority": "low"}, "c1"))],
        during=cancel_when_waiting)
    assert (out.result.reason, out.result.tool_executions) == ("cancelled", 0)
    # The SDK's Canceled carries no details: a cancelled run fails with RunStopped too.
    assert (await out.handle.describe()).status == WorkflowExecutionStatus.FAILED


async def test_chat_completions_two_rounds(run_script: RunScript) -> None:
    out = await run_script([
        chat(calls=[chat_call("lookup_stock", {"sku": "A-001"}, "call_1")]),
        chat(calls=[chat_call("lookup_stock", {"sku": "B-002"}, "call_2")]),
        chat("A-001は12個、B-002は0個です。"),
    ], api="chat", instructions="Answer briefly.")
    r = out.result
    assert (r.reason, r.steps, r.tool_executions) == ("completed", 3, 2)
    msgs = out.bodies[2]["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool",
                                         "assistant", "tool"]
    assert tool_messages(out.bodies[2])["call_2"]["data"]["quantity"] == 0


async def test_conversation_rebuilt_from_history_without_cache(run_script: RunScript) -> None:
    script = [
        resp(call("lookup_stock", {"sku": "A-001"}, "c1")),
        resp(call("lookup_stock", {"sku": "B-002"}, "c2")),
        answer("done"),
    ]
    cached = await run_script(script)
    uncached = await run_script(script, cache=0)
    assert uncached.result.reason == "completed"
    assert [b["input"] for b in uncached.bodies] == [b["input"] for b in cached.bodies]
