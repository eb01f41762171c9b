"""Search attributes shown and filterable in the Temporal Web UI."""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

STATUS = SearchAttributeKey.for_keyword("BoundloopStatus")
STOP_REASON = SearchAttributeKey.for_keyword("BoundloopStopReason")
STEPS = SearchAttributeKey.for_int("BoundloopSteps")
TOOL_EXECUTIONS = SearchAttributeKey.for_int("BoundloopToolExecutions")
PENDING_APPROVALS = SearchAttributeKey.for_int("BoundloopPendingApprovals")

ALL = (STATUS, STOP_REASON, STEPS, TOOL_EXECUTIONS, PENDING_APPROVALS)
#: The tenant a run's starter tags it with (`boundloop run --tenant`, `tenant=`): never
#: written by the workflow; an operator's `[budget] key_from` may derive the budget key
#: from it.
TENANT = SearchAttributeKey.for_keyword("BoundloopTenant")
#: Every attribute a server registers for boundloop.
REGISTERED = (*ALL, TENANT)


def cli_flags() -> list[str]:
    """`--search-attribute Name=Type` flags for `temporal server start-dev`."""
    kinds = {STATUS: "Keyword", STOP_REASON: "Keyword", STEPS: "Int",
             TOOL_EXECUTIONS: "Int", PENDING_APPROVALS: "Int", TENANT: "Keyword"}
    return [arg for key in REGISTERED
            for arg in ("--search-attribute", f"{key.name}={kinds[key]}")]
