"""boundloop: a durable, bounded LLM tool-calling loop on Temporal.

Define tools, serve them from a worker, start runs and decide their approvals:

    import boundloop

    tools = boundloop.Toolset[MyDeps]()

    @tools.tool(side_effects=True, needs_approval=True)
    def create_ticket(ctx: boundloop.ToolContext[MyDeps], title: str) -> dict: ...

    agent = boundloop.Agent(tools, model="gpt-5-mini", instructions="...")

    client = await boundloop.connect("127.0.0.1:7233")
    async with boundloop.Worker(client, agent, deps=MyDeps(...), model=AsyncOpenAI()):
        run = await agent.start(client, "question")
        async for event in run.events():
            if event.event == "approval_requested":
                await run.approve(event.call_id, approver="alice")
        result = await run.result()

See README.md ("Build your own agent") and examples/weather_desk/.
"""

from typing import TYPE_CHECKING, Any

from boundloop.agent import DEFAULT_TASK_QUEUE, Agent
from boundloop.budgets import set_budget, show_budget
from boundloop.client import (
    Run,
    Session,
    connect,
    get_run,
    get_session,
    start,
    start_session,
)
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
    PolicyRefused,
    RunEnded,
    RunIdTaken,
    RunNotFound,
    RunStuck,
    SessionRefused,
    ToolDefinitionError,
    ToolFailure,
    TransientToolError,
    UnknownTools,
)
from boundloop.logs import configure as configure_logging
from boundloop.process import run_client
from boundloop.tools.registry import ToolContext, Toolset, ToolSpec

if TYPE_CHECKING:
    from boundloop.mcp.config import load_mcp_config
    from boundloop.mcp.pool import list_mcp_tools
    from boundloop.signing import Signer
    from boundloop.worker.plugin import Plugin, Worker


def __getattr__(name: str) -> Any:
    # The worker imports the workflow and activities, which import boundloop's modules:
    # loaded on first use, so importing any boundloop module never needs the worker.
    if name in ("Plugin", "Worker"):
        from boundloop.worker import plugin as worker_plugin

        return getattr(worker_plugin, name)
    if name == "Signer":  # loads `cryptography`'s native module: only when asked for
        from boundloop.signing import Signer

        return Signer
    if name in ("list_mcp_tools", "load_mcp_config"):
        # The MCP SDK (and its HTTP stack) loads only where MCP servers are used.
        from boundloop import mcp

        return getattr(mcp, name)
    raise AttributeError(f"module 'boundloop' has no attribute {name!r}")

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
