"""Approval decisions: pure checks and state changes.

A call to an approval-required tool is validated first (arguments, limits, identical
calls) and then recorded here as pending. Decisions come by signal or update; both go
through `check`, so an update is refused - and a signal ignored - for the same reasons.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any, Protocol

from pydantic import ValidationError

from boundloop.core import envelope as env
from boundloop.core import rules as argument_rules
from boundloop.core import signatures
from boundloop.core.canonical import compact_json, preview
from boundloop.core.envelope import Envelope
from boundloop.core.fingerprint import fingerprint
from boundloop.core.loop import (
    Approval,
    Execute,
    Grant,
    LoopState,
    ToolRule,
    parse_arguments,
    validation_problems,
)


class DecisionLike(Protocol):
    call_id: str
    approve: bool
    approver: str
    reason: str | None
    arguments: dict[str, Any] | None
    signature: signatures.Signature | None
    remember: bool
    when: str | None
    run: str | None
    fingerprint: str | None

    @property
    def scope(self) -> str: ...


def remembered(decision: DecisionLike) -> signatures.Remember | None:
    """The grant a decision asks for, as its signature covers it."""
    return (signatures.Remember(when=decision.when, scope=decision.scope)
            if decision.remember else None)


def request(state: LoopState, plan: Execute, step: int, now: datetime) -> Approval:
    approval = Approval(
        call_id=plan.call.call_id, tool=plan.call.name, arguments=plan.arguments,
        fingerprint=plan.fingerprint, idempotency_key=plan.idempotency_key, step=step,
        requested_at=now.isoformat(), asked_because=plan.asked_because,
        asked_by=plan.asked_by)
    state.approvals.append(approval)
    state.log("approval_requested", tool=plan.call.name, call_id=plan.call.call_id,
              fp=plan.fingerprint, detail=None if plan.asked_because is None
              else f"asked because: {plan.asked_because}")
    return approval


def find(state: LoopState, call_id: str) -> Approval | None:
    """The latest approval for `call_id` (Chat servers may reuse ids across steps)."""
    for approval in reversed(state.approvals):
        if approval.call_id == call_id:
            return approval
    return None


def pending_count(state: LoopState) -> int:
    return sum(1 for a in state.approvals if a.status == "pending")


def withdraw(state: LoopState) -> None:
    """The run has stopped: nothing waits for a decision any more (the pending count,
    the status query and `list` say so), and a late decision is refused."""
    for approval in state.approvals:
        if approval.status == "pending":
            approval.status = "withdrawn"


def time_left(approval: Approval, now: datetime, limit: timedelta) -> timedelta:
    """Time until the approval times out, counted from when it was requested."""
    requested = datetime.fromisoformat(approval.requested_at)
    return max(timedelta(0), requested + limit - now)


def check(state: LoopState, decision: DecisionLike, rules: dict[str, ToolRule],
          signed: signatures.Context | None = None, *, in_session: bool = False,
          run: str | None = None, bound: bool = False) -> str | None:
    """Why the decision must be refused, or None. Never changes state.

    Refused: unknown call ids, calls already decided (a repeat is harmless: refused and
    nothing changes), when `signed` has keys a decision without a valid, fresh signature
    of its approver over this run, call and decision, approvers outside the tool's
    allow-list, edited arguments that fail the tool's schema, edited arguments on a
    rejection, `remember` on a rejection, a `when` without `remember`, a `when` that does
    not parse or does not cover the call it approves, a grant for the session in a run
    that is not a session's turn (`in_session`), a decision made for another run than
    `run` (this run's first execution run id) or for other arguments than those waiting
    (see `changed`).
    """
    approval = find(state, decision.call_id)
    if approval is None:
        return f"unknown call id {preview(decision.call_id, 60)!r}: no approval waits for it"
    if approval.status != "pending":
        return (f"call {approval.call_id} is already {approval.status}"
                + (f" by {approval.approver}" if approval.approver else ""))
    moved = changed(approval, decision, run, bound=bound)
    if moved is not None:
        return moved
    if signed is not None:
        bad = signatures.problem(
            signed, call_id=approval.call_id, step=approval.step,
            fingerprint=approval.fingerprint, approve=decision.approve,
            approver=decision.approver, arguments=decision.arguments,
            reason=decision.reason, signature=decision.signature,
            remember=remembered(decision), run=decision.run)
        if bad is not None:
            return bad
    allowed = state.policy.approvers.get(approval.tool)
    if allowed and decision.approver not in allowed:
        return (f"approver {preview(decision.approver, 60)!r} may not decide "
                f"{approval.tool} calls")
    grant_problem = _grant_problem(approval, decision)
    if grant_problem is not None:
        return grant_problem
    if decision.scope == "session" and not in_session:
        return ("remember for the session: this run is not a session's turn "
                "(remember it for the run)")
    if decision.arguments is not None:  # an approval's (form_problem refused the rest)
        rule = rules[approval.tool]
        if rule.args_model is None:  # a JSON schema tool (MCP)
            assert rule.check is not None
            invalid = rule.check(decision.arguments)
            return None if invalid is None else f"edited {invalid.message}"
        try:
            edited(rule, decision.arguments)
        except ValidationError as exc:
            return (f"edited arguments do not match the {approval.tool} schema: "
                    f"{validation_problems(exc)}")
    return None


#: The start of every refusal of a decision made for what no longer waits.
CHANGED = "the call changed since you looked at it"


def changed(approval: Approval, decision: DecisionLike, run: str | None, *,
            bound: bool) -> str | None:
    """Why a decision does not decide what waits now, or None. A decision binds the run
    (first execution run id) and the arguments' fingerprint its approver was shown: a
    new run under the same workflow id, or a call with the same id and other arguments,
    is not what they decided. A `bound` run (one started under this rule) refuses a
    signed decision that names neither (its signature must not hold for another run);
    any other decision is checked for what it names."""
    if bound and decision.signature is not None and (decision.run is None
                                                     or decision.fingerprint is None):
        return ("a signed decision names the run and the arguments it decides (`run` and "
                "`fingerprint`, as the pending call shows them): look at the call "
                "(`boundloop pending`) and decide again")
    if decision.run is not None and run is not None and decision.run != run:
        return (f"{CHANGED}: the decision was made for run {preview(decision.run, 60)!r}, "
                f"this is run {run} (another run, or a new run under the same workflow "
                "id); look at the call again")
    if decision.fingerprint is not None and decision.fingerprint != approval.fingerprint:
        return (f"{CHANGED}: you decided arguments with fingerprint "
                f"{preview(decision.fingerprint, 60)!r}, the call waiting now has "
                f"{approval.fingerprint}; look at it again")
    return None


def form_problem(decision: DecisionLike) -> str | None:
    """What a decision gets wrong in itself, whatever call it decides, or None: a `when`
    without `remember`, `remember` or edited arguments on a rejection, a `when` that does
    not parse. The client checks it before sending; `check` again (the same words)."""
    if decision.when is not None and not decision.remember:
        return "a `when` condition is only accepted with `remember`"
    if decision.scope != "run" and not decision.remember:
        return "a scope (for the session) is only accepted with `remember`"
    if decision.remember and not decision.approve:
        return "`remember` is only accepted with an approval"
    if decision.arguments is not None and not decision.approve:
        return "edited arguments are only accepted with an approval"
    if decision.when is not None:
        try:
            argument_rules.parse_condition(decision.when)
        except argument_rules.ConditionError as exc:
            return f"remember: condition {preview(decision.when, 100)!r}: {exc}"
    return None


def _grant_problem(approval: Approval, decision: DecisionLike) -> str | None:
    problem = form_problem(decision)
    if problem is not None or not decision.remember:
        return problem
    try:
        grant = _grant(approval, decision)
    except ValueError as exc:
        return f"remember: {exc}"
    arguments = approval.arguments if decision.arguments is None else decision.arguments
    if not grant.covers(approval.tool, arguments):
        return (f"remember: the condition {grant.when!r} does not cover the call it "
                "approves (its arguments do not meet it)")
    return None


def _grant(approval: Approval, decision: DecisionLike) -> Grant:
    """The grant of a remembered approval. Raises ValueError for a bad condition."""
    if decision.when is not None:
        try:
            argument_rules.parse_condition(decision.when)
        except argument_rules.ConditionError as exc:
            raise ValueError(f"condition {preview(decision.when, 100)!r}: {exc}") from None
    scope = "session" if decision.scope == "session" else "run"
    return Grant(tool=approval.tool, when=decision.when, approver=decision.approver,
                 call_id=approval.call_id, scope=scope)


def edited(rule: ToolRule, arguments: dict[str, Any]) -> dict[str, Any]:
    """Edited arguments validated like the model's own (from their JSON text) and in the
    same normal form. Raises ValidationError."""
    if rule.args_model is None:  # a JSON schema tool (MCP): checked by `check`, kept as JSON
        parsed: dict[str, Any] = json.loads(compact_json(arguments))
        return parsed
    return parse_arguments(rule.args_model, compact_json(arguments)).model_dump(mode="json")


def apply(state: LoopState, decision: DecisionLike, now: datetime,
          rules: dict[str, ToolRule]) -> None:
    """Record a decision that `check` accepted."""
    approval = find(state, decision.call_id)
    assert approval is not None and approval.status == "pending"
    approval.status = "approved" if decision.approve else "rejected"
    approval.approver = decision.approver
    approval.reason = decision.reason
    approval.decided_at = now.isoformat()
    if decision.arguments is not None:
        approval.arguments = edited(rules[approval.tool], decision.arguments)
    grant = _grant(approval, decision) if decision.remember else None
    if grant is not None:
        state.grants.append(grant)
    # Who decided, and whether the arguments were edited: the audit trail of a side effect.
    detail = f"by {preview(approval.approver, 100)}" + (
        ", edited arguments" if decision.arguments is not None else "") + (
        f", remembered for this {grant.scope}: {grant.text}" if grant is not None else "")
    state.log(f"approval_{approval.status}", tool=approval.tool, call_id=approval.call_id,
              fp=approval.fingerprint, detail=detail)
    if grant is not None:
        _remember_waiting(state, grant, now)


def _remember_waiting(state: LoopState, grant: Grant, now: datetime) -> None:
    """Calls of the same response still waiting that the grant covers are approved now
    (later calls are covered when they are planned: core.loop._plan_one)."""
    for other in state.approvals:
        if other.status == "pending" and grant.covers(other.tool, other.arguments):
            other.status = "approved"
            other.approver = grant.approver
            other.decided_at = now.isoformat()
            state.log("approval_remembered", tool=other.tool, call_id=other.call_id,
                      fp=other.fingerprint,
                      detail=f"by {preview(grant.approver, 100)}: {grant.text}")


def rejection(state: LoopState, approval: Approval) -> Envelope:
    """The model-facing result of a rejection; identical calls are refused from now on."""
    if approval.fingerprint not in state.rejected_fingerprints:
        state.rejected_fingerprints.append(approval.fingerprint)
    return env.rejected(approval.reason)


def approved_plan(plan: Execute, approval: Approval) -> Execute:
    """The call to execute: with the approver's edited arguments, if any."""
    if approval.arguments == plan.arguments:
        return plan
    return plan.model_copy(update={
        "arguments": approval.arguments,
        "fingerprint": fingerprint(plan.call.name, approval.arguments)})
