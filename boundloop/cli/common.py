"""What every command shares: the Typer app, settings, the connection, errors printed with
their exit code, and input checks.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from pydantic import ValidationError
from rich.console import Console

from boundloop.errors import (
    DecisionRefused,
    PolicyRefused,
    RunEnded,
    RunIdTaken,
    RunNotFound,
    RunStuck,
    SessionRefused,
    UnknownTools,
)
from boundloop.exit_codes import ExitCode
from boundloop.terminal import console, invisible_note, safe

# Each command imports the Temporal client, the run types and the connection when it
# uses them: `--help`, and input refused before connecting, start a process without them.
if TYPE_CHECKING:
    from temporalio.client import Client

    from boundloop.contracts import RunResult, RunStatus, SessionStatus
    from boundloop.settings import Settings

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="boundloop: a durable, bounded LLM tool-calling loop on Temporal.")


err = Console(stderr=True, soft_wrap=True)


T = TypeVar("T")


#: What the client API raises, as the CLI reports it (the message is the error's own).
REFUSALS: dict[type[Exception], ExitCode] = {
    RunNotFound: ExitCode.INVALID, RunIdTaken: ExitCode.INVALID,
    UnknownTools: ExitCode.INVALID,
    RunEnded: ExitCode.FAILED, DecisionRefused: ExitCode.FAILED,
    SessionRefused: ExitCode.FAILED, RunStuck: ExitCode.STUCK,
}


#: How long the CLI waits for a worker to answer a query or accept an update.
QUERY_TIMEOUT = 10.0


UPDATE_TIMEOUT = 30.0


def _run(coro: Coroutine[Any, Any, T]) -> T:
    from temporalio.service import RPCError, RPCStatusCode

    from boundloop.codec import CodecKeyError

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
    from boundloop.settings import Settings, one_line

    try:
        return Settings()
    except ValidationError as exc:
        raise fail(f"invalid settings: {one_line(exc)}") from None


async def connect(settings: Settings) -> Client:
    """`boundloop.connect` with the command's settings, its errors said with their exit
    code."""
    from boundloop import connection
    from boundloop.errors import TemporalUnreachable

    try:
        return await connection.connect(settings=settings)
    except connection.ConnectionSettingsError as exc:
        raise fail(str(exc)) from None
    except TemporalUnreachable as exc:
        raise fail(str(exc), ExitCode.UNREACHABLE) from None


async def run_result(handle: Any, refused: ExitCode = ExitCode.INVALID) -> RunResult:
    """The RunResult however the run ended, or exit 3 when Temporal ended it without one
    (terminated, timed out). A run the operator's policy refused at admission prints
    its refusals and exits `refused`: 2 for the command that started it (its input was
    refused), 3 for one that reads a run that ended without completing (`status`)."""
    from boundloop import _ops as ops

    try:
        return await ops.Run(handle).result()
    except RunEnded as exc:
        raise fail(str(exc), ExitCode.STOPPED) from None
    except PolicyRefused as exc:
        print_refusals(exc.lines())
        raise typer.Exit(refused) from None


async def started(handle: Any, settings: Settings, as_json: bool) -> int:
    """`run` without `--wait`: the run's worker admits or refuses it in its first
    workflow task (tools it does not serve, the operator's policy), said here as `--wait`
    says it (exit 2); admitted, or no worker took it yet (a note naming the task queue),
    `started …`, exit 0."""
    from boundloop import _ops as ops
    from boundloop.errors import worker_hint

    admitted = await admission(handle)
    if admitted is None:  # closed at once: refused (printed, exit 2), or ended
        await run_result(handle)
    if as_json:
        console.print_json(json.dumps({"workflow_id": handle.id}))
    else:
        console.print(f"started {handle.id}: {ops.ui_link(settings, handle.id)}")
    if admitted is False:
        queue = (await handle.describe()).task_queue
        err.print(f"[yellow]note:[/] no worker has taken {safe(handle.id)} yet (within "
                  f"{QUERY_TIMEOUT:g} s): {safe(worker_hint(queue))}")
    return ExitCode.OK


async def admission(handle: Any) -> bool | None:
    """Whether a worker admitted the run just started (its first workflow task done, the
    run open): True; None when it closed at once (refused); False when no worker took it
    within QUERY_TIMEOUT."""
    from temporalio.api.enums.v1 import EventType
    from temporalio.client import WorkflowExecutionStatus

    loop = asyncio.get_running_loop()
    end = loop.time() + QUERY_TIMEOUT
    while True:
        if (await handle.describe()).status != WorkflowExecutionStatus.RUNNING:
            return None
        async for event in handle.fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                open_ = (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
                return True if open_ else None
        if loop.time() > end:
            return False
        await asyncio.sleep(0.2)


def print_refusals(lines: list[str]) -> None:
    """One line per refused field: what the run asked and the operator's value."""
    for line in lines:
        err.print(f"[bold red]refused:[/] {safe(line)}")


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


def load_registry(hint: str = "") -> Any:
    from boundloop.tools import catalog

    target = load_settings().tools
    try:
        return catalog.load(target)
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        raise fail(f"cannot load the toolset BOUNDLOOP_TOOLS={target!r}: "
                   f"{type(exc).__name__}: {exc}{hint}") from None


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


async def describe(handle: Any) -> Any:
    from boundloop import _ops as ops

    return await ops.describe(handle)  # RunNotFound: `_run` prints it


def check_approver_keys(settings: Settings) -> None:
    """A worker this command runs itself refuses a bad BOUNDLOOP_APPROVER_KEYS file, and
    a toolset whose tools take other deps, in one line, as `boundloop worker` does."""
    from boundloop.signing import KeyFileError
    from boundloop.worker.main import approver_keys

    try:
        approver_keys(settings)
    except KeyFileError as exc:
        raise fail(f"BOUNDLOOP_APPROVER_KEYS: {exc}") from None
    from boundloop.worker.main import toolset_problem

    problem = toolset_problem(settings)  # the deps it hands tools are the demo's
    if problem is not None:
        raise fail(problem)


def print_session(st: SessionStatus) -> None:
    state = st.status + (f" ({st.ended})" if st.ended else "")
    budget = f" of {st.limits.token_budget}" if st.limits.token_budget else ""
    tenant = f" · tenant {safe(st.tenant)}" if st.tenant is not None else ""
    console.print(f"{safe(st.session_id)}: [bold]{state}[/]{tenant} · turns {st.turns} of "
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
    for g in st.grants:
        console.print(f"remembered for the session: {safe(g.text)} (approved by "
                      f"{safe(g.approver)} on `{safe(g.call_id)}`)")
    if st.idle_until:
        console.print(f"ends if idle until {st.idle_until}")


def print_pending_table(rows: list[tuple[str, RunStatus]]) -> None:
    from rich.table import Table

    from boundloop import _ops as ops

    table = Table()
    for header in ("run", "call id", "tool", "waiting since", "asked because",
                   "arguments (in full)"):
        table.add_column(header, overflow="fold")  # wrapped, never cut with an ellipsis
    for wf_id, status in rows:
        for a in status.pending:
            # A sub-agent's call: its path from the root run (`ROOT → research →
            # create_ticket`); the run column names the run that decides it.
            tool = a.tool if status.tree is None else status.tree.line(a.tool)
            table.add_row(safe(wf_id), safe(a.call_id), safe(tool), a.requested_at,
                          safe(a.asked_because or "tool setting"),
                          safe(ops.argument_text(a)) + invisible_note(a.arguments))
    console.print(table)
