"""The demo tools over real storage: SQLite in the demo's data directory (`DemoDeps`).

- lookup_stock(sku): read-only; SKU pattern ^[A-Z]-[0-9]{3}$.
- search_docs(query, limit): read-only search over the bundled documents.
- create_ticket(title, description, priority): a side effect that needs approval; the
  tickets table has a unique idempotency key, so a retried execution returns the first
  ticket with `already_existed: true` and changes nothing.
"""

from __future__ import annotations

import sqlite3
import threading
from contextlib import closing
from dataclasses import dataclass, field
from datetime import timedelta
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from boundloop.core.envelope import ToolStatus
from boundloop.errors import ToolFailure
from boundloop.tools.registry import ToolContext, Toolset


@dataclass(frozen=True)
class DemoDeps:
    """What the demo tools need: the directory of their SQLite store.

    `store()` is the calling thread's open connection to it, kept for these deps'
    lifetime: opening one per call (with its schema check) cost more than the query
    (docs/benchmarks.md, "Performance levers")."""

    data_dir: Path
    _local: threading.local = field(default_factory=threading.local, init=False,
                                    repr=False, compare=False)

    def store(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = connect(self.data_dir)
            self._local.conn = conn
        return conn


tools = Toolset[DemoDeps]()
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


@tools.tool(timeout=timedelta(seconds=10))
def lookup_stock(
    ctx: ToolContext[DemoDeps],
    sku: Annotated[str, Field(pattern=r"^[A-Z]-[0-9]{3}$", description="SKU such as A-001")],
) -> dict[str, Any]:
    """Look up the stock quantity of one SKU in the demo catalog. Returns found false
    for an unknown SKU."""
    row = ctx.deps.store().execute("SELECT quantity FROM stock WHERE sku = ?",
                                   (sku,)).fetchone()
    if row is None:
        return {"sku": sku, "found": False}
    return {"sku": sku, "found": True, "quantity": row[0]}


def _documents() -> list[tuple[str, str]]:
    folder = resources.files("boundloop.tools") / "docs"
    return sorted((p.name, p.read_text(encoding="utf-8")) for p in folder.iterdir()
                  if p.name.endswith(".md"))


@tools.tool(timeout=timedelta(seconds=10))
def search_docs(
    query: Annotated[str, Field(min_length=1, max_length=200, description="Words to find")],
    limit: Annotated[int, Field(ge=1, le=5, description="Most documents to return (1-5)")],
) -> dict[str, Any]:
    """Search the internal help documents. Search once; if nothing is found, say so
    instead of searching again."""
    words = [w.lower() for w in query.split() if w.strip()]
    hits: list[dict[str, Any]] = []
    for name, text in _documents():
        lower = text.lower()
        score = sum(lower.count(w) for w in words)
        if score:
            title = text.splitlines()[0].lstrip("# ").strip()
            # Bound what is fetched: a snippet, not the whole document.
            hits.append({"doc": name, "title": title, "score": score,
                         "snippet": " ".join(text.split())[:300]})
    hits.sort(key=lambda h: (-h["score"], h["doc"]))
    if not hits:
        raise ToolFailure(ToolStatus.NOT_FOUND, "NO_MATCH",
                          "No document matches. Do not search again with the same words; "
                          "tell the user it was not found.")
    return {"query": query, "results": hits[:limit]}


@tools.tool(side_effects=True, needs_approval=True, terminal=True, cost_units=1,
            timeout=timedelta(seconds=10))
def create_ticket(
    ctx: ToolContext[DemoDeps],
    title: Annotated[str, Field(min_length=1, max_length=120)],
    description: Annotated[str, Field(min_length=1, max_length=2000)],
    priority: Literal["low", "normal", "high"],
) -> dict[str, Any]:
    """Create a support ticket. A human must approve it first. Call it once; after
    success, answer the user."""
    with closing(connect(ctx.deps.data_dir)) as conn:
        cur = conn.execute(
            "INSERT INTO tickets (idempotency_key, title, description, priority) "
            "VALUES (?, ?, ?, ?) ON CONFLICT(idempotency_key) DO NOTHING",
            (ctx.idempotency_key, title, description, priority))
        created = cur.rowcount == 1
        row = conn.execute("SELECT id, priority, created_at, title, description FROM tickets "
                           "WHERE idempotency_key = ?", (ctx.idempotency_key,)).fetchone()
    if (row[3], row[4], row[1]) != (title, description, priority):
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
