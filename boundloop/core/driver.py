"""The run's step order, as a generator of commands: pure, no Temporal, no I/O.

`steps` is the whole order of a run, from its first model request to the reason it
stops (or continues as new): it yields a command for everything that touches the world
(ask a patch, publish, reserve or settle budget, request the model, run a tool, wait
for a decision) and receives the command's result. The workflow (workflows/loop.py) is
its interpreter, as httpx's client drives an `Auth.auth_flow`: it carries out each
command with the Temporal API and sends the result back, and throws `Cancelled` into
the generator when the run is cancelled while a command is out. Every command that
writes to history is a command here, in the order it is written, so a change of this
order is a change of the workflow's commands (docs/durability.md). Tests drive it with
plain values (tests/test_core_driver.py).

What the driver only reads of its surroundings (the clock, whether the server suggests
continue-as-new, an `interrupt`, the fixed bytes of a request) comes from a `View`:
reading it writes nothing to history.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal, Protocol, TypeVar

from boundloop.core import approvals, carry, retries, tree
from boundloop.core import budget as shared
from boundloop.core import context as ctx
from boundloop.core import loop as core
from boundloop.core import model_failures as mf
from boundloop.core.budget import Amount, Grant
from boundloop.core.conversation import ConversationMeta, Item
from boundloop.core.envelope import Envelope, temporary_error_exhausted, tool_timed_out
from boundloop.core.limits import RunSettings
from boundloop.core.reasons import StopReason
from boundloop.core.turn import FunctionCall, Turn

#: The patch under which a run stops `context_exhausted` before a request that would not
#: fit its context window; asked only when the run stops so (workflows/loop.py).
CONTEXT_WINDOW = "context-window"
#: The patch under which a run under the `summarize` context strategy makes a summary
#: request before a request that would not fit its window, or that the provider refused
#: as too long (`Run._summarize`); asked only when a run first summarizes.
SUMMARIZE = "context-summarize"
#: The patch under which a response that used every output token its request allowed
#: ends the run `incomplete`; asked only when a response reached the cap.
CUT_AT_THE_CAP = "cut-at-the-output-cap"
#: The patch under which a short read-only tool runs as a local activity.
LOCAL_TOOLS = "local-tools"
#: The patch under which continue-as-new hands over a state of constant size
#: (`boundloop.core.carry`): the whole-run tables as a segment the next runs look up by
#: reference, the newest events and model attempts only, the stream's newest items; and
#: a run continues as new once its tables reach `carry.SEGMENT_MAX` keys. Asked on its
#: own, and only when the run first continues as new (or its tables are full).
CONSTANT_CARRY = "constant-carry"
#: Event names of a model attempt that failed and was sent again start with this; the
#: failure's kind follows (`worker_lost` for an attempt lost with its request sent).
MODEL_RETRIED = "model_retried:"


# --- commands ---------------------------------------------------------------------


@dataclass(frozen=True)
class AskPatch:
    """`workflow.patched(name)` (a marker event the first time): -> bool."""

    name: str


@dataclass(frozen=True)
class Publish:
    """Search attributes (an upsert event when they changed, unless `attributes` is
    False), current details and the stream's event records: -> None."""

    attributes: bool = True


@dataclass(frozen=True)
class ReserveBudget:
    """Reserve a request's worst case from the run's shared budget (after the settlement
    in flight): -> Grant (a failed ledger is a refusal)."""

    key: str
    step: int
    amount: Amount
    priced: bool


@dataclass(frozen=True)
class SettleBudget:
    """Settle a step with the shared budget, without waiting for it: -> None."""

    step: int
    amount: Amount


@dataclass(frozen=True)
class BuildModelRequest:
    """Build the step's model request (the shell's wire types): -> its payload bytes."""

    plan: core.StepPlan


@dataclass(frozen=True)
class BuildSummaryRequest:
    """Build the request that summarizes the conversation's oldest part (the `summarize`
    context strategy), which the next model attempts send: -> its payload bytes."""

    plan: core.StepPlan
    summarize: ctx.Summarize


@dataclass(frozen=True)
class RequestModel:
    """Send the built request with its counted attempts, as a run from before the
    charged-model-attempts patch does: -> Answered | StopReason."""

    plan: core.StepPlan


@dataclass(frozen=True)
class AttemptModel:
    """One attempt of the built request, one activity Temporal does not retry, silent at
    most `silence_seconds`, answered within `answer_seconds`, within the `remaining`
    seconds of the run: -> Turn | AttemptFailed. The shell routes it (the holder's
    queue or the shared one) and follows the conversation a turn names."""

    plan: core.StepPlan
    silence_seconds: float
    answer_seconds: float
    remaining: float


@dataclass(frozen=True)
class AttemptFailed:
    """A model attempt brought no answer.

    kind: `cancelled` (the run was cancelled with the request out), `deadline` (the
    run's time ran out), `lost` (its worker was lost or shut down, or the holder never
    took it: not the provider's failure, not counted), `failed` (the provider's or our
    code's failure, or a wedged worker: counted). charge: what the activity reported of
    the request (whether it went out, what it streamed)."""

    kind: Literal["cancelled", "deadline", "lost", "failed"]
    charge: mf.Charge | None = None
    failure: mf.ModelFailure | None = None
    retryable: bool = False
    #: The provider's Retry-After, in seconds.
    asked_delay: float | None = None


@dataclass(frozen=True)
class Sleep:
    """A durable timer (the backoff between attempts): -> None."""

    seconds: float


@dataclass(frozen=True)
class Answered:
    """The model's turn, and what the step's attempts that brought no answer were
    charged (settled with the step)."""

    turn: Turn
    abandoned: Amount = field(default_factory=Amount)


@dataclass(frozen=True)
class BuildToolRequest:
    """Build a call's tool request: -> its payload bytes."""

    step: int
    plan: core.Execute
    timeout_seconds: float


@dataclass(frozen=True)
class RunTool:
    """Run the built tool request with its counted attempts, as a local activity or a
    regular one: -> core.ToolOutcome | ToolFailed."""

    step: int
    plan: core.Execute
    timeout_seconds: float
    local: bool


@dataclass(frozen=True)
class ToolFailed:
    """A call's attempts ended without a result.

    kind: `unavailable` (renamed, removed or reshaped by a deploy; `detail` says how),
    `result_too_large` (its body ran, its result could not cross), `transient` (its
    own temporary failures, or a timeout: the model gets a temporary error), `timed_out`
    (the tool's own timeout on every attempt), `fatal` (an unexpected exception)."""

    kind: Literal["unavailable", "result_too_large", "transient", "timed_out", "fatal"]
    failures: int
    started: bool
    detail: str | None = None


@dataclass(frozen=True)
class AwaitDecision:
    """Wait until the approval is decided, at most `timeout`: -> True when decided,
    False when it timed out. The wait is not processing time."""

    approval: core.Approval
    timeout: timedelta


@dataclass(frozen=True)
class LookUpEarlier:
    """Find what the run's earlier Temporal runs hold of these keys (identical-call
    counts, rejections, call ids; boundloop.core.carry), by a local activity whose
    result is in history: -> carry.EarlierCalls."""

    keys: list[str]


@dataclass(frozen=True)
class RunChild:
    """Start the sub-agent's run (a child workflow whose id the call's idempotency key
    makes) with `settings`, and wait for its end: -> tree.ChildEnded | tree.ChildFailed."""

    step: int
    plan: core.Execute
    agent: tree.AgentTool
    settings: RunSettings


Command = (AskPatch | Publish | ReserveBudget | SettleBudget | BuildModelRequest
           | RequestModel | AttemptModel | Sleep | BuildToolRequest | RunTool | AwaitDecision
           | LookUpEarlier | RunChild | BuildSummaryRequest)

_T = TypeVar("_T")
#: A generator of commands returning `_T`.
Steps = Generator[Command, object, _T]


class Cancelled(Exception):
    """Thrown into `steps` when the run is cancelled while a command is out."""


class View(Protocol):
    """What the driver reads of its surroundings; nothing it reads is a history event."""

    def processing_seconds(self) -> float: ...

    def now(self) -> datetime: ...

    def continue_as_new_suggested(self) -> bool: ...

    def interrupted(self) -> str | None: ...

    def cancel_reason(self) -> str | None: ...

    def fixed_bytes(self) -> int: ...


# --- the conversation the steps hand on ------------------------------------------


@dataclass
class Exchange:
    """The conversation's bookkeeping between steps, which the shell reads to build a
    request, continue as new or hand a session's next turn on."""

    #: Items of the conversation not yet in a model request's history.
    unsent: list[Item] = field(default_factory=list)
    #: call_id -> the idempotency key of a tool output history already holds.
    refs: dict[str, str] = field(default_factory=dict)
    #: The conversation as the last model turn left it in history.
    sent: ConversationMeta = field(default_factory=ConversationMeta)
    #: The last turn's calls with no output in the conversation yet, and their outputs
    #: so far: a session's next turn answers each of them.
    open_calls: list[FunctionCall] = field(default_factory=list)
    answered: dict[str, tuple[Envelope, str | None]] = field(default_factory=dict)
    turn_returned: bool = False  # a model turn of this run is in history
    #: The model request is out (or its budget being reserved): a cancel now leaves the
    #: step unfinished.
    model_in_flight: bool = False
    #: What the shared budget holds for the request in flight.
    reserved: Amount = field(default_factory=Amount)


@dataclass
class Run:
    """One run's driver: its state, its tools' rules and what the steps hand on."""

    state: core.LoopState
    rules: dict[str, core.ToolRule]
    key_scope: str
    view: View
    exchange: Exchange = field(default_factory=Exchange)
    #: The charged-model-attempts patch: each model attempt is a command of its own, and
    #: every attempt that reached the provider is charged (else RequestModel).
    charged: bool = False
    #: What the step's attempts that brought no answer were charged, not yet settled with
    #: the shared budget (settled with the step, or when the step ends without one).
    abandoned: Amount = field(default_factory=Amount)
    #: The agents the model may call as tools, by tool name (boundloop.core.tree).
    agents: dict[str, tree.AgentTool] = field(default_factory=dict)
    #: Calls of the response being run that have not started yet (a sub-agent's
    #: allowance keeps their tool executions back).
    unrun: int = 0
    #: Their tool cost units (kept back from a sub-agent's allowance too).
    unrun_units: int = 0
    #: The step that last wrote a summary (one a step at most), and whether the attempts
    #: out are the summary request's.
    summarized_step: int = 0
    summarizing: bool = False
    #: The step whose request the shared budget holds a reservation for (a summary and
    #: the step's own request share the step's reservation and settlement).
    reserved_step: int = 0

    def steps(self) -> Steps[StopReason | None]:
        """The run's steps until it stops (the reason) or should continue as new
        (None). A `Cancelled` thrown in at any command ends it `cancelled`."""
        try:
            return (yield from self._steps())
        except Cancelled:
            return core.cancelled(self.state, self.view.cancel_reason(),
                                  step_unfinished=self.exchange.model_in_flight)

    def _steps(self) -> Steps[StopReason | None]:
        state, view, ex = self.state, self.view, self.exchange
        while True:
            if view.interrupted() is not None:
                # A safe point: every call of the last response has its result (none
                # runs now), and the next request is not sent.
                return core.cancelled(state, view.interrupted(), step_unfinished=False)
            if state.steps and (view.continue_as_new_suggested() or (
                    carry.segment_full(state) and (yield from _ask(CONSTANT_CARRY)))):
                return None
            plan = core.begin_step(state, view.processing_seconds())
            if isinstance(plan, StopReason):
                return plan
            over = ctx.check(state, view.fixed_bytes)  # the `stop` context strategy
            if over is not None and self._summarizes() and (yield from _ask(SUMMARIZE)):
                stop = yield from self._summarize(plan)
                if stop is not None:
                    return stop
                over = ctx.check(state, view.fixed_bytes)
                if over is not None:  # the run stops: the summary's spending is settled
                    yield from self._settle_abandoned(plan.step)
            # Under `trim` the model activity fits the request (it has the items).
            if over is not None and not ctx.trims(state) \
                    and (yield from _ask(CONTEXT_WINDOW)):
                return ctx.exhausted(state, over)
            spent = tree.check_allowance(state, view.fixed_bytes())  # a sub-agent's run
            if spent is not None:
                return spent
            yield Publish()
            answered = yield from self._request_model(plan)
            if isinstance(answered, TooLong):  # refused as too long: summarize, send again
                stop = yield from self._summarize(plan)
                answered = stop if stop is not None else (yield from self._request_model(plan))
            if isinstance(answered, StopReason | TooLong):
                assert not isinstance(answered, TooLong)  # once a step
                return answered
            turn = answered.turn
            state.conversation = state.conversation.extend(turn.items)
            ex.sent = state.conversation
            ctx.note_trimmed(state, turn.trimmed)
            before = (state.usage.total_tokens, state.cost_usd)
            ex.open_calls, ex.answered, ex.turn_returned = list(turn.calls), {}, True
            stop = core.account_usage(state, turn, state.conversation.bytes)
            if state.settings.budget is not None:
                yield SettleBudget(plan.step, shared.settlement(
                    ex.reserved, state.usage.total_tokens - before[0],
                    state.cost_usd - before[1], turn.usage is not None or state.usage.estimated)
                    + answered.abandoned)
            if stop is not None:
                return stop
            if view.processing_seconds() >= state.limits.deadline_seconds:
                return state.stop(StopReason.DEADLINE, turn.text)
            if view.interrupted() is not None:  # before any call of this response runs
                return core.cancelled(state, view.interrupted(), step_unfinished=False)
            # Asked only for a response that reached the cap: a run whose history has
            # none never writes the marker; one from before it replays as it ran.
            cut = (core.cut_at_the_cap(turn, state.limits.max_output_tokens)
                   and turn.status == "completed" and turn.fault is None
                   and (yield from _ask(CUT_AT_THE_CAP)))
            # What the earlier Temporal runs hold of the calls the filter may have seen
            # (only a run handed over with a constant-size state has any).
            keys = carry.to_look_up(state, turn, self.rules)
            if keys:
                found = yield LookUpEarlier(keys)
                assert isinstance(found, carry.EarlierCalls)
                carry.take_earlier(state, keys, found)
            plans = core.plan_calls(state, turn, plan, self.rules, self.key_scope, cut=cut)
            if isinstance(plans, StopReason):
                return plans
            outputs = yield from self._run_calls(plan.step, plans)
            if isinstance(outputs, StopReason):
                return outputs
            items = core.outputs_items([(call, envelope) for call, envelope, _ in outputs])
            ex.unsent = items
            ex.refs = {call.call_id: key for call, _, key in outputs if key is not None}
            state.conversation = state.conversation.extend(items)
            ex.open_calls = []

    # --- model ---------------------------------------------------------------------

    def _request_model(self, plan: core.StepPlan) -> Steps[Answered | StopReason | TooLong]:
        state, ex = self.state, self.exchange
        size = yield BuildModelRequest(plan)
        assert isinstance(size, int)
        too_large = core.check_payload(state, "model_request", size)
        if too_large is not None:
            yield from self._settle_abandoned(plan.step)  # a summary's, if any
            return too_large
        # Until the model returns (a cancel raises through): a cancel while the shared
        # budget reserves leaves the step unsent, so unfinished too.
        ex.model_in_flight = True
        refused = yield from self._reserve_budget(plan.step)
        if refused is not None:
            ex.model_in_flight = False
            return refused
        answered: Answered | StopReason | TooLong
        if self.charged:
            turn = yield from self._charged_attempts(plan)
            answered = turn if isinstance(turn, StopReason | TooLong) \
                else Answered(turn, self.abandoned)
            self.abandoned = Amount()
        else:
            sent = yield RequestModel(plan)
            assert isinstance(sent, Answered | StopReason)
            answered = sent
        ex.model_in_flight = False
        if isinstance(answered, StopReason | TooLong):
            return answered
        ex.unsent, ex.refs = [], {}
        state.log("model_returned")
        return answered

    def _charged_attempts(self, plan: core.StepPlan) -> Steps[Turn | StopReason | TooLong]:
        """The request's attempts under the charged-model-attempts patch. A provider
        failure, a timeout of the activity's own (silence: model_timeout_seconds; the
        whole answer: model_answer_seconds) and a wedged worker count against
        MODEL_BACKOFF, with the provider's Retry-After; an attempt whose worker was lost
        is sent again without counting. Every attempt that reached the provider and
        brought no answer is charged its worst case, and each retry is an event naming
        why."""
        state, step = self.state, plan.step
        silence = state.limits.model_timeout_seconds
        failures = 0
        while True:
            remaining = state.limits.deadline_seconds - self.view.processing_seconds()
            answer = max(min(state.limits.model_answer_seconds or remaining, remaining), 1.0)
            out = yield AttemptModel(plan, silence, answer, remaining)
            if isinstance(out, Turn):
                usage = out.usage
                state.model_attempts.append(core.ModelAttempt(
                    step=step, outcome="answered",
                    input_tokens=usage.input_tokens if usage is not None else 0,
                    output_tokens=usage.output_tokens if usage is not None else 0))
                return out
            assert isinstance(out, AttemptFailed)
            if out.kind == "cancelled":
                # The run was cancelled with the request out: charged, as it may have
                # been answered.
                self._charge(step, "cancelled", None)
                yield from self._settle_abandoned(step)
                raise Cancelled
            if out.kind == "deadline":
                self._charge(step, "deadline", out.charge)
                yield from self._settle_abandoned(step)
                return state.stop(StopReason.DEADLINE)
            if out.kind == "lost":
                # Sent again; the event says it when the request had gone out.
                if out.charge is not None and out.charge.sent:
                    tokens = self._charge(step, "worker_lost", out.charge)
                    state.log(f"{MODEL_RETRIED}worker_lost", detail=(
                        f"the worker was lost with the request sent; charged {tokens} "
                        "tokens (worst case)"))
                continue
            failures += 1
            failure = out.failure
            assert failure is not None
            if failure.kind == mf.CONTEXT_NOT_FITTED:
                # Refused by the activity itself (no stub or summary makes it fit):
                # nothing went out, so it is not a step, as under `stop`.
                yield from self._settle_abandoned(step)
                return ctx.exhausted(state, failure.detail)
            tokens = self._charge(step, failure.kind, out.charge)
            charged = f"; charged {tokens} tokens (worst case)" if tokens else ""
            delay = retries.next_delay(
                retries.MODEL_BACKOFF, failures, out.asked_delay,
                state.limits.deadline_seconds - self.view.processing_seconds()) \
                if out.retryable else "exhausted"
            if delay == "deadline":
                yield from self._settle_abandoned(step)
                return state.stop(StopReason.DEADLINE)
            if not isinstance(delay, str):
                state.log(f"{MODEL_RETRIED}{failure.kind}", detail=(
                    f"attempt {failures} of {retries.MODEL_BACKOFF.max_attempts}: "
                    f"{failure.detail}{charged}"))
                try:
                    yield Sleep(delay)
                except Cancelled:  # cancelled between attempts
                    yield from self._settle_abandoned(step)
                    raise
                continue
            if failure.kind == mf.CONTEXT_LENGTH_EXCEEDED and self._summarizes() \
                    and not self.summarizing and self.summarized_step != step \
                    and (yield from _ask(SUMMARIZE)):
                # Under `summarize`, once a step: the step's request is sent again after
                # a summary (the charge stays with the step).
                state.log(f"{MODEL_RETRIED}{failure.kind}", detail=(
                    f"{failure.detail}{charged}; the conversation is summarized first"))
                return TooLong(failure)
            state.log(f"{mf.EVENT_PREFIX}{failure.kind}", detail=failure.detail + charged)
            yield from self._settle_abandoned(step)
            return state.stop((yield from self.failed(failure)))

    def _summarize(self, plan: core.StepPlan) -> Steps[StopReason | None]:
        """The `summarize` context strategy, once a step: one model request (under the
        run's limits, its budget reservation and its totals, as a step's request) writes
        a summary of the conversation's oldest part, which every request from then on
        sends in its place. The summary is that activity's result in history: a replay
        or a crash never writes it twice."""
        state, ex, step = self.state, self.exchange, plan.step
        self.summarized_step = step
        spec = ctx.summarize_request(state, f"{self.key_scope}/step-{step}/summary",
                                     self.view.fixed_bytes())
        size = yield BuildSummaryRequest(plan, spec)
        assert isinstance(size, int)
        too_large = core.check_payload(state, "model_request", size)
        if too_large is not None:
            return too_large
        ex.model_in_flight = True
        # The step's reservation covers the summary and the step's request after it
        # (which fits the window); both are settled with the step.
        refused = yield from self._reserve_budget(step, more=shared.worst_case(
            state.policy.prices.get(state.settings.model), spec.window,
            state.limits.max_output_tokens or 0))
        if refused is not None:
            ex.model_in_flight = False
            return refused
        self.summarizing = True
        turn = yield from self._charged_attempts(plan)
        self.summarizing = False
        ex.model_in_flight = False
        assert not isinstance(turn, TooLong)  # only a step's own request
        if isinstance(turn, StopReason):
            return turn
        before = (state.usage.total_tokens, state.cost_usd)
        stop = ctx.note_summarized(state, turn, spec)
        # Settled with the step's own request (or now, when the run stops here).
        self.abandoned = self.abandoned + shared.settlement(
            ex.reserved, state.usage.total_tokens - before[0], state.cost_usd - before[1],
            turn.usage is not None or state.usage.estimated)
        if stop is not None:
            yield from self._settle_abandoned(step)
        return stop

    def _summarizes(self) -> bool:
        """The run summarizes (its attempts are charged: every run since the `summarize`
        strategy exists is)."""
        return self.charged and ctx.summarizes(self.state)

    def failed(self, failure: mf.ModelFailure) -> Steps[StopReason]:
        """A failed model request's stop: `context_exhausted` when the provider refused
        it as over the model's context window, `model_error` otherwise."""
        if failure.kind == mf.CONTEXT_LENGTH_EXCEEDED and (yield from _ask(CONTEXT_WINDOW)):
            return StopReason.CONTEXT_EXHAUSTED
        return StopReason.MODEL_ERROR

    def _charge(self, step: int, outcome: str, charge: mf.Charge | None) -> int:
        """Charge an attempt that brought no answer to the run (its usage totals and cost)
        and to what the step settles with the shared budget: its worst case, every input
        token the request may hold plus the most output it may produce (without
        max_output_tokens: its streamed bytes / 4), when it reached the provider. Returns
        the tokens charged (0: it never went out)."""
        state = self.state
        if charge is not None and not charge.sent:
            return 0
        if charge is None and outcome not in ("cancelled", "deadline", mf.TIMEOUT):
            return 0  # a failure the provider refused before answering (an HTTP status)
        input_tokens = shared.input_tokens_bound(
            conversation_bytes=state.conversation.bytes, fixed_bytes=self.view.fixed_bytes(),
            last_tokens=state.last_tokens, last_bytes=state.last_bytes)
        cap = state.limits.max_output_tokens
        output_tokens = cap if cap is not None else max(
            1, (charge.output_bytes if charge is not None else 0) // 4)
        price = state.policy.prices.get(state.settings.model)
        amount = shared.worst_case(price, input_tokens, output_tokens)
        # In the run's own totals, as an answered request's usage is (the token threshold
        # and the USD budget see it at the next response).
        state.usage.input_tokens += input_tokens
        state.usage.output_tokens += output_tokens
        state.usage.total_tokens += amount.tokens
        state.cost_usd += amount.usd
        state.model_attempts.append(core.ModelAttempt(
            step=step, outcome=outcome, input_tokens=input_tokens,
            output_tokens=output_tokens, worst_case=True))
        self.abandoned = self.abandoned + amount
        return amount.tokens

    def _settle_abandoned(self, step: int) -> Steps[None]:
        """The step ends without an answer: settle what its attempts were charged."""
        if self.abandoned.tokens or self.abandoned.usd:
            taken, self.abandoned = self.abandoned, Amount()
            if self.state.settings.budget is not None:
                yield SettleBudget(step, taken)

    def _reserve_budget(self, step: int, more: Amount | None = None
                        ) -> Steps[StopReason | None]:
        """Reserve this request's worst case (and `more`) from the run's shared budget, if
        it names one; a refusal stops the run before the request is sent."""
        state, key = self.state, self.state.settings.budget
        cap = state.limits.max_output_tokens
        if key is None or cap is None:  # settings validation: a budget comes with a cap
            return None
        if self.reserved_step == step:  # held already: a summary reserved for the step
            return None
        price = state.policy.prices.get(state.settings.model)
        input_tokens = shared.input_tokens_bound(
            conversation_bytes=state.conversation.bytes, fixed_bytes=self.view.fixed_bytes(),
            last_tokens=state.last_tokens, last_bytes=state.last_bytes)
        amount = shared.worst_case(price, input_tokens, cap) + (more or Amount())
        grant = yield ReserveBudget(key=key, step=step, amount=amount,
                                    priced=price is not None)
        assert isinstance(grant, Grant)
        if not grant.granted:
            return core.budget_refused(state, grant.message)
        self.exchange.reserved = amount
        self.reserved_step = step
        return None

    # --- tools ---------------------------------------------------------------------

    def _run_calls(self, step: int, plans: list[core.CallPlan]
                   ) -> Steps[list[tuple[FunctionCall, Envelope, str | None]] | StopReason]:
        """Every call's output in call order, with the idempotency key when the output is
        the tool activity's own result (then history already holds it: docs/history.md).
        Calls that need no approval run first, in order; then each approval is awaited."""
        state = self.state
        results = self.exchange.answered  # kept as they come: a stopped turn hands them on
        self.unrun = sum(isinstance(p, core.Execute) for p in plans)
        self.unrun_units = sum(self.rules[p.call.name].cost_units for p in plans
                               if isinstance(p, core.Execute))
        waiting: list[core.Execute] = []
        for p in plans:
            if isinstance(p, core.Execute) and p.needs_approval:
                approvals.request(state, p, step, self.view.now())
                waiting.append(p)
        if waiting:
            yield Publish()
        for p in plans:
            if isinstance(p, core.Reply):
                out = _no_ref(core.reply_output(state, p))
            elif not p.needs_approval:
                out = yield from self._execute(step, p)
            else:
                continue
            if isinstance(out, StopReason):
                return out
            results[p.call.call_id] = out
        for p in waiting:
            out = yield from self._await_approval(step, p)
            if isinstance(out, StopReason):
                return out
            results[p.call.call_id] = out
        return [(p.call, *results[p.call.call_id]) for p in plans]

    def _await_approval(self, step: int, p: core.Execute
                        ) -> Steps[tuple[Envelope, str | None] | StopReason]:
        state = self.state
        approval = approvals.find(state, p.call.call_id)
        assert approval is not None
        limit = timedelta(seconds=state.limits.approval_timeout_seconds)
        left = approvals.time_left(approval, self.view.now(), limit)
        yield Publish()
        decided = yield AwaitDecision(approval, left)
        if not decided:
            approval.status = "timed_out"
            state.log("approval_timed_out", tool=p.call.name, call_id=p.call.call_id,
                      fp=p.fingerprint)
            return state.stop(StopReason.APPROVAL_TIMEOUT)
        if approval.status == "rejected":
            refusal = approvals.rejection(state, approval)
            return _no_ref(core.reply_output(state, core.Reply(
                call=p.call, fingerprint=p.fingerprint, envelope=refusal)))
        execute = approvals.approved_plan(p, approval)
        yield Publish()
        return (yield from self._execute(step, execute))

    def _execute(self, step: int, p: core.Execute
                 ) -> Steps[tuple[Envelope, str | None] | StopReason]:
        state = self.state
        self.unrun -= 1
        self.unrun_units -= self.rules[p.call.name].cost_units
        if p.call.name in self.agents:
            return (yield from self._run_child(step, p, self.agents[p.call.name]))
        rule = self.rules[p.call.name]
        timeout = state.limits.tool_timeout_seconds or rule.timeout_seconds
        size = yield BuildToolRequest(step, p, timeout)
        assert isinstance(size, int)
        too_large = core.check_payload(state, "tool_request", size)
        if too_large is not None:
            return too_large
        local = core.runs_locally(rule, timeout, gated=p.needs_approval) \
            and (yield from _ask(LOCAL_TOOLS))
        outcome = yield RunTool(step, p, timeout, local)
        if isinstance(outcome, ToolFailed):
            if outcome.kind == "unavailable":
                state.log("tool_unavailable", tool=p.call.name, call_id=p.call.call_id,
                          fp=p.fingerprint,
                          detail=outcome.detail or f"{p.call.name} is not served here")
                return state.stop(StopReason.TOOL_UNAVAILABLE)
            if outcome.kind == "result_too_large":
                return core.result_payload_too_large(state, p, self.rules)
            # A tool's timeout and transient failures give the model a temporary error
            # (timing out on the last attempt is told apart, with the numbers); an
            # unexpected exception stops the run.
            exhausted = (tool_timed_out(timeout, outcome.failures)
                         if outcome.kind == "timed_out" else temporary_error_exhausted())
            outcome = core.ToolOutcome(envelope=exhausted, executed=outcome.started,
                                       fatal=outcome.kind == "fatal", from_activity=False)
        assert isinstance(outcome, core.ToolOutcome)
        result = core.record_outcome(state, p, outcome, self.rules)
        yield Publish(attributes=False)  # the count reaches the attributes next step
        if isinstance(result, StopReason):
            return result
        # The activity's own result is in history: the next request refers to it.
        return result, p.idempotency_key if outcome.from_activity \
            and result == outcome.envelope else None


    def _run_child(self, step: int, p: core.Execute, agent: tree.AgentTool
                   ) -> Steps[tuple[Envelope, str | None] | StopReason]:
        """A sub-agent's call: checked against max_children and max_depth, given its
        allowance, run as a child run; everything it used is charged to this run."""
        state, view, call = self.state, self.view, p.call
        why = tree.refused_by_limits(state)
        if why is not None:
            state.log(tree.NOT_STARTED, tool=call.name, call_id=call.call_id,
                      fp=p.fingerprint, detail=why)
            return _no_ref(core.reply_output(state, core.Reply(
                call=call, fingerprint=p.fingerprint,
                envelope=tree.blocked_by_limits(state, why))))
        crowded = tree.rules_crowded(state.policy, agent.settings.policy)
        if crowded is not None:
            state.log(tree.NOT_STARTED, tool=call.name, call_id=call.call_id,
                      fp=p.fingerprint, detail=crowded)
            return _no_ref(core.reply_output(state, core.Reply(
                call=call, fingerprint=p.fingerprint, envelope=tree.crowded(agent.name))))
        # The later calls' cost units run whatever the child spends: kept back from it.
        later_units = self.unrun_units if state.limits.tool_cost_budget is not None else 0
        removed = state.summary.removed if state.summary is not None else 0
        settings = tree.allowance(
            state, agent, processing_seconds=view.processing_seconds(),
            next_input_tokens=ctx.estimate_input_tokens(
                # What the next request sends: a summary in place of the oldest items.
                conversation_bytes=state.conversation.bytes - removed,
                fixed_bytes=view.fixed_bytes() if state.last_tokens is None else 0,
                last_tokens=state.last_tokens, last_bytes=state.last_bytes - removed),
            later_calls=self.unrun, later_units=later_units, caps={
                name: cap for name in agent.tools if name in self.rules and (
                    cap := state.limits.per_tool_max_calls.get(
                        name, self.rules[name].max_calls)) is not None})
        if isinstance(settings, str):
            state.log(tree.NOT_STARTED, tool=call.name, call_id=call.call_id,
                      fp=p.fingerprint, detail=settings)
            return _no_ref(core.reply_output(state, core.Reply(
                call=call, fingerprint=p.fingerprint,
                envelope=tree.not_started(agent.name, settings))))
        state.children += 1
        state.log(tree.STARTED, tool=call.name, call_id=call.call_id, fp=p.fingerprint,
                  detail=tree.allowance_line(settings))
        yield Publish(attributes=False)
        ended = yield RunChild(step, p, agent, settings)
        assert isinstance(ended, tree.ChildEnded | tree.ChildFailed)
        if isinstance(ended, tree.ChildEnded):
            tree.charge(state, ended)
            n = ended.tool_executions
            detail = (f"{ended.reason.value}: {ended.total_tokens} tokens, {n} tool "
                      f"execution{'' if n == 1 else 's'}")
            if ended.uncounted:
                tree.charge_uncounted(state, ended, settings)
                detail += "; a response without usage: charged its whole allowance"
        else:
            detail = f"{ended.kind}: {ended.detail}"
            if ended.use_unknown:
                tree.charge_allowance(state, settings)
                detail += "; its use is unknown: charged its whole allowance"
        state.log(tree.ENDED, tool=call.name, call_id=call.call_id, fp=p.fingerprint,
                  detail=detail)
        result = core.record_outcome(state, p, core.ToolOutcome(
            envelope=tree.output(agent.name, ended), from_activity=False), self.rules)
        yield Publish(attributes=False)
        if isinstance(result, StopReason):
            return result
        over = tree.over_limits(state)
        return over if over is not None else (result, None)


@dataclass(frozen=True)
class TooLong:
    """The provider refused the step's request as over the model's context window, and
    the run summarizes before sending it again (the `summarize` strategy)."""

    failure: mf.ModelFailure


def _ask(patch: str) -> Steps[bool]:
    answer = yield AskPatch(patch)
    assert isinstance(answer, bool)
    return answer


def _no_ref(out: Envelope | StopReason) -> tuple[Envelope, str | None] | StopReason:
    return out if isinstance(out, StopReason) else (out, None)
