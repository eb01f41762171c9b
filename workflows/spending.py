"""The run's side of a shared budget (the ledger is workflows/budget.py): reserve a
step's worst case before its request, settle it after (without waiting), release what
is left when the run ends."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, is_cancelled_exception

from boundloop.workflows import options
from boundloop.workflows.budget import RUN_MESSAGES_BY_UPDATE, BudgetLedgerWorkflow

with workflow.unsafe.imports_passed_through():
    from boundloop.activities.budget import budget_release, budget_reserve, budget_settle
    from boundloop.contracts import (
        BudgetRelease,
        BudgetReserve,
        BudgetSettle,
        ReleaseRequest,
        SettleRequest,
        budget_workflow_id,
    )
    from boundloop.core import driver
    from boundloop.core import loop as core
    from boundloop.core.budget import Amount, Grant


class RunBudget:
    """The run's reservation token and the settlement in flight."""

    def __init__(self, state: core.LoopState) -> None:
        self._state = state
        self.token: str | None = None  # what the hold was reserved with
        self._settling: asyncio.Task[None] | None = None  # the settlement in flight

    async def reserve(self, command: driver.ReserveBudget) -> Grant:
        """Reserve the request's worst case from the run's shared budget, once the last
        step's usage is in; a ledger that fails refuses."""
        key, step = command.key, command.step
        await self.settled()
        try:
            grant = await workflow.execute_activity(
                budget_reserve,
                BudgetReserve(key=key, step=step, amount=command.amount, priced=command.priced),
                start_to_close_timeout=options.RESERVE_TIMEOUT,
                heartbeat_timeout=options.HEARTBEAT_TIMEOUT, retry_policy=options.LEDGER_RETRY,
                summary=f"reserve step {step} · budget {key}")
        except ActivityError as err:
            if is_cancelled_exception(err):
                raise asyncio.CancelledError from None
            grant = Grant(granted=False, message=f"budget {key!r} could not reserve step "
                          f"{step}: {getattr(err.cause, 'message', 'the ledger failed')}")
        if grant.granted:
            self.token = grant.token
        else:
            workflow.logger.info("budget refused the step", extra={"step": step})
        return grant

    def settle(self, step: int, actual: Amount) -> None:
        """Send the settlement without waiting for it: the step goes on (its tools run)
        meanwhile; the next reservation, continue-as-new and the release wait for it."""
        key = self._state.settings.budget
        if key is None:
            return
        if workflow.patched(RUN_MESSAGES_BY_UPDATE):
            self._settling = asyncio.create_task(self._ledger_activity(
                budget_settle, BudgetSettle(key=key, step=step, amount=actual,
                                                     token=self.token),
                f"settle step {step} · budget {key}"))
            return
        self._settling = asyncio.create_task(self._signal_ledger(
            key, BudgetLedgerWorkflow.settle,
            SettleRequest(run=workflow.info().workflow_id, step=step, amount=actual,
                          token=self.token)))

    async def settled(self) -> None:
        """The settlement in flight has been sent (or given up)."""
        task, self._settling = self._settling, None
        if task is not None:
            # A cancel of the run does not cancel this task; should it have been
            # cancelled anyway, the run still ends (and releases) as it would.
            await workflow.wait([task])

    async def release(self) -> None:
        """Every ending releases what the run still holds (idempotent at the ledger)."""
        key = self._state.settings.budget
        if key is not None:
            await self.settled()
            token, run = self.token, workflow.info().workflow_id
            if workflow.patched(RUN_MESSAGES_BY_UPDATE):
                await self._ledger_activity(budget_release,
                                            BudgetRelease(key=key, token=token),
                                            f"release · budget {key}", give_up=options.RELEASE_WAIT)
                return
            await self._signal_ledger(key, BudgetLedgerWorkflow.release,
                                      run if token is None else ReleaseRequest(run=run,
                                                                               token=token))

    async def _ledger_activity(self, activity: Callable[[Any], Awaitable[None]], arg: Any,
                               summary: str, give_up: timedelta = options.SETTLE_WAIT) -> None:
        """Settle or release by the activity that sends the ledger an update; a ledger
        that does not answer within `give_up` is left to find the run closed itself."""
        try:
            await workflow.execute_activity(
                activity, arg, schedule_to_close_timeout=give_up,
                heartbeat_timeout=options.HEARTBEAT_TIMEOUT, retry_policy=options.LEDGER_RETRY,
                summary=summary)
        except ActivityError as exc:
            if is_cancelled_exception(exc):
                raise asyncio.CancelledError from None
            workflow.logger.warning("budget ledger message failed", extra={
                "activity": activity.__name__, "error": type(exc.cause).__name__})

    async def _signal_ledger(self, key: str, signal: Callable[[Any, Any], None],
                             arg: object) -> None:
        try:
            await workflow.get_external_workflow_handle(budget_workflow_id(key)).signal(
                signal, arg)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the ledger is gone (terminated): nothing to settle
            workflow.logger.warning("budget ledger signal failed", extra={
                "signal": signal.__name__, "error": type(exc).__name__})

