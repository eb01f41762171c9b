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
    from boundloop.agent import DEFAULT_TASK_QUEUE, Agent, start, start_session
    from boundloop.budgets import set_budget, show_budget
    from boundloop.client import Run, Session, get_run, get_session
    from boundloop.connection import connect
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
    from boundloop.core.tree import AgentTool
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


_where: dict[str, tuple[str, str]] = {}


def __getattr__(name: str) -> Any:
    # Each public name loads on first use (PEP 562), so a process that imports one
    # boundloop module (the CLI, a worker, a test) pays for what it uses, not for the
    # Temporal client, the worker, MCP and cryptography all at once. Where each comes
    # from is read from the imports above (for type checkers): written once.
    if name not in __all__:
        raise AttributeError(f"module 'boundloop' has no attribute {name!r}")
    if not _where:
        import ast

        with open(__file__, encoding="utf-8") as source:
            module = ast.parse(source.read())
        [block] = [node for node in module.body if isinstance(node, ast.If)
                   and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"]
        _where.update({alias.asname or alias.name: (statement.module, alias.name)
                       for statement in block.body if isinstance(statement, ast.ImportFrom)
                       and statement.module for alias in statement.names})
    where, original = _where[name]
    value = getattr(import_module(where), original)
    globals()[name] = value  # found by plain lookup from now on
    return value


__all__ = [
    "DEFAULT_TASK_QUEUE",
    "Agent",
    "AgentTool",
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
