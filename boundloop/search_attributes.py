"""Search attributes shown and filterable in the Temporal Web UI."""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

STATUS = SearchAttributeKey.for_keyword("BoundloopStatus")
STOP_REASON = SearchAttributeKey.for_keyword("BoundloopStopReason")
STEPS = SearchAttributeKey.for_int("BoundloopSteps")
TOOL_EXECUTIONS = SearchAttributeKey.for_int("BoundloopToolExecutions")
PENDING_APPROVALS = SearchAttributeKey.for_int("BoundloopPendingApprovals")

ALL = (STATUS, STOP_REASON, STEPS, TOOL_EXECUTIONS, PENDING_APPROVALS)


def cli_flags() -> list[str]:
    """`--search-attribute Name=Type` flags for `temporal server start-dev`."""
    kinds = {STATUS: "Keyword", STOP_REASON: "Keyword", STEPS: "Int",
             TOOL_EXECUTIONS: "Int", PENDING_APPROVALS: "Int"}
    return [arg for key in ALL for arg in ("--search-attribute", f"{key.name}={kinds[key]}")]
