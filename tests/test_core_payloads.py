"""The payload budget (boundloop/core/limits.py): the largest settings derived from
Temporal's payload limit, and the core's stops when a payload would pass it.

Payloads are encoded by the real `pydantic_data_converter`, and measured as Temporal
measures them (the payload's protobuf size: data and metadata).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from temporalio.contrib.pydantic import pydantic_data_converter

from boundloop.contracts import RunInput
from boundloop.core.envelope import cap_envelope, success
from boundloop.core.limits import (
    MAX_PAYLOAD_VALUE_BYTES,
    MAX_PROMPT_BYTES,
    MAX_RESULT_BYTES,
    MAX_SETTINGS_BYTES,
    MAX_TURN_BYTES,
    PAYLOAD_LIMIT_BYTES,
    PAYLOAD_MARGIN_BYTES,
    Limits,
    RunSettings,
    payload_bytes,
)
from boundloop.core.loop import (
    Event,
    Execute,
    LoopState,
    ToolOutcome,
    ToolRule,
    check_payload,
    events_within,
    result_payload_too_large,
)
from boundloop.core.reasons import StopReason
from boundloop.core.turn import FunctionCall
from tests.support.tools import tools as test_tools


def temporal_size(value: object) -> int:
    [payload] = pydantic_data_converter.payload_converter.to_payloads([value])
    return payload.ByteSize()


def test_largest_values_are_the_payload_limit_less_the_margin() -> None:
    assert PAYLOAD_LIMIT_BYTES == 2_097_152
    assert MAX_PAYLOAD_VALUE_BYTES == PAYLOAD_LIMIT_BYTES - PAYLOAD_MARGIN_BYTES == 2_031_616
    assert MAX_RESULT_BYTES == MAX_PAYLOAD_VALUE_BYTES
    # A model response leaves room in the workflow result for counters and events.
    assert MAX_TURN_BYTES == MAX_PAYLOAD_VALUE_BYTES - 512 * 1024
    # The question, the instructions and the settings leave most of a continue-as-new
    # input to the carried state.
    assert 2 * MAX_PROMPT_BYTES + MAX_SETTINGS_BYTES <= PAYLOAD_LIMIT_BYTES * 3 // 8


def test_result_cap_is_refused_above_the_largest_value_with_that_value() -> None:
    assert Limits(max_result_bytes=MAX_RESULT_BYTES).max_result_bytes == MAX_RESULT_BYTES
    with pytest.raises(ValidationError) as info:
        Limits(max_result_bytes=MAX_RESULT_BYTES + 1)
    message = str(info.value)
    assert "max_result_bytes" in message and f"largest allowed value, {MAX_RESULT_BYTES}" in message
    with pytest.raises(ValidationError, match=str(MAX_RESULT_BYTES)):
        Limits.model_validate({"max_result_bytes": 3_000_000})


@pytest.mark.parametrize("fill", ["a", "あ", '"', "\\", "\x01", "\n", "😀", "\u2028"],
                         ids=["ascii", "kana", "quote", "backslash", "control", "newline",
                              "emoji", "line-separator"])
def test_any_result_the_largest_cap_lets_through_fits_one_payload(fill: str) -> None:
    base = success({"text": ""}).output_bytes()
    per = success({"text": fill}).output_bytes() - base
    envelope = success({"text": fill * ((MAX_RESULT_BYTES - base) // per)})
    assert cap_envelope(envelope, MAX_RESULT_BYTES) is envelope  # as large as allowed
    assert MAX_RESULT_BYTES - envelope.output_bytes() < per
    assert temporal_size(ToolOutcome(envelope=envelope)) <= PAYLOAD_LIMIT_BYTES


def test_payload_bytes_measures_what_the_data_converter_writes() -> None:
    outcome = ToolOutcome(envelope=success({"text": "在庫" * 1000}))
    [payload] = pydantic_data_converter.payload_converter.to_payloads([outcome])
    assert payload_bytes(outcome) == len(payload.data)


def _input(**fields: str) -> RunInput:
    return RunInput(settings=RunSettings(model="m"), tools=[], **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["question", "instructions"])
def test_question_and_instructions_are_refused_over_the_largest_size(field: str) -> None:
    other = {"question": "q"} if field == "instructions" else {}
    assert _input(**{field: "x" * MAX_PROMPT_BYTES}, **other)
    for text in ["x" * (MAX_PROMPT_BYTES + 1), "あ" * (MAX_PROMPT_BYTES // 3 + 1)]:
        with pytest.raises(ValidationError) as info:
            _input(**{field: text}, **other)
        assert field in str(info.value)
        assert f"the largest allowed, {MAX_PROMPT_BYTES} bytes" in str(info.value)


def _state() -> LoopState:
    return LoopState(settings=RunSettings(model="m"), allowed_tools=["echo"])


def test_check_payload_stops_with_history_limit_naming_the_payload() -> None:
    state = _state()
    assert check_payload(state, "carried_state", MAX_PAYLOAD_VALUE_BYTES) is None
    assert state.reason is None
    assert check_payload(state, "carried_state",
                         MAX_PAYLOAD_VALUE_BYTES + 1) == StopReason.HISTORY_LIMIT
    assert [e.event for e in state.events] == ["payload_too_large:carried_state",
                                               "stopped:history_limit"]


def test_a_tool_result_over_the_payload_limit_counts_once_and_names_the_tool() -> None:
    state = _state()
    rules = {"echo": ToolRule(name="echo", args_model=test_tools.get("echo").args_model,
                              cost_units=2)}
    plan = Execute(call=FunctionCall(call_id="c1", name="echo", arguments='{"x":"1"}'),
                   arguments={"x": "1"}, fingerprint="echo:1", idempotency_key="wf/step-1/call-0")
    assert result_payload_too_large(state, plan, rules) == StopReason.RESULT_LIMIT
    assert (state.tool_executions, state.cost_units) == (1, 2)
    first = state.events[0]
    assert (first.event, first.tool, first.call_id) == ("payload_too_large:tool_result", "echo",
                                                        "c1")


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.integers(min_value=0, max_value=10**6), min_size=1, max_size=60),
       excess=st.integers(min_value=-10, max_value=6000))
def test_events_within_frees_the_excess_keeping_the_newest_events(
        steps: list[int], excess: int) -> None:
    events = [Event(step=s, event="tool_success", tool="lookup_stock", call_id=f"c{i}",
                    fingerprint="lookup_stock:0123456789abcdef") for i, s in enumerate(steps)]
    kept = events_within(events, excess)
    if excess <= 0 or len(events) == 1:  # nothing to free, or only the newest event left
        assert kept == events
        return
    marker, rest = kept[0], kept[1:]
    dropped = int(marker.event.removeprefix("events_dropped:"))
    assert rest == events[dropped:] and rest[-1] == events[-1]  # the newest survive
    freed = len(_json(events)) - len(_json(kept))
    assert freed >= excess or len(rest) == 1


def _json(events: list[Event]) -> str:
    return "[" + ",".join(e.model_dump_json() for e in events) + "]"


def test_run_settings_are_refused_over_the_largest_size() -> None:
    many = {f"tool_{i}": [f"approver-{j}" for j in range(40)] for i in range(600)}
    with pytest.raises(ValidationError, match=f"the largest allowed, {MAX_SETTINGS_BYTES} bytes"):
        RunSettings.model_validate({"model": "m", "policy": {"approvers": many}})
    few = {name: names[:10] for name, names in list(many.items())[:100]}
    assert RunSettings.model_validate({"model": "m", "policy": {"approvers": few}})
