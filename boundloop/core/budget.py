"""A budget shared by many runs: pure ledger rules (no Temporal, no I/O).

A team gives a key (a tenant, a project, an API key) a budget in USD and/or tokens, in
total or per UTC day. Before each model request a run *reserves* the request's worst
case from the ledger; after the response it *settles* the reservation with the real
usage; when it ends it *releases* whatever it still holds. A reservation that does not
fit what is left is refused, and the run stops with `budget_limit` before the request
is sent. Because every reservation is a worst case taken before spending, the ledger's
spent total never passes the budget by more than what a request's worst case
under-estimated.

A run's workflow id is its reservation key, and the step number makes each reservation,
settlement and release idempotent: a retried or replayed message changes nothing.

Under claims (`reserve_claimed`, `settle_claimed`, `release_claimed`), only the run that
holds a reservation spends it: the reservation keeps the digest of a random token the
run's reserve activity drew (`claim_of`), and a settlement or release counts only for
that open (run, step) with that token. A reservation is always checked against the
limits, a settlement's amount is bounded by its reservation, and nothing else (an
unknown run or step, a wrong token, an earlier settlement) changes what is spent.
"""

from __future__ import annotations

import hashlib
import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from boundloop.core.limits import USD, PositiveInt, Price
from boundloop.core.retries import MODEL_BACKOFF

Period = Literal["total", "day"]


class BudgetLimits(BaseModel):
    """What a budget key may spend: USD and/or tokens, in total or per UTC day."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    usd: USD | None = None
    tokens: PositiveInt | None = None
    period: Period = "total"

    @model_validator(mode="after")
    def _something_to_limit(self) -> BudgetLimits:
        if self.usd is None and self.tokens is None:
            raise ValueError("a budget needs a USD amount, a token amount, or both")
        return self


class Amount(BaseModel):
    """USD and tokens, spent or reserved."""

    model_config = ConfigDict(frozen=True)

    usd: float = 0.0
    tokens: int = 0

    def __add__(self, other: Amount) -> Amount:
        return Amount(usd=self.usd + other.usd, tokens=self.tokens + other.tokens)


class Reservation(BaseModel):
    """One run's open reservation: the worst case of its next model request."""

    model_config = ConfigDict(frozen=True)

    run: str
    step: int
    amount: Amount
    #: sha256 of the token the run reserved with (`claim_of`); None: a reservation of a
    #: run (or ledger) of before claims, settled and released by the run id alone.
    claim: str | None = Field(default=None, exclude_if=lambda v: v is None)


class Grant(BaseModel):
    """The ledger's answer to a reservation."""

    model_config = ConfigDict(frozen=True)

    granted: bool
    message: str = ""
    #: The claim (digest) the granted reservation is held under (None: no claim).
    claim: str | None = Field(default=None, exclude_if=lambda v: v is None)
    #: Set by the run's reserve activity, never by the ledger: the token whose digest is
    #: the claim, which the run's settle and release carry.
    token: str | None = Field(default=None, exclude_if=lambda v: v is None)


class LedgerState(BaseModel):
    """Everything a ledger carries (across continue-as-new). Small: it grows with the
    runs holding a reservation, not with the runs that ever spent."""

    key: str
    #: None: no limits set yet (every reservation is refused until they are).
    limits: BudgetLimits | None
    period: str = "total"  # "total", or the UTC date the spent figures belong to
    spent: Amount = Field(default_factory=Amount)
    reservations: dict[str, Reservation] = Field(default_factory=dict)
    # run -> the last step it settled (idempotency of settle and of late reserves)
    settled: dict[str, int] = Field(default_factory=dict)
    # run -> the step refused, until the run releases: a retried refusal (an update sent
    # again after continue-as-new aborted it) is not counted twice.
    refusing: dict[str, int] = Field(default_factory=dict)
    refused: int = 0
    #: nonce -> signed_at of the signed limit changes applied lately: a signature
    #: replayed while it is still valid changes nothing.
    nonces: dict[str, int] = Field(default_factory=dict)


def worst_case(price: Price | None, input_tokens: int, max_output_tokens: int) -> Amount:
    """A request's worst case: every input token plus the most output it may produce."""
    tokens = input_tokens + max_output_tokens
    usd = 0.0 if price is None else (input_tokens * price.input_usd_per_mtok
                                     + max_output_tokens * price.output_usd_per_mtok) / 1e6
    return Amount(usd=usd, tokens=tokens)


def input_tokens_bound(*, conversation_bytes: int, fixed_bytes: int,
                       last_tokens: int | None, last_bytes: int) -> int:
    """The most input tokens the next request can hold.

    A token is at least one byte of UTF-8, so bytes bound tokens. After a response whose
    usage the provider reported, the next request is that request plus its answer
    (`last_tokens`: input + output tokens as counted) plus what was added since (the
    conversation's JSON bytes past `last_bytes`, one token per byte). Before the first
    response, or after one with no usage, it is every byte of the request: the
    conversation's JSON, the instructions and the tool declarations (`fixed_bytes`).
    """
    if last_tokens is None:
        return fixed_bytes + conversation_bytes
    return last_tokens + max(0, conversation_bytes - last_bytes)


def settlement(reserved: Amount, tokens: int, usd: float, usage_known: bool) -> Amount:
    """What a request really used: the run's own count of it (reported, or estimated by
    policy); with no usage at all, the whole reservation (it may all have been spent)."""
    return Amount(usd=usd, tokens=tokens) if usage_known else reserved


def period_of(limits: BudgetLimits | None, today: str) -> str:
    return today if limits is not None and limits.period == "day" else "total"


def roll(state: LedgerState, today: str) -> None:
    """Start a new period when the day changed (reservations carry over: they are
    requests in flight, settled into the period they finish in)."""
    period = period_of(state.limits, today)
    if period != state.period:
        state.period = period
        state.spent = Amount()


def reserved(state: LedgerState, *, excluding: str | None = None) -> Amount:
    total = Amount()
    for run, r in state.reservations.items():
        if run != excluding:
            total = total + r.amount
    return total


def left(state: LedgerState) -> Amount:
    """What is left after spending and open reservations (negative when over)."""
    held = reserved(state)
    lim = state.limits
    if lim is None:
        return Amount()
    return Amount(usd=(lim.usd - state.spent.usd - held.usd) if lim.usd is not None else 0.0,
                  tokens=(lim.tokens - state.spent.tokens - held.tokens)
                  if lim.tokens is not None else 0)


def reserve(state: LedgerState, run: str, step: int, amount: Amount, today: str, *,
            priced: bool = True) -> Grant:
    """Hold `amount` for `run`'s request at `step`, or refuse it with the reason.

    `priced` is False when the run's model has no price: its USD cost is unknown, so a
    USD-limited budget cannot let it spend.
    """
    roll(state, today)
    held = state.reservations.get(run)
    if held is not None and held.step == step:
        return Grant(granted=True)  # a retried reserve: already held
    if state.settled.get(run, 0) >= step:
        return Grant(granted=True)  # a late duplicate of a step already settled
    others = reserved(state, excluding=run)
    lim = state.limits
    problems = (["it has no limits set yet (boundloop budget set "
                 f"{state.key} --usd AMOUNT)"] if lim is None
                else _over(lim, state, others, amount, priced))
    if problems:
        return _refused(state, run, step, problems)
    # An older reservation of the same run was never settled (its request failed):
    # the new one replaces it.
    state.reservations[run] = Reservation(run=run, step=step, amount=amount)
    return Grant(granted=True)


def _over(lim: BudgetLimits, state: LedgerState, others: Amount, amount: Amount,
          priced: bool) -> list[str]:
    problems: list[str] = []
    if lim.usd is not None and not priced:
        problems.append(f"USD budget {lim.usd:g}{_per(lim)}: the run's model has no price "
                        "in its price table, so its cost cannot be counted")
    if lim.usd is not None and state.spent.usd + others.usd + amount.usd > lim.usd:
        problems.append(
            f"USD budget {lim.usd:g}{_per(lim)}: spent {state.spent.usd:.6f}, reserved by "
            f"other runs {others.usd:.6f}, this request needs up to {amount.usd:.6f}")
    if (lim.tokens is not None
            and state.spent.tokens + others.tokens + amount.tokens > lim.tokens):
        problems.append(
            f"token budget {lim.tokens}{_per(lim)}: spent {state.spent.tokens}, reserved by "
            f"other runs {others.tokens}, this request needs up to {amount.tokens}")
    return problems


def settle(state: LedgerState, run: str, step: int, actual: Amount, today: str) -> None:
    """Turn `run`'s reservation for `step` into what the request really used."""
    roll(state, today)
    if state.settled.get(run, 0) >= step:
        return  # settled already
    held = state.reservations.get(run)
    if held is not None and held.step <= step:
        del state.reservations[run]
    # Real usage counts even when the reservation was released meanwhile.
    state.spent = state.spent + actual
    state.settled[run] = step


def release(state: LedgerState, run: str) -> None:
    """The run ended (or was found closed): drop what it still holds."""
    state.reservations.pop(run, None)
    state.settled.pop(run, None)
    state.refusing.pop(run, None)


def _per(limits: BudgetLimits) -> str:
    return " per day" if limits.period == "day" else ""


# --- claims: only the run holding a reservation spends it -------------------------------

#: A settlement may pass its reservation this many times: each model attempt of the step
#: that reached the provider without an answer is charged its worst case, and the answer
#: once more (a provider may count more than the worst case). Beyond, it is no usage but
#: a forged or broken figure: the ledger charges the reservation instead.
SETTLE_FACTOR = float(MODEL_BACKOFF.max_attempts + 1)
#: Tokens are 128-bit random hex (the reserve activity's `secrets.token_hex(16)`).
TOKEN_PATTERN = r"^[0-9a-f]{32}$"


def claim_of(token: str) -> str:
    """The digest a reservation keeps of its run's token: the ledger's state, query and
    continue-as-new input never carry the token itself."""
    return hashlib.sha256(token.encode("ascii", "replace")).hexdigest()


#: The largest amount a ledger holds or charges in one message, in each dimension, with
#: a limit on it or not: a sum of such amounts stays finite (a dimension without a limit
#: was otherwise driven to infinity, which broke the ledger's view and its continuation).
MAX_USD = 1e9
MAX_TOKENS = 10**12
#: The most runs a ledger keeps at once (holding, settled or refused, until released or
#: reaped): its check of closed runs sends their ids in one activity input.
MAX_RUNS = 2000


def amount_problem(amount: Amount) -> str | None:
    """Why `amount` is no amount a ledger may hold or charge (not finite, negative, over
    MAX_USD or MAX_TOKENS), or None. Worded without the figures: they may be anyone's."""
    if not (math.isfinite(amount.usd) and 0 <= amount.usd <= MAX_USD
            and 0 <= amount.tokens <= MAX_TOKENS):
        return "not a finite, non-negative amount within the ledger's bounds"
    return None


def known_runs(state: LedgerState) -> set[str]:
    """The runs a ledger keeps: holding a reservation, settled or refused, not released."""
    return set(state.reservations) | set(state.settled) | set(state.refusing)


def _within(actual: Amount, held: Amount) -> bool:
    return (actual.usd <= held.usd * SETTLE_FACTOR
            and actual.tokens <= held.tokens * SETTLE_FACTOR)


def reserve_claimed(state: LedgerState, run: str, step: int, amount: Amount, today: str, *,
                    priced: bool = True, token: str | None = None) -> Grant:
    """`reserve`, where only the run's own messages spend its reservation.

    The reservation is always checked against the limits: an earlier settlement of the
    run's (anyone's signal, before) never waves it through. A run holds one reservation
    at a time: the same (step, amount, token) again is a retry, granted as held; anything
    else while one is held is refused and changes nothing (a third party cannot replace
    the run's reservation with a smaller one, or learn its token). A step the run settled
    already is refused as stale. `token` None: a run of before claims (its reserve
    activity drew none).
    """
    roll(state, today)
    claim = None if token is None else claim_of(token)
    if run not in known_runs(state) and len(known_runs(state)) >= MAX_RUNS:
        # Not kept, not counted: the ledger's state stays bounded.
        return Grant(granted=False, message=f"budget {state.key!r} refused step {step}: it "
                     f"keeps {MAX_RUNS} runs already; try again once some have ended")
    problem = amount_problem(amount)
    held = state.reservations.get(run)
    if problem is None and held is not None:
        if held.step == step and held.amount == amount and held.claim == claim:
            return Grant(granted=True, claim=claim)  # a retried reserve: already held
        problem = (f"the run already holds a reservation (step {held.step}): a run "
                   "reserves one request at a time")
    if problem is None and state.settled.get(run, 0) >= step:
        problem = f"step {step} of this run was settled already"
    lim = state.limits
    problems = ([problem] if problem is not None
                else ["it has no limits set yet (boundloop budget set "
                      f"{state.key} --usd AMOUNT)"] if lim is None
                else _over(lim, state, reserved(state, excluding=run), amount, priced))
    if problems:
        return _refused(state, run, step, problems)
    state.reservations[run] = Reservation(run=run, step=step, amount=amount, claim=claim)
    return Grant(granted=True, claim=claim)


def _refused(state: LedgerState, run: str, step: int, problems: list[str]) -> Grant:
    """A refusal of `run`'s `step`, counted once however often the run asks again."""
    if state.refusing.get(run) != step:
        state.refusing[run] = step
        state.refused += 1
    return Grant(granted=False, message=f"budget {state.key!r} refused step {step}: "
                 + "; ".join(problems))


def settle_problem(state: LedgerState, run: str, step: int, token: str | None) -> str | None:
    """Why a settlement of `run`'s `step` is not the run's own (no open reservation of
    that step, or not its token), or None. Worded without the token."""
    held = state.reservations.get(run)
    if held is None or held.step != step:
        return f"no open reservation of step {step} of this run"
    if held.claim is not None and (token is None or claim_of(token) != held.claim):
        return "not the token the reservation was made with"
    return None


def settle_claimed(state: LedgerState, run: str, step: int, actual: Amount, today: str, *,
                   token: str | None = None) -> str | None:
    """Turn `run`'s open reservation of `step` into what its request used, when the
    settlement is the run's own (`settle_problem`); else change nothing and say why.

    An amount that is no amount (negative, not finite) or passes the reservation by more
    than SETTLE_FACTOR is not added: the reservation's own worst case is charged instead
    (the request was sent and answered: it may have cost that much). Returns None when the
    run's figure was charged, else why not (the caller logs it; no figure in it).
    """
    problem = settle_problem(state, run, step, token)
    if problem is not None:
        return problem
    roll(state, today)
    held = state.reservations.pop(run)
    state.settled[run] = step
    if amount_problem(actual) is not None or not _within(actual, held.amount):
        state.spent = state.spent + held.amount
        return "the amount was out of bounds: the reservation's worst case was charged"
    state.spent = state.spent + actual
    return None


def release_claimed(state: LedgerState, run: str, token: str | None = None) -> bool:
    """The run ended: drop what it holds, if the release is its own (a reservation made
    with a token is dropped only with it: a third party's release would free it before
    the run settles). False when a reservation stays (the ledger's check for closed runs
    drops it once the run has ended)."""
    held = state.reservations.get(run)
    if held is not None and held.claim is not None and (
            token is None or claim_of(token) != held.claim):
        return False
    release(state, run)
    return True


class BudgetReset(BaseModel):
    """An operator's recovery of a ledger after an incident (`boundloop budget reset`):
    spent back to zero, and the reservations of the runs named dropped."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    spent: bool = True
    drop: list[str] = Field(default_factory=list, max_length=1000)


def reset(state: LedgerState, change: BudgetReset) -> None:
    if change.spent:
        state.spent = Amount()
    for run in change.drop:
        release(state, run)


def carried_state(key: str, state: LedgerState, *, continued: bool, cron: bool,
                  attempt: int) -> LedgerState:
    """What a ledger starts from: the state its own continue-as-new carried, or an empty
    one. A start input is anyone's (whoever may start a workflow writes it), and so is
    the input a cron schedule or a retry hands the next run (that run also has a
    `continued_run_id`): only a continue-as-new (no cron schedule, first attempt) carries
    the ledger's own state. The key is always the workflow id's."""
    if continued and not cron and attempt == 1 and state.key == key:
        return state
    return LedgerState(key=key, limits=None)


def irregular_start(*, timeout: bool, cron: bool, retry: bool) -> str | None:
    """Why a ledger's workflow is not one boundloop started, or None. boundloop starts a
    ledger with no timeout, cron schedule or retry policy: a ledger started with one
    (anyone with namespace access may start it first) would end, or start over empty,
    when its starter chose."""
    if timeout or cron or retry:
        what = "a timeout" if timeout else "a cron schedule" if cron else "a retry policy"
        return (f"the ledger's workflow was started with {what}, which boundloop never "
                "sets: terminate it (temporal workflow terminate --workflow-id …), then set "
                "the budget again")
    return None
