"""A worker process for the bench: boundloop's own worker (`build_worker`) and, unless
`--boundloop-only`, a second worker on the bench queue for the bare and naive workflows.

Run as a child of `bench.run` so its memory (/proc/PID/status) and CPU are its own.
`--max-cached-workflows N` (diagnostic) rebuilds build_worker's worker from its own
config with only the sticky workflow cache size changed.
`--stats FILE` writes the conversation cache's counters (look-ups, rebuilds from
history, history bytes read) as JSON to FILE at shutdown; `--shared-queue-only` turns
off the worker's own task queue (the multi-worker phase's "before"); `--census FILE`
traces allocations and answers SIGUSR2 with a census of what the worker holds
(bench/census.py).
Settings come from the environment, as for `boundloop worker`. Prints `ready PID`
once both workers run; SIGTERM shuts it down.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from bench import census
from bench.workflows import (
    BarePairWorkflow,
    BareWorkflow,
    NaiveModel,
    NaiveWorkflow,
    bench_noop,
    bench_report,
)
from boundloop.activities.conversation import ConversationCache
from boundloop.activities.threads import ToolThreads
from boundloop.activities.tools import ToolActivities
from boundloop.settings import Settings
from boundloop.tools import catalog
from boundloop.tools.demo import DemoDeps
from boundloop.worker.main import build_worker, connect, model_client
from boundloop.worker.plugin import Worker as BoundloopWorker


def shared_queue_only(client: Client, settings: Settings) -> BoundloopWorker[DemoDeps]:
    """`boundloop worker`'s worker without a task queue of its own (phase 5's "before")."""
    return BoundloopWorker(
        client, catalog.load(settings.tools), deps=DemoDeps(data_dir=settings.data_dir),
        model=model_client(settings), task_queue=settings.task_queue,
        max_cached_workflows=settings.max_cached_workflows,
        sticky_timeout=timedelta(seconds=settings.sticky_timeout_seconds),
        own_task_queue=False)


async def serve(bench_queue: str | None, max_cached_workflows: int | None = None,
                stats: Path | None = None, own_task_queue: bool = True,
                census_file: Path | None = None) -> None:
    settings = Settings()
    client = await connect(settings)
    cache: ConversationCache | None = None
    loop_worker: Worker
    if max_cached_workflows is None:
        built = (build_worker(client, settings) if own_task_queue
                 else shared_queue_only(client, settings))
        cache, loop_worker = built.plugin.cache, built
    else:  # diagnostic: build_worker's own config with one knob changed. Its worker is
        # made on a second connection, so the two never share a task-queue registration.
        config = build_worker(await connect(settings), settings).config()
        changed: dict[str, Any] = {**config, "client": client,
                                   "max_cached_workflows": max_cached_workflows}
        loop_worker = Worker(**changed)
    workers: list[Worker] = [loop_worker]
    if bench_queue is not None:
        reg = catalog.load(settings.tools)
        naive = NaiveModel(settings.openai_base_url, reg)
        tools = ToolActivities(reg, DemoDeps(data_dir=settings.data_dir),
                               threads=ToolThreads(64))
        workers.append(Worker(
            client, task_queue=bench_queue,
            workflows=[BareWorkflow, BarePairWorkflow, NaiveWorkflow],
            activities=[bench_noop, bench_report, naive.model, tools.tool_execute],
            max_concurrent_activities=64))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    if census_file is not None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2,
                                                      census.Trigger(census_file))
    async with contextlib.AsyncExitStack() as stack:
        for w in workers:
            await stack.enter_async_context(w)
        print(f"ready {os.getpid()}", flush=True)
        await stop.wait()
    if stats is not None and cache is not None:
        counters = {k: getattr(cache, k) for k in ("hits", "misses", "rebuilds",
                                                   "history_bytes")}
        stats.write_text(json.dumps(counters), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.worker")
    parser.add_argument("--bench-queue", help="also serve the bench workflows on this queue")
    parser.add_argument("--max-cached-workflows", type=int,
                        help="diagnostic: build_worker's worker with this workflow cache size")
    parser.add_argument("--stats", type=Path, help="write the cache counters here at exit")
    parser.add_argument("--shared-queue-only", action="store_true",
                        help="no task queue of the worker's own")
    parser.add_argument("--census", type=Path,
                        help="trace allocations; SIGUSR2 writes a census (bench/census.py)")
    args = parser.parse_args()
    # As `boundloop worker` does (worker/main.py): INFO through Temporal's loggers.
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(serve(args.bench_queue, args.max_cached_workflows, args.stats,
                      not args.shared_queue_only, args.census))


if __name__ == "__main__":
    main()
