"""A short read-only tool runs as a Temporal local activity in the workflow's worker, with
the same envelope, limits, idempotency key, counted attempts and typed outcomes as a
regular one; side-effecting, approval-gated, terminal, long or opted-out tools stay
regular activities (docs/durability.md, "Local activities")."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType

from boundloop import Toolset
from boundloop.contracts import MODEL_ACTIVITY, TOOL_ACTIVITY
from boundloop.core.limits import Limits
from boundloop.core.loop import LOCAL_TOOL_MAX_SECONDS, idempotency_key, runs_locally
from boundloop.core.mcp_tools import MCPToolDeclaration, tool_rule
from tests.conftest import Outcome, RunScript, unscoped_key
from tests.scripts import answer, call, outputs, resp

# --- which tools run locally (the pure rule) --------------------------------------------


def _rule(**declared: Any) -> Any:
    ts = Toolset[None]()

    @ts.tool(**{"timeout": timedelta(seconds=10), **declared})
    def look(x: str) -> dict[str, str]:
        """Looks x up."""
        return {"x": x}

    return ts.get("look").rule


def test_a_short_read_only_tool_runs_locally() -> None:
    rule = _rule()
    assert rule.local
    assert runs_locally(rule, LOCAL_TOOL_MAX_SECONDS, gated=False)


@pytest.mark.parametrize("declared", [
    {"side_effects": True}, {"needs_approval": True}, {"needs_approval": lambda a: False},
    {"terminal": True}, {"local_activity": False},
], ids=["side_effects", "needs_approval", "approval_predicate", "terminal", "opted_out"])
def test_a_tool_that_is_not_read_only_or_opted_out_stays_regular(
        declared: dict[str, Any]) -> None:
    rule = _rule(**declared)
    assert not rule.local
    assert not runs_locally(rule, 1.0, gated=False)


def test_a_timeout_over_the_threshold_or_a_waited_approval_stays_regular() -> None:
    rule = _rule()
    assert not runs_locally(rule, LOCAL_TOOL_MAX_SECONDS + 0.5, gated=False)
    assert not runs_locally(rule, 1.0, gated=True)  # an operator or argument rule asked
    # A tool declared long (the default 30 s) stays regular even under a shorter run
    # limit: it may be one that must see a cancel while it runs.
    assert not _rule(timeout=timedelta(seconds=30)).local


def test_an_admitted_declaration_keeps_the_decision_and_mcp_tools_stay_regular() -> None:
    base = {"name": "t", "server": "s", "remote_name": "t", "description": "",
            "parameters": {"type": "object"}, "strict": False, "needs_approval": False,
            "side_effects": False, "timeout_seconds": 5.0}
    assert tool_rule(MCPToolDeclaration(**base, local=True)).local
    mcp = MCPToolDeclaration(**base)
    assert not tool_rule(mcp).local
    assert "local" not in json.loads(mcp.model_dump_json())  # no byte more in history


# --- runs ------------------------------------------------------------------------------


async def _kinds(out: Outcome) -> tuple[list[str], list[dict[str, Any]]]:
    """(the scheduled activities' types, the local activity markers' data), in order."""
    scheduled: list[str] = []
    local: list[dict[str, Any]] = []
    async for e in out.handle.fetch_history_events():
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled.append(e.activity_task_scheduled_event_attributes.activity_type.name)
        elif e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            marker = e.marker_recorded_event_attributes
            if marker.marker_name == "core_local_activity":  # admit_run's too
                data = json.loads(marker.details["data"].payloads[0].data)
                if data["activity_type"] == TOOL_ACTIVITY:
                    local.append({"id": data["activity_id"],
                                  "returned": "result" in marker.details})
    return scheduled, local


async def test_a_read_only_tool_is_a_local_activity_a_side_effecting_one_is_not(
        run_script: RunScript) -> None:
    out = await run_script([
        resp(call("lookup_stock", {"sku": "A-001"}, "c1"), call("counted", {
            "size": 3, "tag": "t"}, "c2")),
        answer("done")], tools=["lookup_stock", "counted"])
    assert (out.result.reason, out.result.tool_executions) == ("completed", 2)
    scheduled, local = await _kinds(out)
    assert scheduled == [MODEL_ACTIVITY, TOOL_ACTIVITY, MODEL_ACTIVITY]  # counted only
    # The local activity's id is the call's idempotency key, the key its tool got.
    assert [m["returned"] for m in local] == [True]
    assert unscoped_key(local[0]["id"]) == idempotency_key(out.handle.id, 1, 0)
    seen = outputs(out.bodies[1])
    assert seen["c1"]["data"]["sku"] == "A-001" and seen["c2"]["status"] == "success"


async def test_a_run_limit_over_the_threshold_keeps_the_tool_regular(
        run_script: RunScript) -> None:
    out = await run_script([resp(call("lookup_stock", {"sku": "A-001"}, "c1")),
                            answer("done")], tools=["lookup_stock"],
                           limits=Limits(tool_timeout_seconds=LOCAL_TOOL_MAX_SECONDS + 5))
    assert out.result.reason == "completed"
    scheduled, local = await _kinds(out)
    assert scheduled == [MODEL_ACTIVITY, TOOL_ACTIVITY, MODEL_ACTIVITY] and local == []


async def test_local_attempts_are_counted_and_keep_their_typed_outcomes(
        run_script: RunScript) -> None:
    """A transient failure and a timeout: each attempt a local activity (2 each, as the
    tools' retry policies say), the model gets the same envelopes as from regular ones."""
    out = await run_script([
        resp(call("flaky", {"x": "1"}, "c1"), call("sleepy", {"x": "2"}, "c2"),
             call("declared", {"x": "3"}, "c3")),
        answer("done")], tools=["flaky", "sleepy", "declared"])
    assert out.result.reason == "completed"
    seen = outputs(out.bodies[1])
    assert (seen["c1"]["status"], seen["c2"]["status"]) == ("temporary_error",
                                                            "temporary_error")
    assert "timed out after 0.5 s, 2 attempts" in seen["c2"]["message"]
    assert seen["c3"]["status"] == "not_found"
    scheduled, local = await _kinds(out)
    assert scheduled == [MODEL_ACTIVITY, MODEL_ACTIVITY]
    assert [m["returned"] for m in local] == [False, False, False, False, True]
    ids = [m["id"] for m in local]
    assert ids[0] == ids[1] and ids[2] == ids[3] and len(set(ids)) == 3  # key per call


async def test_an_unexpected_exception_in_a_local_tool_stops_the_run(
        run_script: RunScript) -> None:
    out = await run_script([resp(call("explode", {"x": "1"}, "c1"))], tools=["explode"])
    assert out.result.reason == "tool_error"
    _, local = await _kinds(out)
    assert [m["returned"] for m in local] == [False, False]
