"""`python -m bench.run` (`make bench`): boundloop against bare Temporal, in one run.

Starts its own dev server (SQLite in a temporary directory, headless, the fast flags),
the scripted model server (answers at once) and a worker process, then measures:

1. per-step time of a boundloop step vs a bare activity round trip;
2. event-history bytes vs steps, against the conversation's bytes and a naive loop;
3. throughput of 100 concurrent runs vs 100 concurrent bare workflows;
4. worker RSS growth with 1,000 runs waiting for approval;
5. history bytes of a 20-turn session, turn by turn (linear in turns).

Prints a table and writes docs/benchmarks.md. A missed target is reported, never an
error: this is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench import phases
from bench.harness import REPO, Model, WorkerProcess, connect, now
from bench.report import machine_facts, render_markdown, render_table
from bench.sessions import session_growth
from boundloop.devserver import DevServer, free_port

FULL = {"steps": 20, "reps": 5, "sizes": [10, 25, 50, 100], "runs": 100, "run_steps": 5,
        "bare_acts": 10, "rounds": 4, "parked": 1000, "warmup": 20, "diag_cache": 100,
        "session_turns": 20}
QUICK = {"steps": 5, "reps": 2, "sizes": [5, 10], "runs": 10, "run_steps": 5,
         "bare_acts": 10, "rounds": 2, "parked": 50, "warmup": 5, "diag_cache": 10,
         "session_turns": 5}


async def measure(cfg: dict[str, Any], tmp: Path) -> dict[str, Any]:
    server = DevServer(tmp / "temporal", port=free_port(), ui_port=None).start()
    model = Model(free_port())
    model.fresh()
    worker: WorkerProcess | None = None
    try:
        client = await connect(server.address)
        tag = uuid.uuid4().hex[:6]
        worker = await WorkerProcess(
            address=server.address, queue=f"bench-loop-{tag}", model_url=model.base_url,
            data_dir=tmp / "data", log_file=tmp / "worker.log",
            bench_queue=f"bench-bare-{tag}").start()
        assert server.process is not None and worker.bench_queue is not None
        pids = {"worker": worker.pid, "temporal": server.process.pid,
                "driver+model": os.getpid()}
        b = phases.Bench(client=client, model=model, queue=worker.queue,
                         bench_queue=worker.bench_queue, pids=pids, data_dir=tmp / "data")
        out: dict[str, Any] = {"config": cfg}
        timings: dict[str, float] = {}

        t0 = now()
        _say("1/4 per-step overhead")
        out["overhead"] = await phases.overhead(b, cfg["steps"], cfg["reps"])
        timings["overhead"] = now() - t0

        t0 = now()
        _say("3/4 throughput")
        out["throughput"] = await phases.throughput(
            b, cfg["runs"], cfg["run_steps"], cfg["bare_acts"], cfg["rounds"])
        timings["throughput"] = now() - t0

        t0 = now()
        _say("2/4 history bytes")
        out["history"] = await phases.history(b, cfg["sizes"])
        timings["history"] = now() - t0

        t0 = now()
        _say(f"5/5 history bytes of a {cfg['session_turns']}-turn session")
        b.model.fresh()

        def feed(n: int) -> None:
            b.model.feed([b.model.call("lookup_stock", {"sku": phases.sku(n)}),
                          b.model.answer()])
        out["sessions"] = await session_growth(client, worker.queue, phases.MODEL_NAME,
                                               cfg["session_turns"], feed)
        timings["sessions"] = now() - t0

        await worker.stop()
        t0 = now()
        _say("4/4 parked runs (fresh worker process)")
        worker = await WorkerProcess(
            address=server.address, queue=f"bench-park-{tag}", model_url=model.base_url,
            data_dir=tmp / "data", log_file=tmp / "worker-park.log").start()
        out["parked"] = await phases.parked(b, worker, cfg["parked"], cfg["warmup"])
        await worker.stop()
        _say(f"4/4 diagnostic: the same with max_cached_workflows={cfg['diag_cache']}")
        worker = await WorkerProcess(
            address=server.address, queue=f"bench-park-small-{tag}", model_url=model.base_url,
            data_dir=tmp / "data", log_file=tmp / "worker-park-small.log",
            max_cached_workflows=cfg["diag_cache"]).start()
        out["parked_diag"] = await phases.parked(b, worker, cfg["parked"], cfg["warmup"])
        out["parked_diag"]["max_cached_workflows"] = cfg["diag_cache"]
        timings["parked"] = now() - t0
        out["timings"] = timings
        return out
    finally:
        if worker is not None:
            await worker.stop()
        model.stop()
        server.stop()


def _say(text: str) -> None:
    print(f"[bench] {time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="small sizes, to check the bench itself (not for quoting)")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks.md",
                        help="markdown report to write (default docs/benchmarks.md)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    started = now()
    with tempfile.TemporaryDirectory(prefix="boundloop-bench-") as tmp:
        results = asyncio.run(measure(cfg, Path(tmp)))
    results["total_seconds"] = now() - started
    command = "python -m bench.run" + (" --quick" if args.quick else "")
    facts = machine_facts(command)
    print(render_table(results, facts))
    if not args.no_write:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(render_markdown(results, facts), encoding="utf-8")
        _say(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
