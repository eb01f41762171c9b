"""Processes: `server`, `worker`, `demo`, `codec-key`, `codec-server`, `console`.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from boundloop.cli.common import (
    _run,
    app,
    check_approver_keys,
    err,
    fail,
    load_model_script,
    load_registry,
    load_settings,
)
from boundloop.exit_codes import ExitCode
from boundloop.terminal import console


@app.command()
def server(
    data_dir: Annotated[Path | None, typer.Option(help="Where temporal.db lives")] = None,
    port: int = 7233, ui_port: int = 8233,
    ui_codec_endpoint: Annotated[str | None, typer.Option(
        help="The Web UI decodes payloads through this codec server "
             "(`boundloop codec-server`), its token as the path: "
             "http://127.0.0.1:8081/$BOUNDLOOP_CODEC_TOKEN")] = None,
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
    ui_url = f"http://127.0.0.1:{ui_port}"
    console.print(f"Temporal dev server on {srv.address}, Web UI {ui_url} "
                  f"(database {srv.data_dir / 'temporal.db'}). Ctrl-C stops it.")
    differ = [f"{name}={value}" for name, value, now in (
        ("TEMPORAL_ADDRESS", srv.address, settings.temporal_address),
        ("BOUNDLOOP_UI_URL", ui_url, settings.ui_url.rstrip("/"))) if value != now]
    if differ:  # the CLI's defaults are 7233 and 8233: say what the others need
        console.print(f"Every other command (and a worker) needs {' '.join(differ)}: "
                      "the address to reach this server, the base of the Web UI links "
                      "they print.", highlight=False, soft_wrap=True)
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
def demo(interactive: Annotated[bool, typer.Option(
        "--interactive", help="Wait for a person to approve the ticket")] = False) -> None:
    """The main job, end to end on the embedded dev server."""
    from boundloop.demo import run_demo
    from boundloop.devserver import TemporalCLIMissing
    from boundloop.settings import worker_settings_problem

    settings = load_settings()
    problem = worker_settings_problem(settings)  # the demo runs a worker of its own
    if problem is not None:
        raise fail(problem)
    check_approver_keys(settings)
    try:
        code = _run(run_demo(settings, interactive=interactive))
    except TemporalCLIMissing as exc:  # the dev server is an extra (`boundloop[devserver]`)
        raise fail(str(exc), ExitCode.FAILED) from None
    raise typer.Exit(code)


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


@app.command("worker-health")
def worker_health() -> None:
    """Exit 0 when a worker on this host polls BOUNDLOOP_TASK_QUEUE (the container's
    healthcheck: the process is up and connected to Temporal), else 1 with the reason."""
    from boundloop.cli.common import connect
    from boundloop.worker.main import POLLED_WITHIN, polls_from_this_host

    settings = load_settings()

    async def check() -> bool:
        return await polls_from_this_host(await connect(settings), settings.task_queue)

    if not _run(check()):
        raise fail(f"no worker on this host polled task queue {settings.task_queue!r} "
                   f"in the last {POLLED_WITHIN.total_seconds() / 60:g} minutes",
                   ExitCode.FAILED)


@app.command("codec-server")
def codec_server(
    host: Annotated[str, typer.Option(help="Address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on")] = 8081,
    tls_cert: Annotated[Path | None, typer.Option(help="Serve HTTPS with this "
                                                  "certificate (PEM)")] = None,
    tls_key: Annotated[Path | None, typer.Option(help="Its private key (PEM)")] = None,
    dev_no_token: Annotated[bool, typer.Option(
        "--dev-no-token",
        help="Development only: serve without BOUNDLOOP_CODEC_TOKEN, on loopback only. "
             "Anyone and anything on this machine can then encrypt and decrypt with the "
             "keys")] = False,
    allow_no_token: Annotated[bool, typer.Option("--allow-no-token", hidden=True)] = False,
) -> None:
    """Serve Temporal's codec endpoints (/encode, /decode) with the BOUNDLOOP_CODEC_KEYS
    keys, for the Web UI (its codec endpoint http://HOST:PORT/TOKEN, or `boundloop server
    --ui-codec-endpoint`) and `temporal workflow show --codec-endpoint URL --codec-auth
    "Bearer TOKEN"`. Every request needs BOUNDLOOP_CODEC_TOKEN: whoever can use the codec
    server holds the keys."""
    from boundloop import codec_server as cs
    from boundloop.connection import ConnectionSettingsError
    from boundloop.connection import codec as settings_codec

    if allow_no_token:  # gone: a container's port is no proof of who reaches it
        raise fail("--allow-no-token is gone: set BOUNDLOOP_CODEC_TOKEN (the Web UI's codec "
                   "endpoint is then http://HOST:PORT/TOKEN), or use --dev-no-token on "
                   "127.0.0.1 for development")
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
    problem = cs.token_problem(host, token=token, dev_no_token=dev_no_token)
    if problem is not None:
        raise fail(problem)
    hosts = cs.hosts_of(settings.codec_hosts, host, port)
    scheme = "https" if tls_cert else "http"
    console.print(f"codec server on {scheme}://{host}:{port} (keys {', '.join(codec.key_ids)};"
                  f" encrypting with {codec.current}; CORS {', '.join(origins)}; Host "
                  f"{', '.join(hosts)}; "
                  f"{'token required' if token else 'NO TOKEN: development only'}). "
                  "Ctrl-C stops it.", highlight=False)
    cs.serve(codec, host=host, port=port, origins=origins, token=token, hosts=hosts,
             certfile=str(tls_cert) if tls_cert else None,
             keyfile=str(tls_key) if tls_key else None)


def _console_commands() -> None:
    """`boundloop console` and `boundloop console-approver` (boundloop/console/command.py)."""
    from boundloop.console import command

    app.command("console")(command.serve)
    app.command("console-approver")(command.approver)


_console_commands()
