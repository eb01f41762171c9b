"""Client side of shared budgets: set a key's budget, show it.

The ledger of a key is the workflow `boundloop-budget-KEY`; `set_budget` starts it (or
changes its limits when it runs) in one call (update-with-start). The limits travel in
the update, which the ledger validates: where its workers have approver keys, only a
change signed by a budget admin (`signer=`) is taken.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from temporalio.client import Client, WithStartWorkflowOperation, WorkflowUpdateFailedError
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from boundloop import errors
from boundloop.agent import DEFAULT_TASK_QUEUE
from boundloop.contracts import (
    BUDGET_WORKFLOW,
    BudgetView,
    LedgerInput,
    SignedLimits,
    SignedReset,
    budget_workflow_id,
)
from boundloop.core.budget import Amount, BudgetLimits, BudgetReset, LedgerState
from boundloop.core.limits import BUDGET_KEY_PATTERN

if TYPE_CHECKING:  # `cryptography` loads only where a change is signed
    from boundloop.signing import Signer


def check_key(key: str) -> str:
    if not re.fullmatch(BUDGET_KEY_PATTERN, key):
        raise ValueError(f"invalid budget key {key!r}: 1-100 characters of letters, digits "
                         "and . _ : @ -, starting with a letter or digit")
    return key


async def set_budget(client: Client, key: str, limits: BudgetLimits, *,
                     task_queue: str = DEFAULT_TASK_QUEUE, reap_seconds: float = 60.0,
                     signer: Signer | None = None) -> BudgetView:
    """Start the ledger of `key` on the workers of `task_queue` and set its limits, or
    replace the limits of the running one (what was spent and reserved stays). Waits for
    a worker to answer; `reap_seconds`: how often the ledger checks that the runs holding
    reservations are still open; `signer`: a budget admin's key, needed where the
    workers have approver keys. Raises BudgetRefused (nothing changed) when the ledger
    refuses the change."""
    from boundloop.workflows.budget import BudgetLedgerWorkflow

    check_key(key)
    # The start input's limits only reach workers of before the ledger ignored them.
    start: WithStartWorkflowOperation[Any, None] = WithStartWorkflowOperation(
        BUDGET_WORKFLOW, LedgerInput(state=LedgerState(key=key, limits=limits),
                                     reap_seconds=reap_seconds),
        id=budget_workflow_id(key), task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        static_summary=f"budget {key}")
    try:
        if signer is None:
            return await client.execute_update_with_start_workflow(
                BudgetLedgerWorkflow.set_limits, limits, start_workflow_operation=start)
        nonce, signature = signer.sign_budget(namespace=client.namespace, key=key,
                                              limits=limits.model_dump(mode="json"))
        return await client.execute_update_with_start_workflow(
            BudgetLedgerWorkflow.set_signed_limits,
            SignedLimits(limits=limits, admin=signer.name, nonce=nonce, signature=signature),
            start_workflow_operation=start)
    except WorkflowUpdateFailedError as exc:
        cause = exc.cause
        if isinstance(cause, ApplicationError) and cause.type in (
                errors.BUDGET_UNSIGNED, errors.INVALID_BUDGET_MESSAGE):
            raise errors.BudgetRefused(cause.message) from None
        raise


async def reset_budget(client: Client, key: str, reset: BudgetReset, *,
                       signer: Signer | None = None) -> BudgetView:
    """An operator's recovery of the ledger of `key` after an incident: spent back to
    zero (`reset.spent`) and the reservations of the runs in `reset.drop` dropped; the
    limits stay. `signer`: a budget admin's key, needed where the workers have approver
    keys. Raises BudgetRefused (nothing changed) when the ledger refuses it, and
    RPCError NOT_FOUND when no ledger runs for `key`."""
    from boundloop.workflows.budget import BudgetLedgerWorkflow

    check_key(key)
    req = SignedReset(reset=reset)
    if signer is not None:
        nonce, signature = signer.sign_budget_reset(
            namespace=client.namespace, key=key, reset=reset.model_dump(mode="json"))
        req = SignedReset(reset=reset, admin=signer.name, nonce=nonce, signature=signature)
    try:
        return await client.get_workflow_handle(budget_workflow_id(key)).execute_update(
            BudgetLedgerWorkflow.reset, req)
    except WorkflowUpdateFailedError as exc:
        cause = exc.cause
        if isinstance(cause, ApplicationError) and cause.type == errors.BUDGET_UNSIGNED:
            raise errors.BudgetRefused(cause.message) from None
        raise


async def show_budget(client: Client, key: str) -> BudgetView | None:
    """The ledger's figures, or None when no ledger runs for `key`."""
    from boundloop.workflows.budget import BudgetLedgerWorkflow

    check_key(key)
    try:
        view = await client.get_workflow_handle(budget_workflow_id(key)).query(
            BudgetLedgerWorkflow.show)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    return view


def view_lines(view: BudgetView) -> list[str]:
    """`boundloop budget show` and `set`: the figures, one per line."""
    lim = view.limits
    if lim is None:
        return [f"budget {view.key}: no limits set (every reservation is refused until a "
                "`budget set`)"]

    def amount(a: Amount) -> str:
        parts = []
        if lim.usd is not None:
            parts.append(f"${a.usd:.6f}")
        if lim.tokens is not None:
            parts.append(f"{a.tokens} tokens")
        return " · ".join(parts)

    limit = " · ".join(([f"${lim.usd:g}"] if lim.usd is not None else [])
                       + ([f"{lim.tokens} tokens"] if lim.tokens is not None else []))
    period = "in total" if lim.period == "total" else f"per UTC day ({view.period})"
    lines = [f"budget {view.key}: {limit} {period}",
             f"  spent     {amount(view.spent)}",
             f"  reserved  {amount(view.reserved)}",
             f"  left      {amount(view.left)}",
             f"  refused   {view.refused} reservation(s)",
             f"  runs holding reservations: {len(view.holders) or 'none'}"]
    lines += [f"    {h.run}  step {h.step}  {amount(h.amount)}" for h in view.holders]
    return lines
