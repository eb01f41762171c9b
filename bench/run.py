"""`python -m bench.run` (`make bench`): boundloop against bare Temporal, in one run.

Starts its own dev server (SQLite in a temporary directory, headless, the fast flags),
the scripted model server (answers at once) and a worker process, then measures:

1. per-step time of a boundloop step vs a bare activity round trip;
2. event-history bytes vs steps, against the conversation's bytes and a naive loop;
3. throughput of 100 concurrent runs vs 100 concurrent bare workflows;
4. worker RSS growth with 1,000 runs waiting for approval;
5. history bytes of a 20-turn session, turn by turn (linear in turns).
6. with several worker processes: model requests that rebuilt the conversation from
   history, and history bytes read per run.

Prints a table and writes docs/benchmarks.md. A missed target is reported, never an
error: this is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import faulthandler
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

from bench import compare, phases, side, side_report
from bench.census import render as census_text
from bench.harness import REPO, Model, WorkerProcess, connect, now
from bench.report import machine_facts, render_markdown, render_table
from bench.sessions import session_growth
from boundloop.devserver import DevServer
from boundloop.testing import free_port

FULL = {"steps": 20, "reps": 5, "sizes": [10, 25, 50, 100], "runs": 100, "run_steps": 5,
        "bare_acts": 10, "rounds": 4, "parked": 1000, "warmup": 20, "diag_cache": 100,
        "session_turns": 20,
        "scale_runs": 6, "scale_sizes": [25, 50], "scale_workers": 3,
        "lever_steps": 20, "lever_rounds": 6,
        "side_runs": 50, "side_steps": 5, "side_rounds": 4, "side_step_steps": 20,
        "side_reps": 5, "side_parked": 1000}
QUICK = {"steps": 5, "reps": 2, "sizes": [5, 10], "runs": 10, "run_steps": 5,
         "bare_acts": 10, "rounds": 2, "parked": 50, "warmup": 5, "diag_cache": 10,
         "session_turns": 5, "scale_runs": 2, "scale_sizes": [5, 10], "scale_workers": 3,
         "lever_steps": 5, "lever_rounds": 2,
         "side_runs": 3, "side_steps": 3, "side_rounds": 1, "side_step_steps": 3,
         "side_reps": 1, "side_parked": 3}


_T = TypeVar("_T")

#: The line of docs/benchmarks.md after which `make bench` rewrites nothing.
KEPT = "<!-- kept by make bench -->"
#: Dev server flags that turn eager activity execution off (the dev server's default: on).
NO_EAGER = ["--dynamic-config-value", "system.enableActivityEagerExecution=false"]
PHASES = ("overhead", "throughput", "history", "scale", "levers", "parked")
LEVERS = [
    ("short read-only tool as a local activity", "default", "tool as a regular activity"),
    ("pooled store connection (lookup_stock)", "default", "store opened per call"),
    ("eager activity execution (shared queue only)", "shared queue, eager on",
     "shared queue, eager off"),
    ("own task queue, server with eager on", "default", "shared queue, eager on"),
    ("own task queue, server with eager off", "default, eager off",
     "shared queue, eager off"),
]


async def measure(cfg: dict[str, Any], tmp: Path,
                  only: frozenset[str] = frozenset(PHASES)) -> dict[str, Any]:
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

        if "overhead" in only:
            t0 = now()
            _say("1/6 per-step overhead")
            out["overhead"] = await phases.overhead(b, cfg["steps"], cfg["reps"])
            timings["overhead"] = now() - t0

        if "throughput" in only:
            t0 = now()
            _say("3/6 throughput")
            out["throughput"] = await phases.throughput(
                b, cfg["runs"], cfg["run_steps"], cfg["bare_acts"], cfg["rounds"])
            timings["throughput"] = now() - t0

        if "history" in only:
            t0 = now()
            _say("2/6 history bytes")
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
        if "scale" in only:
            t0 = now()
            _say(f"5/6 several workers ({cfg['scale_workers']} processes)")
            out["scale"] = await phases.scale_out(b, server.address, model.base_url, tmp,
                                                  cfg["scale_runs"], cfg["scale_sizes"],
                                                  cfg["scale_workers"])
            # The same on a server with eager activity execution off (on in this dev
            # server by default): then only the routing keeps a run on one worker.
            _say("5/6 the same with eager activity execution off on the server")
            plain = DevServer(tmp / "temporal-no-eager", port=free_port(), ui_port=None,
                              extra_flags=NO_EAGER).start()
            try:
                b2 = dataclasses.replace(b, client=await connect(plain.address))
                out["scale_no_eager"] = await phases.scale_out(
                    b2, plain.address, model.base_url, tmp, cfg["scale_runs"],
                    cfg["scale_sizes"], cfg["scale_workers"])
            finally:
                plain.stop()
            timings["scale"] = now() - t0
        if "levers" in only:
            t0 = now()
            _say("6/6 performance levers")
            out["levers"] = await _levers(cfg, b, server.address, model.base_url, tmp)
            timings["levers"] = now() - t0
        out["timings"] = timings
        if "parked" not in only:
            return out

        t0 = now()
        _say("4/6 parked runs (fresh worker process)")
        census = cfg.get("census", False)
        worker = await WorkerProcess(
            address=server.address, queue=f"bench-park-{tag}", model_url=model.base_url,
            data_dir=tmp / "data", log_file=tmp / "worker-park.log",
            census_file=tmp / "census-park.json" if census else None).start()
        out["parked"] = await phases.parked(b, worker, cfg["parked"], cfg["warmup"])
        await worker.stop()
        _say_census(out["parked"])
        _say(f"4/6 diagnostic: the same with max_cached_workflows={cfg['diag_cache']}")
        worker = await WorkerProcess(
            address=server.address, queue=f"bench-park-small-{tag}", model_url=model.base_url,
            data_dir=tmp / "data", log_file=tmp / "worker-park-small.log",
            max_cached_workflows=cfg["diag_cache"],
            census_file=tmp / "census-park-small.json" if census else None).start()
        out["parked_diag"] = await phases.parked(b, worker, cfg["parked"], cfg["warmup"])
        out["parked_diag"]["max_cached_workflows"] = cfg["diag_cache"]
        _say_census(out["parked_diag"])
        timings["parked"] = now() - t0
        out["timings"] = timings
        return out
    finally:
        if worker is not None:
            await worker.stop()
        model.stop()
        server.stop()


async def measure_side(cfg: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """The side-by-side phase (`bench.side`) on a dev server and bench worker of its own."""
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
        _say("side by side: boundloop, bare Temporal and the peers")
        return await side.measure(b, server.address, model, tmp, cfg)
    finally:
        if worker is not None:
            await worker.stop()
        model.stop()
        server.stop()


async def _levers(cfg: dict[str, Any], b: phases.Bench, address: str, model_url: str,
                  tmp: Path) -> dict[str, Any]:
    """Each lever's two sides on worker processes of their own, runs interleaved."""
    plain = DevServer(tmp / "temporal-levers-no-eager", port=free_port(), ui_port=None,
                      extra_flags=NO_EAGER).start()
    workers: list[WorkerProcess] = []
    try:
        plain_client = await connect(plain.address)

        async def worker(addr: str, name: str, shared_only: bool) -> str:
            queue = f"bench-lever-{name}-{uuid.uuid4().hex[:6]}"
            workers.append(await WorkerProcess(
                address=addr, queue=queue, model_url=model_url, data_dir=tmp / "data",
                log_file=tmp / f"{queue}.log", shared_queue_only=shared_only).start())
            return queue

        own = await worker(address, "own", False)
        variants = [
            phases.Variant("default", b.client, own),
            phases.Variant("store opened per call", b.client, own, "lookup_stock_per_call"),
            phases.Variant("tool as a regular activity", b.client, own,
                           "lookup_stock_regular"),
            phases.Variant("shared queue, eager on", b.client,
                           await worker(address, "shared", True)),
            phases.Variant("shared queue, eager off", plain_client,
                           await worker(plain.address, "plain-shared", True)),
            phases.Variant("default, eager off", plain_client,
                           await worker(plain.address, "plain-own", False)),
        ]
        return await phases.levers(b, variants, LEVERS, cfg["lever_steps"],
                                   cfg["lever_rounds"])
    finally:
        for w in workers:
            await w.stop()
        plain.stop()


async def _dumping(aw: Awaitable[_T]) -> _T:
    """`await aw`; meanwhile `kill -USR2 <pid>` prints every asyncio task's stack (where
    a phase waits: faulthandler's USR1 shows only the event loop's thread)."""
    def dump() -> None:
        for task in asyncio.all_tasks():
            print(f"--- {task.get_name()}", file=sys.stderr)
            task.print_stack(file=sys.stderr)
        sys.stderr.flush()

    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, dump)
    return await aw


def _say(text: str) -> None:
    print(f"[bench] {time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def _load(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    saved: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return saved


def _peers_main(args: argparse.Namespace, cfg: dict[str, Any]) -> int:
    """`--peers`: the side-by-side phase, compared, saved and written into its block."""
    started = now()
    with tempfile.TemporaryDirectory(prefix="boundloop-bench-") as tmp:
        found = asyncio.run(_dumping(measure_side(cfg, Path(tmp))))
    found["total_seconds"] = now() - started
    command = "python -m bench.run --peers" + (" --quick" if args.quick else "")
    found["facts"] = {**machine_facts(command), "peers": side.peer_versions()}
    saved = _load(args.previous)
    before = saved.get("results", {})
    merged = {**before, "peers": found}
    for line in compare.report(args.previous, merged):
        print(line)
    block = side_report.render(found, before.get("peers"))
    print(block)
    if args.json is not None:
        args.json.write_text(json.dumps({"results": merged, "facts": saved.get("facts", {})},
                                        default=str), encoding="utf-8")
    if not args.no_write:
        old = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        args.out.write_text(side_report.place(old, block, KEPT), encoding="utf-8")
        _say(f"wrote {args.out}")
    return 0


def _say_census(parked: dict[str, Any]) -> None:
    if "census" in parked:
        _say(census_text(parked["census"]))


def main(argv: list[str] | None = None) -> int:
    # A phase that hangs says where: `kill -USR1 <pid>` prints every thread's stack.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="small sizes, to check the bench itself (not for quoting)")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks.md",
                        help="markdown report to write (default docs/benchmarks.md)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--json", type=Path,
                        help="also save the measured numbers here (to --render them later)")
    parser.add_argument("--previous", type=Path, default=compare.PREVIOUS,
                        help="results to compare each figure with (default "
                             "bench/results.json, what `make bench` saves)")
    parser.add_argument("--render", type=Path, metavar="JSON",
                        help="measure nothing: write the report from numbers saved by --json")
    parser.add_argument("--peers", action="store_true",
                        help="measure only the side-by-side phase (boundloop, bare Temporal "
                             "and the peers; needs .venv-peers: make bench-peers) and merge "
                             "it into the saved results and its block of the report")
    parser.add_argument("--only", help="comma-separated phases of " + ", ".join(PHASES)
                        + ": print their numbers as JSON, write nothing")
    parser.add_argument("--parked", type=int, metavar="N",
                        help="the parked phase parks N runs (default 1000; --quick 50)")
    parser.add_argument("--diag-cache", type=int, metavar="N",
                        help="the parked phase's second worker caches N workflows "
                             "(default 100; N >= --parked keeps every parked run cached)")
    parser.add_argument("--census", action="store_true",
                        help="the parked phase also takes a census of what its workers "
                             "keep a parked run (bench/census.py; with --only: not for "
                             "quoting RSS, tracemalloc costs memory of its own)")
    args = parser.parse_args(argv)
    cfg = dict(QUICK if args.quick else FULL)
    if args.parked is not None:
        cfg["parked"] = args.parked
    if args.diag_cache is not None:
        cfg["diag_cache"] = args.diag_cache
    if args.census:
        if not args.only:
            parser.error("--census: with --only (a census run's RSS is not for the report)")
        cfg["census"] = True
    only = frozenset(args.only.split(",")) if args.only else frozenset(PHASES)
    if not only <= set(PHASES):
        parser.error(f"--only: unknown phases {sorted(only - set(PHASES))}")
    if args.peers:
        return _peers_main(args, cfg)
    if args.render is not None:
        saved = json.loads(args.render.read_text(encoding="utf-8"))
        results, facts = saved["results"], saved["facts"]
    else:
        started = now()
        with tempfile.TemporaryDirectory(prefix="boundloop-bench-") as tmp:
            results = asyncio.run(_dumping(measure(cfg, Path(tmp), only)))
        results["total_seconds"] = now() - started
        if args.only:
            print(json.dumps(results, indent=1, default=str))
            return 0
        command = "python -m bench.run" + (" --quick" if args.quick else "")
        facts = machine_facts(command)
        previous = _load(args.previous)
        if "peers" not in results and previous.get("results", {}).get("peers"):
            # The side-by-side figures stay until `make bench-peers` measures them again.
            results["peers"] = previous["results"]["peers"]
        for line in compare.report(args.previous, results):
            print(line)
        if args.json is not None:
            args.json.write_text(json.dumps({"results": results, "facts": facts},
                                            default=str), encoding="utf-8")
    print(render_table(results, facts))
    if not args.no_write:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        # The hand-written part after KEPT (what was measured and why) stays.
        old = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        kept = old[old.index(KEPT):] if KEPT in old else ""
        args.out.write_text(render_markdown(results, facts) + kept, encoding="utf-8")
        _say(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
