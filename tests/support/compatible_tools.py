"""Next releases that change `create_ticket`'s arguments compatibly: a call the run was
admitted (and approved) with still validates against the new schema, so it runs as
decided (tests/test_deploys.py). `tools` adds an optional `notify` with a default;
`widened` lets `priority` be "urgent" too. Both create the ticket in the demo's SQLite
store through the demo's own `create_ticket` (same idempotency key, same row)."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any, Literal

from pydantic import Field

from boundloop import ToolContext, Toolset
from boundloop.tools import demo
from boundloop.tools.demo import DemoDeps

tools = Toolset[DemoDeps]()
tools.include(demo.tools, exclude=["create_ticket"])


@tools.tool(side_effects=True, needs_approval=True, terminal=True, cost_units=1,
            timeout=timedelta(seconds=10))
def create_ticket(
    ctx: ToolContext[DemoDeps],
    title: Annotated[str, Field(min_length=1, max_length=120)],
    description: Annotated[str, Field(min_length=1, max_length=2000)],
    priority: Literal["low", "normal", "high"],
    notify: bool = False,
) -> dict[str, Any]:
    """Create a support ticket; `notify` pages the on-call too. A human must approve it
    first. Call it once; after success, answer the user."""
    created = demo.create_ticket(ctx, title, description, priority)
    return {**created, "notified": notify}


widened = Toolset[DemoDeps]()
widened.include(demo.tools, exclude=["create_ticket"])


@widened.tool(name="create_ticket", side_effects=True, needs_approval=True, terminal=True,
              cost_units=1, timeout=timedelta(seconds=10))
def create_ticket_widened(
    ctx: ToolContext[DemoDeps],
    title: Annotated[str, Field(min_length=1, max_length=120)],
    description: Annotated[str, Field(min_length=1, max_length=2000)],
    priority: Literal["low", "normal", "high", "urgent"],
) -> dict[str, Any]:
    """Create a support ticket. A human must approve it first. Call it once; after
    success, answer the user."""
    return demo.create_ticket(ctx, title, description, priority)  # type: ignore[arg-type]
