"""Limits and run policy: validated before a run starts.

Every limit is a strictly positive integer, or a strictly positive finite number for
money and time. Booleans, strings, zero, negatives, NaN and infinity are refused with
pydantic's message naming the field.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic_core import to_json

from boundloop.core.rules import ArgumentRule
from boundloop.core.signatures import ApproverName, PublicKeyText

# Upper bounds keep every limit inside what Temporal timers and Python's C ints take
# (a 1e300-second deadline would fail every workflow task); they are far above any
# sensible setting.
MAX_COUNT = 1_000_000_000
MAX_SECONDS = 366 * 24 * 3600.0
PositiveInt = Annotated[int, Field(strict=True, gt=0, le=MAX_COUNT)]
Seconds = Annotated[float, Field(strict=True, gt=0, le=MAX_SECONDS, allow_inf_nan=False)]
USD = Annotated[float, Field(strict=True, gt=0, le=1e9, allow_inf_nan=False)]
#: Budget keys name a tenant, a project or an API key: plain, short, id-safe (the key is
#: part of the ledger's workflow id).
BUDGET_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,99}$"

# --- payload budget -------------------------------------------------------------------
# Every value that crosses Temporal (an activity input or result, the continue-as-new
# input, the workflow result) is one payload, at most PAYLOAD_LIMIT_BYTES. The largest
# allowed settings are derived here, and only here, from that limit.

#: Temporal's payload limit (bytes): no activity input or result, continue-as-new input
#: or workflow result may be larger. The server refuses it with a failure of type
#: `PAYLOADS_TOO_LARGE` (boundloop/errors.py).
PAYLOAD_LIMIT_BYTES = 2 * 1024 * 1024
#: Kept free in every payload for what wraps the value a setting sizes: the payload's
#: metadata (about 30 bytes), the JSON of the model around it (`{"envelope": …,
#: "executed": true, "fatal": false}` for a tool result: under 100 bytes), and the
#: small differences between our byte measure (`json.dumps`) and the data converter's
#: JSON (float spelling). Measured: a 2,500,000-byte result is a 2,500,184-byte payload;
#: 64 KiB leaves over 300 times that.
PAYLOAD_MARGIN_BYTES = 64 * 1024
#: The largest value one payload carries: 2,031,616 bytes.
MAX_PAYLOAD_VALUE_BYTES = PAYLOAD_LIMIT_BYTES - PAYLOAD_MARGIN_BYTES
#: `max_result_bytes` at most: one capped envelope is the tool activity's whole result.
MAX_RESULT_BYTES = MAX_PAYLOAD_VALUE_BYTES
#: The question and the instructions, each: both travel in the workflow input (again in
#: every continue-as-new input, next to the carried state) and in model activity inputs.
#: Together they keep at most a quarter of a payload, so the carried state has the rest.
MAX_PROMPT_BYTES = 256 * 1024
#: The run settings (model, limits, policy with its approver lists and price table) as
#: JSON: they travel in the workflow input and every continue-as-new input too.
MAX_SETTINGS_BYTES = 256 * 1024
#: One model response (the model activity's result). Its text can be the run's final
#: answer, so the workflow result keeps 512 KiB for counters and the event log beside it.
MAX_TURN_BYTES = MAX_PAYLOAD_VALUE_BYTES - 512 * 1024


def payload_bytes(value: BaseModel) -> int:
    """JSON bytes of `value` as the data converter writes it (pydantic's `to_json`)."""
    return len(to_json(value))


def fits_payload(size: int) -> bool:
    """Whether a value of `size` JSON bytes can cross Temporal (continue-as-new input,
    workflow result, activity input) with the margin above."""
    return size <= MAX_PAYLOAD_VALUE_BYTES


def _result_cap_fits(cap: int) -> int:
    if cap > MAX_RESULT_BYTES:
        raise ValueError(f"{cap} is over the largest allowed value, {MAX_RESULT_BYTES}: a "
                         "result that size would not fit Temporal's payload limit "
                         f"({PAYLOAD_LIMIT_BYTES} bytes)")
    return cap


#: `max_result_bytes`: a positive integer no larger than MAX_RESULT_BYTES.
ResultCap = Annotated[int, Field(strict=True, gt=0), AfterValidator(_result_cap_fits)]


def _prompt_fits(text: str) -> str:
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_PROMPT_BYTES:
        raise ValueError(f"{size} bytes of UTF-8, over the largest allowed, {MAX_PROMPT_BYTES} "
                         "bytes (it must fit Temporal's payload limit)")
    return text


#: The question or the instructions of a run: bounded so every payload holding them fits.
PromptText = Annotated[str, AfterValidator(_prompt_fits)]


class Price(BaseModel):
    """USD per million tokens for one model."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    input_usd_per_mtok: Annotated[float, Field(strict=True, ge=0, le=1e6, allow_inf_nan=False)]
    output_usd_per_mtok: Annotated[float, Field(strict=True, ge=0, le=1e6, allow_inf_nan=False)]


class Limits(BaseModel):
    """Hard limits of one run, with the defaults of the product's reference table.

    - max_steps: model requests per run; the last one is sent with `tool_choice: "none"`.
    - max_tool_executions: tool activities that actually ran.
    - token_threshold: known total tokens; reaching it stops the run (`usage_limit`).
    - max_result_bytes: UTF-8 bytes of one tool result envelope; at most
      MAX_RESULT_BYTES, so a result the cap lets through always fits a payload.
    - max_history_bytes: UTF-8 JSON bytes of the conversation, checked before a request.
      It bounds the HTTP request to the model, not a payload: the conversation never
      crosses Temporal whole (each item is in history once, docs/history.md).
    - max_identical_calls: executions of one fingerprint; the next identical call is blocked.
    - per_tool_max_calls: tool name -> calls allowed per run (overrides the tool's own).
    - tool_cost_budget: cost units (declared per tool) allowed per run.
    - usd_budget: USD per run, from the price table; needs a price for the model.
    - max_output_tokens: the most tokens one model response may produce, sent to the
      model (`max_output_tokens` on Responses, `max_completion_tokens` on Chat); needed
      when the run spends from a shared budget (it bounds each request's worst case).
    - max_input_tokens: the context window a request must fit in: its estimated input
      tokens (boundloop.core.context) plus `max_output_tokens` (when set). A request
      that would not fit is never sent: the run ends `context_exhausted`. The operator's
      window for the model (`OperatorPolicy.context_windows`) is its ceiling and, when
      the run sets none, its value. More than `max_output_tokens`.
    - tool_timeout_seconds: overrides every tool's own timeout (one attempt).
    - model_timeout_seconds: how long one model request attempt may wait for the
      provider: for its first byte, and between two pieces of a streamed answer. An
      answer may take longer while its tokens keep coming.
    - model_answer_seconds: how long one attempt's whole answer may take, however
      steadily it streams (None: until the run's deadline). An attempt cut by either
      timeout is `model_retried:timeout` (or the run's `model_failed:timeout`) and counts.
    - deadline_seconds: processing time of the run, approval waits excluded.
    - approval_timeout_seconds: how long one pending approval may wait (default 24 h).
    - max_children: sub-agents (`Agent.as_tool`) one run may start; the call past it is
      not started and the run ends `max_children`.
    - max_depth: how deep a tree of sub-agents may go below its root (a child of the
      root is at depth 1); a call that would start one deeper ends the run `max_depth`.
      A child's own is never more than its caller's.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_steps: PositiveInt = 5
    max_tool_executions: PositiveInt = 6
    token_threshold: PositiveInt = 8000
    max_result_bytes: ResultCap = 4096
    max_history_bytes: PositiveInt = 64000
    max_identical_calls: PositiveInt = 2
    per_tool_max_calls: dict[str, PositiveInt] = Field(default_factory=dict)
    tool_cost_budget: PositiveInt | None = None
    usd_budget: USD | None = None
    max_output_tokens: PositiveInt | None = None
    max_input_tokens: PositiveInt | None = Field(default=None, exclude_if=lambda v: v is None)
    tool_timeout_seconds: Seconds | None = None
    model_timeout_seconds: Seconds = 60.0
    model_answer_seconds: Seconds | None = Field(default=None, exclude_if=lambda v: v is None)
    deadline_seconds: Seconds = 600.0
    approval_timeout_seconds: Seconds = 86400.0
    max_children: PositiveInt = Field(default=8, exclude_if=lambda v: v == 8)
    max_depth: PositiveInt = Field(default=3, exclude_if=lambda v: v == 3)

    @model_validator(mode="after")
    def _output_fits_the_window(self) -> Limits:
        window, out = self.max_input_tokens, self.max_output_tokens
        if window is not None and out is not None and out >= window:
            raise ValueError(
                f"max_output_tokens ({out}) must be less than max_input_tokens ({window}): "
                "every request's input and its output must fit the context window")
        return self


class Policy(BaseModel):
    """Run-level choices where more than one behaviour is reasonable.

    - unknown_tool: "stop" ends the run with `forbidden_tool`; "report" answers the call
      with an `UNKNOWN_TOOL` envelope and goes on.
    - missing_usage: "stop" ends with `usage_unknown`; "estimate" counts UTF-8 bytes / 4
      and marks the result as estimated.
    - approval: "tool" asks for approval where a tool declares it, "always" for every
      side-effecting tool, "never" for none (for trusted batch runs).
    - approvers: tool name -> names allowed to decide (empty: anyone).
    - approver_keys: approver name -> Ed25519 public key (`ed25519:BASE64`, from
      `boundloop keys new`). When the run has any (here or in the worker's
      BOUNDLOOP_APPROVER_KEYS file), only decisions signed by one of them count.
    - prices: model name -> Price; a `usd_budget` needs the run's model here.
    - context: what happens when the next request would not fit the context window
      (`max_input_tokens`): "stop" ends the run with `context_exhausted` before the
      request is sent; "trim" sends it with every tool output but the newest
      `context_keep` replaced by a short stub (the next requests keep those stubs until
      the window is reached again), and gives the model
      the `recall_output` tool to read one again (it ends `context_exhausted` when even
      that does not fit); "summarize" first makes one model request, under the run's
      limits and budget, that writes a summary of the oldest part of the conversation,
      which every request from then on sends in its place (it ends `context_exhausted`
      when even then the request does not fit). The operator's policy says whether runs
      may trim or summarize.
    - context_keep: under "trim" and "summarize", the newest tool outputs always sent
      verbatim.
    - rules: argument rules (boundloop.core.rules) added by the run: `ask` or `deny` only,
      since they join the operator's and the strictest match wins (docs/approvals.md).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    unknown_tool: Literal["stop", "report"] = "stop"
    missing_usage: Literal["stop", "estimate"] = "stop"
    approval: Literal["tool", "always", "never"] = "tool"
    approvers: dict[str, list[str]] = Field(default_factory=dict)
    approver_keys: dict[ApproverName, PublicKeyText] = Field(default_factory=dict)
    prices: dict[str, Price] = Field(default_factory=dict)
    rules: list[ArgumentRule] = Field(default_factory=list, max_length=100,
                                      exclude_if=lambda v: not v)
    context: Literal["stop", "trim", "summarize"] = Field(default="stop",
                                                          exclude_if=lambda v: v == "stop")
    context_keep: int = Field(default=3, ge=0, le=1000, exclude_if=lambda v: v == 3)

    @model_validator(mode="after")
    def _run_rules_only_tighten(self) -> Policy:
        loose = [r.tool for r in self.rules if r.action == "allow"]
        if loose:
            raise ValueError(
                f"rules for {', '.join(loose)}: a run's own rules may only ask or deny "
                "(allowing is the operator's; a tool's own approval stays)")
        return self


class RunSettings(BaseModel):
    """Limits + policy + model, checked together before a run starts.

    - budget: the key of a shared budget the run spends from (`boundloop budget set`);
      before each model request the run reserves the request's worst case from it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(min_length=1)
    api: Literal["responses", "chat"] = "responses"
    limits: Limits = Field(default_factory=Limits)
    policy: Policy = Field(default_factory=Policy)
    budget: Annotated[str, Field(pattern=BUDGET_KEY_PATTERN)] | None = Field(
        default=None, exclude_if=lambda v: v is None)
    #: Request the model's answer as a stream (its text reaches `run.stream()` as it is
    #: written); False for a provider whose streams misbehave.
    stream: bool = Field(default=True, exclude_if=lambda v: v is True)

    @model_validator(mode="after")
    def _shared_budget_needs_output_cap(self) -> RunSettings:
        if self.budget is not None and self.limits.max_output_tokens is None:
            raise ValueError(
                f"budget {self.budget!r} is named but limits.max_output_tokens is not set: "
                "a shared budget reserves each request's worst case, which needs the most "
                "output a response may produce (e.g. --max-output-tokens 1024)")
        return self

    @model_validator(mode="after")
    def _budget_needs_price(self) -> RunSettings:
        if self.limits.usd_budget is not None and self.model not in self.policy.prices:
            raise ValueError(
                f"usd_budget is set but the price table has no entry for model {self.model!r}"
            )
        return self

    @model_validator(mode="after")
    def _fits_payload_budget(self) -> RunSettings:
        size = payload_bytes(self)
        if size > MAX_SETTINGS_BYTES:
            raise ValueError(
                f"the settings are {size} bytes of JSON, over the largest allowed, "
                f"{MAX_SETTINGS_BYTES} bytes (they must fit Temporal's payload limit)")
        return self
