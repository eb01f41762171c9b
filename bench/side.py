"""Side by side (`make bench-peers`): boundloop, bare Temporal and the peers, in one run.

On one dev server, against one scripted model server (answers at once, strict request
validation on), the same workload for every system:

- bare Temporal: `BenchBarePair`, two activities a step (a no-op, then the ~4 KB report);
- boundloop: the loop on the bench worker, each step calling `fetch_report` (~4 KB);
- Temporal's OpenAI Agents integration and pydantic-ai's Temporal integration: an agent
  whose tool `fetch_report` is an activity returning the same ~4 KB report
  (`bench/peers/`, run by `.venv-peers/bin/python` as worker processes of their own).

Measured: throughput of `runs` concurrent runs of `run_steps` model requests each
(rounds, the order rotating), the CPU each process used; one step of a 20-step run (the
interval between consecutive model-activity schedules, server clock); history bytes
and events per step; worker RSS per run parked on an approval, on fresh workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from bench.harness import (
    REPO,
    CpuMeter,
    Model,
    WorkerProcess,
    bounded,
    history_bytes,
    history_events,
    median,
    now,
    rss_kib,
)
from bench.phases import (
    Bench,
    _check,
    _no_violations,
    _rss,
    _ticket_call,
    parked,
    parked_spare,
)
from bench.tools import REPORT_RESULT_CAP
from bench.workflows import BARE_PAIR_WORKFLOW
from boundloop.client import result_of
from boundloop.core.limits import Limits
from boundloop.core.reasons import StopReason

#: The peers' interpreter: `make bench-peers` installs their packages there.
PEERS_PYTHON = Path(os.environ.get("BENCH_PEERS_PYTHON",
                                   REPO / ".venv-peers" / "bin" / "python"))
#: name -> (workflow type, `--peer` of bench.peers.worker, distribution to report)
PEERS = {
    "openai-agents": ("PeerOpenAIAgents", ["temporalio-openai-agents", "openai-agents"]),
    "pydantic-ai": ("PeerPydanticAI", ["pydantic-ai-slim"]),
}
SYSTEMS = ("bare", "boundloop", *PEERS)
#: The parked phase's boundloop worker with the peers' workflow cache size.
SAME_CACHE = "boundloop_same_cache"
#: temporalio's default `max_cached_workflows`, which the peers' workers keep.
PEER_CACHE = 1000
QUESTION = "Read every part of the inventory report."


@dataclass
class PeerWorker:
    """`python -m bench.peers.worker` in the peers' venv, as a child process."""

    peer: str
    address: str
    queue: str
    model_url: str
    log_file: Path
    proc: asyncio.subprocess.Process | None = field(default=None, init=False)
    _drain: asyncio.Task[None] | None = field(default=None, init=False)

    async def start(self, timeout: float = 90.0) -> PeerWorker:
        env = {**os.environ, "TEMPORAL_ADDRESS": self.address,
               "OPENAI_BASE_URL": self.model_url, "OPENAI_API_KEY": "sk-bench-not-real",
               "OPENAI_AGENTS_DISABLE_TRACING": "1", "PYTHONUNBUFFERED": "1"}
        log = self.log_file.open("ab")
        self.proc = await asyncio.create_subprocess_exec(
            str(PEERS_PYTHON), "-m", "bench.peers.worker", "--peer", self.peer,
            "--queue", self.queue, cwd=REPO, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=log)
        log.close()
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not line.startswith(b"ready"):
            await self.stop()
            raise RuntimeError(f"{self.peer} worker did not start; see {self.log_file}")
        # Whatever the peer's libraries print later goes to its log: an unread pipe that
        # fills up would stop the worker at its next write.
        self._drain = asyncio.create_task(self._copy_stdout())
        return self

    async def _copy_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with self.log_file.open("ab") as log:
            while chunk := await self.proc.stdout.read(65536):
                log.write(chunk)

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
        finally:
            if self._drain is not None:
                self._drain.cancel()


def peer_versions() -> dict[str, str]:
    """Versions of the peers' packages in their venv."""
    names = ["temporalio", *itertools.chain.from_iterable(d for _, d in PEERS.values())]
    code = ("import importlib.metadata as m, sys\n"
            "for n in sys.argv[1:]: print(n, m.version(n))")
    out = subprocess.run([str(PEERS_PYTHON), "-c", code, *names], capture_output=True,
                         text=True, check=True, timeout=60).stdout
    return dict(line.split(" ", 1) for line in out.splitlines())


@dataclass
class System:
    """How to start one run of `steps` model requests (each a `fetch_report` call)."""

    name: str
    client: Client
    queue: str
    worker_pid: int

    def wid(self) -> str:
        return f"bench-side-{self.name}-{uuid.uuid4().hex[:10]}"

    async def start(self, b: Bench, steps: int, answer: bool) -> WorkflowHandle[Any, Any]:
        """`answer`: the model answers after `steps` calls (else every turn is a call and
        the run stops at its limit)."""
        if self.name == "bare":
            return await self.client.start_workflow(
                BARE_PAIR_WORKFLOW, steps, id=self.wid(), task_queue=self.queue,
                result_type=int)
        if self.name == "boundloop":
            # With answer, one step to spare: an answer on the last step is max_steps.
            limits = Limits(max_steps=steps + 2 if answer else steps,
                            max_tool_executions=steps, token_threshold=10**9,
                            max_result_bytes=REPORT_RESULT_CAP, max_history_bytes=100_000_000,
                            max_identical_calls=steps)
            return await b.start_loop(QUESTION, ["fetch_report"], limits, self.queue)
        inp = {"question": QUESTION, "tool": "fetch_report",
               "max_turns": steps + 5 if answer else steps}
        return await self.client.start_workflow(PEERS[self.name][0], inp, id=self.wid(),
                                                task_queue=self.queue)

    def calls_per_run(self, steps: int, answer: bool) -> tuple[int, int]:
        """(model requests, tool executions) of one run."""
        if self.name == "bare":
            return steps, steps
        if answer:
            return steps + 1, steps
        # boundloop stops at max_steps without running the last step's call; the peers
        # run it, then stop before their next model request (max_turns, request_limit).
        return (steps, steps - 1) if self.name == "boundloop" else (steps, steps)

    def check(self, result: Any, steps: int, answer: bool) -> None:
        if self.name == "bare":
            if result != steps:
                raise RuntimeError(f"bare run returned {result}")
        elif self.name == "boundloop":
            if answer:
                _check(result, StopReason.COMPLETED, steps + 1, steps)
            else:
                _check(result, StopReason.MAX_STEPS, steps, steps - 1)
        elif answer != ("output" in result):
            raise RuntimeError(f"{self.name} run ended with {result}")


def _feed(b: Bench, system: System, runs: int, steps: int, answer: bool) -> None:
    if system.name == "bare":
        return
    turns = [b.model.call("fetch_report", {"part": i}) for i in range(runs * steps)]
    if answer:
        turns.append(b.model.answer())
    b.model.feed(turns)


async def _result(system: System, handle: WorkflowHandle[Any, Any]) -> Any:
    if system.name == "boundloop":
        return await result_of(handle)
    return await handle.result()


# --- throughput --------------------------------------------------------------------


async def throughput(b: Bench, systems: list[System], runs: int, steps: int,
                     rounds: int) -> dict[str, Any]:
    """`rounds` rounds; each runs every system once (`runs` concurrent runs), the order
    rotating; per system the medians of wall time and of each process's CPU."""
    b.model.fresh()
    out: dict[str, dict[str, Any]] = {s.name: {"seconds": [], "cpu": [], "load": []}
                                      for s in systems}
    for i in range(rounds):
        order = systems[i % len(systems):] + systems[:i % len(systems)]
        for s in order:
            if s.name == "bare":
                spare = 0
                b.model.fresh()
            else:
                spare = b.model.feed_calls("fetch_report",
                                           [{"part": j} for j in range(runs * steps)])
            pids = {"worker": s.worker_pid, **{k: v for k, v in b.pids.items()
                                                 if k != "worker"}}
            if "failed" in out[s.name]:
                continue
            meter = CpuMeter(pids).start()
            t0 = now()
            handles = await bounded(asyncio.gather(*(s.start(b, steps, False)
                                                     for _ in range(runs))), 120,
                                    f"starting {s.name} runs")
            try:
                results = await bounded(asyncio.gather(*(_result(s, h) for h in handles)),
                                        ROUND_SECONDS, f"{s.name} runs")
            except RuntimeError as e:
                # Said in the report, and its runs ended so they load no later round.
                out[s.name]["failed"] = f"{e} (round {i + 1}; load {os.getloadavg()[0]:.1f})"
                await _terminate(handles)
                b.model.fresh()
                continue
            out[s.name]["seconds"].append(now() - t0)
            out[s.name]["cpu"].append(meter.stop())
            out[s.name]["load"].append(os.getloadavg()[0])
            for r in results:
                s.check(r, steps, answer=False)
            _no_violations(b, spare)
    rows: dict[str, Any] = {}
    for s in systems:
        o = out[s.name]
        if "failed" in o:
            rows[s.name] = {"failed": o["failed"], "seconds_all": o["seconds"]}
            continue
        model, tool = s.calls_per_run(steps, answer=False)
        t = median(o["seconds"])
        cpu = {k: median(c[k] for c in o["cpu"]) for k in o["cpu"][0]}
        rows[s.name] = {
            "seconds": t, "seconds_all": o["seconds"], "load_1m": o["load"],
            "model_requests": model, "tool_executions": tool,
            # A step = one model request and one tool execution (bare: its two activities).
            "steps_per_s": runs * (model + tool) / 2 / t,
            "cpu_per_run": {k: v / runs for k, v in cpu.items()},
            "cpu_per_step": {k: v / runs / ((model + tool) / 2) for k, v in cpu.items()},
        }
    return {"runs": runs, "steps": steps, "rounds": rounds, "systems": rows}


#: A throughput round that takes longer is reported as not finished.
ROUND_SECONDS = 180.0


async def _terminate(handles: list[WorkflowHandle[Any, Any]]) -> None:
    async def one(h: WorkflowHandle[Any, Any]) -> None:
        with contextlib.suppress(Exception):  # it may have finished meanwhile
            await h.terminate("bench: the round did not finish in time")
    await asyncio.gather(*(one(h) for h in handles))


# --- one step, history -------------------------------------------------------------


def _model_schedules(events: list[Any]) -> list[float]:
    """Schedule times of the run's model activity: the type of its first activity."""
    first: str | None = None
    times = []
    for e in events:
        if e.event_type != EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            continue
        name = e.activity_task_scheduled_event_attributes.activity_type.name
        first = first or name
        if name == first:
            times.append(e.event_time.seconds + e.event_time.nanos / 1e9)
    return times


async def per_step(b: Bench, systems: list[System], steps: int,
                   reps: int) -> dict[str, Any]:
    """`reps` rounds of one `steps`-step run (then the answer) of each system, the order
    rotating; a step = the interval between consecutive model-activity schedules."""
    b.model.fresh()
    for s in systems:  # warm-up: imports, sandbox, connections
        _feed(b, s, 1, 3, answer=True)
        handle = await s.start(b, 3, True)
        s.check(await bounded(_result(s, handle), 120, f"{s.name} warm-up"), 3, True)
    data: dict[str, dict[str, list[Any]]] = {s.name: {"step": [], "wall": [], "bytes": [],
                                                     "events": [], "types": []}
                                             for s in systems}
    for i in range(reps):
        for s in systems[i % len(systems):] + systems[:i % len(systems)]:
            _feed(b, s, 1, steps, answer=True)
            t0 = now()
            handle = await s.start(b, steps, True)
            s.check(await bounded(_result(s, handle), 300, f"{s.name} run"), steps, True)
            wall = now() - t0
            events = await history_events(b.client, handle.id)
            times = _model_schedules(events)
            d = data[s.name]
            d["step"].extend(b2 - a for a, b2 in itertools.pairwise(times[:steps + 1]))
            d["wall"].append(wall / steps)
            d["bytes"].append(history_bytes(events))
            d["events"].append(len(events))
            d["types"].append(sorted({e.activity_task_scheduled_event_attributes.activity_type
                                      .name for e in events if e.event_type
                                      == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED}))
    _no_violations(b)
    return {"steps": steps, "reps": reps, "systems": {name: {
        "step": median(d["step"]), "wall_step": median(d["wall"]),
        "history_bytes": median(d["bytes"]), "events": median(d["events"]),
        "bytes_per_step": median(d["bytes"]) / steps,
        "events_per_step": median(d["events"]) / steps,
        "activity_types": d["types"][0], "samples": len(d["step"])}
        for name, d in data.items()}}


# --- parked runs ---------------------------------------------------------------------


async def _until_parked(client: Client, queue: str, n: int, seconds: float) -> None:
    # A peer's workflow sets the status when it parks and leaves it: count open runs only.
    query = (f'TaskQueue = "{queue}" AND BoundloopStatus = "waiting_approval" '
             'AND ExecutionStatus = "Running"')
    t0 = now()
    while (count := (await client.count_workflows(query)).count) < n:
        if now() - t0 > seconds:
            raise RuntimeError(f"only {count} of {n} runs parked after {seconds:.0f} s")
        await asyncio.sleep(0.5)


async def _park_peer(b: Bench, worker: PeerWorker, runs: int, warmup: int) -> dict[str, Any]:
    """A fresh peer worker's RSS before and after `runs` runs wait for approval."""
    b.model.fresh()
    name, queue, pid = worker.peer, worker.queue, worker.pid
    rss_start = rss_kib(pid)
    inp = {"question": "Open a restock ticket.", "tool": "create_ticket", "max_turns": 5}

    async def start() -> WorkflowHandle[Any, Any]:
        return await b.client.start_workflow(PEERS[name][0], inp, task_queue=queue,
                                             id=f"bench-side-park-{uuid.uuid4().hex[:10]}")

    b.model.feed([_ticket_call(b, i) for i in range(warmup)])
    handles = [await start() for _ in range(warmup)]
    await _until_parked(b.client, queue, warmup, 120)
    b.model.feed([b.model.answer("Ticket opened.") for _ in range(warmup)])
    for h in handles:
        await h.signal("approve")
    for h in handles:
        result = await bounded(h.result(), 60, f"{name} warm-up run")
        if "output" not in result:
            raise RuntimeError(f"{name} warm-up run ended with {result}")
    _no_violations(b)
    await asyncio.sleep(1.0)
    before = await _rss(pid)
    spare = parked_spare(runs)
    b.model.feed([_ticket_call(b, i) for i in range(runs + spare)])
    gate = asyncio.Semaphore(50)

    async def gated() -> None:
        async with gate:
            await start()

    t0 = now()
    await bounded(asyncio.gather(*(gated() for _ in range(runs))), 180, f"parking {name}")
    await _until_parked(b.client, queue, runs, 300)
    park_seconds = now() - t0
    _no_violations(b, spare)
    await asyncio.sleep(2.0)
    after = await _rss(pid)
    server = b.model.server
    assert server is not None
    return {"runs": runs, "warmup": warmup, "rss_start_kib": rss_start,
            "rss_before_kib": before, "rss_after_kib": after,
            "retried_requests": spare - server.turns_remaining,
            "per_run_kib": (after - before) / runs, "park_seconds": park_seconds}


# --- the phase -------------------------------------------------------------------------


async def measure(b: Bench, address: str, model: Model, tmp: Path,
                  cfg: dict[str, Any]) -> dict[str, Any]:
    """Every part of the side-by-side phase; `b.queue`/`b.bench_queue` are served by the
    bench worker (`b.pids["worker"]`)."""
    workers: list[PeerWorker] = []
    out: dict[str, Any] = {"config": {k: cfg[k] for k in (
        "side_runs", "side_steps", "side_rounds", "side_step_steps", "side_reps",
        "side_parked", "warmup")}, "load_start": os.getloadavg()}
    try:
        systems = [System("bare", b.client, b.bench_queue, b.pids["worker"]),
                   System("boundloop", b.client, b.queue, b.pids["worker"])]
        for peer in PEERS:
            w = await PeerWorker(peer, address, f"bench-side-{peer}-{uuid.uuid4().hex[:6]}",
                                 model.base_url, tmp / f"peer-{peer}.log").start()
            workers.append(w)
            systems.append(System(peer, b.client, w.queue, w.pid))
        t0 = now()
        out["per_step"] = await per_step(b, systems, cfg["side_step_steps"], cfg["side_reps"])
        out["throughput"] = await throughput(b, systems, cfg["side_runs"], cfg["side_steps"],
                                             cfg["side_rounds"])
        out["seconds"] = {"run": now() - t0}
    finally:
        for w in workers:
            await w.stop()
    # Parked runs: a fresh worker process each, boundloop's as `boundloop worker` builds it.
    t0 = now()
    parked_out: dict[str, Any] = {}
    # Twice: as `boundloop worker` ships (a sticky cache of 100 workflows, the rest evicted)
    # and with the peers' cache size (the SDK's default, 1,000), every parked run cached.
    for key, cache in (("boundloop", None), (SAME_CACHE, PEER_CACHE)):
        loop_worker = await WorkerProcess(
            address=address, queue=f"bench-side-park-{uuid.uuid4().hex[:6]}",
            model_url=model.base_url, data_dir=b.data_dir, log_file=tmp / f"side-park-{key}.log",
            max_cached_workflows=cache).start()
        try:
            parked_out[key] = await parked(b, loop_worker, cfg["side_parked"], cfg["warmup"])
        except RuntimeError as e:  # reported in its row; the other figures stand
            parked_out[key] = {"failed": f"{e} (load {os.getloadavg()[0]:.1f})"}
        finally:
            await loop_worker.stop()
    for peer in PEERS:
        w = await PeerWorker(peer, address, f"bench-side-park-{peer}-{uuid.uuid4().hex[:6]}",
                             model.base_url, tmp / f"peer-park-{peer}.log").start()
        try:
            parked_out[peer] = await bounded(_park_peer(b, w, cfg["side_parked"], cfg["warmup"]),
                                             900, f"parking {peer}'s runs")
        except RuntimeError as e:
            parked_out[peer] = {"failed": f"{e} (load {os.getloadavg()[0]:.1f})"}
            b.model.fresh()
        finally:
            await w.stop()
    out["parked"] = parked_out
    out["seconds"]["parked"] = now() - t0
    out["load_end"] = os.getloadavg()
    return out
