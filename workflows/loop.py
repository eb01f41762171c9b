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
    TimeoutError,
    TimeoutType,
    is_cancelled_exception,
)

from boundloop.workflows import SANDBOXED, options
from boundloop.workflows.admission import RunTools
from boundloop.workflows.attempts import Attempts, Failed, Routing, body_started
from boundloop.workflows.attempts import attempts as counted_attempts
from boundloop.workflows.patches import (
    ADMIT_ATTRIBUTES,
    ADMITTED_SCHEMAS,
    CARRIED_BY_CONTINUE,
    CARRIED_GENUINE,
    CARRIED_RULES,
    CHARGED_ATTEMPTS,
    CONTEXT_WINDOW,
    COUNTED_RETRIES,
    DECISIONS_BOUND,
    OPERATOR_POLICY,
    ROUTE_WHEN_NEEDED,
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
    from boundloop.activities.model import ModelActivities
    from boundloop.activities.tools import ToolActivities
    from boundloop.contracts import (
        OUTPUT_REF,
        WORKFLOW_NAME,
        AdmitRequest,
        CancelRequest,
        Carried,
        ConversationRef,
        Decision,
        ModelRequest,
        Reset,
        RunInput,
        RunResult,
        RunStatus,
        StreamResult,
        ToolRequest,
    )
    from boundloop.core import approvals, driver, mcp_tools, retries, signatures
    from boundloop.core import context as ctx
    from boundloop.core import loop as core
    from boundloop.core import model_failures as mf
    from boundloop.core import session as sessions
    from boundloop.core.canonical import preview
    from boundloop.core.conversation import (
        ConversationMeta,
        Item,
        function_call_output,
        user_message,
    )
    from boundloop.core.limits import MAX_PAYLOAD_VALUE_BYTES, payload_bytes
    from boundloop.core.operator import Refusal, unknown_tools_line
    from boundloop.core.reasons import NEXT_CHECK, StopReason
    from boundloop.core.turn import Turn
    from boundloop.tools import catalog


#: Failure kinds of model activity errors that carry no `ModelFailure` of their own.
MODEL_FAILURES = {
    errors.MODEL_RESPONSE_TOO_LARGE: mf.PAYLOAD_TOO_LARGE,  # over Temporal's payload limit
    errors.PAYLOADS_TOO_LARGE: mf.PAYLOAD_TOO_LARGE,
    errors.CONVERSATION_MISMATCH: mf.CONVERSATION_MISMATCH,
    errors.MODEL_ACTIVITY_FAILED: mf.WORKER_ERROR,  # our own code failed (worker log)
}


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
                self._request = self._model_request(plan)
                return payload_bytes(self._request)
            case driver.ReserveBudget():
                return await self._budget.reserve(command)
            case driver.RequestModel(plan):
                return await self._send_model_request(plan)
            case driver.AttemptModel():
                return await self._attempt_model(command)
            case driver.Sleep(seconds):
                await workflow.sleep(seconds)
                return None
            case driver.SettleBudget(step, amount):
                self._budget.settle(step, amount)
                return None
            case driver.BuildToolRequest(step, plan, timeout):
                self._tool_request = self._build_tool_request(step, plan, timeout)
                return payload_bytes(self._tool_request)
            case driver.RunTool():
                return await self._run_tool(command)
            case driver.AwaitDecision(approval, timeout):
                return await self._await_decision(approval, timeout)
        raise AssertionError(f"unknown command {command!r}")

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
             OUTPUT_REF: self._ex.refs[item["call_id"]]}
            if item.get("type") == "function_call_output" and item["call_id"] in self._ex.refs
            else item
            for item in self._ex.unsent]

    def _model_request(self, plan: core.StepPlan) -> ModelRequest:
        state = self._state
        return ModelRequest(
            step=plan.step,
            model=state.settings.model, api=state.settings.api, tools=list(state.allowed_tools),
            tool_choice=plan.tool_choice, instructions=self._inp.instructions,
            prior=self._ex.sent, new_items=self._wire_items(), expected=state.conversation,
            base=self._base, max_output_tokens=state.limits.max_output_tokens,
            stream=state.settings.stream,
            # The tools the run describes itself: its MCP tools, and any a deploy took
            # from this worker's toolset since the run was admitted (a call of one then
            # stops the run with `tool_unavailable`; a run that never calls it goes on).
            mcp_tools=self._tools.described_tools(state.allowed_tools))

    async def _send_model_request(self, plan: core.StepPlan) -> driver.Answered | StopReason:
        """The request's attempts as a run from before CHARGED_ATTEMPTS makes them: each
        provider failure counts (MODEL_BACKOFF, with the provider's Retry-After), attempts
        lost to a dead worker do not, Temporal retries them."""
        state, req = self._state, self._request
        limit = state.limits.model_timeout_seconds
        req = req.model_copy(update={"timeout_seconds": limit})
        attempts = Attempts(
            activity=ModelActivities.model_request, timeout_seconds=limit,
            lost=options.MODEL_RETRY, backoff=retries.MODEL_BACKOFF,
            retryable=options.MODEL_RETRYABLE, deadline_ends=True,
            summary=f"model step {plan.step} · {state.settings.model}",
            # Whatever a failed attempt streamed is void.
            on_failure=(lambda: self._show.topic.publish(Reset(step=plan.step))) if req.stream
            else None)
        out = await self._attempts(attempts, req, Turn)
        if not isinstance(out, Failed):
            self._routes.after_turn(out.worker_queue, out.cached,
                                    lambda: self._patched(ROUTE_WHEN_NEEDED))
            return driver.Answered(out)
        if out.deadline:
            return state.stop(StopReason.DEADLINE)
        failure = _model_failure(out.error, limit)
        workflow.logger.warning("model request failed", extra={
            "step": plan.step, "failure": failure.kind, "detail": failure.detail})
        state.log(f"{mf.EVENT_PREFIX}{failure.kind}", detail=failure.detail)
        return state.stop(self._failed(failure))

    _charged = False  # CHARGED_ATTEMPTS, asked first thing in `run`

    async def _attempt_model(self, c: driver.AttemptModel) -> Turn | driver.AttemptFailed:
        """One attempt of the step's model request, one activity Temporal does not retry
        (under CHARGED_ATTEMPTS); its failure as the driver counts it."""
        req, step = self._request, c.plan.step
        sent = req.model_copy(update={"timeout_seconds": c.silence_seconds,
                                      "answer_seconds": c.answer_seconds})
        wedged = c.answer_seconds + options.WEDGED_MARGIN
        try:
            turn: Turn = await workflow.execute_activity_method(
                ModelActivities.model_request, sent,
                start_to_close_timeout=timedelta(seconds=wedged),
                schedule_to_close_timeout=timedelta(seconds=max(c.remaining, 1.0)),
                heartbeat_timeout=options.HEARTBEAT_TIMEOUT,
                **self._routes.route(options.MODEL_ONCE),
                summary=f"model step {step} · {self._state.settings.model}")
        except ActivityError as err:
            if req.stream:  # its text is void, and so is any that arrives later
                self._show.topic.publish(Reset(step=step, attempt=f"{err.activity_id}.1"))
            return self._attempt_failed(err, c, wedged)
        if req.stream and turn.streamed is not None:
            self._show.complete_text(step, turn)
        self._routes.after_turn(turn.worker_queue, turn.cached,
                                lambda: self._patched(ROUTE_WHEN_NEEDED))
        return turn

    def _attempt_failed(self, err: ActivityError, c: driver.AttemptModel,
                        wedged: float) -> driver.AttemptFailed:
        cause = err.cause
        charge = mf.Charge.from_details(
            cause.details if isinstance(cause, ApplicationError)
            else cause.last_heartbeat_details if isinstance(cause, TimeoutError) else ())
        if is_cancelled_exception(err):
            return driver.AttemptFailed("cancelled")
        timeout = cause.type if isinstance(cause, TimeoutError) else None
        if timeout == TimeoutType.SCHEDULE_TO_CLOSE \
                or self._processing_seconds() >= self._state.limits.deadline_seconds:
            return driver.AttemptFailed("deadline", charge)
        shut_down = isinstance(cause, ApplicationError) and cause.type == errors.WORKER_SHUTDOWN
        if timeout == TimeoutType.HEARTBEAT or shut_down or (
                timeout == TimeoutType.SCHEDULE_TO_START and self._routes.on_holder()):
            # Its worker was lost, or shut down while it ran (a deploy's stop, which fails
            # the attempt with WorkerShutdown), or the holder never took it.
            if self._routes.on_holder():
                self._routes.holder = None
            return driver.AttemptFailed("lost", charge)
        failure = _model_failure(err, c.silence_seconds) \
            if timeout != TimeoutType.START_TO_CLOSE else mf.ModelFailure(
                kind=mf.TIMEOUT, detail=f"the attempt outlived its start-to-close timeout "
                f"({wedged:g} s): its worker was overloaded or wedged")
        workflow.logger.warning("model request failed", extra={
            "step": c.plan.step, "failure": failure.kind, "detail": failure.detail})
        asked = cause.next_retry_delay if isinstance(cause, ApplicationError) else None
        return driver.AttemptFailed(
            "failed", charge, failure, retryable=timeout == TimeoutType.START_TO_CLOSE or (
                isinstance(cause, ApplicationError) and cause.type in options.MODEL_RETRYABLE),
            asked_delay=asked.total_seconds() if asked is not None else None)

    async def _attempts(self, a: Attempts, arg: object, result_type: type[_R]) -> _R | Failed:
        """`a`'s counted attempts (workflows/attempts.py) within the run's deadline."""
        return await counted_attempts(
            a, arg, result_type, routes=self._routes,
            seconds_left=lambda: self._state.limits.deadline_seconds
            - self._processing_seconds(),
            counted=lambda: self._patched(COUNTED_RETRIES))

    # --- shared budget (workflows/budget.py) ----------------------------------------

    def _fixed_bytes(self) -> int:
        return self._tools.fixed_bytes(self._state, self._inp.instructions)

    # --- tools ---------------------------------------------------------------------

    def _build_tool_request(self, step: int, p: core.Execute, timeout: float) -> ToolRequest:
        state = self._state
        mcp = self._tools.mcp.get(p.call.name)  # an MCP tool: the activity calls its server
        return ToolRequest(tool=p.call.name,
                           call_id=p.call.call_id, step=step, arguments=p.arguments,
                           idempotency_key=p.idempotency_key,
                           max_result_bytes=state.limits.max_result_bytes,
                           timeout_seconds=timeout,
                           mcp=mcp_tools.call_target(mcp) if mcp is not None else None,
                           parameters_digest=self._tools.digests.get(p.call.name))

    async def _run_tool(self, command: driver.RunTool) -> core.ToolOutcome | driver.ToolFailed:
        p, local, req = command.plan, command.local, self._tool_request
        rule = self._tools.rules[p.call.name]
        workflow.logger.info("tool execution", extra={
            "step": command.step, "tool": p.call.name, "fingerprint": p.fingerprint,
            "local": local})
        attempts = Attempts(
            activity=ToolActivities.tool_execute, timeout_seconds=command.timeout_seconds,
            lost=options.TOOL_RETRY, backoff=rule.backoff, retryable=options.TOOL_RETRYABLE,
            deadline_ends=False,
            summary=f"tool {p.call.name} · call {self._state.tool_executions + 1}",
            local_id=p.idempotency_key if local else None)
        if local and self._routes.active:
            req = req.model_copy(update={"holder": self._routes.holder})
        outcome = await self._attempts(attempts, req, core.ToolOutcome)
        if not isinstance(outcome, Failed):
            if outcome.worker_queue is not None and self._routes.active:
                # A local tool ran in the worker that runs this run's tasks, not the
                # holder: its output is in that worker's cache, so the next request goes
                # there.
                self._routes.holder = outcome.worker_queue
            return outcome
        cause = outcome.error.cause
        kind = cause.type if isinstance(cause, ApplicationError) else None
        started = any(body_started(err.cause) for err in outcome.attempts)
        if kind in (errors.TOOL_UNAVAILABLE, errors.TOOL_ARGUMENTS_CHANGED):
            # Renamed or removed by a deploy since the run started: never retried.
            return driver.ToolFailed("unavailable", outcome.failures, started, detail=(
                preview(cause.message, 300) if isinstance(cause, ApplicationError)
                and kind == errors.TOOL_ARGUMENTS_CHANGED else None))
        if kind == errors.PAYLOADS_TOO_LARGE:
            # The body ran; its result could not be returned (never retried).
            workflow.logger.warning("tool result over the payload limit", extra={
                "step": command.step, "tool": p.call.name, "fingerprint": p.fingerprint})
            return driver.ToolFailed("result_too_large", outcome.failures, started)
        if kind == errors.TOOL_TIMED_OUT:
            return driver.ToolFailed("timed_out", outcome.failures, started)
        transient = isinstance(cause, TimeoutError) or kind == errors.TRANSIENT_TOOL_ERROR
        return driver.ToolFailed("transient" if transient else "fatal", outcome.failures,
                                 started)

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
            context_tokens=ctx.estimate(self._state, self._fixed_bytes))

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
        carried = Carried(state=self._state, base=base, unsent=self._wire_items(),
                          processing_seconds=self._processing_seconds(),
                          stream=self._show.stream.get_state(),
                          tools=self._tools.admitted if self._patched(CARRIED_RULES) else [])
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
            usage_estimated=s.usage.estimated, cost_usd=cost_of(s), cost_units=s.cost_units,
            events=list(s.events), workflow_id=info.workflow_id, run_id=info.run_id,
            answer_looks_like_tool_call=s.answer_looks_like_tool_call,
            cancel_reason=(self._cancel_reason or self._interrupted
                           if s.reason == StopReason.CANCELLED else None),
            continuation=self._continuation() if self._inp.turn is not None else None,
            session_grants=[g for g in s.grants if g.scope == "session"]
            if self._session_grants else [], model_attempts=list(s.model_attempts))
        excess = payload_bytes(result) - MAX_PAYLOAD_VALUE_BYTES
        if excess <= 0:
            return result
        return result.model_copy(update={"events": core.events_within(result.events, excess)})


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
        return sessions.Continuation(base=base, unsent=[*self._wire_items(), *wire],
                                     conversation=conversation)


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
