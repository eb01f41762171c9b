"""The BoundLoop workflow: a thin Temporal shell around `boundloop.core.loop`.

Each model request and each tool execution is one activity; the counters, the
identical-call table and pending approvals live in workflow state. The
conversation itself is written to history once and rebuilt by the model activity
from references (docs/history.md).
"""

from __future__ import annotations

import asyncio
import builtins
import functools
from datetime import datetime, timedelta
from typing import NoReturn, TypeVar

from temporalio import workflow
from temporalio.contrib.workflow_streams import WorkflowStream
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    is_cancelled_exception,
)

from boundloop.workflows import SANDBOXED, options
from boundloop.workflows.admission import RunTools
from boundloop.workflows.attempts import Routing
from boundloop.workflows.calls import Calls
from boundloop.workflows.patches import (
    ADMIT_ATTRIBUTES,
    ADMITTED_SCHEMAS,
    CARRIED_BY_CONTINUE,
    CARRIED_GENUINE,
    CARRIED_RULES,
    CHARGED_ATTEMPTS,
    CONSTANT_CARRY,
    DECISIONS_BOUND,
    OPERATOR_POLICY,
    RUN_SCOPED_KEYS,
    SESSION_GRANTS,
    SPARSE_UPSERTS,
    STRICTER_APPROVALS,
    TURN_FOLLOWS_OWNED,
    UNKNOWN_TOOLS_NAMED,
    WITHDRAWN_ON_STOP,
    Patches,
)
from boundloop.workflows.publish import Publisher, cost_of, status_of
from boundloop.workflows.spending import RunBudget

with workflow.unsafe.imports_passed_through():
    from boundloop import errors
    from boundloop.activities.admission import Admissions
    from boundloop.activities.earlier import earlier_calls
    from boundloop.contracts import (
        OUTPUT_REF,
        WORKFLOW_NAME,
        AdmitRequest,
        CancelRequest,
        Carried,
        ConversationRef,
        Decision,
        RunInput,
        RunResult,
        RunStatus,
        StreamResult,
    )
    from boundloop.core import approvals, carry, driver, signatures
    from boundloop.core import context as ctx
    from boundloop.core import loop as core
    from boundloop.core import session as sessions
    from boundloop.core.canonical import preview
    from boundloop.core.conversation import (
        ConversationMeta,
        function_call_output,
        user_message,
    )
    from boundloop.core.limits import MAX_PAYLOAD_VALUE_BYTES, payload_bytes
    from boundloop.core.operator import Refusal, unknown_tools_line
    from boundloop.core.reasons import NEXT_CHECK, StopReason
    from boundloop.tools import catalog


_R = TypeVar("_R")


@workflow.defn(name=WORKFLOW_NAME, sandboxed=SANDBOXED)
class BoundLoopWorkflow:
    @workflow.init
    def __init__(self, inp: RunInput) -> None:
        self._inp = inp
        # The run's tools: this worker's, its MCP tools and those it was admitted with.
        served = catalog.served_on(workflow.info().task_queue)
        self._tools = RunTools(served.toolset, inp)
        carried = inp.carried
        # The conversation's bookkeeping between steps (the driver keeps it up to date).
        self._ex = driver.Exchange()
        if carried is not None:
            self._state = carried.state
            self._tools.offer_recall(self._state)
            self._ex.unsent = list(carried.unsent)
            self._base: ConversationRef | None = carried.base
            self._ex.sent = carried.base.meta
            self._processing_before = carried.processing_seconds
        else:
            self._state = core.LoopState(settings=inp.settings, allowed_tools=list(inp.tools))
            self._base = None
            self._processing_before = 0.0
            follows = inp.turn.follows if inp.turn is not None else None
            if follows is not None:  # a session's next turn: its conversation so far
                self._state.conversation = follows.conversation
                self._ex.unsent = list(follows.unsent)
                self._base = follows.base
                self._ex.sent = follows.base.meta if follows.base else ConversationMeta()
        self._waited = 0.0  # approval waits of this run (excluded from processing time)
        self._patches = Patches()  # the bundles, asked first when the run starts
        self._decisions_bound = False  # DECISIONS_BOUND, decided when the run starts
        # What tool idempotency keys are scoped by (RUN_SCOPED_KEYS), set when it starts.
        self._key_scope = workflow.info().workflow_id
        self._session_grants = False  # SESSION_GRANTS, decided when the run starts
        self._started = workflow.now()
        self._cancel_reason: str | None = None
        self._interrupted: str | None = None  # the `interrupt` signal's reason
        self._routes = Routing()  # which task queue the next activity goes to
        # Approver public keys: the worker's (like its toolset) and the run policy's.
        self._tools.keys = signatures.run_keys(served.approver_keys,
                                         self._state.policy.approver_keys)
        self._budget = RunBudget(self._state)  # the run's side of its shared budget
        self._show = Publisher(
            self._state, WorkflowStream(prior_state=carried.stream if carried else None),
            carried=carried is not None, search_attributes=bool(inp.search_attributes))
        # The model and tool activities (the driver's requests and attempts).
        self._calls = Calls(self._state, self._ex, self._tools, self._routes, self._show,
                            inp.instructions, self._base, self._patched,
                            self._processing_seconds)

    # --- run -----------------------------------------------------------------------

    @workflow.run
    async def run(self, inp: RunInput) -> RunResult:
        self._patches.start()
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
        self._show.sparse = bool(inp.search_attributes) and self._patched(SPARSE_UPSERTS)
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
        elif self._tools.unknown:
            self._tools.refuse_unknown(self._tools.unknown)
        if own_schemas:
            self._tools.own_schemas()
        if stricter:
            self._tools.ask_as_admitted()
        if inp.carried is None and self._session_grants:
            self._inherit_grants(inp)
        if inp.carried is None:
            first = [user_message(inp.question)]
            self._ex.unsent = [*self._ex.unsent, *first]
            self._state.conversation = self._state.conversation.extend(first)
            self._state.log("run_started")
        self._run = driver.Run(self._state, self._tools.rules, self._key_scope, _View(self),
                               self._ex, charged=self._charged)
        reason = (core.cancelled(self._state, self._cancel_reason, step_unfinished=False)
                  if cancelled_first else await self._drive())
        if reason is None:  # continue-as-new was requested
            await self._budget.settled()
            self._show.stream_events()
            self._show.stream.detach_pollers()  # readers follow to the next run
            await workflow.wait_condition(workflow.all_handlers_finished)
            carry = self._carry()
            reason = core.check_payload(self._state, "carried_state", payload_bytes(carry))
            if reason is None:
                workflow.continue_as_new(carry)
        if approvals.pending_count(self._state) and self._patched(WITHDRAWN_ON_STOP):
            approvals.withdraw(self._state)
        await self._budget.release()
        self._show.publish()
        workflow.logger.info("run stopped", extra={"reason": reason.value,
                                                   "step": self._state.steps})
        self._show.stream_events()
        self._show.stream.detach_pollers()  # waiting readers return; they read the end closed
        await workflow.wait_condition(workflow.all_handlers_finished)
        result = self._result()
        self._show.topic.publish(StreamResult(result=result))
        if reason != StopReason.COMPLETED:
            # Temporal's own status says the run did not succeed (the Web UI list shows
            # it Failed, not green Completed); the RunResult rides along as the detail.
            # A cancelled run ends this way too: the SDK's Canceled carries no details.
            raise ApplicationError(f"run stopped: {reason.value} — {NEXT_CHECK[reason]}",
                                   result, type=errors.RUN_STOPPED, non_retryable=True)
        return result

    async def _admit(self, inp: RunInput) -> None:
        """The run's effective settings under the worker's operator policy, resolved once
        by a local activity whose result is in history (replay and continue-as-new, which
        carries the settings in the state, never ask the worker's current policy)."""
        # As the run was started (the workflow upserts only its own Boundloop* ones).
        attributes = ({pair.key.name: pair.value
                       for pair in workflow.info().typed_search_attributes
                       if isinstance(pair.value, str)}
                      if self._patched(ADMIT_ATTRIBUTES) else {})
        admission = await workflow.execute_local_activity_method(
            Admissions.admit_run, AdmitRequest(settings=inp.settings, tools=list(inp.tools),
                                         mcp_tools=list(self._tools.mcp.values()),
                                         search_attributes=attributes),
            start_to_close_timeout=options.ADMIT_TIMEOUT)
        if admission.unknown:
            if self._patched(UNKNOWN_TOOLS_NAMED):
                raise ApplicationError(
                    unknown_tools_line(admission.unknown, admission.served,
                                       workflow.info().task_queue),
                    type=errors.UNKNOWN_TOOLS, non_retryable=True)
            self._tools.refuse_unknown(admission.unknown)
        if admission.settings is None:
            raise ApplicationError(
                "the operator's policy refuses this run: "
                + "; ".join(r.line() for r in admission.refusals),
                *[r.model_dump() for r in admission.refusals],
                type=errors.POLICY_REFUSED, non_retryable=True)
        self._state.settings = admission.settings
        self._tools.admit(admission)
        self._tools.offer_recall(self._state)
        served = catalog.served_on(workflow.info().task_queue)
        self._tools.keys = signatures.run_keys(served.approver_keys,
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
                                       keys=self._tools.keys)
        for grant in kept:
            self._state.grants.append(grant)
            self._state.log("approval_inherited", tool=grant.tool, call_id=grant.call_id,
                            detail=f"remembered for the session by "
                                   f"{preview(grant.approver, 100)}: {grant.text}")

    async def _drive(self) -> StopReason | None:
        """Carry out the driver's commands (boundloop/core/driver.py) until the run stops
        or should continue as new; a cancel while a command is out is thrown into it."""
        steps = self._run.steps()
        command = next(steps)
        while True:
            try:
                answer = await self._carry_out(command)
            except asyncio.CancelledError:
                advance = functools.partial(steps.throw, driver.Cancelled())
            else:
                advance = functools.partial(steps.send, answer)
            try:
                command = advance()
            except StopIteration as done:
                result: StopReason | None = done.value
                return result

    async def _carry_out(self, command: driver.Command) -> object:
        match command:
            case driver.AskPatch(name):
                return self._patched(name)
            case driver.Publish(attributes):
                self._show.publish(attributes=attributes)
                return None
            case driver.BuildModelRequest(plan):
                workflow.logger.info("step started", extra={"step": plan.step})
                return self._calls.build_model_request(plan)
            case driver.ReserveBudget():
                return await self._budget.reserve(command)
            case driver.RequestModel(plan):
                return await self._calls.send_model_request(plan)
            case driver.AttemptModel():
                return await self._calls.attempt_model(command)
            case driver.Sleep(seconds):
                await workflow.sleep(seconds)
                return None
            case driver.SettleBudget(step, amount):
                self._budget.settle(step, amount)
                return None
            case driver.BuildToolRequest(step, plan, timeout):
                return self._calls.build_tool_request(step, plan, timeout)
            case driver.RunTool():
                return await self._calls.run_tool(command)
            case driver.AwaitDecision(approval, timeout):
                return await self._await_decision(approval, timeout)
            case driver.LookUpEarlier(keys):
                return await self._look_up_earlier(keys)
        raise AssertionError(f"unknown command {command!r}")

    # --- model ---------------------------------------------------------------------

    _charged = False  # CHARGED_ATTEMPTS, asked first thing in `run`

    def _fixed_bytes(self) -> int:
        return self._tools.fixed_bytes(self._state, self._inp.instructions)

    async def _await_decision(self, approval: core.Approval, timeout: timedelta) -> bool:
        """Whether the approval was decided within `timeout`; the wait is not counted as
        processing time."""
        began = workflow.now()
        try:
            await workflow.wait_condition(lambda: approval.status != "pending",
                                          timeout=timeout)
            decided = True
        except builtins.TimeoutError:
            decided = False
        # Not in a `finally`: a worker that shuts down or evicts this run closes the
        # coroutine outside the workflow's event loop, where no workflow API may run (a
        # cancelled run ends right away, so its last wait need not be counted).
        self._waited += (workflow.now() - began).total_seconds()
        return decided

    async def _look_up_earlier(self, keys: list[str]) -> carry.EarlierCalls:
        """What the earlier Temporal runs hold of `keys`, read from their continue-as-new
        inputs by a local activity (in history: a replay does not read again)."""
        run_id = workflow.info().continued_run_id
        assert run_id is not None  # state.earlier comes only with continue-as-new
        try:
            return await workflow.execute_local_activity(
                earlier_calls, carry.EarlierRequest(run_id=run_id, keys=keys),
                start_to_close_timeout=options.EARLIER_CALLS_TIMEOUT,
                summary=f"earlier calls · {len(keys)} keys")
        except ActivityError as err:
            if is_cancelled_exception(err):
                raise asyncio.CancelledError from None
            raise

    # --- approvals: signals, update, query -----------------------------------------

    @workflow.signal
    def approve(self, decision: Decision) -> None:
        self._signal_decision(decision.model_copy(update={"approve": True}))

    @workflow.signal
    def reject(self, decision: Decision) -> None:
        self._signal_decision(decision.model_copy(update={"approve": False}))

    def _signed(self) -> signatures.Context:
        return signatures.Context(keys=self._tools.keys, workflow_id=workflow.info().workflow_id,
                                  now=workflow.now())

    def _decision_problem(self, decision: Decision) -> str | None:
        return approvals.check(self._state, decision, self._tools.rules, self._signed(),
                               in_session=self._session_grants,
                               run=workflow.info().first_execution_run_id,
                               bound=self._decisions_bound)

    def _signal_decision(self, decision: Decision) -> None:
        problem = self._decision_problem(decision)
        if problem is not None:
            workflow.logger.warning("approval signal ignored", extra={
                "call_id": preview(decision.call_id, 60), "problem": problem})
            return
        approvals.apply(self._state, decision, workflow.now(), self._tools.rules)
        self._show.publish()

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
        approvals.apply(self._state, decision, workflow.now(), self._tools.rules)
        self._show.publish()
        return "approved" if decision.approve else "rejected"

    @decide.validator
    def _validate_decide(self, decision: Decision) -> None:
        problem = self._decision_problem(decision)
        if problem is not None:
            raise ApplicationError(problem, type=errors.INVALID_DECISION, non_retryable=True)

    @workflow.query
    def status(self) -> RunStatus:
        return RunStatus(
            status=status_of(self._state), reason=self._state.reason, steps=self._state.steps,
            tool_executions=self._state.tool_executions,
            total_tokens=self._state.usage.total_tokens, cost_usd=cost_of(self._state),
            pending=[a for a in self._state.approvals if a.status == "pending"],
            events=list(self._state.events), question=self._inp.question,
            model=self._state.settings.model, limits=self._state.limits,
            grants=list(self._state.grants), run=workflow.info().first_execution_run_id,
            context_tokens=ctx.estimate(self._state, self._fixed_bytes),
            events_dropped=self._state.events_dropped)

    # --- helpers -------------------------------------------------------------------

    def _patched(self, patch: str) -> bool:
        return self._patches.patched(patch)

    def _processing_seconds(self) -> float:
        elapsed = (workflow.now() - self._started).total_seconds()
        return self._processing_before + elapsed - self._waited

    def _carry(self) -> RunInput:
        info = workflow.info()
        base = ConversationRef(workflow_id=info.workflow_id, run_id=info.run_id,
                               meta=self._ex.sent)
        segment = self._hand_over() if self._patched(CONSTANT_CARRY) else None
        carried = Carried(state=self._state, base=base, unsent=self._calls.wire_items(),
                          processing_seconds=self._processing_seconds(),
                          stream=self._show.stream.get_state(),
                          tools=self._tools.admitted if self._patched(CARRIED_RULES) else [],
                          segment=segment)
        return self._inp.model_copy(update={"carried": carried})

    def _hand_over(self) -> carry.Segment:
        """Make the state constant in size for continue-as-new (CONSTANT_CARRY): the
        tables go into the segment this run hands over, the logs keep their newest
        records, the stream its newest items."""
        state = self._state
        previous = workflow.info().continued_run_id if state.earlier is not None else None
        segment = carry.hand_over(state, previous)
        self._show.hand_over()
        return segment

    def _events_shown(self, excess: int = 0) -> list[core.Event]:
        """The event log as a RunResult shows it: the newest events, after one
        `events_dropped:N` standing for the N older ones (no longer carried, or left out
        so the result fits a payload)."""
        return carry.shown_events(self._state.events, self._state.events_dropped, excess)

    def _result(self) -> RunResult:
        """The RunResult; when the event log would take it over the payload limit, the
        oldest events give way (the counters and the reason are always whole)."""
        s, info = self._state, workflow.info()
        assert s.reason is not None
        result = RunResult(
            reason=s.reason, text=s.text, steps=s.steps, tool_executions=s.tool_executions,
            input_tokens=s.usage.input_tokens, output_tokens=s.usage.output_tokens,
            total_tokens=s.usage.total_tokens, usage_unknown=s.usage.unknown_steps > 0,
            usage_estimated=s.usage.estimated, cost_usd=cost_of(s), cost_units=s.cost_units,
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
        closing = sessions.closing_outputs(self._ex.open_calls, self._ex.answered, s.reason)
        wire = [{"type": "function_call_output", "call_id": call_id, OUTPUT_REF: key}
                if key is not None else function_call_output(call_id, envelope.to_output())
                for call_id, envelope, key in closing]
        base = (ConversationRef(workflow_id=info.workflow_id, run_id=info.run_id,
                                meta=self._ex.sent) if self._ex.turn_returned else self._base)
        conversation = s.conversation.extend(
            [function_call_output(call_id, envelope.to_output())
             for call_id, envelope, _ in closing])
        return sessions.Continuation(base=base, unsent=[*self._calls.wire_items(), *wire],
                                     conversation=conversation)


def _refuse(refusal: Refusal) -> NoReturn:
    """Fail the run as refused by the operator's policy (`PolicyRefused` for its starter),
    before any command of its own."""
    raise ApplicationError("the operator's policy refuses this run: " + refusal.line(),
                           refusal.model_dump(), type=errors.POLICY_REFUSED,
                           non_retryable=True)


class _View:
    """What the driver reads of the run's surroundings (driver.View)."""

    def __init__(self, run: BoundLoopWorkflow) -> None:
        self._run = run

    def processing_seconds(self) -> float:
        return self._run._processing_seconds()

    def now(self) -> datetime:
        return workflow.now()

    def continue_as_new_suggested(self) -> bool:
        return workflow.info().is_continue_as_new_suggested()

    def interrupted(self) -> str | None:
        return self._run._interrupted

    def cancel_reason(self) -> str | None:
        return self._run._cancel_reason

    def fixed_bytes(self) -> int:
        return self._run._fixed_bytes()
