"""The operator's policy through the real workflow (real dev server, real worker, the
scripted model over HTTP): each way a run's starter loosened it on the day issue 17 was
filed is refused before any model request, naming the field; a tightening runs; an open
run keeps the policy it was admitted under when the worker restarts with another.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import openai
import pytest
from temporalio.client import Client, WorkflowHandle

from boundloop import OperatorPolicy, PolicyRefused, Worker
from boundloop.client import decide, query_status, result_of
from boundloop.contracts import WORKFLOW_NAME, Carried, Decision, RunInput, RunResult
from boundloop.core.conversation import ConversationMeta, ConversationRef, user_message
from boundloop.core.limits import RunSettings
from boundloop.core.loop import LoopState
from boundloop.core.mcp_tools import MCPToolDeclaration
from boundloop.scripted.server import ScriptedModelServer
from boundloop.signing import Signer, new_key
from boundloop.tools.demo import DemoDeps, list_tickets
from tests.conftest import RUN_TIMEOUT, workflow_task_failures
from tests.scripts import answer, call, resp
from tests.support.tools import tools as test_tools
from tests.test_approvals import pending
from tests.test_cli import cli, env_for
from tests.test_worker_process import BOUNDLOOP, log_has, process, worker_env

TICKET = {"title": "Printer on fire", "description": "3F printer smokes", "priority": "high"}
PRICE = {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0}


@asynccontextmanager
async def served(temporal: Client, model: ScriptedModelServer, queue: str, data: Path,
                 policy: OperatorPolicy) -> AsyncIterator[None]:
    client = openai.AsyncOpenAI(base_url=model.base_url, api_key="sk-test-not-real")
    async with Worker(temporal, test_tools, deps=DemoDeps(data_dir=data), model=client,
                      task_queue=queue, policy=policy):
        yield


async def start(temporal: Client, queue: str, settings: dict[str, Any],
                tools: list[str], mcp: list[MCPToolDeclaration] = ()  # type: ignore[assignment]
                ) -> WorkflowHandle[Any, Any]:
    inp = RunInput(question="チケットを作って", tools=tools, mcp_tools=list(mcp),
                   settings=RunSettings.model_validate({"model": "scripted-model",
                                                        **settings}))
    return await temporal.start_workflow(WORKFLOW_NAME, inp, id=f"op-{uuid.uuid4().hex[:12]}",
                                         task_queue=queue, result_type=RunResult)


@pytest.fixture
def model() -> AsyncIterator[ScriptedModelServer]:
    server = ScriptedModelServer([])
    server.start()
    yield server  # type: ignore[misc]
    server.stop()


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Signer]:
    made = {name: new_key(name, tmp_path) for name in ("alice", "mallory")}
    return {name: Signer.from_file(name, k.private_path) for name, k in made.items()}


def shop_delete(needs_approval: bool) -> MCPToolDeclaration:
    return MCPToolDeclaration(name="shop__delete_record", server="shop",
                              remote_name="delete_record", description="delete a record",
                              parameters={"type": "object", "properties": {}},
                              strict=False, needs_approval=needs_approval, side_effects=True)


BYPASSES: dict[str, tuple[dict[str, Any], dict[str, Any], list[str], list[str]]] = {
    # name: (operator policy, run settings, tools, refused fields)
    "approval never": ({}, {"policy": {"approval": "never"}}, ["create_ticket"],
                       ["policy.approval"]),
    "zero prices": ({"prices": {"scripted-model": PRICE}},
                    {"limits": {"usd_budget": 0.0001},
                     "policy": {"prices": {"scripted-model": {"input_usd_per_mtok": 0.0,
                                                              "output_usd_per_mtok": 0.0}}}},
                    ["lookup_stock"], ["policy.prices.scripted-model"]),
    "missing budget": ({"budget": {"key": "team-a", "required": True}}, {},
                       ["lookup_stock"], ["budget"]),
    "foreign budget": ({"budget": {"key": "team-a", "required": True}},
                       {"budget": "team-b", "limits": {"max_output_tokens": 100}},
                       ["lookup_stock"], ["budget"]),
    "limits over the ceiling": ({"limits": {"max": {"max_steps": 10,
                                                    "deadline_seconds": 3600}}},
                                {"limits": {"max_steps": 1000,
                                            "deadline_seconds": 1_000_000.0}},
                                ["lookup_stock"],
                                ["limits.max_steps", "limits.deadline_seconds"]),
    "tool outside the allowed set": ({"tools": ["lookup_*"]}, {}, ["create_ticket"],
                                     ["tools"]),
}


@pytest.mark.parametrize("bypass", list(BYPASSES))
async def test_each_bypass_is_refused_before_any_model_request(
        bypass: str, temporal: Client, model: ScriptedModelServer, tmp_path: Path) -> None:
    operator, settings, tools, fields = BYPASSES[bypass]
    model.append(resp(call("create_ticket", TICKET, "t1")))
    queue = f"q-{uuid.uuid4().hex[:8]}"
    async with served(temporal, model, queue, tmp_path, OperatorPolicy.model_validate(operator)):
        handle = await start(temporal, queue, settings, tools)
        with pytest.raises(PolicyRefused) as refused:
            await asyncio.wait_for(result_of(handle), RUN_TIMEOUT)
    assert [r["field"] for r in refused.value.refusals] == fields
    assert model.requests == []
    assert list_tickets(tmp_path) == []
    assert await workflow_task_failures(handle, temporal) == 0


async def test_without_a_policy_file_the_tools_and_the_workers_keys_are_the_floor(
        temporal: Client, model: ScriptedModelServer, tmp_path: Path,
        keys: dict[str, Signer]) -> None:
    """The issue's first two bypasses against a worker with approver keys and no policy:
    `create_ticket` declares `needs_approval`, so `approval: never` is refused; a key the
    worker does not have is refused; a run that asks nothing looser is admitted."""
    client = openai.AsyncOpenAI(base_url=model.base_url, api_key="sk-test-not-real")
    model.append(answer("在庫は十分です。"))
    queue = f"q-{uuid.uuid4().hex[:8]}"
    async with Worker(temporal, test_tools, deps=DemoDeps(data_dir=tmp_path), model=client,
                      task_queue=queue, approver_keys={"alice": keys["alice"].public_key}):
        never = await start(temporal, queue, {"policy": {"approval": "never"}},
                            ["create_ticket"])
        mallory = await start(temporal, queue, {"policy": {"approver_keys": {
            "mallory": keys["mallory"].public_key}}}, ["create_ticket"])
        plain = await start(temporal, queue, {}, ["lookup_stock"])
        with pytest.raises(PolicyRefused) as by_approval:
            await asyncio.wait_for(result_of(never), RUN_TIMEOUT)
        with pytest.raises(PolicyRefused) as by_key:
            await asyncio.wait_for(result_of(mallory), RUN_TIMEOUT)
        admitted = await asyncio.wait_for(result_of(plain), RUN_TIMEOUT)
    assert [r["field"] for r in by_approval.value.refusals] == ["policy.approval"]
    assert [r["field"] for r in by_key.value.refusals] == ["policy.approver_keys.mallory"]
    assert admitted.reason == "completed"
    assert list_tickets(tmp_path) == []


async def test_a_self_added_approver_key_and_a_loose_mcp_flag_are_refused(
        temporal: Client, model: ScriptedModelServer, tmp_path: Path,
        keys: dict[str, Signer]) -> None:
    operator = OperatorPolicy.model_validate({
        "approver_keys": {"alice": keys["alice"].public_key},
        "approval": {"shop__delete_*": {"approval": "always"}}})
    queue = f"q-{uuid.uuid4().hex[:8]}"
    async with served(temporal, model, queue, tmp_path, operator):
        mallory = await start(temporal, queue, {"policy": {"approver_keys": {
            "mallory": keys["mallory"].public_key}}}, ["create_ticket"])
        mcp = await start(temporal, queue, {}, ["shop__delete_record"], [shop_delete(False)])
        with pytest.raises(PolicyRefused) as by_key:
            await asyncio.wait_for(result_of(mallory), RUN_TIMEOUT)
        with pytest.raises(PolicyRefused) as by_flag:
            await asyncio.wait_for(result_of(mcp), RUN_TIMEOUT)
    assert by_key.value.lines() == [
        "policy.approver_keys.mallory: the run asked a key of its own; the operator's "
        "policy: approvers: alice"]
    assert [r["field"] for r in by_flag.value.refusals] == [
        "mcp_tools.shop__delete_record.needs_approval"]
    assert model.requests == []


async def test_a_tightening_runs_under_the_operators_defaults(
        temporal: Client, model: ScriptedModelServer, tmp_path: Path) -> None:
    operator = OperatorPolicy.model_validate({
        "limits": {"max": {"max_steps": 10}, "defaults": {"max_tool_executions": 3}}})
    model.append(resp(call("lookup_stock", {"sku": "A-001"}, "s1")))
    model.append(answer("in stock"))
    queue = f"q-{uuid.uuid4().hex[:8]}"
    async with served(temporal, model, queue, tmp_path, operator):
        handle = await start(temporal, queue, {"limits": {"max_steps": 4}}, ["lookup_stock"])
        result = await asyncio.wait_for(result_of(handle), RUN_TIMEOUT)
        status = await query_status(handle)
    assert (result.reason, result.tool_executions) == ("completed", 1)
    assert (status.limits.max_steps, status.limits.max_tool_executions) == (4, 3)


async def test_an_open_run_keeps_its_recorded_policy_across_a_restart(
        temporal: Client, model: ScriptedModelServer, tmp_path: Path) -> None:
    """Parked under a policy whose approver is alice; the worker restarts with a policy
    naming bob only: alice's approval still counts (the admission in history is used)."""
    queue = f"q-{uuid.uuid4().hex[:8]}"
    before = OperatorPolicy.model_validate({"approval": {"create_ticket": {
        "approvers": ["alice"]}}})
    after = OperatorPolicy.model_validate({"approval": {"create_ticket": {
        "approvers": ["bob"]}}, "limits": {"max": {"max_steps": 2}}})
    model.append(resp(call("create_ticket", TICKET, "t1")))
    async with served(temporal, model, queue, tmp_path, before):
        handle = await start(temporal, queue, {"limits": {"max_steps": 5}},
                             ["create_ticket"])
        assert [a.call_id for a in (await pending(handle)).pending] == ["t1"]
    model.append(answer("done"))
    async with served(temporal, model, queue, tmp_path, after):
        await asyncio.wait_for(decide(handle, Decision(call_id="t1", approve=True,
                                                       approver="alice")), RUN_TIMEOUT)
        result = await asyncio.wait_for(result_of(handle), RUN_TIMEOUT)
    assert (result.reason, result.tool_executions) == ("completed", 1)
    assert [t["title"] for t in list_tickets(tmp_path)] == [TICKET["title"]]
    assert await workflow_task_failures(handle, temporal) == 0


# --- `boundloop worker` with BOUNDLOOP_POLICY, `boundloop run` refused ----------------

POLICY_TOML = """\
tools = ["lookup_*", "search_docs", "create_ticket"]

[approval.create_ticket]
approvers = ["alice"]

[limits.max]
max_steps = 10
"""


async def test_a_policy_file_refuses_a_cli_run_that_loosens_it(
        temporal: Client, model: ScriptedModelServer, tmp_path: Path) -> None:
    """A real `boundloop worker` reading BOUNDLOOP_POLICY; `boundloop run --wait` asking
    `approval: never` and 50 steps prints one line per refused field and exits 2; nothing
    was asked of the model, no ticket exists."""
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY_TOML, encoding="utf-8")
    queue = f"q-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "worker.log"
    address = temporal.service_client.config.target_host
    env = worker_env(tmp_path, TEMPORAL_ADDRESS=address, BOUNDLOOP_TASK_QUEUE=queue,
                     OPENAI_BASE_URL=model.base_url, OPENAI_API_KEY="sk-test-not-real",
                     BOUNDLOOP_POLICY=str(policy))
    with process([BOUNDLOOP, "worker"], env, log):
        await log_has(log, "worker started")
        code, _out, err = await cli("run", "チケットを作って", "--wait", "--max-steps", "50",
                                    "--policy", '{"approval": "never"}',
                                    env={**env_for(temporal, tmp_path),
                                         "BOUNDLOOP_TASK_QUEUE": queue})
        cli_env = {**env_for(temporal, tmp_path), "BOUNDLOOP_TASK_QUEUE": queue}
        started, out, _ = await cli("run", "チケットを作って", "--policy",
                                    '{"approval": "never"}', env=cli_env)
        run_id = next(w for w in out.split() if w.startswith("boundloop-")).rstrip(":")
        with pytest.raises(PolicyRefused):  # ended: `status` reads the closed run
            await asyncio.wait_for(result_of(temporal.get_workflow_handle(run_id)),
                                   RUN_TIMEOUT)
        shown = await cli("status", run_id, env=cli_env)
    text = " ".join(err.split())
    # Started without --wait, the refusal shows in `status` the same way.
    assert started == 0 and shown[0] == 2, shown
    assert "refused: policy.approval: the run asked never" in " ".join(shown[2].split())
    assert code == 2, err
    assert "refused: policy.approval: the run asked never; the operator's policy: " \
        "approval required for create_ticket" in text, err
    assert "refused: limits.max_steps: the run asked 50; the operator's policy: at most 10" \
        in text, err
    assert model.requests == []
    assert list_tickets(tmp_path / "data") == []


async def test_a_bad_policy_file_stops_the_worker_with_one_line_per_error(
        tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('tools = "all"\n[limits.max]\nmax_stepz = 3\n', encoding="utf-8")
    env = worker_env(tmp_path, BOUNDLOOP_POLICY=str(policy), TEMPORAL_ADDRESS="127.0.0.1:1")
    code, _out, err = await cli("worker", env=env)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2, err
    assert lines == [
        f"error: BOUNDLOOP_POLICY: {policy}: tools: Input should be a valid list",
        f"error: BOUNDLOOP_POLICY: {policy}: limits.max: Value error, no such limit "
        "max_stepz (limits: max_steps, max_tool_executions, token_threshold, "
        "max_result_bytes, max_history_bytes, max_identical_calls, tool_cost_budget, "
        "usd_budget, max_output_tokens, tool_timeout_seconds, model_timeout_seconds, "
        "deadline_seconds, approval_timeout_seconds)"], err


async def test_a_run_started_with_carried_state_of_its_own_is_refused(
        temporal: Client, model: ScriptedModelServer, tmp_path: Path) -> None:
    """Carried state is what continue-as-new hands to the next run, already admitted: a
    starter who writes it into a new run's input (here: approval never, the user message
    unsent) must not skip the operator's admission."""
    model.append(resp(call("create_ticket", TICKET, "t1")))
    model.append(answer("done"))
    queue = f"q-{uuid.uuid4().hex[:8]}"
    settings = RunSettings.model_validate({"model": "scripted-model",
                                           "policy": {"approval": "never"}})
    question = user_message("チケットを作って")
    forged = Carried(
        state=LoopState(settings=settings, allowed_tools=["create_ticket"],
                        conversation=ConversationMeta().extend([question])),
        base=ConversationRef(workflow_id="none", run_id="none", meta=ConversationMeta()),
        unsent=[question])
    inp = RunInput(question="チケットを作って", tools=["create_ticket"], settings=settings,
                   carried=forged)
    async with served(temporal, model, queue, tmp_path, OperatorPolicy()):
        handle = await temporal.start_workflow(
            WORKFLOW_NAME, inp, id=f"op-{uuid.uuid4().hex[:12]}", task_queue=queue,
            result_type=RunResult)
        with pytest.raises(PolicyRefused) as refused:
            await asyncio.wait_for(result_of(handle), RUN_TIMEOUT)
    assert [r["field"] for r in refused.value.refusals] == ["carried"]
    assert model.requests == []
    assert list_tickets(tmp_path) == []
