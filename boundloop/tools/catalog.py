"""Which toolset serves which task queue, in this process.

A worker registers its toolset for its task queue (the boundloop plugin does it when the
worker is built, and removes it when the worker stops); the workflow, which runs in
Temporal's sandbox, reads the tool rules (argument models, approval, cost, limits) of
its own task queue from here. This module is imported through the sandbox unchanged, so
worker and workflow see one table. A Replayer registers its toolset for every queue.
"""

from __future__ import annotations

import importlib
from typing import Any

from boundloop.errors import NoToolset
from boundloop.tools.registry import Toolset

#: task queue (None: any, for a Replayer) -> (toolset, how many workers registered it)
_by_queue: dict[str | None, tuple[Toolset[Any], int]] = {}


def register(task_queue: str | None, toolset: Toolset[Any]) -> None:
    """Serve `toolset` on `task_queue`. Another toolset on the same queue in the same
    process is refused: the workflow could not tell which rules apply."""
    current = _by_queue.get(task_queue)
    if current is not None and current[0] is not toolset:
        raise ValueError(f"task queue {task_queue!r} already has another toolset in this "
                         "process; give each toolset its own task queue")
    _by_queue[task_queue] = (toolset, current[1] + 1 if current else 1)


def unregister(task_queue: str | None, toolset: Toolset[Any]) -> None:
    current = _by_queue.get(task_queue)
    if current is None or current[0] is not toolset:
        return
    if current[1] > 1:
        _by_queue[task_queue] = (toolset, current[1] - 1)
    else:
        del _by_queue[task_queue]


def toolset_for(task_queue: str) -> Toolset[Any]:
    found = _by_queue.get(task_queue) or _by_queue.get(None)
    if found is None:
        raise NoToolset(f"no boundloop toolset is registered for task queue {task_queue!r} "
                        "in this worker process (build the worker with boundloop.Worker or "
                        "boundloop.Plugin)")
    return found[0]


def load(target: str | None) -> Toolset[Any]:
    """The toolset named by `package.module:attribute` (a Toolset, or a function returning
    one), or the demo tools when `target` is empty (the CLI's BOUNDLOOP_TOOLS)."""
    if not target:
        from boundloop.tools.demo import tools

        return tools
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{target!r} is not of the form package.module:attribute")
    found = getattr(importlib.import_module(module), attr)
    toolset = found() if callable(found) and not isinstance(found, Toolset) else found
    if not isinstance(toolset, Toolset):
        raise TypeError(f"{target} is not a Toolset (nor a function returning one)")
    return toolset
