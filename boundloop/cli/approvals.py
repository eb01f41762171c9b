"""Decisions: `pending`, `approve`, `reject`, and approvers' signing keys (`keys new`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from boundloop.cli.common import (
    UPDATE_TIMEOUT,
    _run,
    app,
    connect,
    err,
    fail,
    json_object,
    load_settings,
    print_pending_table,
)
from boundloop.errors import InvalidDecision, NoWorker, worker_hint
from boundloop.exit_codes import ExitCode
from boundloop.terminal import console, safe

if TYPE_CHECKING:  # loaded by the commands that use them (see cli/common.py)
    from boundloop.contracts import Decision


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


def _decide(run_id: str, verb: str, make: Callable[[], Decision], signer: Any = None) -> None:
    """Send the decision `make()` builds and print it. A decision malformed in itself
    is refused before connecting (nothing was sent)."""
    try:
        decision = make()
    except InvalidDecision as exc:
        raise fail(f"invalid decision: {exc}") from None
    settings = load_settings()

    async def go() -> None:
        from temporalio.client import WorkflowUpdateRPCTimeoutOrCancelledError

        from boundloop import _ops as ops

        run = await ops.get_run(await connect(settings), run_id)
        deciding = run.decide(decision, signer)
        try:
            await asyncio.wait_for(deciding, timeout=UPDATE_TIMEOUT)
        except NoWorker as exc:
            # No worker answered before anything was sent: an unsigned decision went as
            # the signal (recorded, applied when a worker picks the run up), exit 7.
            if not exc.recorded:
                raise fail(str(exc), ExitCode.FAILED) from None
            console.print(f"{safe(decision.call_id)}: {verb}, recorded — {safe(str(exc))}",
                          highlight=False)
            raise typer.Exit(ExitCode.RECORDED) from None
        except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError):
            # A worker answered the status query, then none took the update (it went
            # away): the server keeps an update it could not deliver until a worker takes
            # the run (not across a server restart): it may still apply.
            queue = (await run.describe()).task_queue
            raise fail(f"no worker took the decision within {UPDATE_TIMEOUT:.0f} s "
                       f"({worker_hint(queue)}); it may still take effect when a worker "
                       f"picks up the run: check `boundloop status {run_id}` before deciding "
                       "again", ExitCode.FAILED) from None
        console.print(f"{safe(decision.call_id)}: {verb}"
                      + (f" (signed by {safe(signer.name)})" if signer is not None else ""))

    _run(go())


KeyOption = Annotated[Path | None, typer.Option(
    "--key", help="Sign the decision with this private key (NAME.key from `keys new`)")]
#: The arguments the decider was shown: the run refuses the decision if they changed.
FingerprintOption = Annotated[str | None, typer.Option(
    "--fp", help="The fingerprint of the arguments you decide, as `pending` or `status` "
    "shows it: refused if the call waiting now has other arguments (default: the call as "
    "the run shows it now)")]


@app.command()
def approve(run_id: str, call_id: str,
            approver: Annotated[str, typer.Option("--as", help="Approver name")] = "operator",
            args: Annotated[str | None, typer.Option("--args", help="Edited arguments (JSON)")]
            = None, key: KeyOption = None,
            remember: Annotated[bool, typer.Option(
                "--remember", help="Approve later calls of this tool in this run too")] = False,
            when: Annotated[str | None, typer.Option(
                "--when", help="With --remember: only later calls meeting this condition "
                "(as in argument rules, e.g. 'priority != \"high\"')")] = None,
            scope: Annotated[str, typer.Option(
                "--for", help="With --remember: 'run' (this run) or 'session' (this "
                "session's later turns too)")] = "run", fp: FingerprintOption = None) -> None:
    """Approve a pending call (optionally with edited arguments, or remembered for the
    rest of the run or session)."""
    from boundloop import _ops as ops

    if scope not in ("run", "session"):
        raise typer.BadParameter("must be 'run' or 'session'", param_hint="--for")
    edited = json_object("--args", args) if args is not None else None
    signer = load_signer(approver, key)
    _decide(run_id, "approved", lambda: ops.approval(
        call_id, approver=approver, args=edited, signer=signer, remember=remember,
        when=when, scope="session" if scope == "session" else "run", fingerprint=fp),
        signer)


@app.command()
def reject(run_id: str, call_id: str,
           reason: Annotated[str, typer.Option("--reason", help="Why (shown to the model)")],
           approver: Annotated[str, typer.Option("--as", help="Approver name")] = "operator",
           key: KeyOption = None, fp: FingerprintOption = None) -> None:
    """Reject a pending call; the model is told not to retry it."""
    from boundloop import _ops as ops

    signer = load_signer(approver, key)
    _decide(run_id, "rejected", lambda: ops.rejection(
        call_id, reason=reason, approver=approver, signer=signer, fingerprint=fp), signer)


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
def pending(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List calls waiting for approval across runs (a sub-agent's with its path in its
    agent tree)."""
    settings = load_settings()

    async def go() -> None:
        from boundloop import _ops as ops

        unanswered: list[str] = []
        queues: dict[str, str] = {}
        rows = await ops.pending_runs(await connect(settings), unanswered, queues)
        for wf_id in unanswered:
            err.print(f"[yellow]note:[/] {safe(wf_id)} waits for approval but no worker "
                      f"answered its status query: {safe(worker_hint(queues[wf_id]))}")
        if as_json:
            print(json.dumps([{"workflow_id": wf, "call_id": a.call_id, "tool": a.tool,
                               "path": ops.approval_path(wf, st, a),
                               "arguments": a.arguments, "requested_at": a.requested_at,
                               "fingerprint": a.fingerprint, "run": st.run}
                              for wf, st in rows for a in st.pending], ensure_ascii=False))
        elif not rows and unanswered:  # they do wait: only their calls are unknown
            console.print(f"{len(unanswered)} run(s) wait for approval, but no worker "
                          "answered to show their calls (see the notes above)")
        elif not rows:
            console.print("no calls are waiting for approval")
        else:
            print_pending_table(rows)

    _run(go())
