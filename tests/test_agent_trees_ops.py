"""An agent tree as operators see it, through a real dev server, worker, CLI and console:
a sub-agent's `create_ticket` waits for approval; `pending` shows it with its path from
the root run, `status` of the root lists the sub-agent and `status` of the sub-agent its
place, `list --root` lists the tree, the console's inbox shows the path and its run
pages link parent and child; the approval, signed by the console with alice's key, reaches
the sub-agent's run (the one that asked) and the ticket is filed once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pty
import re
import select
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from rich.console import Console
from temporalio.client import Client, WorkflowHandle

from boundloop import Agent
from boundloop.client import get_run, query_status, result_of
from boundloop.console.auth import hash_credential
from boundloop.contracts import RunResult
from boundloop.core.limits import Policy
from boundloop.devserver import port_open
from boundloop.live import render
from boundloop.signing import Signer, new_key
from boundloop.testing import free_port, wait_until
from boundloop.tools.demo import list_tickets
from tests.scripts import answer, call, resp
from tests.support.tools import tools as test_tools
from tests.test_agent_trees import run_tree
from tests.test_cli import CLI, cli, env_for
from tests.test_web_ui import CHROMIUM, CHROMIUM_ARGS

DECIDED = ("approval_approved", "approval_rejected")
PASSWORD = "correct horse battery staple"
TICKET = {"title": "Restock B-002", "description": "B-002 is out of stock",
          "priority": "normal"}


def _http(url: str, data: dict[str, str] | None = None, cookie: str | None = None
          ) -> tuple[int, dict[str, str], str]:
    """One plain HTTP request, redirects not followed: status, headers, body."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    body = urllib.parse.urlencode(data).encode() if data is not None else None
    req = urllib.request.Request(url, data=body, method="POST" if data is not None else "GET")
    if cookie:
        req.add_header("Cookie", cookie)
    try:
        with urllib.request.build_opener(NoRedirect).open(req, timeout=60) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


async def http(url: str, data: dict[str, str] | None = None, cookie: str | None = None
               ) -> tuple[int, dict[str, str], str]:
    # In a thread: this test's event loop also runs the worker that answers the console.
    return await asyncio.to_thread(_http, url, data, cookie)


#: A terminal's control sequences (colours, cursor moves of rich's live view).
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


async def on_a_terminal_until(args: list[str], env: dict[str, str], pattern: str) -> str:
    """Run the CLI with a terminal of its own (`watch` draws its live view only on one)
    until what it showed matches `pattern`, then stop it; what it showed, as text."""
    main, side = pty.openpty()
    proc = subprocess.Popen([*CLI, *args], env=env, stdin=side, stdout=side, stderr=side)
    os.close(side)
    shown = b""

    async def matched() -> bool:
        nonlocal shown
        while select.select([main], [], [], 0)[0]:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: it closed the terminal
                break
            if not chunk:
                break
            shown += chunk
        return re.search(pattern, ANSI.sub("", shown.decode(errors="replace"))) is not None

    try:
        await wait_until(matched, timeout=60)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        os.close(main)
    return ANSI.sub("", shown.decode(errors="replace"))


@dataclass
class Setup:
    """A root agent whose `ticketing` sub-agent files tickets, signed decisions only (the
    root's policy names alice's key; a sub-agent's is never looser than its caller's),
    and a console process where alice signs in, her key on its host."""

    root: Agent[Any]
    env: dict[str, str]
    url: str
    port: int
    console: subprocess.Popen[bytes]
    alice: Signer


@contextlib.contextmanager
def setup(temporal: Client, tmp_path: Path) -> Iterator[Setup]:
    keys = tmp_path / "keys"
    keys.mkdir()
    made = new_key("alice", keys)
    approvers = tmp_path / "approvers"
    approvers.write_text(f"alice {hash_credential(PASSWORD)}\n")
    ticketing = Agent(test_tools, model="scripted-model", allowed=["create_ticket"],
                      instructions="You file tickets.").as_tool("ticketing", "Files tickets")
    root = Agent(test_tools, model="scripted-model", allowed=["lookup_stock"],
                 agents=[ticketing],
                 policy=Policy(approver_keys={"alice": made.public_line.split()[1]}))
    env = {**env_for(temporal, tmp_path), "COLUMNS": "400"}
    port = free_port()
    console = subprocess.Popen(
        [sys.executable, "-m", "boundloop.cli", "console", "--port", str(port)],
        env={**env, "BOUNDLOOP_CONSOLE_APPROVERS": str(approvers),
             "BOUNDLOOP_CONSOLE_KEYS": str(keys)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        yield Setup(root=root, env=env, url=f"http://127.0.0.1:{port}", port=port,
                    console=console, alice=Signer.from_file("alice", made.private_path))
    finally:
        console.terminate()
        console.communicate(timeout=30)


#: The root calls ticketing, whose create_ticket waits for approval; once approved, the
#: sub-agent answers (create_ticket is terminal), then the root.
SCRIPT = [
    resp(call("ticketing", {"question": "Open a restock ticket for B-002"}, "p1")),
    resp(call("create_ticket", TICKET, "t1")),
    answer("Filed."),
    answer("The restock ticket for B-002 is filed."),
]
#: The root's question (in English: the screenshots' fonts).
QUESTION = "B-002 is out of stock: have it restocked"


async def waiting_child(temporal: Client, handle: WorkflowHandle[Any, RunResult]) -> str:
    """The workflow id of the root's sub-agent, once its call waits for approval."""
    seen: list[str] = []

    async def child_waits() -> bool:
        seen[:] = [w.id async for w in temporal.list_workflows(
            f"ParentWorkflowId = '{handle.id}'")]
        return bool(seen) and bool(
            (await query_status(temporal.get_workflow_handle(seen[0]))).pending)

    await wait_until(child_waits, timeout=60)
    return seen[0]


async def test_a_sub_agents_approval_is_seen_with_its_path_and_decided_where_it_asked(
        temporal: Client, tmp_path: Path) -> None:
    with setup(temporal, tmp_path) as it:
        await _seen_and_decided(temporal, tmp_path, it)


async def _seen_and_decided(temporal: Client, tmp_path: Path, it: Setup) -> None:
    env, url, port = it.env, it.url, it.port
    seen: dict[str, Any] = {}

    async def while_the_child_waits(handle: WorkflowHandle[Any, RunResult]) -> None:
        child = seen["child"] = await waiting_child(temporal, handle)
        path = f"{handle.id} → ticketing → create_ticket"

        # `pending`: the sub-agent's call, with its path; the run that decides it is the
        # sub-agent's.
        code, out, err = await cli("pending", "--json", env=env)
        assert code == 0, err
        [row] = json.loads(out)
        assert (row["workflow_id"], row["call_id"], row["tool"], row["path"]) == (
            child, "t1", "create_ticket", path)
        code, out, err = await cli("pending", env=env)
        # (The run column folds the sub-agent's long id; the JSON above names it whole.)
        assert code == 0 and f"│ {path} │" in out, out + err

        # `status` of the root lists its sub-agent; of the sub-agent, its place.
        code, out, err = await cli("status", handle.id, env=env)
        assert code == 0, err
        [line] = [x for x in out.splitlines() if x.startswith("sub-agent ")]
        assert line.startswith("sub-agent ticketing (call p1): waiting_approval · tokens 120 / ")
        assert line.endswith(f" · {child}")
        code, out, err = await cli("status", child, env=env)
        assert code == 0, err
        assert f"tree: {handle.id} → ticketing (started by {handle.id})" in out.splitlines()

        # `watch`'s frames: the caller's sub-agents and the allowance it gave; the
        # sub-agent's place.
        parent_now = await query_status(handle)
        [given] = parent_now.children
        frame = StringIO()
        Console(file=frame, width=300).print(render(handle.id, parent_now))
        assert re.search(rf"│ ticketing +│ running +│ … / {given.token_allowance} +│",
                         frame.getvalue()), frame.getvalue()
        assert ("subagent_started · ticketing · allowance: "
                f"{given.token_allowance} tokens") in frame.getvalue()
        frame = StringIO()
        Console(file=frame, width=300).print(render(child, await query_status(
            temporal.get_workflow_handle(child))))
        assert re.search(rf"tree +{handle.id} → ticketing", frame.getvalue())
        # `watch` of the caller on a terminal: the sub-agent as its own run says it is,
        # waiting for approval, with what it spent so far.
        await on_a_terminal_until(
            ["watch", handle.id], env,
            rf"│ ticketing +│ waiting_approval +│ 120 / {given.token_allowance} +│")

        # `list --root`: the tree and nothing else; the sub-agent names its parent.
        code, out, err = await cli("list", "--root", handle.id, "--json", env=env)
        assert code == 0, err
        rows = {r["workflow_id"]: r for r in json.loads(out)}
        assert set(rows) == {handle.id, child}
        assert (rows[child]["parent"], rows[child]["root"]) == (handle.id, handle.id)
        assert (rows[handle.id]["parent"], rows[handle.id]["root"]) == (None, None)
        assert rows[child]["status"] == "waiting_approval"

        # The console: the inbox shows the path, the run pages link parent and child.
        async def up() -> bool:
            return port_open("127.0.0.1", port)

        await wait_until(up, timeout=60)
        status, headers, _ = await http(f"{url}/login",
                                        {"approver": "alice", "credential": PASSWORD})
        assert status == 303
        cookie = next(v for k, v in headers.items()
                      if k.lower() == "set-cookie").split(";")[0]
        _, _, inbox = await http(f"{url}/approvals", cookie=cookie)
        root_link = f'<a href="/runs/{quote(handle.id, safe="")}">{handle.id}</a>'
        assert (f'<p class="path">asked in an agent tree: {root_link} → ticketing → '
                'create_ticket</p>') in inbox
        assert f'data-run="{child}" data-call="t1"' in inbox
        csrf = inbox.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        _, _, parent_page = await http(f"{url}/runs/{quote(handle.id, safe='')}",
                                       cookie=cookie)
        assert '<table id="children">' in parent_page
        assert f'<a href="/runs/{quote(child, safe="")}">' in parent_page
        tree_runs = f'href="/?{urllib.parse.urlencode({"root": handle.id})}"'
        assert tree_runs in parent_page
        _, _, child_page = await http(f"{url}/runs/{quote(child, safe='')}", cookie=cookie)
        assert (f'<p class="card" id="tree">sub-agent run: {root_link} → ticketing · '
                f'started by {root_link}</p>') in child_page
        # The runs list of the tree: the two runs, the sub-agent's naming its parent.
        _, _, listed = await http(f"{url}/?{urllib.parse.urlencode({'root': handle.id})}",
                                  cookie=cookie)
        assert set(re.findall(r'<tr class="[a-z_]+" data-run="([^"]+)"', listed)) == {
            handle.id, child}
        assert f'<span class="parent">started by {root_link}</span>' in listed

        # A decision on the call sent to the caller instead is refused: the caller did
        # not ask, and the sub-agent still waits.
        status, headers, _ = await http(f"{url}/decide", {
            "csrf": csrf, "run": handle.id, "call_id": "t1", "action": "approve",
            "back": "/approvals"}, cookie=cookie)
        refused = urllib.parse.parse_qs(urllib.parse.urlsplit(headers["location"]).query)
        assert status == 303 and refused["error"] == [
            f"refused: call 't1' is not waiting for approval in run {handle.id}: nothing "
            "to sign"], refused
        # The decision, as the inbox's form sends it: to the sub-agent's run.
        waiting = await query_status(temporal.get_workflow_handle(child))
        [asked] = waiting.pending
        status, headers, _ = await http(f"{url}/decide", {
            "csrf": csrf, "run": child, "call_id": "t1", "action": "approve",
            "fingerprint": asked.fingerprint, "first_run": waiting.run,
            "back": "/approvals"}, cookie=cookie)
        assert status == 303, headers
        note = urllib.parse.parse_qs(urllib.parse.urlsplit(headers["location"]).query)
        assert note["note"] == [f"run {child} · call t1: approved (signed by alice)"]

    async def once_ended(handle: WorkflowHandle[Any, RunResult]) -> None:
        code, out, err = await cli("status", handle.id, env=env)
        assert code == 0, err
        assert f"sub-agent run: completed · {seen['child']}" in out.splitlines()
        code, out, err = await cli("status", seen["child"], env=env)
        assert code == 0, err
        assert f"started by {handle.id}" in out.splitlines()

    result, _, _ = await run_tree(temporal, tmp_path, it.root, SCRIPT, question=QUESTION,
                                  during=while_the_child_waits, after=once_ended)
    assert result.reason == "completed"
    child_result = await result_of(temporal.get_workflow_handle(seen["child"],
                                                               result_type=RunResult))
    assert [(e.event, e.detail) for e in child_result.events
            if e.event in DECIDED] == [("approval_approved", "by alice")]
    assert [e.event for e in result.events if e.event in DECIDED] == []
    assert [t["title"] for t in list_tickets(tmp_path / "data")] == ["Restock B-002"]


async def test_the_console_follows_a_tree_in_the_browser(temporal: Client,
                                                         tmp_path: Path) -> None:
    """The root's page, open while its sub-agent waits: the sub-agent's row waits for
    approval; approved elsewhere (signed with alice's key), the row turns completed
    without a reload by hand. The sub-agent's page links its root. Screenshots as in
    tests/test_console.py ($BOUNDLOOP_UI_SCREENSHOTS=docs/screenshots refreshes
    docs/console.md's)."""
    if CHROMIUM is None:
        pytest.skip("Chromium not found")
    playwright_api = pytest.importorskip("playwright.async_api")
    expect = playwright_api.expect
    shots = Path(os.environ.get("BOUNDLOOP_UI_SCREENSHOTS") or tmp_path / "shots")
    shots.mkdir(parents=True, exist_ok=True)
    with setup(temporal, tmp_path) as it:

        async def in_the_browser(handle: WorkflowHandle[Any, RunResult]) -> None:
            child = await waiting_child(temporal, handle)

            async def up() -> bool:
                return port_open("127.0.0.1", it.port)

            await wait_until(up, timeout=60)
            async with playwright_api.async_playwright() as p:
                browser = await p.chromium.launch(executable_path=CHROMIUM,
                                                  args=CHROMIUM_ARGS)
                try:
                    page = await (await browser.new_context(
                        viewport={"width": 1300, "height": 900})).new_page()
                    page.set_default_timeout(30_000)
                    await page.goto(f"{it.url}/login?next=/approvals")
                    await page.fill("input[name=approver]", "alice")
                    await page.fill("input[name=credential]", PASSWORD)
                    await page.click("button[name=signin]")
                    path = page.locator(f'.approval[data-run="{child}"] .path')
                    await expect(path).to_have_text(
                        f"asked in an agent tree: {handle.id} → ticketing → create_ticket")

                    await page.goto(f"{it.url}/runs/{quote(child, safe='')}")
                    await expect(page.locator("#tree")).to_have_text(
                        f"sub-agent run: {handle.id} → ticketing · started by {handle.id}")
                    await page.screenshot(path=shots / "console-run-subagent.png",
                                          full_page=True)
                    await page.locator("#tree a").first.click()
                    row = page.locator(f'#children tr[data-run="{child}"]')
                    await expect(row).to_contain_text("waiting approval")
                    await expect(row).to_contain_text("ticketing")
                    await page.screenshot(path=shots / "console-run-tree.png",
                                          full_page=True)
                    run = await get_run(temporal, child)
                    await run.approve("t1", approver="alice", signer=it.alice)
                    await expect(row.locator(".badge")).to_have_text("completed")
                    await expect(page.locator("#state")).to_have_text("completed")
                finally:
                    await browser.close()

        result, _, _ = await run_tree(temporal, tmp_path, it.root, SCRIPT,
                                      question=QUESTION, during=in_the_browser)
    assert result.reason == "completed"
    assert [t["title"] for t in list_tickets(tmp_path / "data")] == ["Restock B-002"]
