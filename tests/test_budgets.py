"""Shared budgets with real runs on a real dev server: concurrent runs against one small
budget, a refusal before the request is sent, prices a USD budget needs, a cancelled
run's reservation released, and a worker process killed while runs reserve.

The USD figures use a price of 0 per input token and 1 USD per output token: a request's
worst case is then exactly `max_output_tokens` USD whatever the conversation's bytes, so
the tests can say which reservation fits.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

import boundloop
from boundloop import search_attributes as sa
from boundloop.budgets import set_budget, show_budget
from boundloop.contracts import (
    BUDGET_WORKFLOW,
    WORKFLOW_NAME,
    BudgetView,
    LedgerInput,
    RunInput,
    RunResult,
    budget_workflow_id,
)
from boundloop.core.budget import BudgetLimits, LedgerState
from boundloop.core.limits import Limits, Policy, Price, RunSettings
from boundloop.devserver import FAST_FLAGS, temporal_binary
from boundloop.scripted.server import ScriptedModelServer
from tests.conftest import DEMO_TOOLS, workflow_task_failures
from tests.conftest import test_worker as worker_for
from tests.scripts import answer, call, chat, resp
from tests.test_cli import cli, env_for
from tests.test_crash import cluster

#: Bound of every wait (seconds); none is an assertion on time.
WAIT = 60.0
MODEL = "scripted-model"
#: 1 USD per output token, inputs free: a request's worst case is max_output_tokens USD.
PRICES = {MODEL: Price(input_usd_per_mtok=0.0, output_usd_per_mtok=1_000_000.0)}
MAX_OUT = 50


@pytest_asyncio.fixture(scope="module")
async def client(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Client]:
    """A dev server that suggests continue-as-new after 40 events: the ledger does it
    many times while runs hold reservations."""
    db = tmp_path_factory.mktemp("budgets") / "temporal.db"
    env = await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter, dev_server_existing_path=temporal_binary(),
        dev_server_database_filename=str(db), search_attributes=sa.ALL,
        dev_server_extra_args=[
            *FAST_FLAGS, "--dynamic-config-value", "limit.historyCount.suggestContinueAsNew=40"])
    try:
        yield env.client
    finally:
        await env.shutdown()


def names() -> tuple[str, str]:
    return f"q-{uuid.uuid4().hex[:8]}", f"team-{uuid.uuid4().hex[:6]}"


async def start(client: Client, queue: str, key: str, *, priced: bool = True,
                question: str = "在庫を調べて") -> boundloop.Run:
    return await boundloop.start(
        client, question, tools=DEMO_TOOLS, model=MODEL,
        limits=Limits(max_output_tokens=MAX_OUT, max_steps=3),
        policy=Policy(prices=PRICES if priced else {}), task_queue=queue, budget=key)


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


def usage(output: int) -> dict[str, int]:
    return {"input_tokens": 100, "output_tokens": output, "total_tokens": 100 + output}


async def test_refused_reservation_stops_the_run_before_the_request(client: Client,
                                                                   tmp_path: Path) -> None:
    """Step 1 reserves 50 of 60 USD and spends 20; step 2's 50 does not fit the 40 left:
    the run stops with `budget_limit`, the second request never reaches the model."""
    queue, key = names()
    server = ScriptedModelServer([resp(call("lookup_stock", {"sku": "A-001"}, "c1"),
                                       usage=usage(20)), answer("never asked")])
    base_url = server.start()
    try:
        async with worker_for(client, queue, base_url, tmp_path / "data"):
            await set_budget(client, key, BudgetLimits(usd=60), task_queue=queue)
            run = await start(client, queue, key)
            result = await asyncio.wait_for(run.result(), WAIT)
            view = await wait_view(client, key, lambda v: not v.holders, "the release")
    finally:
        server.stop()
    assert (result.reason, result.steps, result.tool_executions) == ("budget_limit", 1, 1)
    assert result.text.startswith(f"budget {key!r} refused step 2: USD budget 60")
    assert [e.event for e in result.events][-2:] == ["budget_refused", "stopped:budget_limit"]
    assert len(server.requests) == 1
    assert server.requests[0].body["max_output_tokens"] == MAX_OUT
    assert server.violations == []
    assert (view.spent.usd, view.reserved.usd, view.refused) == (20.0, 0.0, 1)
    assert await workflow_task_failures(run.handle) == 0


async def test_events_as_they_appear_never_show_the_request_a_budget_refused(
        client: Client, tmp_path: Path) -> None:
    """What `run --wait` prints and `Run.events()` yields, read while the step waits for
    its reservation (the ledger's worker is away, so the status shows the step's
    model_requested); the ledger then refuses it. The events yielded are the run's own
    log: budget_refused, and no request that was never sent (before: model_requested
    yielded, budget_refused never)."""
    from boundloop.client import follow

    ledger_queue, key = names()
    queue = f"q-{uuid.uuid4().hex[:8]}"
    server = ScriptedModelServer([answer("never asked")])
    base_url = server.start()
    yielded: list[Any] = []
    reserving = asyncio.Event()

    async def read(run: boundloop.Run) -> None:
        async for status, new in follow(run.handle, interval=0.05):
            yielded.extend(new)
            if status.events and status.events[-1].event == "model_requested":
                reserving.set()
    try:
        async with worker_for(client, ledger_queue, base_url, tmp_path / "ledger"):
            await set_budget(client, key, BudgetLimits(usd=1), task_queue=ledger_queue)
        async with worker_for(client, queue, base_url, tmp_path / "data"):
            run = await start(client, queue, key)  # needs up to 50 USD of 1
            reader = asyncio.create_task(read(run))
            await asyncio.wait_for(reserving.wait(), WAIT)
            async with worker_for(client, ledger_queue, base_url, tmp_path / "ledger"):
                result = await asyncio.wait_for(run.result(), WAIT)
                await asyncio.wait_for(reader, WAIT)
    finally:
        server.stop()
    assert result.reason == "budget_limit"
    assert [e.event for e in yielded] == [e.event for e in result.events] == [
        "run_started", "budget_refused", "stopped:budget_limit"]
    assert server.requests == []


async def test_usd_budget_refuses_a_model_without_a_price(client: Client,
                                                         tmp_path: Path) -> None:
    queue, key = names()
    server = ScriptedModelServer([answer("never asked")])
    base_url = server.start()
    try:
        async with worker_for(client, queue, base_url, tmp_path / "data"):
            await set_budget(client, key, BudgetLimits(usd=5, tokens=100_000),
                             task_queue=queue)
            result = await asyncio.wait_for((await start(client, queue, key,
                                                         priced=False)).result(), WAIT)
    finally:
        server.stop()
    assert (result.reason, result.steps) == ("budget_limit", 0)
    assert "the run's model has no price" in result.text and key in result.text
    assert server.requests == []


async def test_a_budget_that_is_not_set_stops_the_run(client: Client, tmp_path: Path) -> None:
    queue, key = names()
    server = ScriptedModelServer([answer("never asked")])
    base_url = server.start()
    try:
        async with worker_for(client, queue, base_url, tmp_path / "data"):
            result = await asyncio.wait_for((await start(client, queue, key)).result(), WAIT)
    finally:
        server.stop()
    assert result.reason == "budget_limit"
    assert result.text == (f"budget {key!r} is not set: no ledger runs for it "
                           f"(boundloop budget set {key} --usd AMOUNT)")
    assert server.requests == []


def test_a_budget_needs_max_output_tokens_and_a_valid_key() -> None:
    with pytest.raises(ValueError, match=r"limits\.max_output_tokens is not set"):
        RunSettings(model=MODEL, budget="team-a")
    with pytest.raises(ValueError, match="budget"):
        RunSettings(model=MODEL, budget="no spaces", limits=Limits(max_output_tokens=10))


async def test_twenty_concurrent_runs_never_overspend_one_budget(client: Client,
                                                                tmp_path: Path) -> None:
    """20 runs at once against 200 USD (each request's worst case 50, each spends 20):
    spent stays within the budget plus one worst case, every refused run ends
    `budget_limit` before its request, the ledger's figures are the runs' own, and the
    ledger continued as new meanwhile with reservations held."""
    queue, key = names()
    runs = 20
    server = ScriptedModelServer([answer("在庫があります。", usage=usage(20),
                                         delay_seconds=0.3) for _ in range(runs)])
    base_url = server.start()
    try:
        async with worker_for(client, queue, base_url, tmp_path / "data"):
            await set_budget(client, key, BudgetLimits(usd=200, tokens=10**9),
                             task_queue=queue)
            ledger = client.get_workflow_handle(budget_workflow_id(key))
            first_run = (await ledger.describe()).run_id
            started = await asyncio.gather(*(start(client, queue, key) for _ in range(runs)))
            results: list[RunResult] = await asyncio.wait_for(
                asyncio.gather(*(r.result() for r in started)), WAIT)
            view = await wait_view(client, key, lambda v: not v.holders, "every release")
            ledger_run = (await ledger.describe()).run_id
    finally:
        server.stop()
    done = [r for r in results if r.reason == "completed"]
    refused = [r for r in results if r.reason != "completed"]
    assert done and refused
    assert view.spent.usd <= 200 + MAX_OUT
    assert view.spent.usd == sum(r.cost_usd or 0 for r in done)
    assert view.spent.tokens == sum(r.total_tokens for r in results)
    assert all(r.reason == "budget_limit" and r.steps == 0
               and r.text.startswith(f"budget {key!r} refused step 1") for r in refused)
    # Every refused run was counted (the counter is the ledger's own figure; a refusal
    # answered twice across a continue-as-new may count twice).
    assert view.refused >= len(refused)
    assert len(server.requests) == len(done)
    assert server.violations == []
    assert ledger_run != first_run, "the ledger never continued as new"


async def test_a_cancelled_run_releases_its_reservation(client: Client,
                                                       tmp_path: Path) -> None:
    queue, key = names()
    server = ScriptedModelServer([answer("never delivered", delay_seconds=WAIT)])
    base_url = server.start()
    try:
        async with worker_for(client, queue, base_url, tmp_path / "data"):
            # The ledger's own check for closed runs is far off: only the run's release
            # can free the reservation within the wait.
            await set_budget(client, key, BudgetLimits(usd=100), task_queue=queue,
                             reap_seconds=3600)
            run = await start(client, queue, key)
            held = await wait_view(client, key, lambda v: bool(v.holders), "the reservation")
            assert [(h.run, h.amount.usd) for h in held.holders] == [(run.id, MAX_OUT)]
            await asyncio.wait_for(_until(lambda: len(server.requests) == 1), WAIT)
            await run.cancel("enough")
            result = await asyncio.wait_for(run.result(), WAIT)
            view = await wait_view(client, key, lambda v: not v.holders, "the release")
    finally:
        server.stop()
    assert result.reason == "cancelled"
    # Released, and the request that reached the server charged its worst case (it may
    # have been answered: docs/guide.md, "Shared budgets").
    assert (view.reserved.usd, view.spent.usd, view.left.usd) == (0.0, MAX_OUT, 100.0 - MAX_OUT)


async def _until(check: Callable[[], bool]) -> None:
    while not check():
        await asyncio.sleep(0.05)


async def test_worker_killed_while_runs_reserve_loses_nothing(tmp_path: Path) -> None:
    """kill -9 the only worker (it runs the ledger, the runs and their reserve
    activities) while runs hold and take reservations; a new worker finishes them. No
    reservation is left behind and the ledger's spent figures are the runs' own."""
    runs = 6
    async with cluster(tmp_path) as c:
        assert c.client is not None
        key = f"team-{uuid.uuid4().hex[:6]}"
        for _ in range(runs * 3):  # answers for the attempts the kill loses, too
            c.model.append(answer("在庫があります。", usage=usage(20), delay_seconds=1.0))
        worker = c.start_worker()
        await asyncio.wait_for(set_budget(c.client, key, BudgetLimits(usd=120, tokens=10**9),
                                          task_queue=c.queue), WAIT)
        settings = RunSettings(model=MODEL, limits=Limits(max_output_tokens=MAX_OUT),
                               policy=Policy(prices=PRICES), budget=key)
        handles: list[Any] = []
        for i in range(runs):
            handles.append(await c.client.start_workflow(
                WORKFLOW_NAME, RunInput(question=f"在庫 {i}", settings=settings,
                                        tools=DEMO_TOOLS),
                id=f"crash-{uuid.uuid4().hex[:12]}", task_queue=c.queue,
                result_type=RunResult))
            if i == 1:
                await wait_view(c.client, key, lambda v: bool(v.holders), "a reservation")
                c.kill(worker)
                worker = c.start_worker()
        results = [await asyncio.wait_for(
                       (await boundloop.get_run(c.client, h.id)).result(), WAIT)
                   for h in handles]
        view = await wait_view(c.client, key, lambda v: not v.holders, "every release")
    assert {r.reason for r in results} <= {"completed", "budget_limit"}
    assert any(r.reason == "completed" for r in results)
    assert view.spent.usd == sum(r.cost_usd or 0 for r in results)
    assert view.spent.tokens == sum(r.total_tokens for r in results)
    assert view.spent.usd <= 120 + MAX_OUT
    for r in results:
        if r.reason == "budget_limit":
            assert r.steps == 0 and key in r.text


async def test_budget_commands_from_the_cli(client: Client, tmp_path: Path) -> None:
    """`boundloop budget set|show` and `run --budget` as a user types them; exit codes
    from the README's table."""
    queue, key = names()
    env = {**env_for(client, tmp_path), "BOUNDLOOP_TASK_QUEUE": queue}
    server = ScriptedModelServer([])
    try:
        async with worker_for(client, queue, server.start(), tmp_path / "data"):
            code, out, err = await cli("budget", "set", key, "--usd", "5", "--tokens",
                                       "2000000", env=env)
            assert code == 0, err
            assert out.splitlines()[0] == f"budget {key}: $5 · 2000000 tokens in total"
            code, out, err = await cli(
                "run", "A-001とB-002の在庫をそれぞれ調べて。", "--json", "--budget", key,
                "--max-output-tokens", "200", "--model", MODEL, "--policy", json.dumps(
                    {"prices": {MODEL: {"input_usd_per_mtok": 0.25,
                                        "output_usd_per_mtok": 2.0}}}), "--model-script",
                "examples/scripts/stock_two_skus.json", env=env)
            assert code == 0, err
            result = json.loads(out)
            code, out, err = await cli("budget", "show", key, "--json", env=env)
            assert code == 0, err
            view = json.loads(out)
            assert view["spent"]["tokens"] == result["total_tokens"] > 0
            assert view["spent"]["usd"] == pytest.approx(result["cost_usd"])
            assert view["holders"] == [] and view["reserved"]["tokens"] == 0
            code, out, _ = await cli("budget", "show", key, env=env)
            spent = f"  spent     ${result['cost_usd']:.6f} · {result['total_tokens']} tokens"
            assert code == 0 and spent in out.splitlines()
            missing = await cli("budget", "show", f"nobody-{key}", env=env)
            assert missing[0] == 2 and "no budget" in missing[2]
    finally:
        server.stop()
    bad = [await cli("budget", "set", "no spaces", "--usd", "5", env=env),
           await cli("budget", "set", key, env=env),
           await cli("budget", "set", key, "--usd", "-1", env=env),
           await cli("budget", "set", key, "--tokens", "5", "--period", "week", env=env),
           await cli("run", "hi", "--budget", key, env=env)]
    assert [c for c, _, _ in bad] == [2, 2, 2, 2, 2]
    assert "invalid budget key" in bad[0][2]
    assert "a USD amount, a token amount, or both" in bad[1][2]
    assert "max_output_tokens is not set" in bad[4][2]


async def test_chat_requests_carry_max_completion_tokens(client: Client,
                                                        tmp_path: Path) -> None:
    queue, key = names()
    server = ScriptedModelServer([chat("在庫があります。")])
    base_url = server.start()
    try:
        async with worker_for(client, queue, base_url, tmp_path / "data"):
            await set_budget(client, key, BudgetLimits(tokens=100_000), task_queue=queue)
            run = await boundloop.start(
                client, "在庫を調べて", tools=DEMO_TOOLS, model=MODEL, api="chat",
                limits=Limits(max_output_tokens=MAX_OUT), task_queue=queue, budget=key)
            result = await asyncio.wait_for(run.result(), WAIT)
            view = await wait_view(client, key, lambda v: v.spent.tokens > 0, "the settle")
    finally:
        server.stop()
    assert result.reason == "completed"
    assert server.requests[0].body["max_completion_tokens"] == MAX_OUT
    assert "max_output_tokens" not in server.requests[0].body
    assert server.violations == []
    assert view.spent.tokens == result.total_tokens


async def test_a_cancel_while_the_budget_reserves_leaves_no_step(client: Client,
                                                                tmp_path: Path) -> None:
    """The ledger's workflow is on a task queue no worker serves: the reservation waits.
    A cancel then ends the run `cancelled` with no step counted and no request sent."""
    queue, key = names()
    await client.start_workflow(
        BUDGET_WORKFLOW, LedgerInput(state=LedgerState(key=key, limits=BudgetLimits(usd=5))),
        id=budget_workflow_id(key), task_queue=f"nobody-{queue}")
    server = ScriptedModelServer([answer("never asked")])
    base_url = server.start()
    try:
        async with worker_for(client, queue, base_url, tmp_path / "data"):
            run = await start(client, queue, key)
            history = client.get_workflow_handle(run.id)

            async def reserving() -> bool:
                pending = (await history.describe()).raw_description.pending_activities
                return any(a.activity_type.name == "budget_reserve" and a.state
                           == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
                           for a in pending)

            async def until_reserving() -> None:
                while not await reserving():
                    await asyncio.sleep(0.1)

            await asyncio.wait_for(until_reserving(), WAIT)
            await run.cancel("stop waiting")
            result = await asyncio.wait_for(run.result(), WAIT)
    finally:
        server.stop()
    assert (result.reason, result.steps) == ("cancelled", 0)
    assert server.requests == []
