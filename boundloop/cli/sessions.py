"""Sessions: `session start|show|end`, `say`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError

from boundloop.cli.agents import build_agent, limit_flags
from boundloop.cli.common import (
    QUERY_TIMEOUT,
    _run,
    app,
    connect,
    err,
    fail,
    load_settings,
    print_refusals,
    print_session,
    run_result,
    validation_lines,
)
from boundloop.errors import REFUSES, RunEnded, SessionRefused
from boundloop.exit_codes import ExitCode
from boundloop.terminal import console, exit_code, print_event, print_result, safe

if TYPE_CHECKING:  # loaded by the commands that use them (see cli/common.py)
    from temporalio.client import Client

    from boundloop import _ops as ops
    from boundloop.contracts import RunResult, SessionStatus
    from boundloop.settings import Settings

session_app = typer.Typer(no_args_is_help=True, help="Multi-turn sessions: one "
                          "conversation across turns (send messages with `boundloop say`).")


app.add_typer(session_app, name="session")


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
    tenant: Annotated[str | None, typer.Option(
        "--tenant", help="The BoundloopTenant search attribute each turn carries")] = None,
    task_queue: Annotated[str | None, typer.Option(
        "--task-queue", help="The task queue its worker polls (default: "
        "BOUNDLOOP_TASK_QUEUE, else boundloop)")] = None,
    limits: Annotated[str | None, typer.Option("--limits", help="Turn limits as JSON")] = None,
    policy: Annotated[str | None, typer.Option("--policy", help="Policy as JSON")] = None,
    budget: Annotated[str | None, typer.Option(
        "--budget", help="Each turn spends from this shared budget key (boundloop budget "
        "set); needs --max-output-tokens")] = None,
    limit_flags: dict[str, Any] | None = None,
) -> None:
    """Start a session. Each turn is one bounded run with these limits; the session's
    own limits bound the turns, their tokens and the idle time."""
    settings = load_settings()
    # The turns' settings are a run's settings, checked the same way (the message comes
    # with each `say`).
    agent = build_agent(settings, model=model, api=api, tools=tools,
                        instructions=instructions, limits_json=limits, policy_json=policy,
                        limit_flags=limit_flags or {}, budget=budget,
                        task_queue=task_queue)
    from boundloop.core.session import SessionLimits

    chosen = {"idle_seconds": idle_seconds, "max_turns": max_turns,
              "token_budget": token_budget, "busy": busy}
    try:
        session_limits = SessionLimits.model_validate(
            {k: v for k, v in chosen.items() if v is not None})
    except ValidationError as exc:
        raise fail("invalid session limits:\n" + validation_lines(exc)) from None

    async def go() -> None:
        from boundloop import _ops as ops

        client = await connect(settings)
        session = await agent.session(client, limits=session_limits, id=session_id,
                                      tenant=tenant)
        if as_json:
            print(json.dumps({"session_id": session.id}))
        else:
            console.print(f"started session {session.id}: send messages with `boundloop "
                          f"say {session.id} \"…\"`")
            console.print(f"Web UI: {ops.ui_link(settings, session.id)}")

    _run(go())


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
        from boundloop import _ops as ops

        client = await connect(settings)
        session = await ops.get_session(client, session_id)
        # What the session did with the message (started, queued, interrupting): on
        # stderr, so `--json` output stays one object.
        try:
            result = await session.say(message, taken=lambda what: err.print(safe(what)))
        except SessionRefused as exc:
            # A turn the operator's policy refused is a run refused at admission: its
            # refusals and exit 2, as `run` prints them; any other refusal: exit 1.
            head, found, refusal = str(exc).partition(REFUSES)
            if not found:
                raise
            err.print(f"[bold red]error:[/] {safe(head.rstrip(': '))} by the operator's policy")
            print_refusals([refusal])
            return ExitCode.INVALID
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


@session_app.command("show")
def show(session_id: Annotated[str, typer.Argument(help="Session id")],
         as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """A session's turns, tokens, running or last turn, and when it ends if idle."""

    async def status(session: ops.Session) -> SessionStatus:
        from temporalio.service import RPCError

        try:
            return await asyncio.wait_for(session.show(), timeout=QUERY_TIMEOUT)
        except (RPCError, TimeoutError):
            raise fail(f"{session_id}: no worker answered the status query — is `boundloop "
                       "worker` running?", ExitCode.FAILED) from None

    _print_status(session_id, as_json, status)


@session_app.command("end")
def end(session_id: Annotated[str, typer.Argument(help="Session id")],
        as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """End a session; a running turn is cancelled first (it ends `cancelled`)."""

    async def status(session: ops.Session) -> SessionStatus:
        try:
            return await session.end()
        except RunEnded:
            # Ending is idempotent: the session is ended, as asked; its final status.
            st = await session.show()
            err.print(f"note: session {safe(session_id)} had already ended")
            return st

    _print_status(session_id, as_json, status)


def _print_status(session_id: str, as_json: bool,
                  status: Callable[[ops.Session], Awaitable[SessionStatus]]) -> None:
    """Print the status `status` gives of the session (one JSON object with --json)."""
    settings = load_settings()

    async def go() -> None:
        from boundloop import _ops as ops

        client = await connect(settings)
        st = await status(await ops.get_session(client, session_id))
        if as_json:
            print(st.model_dump_json())
        else:
            print_session(st)

    _run(go())


async def watch_session(client: Client, session: ops.Session, settings: Settings) -> int:
    """`boundloop watch SESSION`: follow each turn live as it runs, print its result,
    until the session ends."""
    from temporalio.client import WorkflowExecutionStatus

    from boundloop.contracts import RunResult
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
