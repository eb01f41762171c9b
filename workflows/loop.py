"""The BoundLoop workflow: the interpreter of the driver's commands
(`boundloop.core.driver`), with the run's start (workflows/start.py), its end
(workflows/ending.py) and its handlers.

Each model request and each tool execution is one activity; the counters, the
identical-call table and pending approvals live in workflow state. The
conversation itself is written to history once and rebuilt by the model activity
from references (docs/history.md).
"""

from __future__ import annotations

import asyncio
import builtins
import functools
from collections.abc import Callable
from datetime import datetime, timedelta

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
from boundloop.workflows.children import Children
from boundloop.workflows.ending import Ending
from boundloop.workflows.patches import Patches
from boundloop.workflows.publish import Publisher, cost_of, status_of
from boundloop.workflows.spending import RunBudget
from boundloop.workflows.start import Start

with workflow.unsafe.imports_passed_through():
    from boundloop import errors
    from boundloop.activities.earlier import earlier_calls
    from boundloop.contracts import (
        WORKFLOW_NAME,
        CancelRequest,
        ConversationRef,
        Decision,
        RunInput,
        RunResult,
        RunStatus,
    )
    from boundloop.core import approvals, carry, driver, signatures
    from boundloop.core import context as ctx
    from boundloop.core import loop as core
    from boundloop.core.canonical import preview
    from boundloop.core.conversation import ConversationMeta
    from boundloop.core.reasons import StopReason
    from boundloop.tools import catalog


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
            self._tools.offer_agents(self._state)
            self._ex.unsent = list(carried.unsent)
            self._base: ConversationRef | None = carried.base
            self._ex.sent = carried.base.meta
            self._processing_before = carried.processing_seconds
        else:
            self._state = core.LoopState(settings=inp.settings, allowed_tools=list(inp.tools),
                                         tree=inp.tree)
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
        self._started = workflow.now()
        self._cancel_reason: str | None = None
        self._interrupted: str | None = None  # the `interrupt` signal's reason
        self._routes = Routing()  # which task queue the next activity goes to
        # Approver public keys: the worker's (like its toolset) and the run policy's.
        self._tools.keys = signatures.run_keys(served.approver_keys,
                                               self._state.policy.approver_keys)
        self._budget = RunBudget(self._state)  # the run's side of its shared budget
        self._children = Children(inp, self._add_waited)  # its sub-agents' runs
        self._show = Publisher(
            self._state, WorkflowStream(prior_state=carried.stream if carried else None),
            carried=carried is not None, search_attributes=bool(inp.search_attributes))
        # The model and tool activities (the driver's requests and attempts).
        self._calls = Calls(self._state, self._ex, self._tools, self._routes, self._show,
                            inp.instructions, self._base, self._patched,
                            self._processing_seconds)
        # What the run decides as it starts, and how it ends.
        self._start = Start(inp, self._state, self._tools, self._ex, self._show,
                            self._patched)
        self._end = Ending(inp, self._state, self._ex, self._tools, self._calls, self._show,
                           self._budget, self._start, self._base, self._patched,
                           self._processing_seconds)

    # --- run -----------------------------------------------------------------------

    @workflow.run
    async def run(self, inp: RunInput) -> RunResult:
        self._patches.start()
        await self._start.begin()
        self._calls.key_scope = self._start.model_key_scope
        self._run = driver.Run(self._state, self._tools.rules, self._start.key_scope,
                               _View(self), self._ex, charged=self._start.charged,
                               agents=dict(self._tools.agents))
        reason = (core.cancelled(self._state, self._cancel_reason, step_unfinished=False)
                  if self._start.cancelled_first else await self._drive())
        if reason is None:  # continue-as-new was requested
            reason = await self._end.continue_as_new()
        return await self._end.stop(reason, lambda: self._cancel_reason or self._interrupted)

    async def _drive(self) -> StopReason | None:
        """Carry out the driver's commands (boundloop/core/driver.py) until the run stops
        or should continue as new; a cancel while a command is out is thrown into it."""
        steps = self._run.steps()
        # The first command too may be none: a run can stop before its first request
        # (a question over max_history_bytes), and a StopIteration must not escape a
        # coroutine.
        advance: Callable[[], driver.Command] = functools.partial(next, steps)
        while True:
            try:
                command = advance()
            except StopIteration as done:
                result: StopReason | None = done.value
                return result
            try:
                answer = await self._carry_out(command)
            except asyncio.CancelledError:
                advance = functools.partial(steps.throw, driver.Cancelled())
            else:
                advance = functools.partial(steps.send, answer)

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
            case driver.BuildSummaryRequest(plan, summarize):
                return self._calls.build_summary_request(plan, summarize)
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
            case driver.RunChild():
                return await self._children.run(command)
        raise AssertionError(f"unknown command {command!r}")

    # --- model ---------------------------------------------------------------------

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
                               in_session=self._start.session_grants,
                               run=workflow.info().first_execution_run_id,
                               bound=self._start.decisions_bound)

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
            events_dropped=self._state.events_dropped, tree=self._state.tree,
            children=list(self._children.runs), summarized=self._state.summaries)

    # --- helpers -------------------------------------------------------------------

    def _patched(self, patch: str) -> bool:
        return self._patches.patched(patch)

    def _add_waited(self, seconds: float) -> None:
        self._waited += seconds

    def _processing_seconds(self) -> float:
        elapsed = (workflow.now() - self._started).total_seconds()
        return self._processing_before + elapsed - self._waited


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
