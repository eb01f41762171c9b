"""Agent trees through the real workflow on a real dev server: a run's model calls
another agent as a tool, which runs as a child run bounded by what its caller has left
(boundloop.core.tree). Parent and child share one scripted model server: the tree runs
one request at a time, so the script is in the order the requests come."""

from __future__ import annotations

import asyncio
import threading
import uuid
from pathlib import Path
from typing import Any

import openai
import pytest
from temporalio.client import Client, WorkflowHandle

import boundloop
from boundloop import Agent, AgentTool, OperatorPolicy, Worker
from boundloop.budgets import set_budget, show_budget
from boundloop.client import Run, result_of
from boundloop.contracts import WORKFLOW_NAME, RunInput, RunResult, RunStatus, StreamEvent
from boundloop.core.budget import BudgetLimits
from boundloop.core.limits import Limits
from boundloop.core.place import TreePlace
from boundloop.scripted.server import ScriptedModelServer
from boundloop.tools.demo import DemoDeps, list_tickets
from tests import conftest
from tests.conftest import RUN_TIMEOUT, workflow_task_failures
from tests.scripts import answer, call, outputs, resp
from tests.support.tools import tools as test_tools


def bodies(server: ScriptedModelServer) -> list[dict[str, Any]]:
    return [r.body for r in server.requests]


def researcher(**limits: Any) -> AgentTool:
    agent: Agent[Any] = Agent(test_tools, model="scripted-model", allowed=["lookup_stock"],
                              instructions="You look things up.",
                              limits=Limits(**limits) if limits else Limits())
    return agent.as_tool("research", "Looks up stock levels and reports them")


def writer(*agents: AgentTool, allowed: tuple[str, ...] = ("create_ticket",),
           **limits: Any) -> Agent[Any]:
    return Agent(test_tools, model="scripted-model", allowed=list(allowed),
                 agents=list(agents), limits=Limits(**limits) if limits else Limits())


async def run_tree(temporal: Client, tmp_path: Path, agent: Agent[Any],
                   turns: list[dict[str, Any]] | ScriptedModelServer, *,
                   question: str = "在庫を調べて報告して",
                   inp: RunInput | None = None,
                   before: Any = None, during: Any = None, after: Any = None
                   ) -> tuple[RunResult, ScriptedModelServer, WorkflowHandle[Any, RunResult]]:
    server = turns if isinstance(turns, ScriptedModelServer) else ScriptedModelServer(turns)
    base_url = server.start()
    queue = f"q-{uuid.uuid4().hex[:8]}"
    # Sub-agents on the parent's queue move with it; those on a queue of their own (a
    # worker the test started) stay there.
    agent = agent.on_queue(queue)
    try:
        async with conftest.test_worker(temporal, queue, base_url, tmp_path / "data"):
            if before is not None:
                await before(queue)
            handle = await temporal.start_workflow(
                WORKFLOW_NAME, inp or agent.run_input(question),
                id=f"tree-{uuid.uuid4().hex[:10]}", task_queue=queue, result_type=RunResult)
            if during is not None:
                await during(handle)
            result = await asyncio.wait_for(result_of(handle), timeout=RUN_TIMEOUT)
            if after is not None:  # with the worker up (a query needs one)
                await after(handle)
    finally:
        server.stop()
    assert await workflow_task_failures(handle, temporal) == 0
    return result, server, handle


async def test_a_sub_agent_answers_and_its_use_is_the_callers(temporal: Client,
                                                              tmp_path: Path) -> None:
    statuses: list[RunStatus] = []

    async def child_status(handle: WorkflowHandle[Any, RunResult]) -> None:
        [child] = [w async for w in temporal.list_workflows(f"ParentWorkflowId = '{handle.id}'")]
        statuses.append(await temporal.get_workflow_handle(child.id).query(
            "status", result_type=RunStatus))
        statuses.append(await handle.query("status", result_type=RunStatus))

    result, server, handle = await run_tree(temporal, tmp_path, writer(researcher()), [
        resp(call("research", {"question": "A-001の在庫は?"}, "p1")),  # parent, step 1
        resp(call("lookup_stock", {"sku": "A-001"}, "k1")),  # child, step 1
        answer("A-001は12個です。"),  # child, step 2
        answer("調査結果: A-001は12個。"),  # parent, step 2
    ], after=child_status)
    assert (result.reason, result.steps) == ("completed", 2)
    # The parent's own two responses, and the child's two: 4 x 120 tokens.
    assert result.total_tokens == 4 * 120
    # The research call itself, and the child's lookup_stock.
    assert result.tool_executions == 2
    sub = outputs(bodies(server)[3])["p1"]
    assert sub["status"] == "success"
    assert sub["data"]["answer"] == "A-001は12個です。"
    assert sub["data"]["stop_reason"] == "completed" and sub["data"]["completed"] is True
    assert (sub["data"]["steps"], sub["data"]["tool_executions"]) == (2, 1)
    # The child's first request is its own question, with its own tools only.
    child_body = bodies(server)[1]
    assert [t["name"] for t in child_body["tools"]] == ["lookup_stock"]
    assert child_body["input"][0]["content"] == "A-001の在庫は?"
    events = [e.event for e in result.events]
    assert "subagent_started" in events and "subagent_ended" in events
    started = next(e for e in result.events if e.event == "subagent_started")
    assert started.detail is not None and started.detail.startswith("allowance:")
    # The child is a Temporal child workflow whose id the call's key makes.
    child_id = next(e for e in result.events if e.event == "subagent_ended")
    assert child_id.detail is not None and child_id.detail.startswith("completed")
    children = [w async for w in temporal.list_workflows(
        f"ParentWorkflowId = '{handle.id}'")]
    assert len(children) == 1 and children[0].id.endswith("/research")
    assert children[0].id.startswith(f"{handle.id}/")
    child = temporal.get_workflow_handle(children[0].id, result_type=RunResult)
    child_result = await child.result()
    assert child_result.text == "A-001は12個です。"
    assert statuses[0].tree == TreePlace(root=handle.id, parent=handle.id, path=["research"])
    [seen] = statuses[1].children
    assert (seen.workflow_id, seen.tool, seen.call_id) == (children[0].id, "research", "p1")
    assert (seen.state, seen.total_tokens) == ("completed", 240)
    assert seen.token_allowance < 8000


async def test_a_child_cut_short_is_reported_as_such(temporal: Client,
                                                     tmp_path: Path) -> None:
    result, server, _ = await run_tree(temporal, tmp_path, writer(researcher(max_steps=2)), [
        resp(call("research", {"question": "全部調べて"}, "p1")),
        resp(call("lookup_stock", {"sku": "A-001"}, "k1")),
        answer("A-001は12個…(途中)"),  # the child's forced last step
        answer("途中までの結果です。"),
    ])
    sub = outputs(bodies(server)[3])["p1"]
    assert sub["status"] == "permanent_error"
    assert sub["error_code"] == "SUBAGENT_STOPPED"
    assert sub["data"]["stop_reason"] == "max_steps" and sub["data"]["completed"] is False
    assert result.reason == "completed"


async def test_a_place_in_a_tree_from_a_starter_is_refused(temporal: Client,
                                                           tmp_path: Path) -> None:
    agent = writer(researcher())
    forged = agent.run_input("q").model_copy(update={"tree": TreePlace(
        root="someone-else", parent="someone-else", path=["research"])})
    with pytest.raises(Exception) as caught:
        await run_tree(temporal, tmp_path, agent, [answer("x")], inp=forged)
    assert "tree" in str(caught.value.__cause__ or caught.value)
    assert list_tickets(tmp_path / "data") == []


async def test_a_tree_never_spends_more_than_its_root_allows(temporal: Client,
                                                             tmp_path: Path) -> None:
    """Three sub-agents that each try to spend far more than the parent has left: each
    is cut short (or never started) and says so, and the whole tree stays within the
    parent's token threshold."""
    threshold = 6000
    child_server = ScriptedModelServer([
        resp(call("lookup_stock", {"sku": f"A-{i:03d}"}, f"k{i}"),
             usage={"input_tokens": 300, "output_tokens": 100, "total_tokens": 400})
        for i in range(60)])
    child_queue = f"q-{uuid.uuid4().hex[:8]}"
    greedy = researcher(max_steps=60, max_tool_executions=60, token_threshold=1_000_000)
    greedy = greedy.model_copy(update={"task_queue": child_queue})
    parent = writer(greedy, token_threshold=threshold, max_output_tokens=200,
                    max_tool_executions=200)
    statuses: list[RunStatus] = []

    async def parent_status(handle: WorkflowHandle[Any, RunResult]) -> None:
        statuses.append(await handle.query("status", result_type=RunStatus))

    async with conftest.test_worker(temporal, child_queue, child_server.start(),
                                    tmp_path / "data"):
        try:
            result, server, _ = await run_tree(temporal, tmp_path, parent, [
                resp(*(call("research", {"question": f"調べて {i}"}, f"p{i}")
                       for i in range(3))),
                answer("調べきれませんでした。"),
            ], after=parent_status)
        finally:
            child_server.stop()
    assert result.total_tokens <= threshold
    own = 2 * 120  # the parent's two responses
    children = statuses[0].children
    assert result.total_tokens == own + sum(c.total_tokens for c in children)
    for child in children:
        assert child.total_tokens <= child.token_allowance
        assert child.state == "usage_limit"
    sent = outputs(bodies(server)[1])
    assert len(sent) == 3
    for out in sent.values():
        assert out["error_code"] in ("SUBAGENT_STOPPED", "SUBAGENT_NOT_STARTED")
        if out["error_code"] == "SUBAGENT_STOPPED":
            assert out["data"]["stop_reason"] == "usage_limit"
            assert out["data"]["completed"] is False
    assert children, "at least the first sub-agent ran"
    assert len(child_server.requests) >= 2


async def test_max_children_stops_the_run_with_its_own_reason(temporal: Client,
                                                              tmp_path: Path) -> None:
    result, server, _ = await run_tree(temporal, tmp_path, writer(researcher(),
                                                                  max_children=1), [
        resp(call("research", {"question": "一つ目"}, "p1"),
             call("research", {"question": "二つ目"}, "p2")),
        answer("一つ目の答え"),  # the first child
        answer("一つだけ調べました。"),  # the parent's forced last step
    ])
    assert result.reason == "max_children"
    sent = outputs(bodies(server)[2])
    assert sent["p1"]["status"] == "success"
    assert sent["p2"]["error_code"] == "SUBAGENT_LIMIT"
    assert bodies(server)[2]["tool_choice"] == "none"
    assert [e.event for e in result.events].count("subagent_started") == 1


async def test_max_depth_stops_the_child_that_would_go_deeper(temporal: Client,
                                                              tmp_path: Path) -> None:
    inner = researcher()
    middle: Agent[Any] = Agent(test_tools, model="scripted-model", allowed=["search_docs"],
                               agents=[inner])
    root = writer(middle.as_tool("middle", "Delegates"), max_depth=1)
    result, server, _ = await run_tree(temporal, tmp_path, root, [
        resp(call("middle", {"question": "深く調べて"}, "p1")),  # root
        resp(call("research", {"question": "もっと深く"}, "m1")),  # middle: blocked
        answer("ここまでです。"),  # middle's forced last step
        answer("中間の結果です。"),  # root
    ])
    sent = outputs(bodies(server)[3])["p1"]
    assert sent["error_code"] == "SUBAGENT_STOPPED"
    assert sent["data"]["stop_reason"] == "max_depth"
    assert outputs(bodies(server)[2])["m1"]["error_code"] == "SUBAGENT_LIMIT"
    assert result.reason == "completed"


async def test_a_child_refused_by_its_workers_policy_is_reported(temporal: Client,
                                                                 tmp_path: Path) -> None:
    child_queue = f"q-{uuid.uuid4().hex[:8]}"
    refused = researcher().model_copy(update={"task_queue": child_queue})
    strict_server = ScriptedModelServer([])
    worker = Worker(temporal, test_tools, deps=DemoDeps(data_dir=tmp_path / "data"),
                    model=openai.AsyncOpenAI(base_url=strict_server.start(),
                                             api_key="sk-test-not-real"),
                    task_queue=child_queue,
                    policy=OperatorPolicy(tools=["search_docs", "create_ticket"]))
    async with worker:
        try:
            result, server, _ = await run_tree(temporal, tmp_path, writer(refused), [
                resp(call("research", {"question": "調べて"}, "p1")),
                answer("調べられませんでした。"),
            ])
        finally:
            strict_server.stop()
    sent = outputs(bodies(server)[1])["p1"]
    assert sent["error_code"] == "SUBAGENT_FAILED"
    assert "lookup_stock" not in sent["message"]  # the operator's line is not the model's
    ended = next(e for e in result.events if e.event == "subagent_ended")
    assert ended.detail is not None and ended.detail.startswith("refused:")
    assert "lookup_stock" in ended.detail
    assert strict_server.requests == []


async def test_a_sub_agents_id_taken_by_a_starter_is_reported_not_stuck(
        temporal: Client, tmp_path: Path) -> None:
    """Someone with namespace access starts a workflow under the id the parent's next
    sub-agent will have (it is the call's key: readable once the run started): the
    parent reports the sub-agent as failed and goes on; no workflow task fails."""
    gate = threading.Event()
    server = ScriptedModelServer([
        {**resp(call("research", {"question": "A-001?"}, "p1")), "delay_seconds": 1.0},
        answer("調べられませんでした。"),
    ], sleep=lambda _: gate.wait(RUN_TIMEOUT))
    squatter: list[str] = []

    async def squat(handle: WorkflowHandle[Any, RunResult]) -> None:
        run_id = (await handle.describe()).raw_description.workflow_execution_info \
            .first_run_id
        squatter.append(f"{handle.id}/{run_id}/step-1/call-0/research")
        # Any workflow will do, on a queue no worker polls.
        await temporal.start_workflow("Squatter", id=squatter[0], task_queue="nobody")
        gate.set()  # now the model answers, and the parent calls the sub-agent

    result, server, _ = await run_tree(temporal, tmp_path, writer(researcher()),
                                       server, during=squat)
    sent = outputs(bodies(server)[1])["p1"]
    assert sent["error_code"] == "SUBAGENT_FAILED"
    ended = next(e for e in result.events if e.event == "subagent_ended")
    assert ended.detail is not None and "already used" in ended.detail
    assert result.reason == "completed"
    await temporal.get_workflow_handle(squatter[0]).terminate()


async def test_a_tree_spends_from_its_roots_shared_budget(temporal: Client,
                                                          tmp_path: Path) -> None:
    """The sub-agent spends from the parent's shared budget key: each of its requests
    reserves its worst case under its own run id, so the ledger sees the whole tree."""
    key = f"tree-{uuid.uuid4().hex[:8]}"

    async def budget(queue: str) -> None:
        await set_budget(temporal, key, BudgetLimits(tokens=100_000), task_queue=queue)

    views: list[Any] = []

    async def spent(handle: WorkflowHandle[Any, RunResult]) -> None:
        views.append(await show_budget(temporal, key))

    parent = writer(researcher()).replace(budget=key,
                                          limits=Limits(max_output_tokens=200))
    result, _, _ = await run_tree(temporal, tmp_path, parent, [
        resp(call("research", {"question": "A-001?"}, "p1")),
        resp(call("lookup_stock", {"sku": "A-001"}, "k1")),
        answer("12個です。"),
        answer("A-001は12個です。"),
    ], before=budget, after=spent)
    assert result.reason == "completed"
    assert result.total_tokens == 4 * 120
    [view] = views
    assert view.spent.tokens == result.total_tokens
    assert view.reserved.tokens == 0


async def test_the_tree_stream_carries_the_sub_agents_events(temporal: Client,
                                                             tmp_path: Path) -> None:
    """`Run.stream_tree` follows each sub-agent's stream from its start: its events and
    its streamed text come with its path, and the whole stream ends with the parent's
    result."""
    seen: list[tuple[tuple[str, ...], str]] = []
    reader: list[asyncio.Task[None]] = []

    async def read(handle: WorkflowHandle[Any, RunResult]) -> None:
        async def go() -> None:
            async for path, item in Run(handle).stream_tree():
                what = item.event.event if isinstance(item, StreamEvent) else item.kind
                seen.append((path, what))
        reader.append(asyncio.create_task(go()))

    async def read_to_the_end(handle: WorkflowHandle[Any, RunResult]) -> None:
        await asyncio.wait_for(reader[0], RUN_TIMEOUT)  # with the worker up

    result, _, _ = await run_tree(temporal, tmp_path, writer(researcher()), [
        resp(call("research", {"question": "A-001?"}, "p1")),
        resp(call("lookup_stock", {"sku": "A-001"}, "k1")),
        answer("A-001は12個です。"),
        answer("調査結果: 12個。"),
    ], during=read, after=read_to_the_end)
    child = [what for path, what in seen if path == ("research",)]
    parent = [what for path, what in seen if path == ()]
    assert child[0] == "run_started" and "tool_success" in child
    assert "text" in child and child[-1] == "result"
    assert "subagent_started" in parent and parent[-1] == "result"
    assert seen.index((("research",), "run_started")) > seen.index(((), "subagent_started"))
    assert result.reason == "completed"


def test_an_agent_whose_toolset_lacks_a_sub_agents_tools_is_refused_when_made() -> None:
    other = boundloop.Toolset[None]()

    @other.tool()
    def look_up(topic: str) -> str:
        """Look a topic up."""
        return topic

    helper: Agent[Any] = Agent(other)
    with pytest.raises(ValueError, match=r"toolset does not serve \(helper: look_up\)"):
        Agent(test_tools, agents=[helper.as_tool("helper", "Looks up")])
    with pytest.raises(ValueError, match="offered to the model without being listed"):
        Agent(test_tools, allowed=["lookup_stock", "helper"],
              agents=[Agent(test_tools).as_tool("helper", "Looks up")])
    # On a task queue of its own, another worker serves it.
    apart = helper.as_tool("helper", "Looks up").model_copy(update={"task_queue": "other"})
    assert list(Agent(test_tools, agents=[apart]).agents) == [apart]


async def test_a_roots_per_tool_limit_holds_across_its_sub_agents(temporal: Client,
                                                                   tmp_path: Path) -> None:
    """The root may look up stock twice: it looks once, its sub-agent may look once more
    (its second look is blocked), and the root's own third look is blocked too."""
    result, server, _ = await run_tree(temporal, tmp_path, writer(
        researcher(), allowed=("lookup_stock",), per_tool_max_calls={"lookup_stock": 2}), [
        resp(call("lookup_stock", {"sku": "A-001"}, "p1")),  # root: 1 of 2
        resp(call("research", {"question": "B and C?"}, "p2")),
        resp(call("lookup_stock", {"sku": "B-002"}, "k1")),  # child: the 1 left
        resp(call("lookup_stock", {"sku": "C-003"}, "k2")),  # child: blocked
        answer("B-002だけ調べました。"),  # the child's forced last step
        resp(call("lookup_stock", {"sku": "D-004"}, "p3")),  # root: blocked
        answer("A-001とB-002だけ調べました。"),
    ])
    sent = bodies(server)
    assert outputs(sent[3])["k1"]["status"] == "success"
    assert outputs(sent[4])["k2"]["error_code"] == "TOOL_CALL_LIMIT"
    assert outputs(sent[6])["p3"]["error_code"] == "TOOL_CALL_LIMIT"
    assert result.reason == "max_tools"


async def test_a_tool_its_caller_spent_is_denied_to_the_sub_agent(temporal: Client,
                                                                   tmp_path: Path) -> None:
    result, server, _ = await run_tree(temporal, tmp_path, writer(
        researcher(), allowed=("lookup_stock",), per_tool_max_calls={"lookup_stock": 1}), [
        resp(call("lookup_stock", {"sku": "A-001"}, "p1")),  # root: its one look
        resp(call("research", {"question": "B?"}, "p2")),
        resp(call("lookup_stock", {"sku": "B-002"}, "k1")),  # child: denied
        answer("調べられませんでした。"),
        answer("A-001だけです。"),
    ])
    denied = outputs(bodies(server)[3])["k1"]
    assert denied["error_code"] == "DENIED_BY_RULE"
    assert "caller's calls of it are spent" in denied["message"]
    assert result.tool_executions == 2  # the root's look and the research call


async def test_a_grandchild_with_the_default_limits_gets_to_answer(temporal: Client,
                                                                   tmp_path: Path) -> None:
    """Default limits at every level: the grandchild's allowance is small, and its output
    cap fits it, so it sends its request and answers."""
    middle: Agent[Any] = Agent(test_tools, model="scripted-model", allowed=["search_docs"],
                               agents=[researcher()])
    result, server, _ = await run_tree(temporal, tmp_path, writer(
        middle.as_tool("middle", "Delegates")), [
        resp(call("middle", {"question": "調べて"}, "p1")),  # root
        resp(call("research", {"question": "A-001?"}, "m1")),  # middle
        answer("A-001は12個です。"),  # grandchild
        answer("12個だそうです。"),  # middle
        answer("A-001は12個です。"),  # root
    ])
    assert outputs(bodies(server)[3])["m1"]["data"]["completed"] is True
    assert outputs(bodies(server)[4])["p1"]["data"]["completed"] is True
    assert bodies(server)[2]["max_output_tokens"] <= 4096
    assert result.reason == "completed" and result.total_tokens == 5 * 120


async def test_a_slow_models_charged_attempts_in_a_sub_agent_are_its_callers(
        temporal: Client, tmp_path: Path) -> None:
    """The sub-agent's model is silent past model_timeout_seconds once: that attempt is
    charged its worst case and sent again. What the sub-agent's model server received,
    what the sub-agent recorded and what its caller was charged all agree."""
    child_server = ScriptedModelServer([
        {**answer("遅い答え"), "delay_seconds": 3.0},  # silent past the timeout
        answer("A-001は12個です。"),
    ])
    child_queue = f"q-{uuid.uuid4().hex[:8]}"
    slow = researcher(model_timeout_seconds=1.0).model_copy(
        update={"task_queue": child_queue})
    ended: list[RunResult] = []

    async def child_result(handle: WorkflowHandle[Any, RunResult]) -> None:
        [child] = [w async for w in temporal.list_workflows(
            f"ParentWorkflowId = '{handle.id}'")]
        ended.append(await result_of(temporal.get_workflow_handle(
            child.id, result_type=RunResult)))

    async with conftest.test_worker(temporal, child_queue, child_server.start(),
                                    tmp_path / "data"):
        try:
            result, _, _ = await run_tree(temporal, tmp_path, writer(slow), [
                resp(call("research", {"question": "A-001?"}, "p1")),
                answer("A-001は12個です。"),
            ], after=child_result)
        finally:
            child_server.stop()
    [child] = ended
    assert len(child_server.requests) == 2
    assert [a.outcome for a in child.model_attempts] == ["timeout", "answered"]
    assert child.model_attempts[0].worst_case
    assert child.total_tokens == sum(a.input_tokens + a.output_tokens
                                     for a in child.model_attempts)
    assert result.total_tokens == 2 * 120 + child.total_tokens
