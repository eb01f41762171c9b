"""Agent trees: another agent as a tool of a run, bounded by the run that calls it.
Pure: no Temporal, no I/O.

A run's model calls a sub-agent like any tool (`AgentTool`, made by `Agent.as_tool`);
the run starts it as a child run of the same loop and waits for its end. Before it
starts, the calling run gives it an *allowance* out of what it has left (tokens, USD,
tool executions, tool cost units, processing time), minus a reserve the caller keeps to
read the answer and go on; the child's own limits are the smaller of what it declares
and that allowance, and its policy the stricter of its own and the caller's. A child
never sends a model request whose worst case (every input token the request may hold
plus the most output it may produce) would pass what is left of its allowance, so a
tree spends at most what its root's limits allow. When the child ends, everything it
used is charged to the caller, and what it did not use is the caller's again.

Sub-agents of one response run one after another, in call order, like every tool call:
each allowance is cut from what is left when that child starts, so two siblings never
hold the same tokens.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from boundloop.core import budget as shared
from boundloop.core import envelope as env
from boundloop.core.envelope import Envelope, ToolStatus
from boundloop.core.limits import Limits, Policy, PromptText, RunSettings
from boundloop.core.loop import LoopState
from boundloop.core.mcp_tools import MCPToolDeclaration
from boundloop.core.reasons import StopReason
from boundloop.core.rules import ArgumentRule

#: The share of what the caller has left that it keeps back when a child starts (on top
#: of its next request's input): enough to read the child's answer and go on.
RESERVE_SHARE = 0.1
#: A child's most output per response when neither it nor its caller sets
#: `max_output_tokens` (a child needs one: its worst case bounds every request it sends);
#: never more than half its allowance of tokens.
CHILD_OUTPUT_TOKENS = 4096
#: Events of the calling run.
STARTED = "subagent_started"
ENDED = "subagent_ended"
NOT_STARTED = "subagent_not_started"
#: The event of a child run that stops before a request whose worst case would pass
#: what is left of its allowance.
ALLOWANCE_SPENT = "allowance_spent"
#: The most argument rules one policy holds (`Policy.rules`).
MAX_RULES = 100

ToolName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]


class AgentTool(BaseModel):
    """Another agent as a tool a run's model may call (`boundloop.Agent.as_tool`): the
    child run's question is the call's `question` argument; the rest is the agent's
    definition, carried in the calling run's input."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: ToolName
    description: str = Field(min_length=1, max_length=1024)
    instructions: PromptText | None = None
    settings: RunSettings
    tools: list[str]
    mcp_tools: list[MCPToolDeclaration] = Field(default_factory=list,
                                                exclude_if=lambda v: not v)
    task_queue: str = Field(min_length=1, max_length=1000)
    #: The sub-agent's own sub-agents.
    agents: list[AgentTool] = Field(default_factory=list, exclude_if=lambda v: not v)

    def declaration(self) -> MCPToolDeclaration:
        """How the calling run's model sees it (and how the run checks its calls)."""
        return MCPToolDeclaration(
            name=self.name, server="boundloop", remote_name=self.name,
            description=self.description, strict=True, needs_approval=False,
            side_effects=False, max_attempts=1, parameters={
                "type": "object", "additionalProperties": False, "required": ["question"],
                "properties": {"question": {
                    "type": "string", "minLength": 1, "maxLength": 16000,
                    "description": "What to ask this agent: everything it needs to know, "
                                   "since it sees nothing else of this conversation"}}})


@dataclass(frozen=True)
class ChildEnded:
    """What the calling run needs of a child's `RunResult`."""

    reason: StopReason
    text: str
    steps: int
    tool_executions: int
    input_tokens: int
    output_tokens: int
    total_tokens: int
    cost_usd: float | None
    cost_units: int
    usage_estimated: bool
    workflow_id: str
    #: Its processing time (approval waits excluded).
    processing_seconds: float = 0.0
    #: A response of it came without usage (RunResult.usage_unknown).
    usage_unknown: bool = False
    #: Its calls per tool (RunResult.per_tool_calls): its caller's per-tool limits count
    #: them too.
    per_tool_calls: dict[str, int] = field(default_factory=dict)

    @property
    def uncounted(self) -> bool:
        """A response's usage was neither given nor estimated: it stopped on it
        (`usage_unknown`, or a fault: `protocol_error`), or it never estimated."""
        return self.usage_unknown and (
            self.reason in (StopReason.USAGE_UNKNOWN, StopReason.PROTOCOL_ERROR)
            or not self.usage_estimated)


@dataclass(frozen=True)
class ChildFailed:
    """The child run failed instead of ending: `refused` by its worker's admission (the
    operator's policy, tools its worker does not serve), or `failed` (terminated, timed
    out). `detail` is the operator's line, never shown to the model."""

    kind: Literal["refused", "failed"]
    detail: str
    #: It ran and left no RunResult (terminated, timed out): what it used is unknown, so
    #: its caller is charged its whole allowance (`charge_allowance`).
    use_unknown: bool = False


# --- before a child starts ------------------------------------------------------------


def refused_by_limits(state: LoopState) -> str | None:
    """Whether the run may start one more child: its `max_children` and `max_depth`."""
    lim = state.limits
    if state.children >= lim.max_children:
        return f"max_children {lim.max_children}: this run started {state.children} sub-agents"
    depth = state.tree.depth if state.tree is not None else 0
    if depth + 1 > lim.max_depth:
        return f"max_depth {lim.max_depth}: this run is at depth {depth}"
    return None


def blocked_by_limits(state: LoopState, why: str) -> Envelope:
    """The call of a sub-agent past `max_children` or `max_depth`: not started; the next
    request is the run's last and it ends with that limit."""
    state.force_final = True
    reason = StopReason.MAX_CHILDREN if why.startswith("max_children") else StopReason.MAX_DEPTH
    state.pending_limit = state.pending_limit or reason
    return env.blocked("SUBAGENT_LIMIT", f"No more sub-agents may start in this run ({why}). "
                       "Answer the user with the results you have.")


def rules_crowded(parent: Policy, child: Policy) -> str | None:
    """Why the child's argument rules do not fit beside its caller's in one policy
    (`Policy.rules` holds at most MAX_RULES), or None. Cut to fit, the child's own would
    be the ones dropped: it would call tools its own rules ask for or deny."""
    count = len(parent.rules) + sum(r not in parent.rules for r in child.rules)
    if count <= MAX_RULES:
        return None
    return (f"its argument rules and this run's are {count} together; a policy holds "
            f"{MAX_RULES}")


def crowded(name: str) -> Envelope:
    """The model's output for a sub-agent whose rules do not fit beside the caller's."""
    return env.blocked("SUBAGENT_NOT_STARTED",
                       f"The {name} agent was not started: its policy cannot be joined "
                       "to this run's. Answer the user with the results you have.")


def stricter_policy(parent: Policy, child: Policy) -> Policy:
    """The child's policy, never looser than its caller's: the stricter approval mode,
    the caller's argument rules too, the approvers both allow for a tool both name, the
    caller's approver keys and prices, `stop` for missing usage and unknown tools when
    either says so."""
    order = {"never": 0, "tool": 1, "always": 2}
    approval = max(parent.approval, child.approval, key=order.__getitem__)
    approvers = dict(parent.approvers)
    for tool, names in child.approvers.items():
        # Empty (or none) means anyone: where the two lists share no one, the caller's
        # stands.
        theirs = approvers.get(tool) or []
        both = [n for n in names if not theirs or n in theirs]
        approvers[tool] = both or theirs
    rules = [*parent.rules, *(r for r in child.rules if r not in parent.rules)]
    return child.model_copy(update={
        "approval": approval, "approvers": approvers, "rules": rules[:MAX_RULES],
        "approver_keys": _stricter_keys(parent.approver_keys, child.approver_keys),
        "prices": {**child.prices, **parent.prices},
        "missing_usage": "stop" if "stop" in (parent.missing_usage, child.missing_usage)
        else "estimate",
        "unknown_tool": "stop" if "stop" in (parent.unknown_tool, child.unknown_tool)
        else "report"})


def _stricter_keys(parent: dict[str, str], child: dict[str, str]) -> dict[str, str]:
    """The approver keys a child's decisions are checked by: where the caller has keys,
    only those (a key the caller does not hold would let someone it never trusted
    decide the child's calls), narrowed to the ones the child names too; else the
    child's own, which only tighten."""
    if not parent:
        return dict(child)
    both = {name: key for name, key in child.items() if parent.get(name) == key}
    return both or dict(parent)


def allowance(state: LoopState, tool: AgentTool, *, processing_seconds: float,
              next_input_tokens: int, later_calls: int,
              later_units: int = 0,
              caps: Mapping[str, int] | None = None) -> RunSettings | str:
    """The child's settings: its own, cut to what the caller has left less its reserve.
    A string says why it cannot start (nothing left of a limit).

    `next_input_tokens`: the caller's estimate of its next request's input (kept back
    with RESERVE_SHARE of what is left); `later_calls`: the caller's calls of this
    response still to run after this one (their executions are kept back too);
    `later_units`: their tool cost units (planned within the caller's tool_cost_budget,
    they run whatever the child spends); `caps`: the caller's calls allowed per tool
    (`per_tool_max_calls`, else the tool's own `max_calls`) of the tools the child may
    call: the child may make only what is left of them, and none of a tool whose calls
    the caller spent (a deny rule)."""
    lim, own = state.limits, tool.settings.limits
    tokens_left = lim.token_threshold - state.usage.total_tokens
    cap = own.max_output_tokens or lim.max_output_tokens
    reserve = next_input_tokens + (lim.max_output_tokens or math.ceil(tokens_left * RESERVE_SHARE))
    tokens = min(own.token_threshold, tokens_left - reserve)
    if tokens <= 0:
        return (f"{tokens_left} tokens left of token_threshold {lim.token_threshold}, and "
                f"{reserve} kept to read its answer")
    executions = min(own.max_tool_executions,
                     lim.max_tool_executions - state.tool_executions - later_calls - 1)
    if executions <= 0:
        return (f"no tool executions left for it (max_tool_executions "
                f"{lim.max_tool_executions}, {state.tool_executions} ran)")
    seconds_left = lim.deadline_seconds - processing_seconds
    seconds = min(own.deadline_seconds, seconds_left * (1 - RESERVE_SHARE))
    if seconds <= 0:
        return f"no processing time left (deadline_seconds {lim.deadline_seconds})"
    update: dict[str, object] = {
        "token_threshold": tokens, "max_tool_executions": executions,
        "deadline_seconds": seconds,
        # A tree waits for a person no longer than its root would.
        "approval_timeout_seconds": min(own.approval_timeout_seconds,
                                        lim.approval_timeout_seconds),
        "max_children": min(own.max_children, lim.max_children),
        "max_depth": min(own.max_depth, lim.max_depth)}
    window = own.max_input_tokens
    # At most half its tokens: a cap its allowance cannot pay for would stop the child
    # before its first request (a grandchild of a root with the default limits).
    cap = min(cap or CHILD_OUTPUT_TOKENS, max(1, tokens // 2))
    update["max_output_tokens"] = min(cap, window - 1) if window is not None else cap
    policy = stricter_policy(state.policy, tool.settings.policy)
    if lim.usd_budget is not None:
        if tool.settings.model not in policy.prices:
            return (f"its model {tool.settings.model!r} has no price, and this run has a "
                    "usd_budget")
        usd_left = lim.usd_budget - state.cost_usd
        usd = min(own.usd_budget or usd_left, usd_left * (1 - RESERVE_SHARE))
        if usd <= 0:
            return f"no USD left (usd_budget {lim.usd_budget})"
        update["usd_budget"] = usd
    if lim.tool_cost_budget is not None:
        units = min(own.tool_cost_budget or lim.tool_cost_budget,
                    lim.tool_cost_budget - state.cost_units - later_units)
        if units <= 0:
            return f"no tool cost units left (tool_cost_budget {lim.tool_cost_budget})"
        update["tool_cost_budget"] = units
    per_tool = dict(own.per_tool_max_calls)
    spent: list[str] = []
    for name, cap_calls in (caps or {}).items():
        if name not in tool.tools:
            continue
        left = cap_calls - state.per_tool_calls.get(name, 0)
        if left <= 0:
            spent.append(name)
        else:
            per_tool[name] = min(per_tool.get(name, left), left)
    update["per_tool_max_calls"] = per_tool
    if spent:
        rules = [*policy.rules, *(ArgumentRule(
            tool=name, action="deny", reason="its caller's calls of it are spent")
            for name in spent)]
        if len(rules) > MAX_RULES:
            return f"its tools' spent calls ({', '.join(spent)}) leave no room for their rules"
        policy = policy.model_copy(update={"rules": rules})
    limits = Limits.model_validate({**own.model_dump(), **update})
    return RunSettings(model=tool.settings.model, api=tool.settings.api, limits=limits,
                       policy=policy, budget=tool.settings.budget or state.settings.budget,
                       stream=tool.settings.stream)


def allowance_line(settings: RunSettings) -> str:
    """The allowance a child starts with, for the caller's event log."""
    lim = settings.limits
    usd = f", {lim.usd_budget:.4f} USD" if lim.usd_budget is not None else ""
    return (f"allowance: {lim.token_threshold} tokens{usd}, {lim.max_tool_executions} tool "
            f"executions, {lim.deadline_seconds:.0f} s")


def not_started(name: str, why: str) -> Envelope:
    """The model's output for a sub-agent that could not start for want of budget."""
    return env.blocked("SUBAGENT_NOT_STARTED",
                       f"The {name} agent was not started: this run has too little left "
                       f"for it ({why}). Answer the user with the results you have.")


# --- a child runs ---------------------------------------------------------------------


def check_allowance(state: LoopState, fixed_bytes: int) -> StopReason | None:
    """Of a child run, before each model request: stop (`usage_limit`, or
    `budget_limit` for USD) when the request's worst case would pass what is left of its
    allowance. The request is not sent, so it is not a step."""
    if state.tree is None:
        return None
    lim = state.limits
    cap = lim.max_output_tokens or CHILD_OUTPUT_TOKENS
    worst = shared.worst_case(
        state.policy.prices.get(state.settings.model),
        shared.input_tokens_bound(conversation_bytes=state.conversation.bytes,
                                  fixed_bytes=fixed_bytes, last_tokens=state.last_tokens,
                                  last_bytes=state.last_bytes), cap)
    reason, detail = None, ""
    if state.usage.total_tokens + worst.tokens > lim.token_threshold:
        reason = StopReason.USAGE_LIMIT
        detail = (f"the next request may use {worst.tokens} tokens; "
                  f"{lim.token_threshold - state.usage.total_tokens} are left of the "
                  f"allowance ({lim.token_threshold})")
    elif lim.usd_budget is not None and state.cost_usd + worst.usd > lim.usd_budget:
        reason = StopReason.BUDGET_LIMIT
        detail = (f"the next request may cost {worst.usd:.6f} USD; "
                  f"{lim.usd_budget - state.cost_usd:.6f} are left of the allowance")
    if reason is None:
        return None
    state.steps -= 1
    if state.events and state.events[-1].event == "model_requested":
        state.events.pop()  # begin_step logged the request that is not sent
    state.log(ALLOWANCE_SPENT, detail=detail)
    return state.stop(reason)


# --- a child ended ----------------------------------------------------------------------


def charge(state: LoopState, ended: ChildEnded) -> None:
    """Everything the child used is the caller's too (its totals, the token threshold,
    the USD budget, tool executions and cost units, which the next checks see)."""
    state.usage.input_tokens += ended.input_tokens
    state.usage.output_tokens += ended.output_tokens
    state.usage.total_tokens += ended.total_tokens
    state.usage.estimated = state.usage.estimated or ended.usage_estimated
    state.cost_usd += ended.cost_usd or 0.0
    state.tool_executions += ended.tool_executions
    state.cost_units += ended.cost_units
    for name, calls in ended.per_tool_calls.items():
        state.per_tool_calls[name] = state.per_tool_calls.get(name, 0) + calls


def charge_allowance(state: LoopState, settings: RunSettings) -> None:
    """A child that ran and left no RunResult (terminated, timed out) may have used all
    of its allowance: the caller is charged all of it (tokens, executions, and USD and
    cost units where the caller has a budget of them), as a model attempt that brought
    no answer is charged its worst case."""
    lim = settings.limits
    state.usage.total_tokens += lim.token_threshold
    state.usage.estimated = True
    state.tool_executions += lim.max_tool_executions
    if state.limits.usd_budget is not None:
        state.cost_usd += lim.usd_budget or 0.0
    if state.limits.tool_cost_budget is not None:
        state.cost_units += lim.tool_cost_budget or 0


def charge_uncounted(state: LoopState, ended: ChildEnded, settings: RunSettings) -> None:
    """A child with a response it could not count (`ChildEnded.uncounted`) may have
    used, in it, all that was left of its allowance (its worst case was within it): the
    caller is charged the whole allowance, not only what the child counted."""
    lim = settings.limits
    state.usage.total_tokens += max(0, lim.token_threshold - ended.total_tokens)
    state.usage.estimated = True
    if state.limits.usd_budget is not None and lim.usd_budget is not None:
        state.cost_usd += max(0.0, lim.usd_budget - (ended.cost_usd or 0.0))


def over_limits(state: LoopState) -> StopReason | None:
    """After a child's use is charged: the caller's token threshold or USD budget
    reached stops it, as its own response would have."""
    if state.usage.total_tokens >= state.limits.token_threshold:
        return state.stop(StopReason.USAGE_LIMIT)
    budget = state.limits.usd_budget
    if budget is not None and state.cost_usd >= budget:
        return state.stop(StopReason.BUDGET_LIMIT)
    return None


def output(name: str, ended: ChildEnded | ChildFailed) -> Envelope:
    """The model's output for a sub-agent's call: its answer when it completed; when a
    limit or a fault cut it short, an error saying so (its partial answer is data, never
    a clean answer)."""
    if isinstance(ended, ChildFailed):
        what = ("was refused by the operator's policy or its worker" if ended.kind == "refused"
                else "failed before it could answer")
        return Envelope(status=ToolStatus.PERMANENT_ERROR, retryable=False,
                        error_code="SUBAGENT_FAILED",
                        message=f"The {name} agent {what}. Do not call it again with this "
                                "question; answer the user with what you have.")
    data = {"answer": ended.text, "stop_reason": ended.reason.value,
            "completed": ended.reason == StopReason.COMPLETED, "steps": ended.steps,
            "tool_executions": ended.tool_executions, "total_tokens": ended.total_tokens,
            "cost_usd": ended.cost_usd}
    if ended.reason == StopReason.COMPLETED:
        return env.success(data, f"the {name} agent answered")
    return Envelope(status=ToolStatus.PERMANENT_ERROR, retryable=False, data=data,
                    error_code="SUBAGENT_STOPPED",
                    message=f"The {name} agent stopped before finishing "
                            f"({ended.reason.value}): its answer, if any, is partial. "
                            "Do not present it as complete.")
