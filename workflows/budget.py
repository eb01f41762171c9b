"""The budget ledger: one long-running workflow per budget key, shared by many runs.

Runs reserve the worst case of each model request by the validated update `reserve`
(through their reserve activity: a workflow cannot send an update itself), settle it by
the signal `settle` once the response is in, and release what they hold by the signal
`release` when they end. The rules are pure (`boundloop.core.budget`); this shell keeps
the state, continues as new when Temporal suggests it (the state is small), and
releases the reservations of runs that closed without releasing (terminated, timed out).

Limits are set only by the validated updates `set_limits` (refused where the serving
worker has approver keys) and `set_signed_limits` (a budget admin's signature): a new
ledger ignores the limits of its start input, which anyone who may start a workflow
controls, and refuses every reservation until its limits are set.
"""

from __future__ import annotations

import builtins
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ApplicationError

from boundloop.workflows import SANDBOXED

with workflow.unsafe.imports_passed_through():
    from boundloop import errors
    from boundloop.contracts import (
        BUDGET_CLOSED_RUNS_ACTIVITY,
        BUDGET_WORKFLOW,
        BudgetView,
        LedgerInput,
        ReserveRequest,
        SettleRequest,
        SignedLimits,
    )
    from boundloop.core import budget, signatures
    from boundloop.core.budget import BudgetLimits, Grant
    from boundloop.tools import catalog

#: The patch under which a new ledger starts without limits (its start input's are
#: ignored: only the validated updates set them).
SIGNED_LIMITS = "budget-limits-by-update"


@workflow.defn(name=BUDGET_WORKFLOW, sandboxed=SANDBOXED)
class BudgetLedgerWorkflow:
    @workflow.init
    def __init__(self, inp: LedgerInput) -> None:
        self._inp = inp
        self._state = inp.state
        if workflow.info().continued_run_id is None and workflow.patched(SIGNED_LIMITS):
            self._state = inp.state.model_copy(update={"limits": None})

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
        return self._apply(limits)

    def _apply(self, limits: BudgetLimits) -> BudgetView:
        self._state.limits = limits
        budget.roll(self._state, self._today())
        return self.show()

    @set_limits.validator
    def _validate_set_limits(self, limits: BudgetLimits) -> None:
        # Read in the validator only (it never runs on replay): the worker's own keys.
        admins = catalog.served_on(workflow.info().task_queue).budget_admins
        if admins is not None:
            raise ApplicationError(signatures.unsigned_budget_change(admins, self._state.key),
                                   type=errors.BUDGET_UNSIGNED, non_retryable=True)

    @workflow.update
    def set_signed_limits(self, req: SignedLimits) -> BudgetView:
        now = int(workflow.now().timestamp())
        self._state.nonces = {n: at for n, at in self._state.nonces.items()
                              if now - at <= signatures.MAX_AGE_SECONDS}
        self._state.nonces[req.nonce] = req.signature.signed_at
        return self._apply(req.limits)

    @set_signed_limits.validator
    def _validate_set_signed_limits(self, req: SignedLimits) -> None:
        admins = catalog.served_on(workflow.info().task_queue).budget_admins
        if admins is None:
            return  # no approver keys configured: namespace access sets limits
        info = workflow.info()
        problem = signatures.budget_problem(
            admins, namespace=info.namespace, key=self._state.key,
            limits=req.limits.model_dump(mode="json"), admin=req.admin, nonce=req.nonce,
            signature=req.signature, now=workflow.now(), applied=self._state.nonces)
        if problem is not None:
            raise ApplicationError(f"budget {self._state.key!r} refused the change: {problem}",
                                   type=errors.BUDGET_UNSIGNED, non_retryable=True)

    @workflow.query
    def show(self) -> BudgetView:
        s = self._state
        return BudgetView(key=s.key, limits=s.limits, period=s.period, spent=s.spent,
                          reserved=budget.reserved(s), left=budget.left(s),
                          holders=sorted(s.reservations.values(), key=lambda r: r.run),
                          refused=s.refused)
