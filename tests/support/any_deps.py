"""A toolset declared for any deps (`Toolset[typing.Any]`): no isinstance can check them,
so every worker serves it (`boundloop worker` hands it the demo's)."""

from __future__ import annotations

from typing import Any

from boundloop import ToolContext, Toolset

tools = Toolset[Any]()


@tools.tool()
def deps_kind(ctx: ToolContext[Any]) -> str:
    """The type name of the deps this tool was given."""
    return type(ctx.deps).__name__
