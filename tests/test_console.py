"""`boundloop console` in a real headless Chromium, against a real dev server and worker.

The console runs as its own process (`boundloop console`, configured by environment as
an operator would), an approver signs in, follows a run on its page and decides three
calls from the inbox: one approved, one rejected with a reason, one approved with edited
arguments; each run ends. Decisions are signed with alice's key, which the runs' policy
requires, so an unsigned or forged decision would be refused. Plain HTTP requests without
a session, or without the CSRF token, change nothing.

Screenshots go to a temporary directory, or to $BOUNDLOOP_UI_SCREENSHOTS
(`BOUNDLOOP_UI_SCREENSHOTS=docs/screenshots` refreshes docs/console.md's images).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError

import boundloop
from boundloop.client import query_status, result_of
from boundloop.codec import EncryptionCodec, load_keys, new_key_line
from boundloop.console.auth import hash_credential
from boundloop.contracts import RunResult
from boundloop.core.limits import Policy
from boundloop.core.reasons import StopReason
from boundloop.core.session import SessionLimits
from boundloop.devserver import port_open
from boundloop.scripted.server import ScriptedModelServer
from boundloop.signing import new_key
from boundloop.testing import free_port, wait_until
from tests.conftest import DEMO_TOOLS
from tests.conftest import test_worker as make_worker
from tests.scripts import answer, call, resp
from tests.test_docs_outputs import ROOT
from tests.test_docs_shown import commands_of
from tests.test_web_ui import CHROMIUM, CHROMIUM_ARGS

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium not found")
playwright_api = pytest.importorskip("playwright.async_api")
expect = playwright_api.expect
expect.set_options(timeout=30_000)

PASSWORD = "correct horse battery staple"
WAIT_MS = 30_000


def ticket(n: int, priority: str = "normal") -> dict[str, Any]:
    return {"title": f"Restock B-00{n}", "description": f"B-00{n} is out of stock",
            "priority": priority}


@dataclass
class Deployed:
    url: str
    client: Client
    runs: list[WorkflowHandle[Any, Any]]
    data_dir: Path
    shots: Path
    model: ScriptedModelServer
    queue: str
    plain: Client  # without the codec key


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


async def http(url: str, data: dict[str, str] | None = None, cookie: str | None = None
               ) -> tuple[int, dict[str, str], str]:
    """One plain HTTP request (redirects not followed): status, headers, body. In a
    thread: the test's event loop also runs the worker that answers the console."""
    return await asyncio.to_thread(_http, url, data, cookie)


def _http(url: str, data: dict[str, str] | None, cookie: str | None
          ) -> tuple[int, dict[str, str], str]:
    body = urllib.parse.urlencode(data).encode() if data is not None else None
    req = urllib.request.Request(url, data=body, method="POST" if data is not None else "GET")
    if cookie:
        req.add_header("Cookie", cookie)
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def deployed(temporal: Client, tmp_path_factory: pytest.TempPathFactory
                   ) -> AsyncIterator[Deployed]:
    base = tmp_path_factory.mktemp("console")
    keys = base / "keys"
    keys.mkdir()
    alice = new_key("alice", keys)
    approvers = base / "approvers"
    approvers.write_text(f"# who may sign in\nalice {hash_credential(PASSWORD)}\n"
                         f"bob {hash_credential('bobs-token-0123456789')}\n")
    model = ScriptedModelServer([
        *(resp(call("create_ticket", ticket(n), f"t{n}"), rid=f"resp_t{n}")
          for n in (1, 2, 3)),
        *(answer("Done.", rid=f"resp_a{n}") for n in (1, 2, 3)),
    ])
    queue = f"q-{uuid.uuid4().hex[:8]}"
    data_dir = base / "data"
    port = free_port()
    address = temporal.service_client.config.target_host
    # Every payload encrypted: the worker, the runs and the console share the codec key.
    key_line = new_key_line("console")
    codec = EncryptionCodec(load_keys(keys_file=None, keys_text=key_line) or {})
    client = await boundloop.connect(address, codec=codec)
    env = {**os.environ, "TEMPORAL_ADDRESS": address, "BOUNDLOOP_CONSOLE_APPROVERS":
           str(approvers), "BOUNDLOOP_CONSOLE_KEYS": str(keys), "BOUNDLOOP_CODEC_KEY": key_line}
    console = subprocess.Popen(
        [sys.executable, "-m", "boundloop.cli", "console", "--port", str(port)], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    # Signed decisions required: the run's policy names alice's public key.
    agent = boundloop.Agent(DEMO_TOOLS, model="scripted-model", task_queue=queue,
                            policy=Policy(approver_keys={"alice": alice.public_line.split()[1]}))
    try:
        async with make_worker(client, queue, model.start(), data_dir):
            runs = []
            for n in (1, 2, 3):  # one at a time: the scripted model answers in order
                handle = (await agent.start(client, f"Open a restock ticket for B-00{n}")
                          ).handle

                async def waiting(h: WorkflowHandle[Any, Any] = handle) -> bool:
                    return bool((await query_status(h)).pending)

                await wait_until(waiting, timeout=60)
                runs.append(handle)

            async def up() -> bool:
                return port_open("127.0.0.1", port)

            await wait_until(up, timeout=60)
            shots = Path(os.environ.get("BOUNDLOOP_UI_SCREENSHOTS") or base / "shots")
            shots.mkdir(parents=True, exist_ok=True)
            yield Deployed(url=f"http://127.0.0.1:{port}", client=client, runs=runs,
                           data_dir=data_dir, shots=shots, model=model, queue=queue,
                           plain=temporal)
            for h in runs:  # a run the test left waiting
                with contextlib.suppress(RPCError):
                        await h.terminate("console test finished")
    finally:
        console.terminate()
        output = console.communicate(timeout=30)[0].decode()
        model.stop()
    # Nothing raw in the console's output: no argument, reason or credential.
    for secret in (PASSWORD, "B-002 is out of stock", "wrong priority", "bobs-token"):
        assert secret not in output, output


async def sign_in(url: str, approver: str, credential: str) -> tuple[str, str]:
    """A session cookie and its CSRF token, by plain HTTP."""
    status, headers, _ = await http(f"{url}/login",
                                    {"approver": approver, "credential": credential})
    assert status == 303 and "set-cookie" in {k.lower() for k in headers}
    cookie = next(v for k, v in headers.items() if k.lower() == "set-cookie").split(";")[0]
    _, _, page = await http(f"{url}/approvals", cookie=cookie)
    token = page.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    return cookie, token


async def test_requests_without_session_or_csrf_change_nothing(deployed: Deployed) -> None:
    url, run = deployed.url, deployed.runs[0]
    decision = {"run": run.id, "call_id": "t1", "action": "approve"}
    # No session: pages send to sign-in, a decision is refused.
    status, headers, _ = await http(f"{url}/approvals")
    assert status == 303 and headers["location"].startswith("/login")
    assert (await http(f"{url}/decide", decision))[0] == 401
    assert (await http(f"{url}/api/stream/runs/{run.id}"))[0] == 401
    assert (await http(f"{url}/api/runs/{run.id}"))[0] == 401
    # A forged cookie is no session.
    assert (await http(f"{url}/decide", decision, cookie="boundloop_console=e30.AAAA"))[0] == 401
    # A wrong credential signs nobody in.
    status, headers, _ = await http(f"{url}/login", {"approver": "alice", "credential": "guess"})
    assert status == 303 and "error=" in headers["location"]
    assert not any(k.lower() == "set-cookie" for k in headers)
    # Signed in, but without the CSRF token (or with another one): refused.
    cookie, token = await sign_in(url, "bob", "bobs-token-0123456789")
    assert (await http(f"{url}/decide", decision, cookie=cookie))[0] == 403
    assert (await http(f"{url}/decide", {**decision, "csrf": token + "x"}, cookie=cookie))[0] == 403
    pending = (await query_status(run)).pending
    assert [a.call_id for a in pending] == ["t1"]
    # The run's payloads are encrypted in history: the console read them with its key.
    async for event in deployed.plain.get_workflow_handle(run.id).fetch_history_events():
        payload = event.workflow_execution_started_event_attributes.input.payloads[0]
        assert payload.metadata["encoding"] == b"binary/encrypted"
        break
    assert not any(ev.event.startswith("approval_a") for ev in (await query_status(run)).events)


async def test_approver_decides_three_calls_in_the_browser(deployed: Deployed) -> None:
    r1, r2, r3 = deployed.runs
    shots = deployed.shots
    async with playwright_api.async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = await browser.new_context(viewport={"width": 1300, "height": 900})
            page = await context.new_page()
            page.set_default_timeout(WAIT_MS)
            await page.goto(f"{deployed.url}/approvals")
            await expect(page).to_have_url(f"{deployed.url}/login?next=%2Fapprovals")
            await page.fill("input[name=approver]", "alice")
            await page.fill("input[name=credential]", PASSWORD)
            await page.click("button[name=signin]")
            await expect(page.locator("#approver")).to_have_text("alice")

            # The inbox: each waiting call with its full arguments and why it asks.
            cards = page.locator(".approval")
            await expect(cards).to_have_count(3)
            card1 = page.locator(f'.approval[data-run="{r1.id}"]')
            await expect(card1.locator(".arguments")).to_contain_text(
                '"description": "B-001 is out of stock"')
            # Which rule asked: create_ticket's declaration (needs_approval=True).
            await expect(card1.locator(".why")).to_have_text(
                "asked because: the tool's declaration (needs_approval=True: every call asks)")
            # The run's question, and when the call began to wait, to the second.
            await expect(card1.locator(".question")).to_have_text(
                "Open a restock ticket for B-001")
            await expect(card1.locator("p").first).to_contain_text(re.compile(
                r"waiting since \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00$"))
            await page.screenshot(path=shots / "console-inbox.png", full_page=True)

            # The runs list: all three wait for approval, each with its question.
            await page.click("header >> text=Runs")
            for n, h in enumerate(deployed.runs, 1):
                row = page.locator(f'tr[data-run="{h.id}"]')
                await expect(row).to_contain_text("waiting approval")
                await expect(row.locator(".question")).to_have_text(
                    f"Open a restock ticket for B-00{n}")

            # Run 1's page, approved from there; the page follows it to its end.
            await page.click(f"text={r1.id}")
            await expect(page.locator("#question")).to_have_text(
                "Open a restock ticket for B-001")
            await expect(page.locator("#timeline")).to_contain_text("approval_requested")
            await page.screenshot(path=shots / "console-run-waiting.png", full_page=True)
            await page.locator('.approval[data-call="t1"] button[name=approve]').click()
            # The note names the run: every run of this script has a call t1.
            await expect(page.locator("#note")).to_have_text(
                f"run {r1.id} · call t1: approved (signed by alice)")
            await expect(page.locator("#state")).to_have_text("completed")
            await expect(page.locator("#answer")).to_have_text("Done.")
            await expect(page.locator("#timeline")).to_contain_text("tool_success")
            # Drawn from the run's live stream: each line with its offset, in order, and
            # the answer from the model's streamed text.
            await expect(page.locator("#timeline li[data-offset]").last).to_contain_text(
                "stopped:completed")
            offsets = await page.locator("#timeline li").evaluate_all(
                "lis => lis.map(li => Number(li.dataset.offset))")
            assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets) >= 10
            await expect(page.locator("#answer")).to_have_attribute("data-source", "stream")
            await page.screenshot(path=shots / "console-run.png", full_page=True)

            # Run 2: rejected from the inbox with a reason.
            await page.click("header >> text=Approvals")
            card2 = page.locator(f'.approval[data-run="{r2.id}"]')
            await card2.locator("input[name=reason]").fill("wrong priority")
            await card2.locator("button[name=reject]").click()
            await expect(page.locator("#note")).to_have_text(
                f"run {r2.id} · call t2: rejected (signed by alice)")

            # Run 3: edited, the edit shown as a diff, then approved.
            card3 = page.locator(f'.approval[data-run="{r3.id}"]')
            await card3.locator("summary").click()
            await card3.locator("textarea").fill(
                '{"title": "Restock B-003", "description": "B-003 is out of stock", '
                '"priority": "high"}')
            await card3.locator("button[name=review]").click()
            await expect(page.locator(".diff .del")).to_contain_text('"priority": "normal"')
            await expect(page.locator(".diff .add")).to_contain_text('"priority": "high"')
            await page.click("button[name=confirm]")
            await expect(page.locator("#note")).to_have_text(
                f"run {r3.id} · call t3: approved with edited arguments (signed by alice)")
            await expect(page.locator("#inbox-empty")).to_be_visible()

            # Once they have ended, the list shows every run completed.
            for h in deployed.runs:
                await asyncio.wait_for(result_of(h), 60)
            await page.click("header >> text=Runs")
            for h in deployed.runs:
                await expect(page.locator(f'tr[data-run="{h.id}"]')).to_contain_text(
                    "completed")
            await page.screenshot(path=shots / "console-runs.png", full_page=True)
        finally:
            await browser.close()

    results: list[RunResult] = [await asyncio.wait_for(result_of(h), 60) for h in (r1, r2, r3)]
    assert [r.reason for r in results] == ["completed"] * 3
    decided = [[e for e in r.events if e.event.startswith("approval_") and e.detail]
               for r in results]
    assert [(d[0].event, d[0].detail) for d in decided] == [
        ("approval_approved", "by alice"), ("approval_rejected", "by alice"),
        ("approval_approved", "by alice, edited arguments")]
    assert "tool_success" not in [e.event for e in results[1].events]  # never ran
    from boundloop.tools.demo import list_tickets

    made = {t["title"]: t["priority"] for t in list_tickets(deployed.data_dir)}
    assert made == {"Restock B-001": "normal", "Restock B-003": "high"}


async def sign_in_browser(page: Any, url: str) -> None:
    await page.goto(f"{url}/login")
    await page.fill("input[name=approver]", "alice")
    await page.fill("input[name=credential]", PASSWORD)
    await page.click("button[name=signin]")
    await expect(page.locator("#approver")).to_have_text("alice")


async def test_a_session_in_the_chat_view_queues_a_message_and_approves_inside_it(
        deployed: Deployed) -> None:
    # After the runs above: the scripted model answers this session's requests next.
    for turn in (resp(call("create_ticket", ticket(7), "s1"), rid="resp_s1"),
                 answer("Filed B-007.", rid="resp_s2"), answer("Yes, it is filed.",
                                                              rid="resp_s3")):
        deployed.model.append(turn)
    session = await boundloop.start_session(
        deployed.client, tools=DEMO_TOOLS, model="scripted-model", task_queue=deployed.queue,
        session_limits=SessionLimits(busy="queue"))
    async with playwright_api.async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await (await browser.new_context(viewport={"width": 1300, "height": 900})
                          ).new_page()
            page.set_default_timeout(WAIT_MS)
            await sign_in_browser(page, deployed.url)
            await page.click("header >> text=Sessions")
            await page.click(f"text={session.id}")
            await page.fill("input[name=message]", "Open a restock ticket for B-007")
            await page.click("button[name=say]")
            await expect(page.locator("#note")).to_have_text("turn 1 started")
            card = page.locator('.approval[data-call="s1"]')
            await expect(card.locator(".arguments")).to_contain_text("B-007")
            # A second message while turn 1 waits for approval: queued, and shown so.
            await page.fill("input[name=message]", "Is it filed?")
            await page.click("button[name=say]")
            await expect(page.locator("#note")).to_have_text(
                "queued: it starts a turn when turn 1 ends (1 waiting)")
            await expect(page.locator("#session-state")).to_contain_text("1 waiting")
            await page.locator('.approval[data-call="s1"] button[name=approve]').click()
            await expect(page.locator("#note")).to_contain_text("s1: approved")
            chat = page.locator("#chat")
            await expect(chat).to_contain_text("Filed B-007.")
            await expect(chat).to_contain_text("Yes, it is filed.")
            await page.screenshot(path=deployed.shots / "console-session.png", full_page=True)
        finally:
            await browser.close()
    shown = await session.show()
    assert (shown.turns, shown.waiting, shown.last and shown.last.reason) == (
        2, 0, StopReason.COMPLETED)
    await session.end()


async def test_the_runs_list_filters_by_state_tool_and_approver(deployed: Deployed) -> None:
    """After the decisions above: alice decided all three runs, none called lookup_stock."""
    ids = {h.id for h in deployed.runs}
    cookie, _ = await sign_in(deployed.url, "bob", "bobs-token-0123456789")

    async def listed(query: str) -> set[str]:
        _, _, page = await http(f"{deployed.url}/?{query}", cookie=cookie)
        return {i for i in ids if f'data-run="{i}"' in page}

    assert await listed("state=completed&approver=alice") == ids
    assert await listed("tool=create_ticket") == ids
    assert await listed("approver=bob") == set()
    assert await listed("tool=lookup_stock") == set()
    assert await listed("state=stopped") == set()
    assert await listed("reason=max_steps") == set()


async def test_a_script_signs_in_and_decides_with_the_pages_curl_lines(
        deployed: Deployed) -> None:
    """docs/console.md's "Without a browser" lines, run in a shell as shown (the console
    on its test port): they sign in as alice, approve a waiting call, and print what the
    page shows."""
    for turn in (resp(call("create_ticket", ticket(8), "c8"), rid="resp_c8"),
                 answer("Filed B-008.", rid="resp_c8a")):
        deployed.model.append(turn)
    agent = boundloop.Agent(DEMO_TOOLS, model="scripted-model", task_queue=deployed.queue)
    handle = (await agent.start(deployed.client, "Open a restock ticket for B-008")).handle

    async def waiting() -> bool:
        return bool((await query_status(handle)).pending)

    await wait_until(waiting, timeout=60)
    lines = (ROOT / "docs/console.md").read_text(encoding="utf-8").splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("$ curl") and "/login" in
                 lines[i + 1])
    block = lines[start:lines.index("```", start)]
    commands = commands_of(block)
    script = "\n".join(c for c, _ in commands).replace("http://127.0.0.1:8090", deployed.url)
    done = await asyncio.to_thread(
        subprocess.run, ["sh", "-c", "set -e\n" + script], cwd=deployed.data_dir,
        env={**os.environ, "TOKEN": PASSWORD, "RUN": handle.id, "CALL": "c8"},
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done
    assert done.stdout.splitlines() == [x for _, shown in commands for x in shown], done
    result = await asyncio.wait_for(result_of(handle), 60)
    assert (result.reason, [(e.event, e.detail) for e in result.events
                            if e.event == "approval_approved"]) == (
        "completed", [("approval_approved", "by alice")])
