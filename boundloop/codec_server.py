"""`boundloop codec-server`: Temporal's remote codec endpoints over HTTP, so the Web UI
and `temporal workflow show --codec-endpoint` can show encrypted payloads decoded.

- `POST /encode`, `POST /decode`: a JSON body `{"payloads": [...]}` in the protobuf
  JSON form of `temporal.api.common.v1.Payloads` (base64 `data` and metadata values),
  answered in the same form. The keys are the process's (BOUNDLOOP_CODEC_KEYS); they
  never leave it.
- CORS for the Web UI's origin(s), preflight included (the UI sends `Content-Type`,
  `X-Namespace` and, with an auth token, `Authorization`).
- A bearer token (BOUNDLOOP_CODEC_TOKEN): any other request gets 401. Without one,
  anyone who reaches the port can decrypt, so it listens without one on loopback only,
  unless the operator says nothing else reaches the address (`--allow-no-token`).
- `GET /healthz` (no token, no payloads): the container's healthcheck.

A payload it cannot decrypt (an unknown key id) answers 422 with the one-line reason.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from google.protobuf import json_format
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.converter import PayloadCodec

from boundloop.codec import CodecKeyError

#: The largest request body read (a workflow's history page of payloads fits).
MAX_BODY_BYTES = 16 * 1024 * 1024


def app(codec: PayloadCodec, *, origins: Sequence[str], token: str | None) -> Starlette:
    """The codec endpoints for `codec`, answering `origins` (CORS), requiring `token`
    as `Authorization: Bearer …` when given."""

    def endpoint(apply: Callable[[list[Payload]], Awaitable[list[Payload]]]
                 ) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            if token is not None and not hmac.compare_digest(
                    request.headers.get("authorization", "").encode(),
                    f"Bearer {token}".encode()):
                return JSONResponse({"error": "missing or wrong bearer token"}, 401)
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

    routes = [Route("/encode", endpoint(codec.encode), methods=["POST"]),
              Route("/decode", endpoint(codec.decode), methods=["POST"]),
              Route("/healthz", health, methods=["GET"])]
    middleware = [Middleware(CORSMiddleware, allow_origins=list(origins),
                             allow_methods=["POST", "OPTIONS"],
                             allow_headers=["content-type", "x-namespace", "authorization"],
                             allow_credentials=True, max_age=600)]
    return Starlette(routes=routes, middleware=middleware)


def is_loopback(host: str) -> bool:
    """`host` is a loopback address (or `localhost`): only this machine reaches it."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def exposure_problem(host: str, port: int, *, token: str | None,
                     allow_no_token: bool) -> str | None:
    """Why serving on `host` would decrypt for anyone who reaches it, or None."""
    if token is not None or is_loopback(host) or allow_no_token:
        return None
    return (f"refusing to decrypt for anyone who reaches {host}:{port} without a token: "
            "set BOUNDLOOP_CODEC_TOKEN, listen on 127.0.0.1, or pass --allow-no-token "
            "where only a port published on the host's loopback reaches it")


def origins_of(value: str | None, ui_url: str) -> list[str]:
    """BOUNDLOOP_CODEC_CORS_ORIGINS (comma-separated), or the origin of BOUNDLOOP_UI_URL."""
    if value:
        return [o.strip().rstrip("/") for o in value.split(",") if o.strip()]
    from urllib.parse import urlsplit

    parts = urlsplit(ui_url)
    return [f"{parts.scheme}://{parts.netloc}"]


def serve(codec: PayloadCodec, *, host: str, port: int, origins: Sequence[str],
          token: str | None, certfile: str | None = None,
          keyfile: str | None = None) -> None:
    """Serve until interrupted (uvicorn; HTTPS when a certificate is given)."""
    import uvicorn

    config: dict[str, Any] = {"host": host, "port": port, "log_level": "warning",
                              "access_log": False}  # request bodies are never logged
    if certfile:
        config.update(ssl_certfile=certfile, ssl_keyfile=keyfile)
    uvicorn.run(app(codec, origins=origins, token=token), **config)

