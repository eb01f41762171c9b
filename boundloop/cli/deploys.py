"""Before a deploy: `boundloop replay-check` (docs/deploying.md)."""

from __future__ import annotations

from typing import Annotated

import typer

from boundloop.cli.common import _run, app, connect, err, load_registry, load_settings
from boundloop.exit_codes import ExitCode
from boundloop.terminal import console, safe


@app.command("replay-check")
def replay_check(
    closed: Annotated[int, typer.Option(
        help="Also replay the latest N closed runs", min=0)] = 0,
) -> None:
    """Replay the histories of open runs, sessions and budget ledgers (and the latest
    --closed N runs) against this code and the BOUNDLOOP_TOOLS toolset: run it before
    every deploy. Exits 5 naming each workflow that would fail, with its first
    divergent command (docs/deploying.md)."""
    from boundloop.replay_check import replay_check as check
    from boundloop.worker.plugin import Plugin

    settings = load_settings()
    plugin = Plugin(load_registry(), deps=None)

    async def go() -> int:
        client = await connect(settings)
        replayed, diverged = await check(client, [plugin], closed=closed)
        for d in diverged:
            err.print(f"[bold red]diverges:[/] {safe(d.workflow_type)} {safe(d.workflow_id)} "
                      f"(run {safe(d.run_id)}): {safe(d.message)}", highlight=False)
        console.print(f"replayed {replayed} histories: "
                      + (f"{len(diverged)} diverge; do not deploy this code while they are "
                         "open" if diverged else "all replay"), highlight=False)
        return ExitCode.DIVERGED if diverged else ExitCode.OK

    raise typer.Exit(_run(go()))
