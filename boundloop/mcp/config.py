"""Loading a worker's MCP server list from a JSON or TOML file.

JSON: `{"servers": [{"name": "time", "command": "mcp-server-time"}]}`
TOML: `[[servers]]` tables with the same keys. The model is
`boundloop.core.mcp_tools.MCPServerConfig`; docs/mcp.md lists every key.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from boundloop.core.mcp_tools import MCPConfig, MCPServerConfig


class MCPConfigError(ValueError):
    """The MCP configuration file is missing, unreadable or invalid (the message says where)."""


def load_mcp_config(path: str | os.PathLike[str]) -> list[MCPServerConfig]:
    """The servers configured in the file at `path` (`.json` or `.toml`), validated.

    Error messages name the file and the field, never a value: `env` may hold secrets.
    """
    file = Path(path)
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise MCPConfigError(f"{file}: cannot read the MCP configuration "
                             f"({exc.strerror or type(exc).__name__})") from None
    data: Any
    if file.suffix == ".json":
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            where = f"line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else "?"
            raise MCPConfigError(f"{file}: not valid JSON ({where})") from None
    elif file.suffix == ".toml":
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise MCPConfigError(f"{file}: not valid TOML ({exc})") from None
    else:
        raise MCPConfigError(f"{file}: the MCP configuration must be a .json or .toml file")
    try:
        return MCPConfig.model_validate(data).servers
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}"
            for e in exc.errors(include_url=False, include_input=False, include_context=False))
        raise MCPConfigError(f"{file}: invalid MCP configuration: {problems}") from None
