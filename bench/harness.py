"""What the bench runs on: its own dev server, a scripted model, a worker process.

Everything listens on 127.0.0.1 and lives in one temporary directory. Every wait is
bounded in time.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from boundloop.scripted.builders import fn_call, reasoning_item, responses_turn, usage
from boundloop.scripted.server import ScriptedModelServer

REPO = Path(__file__).resolve().parent.parent
TOOLS_ENV = "bench.tools:tools"


def median(values: Iterable[float]) -> float:
    data = list(values)
    return statistics.median(data) if data else float("nan")


# --- the scripted model ------------------------------------------------------------


class Model:
    """The scripted OpenAI-compatible server on one fixed port.

    `fresh()` replaces it by a new one on the same port (the server closes every
    connection after its answer, so clients notice nothing): each phase starts with
    an empty request record. Turn ids are unique for the whole bench, so turns may be
    served to any run in any order.
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self.server: ScriptedModelServer | None = None
        self._n = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def fresh(self) -> ScriptedModelServer:
        self.stop()
        self.server = ScriptedModelServer([], port=self.port)
        self.server.start()
        return self.server

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def feed(self, turns: list[dict[str, Any]]) -> None:
        assert self.server is not None
        for t in turns:
            self.server.append(t)

    def feed_calls(self, name: str, args: list[dict[str, Any]]) -> int:
        """A fresh server with one call turn for each of `args`, plus spares; returns the
        number of spares. Every turn is a call, served to any run in arrival order, so a
        model request retried after a lost attempt (it consumes a turn of its own) takes
        a spare one instead of leaving the last run without a turn."""
        spare = max(5, len(args) // 10)
        self.fresh()
        self.feed([self.call(name, a) for a in [*args, *args[:spare]]])
        return spare

    def call(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        """A turn with a reasoning item and one function call (unique ids)."""
        self._n += 1
        n = self._n
        return {"body": responses_turn(
            id=f"resp_b{n}", reasoning=reasoning_item(f"rs_b{n}"),
            calls=[fn_call(name, args, call_id=f"call_b{n}")], usage=usage(100, 20))}

    def answer(self, text: str = "Done: every part was read.") -> dict[str, Any]:
        self._n += 1
        return {"body": responses_turn(id=f"resp_b{self._n}", text=text,
                                       usage=usage(100, 20))}


# --- the worker process ------------------------------------------------------------


@dataclass
class WorkerProcess:
    """`python -m bench.worker` as a child process (its own RSS and CPU)."""

    address: str
    queue: str
    model_url: str
    data_dir: Path
    log_file: Path
    bench_queue: str | None = None
    max_cached_workflows: int | None = None
    stats_file: Path | None = None
    shared_queue_only: bool = False
    census_file: Path | None = None
    #: The operator's policy file (BOUNDLOOP_POLICY), if any.
    policy_file: Path | None = None
    proc: asyncio.subprocess.Process | None = field(default=None, init=False)

    async def start(self, timeout: float = 60.0) -> WorkerProcess:
        env = {**os.environ, "TEMPORAL_ADDRESS": self.address,
               "BOUNDLOOP_TASK_QUEUE": self.queue, "BOUNDLOOP_DATA_DIR": str(self.data_dir),
               "OPENAI_BASE_URL": self.model_url, "OPENAI_API_KEY": "sk-bench-not-real",
               "BOUNDLOOP_TOOLS": TOOLS_ENV, "PYTHONUNBUFFERED": "1"}
        if self.policy_file is not None:
            env["BOUNDLOOP_POLICY"] = str(self.policy_file)
        args = [sys.executable, "-m", "bench.worker"]
        if self.bench_queue:
            args += ["--bench-queue", self.bench_queue]
        if self.max_cached_workflows is not None:
            args += ["--max-cached-workflows", str(self.max_cached_workflows)]
        if self.stats_file is not None:
            args += ["--stats", str(self.stats_file)]
        if self.shared_queue_only:
            args.append("--shared-queue-only")
        if self.census_file is not None:
            args += ["--census", str(self.census_file)]
        log = self.log_file.open("ab")
        self.proc = await asyncio.create_subprocess_exec(
            *args, cwd=REPO, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=log)
        log.close()
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not line.startswith(b"ready"):
            await self.stop()
            raise RuntimeError(f"bench worker did not start; see {self.log_file}")
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def stop(self, timeout: float = 30.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            proc.kill()
            await asyncio.wait_for(proc.wait(), timeout)


# --- /proc -------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    """VmRSS of `pid` in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of `pid` so far (its threads included)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


class CpuMeter:
    """CPU seconds each of some processes used between `start()` and `stop()`."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self._t0: dict[str, float] = {}
        self.used: dict[str, float] = {}

    def start(self) -> CpuMeter:
        self._t0 = {k: cpu_seconds(p) for k, p in self.pids.items()}
        return self

    def stop(self) -> dict[str, float]:
        self.used = {k: cpu_seconds(p) - self._t0[k] for k, p in self.pids.items()}
        return self.used


# --- history -----------------------------------------------------------------------


async def history_events(client: Client, workflow_id: str, run_id: str | None = None,
                         max_runs: int = 20) -> list[HistoryEvent]:
    """Events of a workflow's runs from `run_id` on, following continue-as-new."""
    events: list[HistoryEvent] = []
    for _ in range(max_runs):
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        events.extend(history.events)
        last = history.events[-1]
        if last.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
            return events
        run_id = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
    raise RuntimeError(f"{workflow_id}: more than {max_runs} runs")


def history_bytes(events: list[HistoryEvent]) -> int:
    return sum(e.ByteSize() for e in events)


@dataclass(frozen=True)
class Act:
    """One activity as its history events tell it (seconds on the server's clock)."""

    name: str
    scheduled: float
    started: float
    completed: float


def _ts(event: HistoryEvent) -> float:
    return event.event_time.seconds + event.event_time.nanos / 1e9


def activities(events: list[HistoryEvent]) -> list[Act]:
    """Completed activities in schedule order, local activities too: a local activity's
    marker is written with the workflow task that ran it, so it is scheduled, started
    and completed at that event's time (its run time counts in the task around it)."""
    sched: dict[int, tuple[str, float]] = {}
    started: dict[int, float] = {}
    done: list[Act] = []
    for e in events:
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            marker = e.marker_recorded_event_attributes
            if marker.marker_name == "core_local_activity" and "result" in marker.details:
                data = json.loads(marker.details["data"].payloads[0].data)
                done.append(Act(data["activity_type"], _ts(e), _ts(e), _ts(e)))
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = e.activity_task_scheduled_event_attributes
            sched[e.event_id] = (attrs.activity_type.name, _ts(e))
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started[e.activity_task_started_event_attributes.scheduled_event_id] = _ts(e)
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            sid = e.activity_task_completed_event_attributes.scheduled_event_id
            name, at = sched[sid]
            done.append(Act(name, at, started.get(sid, at), _ts(e)))
    return sorted(done, key=lambda a: a.scheduled)


def bytes_by_kind(events: list[HistoryEvent], names: dict[str, str]) -> dict[str, int]:
    """History bytes grouped: activity events by `names[activity type]`, others by type."""
    kind_of: dict[int, str] = {}
    out: dict[str, int] = {}
    for e in events:
        marker = e.marker_recorded_event_attributes
        if (e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
                and marker.marker_name == "core_local_activity" and "result" in marker.details):
            # A local activity's result is its marker (no activity events of its own).
            name = json.loads(marker.details["data"].payloads[0].data)["activity_type"]
            key = f"{names.get(name, name)}: result (completed)"
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = e.activity_task_scheduled_event_attributes.activity_type.name
            kind_of[e.event_id] = names.get(name, name)
            key = f"{kind_of[e.event_id]}: input (scheduled)"
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            sid = e.activity_task_completed_event_attributes.scheduled_event_id
            key = f"{kind_of.get(sid, '?')}: result (completed)"
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            key = "activity started events"
        elif e.event_type in (EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
                              EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED,
                              EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED):
            key = "workflow task events"
        else:
            key = EventType.Name(e.event_type).removeprefix("EVENT_TYPE_").lower()
        out[key] = out.get(key, 0) + e.ByteSize()
    return out


async def connect(address: str, seconds: float = 30.0) -> Client:
    """A client once the dev server's frontend answers (its port opens a little earlier)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return await Client.connect(address, data_converter=pydantic_data_converter)
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def bounded(aw: Any, seconds: float, what: str) -> Any:
    """`await aw`, or fail with a clear message after `seconds`."""
    try:
        return await asyncio.wait_for(aw, seconds)
    except TimeoutError:
        raise RuntimeError(f"{what}: no result within {seconds:.0f} s") from None


def now() -> float:
    return time.perf_counter()
