"""Activities of shared budgets: a run's reservation (an update to the ledger, which a
workflow cannot send itself) and the ledger's check for closed runs."""

from __future__ import annotations

from temporalio import activity
from temporalio.client import WorkflowExecutionStatus, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from boundloop.activities.heartbeat import heartbeating
from boundloop.contracts import (
    BUDGET_CLOSED_RUNS_ACTIVITY,
    BUDGET_RESERVE_ACTIVITY,
    BudgetReserve,
    ReserveRequest,
    budget_workflow_id,
)
from boundloop.core.budget import Grant
from boundloop.workflows.budget import BudgetLedgerWorkflow


@activity.defn(name=BUDGET_RESERVE_ACTIVITY)
async def budget_reserve(req: BudgetReserve) -> Grant:
    """Reserve from the ledger of `req.key` for this run's request at `req.step`.

    The update id is the run and the step: a retried attempt is the same update, which
    the ledger answers once (Temporal deduplicates updates by id). It heartbeats while
    the ledger answers, so an attempt whose worker died is retried within the heartbeat
    timeout.
    """
    info = activity.info()
    run = info.workflow_id or ""
    handle = activity.client().get_workflow_handle(budget_workflow_id(req.key))
    try:
        async with heartbeating():
            grant = await handle.execute_update(
                BudgetLedgerWorkflow.reserve,
                ReserveRequest(run=run, step=req.step, amount=req.amount, priced=req.priced),
                id=f"{run}/step-{req.step}/reserve")
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return Grant(granted=False, message=(
                f"budget {req.key!r} is not set: no ledger runs for it "
                f"(boundloop budget set {req.key} --usd AMOUNT)"))
        raise
    except WorkflowUpdateFailedError as err:
        raise ApplicationError(f"budget {req.key!r} refused the reservation message",
                               non_retryable=True) from err
    return grant


@activity.defn(name=BUDGET_CLOSED_RUNS_ACTIVITY)
async def budget_closed_runs(runs: list[str]) -> list[str]:
    """The runs among `runs` that are no longer open (or never existed)."""
    client = activity.client()
    closed: list[str] = []
    for run in runs:
        try:
            desc = await client.get_workflow_handle(run).describe()
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            closed.append(run)
            continue
        if desc.status != WorkflowExecutionStatus.RUNNING:
            closed.append(run)
    return closed
