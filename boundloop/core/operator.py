"""The operator's policy: the floor under every run a worker serves.

The operator configures it where the worker is deployed (`Worker(policy=…)`,
`BOUNDLOOP_POLICY=path`). A run's own settings may only tighten it: fewer tools, lower
limits, more approvals, approvers drawn from the operator's. `resolve` turns a run's
settings into the effective ones, or into the list of what the run asked that is looser
(refused, never silently clamped). Pure: no Temporal, no I/O.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from boundloop.core.limits import (
    BUDGET_KEY_PATTERN,
    MAX_COUNT,
    Limits,
    Policy,
    Price,
    RunSettings,
)
from boundloop.core.mcp_tools import MCPToolDeclaration
from boundloop.core.rules import TOOL_PATTERN, ArgumentRule
from boundloop.core.signatures import ApproverName, PublicKeyText

__all__ = ["IN_CLEAR", "Admission", "BudgetRule", "OperatorLimits", "OperatorPolicy",
           "Refusal", "ToolDeclared", "ToolPolicy", "budget_admin_keys", "mcp_refusals",
           "resolve", "unserved_tools_line"]

ToolGlob = Annotated[str, Field(pattern=TOOL_PATTERN)]
PositiveTokens = Annotated[int, Field(strict=True, gt=0, le=MAX_COUNT)]
#: A context strategy (limits.Policy.context).
ContextStrategy = Literal["stop", "trim", "summarize"]
#: The Limits fields that take a ceiling: the numeric ones.
_NUMERIC = [name for name in Limits.model_fields if name != "per_tool_max_calls"]
_INTEGERS = {"max_steps", "max_tool_executions", "token_threshold", "max_result_bytes",
             "max_history_bytes", "max_identical_calls", "tool_cost_budget",
             "max_output_tokens", "max_input_tokens"}


class ToolPolicy(BaseModel):
    """The operator's word on the tools a name or glob matches.

    - approval: "always" asks before every call; "tool" (default) asks where the tool's
      own declaration does (`needs_approval=True` counts as operator policy).
    - approvers: names allowed to decide its approvals (None: any of `approver_keys`).
    - side_effects: for MCP tools, the side-effect flag a declaration may not drop.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    approval: Literal["always", "tool"] = "tool"
    approvers: list[ApproverName] | None = None
    side_effects: bool | None = None


#: `{Name}` in a `key_from` template: the run's search attribute Name.
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


class BudgetRule(BaseModel):
    """Which shared budget runs spend from: `key` fixed (a run naming another is refused),
    or `key_from`, a template over the run's search attributes (`"tenant-{BoundloopTenant}"`:
    a run without the attribute, or naming another key, is refused); `required` (a run
    naming none is refused; implied by `key_from`). And who may change budgets: `admins`,
    approvers whose signed `budget set` counts (with approver keys configured, only
    theirs does)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: Annotated[str, Field(pattern=BUDGET_KEY_PATTERN)] | None = None
    key_from: str | None = Field(None, min_length=3, max_length=100)
    required: bool = False
    admins: list[ApproverName] = Field(default_factory=list)

    @field_validator("key_from")
    @classmethod
    def _a_template(cls, template: str | None) -> str | None:
        if template is None:
            return None
        if not _PLACEHOLDER.search(template):
            raise ValueError("a template naming at least one search attribute, as "
                             '"{BoundloopTenant}" or "tenant-{BoundloopTenant}"')
        literal = _PLACEHOLDER.sub("x", template)
        if not re.fullmatch(BUDGET_KEY_PATTERN, literal):
            raise ValueError(f"{template!r} cannot make a budget key (letters, digits and "
                             ". _ : @ - around the {Name} parts)")
        return template

    @model_validator(mode="after")
    def _one_source(self) -> BudgetRule:
        if self.key is not None and self.key_from is not None:
            raise ValueError("budget: key and key_from exclude each other")
        return self

    def derived_key(self, attributes: Mapping[str, str]) -> str | list[str]:
        """The key `key_from` makes of a run's search attributes, or the names missing."""
        assert self.key_from is not None
        missing = [n for n in _PLACEHOLDER.findall(self.key_from) if not attributes.get(n)]
        if missing:
            return missing
        return _PLACEHOLDER.sub(lambda m: attributes[m.group(1)], self.key_from)


class OperatorLimits(BaseModel):
    """`max`: ceilings (a run asking more is refused; a limit the run leaves unset, or at
    boundloop's own default when that is over the ceiling, gets the ceiling). `defaults`:
    used where the run leaves a limit at boundloop's own default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max: dict[str, float] = Field(default_factory=dict)
    defaults: dict[str, Any] = Field(default_factory=dict)

    @field_validator("max")
    @classmethod
    def _known_ceilings(cls, ceilings: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(ceilings) - set(_NUMERIC))
        if unknown:
            raise ValueError(f"no such limit {', '.join(unknown)} (limits: {', '.join(_NUMERIC)})")
        bad = [k for k, v in ceilings.items() if isinstance(v, bool) or not v > 0]
        if bad:
            raise ValueError(f"ceilings must be positive numbers: {', '.join(bad)}")
        return ceilings

    @field_validator("defaults")
    @classmethod
    def _valid_defaults(cls, defaults: dict[str, Any]) -> dict[str, Any]:
        Limits.model_validate(defaults)  # names and values as a run's limits take them
        return defaults

    @model_validator(mode="after")
    def _defaults_within_ceilings(self) -> OperatorLimits:
        # Such a default would refuse every run that sets nothing: refused at the start.
        over = [f"defaults.{k} = {v:g} is over max.{k} = {self.max[k]:g}"
                for k, v in self.defaults.items()
                if k in self.max and isinstance(v, int | float) and v > self.max[k]]
        if over:
            raise ValueError("; ".join(over))
        return self


class OperatorPolicy(BaseModel):
    """What the operator of a worker allows every run it serves (docs/security.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Tool names or globs runs may use; None: every tool the worker serves.
    tools: list[ToolGlob] | None = None
    #: Tool name or glob -> its approval, approvers and flags.
    approval: dict[ToolGlob, ToolPolicy] = Field(default_factory=dict)
    #: Approver name -> Ed25519 public key; a run may use a subset, never add one. With
    #: any, only decisions signed by one of them count.
    approver_keys: dict[ApproverName, PublicKeyText] = Field(default_factory=dict)
    #: The only price table runs are charged by.
    prices: dict[str, Price] = Field(default_factory=dict)
    #: Model name -> its context window in tokens (input and output together): a run of
    #: that model gets it as `max_input_tokens`, and may only lower it.
    context_windows: dict[str, PositiveTokens] = Field(default_factory=dict)
    #: The context strategies runs may use: "stop" (only stop before a request that
    #: would not fit), "trim" (runs may also trim old tool outputs, or keep "stop"),
    #: "summarize" (runs may also summarize the oldest part of the conversation), or a
    #: list of them (["trim", "summarize"]: either).
    context: ContextStrategy | list[ContextStrategy] = "stop"
    #: Under "trim" and "summarize": the fewest newest tool outputs a run keeps verbatim
    #: (a run may keep more, never fewer).
    context_keep: int = Field(default=3, ge=0, le=1000)
    budget: BudgetRule = Field(default_factory=BudgetRule)
    limits: OperatorLimits = Field(default_factory=OperatorLimits)
    #: Argument rules ahead of the run's own; the strictest match wins.
    rules: list[ArgumentRule] = Field(default_factory=list, max_length=100)
    #: Refuse a run whose input reached Temporal in clear (its starter had no codec
    #: keys), before any model request. The worker itself needs codec keys.
    require_encryption: bool = False

    def tool_policy(self, tool: str) -> ToolPolicy:
        """The first entry of `approval` whose name or glob matches `tool`."""
        for pattern, entry in self.approval.items():
            if fnmatch.fnmatchcase(tool, pattern):
                return entry
        return ToolPolicy()

    def allows(self, tool: str) -> bool:
        return self.tools is None or any(fnmatch.fnmatchcase(tool, p) for p in self.tools)


def budget_admin_keys(policy: OperatorPolicy | None,
                      worker_keys: Mapping[str, str]) -> dict[str, str] | None:
    """The budget admins' public keys (only their signed changes set a budget's limits),
    or None where no approver key is configured (namespace access sets them). Raises
    ValueError naming an admin without a key."""
    keys = {**worker_keys, **(policy.approver_keys if policy else {})}
    admins = policy.budget.admins if policy else []
    missing = [name for name in admins if name not in keys]
    if missing:
        raise ValueError(f"budget.admins: {', '.join(missing)} has no approver key (give "
                         "each admin one in [approver_keys] or BOUNDLOOP_APPROVER_KEYS)")
    return {name: keys[name] for name in admins} if keys else None


def unserved_tools_line(policy: OperatorPolicy, served: Sequence[str]) -> str | None:
    """Why a worker serving `served` refuses `policy`, in one line, or None: an entry of
    a per-tool section (`tools`, `approval`, `rules[].tool`,
    `limits.defaults.per_tool_max_calls`) whose name or glob matches no served tool — a
    typo the operator would otherwise believe applies."""
    entries = [*((f"tools {p!r}", p) for p in policy.tools or []),
               *((f"approval.{p}", p) for p in policy.approval),
               *((f"rules[{i}].tool {r.tool!r}", r.tool) for i, r in enumerate(policy.rules)),
               *((f"limits.defaults.per_tool_max_calls.{t}", t)
                 for t in policy.limits.defaults.get("per_tool_max_calls") or {})]
    unserved = [where for where, pattern in entries
                if not any(fnmatch.fnmatchcase(tool, pattern) for tool in served)]
    if not unserved:
        return None
    return (f"{', '.join(unserved)}: no tool this worker serves has "
            f"{'that name' if len(unserved) == 1 else 'those names'} (it serves: "
            f"{', '.join(served) or 'no tools'})")


@dataclass(frozen=True)
class ToolDeclared:
    """What a function tool's code declares (a predicate `needs_approval` counts as True:
    it may ask)."""

    side_effects: bool
    needs_approval: bool


class Refusal(BaseModel):
    """One setting of a run that is looser than the operator's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    field: str
    asked: str
    operator: str

    def line(self) -> str:
        return f"{self.field}: the run asked {self.asked}; the operator's policy: {self.operator}"


#: Why a run started in clear is refused: what to configure where it is started.
IN_CLEAR = Refusal(
    field="payloads", asked="its input in clear (started by a client without codec keys)",
    operator="encrypted payloads only: start runs with the workers' codec keys "
             "(BOUNDLOOP_CODEC_KEYS or BOUNDLOOP_CODEC_KEY)")


class Admission(BaseModel):
    """A run's admission, recorded once in its history: the effective settings, or what
    was refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    settings: RunSettings | None = None
    refusals: list[Refusal] = Field(default_factory=list)
    #: The run's tools its worker's toolset does not have (the run fails at once), and
    #: the tools it has then (`unknown_tools_line`).
    unknown: list[str] = Field(default_factory=list)
    served: list[str] = Field(default_factory=list, exclude_if=lambda v: not v)
    #: The function tools' rules as the worker served them, as plain declarations: a
    #: worker that no longer serves one (renamed or removed by a deploy) still replays
    #: the run's decisions by these, and its tool activity stops the run with
    #: `tool_unavailable` (a predicate `needs_approval` is recorded as True).
    tools: list[MCPToolDeclaration] = Field(default_factory=list)


def unknown_tools_line(unknown: Sequence[str], served: Sequence[str], task_queue: str) -> str:
    """Why a run naming tools its worker does not serve is refused, in one sentence."""
    return (f"the worker on task queue {task_queue!r} serves no tool named "
            f"{', '.join(repr(t) for t in unknown)} (it serves: "
            f"{', '.join(served) or 'no tools'})")


def _asks(operator: OperatorPolicy, tool: str, declared: ToolDeclared | None,
          mcp: MCPToolDeclaration | None) -> bool:
    """Whether the operator's floor asks for approval before calls of `tool`."""
    if operator.tool_policy(tool).approval == "always":
        return True
    if declared is not None:
        return declared.needs_approval
    return mcp is not None and mcp.needs_approval


def _refused_limits(operator: OperatorPolicy, asked: Limits,
                    model: str) -> tuple[Limits | None, list[Refusal]]:
    values = asked.model_dump()
    builtin = Limits().model_dump()
    for name, value in operator.limits.defaults.items():
        if values.get(name) == builtin.get(name):
            values[name] = value
    refusals: list[Refusal] = []
    for name, ceiling in operator.limits.max.items():
        value = values.get(name)
        # A run that set nothing asked nothing: boundloop's own default over the ceiling
        # is the operator's to lower, so the ceiling stands in for it (as a default would).
        left = value is None or (value == builtin.get(name)
                                 and name not in operator.limits.defaults)
        if left and (value is None or value > ceiling):
            values[name] = int(ceiling) if name in _INTEGERS else float(ceiling)
        elif value is not None and value > ceiling:
            refusals.append(Refusal(field=f"limits.{name}", asked=repr(value),
                                    operator=f"at most {ceiling:g}"))
    # The model's context window: the run's max_input_tokens, or lower.
    window = operator.context_windows.get(model)
    if window is not None:
        asked_window = values.get("max_input_tokens")
        if asked_window is None or (asked_window > window and "max_input_tokens"
                                    not in asked.model_fields_set):
            values["max_input_tokens"] = window
        elif asked_window > window:
            refusals.append(Refusal(field="limits.max_input_tokens", asked=repr(asked_window),
                                    operator=f"at most {window} (the context window of "
                                             f"{model})"))
    try:
        return Limits.model_validate(values), refusals
    except ValidationError as e:
        return None, [*refusals, *(Refusal(
            field="limits." + ".".join(str(p) for p in err["loc"]) if err["loc"] else "limits",
            asked="", operator=err["msg"]) for err in e.errors())]


def resolve(operator: OperatorPolicy, settings: RunSettings, *, tools: Sequence[str],
            declared: Mapping[str, ToolDeclared],
            mcp_tools: Sequence[MCPToolDeclaration] = (),
            search_attributes: Mapping[str, str] | None = None
            ) -> RunSettings | list[Refusal]:
    """The run's effective settings under `operator`, or every field it asked looser.

    `tools` are the run's tool names; `declared` what the worker's code declares of its
    function tools; `mcp_tools` the MCP declarations the run carries;
    `search_attributes` the run's own (text values), which a `budget.key_from` reads.
    """
    refusals: list[Refusal] = []
    run = settings.policy
    mcp = {d.name: d for d in mcp_tools}

    for tool in tools:
        if not operator.allows(tool):
            refusals.append(Refusal(field="tools", asked=tool,
                                    operator=f"allowed: {', '.join(operator.tools or [])}"))
    for tool, d in mcp.items():
        entry = operator.tool_policy(tool)
        if entry.approval == "always" and not d.needs_approval:
            refusals.append(Refusal(field=f"mcp_tools.{tool}.needs_approval", asked="false",
                                    operator="approval always"))
        if entry.side_effects and not d.side_effects:
            refusals.append(Refusal(field=f"mcp_tools.{tool}.side_effects", asked="false",
                                    operator="side_effects true"))

    asking = [t for t in tools if _asks(operator, t, declared.get(t), mcp.get(t))]
    if run.approval == "never" and asking:
        refusals.append(Refusal(field="policy.approval", asked="never",
                                operator=f"approval required for {', '.join(asking)}"))

    strategies = [operator.context] if isinstance(operator.context, str) \
        else operator.context
    if run.context != "stop" and run.context not in strategies:
        refusals.append(Refusal(field="policy.context", asked=run.context, operator=(
            f"{', '.join(strategies) or 'stop'} (runs may not {run.context} their "
            "conversation)")))
    elif run.context != "stop" and run.context_keep < operator.context_keep:
        refusals.append(Refusal(field="policy.context_keep", asked=str(run.context_keep),
                                operator=f"at least {operator.context_keep}"))

    # Without operator keys, a run's own keys only tighten (signed decisions required).
    for name, key in run.approver_keys.items():
        if operator.approver_keys and operator.approver_keys.get(name) != key:
            refusals.append(Refusal(
                field=f"policy.approver_keys.{name}", asked="a key of its own",
                operator=f"approvers: {', '.join(operator.approver_keys) or 'none'}"))
    approvers = dict(run.approvers)
    for tool in tools:
        allowed = operator.tool_policy(tool).approvers
        if allowed is None:
            continue
        names = approvers.get(tool)
        if names is None:
            approvers[tool] = list(allowed)
        elif not names or set(names) - set(allowed):
            refusals.append(Refusal(field=f"policy.approvers.{tool}",
                                    asked=", ".join(names) or "anyone",
                                    operator=", ".join(allowed)))

    for model, price in run.prices.items():
        if operator.prices.get(model) != price:
            mine = operator.prices.get(model)
            refusals.append(Refusal(
                field=f"policy.prices.{model}", asked=price.model_dump_json(),
                operator=mine.model_dump_json() if mine else "no price for this model"))
    if settings.limits.usd_budget is not None and settings.model not in operator.prices:
        refusals.append(Refusal(field="limits.usd_budget", asked=f"a USD budget for "
                                f"{settings.model}", operator="no price for this model"))

    rule = operator.budget
    budget_key = settings.budget
    if rule.key_from is not None:
        derived = rule.derived_key(search_attributes or {})
        if isinstance(derived, list):
            refusals.extend(Refusal(field=f"search_attributes.{name}", asked="none",
                                    operator=f"required: the budget key is {rule.key_from}")
                            for name in derived)
        elif not re.fullmatch(BUDGET_KEY_PATTERN, derived):
            refusals.append(Refusal(field="budget", asked=derived[:120],
                                    operator=f"{rule.key_from} makes no valid budget key"))
        elif settings.budget is not None and settings.budget != derived:
            refusals.append(Refusal(field="budget", asked=settings.budget,
                                    operator=f"{derived} (from {rule.key_from})"))
        else:
            budget_key = derived  # a run naming none spends from its tenant's
    elif settings.budget is None and rule.required:
        refusals.append(Refusal(field="budget", asked="none",
                                operator=f"required{f': {rule.key}' if rule.key else ''}"))
    elif settings.budget is not None and rule.key is not None and settings.budget != rule.key:
        refusals.append(Refusal(field="budget", asked=settings.budget, operator=rule.key))

    limits, refused_limits = _refused_limits(operator, settings.limits, settings.model)
    refusals.extend(refused_limits)
    if refusals or limits is None:
        return refusals

    # The operator's floor becomes part of the run's policy: its `always` approvals and
    # its ask/deny rules come first (an operator `allow` never loosens a tool's own ask,
    # so it changes nothing), the run's own rules after; strictest wins.
    floor = [ArgumentRule(tool=t, action="ask", reason="operator policy") for t in tools
             if operator.tool_policy(t).approval == "always"]
    ahead = [*floor, *(r for r in operator.rules if r.action != "allow")]
    # Each rule once: a sub-agent's policy holds its caller's admitted rules, the
    # operator's among them (twice, they would pass the 100 a policy holds).
    rules = [*ahead, *(r for r in run.rules if r not in ahead)]
    keys = dict(run.approver_keys) or dict(operator.approver_keys)
    try:
        policy = Policy(unknown_tool=run.unknown_tool, missing_usage=run.missing_usage,
                        approval=run.approval, approvers=approvers, approver_keys=keys,
                        prices=dict(operator.prices), rules=rules, context=run.context,
                        context_keep=run.context_keep)
        return RunSettings.model_validate({**settings.model_dump(), "policy": policy.model_dump(),
                                           "limits": limits.model_dump(),
                                           "budget": budget_key})
    except ValidationError as e:
        return [Refusal(field=".".join(str(p) for p in err["loc"]) or "settings",
                        asked="", operator=err["msg"]) for err in e.errors()]


def mcp_refusals(declared: Sequence[MCPToolDeclaration], *, servers: Sequence[str],
                 served: Sequence[MCPToolDeclaration]) -> list[Refusal]:
    """What a run's MCP declarations ask that its worker's MCP configuration does not
    give: a tool of a server the worker has (`servers`) must be one the worker declares
    (`served`: its allow-list and overrides applied), by the same server and remote name,
    and may not drop its `needs_approval` or `side_effects`. The run's starter lists the
    servers itself, so its declarations are what it says; the worker's are the operator's.
    A server the worker does not have is not checked here: its calls cannot run."""
    own = {(d.server, d.remote_name): d for d in served}
    refusals: list[Refusal] = []
    for d in declared:
        if d.server not in servers:
            continue
        mine = own.get((d.server, d.remote_name))
        if mine is None:
            refusals.append(Refusal(
                field=f"mcp_tools.{d.name}", asked=f"tool {d.remote_name!r} of {d.server!r}",
                operator=f"not among the tools the worker declares for {d.server!r}"))
            continue
        for flag in ("needs_approval", "side_effects"):
            if getattr(mine, flag) and not getattr(d, flag):
                refusals.append(Refusal(field=f"mcp_tools.{d.name}.{flag}", asked="false",
                                        operator=f"{flag} true (the worker's declaration)"))
    return refusals
