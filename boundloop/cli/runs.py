"""Runs: `run`, `status`, `watch`, `list`, `cancel`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError

from boundloop.cli.agents import build_agent, limit_flags
from boundloop.cli.common import (
    QUERY_TIMEOUT,
    _run,
    app,
    check_approver_keys,
    connect,
    describe,
    err,
    fail,
    load_model_script,
    load_settings,
    print_pending_table,
    run_result,
    started,
    validation_lines,
)
from boundloop.cli.trees import print_closed_tree, print_tree
from boundloop.core.reasons import StopReason
from boundloop.errors import worker_hint
from boundloop.exit_codes import ExitCode
from boundloop.terminal import (
    console,
    exit_code,
    no_worker,
    print_event,
    print_grants,
    print_result,
    print_stuck,
    safe,
)

# The Temporal client and the run types load inside the commands (see cli/common.py).
if TYPE_CHECKING:
    from temporalio.client import Client

    from boundloop.agent import Agent
    from boundloop.settings import Settings


@app.command()
@limit_flags
def run(
    question: Annotated[str, typer.Argument(help="The user message")],
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the RunResult")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
    model: Annotated[str | None, typer.Option(help="Model name")] = None,
    api: Annotated[str | None, typer.Option(help="responses | chat")] = None,
    tools: Annotated[str | None, typer.Option(help="Allowed tools, comma-separated")] = None,
    instructions: Annotated[str | None, typer.Option(help="Instructions")] = None,
    model_script: Annotated[Path | None, typer.Option(
        help="Use the scripted model server with this script (runs its own worker)")] = None,
    workflow_id: Annotated[str | None, typer.Option("--id", help="Workflow id")] = None,
    task_queue: Annotated[str | None, typer.Option(
        "--task-queue", help="The task queue its worker polls (default: "
        "BOUNDLOOP_TASK_QUEUE, else boundloop)")] = None,
    limits: Annotated[str | None, typer.Option("--limits", help="Limits as JSON")] = None,
    policy: Annotated[str | None, typer.Option("--policy", help="Policy as JSON")] = None,
    budget: Annotated[str | None, typer.Option(
        "--budget", help="Spend from this shared budget key (boundloop budget set)")] = None,
    tenant: Annotated[str | None, typer.Option(
        "--tenant", help="The run's BoundloopTenant search attribute")] = None,
    limit_flags: dict[str, Any] | None = None,
) -> None:
    """Start a run. With --model-script the run uses a scripted model and its own worker."""
    settings = load_settings()
    script = load_model_script(model_script) if model_script is not None else None
    if script is not None:
        check_approver_keys(settings)
    if script is not None and api is None and script.api is not None:
        api = script.api  # the script says which API it speaks
    if not question.strip():
        raise fail("the question is empty")
    agent = build_agent(settings, model=model, api=api, tools=tools,
                        instructions=instructions, limits_json=limits, policy_json=policy,
                        limit_flags=limit_flags or {}, budget=budget, task_queue=task_queue)
    code = _run(_run_async(settings, agent, question, wait or script is not None, as_json,
                           script, model_script, workflow_id, tenant))
    raise typer.Exit(code)


async def _start(client: Client, agent: Agent[Any], question: str,
                 workflow_id: str | None, tenant: str | None = None) -> Any:
    from temporalio.service import RPCError, RPCStatusCode

    try:
        return (await agent.start(client, question, id=workflow_id, tenant=tenant)).handle
    except RPCError as exc:
        if exc.status == RPCStatusCode.UNAVAILABLE:
            raise
        raise fail(f"the server refused the run: {exc.message}") from None


async def _run_async(settings: Settings, agent: Agent[Any], question: str, wait: bool,
                     as_json: bool,
                     script: Any, model_script: Path | None, workflow_id: str | None,
                     tenant: str | None = None) -> int:
    from boundloop import _ops as ops

    client = await connect(settings)
    if script is None:
        handle = await _start(client, agent, question, workflow_id, tenant)
        if not wait:
            return await started(handle, settings, as_json)
        if not as_json:
            console.print(f"started {handle.id}: {ops.ui_link(settings, handle.id)}")
        return await _follow(handle, settings, as_json)
    from boundloop.scripted.server import ScriptedModelServer
    from boundloop.worker.main import build_worker

    # The embedded worker's failed attempts would print SDK tracebacks on stderr.
    logging.getLogger("temporalio").setLevel(logging.ERROR)
    scripted = ScriptedModelServer(script)
    local = settings.model_copy(update={
        "openai_base_url": scripted.start(), "task_queue": f"script-{uuid.uuid4().hex[:8]}"})
    handle = None
    # A closed terminal (SIGHUP) or `kill`/`timeout` (SIGTERM) must end the run like Ctrl-C.
    main_task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if main_task is not None:
            loop.add_signal_handler(signum, main_task.cancel)
    try:
        async with build_worker(client, local):
            handle = await _start(client, agent.replace(task_queue=local.task_queue),
                                  question, workflow_id, tenant)
            if not as_json:
                console.print(f"started {handle.id} against the scripted model "
                              f"({safe(model_script)})")
            return await _follow(handle, settings, as_json, embedded=True)
    except BaseException:
        # The run's only worker and model die with this process: end the run rather
        # than leave it waiting on a task queue no worker will ever poll.
        if handle is not None:
            with contextlib.suppress(Exception):
                await handle.terminate(reason="boundloop run --model-script stopped before "
                                       "the run ended (its embedded worker is gone)")
                err.print(f"terminated {handle.id}: the embedded worker stopped")
        raise
    finally:
        scripted.stop()


async def _follow(handle: Any, settings: Settings, as_json: bool,
                  embedded: bool = False) -> int:
    # embedded: its worker is ours (busy, never missing)
    from boundloop import _ops as ops
    from boundloop.codec import CodecKeyError

    # Without the workers' codec keys only the end is readable (a refusal's message).
    with contextlib.suppress(CodecKeyError):
        if not as_json and sys.stdout.isatty():
            from boundloop.live import watch as live_watch

            await live_watch(handle, warn_silence=not embedded)
        else:
            async for _status, events in ops.follow(handle, on_silence=None if embedded else (
                    lambda q: err.print(no_worker(q)))):
                if not as_json:
                    for ev in events:
                        print_event(ev)
    result = await run_result(handle)
    if as_json:
        print(result.model_dump_json())
    else:
        print_result(result, settings)
    return exit_code(result)


@app.command()
def status(run_id: Annotated[str, typer.Argument(help="Workflow id")],
           as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Show a run: counters, its place in an agent tree and its sub-agents, pending
    approvals, events; the RunResult once it ended."""
    settings = load_settings()

    async def go() -> int:
        from temporalio.client import WorkflowExecutionStatus
        from temporalio.service import RPCError

        from boundloop import _ops as ops
        from boundloop import search_attributes as sa
        from boundloop.contracts import SESSION_WORKFLOW, RunResult

        client = await connect(settings)
        handle = client.get_workflow_handle(run_id, result_type=RunResult)
        desc = await describe(handle)
        if desc.workflow_type == SESSION_WORKFLOW:  # its result is no RunResult
            raise fail(f"{run_id!r} is a session, not a run: `boundloop session show "
                       f"{run_id}` shows it (each turn is a run: {run_id}/turn-N)")
        if desc.status in (WorkflowExecutionStatus.COMPLETED, WorkflowExecutionStatus.FAILED):
            result = await run_result(handle, refused=ExitCode.STOPPED)  # it ended so
            if as_json:
                print(result.model_dump_json())
            else:
                for ev in result.events:
                    print_event(ev)
                await print_closed_tree(client, desc)
                print_result(result, settings)
            return exit_code(result)
        if desc.status == WorkflowExecutionStatus.RUNNING:
            await _exit_if_stuck(handle, desc)
        try:
            st = await asyncio.wait_for(ops.query_status(handle), timeout=QUERY_TIMEOUT)
        except (RPCError, TimeoutError):
            # Queries need a worker; describe() and search attributes do not.
            attrs = desc.typed_search_attributes
            raise fail(f"{run_id}: {desc.status.name.lower() if desc.status else '?'} "
                       f"(BoundloopStatus {attrs.get(sa.STATUS) or '-'}, steps "
                       f"{attrs.get(sa.STEPS) or 0}); no worker answered the status query "
                       f"— {worker_hint(desc.task_queue)}",
                       ExitCode.FAILED) from None
        if as_json:
            print(st.model_dump_json())
        else:
            console.print(f"{safe(run_id)}: [bold]{st.status}[/] · steps {st.steps} · tool "
                          f"executions {st.tool_executions} · tokens {st.total_tokens}")
            print_tree(st, await ops.children_now(client, st))
            window = st.limits.max_input_tokens if st.limits is not None else None
            if st.context_tokens is not None and window is not None:
                console.print(f"context: the next request ~{st.context_tokens} input tokens "
                              f"(estimated) of a {window}-token window" + (
                                  f", the conversation summarized {st.summarized}×"
                                  if st.summarized else ""), highlight=False)
            if st.events_dropped:
                console.print(f"({st.events_dropped} earlier events: in the run's earlier "
                              "histories and its stream)", highlight=False)
            for ev in st.events:
                print_event(ev)
            if st.pending:
                print_pending_table([(run_id, st)])
            print_grants(st)
        # Open: 0. Closed by Temporal (terminated, timed out) without a RunResult: 3.
        return (ExitCode.OK if desc.status == WorkflowExecutionStatus.RUNNING
                else ExitCode.STOPPED)

    raise typer.Exit(_run(go()))


async def _exit_if_stuck(handle: Any, desc: Any) -> None:
    """A run whose workflow task keeps failing says so, with the cause and the fix
    (exit 6, ExitCode.STUCK)."""
    from boundloop.stuck import stuck_line

    line = await stuck_line(handle, desc)
    if line is not None:
        raise fail(f"{handle.id}: running, but {line}", ExitCode.STUCK)


@app.command()
def watch(run_id: Annotated[str, typer.Argument(help="Workflow id")]) -> None:
    """Follow a run live (steps, tool executions, tokens, cost, approvals) until it ends;
    for a session, each of its turns as it runs, until the session ends."""
    settings = load_settings()

    async def go() -> int:
        from boundloop import _ops as ops
        from boundloop.contracts import SESSION_WORKFLOW, RunResult
        from boundloop.live import watch as live_watch

        client = await connect(settings)
        handle = client.get_workflow_handle(run_id, result_type=RunResult)
        desc = await describe(handle)
        if desc.workflow_type == SESSION_WORKFLOW:  # follows each turn as it runs
            from boundloop.cli.sessions import watch_session

            return await watch_session(client, await ops.get_session(client, run_id),
                                       settings)
        await live_watch(handle)
        result = await run_result(handle)
        print_result(result, settings)
        return exit_code(result)

    raise typer.Exit(_run(go()))


@app.command("list")
def list_runs(
    status_filter: Annotated[str | None, typer.Option(
        "--status", help="running | waiting_approval | completed | stopped")] = None,
    reason: Annotated[str | None, typer.Option(help="Stop reason, e.g. max_steps")] = None,
    limit: Annotated[int, typer.Option(help="At most this many runs", min=1)] = 20,
    root: Annotated[str | None, typer.Option(
        "--root", help="Only this run's agent tree: the run and its sub-agents' runs, "
        "at every depth")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """List runs by search attribute, newest first; a sub-agent's run names its parent."""
    settings = load_settings()
    statuses = {"running", "waiting_approval", "completed", "stopped"}
    if status_filter is not None and status_filter not in statuses:
        raise fail(f"--status must be one of {sorted(statuses)}")
    if reason is not None and reason not in {r.value for r in StopReason}:
        raise fail(f"--reason must be one of {[r.value for r in StopReason]}")

    async def go() -> None:
        from rich.table import Table

        from boundloop import _ops as ops

        rows = await ops.list_runs(await connect(settings), status_filter, reason, limit,
                                   root=root)
        if as_json:
            print(json.dumps(rows, ensure_ascii=False))
            return
        # The parent column only where a listed run has one (a sub-agent's, a turn's).
        trees = any(r["parent"] for r in rows)
        table = Table("run", *(("parent",) if trees else ()), "status", "reason", "steps",
                      "tools", "pending", "started", "stuck")
        for r in rows:
            table.add_row(safe(r["workflow_id"]), *((safe(r["parent"] or ""),) if trees else ()),
                          r["status"], r["reason"] or "", str(r["steps"]),
                          str(r["tool_executions"]), str(r["pending_approvals"]),
                          r["start_time"], "[red]stuck[/]" if r["stuck"] else "")
        console.print(table)
        print_stuck(rows)

    _run(go())


@app.command()
def cancel(run_id: Annotated[str, typer.Argument(help="Workflow id")],
           reason: Annotated[str | None, typer.Option(
               "--reason", help="Why (kept in the run's event log and result)")] = None,
           ) -> None:
    """Cancel a run in any state: it stops with `cancelled`; a running tool or model
    request is told to stop (docs/durability.md, "Cancels")."""
    from boundloop.contracts import CancelRequest

    try:
        request = CancelRequest(reason=reason)
    except ValidationError as exc:
        raise fail(f"--reason: {validation_lines(exc)}") from None
    settings = load_settings()

    async def go() -> None:
        from boundloop import _ops as ops

        client = await connect(settings)
        await (await ops.get_run(client, run_id)).cancel(request.reason)
        console.print(f"{safe(run_id)}: cancel requested; the run stops with `cancelled` "
                      f"(follow it with `boundloop watch {safe(run_id)}`)")

    _run(go())
