"""Data that crosses Temporal boundaries (workflow input/output, activities, messages).

All are pydantic models carried by `pydantic_data_converter`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from temporalio.contrib.workflow_streams import WorkflowStreamState

from boundloop.core.budget import (
    TOKEN_PATTERN,
    Amount,
    BudgetLimits,
    BudgetReset,
    LedgerState,
    Reservation,
)
from boundloop.core.carry import Segment
from boundloop.core.context import Summarize, Trim
from boundloop.core.conversation import ConversationMeta, Item, SummaryRef
from boundloop.core.conversation import ConversationRef as ConversationRef  # re-exported
from boundloop.core.limits import Limits, PromptText, RunSettings
from boundloop.core.loop import Approval, Event, Grant, LoopState, ModelAttempt, ToolChoice
from boundloop.core.mcp_tools import MCPToolDeclaration
from boundloop.core.place import TreePlace
from boundloop.core.reasons import StopReason
from boundloop.core.rules import CONDITION_MAX
from boundloop.core.session import (
    Continuation,
    SessionEnd,
    SessionLimits,
    SessionState,
    TurnOf,
    TurnSummary,
)
from boundloop.core.signatures import ApproverName, Signature
from boundloop.core.tree import AgentTool

WORKFLOW_NAME = "BoundLoop"


def _none(value: object) -> bool:
    """Leave None fields out of payloads: every byte of an activity input is history."""
    return value is None


def _empty(value: object) -> bool:
    return not value


MODEL_ACTIVITY = "model_request"
#: The local activity that finds calls of a run's earlier Temporal runs (core/carry.py).
EARLIER_CALLS_ACTIVITY = "earlier_calls"
TOOL_ACTIVITY = "tool_execute"
#: Key of a `function_call_output` item that refers to a tool activity's result by the
#: call's idempotency key instead of copying it (docs/history.md).
OUTPUT_REF = "output_ref"


class Carried(BaseModel):
    """What continue-as-new hands to the next run (docs/history.md).

    `unsent` holds the items the model has not seen yet as `new_items` hold them: a tool
    activity's output as an `output_ref` (it lives in the previous run's history), never
    the output itself, so the carried input does not grow with tool results.
    """

    state: LoopState
    base: ConversationRef
    unsent: list[Item] = Field(default_factory=list)
    #: Processing time so far (approval waits already left out).
    processing_seconds: float = 0.0
    #: The run's live stream (its items and publishers), handed to the next run.
    stream: WorkflowStreamState | None = Field(default=None, exclude_if=_none)
    #: The function tools' rules the run was admitted with (`Admission.tools`): the next
    #: run decides a tool its worker no longer serves by these, as the first one does.
    tools: list[MCPToolDeclaration] = Field(default_factory=list, exclude_if=_empty)
    #: What the run handing over touched of the whole-run tables (identical-call counts,
    #: call ids, rejected fingerprints): the next runs find them here by reference
    #: (boundloop.core.carry), so the carried input does not grow with the run's calls.
    segment: Segment | None = Field(default=None, exclude_if=_none)


class RunInput(BaseModel):
    """Workflow input. `tools` is the allowed subset of the registry and of `mcp_tools`.

    `mcp_tools` are the MCP tools the run may call, as declared when it started (name,
    schema, flags): the workflow reads their rules from here, never from what a server
    lists later, so replay does not depend on the server.
    """

    question: PromptText = Field(min_length=1)
    instructions: PromptText | None = None
    settings: RunSettings
    tools: list[str]
    mcp_tools: list[MCPToolDeclaration] = Field(default_factory=list, exclude_if=_empty)
    search_attributes: bool = True
    carried: Carried | None = None
    #: Set when the run is a session's turn: it continues the session's conversation and
    #: its RunResult says where the conversation goes on (`RunResult.continuation`).
    turn: TurnOf | None = Field(default=None, exclude_if=_none)
    #: Agents the run's model may call as tools (`Agent.as_tool`), each started as a
    #: child run within an allowance of this run's limits (boundloop.core.tree).
    agents: list[AgentTool] = Field(default_factory=list, exclude_if=_empty)
    #: Set when the run is a sub-agent's: its place in the tree. Only the run it names as
    #: its parent, as the parent that started it, hands one on.
    tree: TreePlace | None = Field(default=None, exclude_if=_none)


def run_input(question: str, *, instructions: str | None, settings: RunSettings,
              tools: Sequence[str], mcp_tools: Sequence[MCPToolDeclaration] = (),
              search_attributes: bool = True, turn: TurnOf | None = None,
              agents: Sequence[AgentTool] = (), tree: TreePlace | None = None) -> RunInput:
    """The workflow input of one run: the only place one is made (`Agent.run_input` for a
    run, the session workflow for each turn, a run for its sub-agents). Pure and
    deterministic: `tools` are the names the run may call; `mcp_tools` the declarations
    of those that are MCP tools; `agents` the agents it may call as tools."""
    allowed = set(tools)
    return RunInput(question=question, instructions=instructions, settings=settings,
                    tools=list(tools), mcp_tools=[d for d in mcp_tools if d.name in allowed],
                    search_attributes=search_attributes, turn=turn, agents=list(agents),
                    tree=tree)


class ModelRequest(BaseModel):
    """Model activity input: a reference to the conversation, not the conversation.

    Workflow and run ids come from the activity's info (not repeated in history). The
    activity rebuilds `prior` (cache, else this run's event history) and appends
    `new_items`, resolving `output_ref` items (tool outputs already in history as tool
    activity results); the result must match `expected` (docs/history.md).
    """

    step: int
    model: str
    api: Literal["responses", "chat"]
    tools: list[str]
    tool_choice: ToolChoice
    instructions: str | None = Field(default=None, exclude_if=_none)
    prior: ConversationMeta
    new_items: list[Item]
    expected: ConversationMeta
    base: ConversationRef | None = Field(default=None, exclude_if=_none)
    #: The provider's time for one attempt (None: the activity's start-to-close).
    timeout_seconds: float | None = Field(default=None, exclude_if=_none)
    #: The longest the whole answer may take while it keeps coming (None: no bound but
    #: the activity's start-to-close); `timeout_seconds` bounds each silence.
    answer_seconds: float | None = Field(default=None, exclude_if=_none)
    #: The most output tokens the response may hold (limits.max_output_tokens).
    max_output_tokens: int | None = Field(default=None, exclude_if=_none)
    #: Request a streamed answer and publish its text to the run's stream.
    stream: bool = Field(default=False, exclude_if=lambda v: v is False)
    #: The tools among `tools` the run describes itself (their definitions come from the
    #: run's input or admission): its MCP tools, and function tools a deploy renamed,
    #: removed or reshaped since the run was admitted.
    mcp_tools: list[MCPToolDeclaration] = Field(default_factory=list, exclude_if=_empty)
    #: Under the `trim` context strategy: how to fit the request to the context window
    #: (the activity sends old tool outputs as stubs; boundloop.core.context).
    trim: Trim | None = Field(default=None, exclude_if=_none)
    #: Under the `summarize` context strategy: the summary to send in place of the
    #: conversation's oldest items (its text is a summary request's result in history).
    summary: SummaryRef | None = Field(default=None, exclude_if=_none)
    #: This is a summary request: the activity asks the model for a summary of the
    #: conversation's oldest part (boundloop.core.context), not for the step's answer.
    summarize: Summarize | None = Field(default=None, exclude_if=_none)
    #: What the request's `Idempotency-Key` is scoped by: the workflow id and the run's
    #: first execution run id (None: the workflow id alone, as runs before it had).
    key_scope: str | None = Field(default=None, exclude_if=_none)


class ToolRequest(BaseModel):
    """Tool activity input: validated arguments and the call's idempotency key."""

    tool: str
    call_id: str
    step: int
    arguments: dict[str, Any]
    idempotency_key: str
    max_result_bytes: int
    #: One attempt's limit, enforced by the activity (None: the tool's own timeout).
    timeout_seconds: float | None = Field(default=None, exclude_if=_none)
    #: For a tool from an MCP server: the run's declaration of it (without description).
    mcp: MCPToolDeclaration | None = Field(default=None, exclude_if=_none)
    #: The digest of the argument schema the run was admitted with
    #: (`mcp_tools.parameters_digest`): a worker serving the tool with another schema
    #: refuses the call as `ToolUnavailable`. None: not checked (runs before it).
    parameters_digest: str | None = Field(default=None, exclude_if=_none)
    #: For a call run as a local activity: the own task queue of the worker the run sends
    #: its activities to (`ToolOutcome.worker_queue` names another one).
    holder: str | None = Field(default=None, exclude_if=_none)


class Decision(BaseModel):
    """An approval decision (signal `approve`/`reject`, update `decide`)."""

    model_config = ConfigDict(extra="forbid")

    call_id: str = Field(min_length=1)
    approve: bool
    approver: str = Field(default="operator", min_length=1, max_length=100)
    reason: str | None = Field(default=None, max_length=1000)
    arguments: dict[str, Any] | None = None  # edited arguments (approval only)
    #: The approver's signature (boundloop.core.signatures); required when the run or its
    #: worker has approver keys, unchecked otherwise.
    signature: Signature | None = Field(default=None, exclude_if=_none)
    #: Approve later calls of this tool in this run without asking (approval only),
    #: those whose arguments meet `when` (a condition as in argument rules) if given.
    remember: bool = Field(default=False, exclude_if=lambda v: not v)
    when: str | None = Field(default=None, max_length=CONDITION_MAX, exclude_if=_none)
    #: With `remember`: for the rest of this run, or of the session this run is a turn of
    #: (its later turns approve such calls too, within their own policy).
    scope: Literal["run", "session"] = Field(default="run", exclude_if=lambda v: v == "run")
    #: The run the approver looked at: its first execution run id (continue-as-new and a
    #: reset keep it; a new run under the same workflow id has another). A run refuses a
    #: decision made for another (`RunStatus.run`).
    run: str | None = Field(default=None, min_length=1, max_length=100, exclude_if=_none)
    #: The fingerprint of the arguments the approver was shown (`Approval.fingerprint`):
    #: a run refuses the decision when the call waiting now has other arguments.
    fingerprint: str | None = Field(default=None, min_length=1, max_length=200,
                                    exclude_if=_none)


class CancelRequest(BaseModel):
    """The `cancel_reason` signal `boundloop cancel` sends before cancelling a run."""

    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(default=None, min_length=1, max_length=500)


class RunResult(BaseModel):
    """A run's output. `events` hold no raw arguments, outputs or text."""

    reason: StopReason
    text: str
    steps: int
    tool_executions: int
    input_tokens: int
    output_tokens: int
    total_tokens: int
    usage_unknown: bool
    usage_estimated: bool
    cost_usd: float | None
    cost_units: int
    events: list[Event]
    workflow_id: str = ""
    run_id: str = ""
    #: The final text is (or holds in a code fence) a JSON tool call; never executed.
    answer_looks_like_tool_call: bool = False
    #: The operator's reason when the run was cancelled with one (`boundloop cancel`).
    cancel_reason: str | None = Field(default=None, exclude_if=_none)
    #: A session turn's conversation, for the next turn (only runs that are turns).
    continuation: Continuation | None = Field(default=None, exclude_if=_none)
    #: A session turn's approvals remembered for the session, for its next turns.
    session_grants: list[Grant] = Field(default_factory=list, exclude_if=_empty)
    #: Every model request the provider received, with the tokens charged for it (its
    #: usage, or its worst case when no answer came): they add up to `total_tokens`.
    model_attempts: list[ModelAttempt] = Field(default_factory=list, exclude_if=_empty)
    #: Processing time of the run in seconds (approval waits excluded): a caller's own
    #: clock counts a sub-agent's processing time, not its approval waits.
    processing_seconds: float = Field(default=0.0, exclude_if=lambda v: not v)
    #: Calls per tool name (each counted as its per-tool limit counts it).
    per_tool_calls: dict[str, int] = Field(default_factory=dict, exclude_if=_empty)


class ChildRun(BaseModel):
    """A sub-agent's run as the run that started it sees it (`RunStatus.children`)."""

    workflow_id: str
    tool: str
    call_id: str
    #: Its allowance (RunSettings.limits of the child: what it may spend at most).
    token_allowance: int
    usd_allowance: float | None = None
    #: "running", or its stop reason once it ended ("failed" if it failed instead).
    state: str = "running"
    total_tokens: int = 0
    cost_usd: float | None = None


class RunStatus(BaseModel):
    """The `status` query: counters, pending approvals and the event log."""

    status: Literal["running", "waiting_approval", "completed", "stopped"]
    reason: StopReason | None
    steps: int
    tool_executions: int
    total_tokens: int
    cost_usd: float | None
    pending: list[Approval]
    events: list[Event]
    question: str
    model: str
    limits: Limits | None = None
    #: The approvals remembered for the rest of this run (or of its session).
    grants: list[Grant] = Field(default_factory=list)
    #: The run's first execution run id (`Decision.run`): what a decision names as the
    #: run it was made for. Empty from a worker before it.
    run: str = ""
    #: The next request's input tokens as estimated against the context window
    #: (`limits.max_input_tokens`; boundloop.core.context); None without a window.
    context_tokens: int | None = Field(default=None, exclude_if=lambda v: v is None)
    #: Events of the log that came before `events` (a long run carries only its newest
    #: events across continue-as-new; the older ones are in its earlier runs' histories
    #: and its stream). `events[i]` is the run's event number `events_dropped + i`.
    events_dropped: int = Field(default=0, exclude_if=lambda v: not v)
    #: Of a sub-agent's run: where it is in its tree (root, parent, path).
    tree: TreePlace | None = Field(default=None, exclude_if=_none)
    #: The sub-agents this Temporal run started, in order (the earlier ones of a run that
    #: continued as new are in its event log: subagent_started / subagent_ended).
    children: list[ChildRun] = Field(default_factory=list, exclude_if=_empty)
    #: Summaries the run wrote of its conversation's oldest part (the `summarize` context
    #: strategy; each one a `context_summarized` event).
    summarized: int = Field(default=0, exclude_if=lambda v: not v)


# --- shared budgets (workflows/budget.py) ----------------------------------------------

BUDGET_WORKFLOW = "BoundloopBudget"
BUDGET_RESERVE_ACTIVITY = "budget_reserve"
BUDGET_CLOSED_RUNS_ACTIVITY = "budget_closed_runs"
#: A run's settlement and release, sent as updates by these activities (a workflow
#: cannot send an update itself; a signal racing the ledger's continue-as-new failed its
#: workflow task, and every update in flight with it).
BUDGET_SETTLE_ACTIVITY = "budget_settle"
BUDGET_RELEASE_ACTIVITY = "budget_release"
#: The local activity that admits a run under its worker's operator policy.
ADMIT_ACTIVITY = "admit_run"


class AdmitRequest(BaseModel):
    """What a run asks to be admitted with: its settings, tools and MCP declarations."""

    settings: RunSettings
    tools: list[str]
    mcp_tools: list[MCPToolDeclaration] = Field(default_factory=list)
    #: The run's search attributes with text values, as it was started with them (an
    #: operator's `budget.key_from` derives the budget key from them).
    search_attributes: dict[str, str] = Field(default_factory=dict)


#: A reserve activity's token: 128 random bits, hex.
Token = Annotated[str, Field(pattern=TOKEN_PATTERN)]


def budget_workflow_id(key: str) -> str:
    """The ledger of `key`: one long-running workflow per budget key."""
    return f"boundloop-budget-{key}"


def budget_key_of(workflow_id: str) -> str:
    """The key whose ledger has `workflow_id` (what the ledger answers for, whatever its
    start input says)."""
    return workflow_id.removeprefix(budget_workflow_id(""))


class LedgerInput(BaseModel):
    """Ledger workflow input (also what continue-as-new carries: the state is small).

    - reap_seconds: how often a ledger holding reservations checks that their runs are
      still open, releasing what closed runs (terminated, timed out) still hold.
    """

    state: LedgerState
    reap_seconds: float = Field(default=60.0, gt=0)


#: The longest run (workflow) id a budget ledger takes in a message: its state holds them.
RUN_ID_MAX = 512


class ReserveRequest(BaseModel):
    """Update `reserve`: hold the worst case of `run`'s request at `step`."""

    model_config = ConfigDict(extra="forbid")

    run: str = Field(min_length=1, max_length=RUN_ID_MAX)
    step: int = Field(ge=1)
    amount: Amount
    #: False when the run's model has no price: a USD-limited ledger refuses it.
    priced: bool = True
    #: The random token the run's reserve activity drew (None: a run of before claims):
    #: the ledger keeps its digest, and only a settle or release carrying it counts.
    token: Token | None = Field(default=None, exclude_if=_none)


class SettleRequest(BaseModel):
    """Update `settle_reservation` (signal `settle` from runs of before it): what `run`'s
    request at `step` really used, with the token it reserved with."""

    run: str = Field(min_length=1, max_length=RUN_ID_MAX)
    step: int = Field(ge=1)
    amount: Amount
    token: Token | None = Field(default=None, exclude_if=_none)


class ReleaseRequest(BaseModel):
    """Update `release_reservation` (signal `release`): `run` ended; what it holds goes
    back, if `token` is the one it reserved with."""

    model_config = ConfigDict(extra="forbid")

    run: str = Field(min_length=1, max_length=RUN_ID_MAX)
    token: Token | None = None


class BudgetSettle(BaseModel):
    """The run workflow's settle activity input."""

    key: str
    step: int
    amount: Amount
    token: Token | None = None


class BudgetRelease(BaseModel):
    """The run workflow's release activity input."""

    key: str
    token: Token | None = None


class SignedReset(BaseModel):
    """Update `reset`: an operator's recovery of a ledger (spent back to zero, runs'
    reservations dropped), signed by a budget admin where the workers have approver
    keys (`boundloop.core.signatures.budget_message`, purpose BUDGET_RESET_PURPOSE)."""

    model_config = ConfigDict(extra="forbid")

    reset: BudgetReset
    admin: ApproverName | None = None
    nonce: str | None = Field(default=None, min_length=16, max_length=64,
                              pattern=r"^[0-9a-f]+$")
    signature: Signature | None = None


class SignedLimits(BaseModel):
    """Update `set_signed_limits`: a budget admin's signed change of the ledger's limits
    (`boundloop.core.signatures.budget_message`)."""

    model_config = ConfigDict(extra="forbid")

    limits: BudgetLimits
    admin: ApproverName
    nonce: str = Field(min_length=16, max_length=64, pattern=r"^[0-9a-f]+$")
    signature: Signature


class BudgetReserve(BaseModel):
    """The run workflow's reserve activity input."""

    key: str
    step: int
    amount: Amount
    priced: bool


class BudgetView(BaseModel):
    """Query `show`: spent, reserved, left and the runs holding reservations."""

    key: str
    #: None: no limits set yet (every reservation is refused).
    limits: BudgetLimits | None
    period: str
    spent: Amount
    reserved: Amount
    left: Amount
    holders: list[Reservation]
    refused: int


# --- multi-turn sessions (workflows/session.py) ----------------------------------------

SESSION_WORKFLOW = "BoundloopSession"


class SessionInput(BaseModel):
    """Session workflow input (also what continue-as-new carries, with `state`).

    `settings` are each turn's model, run limits and policy; `limits` the session's.
    """

    instructions: PromptText | None = None
    settings: RunSettings
    tools: list[str]
    #: The declarations of the MCP tools among `tools` (each turn carries them).
    mcp_tools: list[MCPToolDeclaration] = Field(default_factory=list, exclude_if=_empty)
    limits: SessionLimits = Field(default_factory=SessionLimits)
    search_attributes: bool = True
    state: SessionState | None = None


class SayRequest(BaseModel):
    """Update `say`: the user's next message; the update returns the turn's RunResult."""

    model_config = ConfigDict(extra="forbid")

    message: PromptText = Field(min_length=1)


class SessionStatus(BaseModel):
    """Query `status` (`boundloop session show`), and the session's result when it ends."""

    session_id: str
    status: Literal["idle", "running", "ended"]
    ended: SessionEnd | None
    turns: int
    limits: SessionLimits
    #: The workflow id of the running turn (follow it with `boundloop watch`).
    current_turn: str | None
    last: TurnSummary | None
    steps: int
    tool_executions: int
    input_tokens: int
    output_tokens: int
    total_tokens: int
    tokens_left: int | None
    cost_usd: float | None
    #: When an idle session ends (ISO 8601 UTC); None while a turn runs or once ended.
    idle_until: str | None
    model: str
    #: Messages waiting for a turn (busy `queue` / `interrupt`).
    waiting: int = 0
    #: The approvals remembered for the rest of the session.
    grants: list[Grant] = Field(default_factory=list)
    #: The BoundloopTenant the session was started with (each turn carries it).
    tenant: str | None = None


# --- the live stream of a run (docs/streaming.md) --------------------------------------

#: The topic every item of a run's stream is published on.
STREAM_TOPIC = "boundloop"


class StreamEvent(BaseModel):
    """A record of the run's event log, as it is logged (the same records, in order)."""

    kind: Literal["event"] = "event"
    offset: int = 0  # set by the reader: the item's place in the stream
    event: Event


class TextDelta(BaseModel):
    """Answer text of `step` as the model writes it, batched (about every 100 ms).
    `attempt` names the activity attempt that wrote it."""

    kind: Literal["text"] = "text"
    offset: int = 0
    step: int
    attempt: str
    text: str


class Reset(BaseModel):
    """The text streamed so far for `step` is void (its attempt died or failed): drop
    it; a retried attempt streams the answer again. `attempt`: the attempt voided, None
    for every attempt of the step so far."""

    kind: Literal["reset"] = "reset"
    offset: int = 0
    step: int
    attempt: str | None = None


class StreamResult(BaseModel):
    """The end: the run's RunResult (the truth the stream is a view of)."""

    kind: Literal["result"] = "result"
    offset: int = 0
    result: RunResult


StreamItem = Annotated[StreamEvent | TextDelta | Reset | StreamResult,
                       Field(discriminator="kind")]
