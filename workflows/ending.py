"""The end of a run: continue-as-new with the state it hands over, or the stop with its
RunResult (a run that did not complete fails with the result as the failure's detail).

Every ending settles or releases the run's side of its shared budget, publishes its last
status and closes its stream; the result and the carried input fit a payload.
"""

from __future__ import annotations

from collections.abc import Callable

from temporalio import workflow
from temporalio.exceptions import ApplicationError

from boundloop.workflows.admission import RunTools
from boundloop.workflows.calls import Calls
from boundloop.workflows.patches import CARRIED_RULES, CONSTANT_CARRY, WITHDRAWN_ON_STOP
from boundloop.workflows.publish import Publisher, cost_of
from boundloop.workflows.spending import RunBudget
from boundloop.workflows.start import Start

with workflow.unsafe.imports_passed_through():
    from boundloop import errors
    from boundloop.contracts import (
        OUTPUT_REF,
        Carried,
        ConversationRef,
        RunInput,
        RunResult,
        StreamResult,
    )
    from boundloop.core import approvals, carry, driver
    from boundloop.core import loop as core
    from boundloop.core import session as sessions
    from boundloop.core.conversation import function_call_output
    from boundloop.core.limits import MAX_PAYLOAD_VALUE_BYTES, payload_bytes
    from boundloop.core.reasons import NEXT_CHECK, StopReason


class Ending:
    """How the run ends: what it carries to its next Temporal run, or its RunResult."""

    def __init__(self, inp: RunInput, state: core.LoopState, ex: driver.Exchange,
                 tools: RunTools, calls: Calls, show: Publisher, budget: RunBudget,
                 start: Start, base: ConversationRef | None,
                 patched: Callable[[str], bool],
                 processing_seconds: Callable[[], float]) -> None:
        self._inp, self._state, self._ex, self._tools = inp, state, ex, tools
        self._calls, self._show, self._budget, self._start = calls, show, budget, start
        self._base, self._patched = base, patched
        self._processing_seconds = processing_seconds

    async def continue_as_new(self) -> StopReason:
        """Continue as new with the run's state; the reason it stops instead, when the
        state it would carry does not fit a payload."""
        await self._budget.settled()
        self._show.stream_events()
        self._show.stream.detach_pollers()  # readers follow to the next run
        await workflow.wait_condition(workflow.all_handlers_finished)
        carried = self._carry()
        reason = core.check_payload(self._state, "carried_state", payload_bytes(carried))
        if reason is None:
            workflow.continue_as_new(carried)
        return reason

    async def stop(self, reason: StopReason,
                   cancel_reason: Callable[[], str | None]) -> RunResult:
        """The run's RunResult, returned when it completed, else raised as the detail of
        a `RunStopped` failure; `cancel_reason` is read last (a signal may still come)."""
        if approvals.pending_count(self._state) and self._patched(WITHDRAWN_ON_STOP):
            approvals.withdraw(self._state)
        await self._budget.release()
        self._show.publish()
        workflow.logger.info("run stopped", extra={"reason": reason.value,
                                                   "step": self._state.steps})
        self._show.stream_events()
        self._show.stream.detach_pollers()  # waiting readers return; they read the end closed
        await workflow.wait_condition(workflow.all_handlers_finished)
        result = self._result(cancel_reason())
        self._show.topic.publish(StreamResult(result=result))
        if reason != StopReason.COMPLETED:
            # Temporal's own status says the run did not succeed (the Web UI list shows
            # it Failed, not green Completed); the RunResult rides along as the detail.
            # A cancelled run ends this way too: the SDK's Canceled carries no details.
            raise ApplicationError(f"run stopped: {reason.value} — {NEXT_CHECK[reason]}",
                                   result, type=errors.RUN_STOPPED, non_retryable=True)
        return result

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

    def _result(self, cancel_reason: str | None) -> RunResult:
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
            cancel_reason=cancel_reason if s.reason == StopReason.CANCELLED else None,
            continuation=self._continuation() if self._inp.turn is not None else None,
            session_grants=[g for g in s.grants if g.scope == "session"]
            if self._start.session_grants else [], model_attempts=list(s.model_attempts),
            processing_seconds=self._processing_seconds(),
            per_tool_calls=dict(s.per_tool_calls))
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
