"""A budget key derived from the run's own metadata: the operator's policy says
`[budget] key_from = "tenant-{BoundloopTenant}"`; a real `boundloop worker` reading it
refuses a run started without the tenant, or naming another tenant's budget, before any
model request, and a run started with `--tenant` spends from its tenant's ledger; so
does each turn of a session started with `--tenant` (which `session show` names), or
with the attribute of the operator's own that the key names.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import Client
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError

import boundloop
from boundloop import PolicyRefused
from boundloop import search_attributes as sa
from boundloop.budgets import set_budget, show_budget
from boundloop.contracts import SESSION_WORKFLOW, SessionInput
from boundloop.core.budget import BudgetLimits
from boundloop.core.limits import RunSettings
from boundloop.scripted.server import ScriptedModelServer
from tests.conftest import RUN_TIMEOUT
from tests.scripts import answer
from tests.test_cli import cli, env_for
from tests.test_worker_process import BOUNDLOOP, log_has, process, worker_env

POLICY = """\
[prices.scripted-model]
input_usd_per_mtok = 1.0
output_usd_per_mtok = 2.0

[budget]
key_from = "tenant-{BoundloopTenant}"

[limits.max]
max_output_tokens = 100
"""


@pytest.fixture
def model() -> AsyncIterator[ScriptedModelServer]:
    server = ScriptedModelServer([])
    server.start()
    yield server  # type: ignore[misc]
    server.stop()


@pytest_asyncio.fixture
async def worker(temporal: Client, model: ScriptedModelServer, tmp_path: Path
                 ) -> AsyncIterator[dict[str, str]]:
    """A `boundloop worker` reading POLICY; yields the CLI's environment for its queue."""
    async with policy_worker(temporal, model, tmp_path, POLICY) as env:
        yield env


@asynccontextmanager
async def policy_worker(temporal: Client, model: ScriptedModelServer, tmp_path: Path,
                        text: str) -> AsyncIterator[dict[str, str]]:
    policy = tmp_path / "policy.toml"
    policy.write_text(text, encoding="utf-8")
    queue = f"q-{uuid.uuid4().hex[:8]}"
    env = worker_env(tmp_path, TEMPORAL_ADDRESS=temporal.service_client.config.target_host,
                     BOUNDLOOP_TASK_QUEUE=queue, OPENAI_BASE_URL=model.base_url,
                     OPENAI_API_KEY="sk-test-not-real", BOUNDLOOP_POLICY=str(policy),
                     BOUNDLOOP_MODEL="scripted-model")
    log = tmp_path / "worker.log"
    with process([BOUNDLOOP, "worker"], env, log):
        await log_has(log, "worker started")
        yield {**env_for(temporal, tmp_path), "BOUNDLOOP_TASK_QUEUE": queue,
               "BOUNDLOOP_MODEL": "scripted-model"}


#: The refusal of a run (or a session's turn) started without the tenant.
NO_TENANT = ("search_attributes.BoundloopTenant: the run asked none; the operator's "
             "policy: required: the budget key is tenant-{BoundloopTenant}")


@pytest_asyncio.fixture
async def tenant(temporal: Client, worker: dict[str, str]) -> str:
    """A fresh tenant whose budget (tenant-TENANT) holds $1."""
    name = f"acme{uuid.uuid4().hex[:6]}"
    await set_budget(temporal, f"tenant-{name}", BudgetLimits(usd=1.0),
                     task_queue=worker["BOUNDLOOP_TASK_QUEUE"])
    return name


async def spent_from(temporal: Client, tenant: str) -> bool:
    view = await show_budget(temporal, f"tenant-{tenant}")
    return view is not None and view.spent.usd > 0 and view.spent.tokens > 0


async def test_a_run_spends_from_the_budget_its_tenant_attribute_names(
        temporal: Client, model: ScriptedModelServer, worker: dict[str, str],
        tenant: str) -> None:
    queue = worker["BOUNDLOOP_TASK_QUEUE"]
    # No tenant: refused naming the attribute, before any model request.
    code, _out, err = await cli("run", "A-001の在庫は？", "--wait", "--tools", "lookup_stock",
                                env=worker)
    assert code == 2, err
    assert f"refused: {NO_TENANT}" in " ".join(err.split()), err
    # Another tenant's budget named by the run: refused naming the run's own.
    run = await boundloop.start(temporal, "A-001の在庫は？", tools=["lookup_stock"],
                                model="scripted-model", task_queue=queue, tenant=tenant,
                                budget="tenant-bigco",
                                limits=boundloop.Limits(max_output_tokens=50))
    with pytest.raises(PolicyRefused) as refused:
        await asyncio.wait_for(run.result(), RUN_TIMEOUT)
    assert refused.value.lines() == [
        f"budget: the run asked tenant-bigco; the operator's policy: tenant-{tenant} (from "
        "tenant-{BoundloopTenant})"]
    assert model.requests == []

    # With its tenant (and no --budget): it spends from tenant-TENANT.
    model.append(answer("A-001は12個です。"))
    code, _out, err = await cli("run", "A-001の在庫は？", "--wait", "--tools", "lookup_stock",
                                "--tenant", tenant, env=worker)
    assert code == 0, err
    assert await spent_from(temporal, tenant)


async def test_a_session_turn_spends_from_the_budget_of_the_sessions_tenant(
        temporal: Client, model: ScriptedModelServer, worker: dict[str, str],
        tenant: str) -> None:
    # A session without a tenant: its turn is refused naming the attribute.
    code, out, err = await cli("session", "start", "--json", "--tools", "lookup_stock",
                               env=worker)
    assert code == 0, err
    untagged = json.loads(out)["session_id"]
    code, out, err = await cli("say", untagged, "A-001の在庫は？", env=worker)
    assert code == 2, (out, err)  # refused by the policy, as a run is
    said = " ".join(err.split())
    assert "was refused by the operator's policy" in said and f"refused: {NO_TENANT}" in said, err
    assert model.requests == []

    # With --tenant, the turn spends from tenant-TENANT.
    model.append(answer("A-001は12個です。"))
    code, out, err = await cli("session", "start", "--json", "--tools", "lookup_stock",
                               "--tenant", tenant, env=worker)
    assert code == 0, err
    tagged = json.loads(out)["session_id"]
    code, out, err = await cli("say", tagged, "A-001の在庫は？", "--json", env=worker)
    assert code == 0, (out, err)
    assert json.loads(out)["reason"] == "completed"
    assert await spent_from(temporal, tenant)
    # `session show` says whose session it is.
    code, out, err = await cli("session", "show", tagged, env=worker)
    assert code == 0 and f"{tagged}: idle · tenant {tenant} · turns 1 of 100" in out, (out,
                                                                                     err)
    code, out, err = await cli("session", "show", tagged, "--json", env=worker)
    assert code == 0 and json.loads(out)["tenant"] == tenant, (out, err)
    code, out, err = await cli("session", "show", untagged, "--json", env=worker)
    assert code == 0 and json.loads(out)["tenant"] is None, (out, err)


#: A search attribute of the operator's own (not boundloop's), registered by the test.
TEAM = SearchAttributeKey.for_keyword("BoundloopTestTeam")


async def test_a_session_turn_carries_every_attribute_the_budget_key_names(
        temporal: Client, model: ScriptedModelServer, tmp_path: Path) -> None:
    """A policy deriving the key from an attribute of the operator's own: a session
    started with it (by the operator's own client) hands it, and its tenant, to each
    turn, which spends from that budget (before, every turn was refused)."""
    with contextlib.suppress(RPCError):  # registered by an earlier run on this server
        await temporal.operator_service.add_search_attributes(AddSearchAttributesRequest(
            namespace=temporal.namespace,
            search_attributes={TEAM.name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD}))
    team = f"red{uuid.uuid4().hex[:6]}"
    policy = POLICY.replace("tenant-{BoundloopTenant}", "team-{BoundloopTestTeam}")
    async with policy_worker(temporal, model, tmp_path, policy) as env:
        queue = env["BOUNDLOOP_TASK_QUEUE"]
        await set_budget(temporal, f"team-{team}", BudgetLimits(usd=1.0), task_queue=queue)
        inp = SessionInput(settings=RunSettings(model="scripted-model",
                                                limits=boundloop.Limits(max_output_tokens=50)),
                           tools=["lookup_stock"])
        sid = f"team-session-{uuid.uuid4().hex[:8]}"
        await temporal.start_workflow(
            SESSION_WORKFLOW, inp, id=sid, task_queue=queue,
            search_attributes=TypedSearchAttributes([SearchAttributePair(TEAM, team),
                                                     SearchAttributePair(sa.TENANT, "acme")]))
        model.append(answer("A-001は12個です。"))
        code, out, err = await cli("say", sid, "A-001の在庫は？", "--json", env=env)
        assert code == 0, (out, err)
        assert json.loads(out)["reason"] == "completed"
        view = await show_budget(temporal, f"team-{team}")
        assert view is not None and view.spent.usd > 0
        turn = await temporal.get_workflow_handle(f"{sid}/turn-1").describe()
        assert turn.typed_search_attributes.get(TEAM) == team
        assert turn.typed_search_attributes.get(sa.TENANT) == "acme"
