"""`boundloop`: start the dev server and workers, start and follow runs, decide approvals.

One module per command group; importing them registers their commands on the Typer app
(`common.app`).
"""

from __future__ import annotations

import importlib
import os
import sys

from boundloop.cli.agents import LIMIT_FLAGS
from boundloop.cli.common import _run, app, connect, err, fail, load_settings
from boundloop.exit_codes import ExitCode

# Each command group registers its commands when imported, in this order (the
# order of --help).
for _group in ("servers", "runs", "approvals", "sessions", "budgets", "deploys"):
    importlib.import_module(f"boundloop.cli.{_group}")

__all__ = ["LIMIT_FLAGS", "_run", "app", "connect", "err", "fail", "load_settings", "main"]


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
        code = exc.code if isinstance(exc.code, int) else ExitCode.FAILED
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # sdk-python #300: avoid an abort at interpreter exit
    sys.stdout.flush()
    os._exit(ExitCode.OK)
