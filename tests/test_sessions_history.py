"""A session's history: continue-as-new between turns changes nothing the model sees,
and history bytes grow linearly in turns (counted in bytes, never timed)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from temporalio.client import Client

import boundloop
from bench.harness import Model
from bench.sessions import increments, session_growth
from boundloop.core.reasons import StopReason
from boundloop.scripted.server import ScriptedModelServer
from boundloop.testing import free_port
from tests.conftest import RUN_TIMEOUT, continue_as_new_server, workflow_task_failures
from tests.conftest import test_worker as make_worker
from tests.scripts import call, resp
from tests.test_sessions import answer

TURNS = 4


@pytest_asyncio.fixture(scope="module")
async def low_threshold(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Client]:
    async with continue_as_new_server(
            tmp_path_factory.mktemp("session-can") / "temporal.db", 12) as client:
        yield client


def script() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for n in range(1, TURNS + 1):
        out += [resp(call("lookup_stock", {"sku": f"A-{n:03d}"}, f"c{n}"), rid=f"r{n}"),
                answer(f"A-{n:03d} checked", f"msg_{n}")]
    return out


async def converse(client: Client, tmp_path: Path) -> tuple[list[Any], list[str], str]:
    """Run the script as a TURNS-turn session; the model's inputs, the session's runs."""
    server = ScriptedModelServer(script())
    queue = f"scan-{uuid.uuid4().hex[:8]}"
    try:
        async with make_worker(client, queue, server.start(), tmp_path / "data"):
            session = await boundloop.start_session(
                client, tools=["lookup_stock"], model="scripted-model", task_queue=queue)
            for n in range(1, TURNS + 1):
                result = await asyncio.wait_for(session.say(f"turn {n}"), RUN_TIMEOUT)
                assert result.reason == StopReason.COMPLETED
            shown = await asyncio.wait_for(session.show(), RUN_TIMEOUT)
            assert shown.turns == TURNS and shown.tool_executions == TURNS
            await asyncio.wait_for(session.end(), RUN_TIMEOUT)
            runs = [wf.run_id async for wf in client.list_workflows(
                f"WorkflowId = '{session.id}'")]
            assert await workflow_task_failures(session.handle, client) == 0
    finally:
        server.stop()
    assert server.violations == []
    return [r.body["input"] for r in server.requests], runs, session.id


async def test_continue_as_new_between_turns_is_invisible_to_the_model(
        low_threshold: Client, temporal: Client, tmp_path: Path) -> None:
    inputs, runs, _ = await converse(low_threshold, tmp_path / "low")
    assert len(runs) > 1, "the low threshold should have made the session continue as new"
    expected, plain_runs, _ = await converse(temporal, tmp_path / "plain")
    assert len(plain_runs) == 1
    assert inputs == expected


async def test_history_bytes_of_a_20_turn_session_grow_linearly(
        temporal: Client, tmp_path: Path) -> None:
    model = Model(free_port())
    model.fresh()
    queue = f"grow-{uuid.uuid4().hex[:8]}"

    def feed(n: int) -> None:
        model.feed([model.call("lookup_stock", {"sku": f"A-{n:03d}"}), model.answer()])
    try:
        async with make_worker(temporal, queue, model.base_url, tmp_path / "data"):
            rows = await session_growth(temporal, queue, "scripted-model", 20, feed,
                                        seconds=RUN_TIMEOUT)
    finally:
        model.stop()
    history = increments(rows, "history")
    conversation = increments(rows, "conversation")
    # Each turn adds the same conversation bytes; a turn that wrote the conversation so
    # far into history again would add that whole conversation to its increment.
    assert rows[-1]["conversation"] > 15 * conversation[1]
    assert max(history[1:]) - min(history[1:]) < conversation[1], history
