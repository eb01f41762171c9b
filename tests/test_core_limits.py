"""Limits, policy and run settings, and the loop's limit arithmetic.

Validation: every limit is a positive integer (or a positive finite number for money
and time); anything else is refused before the run starts, naming the field.
Arithmetic: driven through the pure core (`begin_step`, `account_usage`, `plan_calls`,
`record_outcome`) with synthetic turns, no Temporal.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from boundloop.core import envelope as env
from boundloop.core.limits import (
    MAX_COUNT,
    MAX_RESULT_BYTES,
    MAX_SECONDS,
    Limits,
    Policy,
    Price,
    RunSettings,
)
from boundloop.core.loop import (
    Execute,
    LoopState,
    Reply,
    StepPlan,
    ToolOutcome,
    account_usage,
    begin_step,
    plan_calls,
    record_outcome,
)
from boundloop.core.reasons import StopReason
from boundloop.core.turn import Turn, Usage
from tests.support import strategies

INT_FIELDS = ["max_steps", "max_tool_executions", "token_threshold", "max_result_bytes",
              "max_history_bytes", "max_identical_calls", "tool_cost_budget"]
NUMBER_FIELDS = ["usd_budget", "tool_timeout_seconds", "model_timeout_seconds",
                 "deadline_seconds", "approval_timeout_seconds"]
REQUIRED_FIELDS = ["max_steps", "max_tool_executions", "token_threshold", "max_result_bytes",
                   "max_history_bytes", "max_identical_calls", "model_timeout_seconds",
                   "deadline_seconds", "approval_timeout_seconds"]

BAD_INTS: list[Any] = [0, -1, -4096, True, False, "5", "", 5.0, 2.5, float("nan"),
                       float("inf"), [5], {"value": 5}]
BAD_NUMBERS: list[Any] = [0, 0.0, -1, -0.5, True, False, "1.5", "", float("nan"),
                          float("inf"), float("-inf"), [1.0]]

RULES = strategies.demo_rules(ticket_cost_units=5)
FAST = settings(max_examples=100, deadline=None)


def field_of(exc: ValidationError) -> set[Any]:
    return {err["loc"][0] for err in exc.errors()}


# --- validation -----------------------------------------------------------------------


def test_defaults_follow_the_spec() -> None:
    lim = Limits()
    assert (lim.max_steps, lim.max_tool_executions, lim.token_threshold,
            lim.max_result_bytes, lim.max_history_bytes, lim.max_identical_calls) == (
        5, 6, 8000, 4096, 64000, 2)


@pytest.mark.parametrize("field", INT_FIELDS)
@pytest.mark.parametrize("value", BAD_INTS, ids=repr)
def test_integer_limits_reject_non_positive_and_non_integer_values(field: str, value: Any) -> None:
    with pytest.raises(ValidationError) as info:
        Limits.model_validate({field: value})
    assert field_of(info.value) == {field}
    assert field in str(info.value)


@pytest.mark.parametrize("field", NUMBER_FIELDS)
@pytest.mark.parametrize("value", BAD_NUMBERS, ids=repr)
def test_money_and_time_limits_reject_non_positive_non_finite_and_non_numbers(
        field: str, value: Any) -> None:
    with pytest.raises(ValidationError) as info:
        Limits.model_validate({field: value})
    assert field_of(info.value) == {field}
    assert field in str(info.value)


@pytest.mark.parametrize("field", REQUIRED_FIELDS)
def test_limits_with_a_default_reject_none(field: str) -> None:
    with pytest.raises(ValidationError) as info:
        Limits.model_validate({field: None})
    assert field_of(info.value) == {field}


@pytest.mark.parametrize("value", BAD_INTS, ids=repr)
def test_per_tool_max_calls_rejects_bad_counts(value: Any) -> None:
    with pytest.raises(ValidationError) as info:
        Limits(per_tool_max_calls={"lookup_stock": value})
    assert field_of(info.value) == {"per_tool_max_calls"}


#: The largest value of each integer limit (a payload-sizing limit is bounded lower).
INT_MAX = {**dict.fromkeys(INT_FIELDS, MAX_COUNT), "max_result_bytes": MAX_RESULT_BYTES}


@FAST
@given(field=st.sampled_from(INT_FIELDS), data=st.data())
def test_integer_limits_accept_positive_integers(field: str, data: st.DataObject) -> None:
    value = data.draw(st.integers(min_value=1, max_value=INT_MAX[field]))
    assert getattr(Limits.model_validate({field: value}), field) == value


@FAST
@given(field=st.sampled_from(INT_FIELDS), value=st.integers(max_value=0))
def test_integer_limits_reject_every_non_positive_integer(field: str, value: int) -> None:
    with pytest.raises(ValidationError):
        Limits.model_validate({field: value})


@FAST
@given(field=st.sampled_from(NUMBER_FIELDS),
       value=st.floats(min_value=1e-6, max_value=MAX_SECONDS, allow_nan=False,
                       allow_infinity=False)
       | st.integers(min_value=1, max_value=10**6))
def test_money_and_time_limits_accept_positive_finite_numbers(
        field: str, value: float) -> None:
    assert getattr(Limits.model_validate({field: value}), field) == value


@pytest.mark.parametrize("field", NUMBER_FIELDS)
def test_time_and_money_limits_refuse_values_no_timer_can_hold(field: str) -> None:
    # 1e300 s once passed validation and failed every workflow task (OverflowError).
    with pytest.raises(ValidationError):
        Limits.model_validate({field: 1e300})


def test_count_limits_refuse_absurd_integers() -> None:
    with pytest.raises(ValidationError):
        Limits.model_validate({"max_steps": MAX_COUNT + 1})


@FAST
@given(field=st.sampled_from(NUMBER_FIELDS), value=st.floats(max_value=0.0))
def test_money_and_time_limits_reject_every_non_positive_number(
        field: str, value: float) -> None:
    with pytest.raises(ValidationError):
        Limits.model_validate({field: value})


def test_positive_per_tool_max_calls_are_accepted() -> None:
    assert Limits(per_tool_max_calls={"lookup_stock": 1, "search_docs": 3}).per_tool_max_calls == {
        "lookup_stock": 1, "search_docs": 3}


@pytest.mark.parametrize(("model", "payload"), [
    (Limits, {"max_step": 5}),
    (Limits, {"max_steps": 5, "timeout": 3}),
    (Policy, {"approver": {}}),
    (Price, {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 1.0, "cached": 0.5}),
    (RunSettings, {"model": "m", "modle": "m"}),
])
def test_unknown_fields_are_rejected(model: Any, payload: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as info:
        model.model_validate(payload)
    assert any(err["type"] == "extra_forbidden" for err in info.value.errors())


@pytest.mark.parametrize(("field", "value"), [
    ("unknown_tool", "ignore"), ("missing_usage", "guess"), ("approval", "sometimes"),
    ("approvers", {"create_ticket": "alice"}),
])
def test_policy_rejects_values_outside_its_choices(field: str, value: Any) -> None:
    with pytest.raises(ValidationError) as info:
        Policy.model_validate({field: value})
    assert field_of(info.value) == {field}


@pytest.mark.parametrize("value", [-0.01, float("nan"), float("inf"), "1", True])
def test_prices_reject_negative_non_finite_and_non_numbers(value: Any) -> None:
    with pytest.raises(ValidationError):
        Price(input_usd_per_mtok=value, output_usd_per_mtok=1.0)
    with pytest.raises(ValidationError):
        Price(input_usd_per_mtok=1.0, output_usd_per_mtok=value)


def test_usd_budget_without_a_price_for_the_model_is_rejected_naming_the_model() -> None:
    with pytest.raises(ValidationError) as info:
        RunSettings(model="gpt-unpriced-9", limits=Limits(usd_budget=1.5))
    assert "gpt-unpriced-9" in str(info.value)
    assert "usd_budget" in str(info.value)


def test_usd_budget_with_a_price_for_another_model_is_rejected_naming_the_run_model() -> None:
    prices = {"other-model": Price(input_usd_per_mtok=1.0, output_usd_per_mtok=2.0)}
    with pytest.raises(ValidationError) as info:
        RunSettings(model="gpt-unpriced-9", limits=Limits(usd_budget=1.5),
                    policy=Policy(prices=prices))
    assert "gpt-unpriced-9" in str(info.value)


def test_usd_budget_with_a_price_for_the_model_is_accepted() -> None:
    prices = {"gpt-x": Price(input_usd_per_mtok=0.0, output_usd_per_mtok=2.0)}
    run = RunSettings(model="gpt-x", limits=Limits(usd_budget=0.25), policy=Policy(prices=prices))
    assert run.limits.usd_budget == 0.25


@pytest.mark.parametrize("payload", [{"model": ""}, {"model": "m", "api": "completions"}, {}])
def test_run_settings_reject_missing_model_and_unknown_api(payload: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        RunSettings.model_validate(payload)


def test_run_settings_round_trip_through_json() -> None:
    run = RunSettings(model="m", api="chat", limits=Limits(max_steps=3, usd_budget=1.0),
                      policy=Policy(prices={"m": Price(input_usd_per_mtok=1.0,
                                                       output_usd_per_mtok=1.0)}))
    assert RunSettings.model_validate_json(run.model_dump_json()) == run


# --- the loop's limit arithmetic ----------------------------------------------------


def new_state(limits: Limits, policy: Policy | None = None) -> LoopState:
    return LoopState(settings=RunSettings(model="m", limits=limits, policy=policy or Policy()),
                     allowed_tools=list(RULES))


def sku(n: int) -> str:
    return f"{chr(ord('A') + (n // 1000) % 26)}-{n % 1000:03d}"


def call_item(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}


def calls_turn(calls: list[tuple[str, str, str]], usage: Usage | None = None,
               text: str = "") -> Turn:
    items = [call_item(*c) for c in calls]
    return Turn(items=items, text=text, usage=usage or Usage(input_tokens=1, output_tokens=1,
                                                             total_tokens=2))


def text_turn(text: str, usage: Usage | None = None) -> Turn:
    return Turn(items=[{"type": "message", "role": "assistant",
                        "content": [{"type": "output_text", "text": text}]}], text=text,
                usage=usage or Usage(input_tokens=1, output_tokens=1, total_tokens=2))


def lookups(step: int, first: int, count: int) -> list[tuple[str, str, str]]:
    """`count` distinct, valid lookup_stock calls."""
    return [(f"call_{step}_{i}", "lookup_stock", json.dumps({"sku": sku(first + i)}))
            for i in range(count)]


def execute_all(state: LoopState, plans: list[Execute | Reply]) -> None:
    for plan in plans:
        if isinstance(plan, Execute):
            outcome = ToolOutcome(envelope=env.success({"ok": True}))
            assert not isinstance(record_outcome(state, plan, outcome, RULES), StopReason)


@FAST
@given(max_steps=st.integers(1, 8),
       batches=st.lists(st.integers(1, 4), min_size=8, max_size=8))
def test_steps_never_exceed_max_steps_and_the_last_step_sends_tool_choice_none(
        max_steps: int, batches: list[int]) -> None:
    state = new_state(Limits(max_steps=max_steps, max_tool_executions=1000,
                             max_identical_calls=1000, token_threshold=10**9))
    plans: list[StepPlan] = []
    made = 0
    expected_executions = 0
    reason: StopReason | None = None
    for batch in batches + [1] * 4:
        step = begin_step(state, 0.0)
        if isinstance(step, StopReason):
            reason = step
            break
        plans.append(step)
        assert state.steps <= max_steps
        assert account_usage(state, calls_turn([]), 10) is None
        decided = plan_calls(state, calls_turn(lookups(step.step, made, batch)), step, RULES,
                             "wf-1")
        made += batch
        if isinstance(decided, StopReason):
            reason = decided
            break
        expected_executions += batch
        execute_all(state, decided)
    assert reason == StopReason.MAX_STEPS
    assert state.reason == StopReason.MAX_STEPS
    assert len(plans) == max_steps == state.steps
    assert [p.step for p in plans] == list(range(1, max_steps + 1))
    assert plans[-1].tool_choice == "none" and plans[-1].last
    assert all(p.tool_choice == "auto" and not p.last for p in plans[:-1])
    # Calls returned on the last step are never executed.
    assert state.tool_executions == expected_executions == sum(batches[: max_steps - 1])


@FAST
@given(max_steps=st.integers(1, 6))
def test_an_answer_on_the_forced_last_step_ends_max_steps_with_its_text(max_steps: int) -> None:
    """The last step is sent with tool_choice "none": the model was not free to go on,
    so its answer is kept as `text` and the reason names the step limit."""
    state = new_state(Limits(max_steps=max_steps, max_identical_calls=100,
                             max_tool_executions=100))
    for n in range(max_steps - 1):
        step = begin_step(state, 0.0)
        assert isinstance(step, StepPlan) and step.tool_choice == "auto"
        decided = plan_calls(state, calls_turn(lookups(step.step, n, 1)), step, RULES, "wf")
        assert isinstance(decided, list)
        execute_all(state, decided)
    last = begin_step(state, 0.0)
    assert isinstance(last, StepPlan) and last.last and last.tool_choice == "none"
    assert plan_calls(state, text_turn("A-001: 12 in stock"), last, RULES, "wf") == (
        StopReason.MAX_STEPS)
    assert state.text == "A-001: 12 in stock"
    assert begin_step(state, 0.0) == StopReason.MAX_STEPS  # no further step begins
    assert state.steps == max_steps


@FAST
@given(max_steps=st.integers(2, 6))
def test_an_answer_before_the_last_step_completes(max_steps: int) -> None:
    state = new_state(Limits(max_steps=max_steps, max_identical_calls=100,
                             max_tool_executions=100))
    for n in range(max_steps - 2):
        step = begin_step(state, 0.0)
        assert isinstance(step, StepPlan)
        decided = plan_calls(state, calls_turn(lookups(step.step, n, 1)), step, RULES, "wf")
        assert isinstance(decided, list)
        execute_all(state, decided)
    free = begin_step(state, 0.0)
    assert isinstance(free, StepPlan) and free.tool_choice == "auto" and not free.last
    assert plan_calls(state, text_turn("A-001: 12 in stock"), free, RULES, "wf") == (
        StopReason.COMPLETED)


@FAST
@given(max_tools=st.integers(1, 10), batches=st.lists(st.integers(1, 6), min_size=1,
                                                      max_size=8))
def test_a_batch_is_refused_exactly_when_it_would_pass_max_tool_executions(
        max_tools: int, batches: list[int]) -> None:
    state = new_state(Limits(max_steps=len(batches) + 1, max_tool_executions=max_tools,
                             max_identical_calls=100))
    made = 0
    for batch in batches:
        step = begin_step(state, 0.0)
        assert isinstance(step, StepPlan)
        before = state.tool_executions
        decided = plan_calls(state, calls_turn(lookups(step.step, made, batch)), step, RULES,
                             "wf")
        made += batch
        if before + batch > max_tools:
            assert decided == StopReason.MAX_TOOLS
            assert state.reason == StopReason.MAX_TOOLS
            assert state.tool_executions == before  # nothing of the batch ran
            break
        assert isinstance(decided, list) and len(decided) == batch
        assert all(isinstance(p, Execute) for p in decided)
        execute_all(state, decided)
        assert state.tool_executions == before + batch <= max_tools
    else:
        assert state.reason is None
        assert state.tool_executions == sum(batches) <= max_tools


def test_max_tools_counts_the_whole_batch_before_executing_any_call() -> None:
    state = new_state(Limits(max_tool_executions=6))
    state.tool_executions = 5
    step = begin_step(state, 0.0)
    assert isinstance(step, StepPlan)
    assert plan_calls(state, calls_turn(lookups(1, 0, 2)), step, RULES, "wf") == (
        StopReason.MAX_TOOLS)
    state2 = new_state(Limits(max_tool_executions=6))
    state2.tool_executions = 5
    step2 = begin_step(state2, 0.0)
    assert isinstance(step2, StepPlan)
    decided = plan_calls(state2, calls_turn(lookups(1, 0, 1)), step2, RULES, "wf")
    assert isinstance(decided, list) and len(decided) == 1


def search_args_variants(n: int) -> str:
    """The same search_docs arguments written in different key orders and spacing."""
    forms = ['{"query":"在庫","limit":2}', '{ "limit" : 2, "query" : "\\u5728\\u5eab" }',
             '{\n  "query": "在庫",\n  "limit": 2\n}']
    return forms[n % len(forms)]


@FAST
@given(max_identical=st.integers(1, 4), repeats=st.integers(1, 8))
def test_identical_calls_across_steps_are_blocked_past_max_identical_calls(
        max_identical: int, repeats: int) -> None:
    state = new_state(Limits(max_steps=repeats + 2, max_identical_calls=max_identical,
                             max_tool_executions=100))
    for n in range(repeats):
        step = begin_step(state, 0.0)
        assert isinstance(step, StepPlan)
        decided = plan_calls(state, calls_turn([(f"c{n}", "search_docs",
                                                 search_args_variants(n))]), step, RULES, "wf")
        assert isinstance(decided, list) and len(decided) == 1
        plan = decided[0]
        if n < max_identical:
            assert isinstance(plan, Execute)
            assert not state.force_final
            execute_all(state, decided)
        else:
            assert isinstance(plan, Reply)
            assert plan.envelope.error_code == "IDENTICAL_CALL_LIMIT"
            assert plan.envelope.status == env.ToolStatus.BLOCKED
            assert state.force_final
            assert state.pending_limit == StopReason.MAX_IDENTICAL_CALLS
            following = begin_step(state, 0.0)
            assert isinstance(following, StepPlan) and following.tool_choice == "none"
            break
    assert state.tool_executions == min(repeats, max_identical)


@FAST
@given(max_identical=st.integers(1, 4), copies=st.integers(1, 6))
def test_identical_calls_in_one_batch_run_at_most_max_identical_calls_times(
        max_identical: int, copies: int) -> None:
    state = new_state(Limits(max_identical_calls=max_identical, max_tool_executions=100))
    step = begin_step(state, 0.0)
    assert isinstance(step, StepPlan)
    calls = [(f"c{i}", "search_docs", search_args_variants(i)) for i in range(copies)]
    decided = plan_calls(state, calls_turn(calls), step, RULES, "wf")
    assert isinstance(decided, list) and len(decided) == copies
    executes = [p for p in decided if isinstance(p, Execute)]
    blocked = [p for p in decided if isinstance(p, Reply)]
    assert len(executes) == min(copies, max_identical)
    assert decided[: len(executes)] == executes  # the first ones run, in call order
    assert all(p.envelope.error_code == "IDENTICAL_CALL_LIMIT" for p in blocked)
    assert len({p.fingerprint for p in decided}) == 1
    assert state.force_final == (copies > max_identical)


def test_a_run_cut_by_identical_calls_never_reports_completed() -> None:
    state = new_state(Limits(max_identical_calls=1))
    for n in range(2):
        step = begin_step(state, 0.0)
        assert isinstance(step, StepPlan)
        decided = plan_calls(state, calls_turn([(f"c{n}", "lookup_stock", '{"sku":"A-001"}')]),
                             step, RULES, "wf")
        assert isinstance(decided, list)
        execute_all(state, decided)
    final = begin_step(state, 0.0)
    assert isinstance(final, StepPlan) and final.tool_choice == "none"
    reason = plan_calls(state, text_turn("A-001 has 12."), final, RULES, "wf")
    assert reason == StopReason.MAX_IDENTICAL_CALLS
    assert state.text == "A-001 has 12."


@FAST
@given(threshold=st.integers(1, 5000),
       usages=st.lists(st.tuples(st.integers(0, 800), st.integers(0, 800)), min_size=1,
                       max_size=12))
def test_account_usage_stops_exactly_when_the_total_reaches_token_threshold(
        threshold: int, usages: list[tuple[int, int]]) -> None:
    state = new_state(Limits(token_threshold=threshold))
    total = 0
    for n, (inp, out) in enumerate(usages):
        total += inp + out
        turn = text_turn(f"partial {n}", Usage(input_tokens=inp, output_tokens=out,
                                               total_tokens=inp + out))
        result = account_usage(state, turn, 100)
        assert state.usage.total_tokens == total
        if total >= threshold:
            assert result == StopReason.USAGE_LIMIT
            assert state.reason == StopReason.USAGE_LIMIT
            assert state.text == f"partial {n}"
            break
        assert result is None
        assert state.reason is None


def test_usage_limit_boundary_is_inclusive() -> None:
    below = new_state(Limits(token_threshold=100))
    assert account_usage(below, text_turn("x", Usage(input_tokens=60, output_tokens=39,
                                                     total_tokens=99)), 10) is None
    reach = new_state(Limits(token_threshold=100))
    assert account_usage(reach, text_turn("x", Usage(input_tokens=60, output_tokens=40,
                                                     total_tokens=100)), 10) == (
        StopReason.USAGE_LIMIT)


def test_missing_usage_stops_with_usage_unknown_by_default() -> None:
    state = new_state(Limits())
    turn = Turn(items=[], text="answer", usage=None)
    assert account_usage(state, turn, 400) == StopReason.USAGE_UNKNOWN
    assert state.usage.unknown_steps == 1


def test_missing_usage_is_estimated_from_bytes_when_policy_says_so() -> None:
    state = new_state(Limits(token_threshold=10**6), Policy(missing_usage="estimate"))
    turn = Turn(items=[], text="answer", usage=None, output_bytes=40)
    assert account_usage(state, turn, 400) is None
    assert state.usage.estimated and state.usage.unknown_steps == 1
    assert (state.usage.input_tokens, state.usage.output_tokens) == (100, 10)


def test_usd_budget_stops_with_budget_limit_when_reached() -> None:
    prices = {"m": Price(input_usd_per_mtok=1_000_000.0, output_usd_per_mtok=0.0)}
    state = new_state(Limits(usd_budget=3.0, token_threshold=10**6), Policy(prices=prices))
    usage = Usage(input_tokens=1, output_tokens=5, total_tokens=6)
    assert account_usage(state, text_turn("a", usage), 1) is None
    assert account_usage(state, text_turn("b", usage), 1) is None
    assert account_usage(state, text_turn("c", usage), 1) == StopReason.BUDGET_LIMIT
    assert math.isclose(state.cost_usd, 3.0)


@FAST
@given(deadline=st.integers(1, 1000), elapsed=st.floats(0, 2000, allow_nan=False))
def test_begin_step_stops_at_the_deadline(deadline: int, elapsed: float) -> None:
    state = new_state(Limits(deadline_seconds=float(deadline)))
    result = begin_step(state, elapsed)
    if elapsed >= deadline:
        assert result == StopReason.DEADLINE and state.steps == 0
    else:
        assert isinstance(result, StepPlan) and state.steps == 1


def test_begin_step_checks_history_bytes_before_a_request() -> None:
    state = new_state(Limits(max_history_bytes=100))
    state.conversation = state.conversation.extend([{"type": "message", "role": "user",
                                                     "content": "あ" * 40}])
    assert state.conversation.bytes > 100
    assert begin_step(state, 0.0) == StopReason.HISTORY_LIMIT
    assert state.steps == 0


def test_tool_cost_budget_refuses_a_batch_that_would_pass_it() -> None:
    state = new_state(Limits(tool_cost_budget=9), Policy(approval="never"))
    step = begin_step(state, 0.0)
    assert isinstance(step, StepPlan)
    args = json.dumps({"title": "t", "description": "d", "priority": "low"})
    turn = calls_turn([("c1", "create_ticket", args), ("c2", "create_ticket",
                                                       args.replace('"t"', '"u"'))])
    assert plan_calls(state, turn, step, RULES, "wf") == StopReason.BUDGET_LIMIT
