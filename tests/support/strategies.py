"""Shared test data for the pure-core tests: JSON value strategies and demo tool rules."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from boundloop.core.loop import ToolRule
from boundloop.tools.demo import tools as demo_tools

CreateTicketArgs = demo_tools.get("create_ticket").args_model
LookupStockArgs = demo_tools.get("lookup_stock").args_model
SearchDocsArgs = demo_tools.get("search_docs").args_model



def json_values(scalars: st.SearchStrategy[Any] | None = None, *, text: int = 20,
                keys: int = 8, width: int = 4, leaves: int = 10) -> st.SearchStrategy[Any]:
    """Finite JSON values (no NaN/inf): scalars nested in lists and string-keyed objects."""
    base = scalars if scalars is not None else (
        st.none() | st.booleans() | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=text))
    return st.recursive(
        base,
        lambda inner: st.lists(inner, max_size=width)
        | st.dictionaries(st.text(max_size=keys), inner, max_size=width),
        max_leaves=leaves)


def demo_rules(ticket_cost_units: int = 1) -> dict[str, ToolRule]:
    """The demo tools as the core sees them; create_ticket needs approval."""
    return {
        "lookup_stock": ToolRule("lookup_stock", LookupStockArgs),
        "search_docs": ToolRule("search_docs", SearchDocsArgs),
        "create_ticket": ToolRule("create_ticket", CreateTicketArgs, side_effects=True,
                                  needs_approval=True, cost_units=ticket_cost_units),
    }
