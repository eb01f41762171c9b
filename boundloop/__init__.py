"""boundloop: a durable, bounded LLM tool-calling loop on Temporal.

Define tools, serve them from a worker, start runs and decide their approvals:

    import boundloop

    tools = boundloop.Toolset[MyDeps]()

    @tools.tool(side_effects=True, needs_approval=True)
    def create_ticket(ctx: boundloop.ToolContext[MyDeps], title: str) -> dict: ...

    agent = boundloop.Agent(tools, model="gpt-5-mini", instructions="...")

    client = await boundloop.connect()  # TEMPORAL_ADDRESS, else 127.0.0.1:7233
    async with boundloop.Worker(client, agent, deps=MyDeps(...), model=AsyncOpenAI()):
        run = await agent.start(client, "question")
        async for event in run.events():
            if event.event == "approval_requested":
                await run.approve(event.call_id, approver="alice")
        result = await run.result()

See README.md ("Build your own agent") and examples/weather_desk/.
"""

import os
from importlib import import_module
from typing import TYPE_CHECKING, Any

# A source checkout keeps workflows/, activities/ and worker/ at its top level; an
# installed boundloop has them inside (pyproject.toml maps them so). A checkout finds its
# own beside this package, whichever one is installed: `PYTHONPATH=<checkout>` runs that
# checkout's workflows, not the installed one's.
_checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if (not os.path.isdir(os.path.join(os.path.dirname(__file__), "workflows"))
        and os.path.isfile(os.path.join(_checkout, "workflows", "__init__.py"))):
    __path__.append(_checkout)

if TYPE_CHECKING:
    from boundloop.agent import DEFAULT_TASK_QUEUE, Agent
    from boundloop.budgets import set_budget, show_budget
    from boundloop.client import Run, Session, connect, get_run, get_session, start, start_session
    from boundloop.contracts import (
        BudgetView,
        Reset,
        RunResult,
        RunStatus,
        SessionStatus,
        StreamEvent,
        StreamItem,
        StreamResult,
        TextDelta,
    )
    from boundloop.core.budget import BudgetLimits
    from boundloop.core.envelope import ToolStatus
    from boundloop.core.limits import Limits, Policy, Price
    from boundloop.core.loop import Approval, Event
    from boundloop.core.mcp_tools import MCPServerConfig, MCPToolDeclaration
    from boundloop.core.operator import OperatorPolicy, Refusal
    from boundloop.core.reasons import StopReason
    from boundloop.core.session import SessionLimits
    from boundloop.errors import (
        BoundloopError,
        BudgetRefused,
        DecisionRefused,
        InvalidDecision,
        NoToolset,
        NoWorker,
        PolicyRefused,
        RunEnded,
        RunIdTaken,
        RunNotFound,
        RunStuck,
        SessionRefused,
        TemporalUnreachable,
        ToolDefinitionError,
        ToolFailure,
        TransientToolError,
        UnknownTools,
    )
    from boundloop.logs import configure as configure_logging
    from boundloop.mcp.config import load_mcp_config
    from boundloop.mcp.pool import list_mcp_tools
    from boundloop.process import run_client
    from boundloop.signing import Signer
    from boundloop.tools.registry import ToolContext, Toolset, ToolSpec
    from boundloop.worker.plugin import Plugin, Worker


def __getattr__(name: str) -> Any:
    # Each public name loads on first use (PEP 562), so a process that imports one
    # boundloop module (the CLI, a worker, a test) pays for what it uses, not for the
    # Temporal client, the worker, MCP and cryptography all at once.
    where = {
        "Agent": "boundloop.agent",
        "Approval": "boundloop.core.loop",
        "BoundloopError": "boundloop.errors",
        "BudgetLimits": "boundloop.core.budget",
        "BudgetRefused": "boundloop.errors",
        "BudgetView": "boundloop.contracts",
        "configure_logging": "boundloop.logs",
        "connect": "boundloop.client",
        "DecisionRefused": "boundloop.errors",
        "DEFAULT_TASK_QUEUE": "boundloop.agent",
        "Event": "boundloop.core.loop",
        "get_run": "boundloop.client",
        "get_session": "boundloop.client",
        "InvalidDecision": "boundloop.errors",
        "Limits": "boundloop.core.limits",
        "list_mcp_tools": "boundloop.mcp.pool",
        "load_mcp_config": "boundloop.mcp.config",
        "MCPServerConfig": "boundloop.core.mcp_tools",
        "MCPToolDeclaration": "boundloop.core.mcp_tools",
        "NoToolset": "boundloop.errors",
        "NoWorker": "boundloop.errors",
        "OperatorPolicy": "boundloop.core.operator",
        "Plugin": "boundloop.worker.plugin",
        "Policy": "boundloop.core.limits",
        "PolicyRefused": "boundloop.errors",
        "Price": "boundloop.core.limits",
        "Refusal": "boundloop.core.operator",
        "Reset": "boundloop.contracts",
        "Run": "boundloop.client",
        "run_client": "boundloop.process",
        "RunEnded": "boundloop.errors",
        "RunIdTaken": "boundloop.errors",
        "RunNotFound": "boundloop.errors",
        "RunResult": "boundloop.contracts",
        "RunStatus": "boundloop.contracts",
        "RunStuck": "boundloop.errors",
        "Session": "boundloop.client",
        "SessionLimits": "boundloop.core.session",
        "SessionRefused": "boundloop.errors",
        "SessionStatus": "boundloop.contracts",
        "set_budget": "boundloop.budgets",
        "show_budget": "boundloop.budgets",
        "Signer": "boundloop.signing",
        "start": "boundloop.client",
        "start_session": "boundloop.client",
        "StopReason": "boundloop.core.reasons",
        "StreamEvent": "boundloop.contracts",
        "StreamItem": "boundloop.contracts",
        "StreamResult": "boundloop.contracts",
        "TemporalUnreachable": "boundloop.errors",
        "TextDelta": "boundloop.contracts",
        "ToolContext": "boundloop.tools.registry",
        "ToolDefinitionError": "boundloop.errors",
        "ToolFailure": "boundloop.errors",
        "Toolset": "boundloop.tools.registry",
        "ToolSpec": "boundloop.tools.registry",
        "ToolStatus": "boundloop.core.envelope",
        "TransientToolError": "boundloop.errors",
        "UnknownTools": "boundloop.errors",
        "Worker": "boundloop.worker.plugin",
    }.get(name)
    if where is None:
        raise AttributeError(f"module 'boundloop' has no attribute {name!r}")
    value = getattr(import_module(where), "configure" if name == "configure_logging" else name)
    globals()[name] = value  # found by plain lookup from now on
    return value


__all__ = [
    "DEFAULT_TASK_QUEUE",
    "Agent",
    "Approval",
    "BoundloopError",
    "BudgetLimits",
    "BudgetRefused",
    "BudgetView",
    "DecisionRefused",
    "Event",
    "InvalidDecision",
    "Limits",
    "MCPServerConfig",
    "MCPToolDeclaration",
    "NoToolset",
    "NoWorker",
    "OperatorPolicy",
    "Plugin",
    "Policy",
    "PolicyRefused",
    "Price",
    "Refusal",
    "Reset",
    "Run",
    "RunEnded",
    "RunIdTaken",
    "RunNotFound",
    "RunResult",
    "RunStatus",
    "RunStuck",
    "Session",
    "SessionLimits",
    "SessionRefused",
    "SessionStatus",
    "Signer",
    "StopReason",
    "StreamEvent",
    "StreamItem",
    "StreamResult",
    "TemporalUnreachable",
    "TextDelta",
    "ToolContext",
    "ToolDefinitionError",
    "ToolFailure",
    "ToolSpec",
    "ToolStatus",
    "Toolset",
    "TransientToolError",
    "UnknownTools",
    "Worker",
    "configure_logging",
    "connect",
    "get_run",
    "get_session",
    "list_mcp_tools",
    "load_mcp_config",
    "run_client",
    "set_budget",
    "show_budget",
    "start",
    "start_session",
]
