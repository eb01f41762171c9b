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

Under LEDGER_CLAIMS, only the run holding a reservation spends it (docs/security.md,
"Budget ledger"): a settle or release counts for that run's open reservation with the
token it reserved with; runs settle and release by validated updates (a signal racing
the continue-as-new failed its workflow task, and that aborted every update in flight);
a ledger keeps only the state its own continue-as-new carried; and `reset` (a budget
admin's signature) is how an operator recovers a ledger.
"""

from __future__ import annotations

import builtins
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ApplicationError

from boundloop.workflows import SANDBOXED, options

with workflow.unsafe.imports_passed_through():
    from boundloop import errors
    from boundloop.contracts import (
        BUDGET_CLOSED_RUNS_ACTIVITY,
        BUDGET_WORKFLOW,
        BudgetView,
        LedgerInput,
        ReleaseRequest,
        ReserveRequest,
        SettleRequest,
        SignedLimits,
        SignedReset,
        budget_key_of,
    )
    from boundloop.core import budget, signatures
    from boundloop.core.budget import BudgetLimits, Grant
    from boundloop.tools import catalog

#: The patch under which a new ledger starts without limits (its start input's are
#: ignored: only the validated updates set them).
SIGNED_LIMITS = "budget-limits-by-update"
#: The patch under which a ledger keeps only what its own continue-as-new carried, checks
#: every reservation against its limits, and counts a settle or release only for the
#: open reservation of that run with its token (`boundloop.core.budget`, claims). A
#: ledger that started before it keeps the rules it started with until it continues as
#: new; the first message of a run of after it (a token) makes it continue as new.
LEDGER_CLAIMS = "budget-claims"
#: The patch under which a run settles and releases by an update its activity sends (with
#: the token of its reservation), not by a signal (workflows/loop.py asks it).
RUN_MESSAGES_BY_UPDATE = "budget-messages-by-update"


@workflow.defn(name=BUDGET_WORKFLOW, sandboxed=SANDBOXED)
class BudgetLedgerWorkflow:
    @workflow.init
    def __init__(self, inp: LedgerInput) -> None:
        self._inp = inp
        self._state = inp.state
        info = workflow.info()
        self._claims = workflow.patched(LEDGER_CLAIMS)
        # Set by a message only a ledger of LEDGER_CLAIMS knows: continue as new onto it.
        self._upgrade = False
        if self._claims:
            self._state = budget.carried_state(
                budget_key_of(info.workflow_id), inp.state,
                continued=info.continued_run_id is not None,
                cron=bool(info.cron_schedule), attempt=info.attempt)
        elif info.continued_run_id is None and workflow.patched(SIGNED_LIMITS):
            self._state = inp.state.model_copy(update={"limits": None})
        # Messages are refused while the ledger is not one boundloop started as it is
        # (a timeout, a cron schedule, a retry policy: its starter would decide when it
        # ends or starts over empty). Timeouts are read at the first run only: Temporal
        # gives a continued run one of its own, and the first run of a ledger started
        # with one refused every message, so it never continues as new.
        self._irregular = budget.irregular_start(
            timeout=info.continued_run_id is None and (
                info.execution_timeout is not None or info.run_timeout is not None),
            cron=bool(info.cron_schedule),
            retry=info.retry_policy is not None)

    @workflow.run
    async def run(self, inp: LedgerInput) -> None:
        while not self._continuing():
            # Idle (no run known) until a run reserves; then check on a timer.
            if not self._runs():
                await workflow.wait_condition(
                    lambda: bool(self._runs()) or self._continuing())
                continue
            try:
                await workflow.wait_condition(
                    self._continuing, timeout=timedelta(seconds=self._inp.reap_seconds))
            except builtins.TimeoutError:
                await self._reap(self._runs())
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(self._inp.model_copy(update={"state": self._state}))

    def _continuing(self) -> bool:
        return self._upgrade or workflow.info().is_continue_as_new_suggested()

    def _runs(self) -> list[str]:
        """Runs the ledger knows of: holding a reservation, or settled or refused and not
        released."""
        s = self._state
        return sorted(set(s.reservations) | set(s.settled) | set(s.refusing))

    async def _reap(self, runs: list[str]) -> None:
        # By name, not by reference: its module (activities/budget.py) sends this
        # workflow's updates by reference, so importing it here would be an import circle.
        closed: list[str] = await workflow.execute_activity(
            BUDGET_CLOSED_RUNS_ACTIVITY, runs, result_type=list[str],
            start_to_close_timeout=options.CLOSED_RUNS_TIMEOUT,
            summary=f"check {len(runs)} run(s) holding budget")
        for run in closed:
            if run in self._state.reservations:
                workflow.logger.info("released a closed run's reservation",
                                     extra={"budget": self._state.key})
            budget.release(self._state, run)  # the run ended: its token is no longer needed

    def _today(self) -> str:
        return workflow.now().date().isoformat()

    @workflow.update
    def reserve(self, req: ReserveRequest) -> Grant:
        if self._claims:
            grant = budget.reserve_claimed(self._state, req.run, req.step, req.amount,
                                           self._today(), priced=req.priced, token=req.token)
        else:
            self._upgrade = self._upgrade or req.token is not None
            grant = budget.reserve(self._state, req.run, req.step, req.amount, self._today(),
                                   priced=req.priced)
        if not grant.granted:
            workflow.logger.info("reservation refused", extra={"budget": self._state.key,
                                                               "step": req.step})
        return grant

    def _refuse_if_irregular(self) -> None:
        if self._irregular is not None:
            raise ApplicationError(f"budget {self._state.key!r}: {self._irregular}",
                                   type=errors.INVALID_BUDGET_MESSAGE, non_retryable=True)

    @reserve.validator
    def _validate_reserve(self, req: ReserveRequest) -> None:
        self._refuse_if_irregular()
        # NaN passes every comparison with a limit: it would be granted, and then every
        # reservation after it.
        if budget.amount_problem(req.amount) is not None:
            raise ApplicationError("a reservation must be a finite, non-negative amount",
                                   type=errors.INVALID_BUDGET_MESSAGE, non_retryable=True)

    @workflow.signal
    def settle(self, req: SettleRequest) -> None:
        """A run of before the settle update settles by this signal (so may anyone)."""
        if self._claims:
            self._settle(req)
            return
        if req.amount.usd < 0 or req.amount.tokens < 0:
            workflow.logger.warning("negative settlement ignored",
                                    extra={"budget": self._state.key})
            return
        budget.settle(self._state, req.run, req.step, req.amount, self._today())

    def _settle(self, req: SettleRequest) -> None:
        problem = budget.settle_claimed(self._state, req.run, req.step, req.amount,
                                        self._today(), token=req.token)
        if problem is not None:  # ids only: the figures and the token may be anyone's
            workflow.logger.warning("settlement not charged as sent", extra={
                "budget": self._state.key, "run": req.run, "step": req.step,
                "problem": problem})

    @workflow.update
    def settle_reservation(self, req: SettleRequest) -> None:
        """A run's settlement (its settle activity): charged only to its open reservation
        of that step, made with the same token."""
        self._upgrade = self._upgrade or not self._claims
        self._settle(req)

    @settle_reservation.validator
    def _validate_settle(self, req: SettleRequest) -> None:
        # Refused here, a message that is not the run's own leaves no trace in history.
        problem = budget.settle_problem(self._state, req.run, req.step, req.token)
        if problem is not None:
            raise ApplicationError(f"budget {self._state.key!r} refused the settlement: "
                                   f"{problem}", type=errors.INVALID_BUDGET_MESSAGE,
                                   non_retryable=True)

    @workflow.signal
    def release(self, req: str | ReleaseRequest) -> None:
        """A run's release by signal: a run id from runs of before ReleaseRequest."""
        req = req if isinstance(req, ReleaseRequest) else ReleaseRequest(run=req)
        if not self._claims:
            budget.release(self._state, req.run)
        elif not budget.release_claimed(self._state, req.run, req.token):
            workflow.logger.warning("release without the reservation's token ignored",
                                    extra={"budget": self._state.key, "run": req.run})

    @workflow.update
    def release_reservation(self, req: ReleaseRequest) -> None:
        """A run's release (its release activity): what it holds goes back."""
        self._upgrade = self._upgrade or not self._claims
        budget.release_claimed(self._state, req.run, req.token)

    @release_reservation.validator
    def _validate_release(self, req: ReleaseRequest) -> None:
        held = self._state.reservations.get(req.run)
        if held is not None and held.claim is not None and (
                req.token is None or budget.claim_of(req.token) != held.claim):
            raise ApplicationError(f"budget {self._state.key!r} refused the release: not "
                                   "the token the reservation was made with",
                                   type=errors.INVALID_BUDGET_MESSAGE, non_retryable=True)

    @workflow.update
    def set_limits(self, limits: BudgetLimits) -> BudgetView:
        return self._apply(limits)

    def _apply(self, limits: BudgetLimits) -> BudgetView:
        self._state.limits = limits
        budget.roll(self._state, self._today())
        return self.show()

    @set_limits.validator
    def _validate_set_limits(self, limits: BudgetLimits) -> None:
        self._refuse_if_irregular()
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
        self._refuse_if_irregular()
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

    @workflow.update
    def reset(self, req: SignedReset) -> BudgetView:
        """An operator's recovery after an incident: spent back to zero and/or the named
        runs' reservations dropped (validated: a budget admin's signature where the
        workers have approver keys)."""
        self._upgrade = self._upgrade or not self._claims
        if req.nonce is not None and req.signature is not None:
            self._remember(req.nonce, req.signature.signed_at)
        budget.reset(self._state, req.reset)
        workflow.logger.info("budget reset", extra={"budget": self._state.key,
                                                    "admin": req.admin})
        return self.show()

    @reset.validator
    def _validate_reset(self, req: SignedReset) -> None:
        admins = catalog.served_on(workflow.info().task_queue).budget_admins
        if admins is None:
            return  # no approver keys configured: namespace access resets, as it sets
        if req.admin is None or req.nonce is None or req.signature is None:
            raise ApplicationError(
                signatures.unsigned_budget_change(admins, self._state.key),
                type=errors.BUDGET_UNSIGNED, non_retryable=True)
        problem = signatures.budget_problem(
            admins, namespace=workflow.info().namespace, key=self._state.key,
            limits=req.reset.model_dump(mode="json"), admin=req.admin, nonce=req.nonce,
            signature=req.signature, now=workflow.now(), applied=self._state.nonces,
            purpose=signatures.BUDGET_RESET_PURPOSE)
        if problem is not None:
            raise ApplicationError(f"budget {self._state.key!r} refused the reset: {problem}",
                                   type=errors.BUDGET_UNSIGNED, non_retryable=True)

    def _remember(self, nonce: str, signed_at: int) -> None:
        now = int(workflow.now().timestamp())
        self._state.nonces = {n: at for n, at in self._state.nonces.items()
                              if now - at <= signatures.MAX_AGE_SECONDS}
        self._state.nonces[nonce] = signed_at

    @workflow.query
    def show(self) -> BudgetView:
        s = self._state
        # Without the claims: a digest tells nothing, but the view is the figures.
        holders = [r.model_copy(update={"claim": None}) for r in s.reservations.values()]
        return BudgetView(key=s.key, limits=s.limits, period=s.period, spent=s.spent,
                          reserved=budget.reserved(s), left=budget.left(s),
                          holders=sorted(holders, key=lambda r: r.run),
                          refused=s.refused)
