"""Find calls of a run's earlier Temporal runs (boundloop.core.carry).

A run that continued as new hands over, in its `WorkflowExecutionContinuedAsNew` event's
input, the segment of the whole-run tables it touched, and names the run before it that
did the same. This local activity reads those close events only (the server returns the
last event of a run's history on its own), newest first, until every key asked is found
or the chain ends. Its result is in the run's history: a replay never reads again.
"""

from __future__ import annotations

from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistoryEventFilterType

from boundloop.contracts import EARLIER_CALLS_ACTIVITY, RunInput
from boundloop.core.carry import EarlierCalls, EarlierRequest, look_in


@activity.defn(name=EARLIER_CALLS_ACTIVITY)
async def earlier_calls(req: EarlierRequest) -> EarlierCalls:
    client = activity.client()
    workflow_id = activity.info().workflow_id or ""
    wanted = set(req.keys)
    found = EarlierCalls()
    run: str | None = req.run_id
    while run is not None and wanted:
        handle = client.get_workflow_handle(workflow_id, run_id=run)
        run = None
        async for event in handle.fetch_history_events(
                event_filter_type=WorkflowHistoryEventFilterType.CLOSE_EVENT):
            if event.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
                continue
            attrs = event.workflow_execution_continued_as_new_event_attributes
            [inp] = await client.data_converter.decode(list(attrs.input.payloads), [RunInput])
            assert isinstance(inp, RunInput)
            carried = inp.carried
            if carried is None or carried.segment is None:
                continue
            look_in(carried.segment, wanted, found)
            earlier = carried.state.earlier
            run = earlier.previous if earlier is not None else None
    return found
