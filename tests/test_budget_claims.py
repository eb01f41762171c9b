"""Only the runs a budget ledger granted spend it. Tried from the least-trusted side (a
client with namespace access: it starts workflows, sends raw signals and updates, reuses
workflow ids, starts a ledger with a retry policy or a cron schedule), against a real
worker, a real dev server and the scripted model server:

- a forged `settle` sent before a run starts does not exempt the run from the limits;
- a forged `settle` of a run that holds nothing charges nothing (the budget stays usable);
- a third party's settle or release of a run's open reservation changes nothing;
- a ledger keeps only the state its own continue-as-new carried: not a start input's,
  not the one a retry or a cron schedule hands its next run;
- 100 concurrent reservations, settlements and releases across continue-as-new: none is
  aborted, lost or counted twice, and the ledger's workflow task never fails.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from pydantic import BaseModel, ConfigDict
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.common import RetryPolicy
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

import boundloop
from boundloop import Plugin
from boundloop.activities.budget import send_update
from boundloop.budgets import set_budget, show_budget
from boundloop.contracts import (
    BUDGET_WORKFLOW,
    WORKFLOW_NAME,
    BudgetView,
    LedgerInput,
    ReleaseRequest,
    ReserveRequest,
    RunInput,
    RunResult,
    SettleRequest,
    budget_workflow_id,
)
from boundloop.core import budget
from boundloop.core.budget import Amount, BudgetLimits, Grant, LedgerState, Reservation
from boundloop.core.limits import Limits, Policy, Price, RunSettings
from boundloop.scripted.server import ScriptedModelServer
from boundloop.workflows.budget import (
    LEDGER_CLAIMS,
    SIGNED_LIMITS,
    BudgetLedgerWorkflow,
)
from tests.conftest import DEMO_TOOLS, continue_as_new_server, workflow_task_failures
from tests.conftest import test_worker as worker_for
from tests.scripts import answer, call, resp
from tests.support.tools import tools as test_tools
from tests.test_budget_ledger import worker as ledger_worker

#: Bound of every wait (seconds); none is an assertion on time.
WAIT = 60.0
MODEL = "scripted-model"
#: 1 USD per output token, inputs free: a request's worst case is MAX_OUT USD.
PRICES = {MODEL: Price(input_usd_per_mtok=0.0, output_usd_per_mtok=1_000_000.0)}
MAX_OUT = 50
DAY = "2026-12-01"


@pytest_asyncio.fixture(scope="module")
async def client(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Client]:
    """A dev server that suggests continue-as-new after 40 events (and starts a workflow
    id's next run at once)."""
    async with continue_as_new_server(
            tmp_path_factory.mktemp("claims") / "temporal.db", 40) as client:
        yield client


def names() -> tuple[str, str]:
    return f"q-{uuid.uuid4().hex[:8]}", f"team-{uuid.uuid4().hex[:6]}"


def usage(output: int) -> dict[str, int]:
    return {"input_tokens": 100, "output_tokens": output, "total_tokens": 100 + output}


async def start_run(client: Client, queue: str, key: str, run_id: str) -> boundloop.Run:
    """A run with the id `run_id` (known to whoever forges messages about it)."""
    settings = RunSettings(model=MODEL, limits=Limits(max_output_tokens=MAX_OUT, max_steps=3),
                           policy=Policy(prices=PRICES), budget=key)
    await client.start_workflow(
        WORKFLOW_NAME, RunInput(question="在庫を調べて", settings=settings, tools=DEMO_TOOLS),
        id=run_id, task_queue=queue, result_type=RunResult)
    return await boundloop.get_run(client, run_id)


async def wait_view(client: Client, key: str, check: Callable[[BudgetView], bool],
                    what: str) -> BudgetView:
    async def poll() -> BudgetView:
        while True:
            view = await show_budget(client, key)
            if view is not None and check(view):
                return view
            await asyncio.sleep(0.1)
    try:
        return await asyncio.wait_for(poll(), WAIT)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for the ledger: {what}") from None


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    async def poll() -> None:
        while not await check():
            await asyncio.sleep(0.1)
    try:
        await asyncio.wait_for(poll(), WAIT)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def test_a_forged_settle_before_a_run_starts_does_not_exempt_it(
        client: Client, tmp_path: Path) -> None:
    """`settle {run: R, step: 1000000, amount: {}}` before R starts: R's reservations
    are still checked (step 2 does not fit: budget_limit) and charged. Before the fix R
    completed over budget and the ledger's spent total stayed 0."""
    queue, key = names()
    run_id = f"forged-{uuid.uuid4().hex[:12]}"
    server = ScriptedModelServer([resp(call("lookup_stock", {"sku": "A-001"}, "c1"),
                                       usage=usage(20)),
                                  answer("在庫は12個です。", usage=usage(20))])
    base_url = server.start()
    try:
        async with worker_for(client, queue, base_url, tmp_path / "data"):
            await set_budget(client, key, BudgetLimits(usd=60), task_queue=queue)
            ledger = client.get_workflow_handle(budget_workflow_id(key))
            await ledger.signal(BudgetLedgerWorkflow.settle, SettleRequest(
                run=run_id, step=1_000_000, amount=Amount()))
            result = await asyncio.wait_for(
                (await start_run(client, queue, key, run_id)).result(), WAIT)
            view = await wait_view(client, key, lambda v: not v.holders, "the release")
    finally:
        server.stop()
    assert (result.reason, result.steps) == ("budget_limit", 1)
    assert result.text.startswith(f"budget {key!r} refused step 2: USD budget 60")
    assert len(server.requests) == 1
    assert (view.spent.usd, view.reserved.usd) == (20.0, 0.0)


async def test_a_forged_settle_of_a_run_holding_nothing_charges_nothing(
        client: Client, tmp_path: Path) -> None:
    """`settle {run: "fake", step: 1, amount: {usd: 1e9}}` (a signal) and the same as an
    update: nothing is spent, and a real run completes. Before the fix the ledger spent
    $1e9 and refused every run for good."""
    queue, key = names()
    server = ScriptedModelServer([answer("在庫があります。", usage=usage(20))])
    base_url = server.start()
    forged = SettleRequest(run="fake", step=1, amount=Amount(usd=1e9, tokens=10**12))
    try:
        async with worker_for(client, queue, base_url, tmp_path / "data"):
            await set_budget(client, key, BudgetLimits(usd=100), task_queue=queue)
            ledger = client.get_workflow_handle(budget_workflow_id(key))
            await ledger.signal(BudgetLedgerWorkflow.settle, forged)
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await ledger.execute_update(BudgetLedgerWorkflow.settle_reservation, forged)
            assert "no open reservation of step 1" in str(refused.value.cause)
            result = await asyncio.wait_for(
                (await start_run(client, queue, key, f"real-{uuid.uuid4().hex[:12]}")
                 ).result(), WAIT)
            view = await wait_view(client, key, lambda v: not v.holders, "the release")
    finally:
        server.stop()
    assert result.reason == "completed"
    assert (view.spent.usd, view.refused) == (20.0, 0)


async def test_a_third_party_cannot_settle_or_release_a_runs_open_reservation(
        client: Client, tmp_path: Path) -> None:
    """While a run's request is in flight, a settle of its step for nothing and a release
    of the run (signals and updates, with no token or a made-up one) change nothing: the
    run's own settlement charges what its request cost."""
    queue, key = names()
    run_id = f"held-{uuid.uuid4().hex[:12]}"
    server = ScriptedModelServer([answer("在庫があります。", usage=usage(20),
                                         delay_seconds=3.0)])
    base_url = server.start()
    made_up = "0" * 32
    try:
        async with worker_for(client, queue, base_url, tmp_path / "data"):
            await set_budget(client, key, BudgetLimits(usd=100), task_queue=queue,
                             reap_seconds=3600)
            ledger = client.get_workflow_handle(budget_workflow_id(key))
            run = await start_run(client, queue, key, run_id)
            await wait_view(client, key, lambda v: bool(v.holders), "the reservation")
            for token in (None, made_up):
                nothing = SettleRequest(run=run_id, step=1, amount=Amount(), token=token)
                await ledger.signal(BudgetLedgerWorkflow.settle, nothing)
                await ledger.signal(BudgetLedgerWorkflow.release,
                                    ReleaseRequest(run=run_id, token=token))
                for update, arg in ((BudgetLedgerWorkflow.settle_reservation, nothing),
                                    (BudgetLedgerWorkflow.release_reservation,
                                     ReleaseRequest(run=run_id, token=token))):
                    with pytest.raises(WorkflowUpdateFailedError) as refused:
                        await ledger.execute_update(update, arg)  # type: ignore[arg-type]
                    assert "not the token the reservation was made with" in str(
                        refused.value.cause)
            await ledger.signal(BudgetLedgerWorkflow.release, run_id)
            # A reservation that does not match the held one is refused, not swapped in.
            smaller = await ledger.execute_update(BudgetLedgerWorkflow.reserve, ReserveRequest(
                run=run_id, step=2, amount=Amount(usd=1), token=made_up))
            assert not smaller.granted and "already holds a reservation" in smaller.message
            held = await show_budget(client, key)
            assert held is not None
            assert [(h.run, h.step, h.amount.usd) for h in held.holders] == [
                (run_id, 1, MAX_OUT)]
            assert held.spent.usd == 0.0
            result = await asyncio.wait_for(run.result(), WAIT)
            view = await wait_view(client, key, lambda v: not v.holders, "the release")
    finally:
        server.stop()
    assert result.reason == "completed"
    assert view.spent.usd == result.cost_usd == 20.0
    # The run settled and released by its activities, and its history replays.
    history = await run.handle.fetch_history()
    activities = [e.activity_task_scheduled_event_attributes.activity_type.name
                  for e in history.events if e.event_type
                  == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
    assert [a for a in activities if a.startswith("budget_")] == [
        "budget_reserve", "budget_settle", "budget_release"]
    replayer = Replayer(workflows=[], data_converter=pydantic_data_converter,
                        plugins=[Plugin(test_tools, deps=None)])
    assert (await replayer.replay_workflow(history)).replay_failure is None


FORGED = LedgerState(
    key="placeholder", limits=BudgetLimits(usd=1e9), spent=Amount(usd=1e9, tokens=10**9),
    reservations={"squatter": Reservation(run="squatter", step=1, amount=Amount(usd=5))},
    settled={"exempt": 1_000_000}, refused=7)


def forged(key: str) -> LedgerInput:
    return LedgerInput(state=FORGED.model_copy(update={"key": key}))


def is_empty(view: BudgetView | None) -> bool:
    return (view is not None and view.limits is None and view.spent == Amount()
            and view.holders == [] and view.refused == 0)


async def test_a_ledger_started_by_anyone_begins_empty(client: Client) -> None:
    """A ledger started (an id reused after a terminate) with spent, settled runs and
    reservations in its input: it starts with none of them. Before the fix it kept all
    but the limits."""
    queue, key = names()
    async with ledger_worker(client, queue):
        handle = await client.start_workflow(BUDGET_WORKFLOW, forged(key),
                                             id=budget_workflow_id(key), task_queue=queue)
        await handle.terminate("an operator's mistake")
        await client.start_workflow(BUDGET_WORKFLOW, forged(key),
                                    id=budget_workflow_id(key), task_queue=queue)
        assert is_empty(await show_budget(client, key))
        await set_budget(client, key, BudgetLimits(usd=10), task_queue=queue)
        # The forged settled step exempts nothing: checked against the limits.
        grant = await client.get_workflow_handle(budget_workflow_id(key)).execute_update(
            BudgetLedgerWorkflow.reserve, ReserveRequest(run="exempt", step=1,
                                                         amount=Amount(usd=11)))
        assert not grant.granted and "USD budget 10" in grant.message


@pytest.mark.parametrize("how", ["retry", "cron"])
async def test_a_ledger_run_handed_its_start_input_again_keeps_none_of_it(
        client: Client, how: str) -> None:
    """A retry policy or a cron schedule hands the next run the start input again, with a
    `continued_run_id` as a continue-as-new would: the ledger keeps none of it (limits
    included). Before the fix that run took the forged limits, spent and reservations."""
    queue, key = names()
    options: dict[str, Any] = {"run_timeout": timedelta(seconds=2)}
    if how == "retry":
        options["retry_policy"] = RetryPolicy(initial_interval=timedelta(seconds=1),
                                              maximum_attempts=2)
    else:
        options["cron_schedule"] = "@every 1s"
    async with ledger_worker(client, queue):
        handle = await client.start_workflow(BUDGET_WORKFLOW, forged(key),
                                             id=budget_workflow_id(key), task_queue=queue,
                                             **options)
        first = handle.first_execution_run_id

        async def next_run_answers() -> bool:
            desc = await client.get_workflow_handle(budget_workflow_id(key)).describe()
            return desc.run_id != first and desc.raw_description.workflow_execution_info \
                .HasField("start_time") and await show_budget(client, key) is not None

        await until(next_run_answers, "the next run")
        desc = await client.get_workflow_handle(budget_workflow_id(key)).describe()
        assert desc.run_id != first
        assert is_empty(await show_budget(client, key))
        await client.get_workflow_handle(budget_workflow_id(key)).terminate("done")


async def test_a_hundred_concurrent_reservations_across_continue_as_new(
        client: Client) -> None:
    """100 runs reserve, settle and release at once, as their activities do (through
    `send_update`), on a ledger that continues as new every 40 events: none fails or is
    lost, spent is exactly what they settled, and no workflow task of the ledger failed.
    Before the fix settlements were signals: one racing a continue-as-new failed that
    workflow task (unhandled command), which failed every update it carried (measured: 9
    failed tasks, 19 updates failed); and past the server's 10 updates in flight per
    workflow the rest were refused or aborted until the client's retries ran out."""
    queue, key = names()
    runs = 100
    async with ledger_worker(client, queue):
        await set_budget(client, key, BudgetLimits(tokens=100 * runs), task_queue=queue)
        ledger = client.get_workflow_handle(budget_workflow_id(key))
        first = (await ledger.describe()).run_id

        async def run(i: int) -> Grant:
            name, token = f"run-{i}", uuid.uuid4().hex
            grant: Grant = await send_update(
                ledger, BudgetLedgerWorkflow.reserve,
                ReserveRequest(run=name, step=1, amount=Amount(tokens=100), token=token),
                f"{name}/step-1/reserve", Grant)
            assert grant.granted, grant.message
            await send_update(
                ledger, BudgetLedgerWorkflow.settle_reservation,
                SettleRequest(run=name, step=1, amount=Amount(tokens=i + 1), token=token),
                f"{name}/step-1/settle")
            await send_update(ledger, BudgetLedgerWorkflow.release_reservation,
                              ReleaseRequest(run=name, token=token), f"{name}/release")
            return grant

        grants = await asyncio.wait_for(asyncio.gather(*(run(i) for i in range(runs))), WAIT)
        view = await show_budget(client, key)
        failed, continued, run_id = 0, 0, first
        while run_id:  # every run of the ledger, first to latest
            history = client.get_workflow_handle(budget_workflow_id(key), run_id=run_id)
            run_id = ""
            async for event in history.fetch_history_events():
                failed += event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
                if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
                    continued += 1
                    run_id = event.workflow_execution_continued_as_new_event_attributes \
                        .new_execution_run_id
    assert len(grants) == runs
    assert view is not None
    assert view.spent.tokens == sum(i + 1 for i in range(runs))
    assert (view.reserved.tokens, view.holders, view.refused) == (0, [], 0)
    assert (await ledger.describe()).run_id != first and continued > 0
    assert failed == 0


@workflow.defn(name=BUDGET_WORKFLOW, sandboxed=False)
class LedgerOfBeforeClaims(BudgetLedgerWorkflow):
    """The ledger as a worker of before LEDGER_CLAIMS ran it: the same commands (it never
    asked the patch), the rules of then."""

    @workflow.init
    def __init__(self, inp: LedgerInput) -> None:
        self._inp, self._state = inp, inp.state
        self._claims, self._upgrade = False, False
        self._irregular = None  # (the check of a ledger's start options came later)
        if workflow.info().continued_run_id is None and workflow.patched(SIGNED_LIMITS):
            self._state = inp.state.model_copy(update={"limits": None})

    @workflow.run
    async def run(self, inp: LedgerInput) -> None:
        await super().run(inp)


async def test_a_ledger_of_before_claims_moves_to_them_at_a_new_runs_first_message(
        client: Client) -> None:
    """A deploy: a ledger open on a worker of before claims (a run's reservation without a
    token, a forged settle of the old rules) is picked up by a worker of now. It replays
    (no failed workflow task), keeps its rules for what it holds (the old run settles by
    its run id), and the first reservation with a token makes it continue as new under
    the claims: the forged settled step no longer waves a reservation through."""
    queue, key = names()
    ledger = client.get_workflow_handle(budget_workflow_id(key))
    async with ledger_worker(client, queue, LedgerOfBeforeClaims):
        await set_budget(client, key, BudgetLimits(tokens=1000), task_queue=queue)
        first = (await ledger.describe()).run_id
        assert (await ledger.execute_update(BudgetLedgerWorkflow.reserve, ReserveRequest(
            run="old-run", step=1, amount=Amount(tokens=100)))).granted
        await ledger.signal(BudgetLedgerWorkflow.settle, SettleRequest(
            run="victim", step=1_000_000, amount=Amount()))
        await wait_view(client, key, lambda v: len(v.holders) == 1, "the old reservation")
    async with ledger_worker(client, queue):
        grant = await ledger.execute_update(BudgetLedgerWorkflow.reserve, ReserveRequest(
            run="new-run", step=1, amount=Amount(tokens=100), token="1" * 32))
        assert grant.granted

        async def continued() -> bool:
            return (await ledger.describe()).run_id != first
        await until(continued, "the continue-as-new onto the claims")
        await ledger.signal(BudgetLedgerWorkflow.settle, SettleRequest(
            run="old-run", step=1, amount=Amount(tokens=40)))
        await ledger.execute_update(BudgetLedgerWorkflow.settle_reservation, SettleRequest(
            run="new-run", step=1, amount=Amount(tokens=60), token="1" * 32))
        view = await wait_view(client, key, lambda v: not v.holders, "both settlements")
        victim = await ledger.execute_update(BudgetLedgerWorkflow.reserve, ReserveRequest(
            run="victim", step=1, amount=Amount(tokens=10**6), token="2" * 32))
        markers: list[str] = []
        async for event in client.get_workflow_handle(
                budget_workflow_id(key), run_id=(await ledger.describe()).run_id
        ).fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
                markers.append(str(event.marker_recorded_event_attributes))
    assert view.spent.tokens == 100 and view.limits is not None
    assert not victim.granted
    assert any(LEDGER_CLAIMS in m for m in markers), markers
    assert await workflow_task_failures(ledger, client) == 0


class ReserveOfBefore(BaseModel):
    """The reservation message of before the tokens: an extra field is refused."""

    model_config = ConfigDict(extra="forbid")

    run: str
    step: int
    amount: Amount
    priced: bool = True


@workflow.defn(name=BUDGET_WORKFLOW, sandboxed=False)
class LedgerOfBeforeTokens:
    """A ledger as a worker of before the tokens serves it (a rolling deploy without
    versioning): the reserve update, the settle and release signals, no other update."""

    @workflow.init
    def __init__(self, inp: LedgerInput) -> None:
        self._state = inp.state

    @workflow.run
    async def run(self, inp: LedgerInput) -> None:
        await workflow.wait_condition(lambda: False)

    @workflow.update
    def set_limits(self, limits: BudgetLimits) -> BudgetView:
        self._state.limits = limits
        return self.show()

    @workflow.update
    def reserve(self, req: ReserveOfBefore) -> Grant:
        return budget.reserve(self._state, req.run, req.step, req.amount, DAY,
                              priced=req.priced)

    @workflow.signal
    def settle(self, req: SettleRequest) -> None:
        budget.settle(self._state, req.run, req.step, req.amount, DAY)

    @workflow.signal
    def release(self, run: str) -> None:
        budget.release(self._state, run)

    @workflow.query
    def show(self) -> BudgetView:
        s = self._state
        return BudgetView(key=s.key, limits=s.limits, period=s.period, spent=s.spent,
                          reserved=budget.reserved(s), left=budget.left(s),
                          holders=list(s.reservations.values()), refused=s.refused)


async def test_a_run_of_now_spends_from_a_ledger_of_before_the_tokens(
        client: Client, tmp_path: Path) -> None:
    """A rolling deploy without versioning: a run of now reserves, settles and releases on
    a ledger still served by a worker of before (it refuses the token, knows no settle or
    release update): the run reserves without a token and settles and releases by the
    signals that ledger knows. It completes, charged what it cost."""
    ledger_queue, key = names()
    queue = f"q-{uuid.uuid4().hex[:8]}"
    server = ScriptedModelServer([answer("在庫があります。", usage=usage(20))])
    base_url = server.start()
    try:
        async with ledger_worker(client, ledger_queue, LedgerOfBeforeTokens), \
                worker_for(client, queue, base_url, tmp_path / "data"):
            await set_budget(client, key, BudgetLimits(usd=100), task_queue=ledger_queue)
            run = await start_run(client, queue, key, f"rolling-{uuid.uuid4().hex[:12]}")
            result = await asyncio.wait_for(run.result(), WAIT)
            view = await wait_view(client, key, lambda v: v.spent.usd > 0 and not v.holders,
                                   "the settlement and the release")
    finally:
        server.stop()
    assert result.reason == "completed"
    assert view.spent.usd == result.cost_usd == 20.0
