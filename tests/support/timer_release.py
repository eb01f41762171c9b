"""The code of a next release that Temporal's replayer lets through but that strands
parked runs: a 1 s timer before each approval wait, without `workflow.patched`. The
replayer matches timers by order, not duration, so on this code a run parked on
approval waits for its history's approval-timeout timer before it goes on, even after
the approval (what `boundloop replay-check` must catch by comparing durations).

Registered under the real workflow name: `swap_plugin()` puts it in place of the
BoundLoop workflow in a worker or a Replayer.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.plugin import SimplePlugin

with workflow.unsafe.imports_passed_through():
    from boundloop.contracts import WORKFLOW_NAME, RunInput, RunResult

from boundloop.workflows.loop import BoundLoopWorkflow


@workflow.defn(name=WORKFLOW_NAME)
class TimerBeforeApproval(BoundLoopWorkflow):
    @workflow.init
    def __init__(self, inp: RunInput) -> None:
        super().__init__(inp)

    @workflow.run
    async def run(self, inp: RunInput) -> RunResult:
        return await super().run(inp)

    async def _await_decision(self, approval: Any, timeout: timedelta) -> bool:
        await workflow.sleep(timedelta(seconds=1))
        return await super()._await_decision(approval, timeout)


def swap_plugin() -> SimplePlugin:
    """Put this release's workflow in place of the BoundLoop workflow."""
    return SimplePlugin("timer-release", workflows=lambda existing: [
        TimerBeforeApproval if w is BoundLoopWorkflow else w for w in existing or []])
