"""``ScriptedModelServer``: a real HTTP server imitating the OpenAI API from a script.

It listens on 127.0.0.1 (a random free port by default) and serves

- ``POST /v1/responses`` (Responses API) and
- ``POST /v1/chat/completions`` (Chat Completions),

answering each accepted request with the next turn of a :class:`~boundloop.scripted.script.Script`
(one shared sequence across both endpoints), byte-for-byte as scripted, so a script can replay
malformed model output, error statuses and headers such as ``Retry-After``. Every request is
recorded (:attr:`ScriptedModelServer.requests`).

When the script is strict (the default), each request is first checked by the pure validators
in :mod:`boundloop.scripted.validation`. A request the real API would reject gets an HTTP 400
with an OpenAI-style error body (``{"error": {"message", "type": "invalid_request_error",
"param", "code"}}``), a line in :attr:`ScriptedModelServer.violations`, and consumes no turn.
A request to the endpoint of the other API than the script's ``api`` is always a violation.
When the script is exhausted, the answer is HTTP 500 ``{"error": {"message": "scripted server:
script exhausted after N turns", "type": "server_error"}}`` and a violation is recorded.

Use it from tests::

    with ScriptedModelServer([{"body": responses_turn(text="hi")}]) as server:
        client = openai.OpenAI(api_key="test", base_url=server.base_url, max_retries=0)
        ...
    assert server.violations == []

or by hand: ``python -m boundloop.scripted.server SCRIPT.json [--port N]`` prints the base URL
and serves until interrupted, logging each request and violation to stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, cast

from boundloop.scripted import sse
from boundloop.scripted.script import ApiKind, Script, Turn, load_script, parse_script
from boundloop.scripted.validation import (
    RequiredReasoning,
    conversation_after,
    reasoning_requirements,
    validate_chat_request,
    validate_responses_request,
)

__all__ = ["ENDPOINTS", "RecordedRequest", "ScriptedModelServer", "main"]

log = logging.getLogger(__name__)

ENDPOINTS: Mapping[str, ApiKind] = {
    "/v1/responses": "responses",
    "/v1/chat/completions": "chat",
}
"""Served paths and the API each one speaks."""

_UNPARSEABLE = (
    "We could not parse the JSON body of your request. (HINT: This likely means you aren't "
    "using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was "
    "sent was not valid JSON.)"
)  # the real API's wording


_POLL_INTERVAL = 0.05
"""How often the serving loop checks for ``stop()``; bounds how long ``stop()`` takes."""


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server received it, in arrival order."""

    method: str
    path: str
    """Request path without the query string, e.g. ``/v1/responses``."""
    headers: dict[str, str]
    """Header names lower-cased (``idempotency-key``, ``authorization``, ...)."""
    body: Any
    """The parsed JSON body, or ``None`` if it was empty or not JSON."""
    turn_index: int | None
    """Index of the turn that answered it, or ``None`` if it was rejected / unscripted."""
    status: int
    """HTTP status the server answered with."""
    raw_body: bytes = b""
    violations: tuple[str, ...] = ()
    """The violations this request caused (also in ``ScriptedModelServer.violations``)."""


@dataclass(frozen=True)
class _Answer:
    status: int
    headers: dict[str, str]
    payload: bytes
    delay_seconds: float = 0.0
    streamed: bool = False
    chunk_bytes: int | None = None
    chunk_interval: float = 0.0


def _pieces(answer: _Answer) -> list[bytes]:
    """A streamed answer's writes: `chunk_bytes` bytes each; without it, one event each
    when there is an interval to wait between them (a model writing at its pace), else
    the whole stream at once."""
    payload = answer.payload
    if answer.chunk_bytes is not None:
        size = answer.chunk_bytes
        return [payload[i:i + size] for i in range(0, len(payload), size)] or [b""]
    if answer.chunk_interval > 0:
        events = [e + b"\n\n" for e in payload.split(b"\n\n")]
        events[-1] = events[-1][:-2]  # what followed the last separator, as it was
        return [e for e in events if e] or [b""]
    return [payload]


def _error_body(message: str, type_: str, code: str | None = None) -> bytes:
    body = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    return json.dumps(body, ensure_ascii=False).encode("utf-8")


def _coerce_script(
    script: Script | Sequence[Any] | Mapping[str, Any] | str | os.PathLike[str],
) -> Script:
    if isinstance(script, Script):
        return script.model_copy(deep=True)
    if isinstance(script, str | os.PathLike):
        return load_script(script)
    if isinstance(script, Mapping):
        return parse_script(dict(script))
    return parse_script(list(script))


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    owner: ScriptedModelServer


class _Handler(BaseHTTPRequestHandler):
    server_version = "boundloop-scripted/1"

    def _serve(self) -> None:
        owner = cast(_HTTPServer, self.server).owner
        raw = self._read_body()
        headers = {k.lower(): v for k, v in self.headers.items()}
        answer = owner._handle(self.command, self.path, headers, raw)
        if answer.delay_seconds > 0:
            owner._sleep(answer.delay_seconds)
        try:
            self.send_response(answer.status)
            sent = {k.lower() for k in answer.headers}
            if "content-type" not in sent:
                self.send_header("Content-Type", "application/json")
            for name, value in answer.headers.items():
                if name.lower() != "content-length":
                    self.send_header(name, value)
            if answer.streamed:  # events until the connection closes, as providers do
                self.send_header("Connection", "close")
                self.end_headers()
                for index, piece in enumerate(_pieces(answer)):
                    if index and answer.chunk_interval > 0:
                        owner._sleep(answer.chunk_interval)
                    self.wfile.write(piece)
                    self.wfile.flush()
                self.close_connection = True
                return
            self.send_header("Content-Length", str(len(answer.payload)))
            self.end_headers()
            self.wfile.write(answer.payload)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (e.g. timeout)
            log.info("client disconnected before the answer to %s %s", self.command, self.path)

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    do_POST = _serve
    do_GET = _serve
    do_PUT = _serve
    do_PATCH = _serve
    do_DELETE = _serve

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s - %s", self.address_string(), format % args)


class ScriptedModelServer:
    """Replays a script of raw OpenAI responses over real HTTP; records and validates requests.

    ``script`` is a :class:`Script`, a list of turn dicts (shorthand), a script dict, or a path
    to a JSON script file. ``strict`` overrides the script's own ``strict`` when not ``None``.
    ``sleep`` is how a turn's ``delay_seconds`` is waited out (default: an event wait that
    :meth:`stop` interrupts); tests may inject a recorder.

    All state is guarded by one lock, so concurrent requests each consume a distinct turn and
    :meth:`append` may be called while requests are being served. ``requests`` and
    ``violations`` are appended to under that lock; read them after the client call returns.
    """

    def __init__(
        self,
        script: Script | Sequence[Any] | Mapping[str, Any] | str | os.PathLike[str],
        *,
        strict: bool | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        sleep: Callable[[float], object] | None = None,
    ) -> None:
        self._script = _coerce_script(script)
        self.strict: bool = self._script.strict if strict is None else strict
        self.api: ApiKind | None = self._script.api
        self._turns: list[Turn] = list(self._script.turns)
        self._next = 0
        self._host = host
        self._port = port
        self._stopping = threading.Event()
        self._sleep: Callable[[float], object] = sleep or self._stopping.wait
        self._lock = threading.Lock()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._base_url: str | None = None
        # What the server remembers of the responses it served (Responses API):
        self._required_reasoning: dict[str, RequiredReasoning] = {}
        self._conversations: dict[str, list[Any]] = {}
        self.requests: list[RecordedRequest] = []
        self.violations: list[str] = []

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> str:
        """Bind, serve from a background daemon thread, and return :attr:`base_url`."""
        if self._httpd is not None:
            raise RuntimeError("ScriptedModelServer already started")
        httpd = _HTTPServer((self._host, self._port), _Handler)
        httpd.owner = self
        self._httpd = httpd
        host, port = httpd.server_address[:2]
        host_text = host.decode() if isinstance(host, bytes) else str(host)
        self._base_url = f"http://{host_text}:{port}/v1"
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": _POLL_INTERVAL},
            name=f"scripted-model-server:{port}",
            daemon=True,
        )
        self._thread.start()
        return self._base_url

    def stop(self) -> None:
        """Stop serving, close the socket and interrupt pending delays. Idempotent."""
        self._stopping.set()
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> ScriptedModelServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def serve_until_interrupted(self) -> None:
        """Block until the serving thread ends (Ctrl-C raises ``KeyboardInterrupt`` here)."""
        thread = self._thread
        if thread is not None:
            thread.join()

    # ---------------------------------------------------------------- inspection

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``, for ``openai.OpenAI(base_url=...)``."""
        if self._base_url is None:
            raise RuntimeError("ScriptedModelServer not started")
        return self._base_url

    @property
    def turns_consumed(self) -> int:
        with self._lock:
            return self._next

    @property
    def turns_remaining(self) -> int:
        with self._lock:
            return len(self._turns) - self._next

    def append(self, turn: Turn | Mapping[str, Any]) -> None:
        """Add a turn at the end of the script (thread-safe, also while serving)."""
        parsed = turn if isinstance(turn, Turn) else Turn.model_validate(dict(turn))
        with self._lock:
            self._turns.append(parsed)

    def assert_no_violations(self) -> None:
        """Raise ``AssertionError`` listing the violations, if any."""
        with self._lock:
            violations = list(self.violations)
        if violations:
            raise AssertionError("scripted server violations:\n" + "\n".join(violations))

    # ---------------------------------------------------------------- request handling

    def _validate(self, api: ApiKind, body: Any) -> list[str]:
        if api == "responses":
            return validate_responses_request(
                body,
                required_reasoning=self._required_reasoning,
                previous_responses=self._conversations,
            )
        return validate_chat_request(body)

    def _remember_served(self, request_body: Any, turn: Turn) -> None:
        """Remember a served Responses body: reasoning bindings and its conversation."""
        body = turn.body
        if turn.raw is not None or turn.status != 200 or not isinstance(body, dict):
            return
        output = body.get("output")
        self._required_reasoning.update(reasoning_requirements(output))
        response_id = body.get("id")
        if isinstance(response_id, str) and isinstance(output, list):
            prior: list[Any] = []
            if isinstance(request_body, dict):
                prev = request_body.get("previous_response_id")
                if isinstance(prev, str):
                    prior = self._conversations.get(prev, [])
            self._conversations[response_id] = conversation_after(request_body, output, prior)

    def _handle(self, method: str, target: str, headers: dict[str, str], raw: bytes) -> _Answer:
        path = target.split("?", 1)[0]
        api = ENDPOINTS.get(path) if method == "POST" else None
        try:
            body: Any = json.loads(raw) if raw else None
            parsed = bool(raw)
        except (UnicodeDecodeError, ValueError):
            body, parsed = None, False

        with self._lock:
            number = len(self.requests) + 1
            request_id = f"req_scripted_{number}"
            problems: list[str] = []
            turn: Turn | None = None
            turn_index: int | None = None
            if api is None:
                problems.append(f"unexpected request {method} {path}")
                status, payload = (
                    404,
                    _error_body(f"Invalid URL ({method} {path})", "invalid_request_error"),
                )
            else:
                if self.api is not None and api != self.api:
                    problems.append(
                        f"this script speaks the {self.api!r} API, but the request went to {path}"
                    )
                if self.strict:
                    problems += self._validate(api, body) if parsed else [_UNPARSEABLE]
                if problems:
                    status, payload = 400, _error_body(problems[0], "invalid_request_error")
                elif self._next >= len(self._turns):
                    problems.append(
                        f"scripted server: script exhausted after {len(self._turns)} turns"
                    )
                    status, payload = 500, _error_body(problems[0], "server_error")
                else:
                    turn_index = self._next
                    turn = self._turns[turn_index]
                    self._next += 1
                    status, payload = turn.status, turn.payload()
                    if api == "responses":
                        self._remember_served(body, turn)
            self.requests.append(
                RecordedRequest(
                    method=method,
                    path=path,
                    headers=headers,
                    body=body,
                    turn_index=turn_index,
                    status=status,
                    raw_body=raw,
                    violations=tuple(problems),
                )
            )
            self.violations.extend(f"request #{number} {method} {path}: {p}" for p in problems)
            total = len(self._turns)

        if problems:
            for p in problems:
                log.warning("#%d %s %s -> %d: %s", number, method, path, status, p)
        else:
            log.info(
                "#%d %s %s -> %d (turn %d of %d)",
                number,
                method,
                path,
                status,
                (turn_index or 0) + 1,
                total,
            )
        answer_headers = {"x-request-id": request_id}
        if turn is not None:
            answer_headers.update(turn.headers)
        streamed = (turn is not None and status == 200 and turn.raw is None
                    and isinstance(turn.body, dict) and isinstance(body, dict)
                    and body.get("stream") is True)
        if streamed:
            assert turn is not None
            options = body.get("stream_options")
            events = (sse.responses_events(turn.body, turn.stream_fault) if api == "responses"
                      else sse.chat_events(turn.body, turn.stream_fault, isinstance(
                          options, dict) and options.get("include_usage") is True))
            payload = b"".join(events)
            answer_headers["Content-Type"] = "text/event-stream"
        return _Answer(
            status=status,
            headers=answer_headers,
            payload=payload,
            delay_seconds=turn.delay_seconds if turn is not None else 0.0,
            streamed=streamed,
            chunk_bytes=turn.chunk_bytes if turn is not None else None,
            chunk_interval=turn.chunk_interval_seconds if turn is not None else 0.0,
        )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m boundloop.scripted.server SCRIPT.json [--port N] [--no-strict]``."""
    parser = argparse.ArgumentParser(
        prog="python -m boundloop.scripted.server",
        description="Serve a scripted OpenAI-compatible model on 127.0.0.1 until interrupted.",
    )
    parser.add_argument("script", help="JSON script file (object form or a list of turns)")
    parser.add_argument("--port", type=int, default=0, help="port to bind (default: random)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind")
    parser.add_argument(
        "--no-strict", action="store_true", help="do not validate requests (overrides script)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    server = ScriptedModelServer(
        args.script, strict=False if args.no_strict else None, host=args.host, port=args.port
    )
    print(server.start(), flush=True)
    try:
        server.serve_until_interrupted()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    print(
        f"served {server.turns_consumed} of {server.turns_consumed + server.turns_remaining} "
        f"turns, {len(server.violations)} violation(s)",
        file=sys.stderr,
    )
    for violation in server.violations:
        print(f"  {violation}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
