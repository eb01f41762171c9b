"""Approvals through the real workflow: decisions by update and by signal,
rejections, timeouts, mixed batches, edited arguments and the deadline."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from boundloop.client import decide, query_status
from boundloop.contracts import Decision, RunStatus
from boundloop.core.limits import Limits, Policy
from tests.conftest import RunScript
from tests.scripts import answer, call, outputs, resp

TICKET = {"title": "Printer on fire", "description": "3F printer smokes", "priority": "high"}
OTHER = {"title": "Broken chair", "description": "Room 4 chair", "priority": "low"}
ONLY_ALICE = Policy(approvers={"create_ticket": ["alice"]})
WAIT = 30.0

Hook = Callable[[WorkflowHandle[Any, Any]], Awaitable[None]]


async def status_when(handle: WorkflowHandle[Any, Any], predicate: Callable[[RunStatus], bool],
                      what: str) -> RunStatus:
    """Poll the status query until `predicate` holds (bounded)."""
    end = asyncio.get_running_loop().time() + WAIT
    while True:
        status = await query_status(handle)
        if predicate(status):
            return status
        if asyncio.get_running_loop().time() > end:
            raise AssertionError(f"timed out waiting for {what}: {status}")
        await asyncio.sleep(0.05)


async def pending(handle: WorkflowHandle[Any, Any], count: int = 1) -> RunStatus:
    return await status_when(handle, lambda s: len(s.pending) == count,
                             f"{count} pending approval(s)")


async def refused(handle: WorkflowHandle[Any, Any], decision: Decision) -> str:
    """Send `decision` through the update; it must be refused. Returns the message."""
    with pytest.raises(WorkflowUpdateFailedError) as info:
        await decide(handle, decision)
    cause = info.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "InvalidDecision"
    return cause.message


async def signals_handled(handle: WorkflowHandle[Any, Any], count: int) -> None:
    """Until `count` signals are in history and a workflow task that started after the
    last of them has completed (the workflow has seen them all)."""
    async def handled() -> bool:
        last_signal, seen, done = 0, 0, False
        async for event in handle.fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
                last_signal, seen, done = event.event_id, seen + 1, False
            elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                attrs = event.workflow_task_completed_event_attributes
                done = done or (last_signal > 0 and attrs.started_event_id > last_signal)
        return seen == count and done

    end = asyncio.get_running_loop().time() + WAIT
    while not await handled():
        if asyncio.get_running_loop().time() > end:
            raise AssertionError(f"timed out waiting for {count} signals to be handled")
        await asyncio.sleep(0.05)


def decision_events(status: RunStatus) -> list[str]:
    return [e.event for e in status.events if e.event.startswith("approval_")
            and e.event != "approval_requested"]


def answered(request_body: dict[str, Any]) -> list[str]:
    """call_ids of the function_call_output items of a request, in order."""
    return [i["call_id"] for i in request_body["input"]
            if isinstance(i, dict) and i.get("type") == "function_call_output"]


# --- (5) refused decisions ------------------------------------------------------------


async def test_decide_refuses_bad_decisions_with_a_message_and_changes_nothing(
        run_script: RunScript) -> None:
    async def during(handle: WorkflowHandle[Any, Any]) -> None:
        before = await pending(handle, 2)
        c1 = "c1"
        assert "unknown call id 'nope'" in await refused(
            handle, Decision(call_id="nope", approve=True, approver="alice"))
        assert "approver 'mallory' may not decide create_ticket" in await refused(
            handle, Decision(call_id=c1, approve=True, approver="mallory"))
        assert "do not match the create_ticket schema" in await refused(
            handle, Decision(call_id=c1, approve=True, approver="alice",
                             arguments={**TICKET, "priority": "urgent"}))
        assert "only accepted with an approval" in await refused(
            handle, Decision(call_id=c1, approve=False, approver="alice", arguments=TICKET))
        after = await query_status(handle)
        assert after.pending == before.pending
        assert after.events == before.events
        assert after.tool_executions == 0

        assert await decide(handle, Decision(call_id=c1, approve=True, approver="alice")) == (
            "approved")
        executed = await status_when(handle, lambda s: s.tool_executions == 1, "c1 to run")
        assert "already approved by alice" in await refused(
            handle, Decision(call_id=c1, approve=False, approver="alice"))
        again = await query_status(handle)
        assert [a.call_id for a in again.pending] == ["c2"]
        assert again.events == executed.events
        assert await decide(handle, Decision(call_id="c2", approve=False,
                                             approver="alice")) == "rejected"

    out = await run_script([
        resp(call("create_ticket", TICKET, "c1"), call("create_ticket", OTHER, "c2")),
        answer("One ticket created."),
    ], policy=ONLY_ALICE, during=during)
    assert (out.result.reason, out.result.tool_executions) == ("completed", 1)
    assert [t["title"] for t in out.tickets()] == [TICKET["title"]]
    assert [e.event for e in out.result.events if e.event.startswith("approval_")] == [
        "approval_requested", "approval_requested", "approval_approved", "approval_rejected"]


async def test_bad_signals_are_ignored_and_the_run_still_waits(run_script: RunScript) -> None:
    async def during(handle: WorkflowHandle[Any, Any]) -> None:
        before = await pending(handle, 2)
        bad = [
            ("approve", Decision(call_id="nope", approve=True, approver="alice")),
            ("approve", Decision(call_id="c1", approve=True, approver="mallory")),
            ("approve", Decision(call_id="c1", approve=True, approver="alice",
                                 arguments={**TICKET, "title": ""})),
            ("reject", Decision(call_id="c1", approve=False, approver="alice",
                                arguments=TICKET)),
        ]
        for name, decision in bad:
            await handle.signal(name, decision)
        await signals_handled(handle, len(bad))
        after = await query_status(handle)
        assert after.status == "waiting_approval"
        assert after.pending == before.pending
        assert after.events == before.events
        assert after.tool_executions == 0

        # Valid signals work; a repeated one is ignored (decided once).
        good = Decision(call_id="c1", approve=True, approver="alice")
        await handle.signal("approve", good)
        await handle.signal("approve", good)
        await handle.signal("reject", Decision(call_id="c2", approve=False, approver="alice",
                                               reason="not needed"))

    out = await run_script([
        resp(call("create_ticket", TICKET, "c1"), call("create_ticket", OTHER, "c2")),
        answer("One ticket created."),
    ], policy=ONLY_ALICE, during=during)
    r = out.result
    assert (r.reason, r.tool_executions) == ("completed", 1)
    assert [t["title"] for t in out.tickets()] == [TICKET["title"]]
    assert [(e.event, e.call_id) for e in r.events if e.event.startswith("approval_")] == [
        ("approval_requested", "c1"), ("approval_requested", "c2"),
        ("approval_approved", "c1"), ("approval_rejected", "c2")]
    results = outputs(out.bodies[1])
    assert results["c1"]["status"] == "success"
    assert results["c2"]["status"] == "rejected"


# --- (6) rejection and timeout --------------------------------------------------------


@pytest.mark.parametrize("reason", ["we already have ticket T-12", None])
async def test_rejected_call_is_not_executed_and_an_identical_one_is_refused_unasked(
        run_script: RunScript, reason: str | None) -> None:
    async def during(handle: WorkflowHandle[Any, Any]) -> None:
        await pending(handle)
        await decide(handle, Decision(call_id="c1", approve=False, reason=reason))

    out = await run_script([
        resp(call("create_ticket", TICKET, "c1")),
        resp(call("create_ticket", TICKET, "c2")),
        answer("I did not create the ticket."),
    ], during=during)
    r = out.result
    # Repeating a call a human rejected is refused and forces the final answer: the
    # run ends naming the identical-call limit (zero repeats of a rejected call).
    assert (r.reason, r.tool_executions, r.steps) == ("max_identical_calls", 0, 3)
    assert r.text == "I did not create the ticket."
    assert out.tickets() == []
    first = outputs(out.bodies[1])["c1"]
    assert (first["status"], first["error_code"], first["retryable"]) == (
        "rejected", "REJECTED", False)
    if reason is None:
        assert "Reason:" not in first["message"]
    else:
        assert first["message"].endswith(f"Reason: {reason}")
    second = outputs(out.bodies[2])["c2"]
    assert second["status"] == "rejected"
    assert "identical call was rejected earlier" in second["message"]
    assert out.bodies[2]["tool_choice"] == "none"
    assert [(e.event, e.call_id) for e in r.events
            if e.event.startswith(("approval_", "refused_"))] == [
        ("approval_requested", "c1"), ("approval_rejected", "c1"),
        ("refused_rejected_again", "c2")]


async def test_undecided_approval_times_out(run_script: RunScript) -> None:
    out = await run_script([resp(call("create_ticket", TICKET, "c1")), answer("never")],
                           limits=Limits(approval_timeout_seconds=1.0))
    r = out.result
    assert (r.reason, r.tool_executions, r.steps) == ("approval_timeout", 0, 1)
    assert out.tickets() == []
    assert len(out.requests) == 1
    assert [e.event for e in r.events][-2:] == ["approval_timed_out",
                                                "stopped:approval_timeout"]


# --- (7) mixed batches, edited arguments, deadline ------------------------------------


async def test_mixed_batch_read_only_runs_first_each_approval_decided_separately(
        run_script: RunScript) -> None:
    async def during(handle: WorkflowHandle[Any, Any]) -> None:
        waiting = await status_when(
            handle, lambda s: len(s.pending) == 2 and s.tool_executions == 1,
            "the read-only call to run while both approvals wait")
        assert [a.call_id for a in waiting.pending] == ["c1", "c3"]
        assert decision_events(waiting) == []
        assert [(e.event, e.call_id) for e in waiting.events if e.event.startswith("tool_")] == [
            ("tool_success", "c2")]
        # Reverse order: the later call first.
        await decide(handle, Decision(call_id="c3", approve=False, reason="not needed"))
        still = await query_status(handle)
        assert [a.call_id for a in still.pending] == ["c1"]
        await decide(handle, Decision(call_id="c1", approve=True))

    out = await run_script([
        resp(call("create_ticket", TICKET, "c1"), call("lookup_stock", {"sku": "A-001"}, "c2"),
             call("create_ticket", OTHER, "c3")),
        answer("Created one ticket; A-001 has 12."),
    ], during=during)
    r = out.result
    assert (r.reason, r.tool_executions, r.steps) == ("completed", 2, 2)
    assert answered(out.bodies[1]) == ["c1", "c2", "c3"]
    results = outputs(out.bodies[1])
    assert results["c1"]["status"] == "success" and results["c1"]["data"]["priority"] == "high"
    assert results["c2"]["data"] == {"sku": "A-001", "found": True, "quantity": 12}
    assert results["c3"]["status"] == "rejected" and "not needed" in results["c3"]["message"]
    assert [t["title"] for t in out.tickets()] == [TICKET["title"]]
    assert [(e.event, e.call_id) for e in r.events if e.call_id] == [
        ("approval_requested", "c1"), ("approval_requested", "c3"), ("tool_success", "c2"),
        ("approval_rejected", "c3"), ("approval_approved", "c1"), ("tool_success", "c1")]


async def test_approval_with_edited_arguments_executes_the_edited_call(
        run_script: RunScript) -> None:
    edited = {"title": "Printer smoking (edited)", "description": "3F, near the window",
              "priority": "low"}

    async def during(handle: WorkflowHandle[Any, Any]) -> None:
        await pending(handle)
        await decide(handle, Decision(call_id="c1", approve=True, approver="alice",
                                      arguments=edited))

    out = await run_script([resp(call("create_ticket", TICKET, "c1")), answer("done")],
                           during=during)
    assert (out.result.reason, out.result.tool_executions) == ("completed", 1)
    tickets = out.tickets()
    assert [(t["title"], t["priority"]) for t in tickets] == [(edited["title"], "low")]
    assert outputs(out.bodies[1])["c1"]["data"]["priority"] == "low"
    requested, executed = (next(e for e in out.result.events if e.event == name)
                           for name in ("approval_requested", "tool_success"))
    assert requested.fingerprint != executed.fingerprint


async def test_time_waiting_for_approval_does_not_count_toward_the_deadline(
        run_script: RunScript) -> None:
    deadline = 3.0

    async def during(handle: WorkflowHandle[Any, Any]) -> None:
        waiting = await pending(handle)
        since = datetime.fromisoformat(waiting.pending[0].requested_at)
        # Decide only once the wait alone is longer than the whole deadline.
        while (datetime.now(UTC) - since).total_seconds() <= deadline + 0.5:
            await asyncio.sleep(0.1)
        await decide(handle, Decision(call_id="c1", approve=True))

    out = await run_script([resp(call("create_ticket", TICKET, "c1")), answer("done")],
                           limits=Limits(deadline_seconds=deadline), during=during)
    assert (out.result.reason, out.result.steps, out.result.tool_executions) == (
        "completed", 2, 1)
    assert len(out.tickets()) == 1
