"""The weather desk's tests: its own tools, its own agent, a scripted model.

    cd examples/weather_desk && pytest -q test_desk.py
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2 as httpx
import pytest
import pytest_asyncio
from desk import Desk, agent
from temporalio.client import Client
from weather_service import start as start_weather_service

from boundloop.testing import AgentEnvironment, dev_server, responses

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def temporal() -> AsyncIterator[Client]:
    async with dev_server() as client:  # one dev server for the whole test session
        yield client


@pytest_asyncio.fixture(loop_scope="session")
async def desk(tmp_path: Path) -> AsyncIterator[Desk]:
    url, service = start_weather_service()
    async with httpx.AsyncClient(base_url=url) as weather:
        yield Desk(weather=weather, store=tmp_path / "warnings.sqlite3")
    service.shutdown()


async def test_a_warning_goes_out_once_approved(temporal: Client, desk: Desk) -> None:
    script = [
        responses.call("forecast", {"city": "Osaka", "day": "2026-12-03"}, "call_1"),
        responses.call("issue_warning", {"city": "Osaka", "day": "2026-12-03",
                                         "level": "red"}, "call_2", number=2),
        responses.answer("A red warning for Osaka is out.", number=3),
    ]
    async with AgentEnvironment(agent, deps=desk, script=script, client=temporal) as env:
        run = await env.start("Storm coming to Osaka on 2026-12-03?")
        waiting = await env.approve(run, approver="duty-officer")
        result = await env.result(run)
    assert (waiting.tool, waiting.arguments["level"]) == ("issue_warning", "red")
    assert (result.reason, result.tool_executions) == ("completed", 2)
    assert result.text == "A red warning for Osaka is out."
    with sqlite3.connect(desk.store) as db:
        assert db.execute("SELECT city, level FROM warnings").fetchall() == [("Osaka", "red")]
    # The model was shown the forecast the tool fetched from the weather service.
    assert "wind_kmh" in str(env.requests[1].body["input"])


async def test_a_rejected_warning_never_goes_out(temporal: Client, desk: Desk) -> None:
    script = [
        responses.call("issue_warning", {"city": "Kyoto", "day": "2026-12-03",
                                         "level": "yellow"}),
        responses.answer("No warning was issued.", number=2),
    ]
    async with AgentEnvironment(agent, deps=desk, script=script, client=temporal) as env:
        run = await env.start("Warn Kyoto.")
        await env.reject(run, reason="check the forecast first")
        result = await env.result(run)
    assert (result.reason, result.text) == ("completed", "No warning was issued.")
    assert not desk.store.exists()  # the tool never ran
    assert "check the forecast first" in str(env.requests[1].body["input"])


async def test_malformed_arguments_go_back_to_the_model(temporal: Client, desk: Desk) -> None:
    script = [responses.malformed_call("forecast", '{"city": "Osaka", "day": '),
              responses.answer("Which day?", number=2)]
    async with AgentEnvironment(agent, deps=desk, script=script, client=temporal) as env:
        result = await env.run("Osaka?")
    assert (result.reason, result.tool_executions) == ("completed", 0)
    assert "invalid" in str(env.requests[1].body["input"]).lower()
