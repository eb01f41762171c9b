"""Next releases' toolsets, each changing `create_ticket` in a way an open run parked on
it cannot decide by: `tools` renames it `open_ticket`, `removed` drops it, `reshaped`
gives it another argument schema (a required `severity` in place of `priority`);
everything else unchanged. `lookup_renamed` and `lookup_removed` do the same to the
tests' toolset's read-only `lookup_stock`."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from boundloop import ToolContext, Toolset
from boundloop.tools.demo import DemoDeps
from boundloop.tools.demo import tools as demo_tools
from tests.support.tools import tools as test_tools

tools = Toolset[DemoDeps]()
tools.include(demo_tools, exclude=["create_ticket"])
tools.add(dataclasses.replace(demo_tools.get("create_ticket"), name="open_ticket"))

removed = Toolset[DemoDeps]()
removed.include(demo_tools, exclude=["create_ticket"])

reshaped = Toolset[DemoDeps]()
reshaped.include(demo_tools, exclude=["create_ticket"])


@reshaped.tool(side_effects=True, needs_approval=True, terminal=True, cost_units=1)
def create_ticket(ctx: ToolContext[DemoDeps], title: str, description: str,
                  severity: Literal[1, 2, 3]) -> dict[str, Any]:
    """Create a support ticket of a severity."""
    raise AssertionError("never called by a run admitted with the old schema")


# --- the tests' toolset (tests/support/tools.py) with lookup_stock changed -------------
# lookup_stock is read-only and short: a run calls it as a local activity.

lookup_renamed = Toolset[DemoDeps]()
lookup_renamed.include(test_tools, exclude=["lookup_stock"])
lookup_renamed.add(dataclasses.replace(test_tools.get("lookup_stock"), name="check_stock"))

lookup_removed = Toolset[DemoDeps]()
lookup_removed.include(test_tools, exclude=["lookup_stock"])
