"""An agent built from `boundloop`'s public names only: tools, a worker, a run, an
approval and the RunResult (the scripted model stands in for a model's intelligence).

Arguments the model writes as JSON strings (dates, datetimes, UUIDs, enums, decimals,
nested models) reach the tools as their types; approval can be a predicate over them.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any

import openai
import pytest
from pydantic import BaseModel
from temporalio.client import Client
from temporalio.worker import Worker

import boundloop
from boundloop.scripted.server import ScriptedModelServer
from tests.scripts import answer, call, outputs, resp
from tests.support.own_workflow import UsersOwnWorkflow

WAIT = 60.0


@dataclass
class Ledger:
    """The tools' dependency: what they were called with (as the tool saw it)."""

    seen: list[tuple[str, Any]] = field(default_factory=list)


class Currency(StrEnum):
    EUR = "EUR"
    JPY = "JPY"


class Address(BaseModel):
    city: str
    postcode: str


tools = boundloop.Toolset[Ledger]()


@tools.tool(side_effects=True, needs_approval=lambda args: args.amount > Decimal("100"))
async def refund(ctx: boundloop.ToolContext[Ledger], order: uuid.UUID, amount: Decimal,
                 currency: Currency, when: datetime) -> dict[str, Any]:
    """Refund an order; refunds over 100 need a person's approval."""
    await asyncio.sleep(0)  # an async tool is awaited, not run in a thread
    ctx.deps.seen.append(("refund", (order, amount, currency, when, ctx.idempotency_key)))
    return {"refunded": str(amount), "currency": currency.value}


@tools.tool()
def ship(ctx: boundloop.ToolContext[Ledger], day: date, to: Address,
         note: str = "none") -> dict[str, Any]:
    """Ship on a day to an address (a note is optional)."""
    ctx.deps.seen.append(("ship", (day, to, note)))
    return {"day": day.isoformat(), "city": to.city}


ORDER = "3f2b8c1e-4a5d-4e6f-9a7b-1c2d3e4f5a6b"


async def test_public_api_defines_tools_runs_a_worker_approves_and_reads_the_result(
        temporal: Client) -> None:
    address = temporal.service_client.config.target_host
    client = await boundloop.connect(address)
    small = {"order": ORDER, "amount": "20.50", "currency": "EUR",
             "when": "2026-12-01T09:30:00Z"}
    big = {**small, "amount": 250, "currency": "JPY"}
    model = ScriptedModelServer([
        resp(call("refund", small, "c1"), call("ship", {"day": "2026-12-03", "to": {
            "city": "Osaka", "postcode": "530-0001"}}, "c2")),
        resp(call("refund", big, "c3")),
        answer("Done."),
    ])
    ledger = Ledger()
    queue = f"api-{uuid.uuid4().hex[:8]}"
    worker = boundloop.Worker(client, tools, deps=ledger, task_queue=queue,
                              model=openai.AsyncOpenAI(base_url=model.start(), api_key="sk-x"))
    try:
        async with worker:
            run = await boundloop.start(client, "refund and ship", tools=tools,
                                        model="scripted-model", task_queue=queue,
                                        limits=boundloop.Limits(max_steps=4))
            pending: list[boundloop.Approval] = []
            async with asyncio.timeout(WAIT):
                async for event in run.events():
                    if event.event == "approval_requested":
                        pending = await run.pending()
                        await run.approve(pending[0].call_id, approver="alice",
                                          args={**big, "amount": "120.00"})
            result = await asyncio.wait_for(run.result(), WAIT)
            # Idempotency keys are scoped by the run (its first execution run id).
            scope = f"{run.id}/{(await run.status()).run}"
    finally:
        model.stop()
    assert model.violations == []
    assert isinstance(result, boundloop.RunResult)
    assert result.reason == boundloop.StopReason.COMPLETED
    # Only the refund over 100 waited; its validated arguments are in JSON form.
    assert [(a.call_id, a.arguments["amount"]) for a in pending] == [("c3", "250")]
    when = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)
    assert ledger.seen == [
        ("refund", (uuid.UUID(ORDER), Decimal("20.50"), Currency.EUR, when,
                    f"{scope}/step-1/call-0")),
        ("ship", (date(2026, 12, 3), Address(city="Osaka", postcode="530-0001"), "none")),
        ("refund", (uuid.UUID(ORDER), Decimal("120.00"), Currency.JPY, when,
                    f"{scope}/step-2/call-0")),
    ]
    sent = outputs(model.requests[1].body)
    assert sent["c1"]["data"] == {"refunded": "20.50", "currency": "EUR"}
    assert sent["c2"]["data"] == {"day": "2026-12-03", "city": "Osaka"}


async def test_a_refused_decision_raises_decision_refused(temporal: Client) -> None:
    address = temporal.service_client.config.target_host
    client = await boundloop.connect(address)
    big = {"order": ORDER, "amount": "500", "currency": "EUR", "when": "2026-12-01T09:30:00Z"}
    model = ScriptedModelServer([resp(call("refund", big, "c1")), answer("Not refunded.")])
    queue = f"api-{uuid.uuid4().hex[:8]}"
    worker = boundloop.Worker(client, tools, deps=Ledger(), task_queue=queue,
                              model=openai.AsyncOpenAI(base_url=model.start(), api_key="sk-x"))
    try:
        async with worker:
            run = await boundloop.start(client, "refund", tools=[refund], model="scripted-model",
                                        task_queue=queue)
            async with asyncio.timeout(WAIT):
                while not await run.pending():
                    await asyncio.sleep(0.1)
            refused: list[str] = []
            for decide in (run.approve("no-such-call"),
                           run.approve("c1", args={**big, "amount": "3 euros"})):
                try:
                    await decide
                except boundloop.DecisionRefused as exc:
                    refused.append(str(exc))
            await run.reject("c1", reason="not this one", approver="bob")
            result = await asyncio.wait_for(run.result(), WAIT)
    finally:
        model.stop()
    assert len(refused) == 2
    assert "unknown call id" in refused[0] and "amount" in refused[1]
    assert "3 euros" not in refused[1]  # the problem, not the raw input
    assert result.reason == boundloop.StopReason.COMPLETED
    assert [e.event for e in result.events if e.event.startswith("approval_")] == [
        "approval_requested", "approval_rejected"]


async def test_plugin_adds_boundloop_to_a_worker_the_user_already_runs(
        temporal: Client) -> None:
    client = await boundloop.connect(temporal.service_client.config.target_host)
    model = ScriptedModelServer([resp(call("ship", {"day": "2026-12-03", "to": {
        "city": "Kobe", "postcode": "650-0001"}, "note": "fragile"}, "c1")), answer("Shipped.")])
    ledger = Ledger()
    queue = f"own-{uuid.uuid4().hex[:8]}"
    plugin = boundloop.Plugin(tools, deps=ledger,
                              model=openai.AsyncOpenAI(base_url=model.start(), api_key="sk-x"))
    try:
        async with Worker(client, task_queue=queue, workflows=[UsersOwnWorkflow],
                          plugins=[plugin]):
            own = await client.execute_workflow(UsersOwnWorkflow.run, "desk", id=f"own-{queue}",
                                                task_queue=queue)
            run = await boundloop.start(client, "ship it", tools=["ship"],
                                        model="scripted-model", task_queue=queue)
            result = await asyncio.wait_for(run.result(), WAIT)
    finally:
        model.stop()
    assert own == "hello desk"
    assert result.reason == boundloop.StopReason.COMPLETED
    assert ledger.seen == [("ship", (date(2026, 12, 3), Address(city="Kobe", postcode="650-0001"),
                                     "fragile"))]


async def test_a_client_without_the_pydantic_converter_is_refused(temporal: Client) -> None:
    plain = await Client.connect(temporal.service_client.config.target_host)
    with pytest.raises(boundloop.BoundloopError, match="pydantic data converter"):
        boundloop.Worker(plain, tools, deps=Ledger(), model=openai.AsyncOpenAI(api_key="x"),
                         task_queue=f"plain-{uuid.uuid4().hex[:8]}")


async def test_a_run_naming_tools_its_worker_lacks_fails_at_once(temporal: Client) -> None:
    client = await boundloop.connect(temporal.service_client.config.target_host)
    queue = f"api-{uuid.uuid4().hex[:8]}"
    async with boundloop.Worker(client, tools, deps=Ledger(), task_queue=queue,
                                model=openai.AsyncOpenAI(api_key="x", base_url="http://0.0.0.0:9")):
        run = await boundloop.start(client, "hi", tools=["ship", "teleport"],
                                    model="scripted-model", task_queue=queue)
        with pytest.raises(boundloop.UnknownTools, match=r"serves no tool named 'teleport' "
                           r"\(it serves: refund, ship\)"):
            await asyncio.wait_for(run.result(), WAIT)


async def test_cancel_ends_a_waiting_run_as_cancelled(temporal: Client) -> None:
    client = await boundloop.connect(temporal.service_client.config.target_host)
    big = {"order": ORDER, "amount": "500", "currency": "EUR", "when": "2026-12-01T09:30:00Z"}
    model = ScriptedModelServer([resp(call("refund", big, "c1"))])
    queue = f"api-{uuid.uuid4().hex[:8]}"
    ledger = Ledger()
    try:
        async with boundloop.Worker(client, tools, deps=ledger, task_queue=queue,
                                    model=openai.AsyncOpenAI(base_url=model.start(),
                                                             api_key="sk-x")):
            run = await boundloop.start(client, "refund", tools=tools, model="scripted-model",
                                        task_queue=queue)
            async with asyncio.timeout(WAIT):
                while not await run.pending():
                    await asyncio.sleep(0.1)
            await run.cancel()
            result = await asyncio.wait_for(run.result(), WAIT)
    finally:
        model.stop()
    assert result.reason == boundloop.StopReason.CANCELLED
    assert ledger.seen == []


def test_the_public_names_are_written_once_and_each_loads() -> None:
    """`boundloop.__all__` is the one list of public names; where each comes from is
    written once, in the imports type checkers read, and the lazy loading reads them."""
    import ast
    from pathlib import Path

    from boundloop import connection

    tree = ast.parse(Path(boundloop.__file__).read_text(encoding="utf-8"))
    [block] = [node for node in tree.body if isinstance(node, ast.If)
               and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"]
    imported = [alias.asname or alias.name for statement in block.body
                if isinstance(statement, ast.ImportFrom) for alias in statement.names]
    assert sorted(imported) == sorted(set(boundloop.__all__)) == sorted(boundloop.__all__)
    assert all(getattr(boundloop, name) is not None for name in boundloop.__all__)
    assert boundloop.connect is connection.connect  # one way to connect, for every process
    with pytest.raises(AttributeError, match="no attribute 'client_connect'"):
        boundloop.client_connect  # noqa: B018
