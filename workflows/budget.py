"""The budget ledger: one long-running workflow per budget key, shared by many runs.

Runs reserve the worst case of each model request by the validated update `reserve`
(through their reserve activity: a workflow cannot send an update itself), settle it by
the signal `settle` once the response is in, and release what they hold by the signal
`release` when they end. The rules are pure (`boundloop.core.budget`); this shell keeps
the state, continues as new when Temporal suggests it (the state is small), and
releases the reservations of runs that closed without releasing (terminated, timed out).
"""

from __future__ import annotations

import builtins
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from boundloop import errors
    from boundloop.contracts import (
        BUDGET_CLOSED_RUNS_ACTIVITY,
        BUDGET_WORKFLOW,
        BudgetView,
        LedgerInput,
        ReserveRequest,
        SettleRequest,
    )
    from boundloop.core import budget
    from boundloop.core.budget import BudgetLimits, Grant


@workflow.defn(name=BUDGET_WORKFLOW)
class BudgetLedgerWorkflow:
    @workflow.init
    def __init__(self, inp: LedgerInput) -> None:
        self._inp = inp
        self._state = inp.state

    @workflow.run
    async def run(self, inp: LedgerInput) -> None:
        while not workflow.info().is_continue_as_new_suggested():
            # Idle (no run known) until a run reserves; then check on a timer.
            if not self._runs():
                await workflow.wait_condition(
                    lambda: bool(self._runs())
                    or workflow.info().is_continue_as_new_suggested())
                continue
            try:
                await workflow.wait_condition(
                    lambda: workflow.info().is_continue_as_new_suggested(),
                    timeout=timedelta(seconds=self._inp.reap_seconds))
            except builtins.TimeoutError:
                await self._reap(self._runs())
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(self._inp.model_copy(update={"state": self._state}))

    def _runs(self) -> list[str]:
        """Runs the ledger knows of: holding a reservation, or settled or refused and not
        released."""
        s = self._state
        return sorted(set(s.reservations) | set(s.settled) | set(s.refusing))

    async def _reap(self, runs: list[str]) -> None:
        closed: list[str] = await workflow.execute_activity(
            BUDGET_CLOSED_RUNS_ACTIVITY, runs, result_type=list[str],
            start_to_close_timeout=timedelta(seconds=30),
            summary=f"check {len(runs)} run(s) holding budget")
        for run in closed:
            if run in self._state.reservations:
                workflow.logger.info("released a closed run's reservation",
                                     extra={"budget": self._state.key})
            budget.release(self._state, run)

    def _today(self) -> str:
        return workflow.now().date().isoformat()

    @workflow.update
    def reserve(self, req: ReserveRequest) -> Grant:
        grant = budget.reserve(self._state, req.run, req.step, req.amount, self._today(),
                               priced=req.priced)
        if not grant.granted:
            workflow.logger.info("reservation refused", extra={"budget": self._state.key,
                                                               "step": req.step})
        return grant

    @reserve.validator
    def _validate_reserve(self, req: ReserveRequest) -> None:
        if req.amount.usd < 0 or req.amount.tokens < 0:
            raise ApplicationError("a reservation cannot be negative",
                                   type=errors.INVALID_BUDGET_MESSAGE, non_retryable=True)

    @workflow.signal
    def settle(self, req: SettleRequest) -> None:
        if req.amount.usd < 0 or req.amount.tokens < 0:
            workflow.logger.warning("negative settlement ignored",
                                    extra={"budget": self._state.key})
            return
        budget.settle(self._state, req.run, req.step, req.amount, self._today())

    @workflow.signal
    def release(self, run: str) -> None:
        budget.release(self._state, run)

    @workflow.update
    def set_limits(self, limits: BudgetLimits) -> BudgetView:
        self._state.limits = limits
        budget.roll(self._state, self._today())
        return self.show()

    @workflow.query
    def show(self) -> BudgetView:
        s = self._state
        return BudgetView(key=s.key, limits=s.limits, period=s.period, spent=s.spent,
                          reserved=budget.reserved(s), left=budget.left(s),
                          holders=sorted(s.reservations.values(), key=lambda r: r.run),
                          refused=s.refused)
