"""The four measurements. Each returns plain numbers; `bench.run` prints and writes them."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import openai
from temporalio.client import Client, WorkflowHandle

from bench.harness import (
    CpuMeter,
    Model,
    WorkerProcess,
    activities,
    bounded,
    bytes_by_kind,
    history_bytes,
    history_events,
    median,
    now,
    rss_kib,
)
from bench.tools import REPORT_RESULT_CAP
from bench.workflows import (
    BARE_WORKFLOW,
    NAIVE_MODEL_ACTIVITY,
    NAIVE_WORKFLOW,
    NaiveInput,
)
from boundloop.client import result_of
from boundloop.contracts import (
    MODEL_ACTIVITY,
    TOOL_ACTIVITY,
    WORKFLOW_NAME,
    Decision,
    RunResult,
    RunStatus,
    run_input,
)
from boundloop.core.canonical import json_bytes
from boundloop.core.conversation import function_call_output
from boundloop.core.envelope import success
from boundloop.core.limits import Limits, RunSettings
from boundloop.core.reasons import StopReason
from boundloop.tools.demo import DemoDeps, lookup_stock
from boundloop.tools.demo import tools as demo_tools
from boundloop.tools.registry import ToolContext

MODEL_NAME = "scripted-model"
#: Workflow ids of boundloop runs (`Bench.wid("loop")`): their results are read with
#: `result_of`.
LOOP_ID_PREFIX = "bench-loop-"


@dataclass
class Bench:
    client: Client
    model: Model
    queue: str
    bench_queue: str
    pids: dict[str, int]
    data_dir: Path

    def wid(self, kind: str) -> str:
        return f"bench-{kind}-{uuid.uuid4().hex[:10]}"

    async def start_loop(self, question: str, tools: list[str], limits: Limits,
                         queue: str | None = None) -> WorkflowHandle[Any, RunResult]:
        inp = run_input(question, instructions=None, tools=tools,
                        settings=RunSettings(model=MODEL_NAME, api="responses", limits=limits))
        return await self.client.start_workflow(
            WORKFLOW_NAME, inp, id=self.wid("loop"), task_queue=queue or self.queue,
            result_type=RunResult)

    async def start_bare(self, n: int) -> WorkflowHandle[Any, int]:
        return await self.client.start_workflow(
            BARE_WORKFLOW, n, id=self.wid("bare"), task_queue=self.bench_queue, result_type=int)


def sku(i: int) -> str:
    return f"{chr(65 + (i // 1000) % 26)}-{i % 1000:03d}"


def _check(result: RunResult, reason: StopReason, steps: int, tools: int) -> None:
    if (result.reason, result.steps, result.tool_executions) != (reason, steps, tools):
        raise RuntimeError(
            f"unexpected run: {result.reason.value}, {result.steps} steps, "
            f"{result.tool_executions} tool executions (wanted {reason.value}, {steps}, {tools})")


def _no_violations(b: Bench, spare: int = 0) -> None:
    """No violations, and every turn used but at most `spare` (see `Model.feed_calls`)."""
    server = b.model.server
    assert server is not None
    if server.violations:
        raise RuntimeError(f"scripted server violations: {server.violations[:3]}")
    if server.turns_remaining > spare:
        raise RuntimeError(f"{server.turns_remaining} scripted turns were not used")


# --- 1. per-step overhead ----------------------------------------------------------


def _bare_parts(acts: list[Any]) -> dict[str, list[float]]:
    parts: dict[str, list[float]] = {"step": [], "queue": [], "run": [], "wft": []}
    for a, nxt in itertools.pairwise(acts):
        parts["step"].append(nxt.scheduled - a.scheduled)
        parts["queue"].append(a.started - a.scheduled)
        parts["run"].append(a.completed - a.started)
        parts["wft"].append(nxt.scheduled - a.completed)
    return parts


def _loop_parts(acts: list[Any]) -> dict[str, list[float]]:
    models = [a for a in acts if a.name == MODEL_ACTIVITY]
    tools = [a for a in acts if a.name == TOOL_ACTIVITY]
    parts: dict[str, list[float]] = {k: [] for k in (
        "step", "model queue", "model run", "wft after model", "tool queue", "tool run",
        "wft after tool")}
    for m, t, nxt in zip(models, tools, models[1:], strict=False):
        parts["step"].append(nxt.scheduled - m.scheduled)
        parts["model queue"].append(m.started - m.scheduled)
        parts["model run"].append(m.completed - m.started)
        parts["wft after model"].append(t.scheduled - m.completed)
        parts["tool queue"].append(t.started - t.scheduled)
        parts["tool run"].append(t.completed - t.started)
        parts["wft after tool"].append(nxt.scheduled - t.completed)
    return parts


async def _run_loop_steps(b: Bench, steps: int) -> tuple[float, list[Any]]:
    b.model.feed([b.model.call("lookup_stock", {"sku": sku(i)}) for i in range(steps)]
                 + [b.model.answer()])
    # One step to spare: an answer on the last step (tool_choice "none") is max_steps.
    limits = Limits(max_steps=steps + 2, max_tool_executions=steps, token_threshold=10**9)
    t0 = now()
    handle = await b.start_loop("Look up each SKU in turn.", ["lookup_stock"], limits)
    result = await bounded(result_of(handle), 120, "boundloop run")
    wall = now() - t0
    _check(result, StopReason.COMPLETED, steps + 1, steps)
    return wall, activities(await history_events(b.client, handle.id))


async def _run_bare(b: Bench, n: int) -> tuple[float, list[Any]]:
    t0 = now()
    handle = await b.start_bare(n)
    await bounded(handle.result(), 120, "bare run")
    wall = now() - t0
    return wall, activities(await history_events(b.client, handle.id))


def _tool_body_seconds(data_dir: Path, calls: int = 200) -> float:
    """Median time of lookup_stock's own body (SQLite open + query), in this process."""
    ctx = ToolContext(deps=DemoDeps(data_dir=data_dir), idempotency_key="k", workflow_id="w",
                      call_id="c", step=1, max_result_bytes=4096)
    times = []
    for i in range(calls):
        t0 = now()
        lookup_stock(ctx, sku(i))
        times.append(now() - t0)
    return median(times)


def _conversation(b: Bench, steps: int) -> list[Any]:
    """A conversation of `steps` lookup_stock steps (reasoning, call, output)."""
    items: list[Any] = [{"type": "message", "role": "user", "content": "Look up each SKU."}]
    for i in range(steps):
        output = b.model.call("lookup_stock", {"sku": sku(i)})["body"]["output"]
        envelope = success({"sku": sku(i), "found": True, "quantity": i})
        items += [*output, function_call_output(output[-1]["call_id"], envelope.to_output())]
    return items


async def _model_request_probe(b: Bench, sizes: tuple[int, ...],
                               probes: int) -> dict[int, dict[str, float]]:
    """Median time of one model request from this process, as activities/model.py sends
    it through the openai SDK, and the same body passed as `extra_body` (which the SDK
    sends as it is), for conversations of `sizes` steps."""
    server = b.model.fresh()
    client = openai.AsyncOpenAI(api_key="sk-bench-not-real", base_url=b.model.base_url,
                                max_retries=0)
    tools = demo_tools.openai_tools(["lookup_stock"], "responses")
    out: dict[int, dict[str, float]] = {}
    for steps in sizes:
        items = _conversation(b, steps)
        times: dict[str, list[float]] = {"sdk": [], "extra_body": []}
        for i in range(probes * 2):
            mode = "sdk" if i % 2 == 0 else "extra_body"
            b.model.feed([b.model.answer("ok")])
            t0 = now()
            if mode == "sdk":
                raw = await client.responses.with_raw_response.create(
                    model=MODEL_NAME, input=items, store=False,
                    tools=cast(Any, tools), tool_choice="auto",
                    include=["reasoning.encrypted_content"])
            else:
                raw = await client.responses.with_raw_response.create(
                    model=MODEL_NAME, store=False, include=["reasoning.encrypted_content"],
                    extra_body={"input": items, "tools": tools, "tool_choice": "auto"})
            json.loads(raw.content)
            times[mode].append(now() - t0)
        out[steps] = {k: median(v) for k, v in times.items()}
    await client.close()
    if server.violations:
        raise RuntimeError(f"scripted server violations: {server.violations[:3]}")
    return out


async def overhead(b: Bench, steps: int, reps: int) -> dict[str, Any]:
    """Bare activity round trip vs one boundloop step (model + tool activity)."""
    b.model.fresh()
    await _run_bare(b, 3)  # warm-up: sandbox, imports, connections
    await _run_loop_steps(b, 3)
    bare_parts: dict[str, list[float]] = {}
    loop_parts: dict[str, list[float]] = {}
    bare_wall, loop_wall = [], []
    for _ in range(reps):  # alternate, so drift hits both alike
        wall, acts = await _run_bare(b, steps)
        bare_wall.append(wall / steps)
        for k, v in _bare_parts(acts).items():
            bare_parts.setdefault(k, []).extend(v)
        wall, acts = await _run_loop_steps(b, steps)
        loop_wall.append(wall / steps)
        for k, v in _loop_parts(acts).items():
            loop_parts.setdefault(k, []).extend(v)
    _no_violations(b)
    bare_step = median(bare_parts["step"])
    loop_step = median(loop_parts["step"])
    with tempfile.TemporaryDirectory() as tmp:
        tool_body = _tool_body_seconds(Path(tmp))
    probe = await _model_request_probe(b, (0, steps // 2, 50), probes=10)
    return {
        "steps": steps, "reps": reps,
        "bare_step": bare_step, "loop_step": loop_step,
        "ratio_step": loop_step / bare_step,
        "ratio_activity": loop_step / (2 * bare_step),
        "bare_wall_step": median(bare_wall), "loop_wall_step": median(loop_wall),
        "bare_parts": {k: median(v) for k, v in bare_parts.items()},
        "loop_parts": {k: median(v) for k, v in loop_parts.items()},
        "samples": len(loop_parts["step"]),
        "tool_body": tool_body, "request_probe": probe,
        # A local activity's marker is its schedule, start and completion at one instant.
        "tool_local": not any(loop_parts["tool run"]),
    }


# --- 2. history bytes --------------------------------------------------------------


def _conversation_bytes(b: Bench, final_turn: dict[str, Any]) -> int:
    """Last request's input + the final answer's output items, as compact UTF-8 JSON."""
    server = b.model.server
    assert server is not None
    last = server.requests[-1].body
    return json_bytes([*last["input"], *final_turn["body"]["output"]])


def _report_turns(b: Bench, steps: int) -> list[dict[str, Any]]:
    return ([b.model.call("fetch_report", {"part": i}) for i in range(steps)]
            + [b.model.answer()])


async def _history_loop(b: Bench, steps: int) -> dict[str, Any]:
    b.model.fresh()
    turns = _report_turns(b, steps)
    b.model.feed(turns)
    # One step to spare: an answer on the last step (tool_choice "none") is max_steps.
    limits = Limits(max_steps=steps + 2, max_tool_executions=steps, token_threshold=10**9,
                    max_result_bytes=REPORT_RESULT_CAP, max_history_bytes=100_000_000,
                    max_identical_calls=steps)
    handle = await b.start_loop("Read every part of the inventory report.",
                                ["fetch_report"], limits)
    result = await bounded(result_of(handle), 180, f"boundloop {steps}-step run")
    _check(result, StopReason.COMPLETED, steps + 1, steps)
    _no_violations(b)
    events = await history_events(b.client, handle.id)
    return {"conversation": _conversation_bytes(b, turns[-1]),
            "history": history_bytes(events), "events": len(events),
            "by_kind": bytes_by_kind(events, {MODEL_ACTIVITY: "model", TOOL_ACTIVITY: "tool"})}


async def _history_naive(b: Bench, steps: int) -> dict[str, Any]:
    b.model.fresh()
    turns = _report_turns(b, steps)
    b.model.feed(turns)
    inp = NaiveInput(question="Read every part of the inventory report.", model=MODEL_NAME,
                     tools=["fetch_report"], max_steps=steps + 1,
                     max_result_bytes=REPORT_RESULT_CAP)
    handle = await b.client.start_workflow(NAIVE_WORKFLOW, inp, id=b.wid("naive"),
                                           task_queue=b.bench_queue, result_type=int)
    done = await bounded(handle.result(), 240, f"naive {steps}-step run")
    if done != steps + 1:
        raise RuntimeError(f"naive run took {done} steps, wanted {steps + 1}")
    _no_violations(b)
    events = await history_events(b.client, handle.id)
    return {"conversation": _conversation_bytes(b, turns[-1]),
            "history": history_bytes(events), "events": len(events),
            "by_kind": bytes_by_kind(events, {NAIVE_MODEL_ACTIVITY: "model",
                                              TOOL_ACTIVITY: "tool"})}


async def history(b: Bench, sizes: list[int]) -> list[dict[str, Any]]:
    rows = []
    for steps in sizes:
        loop = await _history_loop(b, steps)
        naive = await _history_naive(b, steps)
        rows.append({"steps": steps, "conversation": loop["conversation"],
                     "naive_conversation": naive["conversation"],
                     "history": loop["history"], "events": loop["events"],
                     "naive_history": naive["history"], "naive_events": naive["events"],
                     "ratio": loop["history"] / loop["conversation"],
                     "naive_ratio": naive["history"] / naive["conversation"],
                     "by_kind": loop["by_kind"], "naive_by_kind": naive["by_kind"]})
    return rows


# --- 3. throughput -----------------------------------------------------------------


async def _all(starts: list[Callable[[], Awaitable[WorkflowHandle[Any, Any]]]],
               seconds: float, what: str, parallel: int = 50) -> list[Any]:
    """Start every workflow (at most `parallel` start calls at once), await all results."""
    gate = asyncio.Semaphore(parallel)

    async def one(start: Callable[[], Awaitable[WorkflowHandle[Any, Any]]]) -> Any:
        async with gate:
            handle = await start()
        # A boundloop run that stopped fails its workflow with the RunResult as detail.
        return await (result_of(handle) if handle.id.startswith(LOOP_ID_PREFIX)
                      else handle.result())

    return list(await bounded(asyncio.gather(*(one(s) for s in starts)), seconds, what))


async def throughput(b: Bench, runs: int, steps: int, bare_acts: int,
                     rounds: int) -> dict[str, Any]:
    """`rounds` pairs of (bare, boundloop) rounds, the order alternating A B, B A, ..."""
    b.model.fresh()
    limits = Limits(max_steps=steps, max_tool_executions=steps, token_threshold=10**9)
    loop_acts = 2 * steps - 1  # the last step's calls are never executed (max_steps)
    seconds: dict[str, list[float]] = {"bare": [], "loop": []}
    cpu: dict[str, list[dict[str, float]]] = {"bare": [], "loop": []}

    async def bare_round() -> None:
        await _all([lambda: b.start_bare(bare_acts) for _ in range(runs)], 180, "bare runs")

    async def loop_round() -> None:
        spare = b.model.feed_calls("lookup_stock", [{"sku": sku(i)}
                                                     for i in range(runs * steps)])
        results = await _all([lambda: b.start_loop("Look up each SKU in turn.",
                                                   ["lookup_stock"], limits)
                              for _ in range(runs)], 300, "boundloop runs")
        for r in results:  # every turn is a call: the run ends at max_steps
            _check(r, StopReason.MAX_STEPS, steps, steps - 1)
        _no_violations(b, spare)

    kinds = [("bare", bare_round), ("loop", loop_round)]
    for i in range(rounds):
        for kind, fn in kinds if i % 2 == 0 else kinds[::-1]:
            meter = CpuMeter(b.pids).start()
            t0 = now()
            await fn()
            seconds[kind].append(now() - t0)
            cpu[kind].append(meter.stop())
    paired = [(runs * loop_acts / lt) / (runs * bare_acts / bt)
              for bt, lt in zip(seconds["bare"], seconds["loop"], strict=True)]
    bare_t, loop_t = median(seconds["bare"]), median(seconds["loop"])
    cores = os.cpu_count() or 1

    def cpu_of(kind: str) -> dict[str, float]:
        return {k: median(s[k] for s in cpu[kind]) for k in cpu[kind][0]}

    def busy(kind: str) -> float:
        return median(sum(c.values()) / (t * cores) for c, t in zip(cpu[kind], seconds[kind],
                                                                     strict=True))

    return {
        "runs": runs, "steps": steps, "bare_acts": bare_acts, "rounds": rounds,
        "loop_acts": loop_acts, "bare_seconds": bare_t, "loop_seconds": loop_t,
        "bare_all": seconds["bare"], "loop_all": seconds["loop"],
        "loop_steps_per_s": runs * steps / loop_t,
        "bare_steps_per_s": runs * bare_acts / 2 / bare_t,
        "bare_acts_per_s": runs * bare_acts / bare_t,
        "loop_acts_per_s": runs * loop_acts / loop_t,
        "ratio_activities": median(paired), "ratio_all": paired,
        "ratio_steps": median(bt / lt for bt, lt in zip(seconds["bare"], seconds["loop"],
                                                          strict=True)),
        "bare_cpu": cpu_of("bare"), "loop_cpu": cpu_of("loop"),
        "bare_busy": busy("bare"), "loop_busy": busy("loop"),
    }


# --- 4. parked runs ----------------------------------------------------------------


async def _waiting(client: Client, queue: str) -> int:
    query = f'TaskQueue = "{queue}" AND BoundloopStatus = "waiting_approval"'
    return (await client.count_workflows(query)).count


async def _until_waiting(client: Client, queue: str, n: int, seconds: float) -> float:
    t0 = now()
    while (count := await _waiting(client, queue)) < n:
        if now() - t0 > seconds:
            raise RuntimeError(f"only {count} of {n} runs waiting after {seconds:.0f} s")
        await asyncio.sleep(0.5)
    return now() - t0


async def _rss(pid: int, samples: int = 5) -> float:
    values = []
    for _ in range(samples):
        values.append(rss_kib(pid))
        await asyncio.sleep(0.4)
    return median(values)


def _ticket_call(b: Bench, i: int) -> dict[str, Any]:
    return b.model.call("create_ticket", {"title": f"Restock {sku(i)}",
                                          "description": "Stock is low; please reorder.",
                                          "priority": "normal"})


def parked_spare(runs: int) -> int:
    """Spare turns for `runs` runs parking at once (see `parked`)."""
    return max(5, runs // 4)


async def _census(worker: WorkerProcess, wait_for: Path) -> None:
    """Ask the worker for a census (bench/census.py) and wait until it is written."""
    os.kill(worker.pid, signal.SIGUSR2)
    t0 = now()
    while not wait_for.exists():
        if now() - t0 > 300:
            raise RuntimeError(f"no census from the worker after 300 s ({wait_for})")
        await asyncio.sleep(0.5)


async def parked(b: Bench, worker: WorkerProcess, runs: int, warmup: int) -> dict[str, Any]:
    """RSS of a fresh worker process before and after `runs` runs wait for approval;
    with a census file (`WorkerProcess.census_file`), what the worker keeps for them."""
    b.model.fresh()
    queue, pid = worker.queue, worker.pid
    rss_start = rss_kib(pid)
    limits = Limits()
    # Warm-up: the same path to the approval, then approved and answered.
    b.model.feed([_ticket_call(b, i) for i in range(warmup)])
    handles = [await b.start_loop("Open a restock ticket.", ["create_ticket"], limits, queue)
               for _ in range(warmup)]
    await _until_waiting(b.client, queue, warmup, 60)
    b.model.feed([b.model.answer("Ticket opened.") for _ in range(warmup)])
    for h in handles:
        status: RunStatus = await h.query("status", result_type=RunStatus)
        await h.signal("approve", Decision(call_id=status.pending[0].call_id, approve=True))
    for h in handles:
        _check(await bounded(result_of(h), 60, "warm-up run"), StopReason.COMPLETED, 2, 1)
    _no_violations(b)
    await asyncio.sleep(1.0)
    before = await _rss(pid)
    census_file = worker.census_file
    if census_file is not None:
        Path(f"{census_file}.runs").write_text(str(runs))
        await _census(worker, Path(f"{census_file}.before"))

    # Spare turns: a model request retried after a lost attempt (a busy worker missing its
    # heartbeats) consumes a turn of its own; the spares keep the last runs from none.
    spare = parked_spare(runs)
    b.model.feed([_ticket_call(b, i) for i in range(runs + spare)])
    gate = asyncio.Semaphore(50)

    async def start() -> None:
        async with gate:
            await b.start_loop("Open a restock ticket.", ["create_ticket"], limits, queue)

    t0 = now()
    await bounded(asyncio.gather(*(start() for _ in range(runs))), 180, "starting parked runs")
    await _until_waiting(b.client, queue, runs, 240)
    park_seconds = now() - t0
    _no_violations(b, spare)
    await asyncio.sleep(2.0)
    after = await _rss(pid)
    server = b.model.server
    assert server is not None
    out = {"runs": runs, "warmup": warmup, "rss_start_kib": rss_start,
           "rss_before_kib": before, "rss_after_kib": after,
           "retried_requests": spare - server.turns_remaining,
           "growth_mb": (after - before) * 1024 / 1e6,
           "per_run_kib": (after - before) / runs, "park_seconds": park_seconds}
    if census_file is not None:
        await _census(worker, census_file)
        out["census"] = json.loads(census_file.read_text(encoding="utf-8"))
    return out


# --- 5. several workers ------------------------------------------------------------


async def _scale_round(b: Bench, address: str, model_url: str, tmp: Path, workers: int,
                       shared_only: bool, runs: int, steps: int) -> dict[str, Any]:
    """`runs` concurrent `steps`-step runs (each step reads a ~4 KB report) on `workers`
    fresh worker processes; the conversation caches' counters summed over the workers."""
    b.model.fresh()
    queue = f"bench-scale-{uuid.uuid4().hex[:6]}"
    procs = [WorkerProcess(address=address, queue=queue, model_url=model_url,
                           data_dir=b.data_dir, log_file=tmp / f"{queue}-{i}.log",
                           stats_file=tmp / f"{queue}-{i}.json",
                           shared_queue_only=shared_only) for i in range(workers)]
    for p in procs:
        await p.start()
    try:
        # Every turn is a call (served in arrival order, to any run): each run ends at
        # max_steps after exactly `steps` model requests.
        spare = b.model.feed_calls("fetch_report", [{"part": i} for i in range(runs * steps)])
        limits = Limits(max_steps=steps, max_tool_executions=steps, token_threshold=10**9,
                        max_result_bytes=REPORT_RESULT_CAP, max_history_bytes=100_000_000)
        t0 = now()
        results = await _all([lambda: b.start_loop("Read every part of the inventory report.",
                                                   ["fetch_report"], limits, queue=queue)
                              for _ in range(runs)], 600, f"{workers}-worker runs")
        wall = now() - t0
        for r in results:
            _check(r, StopReason.MAX_STEPS, steps, steps - 1)
        steps_done = sum(r.steps for r in results)
        parts: dict[str, list[float]] = {}
        for r in results:
            for k, v in _loop_parts(activities(await history_events(b.client,
                                                                    r.workflow_id))).items():
                parts.setdefault(k, []).extend(v)
    finally:
        for p in procs:
            await p.stop()
    assert b.model.server is not None
    requests = len(b.model.server.requests)
    _no_violations(b, spare)
    totals = {"hits": 0, "misses": 0, "rebuilds": 0, "history_bytes": 0}
    per_worker = []
    for p in procs:
        assert p.stats_file is not None
        counters = json.loads(p.stats_file.read_text(encoding="utf-8"))
        per_worker.append(counters)
        for k in totals:
            totals[k] += counters[k]
    return {"workers": workers, "shared_only": shared_only, "runs": runs, "steps": steps,
            "requests": requests, "steps_done": steps_done, **totals,
            "rebuild_rate": totals["rebuilds"] / requests,
            "bytes_per_run": totals["history_bytes"] / runs, "per_worker": per_worker,
            "wall_seconds": wall, "parts_ms": {k: 1000 * median(v) for k, v in parts.items()}}


async def scale_out(b: Bench, address: str, model_url: str, tmp: Path, runs: int,
                    sizes: list[int], workers: int) -> list[dict[str, Any]]:
    """For each run size: 1 worker, `workers` workers on the shared queue only, and
    `workers` workers each with its own queue (the run's steps follow its conversation)."""
    rows = []
    for steps in sizes:
        for n, shared_only in ((1, False), (workers, True), (workers, False)):
            rows.append(await _scale_round(b, address, model_url, tmp, n, shared_only,
                                           runs, steps))
    return rows


# --- 6. performance levers ---------------------------------------------------------


@dataclass
class Variant:
    """One side of a lever: runs on `queue` (a worker process of its own) through
    `client`'s server, each step calling `tool`."""

    name: str
    client: Client
    queue: str
    tool: str = "lookup_stock"


async def _variant_run(b: Bench, v: Variant, steps: int) -> dict[str, float]:
    b.model.feed([b.model.call(v.tool, {"sku": sku(i)}) for i in range(steps)]
                 + [b.model.answer()])
    limits = Limits(max_steps=steps + 2, max_tool_executions=steps, token_threshold=10**9)
    inp = run_input("Look up each SKU in turn.", instructions=None, tools=[v.tool],
                    settings=RunSettings(model=MODEL_NAME, api="responses", limits=limits))
    t0 = now()
    handle = await v.client.start_workflow(WORKFLOW_NAME, inp, id=b.wid("loop"),
                                           task_queue=v.queue, result_type=RunResult)
    result = await bounded(result_of(handle), 120, f"{v.name} run")
    wall = now() - t0
    _check(result, StopReason.COMPLETED, steps + 1, steps)
    parts = _loop_parts(activities(await history_events(v.client, handle.id)))
    return {"wall_step_ms": 1000 * wall / (steps + 1),
            **{f"{k}_ms": 1000 * median(vals) for k, vals in parts.items()}}


async def levers(b: Bench, variants: list[Variant], pairs: list[tuple[str, str, str]],
                 steps: int, rounds: int) -> dict[str, Any]:
    """`rounds` rounds, each one run of every variant, the order rotating each round;
    for each lever (name, A, B), the per-round ratio A/B of the median step time."""
    b.model.fresh()
    runs: dict[str, list[dict[str, float]]] = {v.name: [] for v in variants}
    for i in range(rounds):
        order = variants[i % len(variants):] + variants[:i % len(variants)]
        for v in order:
            runs[v.name].append(await _variant_run(b, v, steps))
    _no_violations(b)
    out: dict[str, Any] = {"steps": steps, "rounds": rounds, "variants": {}, "levers": []}
    for name, rs in runs.items():
        out["variants"][name] = {k: median(r[k] for r in rs) for k in rs[0]}
        out["variants"][name]["each_step_ms"] = [r["step_ms"] for r in rs]
    out["pydantic_us"] = pydantic_step_cost()
    for lever, a, bname in pairs:
        ratios = [ra["step_ms"] / rb["step_ms"] for ra, rb in zip(runs[a], runs[bname],
                                                                  strict=True)]
        out["levers"].append({"lever": lever, "a": a, "b": bname, "ratios": ratios,
                              "ratio": median(ratios)})
    return out


def pydantic_step_cost(repeat: int = 500) -> dict[str, float]:
    """Microseconds of the pydantic work a step's workflow tasks do, in this process: the
    size checks (`payload_bytes`) and the data converter's encode of both activity inputs
    and decode of both results (a ~4 KB tool result, a one-call turn)."""
    import timeit

    from temporalio.contrib.pydantic import pydantic_data_converter

    from bench.tools import report
    from boundloop.contracts import ModelRequest, ToolRequest
    from boundloop.core.conversation import ConversationMeta, user_message
    from boundloop.core.limits import payload_bytes
    from boundloop.core.loop import ToolOutcome
    from boundloop.core.turn import Turn

    meta = ConversationMeta().extend([user_message("Read every part of the report.")])
    req = ModelRequest(step=25, model=MODEL_NAME, api="responses", tools=["fetch_report"],
                       tool_choice="auto", prior=meta, expected=meta, new_items=[
                           {"type": "function_call_output", "call_id": "call_1",
                            "output_ref": "wf/tool/call_1"}])
    treq = ToolRequest(tool="fetch_report", call_id="call_1", step=25, arguments={"part": 3},
                       idempotency_key="wf/tool/call_1", max_result_bytes=REPORT_RESULT_CAP,
                       timeout_seconds=10.0)
    turn = Turn(items=[{"type": "reasoning", "id": "rs_1", "summary": [],
                        "encrypted_content": "x" * 300},
                       {"type": "function_call", "call_id": "call_1", "name": "fetch_report",
                        "arguments": '{"part": 3}'}])
    outcome = ToolOutcome(envelope=success(report(3)))
    pc = pydantic_data_converter.payload_converter
    [p_turn], [p_out] = pc.to_payloads([turn]), pc.to_payloads([outcome])
    cases = {
        "size checks (payload_bytes x2)": lambda: (payload_bytes(req), payload_bytes(treq)),
        "encode both activity inputs": lambda: pc.to_payloads([req, treq]),
        "decode the model turn": lambda: pc.from_payloads([p_turn], [Turn]),
        "decode the 4 KB tool outcome": lambda: pc.from_payloads([p_out], [ToolOutcome]),
    }
    return {k: 1e6 * min(timeit.repeat(f, number=repeat, repeat=5)) / repeat
            for k, f in cases.items()}
