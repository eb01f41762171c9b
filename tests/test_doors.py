"""The doors boundloop does not own, tried as a starter with namespace access who is no
approver and holds no approver key: Temporal's cron schedules, a workflow id reused by a
new run, raw signals and updates. Each test got a side effect through (or an approval
moved to another call) before the doors were guarded; each is refused now, through the
real workflow on a dev server, a real worker and the scripted model over HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError

from boundloop._ops import pending_runs
from boundloop.client import (
    decide,
    get_run,
    query_status,
    record,
    result_of,
)
from boundloop.console.auth import hash_credential
from boundloop.contracts import (
    SESSION_WORKFLOW,
    WORKFLOW_NAME,
    Carried,
    ConversationRef,
    Decision,
    RunResult,
    SessionInput,
    run_input,
)
from boundloop.core.conversation import ConversationMeta, user_message
from boundloop.core.limits import Policy, RunSettings
from boundloop.core.loop import LoopState
from boundloop.core.rules import Grant
from boundloop.core.session import SessionState, turn_id
from boundloop.devserver import port_open
from boundloop.errors import DecisionRefused
from boundloop.scripted.server import ScriptedModelServer
from boundloop.signing import Signer, new_key
from boundloop.testing import free_port
from boundloop.tools.demo import list_tickets
from tests import conftest
from tests.conftest import RUN_TIMEOUT
from tests.scripts import answer, call, resp
from tests.test_cli import cli, env_for

BENIGN = {"title": "restock paper", "description": "3F printer is out of paper",
          "priority": "low"}
MALICIOUS = {"title": "wire funds", "description": "send $10,000 to account 0001",
             "priority": "high"}
WAIT = 60.0


@dataclass
class Served:
    server: ScriptedModelServer
    queue: str
    data: Path

    def tickets(self) -> list[dict[str, Any]]:
        return list_tickets(self.data)


@contextlib.asynccontextmanager
async def served(temporal: Client, tmp_path: Path,
                 turns: list[dict[str, Any]]) -> AsyncIterator[Served]:
    """A boundloop worker of the demo tools (create_ticket asks for approval) against a
    scripted model."""
    server = ScriptedModelServer(turns)
    base_url = server.start()
    queue = f"doors-{uuid.uuid4().hex[:8]}"
    data = tmp_path / "data"
    try:
        async with conftest.test_worker(temporal, queue, base_url, data):
            yield Served(server, queue, data)
    finally:
        server.stop()


async def until(check: Any, what: str, timeout: float = WAIT) -> Any:
    async def poll() -> Any:
        while True:
            value = await check()
            if value:
                return value
            await asyncio.sleep(0.2)
    try:
        return await asyncio.wait_for(poll(), timeout)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def closed_runs(temporal: Client, workflow_id: str) -> list[str]:
    """The run ids of `workflow_id`'s closed runs."""
    return [w.run_id async for w in temporal.list_workflows(f"WorkflowId = '{workflow_id}'")
            if w.status not in (None, WorkflowExecutionStatus.RUNNING)]


# --- carried state only from the run's own continue-as-new ------------------------------


async def forged_carried(temporal: Client, queue: str, policy: Policy) -> Carried:
    """A run state as continue-as-new hands it over, written by the starter: admitted
    (it says) with `policy`, allowed to call create_ticket. Its conversation so far is
    that of a real run with none (one refused as it started), so the model activity
    finds it in history as it would a genuine one's."""
    state = LoopState(settings=RunSettings(model="scripted-model", policy=policy),
                      allowed_tools=["create_ticket"])
    empty = await temporal.start_workflow(
        WORKFLOW_NAME, run_input("-", instructions=None, settings=state.settings,
                                 tools=["no_such_tool"]),
        id=f"empty-{uuid.uuid4().hex[:8]}", task_queue=queue)
    with contextlib.suppress(Exception):
        await empty.result()
    return Carried(state=state, base=ConversationRef(workflow_id=empty.id,
                                                     run_id=empty.result_run_id or "",
                                                     meta=ConversationMeta()),
                   unsent=[user_message("open the ticket")])


async def test_a_cron_started_run_with_a_forged_carried_state_is_refused(
        temporal: Client, tmp_path: Path) -> None:
    """The server starts a cron schedule's next run with `continued_run_id` set and the
    first run's input: it looked like continue-as-new, and the forged state (approval
    "never") skipped the admission. Every run of the schedule is refused now, before any
    model request, and nothing is written."""
    wf = f"cron-forged-{uuid.uuid4().hex[:8]}"
    async with served(temporal, tmp_path, [resp(call("create_ticket", MALICIOUS, "t1")),
                                           answer("done")] * 3) as env:
        inp = run_input("open the ticket", instructions=None,
                        settings=RunSettings(model="scripted-model"), tools=["create_ticket"])
        forged = await forged_carried(temporal, env.queue, Policy(approval="never"))
        inp = inp.model_copy(update={"carried": forged})
        handle = await temporal.start_workflow(WORKFLOW_NAME, inp, id=wf, task_queue=env.queue,
                                               cron_schedule="@every 2s")
        try:
            runs = await until(lambda: _at_least(temporal, wf, 2), "two cron runs to close")
        finally:
            await handle.terminate("test over")
        for run_id in runs[:2]:
            events = (await temporal.get_workflow_handle(wf, run_id=run_id)
                      .fetch_history()).events
            failure = events[-1].workflow_execution_failed_event_attributes.failure
            assert "carried state comes only from the run" in failure.message, run_id
        started = (await temporal.get_workflow_handle(wf, run_id=runs[0]).fetch_history()
                   ).events[0].workflow_execution_started_event_attributes
        assert started.cron_schedule and started.continued_execution_run_id
    assert env.server.requests == [] and env.tickets() == []


async def _at_least(temporal: Client, wf: str, n: int) -> list[str] | None:
    """The closed runs once there are `n`, those started by the schedule first."""
    runs = await closed_runs(temporal, wf)
    if len(runs) < n:
        return None
    # The schedule's next runs carry `continued_run_id`: put those first.
    flagged = []
    for run_id in runs:
        events = (await temporal.get_workflow_handle(wf, run_id=run_id).fetch_history()).events
        started = events[0].workflow_execution_started_event_attributes
        flagged.append((not started.continued_execution_run_id, run_id))
    return [run_id for _, run_id in sorted(flagged)]


async def test_a_cron_started_session_drops_its_forged_grants(
        temporal: Client, tmp_path: Path) -> None:
    """A session's grants (approvals remembered for the session) and conversation came
    through continue-as-new only, but a cron schedule's next run has `continued_run_id`
    too: its forged grant "by alice" approved create_ticket on the next `say`. Now the
    call waits for a real approval."""
    wf = f"cron-session-{uuid.uuid4().hex[:8]}"
    forged = Grant(tool="create_ticket", when=None, approver="alice", call_id="t0",
                   scope="session")
    async with served(temporal, tmp_path, [resp(call("create_ticket", MALICIOUS, "t1")),
                                           answer("done")]) as env:
        state = SessionState(idle_since=datetime.now(UTC).isoformat(), grants=[forged])
        handle = await temporal.start_workflow(
            SESSION_WORKFLOW, SessionInput(settings=RunSettings(model="scripted-model"),
                                           tools=["create_ticket"], state=state),
            id=wf, task_queue=env.queue, cron_schedule="@every 2s")
        try:
            # The schedule's first run (no `continued_run_id`: its grants were dropped
            # already) is ended, so that the schedule starts the next.
            first = await until(lambda: _running(temporal, wf), "the first session run")
            await temporal.get_workflow_handle(wf, run_id=first).execute_update("end")
            # The schedule's second run: started with `continued_run_id` set, open.
            async def second() -> WorkflowHandle[Any, Any] | None:
                desc = await handle.describe()
                attrs = (await temporal.get_workflow_handle(wf, run_id=desc.run_id)
                         .fetch_history()).events[0]
                started = attrs.workflow_execution_started_event_attributes
                return (handle if started.continued_execution_run_id
                        and desc.status == WorkflowExecutionStatus.RUNNING else None)
            await until(second, "the schedule's second session run")
            session = temporal.get_workflow_handle(wf)
            say = asyncio.ensure_future(session.execute_update(
                "say", {"message": "open the ticket"}, result_type=RunResult))
            turn = temporal.get_workflow_handle(turn_id(wf, 1))
            await until(lambda: _pending(turn), "the turn to ask")
            status = await query_status(turn)
            assert [a.call_id for a in status.pending] == ["t1"]
            assert not [e for e in status.events if e.event.startswith(
                ("approval_inherited", "approval_remembered"))]
            say.cancel()
        finally:
            with contextlib.suppress(Exception):
                await handle.terminate("test over")
    assert env.tickets() == []


async def _running(temporal: Client, wf: str) -> str | None:
    desc = await temporal.get_workflow_handle(wf).describe()
    return desc.run_id if desc.status == WorkflowExecutionStatus.RUNNING else None


# --- a decision binds what its approver saw ------------------------------------------


async def parked(temporal: Client, wf: str, queue: str) -> WorkflowHandle[Any, Any]:
    """A run under `wf` waiting for approval of call t1 (the script's next create_ticket)."""
    inp = run_input("open the ticket", instructions=None,
                    settings=RunSettings(model="scripted-model"), tools=["create_ticket"])
    handle = await temporal.start_workflow(WORKFLOW_NAME, inp, id=wf, task_queue=queue,
                                           result_type=RunResult)

    async def waiting() -> bool:
        return bool((await query_status(handle)).pending)
    await until(waiting, "the call to wait for approval")
    return temporal.get_workflow_handle(wf, result_type=RunResult)


SWAP_SCRIPT = [resp(call("create_ticket", BENIGN, "t1")),
               resp(call("create_ticket", MALICIOUS, "t1")), answer("done")]


async def test_the_cli_refuses_a_decision_on_a_call_swapped_under_the_same_workflow_id(
        temporal: Client, tmp_path: Path) -> None:
    """alice reads `pending` (benign arguments); the starter terminates the run and starts
    another under the same workflow id and call id with other arguments; alice's
    `approve --fp` (the fingerprint she read) is refused, nothing is written."""
    wf = f"swap-{uuid.uuid4().hex[:8]}"
    cli_env = env_for(temporal, tmp_path)
    async with served(temporal, tmp_path, SWAP_SCRIPT) as env:
        await parked(temporal, wf, env.queue)
        code, out, err = await cli("pending", "--json", env=cli_env)
        assert code == 0, err
        shown = next(p for p in json.loads(out) if p["workflow_id"] == wf)
        assert shown["arguments"] == BENIGN
        await temporal.get_workflow_handle(wf).terminate("swapped")
        swapped = await parked(temporal, wf, env.queue)
        code, out, err = await cli("approve", wf, "t1", "--fp",
                                   shown["fingerprint"].split(":")[1], env=cli_env)
        assert code != 0 and "the call changed since you looked at it" in " ".join(
            err.split()), (out, err)
        status = await query_status(swapped)
        assert [a.arguments for a in status.pending] == [MALICIOUS]
        await swapped.terminate("test over")
    assert env.tickets() == []


async def test_a_decision_captured_for_one_run_is_refused_by_a_new_run_under_its_id(
        temporal: Client, tmp_path: Path) -> None:
    """alice's signed approval of run A, sent again by the starter (raw update and raw
    signal) to run B under the same workflow id with the same call: refused, because it
    names and signs run A. Before, it was `approved (signed by alice)` within the
    signature's 300 s."""
    wf = f"replay-{uuid.uuid4().hex[:8]}"
    made = new_key("alice", tmp_path)
    alice = Signer.from_file("alice", made.private_path)
    policy = Policy(approver_keys={"alice": alice.public_key})
    script = [resp(call("create_ticket", BENIGN, "t1")), answer("filed"),
              resp(call("create_ticket", BENIGN, "t1")), answer("filed again")]
    async with served(temporal, tmp_path, script) as env:
        inp = run_input("open the ticket", instructions=None,
                        settings=RunSettings(model="scripted-model", policy=policy),
                        tools=["create_ticket"])
        first = await temporal.start_workflow(WORKFLOW_NAME, inp, id=wf, task_queue=env.queue,
                                              result_type=RunResult)
        await until(lambda: _pending(first), "run A to ask")
        run_a = await get_run(temporal, wf)
        captured = await run_a._bound(Decision(call_id="t1", approve=True, approver="alice"),
                                      alice)
        assert captured.run == (await query_status(first)).run
        await decide(first, captured)  # alice approves run A: one ticket
        result_a = await asyncio.wait_for(result_of(first), RUN_TIMEOUT)
        assert result_a.reason.value == "completed"
        second = await temporal.start_workflow(WORKFLOW_NAME, inp, id=wf, task_queue=env.queue,
                                               result_type=RunResult)
        await until(lambda: _pending(second), "run B to ask")
        with pytest.raises(Exception) as refused:
            await decide(second, captured)
        assert "the call changed since you looked at it" in str(refused.value.__cause__ or
                                                                refused.value)
        await record(second, captured)  # the signal: ignored, the call still waits
        status = await query_status(second)
        assert [a.status for a in status.pending] == ["pending"]
        # A decision made for run B approves it: and it gets a ticket of its own, since
        # its idempotency key is its run's, not the workflow id's.
        await (await get_run(temporal, wf)).approve("t1", signer=alice)
        result_b = await asyncio.wait_for(result_of(second), RUN_TIMEOUT)
    assert result_b.reason.value == "completed"
    assert len(env.tickets()) == 2


async def _pending(handle: WorkflowHandle[Any, Any]) -> bool:
    with contextlib.suppress(RPCError):  # not started yet
        return bool((await query_status(handle)).pending)
    return False


async def test_the_api_refuses_a_decision_for_arguments_other_than_those_shown(
        temporal: Client, tmp_path: Path) -> None:
    wf = f"shown-{uuid.uuid4().hex[:8]}"
    async with served(temporal, tmp_path, SWAP_SCRIPT) as env:
        handle = await parked(temporal, wf, env.queue)
        run = await get_run(temporal, wf)
        seen = (await run.status())
        await handle.terminate("swapped")
        await parked(temporal, wf, env.queue)
        with pytest.raises(DecisionRefused, match="the call changed since you looked at it"):
            await run.approve("t1", fingerprint=seen.pending[0].fingerprint, run=seen.run)
        # The same decision naming only the run is refused too: a new run holds the id.
        with pytest.raises(DecisionRefused, match="another run, or a new run"):
            await run.approve("t1", run=seen.run)
        await temporal.get_workflow_handle(wf).terminate("test over")
    assert env.tickets() == []


@contextlib.contextmanager
def console_serving(temporal: Client, tmp_path: Path) -> Iterator[str]:
    """`boundloop console` as its own process, as an operator runs it (test_console's
    `deployed`): alice signs in with test_console's PASSWORD and her key signs her
    decisions; no codec key (the runs' payloads are plain). Yields its URL."""
    from tests.test_console import PASSWORD

    keys = tmp_path / "console-keys"
    keys.mkdir()
    new_key("alice", keys)
    approvers = tmp_path / "approvers"
    approvers.write_text(f"alice {hash_credential(PASSWORD)}\n")
    port = free_port()
    console = subprocess.Popen(
        [sys.executable, "-m", "boundloop.cli", "console", "--port", str(port)],
        env={**env_for(temporal, tmp_path), "BOUNDLOOP_CONSOLE_APPROVERS": str(approvers),
             "BOUNDLOOP_CONSOLE_KEYS": str(keys)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        console.terminate()
        console.communicate(timeout=30)


async def test_the_console_refuses_a_decision_on_a_call_swapped_under_the_same_workflow_id(
        temporal: Client, tmp_path: Path) -> None:
    """alice opens the approvals inbox in the browser and sees the benign call; the starter
    terminates the run and starts another under the same workflow id and call id with
    other arguments; alice clicks Approve on the card she still sees. The console's form
    carries the run and the fingerprint she was shown: refused, nothing is written.
    Before, the form named the workflow id and call id only, and the console approved
    (and signed as alice) whatever waited under them when she clicked."""
    from tests.test_web_ui import CHROMIUM, CHROMIUM_ARGS  # skips without Playwright

    if CHROMIUM is None:
        pytest.skip("Chromium not found")
    from tests.test_console import WAIT_MS, expect, playwright_api, sign_in_browser

    wf = f"console-swap-{uuid.uuid4().hex[:8]}"
    async with served(temporal, tmp_path, SWAP_SCRIPT) as env:
        with console_serving(temporal, tmp_path) as url:
            await parked(temporal, wf, env.queue)

            async def listed() -> bool:  # the inbox finds waiting runs by search attribute
                return wf in [w for w, _ in await pending_runs(temporal)]

            await until(listed, "the inbox to list the run")
            await until(lambda: _port_open(url), "the console to listen")
            async with playwright_api.async_playwright() as p:
                browser = await p.chromium.launch(executable_path=CHROMIUM,
                                                  args=CHROMIUM_ARGS)
                try:
                    page = await (await browser.new_context()).new_page()
                    page.set_default_timeout(WAIT_MS)
                    await sign_in_browser(page, url)
                    await page.goto(f"{url}/approvals")
                    card = page.locator(f'.approval[data-run="{wf}"][data-call="t1"]')
                    await expect(card.locator(".arguments")).to_contain_text(
                        BENIGN["description"])
                    # The swap, while alice's page stays as it is (not reloaded).
                    await temporal.get_workflow_handle(wf).terminate("swapped")
                    swapped = await parked(temporal, wf, env.queue)
                    assert [a.arguments for a in (await query_status(swapped)).pending
                            ] == [MALICIOUS]
                    await expect(card.locator(".arguments")).to_contain_text(
                        BENIGN["description"])
                    await card.locator("button[name=approve]").click()
                    await expect(page.locator("#error")).to_contain_text(
                        "the call changed since you looked at it")
                    await expect(page.locator("#note")).to_have_count(0)
                    # The inbox, drawn again, shows what waits now.
                    await expect(card.locator(".arguments")).to_contain_text(
                        MALICIOUS["description"])
                finally:
                    await browser.close()
            status = await query_status(swapped)
            assert [(a.call_id, a.status, a.arguments) for a in status.pending] == [
                ("t1", "pending", MALICIOUS)]
            assert not [e for e in status.events if e.event.startswith("approval_a")]
            await swapped.terminate("test over")
    assert env.tickets() == []


async def _port_open(url: str) -> bool:
    return port_open("127.0.0.1", int(url.rsplit(":", 1)[1]))


# --- the budget ledger's own start --------------------------------------------------


async def test_a_ledger_started_first_with_a_timeout_refuses_the_operators_budget(
        temporal: Client, tmp_path: Path) -> None:
    """A stranger starts a budget's ledger before the operator does, with an execution
    timeout: the operator's `budget set` attached to it, runs spent from it, and at the
    timeout everything it counted was gone. Now it refuses the limits, naming the fix."""
    from boundloop.budgets import set_budget
    from boundloop.contracts import BUDGET_WORKFLOW, LedgerInput, budget_workflow_id
    from boundloop.core.budget import BudgetLimits, LedgerState
    from boundloop.errors import BudgetRefused

    key = f"doors-{uuid.uuid4().hex[:8]}"
    async with served(temporal, tmp_path, []) as env:
        squatter = await temporal.start_workflow(
            BUDGET_WORKFLOW, LedgerInput(state=LedgerState(key=key, limits=None)),
            id=budget_workflow_id(key), task_queue=env.queue,
            execution_timeout=timedelta(minutes=10))
        with pytest.raises(BudgetRefused, match=r"started with a timeout.*terminate it"):
            await set_budget(temporal, key, BudgetLimits(usd=5.0), task_queue=env.queue)
        await squatter.terminate("test over")
