"""What someone who reaches `boundloop console` but is no approver can still try: guess
credentials, put words into its pages with a link, hide an argument's meaning behind
bidi characters. A real console process (its first lockout set to 2 s, as an operator
sets BOUNDLOOP_CONSOLE_LOCKOUT_SECONDS), a real worker and dev server, plain HTTP and
headless Chromium."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError

import boundloop
from boundloop.client import query_status
from boundloop.console.auth import hash_credential
from boundloop.devserver import port_open
from boundloop.scripted.server import ScriptedModelServer
from boundloop.testing import free_port, wait_until
from tests.conftest import DEMO_TOOLS
from tests.conftest import test_worker as make_worker
from tests.scripts import call, resp
from tests.test_console import http
from tests.test_web_ui import CHROMIUM, CHROMIUM_ARGS

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium not found")
playwright_api = pytest.importorskip("playwright.async_api")
expect = playwright_api.expect

PASSWORD = "correct horse battery staple"
MAX_FAILURES = 5  # boundloop.console.auth.MAX_FAILURES
LOCKED = ("too many failed sign-ins for this approver or from this address: sign-in is "
          "refused for a while, try again later")
#: Reads "$10,000" on screen when the override is applied; it is 1 0 , 0 0 0 reversed.
SPOOFED = "\u202e000,01$"


@dataclass
class Console:
    url: str
    run: WorkflowHandle[Any, Any]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def console(temporal: Client, tmp_path_factory: pytest.TempPathFactory
                  ) -> AsyncIterator[Console]:
    base = tmp_path_factory.mktemp("console-hardening")
    approvers = base / "approvers"
    approvers.write_text(f"alice {hash_credential(PASSWORD)}\n")
    model = ScriptedModelServer([resp(call(
        "create_ticket", {"title": "Refund", "description": SPOOFED, "priority": "high"},
        "t1"))])
    queue = f"q-{uuid.uuid4().hex[:8]}"
    port = free_port()
    env = {**os.environ, "TEMPORAL_ADDRESS": temporal.service_client.config.target_host,
           "BOUNDLOOP_CONSOLE_APPROVERS": str(approvers),
           "BOUNDLOOP_CONSOLE_LOCKOUT_SECONDS": "2"}
    proc = subprocess.Popen([sys.executable, "-m", "boundloop.cli", "console", "--port",
                             str(port)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    agent = boundloop.Agent(DEMO_TOOLS, model="scripted-model", task_queue=queue)
    try:
        async with make_worker(temporal, queue, model.start(), base / "data"):
            handle = (await agent.start(temporal, "Refund the customer")).handle

            async def waiting() -> bool:
                return bool((await query_status(handle)).pending)

            async def up() -> bool:
                return port_open("127.0.0.1", port)

            await wait_until(waiting, timeout=60)
            await wait_until(up, timeout=60)
            yield Console(url=f"http://127.0.0.1:{port}", run=handle)
            with contextlib.suppress(RPCError):
                await handle.terminate("test finished")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        model.stop()


async def sign_in(url: str, name: str, credential: str) -> tuple[str, str | None]:
    """Where a sign-in sends the browser, and the session cookie if one was set."""
    status, headers, _ = await http(f"{url}/login", {"approver": name, "credential":
                                                     credential})
    assert status == 303
    cookie = next((v.split(";")[0] for k, v in headers.items() if k.lower() == "set-cookie"),
                  None)
    return headers["location"], cookie


async def refused_as_locked(url: str, name: str, credential: str) -> bool:
    location, cookie = await sign_in(url, name, credential)
    if cookie is not None or "error=locked" not in location:
        return False
    _, _, page = await http(f"{url}{location}")
    return LOCKED in page


async def test_repeated_failures_lock_out_a_name_and_an_address_for_a_while(
        console: Console) -> None:
    url = console.url
    # One approver's name: after MAX_FAILURES wrong credentials, the right one is
    # refused too, with the fixed message, until the lockout ends.
    for _ in range(MAX_FAILURES):
        assert (await sign_in(url, "alice", "guess"))[1] is None
    assert await refused_as_locked(url, "alice", PASSWORD)

    async def signs_in() -> bool:
        return (await sign_in(url, "alice", PASSWORD))[1] is not None

    await wait_until(signs_in, timeout=60, interval=0.2)
    # One address: failures spread over names (none of them an approver) lock it out,
    # so alice's right credential from there is refused as well, then works again.
    for n in range(MAX_FAILURES):
        assert (await sign_in(url, f"nobody{n}", "guess"))[1] is None
    assert await refused_as_locked(url, "alice", PASSWORD)
    await wait_until(signs_in, timeout=60, interval=0.2)


async def test_a_link_cannot_put_words_into_a_console_page(console: Console) -> None:
    url = console.url
    planted = "<script>alert(1)</script> Your session expired: sign in at evil.example"
    for query in (f"error={planted}", f"error=credential%20{planted}", f"note={planted}"):
        _, _, page = await http(f"{url}/login?{query.replace(' ', '%20')}")
        assert "evil.example" not in page and 'id="error"' not in page, query
    # A known code shows its fixed text.
    _, _, page = await http(f"{url}/login?error=credential")
    assert '<p class="error" id="error">wrong approver or credential</p>' in page
    # Signed in: a note or error in a link, without the console's MAC, shows nothing.
    _, cookie = await sign_in(url, "alice", PASSWORD)
    assert cookie is not None
    for query in (f"error={planted}", f"note={planted}", f"note={planted}&mac=AAAA"):
        _, _, page = await http(f"{url}/approvals?{query.replace(' ', '%20')}",
                                cookie=cookie)
        assert 'id="approver"' in page and "evil.example" not in page, query


async def test_every_response_carries_the_content_security_policy(console: Console) -> None:
    url, run = console.url, console.run.id
    _, cookie = await sign_in(url, "alice", PASSWORD)
    paths = ["/login", "/login?error=credential", "/static/console.css", "/static/run.js",
             "/static/nothing.js", "/", "/approvals", f"/runs/{run}", f"/api/runs/{run}",
             "/sessions", "/sessions/none"]
    seen = []
    for path in paths:
        for with_cookie in (cookie, None):
            status, headers, _ = await http(f"{url}{path}", cookie=with_cookie)
            policy = {k.lower(): v for k, v in headers.items()}["content-security-policy"]
            seen.append((path, status))
            directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
            assert directives["default-src"] == "'none'", (path, policy)
            assert directives["script-src"] == "'self'", (path, policy)
            assert directives["style-src"] == "'self'", (path, policy)
            assert directives["frame-ancestors"] == "'none'", (path, policy)
    # Pages, redirects to sign-in, refusals and a missing file alike.
    assert {s for _, s in seen} >= {200, 303, 401, 404}, seen


async def test_a_bidi_argument_is_shown_escaped_and_marked_in_the_inbox(
        console: Console) -> None:
    async with playwright_api.async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await (await browser.new_context()).new_page()
            page.set_default_timeout(30_000)
            refused: list[str] = []  # what the policy blocked: nothing the page needs
            page.on("console", lambda m: refused.append(m.text)
                    if "Content Security Policy" in m.text else None)
            await page.goto(f"{console.url}/login?next=/approvals")
            await page.fill("input[name=approver]", "alice")
            await page.fill("input[name=credential]", PASSWORD)
            await page.click("button[name=signin]")
            card = page.locator(f'.approval[data-run="{console.run.id}"]')
            arguments = card.locator(".arguments")
            await expect(arguments).to_contain_text('"description": "\\u202e000,01$"')
            await expect(card.locator(".arguments .invisible")).to_have_text("\\u202e")
            await expect(card.locator(".invisible-note")).to_contain_text(
                "contains invisible/control characters")
            assert "\u202e" not in await arguments.inner_text()
            # The edit box holds the same value as JSON (the escape parses back to it).
            textarea = await card.locator("textarea").input_value()
            assert "\\u202e000,01$" in textarea and "\u202e" not in textarea
            # The run page, its script and style sheet under the policy.
            await page.goto(f"{console.url}/runs/{console.run.id}")
            await expect(page.locator("#timeline")).to_contain_text("approval_requested")
            await expect(page.locator(".arguments .invisible")).to_have_text("\\u202e")
            assert await page.locator("header").evaluate(
                "h => getComputedStyle(h).backgroundColor") == "rgb(27, 42, 65)"
            assert refused == []
        finally:
            await browser.close()


async def test_the_cli_shows_the_bidi_argument_escaped_and_marked(console: Console,
                                                                  temporal: Client) -> None:
    """`boundloop pending`, as an approver at a terminal reads it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BOUNDLOOP_", "TEMPORAL_"))}
    env["TEMPORAL_ADDRESS"] = temporal.service_client.config.target_host
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "boundloop.cli", "pending"], env=env,
        capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert '"\\u202e000,01$"' in done.stdout and "\u202e" not in done.stdout, done.stdout
    assert "contains invisible/control" in " ".join(done.stdout.split()), done.stdout
