"""What the CLI and the console build on: the client's runs and sessions (`Run`,
`Session` and the operations on a workflow handle they are built on, named here so that
a command imports one module) and what only they need: lists of runs and of the calls
waiting for approval, the stuck line of a listed run, arguments shown in full, Web UI
links. Private: the public client is boundloop/client.py (`boundloop.Run`, ...).
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from boundloop import search_attributes as sa
from boundloop.agent import start_session as start_session
from boundloop.client import QUERY_SECONDS
from boundloop.client import Run as Run
from boundloop.client import Session as Session
from boundloop.client import approval as approval
from boundloop.client import cancel as cancel
from boundloop.client import decide as decide
from boundloop.client import describe as describe
from boundloop.client import follow as follow
from boundloop.client import get_run as get_run
from boundloop.client import get_session as get_session
from boundloop.client import query_status as query_status
from boundloop.client import rejection as rejection
from boundloop.client import result_of as result_of
from boundloop.client import stream_items as stream_items
from boundloop.contracts import WORKFLOW_NAME, RunStatus
from boundloop.core.loop import Approval
from boundloop.settings import Settings
from boundloop.stuck import stuck_line


def ui_link(settings: Settings, workflow_id: str, run_id: str | None = None) -> str:
    """The run's page in the Temporal Web UI (its history when `run_id` is given)."""
    # Encoded: a session turn's id holds a slash (`{session}/turn-2`), as the UI's own
    # links encode it.
    wf = urllib.parse.quote(workflow_id, safe="")
    base = f"{settings.ui_url}/namespaces/{settings.temporal_namespace}/workflows/{wf}"
    return f"{base}/{run_id}/history" if run_id else base


async def pending_runs(client: Client, unanswered: list[str] | None = None,
                       queues: dict[str, str] | None = None) -> list[tuple[str, RunStatus]]:
    """Runs waiting for approval, found by search attribute, with their pending calls.
    Runs whose status query no worker answered are added to `unanswered`, and their
    task queues to `queues` (workflow id: task queue)."""
    out: list[tuple[str, RunStatus]] = []
    query = f"{sa.STATUS.name} = 'waiting_approval' AND ExecutionStatus = 'Running'"
    async for wf in client.list_workflows(query):
        try:
            status = await asyncio.wait_for(
                query_status(client.get_workflow_handle(wf.id)), timeout=QUERY_SECONDS)
        except (RPCError, TimeoutError):
            if unanswered is not None:
                unanswered.append(wf.id)
            if queues is not None:
                queues[wf.id] = wf.task_queue
            continue
        if status.pending:
            out.append((wf.id, status))
    return out


async def list_runs(client: Client, status: str | None, reason: str | None,
                    limit: int) -> list[dict[str, Any]]:
    """Runs newest first, filtered by the BoundloopStatus / BoundloopStopReason attributes."""
    clauses = [f"WorkflowType = '{WORKFLOW_NAME}'"]
    if status:
        clauses.append(f"{sa.STATUS.name} = '{status}'")
        if status in ("running", "waiting_approval"):  # not terminated/failed ones
            clauses.append("ExecutionStatus = 'Running'")
    if reason:
        clauses.append(f"{sa.STOP_REASON.name} = '{reason}'")
    rows: list[dict[str, Any]] = []
    async for wf in client.list_workflows(" AND ".join(clauses), limit=limit):
        attrs = wf.typed_search_attributes
        closed = wf.status is not None and wf.status != WorkflowExecutionStatus.RUNNING
        ended_by_us = attrs.get(sa.STATUS) in ("completed", "stopped")
        # A terminated, failed or timed-out run keeps its last attribute values: show the
        # execution status then, not a stale "running".
        shown = (wf.status.name.lower() if closed and not ended_by_us and wf.status
                 else attrs.get(sa.STATUS) or "")
        rows.append({
            "workflow_id": wf.id, "run_id": wf.run_id,
            "status": shown,
            "reason": attrs.get(sa.STOP_REASON) or None,
            "steps": attrs.get(sa.STEPS) or 0,
            "tool_executions": attrs.get(sa.TOOL_EXECUTIONS) or 0,
            "pending_approvals": attrs.get(sa.PENDING_APPROVALS) or 0,
            "start_time": wf.start_time.isoformat(timespec="seconds"),
            "stuck": await stuck_of(client, wf) if not closed else None,
        })
    rows.sort(key=lambda r: r["start_time"], reverse=True)  # newest first
    return rows


#: Set by the server on a run whose workflow task failed or timed out this many times in
#: a row (system.numConsecutiveWorkflowTaskProblemsToTriggerSearchAttribute), cleared by
#: its next successful task; the Web UI's "Task Failures" view lists these runs.
REPORTED_PROBLEMS = "TemporalReportedProblems"


async def stuck_of(client: Client, wf: Any) -> str | None:
    """The stuck line of an open listed run, else None. The server's
    TemporalReportedProblems attribute decides where it is set; a server that does not set
    it (the dynamic config is 0) costs one describe per open run; only a stuck run's
    history is read (for its cause)."""
    handle = client.get_workflow_handle(wf.id, run_id=wf.run_id)
    problems = (wf.search_attributes or {}).get(REPORTED_PROBLEMS)
    desc = await handle.describe()
    line = await stuck_line(handle, desc)
    if line is None and problems:  # reported, but the pending task is not a retry yet
        return "the server reports workflow task problems: " + ", ".join(map(str, problems))
    return line


def argument_text(approval: Approval) -> str:
    """The validated arguments in full, pretty-printed, for the person approving them
    (never cut: approving what you cannot read is no approval; never for logs)."""
    return json.dumps(approval.arguments, ensure_ascii=False, indent=2)
