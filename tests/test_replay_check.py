"""`boundloop replay-check` against the server's open runs (real dev server, the CLI as
a subprocess): the current code replays a run parked on approval; a next release with
an extra activity before the approval wait and no `workflow.patched` is caught, naming
the run and its first divergent command, before it is deployed. Deployed anyway, the
run's workflow task fails; redeploying the old code unblocks it: one ticket."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import openai
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from boundloop import Worker
from boundloop.client import result_of
from boundloop.contracts import WORKFLOW_NAME, Decision, RunInput, RunResult
from boundloop.core.limits import RunSettings
from boundloop.scripted.server import ScriptedModelServer
from boundloop.testing import wait_until
from boundloop.tools.demo import DemoDeps, list_tickets
from tests.conftest import DEMO_TOOLS, RUN_TIMEOUT, workflow_task_failures
from tests.scripts import answer, call, resp
from tests.support.next_release import swap_plugin
from tests.support.tools import tools as test_tools
from tests.test_cli import ROOT, env_for
from tests.test_docs_outputs import shown_block, shown_matches

TICKET = '{"title": "Printer on fire", "description": "3F", "priority": "high"}'
DEPLOYING = "docs/deploying.md"
#: What differs per run in the lines docs/deploying.md shows, as the page shows it: when
#: and how often the workflow task failed, Temporal's run id, how many histories the
#: test's server holds.
PER_RUN = [(re.compile(p), shown) for p, shown in (
    (r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", "2026-12-01T22:36:27Z"),
    (r"\(attempt \d+\)", "(attempt 3)"),
    (r"\(run [0-9a-f]{8}-", "(run 01a233c0-"),
    (r"replayed \d+ histories: \d+ diverge", "replayed 12 histories: 1 diverge"),
    (r"replayed \d+ histories", "replayed 12 histories"),
    # The event the run diverges at depends on how many workflow tasks (3 events each)
    # it took to get there, which timing decides: 16 and 19 both seen.
    (r"HistoryEvent\(id: \d+,", "HistoryEvent(id: 19,"),
)]


def as_deploying_shows(command: str, printed: list[str], run_id: str, shown_id: str) -> None:
    """`printed` (the lines of one command, as wide as a wide terminal) is what
    docs/deploying.md shows under `$ command`, with `run_id` shown as `shown_id`."""
    lines = []
    for line in printed:
        line = line.replace(run_id, shown_id)
        for pattern, shown in PER_RUN:
            line = pattern.sub(shown, line)
        lines.append(line)
    shown = shown_block(DEPLOYING, command)
    assert shown_matches(lines, shown), "\n".join(["printed:", *lines, "shown:", *shown])


async def cli(*args: str, env: dict[str, str], next_release: bool = False,
              ) -> tuple[int, str, str]:
    command = ([sys.executable, "-m", "tests.support.next_release", "cli"] if next_release
               else [sys.executable, "-m", "boundloop.cli"])
    proc = await asyncio.create_subprocess_exec(
        *command, *args, cwd=ROOT, env={**env, "BOUNDLOOP_TOOLS": "tests.support.tools:tools",
                                        "PYTHONPATH": str(ROOT), "COLUMNS": "400"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_replay_check_catches_an_unpatched_change_before_the_deploy(
        temporal: Client, tmp_path: Path) -> None:
    server = ScriptedModelServer([resp(call("create_ticket", TICKET, "t1")),
                                  answer("Ticket opened.")])
    model = openai.AsyncOpenAI(base_url=server.start(), api_key="sk-test-not-real")
    queue = f"rc-{uuid.uuid4().hex[:8]}"
    data = tmp_path / "data"

    def worker(*plugins: object) -> Worker[DemoDeps]:
        return Worker(temporal, test_tools, deps=DemoDeps(data_dir=data), model=model,
                      task_queue=queue, plugins=list(plugins),  # type: ignore[arg-type]
                      sticky_timeout=timedelta(seconds=1))

    inp = RunInput(question="open a ticket", settings=RunSettings(model="scripted-model"),
                   tools=DEMO_TOOLS)
    env = env_for(temporal, tmp_path)
    watch: asyncio.subprocess.Process | None = None
    try:
        async with worker():
            handle = await temporal.start_workflow(
                WORKFLOW_NAME, inp, id=f"rc-{uuid.uuid4().hex[:12]}", task_queue=queue,
                result_type=RunResult)

            async def parked() -> bool:
                st = await handle.query("status")
                return bool(st["pending"])

            await wait_until(parked, timeout=60)
        shown_id = "rc-6f0c1d2e9a11"
        code, out, err = await cli("replay-check", env=env)
        assert code == 0, err
        assert "all replay" in out
        as_deploying_shows("boundloop replay-check", out.splitlines(), handle.id, shown_id)
        code, out, err = await cli("replay-check", env=env, next_release=True)
        assert code == 5, (out, err)
        assert handle.id in err and "Nondeterminism" in err and "BoundLoop" in err
        # The page shows this run's line (the test's server may hold others) and the total.
        as_deploying_shows("boundloop replay-check          # with the next release checked out",
                           [x for x in err.splitlines() if handle.id in x] + out.splitlines(),
                           handle.id, shown_id)
        # Deployed anyway: the decision's workflow task fails on the new code.
        async with worker(swap_plugin()):
            await handle.signal("approve", Decision(call_id="t1", approve=True))
            await wait_until(lambda: _failed(handle, temporal), timeout=60)
            code, out, err = await cli("status", handle.id, env=env)
            assert code == 6, (out, err)
            assert "workflow task failing since" in err and "Nondeterminism" in err
            assert "deploy the code it started on" in err
            as_deploying_shows(f"boundloop status {shown_id}", (out + err).splitlines(),
                               handle.id, shown_id)
            code, out, err = await cli("approve", handle.id, "t1", env=env)
            assert code == 6, (out, err)
            # Recorded (a signal): the approval already sent is applied once, below.
            assert "workflow task failing since" in err and "decision is recorded" in err
            as_deploying_shows(f"boundloop approve {shown_id} t1", (out + err).splitlines(),
                               handle.id, shown_id)
            # The server marks it too (the Web UI's Task Failures view lists it).
            query = (f"WorkflowId = '{handle.id}' AND "
                     "TemporalReportedProblems IS NOT NULL")
            await wait_until(lambda: _count(temporal, query), timeout=60)
            code, out, err = await cli("list", "--json", env=env)
            assert code == 0, err
            row = next(r for r in json.loads(out) if r["workflow_id"] == handle.id)
            assert row["stuck"] and "Nondeterminism" in row["stuck"]
            assert "deploy the code it started on" in row["stuck"]
            code, out, err = await cli("list", env=env)
            assert f"stuck: {handle.id}: workflow task failing since" in " ".join(out.split())
            # The table, then this run's line (the test's server may hold other stuck runs).
            as_deploying_shows("boundloop list", [x for x in out.splitlines() if
                                                  not x.startswith("stuck:") or handle.id in x],
                               handle.id, shown_id)
            # watch says why it does not move (not "no worker is answering").
            watched = tmp_path / "watch.out"
            watch = await _start_cli("watch", handle.id, env=env, out=watched)

            async def watch_says_stuck() -> bool:
                return "workflow task failing" in watched.read_text()

            await wait_until(watch_says_stuck, timeout=60)
            assert "Nondeterminism" in " ".join(watched.read_text().split())
        # The old code back: the run replays and completes, one ticket; watch ends with it.
        async with worker():
            result = await asyncio.wait_for(result_of(handle), timeout=RUN_TIMEOUT)
            assert await asyncio.wait_for(watch.wait(), timeout=60) == 0
    finally:
        server.stop()
        if watch is not None and watch.returncode is None:
            watch.kill()
    assert result.reason.value == "completed"
    assert len(list_tickets(data)) == 1


async def _start_cli(*args: str, env: dict[str, str], out: Path,
                     ) -> asyncio.subprocess.Process:
    with out.open("wb") as sink:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "boundloop.cli", *args, cwd=ROOT,
            env={**env, "BOUNDLOOP_TOOLS": "tests.support.tools:tools",
                 "PYTHONPATH": str(ROOT), "COLUMNS": "400"},
            stdout=sink, stderr=asyncio.subprocess.STDOUT)


async def _count(client: Client, query: str) -> bool:
    return (await client.count_workflows(query)).count == 1


async def _failed(handle: object, client: Client) -> bool:
    return await workflow_task_failures(handle, client) > 0  # type: ignore[arg-type]


def test_a_divergence_raised_by_workflow_code_is_its_message_not_the_sdks_dump() -> None:
    """The shape the Replayer reports when the workflow code raises on replay (here a
    KeyError for a tool the local toolset lacks): one line with the exception's message,
    not several KB of the failure with its stack trace."""
    from boundloop.replay_check import _first_line

    dump = ('Workflow activation completion failed: Failure { failure: Some(Failure { '
            'message: "\'create_ticket\'", source: "", stack_trace: "Traceback (most recent '
            'call last):\\n  File \\"workflows/loop.py\\", line 599' + "x" * 4000 + '" }) }')
    line = _first_line(RuntimeError(dump))
    assert line == "the workflow code raised: 'create_ticket'"
    nondeterminism = ('Failure { message: "[TMPRL1100] Nondeterminism error: Activity machine '
                      'does not handle this event: HistoryEvent(id: 22, TimerStarted)", '
                      'source: "" }')
    assert _first_line(RuntimeError(nondeterminism)) == (
        "[TMPRL1100] Nondeterminism error: Activity machine does not handle this event: "
        "HistoryEvent(id: 22, TimerStarted)")


async def test_replay_check_catches_a_timer_of_another_duration_that_temporal_replays(
        temporal: Client, tmp_path: Path) -> None:
    """A release with a 1 s timer before the approval wait replays without an error in
    Temporal's replayer (timers match by order, not duration): on it, the approved run
    would wait for its history's 24 h approval timer. replay-check names the timer and
    both durations; the code of now replays the same run with nothing to say."""
    from boundloop.replay_check import replay_check
    from boundloop.worker.plugin import Plugin
    from tests.support import timer_release

    server = ScriptedModelServer([resp(call("create_ticket", TICKET, "t1")),
                                  answer("Ticket opened.")])
    model = openai.AsyncOpenAI(base_url=server.start(), api_key="sk-test-not-real")
    queue = f"rt-{uuid.uuid4().hex[:8]}"
    data = tmp_path / "data"

    def worker(*plugins: object) -> Worker[DemoDeps]:
        return Worker(temporal, test_tools, deps=DemoDeps(data_dir=data), model=model,
                      task_queue=queue, plugins=list(plugins),  # type: ignore[arg-type]
                      sticky_timeout=timedelta(seconds=1))

    inp = RunInput(question="open a ticket", settings=RunSettings(model="scripted-model"),
                   tools=DEMO_TOOLS)
    try:
        async with worker():
            handle = await temporal.start_workflow(
                WORKFLOW_NAME, inp, id=f"rt-{uuid.uuid4().hex[:12]}", task_queue=queue,
                result_type=RunResult)

            async def parked() -> bool:
                return bool((await handle.query("status"))["pending"])

            await wait_until(parked, timeout=60)

        async def diverges(*plugins: object) -> list[str]:
            _, diverged = await replay_check(
                temporal, [Plugin(test_tools, deps=None), *plugins])  # type: ignore[list-item]
            return [d.message for d in diverged if d.run_id == handle.result_run_id]

        assert await diverges() == []
        [message] = await diverges(timer_release.swap_plugin())
        assert re.fullmatch(
            r"timer \d+ \(HistoryEvent \d+, TimerStarted\) was started for 86400 s, this "
            r"code starts it for 1 s: Temporal's replayer matches timers by order, not "
            r"duration, so the run would wait for the history's timer", message), message
    finally:
        server.stop()
        await handle.terminate("replay-check test finished")
    assert list_tickets(data) == []


async def test_every_committed_history_issues_the_timers_and_activities_it_recorded() -> None:
    """Where nothing changed replay-check has nothing to say: every committed history of
    every release, replayed on this code, issues its timers with the durations and its
    activities with the types and task queues (the holders' own queues included) its
    history recorded."""
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.worker import Replayer

    from boundloop import Plugin
    from boundloop.replay_check import _Recording, first_difference
    from tests.support.crash_tools import tools
    from tests.test_replay import ALL_FILES, load

    recording = _Recording()
    replayer = Replayer(workflows=[], data_converter=pydantic_data_converter,
                        plugins=[Plugin(tools, deps=None), recording])
    differ, compared = {}, 0
    for name in ALL_FILES:
        history = load(name)
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert result.replay_failure is None, name
        issued = recording.issued.pop(history.run_id)
        timers = {e.timer_started_event_attributes.timer_id for e in history.events
                  if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED}
        activities = {e.activity_task_scheduled_event_attributes.activity_id
                      for e in history.events
                      if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED}
        compared += sum(1 for c in issued if c.HasField("start_timer")
                        and str(c.start_timer.seq) in timers)
        compared += sum(1 for c in issued if c.HasField("schedule_activity")
                        and c.schedule_activity.activity_id in activities)
        found = first_difference(history, issued, recording.queues.pop(history.run_id))
        if found is not None:
            differ[name] = found
    assert differ == {}
    assert compared >= len(ALL_FILES)  # the comparison saw the histories' commands
