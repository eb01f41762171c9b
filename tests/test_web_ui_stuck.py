"""Temporal's Web UI shows a stuck run: a dev server with its UI, a run parked on
approval, then a next release that does not replay it (an extra activity before the
approval wait, no `workflow.patched`) deployed; the approval's workflow task fails on
every attempt, and headless Chromium (as in tests/test_web_ui.py) finds the failure —
the nondeterminism error — on the run's page.

Screenshots go to a temporary directory, or to $BOUNDLOOP_UI_SCREENSHOTS when set
(`BOUNDLOOP_UI_SCREENSHOTS=docs/screenshots` refreshes docs/deploying.md's image)."""

from __future__ import annotations

import os
import uuid
from datetime import timedelta
from pathlib import Path

import openai
import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from boundloop import Worker
from boundloop.contracts import WORKFLOW_NAME, Decision, RunInput, RunResult
from boundloop.core.limits import RunSettings
from boundloop.devserver import DevServer, port_open
from boundloop.scripted.server import ScriptedModelServer
from boundloop.stuck import stuck_line
from boundloop.testing import free_port, wait_until
from boundloop.tools.demo import DemoDeps
from tests.conftest import DEMO_TOOLS
from tests.scripts import answer, call, resp
from tests.support.next_release import swap_plugin
from tests.support.tools import tools as test_tools
from tests.test_codec_web_ui import CHROMIUM, CHROMIUM_ARGS, WAIT_MS
from tests.test_replay_check import TICKET
from tests.test_tool_unavailable import pending

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium not found (apt-get "
                                "install -y chromium, or set BOUNDLOOP_CHROMIUM)")
playwright_api = pytest.importorskip(
    "playwright.async_api", reason="the `playwright` package (dev extra) is not installed")
expect = playwright_api.expect


async def test_the_web_ui_shows_the_failing_workflow_task_of_a_stuck_run(
        tmp_path: Path) -> None:
    server = DevServer(tmp_path / "temporal", port=free_port(), ui_port=free_port()).start()
    model_server = ScriptedModelServer([resp(call("create_ticket", TICKET, "t1")),
                                        answer("Ticket opened.")])
    model = openai.AsyncOpenAI(base_url=model_server.start(), api_key="sk-test-not-real")
    queue = f"ui-{uuid.uuid4().hex[:8]}"
    try:
        client = await Client.connect(server.address, data_converter=pydantic_data_converter)

        def worker(*plugins: object) -> Worker[DemoDeps]:
            return Worker(client, test_tools, deps=DemoDeps(data_dir=tmp_path / "data"),
                          model=model, task_queue=queue,
                          plugins=list(plugins),  # type: ignore[arg-type]
                          sticky_timeout=timedelta(seconds=1))

        async with worker():
            handle = await client.start_workflow(
                WORKFLOW_NAME, RunInput(question="open a ticket", tools=DEMO_TOOLS,
                                        settings=RunSettings(model="scripted-model")),
                id=f"stuck-{uuid.uuid4().hex[:12]}", task_queue=queue, result_type=RunResult)
            await pending(handle)
        async with worker(swap_plugin()):
            await handle.signal("approve", Decision(call_id="t1", approve=True))

            async def stuck() -> bool:
                return await stuck_line(handle, await handle.describe()) is not None

            async def ui_up() -> bool:
                return port_open("127.0.0.1", server.ui_port or 0)

            await wait_until(stuck, timeout=60)
            await wait_until(ui_up, timeout=60)
            shots = Path(os.environ.get("BOUNDLOOP_UI_SCREENSHOTS") or tmp_path / "shots")
            shots.mkdir(parents=True, exist_ok=True)
            run_id = (await handle.describe()).run_id
            url = (f"http://127.0.0.1:{server.ui_port}/namespaces/default/workflows/"
                   f"{handle.id}/{run_id}/history")
            async with playwright_api.async_playwright() as p:
                browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                try:
                    context = await browser.new_context(
                        viewport={"width": 1400, "height": 1000}, timezone_id="UTC")
                    page = await context.new_page()
                    page.set_default_timeout(WAIT_MS)
                    await page.goto(url)
                    # The run's page: the failing workflow task, its failure (the
                    # nondeterminism error) and the pending workflow task it retries.
                    for text in ("Non Deterministic Error", "Workflow Task Failed",
                                 "Pending Workflow Task",
                                 "[TMPRL1100] Nondeterminism error: Activity machine does "
                                 "not handle this event"):
                        await expect(page.get_by_text(text).first).to_be_visible(
                            timeout=WAIT_MS)
                    await expect(page.get_by_text("RUNNING").first).to_be_visible()
                    await page.screenshot(path=shots / "stuck-run.png")
                finally:
                    await browser.close()
    finally:
        model_server.stop()
        server.stop()
