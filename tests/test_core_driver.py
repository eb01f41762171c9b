"""The run's step order (boundloop/core/driver.py), driven with plain values: no server.

Each test plays the workflow's part: it answers the driver's commands (a model turn,
a tool outcome, a decision, a patch) and reads the commands it was given, in order.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from boundloop.core import carry, driver, mcp_tools, tree
from boundloop.core import envelope as env
from boundloop.core import model_failures as mf
from boundloop.core.budget import Amount, Grant
from boundloop.core.fingerprint import fingerprint
from boundloop.core.limits import Limits, Policy, RunSettings
from boundloop.core.loop import LoopState, ToolOutcome
from boundloop.core.reasons import StopReason
from boundloop.core.turn import Turn, Usage
from tests.support import strategies

RULES = strategies.demo_rules()
USAGE = Usage(input_tokens=10, output_tokens=5, total_tokens=15)
CALL_IDS = itertools.count(1)
TICKET = {"title": "Printer on fire", "description": "3F printer smokes", "priority": "high"}


def calls(*specs: tuple[str, dict[str, Any]]) -> Turn:
    return Turn(items=[{"type": "function_call", "call_id": f"c{next(CALL_IDS)}",
                        "name": name, "arguments": json.dumps(args)} for name, args in specs],
                usage=USAGE)


def text(answer: str) -> Turn:
    return Turn(items=[{"type": "message", "role": "assistant",
                        "content": [{"type": "output_text", "text": answer}]}],
                text=answer, usage=USAGE)


@dataclass
class View:
    seconds: float = 0.0
    suggested: bool = False
    interrupt: str | None = None
    reason: str | None = None

    def processing_seconds(self) -> float:
        return self.seconds

    def now(self) -> datetime:
        return datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=self.seconds)

    def continue_as_new_suggested(self) -> bool:
        return self.suggested

    def interrupted(self) -> str | None:
        return self.interrupt

    def cancel_reason(self) -> str | None:
        return self.reason

    def fixed_bytes(self) -> int:
        return 100


Answer = Callable[[driver.Command], object]


@dataclass
class Shell:
    """The workflow's part: answers each command, records them in order."""

    turns: list[Turn]
    limits: Limits = field(default_factory=Limits)
    policy: Policy = field(default_factory=lambda: Policy(approval="never"))
    budget: str | None = None
    view: View = field(default_factory=View)
    #: call_id -> how a waiting approval is decided ("approve", "reject", "timeout").
    decide: dict[str, str] = field(default_factory=dict)
    patches: set[str] = field(default_factory=lambda: {
        driver.CONTEXT_WINDOW, driver.CUT_AT_THE_CAP, driver.LOCAL_TOOLS})
    tool: Callable[[driver.RunTool], object] = lambda c: ToolOutcome(
        envelope=env.success({"ok": True}))
    grant: Grant = field(default_factory=lambda: Grant(granted=True, token="t"))
    #: A command type that is cancelled when given (the run's cancel arrives).
    cancel_at: type | None = None
    #: Under the charged-model-attempts patch: model attempts answered from `attempts`
    #: (an AttemptFailed, or None for the next turn).
    charged: bool = False
    attempts: list[driver.AttemptFailed | None] = field(default_factory=list)
    commands: list[driver.Command] = field(default_factory=list)
    #: What the earlier Temporal runs hold (answers LookUpEarlier).
    earlier: carry.EarlierCalls = field(default_factory=carry.EarlierCalls)
    #: The agents the model may call as tools, and how each child run ends.
    agents: list[tree.AgentTool] = field(default_factory=list)
    child: Callable[[driver.RunChild], object] = lambda c: None

    def __post_init__(self) -> None:
        settings = RunSettings(model="m", limits=self.limits, policy=self.policy,
                               budget=self.budget)
        self.state = LoopState(settings=settings, allowed_tools=[
            *RULES, *(a.name for a in self.agents)])
        rules = {**RULES, **{a.name: mcp_tools.tool_rule(a.declaration())
                             for a in self.agents}}
        self.run = driver.Run(self.state, rules, "wf/run", self.view, charged=self.charged,
                              agents={a.name: a for a in self.agents})

    def answer(self, c: driver.Command) -> object:
        match c:
            case driver.AskPatch(name):
                return name in self.patches
            case driver.Publish() | driver.SettleBudget():
                return None
            case driver.BuildModelRequest() | driver.BuildToolRequest():
                return 1000
            case driver.ReserveBudget():
                return self.grant
            case driver.RequestModel():
                return driver.Answered(self.turns.pop(0))
            case driver.AttemptModel():
                failed = self.attempts.pop(0) if self.attempts else None
                return failed if failed is not None else self.turns.pop(0)
            case driver.Sleep():
                return None
            case driver.RunTool():
                return self.tool(c)
            case driver.LookUpEarlier():
                return self.earlier
            case driver.RunChild():
                return self.child(c)
            case driver.AwaitDecision(approval, _):
                how = self.decide.get(approval.call_id, "timeout")
                if how == "timeout":
                    return False
                approval.status = "approved" if how == "approve" else "rejected"
                return True
        raise AssertionError(c)

    def go(self) -> StopReason | None:
        steps = self.run.steps()
        try:
            command = next(steps)
        except StopIteration as first:
            stopped: StopReason | None = first.value
            return stopped
        while True:
            self.commands.append(command)
            try:
                if self.cancel_at is not None and isinstance(command, self.cancel_at):
                    command = steps.throw(driver.Cancelled())
                else:
                    command = steps.send(self.answer(command))
            except StopIteration as done:
                result: StopReason | None = done.value
                return result

    def kinds(self) -> list[str]:
        return [type(c).__name__ for c in self.commands]

    def events(self) -> list[str]:
        return [e.event for e in self.state.events]


STEP = ["Publish", "BuildModelRequest", "RequestModel"]
TOOL = ["BuildToolRequest", "RunTool", "Publish"]


def test_a_tool_call_then_an_answer_completes_in_two_steps() -> None:
    shell = Shell([calls(("lookup_stock", {"sku": "A-001"})), text("12 in stock")])
    assert shell.go() == StopReason.COMPLETED
    assert shell.kinds() == [*STEP, *TOOL, *STEP]
    assert shell.events() == ["model_requested", "model_returned", "tool_success",
                              "model_requested", "model_returned", "answered",
                              "stopped:completed"]
    assert shell.state.steps == 2 and shell.state.tool_executions == 1
    # The tool's output goes in the next request by its idempotency key.
    assert shell.run.exchange.unsent == []
    assert shell.run.exchange.turn_returned


def test_the_tool_activity_output_is_referred_to_by_its_key() -> None:
    shell = Shell([calls(("lookup_stock", {"sku": "A-001"})), text("done")])
    seen: list[dict[str, str]] = []

    def model(c: driver.Command) -> object:
        seen.append(dict(shell.run.exchange.refs))
        return driver.Answered(shell.turns.pop(0))
    answer = shell.answer
    shell.answer = lambda c: model(c) if isinstance(c, driver.RequestModel) else answer(c)
    shell.go()
    assert seen[0] == {} and list(seen[1].values()) == ["wf/run/step-1/call-0"]


def test_a_short_read_only_tool_asks_the_local_tools_patch() -> None:
    rules = {**RULES, "lookup_stock": driver.core.ToolRule(
        "lookup_stock", RULES["lookup_stock"].args_model, local=True, timeout_seconds=5)}
    shell = Shell([calls(("lookup_stock", {"sku": "A-001"})), text("done")])
    shell.run.rules = rules
    shell.go()
    run = next(c for c in shell.commands if isinstance(c, driver.RunTool))
    assert run.local and driver.AskPatch(driver.LOCAL_TOOLS) in shell.commands
    shell = Shell([calls(("lookup_stock", {"sku": "A-001"})), text("done")], patches=set())
    shell.run.rules = rules
    shell.go()
    assert not next(c for c in shell.commands if isinstance(c, driver.RunTool)).local


def test_the_last_step_is_forced_to_answer() -> None:
    shell = Shell([calls(("lookup_stock", {"sku": "A-001"})), text("forced")],
                  limits=Limits(max_steps=2))
    assert shell.go() == StopReason.MAX_STEPS
    plans = [c.plan for c in shell.commands if isinstance(c, driver.RequestModel)]
    assert [(p.tool_choice, p.last) for p in plans] == [("auto", False), ("none", True)]


def test_steps_run_out_before_a_third_request() -> None:
    shell = Shell([calls(("lookup_stock", {"sku": "A-001"})),
                   calls(("lookup_stock", {"sku": "B-002"}))], limits=Limits(max_steps=2))
    # The forced last step's calls are refused, not run.
    assert shell.go() == StopReason.MAX_STEPS
    assert shell.kinds().count("RunTool") == 1


def test_the_deadline_stops_before_a_request_and_after_a_slow_answer() -> None:
    shell = Shell([text("late")], limits=Limits(deadline_seconds=10))
    shell.view.seconds = 10
    assert shell.go() == StopReason.DEADLINE and shell.kinds() == []
    shell = Shell([calls(("lookup_stock", {"sku": "A-001"}))], limits=Limits(deadline_seconds=10))
    answer = shell.answer

    def slow(c: driver.Command) -> object:
        if isinstance(c, driver.RequestModel):
            shell.view.seconds = 11
        return answer(c)
    shell.answer = slow
    assert shell.go() == StopReason.DEADLINE
    assert "RunTool" not in shell.kinds()


def test_identical_calls_stop_the_run() -> None:
    same = ("lookup_stock", {"sku": "A-001"})
    shell = Shell([calls(same), calls(same), calls(same), calls(same)],
                  limits=Limits(max_identical_calls=2))
    assert shell.go() == StopReason.MAX_IDENTICAL_CALLS
    assert shell.kinds().count("RunTool") == 2


def test_an_approved_call_runs_after_the_other_calls() -> None:
    turn = calls(("create_ticket", TICKET), ("lookup_stock", {"sku": "A-001"}))
    ticket = turn.calls[0].call_id
    shell = Shell([turn, text("done")], policy=Policy(), decide={ticket: "approve"})
    assert shell.go() == StopReason.COMPLETED
    # Asked (published), the lookup runs, then the wait, then the approved call.
    assert shell.kinds() == [*STEP, "Publish", *TOOL, "Publish", "AwaitDecision", "Publish",
                             *TOOL, *STEP]
    runs = [c.plan.call.name for c in shell.commands if isinstance(c, driver.RunTool)]
    assert runs == ["lookup_stock", "create_ticket"]
    wait = next(c for c in shell.commands if isinstance(c, driver.AwaitDecision))
    assert wait.timeout == timedelta(seconds=shell.limits.approval_timeout_seconds)


def test_a_rejected_call_is_answered_without_running() -> None:
    turn = calls(("create_ticket", TICKET))
    shell = Shell([turn, text("not created")], policy=Policy(),
                  decide={turn.calls[0].call_id: "reject"})
    assert shell.go() == StopReason.COMPLETED
    assert "RunTool" not in shell.kinds()
    assert shell.state.rejected_fingerprints


def test_an_approval_nobody_decides_times_out() -> None:
    shell = Shell([calls(("create_ticket", TICKET))], policy=Policy(),
                  limits=Limits(approval_timeout_seconds=60))
    shell.view.seconds = 30  # requested now: 60 s left
    assert shell.go() == StopReason.APPROVAL_TIMEOUT
    assert shell.kinds()[-1] == "AwaitDecision"
    assert shell.state.approvals[0].status == "timed_out"
    assert "approval_timed_out" in shell.events()


def test_a_cancel_during_the_approval_wait_leaves_the_step_finished() -> None:
    shell = Shell([calls(("create_ticket", TICKET))], policy=Policy(),
                  cancel_at=driver.AwaitDecision)
    shell.view.reason = "wrong customer"
    assert shell.go() == StopReason.CANCELLED
    assert shell.state.steps == 1
    assert shell.state.events[-2].detail == "wrong customer"


def test_a_cancel_during_the_model_request_leaves_the_step_unfinished() -> None:
    shell = Shell([text("never")], cancel_at=driver.RequestModel)
    assert shell.go() == StopReason.CANCELLED
    assert shell.state.steps == 0  # the request in flight is not a step


def test_an_interrupt_stops_before_any_call_of_the_response_runs() -> None:
    shell = Shell([calls(("lookup_stock", {"sku": "A-001"}))])
    answer = shell.answer

    def interrupted(c: driver.Command) -> object:
        if isinstance(c, driver.RequestModel):
            shell.view.interrupt = "a newer message"
        return answer(c)
    shell.answer = interrupted
    assert shell.go() == StopReason.CANCELLED
    assert "RunTool" not in shell.kinds() and shell.state.steps == 1


def test_continue_as_new_is_suggested_between_steps_only() -> None:
    shell = Shell([calls(("lookup_stock", {"sku": "A-001"}))])
    shell.view.suggested = True
    assert shell.go() is None  # after the first step, before the second request
    assert shell.kinds() == [*STEP, *TOOL] and shell.state.steps == 1
    assert shell.run.exchange.unsent  # the tool's output goes with the carried state


def test_a_shared_budget_reserves_before_and_settles_after_each_request() -> None:
    shell = Shell([calls(("lookup_stock", {"sku": "A-001"})), text("done")], budget="team",
                  limits=Limits(max_output_tokens=100))
    assert shell.go() == StopReason.COMPLETED
    assert shell.kinds() == ["Publish", "BuildModelRequest", "ReserveBudget", "RequestModel",
                             "SettleBudget", *TOOL,
                             "Publish", "BuildModelRequest", "ReserveBudget", "RequestModel",
                             "SettleBudget"]
    settle = next(c for c in shell.commands if isinstance(c, driver.SettleBudget))
    assert settle.amount.tokens == USAGE.total_tokens


def test_a_budget_refusal_stops_before_the_request_and_is_no_step() -> None:
    shell = Shell([text("never")], budget="team", limits=Limits(max_output_tokens=100),
                  grant=Grant(granted=False, message="budget 'team' is spent"))
    assert shell.go() == StopReason.BUDGET_LIMIT
    assert shell.kinds()[-1] == "ReserveBudget" and shell.state.steps == 0
    assert shell.state.text == "budget 'team' is spent"


def test_attempts_that_brought_no_answer_are_settled_with_the_step() -> None:
    shell = Shell([text("done")], budget="team", limits=Limits(max_output_tokens=100))
    answer = shell.answer
    abandoned = Amount(usd=0.5, tokens=1000)
    shell.answer = lambda c: (driver.Answered(shell.turns.pop(0), abandoned)
                              if isinstance(c, driver.RequestModel) else answer(c))
    shell.go()
    settle = next(c for c in shell.commands if isinstance(c, driver.SettleBudget))
    assert settle.amount.tokens == USAGE.total_tokens + 1000


def test_a_model_failure_stops_with_the_shells_reason() -> None:
    shell = Shell([])
    shell.answer = lambda c: (StopReason.MODEL_ERROR if isinstance(c, driver.RequestModel)
                              else Shell.answer(shell, c))
    assert shell.go() == StopReason.MODEL_ERROR


def test_a_request_over_the_context_window_is_never_sent() -> None:
    shell = Shell([text("never")], limits=Limits(max_input_tokens=20, max_output_tokens=10))
    assert shell.go() == StopReason.CONTEXT_EXHAUSTED
    assert shell.commands == [driver.AskPatch(driver.CONTEXT_WINDOW)]
    # A run from before the patch sends it as it did.
    shell = Shell([text("sent")], limits=Limits(max_input_tokens=20, max_output_tokens=10),
                  patches=set())
    assert shell.go() == StopReason.COMPLETED


def test_a_request_over_the_payload_limit_is_never_sent() -> None:
    shell = Shell([text("never")])
    answer = shell.answer
    shell.answer = lambda c: (10**9 if isinstance(c, driver.BuildModelRequest) else answer(c))
    assert shell.go() == StopReason.HISTORY_LIMIT
    assert "RequestModel" not in shell.kinds()


@pytest.mark.parametrize(("kind", "reason", "executed"), [
    ("unavailable", StopReason.TOOL_UNAVAILABLE, 0),
    ("result_too_large", StopReason.RESULT_LIMIT, 1),
    ("fatal", StopReason.TOOL_ERROR, 1),
])
def test_a_failed_tool_stops_the_run(kind: str, reason: StopReason, executed: int) -> None:
    shell = Shell([calls(("lookup_stock", {"sku": "A-001"})), text("never")],
                  tool=lambda c: driver.ToolFailed(kind, 3, started=True))  # type: ignore[arg-type]
    assert shell.go() == reason
    assert shell.state.tool_executions == executed


@pytest.mark.parametrize("kind", ["transient", "timed_out"])
def test_a_tool_that_keeps_failing_gives_the_model_a_temporary_error(kind: str) -> None:
    shell = Shell([calls(("lookup_stock", {"sku": "A-001"})), text("sorry")],
                  tool=lambda c: driver.ToolFailed(kind, 3, started=False))  # type: ignore[arg-type]
    assert shell.go() == StopReason.COMPLETED
    assert "tool_temporary_error" in shell.events() and "tool_failed" not in shell.events()
    assert shell.state.tool_executions == 0


def test_a_terminal_success_forces_the_answer_and_completes() -> None:
    rules = {**RULES, "create_ticket": driver.core.ToolRule(
        "create_ticket", RULES["create_ticket"].args_model, side_effects=True)}
    shell = Shell([calls(("create_ticket", TICKET)), text("created")],
                  tool=lambda c: ToolOutcome(envelope=env.success({"id": 1}, terminal=True)))
    shell.run.rules = rules
    assert shell.go() == StopReason.COMPLETED
    plans = [c.plan for c in shell.commands if isinstance(c, driver.RequestModel)]
    assert plans[-1].tool_choice == "none"


# --- model attempts under the charged-model-attempts patch --------------------------

SENT = mf.Charge(sent=True, output_bytes=0)
BUSY = driver.AttemptFailed("failed", SENT, mf.ModelFailure(kind="http_503", detail="503"),
                            retryable=True, asked_delay=2.0)


def charged(*attempts: driver.AttemptFailed | None, turns: list[Turn] | None = None,
            **kw: Any) -> Shell:
    return Shell(turns if turns is not None else [text("done")], charged=True,
                 attempts=list(attempts), limits=Limits(max_output_tokens=100), **kw)


def test_a_failed_attempt_is_charged_counted_and_retried_after_the_asked_delay() -> None:
    shell = charged(BUSY, None, budget="team")
    assert shell.go() == StopReason.COMPLETED
    assert shell.kinds() == ["Publish", "BuildModelRequest", "ReserveBudget", "AttemptModel",
                             "Sleep", "AttemptModel", "SettleBudget"]
    sleep = next(c for c in shell.commands if isinstance(c, driver.Sleep))
    assert sleep.seconds >= 2.0
    assert [a.outcome for a in shell.state.model_attempts] == ["http_503", "answered"]
    assert "model_retried:http_503" in shell.events()
    # The step settles its answer's usage and the failed attempt's worst case.
    settle = next(c for c in shell.commands if isinstance(c, driver.SettleBudget))
    assert settle.amount.tokens == USAGE.total_tokens + shell.state.model_attempts[0].input_tokens \
        + 100


def test_an_attempt_lost_with_its_worker_is_sent_again_without_counting() -> None:
    lost = driver.AttemptFailed("lost", SENT)
    shell = charged(lost, lost, lost, lost, lost, None)
    assert shell.go() == StopReason.COMPLETED
    assert shell.kinds().count("AttemptModel") == 6 and "Sleep" not in shell.kinds()
    assert shell.events().count("model_retried:worker_lost") == 5
    # One never sent is neither charged nor told.
    shell = charged(driver.AttemptFailed("lost", mf.Charge(sent=False)), None)
    assert shell.go() == StopReason.COMPLETED
    assert [a.outcome for a in shell.state.model_attempts] == ["answered"]


def test_the_attempts_run_out_as_model_error() -> None:
    shell = charged(*[BUSY] * 10)
    assert shell.go() == StopReason.MODEL_ERROR
    assert shell.kinds().count("AttemptModel") == driver.retries.MODEL_BACKOFF.max_attempts
    assert shell.events()[-2] == "model_failed:http_503"


def test_a_refusal_is_never_retried_and_an_over_window_one_is_context_exhausted() -> None:
    refused = driver.AttemptFailed("failed", None, mf.ModelFailure(kind="http_400", detail="x"))
    shell = charged(refused)
    assert shell.go() == StopReason.MODEL_ERROR and "Sleep" not in shell.kinds()
    assert shell.state.model_attempts == []  # refused before answering: not charged
    over = driver.AttemptFailed("failed", None, mf.ModelFailure(
        kind=mf.CONTEXT_LENGTH_EXCEEDED, detail="over"))
    shell = charged(over)
    assert shell.go() == StopReason.CONTEXT_EXHAUSTED
    assert shell.commands[-1] == driver.AskPatch(driver.CONTEXT_WINDOW)


def test_the_deadline_during_the_attempts_stops_and_settles_what_they_were_charged() -> None:
    shell = charged(driver.AttemptFailed("deadline", SENT), budget="team")
    assert shell.go() == StopReason.DEADLINE
    assert shell.kinds()[-2:] == ["AttemptModel", "SettleBudget"]
    assert [a.outcome for a in shell.state.model_attempts] == ["deadline"]


def test_a_cancel_with_the_request_out_charges_it_and_leaves_the_step_unfinished() -> None:
    shell = charged(driver.AttemptFailed("cancelled"), budget="team")
    assert shell.go() == StopReason.CANCELLED
    assert shell.kinds()[-2:] == ["AttemptModel", "SettleBudget"]
    assert [a.outcome for a in shell.state.model_attempts] == ["cancelled"]
    assert shell.state.steps == 0


def test_a_cancel_between_attempts_settles_what_they_were_charged() -> None:
    shell = charged(BUSY, budget="team", cancel_at=driver.Sleep)
    assert shell.go() == StopReason.CANCELLED
    assert shell.kinds()[-2:] == ["Sleep", "SettleBudget"]


def test_a_call_an_earlier_temporal_run_made_counts_against_the_identical_call_limit() -> None:
    """After a continue-as-new with a constant-size state, a call the filter may have
    seen is looked up in the earlier runs before the calls are planned; the count found
    there decides as if it had never left the state."""
    same = ("lookup_stock", {"sku": "A-001"})
    fp = fingerprint(*same)
    shell = Shell([calls(same), calls(same)], limits=Limits(max_identical_calls=2),
                  earlier=carry.EarlierCalls(identical_calls={fp: 2}))
    shell.state.earlier = carry.Earlier(seen=carry.add_keys(carry.empty_filter(), [fp]))
    assert shell.go() == StopReason.MAX_IDENTICAL_CALLS
    assert "LookUpEarlier" in shell.kinds() and "RunTool" not in shell.kinds()
    assert shell.state.earlier is not None and shell.state.earlier.found == 1


def test_a_call_the_filter_never_saw_is_not_looked_up() -> None:
    shell = Shell([calls(("lookup_stock", {"sku": "A-001"})), text("12 in stock")])
    shell.state.earlier = carry.Earlier(seen=carry.empty_filter())
    assert shell.go() == StopReason.COMPLETED
    assert "LookUpEarlier" not in shell.kinds()


def test_a_full_segment_continues_as_new_under_its_patch() -> None:
    shell = Shell([calls(("lookup_stock", {"sku": "A-001"})), text("done")],
                  patches={driver.CONSTANT_CARRY, driver.LOCAL_TOOLS})
    shell.state.call_ids = [f"old{i}" for i in range(carry.SEGMENT_MAX)]
    assert shell.go() is None and shell.state.steps == 1
    assert driver.AskPatch(driver.CONSTANT_CARRY) in shell.commands


# --- sub-agents ----------------------------------------------------------------------

RESEARCH = tree.AgentTool(name="research", description="looks up",
                          settings=RunSettings(model="m"), tools=["lookup_stock"],
                          task_queue="q")


def child_ended(reason: StopReason = StopReason.COMPLETED, tokens: int = 300,
                executions: int = 2) -> tree.ChildEnded:
    return tree.ChildEnded(reason=reason, text="found it", steps=2,
                           tool_executions=executions, input_tokens=tokens - 50,
                           output_tokens=50, total_tokens=tokens, cost_usd=None,
                           cost_units=0, usage_estimated=False, workflow_id="w/child")


def test_a_sub_agent_runs_with_its_allowance_and_is_charged() -> None:
    started: list[driver.RunChild] = []

    def child(c: driver.RunChild) -> tree.ChildEnded:
        started.append(c)
        return child_ended()

    shell = Shell([calls(("research", {"question": "A-001?"})), text("done")],
                  limits=Limits(token_threshold=5_000), agents=[RESEARCH], child=child)
    assert shell.go() == StopReason.COMPLETED
    assert shell.kinds() == [*STEP, "Publish", "RunChild", "Publish", *STEP]
    [c] = started
    assert c.agent == RESEARCH and c.plan.arguments == {"question": "A-001?"}
    assert c.settings.limits.token_threshold < 5_000 - shell.state.usage.total_tokens + 300
    # The call and the child's two tool executions; its tokens are the run's too.
    assert shell.state.tool_executions == 3
    assert shell.state.children == 1
    assert "subagent_started" in shell.events() and "subagent_ended" in shell.events()


def test_a_cancel_while_a_sub_agent_runs_ends_the_run_cancelled() -> None:
    shell = Shell([calls(("research", {"question": "A-001?"}))], agents=[RESEARCH],
                  cancel_at=driver.RunChild)
    assert shell.go() == StopReason.CANCELLED
    assert shell.state.tool_executions == 0  # the call never finished


def test_a_sub_agent_that_spends_the_callers_tokens_stops_the_caller() -> None:
    shell = Shell([calls(("research", {"question": "A-001?"})), text("never")],
                  limits=Limits(token_threshold=1_000), agents=[RESEARCH],
                  child=lambda c: child_ended(tokens=c.settings.limits.token_threshold
                                              + 1_000))
    assert shell.go() == StopReason.USAGE_LIMIT
    assert shell.kinds()[-1] == "Publish"  # no second model request


def test_a_run_whose_tables_are_full_continues_as_new_under_constant_carry() -> None:
    """Once the run's own share of the whole-run tables reaches carry.SEGMENT_MAX keys,
    the next step is not begun: the run continues as new (the driver returns None),
    asking the constant-carry patch; without that patch it goes on as it always did."""
    def full(shell: Shell) -> Shell:
        shell.state.steps = 1
        shell.state.identical_calls = {f"fp{i}": 1 for i in range(carry.SEGMENT_MAX - 10)}
        shell.state.call_ids = [f"c{i}" for i in range(10)]
        return shell

    shell = full(Shell([text("never")], limits=Limits(max_steps=10),
                       patches={driver.CONSTANT_CARRY}))
    assert shell.go() is None
    assert shell.kinds() == ["AskPatch"]
    old = full(Shell([text("12 in stock")], limits=Limits(max_steps=10)))
    assert old.go() == StopReason.COMPLETED
    below = Shell([text("12 in stock")], limits=Limits(max_steps=10),
                  patches={driver.CONSTANT_CARRY})
    below.state.steps = 1
    below.state.identical_calls = {f"fp{i}": 1 for i in range(carry.SEGMENT_MAX - 1)}
    assert below.go() == StopReason.COMPLETED
