"""Tools of the crash tests' worker processes (BOUNDLOOP_TOOLS=tests.support.crash_tools:tools).

The demo and test tools, with two changes only the crash tests need:
- `create_ticket` kills its worker process right after the ticket row is committed when
  the worker was started with CRASH_AFTER_WRITE_ENV=1 (the activity never completes), and
  with HOLD_AFTER_WRITE_ENV=1 waits there until the test releases it (or SIGKILLs the
  worker, with the row committed);
- `hold` blocks until the test releases it.
"""

from __future__ import annotations

import dataclasses
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from temporalio.common import RetryPolicy

from boundloop import ToolContext, Toolset
from boundloop.tools import demo
from boundloop.tools.demo import DemoDeps
from tests.support.tools import tools as test_tools

CRASH_AFTER_WRITE_ENV = "BOUNDLOOP_TEST_CRASH_AFTER_TICKET_WRITE"
HOLD_AFTER_WRITE_ENV = "BOUNDLOOP_TEST_HOLD_AFTER_TICKET_WRITE"

tools = Toolset[DemoDeps]()
tools.include(test_tools, exclude=["create_ticket"])


def create_ticket_then_crash(ctx: ToolContext[DemoDeps], title: str, description: str,
                             priority: Literal["low", "normal", "high"]) -> dict[str, Any]:
    out = demo.create_ticket(ctx, title, description, priority)
    if not out["already_existed"] and os.environ.get(CRASH_AFTER_WRITE_ENV) == "1":
        os._exit(137)  # the row is committed; the activity never completes
    if not out["already_existed"] and os.environ.get(HOLD_AFTER_WRITE_ENV) == "1":
        _wait_for_release(ctx.deps.data_dir)  # the row is committed; the tool still runs
    return out


def _wait_for_release(data_dir: Path) -> None:
    end = time.monotonic() + 60
    while not (data_dir / "hold-release").exists():
        if time.monotonic() > end:
            raise RuntimeError("hold was never released")
        time.sleep(0.05)


tools.add(dataclasses.replace(test_tools.get("create_ticket"), fn=create_ticket_then_crash))


@tools.tool(timeout=timedelta(seconds=3),
            retry=RetryPolicy(initial_interval=timedelta(seconds=0.1), maximum_attempts=3))
def hold(ctx: ToolContext[DemoDeps], x: str) -> Any:
    """Blocks until released. Read-only; appends its idempotency key to `hold-entered`,
    then waits for `hold-release` to exist. Bounded: gives up (unexpected error) after
    60 s."""
    data_dir = ctx.deps.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    with (data_dir / "hold-entered").open("a", encoding="utf-8") as f:
        f.write(ctx.idempotency_key + "\n")
    _wait_for_release(data_dir)
    return {"held": x}
