"""What operators see: summaries, search attributes, the status query, `list`, safe logs."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from boundloop import _ops as ops
from boundloop import search_attributes as sa
from boundloop.contracts import Decision
from boundloop.logs import JsonFormatter, TextFormatter
from boundloop.testing import wait_until
from tests.conftest import RunScript
from tests.scripts import answer, call, resp

PLANTED_KEY = "sk-test-not-real"  # conftest's worker key: must never be logged
DISTINCT_ARG = "ZEBRA-4242-DISTINCT"
DISTINCT_PROMPT = "PROMPT-MARKER-7777"


async def test_logs_carry_ids_but_no_arguments_outputs_prompts_or_keys(
        run_script: RunScript, caplog: pytest.LogCaptureFixture) -> None:
    # The worker's level (boundloop.logs.configure). At DEBUG, temporalio itself logs
    # activity payloads: docs/observability.md says to keep production at INFO.
    caplog.set_level(logging.INFO)
    out = await run_script([resp(call("echo", {"x": DISTINCT_ARG}, "c1")),
                            resp(call("explode", {"x": DISTINCT_ARG}, "c2")),
                            ], tools=["echo", "explode"],
                           question=f"{DISTINCT_PROMPT} please echo")
    assert out.result.reason == "tool_error"
    lines = []
    for record in caplog.records:
        lines.append(record.getMessage())
        lines.append(TextFormatter().format(record))
        lines.append(JsonFormatter().format(record))
        lines.append(repr(record.__dict__))
    text = "\n".join(lines)
    for secret in (PLANTED_KEY, DISTINCT_ARG, DISTINCT_PROMPT, "hunter2"):
        assert secret not in text, secret
    ours = [r for r in caplog.records if r.getMessage().startswith("tool execution")]
    assert ours, "the workflow logs each tool execution"
    formatted = TextFormatter().format(ours[0])
    assert f"workflow_id={out.result.workflow_id}" in formatted
    assert "fingerprint=echo:" in formatted and "step=1" in formatted


async def test_summaries_and_search_attributes_describe_the_run(
        run_script: RunScript, temporal: Client) -> None:
    out = await run_script([resp(call("lookup_stock", {"sku": "A-001"}, "c1")),
                            answer("12個")])
    desc = await out.handle.describe()
    attrs = desc.typed_search_attributes
    assert attrs.get(sa.STATUS) == "completed"
    assert attrs.get(sa.STOP_REASON) == "completed"
    assert (attrs.get(sa.STEPS), attrs.get(sa.TOOL_EXECUTIONS)) == (2, 1)
    assert attrs.get(sa.PENDING_APPROVALS) == 0
    summaries = []
    async for event in out.handle.fetch_history_events():
        # A short read-only tool runs as a local activity: its summary is on its marker.
        if event.event_type in (EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
                                EventType.EVENT_TYPE_MARKER_RECORDED) \
                and event.user_metadata.HasField("summary"):
            payload = event.user_metadata.summary
            summaries.append(temporal.data_converter.payload_converter.from_payload(
                payload, str))
    assert summaries == ["model step 1 · scripted-model", "tool lookup_stock · call 1",
                         "model step 2 · scripted-model"]


async def test_waiting_run_is_found_by_status_list_and_pending(
        run_script: RunScript, temporal: Client) -> None:
    seen: dict[str, Any] = {}

    async def inspect_while_waiting(handle: WorkflowHandle[Any, Any]) -> None:
        await wait_until(lambda: _has_pending(handle))
        status = await ops.query_status(handle)
        seen["status"] = status

        async def listed() -> bool:
            rows = await ops.list_runs(temporal, "waiting_approval", None, 50)
            return any(r["workflow_id"] == handle.id for r in rows)

        await wait_until(listed)  # visibility is eventually consistent
        pending = await ops.pending_runs(temporal)
        seen["pending"] = [(wf, [a.call_id for a in st.pending]) for wf, st in pending]
        desc = await handle.describe()
        seen["attrs"] = desc.typed_search_attributes
        await ops.decide(handle, Decision(call_id="t1", approve=True, approver="ops"))

    out = await run_script([resp(call("create_ticket", {
        "title": "t", "description": "d", "priority": "low"}, "t1")), answer("created")],
        during=inspect_while_waiting)
    assert out.result.reason == "completed"
    status = seen["status"]
    assert status.status == "waiting_approval" and status.steps == 1
    assert [a.call_id for a in status.pending] == ["t1"]
    assert [e.event for e in status.events][-1] == "approval_requested"
    assert (out.handle.id, ["t1"]) in seen["pending"]
    assert seen["attrs"].get(sa.PENDING_APPROVALS) == 1
    rows = await ops.list_runs(temporal, None, "completed", 200)
    assert any(r["workflow_id"] == out.handle.id for r in rows)


async def _has_pending(handle: WorkflowHandle[Any, Any]) -> bool:
    return bool((await ops.query_status(handle)).pending)


async def test_status_query_reports_counters_during_a_run(run_script: RunScript) -> None:
    snapshots: list[Any] = []

    async def sample(handle: WorkflowHandle[Any, Any]) -> None:
        async for status, _ in ops.follow(handle, interval=0.05):
            snapshots.append(status)
        await asyncio.sleep(0)

    out = await run_script([resp(call("lookup_stock", {"sku": "A-001"}, "c1"),
                                 delay_seconds=0.3), answer("ok", delay_seconds=0.3)],
                           during=sample)
    assert out.result.reason == "completed"
    assert snapshots[-1].status == "completed" and snapshots[-1].steps == 2
    assert any(s.status == "running" for s in snapshots)
