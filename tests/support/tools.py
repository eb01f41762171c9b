"""Test-only tools, served beside the demo tools by the tests' workers."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.common import RetryPolicy

from boundloop import ToolContext, ToolFailure, Toolset, ToolStatus, TransientToolError
from boundloop.tools.demo import DemoDeps
from boundloop.tools.demo import tools as demo_tools

SECRET_DETAIL = "private DB detail: password=hunter2"
SLEEPY_SECONDS = 2.0
FAST = {"timeout": timedelta(seconds=5)}


def retry(attempts: int = 3) -> RetryPolicy:
    return RetryPolicy(initial_interval=timedelta(seconds=0.05), maximum_attempts=attempts)


tools = Toolset[DemoDeps]()
tools.include(demo_tools)


def executions(data_dir: Path, key: str | None = None) -> int:
    """How often `counted` ran (for one idempotency key, or in all), from its store."""
    path = data_dir / "counted.sqlite3"
    if not path.exists():
        return 0
    with sqlite3.connect(path) as db:
        where, params = ("WHERE key = ?", (key,)) if key is not None else ("", ())
        (count,) = db.execute(f"SELECT COUNT(*) FROM runs {where}", params).fetchone()
    return int(count)


@tools.tool(side_effects=True, retry=retry(), **FAST)
def counted(ctx: ToolContext[DemoDeps], size: int, tag: str) -> Any:
    """Counts its executions; returns bytes. Records each execution in a SQLite store
    (a side effect), then returns `size` ASCII characters of data."""
    data_dir = ctx.deps.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(data_dir / "counted.sqlite3") as db:
        db.execute("CREATE TABLE IF NOT EXISTS runs (key TEXT NOT NULL)")
        db.execute("INSERT INTO runs (key) VALUES (?)", (ctx.idempotency_key,))
    return {"text": "a" * size}


class Opaque:
    """A value JSON cannot carry."""


@tools.tool(side_effects=True, retry=retry(), **FAST)
def opaque(ctx: ToolContext[DemoDeps], size: int, tag: str) -> Any:
    """Records its execution like `counted`, then returns something JSON cannot carry."""
    counted(ctx, size, tag)
    return Opaque()


@tools.tool(retry=retry(2), **FAST)
def explode(x: str) -> Any:
    """Always raises."""
    raise RuntimeError(SECRET_DETAIL)


@tools.tool(retry=retry(), **FAST)
def huge(chars: int) -> Any:
    """Returns a large text."""
    return {"text": "あ" * chars}


@tools.tool(name="huge_remote", local_activity=False, retry=retry(), **FAST)
def huge_remote(chars: int) -> Any:
    """Returns a large text (a regular activity: opted out of running locally)."""
    return {"text": "あ" * chars}


@tools.tool(retry=retry(2), **FAST)
def flaky(x: str) -> Any:
    """Always fails transiently."""
    raise TransientToolError("upstream 503")


@tools.tool(retry=retry(), **FAST)
def declared(x: str) -> Any:
    """Fails with a declared error."""
    raise ToolFailure(ToolStatus.NOT_FOUND, "NO_SUCH_ORDER", f"order {x} does not exist")


@tools.tool(terminal=True, retry=retry(), **FAST)
def finish(x: str) -> Any:
    """Terminal success."""
    return {"done": x}


@tools.tool(max_calls=2, cost_units=2, retry=retry(), **FAST)
def echo(ctx: ToolContext[DemoDeps], x: str) -> Any:
    """Echoes x."""
    return {"echo": x}


@tools.tool(timeout=timedelta(seconds=0.5), retry=retry(2))
def sleepy(x: str) -> Any:
    """Never answers in time."""
    time.sleep(SLEEPY_SECONDS)  # well past its 0.5 s timeout, on every attempt
    return {"late": x}


# --- tools that run long: cancels and hung threads (tests/test_lifecycle.py) ----------

#: How long `anap` sleeps (None: until it is cancelled), and `hang` whatever happens.
NAP_SECONDS: float | None = None
HANG_SECONDS = 30.0


def mark(ctx: ToolContext[DemoDeps], what: str) -> None:
    """Record `what` for this call in a SQLite store in the data directory."""
    data_dir = ctx.deps.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(data_dir / "marks.db", timeout=10) as db:
        db.execute("CREATE TABLE IF NOT EXISTS marks (key TEXT, what TEXT)")
        db.execute("INSERT INTO marks VALUES (?, ?)", (ctx.idempotency_key, what))


def marks(data_dir: Path) -> list[tuple[str, str]]:
    """(idempotency key, what) in the order the tools recorded them."""
    if not (data_dir / "marks.db").exists():
        return []
    with sqlite3.connect(data_dir / "marks.db", timeout=10) as db:
        # The file exists a moment before a tool's first `mark` has made the table.
        db.execute("CREATE TABLE IF NOT EXISTS marks (key TEXT, what TEXT)")
        return [(k, w) for k, w in db.execute("SELECT key, what FROM marks ORDER BY rowid")]


#: The timeout of `nap` and `anap`: they run until cancelled, and a test's cancel may come
#: late on a loaded machine (a CLI process or two starting first); the bound only keeps a
#: failed test from holding a worker thread for ever.
NAP_TIMEOUT = timedelta(seconds=300)


@tools.tool(timeout=NAP_TIMEOUT, retry=retry(1))
def nap(ctx: ToolContext[DemoDeps], x: str) -> Any:
    """Runs until cancelled (sync), then records that it saw the cancel."""
    mark(ctx, "started")
    while not ctx.is_cancelled():  # the run's cancel, or the attempt's timeout
        time.sleep(0.05)
    mark(ctx, "cancelled")
    return {"stopped_early": True}


@tools.tool(timeout=NAP_TIMEOUT, retry=retry(1))
async def anap(ctx: ToolContext[DemoDeps], x: str) -> Any:
    """Sleeps NAP_SECONDS, or until cancelled (async); records that it was cancelled."""
    mark(ctx, "started")
    try:
        if NAP_SECONDS is None:
            await asyncio.Event().wait()
        else:
            await asyncio.sleep(NAP_SECONDS)
    except asyncio.CancelledError:
        mark(ctx, "cancelled")
        raise
    mark(ctx, "finished")
    return {"slept": x}


@tools.tool(timeout=timedelta(seconds=1), retry=retry(3))
def hang(ctx: ToolContext[DemoDeps], x: str) -> Any:
    """Hangs past its timeout, deaf to cancels: holds its thread for HANG_SECONDS."""
    mark(ctx, "started")
    time.sleep(HANG_SECONDS)
    return {"hung": x}


# --- tools the argument rules decide (tests/test_rules.py) ------------------------------


@tools.tool(side_effects=True, retry=retry(1), **FAST)
def transfer(ctx: ToolContext[DemoDeps], amount: float, to: str) -> Any:
    """Moves money to an account (recorded in the marks store)."""
    mark(ctx, f"transfer {amount} to {to}")
    return {"transferred": amount, "to": to}


@tools.tool(side_effects=True, retry=retry(1), **FAST)
def delete_record(ctx: ToolContext[DemoDeps], record: str) -> Any:
    """Deletes a record (recorded in the marks store)."""
    mark(ctx, f"delete {record}")
    return {"deleted": record}
