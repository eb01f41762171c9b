"""A toolset whose tools take deps other than the demo's (for `boundloop worker`'s check)."""

from __future__ import annotations

from dataclasses import dataclass

from boundloop import ToolContext, Toolset


@dataclass
class Clinic:
    opening_hours: str


tools = Toolset[Clinic]()


@tools.tool()
def hours(ctx: ToolContext[Clinic]) -> str:
    """When the clinic is open."""
    return ctx.deps.opening_hours
