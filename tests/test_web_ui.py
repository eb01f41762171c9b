"""Every run is readable in the Temporal Web UI (README, "Reading a run in the Web UI").

A real headless Chromium (Debian's `chromium`, driven by Playwright with the system binary)
against our own `DevServer` started with its UI on free ports, a real worker and the
scripted model server. Three runs: one completed (`lookup_stock`), one stopped at the step
limit (a looping model whose forced last answer is a tool call written as text), one
waiting for approval (`create_ticket`, never decided; terminated at the end).

Skipped when Chromium is absent (`apt-get install chromium`; `.ci/run` tries it).
Screenshots go to a temporary directory, or to $BOUNDLOOP_UI_SCREENSHOTS when set
(`BOUNDLOOP_UI_SCREENSHOTS=docs/screenshots` refreshes the README's images).
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.parse
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from temporalio.client import Client, WorkflowHandle

import boundloop
from boundloop.client import result_of
from boundloop.contracts import RunResult
from boundloop.core.reasons import NEXT_CHECK, StopReason
from boundloop.devserver import DevServer, port_open
from boundloop.scripted.server import ScriptedModelServer
from boundloop.settings import Settings
from boundloop.testing import free_port, wait_until
from boundloop.worker.main import build_worker, connect
from tests.conftest import DEMO_TOOLS
from tests.scripts import answer, call, resp

CHROMIUM = (os.environ.get("BOUNDLOOP_CHROMIUM") or shutil.which("chromium")
            or shutil.which("chromium-browser"))
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="Chromium not found (apt-get install -y chromium, or set BOUNDLOOP_CHROMIUM): "
           "the Web UI test needs a real browser")

playwright_api = pytest.importorskip(
    "playwright.async_api", reason="the `playwright` package (dev extra) is not installed")
expect = playwright_api.expect

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
WAIT_MS = 60_000  # generous: the UI loads lazily and visibility is eventually consistent

COMPLETED_QUESTION = "How many A-001 are in stock?"
STOPPED_QUESTION = "Look up the stock of A-001 and B-002."  # CJK has no font here
CALL_AS_TEXT = '{"name": "lookup_stock", "arguments": {"sku": "A-001"}}'
WAITING_QUESTION = "Open a restock ticket for B-002"
WAITING_QUERY = 'BoundloopStatus="waiting_approval"'


@dataclass
class UiRuns:
    ui: str
    client: Client
    completed: RunResult
    stopped: RunResult
    waiting: WorkflowHandle[Any, Any]
    shots: Path

    def run_url(self, workflow_id: str, run_id: str, tab: str) -> str:
        return f"{self.ui}/namespaces/default/workflows/{workflow_id}/{run_id}/{tab}"

    def list_url(self, query: str | None = None) -> str:
        url = f"{self.ui}/namespaces/default/workflows"
        return f"{url}?query={urllib.parse.quote(query)}" if query else url


async def listed(client: Client, query: str) -> set[str]:
    return {wf.id async for wf in client.list_workflows(query)}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def runs(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[UiRuns]:
    base = tmp_path_factory.mktemp("web-ui")
    server = DevServer(base / "temporal", port=free_port(), ui_port=free_port()).start()
    model = ScriptedModelServer([
        resp(call("lookup_stock", {"sku": "A-001"}, "c1")),
        answer("A-001: 12 in stock."),
        *(resp(call("lookup_stock", {"sku": sku}, f"s{i}"), rid=f"resp_s{i}")
          for i, sku in enumerate(["B-002", "B-002", "A-001", "A-001"], 1)),
        answer(CALL_AS_TEXT, rid="resp_s5"),
        resp(call("create_ticket", {"title": "Restock B-002", "description": "B-002 is out "
                                    "of stock", "priority": "high"}, "t1"), rid="resp_2"),
    ])
    try:
        settings = Settings(OPENAI_BASE_URL=model.start(), OPENAI_API_KEY="sk-test-not-real",
                            TEMPORAL_ADDRESS=server.address,
                            BOUNDLOOP_TASK_QUEUE=f"q-{uuid.uuid4().hex[:8]}",
                            BOUNDLOOP_DATA_DIR=base / "data",
                            BOUNDLOOP_UI_URL=f"http://127.0.0.1:{server.ui_port}")
        client = await connect(settings)
        agent = boundloop.Agent(DEMO_TOOLS, model="scripted-model",
                                task_queue=settings.task_queue)
        # The worker stays up while the browser looks: the UI reads current details
        # through a query that a worker answers.
        async with build_worker(client, settings):
            done = (await agent.start(client, COMPLETED_QUESTION)).handle
            completed = await result_of(done)
            assert completed.reason == "completed"
            loop = (await agent.start(client, STOPPED_QUESTION)).handle
            stopped = await result_of(loop)
            assert (stopped.reason, stopped.answer_looks_like_tool_call) == ("max_steps", True)
            waiting = (await agent.start(client, WAITING_QUESTION)).handle
            try:
                async def visible() -> bool:
                    return (await listed(client, WAITING_QUERY) == {waiting.id}
                            and done.id in await listed(client, 'BoundloopStatus="completed"')
                            and loop.id in await listed(client, 'BoundloopStatus="stopped"'))

                try:
                    await wait_until(visible, timeout=60)
                except TimeoutError:
                    pytest.fail("the runs were never listed by their BoundloopStatus search "
                                "attribute (completed / stopped / waiting_approval)")
                assert model.violations == [], model.violations

                async def ui_up() -> bool:
                    return port_open("127.0.0.1", server.ui_port or 0)

                await wait_until(ui_up, timeout=60)
                shots = Path(os.environ.get("BOUNDLOOP_UI_SCREENSHOTS") or base / "shots")
                shots.mkdir(parents=True, exist_ok=True)
                yield UiRuns(ui=settings.ui_url, client=client, completed=completed,
                             stopped=stopped, waiting=waiting, shots=shots)
            finally:
                await waiting.terminate("web UI test finished")
    finally:
        model.stop()
        server.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def browser(runs: UiRuns) -> AsyncIterator[Any]:
    async with playwright_api.async_playwright() as p:
        chromium = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            await chromium.close()


@pytest_asyncio.fixture(loop_scope="session")
async def page(browser: Any) -> AsyncIterator[Any]:
    context = await browser.new_context(viewport={"width": 1400, "height": 900},
                                        timezone_id="UTC")
    page = await context.new_page()
    page.set_default_timeout(WAIT_MS)
    try:
        yield page
    finally:
        await context.close()


async def test_completed_run_shows_summary_and_details(runs: UiRuns, page: Any) -> None:
    r = runs.completed
    await page.goto(runs.run_url(r.workflow_id, r.run_id, "user-metadata"))
    summary = page.frame_locator("#user-metadata-summary").locator("body")
    await expect(summary).to_contain_text(COMPLETED_QUESTION, timeout=WAIT_MS)
    details = page.frame_locator("#user-metadata-details").locator("body")
    await expect(details).to_contain_text("scripted-model", timeout=WAIT_MS)
    await expect(details).to_contain_text("lookup_stock, search_docs, create_ticket",
                                          timeout=WAIT_MS)
    current = page.frame_locator("#user-metadata-current-details").locator("body")
    await expect(current).to_contain_text("completed · completed", timeout=WAIT_MS)
    await expect(current).to_contain_text("tool executions", timeout=WAIT_MS)
    await page.screenshot(path=runs.shots / "run-completed.png")


async def test_completed_run_shows_search_attributes(runs: UiRuns, page: Any) -> None:
    r = runs.completed
    await page.goto(runs.run_url(r.workflow_id, r.run_id, "search-attributes"))
    box = page.get_by_role("textbox", name="Search Attributes")
    await expect(box).to_contain_text('"BoundloopStatus": "completed"', timeout=WAIT_MS)
    shown = json.loads(await box.inner_text())
    assert {k: v for k, v in shown.items() if k.startswith("Boundloop")} == {
        "BoundloopStatus": "completed", "BoundloopStopReason": "completed",
        "BoundloopSteps": 2, "BoundloopToolExecutions": 1, "BoundloopPendingApprovals": 0}
    await page.screenshot(path=runs.shots / "run-completed-search-attributes.png")


async def test_completed_run_history_shows_activity_summaries(runs: UiRuns, page: Any
                                                              ) -> None:
    r = runs.completed
    await page.goto(runs.run_url(r.workflow_id, r.run_id, "history"))
    for text in ("model step 1 · scripted-model", "tool lookup_stock · call 1",
                 "model step 2 · scripted-model"):
        await expect(page.get_by_text(text, exact=True)).to_be_visible(timeout=WAIT_MS)


async def test_list_filtered_by_status_shows_only_the_waiting_run(runs: UiRuns, page: Any
                                                                   ) -> None:
    done, waiting = runs.completed.workflow_id, runs.waiting.id
    await page.goto(runs.list_url())  # unfiltered, both runs are listed
    await expect(page.get_by_text(waiting, exact=True)).to_be_visible(timeout=WAIT_MS)
    await expect(page.get_by_text(done, exact=True)).to_be_visible(timeout=WAIT_MS)

    await page.goto(runs.list_url(WAITING_QUERY))
    await expect(page.get_by_text(waiting, exact=True)).to_be_visible(timeout=WAIT_MS)
    await expect(page.get_by_text('BoundloopStatus = "waiting_approval"')).to_be_visible(
        timeout=WAIT_MS)
    await expect(page.get_by_text(done, exact=True)).to_have_count(0)
    await page.screenshot(path=runs.shots / "list-waiting-approval.png")


async def test_waiting_run_shows_what_it_waits_for(runs: UiRuns, page: Any) -> None:
    desc = await runs.waiting.describe()
    await page.goto(runs.run_url(runs.waiting.id, desc.run_id or "", "user-metadata"))
    summary = page.frame_locator("#user-metadata-summary").locator("body")
    await expect(summary).to_contain_text(WAITING_QUESTION, timeout=WAIT_MS)
    current = page.frame_locator("#user-metadata-current-details").locator("body")
    await expect(current).to_contain_text("waiting_approval", timeout=WAIT_MS)
    await expect(current).to_contain_text("waiting for approval: create_ticket t1",
                                          timeout=WAIT_MS)
    await page.screenshot(path=runs.shots / "run-waiting-approval.png")


def row(page: Any, workflow_id: str) -> Any:
    """The list's row of one run."""
    return page.locator("tr", has=page.get_by_text(workflow_id, exact=True))


async def test_list_shows_stopped_runs_apart_from_completed_ones(runs: UiRuns, page: Any
                                                                  ) -> None:
    """Temporal's own status column: a run stopped by a limit is Failed, not a green
    Completed, so an operator tells them apart without opening each."""
    done, stopped = runs.completed.workflow_id, runs.stopped.workflow_id
    await page.goto(runs.list_url())  # unfiltered: this server holds only these runs
    await expect(row(page, runs.waiting.id)).to_contain_text("Running", timeout=WAIT_MS)
    await expect(row(page, stopped)).to_contain_text("Failed", timeout=WAIT_MS)
    await expect(row(page, done)).to_contain_text("Completed", timeout=WAIT_MS)
    await expect(row(page, stopped)).not_to_contain_text("Completed")
    await expect(row(page, done)).not_to_contain_text("Failed")
    await page.screenshot(path=runs.shots / "list-stopped-and-completed.png")


async def test_stopped_run_shows_its_reason_and_the_tool_call_shaped_answer(
        runs: UiRuns, page: Any) -> None:
    r = runs.stopped
    await page.goto(runs.run_url(r.workflow_id, r.run_id, "user-metadata"))
    current = page.frame_locator("#user-metadata-current-details").locator("body")
    await expect(current).to_contain_text("stopped · max_steps", timeout=WAIT_MS)
    await expect(current).to_contain_text(NEXT_CHECK[StopReason.MAX_STEPS], timeout=WAIT_MS)
    await expect(current).to_contain_text("the answer looks like a tool call",
                                          timeout=WAIT_MS)
    await page.screenshot(path=runs.shots / "run-stopped.png")
