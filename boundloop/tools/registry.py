"""Tool declarations: a `Toolset` of functions, each with its argument schema, side
effects, approval rule, cost, limits, timeout and retry policy.

A tool is a plain function, synchronous or `async`:

    tools = Toolset[Deps]()

    @tools.tool(side_effects=True, needs_approval=True)
    async def create_ticket(ctx: ToolContext[Deps], title: str, priority: Priority) -> dict:
        "Create a support ticket."

- Its parameters (after an optional first `ctx: ToolContext[...]`) become the argument
  model; every one needs a type annotation. Or pass `args_model=` (a pydantic model) and
  take the validated instance as the one parameter after the context.
- Its docstring is the description the model reads (or pass `description=`).
- Arguments are validated from the model's JSON text in strict mode: dates, datetimes,
  UUIDs, enums, decimals and nested models arrive as their types; `"3"` is not an int.
- A tool without defaults gets an OpenAI *strict* definition (every property required,
  objects closed). Strict mode has no optional properties, so a tool with a default
  anywhere in its arguments gets a non-strict definition instead: the model may leave
  such a field out and the default applies (objects are still closed, and the workflow
  still validates every call against the schema before anything runs).

A sync tool runs on one of the worker's own tool threads, an `async` one is awaited on
the worker's event loop; both are stopped at their timeout or when the run is cancelled
(an `async` tool is cancelled, a sync one sees `ctx.is_cancelled()` and should return;
docs/durability.md, "Hung tools").

A tool reports expected failures by raising `ToolFailure` (an envelope for the model),
transient ones by raising `TransientToolError` (retried per its retry policy); anything else is
unexpected: the run stops with `tool_error`, the worker logs the traceback, and the
exception text never reaches the model, the RunResult or the history.

Everything that can be wrong with a declaration is refused when the tool is registered
(`ToolDefinitionError`), not when a run calls it.
"""

from __future__ import annotations

import copy
import inspect
import re
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from functools import cached_property, partial
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, PydanticUserError, create_model
from temporalio.common import RetryPolicy

from boundloop.core.loop import LOCAL_TOOL_MAX_SECONDS, ToolRule
from boundloop.core.mcp_tools import parameters_digest
from boundloop.core.retries import TOOL_INITIAL_SECONDS, tool_backoff
from boundloop.errors import ToolDefinitionError

__all__ = ["ToolContext", "ToolSpec", "Toolset", "strict_json_schema"]

Deps = TypeVar("Deps")
F = TypeVar("F", bound=Callable[..., Any])

#: OpenAI's rule for function names.
NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
#: A tool's retry policy unless it declares one: three attempts, 0.5 s apart at first.
DEFAULT_RETRY = RetryPolicy(initial_interval=timedelta(seconds=TOOL_INITIAL_SECONDS),
                            maximum_attempts=3)


def _no_heartbeat(*details: Any) -> None:
    """Outside an activity (a tool called directly, e.g. in a unit test) there is no one
    to tell."""


def _never_cancelled() -> bool:
    return False


@dataclass(frozen=True)
class ToolContext(Generic[Deps]):
    """What a tool knows of the call it serves, and what the worker gave it.

    - deps: the dependencies the worker was started with (`Worker(..., deps=...)`):
      a database pool, an HTTP client, a data directory.
    - idempotency_key: stable across activity retries, worker crashes and workflow
      reset (the workflow id and the call's position in the run); a side-effecting tool
      hands it to the system it changes, so a repeated execution changes nothing.
    - workflow_id, call_id, step: where the call comes from (for logs and stores).
    - max_result_bytes: the run's result cap, so a tool can bound what it fetches.
    - heartbeat(*details): tells Temporal the tool is still alive (long tools).
    - is_cancelled(): whether this attempt is over before the tool returned - the run
      was cancelled, or the attempt's timeout passed. A sync tool cannot be stopped from
      outside: a long one checks it between units of work and returns early.
    """

    deps: Deps
    idempotency_key: str
    workflow_id: str
    call_id: str
    step: int
    max_result_bytes: int
    heartbeat: Callable[..., None] = field(default=_no_heartbeat, repr=False, compare=False)
    is_cancelled: Callable[[], bool] = field(default=_never_cancelled, repr=False,
                                             compare=False)


@dataclass(frozen=True)
class ToolSpec:
    """One tool's declaration (made by `Toolset.tool`).

    `timeout` bounds one attempt (the tool activity enforces it); `retry` is the tool's
    retry policy, whose attempts and backoff the workflow counts itself: an attempt lost
    to a dead worker is not one of them (docs/durability.md, "Crashes and retries").
    `needs_approval` is a bool or a pure, deterministic predicate over the validated
    arguments: it runs inside the workflow. `local_activity` False keeps a read-only
    tool a regular activity (`read_only`, `boundloop.core.loop.runs_locally`).
    """

    name: str
    description: str
    args_model: type[BaseModel]
    fn: Callable[..., Any]
    takes_context: bool
    #: The function takes the argument model itself (`args_model=`), not its fields.
    takes_model: bool
    is_async: bool
    side_effects: bool = False
    needs_approval: bool | Callable[[Any], bool] = False
    terminal: bool = False
    cost_units: int = 0
    max_calls: int | None = None
    timeout: timedelta = timedelta(seconds=30)
    retry: RetryPolicy = field(default_factory=lambda: DEFAULT_RETRY)
    local_activity: bool = True

    @property
    def read_only(self) -> bool:
        """No side effects, never asks for approval, not terminal: a short tool of this
        kind runs as a local activity unless its author opted out (`local_activity`)."""
        return not self.side_effects and self.needs_approval is False and not self.terminal

    @property
    def rule(self) -> ToolRule:
        return ToolRule(name=self.name, args_model=self.args_model,
                        side_effects=self.side_effects, needs_approval=self.needs_approval,
                        cost_units=self.cost_units, max_calls=self.max_calls,
                        timeout_seconds=self.timeout.total_seconds(),
                        backoff=tool_backoff(
                            self.retry.maximum_attempts,
                            self.retry.initial_interval.total_seconds(),
                            self.retry.backoff_coefficient,
                            self.retry.maximum_interval.total_seconds()
                            if self.retry.maximum_interval else None),
                        local=self.local_activity and self.read_only
                        and self.timeout.total_seconds() <= LOCAL_TOOL_MAX_SECONDS)

    @cached_property
    def strict(self) -> bool:
        """Whether the definition sent to the model is OpenAI strict (no defaults)."""
        return not _has_default(self.args_model.model_json_schema())

    @cached_property
    def _schema(self) -> dict[str, Any]:
        # Built once a spec: pydantic builds a schema anew each time (~1 ms), and the tool
        # activity checks a call's schema digest on every call.
        return strict_json_schema(self.args_model) if self.strict else closed_json_schema(
            self.args_model)

    def json_schema(self) -> dict[str, Any]:
        return copy.deepcopy(self._schema)  # the caller's own: it may change it

    @cached_property
    def schema_digest(self) -> str:
        """`parameters_digest` of `json_schema()`."""
        return parameters_digest(self._schema)

    def bind(self, args: BaseModel, ctx: ToolContext[Any]) -> Callable[[], Any]:
        """The call of the function with these validated arguments: no arguments left."""
        lead = (ctx,) if self.takes_context else ()
        if self.takes_model:
            return partial(self.fn, *lead, args)
        return partial(self.fn, *lead, **{name: getattr(args, name)
                                          for name in type(args).model_fields})


def _has_default(node: Any) -> bool:
    if isinstance(node, dict):
        props = node.get("properties")
        if isinstance(props, dict) and any(isinstance(p, dict) and "default" in p
                                           for p in props.values()):
            return True
        return any(_has_default(v) for v in node.values())
    if isinstance(node, list):
        return any(_has_default(v) for v in node)
    return False


def _close(node: Any, *, require_all: bool) -> None:
    """Close every object schema and drop pydantic's `title` annotations. A `properties`
    or `$defs` mapping holds names, not keywords: a field called `title` stays."""
    if isinstance(node, dict):
        if node.get("type") == "object" and "properties" in node:
            node["additionalProperties"] = False
            if require_all:
                node["required"] = list(node["properties"])
        node.pop("title", None)
        for key, value in node.items():
            if key in ("properties", "$defs") and isinstance(value, dict):
                for sub in value.values():
                    _close(sub, require_all=require_all)
            else:
                _close(value, require_all=require_all)
    elif isinstance(node, list):
        for value in node:
            _close(value, require_all=require_all)


def strict_json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema in OpenAI strict form: every object closed
    (`additionalProperties: false`) and every property required.

    Raises ToolDefinitionError for a field with a default: strict mode has no optional
    fields (`ToolSpec` sends such a tool non-strict instead).
    """
    schema = copy.deepcopy(model.model_json_schema())
    if _has_default(schema):
        raise ToolDefinitionError(f"{model.__name__} has a field with a default; strict "
                                  "schemas require every field")
    _close(schema, require_all=True)
    return schema


def closed_json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The schema of a non-strict definition: objects closed, defaults kept, only the
    fields without a default required."""
    schema = copy.deepcopy(model.model_json_schema())
    _close(schema, require_all=False)
    return schema


def _is_context(annotation: Any) -> bool:
    origin = typing.get_origin(annotation) or annotation
    return origin is ToolContext


def _is_model(annotation: Any) -> bool:
    return inspect.isclass(annotation) and issubclass(annotation, BaseModel)


def _describe(fn: Callable[..., Any], description: str | None, name: str) -> str:
    if description is None:
        # A docstring's paragraphs, each on one line (the model reads no line wrapping).
        doc = inspect.getdoc(fn) or ""
        description = "\n\n".join(" ".join(p.split()) for p in doc.split("\n\n") if p.strip())
    if not description.strip():
        raise ToolDefinitionError(f"tool {name!r} has no description: give the function a "
                                  "docstring (the model reads it) or pass description=")
    return description.strip()


def _signature(fn: Callable[..., Any], name: str,
               args_model: type[BaseModel] | None) -> tuple[bool, type[BaseModel], bool]:
    """(takes_context, argument model, takes_model) from the function's signature."""
    try:
        sig = inspect.signature(fn)
        hints = typing.get_type_hints(fn, include_extras=True)
    except (TypeError, ValueError) as exc:
        raise ToolDefinitionError(f"tool {name!r}: cannot read the signature: {exc}") from None
    except NameError as exc:
        raise ToolDefinitionError(f"tool {name!r}: an annotation does not resolve ({exc}); "
                                  "import the type at module level") from None
    params = list(sig.parameters.values())
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ToolDefinitionError(f"tool {name!r}: *{p.name} / **{p.name} cannot be "
                                      "described to a model; declare each argument")
        if p.name not in hints:
            raise ToolDefinitionError(f"tool {name!r}: parameter {p.name!r} has no type "
                                      "annotation (the argument schema comes from them)")
    takes_context = bool(params) and _is_context(hints[params[0].name])
    rest = params[1:] if takes_context else params
    for p in rest:
        if _is_context(hints[p.name]):
            raise ToolDefinitionError(f"tool {name!r}: the ToolContext parameter {p.name!r} "
                                      "must be the first one")
    if params and not takes_context and params[0].name in ("ctx", "context"):
        raise ToolDefinitionError(
            f"tool {name!r}: the first parameter {params[0].name!r} is annotated "
            f"{hints[params[0].name]!r}, not ToolContext[...]; annotate it as the context "
            "or rename it")
    if args_model is not None:
        if not _is_model(args_model):
            raise ToolDefinitionError(f"tool {name!r}: args_model must be a pydantic model "
                                      "class")
        if len(rest) != 1 or rest[0].kind == rest[0].KEYWORD_ONLY:
            raise ToolDefinitionError(
                f"tool {name!r}: with args_model= the function takes the validated model as "
                "its one parameter (after the optional ToolContext)")
        return takes_context, args_model, True
    fields: dict[str, Any] = {}
    for p in rest:
        if p.kind == p.POSITIONAL_ONLY:
            raise ToolDefinitionError(f"tool {name!r}: positional-only parameter {p.name!r} "
                                      "cannot be passed by name")
        fields[p.name] = (hints[p.name], ... if p.default is p.empty else p.default)
    try:
        model = create_model(f"{name}_arguments", __config__=ConfigDict(extra="forbid"),
                             **fields)
        model.model_json_schema()
    except (PydanticUserError, TypeError, ValueError) as exc:
        raise ToolDefinitionError(f"tool {name!r}: the arguments cannot be described as a "
                                  f"JSON schema: {exc}") from None
    return takes_context, model, False


class Toolset(Generic[Deps]):
    """Named tools for one agent. `Deps` is the type of what the worker hands every tool
    as `ctx.deps`.

    Register with the `tool` decorator, or add another toolset's tools with `include`.
    A toolset is what a worker serves and what the workflow reads the tool rules from
    (argument models, approval, cost, limits).
    """

    def __init__(self, tools: Iterable[ToolSpec] = ()) -> None:
        self._tools: dict[str, ToolSpec] = {}
        self._definitions: dict[tuple[tuple[str, ...], str], list[dict[str, Any]]] = {}
        for spec in tools:
            self.add(spec)

    def tool(self, *, name: str | None = None, description: str | None = None,
             args_model: type[BaseModel] | None = None, side_effects: bool = False,
             needs_approval: bool | Callable[[Any], bool] = False, terminal: bool = False,
             cost_units: int = 0, max_calls: int | None = None,
             timeout: timedelta = timedelta(seconds=30),
             retry: RetryPolicy = DEFAULT_RETRY,
             local_activity: bool = True) -> Callable[[F], F]:
        """Register the decorated function as a tool; the function is returned unchanged.

        - name: defaults to the function's name.
        - description: defaults to the docstring.
        - args_model: a pydantic model the function takes instead of separate arguments.
        - side_effects: the tool changes something (approval policy `always` asks first).
        - needs_approval: True, or a pure predicate over the validated arguments (the
          argument model instance) deciding per call; it runs in the workflow, so it must
          be deterministic (no clock, no I/O, no randomness).
        - terminal: after its success the model gets one last turn without tools.
        - cost_units: counted against the run's `tool_cost_budget`.
        - max_calls: executions per run (a run's `per_tool_max_calls` overrides it).
        - timeout: one attempt; retry: its attempts and backoff (`maximum_attempts`
          must be set: unlimited retries are refused), counted by the workflow.
        - local_activity: False keeps the tool a regular activity. A read-only tool (no
          side effects, no approval, not terminal) whose timeout is at most 10 s runs
          as a Temporal local activity in the workflow's worker. Opt out when running it
          again costs much (a worker crash re-runs a local activity whole), when it
          reports progress with `ctx.heartbeat` (a local activity has no heartbeats),
          or when it should show as a pending activity while it runs
          (docs/durability.md, "Local activities")."""

        def register(fn: F) -> F:
            tool_name = name if name is not None else getattr(fn, "__name__", "")
            if not NAME_PATTERN.match(tool_name):
                raise ToolDefinitionError(
                    f"tool name {tool_name!r} is not valid: letters, digits, _ and - only, "
                    "1-64 characters (a lambda needs name=)")
            if not callable(fn):
                raise ToolDefinitionError(f"tool {tool_name!r} is not callable")
            if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
                raise ToolDefinitionError(f"tool {tool_name!r} is a generator; a tool returns "
                                          "one result")
            takes_context, model, takes_model = _signature(fn, tool_name, args_model)
            if not isinstance(needs_approval, bool) and not callable(needs_approval):
                raise ToolDefinitionError(f"tool {tool_name!r}: needs_approval must be a bool "
                                          "or a predicate over the arguments")
            if cost_units < 0 or (max_calls is not None and max_calls < 1):
                raise ToolDefinitionError(f"tool {tool_name!r}: cost_units must be >= 0 and "
                                          "max_calls >= 1")
            if timeout <= timedelta(0):
                raise ToolDefinitionError(f"tool {tool_name!r}: timeout must be positive")
            if retry.maximum_attempts < 1:
                raise ToolDefinitionError(f"tool {tool_name!r}: retry.maximum_attempts must "
                                          "be at least 1 (unlimited retries are refused)")
            self.add(ToolSpec(
                name=tool_name, description=_describe(fn, description, tool_name),
                args_model=model, fn=fn, takes_context=takes_context,
                takes_model=takes_model,
                is_async=inspect.iscoroutinefunction(inspect.unwrap(fn)),
                side_effects=side_effects, needs_approval=needs_approval, terminal=terminal,
                cost_units=cost_units, max_calls=max_calls, timeout=timeout, retry=retry,
                local_activity=local_activity))
            return fn

        return register

    def add(self, spec: ToolSpec) -> ToolSpec:
        """Register a declaration made elsewhere (`tool` builds them)."""
        if spec.name in self._tools:
            raise ToolDefinitionError(f"tool {spec.name!r} registered twice")
        spec.json_schema()
        self._tools[spec.name] = spec
        self._definitions.clear()
        return spec

    def include(self, other: Toolset[Deps], *, exclude: Sequence[str] = ()) -> None:
        """Add every tool of `other` (except those named in `exclude`)."""
        for spec in other._tools.values():
            if spec.name not in exclude:
                self.add(spec)

    def get(self, name: str) -> ToolSpec:
        return self._tools[name]

    def deps_problem(self, deps: object) -> str | None:
        """Why `deps` cannot be this toolset's `ctx.deps`, or None: the toolset was made
        as `Toolset[SomeDeps]()` and `deps` is not a SomeDeps. A toolset made without
        the type (`Toolset()`), or with one no isinstance can check, takes any deps."""
        declared = typing.get_args(getattr(self, "__orig_class__", None))
        wanted = declared[0] if declared else None
        if not isinstance(wanted, type):
            return None
        try:
            if isinstance(deps, wanted):
                return None
        except TypeError:  # `Toolset[typing.Any]`, a Protocol not runtime-checkable: any deps
            return None
        return (f"the toolset's tools take {wanted.__qualname__} as ctx.deps "
                f"(Toolset[{wanted.__qualname__}]), but the worker was given a "
                f"{type(deps).__qualname__}")

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
                  "parameters": spec.json_schema(), "strict": spec.strict}
            out.append({"type": "function", **fn} if api == "responses"
                       else {"type": "function", "function": fn})
        return out


def tool_names(tools: Toolset[Any] | Sequence[str | Callable[..., Any]]) -> list[str]:
    """Names of `tools`: a toolset (all its tools), or names and tool functions (a function
    stands for its own name; one registered under another `name=` is named by that)."""
    if isinstance(tools, Toolset):
        return tools.names()
    out: list[str] = []
    for t in tools:
        name = t if isinstance(t, str) else getattr(t, "__name__", None)
        if not isinstance(name, str) or not name:
            raise TypeError(f"{t!r} is neither a tool name nor a tool function")
        out.append(name)
    return out
