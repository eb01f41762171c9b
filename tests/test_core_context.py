"""The context window as a limit, in the pure core: the input estimate, the check before
a request, the operator's window per model (a run may only lower it), and the provider
errors that say a request is too long."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from boundloop.core import context
from boundloop.core import model_failures as mf
from boundloop.core.canonical import json_bytes
from boundloop.core.conversation import ConversationMeta
from boundloop.core.limits import Limits, Policy, RunSettings
from boundloop.core.loop import LoopState, begin_step
from boundloop.core.operator import OperatorPolicy, Refusal, resolve
from boundloop.core.reasons import NEXT_CHECK, StopReason
from boundloop.exit_codes import ExitCode


def _state(limits: Limits, *, conversation_bytes: int = 0, last_tokens: int | None = None,
           last_bytes: int = 0) -> LoopState:
    state = LoopState(settings=RunSettings(model="m", limits=limits), allowed_tools=[])
    state.conversation = ConversationMeta(bytes=conversation_bytes)
    state.last_tokens, state.last_bytes = last_tokens, last_bytes
    return state


def test_before_any_usage_the_whole_request_counts_at_four_bytes_a_token() -> None:
    # instructions + tool declarations (1000 bytes) and the conversation (601 bytes)
    assert context.estimate_input_tokens(conversation_bytes=601, fixed_bytes=1000,
                                         last_tokens=None, last_bytes=0) == 401  # rounded up
    assert context.BYTES_PER_TOKEN == 4


def test_after_a_reported_usage_only_the_bytes_added_since_are_estimated() -> None:
    # The last response reported 900 tokens for its request and itself; 400 bytes of tool
    # results were added since: 100 tokens more. The fixed bytes are in the 900 already.
    assert context.estimate_input_tokens(conversation_bytes=2400, fixed_bytes=10_000,
                                         last_tokens=900, last_bytes=2000) == 1000
    # Nothing added: exactly what the provider counted.
    assert context.estimate_input_tokens(conversation_bytes=2000, fixed_bytes=10_000,
                                         last_tokens=900, last_bytes=2000) == 900


def test_a_request_fits_when_its_estimate_and_its_output_cap_fit_the_window() -> None:
    assert context.over_window(3500, 500, 4000) is None  # exactly the window
    detail = context.over_window(3501, 500, 4000)
    assert detail == ("estimated 3501 input tokens + max_output_tokens 500 = 4001 > context "
                      "window 4000 (max_input_tokens): the request was not sent")
    assert context.over_window(4000, None, 4000) is None
    assert context.over_window(4001, None, 4000) is not None


def test_no_window_no_check_and_fixed_bytes_are_read_only_without_usage() -> None:
    def never() -> int:
        raise AssertionError("fixed bytes read while usage is known")

    assert context.check(_state(Limits(), conversation_bytes=10**8), never) is None
    known = _state(Limits(max_input_tokens=1000), conversation_bytes=500, last_tokens=990,
                   last_bytes=440)
    assert context.estimate(known, never) == 1005
    assert context.check(known, never) is not None
    fresh = _state(Limits(max_input_tokens=1000), conversation_bytes=400)
    assert context.estimate(fresh, lambda: 3600) == 1000
    assert context.check(fresh, lambda: 3600) is None
    assert context.check(fresh, lambda: 3601) is not None


def test_stopping_for_the_context_unsends_the_step_and_names_the_estimate() -> None:
    state = _state(Limits(max_input_tokens=1000, max_output_tokens=100),
                   conversation_bytes=2000, last_tokens=851, last_bytes=1800)
    plan = begin_step(state, 0.0)
    assert not isinstance(plan, StopReason) and state.steps == 1
    detail = context.check(state, lambda: 0)
    assert detail == ("estimated 901 input tokens + max_output_tokens 100 = 1001 > context "
                      "window 1000 (max_input_tokens): the request was not sent")
    assert context.exhausted(state, detail) == StopReason.CONTEXT_EXHAUSTED
    assert state.reason == "context_exhausted" and state.steps == 0
    assert [(e.event, e.detail) for e in state.events] == [
        ("context_exhausted", detail), ("stopped:context_exhausted", None)]


def test_max_input_tokens_is_a_positive_int_above_max_output_tokens() -> None:
    assert Limits(max_input_tokens=8192).max_input_tokens == 8192
    for bad in (0, -1, 1.5, "4096", True):
        with pytest.raises(ValidationError, match="max_input_tokens"):
            Limits.model_validate({"max_input_tokens": bad})
    with pytest.raises(ValidationError, match=r"max_output_tokens .* must be less than "
                                              "max_input_tokens"):
        Limits(max_input_tokens=1000, max_output_tokens=1000)
    # Unset, it is not in the settings' JSON (runs of before read the same).
    assert "max_input_tokens" not in Limits().model_dump_json()
    assert "context" not in Policy().model_dump_json()
    assert "context_keep" not in Policy(context="trim").model_dump_json()
    with pytest.raises(ValidationError, match="context"):
        Policy.model_validate({"context": "forget"})  # `stop` and `trim` exist


def _resolve(op: dict[str, Any], limits: dict[str, Any],
             model: str = "small") -> RunSettings | list[Refusal]:
    return resolve(OperatorPolicy.model_validate(op),
                   RunSettings.model_validate({"model": model, "limits": limits}),
                   tools=[], declared={})


def test_the_operators_window_is_the_runs_unless_it_asks_less() -> None:
    op = {"context_windows": {"small": 4096}}
    given = _resolve(op, {})
    assert isinstance(given, RunSettings) and given.limits.max_input_tokens == 4096
    tighter = _resolve(op, {"max_input_tokens": 2000})
    assert isinstance(tighter, RunSettings) and tighter.limits.max_input_tokens == 2000
    other = _resolve(op, {}, model="large")  # no window known for it
    assert isinstance(other, RunSettings) and other.limits.max_input_tokens is None


def test_a_run_asking_more_than_the_operators_window_is_refused_naming_the_field() -> None:
    refused = _resolve({"context_windows": {"small": 4096}}, {"max_input_tokens": 100_000})
    assert refused == [Refusal(field="limits.max_input_tokens", asked="100000",
                               operator="at most 4096 (the context window of small)")]
    # A ceiling of limits.max works as for any limit.
    ceiling = _resolve({"limits": {"max": {"max_input_tokens": 1000}}},
                       {"max_input_tokens": 5000})
    assert isinstance(ceiling, list) and [r.field for r in ceiling] == [
        "limits.max_input_tokens"]


def test_a_window_the_output_cap_does_not_fit_is_refused_not_raised() -> None:
    refused = _resolve({"context_windows": {"small": 1000}}, {"max_output_tokens": 1000})
    assert isinstance(refused, list) and refused[0].field == "limits"
    assert "must be less than max_input_tokens" in refused[0].operator


def test_a_bad_window_in_the_operators_table_is_refused() -> None:
    for bad in (0, -5, "4096", 2.5):
        with pytest.raises(ValidationError, match="context_windows"):
            OperatorPolicy.model_validate({"context_windows": {"small": bad}})


OPENAI = {"error": {"message": "This model's maximum context length is 128000 tokens. "
                               "However, your messages resulted in 130512 tokens.",
                    "type": "invalid_request_error", "param": "messages",
                    "code": "context_length_exceeded"}}
LLAMA_CPP = {"error": {"code": 400, "message": "the request exceeds the available context "
                                               "size, try increasing it",
                       "type": "exceed_context_size_error", "n_prompt_tokens": 5012,
                       "n_ctx": 4096}}
VLLM = {"object": "error", "message": "This model's maximum context length is 4096 tokens. "
                                      "However, you requested 5000 tokens (4900 in the "
                                      "messages, 100 in the completion). Please reduce the "
                                      "length of the messages or completion.",
        "type": "BadRequestError", "param": None, "code": 400}


@pytest.mark.parametrize(("body", "told"), [
    (OPENAI, ": 130512 tokens asked, context window 128000"),
    (OPENAI["error"], ": 130512 tokens asked, context window 128000"),  # as the SDK hands it
    (LLAMA_CPP, ": 5012 tokens asked, context window 4096"),
    (VLLM, ": 5000 tokens asked, context window 4096"),
    ({"error": {"message": "prompt too long", "code": "context_length_exceeded"}}, ""),
])
def test_providers_context_errors_are_recognised(body: Any, told: str) -> None:
    assert mf.context_too_long(body)
    failure = mf.context_failure(400, "127.0.0.1:8080", body)
    assert failure.kind == mf.CONTEXT_LENGTH_EXCEEDED == "context_length_exceeded"
    assert failure.detail == f"HTTP 400 (over the model's context window{told}) from " \
                             "127.0.0.1:8080"
    assert "max_input_tokens" in mf.hint(failure.kind)


@pytest.mark.parametrize("body", [
    None, "oops", {"error": {"message": "rate limited", "type": "rate_limit"}},
    {"error": {"message": "Invalid 'tools[0].name'", "code": "invalid_value"}},
])
def test_other_errors_are_not_context_errors(body: Any) -> None:
    assert not mf.context_too_long(body)


def test_context_exhausted_has_its_next_check_and_its_own_exit_code() -> None:
    assert StopReason.CONTEXT_EXHAUSTED == "context_exhausted"
    assert "max_input_tokens" in NEXT_CHECK[StopReason.CONTEXT_EXHAUSTED]
    assert int(ExitCode.CONTEXT_EXHAUSTED) not in {int(c) for c in ExitCode
                                                   if c != ExitCode.CONTEXT_EXHAUSTED}


# --- the `trim` strategy: which outputs go as stubs -----------------------------------


def _outputs(sizes: list[int]) -> list[tuple[dict[str, Any], int]]:
    """Tool outputs c0, c1, ... of `sizes` characters, each with its JSON bytes."""
    items = [{"type": "function_call_output", "call_id": f"c{i}", "output": "x" * n}
             for i, n in enumerate(sizes)]
    return [(item, json_bytes(item)) for item in items]


def _trim(window: int, trimmed: int = 0, keep: int = 2) -> context.Trim:
    return context.Trim(window=window, keep=keep, trimmed=trimmed, fixed_bytes=0)


def test_a_conversation_that_fits_is_sent_whole() -> None:
    outputs = _outputs([400] * 5)
    size = sum(n for _, n in outputs) + 200
    fitted = context.trim_outputs(outputs, size, _trim(window=10_000))
    assert fitted is not None
    stubs, trimmed = fitted
    assert (stubs, trimmed.outputs) == ([], 0)


def test_over_the_window_every_output_but_the_newest_keep_is_a_stub() -> None:
    outputs = _outputs([4000] * 5)  # ~5,000 tokens in all
    size = sum(n for _, n in outputs) + 200
    fitted = context.trim_outputs(outputs, size, _trim(window=3000, keep=2))
    assert fitted is not None
    stubs, trimmed = fitted
    assert [s["call_id"] for s in stubs] == ["c0", "c1", "c2"] and trimmed.outputs == 3
    assert trimmed.tokens_after < 3000 < trimmed.tokens_before
    told = json.loads(stubs[0]["output"])
    assert told["status"] == "trimmed" and told["bytes"] == 4000
    assert context.RECALL_TOOL in told["message"] and "'c0'" in told["message"]


def test_the_stubs_the_last_request_sent_are_sent_again_even_when_it_would_fit() -> None:
    outputs = _outputs([400] * 5)
    size = sum(n for _, n in outputs) + 200
    fitted = context.trim_outputs(outputs, size, _trim(window=10_000, trimmed=2))
    assert fitted is not None
    stubs, trimmed = fitted
    assert [s["call_id"] for s in stubs] == ["c0", "c1"] and trimmed.outputs == 2


def test_what_does_not_fit_even_trimmed_is_not_sent() -> None:
    outputs = _outputs([4000] * 5)
    size = sum(n for _, n in outputs) + 200
    assert context.trim_outputs(outputs, size, _trim(window=1500, keep=2)) is None
