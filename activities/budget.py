"""Activities of shared budgets: a run's reservation, settlement and release (updates to
the ledger, which a workflow cannot send itself) and the ledger's check for closed runs."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

from temporalio import activity
from temporalio.client import (
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from boundloop.activities.heartbeat import heartbeating
from boundloop.contracts import (
    BUDGET_CLOSED_RUNS_ACTIVITY,
    BUDGET_RELEASE_ACTIVITY,
    BUDGET_RESERVE_ACTIVITY,
    BUDGET_SETTLE_ACTIVITY,
    BudgetRelease,
    BudgetReserve,
    BudgetSettle,
    ReleaseRequest,
    ReserveRequest,
    SettleRequest,
    budget_workflow_id,
)
from boundloop.core.budget import Grant, claim_of
from boundloop.workflows.budget import BudgetLedgerWorkflow

#: Updates one worker process sends one ledger at once. The server takes at most 10
#: updates in flight per workflow (history.maxInFlightUpdates): 100 runs reserving at
#: once got "limit on number of concurrent in-flight updates", and under that load
#: "workflow update was aborted", each time the client's own retries ran out.
IN_FLIGHT = 8
#: Answers that leave the update unsent or unfinished, so the same update (the same id:
#: answered once) is sent again: the server's in-flight limit, an update aborted by the
#: server (a continue-as-new, a workflow task failure, a cleared update registry).
RESEND = (RPCStatusCode.RESOURCE_EXHAUSTED, RPCStatusCode.UNAVAILABLE,
          RPCStatusCode.FAILED_PRECONDITION)
_slots: dict[tuple[int, str], asyncio.Semaphore] = {}


async def send_update(handle: WorkflowHandle[Any, Any], update: Any, arg: Any,
                      update_id: str, result_type: type | None = None) -> Any:
    """`handle.execute_update`, at most IN_FLIGHT at once per ledger from this process,
    sent again (same id) while the server answers with one of RESEND: the caller sees
    the ledger's answer, never the server's load. The activity's heartbeat and timeouts
    bound it."""
    slot = _slots.setdefault((id(asyncio.get_running_loop()), handle.id),
                             asyncio.Semaphore(IN_FLIGHT))
    delay = 0.05
    while True:
        async with slot:
            try:
                return await handle.execute_update(update, arg, id=update_id,
                                                   result_type=result_type)
            except RPCError as err:
                if err.status not in RESEND:
                    raise
        await asyncio.sleep(delay)  # outside the slot: another update goes meanwhile
        delay = min(delay * 2, 1.0)


def _causes(err: BaseException) -> str:
    """The messages of `err`'s failure and its causes, to tell a ledger of before a message
    (an update it does not know, a field it refuses) from a refusal."""
    texts: list[str] = []
    cause = err.__cause__ or getattr(err, "cause", None)
    while isinstance(cause, BaseException) and len(texts) < 5:
        texts.append(str(getattr(cause, "message", cause)))
        cause = getattr(cause, "cause", None) or cause.__cause__
    return " | ".join(texts)


@activity.defn(name=BUDGET_RESERVE_ACTIVITY)
async def budget_reserve(req: BudgetReserve) -> Grant:
    """Reserve from the ledger of `req.key` for this run's request at `req.step`.

    The update id is the run and the step: a retried attempt is the same update, which
    the ledger answers once (Temporal deduplicates updates by id). It heartbeats while
    the ledger answers, so an attempt whose worker died is retried within the heartbeat
    timeout.

    The reservation is made with a random token, drawn here (workflow code has no secret
    randomness: its seed is the run id) and heartbeated first, so a retried attempt
    reserves with the same one; the ledger keeps its digest, the grant returned to the
    run carries the token, and only a settle or release carrying it counts.
    """
    info = activity.info()
    run = info.workflow_id or ""
    token = next((d for d in info.heartbeat_details if isinstance(d, str)), None) \
        if info.heartbeat_details else None
    token = token or secrets.token_hex(16)
    activity.heartbeat(token)
    handle = activity.client().get_workflow_handle(budget_workflow_id(req.key))
    ask = ReserveRequest(run=run, step=req.step, amount=req.amount, priced=req.priced,
                         token=token)
    try:
        async with heartbeating(lambda: (token,)):
            try:
                grant: Grant = await send_update(handle, BudgetLedgerWorkflow.reserve, ask,
                                                 f"{run}/step-{req.step}/reserve", Grant)
            except WorkflowUpdateFailedError as err:
                if "extra_forbidden" not in _causes(err):
                    raise
                # A ledger on a worker of before the tokens (a rolling deploy without
                # versioning): a reservation as runs of then made it, settled and
                # released by the run id.
                grant = await send_update(
                    handle, BudgetLedgerWorkflow.reserve, ask.model_copy(update={"token": None}),
                    f"{run}/step-{req.step}/reserve-untokened", Grant)
                return grant
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return Grant(granted=False, message=(
                f"budget {req.key!r} is not set: no ledger runs for it "
                f"(boundloop budget set {req.key} --usd AMOUNT)"))
        raise
    except WorkflowUpdateFailedError as err:
        raise ApplicationError(f"budget {req.key!r} refused the reservation message",
                               non_retryable=True) from err
    if grant.granted and grant.claim is not None and grant.claim != claim_of(token):
        # An earlier attempt reserved with another token (its heartbeat never reached
        # the server): this run cannot settle that reservation, so it does not spend it.
        return Grant(granted=False, message=(
            f"budget {req.key!r} holds step {req.step} of this run under another attempt's "
            "token: the request is not sent"))
    return grant.model_copy(update={"token": token})


async def _to_ledger(key: str, update: object, arg: object, update_id: str,
                     signal: object, signal_arg: object) -> None:
    """Send a run's settlement or release; a ledger that is gone or refuses it (not the
    run's open reservation, e.g. a retry of one it took already) is logged by ids. A
    ledger on a worker of before the update (a rolling deploy without versioning) gets
    the signal it knows instead."""
    handle = activity.client().get_workflow_handle(budget_workflow_id(key))
    try:
        async with heartbeating():
            await send_update(handle, update, arg, update_id)
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
        activity.logger.warning("budget ledger is gone", extra={"budget": key})
    except WorkflowUpdateFailedError as err:
        if "expected but not found" in _causes(err):
            await handle.signal(signal, signal_arg)  # type: ignore[call-overload]
            return
        activity.logger.warning("budget ledger refused the message", extra={
            "budget": key, "update_id": update_id})


@activity.defn(name=BUDGET_SETTLE_ACTIVITY)
async def budget_settle(req: BudgetSettle) -> None:
    """Settle this run's reservation of `req.step` with what the request used (an update:
    a signal racing the ledger's continue-as-new failed its workflow task)."""
    run = activity.info().workflow_id or ""
    settle = SettleRequest(run=run, step=req.step, amount=req.amount, token=req.token)
    await _to_ledger(req.key, BudgetLedgerWorkflow.settle_reservation, settle,
                     f"{run}/step-{req.step}/settle", BudgetLedgerWorkflow.settle, settle)


@activity.defn(name=BUDGET_RELEASE_ACTIVITY)
async def budget_release(req: BudgetRelease) -> None:
    """The run ended: give back what it holds."""
    run = activity.info().workflow_id or ""
    await _to_ledger(req.key, BudgetLedgerWorkflow.release_reservation,
                     ReleaseRequest(run=run, token=req.token), f"{run}/release",
                     BudgetLedgerWorkflow.release, run)


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
