"""Errors: the exceptions tool authors raise, and every Temporal error type name the
workflow matches on (defined once here, so a rename cannot miss one place).
"""

from __future__ import annotations

from boundloop.core.envelope import Envelope, ToolStatus

# --- error type names (ApplicationError.type) -----------------------------------------

#: The SDK's own type for a completion over the payload limit (plural, as the SDK spells
#: it); the limit is boundloop.core.limits.PAYLOAD_LIMIT_BYTES.
PAYLOADS_TOO_LARGE = "PayloadsTooLarge"
#: A model response too large to return from the model activity (ours).
MODEL_RESPONSE_TOO_LARGE = "ModelResponseTooLarge"
#: A 4xx other than 408/409/429: key, model or request refused; never retried.
MODEL_REQUEST_REJECTED = "ModelRequestRejected"
#: 408/409/429/5xx, connection failures and provider timeouts: retried.
MODEL_REQUEST_RETRYABLE = "ModelRequestRetryable"
#: The model activity failed in our own code (not the provider): counted as an attempt.
MODEL_ACTIVITY_FAILED = "ModelActivityFailed"
#: The rebuilt conversation does not match what the workflow expects.
CONVERSATION_MISMATCH = "ConversationMismatch"
#: A tool raised `TransientToolError`: retried.
TRANSIENT_TOOL_ERROR = "TransientToolError"
#: A tool ran past its timeout (the tool activity's own, so not a lost worker): retried.
TOOL_TIMED_OUT = "ToolTimedOut"
#: A tool raised something unexpected: the run stops with `tool_error`.
UNEXPECTED_TOOL_ERROR = "UnexpectedToolError"
#: An approval decision the `decide` update's validator refused.
INVALID_DECISION = "InvalidDecision"
#: A budget ledger message its validator refused.
INVALID_BUDGET_MESSAGE = "InvalidBudgetMessage"
#: A change of a budget's limits the ledger refused: unsigned, or not by a budget admin.
BUDGET_UNSIGNED = "BudgetChangeRefused"
#: A run that ended for any reason but `completed`: the workflow fails with this
#: non-retryable type so Temporal's own status (the Web UI list) shows it; the message
#: names the stop reason and the first detail is the RunResult (`client.result_of`).
RUN_STOPPED = "RunStopped"
#: A run named tools its worker's toolset does not have: the run fails at once.
UNKNOWN_TOOLS = "UnknownTools"
#: A run asked for settings looser than its worker's operator policy: it ends before
#: any model request; the details are the refusals (boundloop.core.operator.Refusal).
POLICY_REFUSED = "PolicyRefused"
#: The worker that took a tool call does not serve that tool (renamed or removed since
#: the run started): never retried; the run stops with `tool_unavailable`.
TOOL_UNAVAILABLE = "ToolUnavailable"
#: The worker serves the tool with an argument schema the run's call no longer fits (a
#: compatible change runs the call): like TOOL_UNAVAILABLE, with the mismatch named.
TOOL_ARGUMENTS_CHANGED = "ToolArgumentsChanged"
#: The failure type Temporal's SDK gives an activity attempt its worker stopped while it
#: ran (a graceful shutdown, as a deploy does): a lost worker, never a counted failure.
WORKER_SHUTDOWN = "WorkerShutdown"
#: A session refused a message or an end (a turn is running, the session has ended).
SESSION_REFUSED = "SessionRefused"
#: A session's turn ended without a RunResult (terminated, its tools not served).
TURN_FAILED = "TurnFailed"


# --- exceptions boundloop raises -------------------------------------------------------


class BoundloopError(Exception):
    """Base of the errors boundloop's API raises (not of those tools raise)."""


class ToolDefinitionError(BoundloopError, ValueError):
    """A tool declaration boundloop cannot serve (raised when it is registered)."""


class DecisionRefused(BoundloopError):
    """The run refused an approval decision (unknown or already decided call id, an
    approver outside the allow-list, edited arguments that fail the schema); nothing
    changed. The message says why."""


class RunStuck(BoundloopError):
    """The run's workflow task keeps failing (a deploy it does not replay, a missing codec
    key, a bug): `line` says since when, the cause and what fixes it. With `recorded`, the
    decision was delivered as a signal: it is in the run's history and takes effect once a
    healthy worker serves the run (if the call still waits for a decision then); without,
    nothing was sent."""

    def __init__(self, message: str, *, line: str, recorded: bool) -> None:
        super().__init__(message)
        self.line = line
        self.recorded = recorded


class InvalidDecision(BoundloopError, ValueError):
    """A decision malformed in itself (a `when` without `remember`, a condition that does
    not parse, a name or reason too long): refused before it is sent; nothing changed."""


class SessionRefused(BoundloopError):
    """The session refused a message (a turn is still running); nothing changed. The
    message says why."""


class RunNotFound(BoundloopError, LookupError):
    """No run (or session) has this workflow id in the namespace."""


class RunEnded(BoundloopError):
    """The run (or session) has ended: it takes no more decisions, messages, ends or
    cancels; nothing changed. Its result is still there to read."""


class UnknownTools(BoundloopError):
    """The run named tools its worker does not serve: the worker refused it before any
    model request. The message names them and the tools served."""


class RunIdTaken(BoundloopError):
    """A run or session with this workflow id exists already (ids are never reused: they
    scope the idempotency keys of side effects)."""



#: How the message of a PolicyRefused failure begins (the refusals follow).
REFUSES = "the operator's policy refuses this run: "


class PolicyRefused(BoundloopError):
    """The worker's operator policy refused the run's settings before it started:
    `refusals` names each field, what the run asked and the operator's value."""

    def __init__(self, message: str, refusals: list[dict[str, str]]) -> None:
        super().__init__(message)
        self.refusals = refusals

    def lines(self) -> list[str]:
        if not self.refusals:  # read without the codec keys: the message alone
            return [str(self).removeprefix(REFUSES)]
        return [f"{r['field']}: the run asked {r['asked']}; the operator's policy: "
                f"{r['operator']}" for r in self.refusals]


class BudgetRefused(BoundloopError):
    """The ledger refused a change of its limits (unsigned where approver keys are
    configured, not signed by a budget admin, or a signature used already); nothing
    changed. The message says why."""


class PolicyNamesUnservedTools(BoundloopError, ValueError):
    """The operator's policy names a tool (or a glob) no tool of the worker matches: the
    worker refuses to start rather than serve runs under a rule that applies to nothing.
    The message names each such entry and the tools served."""


class TemporalUnreachable(BoundloopError, ConnectionError):
    """`boundloop.connect` could not reach Temporal (connection refused, a name that does
    not resolve, a timeout) or the server refused the TLS connection. The message says
    where and why in one line."""


def worker_hint(task_queue: str) -> str:
    """What to start when no worker answers for a run on `task_queue`: the queue named,
    whoever's worker serves it."""
    return (f"start a worker polling task queue {task_queue!r} (`boundloop worker` with "
            f"BOUNDLOOP_TASK_QUEUE={task_queue}, or your own worker of an agent with "
            f"task_queue={task_queue!r})")


class NoWorker(BoundloopError, TimeoutError):
    """No worker answered for the run within the time allowed (a query or a decision
    needs one; the server keeps the run). `task_queue` is the queue a worker must poll.
    With `recorded`, the decision was delivered as a signal: it is in the run's history
    and takes effect when a worker picks the run up (if the call still waits then);
    without, nothing was sent."""

    def __init__(self, message: str, *, task_queue: str, recorded: bool = False) -> None:
        super().__init__(message)
        self.task_queue = task_queue
        self.recorded = recorded


class NoToolset(BoundloopError):
    """No toolset is registered for a worker's task queue in this process."""


# --- exceptions tools raise -----------------------------------------------------------


class ToolFailure(Exception):
    """An expected failure the model can act on (not found, permission, bad state)."""

    def __init__(self, status: ToolStatus, error_code: str, message: str,
                 *, retryable: bool = False) -> None:
        super().__init__(error_code)
        self.envelope = Envelope(status=status, error_code=error_code, message=message,
                                 retryable=retryable)


class TransientToolError(Exception):
    """A failure worth retrying (timeout, 503 upstream): Temporal retries with backoff."""
