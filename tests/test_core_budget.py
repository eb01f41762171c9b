"""The shared-budget ledger's pure rules: reserve, settle, release, periods."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from boundloop.core import budget
from boundloop.core.budget import Amount, BudgetLimits, LedgerState
from boundloop.core.limits import Price

DAY = "2026-12-01"


def ledger(**limits: object) -> LedgerState:
    return LedgerState(key="team-a", limits=BudgetLimits.model_validate(limits))


def test_a_budget_needs_an_amount() -> None:
    with pytest.raises(ValidationError, match="needs a USD amount, a token amount"):
        BudgetLimits()
    with pytest.raises(ValidationError):
        BudgetLimits(usd=0)


def test_worst_case_prices_every_input_token_and_the_output_cap() -> None:
    price = Price(input_usd_per_mtok=1.0, output_usd_per_mtok=4.0)
    amount = budget.worst_case(price, input_tokens=1000, max_output_tokens=500)
    assert amount.tokens == 1500
    assert amount.usd == pytest.approx((1000 * 1.0 + 500 * 4.0) / 1e6)
    assert budget.worst_case(None, 10, 5) == Amount(usd=0.0, tokens=15)


def test_a_reservation_that_does_not_fit_is_refused_with_the_budget_named() -> None:
    state = ledger(tokens=1000)
    assert budget.reserve(state, "run-1", 1, Amount(tokens=600), DAY).granted
    grant = budget.reserve(state, "run-2", 1, Amount(tokens=600), DAY)
    assert not grant.granted
    assert "budget 'team-a'" in grant.message and "token budget 1000" in grant.message
    assert "reserved by other runs 600" in grant.message
    assert state.refused == 1 and set(state.reservations) == {"run-1"}


def test_settle_counts_real_usage_and_frees_the_rest() -> None:
    state = ledger(tokens=1000)
    budget.reserve(state, "run-1", 1, Amount(tokens=900), DAY)
    budget.settle(state, "run-1", 1, Amount(tokens=200), DAY)
    assert state.spent.tokens == 200 and state.reservations == {}
    assert budget.reserve(state, "run-2", 1, Amount(tokens=800), DAY).granted
    assert budget.left(state).tokens == 0


def test_reserve_settle_and_release_are_idempotent() -> None:
    state = ledger(usd=1.0)
    for _ in range(3):
        assert budget.reserve(state, "run-1", 1, Amount(usd=0.5), DAY).granted
    assert budget.reserved(state).usd == 0.5
    for _ in range(3):
        budget.settle(state, "run-1", 1, Amount(usd=0.1), DAY)
    assert state.spent.usd == pytest.approx(0.1)
    # A late duplicate reserve of a settled step holds nothing.
    assert budget.reserve(state, "run-1", 1, Amount(usd=0.5), DAY).granted
    assert state.reservations == {}
    budget.reserve(state, "run-1", 2, Amount(usd=0.5), DAY)
    for _ in range(2):
        budget.release(state, "run-1")
    assert state.reservations == {} and state.settled == {}
    assert state.spent.usd == pytest.approx(0.1)


def test_an_unsettled_reservation_is_replaced_by_the_runs_next_one() -> None:
    state = ledger(tokens=1000)
    budget.reserve(state, "run-1", 1, Amount(tokens=700), DAY)
    assert budget.reserve(state, "run-1", 2, Amount(tokens=700), DAY).granted
    assert budget.reserved(state).tokens == 700


def test_a_daily_budget_starts_over_each_utc_day() -> None:
    state = ledger(tokens=100, period="day")
    budget.reserve(state, "run-1", 1, Amount(tokens=100), DAY)
    budget.settle(state, "run-1", 1, Amount(tokens=100), DAY)
    assert not budget.reserve(state, "run-2", 1, Amount(tokens=1), DAY).granted
    assert budget.reserve(state, "run-2", 1, Amount(tokens=1), "2026-12-02").granted
    assert state.period == "2026-12-02" and state.spent.tokens == 0
    total = ledger(tokens=100)
    budget.settle(total, "run-1", 1, Amount(tokens=100), DAY)
    budget.roll(total, "2027-01-01")
    assert total.spent.tokens == 100


@given(st.lists(st.tuples(st.integers(0, 9), st.integers(1, 400), st.integers(0, 400),
                          st.booleans()), max_size=60))
def test_spent_never_passes_the_budget_when_usage_stays_within_its_reservation(
        ops: list[tuple[int, int, int, bool]]) -> None:
    state = ledger(tokens=1000)
    step: dict[str, int] = {}
    for run_no, want, used, finish in ops:
        run = f"run-{run_no}"
        step[run] = step.get(run, 0) + 1
        if budget.reserve(state, run, step[run], Amount(tokens=want), DAY).granted:
            budget.settle(state, run, step[run], Amount(tokens=min(used, want)), DAY)
        if finish:
            budget.release(state, run)
        assert state.spent.tokens + budget.reserved(state).tokens <= 1000


def test_a_usd_budget_refuses_a_run_whose_model_has_no_price() -> None:
    state = ledger(usd=5)
    grant = budget.reserve(state, "run-1", 1, Amount(tokens=10), DAY, priced=False)
    assert not grant.granted and "has no price" in grant.message
    # A token-only budget can count it.
    assert budget.reserve(ledger(tokens=100), "run-1", 1, Amount(tokens=10), DAY,
                          priced=False).granted


def test_a_refusal_asked_again_is_counted_once_until_the_run_releases() -> None:
    state = ledger(tokens=10)
    for _ in range(3):  # a retried update (e.g. re-sent after continue-as-new)
        assert not budget.reserve(state, "run-1", 1, Amount(tokens=50), DAY).granted
    assert state.refused == 1
    budget.release(state, "run-1")
    assert state.refusing == {}


def test_input_bound_is_every_byte_first_then_the_reported_tokens_plus_new_bytes() -> None:
    first = budget.input_tokens_bound(conversation_bytes=300, fixed_bytes=1200,
                                      last_tokens=None, last_bytes=0)
    assert first == 1500
    # After a response that reported 400 + 80 tokens at 900 conversation bytes, 250 bytes
    # of tool results were added.
    later = budget.input_tokens_bound(conversation_bytes=1150, fixed_bytes=1200,
                                      last_tokens=480, last_bytes=900)
    assert later == 480 + 250


def test_settlement_is_the_runs_count_or_the_whole_reservation_without_usage() -> None:
    held = Amount(usd=0.5, tokens=900)
    assert budget.settlement(held, 120, 0.01, usage_known=True) == Amount(usd=0.01,
                                                                         tokens=120)
    assert budget.settlement(held, 0, 0.0, usage_known=False) == held


# --- claims: only the run holding a reservation spends it -------------------------------

TOKEN, OTHER = "a" * 32, "b" * 32


def test_a_settled_step_never_waves_a_reservation_through() -> None:
    """A forged `settle {run, step: 1000000}` exempted the run: its reservations were
    granted unchecked. Under claims it is refused (no reservation of that step), and the
    run's reservations are checked against the limits."""
    state = ledger(usd=60)
    forged = budget.settle_claimed(state, "run-1", 1_000_000, Amount(), DAY)
    assert forged is not None and "no open reservation" in forged
    assert state.settled == {} and state.spent == Amount()
    grant = budget.reserve_claimed(state, "run-1", 1, Amount(usd=100), DAY, token=TOKEN)
    assert not grant.granted and "USD budget 60" in grant.message


def test_a_settlement_counts_only_for_the_open_reservation_with_its_token() -> None:
    state = ledger(tokens=1000)
    grant = budget.reserve_claimed(state, "run-1", 1, Amount(tokens=500), DAY, token=TOKEN)
    assert grant.granted and grant.claim == budget.claim_of(TOKEN) != TOKEN
    for run, step, token in (("fake", 1, TOKEN), ("run-1", 2, TOKEN), ("run-1", 1, None),
                             ("run-1", 1, OTHER)):
        assert budget.settle_claimed(state, run, step, Amount(), DAY, token=token)
    assert not budget.release_claimed(state, "run-1", OTHER)
    assert not budget.release_claimed(state, "run-1")
    assert set(state.reservations) == {"run-1"} and state.spent == Amount()
    assert budget.settle_claimed(state, "run-1", 1, Amount(tokens=120), DAY,
                                 token=TOKEN) is None
    assert state.spent.tokens == 120 and state.reservations == {}
    # Settled once: the same settlement again (a retry) changes nothing.
    assert budget.settle_claimed(state, "run-1", 1, Amount(tokens=120), DAY, token=TOKEN)
    assert state.spent.tokens == 120


def test_an_unbounded_settlement_charges_the_reservation_instead() -> None:
    for actual in (Amount(usd=1e9), Amount(usd=-1.0), Amount(usd=float("nan")),
                   Amount(usd=float("inf")), Amount(tokens=-5), Amount(tokens=10**12)):
        state = ledger(usd=10, tokens=1000)
        budget.reserve_claimed(state, "run-1", 1, Amount(usd=2, tokens=100), DAY,
                               token=TOKEN)
        problem = budget.settle_claimed(state, "run-1", 1, actual, DAY, token=TOKEN)
        assert problem is not None and "worst case was charged" in problem
        assert state.spent == Amount(usd=2, tokens=100) and state.reservations == {}
    # Within the bound (attempts charged their worst case, a provider counting more).
    state = ledger(usd=100)
    budget.reserve_claimed(state, "run-1", 1, Amount(usd=2), DAY, token=TOKEN)
    assert budget.settle_claimed(state, "run-1", 1, Amount(usd=2 * budget.SETTLE_FACTOR),
                                 DAY, token=TOKEN) is None


def test_a_reservation_is_never_replaced_or_re_answered_to_another_token() -> None:
    state = ledger(tokens=1000)
    assert budget.reserve_claimed(state, "run-1", 1, Amount(tokens=500), DAY,
                                  token=TOKEN).granted
    # The same reserve again (a retry, e.g. after continue-as-new): granted, held once.
    assert budget.reserve_claimed(state, "run-1", 1, Amount(tokens=500), DAY,
                                  token=TOKEN).granted
    for step, tokens, token in ((1, 500, OTHER), (1, 1, TOKEN), (2, 1, OTHER)):
        grant = budget.reserve_claimed(state, "run-1", step, Amount(tokens=tokens), DAY,
                                       token=token)
        assert not grant.granted and "already holds a reservation" in grant.message
    assert state.reservations["run-1"].amount.tokens == 500
    assert budget.reserved(state).tokens == 500


def test_a_settled_step_reserved_again_is_refused_as_stale() -> None:
    state = ledger(tokens=1000)
    budget.reserve_claimed(state, "run-1", 1, Amount(tokens=10), DAY, token=TOKEN)
    budget.settle_claimed(state, "run-1", 1, Amount(tokens=5), DAY, token=TOKEN)
    late = budget.reserve_claimed(state, "run-1", 1, Amount(tokens=10), DAY, token=TOKEN)
    assert not late.granted and "settled already" in late.message
    assert budget.reserve_claimed(state, "run-1", 2, Amount(tokens=10), DAY,
                                  token=OTHER).granted


def test_a_non_finite_reservation_is_refused() -> None:
    """NaN passes every comparison with a limit: granted, it made every later
    reservation pass too."""
    state = ledger(usd=1)
    for amount in (Amount(usd=float("nan")), Amount(usd=float("inf")), Amount(usd=-1)):
        assert budget.amount_problem(amount) is not None
        assert not budget.reserve_claimed(state, "run-1", 1, amount, DAY).granted
    assert state.reservations == {}


def test_a_reservation_of_a_run_of_before_claims_is_settled_by_its_run_id() -> None:
    state = ledger(tokens=1000)
    assert budget.reserve_claimed(state, "old-run", 1, Amount(tokens=100), DAY).granted
    assert budget.settle_claimed(state, "old-run", 1, Amount(tokens=40), DAY) is None
    assert state.spent.tokens == 40


def test_a_ledger_keeps_only_what_its_own_continue_as_new_carried() -> None:
    carried = LedgerState(key="team-a", limits=BudgetLimits(usd=1e9),
                          spent=Amount(usd=1e9), settled={"exempt": 10**6})
    genuine = {"continued": True, "cron": False, "attempt": 1}
    assert budget.carried_state("team-a", carried, **genuine) is carried
    empty = LedgerState(key="team-a", limits=None)
    for forged in ({"continued": False}, {"cron": True}, {"attempt": 2}):
        assert budget.carried_state("team-a", carried, **{**genuine, **forged}) == empty
    assert budget.carried_state("team-b", carried, **genuine) == LedgerState(
        key="team-b", limits=None)


def test_a_reset_zeroes_spent_and_drops_the_runs_named() -> None:
    state = ledger(tokens=1000)
    budget.reserve_claimed(state, "run-1", 1, Amount(tokens=100), DAY, token=TOKEN)
    budget.reserve_claimed(state, "run-2", 1, Amount(tokens=100), DAY, token=OTHER)
    state.spent = Amount(tokens=900)
    budget.reset(state, budget.BudgetReset(drop=["run-1"]))
    assert state.spent == Amount() and set(state.reservations) == {"run-2"}
    budget.reset(state, budget.BudgetReset(spent=False, drop=["run-2"]))
    assert state.reservations == {}


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 3), st.integers(0, 400),
                          st.sampled_from(["own", "none", "other"]),
                          st.sampled_from(["reserve", "settle", "release"])), max_size=80))
def test_only_a_runs_own_settlement_moves_spent_and_it_stays_within_its_reservation(
        ops: list[tuple[int, int, int, str, str]]) -> None:
    """Any interleaving of reservations, settlements and releases, a third of them with
    no token and a third with a third party's: spent grows only by a settlement with the
    token the reservation was made with, by at most SETTLE_FACTOR times it, and a message
    with another token leaves the reservation as it was."""
    state = ledger(tokens=1000)
    tokens = {f"run-{i}": f"{i:032x}" for i in range(6)}
    for run_no, step, amount, who, what in ops:
        run = f"run-{run_no}"
        token = {"own": tokens[run], "none": None, "other": "f" * 32}[who]
        before, held = state.spent.tokens, state.reservations.get(run)
        if what == "reserve":
            budget.reserve_claimed(state, run, step, Amount(tokens=amount), DAY, token=token)
        elif what == "settle":
            budget.settle_claimed(state, run, step, Amount(tokens=amount), DAY, token=token)
        else:
            budget.release_claimed(state, run, token)
        grew = state.spent.tokens - before
        own = held is not None and (held.claim is None or (
            token is not None and budget.claim_of(token) == held.claim))
        if grew:
            assert what == "settle" and held is not None and held.step == step and own
            assert grew <= held.amount.tokens * budget.SETTLE_FACTOR
        if held is not None and not own:
            assert state.reservations.get(run) == held  # another's message moved nothing


# --- what a stranger's message may make a ledger hold ----------------------------------


def test_an_amount_over_the_ledgers_bounds_is_refused_in_a_dimension_without_a_limit(
        ) -> None:
    """A tokens-only budget took usd=1e308 twice: its spent total became infinite and
    every reader of the ledger failed."""
    state = LedgerState(key="k", limits=BudgetLimits(tokens=100_000))
    huge = budget.reserve_claimed(state, "r1", 1, Amount(usd=1e308, tokens=1), "2026-12-03",
                                  token="0" * 32)
    assert not huge.granted and "within the ledger's bounds" in huge.message
    assert budget.amount_problem(Amount(usd=budget.MAX_USD, tokens=budget.MAX_TOKENS)) is None
    assert budget.amount_problem(Amount(tokens=budget.MAX_TOKENS + 1)) is not None


def test_a_ledger_keeps_a_bounded_number_of_runs() -> None:
    state = LedgerState(key="k", limits=BudgetLimits(tokens=10**9))
    for n in range(budget.MAX_RUNS):
        assert budget.reserve_claimed(state, f"r{n}", 1, Amount(tokens=1), "2026-12-03",
                                      token=f"{n:032x}").granted
    refused = budget.reserve_claimed(state, "one-more", 1, Amount(tokens=1), "2026-12-03",
                                     token="f" * 32)
    assert not refused.granted and f"keeps {budget.MAX_RUNS} runs" in refused.message
    assert "one-more" not in budget.known_runs(state)
    # A run it keeps already is still answered.
    assert budget.reserve_claimed(state, "r0", 1, Amount(tokens=1), "2026-12-03",
                                  token=f"{0:032x}").granted


def test_a_ledger_started_with_a_timeout_schedule_or_retry_is_named() -> None:
    assert budget.irregular_start(timeout=False, cron=False, retry=False) is None
    for kwargs, what in (({"timeout": True}, "a timeout"), ({"cron": True}, "a cron"),
                         ({"retry": True}, "a retry policy")):
        why = budget.irregular_start(**{"timeout": False, "cron": False, "retry": False,
                                        **kwargs})
        assert why is not None and what in why and "terminate it" in why


def test_a_run_id_longer_than_a_ledger_takes_is_refused_in_its_message() -> None:
    """Three reservations under 900 KB run ids made the ledger's check of closed runs an
    activity input over Temporal's payload limit: every workflow task of it failed."""
    from boundloop.contracts import RUN_ID_MAX, ReserveRequest

    ReserveRequest(run="r" * RUN_ID_MAX, step=1, amount=Amount())
    with pytest.raises(ValidationError):
        ReserveRequest(run="r" * (RUN_ID_MAX + 1), step=1, amount=Amount())
