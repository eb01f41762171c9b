"""The run's tools as the workflow sees them: this worker's toolset, the run's MCP tools
and the declarations the run was admitted with (handed on by continue-as-new), and the
rules the core decides each call by.

A deploy may rename, remove or reshape a tool while a run is open: the run keeps the
rules it was admitted with (the call then stops `tool_unavailable`), describes such a
tool to the model by its admitted declaration, and never asks for approval less than it
was admitted with.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, NoReturn

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from boundloop import errors
    from boundloop.contracts import RunInput
    from boundloop.core import context as ctx
    from boundloop.core import loop as core
    from boundloop.core import mcp_tools
    from boundloop.core.mcp_tools import MCPToolDeclaration
    from boundloop.core.operator import Admission
    from boundloop.tools.registry import Toolset


class RunTools:
    """The toolset, MCP tools, admitted declarations, rules and approver keys of a run."""

    def __init__(self, toolset: Toolset[Any], inp: RunInput) -> None:
        # The toolset of this worker's task queue (registered by the boundloop plugin;
        # the catalog is passed through the sandbox, so it is the worker's own table).
        self.toolset = toolset
        # MCP tools come with their declarations in the input (never from a server now).
        self.mcp = {d.name: d for d in inp.mcp_tools if d.name in inp.tools}
        self.unknown = toolset.unknown([t for t in inp.tools if t not in self.mcp])
        self.rules: dict[str, core.ToolRule] = {
            **toolset.rules([t for t in inp.tools
                             if t not in self.unknown and t not in self.mcp]),
            **{name: mcp_tools.tool_rule(d) for name, d in self.mcp.items()}}
        # The rules the run was admitted with, handed on by continue-as-new.
        self.admitted = list(inp.carried.tools) if inp.carried is not None else []
        self.digests: dict[str, str] = {}  # tool -> its admitted schema's digest
        # Function tools this worker does not serve as the run was admitted with them
        # (renamed, removed or reshaped by a deploy): model requests describe them by
        # the admitted declaration, never by this worker's toolset.
        self.described: dict[str, MCPToolDeclaration] = {}
        # Approver public keys: the worker's (like its toolset) and the run policy's.
        self.keys: dict[str, str] = {}
        # The agents the run may call as tools, by name (offer_agents).
        self.agents = {a.name: a for a in inp.agents}
        self.keep_admitted()

    def admit(self, admission: Admission) -> None:
        """The tools as the admission declared them: the run keeps their rules."""
        self.admitted = list(admission.tools)
        self.keep_admitted()
        self.unknown = []

    def offer_recall(self, state: core.LoopState) -> None:
        """A trimming run's model gets the built-in `recall_output` tool (decided like any
        other tool: counted, identical-call rules), described by the run itself."""
        if not ctx.uses_recall(state) or ctx.RECALL_TOOL in self.rules:
            return
        declared = ctx.recall_declaration()
        self.rules[ctx.RECALL_TOOL] = mcp_tools.tool_rule(declared)
        self.described[ctx.RECALL_TOOL] = declared
        if ctx.RECALL_TOOL not in state.allowed_tools:
            state.allowed_tools = [*state.allowed_tools, ctx.RECALL_TOOL]

    def offer_agents(self, state: core.LoopState) -> None:
        """The agents the run may call as tools (boundloop.core.tree), described by the
        run itself and decided like any other tool (counted, identical-call rules, the
        policy's argument rules). A name a served tool has already is refused."""
        for agent in self.agents.values():
            if agent.name in self.rules and agent.name not in self.described:
                raise ApplicationError(
                    f"the operator's policy refuses this run: sub-agent {agent.name!r} has "
                    "the name of one of the run's tools; give it another",
                    type=errors.POLICY_REFUSED, non_retryable=True)
            declared = agent.declaration()
            self.rules[agent.name] = mcp_tools.tool_rule(declared)
            self.described[agent.name] = declared
            if agent.name not in state.allowed_tools:
                state.allowed_tools = [*state.allowed_tools, agent.name]

    def described_tools(self, allowed: list[str]) -> list[MCPToolDeclaration]:
        """The tools the run describes itself: its MCP tools, and any a deploy took from
        this worker's toolset since the run was admitted."""
        return [self.mcp.get(n) or self.described[n] for n in allowed
                if n in self.mcp or n in self.described]

    def refuse_unknown(self, unknown: list[str]) -> NoReturn:
        raise ApplicationError(f"the worker's toolset has no tools {unknown}; it has "
                               f"{self.toolset.names()}", type=errors.UNKNOWN_TOOLS,
                               non_retryable=True)

    def keep_admitted(self) -> None:
        """A tool this worker no longer serves keeps the rules it was admitted with (its
        tool activity then stops the run with `tool_unavailable`)."""
        for declared in self.admitted:
            if declared.name in self.unknown:
                self.rules[declared.name] = mcp_tools.tool_rule(declared)
                self.described[declared.name] = declared
        self.unknown = [t for t in self.unknown if t not in self.rules]

    def ask_as_admitted(self) -> None:
        """A tool the run was admitted with as asking for approval still asks, whatever
        the worker serving it now declares: a deploy never loosens an open run's
        approvals (a worker's stricter rule applies at once: its rules are the base)."""
        for declared in self.admitted:
            rule = self.rules.get(declared.name)
            if rule is None or not declared.needs_approval or rule.needs_approval is True:
                continue
            served = rule.needs_approval
            # Admitted as always asking, or with another predicate than the one served
            # now (which may ask less): the call always asks.
            if served is False or declared.approval_predicate is None \
                    or mcp_tools.predicate_digest(served) != declared.approval_predicate:
                self.rules[declared.name] = dataclasses.replace(rule, needs_approval=True)

    def own_schemas(self) -> None:
        """Every admitted tool's calls carry its admitted schema's digest; a tool this
        worker serves with another schema is decided by the admitted rules (replay then
        validates calls as the run did; the tool activity refuses them)."""
        served = set(self.toolset.names())
        for declared in self.admitted:
            digest = mcp_tools.parameters_digest(declared.parameters)
            self.digests[declared.name] = digest
            if declared.name in served and digest != self.toolset.get(
                    declared.name).schema_digest:
                self.rules[declared.name] = mcp_tools.tool_rule(declared)
                self.described[declared.name] = declared

    def fixed_bytes(self, state: core.LoopState, instructions: str | None) -> int:
        """UTF-8 bytes every request carries beside the conversation: the instructions
        and the tool declarations."""
        api = state.settings.api
        admitted = {d.name: d for d in self.admitted}
        served = set(self.toolset.names())
        tools: list[dict[str, Any]] = []
        for name in state.allowed_tools:
            # A tool from an MCP server, or one a deploy renamed, removed or changed, is
            # described by the run's own declaration, not by this worker's toolset.
            declared = self.mcp.get(name) or (self.described.get(name)
                                              if name == ctx.RECALL_TOOL
                                              or name in self.agents else None)
            if declared is None and name in admitted and (
                    name not in served or mcp_tools.parameters_digest(
                        admitted[name].parameters) != self.toolset.get(name).schema_digest):
                declared = admitted[name]
            if declared is not None:
                tools.append(declared.openai_tool(api))
            elif name in served:
                tools += self.toolset.openai_tools([name], api)
        instructions = instructions or ""
        return len(instructions.encode("utf-8", "surrogatepass")) + len(
            json.dumps(tools, ensure_ascii=False).encode("utf-8", "surrogatepass"))

