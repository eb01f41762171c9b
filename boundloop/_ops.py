"""What the CLI and the console build on: the client's runs and sessions (`Run`,
`Session` and the operations on a workflow handle they are built on, named here so that
a command imports one module) and what only they need: lists of runs and of the calls
waiting for approval, the stuck line of a listed run, arguments shown in full, Web UI
links. Private: the public client is boundloop/client.py (`boundloop.Run`, ...).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.parse
from typing import Any

from temporalio.client import Client, WorkflowExecution, WorkflowExecutionStatus
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
from boundloop.contracts import WORKFLOW_NAME, ChildRun, RunStatus
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


def literal(value: str) -> str:
    """`value` as a string literal of a visibility query (a workflow id may hold a quote)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def approval_path(workflow_id: str, status: RunStatus, approval: Approval) -> str:
    """Where a waiting call is: `ROOT → research → create_ticket` for a sub-agent's run
    (the root run's id, the agents down to it, the tool), `RUN → create_ticket` for a
    run of its own."""
    if status.tree is not None:
        return status.tree.line(approval.tool)
    return f"{workflow_id} → {approval.tool}"


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


def shown_status(wf: WorkflowExecution) -> str:
    """A listed run's status: its BoundloopStatus, or how Temporal closed it. A
    terminated, failed or timed-out run keeps its last attribute values: show the
    execution status then, not a stale "running"."""
    attrs = wf.typed_search_attributes
    closed = wf.status is not None and wf.status != WorkflowExecutionStatus.RUNNING
    if closed and wf.status and attrs.get(sa.STATUS) not in ("completed", "stopped"):
        return wf.status.name.lower()
    return attrs.get(sa.STATUS) or ""


async def list_runs(client: Client, status: str | None, reason: str | None,
                    limit: int, root: str | None = None) -> list[dict[str, Any]]:
    """Runs newest first, filtered by the BoundloopStatus / BoundloopStopReason attributes,
    and to one agent tree by `root` (the root run's workflow id: it and every sub-agent's
    run under it, by Temporal's RootWorkflowId)."""
    clauses = [f"WorkflowType = '{WORKFLOW_NAME}'"]
    if root:
        clauses.append(f"RootWorkflowId = {literal(root)}")
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
        rows.append({
            "workflow_id": wf.id, "run_id": wf.run_id,
            # Set for a sub-agent's run (and a session's turn): the workflow that started
            # it, and the root of its tree.
            "parent": wf.parent_id,
            "root": wf.root_id if wf.root_id and wf.root_id != wf.id else None,
            "status": shown_status(wf),
            "reason": attrs.get(sa.STOP_REASON) or None,
            "steps": attrs.get(sa.STEPS) or 0,
            "tool_executions": attrs.get(sa.TOOL_EXECUTIONS) or 0,
            "pending_approvals": attrs.get(sa.PENDING_APPROVALS) or 0,
            "start_time": wf.start_time.isoformat(timespec="seconds"),
            "stuck": await stuck_of(client, wf) if not closed else None,
        })
    rows.sort(key=lambda r: r["start_time"], reverse=True)  # newest first
    return rows


async def children_now(client: Client, status: RunStatus) -> list[ChildRun]:
    """A run's sub-agents (`status.children`), each running one with its own status and
    spend so far, by its status query (its caller learns what it spent when it ends);
    as its caller sees it where no worker answers."""

    async def now(child: ChildRun) -> ChildRun:
        if child.state != "running":
            return child
        with contextlib.suppress(RPCError, TimeoutError):
            st = await asyncio.wait_for(query_status(
                client.get_workflow_handle(child.workflow_id)), timeout=QUERY_SECONDS)
            return child.model_copy(update={"state": st.status,
                                            "total_tokens": st.total_tokens,
                                            "cost_usd": st.cost_usd})
        return child

    return list(await asyncio.gather(*(now(c) for c in status.children)))


async def child_runs(client: Client, workflow_id: str) -> list[dict[str, Any]]:
    """The runs `workflow_id` started as sub-agents, oldest first, as the server lists
    them (ParentWorkflowId; no worker needed): id, status and reason by their search
    attributes. A closed run's children, when no status query tells their spend."""
    rows: list[dict[str, Any]] = []
    query = f"WorkflowType = '{WORKFLOW_NAME}' AND ParentWorkflowId = {literal(workflow_id)}"
    listed = [wf async for wf in client.list_workflows(query)]
    for wf in sorted(listed, key=lambda wf: wf.start_time):
        rows.append({
            "workflow_id": wf.id,
            # A sub-agent's run id ends with its agent's name (workflows/children.py).
            "tool": wf.id.rsplit("/", 1)[-1],
            "status": shown_status(wf),
            "reason": wf.typed_search_attributes.get(sa.STOP_REASON) or None,
            "start_time": wf.start_time.isoformat(timespec="seconds"),
        })
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
