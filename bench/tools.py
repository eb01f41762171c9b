"""Bench-only tools beside the demo tools (`BOUNDLOOP_TOOLS=bench.tools:tools`).

`fetch_report(part)` returns a deterministic result of about 4 KB (its envelope is
~4,000 UTF-8 bytes), the size the history benchmark uses for every tool result.
"""

from __future__ import annotations

import dataclasses
from contextlib import closing
from datetime import timedelta
from typing import Annotated, Any

from pydantic import Field

from bench.peers.report import REPORT_BYTES as REPORT_BYTES
from bench.peers.report import report as report
from boundloop.tools.demo import DemoDeps, connect
from boundloop.tools.demo import tools as demo_tools
from boundloop.tools.registry import ToolContext, Toolset

#: A limit of `max_result_bytes` that the report's envelope stays under.
REPORT_RESULT_CAP = 5000


tools = Toolset[DemoDeps]()
tools.include(demo_tools)


@tools.tool(timeout=timedelta(seconds=10))
def fetch_report(
    part: Annotated[int, Field(ge=0, le=100_000, description="Report part number")],
) -> dict[str, Any]:
    """Fetch one part of the inventory report (about 4 KB)."""
    return report(part)


#: `lookup_stock` opted out of running as a local activity: the local-tools lever
#: compares the two.
tools.add(dataclasses.replace(demo_tools.get("lookup_stock"), name="lookup_stock_regular",
                              local_activity=False))


@tools.tool(timeout=timedelta(seconds=10))
def lookup_stock_per_call(
    ctx: ToolContext[DemoDeps],
    sku: Annotated[str, Field(pattern=r"^[A-Z]-[0-9]{3}$", description="SKU such as A-001")],
) -> dict[str, Any]:
    """`lookup_stock` as it was: a new store connection (and schema check) each call. The
    pooled-connection lever compares the two."""
    with closing(connect(ctx.deps.data_dir)) as conn:
        row = conn.execute("SELECT quantity FROM stock WHERE sku = ?", (sku,)).fetchone()
    if row is None:
        return {"sku": sku, "found": False}
    return {"sku": sku, "found": True, "quantity": row[0]}
