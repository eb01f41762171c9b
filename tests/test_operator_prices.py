"""Prices come only from the operator's table, against a real `boundloop worker` reading
a policy file: a run bringing a price other than the operator's (not only a zero one) is
refused naming the model and the operator's value; a run whose model the operator has no
price for cannot spend from a USD budget, its own or a shared one, and the model is
never asked.
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
from boundloop import Limits, Policy, PolicyRefused, Price
from boundloop.budgets import set_budget
from boundloop.core.budget import BudgetLimits
from boundloop.scripted.server import ScriptedModelServer
from tests.conftest import RUN_TIMEOUT
from tests.scripts import answer
from tests.test_worker_process import BOUNDLOOP, log_has, process, worker_env

#: The operator prices one model; the runs use "scripted-model" or "other-model".
POLICY = """\
[prices.scripted-model]
input_usd_per_mtok = 1.0
output_usd_per_mtok = 2.0
"""
OPERATORS = {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0}


@pytest.fixture
def model() -> AsyncIterator[ScriptedModelServer]:
    server = ScriptedModelServer([answer("never asked")])
    server.start()
    yield server  # type: ignore[misc]
    server.stop()


@pytest_asyncio.fixture
async def queue(temporal: Client, model: ScriptedModelServer, tmp_path: Path
                ) -> AsyncIterator[str]:
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY, encoding="utf-8")
    name = f"q-{uuid.uuid4().hex[:8]}"
    env = worker_env(tmp_path, TEMPORAL_ADDRESS=temporal.service_client.config.target_host,
                     BOUNDLOOP_TASK_QUEUE=name, OPENAI_BASE_URL=model.base_url,
                     OPENAI_API_KEY="sk-test-not-real", BOUNDLOOP_POLICY=str(policy))
    log = tmp_path / "worker.log"
    with process([BOUNDLOOP, "worker"], env, log):
        await log_has(log, "worker started")
        yield name


async def refused_lines(temporal: Client, queue: str, **kw: object) -> list[str]:
    run = await boundloop.start(temporal, "A-001の在庫は？", tools=["lookup_stock"],
                                task_queue=queue, **kw)  # type: ignore[arg-type]
    with pytest.raises(PolicyRefused) as refused:
        await asyncio.wait_for(run.result(), RUN_TIMEOUT)
    return refused.value.lines()


async def test_a_price_other_than_the_operators_is_refused_naming_its_value(
        temporal: Client, model: ScriptedModelServer, queue: str) -> None:
    # Half the operator's output price: not zero, still not the operator's.
    half = Price(input_usd_per_mtok=1.0, output_usd_per_mtok=1.0)
    lines = await refused_lines(temporal, queue, model="scripted-model",
                                policy=Policy(prices={"scripted-model": half}),
                                limits=Limits(usd_budget=0.01))
    assert lines == [
        "policy.prices.scripted-model: the run asked "
        f"{half.model_dump_json()}; the operator's policy: "
        f"{Price.model_validate(OPERATORS).model_dump_json()}"]
    # A USD budget for a model the operator has no price for, even with one of its own.
    own = Price.model_validate(OPERATORS)
    lines = await refused_lines(temporal, queue, model="other-model",
                                policy=Policy(prices={"other-model": own}),
                                limits=Limits(usd_budget=0.01))
    assert lines == [
        f"policy.prices.other-model: the run asked {own.model_dump_json()}; the "
        "operator's policy: no price for this model",
        "limits.usd_budget: the run asked a USD budget for other-model; the operator's "
        "policy: no price for this model"]
    assert model.requests == []
    assert json.loads(own.model_dump_json()) == OPERATORS


async def test_a_shared_usd_budget_refuses_a_model_the_operator_has_no_price_for(
        temporal: Client, model: ScriptedModelServer, queue: str) -> None:
    key = f"team-{uuid.uuid4().hex[:6]}"
    await set_budget(temporal, key, BudgetLimits(usd=5.0), task_queue=queue)
    run = await boundloop.start(temporal, "A-001の在庫は？", tools=["lookup_stock"],
                                model="other-model", task_queue=queue, budget=key,
                                limits=Limits(max_output_tokens=50))
    result = await asyncio.wait_for(run.result(), RUN_TIMEOUT)
    assert (result.reason, result.steps) == ("budget_limit", 0)
    assert "the run's model has no price" in result.text and key in result.text
    assert model.requests == []
