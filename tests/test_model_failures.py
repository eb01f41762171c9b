"""A failed model request is named for the operator: kind, host and port, hint.

Real HTTP throughout: a closed port, a name under `.invalid`, TLS spoken to a plain HTTP
server, and the scripted server answering error statuses or answering too late.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from boundloop.client import result_of
from boundloop.contracts import WORKFLOW_NAME, RunInput, RunResult
from boundloop.core import model_failures as mf
from boundloop.core.limits import Limits, Policy, RunSettings
from boundloop.logs import TextFormatter
from boundloop.scripted.server import ScriptedModelServer
from boundloop.settings import Settings
from boundloop.worker.main import build_worker
from tests.conftest import RUN_TIMEOUT, workflow_task_failures
from tests.scripts import body

SECRET = "sk-live-SECRET-in-provider-body"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def run_against(temporal: Client, tmp_path: Path, base_url: str,
                      limits: Limits | None = None) -> RunResult:
    queue = f"q-{uuid.uuid4().hex[:8]}"
    settings = Settings(OPENAI_BASE_URL=base_url, OPENAI_API_KEY="sk-test-not-real",
                        BOUNDLOOP_TASK_QUEUE=queue, BOUNDLOOP_DATA_DIR=tmp_path / "data")
    inp = RunInput(question="在庫を調べて", tools=["lookup_stock"], settings=RunSettings(
        model="scripted-model", api="responses", limits=limits or Limits(), policy=Policy()))
    async with build_worker(temporal, settings):
        handle = await temporal.start_workflow(
            WORKFLOW_NAME, inp, id=f"test-{uuid.uuid4().hex[:12]}", task_queue=queue,
            result_type=RunResult)
        result = await asyncio.wait_for(result_of(handle), timeout=RUN_TIMEOUT)
    assert await workflow_task_failures(handle) == 0
    return result


def failure_of(result: RunResult) -> tuple[str, str]:
    """The (kind, detail) of the run's failed model request."""
    assert result.reason == "model_error", result.events
    failed = [e for e in result.events if e.event.startswith(mf.EVENT_PREFIX)]
    assert len(failed) == 1, result.events
    assert SECRET not in result.model_dump_json()
    return failed[0].event.removeprefix(mf.EVENT_PREFIX), failed[0].detail or ""


async def test_wrong_base_url_names_connection_refused_with_host_and_port(
        temporal: Client, tmp_path: Path) -> None:
    port = closed_port()
    result = await run_against(temporal, tmp_path, f"http://127.0.0.1:{port}/v1")
    kind, detail = failure_of(result)
    assert kind == "connection_refused"
    assert f"127.0.0.1:{port}" in detail


async def test_unknown_host_names_dns(temporal: Client, tmp_path: Path) -> None:
    result = await run_against(temporal, tmp_path, "http://model-server.invalid/v1")
    kind, detail = failure_of(result)
    assert kind == "dns"
    assert "model-server.invalid:80" in detail


async def test_https_to_a_plain_http_server_names_tls(temporal: Client, tmp_path: Path) -> None:
    server = ScriptedModelServer([])
    url = server.start()
    try:
        result = await run_against(temporal, tmp_path, url.replace("http://", "https://"))
    finally:
        server.stop()
    kind, detail = failure_of(result)
    assert kind == "tls"
    assert url.split("//")[1].split("/")[0] in detail


def error_turn(status: int) -> dict[str, Any]:
    return body({"error": {"message": f"{SECRET} says no", "type": "error"}}, status=status,
                headers={"retry-after-ms": "10"})


@pytest.mark.parametrize(("status", "cls"), [
    (401, "authentication"), (403, "authentication"), (404, "model or route not found"),
    (400, "request rejected"), (429, "rate limited"), (500, "provider error")])
async def test_http_status_names_its_kind_and_class(
        temporal: Client, tmp_path: Path, status: int, cls: str,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    # More error turns than any retry policy sends, so every attempt gets this status.
    server = ScriptedModelServer([error_turn(status)] * 12)
    url = server.start()
    try:
        result = await run_against(temporal, tmp_path, url)
    finally:
        server.stop()
    kind, detail = failure_of(result)
    assert kind == f"http_{status}"
    assert f"HTTP {status} ({cls})" in detail
    assert url.split("//")[1].split("/")[0] in detail
    # The worker log names the kind for each failed attempt, and never the body.
    lines = [TextFormatter().format(r) for r in caplog.records]
    assert any("model request failed" in line and f"failure=http_{status}" in line
               for line in lines if "temporalio.activity" in line), lines
    assert not [line for line in lines if SECRET in line]


async def test_a_model_that_answers_too_late_names_the_timeout(
        temporal: Client, tmp_path: Path) -> None:
    late = body({"id": "r", "object": "response", "status": "completed", "output": []},
                delay_seconds=5)
    server = ScriptedModelServer([late] * 12)
    url = server.start()
    try:
        result = await run_against(temporal, tmp_path, url, Limits(model_timeout_seconds=1))
    finally:
        server.stop()
    kind, detail = failure_of(result)
    assert kind == "timeout"
    assert "after 1 s" in detail


def test_every_kind_has_its_own_hint() -> None:
    assert "OPENAI_API_KEY" in mf.hint("http_401") and mf.hint("http_401") == mf.hint("http_403")
    assert "model name" in mf.hint("http_404")
    assert "OPENAI_BASE_URL" in mf.hint("connection_refused")
    assert "host" in mf.hint("dns")
    assert "https" in mf.hint("tls")
    assert "model_timeout_seconds" in mf.hint("timeout")
    assert "rate limited" in mf.hint("http_429")
    assert mf.hint("http_502") == mf.hint("http_500") != mf.hint("http_400")
