"""The workflows as a versioned worker registers them (docs/deploying.md), each with its
versioning behaviour. Separate classes because the server refuses a behaviour from an
unversioned worker ("versioning behavior cannot be specified without deployment
options"): an unversioned worker registers the plain classes.

- A run is pinned: it finishes on the version it started on, so a deploy never changes
  the commands an open run replays.
- A budget ledger and a session never end by themselves: they auto-upgrade to the
  current version at their next workflow task (their code changes go behind
  `workflow.patched`; `boundloop replay-check` replays open sessions and ledgers).
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import VersioningBehavior

from boundloop.workflows import SANDBOXED
from boundloop.workflows.budget import BudgetLedgerWorkflow
from boundloop.workflows.loop import BoundLoopWorkflow
from boundloop.workflows.session import BoundloopSessionWorkflow

with workflow.unsafe.imports_passed_through():
    from boundloop.contracts import (
        BUDGET_WORKFLOW,
        SESSION_WORKFLOW,
        WORKFLOW_NAME,
        LedgerInput,
        RunInput,
        RunResult,
        SessionInput,
        SessionStatus,
    )


@workflow.defn(name=WORKFLOW_NAME, versioning_behavior=VersioningBehavior.PINNED,
               sandboxed=SANDBOXED)
class PinnedBoundLoopWorkflow(BoundLoopWorkflow):
    @workflow.init
    def __init__(self, inp: RunInput) -> None:
        super().__init__(inp)

    @workflow.run
    async def run(self, inp: RunInput) -> RunResult:
        return await super().run(inp)


@workflow.defn(name=BUDGET_WORKFLOW, versioning_behavior=VersioningBehavior.AUTO_UPGRADE,
               sandboxed=SANDBOXED)
class UpgradingBudgetLedgerWorkflow(BudgetLedgerWorkflow):
    @workflow.init
    def __init__(self, inp: LedgerInput) -> None:
        super().__init__(inp)

    @workflow.run
    async def run(self, inp: LedgerInput) -> None:
        await super().run(inp)


@workflow.defn(name=SESSION_WORKFLOW, versioning_behavior=VersioningBehavior.AUTO_UPGRADE,
               sandboxed=SANDBOXED)
class UpgradingSessionWorkflow(BoundloopSessionWorkflow):
    @workflow.init
    def __init__(self, inp: SessionInput) -> None:
        super().__init__(inp)

    @workflow.run
    async def run(self, inp: SessionInput) -> SessionStatus:
        return await super().run(inp)


#: What a versioned worker registers in place of each plain workflow class.
VERSIONED: dict[type, type] = {BoundLoopWorkflow: PinnedBoundLoopWorkflow,
                               BudgetLedgerWorkflow: UpgradingBudgetLedgerWorkflow,
                               BoundloopSessionWorkflow: UpgradingSessionWorkflow}
