"""A budget key derived from the run's own metadata: the operator's policy says
`[budget] key_from = "tenant-{BoundloopTenant}"`; a real `boundloop worker` reading it
refuses a run started without the tenant, or naming another tenant's budget, before any
model request, and a run started with `--tenant` spends from its tenant's ledger; so
does each turn of a session started with `--tenant`.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.client import Client

import boundloop
from boundloop import PolicyRefused
from boundloop.budgets import set_budget, show_budget
from boundloop.core.budget import BudgetLimits
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
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY, encoding="utf-8")
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
    assert code == 1, (out, err)
    assert f"was refused: the operator's policy refuses this run: {NO_TENANT}" \
        in " ".join(err.split()), err
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
