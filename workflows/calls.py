"""Carrying out the driver's model and tool commands: build each request, send each
attempt where the run's routing says (workflows/attempts.py), with the timeouts of
workflows/options.py, and turn a failed attempt into what the driver counts
(`driver.AttemptFailed`, `driver.ToolFailed`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    TimeoutError,
    TimeoutType,
    is_cancelled_exception,
)

from boundloop.workflows import options
from boundloop.workflows.admission import RunTools
from boundloop.workflows.attempts import Attempts, Failed, Routing, body_started
from boundloop.workflows.attempts import attempts as counted_attempts
from boundloop.workflows.patches import CONTEXT_WINDOW, COUNTED_RETRIES, ROUTE_WHEN_NEEDED
from boundloop.workflows.publish import Publisher

with workflow.unsafe.imports_passed_through():
    from boundloop import errors
    from boundloop.activities.model import ModelActivities
    from boundloop.activities.tools import ToolActivities
    from boundloop.contracts import OUTPUT_REF, ConversationRef, ModelRequest, Reset, ToolRequest
    from boundloop.core import context as ctx
    from boundloop.core import driver, mcp_tools, retries
    from boundloop.core import loop as core
    from boundloop.core import model_failures as mf
    from boundloop.core.canonical import preview
    from boundloop.core.conversation import Item
    from boundloop.core.limits import payload_bytes
    from boundloop.core.reasons import StopReason
    from boundloop.core.turn import Turn

_R = TypeVar("_R")

#: Failure kinds of model activity errors that carry no `ModelFailure` of their own.
MODEL_FAILURES = {
    errors.MODEL_RESPONSE_TOO_LARGE: mf.PAYLOAD_TOO_LARGE,  # over Temporal's payload limit
    errors.PAYLOADS_TOO_LARGE: mf.PAYLOAD_TOO_LARGE,
    errors.CONVERSATION_MISMATCH: mf.CONVERSATION_MISMATCH,
    errors.MODEL_ACTIVITY_FAILED: mf.WORKER_ERROR,  # our own code failed (worker log)
}


@dataclass
class Calls:
    """One run's model and tool activities."""

    state: core.LoopState
    ex: driver.Exchange
    tools: RunTools
    routes: Routing
    show: Publisher
    instructions: str | None
    #: Where the conversation the run was handed lives in history (None: nowhere yet).
    base: ConversationRef | None
    patched: Callable[[str], bool]
    processing_seconds: Callable[[], float]
    request: ModelRequest | None = None  # the step's model request, once built
    #: What the model requests' idempotency keys are scoped by (None: the workflow id).
    key_scope: str | None = None
    tool_request: ToolRequest | None = None  # the call's tool request, once built

    def failed(self, failure: mf.ModelFailure) -> StopReason:
        """A failed model request's stop: `context_exhausted` when the provider refused
        it as over the model's context window, `model_error` otherwise."""
        if failure.kind == mf.CONTEXT_LENGTH_EXCEEDED and self.patched(CONTEXT_WINDOW):
            return StopReason.CONTEXT_EXHAUSTED
        return StopReason.MODEL_ERROR

    def wire_items(self) -> list[Item]:
        """The unsent items as payloads carry them: a tool activity's output by reference
        (its idempotency key), since history already holds it (docs/history.md)."""
        return [
            {"type": "function_call_output", "call_id": item["call_id"],
             OUTPUT_REF: self.ex.refs[item["call_id"]]}
            if item.get("type") == "function_call_output" and item["call_id"] in self.ex.refs
            else item
            for item in self.ex.unsent]

    def build_model_request(self, plan: core.StepPlan) -> int:
        """Build the step's model request: its payload bytes."""
        state = self.state
        self.show.mark_step()
        self.request = ModelRequest(
            step=plan.step,
            model=state.settings.model, api=state.settings.api, tools=list(state.allowed_tools),
            tool_choice=plan.tool_choice, instructions=self.instructions,
            prior=self.ex.sent, new_items=self.wire_items(), expected=state.conversation,
            base=self.base, max_output_tokens=state.limits.max_output_tokens,
            stream=state.settings.stream,
            # The tools the run describes itself: its MCP tools, and any a deploy took
            # from this worker's toolset since the run was admitted (a call of one then
            # stops the run with `tool_unavailable`; a run that never calls it goes on).
            mcp_tools=self.tools.described_tools(state.allowed_tools),
            trim=ctx.trim_request(state, self.tools.fixed_bytes(state, self.instructions))
            if ctx.trims(state) else None, summary=state.summary, key_scope=self.key_scope)
        return payload_bytes(self.request)

    def build_summary_request(self, plan: core.StepPlan, summarize: ctx.Summarize) -> int:
        """Build the step's summary request (the `summarize` context strategy): the
        conversation by reference as the step's request has it, no tools, no stream;
        the activity sends the oldest part to summarize. Its payload bytes."""
        state = self.state
        self.request = ModelRequest(
            step=plan.step, model=state.settings.model, api=state.settings.api, tools=[],
            tool_choice="none", prior=self.ex.sent, new_items=self.wire_items(),
            expected=state.conversation, base=self.base,
            max_output_tokens=summarize.summary_tokens, summary=state.summary,
            summarize=summarize, key_scope=self.key_scope)
        return payload_bytes(self.request)

    async def send_model_request(self, plan: core.StepPlan) -> driver.Answered | StopReason:
        """The request's attempts as a run from before CHARGED_ATTEMPTS makes them: each
        provider failure counts (MODEL_BACKOFF, with the provider's Retry-After), attempts
        lost to a dead worker do not, Temporal retries them."""
        state, req = self.state, self.request
        assert req is not None
        limit = state.limits.model_timeout_seconds
        req = req.model_copy(update={"timeout_seconds": limit})
        attempts = Attempts(
            activity=ModelActivities.model_request, timeout_seconds=limit,
            lost=options.MODEL_RETRY, backoff=retries.MODEL_BACKOFF,
            retryable=options.MODEL_RETRYABLE, deadline_ends=True,
            summary=f"model step {plan.step} · {state.settings.model}",
            # Whatever a failed attempt streamed is void.
            on_failure=(lambda: self.show.topic.publish(Reset(step=plan.step))) if req.stream
            else None)
        out = await self.attempts(attempts, req, Turn)
        if not isinstance(out, Failed):
            self.routes.after_turn(out.worker_queue, out.cached,
                                    lambda: self.patched(ROUTE_WHEN_NEEDED))
            return driver.Answered(out)
        if out.deadline:
            return state.stop(StopReason.DEADLINE)
        failure = model_failure(out.error, limit)
        workflow.logger.warning("model request failed", extra={
            "step": plan.step, "failure": failure.kind, "detail": failure.detail})
        state.log(f"{mf.EVENT_PREFIX}{failure.kind}", detail=failure.detail)
        return state.stop(self.failed(failure))

    async def attempt_model(self, c: driver.AttemptModel) -> Turn | driver.AttemptFailed:
        """One attempt of the step's model request, one activity Temporal does not retry
        (under CHARGED_ATTEMPTS); its failure as the driver counts it."""
        req, step = self.request, c.plan.step
        assert req is not None
        sent = req.model_copy(update={"timeout_seconds": c.silence_seconds,
                                      "answer_seconds": c.answer_seconds})
        wedged = c.answer_seconds + options.WEDGED_MARGIN
        try:
            turn: Turn = await workflow.execute_activity_method(
                ModelActivities.model_request, sent,
                start_to_close_timeout=timedelta(seconds=wedged),
                schedule_to_close_timeout=timedelta(seconds=max(c.remaining, 1.0)),
                heartbeat_timeout=options.HEARTBEAT_TIMEOUT,
                **self.routes.route(options.MODEL_ONCE),
                summary=f"{'summary' if req.summarize else 'model step'} {step} · "
                        f"{self.state.settings.model}")
        except ActivityError as err:
            if req.stream:  # its text is void, and so is any that arrives later
                self.show.topic.publish(Reset(step=step, attempt=f"{err.activity_id}.1"))
            return self._attempt_failed(err, c, wedged)
        if req.stream and turn.streamed is not None:
            self.show.complete_text(step, turn)
        self.routes.after_turn(turn.worker_queue, turn.cached,
                                lambda: self.patched(ROUTE_WHEN_NEEDED))
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
                or self.processing_seconds() >= self.state.limits.deadline_seconds:
            return driver.AttemptFailed("deadline", charge)
        shut_down = isinstance(cause, ApplicationError) and cause.type == errors.WORKER_SHUTDOWN
        if timeout == TimeoutType.HEARTBEAT or shut_down or (
                timeout == TimeoutType.SCHEDULE_TO_START and self.routes.on_holder()):
            # Its worker was lost, or shut down while it ran (a deploy's stop, which fails
            # the attempt with WorkerShutdown), or the holder never took it.
            if self.routes.on_holder():
                self.routes.holder = None
            return driver.AttemptFailed("lost", charge)
        failure = model_failure(err, c.silence_seconds) \
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

    async def attempts(self, a: Attempts, arg: object, result_type: type[_R]) -> _R | Failed:
        """`a`'s counted attempts (workflows/attempts.py) within the run's deadline."""
        return await counted_attempts(
            a, arg, result_type, routes=self.routes,
            seconds_left=lambda: self.state.limits.deadline_seconds
            - self.processing_seconds(),
            counted=lambda: self.patched(COUNTED_RETRIES))

    # --- tools ---------------------------------------------------------------------

    def build_tool_request(self, step: int, p: core.Execute, timeout: float) -> int:
        """Build a call's tool request: its payload bytes."""
        state = self.state
        mcp = self.tools.mcp.get(p.call.name)  # an MCP tool: the activity calls its server
        self.tool_request = ToolRequest(tool=p.call.name,
                           call_id=p.call.call_id, step=step, arguments=p.arguments,
                           idempotency_key=p.idempotency_key,
                           max_result_bytes=state.limits.max_result_bytes,
                           timeout_seconds=timeout,
                           mcp=mcp_tools.call_target(mcp) if mcp is not None else None,
                           parameters_digest=self.tools.digests.get(p.call.name))
        return payload_bytes(self.tool_request)

    async def run_tool(self, command: driver.RunTool) -> core.ToolOutcome | driver.ToolFailed:
        p, local, req = command.plan, command.local, self.tool_request
        assert req is not None
        rule = self.tools.rules[p.call.name]
        workflow.logger.info("tool execution", extra={
            "step": command.step, "tool": p.call.name, "fingerprint": p.fingerprint,
            "local": local})
        attempts = Attempts(
            activity=ToolActivities.tool_execute, timeout_seconds=command.timeout_seconds,
            lost=options.TOOL_RETRY, backoff=rule.backoff, retryable=options.TOOL_RETRYABLE,
            deadline_ends=False,
            summary=f"tool {p.call.name} · call {self.state.tool_executions + 1}",
            local_id=p.idempotency_key if local else None)
        if local and self.routes.active:
            req = req.model_copy(update={"holder": self.routes.holder})
        outcome = await self.attempts(attempts, req, core.ToolOutcome)
        if not isinstance(outcome, Failed):
            if outcome.worker_queue is not None and self.routes.active:
                # A local tool ran in the worker that runs this run's tasks, not the
                # holder: its output is in that worker's cache, so the next request goes
                # there.
                self.routes.holder = outcome.worker_queue
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


def model_failure(err: ActivityError, timeout_seconds: float) -> mf.ModelFailure:
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
