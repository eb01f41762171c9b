"""The `summarize` context strategy in the pure core (boundloop/core/context.py) and in
the run's step order (boundloop/core/driver.py), driven with plain values: where the
conversation may be cut, what the summary replaces, how its request is charged, and
the commands a summarizing step gives."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from boundloop.core import context as ctx
from boundloop.core import driver
from boundloop.core import envelope as env
from boundloop.core import model_failures as mf
from boundloop.core.conversation import (
    ConversationMeta,
    Item,
    SummaryRef,
    to_chat_messages,
    user_message,
)
from boundloop.core.limits import Limits, Policy, RunSettings
from boundloop.core.loop import LoopState, ToolOutcome
from boundloop.core.reasons import StopReason
from boundloop.core.turn import Summarized, Turn, Usage
from boundloop.scripted.validation import (
    reasoning_requirements,
    validate_chat_request,
    validate_responses_request,
)
from tests.test_core_driver import USAGE, Shell, calls, text


def fc(call_id: str, name: str = "lookup_stock") -> Item:
    return {"type": "function_call", "call_id": call_id, "name": name,
            "arguments": json.dumps({"sku": call_id})}


def out(call_id: str, size: int = 10) -> Item:
    return {"type": "function_call_output", "call_id": call_id, "output": "x" * size}


def reasoning(rid: str) -> Item:
    return {"type": "reasoning", "id": rid, "summary": [], "encrypted_content": f"enc-{rid}"}


def said(answer: str) -> Item:
    return {"type": "message", "role": "assistant",
            "content": [{"type": "output_text", "text": answer}]}


#: A session-like conversation: a question, a turn with reasoning and a call, a turn of
#: two calls, an answer, a second question and a turn with reasoning and a call.
ITEMS: list[Item] = [
    user_message("q1"),                               # 0
    reasoning("r1"), fc("c1"),                        # 1, 2
    out("c1"),                                        # 3
    fc("c2"), fc("c3"),                               # 4, 5
    out("c2"), out("c3"),                             # 6, 7
    said("answer"),                                   # 8
    user_message("q2"),                               # 9
    reasoning("r4"), fc("c4"),                        # 10, 11
    out("c4"),                                        # 12
]
#: The calls the provider served with a reasoning item that must come back with them.
REASONED = {**reasoning_requirements(ITEMS[1:3]), **reasoning_requirements(ITEMS[10:12])}


def test_the_cut_falls_between_turns_and_never_parts_a_call_from_its_output() -> None:
    # After the question; after c1's output; after both outputs of the two-call turn (not
    # between them); after the answer (a user message follows); after the second
    # question; at the end. Never after the reasoning, a call, or the first of two outputs.
    assert ctx.cut_points(ITEMS) == [1, 4, 8, 9, 10, 13]
    assert ctx.cut_points(ITEMS, start=4) == [8, 9, 10, 13]


@pytest.mark.parametrize("cut", ctx.cut_points(ITEMS))
def test_every_cut_leaves_a_conversation_both_apis_accept(cut: int) -> None:
    """The scripted server's validators (the APIs' own rules: each call answered once,
    each output after its call, a served reasoning item before its call)."""
    sent = list(ctx.with_summary(ITEMS, cut, ctx.summary_item("s")))
    assert sent[0] == ctx.summary_item("s") and sent[1:] == ITEMS[cut:]
    assert validate_responses_request({"model": "m", "input": sent},
                                      required_reasoning=REASONED) == []
    assert validate_chat_request({"model": "m", "messages": to_chat_messages(sent, "i")}) == []


def spec(window: int = 100_000, keep: int = 2, summary_tokens: int = 100,
         max_output_tokens: int | None = None, fixed_bytes: int = 400) -> ctx.Summarize:
    return ctx.Summarize(key="k", window=window, max_output_tokens=max_output_tokens,
                         summary_tokens=summary_tokens, keep=keep, fixed_bytes=fixed_bytes,
                         tokens_before=0)


def test_the_cut_keeps_the_newest_outputs_whole() -> None:
    # keep 2: c3's and c4's outputs stay, so the cut is before c2's and c3's turn.
    assert ctx.summary_cut(ITEMS, None, None, spec(keep=2)) == 4
    assert ctx.summary_cut(ITEMS, None, None, spec(keep=1)) == 10
    assert ctx.summary_cut(ITEMS, None, None, spec(keep=0)) == 13
    # Fewer outputs than `keep`: every one stays; only the question may go.
    assert ctx.summary_cut(ITEMS, None, None, spec(keep=9)) == 1
    # A second summary starts after the first one's cut; none is left before the limit.
    first = SummaryRef(key="k0", count=4, digest="", removed=0)
    assert ctx.summary_cut(ITEMS, first, "s", spec(keep=2)) is None
    assert ctx.summary_cut(ITEMS, first, "s", spec(keep=1)) == 10


def test_a_summary_request_that_would_not_fit_cuts_less_or_not_at_all() -> None:
    big = [user_message("q"), fc("a"), out("a", 4000), fc("b"), out("b", 4000), fc("c"),
           out("c", 40)]
    # Summarizing both big outputs needs ~2,000 tokens: in a 2,000-token window with
    # 100 for the summary, only the first one may go (then ~1,000 stay: it fits).
    assert ctx.summary_cut(big, None, None, spec(window=10_000, keep=1)) == 5
    assert ctx.summary_cut(big, None, None, spec(window=2_000, keep=1)) == 3
    # Nothing may be summarized that lets the step's request fit: none.
    assert ctx.summary_cut(big, None, None, spec(window=1_300, keep=1)) is None


def state(limits: Limits, **policy: Any) -> LoopState:
    settings = RunSettings(model="m", limits=limits,
                           policy=Policy(context="summarize", **policy))
    return LoopState(settings=settings, allowed_tools=[])


def summary_turn(removed: int, usage: Usage | None = USAGE, summary: str = "summary",
                 count: int = 2) -> Turn:
    return Turn(items=[said(summary)], usage=usage, summarized=Summarized(
        count=count, removed=removed, tokens_before=900, tokens_after=300, input_bytes=2000))


def test_the_summary_counts_in_the_totals_and_the_next_estimate_is_what_is_sent() -> None:
    s = state(Limits(max_input_tokens=1000, token_threshold=10_000))
    s.conversation = ConversationMeta(count=9, bytes=4000)
    s.last_tokens, s.last_bytes = 950, 3000
    s.steps = 3
    s.log("model_requested")
    assert ctx.note_summarized(s, summary_turn(removed=3000), spec()) is None
    assert s.summary == SummaryRef(key="k", count=2, digest=ctx.text_digest("summary"),
                                   removed=3000)
    assert s.summaries == 1 and s.usage.total_tokens == USAGE.total_tokens
    assert s.events[-1].event == ctx.SUMMARIZED_EVENT
    assert (s.events[-1].detail or "").startswith("900 tokens before, 300 after (estimated)")
    # What is sent now: 1,000 bytes of the conversation (and 400 fixed) at 4 a token.
    assert ctx.estimate(s, lambda: 400) == 350
    # A response after it reports its usage: the bytes added since count on top of it.
    s.last_tokens, s.last_bytes = 320, 4000
    s.conversation = ConversationMeta(count=10, bytes=4400)
    assert ctx.estimate(s, lambda: 400) == 420


def test_a_summary_over_the_token_threshold_stops_the_run_before_the_step_is_sent() -> None:
    s = state(Limits(max_input_tokens=1000, token_threshold=10))
    s.steps = 3
    s.log("model_requested")
    assert ctx.note_summarized(s, summary_turn(removed=10), spec()) == StopReason.USAGE_LIMIT
    assert s.steps == 2 and "model_requested" not in [e.event for e in s.events]
    # The summary's event and the stop's are of the same step: the log never goes back.
    assert [(e.step, e.event) for e in s.events] == [
        (2, ctx.SUMMARIZED_EVENT), (2, "stopped:usage_limit")]
    # Without usage and a policy that stops on it: usage_unknown; estimated otherwise.
    s = state(Limits(max_input_tokens=1000))
    s.steps = 1
    assert ctx.note_summarized(s, summary_turn(10, usage=None), spec()) \
        == StopReason.USAGE_UNKNOWN
    s = state(Limits(max_input_tokens=1000), missing_usage="estimate")
    s.steps = 1
    assert ctx.note_summarized(s, summary_turn(10, usage=None), spec()) is None
    assert s.usage.estimated and s.usage.input_tokens == 2000 // 4


def test_an_empty_summary_ends_context_exhausted() -> None:
    s = state(Limits(max_input_tokens=1000))
    s.steps = 1
    assert ctx.note_summarized(s, summary_turn(10, summary=" "), spec()) \
        == StopReason.CONTEXT_EXHAUSTED
    assert s.summary is None
    assert s.usage.total_tokens == USAGE.total_tokens  # charged all the same


# --- the driver ----------------------------------------------------------------------

BIG = {"text": "x" * 1200}  # a tool output of over 300 tokens
#: A 300-token window: the question fits, the question and one big output do not.
WINDOW = Limits(max_input_tokens=300, max_output_tokens=50, max_identical_calls=2)


@dataclass
class Summarizing(Shell):
    """The shell, answering summary requests: each summary leaves 40 bytes of the
    conversation (and the 100 fixed ones), so the next request fits."""

    leave: int = 40
    #: Model attempts answered with the provider's refusal as too long (by number).
    too_long: tuple[int, ...] = ()
    #: Model attempts the activity itself refused: no summary lets them fit (by number).
    not_fitted: tuple[int, ...] = ()
    summaries: list[driver.BuildSummaryRequest] = field(default_factory=list)
    attempt: int = 0
    pending: bool = False  # the request built last is a summary request

    def answer(self, c: driver.Command) -> object:
        if isinstance(c, driver.BuildSummaryRequest):
            self.summaries.append(c)
            self.pending = True
            return 1000
        if isinstance(c, driver.BuildModelRequest):
            self.pending = False
        if isinstance(c, driver.AttemptModel):
            self.attempt += 1
            if self.attempt in self.too_long:
                return driver.AttemptFailed("failed", None, mf.ModelFailure(
                    kind=mf.CONTEXT_LENGTH_EXCEEDED, detail="over"))
            if self.attempt in self.not_fitted:
                return driver.AttemptFailed("failed", None, mf.ModelFailure(
                    kind=mf.CONTEXT_NOT_FITTED, detail="no summary lets it fit"))
            if self.pending:
                return summary_turn(removed=self.state.conversation.bytes - self.leave)
        return super().answer(c)


def summarizing(turns: list[Turn], **kw: Any) -> Summarizing:
    kw.setdefault("limits", WINDOW)
    kw.setdefault("policy", Policy(approval="never", context="summarize"))
    shell = Summarizing(turns, charged=True,
                        tool=lambda c: ToolOutcome(envelope=env.success(BIG)), **kw)
    shell.patches.add(driver.SUMMARIZE)
    return shell


STEP = ["Publish", "BuildModelRequest", "AttemptModel"]
TOOL = ["BuildToolRequest", "RunTool", "Publish"]
SUMMARY = ["AskPatch", "BuildSummaryRequest", "AttemptModel"]


def test_a_request_that_would_not_fit_is_sent_after_one_summary() -> None:
    shell = summarizing([calls(("lookup_stock", {"sku": "A-001"})), text("done")])
    assert shell.go() == StopReason.COMPLETED
    assert shell.kinds() == [*STEP, *TOOL, *SUMMARY, *STEP]
    assert shell.commands[len(STEP + TOOL)] == driver.AskPatch(driver.SUMMARIZE)
    [build] = shell.summaries
    assert build.plan.step == 2 and build.summarize.key == "wf/run/step-2/summary"
    assert build.summarize.summary_tokens == 50  # a quarter of 300, at most the cap
    assert shell.state.summaries == 1 and shell.state.summary is not None
    assert shell.state.steps == 2  # the summary request is no step
    # Its usage is in the run's totals like a step's.
    assert shell.state.usage.total_tokens == 3 * USAGE.total_tokens
    assert shell.events()[3:6] == ["model_requested", ctx.SUMMARIZED_EVENT, "model_returned"]


def test_a_summary_shares_the_steps_reservation_and_settlement() -> None:
    shell = summarizing([calls(("lookup_stock", {"sku": "A-001"})), text("done")],
                        budget="team")
    assert shell.go() == StopReason.COMPLETED
    second = shell.kinds()[shell.kinds().index("BuildSummaryRequest"):]
    assert second == ["BuildSummaryRequest", "ReserveBudget", "AttemptModel", "Publish",
                      "BuildModelRequest", "AttemptModel", "SettleBudget"]
    reserves = [c for c in shell.commands if isinstance(c, driver.ReserveBudget)]
    # The summary's worst case and the step's request's after it (the window and the cap).
    assert reserves[1].amount.tokens > WINDOW.max_input_tokens + 50  # type: ignore[operator]
    settle = [c for c in shell.commands if isinstance(c, driver.SettleBudget)][-1]
    assert settle.step == 2 and settle.amount.tokens == 2 * USAGE.total_tokens


def test_the_identical_call_limit_still_sees_a_call_made_before_the_summary() -> None:
    same = ("lookup_stock", {"sku": "A-001"})
    shell = summarizing([calls(same), calls(same), calls(same), text("forced")])
    assert shell.go() == StopReason.MAX_IDENTICAL_CALLS
    # The first call ran before any summary; summarized before each later step, the
    # third call is blocked all the same: the count is in the state, not the conversation.
    first_summary = shell.kinds().index("BuildSummaryRequest")
    assert shell.kinds()[:first_summary].count("RunTool") == 1
    assert shell.kinds().count("RunTool") == 2 and len(shell.summaries) == 2
    assert "blocked_identical" in shell.events()
    assert list(shell.state.identical_calls.values()) == [2]


def test_a_provider_refusal_as_too_long_summarizes_once_a_step() -> None:
    # The first request is refused as too long (the estimate let it through): one
    # summary, the same step's request again, answered.
    shell = summarizing([text("done")], too_long=(1,))
    assert shell.go() == StopReason.COMPLETED
    assert shell.kinds() == ["Publish", "BuildModelRequest", "AttemptModel", *SUMMARY,
                             "BuildModelRequest", "AttemptModel"]
    assert shell.events()[:3] == ["model_requested", "model_retried:context_length_exceeded",
                                  ctx.SUMMARIZED_EVENT]
    # Refused again after the summary: context_exhausted, never a second summary.
    shell = summarizing([text("never")], too_long=(1, 3))
    assert shell.go() == StopReason.CONTEXT_EXHAUSTED
    assert len(shell.summaries) == 1
    assert "model_failed:context_length_exceeded" in shell.events()


def test_a_summary_the_activity_cannot_make_fit_ends_context_exhausted_unsent() -> None:
    # The summary request (the second attempt) is refused by the activity itself: no cut
    # lets the step's request fit. Nothing went out: not a step, no provider failure,
    # the event says why, as under `stop`.
    shell = summarizing([calls(("lookup_stock", {"sku": "A-001"})), text("never")],
                        not_fitted=(2,))
    assert shell.go() == StopReason.CONTEXT_EXHAUSTED
    assert shell.state.steps == 1 and shell.events().count("model_requested") == 1
    assert not [e for e in shell.events() if e.startswith("model_failed")]
    assert shell.events()[-2:] == [ctx.EVENT, "stopped:context_exhausted"]
    assert shell.state.events[-2].detail == "no summary lets it fit"
    assert shell.state.usage.total_tokens == USAGE.total_tokens  # the first step only


def test_a_request_that_still_would_not_fit_after_the_summary_is_never_sent() -> None:
    shell = summarizing([calls(("lookup_stock", {"sku": "A-001"})), text("never")])
    shell.leave = 2000  # the summary leaves too much: still over the window
    assert shell.go() == StopReason.CONTEXT_EXHAUSTED
    assert shell.kinds()[-3:] == [*SUMMARY[1:], "AskPatch"]
    assert shell.commands[-1] == driver.AskPatch(driver.CONTEXT_WINDOW)
    assert shell.events()[-3:] == [ctx.SUMMARIZED_EVENT, ctx.EVENT, "stopped:context_exhausted"]
    assert shell.state.steps == 1


def test_a_summary_is_settled_when_the_run_stops_before_the_steps_request() -> None:
    shell = summarizing([calls(("lookup_stock", {"sku": "A-001"})), text("never")],
                        budget="team")
    shell.leave = 2000  # still over the window after it: context_exhausted
    assert shell.go() == StopReason.CONTEXT_EXHAUSTED
    settle = [c for c in shell.commands if isinstance(c, driver.SettleBudget)]
    assert [(c.step, c.amount.tokens) for c in settle] == [
        (1, USAGE.total_tokens), (2, USAGE.total_tokens)]


def test_a_run_that_stops_or_trims_never_summarizes() -> None:
    for policy in (Policy(approval="never"), Policy(approval="never", context="trim")):
        shell = summarizing([calls(("lookup_stock", {"sku": "A-001"})), text("done")],
                            policy=policy)
        shell.go()
        assert shell.summaries == [] and driver.AskPatch(driver.SUMMARIZE) not in shell.commands


def test_an_answer_after_a_summary_that_looks_like_a_tool_call_is_still_flagged() -> None:
    """The summary is never the answer, and the answer after it is checked as any is."""
    as_text = json.dumps({"name": "lookup_stock", "arguments": {"sku": "A-001"}})
    shell = summarizing([calls(("lookup_stock", {"sku": "A-001"})), text(as_text)])
    assert shell.go() == StopReason.COMPLETED and len(shell.summaries) == 1
    assert (shell.state.text, shell.state.answer_looks_like_tool_call) == (as_text, True)
    assert "answer_looks_like_tool_call" in shell.events()


def test_a_malformed_summary_answer_is_a_protocol_error() -> None:
    s = state(Limits(max_input_tokens=1000))
    s.steps = 1
    s.log("model_requested")
    malformed = summary_turn(10).model_copy(update={"fault": "unknown item type"})
    assert ctx.note_summarized(s, malformed, spec()) == StopReason.PROTOCOL_ERROR
    assert [e.event for e in s.events] == ["protocol_fault", "stopped:protocol_error"]
    assert s.summary is None and s.steps == 0
