"""`boundloop codec-server`: Temporal's remote codec endpoints over HTTP, so the Web UI
and `temporal workflow show --codec-endpoint` can show encrypted payloads decoded.

Whoever can use it holds the keys: it encrypts and decrypts for any request it accepts
(a client without keys could have its run's input encrypted through `/encode` and pass
`require_encryption`). So:

- `POST /encode`, `POST /decode`: a JSON body `{"payloads": [...]}` in the protobuf
  JSON form of `temporal.api.common.v1.Payloads` (base64 `data` and metadata values),
  answered in the same form. The keys are the process's (BOUNDLOOP_CODEC_KEYS); they
  never leave it.
- A token (BOUNDLOOP_CODEC_TOKEN, at least 32 URL-safe characters) on every request:
  `Authorization: Bearer TOKEN` (the `temporal` CLI's `--codec-auth`), or as the first
  part of the path, `/TOKEN/decode`, which is how the Web UI sends it (its codec
  endpoint is `http://HOST:PORT/TOKEN`: the UI adds `/decode`; it sends an
  Authorization header only with its own OIDC login). Anything else gets 401. Without a
  token it serves only when started with `--dev-no-token`, on loopback only.
- The `Host` header must be one of BOUNDLOOP_CODEC_HOSTS (default: the address and port
  it listens on, with `localhost` / `127.0.0.1` / `[::1]` for a loopback or wildcard
  address): a web page whose name was re-pointed at this machine (DNS rebinding) sends
  its own name and gets 421.
- CORS for the Web UI's origin(s), preflight included (the UI sends `Content-Type`,
  `X-Namespace` and, with an auth token, `Authorization`).
- `GET /healthz` (no token, no payloads, any Host): the container's healthcheck.

A payload it cannot decrypt (an unknown key id) answers 422 with the one-line reason.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any

from google.protobuf import json_format
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.converter import PayloadCodec

from boundloop.codec import CodecKeyError

#: The largest request body read (a workflow's history page of payloads fits).
MAX_BODY_BYTES = 16 * 1024 * 1024


#: A token: long enough not to be guessed, and URL-safe (it may stand in the path).
TOKEN_FORM = re.compile(r"[A-Za-z0-9._~-]{32,}")


def app(codec: PayloadCodec, *, origins: Sequence[str], token: str | None,
        hosts: Collection[str]) -> Starlette:
    """The codec endpoints for `codec`, answering `origins` (CORS) at `hosts` (the Host
    header, `name:port`), requiring `token` (as `Authorization: Bearer …` or the path's
    first part) unless it is None (`--dev-no-token`, loopback only)."""

    def authorized(request: Request) -> bool:
        if token is None:
            return True
        given = request.path_params.get("token")
        if given is not None:  # /TOKEN/decode: the Web UI's form
            return hmac.compare_digest(given.encode(), token.encode())
        return hmac.compare_digest(request.headers.get("authorization", "").encode(),
                                   f"Bearer {token}".encode())

    def endpoint(apply: Callable[[list[Payload]], Awaitable[list[Payload]]]
                 ) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            if not authorized(request):
                return JSONResponse({"error": "missing or wrong token"}, 401)
            body = await request.body()
            if len(body) > MAX_BODY_BYTES:
                return JSONResponse({"error": "request too large"}, 413)
            try:
                payloads = json_format.Parse(body, Payloads(), ignore_unknown_fields=True)
            except (json_format.ParseError, UnicodeDecodeError) as exc:
                return JSONResponse({"error": f"not a Payloads JSON object: {exc}"}, 400)
            try:
                out = await apply(list(payloads.payloads))
            except CodecKeyError as exc:
                return JSONResponse({"error": str(exc)}, 422)
            text = json_format.MessageToJson(Payloads(payloads=out), indent=None)
            return Response(text, media_type="application/json")

        return handle

    async def health(_: Request) -> Response:
        return JSONResponse({"ok": True})

    encode, decode = endpoint(codec.encode), endpoint(codec.decode)
    routes = [Route("/encode", encode, methods=["POST"]),
              Route("/decode", decode, methods=["POST"]),
              Route("/{token}/encode", encode, methods=["POST"]),
              Route("/{token}/decode", decode, methods=["POST"]),
              Route("/healthz", health, methods=["GET"])]
    middleware = [Middleware(HostChecked, hosts=hosts),
                  Middleware(CORSMiddleware, allow_origins=list(origins),
                             allow_methods=["POST", "OPTIONS"],
                             allow_headers=["content-type", "x-namespace", "authorization"],
                             allow_credentials=True, max_age=600)]
    return Starlette(routes=routes, middleware=middleware)


class HostChecked:
    """Answers only requests whose Host header is one of `hosts` (and /healthz): a page
    of another site whose name now resolves to this machine (DNS rebinding) is refused
    before anything else, preflight included."""

    def __init__(self, app: ASGIApp, hosts: Collection[str]) -> None:
        self.app = app
        self.hosts = {h.lower() for h in hosts}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] != "/healthz":
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1").lower()
            if host not in self.hosts:
                response = JSONResponse({"error": f"this codec server does not answer for "
                                                  f"host {host[:100]!r} (BOUNDLOOP_CODEC_HOSTS)"},
                                        421)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def default_hosts(host: str, port: int) -> list[str]:
    """The Host headers answered by default: the address listened on, and the loopback
    names when that is a loopback or wildcard address (a port published on the host's
    loopback, as in the compose stack)."""
    bracketed = f"[{host.strip('[]')}]" if ":" in host.strip("[]") else host
    names = [f"{bracketed}:{port}"]
    if is_loopback(host) or host.strip("[]") in ("0.0.0.0", "::", ""):
        names += [f"{n}:{port}" for n in ("127.0.0.1", "localhost", "[::1]")]
    return list(dict.fromkeys(names))


def hosts_of(value: str | None, host: str, port: int) -> list[str]:
    """BOUNDLOOP_CODEC_HOSTS (comma-separated `name:port`), else `default_hosts`."""
    if value:
        return [h.strip().lower() for h in value.split(",") if h.strip()]
    return default_hosts(host, port)


def is_loopback(host: str) -> bool:
    """`host` is a loopback address (or `localhost`): only this machine reaches it."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def token_problem(host: str, *, token: str | None, dev_no_token: bool) -> str | None:
    """Why the codec server must not serve with this token (or none) on `host`, or None."""
    if token is not None:
        if not TOKEN_FORM.fullmatch(token):
            return ("BOUNDLOOP_CODEC_TOKEN must be at least 32 characters of letters, "
                    "digits and . _ ~ - (it may stand in the Web UI's codec endpoint URL): "
                    "`openssl rand -hex 32` makes one")
        return None
    if not dev_no_token:
        return ("BOUNDLOOP_CODEC_TOKEN is not set: whoever can use the codec server can "
                "encrypt and decrypt with its keys, so every request needs the token "
                "(`openssl rand -hex 32` makes one; the Web UI's codec endpoint is then "
                "http://HOST:PORT/TOKEN). For development on this machine only, "
                "--dev-no-token serves without one on 127.0.0.1")
    if not is_loopback(host):
        return (f"--dev-no-token serves on loopback only, not on {host}: set "
                "BOUNDLOOP_CODEC_TOKEN to listen there")
    return None


def origins_of(value: str | None, ui_url: str) -> list[str]:
    """BOUNDLOOP_CODEC_CORS_ORIGINS (comma-separated), or the origin of BOUNDLOOP_UI_URL."""
    if value:
        return [o.strip().rstrip("/") for o in value.split(",") if o.strip()]
    from urllib.parse import urlsplit

    parts = urlsplit(ui_url)
    return [f"{parts.scheme}://{parts.netloc}"]


def serve(codec: PayloadCodec, *, host: str, port: int, origins: Sequence[str],
          token: str | None, hosts: Collection[str], certfile: str | None = None,
          keyfile: str | None = None) -> None:
    """Serve until interrupted (uvicorn; HTTPS when a certificate is given)."""
    import uvicorn

    config: dict[str, Any] = {"host": host, "port": port, "log_level": "warning",
                              "access_log": False}  # bodies and the path's token unlogged
    if certfile:
        config.update(ssl_certfile=certfile, ssl_keyfile=keyfile)
    uvicorn.run(app(codec, origins=origins, token=token, hosts=hosts), **config)
