"""The code of a next release that breaks open runs: one extra activity before each
approval wait, without `workflow.patched` (what `boundloop replay-check` must catch).

Registered under the real workflow name, so a worker or a Replayer built with
`swap_plugin()` runs it in place of the BoundLoop workflow. `python -m
tests.support.next_release worker|cli ARGS...` runs `boundloop worker` or the
`boundloop` CLI with this code checked out, as an operator about to deploy it would.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.plugin import SimplePlugin

with workflow.unsafe.imports_passed_through():
    from boundloop.contracts import (
        BUDGET_CLOSED_RUNS_ACTIVITY,
        WORKFLOW_NAME,
        RunInput,
        RunResult,
    )

from boundloop.workflows.loop import BoundLoopWorkflow


@workflow.defn(name=WORKFLOW_NAME)
class ExtraActivityBeforeApproval(BoundLoopWorkflow):
    @workflow.init
    def __init__(self, inp: RunInput) -> None:
        super().__init__(inp)

    @workflow.run
    async def run(self, inp: RunInput) -> RunResult:
        return await super().run(inp)

    async def _await_decision(self, approval: Any, timeout: timedelta) -> bool:
        await workflow.execute_activity(BUDGET_CLOSED_RUNS_ACTIVITY, [],
                                        result_type=list[str],
                                        start_to_close_timeout=timedelta(seconds=30))
        return await super()._await_decision(approval, timeout)


def swap_plugin() -> SimplePlugin:
    """Put this release's workflow in place of the BoundLoop workflow."""
    return SimplePlugin("next-release", workflows=lambda existing: [
        ExtraActivityBeforeApproval if w is BoundLoopWorkflow else w
        for w in existing or []])


def _check_out() -> None:
    """Every Plugin built from now on in this process registers this release's workflow."""
    import boundloop.worker.plugin as plugin

    plugin.BoundLoopWorkflow = ExtraActivityBeforeApproval  # type: ignore[misc]


if __name__ == "__main__":
    command = sys.argv.pop(1)
    _check_out()
    if command == "worker":
        worker_main_module = __import__("boundloop.worker.main", fromlist=["main"])
        worker_main_module.main()
    else:
        from boundloop.cli import main

        main()
