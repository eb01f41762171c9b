"""The Web UI shows encrypted runs decoded through `boundloop codec-server`.

A dev server with its UI (`--ui-codec-endpoint` pointing at a real `boundloop
codec-server` process, CORS for the UI's origin, its token in the endpoint's path as an
operator configures it: the UI has no other way to send one), a worker and client with
codec keys,
and headless Chromium (Debian's `chromium`, as in tests/test_web_ui.py). The history in
Temporal is ciphertext (tests/test_codec.py checks that); the browser fetches it and
the UI decodes every payload by POSTing it to the codec server.

Screenshots go to a temporary directory, or to $BOUNDLOOP_UI_SCREENSHOTS when set
(`BOUNDLOOP_UI_SCREENSHOTS=docs/screenshots` refreshes the README's image).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

import boundloop
from boundloop.devserver import DevServer, port_open, temporal_binary
from boundloop.scripted.server import ScriptedModelServer
from boundloop.settings import Settings
from boundloop.testing import free_port, wait_until
from boundloop.worker.main import build_worker, connect
from tests.test_codec import ANSWER, ARGUMENT, CLI, QUESTION, ROOT, TOKEN, keyfile, script

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
WAIT_MS = 60_000


@dataclass
class EncryptedRun:
    url: str
    codec: str
    address: str
    workflow_id: str
    shots: Path


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def encrypted_run(tmp_path_factory: pytest.TempPathFactory
                        ) -> AsyncIterator[EncryptedRun]:
    base = tmp_path_factory.mktemp("codec-ui")
    keys = keyfile(base, "2026-12")
    ui_port, codec_port = free_port(), free_port()
    codec_url = f"http://127.0.0.1:{codec_port}/{TOKEN}"  # the UI adds /decode
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOUNDLOOP_")}
    env.update(BOUNDLOOP_CODEC_KEYS=str(keys), BOUNDLOOP_CODEC_TOKEN=TOKEN,
               BOUNDLOOP_UI_URL=f"http://127.0.0.1:{ui_port}")  # the CORS origin
    log = (base / "codec-server.log").open("ab")
    codec = subprocess.Popen([*CLI, "codec-server", "--port", str(codec_port)], cwd=ROOT,
                             env=env, stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL)
    server = DevServer(base / "temporal", port=free_port(), ui_port=ui_port,
                       ui_codec_endpoint=codec_url).start()
    model = ScriptedModelServer(script())
    try:
        settings = Settings(OPENAI_BASE_URL=model.start(), OPENAI_API_KEY="sk-test-not-real",
                            TEMPORAL_ADDRESS=server.address, BOUNDLOOP_CODEC_KEYS=keys,
                            BOUNDLOOP_TASK_QUEUE=f"q-{uuid.uuid4().hex[:8]}",
                            BOUNDLOOP_DATA_DIR=base / "data")
        client = await connect(settings)
        async with build_worker(client, settings):
            run = await boundloop.start(client, QUESTION, tools=["search_docs"],
                                        model="scripted-model",
                                        task_queue=settings.task_queue)
            result = await asyncio.wait_for(run.result(), timeout=60)
            assert result.reason == "completed"

            async def up() -> bool:
                return (port_open("127.0.0.1", ui_port)
                        and port_open("127.0.0.1", codec_port))

            await wait_until(up, timeout=60)
            shots = Path(os.environ.get("BOUNDLOOP_UI_SCREENSHOTS") or base / "shots")
            shots.mkdir(parents=True, exist_ok=True)
            yield EncryptedRun(url=f"http://127.0.0.1:{ui_port}/namespaces/default/workflows/"
                                   f"{run.id}/{result.run_id}", codec=codec_url,
                               address=server.address, workflow_id=run.id, shots=shots)
    finally:
        model.stop()
        server.stop()
        codec.terminate()
        codec.wait(timeout=10)
        log.close()


@pytest_asyncio.fixture(loop_scope="session")
async def page(encrypted_run: EncryptedRun) -> AsyncIterator[Any]:
    async with playwright_api.async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = await browser.new_context(viewport={"width": 1400, "height": 1000},
                                                timezone_id="UTC")
            page = await context.new_page()
            page.set_default_timeout(WAIT_MS)
            yield page
        finally:
            await browser.close()


async def test_web_ui_shows_the_encrypted_run_decoded_through_the_codec_server(
        encrypted_run: EncryptedRun, page: Any) -> None:
    # What the server holds is ciphertext: the CLI without the codec shows none of it.
    raw = subprocess.run([temporal_binary(), "workflow", "show", "--address",
                          encrypted_run.address, "--workflow-id", encrypted_run.workflow_id],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert QUESTION not in raw and ANSWER not in raw and "binary/encrypted" in raw
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    await page.goto(f"{encrypted_run.url}/history")
    # Input and result, decoded in the browser by the codec server.
    await expect(page.get_by_text(QUESTION).first).to_be_visible(timeout=WAIT_MS)
    await expect(page.get_by_text(ANSWER).first).to_be_visible(timeout=WAIT_MS)
    assert [u for u in requests if u.startswith(f"{encrypted_run.codec}/decode")], requests
    await page.screenshot(path=encrypted_run.shots / "codec-server-decoded.png")
    assert ARGUMENT not in raw
