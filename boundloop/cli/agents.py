"""An agent from command-line flags (`run`, `session start`): the shared limit-flag group,
the toolset and MCP tools.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError

from boundloop.cli.common import T, _run, fail, json_object, load_registry, validation_lines
from boundloop.exit_codes import ExitCode

if TYPE_CHECKING:
    from boundloop.agent import Agent
    from boundloop.settings import Settings

#: The limit flags `run` and `session start` share (`--limits` JSON takes the rest):
#: flag name -> (type, help). Each overrides the same field of --limits.
LIMIT_FLAGS: dict[str, tuple[type, str]] = {
    "max_steps": (int, "Model requests per run (per turn in a session)"),
    "max_tool_executions": (int, "Tool executions per run"),
    "token_threshold": (int, "Known total tokens after which a run stops"),
    "max_result_bytes": (int, "Largest tool result"),
    "max_history_bytes": (int, "Largest conversation the model is sent"),
    "max_identical_calls": (int, "The same call (tool and arguments) at most this often"),
    "deadline_seconds": (float, "Processing time per run"),
    "approval_timeout_seconds": (float, "How long an approval waits"),
    "max_output_tokens": (int, "Most output tokens per model response"),
    "max_input_tokens": (int, "Context window a request must fit: its estimated input "
                              "plus max_output_tokens (at most the operator's for the model)"),
}


def limit_flags(command: Callable[..., T]) -> Callable[..., T]:
    """Add the LIMIT_FLAGS options to `command`, which receives them as one dict,
    `limit_flags` (the flags given; the others left out)."""
    own = [p for p in inspect.signature(command, eval_str=True).parameters.values()
           if p.name != "limit_flags"]
    added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None,
                               annotation=Annotated[kind | None, typer.Option(
                                   help=text, rich_help_panel="Limits (each overrides --limits)")])
             for name, (kind, text) in LIMIT_FLAGS.items()]

    @functools.wraps(command)
    def with_flags(**kwargs: Any) -> T:
        given = {name: kwargs.pop(name) for name in LIMIT_FLAGS}
        return command(**kwargs, limit_flags={k: v for k, v in given.items() if v is not None})

    with_flags.__signature__ = inspect.Signature([*own, *added])  # type: ignore[attr-defined]
    return with_flags


def build_agent(settings: Settings, *, model: str | None, api: str | None,
                tools: str | None, instructions: str | None, limits_json: str | None,
                policy_json: str | None, limit_flags: dict[str, Any],
                budget: str | None = None, task_queue: str | None = None) -> Agent[Any]:
    """The agent the flags describe, validated before anything starts."""
    from boundloop.agent import Agent
    from boundloop.core.limits import Limits, Policy

    limits_raw = json_object("--limits", limits_json)
    policy_raw = json_object("--policy", policy_json)
    limits_raw.update(limit_flags)
    if tools is not None and not tools.strip():
        raise fail("--tools is empty; name at least one tool, e.g. --tools lookup_stock")
    if model is not None and not model.strip():
        raise fail("--model is empty")
    if task_queue is not None and not task_queue.strip():
        raise fail("--task-queue is empty")
    mcp_tools = load_mcp_tools(settings)
    allowed = [t.strip() for t in tools.split(",") if t.strip()] if tools else None
    # Named tools need no toolset here: the worker that serves them checks the names when
    # it admits the run (this machine may not have the toolset's module at all).
    mcp_names = {d.name for d in mcp_tools}
    toolset = ([n for n in allowed if n not in mcp_names] if allowed is not None
               else load_registry(hint=" (to start runs without it, name their tools with "
                                  "--tools: the worker serving them checks the names)"))
    try:
        return Agent(toolset,
                     model=model or settings.model, api=api or settings.api,  # type: ignore[arg-type]
                     instructions=instructions, limits=Limits.model_validate(limits_raw),
                     policy=Policy.model_validate(policy_raw), budget=budget,
                     task_queue=task_queue or settings.task_queue, mcp_tools=mcp_tools,
                     allowed=allowed, stream=settings.stream)
    except ValidationError as exc:
        raise fail("invalid run settings:\n" + validation_lines(exc)) from None
    except ValueError as exc:
        raise fail(str(exc)) from None


def load_mcp_tools(settings: Settings) -> list[Any]:
    """The tools of the BOUNDLOOP_MCP_CONFIG servers, listed now (the servers are started
    or connected, listed and closed): a run carries their declarations in its input."""
    if settings.mcp_config is None:
        return []  # before importing the MCP SDK: most runs use none
    from boundloop.mcp import (
        MCPConfigError,
        MCPDeclarationError,
        MCPServerError,
        list_mcp_tools,
        load_mcp_config,
    )

    try:
        servers = load_mcp_config(settings.mcp_config)
    except MCPConfigError as exc:
        raise fail(f"BOUNDLOOP_MCP_CONFIG: {exc}") from None
    try:
        return _run(list_mcp_tools(servers))
    except (MCPServerError, MCPDeclarationError) as exc:
        raise fail(str(exc), ExitCode.FAILED) from None
