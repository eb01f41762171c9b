"""`boundloop console`: a web console for runs, approvals and sessions (docs/console.md).

`build(settings, client)` makes the Starlette application from the settings;
`serve(...)` runs it with uvicorn. The CLI commands live in `boundloop.console.command`.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import TYPE_CHECKING

from boundloop.console.app import Console, app
from boundloop.console.auth import ApproversFileError, load_approvers
from boundloop.settings import Settings

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from temporalio.client import Client

    from boundloop.signing import Signer

__all__ = ["ApproversFileError", "Console", "app", "build", "load_signers"]


def load_signers(directory: Path, names: list[str]) -> dict[str, Signer]:
    """NAME.key of each approver that has one in `directory` (made by `boundloop keys
    new NAME --dir DIRECTORY`); an approver without one decides unsigned."""
    from boundloop.signing import Signer

    if not directory.is_dir():
        raise ApproversFileError(f"BOUNDLOOP_CONSOLE_KEYS: {directory} is not a directory")
    return {name: Signer.from_file(name, directory / f"{name}.key") for name in names
            if (directory / f"{name}.key").exists()}


def build(settings: Settings, client: Client, *, secure_cookie: bool = False) -> Starlette:
    """The console for these settings. Raises ApproversFileError / KeyFileError for a
    file it cannot use (before serving anything)."""
    from boundloop.console.auth import Sessions

    if settings.console_approvers is None:
        raise ApproversFileError("set BOUNDLOOP_CONSOLE_APPROVERS to the approvers file "
                                 "(`boundloop console-approver NAME` writes its lines): "
                                 "the console lets nobody in without one")
    approvers = load_approvers(settings.console_approvers)
    signers = (load_signers(settings.console_keys, list(approvers))
               if settings.console_keys is not None else {})
    secret = (settings.console_secret.get_secret_value().encode("utf-8")
              if settings.console_secret else secrets.token_bytes(32))
    return app(Console(client=client, approvers=approvers, sessions=Sessions(secret),
                       signers=signers, secure_cookie=secure_cookie))
