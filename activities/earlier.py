"""Find calls of a run's earlier Temporal runs (boundloop.core.carry), and the sub-agent
a run started before a reset (`earlier_child`).

A run that continued as new hands over, in its `WorkflowExecutionContinuedAsNew` event's
input, the segment of the whole-run tables it touched, and names the run before it that
did the same. This local activity reads those close events only (the server returns the
last event of a run's history on its own), newest first, until every key asked is found
or the chain ends. Its result is in the run's history: a replay never reads again.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError, WorkflowHistoryEventFilterType
from temporalio.exceptions import ApplicationError

from boundloop import errors
from boundloop.contracts import EARLIER_CALLS_ACTIVITY, RunInput, RunResult
from boundloop.core.carry import EarlierCalls, EarlierRequest, Segment, look_in

#: Segments read, by (workflow id, run id): a closed run's history never changes, so a
#: key the filter wrongly calls "maybe" (about 1 in 23 at 20,000 keys) reads the chain
#: from memory after its first read, not from the server again. The newest entries.
_READ: OrderedDict[tuple[str, str], tuple[Segment | None, str | None]] = OrderedDict()
READ_KEPT = 64


async def _segment_of(workflow_id: str, run_id: str) -> tuple[Segment | None, str | None]:
    """The segment a run handed over and the run before it that handed one over."""
    key = (workflow_id, run_id)
    if key in _READ:
        _READ.move_to_end(key)
        return _READ[key]
    client = activity.client()
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    found: tuple[Segment | None, str | None] = (None, None)
    async for event in handle.fetch_history_events(
            event_filter_type=WorkflowHistoryEventFilterType.CLOSE_EVENT):
        if event.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
            continue
        attrs = event.workflow_execution_continued_as_new_event_attributes
        [inp] = await client.data_converter.decode(list(attrs.input.payloads), [RunInput])
        assert isinstance(inp, RunInput)
        carried = inp.carried
        if carried is not None and carried.segment is not None:
            earlier = carried.state.earlier
            found = (carried.segment, earlier.previous if earlier is not None else None)
    _READ[key] = found
    while len(_READ) > READ_KEPT:
        _READ.popitem(last=False)
    return found


@activity.defn(name=EARLIER_CALLS_ACTIVITY)
async def earlier_calls(req: EarlierRequest) -> EarlierCalls:
    workflow_id = activity.info().workflow_id or ""
    wanted = set(req.keys)
    found = EarlierCalls()
    run: str | None = req.run_id
    while run is not None and wanted:
        segment, run = await _segment_of(workflow_id, run)
        if segment is not None:
            look_in(segment, wanted, found)
    return found


#: The activity's name (a local activity of the run workflow).
EARLIER_CHILD_ACTIVITY = "earlier_child"


@dataclass(frozen=True)
class EarlierChild:
    """A sub-agent's workflow id that its start found taken, and the calling run's."""

    workflow_id: str
    parent: str


@activity.defn(name=EARLIER_CHILD_ACTIVITY)
async def earlier_child(req: EarlierChild) -> RunResult | None:
    """The RunResult of the workflow under a sub-agent's id when it is a child of the
    calling run's workflow id: the same call's sub-agent, started by the run before a
    reset to a point ahead of its start (the server sets a workflow's parent; a starter
    cannot). Waits for its end (the reset's close policy cancels one still running).
    None when another workflow took the id, or the child left no RunResult."""
    handle = activity.client().get_workflow_handle(req.workflow_id, result_type=RunResult)
    if (await handle.describe()).parent_id != req.parent:
        return None
    try:
        value = await handle.result()
    except WorkflowFailureError as exc:
        cause = exc.cause
        if isinstance(cause, ApplicationError) and cause.type == errors.RUN_STOPPED \
                and cause.details:
            return RunResult.model_validate(cause.details[0])
        return None
    return value if isinstance(value, RunResult) else RunResult.model_validate(value)
