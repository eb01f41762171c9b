"""`python -m bench.budget` (part of `make bench`): what a shared budget costs.

Starts its own dev server, the scripted model server and a bench worker process, then
measures:

1. reservations per second one ledger sustains: concurrent clients send `reserve`
   updates (each followed by its `settle` signal) to one ledger workflow;
2. the latency a budget adds to a step: the same 10-step runs, one after the other,
   with and without `budget=KEY` (a reserve activity before each model request, a
   settle signal after it, a release at the end).

Medians are quoted. Prints a table and writes docs/benchmarks-budget.md. This is a
benchmark, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio.client import Client

from bench.harness import REPO, Model, WorkerProcess, bounded, connect, median, now
from bench.phases import MODEL_NAME, sku
from bench.report import machine_facts
from boundloop.budgets import set_budget
from boundloop.client import result_of
from boundloop.contracts import (
    WORKFLOW_NAME,
    ReserveRequest,
    RunResult,
    SettleRequest,
    budget_workflow_id,
    run_input,
)
from boundloop.core.budget import Amount, BudgetLimits, Grant
from boundloop.core.limits import Limits, RunSettings
from boundloop.devserver import DevServer
from boundloop.testing import free_port

FULL = {"clients": 20, "per_client": 25, "steps": 10, "reps": 5}
QUICK = {"clients": 5, "per_client": 5, "steps": 3, "reps": 2}


async def reservations(client: Client, queue: str, clients: int, per_client: int
                       ) -> dict[str, Any]:
    """`clients` concurrent senders, each `per_client` reserve updates (and settles)."""
    key = f"bench-{uuid.uuid4().hex[:6]}"
    await set_budget(client, key, BudgetLimits(tokens=10**9), task_queue=queue)
    ledger = client.get_workflow_handle(budget_workflow_id(key))
    latencies: list[float] = []

    async def sender(c: int) -> None:
        for i in range(per_client):
            run = f"bench-run-{c}-{i}"
            t0 = now()
            grant: Grant = await ledger.execute_update(
                "reserve", ReserveRequest(run=run, step=1, amount=Amount(tokens=100)),
                id=f"{run}/step-1/reserve", result_type=Grant)
            latencies.append(now() - t0)
            if not grant.granted:
                raise RuntimeError(f"reservation refused: {grant.message}")
            await ledger.signal("settle", SettleRequest(run=run, step=1,
                                                        amount=Amount(tokens=10)))
            await ledger.signal("release", run)

    t0 = now()
    await bounded(asyncio.gather(*(sender(c) for c in range(clients))), 600, "reservations")
    wall = now() - t0
    runs = len({d.run_id async for d in client.list_workflows(
        f"WorkflowId = '{budget_workflow_id(key)}'")})
    total = clients * per_client
    return {"reservations": total, "clients": clients, "seconds": wall,
            "per_second": total / wall, "median_update_ms": median(latencies) * 1000,
            "ledger_runs": runs}


async def _run(client: Client, model: Model, queue: str, steps: int,
               budget: str | None) -> float:
    model.feed([model.call("lookup_stock", {"sku": sku(i)}) for i in range(steps)]
               + [model.answer()])
    limits = Limits(max_steps=steps + 2, max_tool_executions=steps, token_threshold=10**9,
                    max_output_tokens=1000)
    inp = run_input("Look up each SKU in turn.", instructions=None, tools=["lookup_stock"],
                    settings=RunSettings(model=MODEL_NAME, limits=limits, budget=budget))
    t0 = now()
    handle = await client.start_workflow(WORKFLOW_NAME, inp,
                                         id=f"bench-budget-{uuid.uuid4().hex[:10]}",
                                         task_queue=queue, result_type=RunResult)
    result = await bounded(result_of(handle), 120, "boundloop run")
    wall = now() - t0
    if result.reason != "completed" or result.steps != steps + 1:
        raise RuntimeError(f"unexpected run: {result.reason.value}, {result.steps} steps")
    return wall / result.steps


async def step_latency(client: Client, model: Model, queue: str, steps: int, reps: int
                       ) -> dict[str, Any]:
    key = f"bench-{uuid.uuid4().hex[:6]}"
    await set_budget(client, key, BudgetLimits(tokens=10**9), task_queue=queue)
    await _run(client, model, queue, steps, None)  # warm-up: caches, first connections
    without: list[float] = []
    with_budget: list[float] = []
    for _ in range(reps):  # interleaved, so drift hits both alike
        without.append(await _run(client, model, queue, steps, None))
        with_budget.append(await _run(client, model, queue, steps, key))
    a, b = median(without), median(with_budget)
    return {"steps": steps + 1, "reps": reps, "without_ms": a * 1000,
            "with_ms": b * 1000, "added_ms": (b - a) * 1000}


async def measure(cfg: dict[str, Any], tmp: Path) -> dict[str, Any]:
    server = DevServer(tmp / "temporal", port=free_port(), ui_port=None).start()
    model = Model(free_port())
    model.fresh()
    worker: WorkerProcess | None = None
    try:
        client = await connect(server.address)
        worker = await WorkerProcess(
            address=server.address, queue=f"bench-budget-{uuid.uuid4().hex[:6]}",
            model_url=model.base_url, data_dir=tmp / "data",
            log_file=tmp / "worker.log").start()
        _say("1/2 reservations per second")
        res = await reservations(client, worker.queue, cfg["clients"], cfg["per_client"])
        _say("2/2 added latency per step")
        lat = await step_latency(client, model, worker.queue, cfg["steps"], cfg["reps"])
        return {"config": cfg, "reservations": res, "latency": lat}
    finally:
        if worker is not None:
            await worker.stop()
        model.stop()
        server.stop()


def render(r: dict[str, Any], facts: dict[str, str]) -> str:
    res, lat = r["reservations"], r["latency"]
    lines = [
        "# Shared budget benchmark",
        "",
        f"`{facts['command']}` on {facts['CPU']} ({facts['cores']} cores), "
        f"{facts['date (UTC)']} UTC, commit {facts['git commit']}. Its own dev server "
        "(SQLite), the scripted model (answers at once), one worker process.",
        "",
        "| measure | value |",
        "|---|---|",
        f"| reservations per second (one ledger, {res['clients']} concurrent clients, "
        f"{res['reservations']} reserve updates + settle + release signals) | "
        f"{res['per_second']:.1f} |",
        f"| median reserve update round trip | {res['median_update_ms']:.1f} ms |",
        f"| ledger runs (continue-as-new) during it | {res['ledger_runs']} |",
        f"| median time per step, no budget ({lat['steps']}-step runs, {lat['reps']} each) | "
        f"{lat['without_ms']:.1f} ms |",
        f"| median time per step, with a budget | {lat['with_ms']:.1f} ms |",
        f"| added per step (median difference) | {lat['added_ms']:.1f} ms |",
        "",
    ]
    return "\n".join(lines)


def _say(text: str) -> None:
    print(f"[bench.budget] {time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.budget", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes (not for quoting)")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks-budget.md")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    with tempfile.TemporaryDirectory(prefix="boundloop-bench-budget-") as tmp:
        results = asyncio.run(measure(cfg, Path(tmp)))
    facts = machine_facts("python -m bench.budget" + (" --quick" if args.quick else ""))
    text = render(results, facts)
    print(text)
    if not args.no_write:
        args.out.write_text(text, encoding="utf-8")
        _say(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
