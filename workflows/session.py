"""The BoundloopSession workflow: one conversation across turns.

A user message arrives by the validated update `say`; it runs one bounded turn as a
child workflow of the BoundLoop workflow (same loop, limits and approvals) and returns
that turn's RunResult, however the turn ended. The next turn continues the conversation
by reference (`boundloop.core.session`); between turns the session continues as new when
Temporal suggests it, carrying only its counters and that reference. The decisions are
in `boundloop.core.session`; this is the shell.
"""

from __future__ import annotations

import builtins
import contextlib
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDReusePolicy
from temporalio.exceptions import (
    ApplicationError,
    ChildWorkflowError,
    WorkflowAlreadyStartedError,
)

from boundloop.workflows import SANDBOXED
from boundloop.workflows.children import starter_text_attributes
from boundloop.workflows.loop import BoundLoopWorkflow

with workflow.unsafe.imports_passed_through():
    from boundloop import errors
    from boundloop import search_attributes as sa
    from boundloop.contracts import (
        SESSION_WORKFLOW,
        WORKFLOW_NAME,
        CancelRequest,
        RunInput,
        RunResult,
        SayRequest,
        SessionInput,
        SessionStatus,
        run_input,
    )
    from boundloop.core import session as core
    from boundloop.core.canonical import preview
    from boundloop.core.rules import Grant


#: The patch under which a turn whose workflow id another workflow holds is refused in a
#: sentence (before it, the `say` failed with Temporal's bare "already started"), and a
#: turn's id is never reused even once that workflow has closed.
TURN_ID_TAKEN = "turn-id-taken"
#: The patch under which each turn starts with the session's `BoundloopTenant` search
#: attribute (before it, turns started without one, so a policy deriving the budget key
#: from it refused every turn).
TURN_TENANT = "turn-tenant"
#: The patch under which each turn starts with every search attribute of text the session
#: was started with, not its tenant only (a policy deriving the budget key from another
#: one refused every turn).
TURN_ATTRIBUTES = "turn-attributes"
#: The patch under which a turn the operator's policy refused fails its `say` with the
#: policy's refusal (each field named), not just the failure's type.
TURN_REFUSAL_NAMED = "turn-refusal-named"
#: The patch under which the approvals a turn remembered for the session are kept by it
#: and handed to each next turn (each applies those its own policy allows).
SESSION_GRANTS = "session-grants"
#: The patch under which a session started by a cron schedule or a retry (Temporal sets
#: `continued_run_id` on those too) drops the grants and conversation of its input.
CARRIED_GENUINE = "carried-genuine"


@workflow.defn(name=SESSION_WORKFLOW, sandboxed=SANDBOXED)
class BoundloopSessionWorkflow:
    @workflow.init
    def __init__(self, inp: SessionInput) -> None:
        self._inp = inp
        self._state = inp.state or core.SessionState(idle_since=workflow.now().isoformat())
        info = workflow.info()
        if (self._state.grants or self._state.follows) and (
                info.continued_run_id is None
                or (not core.continued_by_itself(info.continued_run_id, info.cron_schedule,
                                                 info.attempt)
                    and workflow.patched(CARRIED_GENUINE))):
            # Only continue-as-new hands grants and the conversation on: a session's
            # starter cannot bring approvals, nor another conversation for the model (a
            # cron schedule's or a retry's next run has the starter's input).
            self._state = self._state.model_copy(update={"grants": [], "follows": None})
        self._running: str | None = None  # the running turn's workflow id
        self._end_asked = False
        #: Messages waiting for a turn (busy `queue` / `interrupt`), by arrival number.
        self._waiting: list[int] = []
        self._arrived = 0
        self._interrupting: str | None = None  # the turn asked to stop for them

    @workflow.run
    async def run(self, inp: SessionInput) -> SessionStatus:
        state, limits = self._state, inp.limits
        while True:
            if self._running is None and self._waiting:
                # A waiting message starts its turn in this workflow task.
                await workflow.wait_condition(lambda: self._running is not None
                                              or not self._waiting)
                continue
            if self._running is None:
                ended = "requested" if self._end_asked else core.end_reason(state, limits)
                left = (limits.idle_seconds
                        - (workflow.now() - _at(state.idle_since)).total_seconds())
                if ended is None and left <= 0:
                    ended = "idle"
                if ended is not None:
                    state.ended = ended  # a `say` from now on is refused
                    break
                if workflow.info().is_continue_as_new_suggested():
                    await workflow.wait_condition(workflow.all_handlers_finished)
                    if self._running is None:
                        workflow.continue_as_new(inp.model_copy(update={"state": state}))
                    continue
                # Timing out means idle: checked at the top, where a turn just begun wins.
                with contextlib.suppress(builtins.TimeoutError):
                    await workflow.wait_condition(
                        lambda: self._running is not None or self._end_asked
                        or workflow.info().is_continue_as_new_suggested(),
                        timeout=timedelta(seconds=left))
            else:
                await workflow.wait_condition(lambda: self._running is None)
        workflow.logger.info("session ended", extra={"reason": state.ended})
        await workflow.wait_condition(workflow.all_handlers_finished)
        return self.status()

    # --- messages ---------------------------------------------------------------------

    @workflow.update
    async def say(self, req: SayRequest) -> RunResult:
        # Checked again here: two messages in one workflow task both pass the validator.
        self._refuse_if_busy()
        state = self._state
        if self._running is not None or self._waiting:
            await self._wait_for_turn()
        state.turns += 1
        turn_id = core.turn_id(workflow.info().workflow_id, state.turns)
        self._running = turn_id
        try:
            settings = self._inp.settings.model_copy(update={"limits": core.turn_limits(
                self._inp.settings.limits, self._inp.limits, state)})
            grants = workflow.patched(SESSION_GRANTS)
            # The child's input (not a command): built as any run's is.
            run = run_input(req.message, instructions=self._inp.instructions,
                            settings=settings, tools=self._inp.tools,
                            mcp_tools=self._inp.mcp_tools,
                            search_attributes=self._inp.search_attributes,
                            turn=core.TurnOf(session_id=workflow.info().workflow_id,
                                             turn=state.turns, follows=state.follows,
                                             grants=state.grants if grants else []))
            handle = await self._start_turn(run, turn_id, req.message)
            result = await self._result_of(handle, state.turns)
        finally:
            self._running = None
            state.idle_since = workflow.now().isoformat()
        assert result.continuation is not None  # every turn's RunResult carries one
        if grants:  # the turn's own, and those it was given that it still applied
            state.grants = _merged(state.grants, result.session_grants)
        core.record_turn(state, core.TurnSummary(
            turn=state.turns, workflow_id=turn_id, reason=result.reason, steps=result.steps,
            tool_executions=result.tool_executions, total_tokens=result.total_tokens),
            input_tokens=result.input_tokens, output_tokens=result.output_tokens,
            cost_usd=result.cost_usd, follows=result.continuation,
            now=workflow.now().isoformat())
        workflow.logger.info("turn ended", extra={"reason": result.reason.value,
                                                  "step": result.steps})
        return result

    @say.validator
    def _validate_say(self, req: SayRequest) -> None:
        self._refuse_if_busy()

    @workflow.update
    async def end(self) -> SessionStatus:
        """End the session; a running turn is cancelled first (it ends `cancelled`)."""
        if self._state.ended is not None:
            raise ApplicationError(f"the session has ended (reason: {self._state.ended})",
                                   type=errors.SESSION_REFUSED, non_retryable=True)
        self._end_asked = True
        if self._running is not None:
            # Asked of the turn's workflow as `boundloop cancel` asks it: the RunResult
            # then comes back through `say` as for any other stop.
            turn = workflow.get_external_workflow_handle(self._running)
            # A turn that closed meanwhile (its result not yet handled here) takes neither:
            # the session then just ends after it.
            with contextlib.suppress(Exception):
                await turn.signal(BoundLoopWorkflow.cancel_reason,
                                  CancelRequest(reason="session ended"))
                await turn.cancel()
        await workflow.wait_condition(lambda: self._state.ended is not None)
        return self.status()

    @workflow.query
    def status(self) -> SessionStatus:
        s, limits = self._state, self._inp.limits
        idle_until = None
        if self._running is None and s.ended is None:
            idle_until = (_at(s.idle_since)
                          + timedelta(seconds=limits.idle_seconds)).isoformat()
        return SessionStatus(
            session_id=workflow.info().workflow_id,
            status="ended" if s.ended else ("running" if self._running else "idle"),
            ended=s.ended, turns=s.turns, limits=limits, current_turn=self._running,
            last=s.last, steps=s.steps, tool_executions=s.tool_executions,
            input_tokens=s.input_tokens, output_tokens=s.output_tokens,
            total_tokens=s.total_tokens, tokens_left=core.tokens_left(s, limits),
            cost_usd=s.cost_usd, idle_until=idle_until, model=self._inp.settings.model,
            waiting=len(self._waiting), grants=list(s.grants),
            tenant=workflow.info().typed_search_attributes.get(sa.TENANT))

    # --- helpers ----------------------------------------------------------------------

    async def _wait_for_turn(self) -> None:
        """Wait, in arrival order, until no turn runs; with `interrupt`, first ask the
        running turn to stop at its next safe point (once per turn)."""
        self._arrived += 1
        me = self._arrived
        self._waiting.append(me)
        try:
            if (self._inp.limits.busy == "interrupt" and self._running is not None
                    and self._interrupting != self._running):
                self._interrupting = self._running
                turn = workflow.get_external_workflow_handle(self._running)
                # A turn that ended meanwhile takes no signal: this message just waits.
                with contextlib.suppress(Exception):
                    await turn.signal(BoundLoopWorkflow.interrupt,
                                      CancelRequest(reason=core.INTERRUPTED))
            await workflow.wait_condition(
                lambda: self._running is None and self._waiting[0] == me)
        finally:
            self._waiting.remove(me)
        # The session may have ended (or run out of turns) while this message waited.
        problem = core.refusal(self._state, self._inp.limits, None)
        if self._end_asked or self._state.ended:
            problem = problem or "the session ended while the message waited"
        if problem is not None:
            raise ApplicationError(problem, type=errors.SESSION_REFUSED, non_retryable=True)

    def _refuse_if_busy(self) -> None:
        problem = core.refusal(self._state, self._inp.limits, self._running,
                               len(self._waiting))
        if self._end_asked and problem is None:
            problem = "the session is ending; start a new one"
        if problem is not None:
            raise ApplicationError(problem, type=errors.SESSION_REFUSED, non_retryable=True)

    async def _start_turn(self, run: RunInput, turn_id: str, message: str
                          ) -> workflow.ChildWorkflowHandle[Any, RunResult]:
        """Start the turn's child workflow. Its id may be taken by a workflow this session
        did not start (a raw Temporal client; `boundloop` refuses such ids): that turn is
        then refused in a sentence, counted, so the next one has an id of its own."""
        summary = f"turn {self._state.turns}: {preview(message, 100)}"
        if not workflow.patched(TURN_ID_TAKEN):
            return await workflow.start_child_workflow(
                WORKFLOW_NAME, run, id=turn_id, result_type=RunResult, static_summary=summary)
        try:
            # Never reused, even once closed: ids scope the side effects' idempotency keys.
            return await workflow.start_child_workflow(
                WORKFLOW_NAME, run, id=turn_id, result_type=RunResult, static_summary=summary,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                search_attributes=self._turn_attributes())
        except WorkflowAlreadyStartedError:
            raise ApplicationError(
                f"turn {self._state.turns}'s workflow id {turn_id!r} is already used by a "
                "workflow this session did not start; the message was not run: send it "
                "again (the next turn has an id of its own)",
                type=errors.TURN_FAILED, non_retryable=True) from None

    def _turn_attributes(self) -> TypedSearchAttributes | None:
        """The search attributes the session's starter gave it with text values (its
        tenant, or any other an operator's `budget.key_from` names), which each turn
        carries as a run started with them does. Never a message's: the sender of a
        `say` gives the turn its text only."""
        given = workflow.info().typed_search_attributes
        text = starter_text_attributes()
        if (any(pair.key.name != sa.TENANT.name for pair in text)
                and workflow.patched(TURN_ATTRIBUTES)):
            return TypedSearchAttributes(text)
        tenant = given.get(sa.TENANT)
        if tenant is None or not workflow.patched(TURN_TENANT):
            return None
        return TypedSearchAttributes([SearchAttributePair(sa.TENANT, tenant)])

    async def _result_of(self, handle: workflow.ChildWorkflowHandle[Any, RunResult],
                         turn: int) -> RunResult:
        """The turn's RunResult however it ended: a stopped turn fails its workflow with
        `RunStopped` carrying it (docs/design.md, "How a run ends")."""
        try:
            return await handle
        except ChildWorkflowError as err:
            cause = err.cause
            if (isinstance(cause, ApplicationError) and cause.type == errors.RUN_STOPPED
                    and cause.details):
                return RunResult.model_validate(cause.details[0])
            if (isinstance(cause, ApplicationError) and cause.type == errors.POLICY_REFUSED
                    and workflow.patched(TURN_REFUSAL_NAMED)):
                raise ApplicationError(f"turn {turn} ({handle.id}) was refused: "
                                       f"{cause.message}", type=errors.TURN_FAILED,
                                       non_retryable=True) from None
            kind = cause.type if isinstance(cause, ApplicationError) else type(cause).__name__
            # The turn left no RunResult (its tools are not served, it was terminated):
            # the conversation goes on from the turn before it.
            raise ApplicationError(f"turn {turn} ({handle.id}) ended without a RunResult: "
                                   f"{kind}", type=errors.TURN_FAILED,
                                   non_retryable=True) from None




def _merged(kept: list[Grant], new: list[Grant]) -> list[Grant]:
    """The session's grants after a turn: those it had (a turn whose policy applies fewer
    does not take them from later turns) and the turn's new ones, each once."""
    return [*kept, *(g for g in new if g not in kept)]


def _at(iso: str) -> datetime:
    return datetime.fromisoformat(iso)
