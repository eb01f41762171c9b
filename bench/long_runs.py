"""`python -m bench.long_runs` (part of `make bench`): runs as long as the work.

One run per size (100, 1,000 and 10,000 steps by default) of the real workflow on its
own dev server, a worker process and the scripted model: each step the model calls a
read-only tool (`lookup_stock`) with other arguments, then it answers. Read back from
the runs' event histories (every Temporal run of the chain):

- per-step time: from one model request's `ActivityTaskScheduled` to the next, the mean
  of the first and of the last 500 steps (of the first and last fifth for shorter runs),
  split into the model request (scheduled to completed: the conversation's rebuild and
  the HTTP round trip, which grow with the conversation the model is sent) and the
  rest of the step (the workflow, the tool: boundloop's own time);
- carried input: the payload bytes of the input each `WorkflowExecutionContinuedAsNew`
  event hands to the next run, and the most events any one Temporal run holds.

`--context summarize` runs the same work under the `summarize` context strategy with a
context window (`--window`, tokens): the model reports each request's input tokens as
its bytes / 4, and answers boundloop's summary requests outside the script. A summary
request is part of the step it is made in (its time is model time). It writes
bench/long_runs_summarize.json.

Prints a table and writes bench/long_runs.json. A missed target is reported, never an
error: this is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError
from temporalio.service import RPCError

from bench.harness import REPO, Model, WorkerProcess, connect
from bench.phases import sku
from boundloop.client import result_of
from boundloop.contracts import MODEL_ACTIVITY, WORKFLOW_NAME, RunResult, run_input
from boundloop.core.context import SUMMARY_INSTRUCTIONS
from boundloop.core.limits import Limits, Policy, RunSettings
from boundloop.devserver import DevServer
from boundloop.scripted.builders import responses_turn, usage
from boundloop.scripted.server import ScriptedModelServer, _Answer
from boundloop.testing import free_port

SIZES = [100, 1000, 10000]
#: The steps compared at each end of a run (a fifth of a shorter run).
WINDOW = 500
#: Per-step time of the last WINDOW steps against the first: the target.
TARGET_RATIO = 1.2


def _window(steps: int) -> int:
    return min(WINDOW, max(1, steps // 5))


async def _runs(client: Client, workflow_id: str) -> list[dict[str, Any]]:
    """Every Temporal run of the chain, first to last: its model requests' scheduled and
    completed times, its event count, and the bytes of the input it handed on."""
    first = [wf async for wf in client.list_workflows(f"WorkflowId = '{workflow_id}'")]
    # The first run is the one no run continued into: follow the chain from it.
    by_id = {wf.run_id: wf for wf in first}
    handed: dict[str, str] = {}
    runs: list[dict[str, Any]] = []
    for wf in first:
        handle = client.get_workflow_handle(workflow_id, run_id=wf.run_id)
        scheduled: dict[int, tuple[float, bool]] = {}
        steps: list[tuple[float, float, bool]] = []
        events, carried, nxt = 0, None, None
        async for event in handle.fetch_history_events():
            events += 1
            at = event.event_time.ToDatetime().timestamp()
            if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                sched = event.activity_task_scheduled_event_attributes
                if sched.activity_type.name == MODEL_ACTIVITY:
                    summary = any(b'"summarize":{' in p.data for p in sched.input.payloads)
                    scheduled[event.event_id] = (at, summary)
            elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                done = event.activity_task_completed_event_attributes.scheduled_event_id
                if done in scheduled:
                    steps.append((scheduled[done][0], at, scheduled[done][1]))
            elif event.event_type \
                    == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
                attrs = event.workflow_execution_continued_as_new_event_attributes
                carried = sum(len(p.data) for p in attrs.input.payloads)
                nxt = attrs.new_execution_run_id
        if nxt is not None:
            handed[wf.run_id] = nxt
        runs.append({"run_id": wf.run_id, "events": events, "carried_bytes": carried,
                     "steps": steps})
    targets = set(handed.values())
    start = next(r for r in by_id if r not in targets)
    order: list[str] = []
    run: str | None = start
    while run is not None:
        order.append(run)
        run = handed.get(run)
    index = {r["run_id"]: r for r in runs}
    return [index[r] for r in order]


def _figures(steps: int, runs: list[dict[str, Any]], seconds: float,
             result: RunResult) -> dict[str, Any]:
    requests = [(sent, done) for r in runs for sent, done, summary in r["steps"]
                if not summary]
    # A summary request is made between two steps' requests: its time is the earlier
    # step's model time.
    summaries = [(sent, done) for r in runs for sent, done, summary in r["steps"] if summary]
    # A step: from its request's scheduling to the next one's (the last request, the
    # answer, has no next).
    step_ms = [(b[0] - a[0]) * 1000 for a, b in itertools.pairwise(requests)]
    model_ms = [(done - sent) * 1000 + sum((d - s) * 1000 for s, d in summaries
                                           if sent <= s < nxt)
                for (sent, done), (nxt, _) in itertools.pairwise(requests)]
    own_ms = [s - m for s, m in zip(step_ms, model_ms, strict=True)]
    n = _window(len(step_ms))

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else float("nan")

    first, last = mean(step_ms[:n]), mean(step_ms[-n:])
    carried = [r["carried_bytes"] for r in runs if r["carried_bytes"] is not None]
    return {
        "steps": steps, "reason": result.reason.value, "steps_done": result.steps,
        "summaries": len(summaries),
        "seconds": round(seconds, 1), "continue_as_new": len(runs) - 1,
        "window": n,
        "step_ms_first": round(first, 1), "step_ms_last": round(last, 1),
        "ratio": round(last / first, 2) if first else None,
        "model_ms_first": round(mean(model_ms[:n]), 1),
        "model_ms_last": round(mean(model_ms[-n:]), 1),
        "own_ms_first": round(mean(own_ms[:n]), 1),
        "own_ms_last": round(mean(own_ms[-n:]), 1),
        "carried_bytes": carried,
        "carried_max": max(carried, default=0),
        "events_per_run_max": max(r["events"] for r in runs),
        "result_events": len(result.events),
    }


class WindowedServer(ScriptedModelServer):
    """A provider with a context window, for `--context summarize`: each answer reports
    the request's input tokens as its bytes / 4, and a summary request (boundloop's
    summary instructions) is answered outside the script, with a summary of a fixed
    length."""

    summary = "Looked up the stock of every SKU asked so far; each was in stock. " * 8

    def _handle(self, method: str, target: str, headers: dict[str, str], raw: bytes,
                ) -> _Answer:
        tokens = len(raw) // 4
        if f'"instructions":{json.dumps(SUMMARY_INSTRUCTIONS)}'.encode() in raw:
            body = responses_turn(id=f"resp_s{uuid.uuid4().hex[:8]}", text=self.summary,
                                  usage=usage(tokens, len(self.summary) // 4))
            return _Answer(status=200, headers={"Content-Type": "application/json"},
                           payload=json.dumps(body).encode())
        with self._lock:  # the next turn reports what this request holds
            if self._next < len(self._turns):
                self._turns[self._next].body["usage"] = usage(tokens, 20)
        return super()._handle(method, target, headers, raw)


class LongModel(Model):
    """The bench's scripted model for runs of thousands of steps: it does not check each
    request's conversation (the tests do; here it would be most of a step's time) and
    forgets the bodies of the requests it answered and the conversations it served
    (10,000 requests of megabytes each would not fit in memory)."""

    def __init__(self, port: int, windowed: bool = False) -> None:
        super().__init__(port)
        self.windowed = windowed

    def fresh(self) -> ScriptedModelServer:
        self.stop()
        kind = WindowedServer if self.windowed else ScriptedModelServer
        self.server = kind([], port=self.port, strict=False)
        self.server.start()
        return self.server


async def forget_bodies(server: ScriptedModelServer) -> None:
    """Drop the bodies of the requests recorded so far, every second."""
    done = 0
    while True:
        await asyncio.sleep(1.0)
        with server._lock:  # the server's own lock (private): it appends under it
            for i in range(done, len(server.requests)):
                server.requests[i] = dataclasses.replace(server.requests[i], body=None,
                                                         raw_body=b"")
            done = len(server.requests)
            # Each response's whole conversation, kept for `previous_response_id` (which
            # boundloop never sends): quadratic in the steps.
            server._conversations.clear()


async def one(client: Client, model: Model, queue: str, steps: int,
              window: int | None = None) -> dict[str, Any]:
    server = model.fresh()
    forgetting = asyncio.create_task(forget_bodies(server))
    model.feed([model.call("lookup_stock", {"sku": sku(i)}) for i in range(steps)])
    model.feed([model.answer()])
    # A step to spare: the answer comes while the model may still call tools.
    limits = Limits(max_steps=steps + 2, max_tool_executions=steps,
                    token_threshold=10**9, max_history_bytes=10**9,
                    deadline_seconds=86400.0, max_input_tokens=window)
    policy = Policy() if window is None else Policy(context="summarize")
    inp = run_input("Look up each SKU in turn.", instructions=None, tools=["lookup_stock"],
                    settings=RunSettings(model="bench-model", api="responses",
                                         limits=limits, policy=policy))
    workflow_id = f"bench-long-{steps}-{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    handle = await client.start_workflow(WORKFLOW_NAME, inp, id=workflow_id,
                                         task_queue=queue, result_type=RunResult)
    while True:
        try:
            result = await result_of(handle)
            break
        except WorkflowFailureError as err:  # not a RunStopped: report, do not raise
            raise RuntimeError(f"{steps}-step run failed: {err.cause}") from err
        except RPCError:  # a busy server's long poll timed out: the run goes on
            await asyncio.sleep(1.0)
    forgetting.cancel()
    seconds = time.monotonic() - t0
    return _figures(steps, await _runs(client, workflow_id), seconds, result)


def render(rows: list[dict[str, Any]]) -> str:
    head = ("| steps | outcome | s | CAN | step ms first → last (ratio) | model ms "
            "first → last | own ms first → last | carried input max | events/run max |")
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        ok = "ok" if r["ratio"] is not None and r["ratio"] <= TARGET_RATIO else "MISSED"
        lines.append(
            f"| {r['steps']:,} | {r['reason']} at {r['steps_done']:,} | {r['seconds']} | "
            f"{r['continue_as_new']} | {r['step_ms_first']} → {r['step_ms_last']} "
            f"({r['ratio']}, {ok}) | {r['model_ms_first']} → {r['model_ms_last']} | "
            f"{r['own_ms_first']} → {r['own_ms_last']} | {r['carried_max']:,} B | "
            f"{r['events_per_run_max']:,} |" + (
                f" {r['summaries']} summaries" if r.get("summaries") else ""))
    return "\n".join(lines)


async def main(sizes: list[int], out: Path, window: int | None) -> None:
    with tempfile.TemporaryDirectory(prefix="boundloop-long-") as tmp_name:
        tmp = Path(tmp_name)
        server = DevServer(tmp / "temporal", port=free_port(), ui_port=None).start()
        model = LongModel(free_port(), windowed=window is not None)
        model.fresh()
        policy = tmp / "policy.toml"
        policy.write_text('context = "summarize"\n')  # the operator allows it
        worker: WorkerProcess | None = None
        try:
            client = await connect(server.address)
            worker = await WorkerProcess(
                address=server.address, queue=f"bench-long-{uuid.uuid4().hex[:6]}",
                model_url=model.base_url, data_dir=tmp / "data",
                log_file=tmp / "worker.log",
                policy_file=policy if window is not None else None).start()
            rows = []
            for steps in sizes:
                print(f"long runs: {steps} steps", flush=True)
                rows.append(await one(client, model, worker.queue, steps, window))
                print(render(rows[-1:]), flush=True)
        finally:
            if worker is not None:
                await worker.stop()
            model.stop()
            server.stop()
    table = render(rows)
    print(table)
    out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES)
    parser.add_argument("--context", choices=["none", "summarize"], default="none",
                        help="the runs' context strategy (summarize: with --window)")
    parser.add_argument("--window", type=int, default=16_000,
                        help="the context window in tokens under --context summarize")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    summarize = args.context == "summarize"
    name = "long_runs_summarize.json" if summarize else "long_runs.json"
    asyncio.run(main(args.sizes, args.json or REPO / "bench" / name,
                     args.window if summarize else None))
