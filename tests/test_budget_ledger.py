"""The budget ledger workflow on a real dev server: refusals, idempotent updates,
continue-as-new with reservations held, and closed runs' reservations released."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.client import Client
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from boundloop.activities.budget import (
    budget_closed_runs,
    budget_release,
    budget_reserve,
    budget_settle,
)
from boundloop.budgets import set_budget, show_budget
from boundloop.contracts import BudgetView, ReserveRequest, SettleRequest, budget_workflow_id
from boundloop.core.budget import Amount, BudgetLimits, Grant
from boundloop.tools import catalog
from boundloop.tools.registry import Toolset
from boundloop.worker.plugin import pass_boundloop_through
from boundloop.workflows.budget import BudgetLedgerWorkflow
from tests.conftest import continue_as_new_server


@pytest_asyncio.fixture(scope="module")
async def client(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Client]:
    async with continue_as_new_server(
            tmp_path_factory.mktemp("ledger") / "temporal.db", 40) as client:
        yield client


@contextlib.asynccontextmanager
async def worker(client: Client, queue: str, ledger: type = BudgetLedgerWorkflow
                 ) -> AsyncIterator[Worker]:
    """A bare Temporal worker for the ledger alone (`ledger`: its workflow class), with
    the queue registered the way boundloop.Worker registers it (no approver keys:
    namespace access sets limits)."""
    served = catalog.Served(Toolset())
    catalog.register(queue, served)
    try:
        async with Worker(client, task_queue=queue, workflows=[ledger],
                          activities=[budget_reserve, budget_settle, budget_release,
                                      budget_closed_runs],
                          workflow_runner=pass_boundloop_through(
                              SandboxedWorkflowRunner())) as w:
            yield w
    finally:
        catalog.unregister(queue, served)


async def reserve(client: Client, key: str, run: str, step: int, tokens: int) -> Grant:
    grant: Grant = await client.get_workflow_handle(budget_workflow_id(key)).execute_update(
        "reserve", ReserveRequest(run=run, step=step, amount=Amount(tokens=tokens)),
        id=f"{run}/step-{step}/reserve", result_type=Grant)
    return grant


async def wait_for(client: Client, key: str, check: object, timeout: float = 30.0
                   ) -> BudgetView:
    async def poll() -> BudgetView:
        while True:
            view = await show_budget(client, key)
            if view is not None and check(view):  # type: ignore[operator]
                return view
            await asyncio.sleep(0.2)
    return await asyncio.wait_for(poll(), timeout)


async def test_ledger_refuses_a_reservation_past_the_budget(client: Client) -> None:
    queue, key = f"q-{uuid.uuid4().hex[:8]}", f"team-{uuid.uuid4().hex[:6]}"
    async with worker(client, queue):
        view = await set_budget(client, key, BudgetLimits(tokens=1000), task_queue=queue)
        assert view.left.tokens == 1000
        assert (await reserve(client, key, "run-a", 1, 600)).granted
        # The same update again (a retried activity) is answered once, holds once.
        assert (await reserve(client, key, "run-a", 1, 600)).granted
        refused = await reserve(client, key, "run-b", 1, 600)
        assert not refused.granted and "token budget 1000" in refused.message
        await client.get_workflow_handle(budget_workflow_id(key)).signal(
            "settle", SettleRequest(run="run-a", step=1, amount=Amount(tokens=150)))
        view = await wait_for(client, key, lambda v: v.spent.tokens == 150)
        assert view.reserved.tokens == 0 and view.left.tokens == 850 and view.refused == 1
        # Limits change; spent stays.
        view = await set_budget(client, key, BudgetLimits(tokens=2000), task_queue=queue)
        assert view.spent.tokens == 150 and view.left.tokens == 1850


async def test_show_of_an_unknown_key_is_none(client: Client) -> None:
    assert await show_budget(client, f"nobody-{uuid.uuid4().hex[:6]}") is None
    with pytest.raises(ValueError, match="invalid budget key"):
        await show_budget(client, "no spaces allowed")


async def test_ledger_continues_as_new_with_reservations_held(client: Client) -> None:
    queue, key = f"q-{uuid.uuid4().hex[:8]}", f"team-{uuid.uuid4().hex[:6]}"
    async with worker(client, queue):
        await set_budget(client, key, BudgetLimits(tokens=100_000), task_queue=queue)
        handle = client.get_workflow_handle(budget_workflow_id(key))
        first_run = (await handle.describe()).run_id
        for run in ("held-1", "held-2"):
            assert (await reserve(client, key, run, 1, 1000)).granted
        for i in range(30):  # enough events for the suggestion (40 events)
            run = f"spender-{i}"
            assert (await reserve(client, key, run, 1, 10)).granted
            await handle.signal("settle", SettleRequest(run=run, step=1,
                                                        amount=Amount(tokens=10)))
        view = await wait_for(client, key, lambda v: v.spent.tokens == 300)
        assert (await handle.describe()).run_id != first_run, "no continue-as-new happened"
        assert [h.run for h in view.holders] == ["held-1", "held-2"]
        assert view.reserved.tokens == 2000


async def test_reservations_of_closed_runs_are_released(client: Client,
                                                       tmp_path: Path) -> None:
    queue, key = f"q-{uuid.uuid4().hex[:8]}", f"team-{uuid.uuid4().hex[:6]}"
    async with worker(client, queue):
        await set_budget(client, key, BudgetLimits(tokens=1000), task_queue=queue,
                         reap_seconds=0.5)
        # No workflow has this id: a run that was terminated and cleaned up.
        assert (await reserve(client, key, f"gone-{uuid.uuid4().hex[:6]}", 1, 900)).granted
        view = await wait_for(client, key, lambda v: not v.holders)
        assert view.left.tokens == 1000
