"""The console's CLI commands (`boundloop console`, `boundloop console-approver`), kept
apart from boundloop/cli/: the CLI registers them, the work is here."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer

from boundloop.terminal import console as out
from boundloop.terminal import safe


def serve(
    host: Annotated[str, typer.Option(help="Address to listen on (loopback unless told)")]
    = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on")] = 8090,
    tls_cert: Annotated[Path | None, typer.Option(help="Serve HTTPS with this certificate "
                                                  "(PEM)")] = None,
    tls_key: Annotated[Path | None, typer.Option(help="Its private key (PEM)")] = None,
    secure_cookie: Annotated[bool, typer.Option(
        "--secure-cookie", help="Mark the session cookie Secure (behind an HTTPS proxy)")]
    = False,
) -> None:
    """Serve the web console: runs, the approvals inbox, sessions. Approvers sign in with
    the credential of BOUNDLOOP_CONSOLE_APPROVERS; their decisions carry their name and,
    with a key in BOUNDLOOP_CONSOLE_KEYS, their signature."""
    import uvicorn

    from boundloop import cli
    from boundloop.console import build
    from boundloop.console.auth import ApproversFileError, load_approvers
    from boundloop.signing import KeyFileError

    if (tls_cert is None) != (tls_key is None):
        raise cli.fail("--tls-cert and --tls-key go together")
    settings = cli.load_settings()
    if settings.console_approvers is not None:  # a bad file is told before connecting
        try:
            load_approvers(settings.console_approvers)
        except ApproversFileError as exc:
            raise cli.fail(str(exc)) from None
    client = cli._run(cli.connect(settings))
    try:
        application = build(settings, client,
                            secure_cookie=secure_cookie or tls_cert is not None)
    except (ApproversFileError, KeyFileError) as exc:
        raise cli.fail(str(exc)) from None
    scheme = "https" if tls_cert else "http"
    codec = (", payloads decrypted with the codec keys"
             if settings.codec_keys_file or settings.codec_key else "")
    out.print(f"console on {scheme}://{safe(host)}:{port} (Temporal "
              f"{safe(settings.temporal_address)}{codec}). Ctrl-C stops it.", highlight=False)
    config: dict[str, Any] = {"host": host, "port": port, "log_level": "warning",
                              "access_log": False}  # URLs hold run ids and call ids only,
    # but form bodies (arguments, reasons) must never reach a log: no access log at all.
    if tls_cert:
        config.update(ssl_certfile=str(tls_cert), ssl_keyfile=str(tls_key))
    server = uvicorn.Server(uvicorn.Config(application, **config))
    asyncio.run(server.serve())


def approver(
    name: Annotated[str, typer.Argument(help="The approver's name (as decisions carry it)")],
    token: Annotated[bool, typer.Option(
        "--token", help="Generate a sign-in token instead of asking for a password")] = False,
) -> None:
    """Print an approvers-file line (`NAME scrypt$…`) for BOUNDLOOP_CONSOLE_APPROVERS: the
    credential's scrypt hash, never the credential."""
    from boundloop import cli
    from boundloop.console.auth import hash_credential, new_token
    from boundloop.signing import KeyFileError, check_name

    try:
        check_name(name)
    except KeyFileError as exc:
        raise cli.fail(str(exc)) from None
    if token:
        secret = new_token()
        cli.err.print(f"{safe(name)}'s sign-in token (shown once): {secret}", highlight=False)
    else:
        secret = typer.prompt("password", hide_input=True, confirmation_prompt=True, err=True)
        if len(secret) < 12:
            raise cli.fail("a password needs at least 12 characters")
    print(f"{name} {hash_credential(secret)}")
