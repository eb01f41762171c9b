"""The tool result envelope and its byte cap (and `result_limit`).

`cap_envelope` returns the envelope when its UTF-8 JSON fits the cap, a
`RESULT_TOO_LARGE` envelope when only that fits, and None when not even that fits (the
run stops with `result_limit`). Bytes are UTF-8 bytes of the compact JSON the model
receives, so Japanese text counts three bytes a character.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from boundloop.core import envelope as env
from boundloop.core.envelope import Envelope, ToolStatus, cap_envelope
from boundloop.core.limits import Limits, RunSettings
from boundloop.core.loop import (
    Execute,
    LoopState,
    Reply,
    ToolOutcome,
    ToolRule,
    record_outcome,
    reply_output,
)
from boundloop.core.reasons import StopReason
from boundloop.core.turn import FunctionCall
from boundloop.tools.demo import tools as demo_tools
from tests.support import strategies

FAST = settings(max_examples=150, deadline=None)

json_data = strategies.json_values(text=40)
envelopes = st.builds(
    Envelope,
    status=st.sampled_from(list(ToolStatus)),
    retryable=st.booleans(),
    terminal=st.booleans(),
    data=json_data,
    error_code=st.none() | st.sampled_from(["NOT_FOUND", "在庫なし", "X"]),
    message=st.text(max_size=60),
)

LookupStockArgs = demo_tools.get("lookup_stock").args_model



def size(envelope: Envelope) -> int:
    return len(envelope.to_output().encode("utf-8"))


# --- cap_envelope -----------------------------------------------------------------------


@FAST
@given(envelope=envelopes, cap=st.integers(1, 2000))
def test_cap_envelope_keeps_what_fits_replaces_what_does_not_and_gives_up_last(
        envelope: Envelope, cap: int) -> None:
    result = cap_envelope(envelope, cap)
    if size(envelope) <= cap:
        assert result == envelope
    elif size(env.result_too_large(size(envelope), cap)) <= cap:
        assert result is not None
        assert result.error_code == "RESULT_TOO_LARGE"
        assert result.status == ToolStatus.PERMANENT_ERROR
        assert result.retryable is False
        assert result.data is None
    else:
        assert result is None
    if result is not None:
        assert size(result) <= cap


@FAST
@given(envelope=envelopes)
def test_cap_boundary_is_inclusive(envelope: Envelope) -> None:
    exact = size(envelope)
    assert cap_envelope(envelope, exact) == envelope
    smaller = cap_envelope(envelope, exact - 1) if exact > 1 else None
    assert smaller != envelope


def test_result_too_large_reports_the_actual_size_and_the_cap() -> None:
    big = env.success({"rows": ["x" * 100] * 50})
    result = cap_envelope(big, 300)
    assert result is not None and result.error_code == "RESULT_TOO_LARGE"
    assert str(size(big)) in result.message
    assert "300" in result.message
    assert "rows" not in result.to_output()  # the oversized data never reaches the model


def test_cap_envelope_gives_none_when_even_the_error_envelope_is_over_the_cap() -> None:
    big = env.success({"text": "x" * 500})
    assert cap_envelope(big, 50) is None
    outcomes = set()
    for cap in range(100, 400):
        error_fits = size(env.result_too_large(size(big), cap)) <= cap
        result = cap_envelope(big, cap)
        if error_fits:
            assert result is not None and result.error_code == "RESULT_TOO_LARGE"
        else:
            assert result is None
        outcomes.add(error_fits)
    assert outcomes == {True, False}


def test_cap_counts_utf8_bytes_not_characters() -> None:
    japanese = env.success({"text": "在庫" * 50})  # 100 characters, 300 bytes of text
    out = japanese.to_output()
    assert len(out) < 250 < len(out.encode("utf-8"))
    result = cap_envelope(japanese, 250)
    assert result is not None and result.error_code == "RESULT_TOO_LARGE"
    ascii_same_length = env.success({"text": "ab" * 50})
    assert cap_envelope(ascii_same_length, 250) == ascii_same_length


@FAST
@given(text=st.text(alphabet="あいうえお在庫調", max_size=100))
def test_japanese_text_counts_three_bytes_a_character(text: str) -> None:
    base = env.success({"t": ""}).output_bytes()
    assert env.success({"t": text}).output_bytes() == base + 3 * len(text)


def test_output_bytes_counts_each_script_by_its_utf8_width() -> None:
    base = Envelope(status=ToolStatus.SUCCESS, message="").output_bytes()
    for text, width in (("a", 1), ("é", 2), ("在", 3), ("😀", 4)):
        assert Envelope(status=ToolStatus.SUCCESS, message=text * 10).output_bytes() == (
            base + 10 * width)


# --- the text sent to the model -----------------------------------------------------------


@FAST
@given(envelope=envelopes)
def test_output_is_compact_utf8_json_that_round_trips(envelope: Envelope) -> None:
    out = envelope.to_output()
    parsed = json.loads(out)
    assert out == json.dumps(parsed, ensure_ascii=False, separators=(",", ":"))
    assert parsed["status"] == envelope.status.value
    assert parsed["retryable"] is envelope.retryable
    assert parsed["terminal"] is envelope.terminal
    assert parsed["message"] == envelope.message
    assert envelope.output_bytes() == len(out.encode("utf-8"))


@FAST
@given(envelope=envelopes)
def test_output_omits_data_and_error_code_only_when_absent(envelope: Envelope) -> None:
    parsed = json.loads(envelope.to_output())
    assert ("data" in parsed) == (envelope.data is not None)
    assert ("error_code" in parsed) == (envelope.error_code is not None)
    if envelope.data is not None:
        assert parsed["data"] == envelope.data
    assert set(parsed) <= {"status", "retryable", "terminal", "data", "error_code", "message"}


def test_output_keeps_none_values_inside_data() -> None:
    out = env.success({"sku": "A-001", "quantity": None, "tags": [None]}).to_output()
    assert json.loads(out)["data"] == {"sku": "A-001", "quantity": None, "tags": [None]}


def test_output_keeps_non_ascii_literal_and_has_no_whitespace() -> None:
    out = env.success({"倉庫": "北京"}, message="在庫あり").to_output()
    assert out == ('{"status":"success","retryable":false,"terminal":false,'
                   '"data":{"倉庫":"北京"},"message":"在庫あり"}')
    assert "\\u" not in out
    assert not re.search(r"[\s]", out)


def test_minimal_envelope_has_exactly_the_required_fields() -> None:
    out = json.loads(Envelope(status=ToolStatus.NOT_FOUND, message="no").to_output())
    assert out == {"status": "not_found", "retryable": False, "terminal": False,
                   "message": "no"}


@pytest.mark.parametrize("payload", [
    {"status": "done", "message": "x"},
    {"status": "success", "message": "x", "stack": "Traceback"},
])
def test_envelopes_accept_only_the_declared_statuses_and_fields(payload: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Envelope.model_validate(payload)


def test_builders_set_status_retryable_and_codes() -> None:
    assert env.invalid_input("INVALID_JSON", "m").status == ToolStatus.INVALID_INPUT
    assert env.invalid_input("INVALID_JSON", "m").retryable is True
    assert env.blocked("IDENTICAL_CALL_LIMIT", "m").retryable is False
    assert env.rejected("why").status == ToolStatus.REJECTED
    exhausted = env.temporary_error_exhausted()
    assert exhausted.status == ToolStatus.TEMPORARY_ERROR and exhausted.retryable is False
    assert env.unknown_tool("rm_rf", ["lookup_stock"]).error_code == "UNKNOWN_TOOL"
    assert env.success(1, terminal=True).terminal is True


# --- caps applied by the loop -----------------------------------------------------------


RULES = {"lookup_stock": ToolRule("lookup_stock", LookupStockArgs)}
CALL = FunctionCall(call_id="c1", name="lookup_stock", arguments='{"sku":"A-001"}')
PLAN = Execute(call=CALL, arguments={"sku": "A-001"}, fingerprint="lookup_stock:0",
               idempotency_key="wf/step-1/call-0")


def state_with_cap(cap: int) -> LoopState:
    return LoopState(settings=RunSettings(model="m", limits=Limits(max_result_bytes=cap)),
                     allowed_tools=["lookup_stock"])


def test_record_outcome_replaces_an_oversized_result_and_counts_the_execution() -> None:
    state = state_with_cap(400)
    out = record_outcome(state, PLAN, ToolOutcome(envelope=env.success({"t": "在" * 200})),
                         RULES)
    assert isinstance(out, Envelope) and out.error_code == "RESULT_TOO_LARGE"
    assert state.tool_executions == 1
    assert state.reason is None
    assert any(e.event == "result_too_large" for e in state.events)


def test_record_outcome_stops_with_result_limit_when_even_the_error_is_too_large() -> None:
    state = state_with_cap(20)
    out = record_outcome(state, PLAN, ToolOutcome(envelope=env.success({"t": "x" * 100})),
                         RULES)
    assert out == StopReason.RESULT_LIMIT
    assert state.reason == StopReason.RESULT_LIMIT


def test_reply_output_caps_envelopes_the_loop_made_itself() -> None:
    reply = Reply(call=CALL, envelope=env.invalid_input("INVALID_ARGUMENTS", "x" * 300))
    assert reply_output(state_with_cap(20), reply) == StopReason.RESULT_LIMIT
    fitted = reply_output(state_with_cap(4096), reply)
    assert fitted == reply.envelope
