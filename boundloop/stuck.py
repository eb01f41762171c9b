"""A run whose workflow task keeps failing (nondeterminism after a deploy, a missing
codec key, a bug): when, why, and what fixes it, from the server alone (no worker)."""

from __future__ import annotations

from typing import Any

from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause

__all__ = ["stuck_line"]

NONDETERMINISM = WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_NON_DETERMINISTIC_ERROR


def fix_for(cause: int, message: str) -> str:
    """What fixes a failing workflow task of this cause."""
    if cause == NONDETERMINISM:
        return ("the workers' code does not replay this run: deploy the code it started on "
                "again (docs/deploying.md; `boundloop replay-check` names what diverges)")
    if "codec" in message.lower() or "CodecKeyError" in message:
        return "give every worker the codec key this run was encrypted with " \
               "(BOUNDLOOP_CODEC_KEYS)"
    return "a bug in the workflow code (the worker log has the traceback): deploy a fix"


async def stuck_line(handle: Any, desc: Any) -> str | None:
    """`workflow task failing since …: <cause> — <fix>` for an open run whose pending
    workflow task has failed, else None."""
    pending = desc.raw_description.pending_workflow_task
    if not desc.raw_description.HasField("pending_workflow_task") or pending.attempt < 2:
        return None
    failure: Any = None
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            failure = event.workflow_task_failed_event_attributes
    if failure is None:  # timed out, not failed (a worker lost mid-task)
        return None
    since = pending.original_scheduled_time.ToDatetime().isoformat(timespec="seconds")
    message = failure.failure.message.splitlines()[0] if failure.failure.message else ""
    return (f"workflow task failing since {since}Z (attempt {pending.attempt}): {message} "
            f"— {fix_for(failure.cause, message)}")
