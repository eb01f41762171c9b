"""The retry decisions the workflow makes itself (boundloop.core.retries), the worker's
own tool threads (activities/threads.py), and what a tool attempt reports about its body
(what the workflow counts)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from boundloop.activities.threads import ToolThreads
from boundloop.activities.tools import ToolActivities
from boundloop.contracts import ToolRequest
from boundloop.core import loop as core
from boundloop.core.limits import RunSettings
from boundloop.core.retries import MODEL_BACKOFF, next_delay, tool_backoff
from boundloop.errors import TOOL_TIMED_OUT


def test_model_backoff_doubles_and_stops_after_four_failures() -> None:
    delays = [next_delay(MODEL_BACKOFF, n, None, 600.0) for n in range(1, 5)]
    assert delays == [1.0, 2.0, 4.0, "exhausted"]


def test_a_provider_retry_after_wins_and_the_deadline_refuses_a_wait() -> None:
    assert next_delay(MODEL_BACKOFF, 1, 7.5, 600.0) == 7.5
    assert next_delay(MODEL_BACKOFF, 1, 30.0, 10.0) == "deadline"
    assert next_delay(MODEL_BACKOFF, 4, 0.0, 600.0) == "exhausted"


def test_tool_backoff_uses_the_tools_own_attempts() -> None:
    backoff = tool_backoff(max_attempts=3, initial_seconds=0.5)
    assert [next_delay(backoff, n, None, 600.0) for n in (1, 2, 3)] == [0.5, 1.0, "exhausted"]
    assert next_delay(tool_backoff(20, 1.0), 19, None, 1e6) == 100.0  # capped


def test_a_cancel_counts_no_unfinished_step() -> None:
    state = core.LoopState(settings=RunSettings(model="m"), allowed_tools=[])
    plan = core.begin_step(state, 0.0)
    assert isinstance(plan, core.StepPlan) and state.steps == 1
    assert core.cancelled(state, "operator", step_unfinished=True) == "cancelled"
    assert state.steps == 0
    assert [(e.event, e.detail) for e in state.events] == [
        ("model_requested", None), ("cancel_requested", "operator"), ("stopped:cancelled", None)]


def test_tool_threads_keep_free_threads_beside_a_hung_one() -> None:
    release, started = threading.Event(), threading.Event()
    threads = ToolThreads(3)

    def hang() -> bool:
        started.set()
        return release.wait(30)

    hung = threads.submit(hang)
    try:
        assert started.wait(10), "the hung call never started"
        assert threads.submit(lambda: "ran").result(timeout=10) == "ran"
        # The thread that ran it is free again once it has counted itself out (just after
        # it delivered the result); the hung call keeps its own.
        deadline = time.monotonic() + 10
        while threads.busy != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert threads.busy == 1
    finally:
        release.set()
    assert hung.result(timeout=10) is True


def test_a_call_cancelled_before_a_thread_was_free_never_runs() -> None:
    release = threading.Event()
    ran: list[str] = []
    threads = ToolThreads(1)
    hung = threads.submit(lambda: release.wait(30))
    queued = threads.submit(lambda: ran.append("body"))
    assert queued.cancel()
    release.set()
    hung.result(timeout=10)
    assert threads.submit(lambda: "next").result(timeout=10) == "next"
    assert ran == []


async def test_a_tool_attempt_reports_whether_its_body_started(tmp_path: Path) -> None:
    """With every tool thread held by a hung call, an `echo` attempt times out before its
    body starts and says so (the workflow then does not count it); a body that ran and
    timed out says it started. The real activity under the SDK's ActivityEnvironment."""
    from boundloop.tools.demo import DemoDeps
    from tests.support.tools import tools as test_tools

    release = threading.Event()
    threads = ToolThreads(1)
    hung = threads.submit(lambda: release.wait(30))
    tools = ToolActivities(test_tools, DemoDeps(data_dir=tmp_path), threads=threads)
    env = ActivityEnvironment()
    beats: list[Any] = []
    env.on_heartbeat = lambda *details: beats.append(details)

    def request(tool: str, timeout: float) -> ToolRequest:
        return ToolRequest(tool=tool, call_id="c1", step=1, arguments={"x": "1"},
                           idempotency_key="wf/step-1/call-0", max_result_bytes=4096,
                           timeout_seconds=timeout)

    try:
        with pytest.raises(ApplicationError) as queued:
            await env.run(tools.tool_execute, request("echo", 0.3))
    finally:
        release.set()
    hung.result(timeout=10)
    assert (queued.value.type, queued.value.details) == (TOOL_TIMED_OUT, ({"started": False},))

    with pytest.raises(ApplicationError) as ran:
        await env.run(tools.tool_execute, request("hang", 0.3))
    assert (ran.value.type, ran.value.details) == (TOOL_TIMED_OUT, ({"started": True},))
    # The first heartbeat comes after a second: attempts this short send none.
    assert beats == []
