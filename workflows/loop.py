"""The BoundLoop workflow: a thin Temporal shell around `boundloop.core.loop`.

Each model request and each tool execution is one activity; the counters, the
identical-call table and pending approvals live in workflow state. The
conversation itself is written to history once and rebuilt by the model activity
from references (docs/history.md).
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.contrib.workflow_streams import WorkflowStream
from temporalio.contrib.workflow_streams._types import PublisherState
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    FailureError,
    RetryState,
    TimeoutError,
    TimeoutType,
    is_cancelled_exception,
)

from boundloop.workflows import SANDBOXED
from boundloop.workflows.budget import (
    RELEASE_WAIT,
    RUN_MESSAGES_BY_UPDATE,
    SETTLE_WAIT,
    BudgetLedgerWorkflow,
)

with workflow.unsafe.imports_passed_through():
    from boundloop import errors
    from boundloop import search_attributes as sa
    from boundloop.contracts import (
        ADMIT_ACTIVITY,
        BUDGET_RELEASE_ACTIVITY,
        BUDGET_RESERVE_ACTIVITY,
        BUDGET_SETTLE_ACTIVITY,
        EARLIER_CALLS_ACTIVITY,
        MODEL_ACTIVITY,
        OUTPUT_REF,
        STREAM_TOPIC,
        TOOL_ACTIVITY,
        WORKFLOW_NAME,
        AdmitRequest,
        BudgetRelease,
        BudgetReserve,
        BudgetSettle,
        CancelRequest,
        Carried,
        ConversationRef,
        Decision,
        ModelRequest,
        ReleaseRequest,
        Reset,
        RunInput,
        RunResult,
        RunStatus,
        SettleRequest,
        StreamEvent,
        StreamResult,
        TextDelta,
        ToolRequest,
        budget_workflow_id,
    )
    from boundloop.core import approvals, carry, mcp_tools, retries, routing, signatures
    from boundloop.core import budget as shared
    from boundloop.core import context as ctx
    from boundloop.core import loop as core
    from boundloop.core import model_failures as mf
    from boundloop.core import session as sessions
    from boundloop.core.budget import Amount, Grant
    from boundloop.core.canonical import preview
    from boundloop.core.conversation import (
        ConversationMeta,
        Item,
        function_call_output,
        user_message,
    )
    from boundloop.core.envelope import Envelope, temporary_error_exhausted, tool_timed_out
    from boundloop.core.limits import MAX_PAYLOAD_VALUE_BYTES, payload_bytes
    from boundloop.core.mcp_tools import MCPToolDeclaration
    from boundloop.core.operator import Admission, Refusal, unknown_tools_line
    from boundloop.core.reasons import NEXT_CHECK, StopReason
    from boundloop.core.turn import FunctionCall, Turn
    from boundloop.tools import catalog

#: Both activities heartbeat every second: an attempt whose worker died is noticed
#: within this and retried by Temporal (not counted), and a cancel reaches the attempt.
HEARTBEAT_TIMEOUT = timedelta(seconds=5)
#: Start-to-close beyond the provider's or tool's own timeout (which the activity
#: enforces and reports as a counted failure): only a wedged worker reaches it.
WEDGED_MARGIN = 10.0
#: The patch under which failures are counted by the workflow (runs that started before
#: it had Temporal count them, and stopped at the first failure Temporal returned).
COUNTED_RETRIES = "counted-retries"
#: The patch under which a stopped run withdraws the approvals still pending (before it,
#: a run cancelled while waiting kept reporting one pending).
WITHDRAWN_ON_STOP = "withdrawn-on-stop"
#: The patch under which a run is first admitted under its worker's operator policy
#: (the `admit_run` local activity, recorded once; docs/security.md).
OPERATOR_POLICY = "operator-policy"
#: The patch under which continue-as-new hands the admitted tool rules to the next run
#: (before it, the next run read them from its worker's toolset: a rename stranded it).
CARRIED_RULES = "carried-rules"
#: A run whose input carries state it was not handed by continue-as-new is refused.
CARRIED_BY_CONTINUE = "carried-by-continue"
#: A run whose input continues a conversation (`turn.follows`) is refused unless the
#: session that owns that turn started it as its child.
TURN_FOLLOWS_OWNED = "turn-follows-owned"
#: The patch under which the search attributes are upserted only when the status, stop
#: reason or pending approvals change (the counters ride along; current details show
#: them live): before it, every step's new count was one more event in history.
SPARSE_UPSERTS = "sparse-upserts"
#: The patch under which a run naming tools its worker does not serve is refused in a
#: sentence naming them and the tools served (`operator.unknown_tools_line`).
UNKNOWN_TOOLS_NAMED = "unknown-tools-named"
#: The patch under which a tool served with another argument schema than the run was
#: admitted with is decided by the admitted rules, and its calls carry the admitted
#: schema's digest (the tool activity refuses a call whose schema changed).
ADMITTED_SCHEMAS = "admitted-schemas"
#: The patch under which the admission is given the run's search attributes (an
#: operator's `budget.key_from` derives the budget key from them).
ADMIT_ATTRIBUTES = "admit-search-attributes"
#: The patch under which a short read-only tool runs as a local activity
#: (`boundloop.core.loop.runs_locally`; before it, every tool was a regular activity).
LOCAL_TOOLS = "local-tools"
#: The patch under which a session's turn takes the approvals remembered for the session
#: by its earlier turns (within its own policy), accepts decisions remembered for the
#: session, and hands them back in its RunResult.
SESSION_GRANTS = "session-grants"
#: The patch under which a run's activities go to the holder's own queue only when the
#: shared queue does not put them where the conversation is (`routing.follows_holder`):
#: before it, every activity after the first model turn went to the holder's queue.
ROUTE_WHEN_NEEDED = "route-when-needed"
#: Every patch above, asked as one. Each patch asked is a marker event and an upsert of
#: `TemporalChangeVersion` (a visibility write on the server): 12 events of a new run's
#: history went to the six it asked. A run started under this patch takes every patch
#: of BUNDLED_PATCHES without asking it; a run that started before it (no marker in its
#: history) asks them one by one as it did. A patch added later is asked on its own (or
#: goes in a new bundle, asked first beside this one).
BUNDLED = "bundled-patches-0.3"
BUNDLED_PATCHES = frozenset({
    COUNTED_RETRIES, WITHDRAWN_ON_STOP, OPERATOR_POLICY, CARRIED_RULES, CARRIED_BY_CONTINUE,
    TURN_FOLLOWS_OWNED, SPARSE_UPSERTS, UNKNOWN_TOOLS_NAMED, ADMITTED_SCHEMAS,
    ADMIT_ATTRIBUTES, LOCAL_TOOLS, SESSION_GRANTS, ROUTE_WHEN_NEEDED})
#: The patch under which carried state is refused from a run a cron schedule or a
#: workflow retry started: the server sets `continued_run_id` on those too, with the
#: input of the first run (a starter's), not one handed over by continue-as-new.
CARRIED_GENUINE = "carried-genuine"
#: The patch under which a decision must name the run (first execution run id) and the
#: arguments' fingerprint its approver was shown (`approvals.changed`).
DECISIONS_BOUND = "decisions-bound"
#: The patch under which tool idempotency keys are scoped by the run's first execution
#: run id, not the workflow id alone: a new run under a reused workflow id never shares a
#: key with an earlier run, while continue-as-new, a reset and a crash keep them.
RUN_SCOPED_KEYS = "run-scoped-keys"
#: The patch under which a tool asks for approval when either the rules the run was
#: admitted with or the serving worker's rules say so (a deploy never loosens an open
#: run's approvals; a tightening applies at once).
STRICTER_APPROVALS = "stricter-approvals"
#: The next bundle: every patch of BUNDLED_PATCHES and those above, asked as one marker
#: by a run that starts under it (instead of BUNDLED).
BUNDLED_04 = "bundled-patches-0.4"
#: The patch under which the workflow alone retries a model request (Temporal never
#: does: a lost worker's attempt is retried without counting, a start-to-close timeout
#: counts as a timeout), the activity bounds the whole answer (model_answer_seconds,
#: start-to-close follows it), every attempt that reached the provider is charged to
#: the run and its shared budget (usage, else the worst case), each retry is a
#: `model_retried:<kind>` event, and the stream gets what of the answer's text the
#: activity did not send (docs/streaming.md). In BUNDLED_04 (a run that started before it
#: asks it on its own).
CHARGED_ATTEMPTS = "charged-model-attempts"
BUNDLED_04_PATCHES = BUNDLED_PATCHES | {CARRIED_GENUINE, DECISIONS_BOUND, RUN_SCOPED_KEYS,
                                        STRICTER_APPROVALS, CHARGED_ATTEMPTS}
#: The patch under which a run stops `context_exhausted` before a request that would not
#: fit its context window (`core.context.check`, `limits.max_input_tokens`), and when
#: the provider refuses a request as over the window (before it: `model_error`). Asked
#: on its own, and only when the run stops so.
CONTEXT_WINDOW = "context-window"
#: The patch under which a response that used every output token its request allowed
#: ends the run `incomplete` whatever its status says (`core.cut_at_the_cap`): before
#: it, such a response reported `completed` was the answer. Asked on its own, and only
#: when a response reached the cap.
CUT_AT_THE_CAP = "cut-at-the-output-cap"
#: The patch under which continue-as-new hands over a state of constant size
#: (`boundloop.core.carry`): the whole-run tables as a segment the next runs look up by
#: reference, the newest events and model attempts only, the stream's newest items; and
#: a run continues as new once its tables reach `carry.SEGMENT_MAX` keys. Asked on its
#: own, and only when the run first continues as new (or its tables are full).
CONSTANT_CARRY = "constant-carry"


def _worker_lost(counted: list[str]) -> RetryPolicy:
    """Temporal retries only attempts lost to our own workers (heartbeat or start-to-close
    timeouts), without limit: schedule-to-close, the time left before the run's deadline,
    bounds them. Every failure type the activity raises is the workflow's to count
    (boundloop.core.retries), so a crash never uses up an attempt."""
    # 1 s apart, no growth: the heartbeat timeout already spaces lost attempts.
    return RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=1.0,
                       maximum_attempts=0,
                       non_retryable_error_types=[*counted, errors.PAYLOADS_TOO_LARGE])


#: Provider failures (HTTP, connection, provider timeout) and failures of our own code,
#: each counted against MODEL_BACKOFF; the others end the request at once.
MODEL_RETRYABLE = (errors.MODEL_REQUEST_RETRYABLE, errors.MODEL_ACTIVITY_FAILED)
MODEL_RETRY = _worker_lost([*MODEL_RETRYABLE, errors.MODEL_REQUEST_REJECTED,
                            errors.MODEL_RESPONSE_TOO_LARGE, errors.CONVERSATION_MISMATCH])
#: Under CHARGED_ATTEMPTS: one attempt per activity; the workflow retries it.
MODEL_ONCE = RetryPolicy(maximum_attempts=1)
#: A tool's own failures, each counted against the tool's attempts.
TOOL_RETRYABLE = (errors.TRANSIENT_TOOL_ERROR, errors.TOOL_TIMED_OUT,
                  errors.UNEXPECTED_TOOL_ERROR)
TOOL_RETRY = _worker_lost(list(TOOL_RETRYABLE))


#: An activity sent to the worker that holds the run's conversation (its own task queue)
#: gets one attempt, which waits this long at most to start: then, or if the worker is
#: lost while running it, the activity goes to the shared queue (core/routing.py).
HOLDER_START_TIMEOUT = timedelta(seconds=5)
HOLDER_RETRY = RetryPolicy(maximum_attempts=1)

_R = TypeVar("_R")


#: Event names of a model attempt that failed and was sent again start with this; the
#: failure's kind follows (`worker_lost` for an attempt lost with its request sent).
MODEL_RETRIED = "model_retried:"
#: Text of one `TextDelta` the workflow publishes (as the activity's pieces).
STREAM_PIECE = 4096

#: Failure kinds of model activity errors that carry no `ModelFailure` of their own.
MODEL_FAILURES = {
    errors.MODEL_RESPONSE_TOO_LARGE: mf.PAYLOAD_TOO_LARGE,  # over Temporal's payload limit
    errors.PAYLOADS_TOO_LARGE: mf.PAYLOAD_TOO_LARGE,
    errors.CONVERSATION_MISMATCH: mf.CONVERSATION_MISMATCH,
    errors.MODEL_ACTIVITY_FAILED: mf.WORKER_ERROR,  # our own code failed (worker log)
}


@workflow.defn(name=WORKFLOW_NAME, sandboxed=SANDBOXED)
class BoundLoopWorkflow:
    @workflow.init
    def __init__(self, inp: RunInput) -> None:
        self._inp = inp
        # The toolset and approver keys of this worker's task queue (registered by the
        # boundloop plugin; the catalog is passed through the sandbox, so it is the
        # worker's own table).
        served = catalog.served_on(workflow.info().task_queue)
        self._toolset = served.toolset
        # MCP tools come with their declarations in the input (never from a server now).
        self._mcp = {d.name: d for d in inp.mcp_tools if d.name in inp.tools}
        self._unknown = self._toolset.unknown([t for t in inp.tools if t not in self._mcp])
        self._rules = {
            **self._toolset.rules([t for t in inp.tools
                                   if t not in self._unknown and t not in self._mcp]),
            **{name: mcp_tools.tool_rule(d) for name, d in self._mcp.items()}}
        carried = inp.carried
        # The rules the run was admitted with, handed on by continue-as-new.
        self._admitted = list(carried.tools) if carried is not None else []
        self._digests: dict[str, str] = {}  # tool -> its admitted schema's digest
        # Function tools this worker does not serve as the run was admitted with them
        # (renamed, removed or reshaped by a deploy): model requests describe them by
        # the admitted declaration, never by this worker's toolset.
        self._described: dict[str, MCPToolDeclaration] = {}
        self._keep_admitted()
        if carried is not None:
            self._state = carried.state
            self._offer_recall()
            self._unsent: list[Item] = list(carried.unsent)
            self._base: ConversationRef | None = carried.base
            self._sent = carried.base.meta
            self._processing_before = carried.processing_seconds
        else:
            self._state = core.LoopState(settings=inp.settings, allowed_tools=list(inp.tools))
            self._unsent = []
            self._base = None
            self._sent = ConversationMeta()
            self._processing_before = 0.0
            follows = inp.turn.follows if inp.turn is not None else None
            if follows is not None:  # a session's next turn: its conversation so far
                self._state.conversation = follows.conversation
                self._unsent = list(follows.unsent)
                self._base = follows.base
                self._sent = follows.base.meta if follows.base else ConversationMeta()
        # The last model turn's calls that have no output in the conversation yet, and
        # the outputs they got so far: a session's next turn answers each of them.
        self._open_calls: list[FunctionCall] = []
        self._answered: dict[str, tuple[Envelope, str | None]] = {}
        self._turn_returned = False  # a model turn of this run is in history
        self._waited = 0.0  # approval waits of this run (excluded from processing time)
        self._published: tuple[object, ...] = ()
        self._bundled = False  # BUNDLED (or BUNDLED_04), asked first when the run starts
        self._bundled_04 = False  # BUNDLED_04
        self._decisions_bound = False  # DECISIONS_BOUND, decided when the run starts
        # What tool idempotency keys are scoped by (RUN_SCOPED_KEYS), set when it starts.
        self._key_scope = workflow.info().workflow_id
        self._sparse_upserts = False  # SPARSE_UPSERTS, decided when the run starts
        self._session_grants = False  # SESSION_GRANTS, decided when the run starts
        self._refs: dict[str, str] = {}  # call_id -> idempotency key of its tool output
        self._started = workflow.now()
        self._cancel_reason: str | None = None
        self._interrupted: str | None = None  # the `interrupt` signal's reason
        self._model_in_flight = False  # a cancel now leaves the step unfinished
        # The own task queue of the worker whose cache holds the conversation (named by
        # the last model turn); None: the shared queue.
        self._holder: str | None = None
        # Whether activities go to the holder's queue (before ROUTE_WHEN_NEEDED: always),
        # and whether a model request sent to the shared queue while a holder was named
        # did not find the conversation there (then the run follows the holder).
        self._follow = True
        self._shared_missed = False
        self._routing = False  # ROUTE_WHEN_NEEDED, decided at the first turn naming a holder
        # Approver public keys: the worker's (like its toolset) and the run policy's.
        self._keys = signatures.run_keys(served.approver_keys,
                                         self._state.policy.approver_keys)
        self._reserved = Amount()  # the shared budget's hold for the request in flight
        self._budget_token: str | None = None  # what the hold was reserved with
        self._settling: asyncio.Task[None] | None = None  # the settle signal in flight
        # The live stream (docs/streaming.md): a view of the event log, the model's text
        # (published by the model activity) and the end. Publishing here adds nothing to
        # history; it is carried through continue-as-new.
        self._stream = WorkflowStream(prior_state=carried.stream if carried else None)
        self._topic = self._stream.topic(STREAM_TOPIC)
        self._streamed = len(self._state.events) if carried is not None else 0

    # --- run -----------------------------------------------------------------------

    @workflow.run
    async def run(self, inp: RunInput) -> RunResult:
        # The first command of a new run: every later patch check reads it.
        self._bundled_04 = workflow.patched(BUNDLED_04)
        self._bundled = self._bundled_04 or workflow.patched(BUNDLED)
        # Asked here, before any local activity: asked after one, a query that replays
        # the run could see the marker one workflow task early.
        self._charged = self._patched(CHARGED_ATTEMPTS)
        cancelled_first = False
        info = workflow.info()
        if inp.carried is not None and (
                (info.continued_run_id is None and self._patched(CARRIED_BY_CONTINUE))
                or (not sessions.continued_by_itself(info.continued_run_id,
                                                     info.cron_schedule, info.attempt)
                    and self._patched(CARRIED_GENUINE))):
            # Carried state skips the admission (it was admitted before continue-as-new):
            # only the run's own continue-as-new may hand it over, never a starter (a cron
            # schedule or a workflow retry starts the next run with the starter's input).
            _refuse(Refusal(field="carried", asked="a run state of its own",
                            operator="carried state comes only from the run's own "
                                     "continue-as-new (never a cron schedule or a "
                                     "retry): start the run without it"))
        if (inp.carried is None and inp.turn is not None and inp.turn.follows is not None
                and not sessions.owns_turn(inp.turn, info.parent.workflow_id
                                           if info.parent is not None else None,
                                           info.workflow_id)
                and self._patched(TURN_FOLLOWS_OWNED)):
            # The model would read the conversation it names (another run's, another
            # tenant's): only the session that owns the turn hands one on.
            _refuse(Refusal(field="turn.follows", asked="a conversation to continue",
                            operator="only a session continues a conversation, in the "
                                     "turns it starts: start the run without `turn`"))
        # Asked first, so its marker goes in the first workflow task with the others.
        self._sparse_upserts = inp.search_attributes and self._patched(SPARSE_UPSERTS)
        # Asked first, with the run's first commands: a patch asked right after the
        # admission's local activity is asked in another workflow task on replay.
        own_schemas = self._patched(ADMITTED_SCHEMAS)
        stricter = self._patched(STRICTER_APPROVALS)
        self._decisions_bound = self._patched(DECISIONS_BOUND)
        self._key_scope = (f"{info.workflow_id}/{info.first_execution_run_id}"
                           if self._patched(RUN_SCOPED_KEYS) else info.workflow_id)
        # Asked of turns only: runs that are no session's turn never see this patch.
        self._session_grants = inp.turn is not None and self._patched(SESSION_GRANTS)
        if inp.carried is None and self._patched(OPERATOR_POLICY):
            # The admission (in history) says which tools were unknown when it started.
            try:
                await self._admit(inp)
            except (asyncio.CancelledError, ActivityError) as err:
                if isinstance(err, ActivityError) and not is_cancelled_exception(err):
                    raise
                cancelled_first = True  # a cancel before the run began: it ends cancelled
        elif self._unknown:
            self._refuse_unknown(self._unknown)
        if own_schemas:
            self._own_schemas()
        if stricter:
            self._ask_as_admitted()
        if inp.carried is None and self._session_grants:
            self._inherit_grants(inp)
        if inp.carried is None:
            first = [user_message(inp.question)]
            self._unsent = [*self._unsent, *first]
            self._state.conversation = self._state.conversation.extend(first)
            self._state.log("run_started")
        try:
            reason = (core.cancelled(self._state, self._cancel_reason, step_unfinished=False)
                      if cancelled_first else await self._loop())
        except asyncio.CancelledError:
            reason = core.cancelled(self._state, self._cancel_reason,
                                    step_unfinished=self._model_in_flight)
        if reason is None:  # continue-as-new was requested
            await self._settled()
            self._stream_events()
            self._stream.detach_pollers()  # readers follow to the next run
            await workflow.wait_condition(workflow.all_handlers_finished)
            carry = self._carry()
            reason = core.check_payload(self._state, "carried_state", payload_bytes(carry))
            if reason is None:
                workflow.continue_as_new(carry)
        if approvals.pending_count(self._state) and self._patched(WITHDRAWN_ON_STOP):
            approvals.withdraw(self._state)
        await self._release_budget()
        self._publish()
        workflow.logger.info("run stopped", extra={"reason": reason.value,
                                                   "step": self._state.steps})
        self._stream_events()
        self._stream.detach_pollers()  # waiting readers return; they read the end closed
        await workflow.wait_condition(workflow.all_handlers_finished)
        result = self._result()
        self._topic.publish(StreamResult(result=result))
        if reason != StopReason.COMPLETED:
            # Temporal's own status says the run did not succeed (the Web UI list shows
            # it Failed, not green Completed); the RunResult rides along as the detail.
            # A cancelled run ends this way too: the SDK's Canceled carries no details.
            raise ApplicationError(f"run stopped: {reason.value} — {NEXT_CHECK[reason]}",
                                   result, type=errors.RUN_STOPPED, non_retryable=True)
        return result

    def _refuse_unknown(self, unknown: list[str]) -> NoReturn:
        raise ApplicationError(f"the worker's toolset has no tools {unknown}; it has "
                               f"{self._toolset.names()}", type=errors.UNKNOWN_TOOLS,
                               non_retryable=True)

    async def _admit(self, inp: RunInput) -> None:
        """The run's effective settings under the worker's operator policy, resolved once
        by a local activity whose result is in history (replay and continue-as-new, which
        carries the settings in the state, never ask the worker's current policy)."""
        # As the run was started (the workflow upserts only its own Boundloop* ones).
        attributes = ({pair.key.name: pair.value
                       for pair in workflow.info().typed_search_attributes
                       if isinstance(pair.value, str)}
                      if self._patched(ADMIT_ATTRIBUTES) else {})
        admission = await workflow.execute_local_activity(
            ADMIT_ACTIVITY, AdmitRequest(settings=inp.settings, tools=list(inp.tools),
                                         mcp_tools=list(self._mcp.values()),
                                         search_attributes=attributes),
            result_type=Admission, start_to_close_timeout=timedelta(seconds=10))
        if admission.unknown:
            if self._patched(UNKNOWN_TOOLS_NAMED):
                raise ApplicationError(
                    unknown_tools_line(admission.unknown, admission.served,
                                       workflow.info().task_queue),
                    type=errors.UNKNOWN_TOOLS, non_retryable=True)
            self._refuse_unknown(admission.unknown)
        if admission.settings is None:
            raise ApplicationError(
                "the operator's policy refuses this run: "
                + "; ".join(r.line() for r in admission.refusals),
                *[r.model_dump() for r in admission.refusals],
                type=errors.POLICY_REFUSED, non_retryable=True)
        self._state.settings = admission.settings
        self._admitted = list(admission.tools)
        self._keep_admitted()
        self._offer_recall()
        self._unknown = []
        served = catalog.served_on(workflow.info().task_queue)
        self._keys = signatures.run_keys(served.approver_keys,
                                         self._state.policy.approver_keys)

    def _inherit_grants(self, inp: RunInput) -> None:
        """The session's remembered approvals, as far as this turn's policy allows. Taken
        only from the session that started this turn as its child: a run's own starter
        cannot hand itself approvals."""
        parent = workflow.info().parent
        if inp.turn is None or not inp.turn.grants or parent is None \
                or parent.workflow_id != inp.turn.session_id:
            return
        kept = sessions.session_grants(inp.turn.grants, tools=self._state.allowed_tools,
                                       approvers=self._state.policy.approvers,
                                       keys=self._keys)
        for grant in kept:
            self._state.grants.append(grant)
            self._state.log("approval_inherited", tool=grant.tool, call_id=grant.call_id,
                            detail=f"remembered for the session by "
                                   f"{preview(grant.approver, 100)}: {grant.text}")

    def _keep_admitted(self) -> None:
        """A tool this worker no longer serves keeps the rules it was admitted with (its
        tool activity then stops the run with `tool_unavailable`)."""
        for declared in self._admitted:
            if declared.name in self._unknown:
                self._rules[declared.name] = mcp_tools.tool_rule(declared)
                self._described[declared.name] = declared
        self._unknown = [t for t in self._unknown if t not in self._rules]

    def _ask_as_admitted(self) -> None:
        """A tool the run was admitted with as asking for approval still asks, whatever
        the worker serving it now declares: a deploy never loosens an open run's
        approvals (a worker's stricter rule applies at once: its rules are the base)."""
        for declared in self._admitted:
            rule = self._rules.get(declared.name)
            if rule is None or not declared.needs_approval or rule.needs_approval is True:
                continue
            served = rule.needs_approval
            # Admitted as always asking, or with another predicate than the one served
            # now (which may ask less): the call always asks.
            if served is False or declared.approval_predicate is None \
                    or mcp_tools.predicate_digest(served) != declared.approval_predicate:
                self._rules[declared.name] = dataclasses.replace(rule, needs_approval=True)

    def _own_schemas(self) -> None:
        """Every admitted tool's calls carry its admitted schema's digest; a tool this
        worker serves with another schema is decided by the admitted rules (replay then
        validates calls as the run did; the tool activity refuses them)."""
        served = set(self._toolset.names())
        for declared in self._admitted:
            digest = mcp_tools.parameters_digest(declared.parameters)
            self._digests[declared.name] = digest
            if declared.name in served and digest != self._toolset.get(
                    declared.name).schema_digest:
                self._rules[declared.name] = mcp_tools.tool_rule(declared)
                self._described[declared.name] = declared

    async def _loop(self) -> StopReason | None:
        state = self._state
        while True:
            if self._interrupted is not None:
                # A safe point: every call of the last response has its result (none
                # runs now), and the next request is not sent.
                return core.cancelled(state, self._interrupted, step_unfinished=False)
            if state.steps and self._continue_now():
                return None
            plan = core.begin_step(state, self._processing_seconds())
            if isinstance(plan, StopReason):
                return plan
            over = ctx.check(state, self._fixed_bytes)  # the `stop` context strategy
            # Under `trim` the model activity fits the request (it has the items).
            if over is not None and not self._trims() and self._patched(CONTEXT_WINDOW):
                return ctx.exhausted(state, over)
            workflow.logger.info("step started", extra={"step": plan.step})
            self._publish()
            turn = await self._request_model(plan)
            if isinstance(turn, StopReason):
                return turn
            state.conversation = state.conversation.extend(turn.items)
            self._sent = state.conversation
            ctx.note_trimmed(state, turn.trimmed)
            before = (state.usage.total_tokens, state.cost_usd)
            self._open_calls, self._answered, self._turn_returned = list(turn.calls), {}, True
            stop = core.account_usage(state, turn, state.conversation.bytes)
            self._settle_budget(plan.step, shared.settlement(
                self._reserved, state.usage.total_tokens - before[0],
                state.cost_usd - before[1], turn.usage is not None or state.usage.estimated)
                + self._take_abandoned())
            if stop is not None:
                return stop
            if self._processing_seconds() >= state.limits.deadline_seconds:
                return state.stop(StopReason.DEADLINE, turn.text)
            if self._interrupted is not None:  # before any call of this response runs
                return core.cancelled(state, self._interrupted, step_unfinished=False)
            # Asked only for a response that reached the cap: a run whose history has
            # none never writes the marker; one from before it replays as it ran.
            cut = (core.cut_at_the_cap(turn, state.limits.max_output_tokens)
                   and turn.status == "completed" and turn.fault is None
                   and self._patched(CUT_AT_THE_CAP))
            await self._find_earlier(turn)
            plans = core.plan_calls(state, turn, plan, self._rules, self._key_scope,
                                    cut=cut)
            if isinstance(plans, StopReason):
                return plans
            outputs = await self._run_calls(plan.step, plans)
            if isinstance(outputs, StopReason):
                return outputs
            items = core.outputs_items([(call, envelope) for call, envelope, _ in outputs])
            self._unsent = items
            self._refs = {call.call_id: key for call, _, key in outputs if key is not None}
            state.conversation = state.conversation.extend(items)
            self._open_calls = []

    # --- a run as long as the work (boundloop.core.carry) ----------------------------

    def _trims(self) -> bool:
        """The run fits its requests to its context window by trimming old tool outputs
        (`trim` context strategy): only runs that chose it, so no patch."""
        return ctx.trim_request(self._state, 0) is not None

    def _offer_recall(self) -> None:
        """A trimming run's model gets the built-in `recall_output` tool (decided like any
        other tool: counted, identical-call rules), described by the run itself."""
        state = self._state
        if not ctx.uses_recall(state) or ctx.RECALL_TOOL in self._rules:
            return
        declared = ctx.recall_declaration()
        self._rules[ctx.RECALL_TOOL] = mcp_tools.tool_rule(declared)
        self._described[ctx.RECALL_TOOL] = declared
        if ctx.RECALL_TOOL not in state.allowed_tools:
            state.allowed_tools = [*state.allowed_tools, ctx.RECALL_TOOL]

    def _continue_now(self) -> bool:
        """Continue as new: Temporal suggests it (history size or events), or this run's
        share of the whole-run tables is full (under CONSTANT_CARRY)."""
        if workflow.info().is_continue_as_new_suggested():
            return True
        return carry.segment_full(self._state) and self._patched(CONSTANT_CARRY)

    async def _find_earlier(self, turn: Turn) -> None:
        """Before the response's calls are decided: what the earlier Temporal runs hold
        of those the filter may have seen (identical-call counts, rejections, call ids),
        read from their continue-as-new inputs by a local activity (in history: a replay
        does not read again). Only a run handed over under CONSTANT_CARRY has any."""
        keys = carry.to_look_up(self._state, turn, self._rules)
        if not keys:
            return
        run_id = workflow.info().continued_run_id
        assert run_id is not None  # state.earlier comes only with continue-as-new
        try:
            found = await workflow.execute_local_activity(
                EARLIER_CALLS_ACTIVITY, carry.EarlierRequest(run_id=run_id, keys=keys),
                result_type=carry.EarlierCalls, start_to_close_timeout=timedelta(seconds=60),
                summary=f"earlier calls · {len(keys)} keys")
        except ActivityError as err:
            if is_cancelled_exception(err):
                raise asyncio.CancelledError from None
            raise
        carry.take_earlier(self._state, keys, found)

    def _hand_over(self) -> carry.Segment:
        """Make the state constant in size for continue-as-new (CONSTANT_CARRY): the
        tables go into the segment this run hands over, the logs keep their newest
        records, the stream its newest items."""
        state = self._state
        previous = workflow.info().continued_run_id if state.earlier is not None else None
        segment = carry.hand_over(state, previous)
        self._streamed = len(state.events)  # every event kept was published
        log = self._stream._log  # the stream's own record (private)
        cut = carry.stream_cut([item.data.ByteSize() for item in log])
        if cut:
            self._stream.truncate(self._stream._base_offset + cut)
        self._stream._publishers = carry.newest(self._stream._publishers,
                                                carry.PUBLISHERS_KEPT, lambda p: p.last_seen)
        return segment

    def _events_shown(self, excess: int = 0) -> list[core.Event]:
        """The event log as a RunResult shows it: the newest events, after one
        `events_dropped:N` standing for the N older ones (no longer carried, or left out
        so the result fits a payload)."""
        return carry.shown_events(self._state.events, self._state.events_dropped, excess)

    # --- model ---------------------------------------------------------------------

    def _failed(self, failure: mf.ModelFailure) -> StopReason:
        """A failed model request's stop: `context_exhausted` when the provider refused
        it as over the model's context window, `model_error` otherwise."""
        if failure.kind == mf.CONTEXT_LENGTH_EXCEEDED and self._patched(CONTEXT_WINDOW):
            return StopReason.CONTEXT_EXHAUSTED
        return StopReason.MODEL_ERROR

    def _wire_items(self) -> list[Item]:
        """The unsent items as payloads carry them: a tool activity's output by reference
        (its idempotency key), since history already holds it (docs/history.md)."""
        return [
            {"type": "function_call_output", "call_id": item["call_id"],
             OUTPUT_REF: self._refs[item["call_id"]]}
            if item.get("type") == "function_call_output" and item["call_id"] in self._refs
            else item
            for item in self._unsent]

    async def _request_model(self, plan: core.StepPlan) -> Turn | StopReason:
        state = self._state
        new_items = self._wire_items()
        req = ModelRequest(
            step=plan.step,
            model=state.settings.model, api=state.settings.api, tools=list(state.allowed_tools),
            tool_choice=plan.tool_choice, instructions=self._inp.instructions,
            prior=self._sent, new_items=new_items, expected=state.conversation,
            base=self._base, max_output_tokens=state.limits.max_output_tokens,
            stream=state.settings.stream,
            # The tools the run describes itself: its MCP tools, and any a deploy took
            # from this worker's toolset since the run was admitted (a call of one then
            # stops the run with `tool_unavailable`; a run that never calls it goes on).
            mcp_tools=[self._mcp.get(n) or self._described[n] for n in state.allowed_tools
                       if n in self._mcp or n in self._described],
            trim=ctx.trim_request(state, self._fixed_bytes()) if self._trims() else None)
        too_large = core.check_payload(state, "model_request", payload_bytes(req))
        if too_large is not None:
            return too_large
        # Until the model returns (a cancel raises through): a cancel while the shared
        # budget reserves leaves the step unsent, so unfinished too.
        self._model_in_flight = True
        refused = await self._reserve_budget(plan.step)
        if refused is not None:
            self._model_in_flight = False
            return refused
        self._step_mark = self._stream._base_offset + len(self._stream._log)
        turn = await self._model_attempts(plan, req)
        self._model_in_flight = False
        if isinstance(turn, StopReason):
            return turn
        self._unsent, self._refs = [], {}
        # How this request was sent: by choice to the shared queue while a holder was
        # named, or to the holder's queue (not lost to the shared queue on the way).
        probed, on_holder = self._holder is not None and not self._follow, self._on_holder()
        self._holder = turn.worker_queue
        if self._holder is not None and self._patched(ROUTE_WHEN_NEEDED):
            self._routing = True
            self._shared_missed = self._shared_missed or (probed and not turn.cached)
            self._follow = routing.follows_holder(turn.cached, on_holder, self._shared_missed)
        state.log("model_returned")
        return turn

    async def _model_attempts(self, plan: core.StepPlan, req: ModelRequest) -> Turn | StopReason:
        """The request's attempts: each provider failure counts (MODEL_BACKOFF, with the
        provider's Retry-After), attempts lost to a dead worker do not."""
        if self._charged:
            return await self._charged_model_attempts(plan, req)
        state = self._state
        limit = state.limits.model_timeout_seconds
        req = req.model_copy(update={"timeout_seconds": limit})
        attempts = _Attempts(
            activity=MODEL_ACTIVITY, timeout_seconds=limit, lost=MODEL_RETRY,
            backoff=retries.MODEL_BACKOFF, retryable=MODEL_RETRYABLE, deadline_ends=True,
            summary=f"model step {plan.step} · {state.settings.model}",
            # Whatever a failed attempt streamed is void.
            on_failure=(lambda: self._topic.publish(Reset(step=plan.step))) if req.stream
            else None)
        out = await self._attempts(attempts, req, Turn)
        if not isinstance(out, _Failed):
            return out
        if out.deadline:
            return state.stop(StopReason.DEADLINE)
        failure = _model_failure(out.error, limit)
        workflow.logger.warning("model request failed", extra={
            "step": plan.step, "failure": failure.kind, "detail": failure.detail})
        state.log(f"{mf.EVENT_PREFIX}{failure.kind}", detail=failure.detail)
        return state.stop(self._failed(failure))

    #: The stream's offset when the step's model request began (`_complete_text`).
    _step_mark = 0
    #: Under CHARGED_ATTEMPTS: what the step's abandoned attempts were charged, not yet
    #: settled with the shared budget (settled with the step, or when the run stops).
    _abandoned: Amount = Amount()
    _charged = False  # CHARGED_ATTEMPTS, asked first thing in `run`

    async def _charged_model_attempts(self, plan: core.StepPlan,
                                      req: ModelRequest) -> Turn | StopReason:
        """The request's attempts under CHARGED_ATTEMPTS. Each attempt is one activity that
        Temporal does not retry. A provider failure, a timeout of the activity's own
        (silence: model_timeout_seconds; the whole answer: model_answer_seconds) and a
        start-to-close timeout (a wedged or overloaded worker) count against
        MODEL_BACKOFF; an attempt whose worker was lost (heartbeat timeout) or that the
        holder's queue did not run is retried without counting. Every attempt that
        reached the provider and brought no answer is charged its worst case, and each
        retry is an event naming why."""
        state = self._state
        silence = state.limits.model_timeout_seconds
        failures = 0
        while True:
            remaining = state.limits.deadline_seconds - self._processing_seconds()
            answer = max(min(state.limits.model_answer_seconds or remaining, remaining), 1.0)
            sent = req.model_copy(update={"timeout_seconds": silence,
                                          "answer_seconds": answer})
            try:
                turn: Turn = await workflow.execute_activity(
                    MODEL_ACTIVITY, sent, result_type=Turn,
                    start_to_close_timeout=timedelta(seconds=answer + WEDGED_MARGIN),
                    schedule_to_close_timeout=timedelta(seconds=max(remaining, 1.0)),
                    heartbeat_timeout=HEARTBEAT_TIMEOUT, **self._route(MODEL_ONCE),
                    summary=f"model step {plan.step} · {state.settings.model}")
            except ActivityError as err:
                if req.stream:  # its text is void, and so is any that arrives later
                    self._topic.publish(Reset(step=plan.step, attempt=f"{err.activity_id}.1"))
                cause = err.cause
                charge = mf.Charge.from_details(
                    cause.details if isinstance(cause, ApplicationError)
                    else cause.last_heartbeat_details if isinstance(cause, TimeoutError)
                    else ())
                if is_cancelled_exception(err):
                    # The run was cancelled with the request out: charged, as it may have
                    # been answered.
                    self._charge_abandoned(plan.step, "cancelled", None)
                    self._settle_abandoned(plan.step)
                    raise asyncio.CancelledError from None
                timeout = cause.type if isinstance(cause, TimeoutError) else None
                in_time = self._processing_seconds() < state.limits.deadline_seconds
                if timeout == TimeoutType.SCHEDULE_TO_CLOSE or not in_time:
                    self._charge_abandoned(plan.step, "deadline", charge)
                    self._settle_abandoned(plan.step)
                    return state.stop(StopReason.DEADLINE)
                shut_down = isinstance(cause, ApplicationError) \
                    and cause.type == errors.WORKER_SHUTDOWN
                if timeout == TimeoutType.HEARTBEAT or shut_down or (
                        timeout == TimeoutType.SCHEDULE_TO_START and self._on_holder()):
                    # Its worker was lost, or shut down while it ran (a deploy's stop,
                    # which fails the attempt with WorkerShutdown), or the holder never
                    # took it: not the
                    # provider's failure, not counted; sent again only once it had gone
                    # out, which the event says.
                    if self._on_holder():
                        self._holder = None
                    if charge is not None and charge.sent:
                        tokens = self._charge_abandoned(plan.step, "worker_lost", charge)
                        state.log(f"{MODEL_RETRIED}worker_lost", detail=(
                            f"the worker was lost with the request sent; charged {tokens} "
                            "tokens (worst case)"))
                    continue
                failures += 1
                failure = _model_failure(err, silence) if timeout != TimeoutType.START_TO_CLOSE \
                    else mf.ModelFailure(kind=mf.TIMEOUT, detail=(
                        f"the attempt outlived its start-to-close timeout "
                        f"({answer + WEDGED_MARGIN:g} s): its worker was overloaded or wedged"))
                tokens = self._charge_abandoned(plan.step, failure.kind, charge)
                charged = f"; charged {tokens} tokens (worst case)" if tokens else ""
                retryable = timeout == TimeoutType.START_TO_CLOSE or (
                    isinstance(cause, ApplicationError) and cause.type in MODEL_RETRYABLE)
                asked = cause.next_retry_delay if isinstance(cause, ApplicationError) else None
                delay = retries.next_delay(
                    retries.MODEL_BACKOFF, failures,
                    asked.total_seconds() if asked is not None else None,
                    state.limits.deadline_seconds - self._processing_seconds()) \
                    if retryable else "exhausted"
                if delay == "deadline":
                    self._settle_abandoned(plan.step)
                    return state.stop(StopReason.DEADLINE)
                if not isinstance(delay, str):
                    workflow.logger.warning("model request failed; retrying", extra={
                        "step": plan.step, "failure": failure.kind, "failures": failures})
                    state.log(f"{MODEL_RETRIED}{failure.kind}", detail=(
                        f"attempt {failures} of {retries.MODEL_BACKOFF.max_attempts}: "
                        f"{failure.detail}{charged}"))
                    try:
                        await workflow.sleep(delay)
                    except asyncio.CancelledError:  # cancelled between attempts
                        self._settle_abandoned(plan.step)
                        raise
                    continue
                workflow.logger.warning("model request failed", extra={
                    "step": plan.step, "failure": failure.kind, "detail": failure.detail})
                state.log(f"{mf.EVENT_PREFIX}{failure.kind}", detail=failure.detail + charged)
                self._settle_abandoned(plan.step)
                return state.stop(self._failed(failure))
            if req.stream and turn.streamed is not None:
                self._complete_text(plan.step, turn)
            usage = turn.usage
            state.model_attempts.append(core.ModelAttempt(
                step=plan.step, outcome="answered",
                input_tokens=usage.input_tokens if usage is not None else 0,
                output_tokens=usage.output_tokens if usage is not None else 0))
            return turn

    def _charge_abandoned(self, step: int, outcome: str, charge: mf.Charge | None) -> int:
        """Charge an attempt that brought no answer to the run (its usage totals and cost)
        and to what the step settles with the shared budget: its worst case, every input
        token the request may hold plus the most output it may produce (without
        max_output_tokens: its streamed bytes / 4), when it reached the provider. Returns
        the tokens charged (0: it never went out)."""
        state = self._state
        if charge is not None and not charge.sent:
            return 0
        if charge is None and outcome not in ("cancelled", "deadline", mf.TIMEOUT):
            return 0  # a failure the provider refused before answering (an HTTP status)
        input_tokens = shared.input_tokens_bound(
            conversation_bytes=state.conversation.bytes, fixed_bytes=self._fixed_bytes(),
            last_tokens=state.last_tokens, last_bytes=state.last_bytes)
        cap = state.limits.max_output_tokens
        output_tokens = cap if cap is not None else max(
            1, (charge.output_bytes if charge is not None else 0) // 4)
        price = state.policy.prices.get(state.settings.model)
        amount = shared.worst_case(price, input_tokens, output_tokens)
        # In the run's own totals, as an answered request's usage is (the token threshold
        # and the USD budget see it at the next response).
        state.usage.input_tokens += input_tokens
        state.usage.output_tokens += output_tokens
        state.usage.total_tokens += amount.tokens
        state.cost_usd += amount.usd
        state.model_attempts.append(core.ModelAttempt(
            step=step, outcome=outcome, input_tokens=input_tokens,
            output_tokens=output_tokens, worst_case=True))
        workflow.logger.info("model attempt charged", extra={
            "step": step, "outcome": outcome, "tokens": amount.tokens})
        self._abandoned = self._abandoned + amount
        return amount.tokens

    def _take_abandoned(self) -> Amount:
        taken, self._abandoned = self._abandoned, Amount()
        return taken

    def _settle_abandoned(self, step: int) -> None:
        """The step ends without an answer: settle what its attempts were charged."""
        if self._abandoned.tokens or self._abandoned.usd:
            self._settle_budget(step, self._take_abandoned())

    def _complete_text(self, step: int, turn: Turn) -> None:
        """Publish what of the answer's text the stream lacks (the activity sends its text
        best effort, and stops waiting for it once the answer is in), then close the
        attempt's publisher: a batch of it still on its way is dropped, not appended."""
        assert turn.streamed is not None
        attempt = turn.streamed.attempt
        converter = workflow.payload_converter()
        shown = ""
        # The step's text was published after its request began: only the items since
        # are read (reading the whole log made each step slower than the one before).
        since = max(0, self._step_mark - self._stream._base_offset)
        for item in self._stream._log[since:]:  # the stream's own record (private)
            if item.topic != STREAM_TOPIC:
                continue
            value = converter.from_payload(item.data)
            if isinstance(value, dict) and value.get("kind") == "text" \
                    and value.get("step") == step and value.get("attempt") == attempt:
                shown += str(value.get("text", ""))
        self._stream._publishers[turn.streamed.publisher] = PublisherState(
            sequence=2 ** 62, last_seen=workflow.now())
        text = turn.text
        if not text.startswith(shown):
            self._topic.publish(Reset(step=step, attempt=attempt))
            shown = ""
        rest = text[len(shown):]
        for start in range(0, len(rest), STREAM_PIECE):
            self._topic.publish(TextDelta(step=step, attempt=attempt,
                                          text=rest[start:start + STREAM_PIECE]))

    async def _attempts(self, a: _Attempts, arg: object,
                        result_type: type[_R]) -> _R | _Failed:
        """One activity's counted attempts, the same for a model request and a tool
        execution: an attempt lost to a dead worker (Temporal retries it) or to the
        holder's queue (the shared queue takes it) is not counted; each failure of the
        provider or tool is, against `a.backoff`, until the attempts or the run's time
        run out. A cancel of the run raises through."""
        state = self._state
        failures = 0
        failed: list[ActivityError] = []
        while True:
            remaining = state.limits.deadline_seconds - self._processing_seconds()
            start_to_close = timedelta(seconds=a.timeout_seconds + WEDGED_MARGIN)
            schedule_to_close = timedelta(seconds=max(remaining, 1.0))
            try:
                if a.local_id is not None:
                    # In this worker, within the workflow task: no heartbeats (the task's
                    # own timeout notices a dead worker) and no routing. Its activity id
                    # is the call's idempotency key: the model activity finds the result
                    # in history by it.
                    try:
                        result: _R = await workflow.execute_local_activity(
                            a.activity, arg, result_type=result_type,
                            start_to_close_timeout=start_to_close,
                            schedule_to_close_timeout=schedule_to_close,
                            retry_policy=a.lost, activity_id=a.local_id, summary=a.summary)
                    except FailureError as exc:
                        raise _as_activity_error(exc, a.activity, a.local_id) from exc
                else:
                    result = await workflow.execute_activity(
                        a.activity, arg, result_type=result_type,
                        start_to_close_timeout=start_to_close,
                        schedule_to_close_timeout=schedule_to_close,
                        heartbeat_timeout=HEARTBEAT_TIMEOUT, **self._route(a.lost),
                        summary=a.summary)
                return result
            except ActivityError as err:
                if a.on_failure is not None:
                    a.on_failure()
                if is_cancelled_exception(err):
                    raise asyncio.CancelledError from None  # the run was cancelled
                failed.append(err)
                in_time = self._processing_seconds() < state.limits.deadline_seconds
                if (in_time or not a.deadline_ends) and a.local_id is None \
                        and self._holder_lost(err, a.lost):
                    continue  # not a failure: the shared queue takes it (same request)
                # Schedule-to-close is the time left before the deadline: a retry refused
                # for lack of time is the deadline, not the provider.
                if a.deadline_ends and (err.retry_state == RetryState.TIMEOUT or not in_time):
                    return _Failed(err, failures, failed, deadline=True)
                failures += 1
                cause = err.cause if isinstance(err.cause, ApplicationError) else None
                if cause is not None and cause.type in a.retryable \
                        and err.retry_state != RetryState.TIMEOUT \
                        and self._patched(COUNTED_RETRIES):
                    asked = cause.next_retry_delay
                    delay = retries.next_delay(
                        a.backoff, failures, asked.total_seconds() if asked is not None else None,
                        state.limits.deadline_seconds - self._processing_seconds())
                    if delay == "deadline" and a.deadline_ends:
                        return _Failed(err, failures, failed, deadline=True)
                    if not isinstance(delay, str):
                        workflow.logger.warning("activity failed; retrying", extra={
                            "activity": a.activity, "error_type": cause.type,
                            "failures": failures})
                        await workflow.sleep(delay)
                        continue
                return _Failed(err, failures, failed, deadline=False)

    # --- shared budget (workflows/budget.py) ----------------------------------------

    async def _reserve_budget(self, step: int) -> StopReason | None:
        """Reserve this request's worst case from the run's shared budget, if it names
        one; a refusal stops the run before the request is sent."""
        state, key = self._state, self._state.settings.budget
        cap = state.limits.max_output_tokens
        if key is None or cap is None:  # settings validation: a budget comes with a cap
            return None
        price = state.policy.prices.get(state.settings.model)
        input_tokens = shared.input_tokens_bound(
            conversation_bytes=state.conversation.bytes, fixed_bytes=self._fixed_bytes(),
            last_tokens=state.last_tokens, last_bytes=state.last_bytes)
        amount = shared.worst_case(price, input_tokens, cap)
        await self._settled()  # the last step's usage is in before this one reserves
        try:
            grant: Grant = await workflow.execute_activity(
                BUDGET_RESERVE_ACTIVITY,
                BudgetReserve(key=key, step=step, amount=amount, priced=price is not None),
                result_type=Grant, start_to_close_timeout=timedelta(seconds=60),
                heartbeat_timeout=HEARTBEAT_TIMEOUT,
                retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1),
                                         backoff_coefficient=1.0, maximum_attempts=0),
                summary=f"reserve step {step} · budget {key}")
        except ActivityError as err:
            if is_cancelled_exception(err):
                raise asyncio.CancelledError from None
            grant = Grant(granted=False, message=f"budget {key!r} could not reserve step "
                          f"{step}: {getattr(err.cause, 'message', 'the ledger failed')}")
        if not grant.granted:
            workflow.logger.info("budget refused the step", extra={"step": step})
            return core.budget_refused(state, grant.message)
        self._reserved, self._budget_token = amount, grant.token
        return None

    def _settle_budget(self, step: int, actual: Amount) -> None:
        """Send the settlement without waiting for it: the step goes on (its tools run)
        meanwhile; the next reservation, continue-as-new and the release wait for it."""
        key = self._state.settings.budget
        if key is None:
            return
        if workflow.patched(RUN_MESSAGES_BY_UPDATE):
            self._settling = asyncio.create_task(self._ledger_activity(
                BUDGET_SETTLE_ACTIVITY, BudgetSettle(key=key, step=step, amount=actual,
                                                     token=self._budget_token),
                f"settle step {step} · budget {key}"))
            return
        self._settling = asyncio.create_task(self._signal_ledger(
            key, BudgetLedgerWorkflow.settle,
            SettleRequest(run=workflow.info().workflow_id, step=step, amount=actual,
                          token=self._budget_token)))

    async def _settled(self) -> None:
        task, self._settling = self._settling, None
        if task is not None:
            # A cancel of the run does not cancel this task; should it have been
            # cancelled anyway, the run still ends (and releases) as it would.
            await workflow.wait([task])

    async def _release_budget(self) -> None:
        """Every ending releases what the run still holds (idempotent at the ledger)."""
        key = self._state.settings.budget
        if key is not None:
            await self._settled()
            token, run = self._budget_token, workflow.info().workflow_id
            if workflow.patched(RUN_MESSAGES_BY_UPDATE):
                await self._ledger_activity(BUDGET_RELEASE_ACTIVITY,
                                            BudgetRelease(key=key, token=token),
                                            f"release · budget {key}", give_up=RELEASE_WAIT)
                return
            await self._signal_ledger(key, BudgetLedgerWorkflow.release,
                                      run if token is None else ReleaseRequest(run=run,
                                                                               token=token))

    async def _ledger_activity(self, activity: str, arg: object, summary: str,
                               give_up: timedelta = SETTLE_WAIT) -> None:
        """Settle or release by the activity that sends the ledger an update; a ledger
        that does not answer within `give_up` is left to find the run closed itself."""
        try:
            await workflow.execute_activity(
                activity, arg, schedule_to_close_timeout=give_up,
                heartbeat_timeout=HEARTBEAT_TIMEOUT,
                retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1),
                                         backoff_coefficient=1.0, maximum_attempts=0),
                summary=summary)
        except ActivityError as exc:
            if is_cancelled_exception(exc):
                raise asyncio.CancelledError from None
            workflow.logger.warning("budget ledger message failed", extra={
                "activity": activity, "error": type(exc.cause).__name__})

    async def _signal_ledger(self, key: str, signal: Callable[[Any, Any], None],
                             arg: object) -> None:
        try:
            await workflow.get_external_workflow_handle(budget_workflow_id(key)).signal(
                signal, arg)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the ledger is gone (terminated): nothing to settle
            workflow.logger.warning("budget ledger signal failed", extra={
                "signal": signal.__name__, "error": type(exc).__name__})

    def _fixed_bytes(self) -> int:
        """UTF-8 bytes every request carries beside the conversation: the instructions
        and the tool declarations."""
        api = self._state.settings.api
        admitted = {d.name: d for d in self._admitted}
        served = set(self._toolset.names())
        tools: list[dict[str, Any]] = []
        for name in self._state.allowed_tools:
            # A tool from an MCP server, or one a deploy renamed, removed or changed, is
            # described by the run's own declaration, not by this worker's toolset.
            declared = self._mcp.get(name) or (self._described.get(name)
                                               if name == ctx.RECALL_TOOL else None)
            if declared is None and name in admitted and (
                    name not in served or mcp_tools.parameters_digest(
                        admitted[name].parameters) != self._toolset.get(name).schema_digest):
                declared = admitted[name]
            if declared is not None:
                tools.append(declared.openai_tool(api))
            elif name in served:
                tools += self._toolset.openai_tools([name], api)
        instructions = self._inp.instructions or ""
        return len(instructions.encode("utf-8", "surrogatepass")) + len(
            json.dumps(tools, ensure_ascii=False).encode("utf-8", "surrogatepass"))

    # --- tools ---------------------------------------------------------------------

    async def _run_calls(
        self, step: int, plans: list[core.CallPlan]
    ) -> list[tuple[FunctionCall, Envelope, str | None]] | StopReason:
        """Every call's output in call order, with the idempotency key when the output is
        the tool activity's own result (then history already holds it: docs/history.md)."""
        state = self._state
        results = self._answered  # kept as they come: a stopped turn hands them on
        waiting: list[core.Execute] = []
        for p in plans:
            if isinstance(p, core.Execute) and p.needs_approval:
                approvals.request(state, p, step, workflow.now())
                waiting.append(p)
        if waiting:
            self._publish()
        for p in plans:
            if isinstance(p, core.Reply):
                out = _no_ref(core.reply_output(state, p))
            elif not p.needs_approval:
                out = await self._execute(step, p)
            else:
                continue
            if isinstance(out, StopReason):
                return out
            results[p.call.call_id] = out
        for p in waiting:
            out = await self._await_approval(step, p)
            if isinstance(out, StopReason):
                return out
            results[p.call.call_id] = out
        return [(p.call, *results[p.call.call_id]) for p in plans]

    async def _await_approval(self, step: int,
                              p: core.Execute) -> tuple[Envelope, str | None] | StopReason:
        state = self._state
        approval = approvals.find(state, p.call.call_id)
        assert approval is not None
        limit = timedelta(seconds=state.limits.approval_timeout_seconds)
        left = approvals.time_left(approval, workflow.now(), limit)
        began = workflow.now()
        self._publish()
        try:
            await workflow.wait_condition(lambda: approval.status != "pending", timeout=left)
            timed_out = False
        except builtins.TimeoutError:
            timed_out = True
        # Not in a `finally`: a worker that shuts down or evicts this run closes the
        # coroutine outside the workflow's event loop, where no workflow API may run (a
        # cancelled run ends right away, so its last wait need not be counted).
        self._waited += (workflow.now() - began).total_seconds()
        if timed_out:
            approval.status = "timed_out"
            state.log("approval_timed_out", tool=p.call.name, call_id=p.call.call_id,
                      fp=p.fingerprint)
            return state.stop(StopReason.APPROVAL_TIMEOUT)
        if approval.status == "rejected":
            refusal = approvals.rejection(state, approval)
            return _no_ref(core.reply_output(state, core.Reply(
                call=p.call, fingerprint=p.fingerprint, envelope=refusal)))
        execute = approvals.approved_plan(p, approval)
        self._publish()
        return await self._execute(step, execute)

    async def _execute(self, step: int,
                       p: core.Execute) -> tuple[Envelope, str | None] | StopReason:
        state = self._state
        rule = self._rules[p.call.name]
        mcp = self._mcp.get(p.call.name)  # an MCP tool: the activity calls its server
        timeout = state.limits.tool_timeout_seconds or rule.timeout_seconds
        req = ToolRequest(tool=p.call.name,
                          call_id=p.call.call_id, step=step, arguments=p.arguments,
                          idempotency_key=p.idempotency_key,
                          max_result_bytes=state.limits.max_result_bytes,
                          timeout_seconds=timeout,
                          mcp=mcp_tools.call_target(mcp) if mcp is not None else None,
                          parameters_digest=self._digests.get(p.call.name))
        too_large = core.check_payload(state, "tool_request", payload_bytes(req))
        if too_large is not None:
            return too_large
        local = core.runs_locally(rule, timeout, gated=p.needs_approval) \
            and self._patched(LOCAL_TOOLS)
        workflow.logger.info("tool execution", extra={
            "step": step, "tool": p.call.name, "fingerprint": p.fingerprint,
            "local": local})
        attempts = _Attempts(
            activity=TOOL_ACTIVITY, timeout_seconds=timeout, lost=TOOL_RETRY,
            backoff=rule.backoff, retryable=TOOL_RETRYABLE, deadline_ends=False,
            summary=f"tool {p.call.name} · call {state.tool_executions + 1}",
            local_id=p.idempotency_key if local else None)
        if local and self._routing:
            req = req.model_copy(update={"holder": self._holder})
        outcome = await self._attempts(attempts, req, core.ToolOutcome)
        if not isinstance(outcome, _Failed) and outcome.worker_queue is not None \
                and self._routing:
            # A local tool ran in the worker that runs this run's tasks, not the holder:
            # its output is in that worker's cache, so the next request goes there.
            self._holder = outcome.worker_queue
        if isinstance(outcome, _Failed):
            cause = outcome.error.cause
            kind = cause.type if isinstance(cause, ApplicationError) else None
            if kind in (errors.TOOL_UNAVAILABLE, errors.TOOL_ARGUMENTS_CHANGED):
                # Renamed or removed by a deploy since the run started: never retried.
                detail = (preview(cause.message, 300) if isinstance(cause, ApplicationError)
                          and kind == errors.TOOL_ARGUMENTS_CHANGED
                          else f"{p.call.name} is not served here")
                state.log("tool_unavailable", tool=p.call.name, call_id=p.call.call_id,
                          fp=p.fingerprint, detail=detail)
                return state.stop(StopReason.TOOL_UNAVAILABLE)
            if kind == errors.PAYLOADS_TOO_LARGE:
                # The body ran; its result could not be returned (never retried).
                workflow.logger.warning("tool result over the payload limit", extra={
                    "step": step, "tool": p.call.name, "fingerprint": p.fingerprint})
                return core.result_payload_too_large(state, p, self._rules)
            # A tool's timeout and transient failures give the model a temporary error;
            # an unexpected exception stops the run.
            transient = isinstance(cause, TimeoutError) or kind in (
                errors.TRANSIENT_TOOL_ERROR, errors.TOOL_TIMED_OUT)
            # Timing out on the last attempt is told apart, with the numbers.
            exhausted = (tool_timed_out(timeout, outcome.failures)
                         if kind == errors.TOOL_TIMED_OUT else temporary_error_exhausted())
            started = any(_body_started(err.cause) for err in outcome.attempts)
            outcome = core.ToolOutcome(envelope=exhausted, executed=started,
                                       fatal=not transient, from_activity=False)
        result = core.record_outcome(state, p, outcome, self._rules)
        self._publish(attributes=False)  # the count reaches the attributes next step
        if isinstance(result, StopReason):
            return result
        # The activity's own result is in history: the next request refers to it.
        return result, p.idempotency_key if outcome.from_activity and result == outcome.envelope \
            else None

    # --- approvals: signals, update, query -----------------------------------------

    @workflow.signal
    def approve(self, decision: Decision) -> None:
        self._signal_decision(decision.model_copy(update={"approve": True}))

    @workflow.signal
    def reject(self, decision: Decision) -> None:
        self._signal_decision(decision.model_copy(update={"approve": False}))

    def _signed(self) -> signatures.Context:
        return signatures.Context(keys=self._keys, workflow_id=workflow.info().workflow_id,
                                  now=workflow.now())

    def _decision_problem(self, decision: Decision) -> str | None:
        return approvals.check(self._state, decision, self._rules, self._signed(),
                               in_session=self._session_grants,
                               run=workflow.info().first_execution_run_id,
                               bound=self._decisions_bound)

    def _signal_decision(self, decision: Decision) -> None:
        problem = self._decision_problem(decision)
        if problem is not None:
            workflow.logger.warning("approval signal ignored", extra={
                "call_id": preview(decision.call_id, 60), "problem": problem})
            return
        approvals.apply(self._state, decision, workflow.now(), self._rules)
        self._publish()

    @workflow.signal
    def interrupt(self, request: CancelRequest) -> None:
        """Stop at the next safe point (between steps, never between a tool's side effect
        and its result), as `cancelled` with this reason: a session's newer message."""
        self._interrupted = request.reason or "interrupted"

    @workflow.signal
    def cancel_reason(self, request: CancelRequest) -> None:
        """Sent by `boundloop cancel` just before it asks Temporal to cancel the run: the
        reason goes into the event log and the RunResult of the cancelled run."""
        self._cancel_reason = request.reason

    @workflow.update
    def decide(self, decision: Decision) -> str:
        approvals.apply(self._state, decision, workflow.now(), self._rules)
        self._publish()
        return "approved" if decision.approve else "rejected"

    @decide.validator
    def _validate_decide(self, decision: Decision) -> None:
        problem = self._decision_problem(decision)
        if problem is not None:
            raise ApplicationError(problem, type=errors.INVALID_DECISION, non_retryable=True)

    @workflow.query
    def status(self) -> RunStatus:
        return RunStatus(
            status=self._status(), reason=self._state.reason, steps=self._state.steps,
            tool_executions=self._state.tool_executions,
            total_tokens=self._state.usage.total_tokens, cost_usd=self._cost(),
            pending=[a for a in self._state.approvals if a.status == "pending"],
            events=list(self._state.events), question=self._inp.question,
            model=self._state.settings.model, limits=self._state.limits,
            grants=list(self._state.grants), run=workflow.info().first_execution_run_id,
            context_tokens=ctx.estimate(self._state, self._fixed_bytes),
            events_dropped=self._state.events_dropped)

    # --- helpers -------------------------------------------------------------------

    def _patched(self, patch: str) -> bool:
        """`workflow.patched(patch)`, answered by the bundle for a run started under it."""
        return ((self._bundled_04 and patch in BUNDLED_04_PATCHES)
                or (self._bundled and patch in BUNDLED_PATCHES) or workflow.patched(patch))

    def _on_holder(self) -> bool:
        return self._holder is not None and self._follow

    def _route(self, policy: RetryPolicy) -> dict[str, Any]:
        """Where the next activity goes: the holder's own queue (one attempt, bounded wait
        to start), or the shared queue with `policy` (docs/history.md, "Several workers")."""
        if not self._on_holder():
            return {"retry_policy": policy}
        return {"task_queue": self._holder, "retry_policy": HOLDER_RETRY,
                "schedule_to_start_timeout": HOLDER_START_TIMEOUT}

    def _holder_lost(self, err: ActivityError, policy: RetryPolicy) -> bool:
        """Whether the attempt failed on the holder's queue in a way the shared queue's
        `policy` would have retried; then the run forgets the holder."""
        if not self._on_holder():
            return False
        cause = err.cause
        timeout = (cause.type.name if isinstance(cause, TimeoutError) and cause.type is not None
                   else None)
        kind = cause.type if isinstance(cause, ApplicationError) else None
        if not routing.lost_on_holder(timeout, kind, policy.non_retryable_error_types or ()):
            return False
        workflow.logger.info("activity not run by the worker holding the conversation; "
                             "the shared queue takes it", extra={"timeout": timeout})
        self._holder = None
        return True

    def _processing_seconds(self) -> float:
        elapsed = (workflow.now() - self._started).total_seconds()
        return self._processing_before + elapsed - self._waited

    def _status(self) -> str:
        s = self._state
        if s.reason is None:
            return "waiting_approval" if approvals.pending_count(s) else "running"
        return "completed" if s.reason == StopReason.COMPLETED else "stopped"

    def _cost(self) -> float | None:
        known = self._state.settings.model in self._state.policy.prices
        return round(self._state.cost_usd, 8) if known else None

    def _publish(self, attributes: bool = True) -> None:
        """Search attributes and current details for the Web UI.

        Each upsert is an event in history: upsert only when the status, stop reason or
        pending approvals changed; the step and tool-execution counts go with it (so they
        are exact from the run's end), and current details, which cost no history, show
        them live.
        """
        s = self._state
        self._stream_events()
        pending = approvals.pending_count(s)
        status = self._status()
        values: tuple[object, ...] = (status, s.reason, s.steps, s.tool_executions, pending)
        if self._sparse_upserts:
            values = values[:2] + values[4:]
        if attributes and self._inp.search_attributes and values != self._published:
            self._published = values
            workflow.upsert_search_attributes([
                sa.STATUS.value_set(status),
                sa.STOP_REASON.value_set(s.reason.value if s.reason else ""),
                sa.STEPS.value_set(s.steps),
                sa.TOOL_EXECUTIONS.value_set(s.tool_executions),
                sa.PENDING_APPROVALS.value_set(pending),
            ])
        cost = self._cost()
        lines = [f"**{status}**" + (f" · {s.reason.value}" if s.reason else ""),
                 f"steps {s.steps} of {s.limits.max_steps} · tool executions "
                 f"{s.tool_executions} of {s.limits.max_tool_executions}",
                 f"tokens {s.usage.total_tokens} of {s.limits.token_threshold}"
                 + (f" · cost ${cost:.6f}" if cost is not None else "")]
        if s.reason is not None and s.reason != StopReason.COMPLETED:
            lines.append(f"check: {NEXT_CHECK[s.reason]}")
        if s.answer_looks_like_tool_call:
            lines.append("**the answer looks like a tool call**: it was not executed, and "
                         "it is not an answer to the question")
        for a in s.approvals:
            if a.status == "pending":
                lines.append(f"waiting for approval: {a.tool} `{a.call_id}` since "
                             f"{a.requested_at}" + (f" (asked because: {a.asked_because})"
                                                    if a.asked_because else ""))
        workflow.set_current_details("\n\n".join(lines))

    def _stream_events(self) -> None:
        """Publish the event log's records not yet in the stream, in order."""
        for event in self._state.events[self._streamed:]:
            self._topic.publish(StreamEvent(event=event))
        self._streamed = len(self._state.events)

    def _carry(self) -> RunInput:
        info = workflow.info()
        base = ConversationRef(workflow_id=info.workflow_id, run_id=info.run_id,
                               meta=self._sent)
        segment = self._hand_over() if self._patched(CONSTANT_CARRY) else None
        carried = Carried(state=self._state, base=base, unsent=self._wire_items(),
                          processing_seconds=self._processing_seconds(),
                          stream=self._stream.get_state(),
                          tools=self._admitted if self._patched(CARRIED_RULES) else [],
                          segment=segment)
        return self._inp.model_copy(update={"carried": carried})

    def _result(self) -> RunResult:
        """The RunResult; when the event log would take it over the payload limit, the
        oldest events give way (the counters and the reason are always whole)."""
        s, info = self._state, workflow.info()
        assert s.reason is not None
        result = RunResult(
            reason=s.reason, text=s.text, steps=s.steps, tool_executions=s.tool_executions,
            input_tokens=s.usage.input_tokens, output_tokens=s.usage.output_tokens,
            total_tokens=s.usage.total_tokens, usage_unknown=s.usage.unknown_steps > 0,
            usage_estimated=s.usage.estimated, cost_usd=self._cost(), cost_units=s.cost_units,
            events=self._events_shown(), workflow_id=info.workflow_id, run_id=info.run_id,
            answer_looks_like_tool_call=s.answer_looks_like_tool_call,
            cancel_reason=(self._cancel_reason or self._interrupted
                           if s.reason == StopReason.CANCELLED else None),
            continuation=self._continuation() if self._inp.turn is not None else None,
            session_grants=[g for g in s.grants if g.scope == "session"]
            if self._session_grants else [], model_attempts=list(s.model_attempts))
        excess = payload_bytes(result) - MAX_PAYLOAD_VALUE_BYTES
        if excess <= 0:
            return result
        return result.model_copy(update={"events": self._events_shown(excess)})


    def _continuation(self) -> sessions.Continuation:
        """Where a session's next turn continues this conversation: this run's history
        up to its last model turn (or the conversation it was given, when the model was
        never answered), then the unsent items, and an output for every open call."""
        s, info = self._state, workflow.info()
        assert s.reason is not None
        closing = sessions.closing_outputs(self._open_calls, self._answered, s.reason)
        wire = [{"type": "function_call_output", "call_id": call_id, OUTPUT_REF: key}
                if key is not None else function_call_output(call_id, envelope.to_output())
                for call_id, envelope, key in closing]
        base = (ConversationRef(workflow_id=info.workflow_id, run_id=info.run_id,
                                meta=self._sent) if self._turn_returned else self._base)
        conversation = s.conversation.extend(
            [function_call_output(call_id, envelope.to_output())
             for call_id, envelope, _ in closing])
        return sessions.Continuation(base=base, unsent=[*self._wire_items(), *wire],
                                     conversation=conversation)


@dataclass(frozen=True)
class _Attempts:
    """What `BoundLoopWorkflow._attempts` needs to run one activity's counted attempts."""

    activity: str
    timeout_seconds: float  # of one attempt (the activity enforces it)
    lost: RetryPolicy  # Temporal's: attempts lost to our own workers
    backoff: retries.Backoff  # the counted failures
    retryable: tuple[str, ...]  # failure types counted and retried
    #: Whether the run's deadline ends the attempts as `DEADLINE` (the model request) or
    #: is one more failure of the operation (a tool's attempts; the next step stops).
    deadline_ends: bool
    summary: str
    on_failure: Callable[[], None] | None = None  # after each failed attempt
    #: Set: the attempts run as local activities with this activity id.
    local_id: str | None = None


@dataclass(frozen=True)
class _Failed:
    """The attempts ended without a result: the last failure, how many were counted,
    every failed attempt (lost ones too), and whether the deadline ended them."""

    error: ActivityError
    failures: int
    attempts: list[ActivityError]
    deadline: bool


def _model_failure(err: ActivityError, timeout_seconds: float) -> mf.ModelFailure:
    """The failure the model activity named, or one named from Temporal's own error."""
    cause = err.cause
    if isinstance(cause, TimeoutError):  # start-to-close: the attempt outlived its timeout
        return mf.timeout_failure(timeout_seconds)
    if isinstance(cause, ApplicationError):
        named = mf.ModelFailure.from_details(cause.details)
        if named is not None:
            return named
        kind = MODEL_FAILURES.get(cause.type or "", mf.WORKER_ERROR)
        return mf.ModelFailure(kind=kind, detail=f"model activity failed: {cause.type}")
    return mf.ModelFailure(kind=mf.WORKER_ERROR,
                           detail=f"model activity failed: {type(cause).__name__}")


def _as_activity_error(err: FailureError, activity: str, activity_id: str) -> ActivityError:
    """A local activity's failure as the ActivityError a regular activity's failure is:
    Temporal hands a local activity's own failure (the tool's ApplicationError, a
    timeout, a cancel) to the workflow unwrapped. Its retry state is the one the server
    gives a regular activity's: the counted failure types are non-retryable."""
    if isinstance(err, ActivityError):
        return err
    wrapped = ActivityError(
        f"local activity {activity} failed", scheduled_event_id=0, started_event_id=0,
        identity="", activity_type=activity, activity_id=activity_id,
        retry_state=RetryState.TIMEOUT if isinstance(err, TimeoutError)
        else RetryState.NON_RETRYABLE_FAILURE)
    wrapped.__cause__ = err  # what `ActivityError.cause` reads
    return wrapped


def _body_started(cause: BaseException | None) -> bool:
    """Whether a failed tool attempt had started the tool's body, as the activity reported
    it in the failure's details (or, for a timeout, its last heartbeat)."""
    if isinstance(cause, ApplicationError):
        details = cause.details
    elif isinstance(cause, TimeoutError):
        details = cause.last_heartbeat_details
    else:
        return False
    first = details[0] if details else None
    return isinstance(first, dict) and first.get("started") is True


def _refuse(refusal: Refusal) -> NoReturn:
    """Fail the run as refused by the operator's policy (`PolicyRefused` for its starter),
    before any command of its own."""
    raise ApplicationError("the operator's policy refuses this run: " + refusal.line(),
                           refusal.model_dump(), type=errors.POLICY_REFUSED,
                           non_retryable=True)


def _no_ref(out: Envelope | StopReason) -> tuple[Envelope, str | None] | StopReason:
    return out if isinstance(out, StopReason) else (out, None)
