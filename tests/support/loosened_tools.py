"""Next releases that loosen `create_ticket`'s approval; everything else is the demo
toolset unchanged. `tools` declares it `needs_approval=False` (a side effect that no
longer asks); `predicate` declares a per-call predicate that asks for no call. A run
admitted while `create_ticket` always asked must still ask (tests/test_deploys.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

from boundloop import Toolset
from boundloop.tools.demo import DemoDeps
from boundloop.tools.demo import tools as demo_tools

tools = Toolset[DemoDeps]()
tools.include(demo_tools, exclude=["create_ticket"])
tools.add(dataclasses.replace(demo_tools.get("create_ticket"), needs_approval=False))


def _never(args: Any) -> bool:
    """A per-call approval predicate that asks for no call."""
    return False


predicate = Toolset[DemoDeps]()
predicate.include(demo_tools, exclude=["create_ticket"])
predicate.add(dataclasses.replace(demo_tools.get("create_ticket"), needs_approval=_never))
