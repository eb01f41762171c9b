"""The `admit_run` local activity: a run's settings under its worker's operator policy.

It runs once, as the run's first action; its result is recorded in the run's history,
so replay and continue-as-new use it, never the worker's policy or toolset of later.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from temporalio import activity

from boundloop.codec import started_encrypted
from boundloop.contracts import ADMIT_ACTIVITY, AdmitRequest
from boundloop.core.mcp_tools import MCPToolDeclaration, predicate_digest
from boundloop.core.operator import (
    IN_CLEAR,
    Admission,
    OperatorPolicy,
    ToolDeclared,
    mcp_refusals,
    resolve,
)
from boundloop.tools.registry import Toolset

if TYPE_CHECKING:
    from boundloop.mcp.pool import MCPPool


class Admissions:
    """Admits the runs of one worker under its operator policy, its toolset and approver
    keys (the worker's keys join the policy's).

    Without a policy the floor is what the worker's code and configuration declare: a
    tool's own `needs_approval` cannot be switched off and, where the worker has approver
    keys, a run cannot add a key of its own; prices, budgets and limits are the run's
    (the operator set none to loosen).
    """

    def __init__(self, policy: OperatorPolicy | None, toolset: Toolset[Any],
                 approver_keys: Mapping[str, str], mcp: MCPPool | None = None) -> None:
        self.policy = policy if policy is None else policy.model_copy(
            update={"approver_keys": {**approver_keys, **policy.approver_keys}})
        self.approver_keys = dict(approver_keys)
        self.toolset = toolset
        #: The worker's MCP servers: a run's declarations of their tools are checked
        #: against the worker's own (allow-list, overrides).
        self.mcp = mcp

    @activity.defn(name=ADMIT_ACTIVITY)
    async def admit_run(self, req: AdmitRequest) -> Admission:
        if self.policy is not None and self.policy.require_encryption:
            # The run's input as the server holds it; the worker's own payloads (its
            # activities, a session's turns, continue-as-new) it encrypts itself.
            info = activity.info()
            if not await started_encrypted(activity.client(), info.workflow_id or "",
                                           info.workflow_run_id or ""):
                return Admission(refusals=[IN_CLEAR])
        mcp = {d.name for d in req.mcp_tools}
        served = self.toolset.names()
        unknown = [t for t in req.tools if t not in mcp and t not in served]
        if unknown:
            return Admission(unknown=unknown, served=served)
        specs = [self.toolset.get(t) for t in req.tools if t not in mcp]
        tools = [MCPToolDeclaration(
            name=s.name, server="boundloop", remote_name=s.name, description="",
            parameters=s.json_schema(), strict=s.strict,
            needs_approval=s.needs_approval is not False, side_effects=s.side_effects,
            terminal=s.terminal, cost_units=s.cost_units, max_calls=s.max_calls,
            timeout_seconds=s.timeout.total_seconds(),
            max_attempts=s.retry.maximum_attempts or 3, local=s.rule.local,
            approval_predicate=None if isinstance(s.needs_approval, bool)
            else predicate_digest(s.needs_approval)) for s in specs]
        policy = self.policy if self.policy is not None else OperatorPolicy(
            approver_keys=self.approver_keys, prices=dict(req.settings.policy.prices))
        rules = self.toolset.rules([s.name for s in specs])
        # A predicate `needs_approval` may ask: it counts as asking.
        declared = {name: ToolDeclared(side_effects=r.side_effects,
                                       needs_approval=r.needs_approval is not False)
                    for name, r in rules.items()}
        result = resolve(policy, req.settings, tools=req.tools, declared=declared,
                         mcp_tools=req.mcp_tools, search_attributes=req.search_attributes)
        loose = ([] if self.mcp is None else
                 mcp_refusals(req.mcp_tools, servers=self.mcp.servers(),
                              served=self.mcp.declarations()))
        if isinstance(result, list) or loose:
            return Admission(refusals=[*(result if isinstance(result, list) else []),
                                       *loose])
        return Admission(settings=result, tools=tools)
