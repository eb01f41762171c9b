"""Tool declarations (SPEC §5): schema, side effects, approval, cost, limits, retry.

A tool is a plain synchronous function `fn(args: ArgsModel, ctx: ToolContext) -> data`
run in a thread by the tool activity. It reports expected failures by raising
`ToolFailure` (returned to the model as an envelope), transient ones by raising
`TransientToolError` (retried by Temporal), and anything else is unexpected (the run
stops with `tool_error`, and the exception text never reaches the model).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from boundloop.core.loop import ToolRule
from boundloop.errors import ToolFailure, TransientToolError

__all__ = ["ToolContext", "ToolFailure", "ToolRegistry", "ToolSpec", "TransientToolError"]


@dataclass(frozen=True)
class ToolContext:
    """Passed to every tool execution.

    - idempotency_key: stable across activity retries, worker crashes and workflow reset
      (SPEC §7); side-effecting tools hand it to the system they change.
    - data_dir: where the demo tools keep their SQLite store.
    - max_result_bytes: the run's cap, so tools can bound what they fetch.
    """

    idempotency_key: str
    workflow_id: str
    call_id: str
    step: int
    data_dir: Path
    max_result_bytes: int


ToolFn = Callable[[Any, ToolContext], Any]


@dataclass(frozen=True)
class ToolSpec:
    """One tool's declaration. `timeout` is start-to-close per attempt; `max_attempts`
    and `initial_retry_seconds` make its Temporal retry policy."""

    name: str
    description: str
    args_model: type[BaseModel]
    fn: ToolFn
    side_effects: bool = False
    needs_approval: bool = False
    terminal: bool = False
    cost_units: int = 0
    max_calls: int | None = None
    timeout: timedelta = timedelta(seconds=30)
    max_attempts: int = 3
    initial_retry_seconds: float = 0.5
    approvers: tuple[str, ...] = field(default_factory=tuple)

    @property
    def rule(self) -> ToolRule:
        return ToolRule(name=self.name, args_model=self.args_model,
                        side_effects=self.side_effects, needs_approval=self.needs_approval,
                        cost_units=self.cost_units, max_calls=self.max_calls)

    def json_schema(self) -> dict[str, Any]:
        return strict_json_schema(self.args_model)


def strict_json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema in OpenAI strict form: every object closed
    (`additionalProperties: false`) and every property required.

    Raises ValueError for a field with a default: strict mode has no optional fields
    (use a nullable type instead).
    """
    schema = copy.deepcopy(model.model_json_schema())

    def close(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                for name, prop in node["properties"].items():
                    if isinstance(prop, dict) and "default" in prop:
                        raise ValueError(f"{model.__name__}.{name} has a default; strict "
                                         "schemas require every field")
                node["additionalProperties"] = False
                node["required"] = list(node["properties"])
            node.pop("title", None)
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for value in node:
                close(value)

    close(schema)
    return schema


class ToolRegistry:
    """Name -> ToolSpec. `register` checks the schema can be made strict."""

    def __init__(self) -> None:
        self._tools: dict[str, ToolSpec] = {}
        self._definitions: dict[tuple[tuple[str, ...], str], list[dict[str, Any]]] = {}

    def register(self, spec: ToolSpec) -> ToolSpec:
        if spec.name in self._tools:
            raise ValueError(f"tool {spec.name!r} registered twice")
        spec.json_schema()
        self._tools[spec.name] = spec
        self._definitions.clear()
        return spec

    def get(self, name: str) -> ToolSpec:
        return self._tools[name]

    def names(self) -> list[str]:
        return list(self._tools)

    def rules(self, names: list[str]) -> dict[str, ToolRule]:
        return {n: self._tools[n].rule for n in names}

    def unknown(self, names: list[str]) -> list[str]:
        return [n for n in names if n not in self._tools]

    def openai_tools(self, names: list[str], api: str) -> list[dict[str, Any]]:
        """Tool definitions for the request, in Responses or Chat Completions form
        (built once per tool set: schema generation costs more than the request)."""
        key = (tuple(names), api)
        if key not in self._definitions:
            self._definitions[key] = self._build_definitions(names, api)
        return self._definitions[key]

    def _build_definitions(self, names: list[str], api: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for n in names:
            spec = self._tools[n]
            fn = {"name": spec.name, "description": spec.description,
                  "parameters": spec.json_schema(), "strict": True}
            out.append({"type": "function", **fn} if api == "responses"
                       else {"type": "function", "function": fn})
        return out
