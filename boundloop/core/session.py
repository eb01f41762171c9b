"""A session's decisions: pure, deterministic, no Temporal, no I/O.

A session holds one conversation across turns; each turn is one bounded run of the
loop (a child workflow). The session workflow (`workflows/session.py`) is a thin shell:
it asks here whether a message may start a turn, which limits the turn gets, how a
finished turn changes the session, and when the session ends.

How a turn continues the conversation: a run ends with a `Continuation` (the run that
holds the conversation up to its last model turn, by reference, plus the items the model
has not seen yet). The next turn starts from it, the way continue-as-new does
(docs/history.md), so no item is written to history twice.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from boundloop.core import envelope as env
from boundloop.core.conversation import ConversationMeta, ConversationRef, Item
from boundloop.core.envelope import Envelope
from boundloop.core.limits import Limits, PositiveInt, Seconds
from boundloop.core.reasons import StopReason
from boundloop.core.rules import Grant
from boundloop.core.turn import FunctionCall

#: Why a session ended: `boundloop session end` (requested), no message for `idle_seconds`, its
#: last allowed turn, or its token budget spent.
SessionEnd = Literal["requested", "idle", "max_turns", "token_budget"]
#: The envelope code of a call whose turn stopped before it ran.
NOT_RUN = "NOT_RUN"
#: What a message sent while a turn runs does: refused (the sender tries again later),
#: queued (it starts the next turn when this one ends), or interrupt (the running turn
#: stops at its next safe point and the next turn answers both messages).
Busy = Literal["refuse", "queue", "interrupt"]
#: Messages that may wait for a turn at once (queue and interrupt): beyond, refused.
MAX_WAITING = 10
#: The cancel reason of a turn stopped by a newer message (`interrupt`).
INTERRUPTED = "interrupted by a new message"


class SessionLimits(BaseModel):
    """Limits of a whole session (each turn also has the run `Limits`).

    - max_turns: turns per session; the session ends after the last one.
    - token_budget: known total tokens of all its turns. Each turn's `token_threshold`
      is at most what is left, so a turn that spends the rest stops with `usage_limit`;
      the session then ends (`token_budget`). None: no session-wide budget.
    - idle_seconds: the session ends when no turn ran for this long (a durable timer;
      a turn waiting for an approval is not idle).
    - busy: what a message sent while a turn runs does: `refuse` (the default),
      `queue` or `interrupt` (see `Busy`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_turns: PositiveInt = 100
    token_budget: PositiveInt | None = None
    idle_seconds: Seconds = 3600.0
    busy: Busy = "refuse"


class Continuation(BaseModel):
    """Where a conversation goes on: `base` holds it up to its last model turn (None when
    the model was never asked), `unsent` the items after it as a `ModelRequest`'s
    `new_items` carry them (a tool activity's output by `output_ref`), `conversation`
    the meta of base + unsent with every reference resolved."""

    model_config = ConfigDict(frozen=True)

    base: ConversationRef | None
    unsent: list[Item] = Field(default_factory=list)
    conversation: ConversationMeta


class TurnOf(BaseModel):
    """A run that is a session's turn: which session, which turn, and the conversation
    it continues (None for the first turn)."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    turn: int = Field(ge=1)
    follows: Continuation | None = None
    #: The approvals remembered for the session by its earlier turns; the turn applies
    #: those its own policy lets approvers decide (`session_grants`).
    grants: list[Grant] = Field(default_factory=list, exclude_if=lambda v: not v)


class TurnSummary(BaseModel):
    """The last turn, as `boundloop session show` prints it."""

    turn: int
    workflow_id: str
    reason: StopReason
    steps: int
    tool_executions: int
    total_tokens: int


class SessionState(BaseModel):
    """All a session carries (and hands on at continue-as-new): counters, the last turn,
    and the reference its next turn continues from. Small whatever the turn count."""

    #: Turns started (numbers the turns' workflow ids, so a failed turn's id is not reused).
    turns: int = 0
    steps: int = 0
    tool_executions: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    cost_usd: float | None = None
    last: TurnSummary | None = None
    follows: Continuation | None = None
    #: The approvals remembered for the session (by its turns), handed to each next turn.
    grants: list[Grant] = Field(default_factory=list, exclude_if=lambda v: not v)
    #: When the session became idle (ISO 8601 UTC, workflow time): its start, or the end
    #: of its last turn.
    idle_since: str
    ended: SessionEnd | None = None


def session_grants(grants: list[Grant], *, tools: list[str],
                   approvers: dict[str, list[str]], keys: dict[str, str]) -> list[Grant]:
    """The session's grants a turn applies: never wider than the turn's own policy, so
    only for its tools, by an approver it lets decide the tool, and (when decisions must
    be signed) one holding a key it accepts. A deny rule still denies, whatever is here."""
    return [g for g in grants if g.scope == "session" and g.tool in tools
            and (not approvers.get(g.tool) or g.approver in approvers[g.tool])
            and (not keys or g.approver in keys)]


def continued_by_itself(continued_run_id: str | None, cron_schedule: str | None,
                        attempt: int) -> bool:
    """Whether a run was started by its predecessor's own continue-as-new, the only door
    through which carried state (a run's counters and approvals, a session's grants and
    conversation) may arrive. Temporal sets `continued_run_id` for a cron schedule's next
    run and a workflow retry as well, each with the input its starter wrote; boundloop
    starts its workflows with neither, and continue-as-new starts attempt 1."""
    return continued_run_id is not None and not cron_schedule and attempt == 1


def turn_id(session_id: str, turn: int) -> str:
    """A turn's workflow id: idempotency keys are scoped by it, so they differ per turn."""
    return f"{session_id}/turn-{turn}"


def owns_turn(turn: TurnOf, parent_id: str | None, workflow_id: str) -> bool:
    """Whether the run `workflow_id`, started as a child of `parent_id` (None: by a client),
    is the turn `turn` names: the session's own child under the session's turn id, whose
    conversation is held by a turn of the same session. Only such a run may continue a
    conversation (a starter naming another run's would have the model read it)."""
    if parent_id != turn.session_id or workflow_id != turn_id(turn.session_id, turn.turn):
        return False
    base = turn.follows.base if turn.follows is not None else None
    return base is None or (is_turn_id(base.workflow_id)
                            and base.workflow_id.rpartition("/turn-")[0] == turn.session_id)


def is_turn_id(workflow_id: str) -> bool:
    """Whether `workflow_id` has the form of a session's turn (`SESSION/turn-N`): such ids
    belong to the session, which starts its turns under them, so no run may take one."""
    head, sep, number = workflow_id.rpartition("/turn-")
    return bool(head and sep and number.isdigit() and number.isascii())


def tokens_left(state: SessionState, limits: SessionLimits) -> int | None:
    if limits.token_budget is None:
        return None
    return max(limits.token_budget - state.total_tokens, 0)


def end_reason(state: SessionState, limits: SessionLimits) -> SessionEnd | None:
    """Whether the session is done after its last turn (None: it takes more messages)."""
    if state.ended is not None:
        return state.ended
    if state.turns >= limits.max_turns:
        return "max_turns"
    if tokens_left(state, limits) == 0:
        return "token_budget"
    return None


def refusal(state: SessionState, limits: SessionLimits, running: str | None,
            waiting: int = 0) -> str | None:
    """Why a new message cannot be taken now (None: it can). With `busy: refuse` a
    message is refused while a turn runs; with `queue` or `interrupt` it waits its turn
    (at most MAX_WAITING at once). Each sender gets its own turn's answer from `say`."""
    if running is not None and limits.busy == "refuse":
        return (f"turn {running} is still running; send the next message when it has "
                "ended (`boundloop watch` follows it), or start the session with "
                "busy `queue` or `interrupt`")
    if waiting >= MAX_WAITING:
        return f"{waiting} messages already wait for a turn; send this one later"
    ended = end_reason(state, limits)
    if ended is None and waiting and state.turns + waiting >= limits.max_turns:
        ended = "max_turns"  # the turns left are taken by the messages already waiting
    if ended is not None:
        return f"the session has ended (reason: {ended}); start a new one"
    return None


def turn_limits(limits: Limits, session: SessionLimits, state: SessionState) -> Limits:
    """A turn's limits: the run limits, with `token_threshold` shrunk to what is left of
    the session's token budget."""
    left = tokens_left(state, session)
    if left is None or left >= limits.token_threshold:
        return limits
    return limits.model_copy(update={"token_threshold": left})


def record_turn(state: SessionState, summary: TurnSummary, *, input_tokens: int,
                output_tokens: int, cost_usd: float | None, follows: Continuation,
                now: str) -> None:
    """A turn ended with a RunResult: add its counts; the next turn continues from it."""
    state.steps += summary.steps
    state.tool_executions += summary.tool_executions
    state.input_tokens += input_tokens
    state.output_tokens += output_tokens
    state.total_tokens += summary.total_tokens
    if cost_usd is not None:
        state.cost_usd = round((state.cost_usd or 0.0) + cost_usd, 8)
    state.last = summary
    state.follows = follows
    state.idle_since = now


def not_run(reason: StopReason) -> Envelope:
    """The output of a call whose turn stopped before it ran: every `function_call` needs
    one `function_call_output` before the next request (Responses API; Chat pairs tool
    messages the same way), and the model should know the call did nothing."""
    return env.blocked(NOT_RUN, f"This call did not run: the previous turn stopped "
                                f"({reason.value}) before it. Nothing was changed.")


def closing_outputs(calls: list[FunctionCall],
                    answered: dict[str, tuple[Envelope, str | None]],
                    reason: StopReason) -> list[tuple[str, Envelope, str | None]]:
    """(call_id, envelope, idempotency key when the output is a tool activity's result)
    for each call of the last model turn that has no output in the conversation yet: the
    real output when the call ran before the turn stopped (a side effect is never
    reported as not done), else `not_run`."""
    return [(c.call_id, *answered.get(c.call_id, (not_run(reason), None))) for c in calls]
