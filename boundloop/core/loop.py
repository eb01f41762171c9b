"""The loop's decisions: pure, deterministic, no Temporal, no I/O.

The workflow feeds events in (a step starts, a response arrives, a tool returns, a
human decides) and carries `LoopState` between them; every rule that decides whether
to call the model, execute a tool, ask a human or stop lives here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from boundloop.core import envelope as env
from boundloop.core import rules as argument_rules
from boundloop.core.answer_shape import looks_like_tool_call
from boundloop.core.canonical import preview
from boundloop.core.conversation import (
    ConversationMeta,
    Item,
    SummaryRef,
    function_call_output,
)
from boundloop.core.envelope import Envelope, ToolStatus
from boundloop.core.fingerprint import fingerprint, invalid_fingerprint
from boundloop.core.limits import Limits, Policy, RunSettings, fits_payload
from boundloop.core.place import TreePlace
from boundloop.core.reasons import StopReason
from boundloop.core.retries import TOOL_BACKOFF, Backoff
from boundloop.core.rules import Grant as Grant
from boundloop.core.turn import FunctionCall, Turn, Usage

ToolChoice = Literal["auto", "none"]


@dataclass(frozen=True)
class ToolRule:
    """What the core needs to know of a tool (the registry's pure part).

    A function tool validates its arguments with `args_model`; a tool from an MCP server
    has a JSON schema instead and sets `check` (arguments -> an `invalid_input` envelope,
    or None when they match), with `args_model` None. Either kind carries the timeout of
    one attempt and the attempts the workflow counts (`backoff`).
    """

    name: str
    args_model: type[BaseModel] | None
    side_effects: bool = False
    #: True, or a pure predicate over the validated argument model (runs in the workflow).
    needs_approval: bool | Callable[[Any], bool] = False
    cost_units: int = 0
    max_calls: int | None = None
    check: Callable[[Any], Envelope | None] | None = None
    timeout_seconds: float = 30.0
    backoff: Backoff = TOOL_BACKOFF
    #: The tool may run as a Temporal local activity: it is read-only (no side effects,
    #: never asks for approval, not terminal), declared with a timeout of at most
    #: LOCAL_TOOL_MAX_SECONDS, and its author did not opt out (`runs_locally` adds the
    #: run's own timeout and the call's approval).
    local: bool = False


#: The longest timeout of one attempt (seconds) with which a read-only tool runs as a
#: local activity, in the workflow's worker. A local activity holds its workflow task
#: open while it runs: a cancel, signal or update that arrives meanwhile is handled when
#: it returns, and a worker that dies re-runs it whole. Only short tools gain (no
#: scheduling round trip, one history event instead of six) and lose little.
LOCAL_TOOL_MAX_SECONDS = 10.0


def runs_locally(rule: ToolRule, timeout_seconds: float, *, gated: bool) -> bool:
    """Whether this call of the tool runs as a local activity: the rule allows it (a
    tool declared short: a run's shorter `tool_timeout_seconds` never makes a long tool
    local), one attempt's timeout as the run sets it is at most LOCAL_TOOL_MAX_SECONDS,
    and the call did not wait for an approval (`gated`)."""
    return rule.local and not gated and timeout_seconds <= LOCAL_TOOL_MAX_SECONDS


class Event(BaseModel):
    """One line of the run's event log: no raw arguments, outputs or text."""

    model_config = ConfigDict(frozen=True)

    step: int
    event: str
    tool: str | None = None
    call_id: str | None = None
    fingerprint: str | None = None
    #: One line for an operator, never a secret or provider text (e.g. a failed model
    #: request's `HTTP 404 (model or route not found) from host:port`, a cancel's reason).
    detail: str | None = None


class ModelAttempt(BaseModel):
    """One model request the provider received, and the tokens the run was charged for
    it: its reported usage when its answer came, else its worst case."""

    model_config = ConfigDict(frozen=True)

    step: int
    #: "answered", or why it brought no answer (`timeout`, `http_500`, `worker_lost`,
    #: `cancelled`, `deadline`, ...).
    outcome: str
    input_tokens: int
    output_tokens: int
    #: No usage came back: charged every input token and the most output it may produce.
    worst_case: bool = Field(default=False, exclude_if=lambda v: not v)


class UsageTotals(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    unknown_steps: int = 0  # responses with no usable usage (estimated or stopped)
    estimated: bool = False


class Approval(BaseModel):
    """A call waiting for (or decided by) a human."""

    call_id: str
    tool: str
    arguments: dict[str, Any]
    fingerprint: str
    idempotency_key: str
    step: int
    requested_at: str  # ISO 8601 UTC, from workflow time
    # withdrawn: the run stopped (a cancel, a limit) before anyone decided.
    status: Literal["pending", "approved", "rejected", "timed_out", "withdrawn"] = "pending"
    approver: str | None = None
    reason: str | None = None
    decided_at: str | None = None
    #: The argument rule that asked for this approval (`amount > 100`); None when the
    #: tool's own declaration or the approval policy asked.
    asked_because: str | None = Field(default=None, exclude_if=lambda v: v is None)
    #: Which rule asked (ASKED_BY): a policy's argument rule, the tool's declaration
    #: (needs_approval=True), its needs_approval predicate, or the run's approval policy
    #: ("always"). None from a worker before it.
    asked_by: str | None = Field(default=None, exclude_if=lambda v: v is None)


class Earlier(BaseModel):
    """The earlier Temporal runs of this run, by reference (boundloop.core.carry)."""

    #: Base64 of the Bloom filter's FILTER_BITS bits.
    seen: str
    #: The Temporal run (run id) whose continue-as-new input holds the newest segment
    #: before this run's predecessor's (None: the predecessor's is the oldest).
    previous: str | None = None
    #: Look-ups made (a maybe of the filter), and those that found the key.
    lookups: int = 0
    found: int = 0


class LoopState(BaseModel):
    """Everything the loop carries between events (and across continue-as-new)."""

    settings: RunSettings
    allowed_tools: list[str]
    steps: int = 0
    tool_executions: int = 0
    cost_units: int = 0
    cost_usd: float = 0.0
    usage: UsageTotals = Field(default_factory=UsageTotals)
    per_tool_calls: dict[str, int] = Field(default_factory=dict)
    identical_calls: dict[str, int] = Field(default_factory=dict)
    rejected_fingerprints: list[str] = Field(default_factory=list)
    call_ids: list[str] = Field(default_factory=list)
    force_final: bool = False
    # A terminal side effect succeeded: the run's goal, so the forced answer after it
    # (or on the last step) is `completed`; every other forced answer names its limit.
    goal_reached: bool = False
    pending_limit: StopReason | None = None
    conversation: ConversationMeta = Field(default_factory=ConversationMeta)
    events: list[Event] = Field(default_factory=list)
    approvals: list[Approval] = Field(default_factory=list)
    #: Approvals remembered for the rest of this run; those scoped to its session (when
    #: it is a session's turn) are handed to the session's next turns.
    grants: list[Grant] = Field(default_factory=list, exclude_if=lambda v: not v)
    text: str = ""
    answer_looks_like_tool_call: bool = False
    reason: StopReason | None = None
    # For a shared budget's worst case (core.budget.input_tokens_bound): the tokens the
    # last response reported for its request and itself (None: no usage), and the
    # conversation's bytes then.
    last_tokens: int | None = None
    last_bytes: int = 0
    #: Every model request the provider received (under the charged-model-attempts patch).
    model_attempts: list[ModelAttempt] = Field(default_factory=list,
                                               exclude_if=lambda v: not v)
    #: Set once the run continued as new with a constant-size state (boundloop.core.
    #: carry): the earlier Temporal runs hold the calls its tables no longer do.
    earlier: Earlier | None = Field(default=None, exclude_if=lambda v: v is None)
    #: Under the `trim` context strategy: the oldest tool outputs the last request sent
    #: as stubs (boundloop.core.context.trim_outputs; the next sends at least as many).
    trimmed_outputs: int = Field(default=0, exclude_if=lambda v: not v)
    #: Under the `summarize` context strategy: the summary every request sends in place
    #: of the conversation's oldest items, and how many summaries the run wrote.
    summary: SummaryRef | None = Field(default=None, exclude_if=lambda v: v is None)
    summaries: int = Field(default=0, exclude_if=lambda v: not v)
    #: Events of the log no longer carried (the oldest; in the earlier runs' histories).
    events_dropped: int = Field(default=0, exclude_if=lambda v: not v)
    #: Of a sub-agent's run: where it is in its tree (its model requests then never pass
    #: what is left of its allowance: boundloop.core.tree).
    tree: TreePlace | None = Field(default=None, exclude_if=lambda v: v is None)
    #: Sub-agents this run started (`max_children`).
    children: int = Field(default=0, exclude_if=lambda v: not v)

    @property
    def limits(self) -> Limits:
        return self.settings.limits

    @property
    def policy(self) -> Policy:
        return self.settings.policy

    def log(self, event: str, *, tool: str | None = None, call_id: str | None = None,
            fp: str | None = None, detail: str | None = None) -> None:
        # Only the fields given: pydantic keeps a set of the field names each record was
        # given, and one of six names costs 3x one of two (the JSON is the same).
        fields = (("tool", tool), ("call_id", call_id), ("fingerprint", fp), ("detail", detail))
        given: dict[str, Any] = {k: v for k, v in fields if v is not None}
        self.events.append(Event(step=self.steps, event=event, **given))

    def stop(self, reason: StopReason, text: str | None = None) -> StopReason:
        self.reason = reason
        if text is not None:
            self.text = text
            if looks_like_tool_call(text, self.allowed_tools):
                # Never executed, but flagged: not the answer the user wanted.
                self.answer_looks_like_tool_call = True
                self.log("answer_looks_like_tool_call")
        self.log(f"stopped:{reason.value}")
        return reason


# --- a step begins -----------------------------------------------------------------


class StepPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    step: int
    tool_choice: ToolChoice
    last: bool


def begin_step(state: LoopState, processing_seconds: float) -> StepPlan | StopReason:
    """Before a request: deadline, history bytes, remaining steps - in that order."""
    lim = state.limits
    if processing_seconds >= lim.deadline_seconds:
        return state.stop(StopReason.DEADLINE)
    if state.conversation.bytes > lim.max_history_bytes:
        state.log(StopReason.HISTORY_LIMIT.value, detail=(
            f"the conversation is {state.conversation.bytes} bytes, over max_history_bytes "
            f"{lim.max_history_bytes} (the whole conversation, parts a context strategy "
            "leaves out of requests too): raise max_history_bytes for a longer run"))
        return state.stop(StopReason.HISTORY_LIMIT)
    if state.steps >= lim.max_steps:
        return state.stop(state.pending_limit or StopReason.MAX_STEPS)
    state.steps += 1
    last = state.steps == lim.max_steps
    choice: ToolChoice = "none" if last or state.force_final else "auto"
    state.log("model_requested")
    return StepPlan(step=state.steps, tool_choice=choice, last=last)


def budget_refused(state: LoopState, message: str) -> StopReason:
    """The shared budget refused the step's reservation: the request was never sent, so
    it is not a step; the ledger's reason is the event detail, and the text of a run
    that is no sub-agent."""
    state.steps -= 1
    if state.events and state.events[-1].event == "model_requested":
        state.events.pop()  # begin_step logged the request that was never sent
    state.log("budget_refused", detail=message)
    # A sub-agent's text is its caller's model's to read: the ledger's reason (its key,
    # what it spent and holds) stays in the event.
    return state.stop(StopReason.BUDGET_LIMIT, message if state.tree is None else None)


def cancelled(state: LoopState, reason: str | None, *, step_unfinished: bool) -> StopReason:
    """The run was cancelled. Nothing that did not finish is counted: a model request
    still in flight is not a step (and its usage is unknown), a tool still running is
    not an execution (the caller never recorded it)."""
    if step_unfinished:
        state.steps -= 1
    state.log("cancel_requested", detail=reason)
    return state.stop(StopReason.CANCELLED)


# --- usage --------------------------------------------------------------------------


def estimate_usage(input_bytes: int, output_bytes: int) -> Usage:
    """Rough tokens from UTF-8 bytes (4 bytes a token), used only when policy says so."""
    inp, out = max(1, input_bytes // 4), max(1, output_bytes // 4)
    return Usage(input_tokens=inp, output_tokens=out, total_tokens=inp + out)


def add_usage(state: LoopState, usage: Usage) -> None:
    """A response's tokens in the run's totals, and their cost by the price table."""
    state.usage.input_tokens += usage.input_tokens
    state.usage.output_tokens += usage.output_tokens
    state.usage.total_tokens += usage.total_tokens
    price = state.policy.prices.get(state.settings.model)
    if price is not None:
        state.cost_usd += (usage.input_tokens * price.input_usd_per_mtok
                           + usage.output_tokens * price.output_usd_per_mtok) / 1_000_000


def account_usage(state: LoopState, turn: Turn, input_bytes: int) -> StopReason | None:
    """After a response: add usage, then check the token threshold and the USD budget."""
    usage = turn.usage
    state.last_tokens = None if usage is None else usage.input_tokens + usage.output_tokens
    state.last_bytes = input_bytes
    if usage is None:
        state.usage.unknown_steps += 1
        if turn.fault is not None:
            return None  # the fault itself stops the run (protocol_error) next
        if state.policy.missing_usage == "stop":
            return state.stop(StopReason.USAGE_UNKNOWN, turn.text)
        usage = estimate_usage(input_bytes, turn.output_bytes)
        state.usage.estimated = True
    add_usage(state, usage)
    if state.usage.total_tokens >= state.limits.token_threshold:
        return state.stop(StopReason.USAGE_LIMIT, turn.text)
    budget = state.limits.usd_budget
    if budget is not None and state.cost_usd >= budget:
        return state.stop(StopReason.BUDGET_LIMIT, turn.text)
    return None


# --- a response arrives -------------------------------------------------------------


class Execute(BaseModel):
    """Run the tool now (or after approval)."""

    model_config = ConfigDict(frozen=True)

    call: FunctionCall
    arguments: dict[str, Any]
    fingerprint: str
    idempotency_key: str
    needs_approval: bool = False
    #: The argument rule that asks for approval, as people read it.
    asked_because: str | None = None
    #: Which rule asks (ASKED_BY), when one does.
    asked_by: str | None = None


class Reply(BaseModel):
    """Answer the call without executing it."""

    model_config = ConfigDict(frozen=True)

    call: FunctionCall
    envelope: Envelope
    fingerprint: str | None = None


CallPlan = Execute | Reply


def idempotency_key(workflow_id: str, step: int, index: int) -> str:
    """The workflow id and the call's position in the run; nothing else (stable across
    retries, crashes and resets, never shared by two runs)."""
    return f"{workflow_id}/step-{step}/call-{index}"


def parse_arguments(model: type[BaseModel], text: str) -> BaseModel:
    """Validate arguments from their JSON text, in strict mode: what JSON can only carry
    as strings (dates, datetimes, UUIDs, enums, decimals) is accepted in that form, but
    `"3"` is still not an int. The workflow, the approval check and the tool activity all
    validate through here. Raises pydantic's ValidationError."""
    return model.model_validate_json(text, strict=True)


def validation_problems(exc: ValidationError) -> str:
    """The first problems of a ValidationError, without the input values."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}"
        for e in exc.errors(include_url=False, include_input=False)[:5])


def _validate_arguments(call: FunctionCall,
                        rule: ToolRule) -> BaseModel | dict[str, Any] | Envelope:
    if call.truncated:
        return env.invalid_input(
            "ARGUMENTS_TRUNCATED",
            "The response was cut off (finish_reason length) while writing these arguments; "
            "the call was not executed. Send the complete call again, shorter if possible.")
    try:
        parsed = json.loads(call.arguments) if call.arguments.strip() else None
        # Refuse what json.loads accepts but JSON cannot carry: NaN/Infinity and unpaired
        # surrogate escapes ("\ud800"), which would break fingerprints and payloads.
        json.dumps(parsed, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (ValueError, RecursionError):  # JSONDecodeError, >4300-digit ints, the above
        return env.invalid_input(
            "INVALID_JSON",
            f"arguments are not valid JSON (got {preview(call.arguments)!r}); "
            f"expected an object matching the {rule.name} schema.")
    if not isinstance(parsed, dict):
        return env.invalid_input(
            "INVALID_ARGUMENTS",
            f"arguments must be a JSON object, got {preview(call.arguments)!r}.")
    if rule.args_model is None:  # a JSON schema tool (MCP): its own check, same envelope
        assert rule.check is not None
        return rule.check(parsed) or parsed
    try:
        return parse_arguments(rule.args_model, call.arguments)
    except ValidationError as exc:
        return env.invalid_input("INVALID_ARGUMENTS", preview(
            f"arguments do not match the {rule.name} schema: {_schema_problems(exc, rule)}",
            600))


#: What `Approval.asked_by` names: the rule that asked for a person.
ASKED_BY = ("rule", "policy", "declaration", "predicate")


def asked_by(rule: ToolRule, policy: Policy) -> str:
    """Which of `needs_approval`'s rules asked, once it did: the run's approval policy
    ("always"), the tool's declaration (True), or its predicate."""
    if policy.approval == "always" and rule.side_effects:
        return "policy"
    return "declaration" if isinstance(rule.needs_approval, bool) else "predicate"


def needs_approval(rule: ToolRule, args: BaseModel | dict[str, Any], policy: Policy) -> bool:
    """The policy, the tool's flag or its predicate. A predicate that raises asks for
    approval: when in doubt, a person decides."""
    if policy.approval == "never":
        return False
    if policy.approval == "always" and rule.side_effects:
        return True
    if isinstance(rule.needs_approval, bool):
        return rule.needs_approval
    try:
        return bool(rule.needs_approval(args))
    except Exception:
        return True


#: Keywords of a JSON schema: arguments made of them are the schema echoed back.
_SCHEMA_WORDS = frozenset({"type", "properties", "required", "additionalProperties",
                           "description", "title"})


def _schema_problems(exc: ValidationError, rule: ToolRule) -> str:
    """Which field was wrong and what was expected, briefly (at most five problems)."""
    fields = list(rule.args_model.model_fields) if rule.args_model is not None else []
    extras: list[str] = []
    problems: list[str] = []
    for e in exc.errors(include_url=False, include_input=False):
        where = ".".join(str(p) for p in e["loc"]) or "(root)"
        if e["type"] == "extra_forbidden":
            extras.append(where)
        elif e["type"] == "missing":
            problems.append(f"missing field {where!r}")
        else:
            problems.append(f"field {where!r}: {e['msg']}")
    if extras:
        problems.insert(0, f"unexpected field{'s' if len(extras) > 1 else ''} "
                           f"{', '.join(repr(x) for x in extras[:5])}")
    text = "; ".join(problems[:5])
    text += f" (expected fields: {', '.join(fields) or 'none'})"
    if extras and set(extras) <= _SCHEMA_WORDS:
        text += "; send the argument values only, not the schema"
    return text


def duplicate_call_text(call: FunctionCall, text: str) -> str:
    """The result's text of a run stopped by a reused call id: the cause, then whatever
    text the model wrote with it."""
    cause = (f"the model reused call id {preview(call.call_id, 60)!r} (tool "
             f"{preview(call.name or '?', 60)!r}) of an earlier call of this run: a call id "
             "is unique in a run, so nothing of this response ran")
    return cause + (f"\n\n{text}" if text.strip() else "")


def cut_at_the_cap(turn: Turn, max_output_tokens: int | None) -> bool:
    """The response used every output token its request allowed (`max_output_tokens`):
    cut short, whatever its `status` says (llama.cpp's Responses API reports `completed`
    for an answer cut by `max_output_tokens`)."""
    return (max_output_tokens is not None and turn.usage is not None
            and turn.usage.output_tokens >= max_output_tokens
            and not turn.calls_truncated)  # told to the model as ARGUMENTS_TRUNCATED


def plan_calls(state: LoopState, turn: Turn, plan: StepPlan, rules: dict[str, ToolRule],
               workflow_id: str, *, cut: bool = False) -> list[CallPlan] | StopReason:
    """From a response up to execution: validate the response, check the batch, then
    decide each call in order. Returns the per-call plans, or the stop reason.

    Text that merely looks like a tool call is an answer (never parsed for calls). `cut`:
    the response reached the request's output cap (`cut_at_the_cap`): `incomplete`,
    nothing of it runs, whatever its status says.
    """
    if turn.fault is not None:
        state.log("protocol_fault", detail=turn.fault)  # the fault, never the model's text
        return state.stop(StopReason.PROTOCOL_ERROR, turn.text)
    if turn.status != "completed":
        return state.stop(StopReason.INCOMPLETE, turn.text)
    if cut:
        used = turn.usage.output_tokens if turn.usage is not None else 0
        state.log("output_cap_reached", detail=f"{used} output tokens, max_output_tokens "
                  f"{state.limits.max_output_tokens}: the answer was cut short")
        return state.stop(StopReason.INCOMPLETE, turn.text)
    if not turn.calls:
        if not turn.text.strip():
            return state.stop(StopReason.EMPTY_OUTPUT)
        state.log("answered")
        return state.stop(answer_reason(state, plan), turn.text)
    for call in turn.calls:
        # Responses API call ids are unique per conversation; Chat servers may reuse ids
        # across steps (tool messages pair by position there), so only the Responses API
        # treats a reused id as a protocol fault.
        if state.settings.api == "responses" and call.call_id in state.call_ids:
            state.log("duplicate_call_id", call_id=call.call_id)
            return state.stop(StopReason.PROTOCOL_ERROR, duplicate_call_text(call, turn.text))
    if plan.last or state.force_final:
        # tool_choice "none" was sent; providers may ignore it: never execute.
        state.log("tool_calls_ignored")
        if state.pending_limit is not None:
            return state.stop(state.pending_limit, turn.text)
        return state.stop(StopReason.MAX_STEPS if plan.last else StopReason.PROTOCOL_ERROR,
                          turn.text)
    allowed = set(state.allowed_tools)
    named = [c for c in turn.calls if c.name and c.name in allowed]
    unknown = [c for c in turn.calls if c.name and c.name not in allowed]
    if unknown and state.policy.unknown_tool == "stop":
        state.log("forbidden_tool", tool=preview(unknown[0].name, 60),
                  call_id=unknown[0].call_id)
        return state.stop(StopReason.FORBIDDEN_TOOL, turn.text)
    if state.tool_executions + len(named) > state.limits.max_tool_executions:
        return state.stop(StopReason.MAX_TOOLS, turn.text)
    budget = state.limits.tool_cost_budget
    if budget is not None and state.cost_units + sum(
            rules[c.name].cost_units for c in named) > budget:
        return state.stop(StopReason.BUDGET_LIMIT, turn.text)
    state.call_ids.extend(c.call_id for c in turn.calls)
    plans: list[CallPlan] = []
    for index, call in enumerate(turn.calls):
        plans.append(_plan_one(state, call, rules, idempotency_key(
            workflow_id, plan.step, index)))
    return plans


def _plan_one(state: LoopState, call: FunctionCall, rules: dict[str, ToolRule],
              key: str) -> CallPlan:
    if not call.name:
        state.log("invalid_input", call_id=call.call_id)
        return Reply(call=call, envelope=env.invalid_input(
            "MISSING_TOOL_NAME", "The call has no function name; it was not executed."))
    if call.name not in state.allowed_tools:
        fp = invalid_fingerprint(call.name, call.arguments)
        return _refused_repeat(state, call, fp) or _count_refusal(
            state, "unknown_tool", call, fp,
            env.unknown_tool(preview(call.name, 60), state.allowed_tools))
    rule = rules[call.name]
    model = _validate_arguments(call, rule)
    if isinstance(model, Envelope):
        fp = invalid_fingerprint(call.name, call.arguments)
        return _refused_repeat(state, call, fp) or _count_refusal(
            state, "invalid_input", call, fp, model)
    args = model if isinstance(model, dict) else model.model_dump(mode="json")
    fp = fingerprint(call.name, args)
    if fp in state.rejected_fingerprints:
        state.log("refused_rejected_again", tool=call.name, call_id=call.call_id, fp=fp)
        # Repeating a call a human refused is a loop too: the limit for it is zero.
        state.force_final = True
        state.pending_limit = state.pending_limit or StopReason.MAX_IDENTICAL_CALLS
        return Reply(call=call, envelope=env.rejected("an identical call was rejected earlier"),
                     fingerprint=fp)
    blocked = _refused_repeat(state, call, fp)
    if blocked is not None:
        return blocked
    verdict = argument_rules.evaluate(state.policy.rules, call.name, args)
    if verdict is not None and verdict.action == "deny":
        # Counted like a refusal: repeating a denied call ends as an identical-call loop.
        return _count_refusal(state, "blocked_by_rule", call, fp, env.blocked(
            "DENIED_BY_RULE",
            f"A policy rule denies this call ({verdict.text}); it was not executed. Do not "
            "call it again with these arguments: answer the user with what you have."),
            detail=verdict.text)
    max_calls = state.limits.per_tool_max_calls.get(call.name, rule.max_calls)
    if state.tree is not None and rule.max_calls is not None and max_calls is not None:
        # A sub-agent's cap is what its caller left: never more than the tool's own.
        max_calls = min(max_calls, rule.max_calls)
    if max_calls is not None and state.per_tool_calls.get(call.name, 0) >= max_calls:
        state.log("blocked_tool_limit", tool=call.name, call_id=call.call_id, fp=fp)
        state.force_final = True
        state.pending_limit = state.pending_limit or StopReason.MAX_TOOLS
        return Reply(call=call, fingerprint=fp, envelope=env.blocked(
            "TOOL_CALL_LIMIT",
            f"{call.name} may run at most {max_calls} times per run. "
            "Answer the user with the results you have."))
    state.identical_calls[fp] = state.identical_calls.get(fp, 0) + 1
    state.per_tool_calls[call.name] = state.per_tool_calls.get(call.name, 0) + 1
    # A rule's `ask` holds whatever the approval policy says; its `allow` leaves the
    # tool's own declaration as it is (that is the operator's).
    asked = verdict.text if verdict is not None and verdict.action == "ask" else None
    ask = asked is not None or needs_approval(rule, model, state.policy)
    # A remembered approval answers an ask only: a deny returned above, whoever remembered.
    grant = next((g for g in state.grants if g.covers(call.name, args)), None) if ask else None
    if grant is not None:
        state.log("approval_remembered", tool=call.name, call_id=call.call_id, fp=fp,
                  detail=f"by {preview(grant.approver, 100)}: {grant.text}")
    return Execute(call=call, arguments=args, fingerprint=fp, idempotency_key=key,
                   needs_approval=ask and grant is None, asked_because=asked,
                   asked_by=None if not ask else "rule" if asked is not None
                   else asked_by(rule, state.policy))


def _refused_repeat(state: LoopState, call: FunctionCall, fp: str) -> Reply | None:
    """`blocked` once a fingerprint was made `max_identical_calls` times (valid calls
    count when accepted, invalid and unknown ones when refused): the next request is
    forced final and the run ends `max_identical_calls`."""
    made = state.identical_calls.get(fp, 0)
    if made < state.limits.max_identical_calls:
        return None
    state.log("blocked_identical", tool=preview(call.name, 60), call_id=call.call_id, fp=fp)
    state.force_final = True
    state.pending_limit = state.pending_limit or StopReason.MAX_IDENTICAL_CALLS
    return Reply(call=call, fingerprint=fp, envelope=env.blocked(
        "IDENTICAL_CALL_LIMIT",
        f"This exact call was already made {made} times; its result is above"
        f"{' (or in the summary of the earlier conversation)' if state.summary else ''}. "
        "Do not call it again: answer the user with the results you have."))


def _count_refusal(state: LoopState, event: str, call: FunctionCall, fp: str,
                   envelope: Envelope, detail: str | None = None) -> Reply:
    state.identical_calls[fp] = state.identical_calls.get(fp, 0) + 1
    state.log(event, tool=preview(call.name, 60), call_id=call.call_id, fp=fp, detail=detail)
    return Reply(call=call, envelope=envelope, fingerprint=fp)


def answer_reason(state: LoopState, plan: StepPlan) -> StopReason:
    """`completed` only for an answer given while the model was free to call
    tools, or after a terminal side effect succeeded (the run's goal). A forced answer
    names what forced it: the blocking limit, or the step limit on the last step."""
    if state.pending_limit is not None:
        return state.pending_limit
    if plan.last and not state.goal_reached:
        return StopReason.MAX_STEPS
    return StopReason.COMPLETED


# --- a tool returns -----------------------------------------------------------------


class ToolOutcome(BaseModel):
    """What a tool activity (or its failure) amounts to for the loop.

    - envelope: the model-facing result, already capped by the activity.
    - executed: the tool body ran (counts as a tool execution).
    - fatal: an unexpected exception after retries (-> `tool_error`).
    - worker_queue: of a call run as a local activity, in the worker that runs the run's
      workflow tasks: that worker's own task queue, when it is not the one the request
      named as the run's holder (the output is in that worker's cache, not the holder's).
    """

    model_config = ConfigDict(frozen=True)

    envelope: Envelope
    executed: bool = True
    fatal: bool = False
    worker_queue: str | None = Field(default=None, exclude_if=lambda v: v is None)
    # The envelope is the tool activity's own result (not serialised: always true there).
    from_activity: bool = Field(default=True, exclude=True)


def _count_execution(state: LoopState, tool: str, rules: dict[str, ToolRule]) -> None:
    state.tool_executions += 1
    state.cost_units += rules[tool].cost_units


def record_outcome(state: LoopState, plan: Execute, outcome: ToolOutcome,
                   rules: dict[str, ToolRule]) -> Envelope | StopReason:
    """Count the execution and cap the result; a fatal outcome stops the run."""
    tool = plan.call.name
    if outcome.executed:
        _count_execution(state, tool, rules)
    if outcome.fatal:
        state.log("tool_failed", tool=tool, call_id=plan.call.call_id, fp=plan.fingerprint)
        return state.stop(StopReason.TOOL_ERROR)
    capped = env.cap_envelope(outcome.envelope, state.limits.max_result_bytes)
    if capped is None:
        return state.stop(StopReason.RESULT_LIMIT)
    if capped.error_code == "RESULT_TOO_LARGE" and outcome.envelope.error_code != capped.error_code:
        state.log("result_too_large", tool=tool, call_id=plan.call.call_id, fp=plan.fingerprint)
    state.log(f"tool_{capped.status.value}", tool=tool, call_id=plan.call.call_id,
              fp=plan.fingerprint)
    if capped.terminal and capped.status == ToolStatus.SUCCESS:
        state.force_final = True
        state.goal_reached = True
    return capped


def result_payload_too_large(state: LoopState, plan: Execute,
                             rules: dict[str, ToolRule]) -> StopReason:
    """The tool ran but its result could not cross Temporal (over the payload limit).

    Its body ran once and is counted; running it again would repeat its side effect
    for a result that cannot be returned either, so the run stops with `result_limit`
    and the event log names the tool. (A result within `max_result_bytes` always fits:
    the cap's maximum is derived from the payload limit; this is the guard behind it.)
    """
    _count_execution(state, plan.call.name, rules)
    state.log("payload_too_large:tool_result", tool=plan.call.name, call_id=plan.call.call_id,
              fp=plan.fingerprint)
    return state.stop(StopReason.RESULT_LIMIT)


def check_payload(state: LoopState, what: str, size: int) -> StopReason | None:
    """Stop before the workflow builds a payload over Temporal's limit.

    `what` names the payload (`carried_state`, `model_request`, `tool_request`) in the
    event log. The reason is `history_limit`: the run's own record (its conversation
    bookkeeping, event log, approvals) outgrew what Temporal can carry, which, like a
    conversation over its cap, another attempt with the same settings cannot fix.
    """
    if fits_payload(size):
        return None
    state.log(f"payload_too_large:{what}")
    return state.stop(StopReason.HISTORY_LIMIT)


def events_within(events: list[Event], excess: int) -> list[Event]:
    """The event log without its oldest events worth at least `excess` JSON bytes, and
    one `events_dropped:N` event in their place: the workflow result must fit a payload,
    and the newest events say how the run ended."""
    if excess <= 0 or not events:
        return events
    dropped, freed = 0, 0
    marker = events[0]
    while dropped < len(events) - 1:
        freed += len(events[dropped].model_dump_json()) + 1  # +1: the comma
        dropped += 1
        marker = Event(step=events[dropped].step, event=f"events_dropped:{dropped}")
        if freed - len(marker.model_dump_json()) - 1 >= excess:
            break
    return [marker, *events[dropped:]] if dropped else events


def reply_output(state: LoopState, reply: Reply) -> Envelope | StopReason:
    """Cap an envelope the workflow made itself (invalid input, blocked, rejected)."""
    capped = env.cap_envelope(reply.envelope, state.limits.max_result_bytes)
    if capped is None:
        return state.stop(StopReason.RESULT_LIMIT)
    return capped


def outputs_items(pairs: list[tuple[FunctionCall, Envelope]]) -> list[Item]:
    """`function_call_output` items, one per call, in call order."""
    return [function_call_output(call.call_id, envelope.to_output()) for call, envelope in pairs]
