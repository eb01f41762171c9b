"""The boundloop worker: the workflow, the model activity and the tool activity.

Run with `boundloop worker` (or `python -m worker.main`). Settings come from the
environment (boundloop/settings.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from datetime import timedelta

from pydantic import ValidationError
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import (
    LogForwardingConfig,
    LoggingConfig,
    Runtime,
    TelemetryConfig,
    TelemetryFilter,
)
from temporalio.worker import Worker

from activities.conversation import ConversationCache
from activities.model import ModelActivities
from activities.tools import ToolActivities
from boundloop.logs import configure
from boundloop.settings import Settings, client_settings_given, one_line, worker_settings_problem
from boundloop.tools.catalog import registry
from boundloop.tracing import client_interceptors
from workflows.loop import BoundLoopWorkflow

#: How long a workflow task waits on this worker's sticky queue before any worker may
#: take it (Temporal's default 10 s). Crash tests shorten it: a killed worker's sticky
#: queue would otherwise delay the next decision by the full timeout.
STICKY_TIMEOUT_ENV = "BOUNDLOOP_STICKY_TIMEOUT_SECONDS"


_core_logs_forwarded = False


def forward_core_logs() -> None:
    """Send the SDK core's own log lines through Python logging (stderr, our format)
    instead of letting them reach stdout, where they would corrupt `--json` output.
    Once per process, before the first client."""
    global _core_logs_forwarded
    if _core_logs_forwarded:
        return
    _core_logs_forwarded = True
    runtime = Runtime(telemetry=TelemetryConfig(logging=LoggingConfig(
        filter=TelemetryFilter(core_level="WARN", other_level="ERROR"),
        forwarding=LogForwardingConfig(logger=logging.getLogger("temporalio.core")))))
    Runtime.set_default(runtime, error_if_already_set=False)


async def connect(settings: Settings) -> Client:
    """A client with the pydantic data converter (SPEC §2)."""
    forward_core_logs()
    return await Client.connect(settings.temporal_address, namespace=settings.temporal_namespace,
                                data_converter=pydantic_data_converter,
                                interceptors=client_interceptors())


def build_worker(client: Client, settings: Settings, *,
                 cache: ConversationCache | None = None) -> Worker:
    """The worker. Both activities share one cache: the tool activity leaves its output
    there for the next model request (docs/history.md).

    `BOUNDLOOP_MAX_CACHED_WORKFLOWS` (default 100) bounds the workflow instances kept in
    memory: a run parked on approval beyond it is evicted and replays its (short)
    history when the decision arrives, so 1,000 parked runs cost little memory.
    """
    reg = registry()
    cache = cache if cache is not None else ConversationCache()
    model = ModelActivities(settings, reg, cache)
    tools = ToolActivities(reg, settings.data_dir, cache)
    sticky = float(os.environ.get(STICKY_TIMEOUT_ENV) or 10.0)
    return Worker(
        client, task_queue=settings.task_queue, workflows=[BoundLoopWorkflow],
        activities=[model.model_request, tools.tool_execute],
        max_concurrent_activities=64,
        max_cached_workflows=int(os.environ.get("BOUNDLOOP_MAX_CACHED_WORKFLOWS") or 100),
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=sticky),
    )


def unreachable_reason(exc: BaseException) -> str:
    """Why Client.connect failed, in a few words (its message is a long transport dump)."""
    text = str(exc)
    if "ConnectionRefused" in text or "Connection refused" in text:
        return "connection refused"
    if "dns error" in text or "failed to lookup" in text:
        return "the host name does not resolve"
    if "timed out" in text.lower() or "deadline" in text.lower():
        return "timed out"
    return "connection failed"


async def connect_with_retry(settings: Settings, *, first_delay: float = 1.0,
                             max_delay: float = 30.0) -> Client:
    """Connect, retrying with backoff while Temporal is unreachable: a worker started
    before its server (or during a restart) waits for it instead of exiting."""
    log = logging.getLogger(__name__)
    delay, attempt = first_delay, 1
    while True:
        try:
            return await connect(settings)
        except RuntimeError as exc:
            log.warning(f"cannot reach Temporal at {settings.temporal_address} "
                        f"({unreachable_reason(exc)}); retrying in {delay:g} s",
                        extra={"attempt": attempt})
        await asyncio.sleep(delay)
        delay, attempt = min(delay * 2, max_delay), attempt + 1


async def run_worker(settings: Settings | None = None) -> None:
    settings = settings or Settings()
    log = logging.getLogger(__name__)
    for warning in client_settings_given(os.environ):
        log.warning(warning)
    client = await connect_with_retry(settings)
    worker = build_worker(client, settings)
    log.info("worker started", extra={"task_queue": settings.task_queue})
    await worker.run()


def main() -> None:
    """`python -m worker.main` and `boundloop worker`: one line per problem, no traceback."""
    configure(os.environ.get("BOUNDLOOP_LOG_FORMAT") or "text")
    try:
        settings = Settings()
    except ValidationError as exc:
        sys.stderr.write(f"error: invalid settings: {one_line(exc)}\n")
        raise SystemExit(2) from None
    problem = worker_settings_problem(settings)
    if problem is not None:
        sys.stderr.write(f"error: {problem}\n")
        raise SystemExit(2)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run_worker(settings))


if __name__ == "__main__":
    main()
