"""A workflow of a user's own application (its module imports only what a workflow may)."""

from __future__ import annotations

from temporalio import workflow


@workflow.defn(name="UsersOwnWorkflow")
class UsersOwnWorkflow:
    """Runs on the same worker as boundloop, next to it."""

    @workflow.run
    async def run(self, name: str) -> str:
        return f"hello {name}"
