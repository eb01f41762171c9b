"""MCP tools as boundloop tools: the pure rules (no SDK, no I/O).

- `MCPServerConfig`: what an operator writes for one MCP server (validated).
- `declare_tools`: a server's listed tools -> `MCPToolDeclaration`s (prefixed names,
  approval and side-effect defaults from the MCP annotations, operator overrides).
- `check_arguments`: arguments against the tool's JSON schema, before anything runs.
- `envelope_from_result`: a `tools/call` result (as JSON) -> the tool result envelope.

MCP annotations are hints from the server; boundloop trusts only one of them to relax
anything (`readOnlyHint: true` means no approval), and only because the operator chose
to configure that server. Everything else defaults to the cautious side.
"""

from __future__ import annotations

import hashlib
import json
import marshal
import re
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Annotated, Any, TypeVar

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, relevance
from jsonschema.validators import validator_for
from pydantic import BaseModel, ConfigDict, Field, model_validator

from boundloop.core import envelope as env
from boundloop.core.canonical import preview
from boundloop.core.limits import MAX_COUNT, PositiveInt, Seconds
from boundloop.core.loop import ToolRule
from boundloop.core.retries import TOOL_INITIAL_SECONDS, tool_backoff

#: OpenAI's rule for function names; every model-facing tool name must match it.
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
#: Characters of an MCP tool name outside OpenAI's rule become "_" (MCP allows ".", "/").
_NOT_ALLOWED = re.compile(r"[^a-zA-Z0-9_-]")
#: Bytes of an `isError` text the model gets: enough to act on, small enough to fit the
#: default 4096-byte result cap with the envelope around it.
ERROR_TEXT_BYTES = 2000
#: Bytes of a server-side protocol error message passed on to the model.
REFUSAL_TEXT_BYTES = 500
#: Schema problems named in one `invalid_input` message.
MAX_PROBLEMS = 5
_T = TypeVar("_T")
#: `${NAME}` in `env` and `headers` values: the worker's variable NAME.
_REFERENCE = re.compile(r"\$\{([^}]*)\}")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: The request `_meta` key that carries the call's idempotency key to the server. A
#: server that changes something should store it with its result and answer a repeated
#: key with the first result.
IDEMPOTENCY_META_KEY = "boundloop/idempotency_key"
DESTRUCTIVE_NOTE = "(This tool may delete or overwrite data.)"

ServerName = Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,40}$")]
NonNegativeUnits = Annotated[int, Field(strict=True, ge=0, le=MAX_COUNT)]


class MCPToolOverride(BaseModel):
    """Operator settings for one MCP tool; each unset field keeps the default.

    - name: model-facing name without the prefix (when the server's name does not fit).
    - needs_approval / side_effects: default from `readOnlyHint` (see `declare_tools`).
    - terminal: a success makes the next model request use `tool_choice: "none"`.
    - cost_units, max_calls: per-tool cost and calls per run (as for any tool).
    - timeout_seconds: start-to-close of one attempt, including connecting.
    - max_attempts: Temporal attempts for transport failures.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")] | None = None
    needs_approval: bool | None = None
    side_effects: bool | None = None
    terminal: bool | None = None
    cost_units: NonNegativeUnits | None = None
    max_calls: PositiveInt | None = None
    timeout_seconds: Seconds | None = None
    max_attempts: Annotated[int, Field(strict=True, ge=1, le=100)] | None = None


class MCPServerConfig(BaseModel):
    """One MCP server: either `command` (+ `args`, `env`, `cwd`) for stdio, or `url` for
    streamable HTTP.

    - name: identifies the server in logs and declarations; letters, digits, `_`, `-`.
    - prefix: put before each tool name (default `NAME__`), so servers cannot clash.
    - env: variables for the server process on top of a minimal default environment
      (HOME, PATH, ...); the worker's own environment, with its API keys, is not passed.
    - headers: HTTP headers sent with every request to a `url` server.
      In `env` and `headers` values, `${NAME}` stands for the worker's variable NAME,
      read when connecting, so a configuration file need not hold secrets.
    - tools: allow-list of the server's tool names (unset: every listed tool).
    - overrides: per tool (server-side name), see `MCPToolOverride`.
    - timeout_seconds / max_attempts: defaults for every tool of this server.
    - connect_timeout_seconds: bound on starting the process or connecting, and listing.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: ServerName
    command: Annotated[str, Field(min_length=1)] | None = None
    args: list[str] = Field(default_factory=list)
    # Out of repr: values may be secrets (or name them).
    env: dict[str, str] = Field(default_factory=dict, repr=False)
    cwd: Path | None = None
    url: Annotated[str, Field(pattern=r"^https?://\S+$")] | None = None
    headers: dict[str, str] = Field(default_factory=dict, repr=False)
    prefix: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{0,63}$")] | None = None
    tools: list[Annotated[str, Field(min_length=1)]] | None = None
    overrides: dict[str, MCPToolOverride] = Field(default_factory=dict)
    timeout_seconds: Seconds = 30.0
    max_attempts: Annotated[int, Field(strict=True, ge=1, le=100)] = 3
    connect_timeout_seconds: Seconds = 30.0

    @model_validator(mode="after")
    def _one_transport(self) -> MCPServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("set exactly one of `command` (stdio) or `url` (streamable HTTP)")
        if self.url is not None and (self.args or self.env or self.cwd is not None):
            raise ValueError("`args`, `env` and `cwd` apply only to a `command` (stdio) server")
        if self.command is not None and self.headers:
            raise ValueError("`headers` apply only to a `url` (streamable HTTP) server")
        for where, values in (("env", self.env), ("headers", self.headers)):
            for key, value in values.items():
                for name in _REFERENCE.findall(value):
                    if not _ENV_NAME.match(name):
                        raise ValueError(f"{where}.{key}: ${{{name}}} is not a variable name")
        if self.tools is not None:
            unknown = sorted(set(self.overrides) - set(self.tools))
            if unknown:
                raise ValueError(f"overrides for tools outside the `tools` allow-list: {unknown}")
        return self

    @property
    def tool_prefix(self) -> str:
        return f"{self.name}__" if self.prefix is None else self.prefix

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "streamable-http"


def expand_references(values: Mapping[str, str],
                      environ: Mapping[str, str]) -> dict[str, str]:
    """`values` with each `${NAME}` replaced by `environ[NAME]`.

    Raises KeyError with the first missing variable's name (never a value).
    """
    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in environ:
            raise KeyError(name)
        return environ[name]

    return {key: _REFERENCE.sub(one, value) for key, value in values.items()}


class MCPConfig(BaseModel):
    """A worker's MCP servers (`{"servers": [...]}` in JSON, `[[servers]]` in TOML)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    servers: list[MCPServerConfig]

    @model_validator(mode="after")
    def _unique_names(self) -> MCPConfig:
        names = [s.name for s in self.servers]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"server names must be unique: {dupes}")
        return self


class ListedTool(BaseModel):
    """What a server lists for one tool (`tools/list`), SDK-independent."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str = ""
    input_schema: dict[str, Any]
    read_only_hint: bool | None = None
    destructive_hint: bool | None = None


def parameters_digest(parameters: Mapping[str, Any]) -> str:
    """A short digest of an argument schema, the same wherever it is computed (sorted
    keys): a run's admitted schema and a worker's current one are told apart by it."""
    text = json.dumps(parameters, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def predicate_digest(predicate: Callable[..., Any]) -> str:
    """A short digest of an approval predicate's code (its qualified name and compiled
    body): an open run tells the predicate it was admitted with from the one a later
    worker serves. The same source on the same Python gives the same digest; any other
    counts as changed (the stricter reading: the call then always asks)."""
    code = getattr(predicate, "__code__", None)
    body = marshal.dumps(code) if code is not None else repr(predicate).encode()
    name = getattr(predicate, "__qualname__", type(predicate).__qualname__).encode()
    return hashlib.sha256(name + b"\n" + body).hexdigest()[:16]


class MCPToolDeclaration(BaseModel):
    """One MCP tool as boundloop declares it: plain data, carried in a run's input so
    replay never depends on what a server lists later.

    `parameters` is the server's input schema as listed; `strict` says whether it is
    already in OpenAI strict form (closed objects, every property required), so the
    function definition can be sent with `strict: true`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    server: str
    remote_name: str
    description: str
    parameters: dict[str, Any]
    strict: bool
    needs_approval: bool
    side_effects: bool
    terminal: bool = False
    cost_units: int = 0
    max_calls: int | None = None
    timeout_seconds: float = 30.0
    max_attempts: int = 3
    #: The tool may run as a local activity (`ToolRule.local`): set only for a worker's
    #: own read-only tools as its admission records them; a tool from an MCP server
    #: always runs as a regular activity. Left out of the JSON when False.
    local: bool = Field(default=False, exclude_if=lambda local: not local)
    #: For a function tool whose `needs_approval` is a predicate (recorded as asking):
    #: its `predicate_digest`. A worker serving the tool with another predicate, or
    #: with none, cannot loosen an open run's approvals: the call then always asks.
    approval_predicate: str | None = Field(default=None, exclude_if=lambda v: v is None)

    def openai_tool(self, api: str) -> dict[str, Any]:
        """The function definition for a Responses (`api="responses"`) or Chat request."""
        fn = {"name": self.name, "description": self.description,
              "parameters": self.parameters, "strict": self.strict}
        return {"type": "function", **fn} if api == "responses" else {"type": "function",
                                                                       "function": fn}


def tool_rule(declaration: MCPToolDeclaration) -> ToolRule:
    """The loop's rule for an MCP tool: arguments checked against its JSON schema (in the
    workflow, before anything runs), its approval, side-effect, cost and call flags, its
    timeout and attempts (with the backoff of any tool)."""
    return ToolRule(name=declaration.name, args_model=None,
                    side_effects=declaration.side_effects,
                    needs_approval=declaration.needs_approval,
                    cost_units=declaration.cost_units, max_calls=declaration.max_calls,
                    check=partial(check_arguments, declaration),
                    timeout_seconds=declaration.timeout_seconds,
                    backoff=tool_backoff(declaration.max_attempts, TOOL_INITIAL_SECONDS),
                    local=declaration.local)


def call_target(declaration: MCPToolDeclaration) -> MCPToolDeclaration:
    """What a tool activity needs of the declaration: all but the description, which
    only the model reads (every tool request is history)."""
    return declaration.model_copy(update={"description": ""})


class MCPDeclarationError(ValueError):
    """A listed tool cannot become a boundloop tool as configured (name, schema, clash)."""


def declare_tools(config: MCPServerConfig,
                  listed: Sequence[ListedTool]) -> list[MCPToolDeclaration]:
    """Declarations for the listed tools the config allows, in listing order.

    Defaults: `readOnlyHint: true` -> no approval, no side effects; anything else ->
    needs approval and has side effects. An explicit `destructiveHint: true` is noted in
    the description. Overrides win. Raises MCPDeclarationError naming the tool when a
    name does not fit `^[a-zA-Z0-9_-]{1,64}$` after prefixing, two tools get one name, a
    schema is not a JSON Schema object, or an allow-listed tool is not listed.
    """
    allowed = None if config.tools is None else set(config.tools)
    out: list[MCPToolDeclaration] = []
    seen: dict[str, str] = {}
    for tool in listed:
        if allowed is not None and tool.name not in allowed:
            continue
        override = config.overrides.get(tool.name, MCPToolOverride())
        name = config.tool_prefix + (override.name or _NOT_ALLOWED.sub("_", tool.name))
        where = f"MCP server {config.name!r}, tool {preview(tool.name)!r}"
        if not TOOL_NAME.match(name):
            raise MCPDeclarationError(
                f"{where}: model-facing name {preview(name)!r} does not match "
                f"^[a-zA-Z0-9_-]{{1,64}}$; set overrides.{tool.name}.name or a shorter prefix, "
                "or leave the tool out of the `tools` allow-list")
        if name in seen:
            raise MCPDeclarationError(
                f"{where}: name {name!r} is also the name of {seen[name]!r}; "
                "set overrides.<tool>.name for one of them")
        seen[name] = tool.name
        _check_schema(where, tool.input_schema)
        read_only = tool.read_only_hint is True
        description = tool.description.strip()
        if tool.destructive_hint is True and not read_only:
            description = f"{description} {DESTRUCTIVE_NOTE}".strip()
        out.append(MCPToolDeclaration(
            name=name, server=config.name, remote_name=tool.name, description=description,
            parameters=tool.input_schema, strict=is_strict_schema(tool.input_schema),
            needs_approval=_pick(override.needs_approval, not read_only),
            side_effects=_pick(override.side_effects, not read_only),
            terminal=_pick(override.terminal, False),
            cost_units=_pick(override.cost_units, 0),
            max_calls=override.max_calls,
            timeout_seconds=_pick(override.timeout_seconds, config.timeout_seconds),
            max_attempts=_pick(override.max_attempts, config.max_attempts)))
    if allowed is not None:
        missing = sorted(allowed - {t.name for t in listed})
        if missing:
            raise MCPDeclarationError(
                f"MCP server {config.name!r} does not list the allow-listed tools {missing}")
    return out


def _pick(value: _T | None, default: _T) -> _T:
    return default if value is None else value


def _check_schema(where: str, schema: Mapping[str, Any]) -> None:
    if schema.get("type") != "object":
        raise MCPDeclarationError(f"{where}: input schema is not a JSON Schema object")
    try:
        _validator_class(schema).check_schema(schema)
    except SchemaError as exc:
        raise MCPDeclarationError(
            f"{where}: input schema is not valid JSON Schema ({preview(exc.message, 200)})"
        ) from None


def is_strict_schema(schema: Any) -> bool:
    """True when every object in `schema` is closed and requires all its properties
    (what OpenAI's strict mode accepts without rewriting the schema)."""
    if isinstance(schema, list):
        return all(is_strict_schema(v) for v in schema)
    if not isinstance(schema, dict):
        return True
    if schema.get("type") == "object":
        props = schema.get("properties", {})
        if schema.get("additionalProperties") is not False:
            return False
        if not isinstance(props, dict) or set(schema.get("required", [])) != set(props):
            return False
    return all(is_strict_schema(v) for k, v in schema.items() if k != "required")


def check_arguments(declaration: MCPToolDeclaration, arguments: Any) -> env.Envelope | None:
    """None when `arguments` match the tool's input schema, else an `invalid_input`
    envelope naming up to MAX_PROBLEMS problems (most relevant first): where, and what
    was expected."""
    validator = _validator_class(declaration.parameters)(declaration.parameters)
    errors = sorted(validator.iter_errors(arguments), key=relevance,
                    reverse=True)[:MAX_PROBLEMS]  # best_match order
    if not errors:
        return None
    problems = "; ".join(
        f"{'/'.join(str(p) for p in e.absolute_path) or '(root)'}: "
        f"{_expected(e.validator, e.validator_value, e.message)}" for e in errors)
    return env.invalid_input("INVALID_ARGUMENTS", preview(
        f"arguments do not match the {declaration.name} schema: {problems}", 600))


def _validator_class(schema: Mapping[str, Any]) -> Any:
    """The validator the schema's `$schema` names; JSON Schema 2020-12 (what MCP
    specifies) when it names none."""
    return validator_for(schema, default=Draft202012Validator)


def _expected(keyword: Any, value: Any, message: str) -> str:
    """A short statement of what the schema wanted, without echoing long values."""
    if keyword == "type":
        return f"expected {value}"
    if keyword == "enum":
        return preview(f"expected one of {value}", 200)
    if keyword == "const":
        return preview(f"expected {value!r}", 200)
    return preview(message, 200)  # "'x' is a required property", "... is too long", ...


def envelope_from_result(result: Mapping[str, Any], *, terminal: bool) -> env.Envelope:
    """A `tools/call` result (JSON, MCP wire names) as the tool result envelope.

    - `isError: true` -> `permanent_error` (`MCP_TOOL_ERROR`) with the text content in
      `data.text`, capped at ERROR_TEXT_BYTES: the model reads it and may try again
      with other arguments.
    - success -> `success` with `data.structured` (the structured content) when the
      server sent it, else `data.text` (text blocks joined by newlines).
    - images, audio, resource links and embedded resources are not passed to the
      model; `data.omitted` counts them by type so the model knows they existed.
    """
    blocks = result.get("content") or []
    texts = [b["text"] for b in blocks if isinstance(b, dict) and b.get("type") == "text"
             and isinstance(b.get("text"), str)]
    omitted: dict[str, int] = {}
    for b in blocks:
        kind = b.get("type") if isinstance(b, dict) else None
        if kind != "text":
            key = kind if isinstance(kind, str) else "unknown"
            omitted[key] = omitted.get(key, 0) + 1
    text = "\n".join(texts)
    if result.get("isError") is True:
        return env.Envelope(
            status=env.ToolStatus.PERMANENT_ERROR, retryable=False,
            error_code="MCP_TOOL_ERROR", data={"text": preview(text, ERROR_TEXT_BYTES)},
            message="The tool reported an error; its text is in data.text. "
                    "Fix the arguments if it says how, otherwise tell the user. "
                    + env.DATA_NOTICE)
    data: dict[str, Any] = ({"structured": result["structuredContent"]}
                            if result.get("structuredContent") is not None else {"text": text})
    if omitted:
        data["omitted"] = omitted
    return env.success(data, terminal=terminal)


def refused(message: str) -> env.Envelope:
    """The server refused the request itself (a JSON-RPC error such as invalid params or
    an unknown tool): the call did not run and repeating it will not help."""
    return env.Envelope(
        status=env.ToolStatus.PERMANENT_ERROR, retryable=False, error_code="MCP_REQUEST_REFUSED",
        data={"text": preview(message, REFUSAL_TEXT_BYTES)},
        message="The MCP server refused this call; it did not run. Do not repeat it "
                "unchanged. " + env.DATA_NOTICE)
