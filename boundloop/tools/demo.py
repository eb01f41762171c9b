"""The demo tools over real storage: SQLite in the data directory.

- lookup_stock(sku): read-only; SKU pattern ^[A-Z]-[0-9]{3}$ (seed 000).
- search_docs(query, limit): read-only search over the bundled documents.
- create_ticket(title, description, priority): a side effect that needs approval; the
  tickets table has a unique idempotency key, so a retried execution returns the first
  ticket with `already_existed: true` and changes nothing (SPEC §7).
"""

from __future__ import annotations

import os
import sqlite3
from contextlib import closing
from datetime import timedelta
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from boundloop.core.envelope import ToolStatus
from boundloop.tools.registry import ToolContext, ToolFailure, ToolRegistry, ToolSpec

#: Test-only hook (issue 3): kill the worker right after the ticket row is committed.
CRASH_AFTER_WRITE_ENV = "BOUNDLOOP_TEST_CRASH_AFTER_TICKET_WRITE"

STOCK = {"A-001": 12, "B-002": 0, "C-003": 48}


def connect(data_dir: Path) -> sqlite3.Connection:
    """Open (and create) the demo store. WAL lets the CLI read while a worker writes."""
    data_dir.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(data_dir / "demo.sqlite3", timeout=10, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(
        """
        CREATE TABLE IF NOT EXISTS stock (sku TEXT PRIMARY KEY, quantity INTEGER NOT NULL);
        CREATE TABLE IF NOT EXISTS tickets (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            idempotency_key TEXT NOT NULL UNIQUE,
            title TEXT NOT NULL,
            description TEXT NOT NULL,
            priority TEXT NOT NULL,
            created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%SZ', 'now'))
        );
        """
    )
    conn.executemany("INSERT OR IGNORE INTO stock (sku, quantity) VALUES (?, ?)",
                     list(STOCK.items()))
    return conn


class LookupStockArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sku: Annotated[str, Field(pattern=r"^[A-Z]-[0-9]{3}$", description="SKU such as A-001")]


def lookup_stock(args: LookupStockArgs, ctx: ToolContext) -> dict[str, Any]:
    with closing(connect(ctx.data_dir)) as conn:
        row = conn.execute("SELECT quantity FROM stock WHERE sku = ?", (args.sku,)).fetchone()
    if row is None:
        return {"sku": args.sku, "found": False}
    return {"sku": args.sku, "found": True, "quantity": row[0]}


class SearchDocsArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: Annotated[str, Field(min_length=1, max_length=200, description="Words to find")]
    limit: Annotated[int, Field(ge=1, le=5, description="Most documents to return (1-5)")]


def _documents() -> list[tuple[str, str]]:
    folder = resources.files("boundloop.tools") / "docs"
    return sorted((p.name, p.read_text(encoding="utf-8")) for p in folder.iterdir()
                  if p.name.endswith(".md"))


def search_docs(args: SearchDocsArgs, ctx: ToolContext) -> dict[str, Any]:
    words = [w.lower() for w in args.query.split() if w.strip()]
    hits: list[dict[str, Any]] = []
    for name, text in _documents():
        lower = text.lower()
        score = sum(lower.count(w) for w in words)
        if score:
            title = text.splitlines()[0].lstrip("# ").strip()
            # Bound what is fetched (SPEC §5): a snippet, not the whole document.
            hits.append({"doc": name, "title": title, "score": score,
                         "snippet": " ".join(text.split())[:300]})
    hits.sort(key=lambda h: (-h["score"], h["doc"]))
    if not hits:
        raise ToolFailure(ToolStatus.NOT_FOUND, "NO_MATCH",
                          "No document matches. Do not search again with the same words; "
                          "tell the user it was not found.")
    return {"query": args.query, "results": hits[: args.limit]}


class CreateTicketArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    title: Annotated[str, Field(min_length=1, max_length=120)]
    description: Annotated[str, Field(min_length=1, max_length=2000)]
    priority: Literal["low", "normal", "high"]


def create_ticket(args: CreateTicketArgs, ctx: ToolContext) -> dict[str, Any]:
    with closing(connect(ctx.data_dir)) as conn:
        cur = conn.execute(
            "INSERT INTO tickets (idempotency_key, title, description, priority) "
            "VALUES (?, ?, ?, ?) ON CONFLICT(idempotency_key) DO NOTHING",
            (ctx.idempotency_key, args.title, args.description, args.priority))
        created = cur.rowcount == 1
        if created and os.environ.get(CRASH_AFTER_WRITE_ENV) == "1":
            os._exit(137)  # test hook: the row is committed, the activity never completes
        row = conn.execute("SELECT id, priority, created_at, title, description FROM tickets "
                           "WHERE idempotency_key = ?", (ctx.idempotency_key,)).fetchone()
    if (row[3], row[4], row[1]) != (args.title, args.description, args.priority):
        # Same position in the run, other content (e.g. after a workflow reset the model
        # proposed another ticket): say so instead of silently returning the first one.
        raise ToolFailure(ToolStatus.PERMANENT_ERROR, "IDEMPOTENCY_CONFLICT",
                          f"A different ticket (#{row[0]}) was already created for this call "
                          "position; nothing was changed. Tell the user.")
    return {"ticket_id": row[0], "priority": row[1], "created_at": row[2],
            "already_existed": not created}


def list_tickets(data_dir: Path) -> list[dict[str, Any]]:
    """All tickets, oldest first (for the demo and tests)."""
    with closing(connect(data_dir)) as conn:
        rows = conn.execute("SELECT id, idempotency_key, title, priority FROM tickets "
                            "ORDER BY id").fetchall()
    return [{"id": r[0], "idempotency_key": r[1], "title": r[2], "priority": r[3]}
            for r in rows]


def demo_registry() -> ToolRegistry:
    registry = ToolRegistry()
    registry.register(ToolSpec(
        name="lookup_stock", args_model=LookupStockArgs, fn=lookup_stock,
        description="Look up the stock quantity of one SKU in the demo catalog. "
                    "Returns found false for an unknown SKU.",
        timeout=timedelta(seconds=10)))
    registry.register(ToolSpec(
        name="search_docs", args_model=SearchDocsArgs, fn=search_docs,
        description="Search the internal help documents. Search once; if nothing is "
                    "found, say so instead of searching again.",
        timeout=timedelta(seconds=10)))
    registry.register(ToolSpec(
        name="create_ticket", args_model=CreateTicketArgs, fn=create_ticket,
        description="Create a support ticket. A human must approve it first. "
                    "Call it once; after success, answer the user.",
        side_effects=True, needs_approval=True, terminal=True, cost_units=1,
        timeout=timedelta(seconds=10)))
    return registry
