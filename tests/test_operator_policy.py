"""The operator's policy through the real workflow (real dev server, real worker, the
scripted model over HTTP): each way a run's starter loosened it on the day issue 17 was
filed is refused before any model request, naming the field; a tightening runs; an open
run keeps the policy it was admitted under when the worker restarts with another.
"""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import AsyncIterator, Sequence
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
from boundloop.core.mcp_tools import MCPServerConfig, MCPToolDeclaration
from boundloop.errors import PolicyNamesUnservedTools
from boundloop.exit_codes import ExitCode
from boundloop.scripted.server import ScriptedModelServer
from boundloop.signing import Signer, new_key
from boundloop.testing import wait_until
from boundloop.tools.demo import DemoDeps, list_tickets
from tests.conftest import RUN_TIMEOUT, workflow_task_failures
from tests.scripts import answer, call, resp
from tests.support import mcp_servers
from tests.support.tools import tools as test_tools
from tests.test_approvals import pending
from tests.test_cli import cli, env_for
from tests.test_mcp_runs import shop
from tests.test_mcp_worker_process import write_config
from tests.test_worker_process import BOUNDLOOP, log_has, process, worker_env

TICKET = {"title": "Printer on fire", "description": "3F printer smokes", "priority": "high"}
PRICE = {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0}


@asynccontextmanager
async def served(temporal: Client, model: ScriptedModelServer, queue: str, data: Path,
                 policy: OperatorPolicy, servers: Sequence[MCPServerConfig] = (),
                 ) -> AsyncIterator[None]:
    client = openai.AsyncOpenAI(base_url=model.base_url, api_key="sk-test-not-real")
    async with Worker(temporal, test_tools, deps=DemoDeps(data_dir=data), model=client,
                      task_queue=queue, policy=policy, mcp_servers=servers):
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
    db = tmp_path / "mcp.sqlite3"
    mcp_servers.connect(db).close()
    # The worker serves the shop server's tools, which the operator's glob names.
    async with served(temporal, model, queue, tmp_path, operator, [shop(db)]):
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
    # Refused by the operator's `always` and, the worker serving the shop's tools, as
    # looser than the worker's own declaration.
    assert {r["field"] for r in by_flag.value.refusals} == {
        "mcp_tools.shop__delete_record.needs_approval"}
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



async def test_a_run_setting_no_limits_runs_under_ceilings_below_the_defaults(
        temporal: Client, model: ScriptedModelServer, tmp_path: Path) -> None:
    """Ceilings under boundloop's own defaults (5 steps, 600 s), no [limits.defaults]: a
    run that sets nothing is admitted with the ceilings; asking more is still refused."""
    operator = OperatorPolicy.model_validate({
        "limits": {"max": {"max_steps": 4, "deadline_seconds": 300}}})
    model.append(answer("in stock"))
    queue = f"q-{uuid.uuid4().hex[:8]}"
    async with served(temporal, model, queue, tmp_path, operator):
        handle = await start(temporal, queue, {}, ["lookup_stock"])
        result = await asyncio.wait_for(result_of(handle), RUN_TIMEOUT)
        status = await query_status(handle)
        asking = await start(temporal, queue, {"limits": {"max_steps": 6}}, ["lookup_stock"])
        with pytest.raises(PolicyRefused) as refused:
            await asyncio.wait_for(result_of(asking), RUN_TIMEOUT)
    assert result.reason == "completed"
    assert (status.limits.max_steps, status.limits.deadline_seconds) == (4, 300.0)
    assert [r["field"] for r in refused.value.refusals] == ["limits.max_steps"]

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
        run_id = f"refused-{uuid.uuid4().hex[:8]}"
        started = await cli("run", "チケットを作って", "--policy", '{"approval": "never"}',
                            "--id", run_id, env=cli_env)
        with pytest.raises(PolicyRefused):  # ended: `status` reads the closed run
            await asyncio.wait_for(result_of(temporal.get_workflow_handle(run_id)),
                                   RUN_TIMEOUT)
        shown = await cli("status", run_id, env=cli_env)
    text = " ".join(err.split())
    # Started without --wait, the refusal is said at once (exit 2, as with --wait), and
    # `status` of the refused run shows it the same way: a run that ended without
    # completing (exit 3, not 2: that is for input refused before anything started).
    assert started[0] == 2 and "started" not in started[1], started
    assert "refused: policy.approval: the run asked never" in " ".join(started[2].split())
    assert shown[0] == 3, shown
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
        "usd_budget, max_output_tokens, max_input_tokens, tool_timeout_seconds, "
        "model_timeout_seconds, model_answer_seconds, deadline_seconds, "
        "approval_timeout_seconds, max_children, max_depth)"], err


async def exits(worker: subprocess.Popen[bytes], log: Path, *, connects: bool = False) -> int:
    """The worker's exit code; fails if it starts serving instead (`connects`: it
    connects first, to list its MCP servers' tools, and must exit then)."""
    async def ended_or_serving() -> bool:
        return worker.poll() is not None or (
            not connects and "worker started" in log.read_text("utf-8"))

    await wait_until(ended_or_serving, timeout=60)
    if not connects:
        assert "worker started" not in log.read_text("utf-8"), log.read_text("utf-8")
    return worker.wait(timeout=60)


#: The tools `boundloop worker` serves by default (the demo's).
DEMO_SERVED = "lookup_stock, search_docs, create_ticket"


@pytest.mark.parametrize(("policy_text", "named"), [
    ('[approval.no_such_tool]\napproval = "always"\n', "approval.no_such_tool"),
    ('tools = ["lookup_*", "creat_ticket"]\n', "tools 'creat_ticket'"),
    ('[[rules]]\ntool = "transfer*"\naction = "deny"\n', "rules[0].tool 'transfer*'"),
    ('[limits.defaults.per_tool_max_calls]\nlookup_stok = 2\n',
     "limits.defaults.per_tool_max_calls.lookup_stok"),
], ids=["approval", "tools", "rules", "per-tool limit"])
async def test_a_policy_naming_a_tool_the_worker_does_not_serve_stops_it_at_start(
        temporal: Client, tmp_path: Path, policy_text: str, named: str) -> None:
    """A typo in a per-tool section would leave the operator believing a rule applies
    that applies to nothing: the worker refuses to start, in one line naming the entry
    and the tools served, exit 2, before it takes any task."""
    policy = tmp_path / "policy.toml"
    policy.write_text(policy_text, encoding="utf-8")
    log = tmp_path / "worker.log"
    env = worker_env(tmp_path, BOUNDLOOP_POLICY=str(policy), BOUNDLOOP_TASK_QUEUE=
                     f"q-{uuid.uuid4().hex[:8]}",
                     TEMPORAL_ADDRESS=temporal.service_client.config.target_host)
    with process([BOUNDLOOP, "worker"], env, log) as worker:
        code = await exits(worker, log)
    assert code == ExitCode.INVALID, log.read_text("utf-8")
    assert [line for line in log.read_text("utf-8").splitlines()
            if not line.startswith("warning:")] == [
        f"error: BOUNDLOOP_POLICY: {named}: no tool this worker serves has that name "
        f"(it serves: {DEMO_SERVED})"]


async def test_a_policy_naming_an_mcp_tool_is_checked_once_the_servers_listed(
        temporal: Client, tmp_path: Path) -> None:
    """With MCP servers, the tools served are known once they listed theirs: a glob
    naming the shop's tools starts the worker, one naming none stops it, exit 2."""
    db = tmp_path / "mcp.sqlite3"
    mcp_servers.connect(db).close()
    policy = tmp_path / "policy.toml"
    env = worker_env(tmp_path, BOUNDLOOP_POLICY=str(policy), BOUNDLOOP_TASK_QUEUE=
                     f"q-{uuid.uuid4().hex[:8]}",
                     TEMPORAL_ADDRESS=temporal.service_client.config.target_host,
                     BOUNDLOOP_MCP_CONFIG=str(write_config(tmp_path, db)))
    policy.write_text('[approval."shop__delete_*"]\napproval = "always"\n', encoding="utf-8")
    with process([BOUNDLOOP, "worker"], env, tmp_path / "ok.log"):
        await log_has(tmp_path / "ok.log", "worker started")
    policy.write_text('[approval."shop__remove_*"]\napproval = "always"\n', encoding="utf-8")
    log = tmp_path / "typo.log"
    with process([BOUNDLOOP, "worker"], env, log) as worker:
        code = await exits(worker, log, connects=True)
    assert code == ExitCode.INVALID, log.read_text("utf-8")
    [line] = [line for line in log.read_text("utf-8").splitlines()
              if line.startswith("error:")]
    assert line.startswith("error: BOUNDLOOP_POLICY: approval.shop__remove_*: no tool this "
                           f"worker serves has that name (it serves: {DEMO_SERVED}, "
                           "shop__lookup"), line
    assert "Traceback" not in log.read_text("utf-8")


async def test_a_worker_of_ones_own_refuses_a_policy_naming_unserved_tools(
        temporal: Client, tmp_path: Path) -> None:
    policy = OperatorPolicy.model_validate({"approval": {"creat_ticket": {
        "approval": "always"}}, "rules": [{"tool": "lookup_*", "action": "ask"}]})
    model = openai.AsyncOpenAI(base_url="http://127.0.0.1:1", api_key="sk-test-not-real")
    with pytest.raises(PolicyNamesUnservedTools) as refused:
        Worker(temporal, test_tools, deps=DemoDeps(data_dir=tmp_path), model=model,
               task_queue=f"q-{uuid.uuid4().hex[:8]}", policy=policy)
    assert str(refused.value).startswith(
        "approval.creat_ticket: no tool this worker serves has that name (it serves: "
        "lookup_stock, search_docs, create_ticket, counted,")


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
