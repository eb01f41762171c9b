"""Tools from MCP servers (Model Context Protocol), as boundloop tools.

The worker owns the sessions (`MCPPool`); workflows see only `MCPToolDeclaration`s.
See docs/mcp.md.
"""

from boundloop.core.mcp_tools import (
    IDEMPOTENCY_META_KEY,
    MCPDeclarationError,
    MCPServerConfig,
    MCPToolDeclaration,
    MCPToolOverride,
    check_arguments,
    declare_tools,
)
from boundloop.mcp.config import MCPConfigError, load_mcp_config
from boundloop.mcp.pool import MCPPool, MCPServerError, list_mcp_tools

__all__ = [
    "IDEMPOTENCY_META_KEY",
    "MCPConfigError",
    "MCPDeclarationError",
    "MCPPool",
    "MCPServerConfig",
    "MCPServerError",
    "MCPToolDeclaration",
    "MCPToolOverride",
    "check_arguments",
    "declare_tools",
    "list_mcp_tools",
    "load_mcp_config",
]
