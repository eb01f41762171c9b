"""Argument rules through the real workflow on the dev server: `ask` makes a call wait
for approval saying why, `deny` answers the model `blocked` naming the rule, globs match
tool names; remembered decisions cover later calls of the same run only."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from temporalio.client import WorkflowHandle

from boundloop.client import decide
from boundloop.contracts import Decision
from boundloop.core.limits import Policy
from boundloop.core.rules import ArgumentRule
from tests.conftest import RunScript
from tests.scripts import answer, call, outputs, resp
from tests.support.tools import marks
from tests.test_approvals import pending

TRANSFER_RULES = Policy(rules=[
    ArgumentRule(tool="transfer", when="amount > 100", action="ask"),
    ArgumentRule(tool="transfer", when="amount > 10000", action="deny",
                 reason="over the daily limit"),
    ArgumentRule(tool="delete_*", action="ask"),
])
TOOLS = ["transfer", "delete_record", "create_ticket"]


async def test_transfer_rules_allow_ask_and_deny_by_amount(run_script: RunScript) -> None:
    async def during(handle: WorkflowHandle[Any, Any]) -> None:
        status = await pending(handle)
        [waiting] = status.pending
        assert (waiting.call_id, waiting.asked_because) == ("big", "amount > 100")
        requested = [e for e in status.events if e.event == "approval_requested"]
        assert [e.detail for e in requested] == ["asked because: amount > 100"]
        assert await decide(handle, Decision(call_id="big", approve=True,
                                             approver="alice")) == "approved"

    out = await run_script([
        resp(call("transfer", {"amount": 50, "to": "acct-1"}, "small"),
             call("transfer", {"amount": 500, "to": "acct-2"}, "big"),
             call("transfer", {"amount": 20000, "to": "acct-3"}, "huge")),
        answer("Two transfers done; the third is over the limit."),
    ], tools=TOOLS, policy=TRANSFER_RULES, during=during)
    r = out.result
    assert (r.reason, r.tool_executions) == ("completed", 2)
    assert sorted(w for _, w in marks(out.data_dir)) == [
        "transfer 50.0 to acct-1", "transfer 500.0 to acct-2"]
    results = outputs(out.bodies[1])
    assert results["small"]["status"] == results["big"]["status"] == "success"
    huge = results["huge"]
    assert (huge["status"], huge["error_code"]) == ("blocked", "DENIED_BY_RULE")
    assert "amount > 10000 (over the daily limit)" in huge["message"]
    blocked = [e for e in r.events if e.event == "blocked_by_rule"]
    assert [(e.call_id, e.detail) for e in blocked] == [
        ("huge", "amount > 10000 (over the daily limit)")]
    # Only the big one waited: the small one ran without asking.
    assert [e.call_id for e in r.events if e.event == "approval_requested"] == ["big"]


async def test_a_glob_rule_asks_for_every_matching_tool(run_script: RunScript) -> None:
    async def during(handle: WorkflowHandle[Any, Any]) -> None:
        status = await pending(handle)
        assert [(a.tool, a.asked_because) for a in status.pending] == [
            ("delete_record", "delete_*")]
        await decide(handle, Decision(call_id="d1", approve=False, reason="keep it"))

    out = await run_script([
        resp(call("delete_record", {"record": "r-7"}, "d1")),
        answer("I kept the record."),
    ], tools=TOOLS, policy=TRANSFER_RULES, during=during)
    assert (out.result.reason, out.result.tool_executions) == ("completed", 0)
    assert marks(out.data_dir) == []


def test_a_runs_own_rules_may_only_ask_or_deny() -> None:
    with pytest.raises(ValidationError, match="a run's own rules may only ask or deny"):
        Policy(rules=[ArgumentRule(tool="create_ticket", action="allow")])
    with pytest.raises(ValidationError, match="not a valid condition"):
        Policy.model_validate({"rules": [{"tool": "transfer", "when": "amount >",
                                          "action": "ask"}]})
    with pytest.raises(ValidationError, match="function call"):
        Policy.model_validate({"rules": [{"tool": "transfer", "action": "deny",
                                          "when": "__import__('os').getpid() > 0"}]})


async def test_a_rule_ask_holds_when_the_run_says_approval_never(
        run_script: RunScript) -> None:
    async def during(handle: WorkflowHandle[Any, Any]) -> None:
        await pending(handle)
        await decide(handle, Decision(call_id="big", approve=False))

    out = await run_script([
        resp(call("transfer", {"amount": 500, "to": "acct-2"}, "big")),
        answer("Not transferred."),
    ], tools=["transfer", "delete_record"],  # create_ticket's own ask cannot be turned off
        policy=TRANSFER_RULES.model_copy(update={"approval": "never"}), during=during)
    assert out.result.tool_executions == 0
    assert marks(out.data_dir) == []
