"""Agent trees under crashes, approvals and cancels, on a real dev server: a sub-agent's
run is a child workflow of the same loop, with the same guarantees (docs/agent-trees.md).

- kill -9 of the worker process while a child's side-effecting tool runs, or while it
  waits for approval: the side effect happens once (the tickets store), the child is
  started once, the tree ends;
- a child's approval is the child's: listed with its place in the tree, decided with a
  signature bound to the child's run, refused by the parent, even when both wait on
  the same call id;
- a cancel of the parent (or of the root, two levels up, or a terminate) while a child
  waits for approval ends each `cancelled`, the child's approval withdrawn and its tool
  never run; a cancel of the child alone reaches the parent's model as a stop;
- a reset of the parent to before its child's start takes the child's outcome and does
  not start it again.

Worker processes (the kill -9 cases) share tests/test_crash.py's cluster; the others
run an in-process worker (tests/test_agent_trees.py's run_tree). A child cut short
reaching the parent's model as such: tests/test_agent_trees.py.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import TerminatedError

from boundloop import Agent, AgentTool
from boundloop import search_attributes as sa
from boundloop._ops import pending_runs
from boundloop.agent import DEFAULT_TASK_QUEUE
from boundloop.client import get_run, query_status
from boundloop.client import result_of as client_result_of
from boundloop.contracts import TOOL_ACTIVITY, WORKFLOW_NAME, RunResult
from boundloop.core.limits import Limits, Policy
from boundloop.errors import DecisionRefused
from boundloop.scripted.server import ScriptedModelServer
from boundloop.signing import Signer, new_key
from boundloop.tools.demo import list_tickets
from tests.conftest import RUN_TIMEOUT, workflow_task_failures
from tests.scripts import answer, call, outputs, resp
from tests.support.crash_tools import HOLD_AFTER_WRITE_ENV
from tests.support.tools import tools as test_tools
from tests.test_agent_trees import bodies, run_tree
from tests.test_approvals import refused
from tests.test_crash import (
    TICKET,
    approve,
    cluster,
    pending_call,
    result_of,
    until,
    wait_recorded_waiting,
)
from tests.test_signed_approvals import signed

FILER = "filer"


def filer(tools: Any, queue: str = DEFAULT_TASK_QUEUE, **policy: Any) -> AgentTool:
    """A sub-agent that files one ticket (create_ticket: a side effect, terminal); on its
    parent's queue (run_tree moves both to its worker's)."""
    agent: Agent[Any] = Agent(tools, model="scripted-model", allowed=["create_ticket"],
                              task_queue=queue, instructions="You file support tickets.",
                              policy=Policy(**policy))
    return agent.as_tool(FILER, "Files a support ticket for the problem it is told")


def script(question: str = "3Fのプリンタが煙を出しています") -> list[dict[str, Any]]:
    """Parent step 1 calls the filer; the filer calls create_ticket, then answers (its
    forced last turn after a terminal tool); the parent answers: 4 requests in order."""
    return [
        resp(call(FILER, {"question": question}, "p1"), rid="parent_1"),
        resp(call("create_ticket", TICKET, "t1"), rid="child_1"),
        answer("チケットを作成しました。", rid="child_2"),
        answer("担当チームにチケットを作成しました。", rid="parent_2"),
    ]


async def only_child(client: Client, parent: WorkflowHandle[Any, Any]
                     ) -> WorkflowHandle[Any, RunResult]:
    """The parent's one child workflow, once the server lists it."""
    found: list[str] = []

    async def listed() -> bool:
        found[:] = [w.id async for w in client.list_workflows(
            f"ParentWorkflowId = '{parent.id}'")]
        return bool(found)
    await until(listed, "the child run to be listed")
    assert len(found) == 1, found
    return client.get_workflow_handle(found[0], result_type=RunResult)


async def start_filer_tree(client: Client, queue: str, prefix: str
                           ) -> tuple[WorkflowHandle[Any, RunResult],
                                      WorkflowHandle[Any, RunResult]]:
    """(The parent, its one child): a tree whose parent files a ticket through the filer
    (create_ticket, which the operator's policy asks approval for), started on `queue`."""
    parent_agent: Agent[Any] = Agent(["lookup_stock"], model="scripted-model",
                                     task_queue=queue,
                                     agents=[filer(["create_ticket"], queue)])
    parent = await client.start_workflow(
        WORKFLOW_NAME, parent_agent.run_input("プリンタの件、チケットにして"),
        id=f"{prefix}-{uuid.uuid4().hex[:10]}", task_queue=queue, result_type=RunResult)
    return parent, await only_child(client, parent)


async def history_count(handle: WorkflowHandle[Any, Any], kind: EventType.ValueType) -> int:
    return len([e async for e in handle.fetch_history_events() if e.event_type == kind])


# --- kill -9 while a child's tool runs ---------------------------------------------------


async def test_worker_killed_while_a_childs_tool_runs_repeats_no_side_effect(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The filer's create_ticket, approved, commits its row and is still running when its
    worker process is SIGKILLed; a new worker retries the call with the same key, which finds
    the row: one ticket, one child started, the tree completes, each model request sent
    once."""
    async with cluster(tmp_path) as c:
        assert c.client is not None
        for turn in script():
            c.model.append(turn)
        monkeypatch.setenv(HOLD_AFTER_WRITE_ENV, "1")
        doomed = c.start_worker()
        monkeypatch.delenv(HOLD_AFTER_WRITE_ENV)
        parent, child = await start_filer_tree(c.client, c.queue, "tree-crash")
        await approve(child, await pending_call(child))  # the operator's policy asks

        async def ticket_written() -> bool:
            return bool(list_tickets(c.data_dir))
        await until(ticket_written, "the child's create_ticket to commit its row")
        c.kill(doomed)  # the tool holds after its write: it is running now
        c.start_worker()
        result = await result_of(parent)
        child_result = await result_of(child)

        assert (result.reason, result.steps) == ("completed", 2)
        assert (child_result.reason, child_result.tool_executions) == ("completed", 1)
        # One ticket, under the child's call's idempotency key.
        [ticket] = list_tickets(c.data_dir)
        assert ticket["idempotency_key"].startswith(f"{child.id}/")
        # The retry on the new worker found the row the killed attempt committed.
        envelope = outputs(bodies(c.model)[2])["t1"]
        assert envelope["status"] == "success"
        assert envelope["data"]["already_existed"] is True
        assert envelope["data"]["ticket_id"] == ticket["id"]
        events = [e async for e in child.fetch_history_events()]
        tools = {e.event_id for e in events
                 if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                 and e.activity_task_scheduled_event_attributes.activity_type.name
                 == TOOL_ACTIVITY}
        ran = [e.activity_task_started_event_attributes for e in events
               if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
               and e.activity_task_started_event_attributes.scheduled_event_id in tools]
        # The attempt that completed the call ran on the new worker.
        assert ran and not ran[-1].identity.startswith(f"{doomed.pid}@"), ran
        # Started once: one child listed, one start command in the parent's history.
        assert [w.id async for w in c.client.list_workflows(
            f"ParentWorkflowId = '{parent.id}'")] == [child.id]
        assert await history_count(
            parent, EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED) == 1
        # The parent's model got the child's answer; no request was sent twice.
        sub = outputs(bodies(c.model)[3])["p1"]
        assert (sub["status"], sub["data"]["answer"]) == ("success", "チケットを作成しました。")
        assert len(c.model.requests) == 4
        assert c.model.violations == []
        assert await workflow_task_failures(parent) == 0
        assert await workflow_task_failures(child) == 0


async def test_worker_killed_while_a_child_waits_keeps_its_approval_for_the_workers_keys(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker processes holding alice's key (BOUNDLOOP_APPROVER_KEYS, no key in any
    policy): the filer waits for approval, its worker is SIGKILLed; on a new worker the
    child still waits, takes only a decision signed by alice, and files one ticket; the
    child was started once and the tree completes."""
    alice_key = new_key("alice", tmp_path)
    keys_file = tmp_path / "approvers.keys"
    keys_file.write_text(f"alice {Signer.from_file('alice', alice_key.private_path).public_key}\n",
                         encoding="utf-8")
    monkeypatch.setenv("BOUNDLOOP_APPROVER_KEYS", str(keys_file))
    alice = Signer.from_file("alice", alice_key.private_path)
    async with cluster(tmp_path) as c:
        assert c.client is not None
        for turn in script():
            c.model.append(turn)
        first = c.start_worker()
        parent, child = await start_filer_tree(c.client, c.queue, "tree-wait")
        call_id = await pending_call(child)
        c.kill(first)
        c.start_worker()
        run = await get_run(c.client, child.id)
        with pytest.raises(DecisionRefused) as unsigned:
            await run.approve(call_id, approver="alice")
        assert list_tickets(c.data_dir) == []
        await run.approve(call_id, signer=alice)
        result = await result_of(parent)

        assert "accepts only signed decisions" in str(unsigned.value)
        assert result.reason == "completed"
        [ticket] = list_tickets(c.data_dir)
        assert ticket["idempotency_key"].startswith(f"{child.id}/")
        assert [w.id async for w in c.client.list_workflows(
            f"ParentWorkflowId = '{parent.id}'")] == [child.id]
        assert await history_count(
            parent, EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED) == 1
        decided = [e.detail for e in (await result_of(child)).events
                   if e.event == "approval_approved"]
        assert decided == ["by alice"], decided
        assert len(c.model.requests) == 4
        assert c.model.violations == []
        assert await workflow_task_failures(parent) == 0
        assert await workflow_task_failures(child) == 0


# --- a child's approval --------------------------------------------------------------------


@pytest.fixture
def alice(tmp_path: Path) -> Signer:
    made = new_key("alice", tmp_path)
    return Signer.from_file("alice", made.private_path)


def approving(alice: Signer, child: AgentTool) -> Agent[Any]:
    """A parent whose policy lets only alice, signing, decide create_ticket: the
    child's policy is never looser, so the child's approval is hers too."""
    return Agent(test_tools, model="scripted-model", allowed=["lookup_stock"],
                 agents=[child], policy=Policy(
                     approvers={"create_ticket": ["alice"]},
                     approver_keys={"alice": alice.public_key}))


async def test_a_childs_approval_is_listed_decided_signed_and_refused_by_the_parent(
        temporal: Client, tmp_path: Path, alice: Signer) -> None:
    seen: dict[str, Any] = {}

    async def operator(parent: WorkflowHandle[Any, RunResult]) -> None:
        child = await only_child(temporal, parent)
        seen["child"] = child
        await wait_recorded_waiting(child)
        seen["listed"] = {wf: st for wf, st in await pending_runs(temporal)
                          if wf in (parent.id, child.id)}
        status = await query_status(child)
        # The parent's id does not take the child's call: not by the client, which
        # finds nothing to sign there, nor by the parent's own check of a decision
        # signed for the child.
        with pytest.raises(DecisionRefused) as caught:
            await (await get_run(temporal, parent.id)).approve("t1", signer=alice)
        seen["parent_client"] = str(caught.value)
        seen["parent_run"] = await refused(parent, signed(status, child.id, alice, "t1"))
        # Signed over the parent's id, it is not a decision of the child's run either;
        # nor is an unsigned one (the child has the parent's approver keys).
        seen["other_run"] = await refused(child, signed(status, child.id, alice, "t1",
                                                        sign_run=parent.id))
        with pytest.raises(DecisionRefused) as caught:
            await (await get_run(temporal, child.id)).approve("t1", approver="alice")
        seen["unsigned"] = str(caught.value)
        assert list_tickets(tmp_path / "data") == []
        assert [a.call_id for a in (await query_status(child)).pending] == ["t1"]
        await (await get_run(temporal, child.id)).approve("t1", signer=alice)

    result, server, parent = await run_tree(
        temporal, tmp_path, approving(alice, filer(test_tools)), script(), during=operator)
    child: WorkflowHandle[Any, RunResult] = seen["child"]
    # Listed under the child's id, with its place in the tree; the parent waits for no
    # decision of its own.
    assert list(seen["listed"]) == [child.id]
    listed = seen["listed"][child.id]
    assert [(a.call_id, a.tool) for a in listed.pending] == [("t1", "create_ticket")]
    assert listed.tree is not None
    assert listed.tree.line("create_ticket") == f"{parent.id} → {FILER} → create_ticket"
    assert "is not waiting for approval in run" in seen["parent_client"]
    assert "t1" in seen["parent_run"]
    assert "signature" in seen["other_run"]
    assert "accepts only signed decisions" in seen["unsigned"]
    # Approved once, with alice's signature, by the child; the ticket created once.
    assert (result.reason, result.steps) == ("completed", 2)
    [ticket] = list_tickets(tmp_path / "data")
    assert ticket["idempotency_key"].startswith(f"{child.id}/")
    child_result = await client_result_of(child)
    assert (child_result.reason, child_result.tool_executions) == ("completed", 1)
    decided = [e for e in child_result.events if e.event == "approval_approved"]
    assert len(decided) == 1 and "alice" in (decided[0].detail or ""), child_result.events
    assert outputs(bodies(server)[2])["t1"]["data"]["already_existed"] is False
    assert not [e for e in result.events if e.event.startswith("approval_")]
    assert await workflow_task_failures(child) == 0


async def test_a_parent_and_its_child_asking_under_one_call_id_each_get_their_own_decision(
        temporal: Client, tmp_path: Path) -> None:
    """The parent's create_ticket waits (calls needing no approval, the filer, run
    first) while its child's create_ticket waits too, both as call `t1`: each decision
    reaches the run it was sent to and decides that run's call only; one bound to the
    child's call is refused by the parent (its `t1` has other arguments)."""
    mine = {**TICKET, "title": "Order toner", "priority": "low"}
    seen: dict[str, Any] = {}

    async def operator(parent: WorkflowHandle[Any, RunResult]) -> None:
        child = await only_child(temporal, parent)
        seen["child"] = child
        await wait_recorded_waiting(child)
        [childs] = (await query_status(child)).pending
        [parents] = (await query_status(parent)).pending
        seen["asked"] = [(a.call_id, a.arguments) for a in (childs, parents)]
        with pytest.raises(DecisionRefused) as caught:
            await (await get_run(temporal, parent.id)).approve(
                "t1", approver="alice", fingerprint=childs.fingerprint)
        seen["crossed"] = str(caught.value)
        await (await get_run(temporal, child.id)).approve("t1", approver="alice")
        seen["child_result"] = await asyncio.wait_for(client_result_of(child), RUN_TIMEOUT)
        # The child's decision and end left the parent's own call waiting.
        seen["still"] = [(a.call_id, a.arguments, a.status)
                         for a in (await query_status(parent)).pending]
        await (await get_run(temporal, parent.id)).approve("t1", approver="bob")

    parent_agent: Agent[Any] = Agent(test_tools, model="scripted-model",
                                     allowed=["create_ticket"], agents=[filer(test_tools)])
    result, _, parent = await run_tree(temporal, tmp_path, parent_agent, [
        resp(call("create_ticket", mine, "t1"),
             call(FILER, {"question": "3Fのプリンタが煙を出しています"}, "p1"), rid="parent_1"),
        resp(call("create_ticket", TICKET, "t1"), rid="child_1"),
        answer("チケットを作成しました。", rid="child_2"),
        answer("トナーの注文と、プリンタのチケットを作成しました。", rid="parent_2"),
    ], during=operator)
    child: WorkflowHandle[Any, RunResult] = seen["child"]
    assert seen["asked"] == [("t1", TICKET), ("t1", mine)]
    assert "changed since" in seen["crossed"], seen["crossed"]
    assert seen["still"] == [("t1", mine, "pending")]
    assert (result.reason, seen["child_result"].reason) == ("completed", "completed")
    tickets = list_tickets(tmp_path / "data")
    assert len(tickets) == 2
    [of_child] = [t for t in tickets if t["idempotency_key"].startswith(f"{child.id}/")]
    [of_parent] = [t for t in tickets if not t["idempotency_key"].startswith(f"{child.id}/")]
    assert (of_child["title"], of_parent["title"]) == (TICKET["title"], mine["title"])
    assert of_parent["idempotency_key"].startswith(f"{parent.id}/")
    deciders = {h.id: [e.detail for e in r.events if e.event == "approval_approved"]
                for h, r in ((child, seen["child_result"]), (parent, result))}
    assert deciders == {child.id: ["by alice"], parent.id: ["by bob"]}
    assert await workflow_task_failures(child) == 0


async def test_a_reset_parent_takes_its_earlier_childs_outcome_and_runs_it_not_again(
        temporal: Client, tmp_path: Path) -> None:
    """The tree completed; the parent is reset (`temporal workflow reset`) to the
    workflow task that started its child. The new run's start finds the child's id
    taken by that child: it is not started again (nor its ticket filed again), and the
    parent's model gets the child's answer, as a reset tool call gets its first result
    (before: SUBAGENT_FAILED, "failed before it could answer", with the ticket filed)."""
    seen: dict[str, Any] = {}

    async def operator(parent: WorkflowHandle[Any, RunResult]) -> None:
        child = await only_child(temporal, parent)
        seen["child"] = child
        await approve(child, await pending_call(child))

    async def reset(parent: WorkflowHandle[Any, RunResult]) -> None:
        events = [e async for e in parent.fetch_history_events()]
        [started] = [e.start_child_workflow_execution_initiated_event_attributes
                     for e in events if e.event_type
                     == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED]
        new_run = await temporal.workflow_service.reset_workflow_execution(
            ResetWorkflowExecutionRequest(
                namespace=temporal.namespace, reason="test: run it again",
                workflow_execution=WorkflowExecution(workflow_id=parent.id),
                workflow_task_finish_event_id=started.workflow_task_completed_event_id,
                request_id=uuid.uuid4().hex))
        again = temporal.get_workflow_handle(parent.id, run_id=new_run.run_id,
                                             result_type=RunResult)
        seen["again"] = await asyncio.wait_for(client_result_of(again), RUN_TIMEOUT)
        seen["again_handle"] = again

    parent_agent: Agent[Any] = Agent(test_tools, model="scripted-model",
                                     allowed=["lookup_stock"], agents=[filer(test_tools)])
    server = ScriptedModelServer([*script(), answer("作成済みです。", rid="parent_2_again")])
    first, _, parent = await run_tree(temporal, tmp_path, parent_agent, server,
                                      during=operator, after=reset)
    child: WorkflowHandle[Any, RunResult] = seen["child"]
    again: RunResult = seen["again"]
    assert (first.reason, again.reason) == ("completed", "completed")
    assert len(list_tickets(tmp_path / "data")) == 1
    assert [w.id async for w in temporal.list_workflows(
        f"ParentWorkflowId = '{parent.id}'")] == [child.id]
    # The reset run's model read the child's answer, as the first run's did.
    assert len(server.requests) == 5
    told = [outputs(bodies(server)[i])["p1"] for i in (3, 4)]
    assert told[1] == told[0], told
    assert told[1]["data"]["answer"] == "チケットを作成しました。"
    ended = [e.detail for e in again.events if e.event == "subagent_ended"]
    assert len(ended) == 1 and (ended[0] or "").startswith("completed: 240 tokens"), ended
    # What the child used is the reset run's too.
    assert again.total_tokens == first.total_tokens
    # The one failed workflow task is the reset's own mark.
    causes = [e.workflow_task_failed_event_attributes.cause
              async for e in seen["again_handle"].fetch_history_events()
              if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED]
    assert causes == [WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_WORKFLOW]


# --- a cancel of the parent while its child waits ----------------------------------------


async def test_a_cancel_of_the_parent_during_a_childs_approval_wait_ends_both_cancelled(
        temporal: Client, tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    async def cancel_parent(parent: WorkflowHandle[Any, RunResult]) -> None:
        child = await only_child(temporal, parent)
        seen["child"] = child
        await wait_recorded_waiting(child)
        await (await get_run(temporal, parent.id)).cancel("wrong printer")

    async def after(parent: WorkflowHandle[Any, RunResult]) -> None:
        child: WorkflowHandle[Any, RunResult] = seen["child"]
        seen["result"] = await asyncio.wait_for(client_result_of(child), RUN_TIMEOUT)
        seen["status"] = await query_status(child)  # a worker answers it
        seen["children"] = (await query_status(parent)).children

    parent_agent: Agent[Any] = Agent(test_tools, model="scripted-model",
                                     allowed=["lookup_stock"], agents=[filer(test_tools)])
    result, _, _ = await run_tree(temporal, tmp_path, parent_agent, script()[:2],
                                  during=cancel_parent, after=after)
    child = seen["child"]
    assert (result.reason, result.steps, result.cancel_reason) == (
        "cancelled", 1, "wrong printer")
    child_result: RunResult = seen["result"]
    assert (child_result.reason, child_result.steps, child_result.tool_executions) == (
        "cancelled", 1, 0)
    assert [e.event for e in child_result.events][-2:] == ["cancel_requested",
                                                            "stopped:cancelled"]
    # The cancel reached the child (its own cancel request), and its approval is gone.
    assert await history_count(
        child, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED) == 1
    assert seen["status"].pending == []
    # The parent's `status` says its sub-agent ended so, not `running` for good.
    assert [(c.workflow_id, c.state) for c in seen["children"]] == [(child.id, "cancelled")]
    desc = await child.describe()
    assert desc.typed_search_attributes.get(sa.PENDING_APPROVALS) == 0
    assert list_tickets(tmp_path / "data") == []
    assert await workflow_task_failures(child) == 0


async def test_a_cancel_of_the_root_reaches_every_level(temporal: Client,
                                                        tmp_path: Path) -> None:
    """root → desk → filer, the filer waiting for approval: a cancel of the root ends all
    three `cancelled`, each having received its own cancel request; no ticket."""
    seen: dict[str, Any] = {}

    async def cancel_root(root: WorkflowHandle[Any, RunResult]) -> None:
        desk = await only_child(temporal, root)
        leaf = await only_child(temporal, desk)
        seen["tree"] = [root, desk, leaf]
        await wait_recorded_waiting(leaf)
        await root.cancel()

    async def after(root: WorkflowHandle[Any, RunResult]) -> None:
        seen["results"] = [await asyncio.wait_for(client_result_of(h), RUN_TIMEOUT)
                           for h in seen["tree"]]
        seen["pending"] = (await query_status(seen["tree"][2])).pending

    desk: Agent[Any] = Agent(test_tools, model="scripted-model", allowed=["lookup_stock"],
                             agents=[filer(test_tools)])
    # (With the default limits a grandchild's allowance is too small for one request
    # whose output may reach 4096 tokens.)
    root_agent: Agent[Any] = Agent(test_tools, model="scripted-model",
                                   allowed=["lookup_stock"],
                                   limits=Limits(token_threshold=40_000, max_output_tokens=1000),
                                   agents=[desk.as_tool("desk", "Handles support requests")])
    await run_tree(temporal, tmp_path, root_agent, [
        resp(call("desk", {"question": "3Fのプリンタ"}, "p1"), rid="root_1"),
        resp(call(FILER, {"question": "3Fのプリンタが煙を出しています"}, "d1"), rid="desk_1"),
        resp(call("create_ticket", TICKET, "t1"), rid="filer_1"),
    ], during=cancel_root, after=after)
    results: list[RunResult] = seen["results"]
    assert [(r.reason, r.steps, r.tool_executions) for r in results] == [
        ("cancelled", 1, 0)] * 3
    for handle in seen["tree"]:
        assert await history_count(
            handle, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED) == 1, handle.id
        assert await workflow_task_failures(handle) == 0
    assert seen["pending"] == []
    assert list_tickets(tmp_path / "data") == []


async def test_a_terminated_parent_cancels_its_waiting_child(temporal: Client,
                                                             tmp_path: Path) -> None:
    """A parent that ends otherwise than by its own cancel (terminated: no code of it
    runs) still takes its child with it: the child ends `cancelled`, its approval
    withdrawn, no ticket."""
    seen: dict[str, Any] = {}

    async def terminate_parent(parent: WorkflowHandle[Any, RunResult]) -> None:
        child = await only_child(temporal, parent)
        seen["child"] = child
        await wait_recorded_waiting(child)
        await parent.terminate("operator: stuck tree")
        seen["result"] = await asyncio.wait_for(client_result_of(child), RUN_TIMEOUT)
        seen["status"] = await query_status(child)

    parent_agent: Agent[Any] = Agent(test_tools, model="scripted-model",
                                     allowed=["lookup_stock"], agents=[filer(test_tools)])
    with pytest.raises(WorkflowFailureError) as ended:
        await run_tree(temporal, tmp_path, parent_agent, script()[:2],
                       during=terminate_parent)
    assert isinstance(ended.value.cause, TerminatedError)
    child_result: RunResult = seen["result"]
    assert (child_result.reason, child_result.tool_executions) == ("cancelled", 0)
    assert seen["status"].pending == []
    assert list_tickets(tmp_path / "data") == []
    assert await workflow_task_failures(seen["child"]) == 0


async def test_a_cancel_of_the_child_alone_reaches_the_parents_model_as_a_stop(
        temporal: Client, tmp_path: Path) -> None:
    """An operator cancels the waiting child, not its parent: the child ends `cancelled`
    (its approval withdrawn, no ticket); the parent goes on, and its model reads the
    child's stop as such (SUBAGENT_STOPPED, stop_reason cancelled), never as an answer."""
    seen: dict[str, Any] = {}

    async def cancel_child(parent: WorkflowHandle[Any, RunResult]) -> None:
        child = await only_child(temporal, parent)
        seen["child"] = child
        await wait_recorded_waiting(child)
        await (await get_run(temporal, child.id)).cancel("not this printer")

    parent_agent: Agent[Any] = Agent(test_tools, model="scripted-model",
                                     allowed=["lookup_stock"], agents=[filer(test_tools)])
    result, server, _ = await run_tree(temporal, tmp_path, parent_agent, [
        *script()[:2], answer("チケットは作成されませんでした。", rid="parent_2")],
        during=cancel_child)
    child_result = await client_result_of(seen["child"])
    assert (child_result.reason, child_result.cancel_reason) == ("cancelled",
                                                                 "not this printer")
    assert result.reason == "completed"
    sub = outputs(bodies(server)[2])["p1"]
    assert (sub["status"], sub["error_code"]) == ("permanent_error", "SUBAGENT_STOPPED")
    assert (sub["data"]["stop_reason"], sub["data"]["completed"]) == ("cancelled", False)
    assert list_tickets(tmp_path / "data") == []
    assert await workflow_task_failures(seen["child"]) == 0
