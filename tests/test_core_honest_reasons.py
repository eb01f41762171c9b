"""The core never reports `completed` for a run a limit cut short.

Pure decisions only: forced answers name their limit, invalid and unknown calls count
toward the identical-call limit by fingerprint, text that looks like a tool call is
flagged, and the messages the model gets say how to stop.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boundloop.core import envelope as env
from boundloop.core.answer_shape import looks_like_tool_call
from boundloop.core.fingerprint import fingerprint, invalid_fingerprint
from boundloop.core.limits import Limits, Policy, RunSettings
from boundloop.core.loop import (
    Execute,
    LoopState,
    Reply,
    StepPlan,
    ToolOutcome,
    begin_step,
    plan_calls,
    record_outcome,
)
from boundloop.core.reasons import StopReason
from boundloop.core.turn import Turn, Usage
from tests.support import strategies

RULES = strategies.demo_rules()
TOOLS = list(RULES)
SCHEMA_ECHO = '{"sku": "A-001", "required": ["sku"], "type": "object"}'
CALL_AS_TEXT = '{"name": "lookup_stock", "arguments": {"sku": "A-001"}}'
USAGE = Usage(input_tokens=1, output_tokens=1, total_tokens=2)


def new_state(limits: Limits | None = None, policy: Policy | None = None) -> LoopState:
    return LoopState(settings=RunSettings(model="m", limits=limits or Limits(),
                                          policy=policy or Policy(approval="never")),
                     allowed_tools=TOOLS)


CALL_IDS = itertools.count(1)


def calls(*specs: tuple[str, str]) -> Turn:
    """One response with these calls; call ids are unique across the whole test run."""
    return Turn(items=[{"type": "function_call", "call_id": f"c{next(CALL_IDS)}",
                        "name": name, "arguments": args} for name, args in specs],
                usage=USAGE)


def text(answer: str) -> Turn:
    return Turn(items=[{"type": "message", "role": "assistant",
                        "content": [{"type": "output_text", "text": answer}]}], usage=USAGE)


def step(state: LoopState, turn: Turn, *, terminal: bool = False) -> StopReason | None:
    """One step through the core; executed calls succeed (terminally when asked)."""
    plan = begin_step(state, 0.0)
    if isinstance(plan, StopReason):
        return plan
    decided = plan_calls(state, turn, plan, RULES, "wf")
    if isinstance(decided, StopReason):
        return decided
    for p in decided:
        if isinstance(p, Execute):
            outcome = ToolOutcome(envelope=env.success({"ok": True}, terminal=terminal))
            assert not isinstance(record_outcome(state, p, outcome, RULES), StopReason)
    return None


# --- the real model's two sequences ------------------------------------------------


def test_tool_call_text_on_the_forced_last_step_is_max_steps_and_flagged() -> None:
    state = new_state()
    for sku in ("B-002", "B-002", "A-001", "A-001"):
        assert step(state, calls(("lookup_stock", json.dumps({"sku": sku})))) is None
    assert step(state, text(CALL_AS_TEXT)) == StopReason.MAX_STEPS
    assert (state.text, state.answer_looks_like_tool_call) == (CALL_AS_TEXT, True)
    assert state.tool_executions == 4
    assert [e.event for e in state.events][-2:] == ["answer_looks_like_tool_call",
                                                    "stopped:max_steps"]


def test_identical_invalid_calls_are_blocked_and_end_max_identical_calls() -> None:
    state = new_state()
    first = begin_step(state, 0.0)
    assert isinstance(first, StepPlan)
    replies = []
    for _ in range(3):
        if replies:
            plan = begin_step(state, 0.0)
            assert isinstance(plan, StepPlan) and plan.tool_choice == "auto"
        else:
            plan = first
        decided = plan_calls(state, calls(("lookup_stock", SCHEMA_ECHO)), plan, RULES, "wf")
        assert isinstance(decided, list) and isinstance(decided[0], Reply)
        replies.append(decided[0])
    assert [r.envelope.status for r in replies] == ["invalid_input", "invalid_input",
                                                     "blocked"]
    assert replies[2].envelope.error_code == "IDENTICAL_CALL_LIMIT"
    assert len({r.fingerprint for r in replies}) == 1
    forced = begin_step(state, 0.0)
    assert isinstance(forced, StepPlan) and forced.tool_choice == "none"
    assert plan_calls(state, calls(("lookup_stock", SCHEMA_ECHO)), forced, RULES,
                      "wf") == StopReason.MAX_IDENTICAL_CALLS
    assert state.tool_executions == 0


# --- who may complete ----------------------------------------------------------------


def test_answer_after_a_terminal_success_completes_even_on_the_last_step() -> None:
    state = new_state(Limits(max_steps=2))
    assert step(state, calls(("lookup_stock", '{"sku": "A-001"}')), terminal=True) is None
    assert state.force_final and state.goal_reached
    assert step(state, text("done")) == StopReason.COMPLETED


def test_repeat_of_a_rejected_call_forces_the_answer_and_ends_max_identical_calls() -> None:
    state = new_state()
    state.rejected_fingerprints.append(fingerprint("lookup_stock", {"sku": "A-001"}))
    assert step(state, calls(("lookup_stock", '{"sku": "A-001"}'))) is None
    assert state.force_final
    assert step(state, text("I will not.")) == StopReason.MAX_IDENTICAL_CALLS


def test_forbidden_tool_event_names_the_tool() -> None:
    state = new_state()
    assert step(state, calls(("rm_rf", "{}"))) == StopReason.FORBIDDEN_TOOL
    assert [(e.event, e.tool) for e in state.events if e.event == "forbidden_tool"] == [
        ("forbidden_tool", "rm_rf")]


def test_repeated_unknown_tool_under_report_is_blocked_past_the_limit() -> None:
    state = new_state(Limits(max_identical_calls=1, max_steps=8),
                      Policy(unknown_tool="report", approval="never"))
    assert step(state, calls(("get_weather", '{"city": "Tokyo"}'))) is None
    assert not state.force_final
    assert step(state, calls(("get_weather", '{"city":"Tokyo"}'))) is None  # same fingerprint
    assert state.force_final and state.pending_limit == StopReason.MAX_IDENTICAL_CALLS
    assert step(state, text("no weather tool")) == StopReason.MAX_IDENTICAL_CALLS


ACTIONS = st.sampled_from([
    ("lookup_stock", '{"sku": "A-001"}'), ("lookup_stock", '{"sku": "B-002"}'),
    ("lookup_stock", SCHEMA_ECHO), ("lookup_stock", "{not json"), ("search_docs", "[]"),
    ("get_weather", '{"city": "Tokyo"}'), ("", "{}"),
])
TURNS = st.one_of(
    st.lists(ACTIONS, min_size=1, max_size=3).map(lambda specs: calls(*specs)),
    st.sampled_from([text("A-001は12個です。"), text(CALL_AS_TEXT), text("")]))


@settings(max_examples=300, deadline=None)
@given(turns=st.lists(TURNS, min_size=1, max_size=12),
       max_steps=st.integers(1, 6), max_identical=st.integers(1, 3),
       unknown=st.sampled_from(["stop", "report"]))
def test_no_sequence_ends_completed_unless_the_model_answered_while_free(
        turns: list[Turn], max_steps: int, max_identical: int, unknown: Any) -> None:
    state = new_state(Limits(max_steps=max_steps, max_identical_calls=max_identical,
                             max_tool_executions=100),
                      Policy(unknown_tool=unknown, approval="never"))
    last: StepPlan | None = None
    for turn in [*turns, text("final answer")]:
        plan = begin_step(state, 0.0)
        if isinstance(plan, StopReason):
            break
        last = plan
        decided = plan_calls(state, turn, plan, RULES, "wf")
        if isinstance(decided, StopReason):
            break
        for p in decided:
            if isinstance(p, Execute):
                record_outcome(state, p, ToolOutcome(envelope=env.success({})), RULES)
    assert state.reason is not None
    if state.reason == StopReason.COMPLETED:
        assert last is not None and last.tool_choice == "auto" and not last.last
    # No fingerprint was answered more than the limit allows (refusals included).
    assert all(n <= max_identical for n in state.identical_calls.values())


# --- tool calls written as text ----------------------------------------------------


@pytest.mark.parametrize("answer", [
    CALL_AS_TEXT,
    f"  {CALL_AS_TEXT}\n",
    f"I will look it up:\n```json\n{CALL_AS_TEXT}\n```",
    '```\n{"name": "any_tool", "arguments": {}}\n```',
    '{"tool": "lookup_stock"}',
    '{"name": "x", "parameters": {"q": 1}}',
    '[{"type": "function", "function": {"name": "lookup_stock", "arguments": "{}"}}]',
    '{"tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}',
    '{"lookup_stock": {"sku": "A-001"}}',
    '<tool_call>\n{"name": "lookup_stock", "arguments": {"sku": "A-001"}}\n</tool_call>',
])
def test_text_shaped_like_a_tool_call_is_recognised(answer: str) -> None:
    assert looks_like_tool_call(answer, TOOLS)


@pytest.mark.parametrize("answer", [
    "A-001は12個、B-002は在庫切れです。",
    '{"sku": "A-001", "quantity": 12}',
    '{"name": "Alice"}',
    "```python\nprint('name', 'arguments')\n```",
    'The tool "lookup_stock" says 12.',
    "{not json",
    "",
])
def test_ordinary_answers_are_not_flagged(answer: str) -> None:
    assert not looks_like_tool_call(answer, TOOLS)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="{[")))
def test_text_without_a_json_object_or_list_is_never_flagged(answer: str) -> None:
    assert not looks_like_tool_call(answer, TOOLS)


# --- fingerprints of invalid calls --------------------------------------------------


def test_invalid_arguments_fingerprint_like_valid_ones_whatever_the_spelling() -> None:
    assert invalid_fingerprint("t", '{"b": 1, "a": [1]}') == invalid_fingerprint(
        "t", '{ "a":[1],\n"b":1 }') == fingerprint("t", {"a": [1], "b": 1})


def test_text_that_is_not_json_fingerprints_by_its_exact_text() -> None:
    assert invalid_fingerprint("t", "{sku: A-001") != invalid_fingerprint("t", "{sku:A-001")
    assert invalid_fingerprint("t", "abc") != fingerprint("t", "abc")  # not the JSON "abc"
    assert invalid_fingerprint("t", "abc") != invalid_fingerprint("u", "abc")
    assert invalid_fingerprint("t", '"\\ud800"').startswith("t:")  # unpaired surrogate


def test_a_long_unknown_tool_name_gives_a_short_fingerprint_still_telling_names_apart() -> None:
    long_a, long_b = "x" * 5000 + "a", "x" * 5000 + "b"
    fa, fb = invalid_fingerprint(long_a, "{}"), invalid_fingerprint(long_b, "{}")
    assert fa != fb and len(fa.encode()) <= 60 + 17


# --- messages that help the model stop --------------------------------------------


def test_unknown_tool_message_lists_the_available_tools() -> None:
    message = env.unknown_tool("get_weather", ["lookup_stock", "search_docs"]).message
    assert "'get_weather'" in message
    assert message.endswith("Available tools: lookup_stock, search_docs.")


def test_exhausted_timeout_message_says_seconds_and_attempts() -> None:
    e = env.tool_timed_out(30.0, 3)
    assert (e.status, e.retryable) == ("temporary_error", False)
    assert "timed out after 30 s, 3 attempts" in e.message


@pytest.mark.parametrize(("arguments", "says"), [
    (SCHEMA_ECHO, "unexpected fields 'required', 'type' (expected fields: sku); send the "
                  "argument values only, not the schema"),
    ("{}", "missing field 'sku' (expected fields: sku)"),
    ('{"sku": 7}', "field 'sku': Input should be a valid string (expected fields: sku)"),
])
def test_invalid_input_says_which_field_and_what_was_expected(arguments: str,
                                                              says: str) -> None:
    state = new_state()
    plan = begin_step(state, 0.0)
    assert isinstance(plan, StepPlan)
    decided = plan_calls(state, calls(("lookup_stock", arguments)), plan, RULES, "wf")
    assert isinstance(decided, list) and isinstance(decided[0], Reply)
    assert decided[0].envelope.message == (
        f"arguments do not match the lookup_stock schema: {says}")
