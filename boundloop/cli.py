"""`boundloop`: start the dev server and workers, start and follow runs, decide approvals."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.service import RPCError, RPCStatusCode

from boundloop import client as ops
from boundloop import search_attributes as sa
from boundloop.agent import Agent
from boundloop.codec import CodecKeyError
from boundloop.connection import TLS_DROPPED, ConnectionSettingsError, tls_dropped, tls_problem
from boundloop.contracts import (
    SESSION_WORKFLOW,
    CancelRequest,
    RunResult,
    RunStatus,
    SessionStatus,
)
from boundloop.core.limits import Limits, Policy
from boundloop.core.reasons import StopReason
from boundloop.core.session import SessionLimits
from boundloop.errors import (
    DecisionRefused,
    RunEnded,
    RunIdTaken,
    RunNotFound,
    SessionRefused,
)
from boundloop.exit_codes import ExitCode
from boundloop.settings import Settings, one_line, worker_settings_problem
from boundloop.terminal import console, exit_code, print_event, print_result, safe

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="boundloop: a durable, bounded LLM tool-calling loop on Temporal.")
err = Console(stderr=True, soft_wrap=True)
T = TypeVar("T")

#: What the client API raises, as the CLI reports it (the message is the error's own).
REFUSALS: dict[type[Exception], ExitCode] = {
    RunNotFound: ExitCode.INVALID, RunIdTaken: ExitCode.INVALID,
    RunEnded: ExitCode.FAILED, DecisionRefused: ExitCode.FAILED,
    SessionRefused: ExitCode.FAILED,
}

#: How long the CLI waits for a worker to answer a query or accept an update.
QUERY_TIMEOUT = 10.0
UPDATE_TIMEOUT = 30.0


def _run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        return asyncio.run(coro)
    except CodecKeyError as exc:  # a payload this process cannot decrypt
        raise fail(str(exc)) from None
    except tuple(REFUSALS) as exc:
        raise fail(str(exc), REFUSALS[type(exc)]) from None
    except RPCError as exc:  # a call after connecting: the server went away or refused
        if exc.status == RPCStatusCode.UNAVAILABLE:
            raise fail(f"lost the connection to Temporal: {exc.message}",
                       ExitCode.UNREACHABLE) from None
        raise fail(f"Temporal refused the request: {exc.message}", ExitCode.FAILED) from None


def fail(message: str, code: int = ExitCode.INVALID) -> typer.Exit:
    err.print(f"[bold red]error:[/] {safe(message)}")
    return typer.Exit(code)


def load_settings() -> Settings:
    try:
        return Settings()
    except ValidationError as exc:
        raise fail(f"invalid settings: {one_line(exc)}") from None


async def connect(settings: Settings) -> Client:
    from boundloop.connection import connect as settings_connect
    from boundloop.connection import unreachable_reason

    try:
        return await settings_connect(settings)
    except ConnectionSettingsError as exc:
        raise fail(str(exc)) from None
    except RuntimeError as exc:
        problem = tls_problem(exc) or (TLS_DROPPED if tls_dropped(exc, settings) else None)
        if problem is not None:
            raise fail(f"cannot connect to Temporal at {settings.temporal_address}: "
                       f"{problem}", ExitCode.UNREACHABLE) from None
        raise fail(f"cannot reach Temporal at {settings.temporal_address} "
                   f"({unreachable_reason(exc)}): start it with `boundloop server` or set "
                   "TEMPORAL_ADDRESS", ExitCode.UNREACHABLE) from None


async def run_result(handle: Any) -> RunResult:
    """The RunResult however the run ended, or exit 3 when Temporal ended it without one
    (terminated, timed out)."""
    try:
        return await ops.Run(handle).result()
    except RunEnded as exc:
        raise fail(str(exc), ExitCode.STOPPED) from None


# --- settings from flags ---------------------------------------------------------


#: The limit flags `run` and `session start` share (`--limits` JSON takes the rest):
#: flag name -> (type, help). Each overrides the same field of --limits.
LIMIT_FLAGS: dict[str, tuple[type, str]] = {
    "max_steps": (int, "Model requests per run (per turn in a session)"),
    "max_tool_executions": (int, "Tool executions per run"),
    "token_threshold": (int, "Known total tokens after which a run stops"),
    "max_result_bytes": (int, "Largest tool result"),
    "max_history_bytes": (int, "Largest conversation the model is sent"),
    "max_identical_calls": (int, "The same call (tool and arguments) at most this often"),
    "deadline_seconds": (float, "Processing time per run"),
    "approval_timeout_seconds": (float, "How long an approval waits"),
    "max_output_tokens": (int, "Most output tokens per model response"),
}


def limit_flags(command: Callable[..., T]) -> Callable[..., T]:
    """Add the LIMIT_FLAGS options to `command`, which receives them as one dict,
    `limit_flags` (the flags given; the others left out)."""
    own = [p for p in inspect.signature(command, eval_str=True).parameters.values()
           if p.name != "limit_flags"]
    added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None,
                               annotation=Annotated[kind | None, typer.Option(
                                   help=text, rich_help_panel="Limits (each overrides --limits)")])
             for name, (kind, text) in LIMIT_FLAGS.items()]

    @functools.wraps(command)
    def with_flags(**kwargs: Any) -> T:
        given = {name: kwargs.pop(name) for name in LIMIT_FLAGS}
        return command(**kwargs, limit_flags={k: v for k, v in given.items() if v is not None})

    with_flags.__signature__ = inspect.Signature([*own, *added])  # type: ignore[attr-defined]
    return with_flags


def build_agent(settings: Settings, *, model: str | None, api: str | None,
                tools: str | None, instructions: str | None, limits_json: str | None,
                policy_json: str | None, limit_flags: dict[str, Any],
                budget: str | None = None, task_queue: str | None = None) -> Agent[Any]:
    """The agent the flags describe, validated before anything starts."""
    limits_raw = json_object("--limits", limits_json)
    policy_raw = json_object("--policy", policy_json)
    limits_raw.update(limit_flags)
    if tools is not None and not tools.strip():
        raise fail("--tools is empty; name at least one tool, e.g. --tools lookup_stock")
    if model is not None and not model.strip():
        raise fail("--model is empty")
    toolset = load_registry()
    try:
        return Agent(toolset, model=model or settings.model, api=api or settings.api,  # type: ignore[arg-type]
                     instructions=instructions, limits=Limits.model_validate(limits_raw),
                     policy=Policy.model_validate(policy_raw), budget=budget,
                     task_queue=task_queue or settings.task_queue,
                     mcp_tools=load_mcp_tools(settings),
                     allowed=[t.strip() for t in tools.split(",")] if tools else None)
    except ValidationError as exc:
        raise fail("invalid run settings:\n" + validation_lines(exc)) from None
    except ValueError as exc:
        raise fail(str(exc)) from None


def validation_lines(exc: ValidationError) -> str:
    return "\n".join(f"  {'.'.join(str(p) for p in e['loc']) or '(value)'}: {e['msg']}"
                     for e in exc.errors())


def json_object(flag: str, text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise fail(f"{flag} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise fail(f"{flag} must be a JSON object ({{...}}), not {type(value).__name__}")
    return value


def load_mcp_tools(settings: Settings) -> list[Any]:
    """The tools of the BOUNDLOOP_MCP_CONFIG servers, listed now (the servers are started
    or connected, listed and closed): a run carries their declarations in its input."""
    from boundloop.mcp import (
        MCPConfigError,
        MCPDeclarationError,
        MCPServerError,
        list_mcp_tools,
        load_mcp_config,
    )

    if settings.mcp_config is None:
        return []
    try:
        servers = load_mcp_config(settings.mcp_config)
    except MCPConfigError as exc:
        raise fail(f"BOUNDLOOP_MCP_CONFIG: {exc}") from None
    try:
        return _run(list_mcp_tools(servers))
    except (MCPServerError, MCPDeclarationError) as exc:
        raise fail(str(exc), ExitCode.FAILED) from None


def load_registry() -> Any:
    from boundloop.tools import catalog

    target = load_settings().tools
    try:
        return catalog.load(target)
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        raise fail(f"cannot load the toolset BOUNDLOOP_TOOLS={target!r}: "
                   f"{type(exc).__name__}: {exc}") from None


def load_model_script(path: Path) -> Any:
    """The script, validated before anything starts (docs/scripted-server.md)."""
    from boundloop.scripted.script import load_script

    try:
        return load_script(path)
    except FileNotFoundError:
        raise fail(f"model script {path} does not exist") from None
    except IsADirectoryError:
        raise fail(f"model script {path} is a directory, not a JSON file") from None
    except UnicodeDecodeError:
        raise fail(f"model script {path} is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise fail(f"model script {path} is not valid JSON: {exc}") from None
    except ValidationError as exc:
        raise fail(f"model script {path} does not follow the script format "
                   f"(docs/scripted-server.md):\n{validation_lines(exc)}") from None
    except OSError as exc:
        raise fail(f"cannot read model script {path}: {exc.strerror}") from None


# --- printing --------------------------------------------------------------------


def print_pending_table(rows: list[tuple[str, RunStatus]]) -> None:
    table = Table()
    for header in ("run", "call id", "tool", "waiting since", "arguments (in full)"):
        table.add_column(header, overflow="fold")  # wrapped, never cut with an ellipsis
    for wf_id, status in rows:
        for a in status.pending:
            table.add_row(safe(wf_id), safe(a.call_id), safe(a.tool), a.requested_at,
                          safe(ops.argument_text(a)))
    console.print(table)


# --- commands --------------------------------------------------------------------


@app.command()
def server(
    data_dir: Annotated[Path | None, typer.Option(help="Where temporal.db lives")] = None,
    port: int = 7233, ui_port: int = 8233,
    ui_codec_endpoint: Annotated[str | None, typer.Option(
        help="The Web UI decodes payloads through this codec server "
             "(`boundloop codec-server`), e.g. http://127.0.0.1:8081")] = None,
) -> None:
    """Start the Temporal dev server (SQLite file, Web UI, search attributes, fast settings)."""
    from boundloop.devserver import DevServer

    settings = load_settings()
    srv = DevServer(data_dir or settings.data_dir, port=port, ui_port=ui_port,
                    ui_codec_endpoint=ui_codec_endpoint)
    try:
        srv.start()
    except RuntimeError as exc:
        raise fail(str(exc), ExitCode.FAILED) from None
    console.print(f"Temporal dev server on {srv.address}, Web UI http://127.0.0.1:{ui_port} "
                  f"(database {srv.data_dir / 'temporal.db'}). Ctrl-C stops it.")
    signal.signal(signal.SIGTERM, lambda *_: srv.stop())
    try:
        while srv.process is not None and srv.process.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()


@app.command()
def worker(
    model_script: Annotated[Path | None, typer.Option(
        help="Serve the model from this script (docs/scripted-server.md)")] = None,
) -> None:
    """Run a worker: the workflow, the model activity and the tool activity."""
    from boundloop.worker.main import main as worker_main

    settings = load_settings()
    load_registry()
    if model_script is not None:
        from boundloop.scripted.server import ScriptedModelServer

        scripted = ScriptedModelServer(load_model_script(model_script))
        settings = settings.model_copy(update={"openai_base_url": scripted.start()})
        console.print(f"scripted model server at {settings.openai_base_url}")
    elif not settings.model_configured:
        err.print("[yellow]warning:[/] neither OPENAI_API_KEY nor OPENAI_BASE_URL is set: "
                  "model requests will fail (use --model-script FILE for a scripted model)")
    worker_main(settings)


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
    limits: Annotated[str | None, typer.Option("--limits", help="Limits as JSON")] = None,
    policy: Annotated[str | None, typer.Option("--policy", help="Policy as JSON")] = None,
    budget: Annotated[str | None, typer.Option(
        "--budget", help="Spend from this shared budget key (boundloop budget set)")] = None,
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
                        limit_flags=limit_flags or {}, budget=budget)
    code = _run(_run_async(settings, agent, question, wait or script is not None, as_json,
                           script, model_script, workflow_id))
    raise typer.Exit(code)


async def _start(client: Client, agent: Agent[Any], question: str,
                 workflow_id: str | None) -> Any:
    try:
        return (await agent.start(client, question, workflow_id=workflow_id)).handle
    except RPCError as exc:
        if exc.status == RPCStatusCode.UNAVAILABLE:
            raise
        raise fail(f"the server refused the run: {exc.message}") from None


async def _run_async(settings: Settings, agent: Agent[Any], question: str, wait: bool,
                     as_json: bool,
                     script: Any, model_script: Path | None, workflow_id: str | None) -> int:
    client = await connect(settings)
    if script is None:
        handle = await _start(client, agent, question, workflow_id)
        if not as_json:
            console.print(f"started {handle.id}: {ops.ui_link(settings, handle.id)}")
        if not wait:
            if as_json:
                console.print_json(json.dumps({"workflow_id": handle.id}))
            return ExitCode.OK
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
                                  question, workflow_id)
            if not as_json:
                console.print(f"started {handle.id} against the scripted model "
                              f"({safe(model_script)})")
            return await _follow(handle, settings, as_json)
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


def _no_worker(task_queue: str) -> None:
    err.print(f"[yellow]no worker is answering for this run (task queue {safe(task_queue)}): "
              "start `boundloop worker`[/]")


async def _follow(handle: Any, settings: Settings, as_json: bool) -> int:
    if not as_json and sys.stdout.isatty():
        from boundloop.live import watch as live_watch

        await live_watch(handle)
    else:
        async for _status, events in ops.follow(handle, on_silence=_no_worker):
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
    """Show a run: counters, pending approvals, events; the RunResult once it ended."""
    settings = load_settings()

    async def go() -> int:
        client = await connect(settings)
        handle = client.get_workflow_handle(run_id, result_type=RunResult)
        desc = await describe(handle)
        if desc.status in (WorkflowExecutionStatus.COMPLETED, WorkflowExecutionStatus.FAILED):
            result = await run_result(handle)
            if as_json:
                print(result.model_dump_json())
            else:
                for ev in result.events:
                    print_event(ev)
                print_result(result, settings)
            return exit_code(result)
        try:
            st = await asyncio.wait_for(ops.query_status(handle), timeout=QUERY_TIMEOUT)
        except (RPCError, TimeoutError):
            # Queries need a worker; describe() and search attributes do not.
            attrs = desc.typed_search_attributes
            raise fail(f"{run_id}: {desc.status.name.lower() if desc.status else '?'} "
                       f"(BoundloopStatus {attrs.get(sa.STATUS) or '-'}, steps "
                       f"{attrs.get(sa.STEPS) or 0}); no worker answered the status query "
                       f"— is `boundloop worker` running for task queue {desc.task_queue}?",
                       ExitCode.FAILED) from None
        if as_json:
            print(st.model_dump_json())
        else:
            console.print(f"{safe(run_id)}: [bold]{st.status}[/] · steps {st.steps} · tool "
                          f"executions {st.tool_executions} · tokens {st.total_tokens}")
            for ev in st.events:
                print_event(ev)
            if st.pending:
                print_pending_table([(run_id, st)])
        # Open: 0. Closed by Temporal (terminated, timed out) without a RunResult: 3.
        return (ExitCode.OK if desc.status == WorkflowExecutionStatus.RUNNING
                else ExitCode.STOPPED)

    raise typer.Exit(_run(go()))


async def describe(handle: Any) -> Any:
    return await ops.describe(handle)  # RunNotFound: `_run` prints it


@app.command()
def watch(run_id: Annotated[str, typer.Argument(help="Workflow id")]) -> None:
    """Follow a run live (steps, tool executions, tokens, cost, approvals) until it ends;
    for a session, each of its turns as it runs, until the session ends."""
    settings = load_settings()

    async def go() -> int:
        from boundloop.live import watch as live_watch

        client = await connect(settings)
        handle = client.get_workflow_handle(run_id, result_type=RunResult)
        desc = await describe(handle)
        if desc.workflow_type == SESSION_WORKFLOW:  # follows each turn as it runs
            return await _watch_session(client, ops.get_session(client, run_id), settings)
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
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """List runs by search attribute, newest first."""
    settings = load_settings()
    statuses = {"running", "waiting_approval", "completed", "stopped"}
    if status_filter is not None and status_filter not in statuses:
        raise fail(f"--status must be one of {sorted(statuses)}")
    if reason is not None and reason not in {r.value for r in StopReason}:
        raise fail(f"--reason must be one of {[r.value for r in StopReason]}")

    async def go() -> None:
        rows = await ops.list_runs(await connect(settings), status_filter, reason, limit)
        if as_json:
            print(json.dumps(rows, ensure_ascii=False))
            return
        table = Table("run", "status", "reason", "steps", "tools", "pending", "started")
        for r in rows:
            table.add_row(r["workflow_id"], r["status"], r["reason"] or "", str(r["steps"]),
                          str(r["tool_executions"]), str(r["pending_approvals"]),
                          r["start_time"])
        console.print(table)

    _run(go())


@app.command()
def pending(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List calls waiting for approval across runs."""
    settings = load_settings()

    async def go() -> None:
        unanswered: list[str] = []
        rows = await ops.pending_runs(await connect(settings), unanswered)
        for wf_id in unanswered:
            err.print(f"[yellow]note:[/] {safe(wf_id)} waits for approval but no worker "
                      "answered its status query: is `boundloop worker` running?")
        if as_json:
            print(json.dumps([{"workflow_id": wf, "call_id": a.call_id, "tool": a.tool,
                               "arguments": a.arguments, "requested_at": a.requested_at}
                              for wf, st in rows for a in st.pending], ensure_ascii=False))
        elif not rows:
            console.print("no calls are waiting for approval")
        else:
            print_pending_table(rows)

    _run(go())


def check_approver_keys(settings: Settings) -> None:
    """A worker this command runs itself refuses a bad BOUNDLOOP_APPROVER_KEYS file in
    one line, as `boundloop worker` does."""
    from boundloop.signing import KeyFileError
    from boundloop.worker.main import approver_keys

    try:
        approver_keys(settings)
    except KeyFileError as exc:
        raise fail(f"BOUNDLOOP_APPROVER_KEYS: {exc}") from None


def load_signer(approver: str, key: Path | None) -> Any:
    """The approver's private key from `--key` (None: an unsigned decision)."""
    if key is None:
        return None
    from boundloop.signing import KeyFileError, Signer

    if approver == "operator":
        raise fail("--key needs --as NAME: the approver the key was made for")
    try:
        return Signer.from_file(approver, key)
    except KeyFileError as exc:
        raise fail(str(exc)) from None


def _decide(run_id: str, call_id: str, verb: str,
            decide: Callable[[ops.Run], Coroutine[Any, Any, None]], signer: Any = None) -> None:
    """Send one decision with `decide(run)` (Run.approve or Run.reject) and print it."""
    settings = load_settings()

    async def go() -> None:
        deciding = decide(ops.get_run(await connect(settings), run_id))
        try:
            await asyncio.wait_for(deciding, timeout=UPDATE_TIMEOUT)
        except ValidationError as exc:  # the decision itself (a reason too long, ...)
            raise fail("invalid decision:\n" + validation_lines(exc)) from None
        except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError):
            # The server keeps an update it could not deliver until a worker takes the run
            # (not across a server restart): it may still apply, so never "nothing changed".
            raise fail(f"no worker answered within {UPDATE_TIMEOUT:.0f} s (is `boundloop "
                       "worker` running?); the decision may still take effect when a worker "
                       f"picks up the run: check `boundloop status {run_id}` before deciding "
                       "again", ExitCode.FAILED) from None
        console.print(f"{safe(call_id)}: {verb}"
                      + (f" (signed by {safe(signer.name)})" if signer is not None else ""))

    _run(go())


KeyOption = Annotated[Path | None, typer.Option(
    "--key", help="Sign the decision with this private key (NAME.key from `keys new`)")]


@app.command()
def approve(run_id: str, call_id: str,
            approver: Annotated[str, typer.Option("--as", help="Approver name")] = "operator",
            args: Annotated[str | None, typer.Option("--args", help="Edited arguments (JSON)")]
            = None, key: KeyOption = None) -> None:
    """Approve a pending call (optionally with edited arguments)."""
    edited = json_object("--args", args) if args is not None else None
    signer = load_signer(approver, key)
    _decide(run_id, call_id, "approved", lambda run: run.approve(
        call_id, approver=approver, args=edited, signer=signer), signer)


@app.command()
def reject(run_id: str, call_id: str,
           reason: Annotated[str, typer.Option("--reason", help="Why (shown to the model)")],
           approver: Annotated[str, typer.Option("--as", help="Approver name")] = "operator",
           key: KeyOption = None) -> None:
    """Reject a pending call; the model is told not to retry it."""
    signer = load_signer(approver, key)
    _decide(run_id, call_id, "rejected", lambda run: run.reject(
        call_id, reason=reason, approver=approver, signer=signer), signer)


keys_app = typer.Typer(no_args_is_help=True, help="Approvers' signing keys.")
app.add_typer(keys_app, name="keys")


@keys_app.command("new")
def keys_new(name: Annotated[str, typer.Argument(help="The approver's name (as in --as)")],
             directory: Annotated[Path, typer.Option(
                 "--dir", help="Where NAME.key and NAME.pub are written")] = Path("."),
             ) -> None:
    """Make an approver's Ed25519 key pair: NAME.key (private, mode 0600) and NAME.pub."""
    from boundloop.signing import KeyFileError, new_key

    try:
        made = new_key(name, directory)
    except KeyFileError as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(f"cannot write the key files in {directory}: {exc.strerror}") from None
    key = made.public_line.split()[1]
    console.print(f"wrote {safe(made.private_path)}: {safe(name)}'s private key (mode 0600); "
                  "it never leaves the approver", highlight=False)
    console.print(f"wrote {safe(made.public_path)}: the public key", highlight=False)
    print(made.public_line)
    console.print(f"give the public key to the worker (add the line above to its "
                  f"BOUNDLOOP_APPROVER_KEYS file) or to a run (--policy "
                  f"'{{\"approver_keys\": {{\"{safe(name)}\": \"{key}\"}}}}'); then "
                  f"decide with --as {safe(name)} --key {safe(made.private_path)}",
                  highlight=False, soft_wrap=True)


@app.command()
def cancel(run_id: Annotated[str, typer.Argument(help="Workflow id")],
           reason: Annotated[str | None, typer.Option(
               "--reason", help="Why (kept in the run's event log and result)")] = None,
           ) -> None:
    """Cancel a run in any state: it stops with `cancelled`; a running tool or model
    request is told to stop (docs/durability.md, "Cancels")."""
    try:
        request = CancelRequest(reason=reason)
    except ValidationError as exc:
        raise fail(f"--reason: {validation_lines(exc)}") from None
    settings = load_settings()

    async def go() -> None:
        client = await connect(settings)
        await ops.get_run(client, run_id).cancel(request.reason)
        console.print(f"{safe(run_id)}: cancel requested; the run stops with `cancelled` "
                      f"(follow it with `boundloop watch {safe(run_id)}`)")

    _run(go())


# --- shared budgets ----------------------------------------------------------------

budget_app = typer.Typer(no_args_is_help=True,
                         help="Budgets shared by many runs: set a key's limits, show it.")
app.add_typer(budget_app, name="budget")


def _budget_key(key: str) -> str:
    from boundloop.budgets import check_key

    try:
        return check_key(key)
    except ValueError as exc:
        raise fail(str(exc)) from None


def _print_view(view: Any, as_json: bool) -> None:
    from boundloop.budgets import view_lines

    if as_json:
        console.print_json(view.model_dump_json())
    else:
        for line in view_lines(view):
            console.print(safe(line), highlight=False)


@budget_app.command("set")
def budget_set(
    key: Annotated[str, typer.Argument(help="Budget key (a tenant, project, API key)")],
    usd: Annotated[float | None, typer.Option("--usd", help="USD limit")] = None,
    tokens: Annotated[int | None, typer.Option("--tokens", help="Token limit")] = None,
    period: Annotated[str, typer.Option("--period", help="total | day (UTC)")] = "total",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
) -> None:
    """Start the ledger of KEY with these limits, or change them (spent and reserved stay)."""
    from boundloop.budgets import set_budget
    from boundloop.core.budget import BudgetLimits

    settings = load_settings()
    _budget_key(key)
    try:
        limits = BudgetLimits.model_validate({"usd": usd, "tokens": tokens, "period": period})
    except ValidationError as exc:
        raise fail("invalid budget:\n" + validation_lines(exc)) from None

    async def go() -> None:
        client = await connect(settings)
        try:
            view = await asyncio.wait_for(
                set_budget(client, key, limits, task_queue=settings.task_queue),
                UPDATE_TIMEOUT)
        except TimeoutError:
            raise fail(f"no worker answered within {UPDATE_TIMEOUT:g} s: is `boundloop "
                       f"worker` running on task queue {settings.task_queue!r}? (the ledger "
                       "takes the limits when one starts)", ExitCode.FAILED) from None
        _print_view(view, as_json)

    _run(go())


@budget_app.command("show")
def budget_show(
    key: Annotated[str, typer.Argument(help="Budget key")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
) -> None:
    """Spent, reserved and left, and the runs holding reservations."""
    from boundloop.budgets import show_budget

    settings = load_settings()
    _budget_key(key)

    async def go() -> None:
        client = await connect(settings)
        try:
            view = await asyncio.wait_for(show_budget(client, key), QUERY_TIMEOUT)
        except TimeoutError:
            raise fail(f"no worker answered within {QUERY_TIMEOUT:g} s: is `boundloop "
                       "worker` running?", ExitCode.FAILED) from None
        if view is None:
            raise fail(f"no budget {key!r}: set it with `boundloop budget set {key} "
                       "--usd AMOUNT`")
        _print_view(view, as_json)

    _run(go())


@app.command()
def demo(interactive: Annotated[bool, typer.Option(
        "--interactive", help="Wait for a person to approve the ticket")] = False) -> None:
    """The main job, end to end on the embedded dev server."""
    from boundloop.demo import run_demo

    settings = load_settings()
    problem = worker_settings_problem(settings)  # the demo runs a worker of its own
    if problem is not None:
        raise fail(problem)
    check_approver_keys(settings)
    code = _run(run_demo(settings, interactive=interactive))
    raise typer.Exit(code)


# --- sessions: `boundloop session start|show|end`, `boundloop say` ---------------------


session_app = typer.Typer(no_args_is_help=True, help="Multi-turn sessions: one "
                          "conversation across turns (send messages with `boundloop say`).")
app.add_typer(session_app, name="session")


def print_session(st: SessionStatus) -> None:
    state = st.status + (f" ({st.ended})" if st.ended else "")
    budget = f" of {st.limits.token_budget}" if st.limits.token_budget else ""
    console.print(f"{safe(st.session_id)}: [bold]{state}[/] · turns {st.turns} of "
                  f"{st.limits.max_turns} · steps {st.steps} · tool executions "
                  f"{st.tool_executions} · tokens {st.total_tokens}{budget}"
                  + (f" · cost ${st.cost_usd:.6f}" if st.cost_usd is not None else ""))
    if st.current_turn:
        console.print(f"running: {safe(st.current_turn)} (`boundloop watch "
                      f"{safe(st.session_id)}` follows it)")
    if st.waiting:
        console.print(f"waiting for a turn: {st.waiting} message(s) (busy: "
                      f"{st.limits.busy})")
    if st.last is not None:
        console.print(f"last turn: {safe(st.last.workflow_id)} · {st.last.reason.value} · "
                      f"steps {st.last.steps} · tokens {st.last.total_tokens}")
    if st.idle_until:
        console.print(f"ends if idle until {st.idle_until}")


@session_app.command("start")
@limit_flags
def start(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
    idle_seconds: Annotated[float | None, typer.Option(
        help="End the session after this long without a turn (default 3600)")] = None,
    max_turns: Annotated[int | None, typer.Option(help="Turns allowed (default 100)")] = None,
    token_budget: Annotated[int | None, typer.Option(
        help="Known total tokens of all turns; each turn's token threshold is at most "
             "what is left")] = None,
    busy: Annotated[str | None, typer.Option(
        help="A message sent while a turn runs: refuse (default) | queue (it starts the "
             "next turn) | interrupt (the turn stops at its next safe point)")] = None,
    model: Annotated[str | None, typer.Option(help="Model name")] = None,
    api: Annotated[str | None, typer.Option(help="responses | chat")] = None,
    tools: Annotated[str | None, typer.Option(help="Allowed tools, comma-separated")] = None,
    instructions: Annotated[str | None, typer.Option(help="Instructions")] = None,
    session_id: Annotated[str | None, typer.Option("--id", help="Session id")] = None,
    limits: Annotated[str | None, typer.Option("--limits", help="Turn limits as JSON")] = None,
    policy: Annotated[str | None, typer.Option("--policy", help="Policy as JSON")] = None,
    limit_flags: dict[str, Any] | None = None,
) -> None:
    """Start a session. Each turn is one bounded run with these limits; the session's
    own limits bound the turns, their tokens and the idle time."""
    settings = load_settings()
    # The turns' settings are a run's settings, checked the same way (the message comes
    # with each `say`).
    agent = build_agent(settings, model=model, api=api, tools=tools,
                        instructions=instructions, limits_json=limits, policy_json=policy,
                        limit_flags=limit_flags or {})
    chosen = {"idle_seconds": idle_seconds, "max_turns": max_turns,
              "token_budget": token_budget, "busy": busy}
    try:
        session_limits = SessionLimits.model_validate(
            {k: v for k, v in chosen.items() if v is not None})
    except ValidationError as exc:
        raise fail("invalid session limits:\n" + validation_lines(exc)) from None

    async def go() -> None:
        client = await connect(settings)
        session = await agent.session(client, limits=session_limits, session_id=session_id)
        if as_json:
            print(json.dumps({"session_id": session.id}))
        else:
            console.print(f"started session {session.id}: send messages with `boundloop "
                          f"say {session.id} \"…\"`")
            console.print(f"Web UI: {ops.ui_link(settings, session.id)}")

    _run(go())


def _session(client: Client, session_id: str) -> ops.Session:
    return ops.get_session(client, session_id)


@app.command()
def say(session_id: Annotated[str, typer.Argument(help="Session id")],
        message: Annotated[str, typer.Argument(help="The user's next message")],
        as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")]
        = False) -> None:
    """Run one turn of a session and print its result (as `run --wait`; exit 0 when the
    turn completed, 3 when it stopped). Refused while a turn runs, or once ended."""
    if not message.strip():
        raise fail("the message is empty")
    settings = load_settings()

    async def go() -> int:
        client = await connect(settings)
        session = _session(client, session_id)
        await _described(session)
        # What the session did with the message (started, queued, interrupting): on
        # stderr, so `--json` output stays one object.
        result = await session.say(message, taken=lambda what: err.print(safe(what)))
        return _print_turn(result, settings, as_json)

    raise typer.Exit(_run(go()))


def _print_turn(result: RunResult, settings: Settings, as_json: bool) -> int:
    if as_json:
        print(result.model_dump_json(exclude={"continuation"}))
    else:
        for ev in result.events:
            print_event(ev)
        print_result(result, settings)
    return exit_code(result)


async def _described(session: ops.Session) -> Any:
    desc = await describe(session.handle)
    if desc.workflow_type != SESSION_WORKFLOW:
        raise fail(f"{session.id} is not a session (it is a {desc.workflow_type} workflow)")
    return desc


@session_app.command("show")
def show(session_id: Annotated[str, typer.Argument(help="Session id")],
         as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """A session's turns, tokens, running or last turn, and when it ends if idle."""
    settings = load_settings()

    async def go() -> None:
        client = await connect(settings)
        session = _session(client, session_id)
        await _described(session)
        try:
            st = await asyncio.wait_for(session.show(), timeout=QUERY_TIMEOUT)
        except (RPCError, TimeoutError):
            raise fail(f"{session_id}: no worker answered the status query — is `boundloop "
                       "worker` running?", ExitCode.FAILED) from None
        if as_json:
            print(st.model_dump_json())
        else:
            print_session(st)

    _run(go())


@session_app.command("end")
def end(session_id: Annotated[str, typer.Argument(help="Session id")],
        as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """End a session; a running turn is cancelled first (it ends `cancelled`)."""
    settings = load_settings()

    async def go() -> None:
        client = await connect(settings)
        session = _session(client, session_id)
        await _described(session)
        st = await session.end()
        if as_json:
            print(st.model_dump_json())
        else:
            print_session(st)

    _run(go())


async def _watch_session(client: Client, session: ops.Session, settings: Settings) -> int:
    """`boundloop watch SESSION`: follow each turn live as it runs, print its result,
    until the session ends."""
    from boundloop.live import watch as live_watch

    followed: set[str] = set()
    code: int = ExitCode.OK
    while True:
        desc = await session.handle.describe()
        st = await asyncio.wait_for(session.show(), timeout=QUERY_TIMEOUT)
        turn = st.current_turn
        if turn is not None and turn not in followed:
            followed.add(turn)
            handle = client.get_workflow_handle(turn, result_type=RunResult)
            await live_watch(handle)
            result = await run_result(handle)
            print_result(result, settings)
            code = exit_code(result)
            continue
        if desc.status != WorkflowExecutionStatus.RUNNING:
            print_session(st)
            return code
        await asyncio.sleep(0.3)


codec_key_app = typer.Typer(no_args_is_help=True, help="Payload encryption keys.")
app.add_typer(codec_key_app, name="codec-key")


@codec_key_app.command("new")
def codec_key_new(key_id: Annotated[str, typer.Argument(
        help="An id for the key (letters, digits, . _ -), e.g. 2026-12")]) -> None:
    """Print a new `id:base64key` line (AES-256). Append it to the BOUNDLOOP_CODEC_KEYS
    file: the last line encrypts new payloads, every line still decrypts."""
    from boundloop.codec import CodecKeyError, new_key_line

    try:
        line = new_key_line(key_id)
    except CodecKeyError as exc:
        raise fail(str(exc)) from None
    sys.stdout.write(line + "\n")


@app.command("codec-server")
def codec_server(
    host: Annotated[str, typer.Option(help="Address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on")] = 8081,
    tls_cert: Annotated[Path | None, typer.Option(help="Serve HTTPS with this "
                                                  "certificate (PEM)")] = None,
    tls_key: Annotated[Path | None, typer.Option(help="Its private key (PEM)")] = None,
) -> None:
    """Serve Temporal's codec endpoints (/encode, /decode) with the BOUNDLOOP_CODEC_KEYS
    keys, for the Web UI (its "Codec Server" setting, or `boundloop server
    --ui-codec-endpoint`) and `temporal workflow show --codec-endpoint`."""
    from boundloop import codec_server as cs
    from boundloop.connection import codec as settings_codec

    settings = load_settings()
    try:
        codec = settings_codec(settings)
    except ConnectionSettingsError as exc:
        raise fail(str(exc)) from None
    if codec is None:
        raise fail("no codec keys: set BOUNDLOOP_CODEC_KEYS to the key file the workers use "
                   "(or BOUNDLOOP_CODEC_KEY)")
    if (tls_cert is None) != (tls_key is None):
        raise fail("--tls-cert and --tls-key go together")
    origins = cs.origins_of(settings.codec_cors_origins, settings.ui_url)
    token = settings.codec_token.get_secret_value() if settings.codec_token else None
    scheme = "https" if tls_cert else "http"
    console.print(f"codec server on {scheme}://{host}:{port} (keys {', '.join(codec.key_ids)};"
                  f" encrypting with {codec.current}; CORS {', '.join(origins)}; "
                  f"{'bearer token required' if token else 'no token'}). Ctrl-C stops it.")
    cs.serve(codec, host=host, port=port, origins=origins, token=token,
             certfile=str(tls_cert) if tls_cert else None,
             keyfile=str(tls_key) if tls_key else None)


def _console_commands() -> None:
    """`boundloop console` and `boundloop console-approver` (boundloop/console/command.py)."""
    from boundloop.console import command

    app.command("console")(command.serve)
    app.command("console-approver")(command.approver)


_console_commands()


def main() -> None:
    for arg in sys.argv[1:]:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            err.print("[bold red]error:[/] an argument is not valid UTF-8 text")
            sys.stderr.flush()
            os._exit(ExitCode.INVALID)
    try:
        app()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # sdk-python #300: avoid an abort at interpreter exit
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
