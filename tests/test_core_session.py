"""The session's pure decisions (`boundloop.core.session`): no Temporal, no I/O."""

from __future__ import annotations

import json
from typing import Any

from boundloop.core import envelope as env
from boundloop.core.conversation import ConversationMeta
from boundloop.core.limits import Limits
from boundloop.core.reasons import StopReason
from boundloop.core.session import (
    MAX_WAITING,
    NOT_RUN,
    Continuation,
    SessionLimits,
    SessionState,
    TurnSummary,
    closing_outputs,
    end_reason,
    record_turn,
    refusal,
    turn_id,
    turn_limits,
)
from boundloop.core.turn import FunctionCall

NOW = "2026-12-01T09:00:00+00:00"


def state(**kw: Any) -> SessionState:
    return SessionState(idle_since=NOW, **kw)


def summary(turn: int, tokens: int) -> TurnSummary:
    return TurnSummary(turn=turn, workflow_id=turn_id("s", turn), reason=StopReason.COMPLETED,
                       steps=2, tool_executions=1, total_tokens=tokens)


def test_turn_ids_are_scoped_by_the_session_and_differ_per_turn() -> None:
    assert turn_id("s", 1) == "s/turn-1" != turn_id("s", 2)


def test_each_turns_token_threshold_is_at_most_what_the_session_has_left() -> None:
    limits = Limits(token_threshold=8000)
    assert turn_limits(limits, SessionLimits(), state(total_tokens=10**6)) == limits
    budget = SessionLimits(token_budget=10000)
    assert turn_limits(limits, budget, state(total_tokens=1000)).token_threshold == 8000
    assert turn_limits(limits, budget, state(total_tokens=7000)).token_threshold == 3000


def test_a_message_is_refused_while_a_turn_runs_and_after_the_end() -> None:
    limits = SessionLimits(max_turns=2, token_budget=500)
    assert refusal(state(), limits, None) is None
    assert "s/turn-1 is still running" in (refusal(state(turns=1), limits, "s/turn-1") or "")
    assert "max_turns" in (refusal(state(turns=2), limits, None) or "")
    assert "token_budget" in (refusal(state(turns=1, total_tokens=500), limits, None) or "")
    assert "requested" in (refusal(state(ended="requested"), limits, None) or "")
    assert end_reason(state(turns=1, total_tokens=499), limits) is None


def test_queue_and_interrupt_take_a_message_while_a_turn_runs_up_to_the_turns_left() -> None:
    for busy in ("queue", "interrupt"):
        limits = SessionLimits(max_turns=3, busy=busy)  # type: ignore[arg-type]
        assert refusal(state(turns=1), limits, "s/turn-1") is None
        assert refusal(state(turns=1), limits, "s/turn-1", waiting=1) is None
        # Turn 1 runs and two messages wait: they take turns 2 and 3, the last ones.
        assert "max_turns" in (refusal(state(turns=1), limits, "s/turn-1", waiting=2) or "")
    crowded = SessionLimits(busy="queue")
    assert "already wait" in (refusal(state(turns=1), crowded, "s/turn-1",
                                      waiting=MAX_WAITING) or "")


def test_a_finished_turn_adds_its_counts_and_becomes_what_the_next_continues() -> None:
    s = state()
    follows = Continuation(base=None, conversation=ConversationMeta())
    record_turn(s, summary(1, 120), input_tokens=100, output_tokens=20, cost_usd=None,
                follows=follows, now="later")
    record_turn(s, summary(2, 240), input_tokens=200, output_tokens=40, cost_usd=0.5,
                follows=follows, now="latest")
    assert (s.steps, s.tool_executions, s.total_tokens, s.input_tokens) == (4, 2, 360, 300)
    assert s.cost_usd == 0.5 and s.last == summary(2, 240) and s.idle_since == "latest"


def test_open_calls_get_their_real_output_if_they_ran_else_a_not_run_envelope() -> None:
    calls = [FunctionCall(call_id=c, name="lookup_stock", arguments="{}") for c in "abc"]
    ran = env.success({"sku": "A-001"})
    refused = env.blocked("IDENTICAL_CALL_LIMIT", "blocked")
    out = closing_outputs(calls, {"a": (ran, "wf/step-1/call-0"), "b": (refused, None)},
                          StopReason.TOOL_ERROR)
    assert [(c, e, k) for c, e, k in out][:2] == [("a", ran, "wf/step-1/call-0"),
                                                   ("b", refused, None)]
    call_id, envelope, key = out[2]
    assert (call_id, key, envelope.error_code) == ("c", None, NOT_RUN)
    text = json.loads(envelope.to_output())
    assert text["status"] == "blocked" and "tool_error" in text["message"]
