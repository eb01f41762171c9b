"""Test-only tools, registered beside the demo tools (BOUNDLOOP_TOOLS in conftest)."""

from __future__ import annotations

import sqlite3
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from boundloop.core.envelope import ToolStatus
from boundloop.tools.demo import demo_registry
from boundloop.tools.registry import (
    ToolContext,
    ToolFailure,
    ToolRegistry,
    ToolSpec,
    TransientToolError,
)

SECRET_DETAIL = "private DB detail: password=hunter2"
SLEEPY_SECONDS = 2.0


class XArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    x: str


class SizeArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    chars: int


class BytesArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    size: int
    tag: str


def executions(data_dir: Path, key: str | None = None) -> int:
    """How often `counted` ran (for one idempotency key, or in all), from its store."""
    path = data_dir / "counted.sqlite3"
    if not path.exists():
        return 0
    with sqlite3.connect(path) as db:
        where, params = ("WHERE key = ?", (key,)) if key is not None else ("", ())
        (count,) = db.execute(f"SELECT COUNT(*) FROM runs {where}", params).fetchone()
    return int(count)


def counted(args: BytesArgs, ctx: ToolContext) -> Any:
    """Records each execution in a SQLite store (a side effect), then returns `size`
    ASCII characters of data."""
    ctx.data_dir.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(ctx.data_dir / "counted.sqlite3") as db:
        db.execute("CREATE TABLE IF NOT EXISTS runs (key TEXT NOT NULL)")
        db.execute("INSERT INTO runs (key) VALUES (?)", (ctx.idempotency_key,))
    return {"text": "a" * args.size}


def explode(args: XArgs, ctx: ToolContext) -> Any:
    raise RuntimeError(SECRET_DETAIL)


def huge(args: SizeArgs, ctx: ToolContext) -> Any:
    return {"text": "あ" * args.chars}


def flaky(args: XArgs, ctx: ToolContext) -> Any:
    raise TransientToolError("upstream 503")


def declared(args: XArgs, ctx: ToolContext) -> Any:
    raise ToolFailure(ToolStatus.NOT_FOUND, "NO_SUCH_ORDER", f"order {args.x} does not exist")


def finish(args: XArgs, ctx: ToolContext) -> Any:
    return {"done": args.x}


def echo(args: XArgs, ctx: ToolContext) -> Any:
    return {"echo": args.x}


def sleepy(args: XArgs, ctx: ToolContext) -> Any:
    time.sleep(SLEEPY_SECONDS)  # well past its 0.5 s timeout, on every attempt
    return {"late": args.x}


def test_registry() -> ToolRegistry:
    reg = demo_registry()
    fast = {"timeout": timedelta(seconds=5), "initial_retry_seconds": 0.05}
    reg.register(ToolSpec(name="explode", description="Always raises.", args_model=XArgs,
                          fn=explode, max_attempts=2, **fast))  # type: ignore[arg-type]
    reg.register(ToolSpec(name="huge", description="Returns a large text.",
                          args_model=SizeArgs, fn=huge, **fast))  # type: ignore[arg-type]
    reg.register(ToolSpec(name="flaky", description="Always fails transiently.",
                          args_model=XArgs, fn=flaky, max_attempts=2,
                          **fast))  # type: ignore[arg-type]
    reg.register(ToolSpec(name="declared", description="Fails with a declared error.",
                          args_model=XArgs, fn=declared, **fast))  # type: ignore[arg-type]
    reg.register(ToolSpec(name="finish", description="Terminal success.", args_model=XArgs,
                          fn=finish, terminal=True, **fast))  # type: ignore[arg-type]
    reg.register(ToolSpec(name="echo", description="Echoes x.", args_model=XArgs, fn=echo,
                          max_calls=2, cost_units=2, **fast))  # type: ignore[arg-type]
    reg.register(ToolSpec(name="sleepy", description="Never answers in time.",
                          args_model=XArgs, fn=sleepy, max_attempts=2,
                          timeout=timedelta(seconds=0.5), initial_retry_seconds=0.05))
    reg.register(ToolSpec(name="counted", description="Counts its executions; returns bytes.",
                          args_model=BytesArgs, fn=counted, side_effects=True,
                          **fast))  # type: ignore[arg-type]
    return reg
