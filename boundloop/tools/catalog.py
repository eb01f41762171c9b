"""The registry the workflow and the worker use (one deployed set of tools).

`BOUNDLOOP_TOOLS=package.module:function` names a function returning a ToolRegistry;
by default the demo tools. Workflow and worker must load the same registry.
"""

from __future__ import annotations

import importlib
import os
from functools import cache

from boundloop.tools.demo import demo_registry
from boundloop.tools.registry import ToolRegistry


@cache
def registry() -> ToolRegistry:
    target = os.environ.get("BOUNDLOOP_TOOLS")
    if not target:
        return demo_registry()
    module, _, attr = target.partition(":")
    factory = getattr(importlib.import_module(module), attr)
    reg = factory()
    if not isinstance(reg, ToolRegistry):
        raise TypeError(f"BOUNDLOOP_TOOLS={target} did not return a ToolRegistry")
    return reg
