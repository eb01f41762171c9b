"""A run's sub-agents as Temporal child workflows (the driver's `RunChild`): started
under an id the call's idempotency key makes (a replay, a retried workflow task or a
worker that died never starts one twice), cancelled with their parent, each one a run
of the same loop with its own history.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from temporalio import workflow
from temporalio.common import (
    RetryPolicy,
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    ChildWorkflowError,
    WorkflowAlreadyStartedError,
    is_cancelled_exception,
)
from temporalio.workflow import ChildWorkflowCancellationType, ParentClosePolicy

from boundloop.workflows import options

with workflow.unsafe.imports_passed_through():
    from boundloop import errors
    from boundloop import search_attributes as sa
    from boundloop.activities.earlier import EarlierChild, earlier_child
    from boundloop.contracts import WORKFLOW_NAME, ChildRun, RunInput, RunResult, run_input
    from boundloop.core import driver, tree
    from boundloop.core.canonical import preview
    from boundloop.core.place import child_place
    from boundloop.core.reasons import StopReason

#: The attributes each run writes of itself: a starter does not set a session's turns'
#: or a run's sub-agents' (nor Temporal's own, `Temporal*`, which only the server sets).
_UPSERTED = frozenset(key.name for key in sa.ALL)


def starter_text_attributes() -> list[SearchAttributePair[Any]]:
    """The search attributes this workflow's starter gave it with text values (a tenant,
    or any other an operator's `budget.key_from` names): a session's turns and a run's
    sub-agents carry them as a run started with them does."""
    return [pair for pair in workflow.info().typed_search_attributes
            if isinstance(pair.value, str) and pair.key.name not in _UPSERTED
            and not pair.key.name.startswith("Temporal")]


def child_id(key: str, name: str) -> str:
    """A sub-agent run's workflow id: its call's idempotency key (this run's workflow id
    and Temporal run, the step and the call's index) and the agent's name."""
    return f"{key}/{name}"


class Children:
    """The sub-agents this Temporal run started (for `status`), and how one runs."""

    def __init__(self, inp: RunInput, add_waited: Callable[[float], None]) -> None:
        self._inp = inp
        self._add_waited = add_waited
        self.runs: list[ChildRun] = []

    async def run(self, command: driver.RunChild) -> tree.ChildEnded | tree.ChildFailed:
        """Start the sub-agent's run and wait for its end. Its time waiting for
        approvals is not this run's processing time either."""
        p, agent, settings = command.plan, command.agent, command.settings
        info = workflow.info()
        place = child_place(self._inp.tree, info.workflow_id, agent.name)
        question = str(p.arguments.get("question", ""))
        inp = run_input(question, instructions=agent.instructions, settings=settings,
                        tools=agent.tools, mcp_tools=agent.mcp_tools,
                        search_attributes=self._inp.search_attributes,
                        agents=agent.agents, tree=place)
        wf_id = child_id(p.idempotency_key, agent.name)
        record = ChildRun(workflow_id=wf_id, tool=agent.name, call_id=p.call.call_id,
                          token_allowance=settings.limits.token_threshold,
                          usd_allowance=settings.limits.usd_budget)
        self.runs.append(record)
        began = workflow.now()
        try:
            ended = await _outcome(wf_id, inp, agent.task_queue,
                                   f"{place.line()} · {preview(question, 100)}")
        except asyncio.CancelledError:
            # This run was cancelled, and its close cancels the child: its `status`
            # says so, not `running` for good.
            self.runs[self.runs.index(record)] = record.model_copy(
                update={"state": StopReason.CANCELLED.value})
            raise
        if isinstance(ended, tree.ChildEnded):
            elapsed = (workflow.now() - began).total_seconds()
            self._add_waited(max(0.0, elapsed - ended.processing_seconds))
        self._finish(record, ended)
        return ended

    def _finish(self, record: ChildRun, ended: tree.ChildEnded | tree.ChildFailed) -> None:
        done = record.model_copy(update=(
            {"state": ended.reason.value, "total_tokens": ended.total_tokens,
             "cost_usd": ended.cost_usd} if isinstance(ended, tree.ChildEnded)
            else {"state": "failed"}))
        self.runs[self.runs.index(record)] = done


async def _outcome(wf_id: str, inp: RunInput, task_queue: str, summary: str
                   ) -> tree.ChildEnded | tree.ChildFailed:
    """Start the sub-agent's run under `wf_id` and wait for its end."""
    attributes = starter_text_attributes()
    try:
        result = await workflow.execute_child_workflow(
            WORKFLOW_NAME, inp, id=wf_id, task_queue=task_queue,
            result_type=RunResult,
            static_summary=summary,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            # A cancel of this run ends it `cancelled` at once (the SDK's wait for
            # the child's end would take the cancel for the child's own). The child's
            # cancel comes from the close policy as this run closes, however it
            # closes: the request TRY_CANCEL records in the run's last workflow task
            # is dropped by the server once the run has closed.
            cancellation_type=ChildWorkflowCancellationType.TRY_CANCEL,
            parent_close_policy=ParentClosePolicy.REQUEST_CANCEL,
            search_attributes=TypedSearchAttributes(attributes) if attributes else None)
        ended: tree.ChildEnded | tree.ChildFailed = _ended(result, wf_id)
    except ChildWorkflowError as err:
        ended = _ended_of(err, wf_id)
    except WorkflowAlreadyStartedError:
        earlier = await _earlier_child(wf_id)
        # This call's own sub-agent, started before a reset of this run: what it
        # did stands (its side effects too), so its outcome is the call's.
        # Otherwise another workflow took the id first (a starter with namespace
        # access): no sub-agent of this call ran.
        ended = _ended(earlier, wf_id) if earlier is not None else tree.ChildFailed(
            "failed", f"{wf_id}: the workflow id was already used by a workflow this "
                      "run did not start")
    return ended


async def _earlier_child(wf_id: str) -> RunResult | None:
    """The RunResult of this run's own child under `wf_id`, if the workflow there is one
    (`earlier_child`, a local activity: in history, a replay does not ask again)."""
    try:
        return await workflow.execute_local_activity(
            earlier_child, EarlierChild(workflow_id=wf_id, parent=workflow.info().workflow_id),
            start_to_close_timeout=options.EARLIER_CALLS_TIMEOUT,
            retry_policy=RetryPolicy(maximum_attempts=3),  # then: a failed call
            summary=f"earlier sub-agent · {preview(wf_id, 100)}")
    except ActivityError as err:
        if is_cancelled_exception(err):
            raise asyncio.CancelledError from None
        return None


def _ended(result: RunResult, wf_id: str) -> tree.ChildEnded:
    return tree.ChildEnded(
        reason=result.reason, text=result.text, steps=result.steps,
        tool_executions=result.tool_executions, input_tokens=result.input_tokens,
        output_tokens=result.output_tokens, total_tokens=result.total_tokens,
        cost_usd=result.cost_usd, cost_units=result.cost_units,
        usage_estimated=result.usage_estimated, workflow_id=wf_id,
        processing_seconds=result.processing_seconds, usage_unknown=result.usage_unknown,
        per_tool_calls=dict(result.per_tool_calls))


def _ended_of(err: ChildWorkflowError, wf_id: str) -> tree.ChildEnded | tree.ChildFailed:
    """A child that stopped short of `completed` fails its workflow with `RunStopped`
    carrying its RunResult (docs/design.md, "How a run ends"); one refused at admission
    or terminated leaves none."""
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.type == errors.RUN_STOPPED \
            and cause.details:
        return _ended(RunResult.model_validate(cause.details[0]), wf_id)
    if isinstance(cause, ApplicationError) and cause.type in (
            errors.POLICY_REFUSED, errors.UNKNOWN_TOOLS):
        return tree.ChildFailed("refused", f"{wf_id}: {preview(cause.message, 300)}")
    if is_cancelled_exception(err):
        raise asyncio.CancelledError  # this run was cancelled (and the child with it)
    kind = cause.type if isinstance(cause, ApplicationError) else type(cause).__name__
    # It ran and left no RunResult (terminated, timed out): what it used is unknown.
    return tree.ChildFailed("failed", f"{wf_id}: {kind}", use_unknown=True)

