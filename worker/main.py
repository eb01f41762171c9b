"""`boundloop worker` (`python -m boundloop.worker.main`): the command-line edge of the
worker. It reads the environment (boundloop/settings.py), serves the BOUNDLOOP_TOOLS
toolset with the demo's dependencies, and reports each problem in one line. The public
`Worker` and `Plugin` are worker/plugin.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import openai
from pydantic import ValidationError
from temporalio.client import Client

from boundloop.connection import (
    TLS_DROPPED,
    ConnectionSettingsError,
    codec,
    connect_options,
    tls_dropped,
    tls_problem,
    unreachable_reason,
)
from boundloop.connection import open_client as connect
from boundloop.core.operator import OperatorPolicy, budget_admin_keys, unserved_tools_line
from boundloop.errors import BoundloopError, PolicyNamesUnservedTools
from boundloop.exit_codes import ExitCode
from boundloop.logs import configure
from boundloop.mcp import (
    MCPConfigError,
    MCPDeclarationError,
    MCPServerConfig,
    MCPServerError,
    load_mcp_config,
)
from boundloop.mcp.pool import check_commands
from boundloop.settings import (
    PolicyFileError,
    Settings,
    client_settings_given,
    load_policy,
    one_line,
    worker_settings_problem,
)
from boundloop.signing import KeyFileError, load_keys_file
from boundloop.tools import catalog
from boundloop.worker.plugin import NO_KEYS_TO_REQUIRE, Worker

__all__ = ["build_worker", "connect", "main"]

def model_client(settings: Settings) -> openai.AsyncOpenAI:
    key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
    return openai.AsyncOpenAI(api_key=key or "not-needed", base_url=settings.openai_base_url,
                              max_retries=0)


def build_worker(client: Client, settings: Settings) -> Worker[Any]:
    """The worker `boundloop worker` runs: the BOUNDLOOP_TOOLS toolset (the demo tools by
    default), each tool getting the demo's dependencies (its data directory), and the
    MCP servers of BOUNDLOOP_MCP_CONFIG. A toolset with other dependencies runs in its
    own worker script (examples/weather_desk/)."""
    from boundloop.tools.demo import DemoDeps

    return Worker(client, catalog.load(settings.tools),
                  deps=DemoDeps(data_dir=settings.data_dir), model=model_client(settings),
                  task_queue=settings.task_queue,
                  max_cached_workflows=settings.max_cached_workflows,
                  sticky_timeout=timedelta(seconds=settings.sticky_timeout_seconds),
                  log_tool_error_messages=settings.log_tool_error_messages,
                  approver_keys=approver_keys(settings), mcp_servers=mcp_servers(settings),
                  policy=operator_policy(settings),
                  deployment_name=settings.deployment_name, build_id=settings.build_id)


def toolset_problem(settings: Settings) -> str | None:
    """Why `boundloop worker` cannot serve the BOUNDLOOP_TOOLS toolset, or None: it cannot
    be loaded, or its tools take other deps than the demo's that this worker hands them."""
    from boundloop.tools.demo import DemoDeps

    try:
        toolset = catalog.load(settings.tools)
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        return (f"cannot load the toolset BOUNDLOOP_TOOLS={settings.tools!r}: "
                f"{type(exc).__name__}: {exc}")
    problem = toolset.deps_problem(DemoDeps(data_dir=settings.data_dir))
    if problem is None:
        return None
    return (f"BOUNDLOOP_TOOLS={settings.tools!r}: {problem} (`boundloop worker` serves "
            "the demo's): serve this toolset from a worker of your own, "
            "boundloop.Worker(client, agent, deps=...)")


def approver_keys(settings: Settings) -> dict[str, str] | None:
    """The BOUNDLOOP_APPROVER_KEYS file's keys (None: not set). Raises KeyFileError."""
    path = settings.approver_keys_file
    return load_keys_file(path) if path is not None else None


def operator_policy(settings: Settings) -> OperatorPolicy | None:
    """The BOUNDLOOP_POLICY file's policy (None: not set). Raises PolicyFileError."""
    path = settings.policy_file
    return load_policy(path) if path is not None else None


def mcp_servers(settings: Settings) -> list[MCPServerConfig]:
    """The servers of BOUNDLOOP_MCP_CONFIG (none when unset). Raises MCPConfigError."""
    return load_mcp_config(settings.mcp_config) if settings.mcp_config else []


class TemporalRefused(BoundloopError):
    """The connection to Temporal was refused for a reason retrying cannot fix (TLS)."""


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
            if (problem := tls_problem(exc)) is not None:
                # Not transient: retrying cannot make the certificate trusted.
                raise TemporalRefused(f"cannot connect to Temporal at "
                                      f"{settings.temporal_address}: {problem}") from None
            reason = TLS_DROPPED if tls_dropped(exc, settings) else unreachable_reason(exc)
            log.warning(f"cannot reach Temporal at {settings.temporal_address} "
                        f"({reason}); retrying in {delay:g} s",
                        extra={"attempt": attempt})
        await asyncio.sleep(delay)
        delay, attempt = min(delay * 2, max_delay), attempt + 1


#: How recently a healthy worker last polled: a workflow-task long poll lasts about a
#: minute and the server records when each one began.
POLLED_WITHIN = timedelta(minutes=2)


async def polls_from_this_host(client: Client, task_queue: str) -> bool:
    """A worker on this host polled `task_queue` for workflow tasks lately: its identity is
    the SDK's default `pid@hostname`, and a container's host name is its own."""
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    answer = await client.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
        namespace=client.namespace, task_queue=TaskQueue(name=task_queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW))
    suffix = f"@{socket.gethostname()}"
    now = datetime.now(UTC)
    return any(p.identity.endswith(suffix)
               and now - p.last_access_time.ToDatetime(UTC) <= POLLED_WITHIN
               for p in answer.pollers)


async def run_worker(settings: Settings) -> None:
    log = logging.getLogger(__name__)
    for warning in client_settings_given(settings):
        log.warning(warning)
    # Said first: connecting can take a while (a server starting, a firewall dropping
    # packets), and a silent worker looks hung. Where, never with what credentials.
    log.info(f"connecting to Temporal at {settings.temporal_address} "
             f"(namespace {settings.temporal_namespace})",
             extra={"task_queue": settings.task_queue})
    client = await connect_with_retry(settings)
    worker = build_worker(client, settings)
    versioned = ({"deployment": settings.deployment_name, "build_id": settings.build_id}
                 if settings.build_id is not None else {})
    log.info("worker started", extra={"task_queue": settings.task_queue, **versioned})
    # SIGTERM (a deploy, `docker stop`, systemd) stops as gracefully as Ctrl-C: polling
    # ends, running activities finish within the graceful shutdown timeout.
    loop = asyncio.get_running_loop()
    stopping: list[asyncio.Task[None]] = []
    loop.add_signal_handler(signal.SIGTERM,
                            lambda: stopping.append(loop.create_task(worker.shutdown())))
    try:
        await worker.run()
        log.info("worker stopped", extra={"task_queue": settings.task_queue})
    except (MCPServerError, MCPDeclarationError) as exc:  # a server did not start or list
        sys.stderr.write(f"error: {exc}\n")
        raise SystemExit(ExitCode.FAILED) from None


def main(settings: Settings | None = None) -> None:
    """`boundloop worker`: serve until interrupted; settings default to the environment's.
    One line per problem, no traceback."""
    if settings is None:
        try:
            settings = Settings()
        except ValidationError as exc:
            configure("text")
            sys.stderr.write(f"error: invalid settings: {one_line(exc)}\n")
            raise SystemExit(ExitCode.INVALID) from None
    configure(settings.log_format)
    problem = worker_settings_problem(settings)
    try:
        connect_options(settings)  # TLS files and codec keys: refused here, in one line
    except ConnectionSettingsError as exc:
        problem = problem or str(exc)
    if problem is not None:
        sys.stderr.write(f"error: {problem}\n")
        raise SystemExit(ExitCode.INVALID)
    try:
        approver_keys(settings)  # a bad keys file stops the worker before it connects
    except KeyFileError as exc:
        sys.stderr.write(f"error: BOUNDLOOP_APPROVER_KEYS: {exc}\n")
        raise SystemExit(ExitCode.INVALID) from None
    try:
        # a bad policy (or a budget admin without a key) stops the worker before it connects
        policy = operator_policy(settings)
        budget_admin_keys(policy, approver_keys(settings) or {})
    except PolicyFileError as exc:
        for line in exc.problems:
            sys.stderr.write(f"error: BOUNDLOOP_POLICY: {line}\n")
        raise SystemExit(ExitCode.INVALID) from None
    except ValueError as exc:
        sys.stderr.write(f"error: BOUNDLOOP_POLICY: {exc}\n")
        raise SystemExit(ExitCode.INVALID) from None
    if policy is not None and policy.require_encryption and codec(settings) is None:
        sys.stderr.write(f"error: BOUNDLOOP_POLICY: {NO_KEYS_TO_REQUIRE}\n")
        raise SystemExit(ExitCode.INVALID)
    try:
        # A bad file, or a server program that does not exist, is refused before
        # anything starts.
        check_commands(mcp_servers(settings))
    except (MCPConfigError, MCPServerError) as exc:
        sys.stderr.write(f"error: BOUNDLOOP_MCP_CONFIG: {exc}\n")
        raise SystemExit(ExitCode.INVALID) from None
    problem = toolset_problem(settings)
    if problem is None and policy is not None and not settings.mcp_config:
        # Every tool the policy names is served (with MCP servers: once they listed).
        unserved = unserved_tools_line(policy, catalog.load(settings.tools).names())
        problem = unserved and f"BOUNDLOOP_POLICY: {unserved}"
    if problem is not None:
        sys.stderr.write(f"error: {problem}\n")
        raise SystemExit(ExitCode.INVALID)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(run_worker(settings))
    except TemporalRefused as exc:
        sys.stderr.write(f"error: {exc}\n")
        raise SystemExit(ExitCode.UNREACHABLE) from None
    except PolicyNamesUnservedTools as exc:  # an MCP tool's name, known once listed
        sys.stderr.write(f"error: BOUNDLOOP_POLICY: {exc}\n")
        raise SystemExit(ExitCode.INVALID) from None


if __name__ == "__main__":
    try:
        main()
        rc = int(ExitCode.OK)
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else int(ExitCode.FAILED)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)  # sdk-python #300: the interpreter may abort at exit after a worker ran
