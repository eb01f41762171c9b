"""The worker's MCP sessions: one `MCPPool` per worker process, never used by workflow code.

The pool connects to each configured server (a stdio process it starts, or a
streamable HTTP URL), lists its tools into `MCPToolDeclaration`s, and runs calls:

    pool = MCPPool(load_mcp_config(path))
    await pool.start()                       # connect and list every server
    envelope = await pool.call(declaration, arguments, idempotency_key, timeout=25.0)
    await pool.close()

Failures: arguments that do not match the tool's schema come back as `invalid_input`
(the server is not called); the server's `isError` and its refusals (JSON-RPC invalid
params, unknown method) come back as error envelopes; anything else — the process
died, the connection dropped, a timeout, a malformed answer — raises
`TransientToolError`, so Temporal retries the attempt with the same idempotency key.
A session that failed is dropped; the next call starts a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import logging
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client import Transport
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    REQUEST_TIMEOUT,
    Implementation,
    RequestParamsMeta,
)

from boundloop.core.envelope import Envelope
from boundloop.core.mcp_tools import (
    IDEMPOTENCY_META_KEY,
    ListedTool,
    MCPDeclarationError,
    MCPServerConfig,
    MCPToolDeclaration,
    check_arguments,
    declare_tools,
    envelope_from_result,
    expand_references,
    refused,
)
from boundloop.errors import TransientToolError
from boundloop.settings import process_environment

log = logging.getLogger("boundloop.mcp")

#: JSON-RPC errors that mean "this request is wrong", not "the server is unwell":
#: answered to the model, never retried.
REFUSAL_CODES = frozenset({INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND})
#: Bound on `tools/list` pages, so a server whose cursor never ends cannot hang a start.
MAX_LIST_PAGES = 100
#: How boundloop introduces itself to servers (`clientInfo`).
CLIENT_INFO = Implementation(name="boundloop", version=importlib.metadata.version("boundloop"))
#: The SDK's own HTTP timeouts: 30 s to connect or write, 300 s between reads of a
#: response stream. A call's `timeout` bounds the whole call anyway.
HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)
#: How long `close` waits for a session to shut down (a stdio process to exit).
CLOSE_TIMEOUT_SECONDS = 10.0


class MCPServerError(RuntimeError):
    """A server could not be started, connected or listed (the message names it)."""


class _Session:
    """One connected `Client`, entered and exited by its own task.

    The SDK's client holds anyio task groups and cancel scopes, which must be exited by
    the task that entered them; calls come from other tasks (tool activities), so one
    owner task per session keeps the context open until `close`.
    """

    def __init__(self, config: MCPServerConfig) -> None:
        self.config = config
        self.client: Client | None = None
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._failure: BaseException | None = None
        self._task: asyncio.Task[None] | None = None

    async def open(self) -> Client:
        try:
            target = _target(self.config, process_environment())
        except KeyError as missing:
            raise MCPServerError(f"MCP server {self.config.name!r}: the worker has no "
                                 f"environment variable {missing.args[0]!r}") from None
        self._task = asyncio.create_task(self._own(target),
                                         name=f"mcp-session-{self.config.name}")
        try:
            async with asyncio.timeout(self.config.connect_timeout_seconds):
                await self._ready.wait()
        except TimeoutError:  # this bound only: a caller's own timeout arrives as a cancel
            await self.close()
            raise MCPServerError(f"MCP server {self.config.name!r}: no session within "
                                 f"{self.config.connect_timeout_seconds:g} s") from None
        except BaseException:
            await self.close()
            raise
        if self.client is None:
            failure = self._failure
            await self.close()
            raise MCPServerError(f"MCP server {self.config.name!r}: could not connect "
                                 f"({_describe(failure)})")
        return self.client

    async def _own(self, target: StdioServerParameters | tuple[str, dict[str, str]]) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                if isinstance(target, StdioServerParameters):
                    server: StdioServerParameters | Transport = target
                else:
                    url, headers = target
                    http = await stack.enter_async_context(httpx2.AsyncClient(
                        headers=headers, timeout=HTTP_TIMEOUT))
                    server = streamable_http_client(url, http_client=http)
                # No response cache: tools are listed only at start and on `refresh`.
                client = await stack.enter_async_context(
                    Client(server, cache=None, client_info=CLIENT_INFO))
                self.client = client
                self._ready.set()
                await self._stop.wait()
        except Exception as exc:  # reported by `open`, or seen as a dead session
            self._failure = exc
        finally:
            self.client = None
            self._ready.set()

    @property
    def alive(self) -> bool:
        return self.client is not None and not self._stop.is_set()

    async def close(self) -> None:
        self._stop.set()
        task = self._task
        if task is None or task.done():
            return
        if self.client is not None:  # connected: let it shut down in order
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), CLOSE_TIMEOUT_SECONDS)
        if not task.done():  # still connecting, or stuck shutting down
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def resolve_command(command: str, cwd: str | os.PathLike[str] | None = None) -> str | None:
    """The program a stdio server's `command` starts: a path as given (relative to
    `cwd`), a bare name found on PATH, else next to this Python interpreter (a server
    installed in the worker's virtual environment, `.venv/bin/mcp-server-time`, runs
    without .venv/bin on PATH). None when there is no such program."""
    if os.sep in command or (os.altsep and os.altsep in command):
        path = Path(cwd or ".") / command
        return command if path.is_file() and os.access(path, os.X_OK) else None
    found = shutil.which(command)
    if found is not None:
        return found
    beside = Path(sys.executable).parent / command
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def check_commands(servers: Sequence[MCPServerConfig]) -> None:
    """Every stdio server's program exists: raises MCPServerError naming the first one
    that does not (before a worker starts, not in each run's first call)."""
    for config in servers:
        if config.command is not None and resolve_command(config.command, config.cwd) is None:
            raise MCPServerError(_no_program(config))


def _no_program(config: MCPServerConfig) -> str:
    return (f"MCP server {config.name!r}: cannot start {config.command!r}: no such program "
            f"(not a file, not on PATH, not in {Path(sys.executable).parent})")


def _target(config: MCPServerConfig, environ: Mapping[str, str],
            ) -> StdioServerParameters | tuple[str, dict[str, str]]:
    """What to connect to, with `${NAME}` references resolved (KeyError: missing NAME;
    MCPServerError: no such program)."""
    if config.command is not None:
        program = resolve_command(config.command, config.cwd)
        if program is None:
            raise MCPServerError(_no_program(config))
        return StdioServerParameters(command=program, args=list(config.args),
                                     env=expand_references(config.env, environ) or None,
                                     cwd=config.cwd)
    assert config.url is not None  # the config's validator requires one of the two
    return config.url, expand_references(config.headers, environ)


def _describe(exc: BaseException | None) -> str:
    """The exception's type, and an OS error's reason (never a message that may carry a
    URL with credentials or a server's output)."""
    if exc is None:
        return "no session"
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _describe(exc.exceptions[0])
    if isinstance(exc, OSError) and exc.strerror:
        return f"{type(exc).__name__}: {exc.strerror}"
    if isinstance(exc, MCPError):
        return f"MCP error {exc.code}"
    return type(exc).__name__


class _Server:
    """A configured server: its current session (if any) and its last listing."""

    def __init__(self, config: MCPServerConfig) -> None:
        self.config = config
        self.declarations: list[MCPToolDeclaration] = []
        self._session: _Session | None = None
        self._lock = asyncio.Lock()

    async def session(self) -> _Session:
        """The live session, or a new one when there is none or it died."""
        async with self._lock:
            if self._session is None or not self._session.alive:
                if self._session is not None:
                    await self._session.close()
                self._session = None
                session = _Session(self.config)
                await session.open()
                self._session = session
            return self._session

    async def discard(self, session: _Session) -> None:
        """Drop `session` after a failure (unless a newer one replaced it already)."""
        async with self._lock:
            if self._session is session:
                self._session = None
        await session.close()

    async def list_tools(self) -> list[ListedTool]:
        session = await self.session()
        client = session.client
        if client is None:
            raise MCPServerError(f"MCP server {self.config.name!r}: session closed")
        listed: list[ListedTool] = []
        cursor: str | None = None
        try:
            async with asyncio.timeout(self.config.connect_timeout_seconds):
                for _ in range(MAX_LIST_PAGES):
                    page = await client.list_tools(cursor=cursor)
                    for tool in page.tools:
                        hints = tool.annotations
                        listed.append(ListedTool(
                            name=tool.name, description=tool.description or "",
                            input_schema=tool.input_schema,
                            read_only_hint=hints.read_only_hint if hints else None,
                            destructive_hint=hints.destructive_hint if hints else None))
                    cursor = page.next_cursor
                    if cursor is None:
                        break
        except Exception as exc:
            await self.discard(session)
            raise MCPServerError(f"MCP server {self.config.name!r}: listing tools failed "
                                 f"({_describe(exc)})") from None
        return listed

    async def close(self) -> None:
        async with self._lock:
            session, self._session = self._session, None
        if session is not None:
            await session.close()


class MCPPool:
    """Sessions to the worker's MCP servers and the tools they declare."""

    def __init__(self, servers: Sequence[MCPServerConfig]) -> None:
        names = [s.name for s in servers]
        if len(set(names)) != len(names):
            raise ValueError(f"MCP server names must be unique: {names}")
        self._servers = {s.name: _Server(s) for s in servers}

    async def __aenter__(self) -> MCPPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> list[MCPToolDeclaration]:
        """Connect to every server and list its tools (what a worker does when it starts)."""
        return await self.refresh()

    async def refresh(self, server: str | None = None) -> list[MCPToolDeclaration]:
        """List the tools of `server` (every server when None) again; returns all
        declarations. A failing server raises MCPServerError and keeps its last listing."""
        targets = list(self._servers.values()) if server is None else [self._servers[server]]
        listings = await asyncio.gather(*(s.list_tools() for s in targets))
        fresh = {s.config.name: declare_tools(s.config, listed)
                 for s, listed in zip(targets, listings, strict=True)}
        _check_unique({**{n: s.declarations for n, s in self._servers.items()}, **fresh})
        for name, declarations in fresh.items():
            self._servers[name].declarations = declarations
        for name, declarations in fresh.items():
            log.info("MCP tools listed", extra={"tool": name, "items": len(declarations)})
        return self.declarations()

    def declarations(self) -> list[MCPToolDeclaration]:
        """Every declared tool from the last listing, servers in configuration order."""
        return [d for s in self._servers.values() for d in s.declarations]

    def servers(self) -> list[str]:
        """The names of the servers configured on this worker."""
        return list(self._servers)

    def declaration(self, name: str) -> MCPToolDeclaration:
        """The declared tool called `name` (prefixed); KeyError when there is none."""
        for d in self.declarations():
            if d.name == name:
                return d
        raise KeyError(name)

    async def call(self, tool: MCPToolDeclaration, arguments: Mapping[str, Any],
                   idempotency_key: str, timeout: float) -> Envelope:
        """Run one call of `tool` and map its result to an envelope.

        `arguments` are checked against `tool.parameters` first (the declaration the run
        was started with); `idempotency_key` goes to the server in the request's
        `_meta` under IDEMPOTENCY_META_KEY; `timeout` (seconds) bounds connecting and
        the call. Raises TransientToolError for transport and protocol failures.
        """
        invalid = check_arguments(tool, arguments)
        if invalid is not None:
            return invalid
        server = self._servers.get(tool.server)
        if server is None:
            raise LookupError(f"no MCP server {tool.server!r} is configured on this worker")
        session: _Session | None = None
        what = {"tool": tool.name}
        try:
            async with asyncio.timeout(timeout):
                session = await server.session()
                client = session.client
                if client is None:  # closed between the two lines: same as a dropped session
                    raise MCPServerError(f"MCP server {tool.server!r}: session closed")
                # An open TypedDict (arbitrary keys); mypy wants literal keys.
                meta = cast(RequestParamsMeta, {IDEMPOTENCY_META_KEY: idempotency_key})
                result = await client.call_tool(tool.remote_name, dict(arguments), meta=meta)
        except MCPError as exc:
            if exc.code in REFUSAL_CODES:
                log.info("MCP request refused", extra={**what, "error": f"MCP {exc.code}"})
                return refused(exc.message)
            if exc.code != REQUEST_TIMEOUT and session is not None:
                await server.discard(session)
            log.warning("MCP call failed", extra={**what, "error": f"MCP {exc.code}"})
            raise TransientToolError(f"{tool.name}: MCP error {exc.code}") from None
        except TimeoutError:
            # The session stays: a slow tool is no reason to restart a healthy server.
            log.warning("MCP call timed out", extra={**what, "error": "TimeoutError"})
            raise TransientToolError(f"{tool.name}: timed out") from None
        except Exception as exc:
            if session is not None:
                await server.discard(session)
            log.warning("MCP call failed", extra={**what, "error": type(exc).__name__})
            raise TransientToolError(f"{tool.name}: {type(exc).__name__}") from None
        return envelope_from_result(result.model_dump(mode="json", by_alias=True),
                                    terminal=tool.terminal)

    async def close(self) -> None:
        """End every session (stdio processes exit); the pool may be started again."""
        await asyncio.gather(*(s.close() for s in self._servers.values()))


def _check_unique(by_server: Mapping[str, list[MCPToolDeclaration]]) -> None:
    owner: dict[str, str] = {}
    for server, declarations in by_server.items():
        for d in declarations:
            if d.name in owner and owner[d.name] != server:
                raise MCPDeclarationError(
                    f"MCP tool name {d.name!r} is declared by servers {owner[d.name]!r} and "
                    f"{server!r}; give them different prefixes")
            owner[d.name] = server


async def list_mcp_tools(servers: Sequence[MCPServerConfig]) -> list[MCPToolDeclaration]:
    """The tools `servers` declare now: connect, list, close (what `boundloop run` does
    with BOUNDLOOP_MCP_CONFIG to put the declarations in a run's input). Raises
    MCPServerError or MCPDeclarationError naming the server."""
    async with MCPPool(servers) as pool:
        return pool.declarations()
