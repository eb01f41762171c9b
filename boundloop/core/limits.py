"""Limits and run policy (SPEC §4): validated before a run starts.

Every limit is a strictly positive integer, or a strictly positive finite number for
money and time. Booleans, strings, zero, negatives, NaN and infinity are refused with
pydantic's message naming the field.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Upper bounds keep every limit inside what Temporal timers and Python's C ints take
# (a 1e300-second deadline would fail every workflow task); they are far above any
# sensible setting.
MAX_COUNT = 1_000_000_000
MAX_SECONDS = 366 * 24 * 3600.0
PositiveInt = Annotated[int, Field(strict=True, gt=0, le=MAX_COUNT)]
Seconds = Annotated[float, Field(strict=True, gt=0, le=MAX_SECONDS, allow_inf_nan=False)]
USD = Annotated[float, Field(strict=True, gt=0, le=1e9, allow_inf_nan=False)]


class Price(BaseModel):
    """USD per million tokens for one model."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    input_usd_per_mtok: Annotated[float, Field(strict=True, ge=0, le=1e6, allow_inf_nan=False)]
    output_usd_per_mtok: Annotated[float, Field(strict=True, ge=0, le=1e6, allow_inf_nan=False)]


class Limits(BaseModel):
    """Hard limits of one run. Defaults are seed 000's table and seed 001's identical calls.

    - max_steps: model requests per run; the last one is sent with `tool_choice: "none"`.
    - max_tool_executions: tool activities that actually ran.
    - token_threshold: known total tokens; reaching it stops the run (`usage_limit`).
    - max_result_bytes: UTF-8 bytes of one tool result envelope.
    - max_history_bytes: UTF-8 JSON bytes of the conversation, checked before a request.
    - max_identical_calls: executions of one fingerprint; the next identical call is blocked.
    - per_tool_max_calls: tool name -> calls allowed per run (overrides the tool's own).
    - tool_cost_budget: cost units (declared per tool) allowed per run.
    - usd_budget: USD per run, from the price table; needs a price for the model.
    - tool_timeout_seconds: overrides every tool's own start-to-close timeout.
    - model_timeout_seconds: one model request attempt (start-to-close).
    - deadline_seconds: processing time of the run, approval waits excluded.
    - approval_timeout_seconds: how long one pending approval may wait (default 24 h).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_steps: PositiveInt = 5
    max_tool_executions: PositiveInt = 6
    token_threshold: PositiveInt = 8000
    max_result_bytes: PositiveInt = 4096
    max_history_bytes: PositiveInt = 64000
    max_identical_calls: PositiveInt = 2
    per_tool_max_calls: dict[str, PositiveInt] = Field(default_factory=dict)
    tool_cost_budget: PositiveInt | None = None
    usd_budget: USD | None = None
    tool_timeout_seconds: Seconds | None = None
    model_timeout_seconds: Seconds = 60.0
    deadline_seconds: Seconds = 600.0
    approval_timeout_seconds: Seconds = 86400.0


class Policy(BaseModel):
    """Run-level choices where the SPEC allows more than one behaviour.

    - unknown_tool: "stop" ends the run with `forbidden_tool`; "report" answers the call
      with an `UNKNOWN_TOOL` envelope and goes on (SPEC §5).
    - missing_usage: "stop" ends with `usage_unknown`; "estimate" counts UTF-8 bytes / 4
      and marks the result as estimated.
    - approval: "tool" asks for approval where a tool declares it, "always" for every
      side-effecting tool, "never" for none (for trusted batch runs).
    - approvers: tool name -> names allowed to decide (empty: anyone).
    - prices: model name -> Price; a `usd_budget` needs the run's model here.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    unknown_tool: Literal["stop", "report"] = "stop"
    missing_usage: Literal["stop", "estimate"] = "stop"
    approval: Literal["tool", "always", "never"] = "tool"
    approvers: dict[str, list[str]] = Field(default_factory=dict)
    prices: dict[str, Price] = Field(default_factory=dict)


class RunSettings(BaseModel):
    """Limits + policy + model, checked together before a run starts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(min_length=1)
    api: Literal["responses", "chat"] = "responses"
    limits: Limits = Field(default_factory=Limits)
    policy: Policy = Field(default_factory=Policy)

    @model_validator(mode="after")
    def _budget_needs_price(self) -> RunSettings:
        if self.limits.usd_budget is not None and self.model not in self.policy.prices:
            raise ValueError(
                f"usd_budget is set but the price table has no entry for model {self.model!r}"
            )
        return self
