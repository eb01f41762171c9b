"""Remembered approvals through the real workflow on the dev server: an approval with
`remember` (and an optional `when` condition) approves the run's later calls it covers
without asking, never a call a rule denies nor one its condition leaves out; the next
run asks again; a signed remembered decision signs its grant."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle

from boundloop.client import decide, get_run
from boundloop.contracts import Decision
from boundloop.core.fingerprint import fingerprint
from boundloop.core.limits import Policy
from boundloop.core.rules import ArgumentRule
from boundloop.core.signatures import Remember
from boundloop.signing import Signer, new_key
from tests.conftest import RunScript
from tests.scripts import answer, call, outputs, resp
from tests.support.tools import marks
from tests.test_approvals import pending, refused, status_when
from tests.test_cli import cli, env_for

TICKET = {"title": "Printer on fire", "description": "3F printer smokes"}
NOT_HIGH = 'priority != "high"'
TRANSFERS = Policy(rules=[
    ArgumentRule(tool="transfer", when="amount > 100", action="ask"),
    ArgumentRule(tool="transfer", when="amount > 10000", action="deny"),
])
TOOLS = ["transfer", "create_ticket"]


def remembered(events: list[Any]) -> list[tuple[str | None, str | None]]:
    return [(e.call_id, e.detail) for e in events if e.event == "approval_remembered"]


async def test_a_remembered_approval_covers_the_runs_calls_its_condition_meets(
        run_script: RunScript, temporal: Client, tmp_path: Path) -> None:
    env = env_for(temporal, tmp_path)

    async def during(handle: WorkflowHandle[Any, Any]) -> None:
        status = await pending(handle, 3)
        # A bad condition, a condition the approved call does not meet, or remember on a
        # rejection are refused, and change nothing.
        assert "condition" in await refused(handle, Decision(
            call_id="t1", approve=True, remember=True, when="priority ==", approver="alice"))
        assert "does not cover" in await refused(handle, Decision(
            call_id="t1", approve=True, remember=True, when='priority == "low"',
            approver="alice"))
        assert "only accepted with an approval" in await refused(handle, Decision(
            call_id="t1", approve=False, remember=True, approver="alice"))
        assert "only accepted with `remember`" in await refused(handle, Decision(
            call_id="t1", approve=True, when=NOT_HIGH, approver="alice"))
        again = await pending(handle, 3)
        assert (again.grants, remembered(again.events)) == ([], [])
        assert [a.call_id for a in status.pending] == ["t1", "t2", "t3"]
        code, _, err = await cli("approve", handle.id, "t1", "--as", "alice", "--remember",
                                 "--when", "priority >", env=env)
        assert code != 0 and "priority >" in err
        code, out, err = await cli("approve", handle.id, "t1", "--as", "alice", "--remember",
                                   "--when", NOT_HIGH, env=env)
        assert code == 0, err
        # t2 (low) is covered at once; t3 (high) still waits.
        left = await pending(handle, 1)
        assert [a.call_id for a in left.pending] == ["t3"]
        [grant] = left.grants
        assert (grant.tool, grant.when, grant.approver, grant.call_id) == (
            "create_ticket", NOT_HIGH, "alice", "t1")
        assert remembered(left.events) == [("t2", f"by alice: create_ticket when {NOT_HIGH}")]
        code, out, _ = await cli("status", handle.id, env=env)
        assert code == 0 and (f"remembered: create_ticket when {NOT_HIGH} (approved by alice "
                              "on `t1`; this run only)") in " ".join(out.split())
        await decide(handle, Decision(call_id="t3", approve=False, reason="not urgent"))

    out = await run_script([
        resp(call("create_ticket", {**TICKET, "priority": "normal"}, "t1"),
             call("create_ticket", {**TICKET, "priority": "low"}, "t2"),
             call("create_ticket", {**TICKET, "priority": "high"}, "t3")),
        answer("Two tickets filed."),
    ], tools=TOOLS, during=during)
    r = out.result
    assert (r.reason, r.tool_executions) == ("completed", 2)
    results = outputs(out.bodies[1])
    assert [results[c]["status"] for c in ("t1", "t2", "t3")] == [
        "success", "success", "rejected"]


async def test_later_steps_are_covered_a_deny_still_denies_and_the_next_run_asks(
        run_script: RunScript) -> None:
    async def during(handle: WorkflowHandle[Any, Any]) -> None:
        await pending(handle)
        await decide(handle, Decision(call_id="a", approve=True, approver="bob",
                                      remember=True))
        # "b" ran without asking; "c" is denied by the rule whatever was remembered.

    out = await run_script([
        resp(call("transfer", {"amount": 500, "to": "acct-1"}, "a")),
        resp(call("transfer", {"amount": 700, "to": "acct-2"}, "b"),
             call("transfer", {"amount": 20000, "to": "acct-3"}, "c")),
        answer("Two transfers done."),
    ], tools=TOOLS, policy=TRANSFERS, during=during)
    r = out.result
    assert (r.reason, r.tool_executions) == ("completed", 2)
    assert remembered(r.events) == [("b", "by bob: transfer")]
    assert [e.call_id for e in r.events if e.event == "approval_requested"] == ["a"]
    assert [e.call_id for e in r.events if e.event == "blocked_by_rule"] == ["c"]
    assert sorted(w for _, w in marks(out.data_dir)) == [
        "transfer 500.0 to acct-1", "transfer 700.0 to acct-2"]

    async def asks_again(handle: WorkflowHandle[Any, Any]) -> None:
        status = await pending(handle)
        assert (status.grants, [a.call_id for a in status.pending]) == ([], ["b2"])
        await decide(handle, Decision(call_id="b2", approve=False, reason="no"))

    nxt = await run_script([
        resp(call("transfer", {"amount": 700, "to": "acct-2"}, "b2")),
        answer("Not transferred."),
    ], tools=TOOLS, policy=TRANSFERS, during=asks_again)
    assert (nxt.result.tool_executions, remembered(nxt.result.events)) == (0, [])


@pytest.fixture
def alice(tmp_path: Path) -> Signer:
    made = new_key("alice", tmp_path)
    return Signer.from_file("alice", made.private_path)


async def test_a_signed_remembered_decision_signs_its_grant(
        run_script: RunScript, alice: Signer, temporal: Client) -> None:
    async def during(handle: WorkflowHandle[Any, Any]) -> None:
        status = await pending(handle, 2)
        target = status.pending[0]
        # Signed as a plain approval, sent with `remember`: the grant is not signed.
        shown = {"run": status.run, "fingerprint": target.fingerprint}
        plain = alice.sign(workflow_id=handle.id, call_id="t1", step=target.step,
                           fingerprint=fingerprint(target.tool, target.arguments),
                           approve=True, arguments=None, reason=None, run=status.run)
        assert "not alice's" in await refused(handle, Decision(
            call_id="t1", approve=True, approver="alice", remember=True, signature=plain,
            **shown))
        wider = alice.sign(workflow_id=handle.id, call_id="t1", step=target.step,
                           fingerprint=fingerprint(target.tool, target.arguments),
                           approve=True, arguments=None, reason=None,
                           remember=Remember(when=None), run=status.run)
        assert "not alice's" in await refused(handle, Decision(
            call_id="t1", approve=True, approver="alice", remember=True, when=NOT_HIGH,
            signature=wider, **shown))
        await pending(handle, 2)
        await (await get_run(temporal, handle.id)).approve(
            "t1", signer=alice, remember=True, when=NOT_HIGH)
        done = await status_when(handle, lambda s: not s.pending, "no pending approval")
        assert [g.approver for g in done.grants] == ["alice"]

    out = await run_script([
        resp(call("create_ticket", {**TICKET, "priority": "normal"}, "t1"),
             call("create_ticket", {**TICKET, "priority": "low"}, "t2")),
        answer("Two tickets filed."),
    ], tools=TOOLS, policy=Policy(approver_keys={"alice": alice.public_key}),
        during=during)
    assert (out.result.reason, out.result.tool_executions) == ("completed", 2)
    assert remembered(out.result.events) == [("t2", f"by alice: create_ticket when {NOT_HIGH}")]
