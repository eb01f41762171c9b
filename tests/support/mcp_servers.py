"""The tests' own MCP server, built with the `mcp` SDK's server API.

    python -m tests.support.mcp_servers stdio
    python -m tests.support.mcp_servers http PORT      # streamable HTTP on 127.0.0.1:PORT/mcp

`MCP_TEST_DB` (an environment variable, so the stdio config's `env` is exercised) names
a SQLite file where the server writes down every `tools/call` request it receives
(before argument validation: the `requests` table, with the `X-Test-Token` header
over HTTP) and every side effect of
`delete_record` with its idempotency key (the `effects` table). Tools:

- `lookup(sku)`: read-only, structured result.
- `delete_record(record)`: destructive; honours the idempotency key from the
  request's `_meta` (a repeated key returns the first result and deletes nothing).
- `archive_record(record, seconds)`: like `delete_record` (same tables, same key rule),
  but answers `seconds` after its side effect is committed (for worker-crash tests).
- `fail(reason)`: returns `isError: true` with the reason.
- `sleep(seconds)`: writes its process id into `sleeps`, then sleeps (for kill tests).
- `chart()`: a text block and an image block.
- `environment(name)`: whether the server process has that environment variable.
- `add_note(note, tags?)`: no annotations at all (an optional property: not strict).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image
from mcp.types import ImageContent, TextContent, ToolAnnotations
from pydantic import BaseModel

IDEMPOTENCY_META_KEY = "boundloop/idempotency_key"
SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (id INTEGER PRIMARY KEY, tool TEXT, key TEXT, pid INTEGER,
                                     client TEXT, token TEXT);
CREATE TABLE IF NOT EXISTS effects (key TEXT PRIMARY KEY, record TEXT, result TEXT);
CREATE TABLE IF NOT EXISTS deleted (id INTEGER PRIMARY KEY, record TEXT);
CREATE TABLE IF NOT EXISTS sleeps (id INTEGER PRIMARY KEY, pid INTEGER);
"""
#: A PNG header is enough: the client never decodes it.
PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 16


def connect(db: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(db, timeout=10, isolation_level=None)
    conn.executescript(SCHEMA)
    return conn


def rows(db: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Read the server's records (tests call this)."""
    with connect(db) as conn:
        return list(conn.execute(sql, params))


class Stock(BaseModel):
    sku: str
    stock: int


def build(db: Path) -> MCPServer:
    async def record_requests(ctx: ServerRequestContext[Any, Any],
                              call_next: CallNext) -> HandlerResult:
        if ctx.method == "tools/call" and ctx.params is not None:
            meta = ctx.params.get("_meta") or {}
            with connect(db) as conn:
                client = meta.get("io.modelcontextprotocol/clientInfo") or {}
                http = ctx.request  # the HTTP request, over streamable HTTP only
                token = http.headers.get("x-test-token") if http is not None else None
                conn.execute(
                    "INSERT INTO requests (tool, key, pid, client, token) VALUES (?, ?, ?, ?, ?)",
                    (ctx.params.get("name"), meta.get(IDEMPOTENCY_META_KEY), os.getpid(),
                     client.get("name"), token))
        return await call_next(ctx)

    server = MCPServer("boundloop-test", log_level="WARNING", middleware=[record_requests])

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def lookup(sku: str) -> Stock:
        """Stock of one SKU."""
        return Stock(sku=sku, stock=len(sku))

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
    def delete_record(record: str, ctx: Context) -> str:
        """Delete one record."""
        key = (ctx.request_context.meta or {}).get(IDEMPOTENCY_META_KEY)
        if not isinstance(key, str):
            raise ToolError("an idempotency key is required")
        with connect(db) as conn:
            conn.execute("BEGIN IMMEDIATE")
            first = conn.execute("SELECT result FROM effects WHERE key = ?", (key,)).fetchone()
            if first is not None:
                conn.execute("COMMIT")
                return str(first[0]) + " (already done)"
            conn.execute("INSERT INTO deleted (record) VALUES (?)", (record,))
            [(count,)] = conn.execute("SELECT count(*) FROM deleted")
            result = f"deleted {record} as #{count}"
            conn.execute("INSERT INTO effects (key, record, result) VALUES (?, ?, ?)",
                         (key, record, result))
            conn.execute("COMMIT")
        return result

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
    async def archive_record(record: str, seconds: float, ctx: Context) -> str:
        """Archive one record."""
        result = delete_record(record, ctx)
        await asyncio.sleep(seconds)
        return result

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def fail(reason: str) -> str:
        """Always fails with the reason."""
        raise ToolError(f"cannot do that: {reason}")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def sleep(seconds: float) -> str:
        """Sleep, then answer."""
        with connect(db) as conn:
            conn.execute("INSERT INTO sleeps (pid) VALUES (?)", (os.getpid(),))
        await asyncio.sleep(seconds)
        return f"slept {seconds}"

    @server.tool(annotations=ToolAnnotations(read_only_hint=True), structured_output=False)
    def chart() -> list[TextContent | ImageContent]:
        """A caption and a picture."""
        return [TextContent(text="caption: stock by day"),
                Image(data=PNG, format="png").to_image_content()]

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def environment(name: str) -> bool:
        """Whether the server process has the environment variable."""
        return name in os.environ

    @server.tool()
    def add_note(note: str, tags: list[str] | None = None) -> str:
        """Add a note."""
        return f"noted {note} {tags or []}"

    return server


def main(argv: list[str]) -> None:
    server = build(Path(os.environ["MCP_TEST_DB"]))
    if argv[:1] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(argv[1]))
    else:
        server.run("stdio")


if __name__ == "__main__":
    main(sys.argv[1:])
