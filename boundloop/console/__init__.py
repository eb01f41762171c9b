"""`boundloop console`: a web console for runs, approvals and sessions (docs/console.md).

`build(settings, client)` makes the Starlette application from the settings;
`serve(...)` runs it with uvicorn. The CLI commands live in `boundloop.console.command`.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from temporalio.client import Client

    from boundloop.console.app import Console
    from boundloop.console.auth import ApproversFileError
    from boundloop.settings import Settings
    from boundloop.signing import Signer

__all__ = ["ApproversFileError", "Console", "build", "load_signers"]


def load_signers(directory: Path, names: list[str]) -> dict[str, Signer]:
    """NAME.key of each approver that has one in `directory` (made by `boundloop keys
    new NAME --dir DIRECTORY`); an approver without one decides unsigned."""
    from boundloop.console.auth import ApproversFileError
    from boundloop.signing import Signer

    if not directory.is_dir():
        raise ApproversFileError(f"BOUNDLOOP_CONSOLE_KEYS: {directory} is not a directory")
    return {name: Signer.from_file(name, directory / f"{name}.key") for name in names
            if (directory / f"{name}.key").exists()}


def build(settings: Settings, client: Client, *, secure_cookie: bool = False) -> Starlette:
    """The console for these settings. Raises ApproversFileError / KeyFileError for a
    file it cannot use (before serving anything)."""
    from boundloop.console.app import Console, app
    from boundloop.console.auth import (
        ApproversFileError,
        Sessions,
        SignInGuard,
        load_approvers,
    )

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
                       signers=signers, secure_cookie=secure_cookie,
                       guard=SignInGuard(settings.console_lockout_seconds)))


def __getattr__(name: str) -> Any:
    # Starlette (and the signing keys' cryptography) load with the console itself, not
    # with every `boundloop` command: the CLI imports `boundloop.console.command`, this
    # package first, to register `console`.
    if name == "Console":
        from boundloop.console.app import Console

        return Console
    if name == "ApproversFileError":
        from boundloop.console.auth import ApproversFileError

        return ApproversFileError
    raise AttributeError(f"module 'boundloop.console' has no attribute {name!r}")
