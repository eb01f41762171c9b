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
