"""Agent trees attacked by the least trusted party at each door, on a real dev server
with a real worker: a model whose calls spend what a sibling was promised, a starter
with namespace access who terminates a sub-agent or adds an approver key of its own.
Each test is a bound of docs/agent-trees.md that such a party tried to pass."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
import pytest_asyncio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from temporalio.client import Client, WorkflowHandle

from boundloop import Agent, OperatorPolicy, Worker, errors
from boundloop.budgets import set_budget
from boundloop.client import Run, query_status, result_of
from boundloop.contracts import WORKFLOW_NAME, RunResult, RunStatus
from boundloop.core import tree
from boundloop.core.budget import BudgetLimits
from boundloop.core.limits import Limits, Policy
from boundloop.core.rules import ArgumentRule
from boundloop.scripted.server import ScriptedModelServer
from boundloop.signing import Signer
from boundloop.tools.demo import DemoDeps, list_tickets
from tests import conftest
from tests.conftest import RUN_TIMEOUT
from tests.scripts import answer, call, outputs, resp
from tests.support.tools import marks
from tests.support.tools import tools as test_tools
from tests.test_agent_trees import bodies, researcher, run_tree, writer
from tests.test_approvals import pending, status_when


async def child_of(temporal: Client, parent: WorkflowHandle[Any, RunResult]
                   ) -> WorkflowHandle[Any, RunResult]:
    """The parent's one sub-agent run, once it started."""
    for _ in range(400):
        found = [w async for w in temporal.list_workflows(f"ParentWorkflowId = '{parent.id}'")]
        if found:
            return temporal.get_workflow_handle(found[0].id, result_type=RunResult)
        await asyncio.sleep(0.05)
    raise AssertionError(f"{parent.id} started no sub-agent")


async def test_a_sub_agent_never_spends_the_cost_units_of_its_callers_later_calls(
        temporal: Client, tmp_path: Path) -> None:
    """The model calls a sub-agent and, in the same response, a tool with a cost: the
    response is within the run's tool_cost_budget when it is planned, so the tool runs
    after the sub-agent whatever the sub-agent spent. Its allowance keeps that tool's
    cost units back, so the tree never passes the root's budget."""
    spender: Agent[Any] = Agent(test_tools, model="scripted-model", allowed=["echo"])
    parent = writer(spender.as_tool("spend", "Echoes things"), allowed=("echo",),
                    tool_cost_budget=4)
    result, server, _ = await run_tree(temporal, tmp_path, parent, [
        resp(call("spend", {"question": "echo twice"}, "p1"),
             call("echo", {"x": "mine"}, "p2")),  # parent: 2 units of 4 planned
        resp(call("echo", {"x": "a"}, "c1"), call("echo", {"x": "b"}, "c2")),  # child
        answer("done"),  # the parent
    ])
    # echo costs 2 units: the parent's own call and at most one of the child's.
    assert result.cost_units <= 4
    child = outputs(bodies(server)[2])["p1"]
    assert (child["error_code"], child["data"]["stop_reason"]) == ("SUBAGENT_STOPPED",
                                                                   "budget_limit")
    assert outputs(bodies(server)[-1])["p2"]["status"] == "success"


async def test_a_terminated_sub_agent_is_charged_its_whole_allowance(
        temporal: Client, tmp_path: Path) -> None:
    """Someone with namespace access terminates a sub-agent that had spent most of its
    allowance: it leaves no RunResult saying what it used. The caller is charged all of
    its allowance (what it may have used), not nothing, so the next sub-agent's
    allowance is not cut from tokens the first one spent already."""
    threshold = 20_000
    spent: list[int] = []
    big = {"input_tokens": 5_000, "output_tokens": 100, "total_tokens": 5_100}
    greedy: Agent[Any] = Agent(test_tools, model="scripted-model", allowed=["create_ticket"])
    parent = writer(greedy.as_tool("ticketer", "Files tickets",
                                   limits=Limits(token_threshold=15_000)),
                    token_threshold=threshold,
                    max_output_tokens=200, max_tool_executions=20)

    async def terminate(handle: WorkflowHandle[Any, RunResult]) -> None:
        child = await child_of(temporal, handle)
        status = await pending(child)  # it spent 5,100 tokens and waits for approval
        spent.append(status.total_tokens)
        await child.terminate(reason="an operator's terminate")

    result, server, _ = await run_tree(temporal, tmp_path, parent, [
        # A long question: the child's request may hold 5,000 input tokens.
        resp(call("ticketer", {"question": "x" * 6_000}, "p1")),
        resp(call("create_ticket", {"title": "t", "description": "d", "priority": "low"},
                  "c1"), usage=big),  # the child, then it is terminated
        answer("the ticketer failed"),  # the parent
    ], during=terminate)
    assert spent == [5_100]
    assert outputs(bodies(server)[2])["p1"]["error_code"] == "SUBAGENT_FAILED"
    own = 2 * 120  # the parent's two responses
    assert result.total_tokens >= own + spent[0]
    assert result.usage_estimated
    assert list_tickets(tmp_path / "data") == []


@pytest.fixture
def keys() -> dict[str, Signer]:
    return {name: Signer(name, Ed25519PrivateKey.generate()) for name in ("alice", "mallory")}


async def test_a_sub_agent_takes_no_approver_key_its_caller_does_not(
        temporal: Client, tmp_path: Path, keys: dict[str, Signer]) -> None:
    """The root accepts decisions signed by alice only; its sub-agent's own policy (in
    the root's input, a starter's) names mallory's key too. A decision mallory signs for
    the sub-agent's side effect is refused: alice decides it."""
    alice, mallory = keys["alice"], keys["mallory"]
    ticketer: Agent[Any] = Agent(test_tools, model="scripted-model", allowed=["create_ticket"],
                                 policy=Policy(approver_keys={"mallory": mallory.public_key}))
    parent = writer(ticketer.as_tool("ticketer", "Files tickets")).replace(
        policy=Policy(approver_keys={"alice": alice.public_key}))
    refusals: list[str] = []

    async def decide(handle: WorkflowHandle[Any, RunResult]) -> None:
        child = await child_of(temporal, handle)
        await pending(child)
        try:
            await Run(child).approve("c1", signer=mallory)
        except errors.DecisionRefused as refused:
            refusals.append(str(refused))
        status: RunStatus = await query_status(child)
        if status.pending:
            await Run(child).approve("c1", signer=alice)
        await status_when(child, lambda s: not s.pending, "the decision")

    result, _, _ = await run_tree(temporal, tmp_path, parent, [
        resp(call("ticketer", {"question": "file one"}, "p1")),
        resp(call("create_ticket", {"title": "t", "description": "d", "priority": "low"},
                  "c1")),
        answer("filed"),  # the child, after its terminal tool
        answer("the ticket is filed"),
    ], during=decide)
    assert len(refusals) == 1 and "mallory" in refusals[0]
    [ticket] = list_tickets(tmp_path / "data")
    assert result.reason == "completed"
    assert ticket["title"] == "t"


async def test_the_shared_budgets_refusal_is_not_the_calling_models_answer(
        temporal: Client, tmp_path: Path) -> None:
    """A sub-agent whose request the shared budget refuses stops `budget_limit`; the
    ledger's reason (the key, what it spent, what other runs hold) is the operator's,
    in the sub-agent's events, never the answer the calling model reads."""
    key = f"tenant-{uuid.uuid4().hex[:8]}"

    async def budget(queue: str) -> None:
        await set_budget(temporal, key, BudgetLimits(tokens=2_800), task_queue=queue)

    # Its worst case (2,700 output tokens and its question) passes what the key has left.
    wordy = researcher().model_copy(update={"settings": researcher().settings.model_copy(
        update={"limits": Limits(max_output_tokens=2_700)})})
    parent = writer(wordy).replace(budget=key, limits=Limits(max_output_tokens=200))
    result, server, _ = await run_tree(temporal, tmp_path, parent, [
        resp(call("research", {"question": "A-001?"}, "p1")),
        answer("the research was refused"),
    ], before=budget)
    sent = outputs(bodies(server)[1])["p1"]
    assert (sent["error_code"], sent["data"]["stop_reason"]) == ("SUBAGENT_STOPPED",
                                                                 "budget_limit")
    assert key not in json.dumps(sent)
    assert result.reason == "completed"


@pytest_asyncio.fixture(scope="module")
async def low_threshold(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Client]:
    async with conftest.continue_as_new_server(
            tmp_path_factory.mktemp("tree-can") / "temporal.db", 12) as client:
        yield client


async def test_a_sub_agent_that_continues_as_new_is_charged_for_every_run(
        low_threshold: Client, tmp_path: Path) -> None:
    """A sub-agent long enough to continue as new keeps its place and allowance (its
    next Temporal runs are not refused as forged: they are still its parent's child),
    and what all its runs used is charged to its caller."""
    steps = 5
    child: Agent[Any] = Agent(test_tools, model="scripted-model", allowed=["lookup_stock"],
                              limits=Limits(max_steps=steps + 2, max_tool_executions=steps))
    parent = writer(child.as_tool("research", "Looks up stock"), max_tool_executions=20)
    result, _, handle = await run_tree(low_threshold, tmp_path, parent, [
        resp(call("research", {"question": "all of them"}, "p1")),
        *(resp(call("lookup_stock", {"sku": f"A-{i:03d}"}, f"k{i}")) for i in range(steps)),
        answer("five looked up"),  # the child
        answer("done"),  # the parent
    ])
    [child_id] = {w.id async for w in low_threshold.list_workflows(
        f"ParentWorkflowId = '{handle.id}'")}
    runs = [w async for w in low_threshold.list_workflows(f"WorkflowId = '{child_id}'")]
    assert len(runs) > 1, "the sub-agent continued as new"
    assert result.reason == "completed"
    assert result.total_tokens == (2 + steps + 1) * 120
    assert result.tool_executions == 1 + steps


async def test_a_sub_agent_named_like_one_of_the_runs_tools_is_refused(
        temporal: Client, tmp_path: Path) -> None:
    """A starter's raw input (no `Agent` to check it) names a sub-agent like a tool the
    run calls: the call would start the sub-agent instead of the tool, out of its rules
    and approval. The run is refused before its first request."""
    shadow = researcher().model_copy(update={"name": "create_ticket"})
    inp = writer(researcher()).run_input("q").model_copy(update={"agents": [shadow]})
    with pytest.raises(Exception) as caught:
        await run_tree(temporal, tmp_path, writer(researcher()), [answer("x")], inp=inp)
    assert "sub-agent 'create_ticket' has the name" in str(caught.value.__cause__
                                                          or caught.value)


async def test_a_sub_agent_is_admitted_under_an_operator_with_many_argument_rules(
        temporal: Client, tmp_path: Path) -> None:
    """The operator's argument rules come first in every run's admitted policy, and a
    sub-agent's policy holds its caller's: admitted, the operator's rules came twice, so
    with more than 50 of them every sub-agent was refused (at most 100 rules). Each rule
    is kept once; the sub-agent runs under all of them."""
    never = [ArgumentRule.model_validate({"tool": "lookup_stock", "action": "ask",
                                          "when": f"sku == 'Z-{i:03d}'"}) for i in range(60)]
    queue = f"q-{uuid.uuid4().hex[:8]}"
    server = ScriptedModelServer([
        resp(call("research", {"question": "A-001?"}, "p1")),
        resp(call("lookup_stock", {"sku": "A-001"}, "k1")),
        answer("12"),
        answer("A-001: 12"),
    ])
    worker = Worker(temporal, test_tools, deps=DemoDeps(data_dir=tmp_path / "data"),
                    model=openai.AsyncOpenAI(base_url=server.start(),
                                             api_key="sk-test-not-real"),
                    task_queue=queue, policy=OperatorPolicy(rules=never))
    try:
        async with worker:
            handle = await temporal.start_workflow(
                WORKFLOW_NAME, writer(researcher()).on_queue(queue).run_input("q"),
                id=f"tree-{uuid.uuid4().hex[:10]}", task_queue=queue, result_type=RunResult)
            result = await asyncio.wait_for(result_of(handle), timeout=RUN_TIMEOUT)
            [child] = [w async for w in temporal.list_workflows(
                f"ParentWorkflowId = '{handle.id}'")]
            status = await query_status(temporal.get_workflow_handle(child.id))
    finally:
        server.stop()
    ended = next(e for e in result.events if e.event == "subagent_ended")
    assert ended.detail is not None and ended.detail.startswith("completed"), ended.detail
    assert status.reason == "completed"
    assert outputs(bodies(server)[3])["p1"]["status"] == "success"
    assert result.reason == "completed"


def test_a_sub_agents_own_approvers_hold_where_its_caller_lets_anyone_decide() -> None:
    """The caller lets anyone decide create_ticket (an empty list); the sub-agent lets
    only bob: only bob decides the sub-agent's calls (before, anyone did)."""
    got = tree.stricter_policy(Policy(approvers={"create_ticket": []}),
                               Policy(approvers={"create_ticket": ["bob"]}))
    assert got.approvers == {"create_ticket": ["bob"]}
    either = tree.stricter_policy(Policy(approvers={"create_ticket": ["alice"]}),
                                  Policy(approvers={"create_ticket": []}))
    assert either.approvers == {"create_ticket": ["alice"]}


async def test_a_sub_agents_own_rules_are_never_dropped_to_fit_its_callers(
        temporal: Client, tmp_path: Path) -> None:
    """The caller holds 100 argument rules, the most a policy holds; the sub-agent's own
    policy denies delete_record. Cut to 100, the sub-agent's deny was dropped and its
    delete ran. A sub-agent whose rules do not fit beside its caller's is not started."""
    many = [ArgumentRule.model_validate({"tool": "lookup_stock", "action": "ask",
                                         "when": f"sku == 'Z-{i:03d}'"}) for i in range(100)]
    deny = ArgumentRule.model_validate({"tool": "delete_record", "action": "deny"})
    cleaner: Agent[Any] = Agent(test_tools, model="scripted-model", allowed=["delete_record"],
                                policy=Policy(rules=[deny]))
    parent = writer(cleaner.as_tool("cleaner", "Deletes records"),
                    allowed=("lookup_stock",)).replace(
        policy=Policy(rules=many, unknown_tool="report"))
    result, server, _ = await run_tree(temporal, tmp_path, parent, [
        resp(call("cleaner", {"question": "delete r1"}, "p1")),
        # The child's, had it started; the parent's model is told the tool is unknown.
        resp(call("delete_record", {"record": "r1"}, "d1")),
        answer("the cleaner did not start"),
    ])
    assert marks(tmp_path / "data") == []
    sent = outputs(bodies(server)[1])["p1"]
    assert sent["error_code"] == "SUBAGENT_NOT_STARTED"
    assert result.reason == "completed"


async def test_sub_agents_whose_usage_is_unknown_are_charged_their_allowance(
        temporal: Client, tmp_path: Path) -> None:
    """The provider answers each sub-agent without usage: each stops `usage_unknown`
    with that response uncounted, so its caller was charged nothing for it and gave the
    next sibling the same tokens again (three allowances of 5,000 from 6,000). A
    sub-agent whose usage is unknown is charged its whole allowance (the most that
    response could have used), so the siblings' allowances stay within the root's."""
    threshold = 6_000
    parent = writer(researcher(), token_threshold=threshold, max_output_tokens=200,
                    max_tool_executions=20)
    statuses: list[RunStatus] = []

    async def parent_status(handle: WorkflowHandle[Any, RunResult]) -> None:
        statuses.append(await query_status(handle))

    result, _, _ = await run_tree(temporal, tmp_path, parent, [
        resp(*(call("research", {"question": f"調べて {i}"}, f"p{i}") for i in range(3))),
        # Each child that starts, then the parent: none with usage.
        *(answer(f"答え {i}", usage=None) for i in range(4)),
    ], after=parent_status)
    started = statuses[0].children
    assert started and all(c.state == "usage_unknown" for c in started)
    # What the children could have used, with the parent's one counted response.
    allowed = 120 + sum(c.token_allowance for c in started)
    assert allowed <= threshold
    assert result.total_tokens >= allowed
