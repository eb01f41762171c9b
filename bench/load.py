"""`python -m bench.load` (part of `make bench`): streamed runs under load.

N runs at once on one worker process, half of them streamed, each followed by two
readers of its stream (`run.stream()`); two CPU-bound processes beside the worker; a
slow scripted model (a create_ticket call after 2 s, approved by the bench as soon as it
waits, then a 2,000-token answer written over about 4 s, streamed or sent whole after
the same time); every run spends from one shared token budget. Reports:

- model requests per (run, step), from the requests the model server received (its
  Idempotency-Key header), and the retries the runs' events name;
- tokens the model server returned (the usage of every answer it sent) against the
  tokens the budget was charged and the runs' own totals;
- side effects per idempotency key (tickets in the worker's store);
- history events per step and time per run, streamed against unstreamed;

then a verdict line. A guarantee broken (a request sent again with no event naming why,
tokens returned that were not charged, a side effect twice) is `FAIL` and the exit
status 1; a missed target (streamed time at most 1.3x, events at most 2x the unstreamed
twin's) is `MISS`. A benchmark's verdict, not a timed test. Writes
docs/benchmarks-load.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from temporalio.client import Client

import boundloop
from bench.harness import REPO, WorkerProcess
from boundloop.budgets import set_budget, show_budget
from boundloop.client import result_of
from boundloop.connection import connect
from boundloop.contracts import BudgetView, RunResult, StreamResult, TextDelta
from boundloop.core.budget import BudgetLimits
from boundloop.core.limits import Limits
from boundloop.devserver import DevServer
from boundloop.scripted import builders as b
from boundloop.scripted.server import ScriptedModelServer
from boundloop.testing import free_port
from boundloop.tools.demo import list_tickets

MODEL = "scripted-model"
#: About 2,000 tokens at 4 characters a token.
ANSWER = ("The stock of A-001 is 12 units in the Sapporo warehouse. " * 140)[:8000]
ANSWER_USAGE = {"input_tokens": 300, "output_tokens": 2000, "total_tokens": 2300}
CALL_USAGE = {"input_tokens": 200, "output_tokens": 40, "total_tokens": 240}
TICKET = {"title": "B-002 restock", "description": "B-002 is out of stock.",
          "priority": "high"}
#: The model thinks this long before its tool call, and writes its answer over about
#: ANSWER_DELAY + 120 x CHUNK_INTERVAL seconds (streamed: 2,000-byte writes of its
#: events; unstreamed: the whole body after the same time).
CALL_DELAY = 2.0
ANSWER_DELAY = 0.5
CHUNK_BYTES = 2000
CHUNK_INTERVAL = 0.03
#: The targets of a streamed run against its unstreamed twin.
TIME_TARGET = 1.3
EVENTS_TARGET = 2.0


class SlowModel(ScriptedModelServer):
    """The scripted server, answering each request by what it asks: a tool call to a
    request without a tool's output, the long answer to one with it (the runs' requests
    arrive in any order), each with its own response id. Counts the tokens it returned."""

    def __init__(self) -> None:
        super().__init__([], strict=True)
        self.returned = 0
        self._pick = threading.Lock()
        self._served = 0
        self._events_bytes = 0

    def _handle(self, method: str, target: str, headers: dict[str, str], raw: bytes) -> Any:
        answering = b'"function_call_output"' in raw
        streamed = b'"stream":true' in raw.replace(b" ", b"")
        with self._pick:
            self._served += 1
            rid = f"resp_{self._served}"
            if answering:
                body = b.responses_turn(text=ANSWER, usage=ANSWER_USAGE, id=rid)
                pace: dict[str, Any] = (
                    {"delay_seconds": ANSWER_DELAY, "chunk_bytes": CHUNK_BYTES,
                     "chunk_interval_seconds": CHUNK_INTERVAL} if streamed
                    else {"delay_seconds": ANSWER_DELAY + self._answer_pieces() * CHUNK_INTERVAL})
                usage = ANSWER_USAGE
            else:
                body = b.responses_turn(
                    calls=[b.fn_call("create_ticket", json.dumps(TICKET), call_id="c1",
                                     id=f"fc_{self._served}")], usage=CALL_USAGE, id=rid)
                pace, usage = {"delay_seconds": CALL_DELAY}, CALL_USAGE
            self.append({"body": body, **pace})
            answer = super()._handle(method, target, headers, raw)
            if answer.status == 200:
                self.returned += usage["total_tokens"]
            return answer

    def _answer_pieces(self) -> int:
        """How many writes the streamed answer takes (its events' bytes / CHUNK_BYTES)."""
        if not self._events_bytes:
            from boundloop.scripted.sse import responses_events

            body = b.responses_turn(text=ANSWER, usage=ANSWER_USAGE)
            self._events_bytes = sum(len(e) for e in responses_events(body, None))
        return -(-self._events_bytes // CHUNK_BYTES)


async def one(client: Client, queue: str, key: str, streamed: bool, readers: int,
              ) -> dict[str, Any]:
    agent: boundloop.Agent[Any] = boundloop.Agent(
        ["create_ticket"], model=MODEL, task_queue=queue, budget=key, stream=streamed,
        limits=Limits(max_steps=3, max_output_tokens=2500, token_threshold=100_000))
    began = time.monotonic()
    run = await agent.start(client, "B-002 is out of stock: open a ticket.",
                            id=f"bench-load-{'s' if streamed else 'u'}-{uuid.uuid4().hex[:8]}")
    seen: list[dict[str, int]] = []

    async def read() -> None:
        counts = {"items": 0, "deltas": 0, "result": 0}
        async for item in run.stream():
            counts["items"] += 1
            counts["deltas"] += isinstance(item, TextDelta)
            counts["result"] += isinstance(item, StreamResult)
        seen.append(counts)

    async def approve() -> None:  # the operator says yes to the ticket, as a person would
        while True:
            pending = await run.pending()
            if pending:
                await run.approve(pending[0].call_id, approver="bench")
                return
            await asyncio.sleep(0.5)

    tasks = [asyncio.create_task(read()) for _ in range(readers if streamed else 0)]
    approving = asyncio.create_task(approve())
    result: RunResult = await result_of(run.handle)
    approving.cancel()
    seconds = time.monotonic() - began
    await asyncio.wait_for(asyncio.gather(*tasks), 120)
    kinds: Counter[str] = Counter()
    async for event in run.handle.fetch_history_events():
        kinds[str(event.event_type)] += 1
    return {"id": run.id, "streamed": streamed, "seconds": seconds, "result": result,
            "events": sum(kinds.values()), "readers": seen}


async def settled(client: Client, key: str) -> BudgetView:
    while True:
        view = await show_budget(client, key)
        if view is not None and not view.holders:
            return view
        await asyncio.sleep(0.2)


async def measure(tmp: Path, runs: int, burners: int, readers: int) -> dict[str, Any]:
    server = DevServer(tmp / "temporal", port=free_port(), ui_port=None).start()
    model = SlowModel()
    url = model.start()
    burning: list[subprocess.Popen[bytes]] = []
    worker: WorkerProcess | None = None
    try:
        client = await connect(server.address)
        queue = f"bench-load-{uuid.uuid4().hex[:6]}"
        worker = await WorkerProcess(address=server.address, queue=queue, model_url=url,
                                     data_dir=tmp / "data", log_file=tmp / "worker.log").start()
        key = f"bench-load-{uuid.uuid4().hex[:6]}"
        await set_budget(client, key, BudgetLimits(tokens=10**9), task_queue=queue)
        burning = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                   for _ in range(burners)]
        began = time.monotonic()
        rows = await asyncio.gather(*(one(client, queue, key, i % 2 == 0, readers)
                                      for i in range(runs)))
        wall = time.monotonic() - began
        for proc in burning:
            proc.kill()
        view = await asyncio.wait_for(settled(client, key), 120)
        tickets = list_tickets(tmp / "data")
    finally:
        for proc in burning:
            proc.kill()
        if worker is not None:
            await worker.stop()
        model.stop()
        server.stop()
    return {"rows": rows, "view": view, "tickets": tickets, "wall": wall,
            "requests": [r.headers.get("idempotency-key", "") for r in model.requests],
            "returned": model.returned, "violations": list(model.violations),
            "runs": runs, "burners": burners, "readers": readers}


def figures(m: dict[str, Any]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = m["rows"]
    per_step = Counter(m["requests"])
    named: Counter[str] = Counter()  # retries an event names, per (run, step)
    for r in rows:
        for e in r["result"].events:
            if e.event.startswith(("model_retried:", "model_failed:")):
                named[f"{r['id']}/model/step-{e.step}"] += 1
    unexplained = {k: n for k, n in per_step.items() if n > 1 + named[k]}
    per_key = Counter(t["idempotency_key"] for t in m["tickets"])
    charged_runs = sum(r["result"].total_tokens for r in rows)
    side = {"tickets": len(m["tickets"]), "keys": len(per_key),
            "twice": sum(1 for n in per_key.values() if n > 1)}

    def med(streamed: bool, what: str) -> float:
        values = [r[what] / (r["result"].steps if what == "events" else 1) for r in rows
                  if r["streamed"] == streamed]
        return statistics.median(values) if values else float("nan")

    return {
        "requests": len(m["requests"]), "pairs": len(per_step),
        "most": max(per_step.values(), default=0),
        "named_retries": sum(named.values()), "unexplained": unexplained,
        "returned": m["returned"], "charged_budget": m["view"].spent.tokens,
        "charged_runs": charged_runs, "side": side,
        "completed": sum(1 for r in rows if r["result"].reason == "completed"),
        "time_s": med(True, "seconds"), "time_u": med(False, "seconds"),
        "events_s": med(True, "events"), "events_u": med(False, "events"),
        "max_events_s": max((r["events"] for r in rows if r["streamed"]), default=0),
        "max_events_u": max((r["events"] for r in rows if not r["streamed"]), default=0),
        "deltas": statistics.median([c["deltas"] for r in rows for c in r["readers"]] or [0]),
        "readers_done": sum(c["result"] for r in rows for c in r["readers"]),
    }


def verdict(f: dict[str, Any], m: dict[str, Any]) -> tuple[str, bool]:
    broken = []
    if f["unexplained"]:
        broken.append(f"{len(f['unexplained'])} (run, step) requested again with no event "
                      "naming why")
    if f["charged_budget"] < f["returned"] or f["charged_runs"] != f["charged_budget"]:
        broken.append("tokens returned or counted by the runs that the budget was not charged")
    if f["side"]["twice"] or f["side"]["tickets"] != f["completed"]:
        broken.append("a side effect not exactly once per run")
    if f["completed"] != m["runs"]:
        broken.append(f"{m['runs'] - f['completed']} runs did not complete")
    missed = []
    if f["time_s"] > TIME_TARGET * f["time_u"]:
        missed.append(f"time {f['time_s'] / f['time_u']:.2f}x > {TIME_TARGET}x")
    if f["events_s"] > EVENTS_TARGET * f["events_u"]:
        missed.append(f"events {f['events_s'] / f['events_u']:.2f}x > {EVENTS_TARGET}x")
    line = ("verdict: FAIL — " + "; ".join(broken) if broken else "verdict: PASS")
    line += (" · targets MISS — " + "; ".join(missed)) if missed else " · targets met"
    return line, not broken


def render(m: dict[str, Any], f: dict[str, Any], line: str) -> str:
    s, u = f["time_s"], f["time_u"]
    es, eu = f["events_s"], f["events_u"]
    return "\n".join([
        "# Benchmark: streamed runs under load",
        "",
        "Written by `python -m bench.load` (part of `make bench`). "
        f"{m['runs']} runs at once on one worker process ({m['runs'] // 2 + m['runs'] % 2} "
        f"streamed, each read by {m['readers']} readers of `run.stream()`), "
        f"{m['burners']} CPU-bound processes beside it, one shared token budget. The "
        f"scripted model calls create_ticket after {CALL_DELAY:g} s, then writes a "
        "2,000-token answer over about 4 s (streamed, or whole after the same time).",
        "",
        "| figure | value |",
        "|---|---|",
        f"| model requests / (run, step) pairs | {f['requests']} / {f['pairs']} "
        f"(most for one pair: {f['most']}) |",
        f"| retries named by an event | {f['named_retries']} |",
        f"| requests sent again with no event naming why | {len(f['unexplained'])} |",
        f"| tokens returned by the model server | {f['returned']:,} |",
        f"| tokens charged to the budget | {f['charged_budget']:,} |",
        f"| tokens the runs counted | {f['charged_runs']:,} |",
        f"| tickets / idempotency keys / keys with two | {f['side']['tickets']} / "
        f"{f['side']['keys']} / {f['side']['twice']} |",
        f"| runs completed | {f['completed']} of {m['runs']} |",
        f"| median time per run, streamed / unstreamed | {s:.1f} s / {u:.1f} s "
        f"({s / u:.2f}x; target ≤ {TIME_TARGET}x) |",
        f"| median history events per step, streamed / unstreamed | {es:.1f} / {eu:.1f} "
        f"({es / eu:.2f}x; target ≤ {EVENTS_TARGET}x) |",
        f"| most history events of a run, streamed / unstreamed | {f['max_events_s']} / "
        f"{f['max_events_u']} |",
        f"| text deltas a reader read (median) | {f['deltas']:g} |",
        f"| readers that read to the result | {f['readers_done']} |",
        f"| wall time | {m['wall']:.0f} s |",
        "",
        line,
        "",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--burners", type=int, default=2)
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--no-write", action="store_true",
                        help="print only (docs/benchmarks-load.md stays as it is)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="boundloop-bench-load-") as tmp:
        m = asyncio.run(measure(Path(tmp), args.runs, args.burners, args.readers))
    f = figures(m)
    line, kept = verdict(f, m)
    text = render(m, f, line)
    print(text)
    if m["violations"]:
        print(f"model server violations: {m['violations'][:3]}")
    if not args.no_write:
        (REPO / "docs" / "benchmarks-load.md").write_text(text, encoding="utf-8")
    return 0 if kept else 1


if __name__ == "__main__":
    sys.exit(main())
