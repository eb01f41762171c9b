"""Agent trees as `status` prints them: a run's place in its tree and its sub-agents
(docs/agent-trees.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from boundloop.terminal import console, safe

# The Temporal client and the run types load inside the commands (see cli/common.py).
if TYPE_CHECKING:
    from temporalio.client import Client

    from boundloop.contracts import ChildRun, RunStatus


def child_line(child: ChildRun) -> str:
    """One sub-agent's run as its caller's `status` lists it: the agent, its state, its
    spend against its allowance, and the workflow id its own `status` takes."""
    cost = ("" if child.cost_usd is None else f" · ${child.cost_usd:.6f}"
            + (f" / ${child.usd_allowance:.4f}" if child.usd_allowance is not None else ""))
    return (f"sub-agent {safe(child.tool)} (call {safe(child.call_id)}): {safe(child.state)} "
            f"· tokens {child.total_tokens} / {child.token_allowance}{cost} · "
            f"{safe(child.workflow_id)}")


def print_tree(status: RunStatus, children: list[ChildRun]) -> None:
    """Where the run is in its agent tree (a sub-agent's run), then its sub-agents."""
    if status.tree is not None:
        console.print(f"tree: {safe(status.tree.line())} (started by "
                      f"{safe(status.tree.parent)})", highlight=False, soft_wrap=True)
    for child in children:
        console.print(child_line(child), highlight=False, soft_wrap=True)


async def print_closed_tree(client: Client, desc: Any) -> None:
    """A closed run's place and sub-agents as the server lists them (no worker needed;
    their spend is in the subagent_ended events above)."""
    from temporalio.service import RPCError

    from boundloop import _ops as ops

    if desc.parent_id:  # a sub-agent's run, or a session's turn
        root = (f" (root {safe(desc.root_id)})" if desc.root_id and desc.root_id
                != desc.parent_id else "")
        console.print(f"started by {safe(desc.parent_id)}{root}", highlight=False,
                      soft_wrap=True)
    try:
        rows = await ops.child_runs(client, desc.id)
    except RPCError:  # a list the server refuses takes nothing from what status shows
        rows = []
    for row in rows:
        state = row["status"] + (f" · {row['reason']}" if row["reason"]
                                 and row["status"] != "completed" else "")
        console.print(f"sub-agent run: {safe(state)} · {safe(row['workflow_id'])}",
                      highlight=False, soft_wrap=True)
