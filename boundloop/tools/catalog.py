"""What each task queue serves in this process: its toolset, approver keys and budget
admins.

A worker registers them for its task queue (the boundloop plugin does it when the worker
is built, and removes them when the worker stops); the workflow reads the tool rules
(argument models, approval, cost, limits) and the approver keys of its own task queue
from here, so worker and workflow see one table (the signing keys too: this is the only
per-queue registry). A Replayer registers for every queue (None).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from boundloop.errors import NoToolset
from boundloop.tools.registry import Toolset


@dataclass(frozen=True)
class Served:
    """What the workers of one task queue serve: every worker of the queue must serve
    the same (a run's next step may go to any of them)."""

    toolset: Toolset[Any]
    #: approver name -> Ed25519 public key (`ed25519:BASE64`); empty: none configured.
    approver_keys: Mapping[str, str] = field(default_factory=dict)
    #: Budget admin name -> public key: only their signed changes set a budget's limits.
    #: None: no approver keys configured, namespace access sets them.
    budget_admins: Mapping[str, str] | None = None

    def same_as(self, other: Served) -> bool:
        return (self.toolset is other.toolset
                and dict(self.approver_keys) == dict(other.approver_keys)
                and self.budget_admins == other.budget_admins)


#: task queue (None: any, for a Replayer) -> (what it serves, how many workers registered it)
_by_queue: dict[str | None, tuple[Served, int]] = {}


def register(task_queue: str | None, served: Served) -> None:
    """Serve `served` on `task_queue`. A different toolset or other approver keys on the
    same queue in the same process are refused: the workflow could not tell which apply."""
    current = _by_queue.get(task_queue)
    if current is not None and not current[0].same_as(served):
        raise ValueError(f"task queue {task_queue!r} already serves another toolset or "
                         "other approver keys in this process; give each its own task queue")
    _by_queue[task_queue] = (current[0] if current else served,
                             current[1] + 1 if current else 1)


def register_replayer(served: Served) -> None:
    """Serve `served` to the Replayer made last in this process (any task queue no worker
    here serves): a replayer replays one set of histories, so the newest one's toolset
    applies (replaying two agents' histories in turn, each with its own toolset, works)."""
    _by_queue[None] = (served, 1)


def unregister(task_queue: str | None, served: Served) -> None:
    current = _by_queue.get(task_queue)
    if current is None or not current[0].same_as(served):
        return
    if current[1] > 1:
        _by_queue[task_queue] = (current[0], current[1] - 1)
    else:
        del _by_queue[task_queue]


def served_on(task_queue: str) -> Served:
    """What this process's workers serve on `task_queue` (or a Replayer on any)."""
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
