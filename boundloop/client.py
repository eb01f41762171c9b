"""The client: one run (`Run`) or session (`Session`), found by id (`get_run`,
`get_session`): follow it, decide its approvals, cancel it, read its result.

These four are public (exported from `boundloop`); an agent starts runs and sessions
(boundloop/agent.py) and `boundloop.connect` makes the client (boundloop/connection.py).
The functions at the bottom are what a run is built on, on a workflow handle; the CLI
and the console reach them through boundloop/_ops.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Literal

from pydantic import TypeAdapter, ValidationError
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowHistoryEventFilterType,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
    WorkflowUpdateFailedError,
    WorkflowUpdateHandle,
    WorkflowUpdateStage,
)
from temporalio.contrib.workflow_streams._types import PollInput, PollResult, _decode_payload
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from boundloop import errors
from boundloop import search_attributes as sa
from boundloop.codec import CodecKeyError
from boundloop.contracts import (
    SESSION_WORKFLOW,
    STREAM_TOPIC,
    CancelRequest,
    Decision,
    RunResult,
    RunStatus,
    SayRequest,
    SessionStatus,
    StreamEvent,
    StreamItem,
    StreamResult,
)
from boundloop.core import approvals
from boundloop.core import session as session_core
from boundloop.core.canonical import preview
from boundloop.core.fingerprint import fingerprint
from boundloop.core.loop import Approval, Event
from boundloop.settings import one_line
from boundloop.stuck import stuck_line

if TYPE_CHECKING:
    from boundloop.signing import Signer

# Messages are sent by typed reference (`BoundLoopWorkflow.decide`, not "decide"): a
# renamed handler is then a type error here, not a run that ignores the message. The
# workflow modules are imported where a message is sent, so `import boundloop` loads
# neither them nor the `cryptography` module their signature checks need.


#: How long `Run.status` (and the calls built on it) waits for a worker to answer.
QUERY_SECONDS = 10.0


# --- public API -----------------------------------------------------------------------


async def get_run(client: Client, id: str) -> Run:
    """The run with workflow id `id` (started earlier, by anyone), awaited like `start`:
    the server is asked whether it exists. Raises RunNotFound."""
    run = Run(client.get_workflow_handle(id, result_type=RunResult))
    await run.describe()
    return run


class Run:
    """One run: read its state, decide its approvals, cancel it, wait for its result.

    `status`, `pending` and `events` are answered by a worker (a query); `result` needs
    only the server once the run has ended.
    """

    def __init__(self, handle: WorkflowHandle[Any, RunResult]) -> None:
        self.handle = handle

    @property
    def id(self) -> str:
        """The workflow id."""
        return self.handle.id

    async def status(self, timeout: float | None = QUERY_SECONDS) -> RunStatus:
        """Counters, pending approvals and the event log so far (a query: a worker
        answers it). Raises RunNotFound, and NoWorker (naming the task queue a worker
        must poll) when no worker answered within `timeout` seconds (None: as long as
        the server waits)."""
        try:
            return await asyncio.wait_for(query_status(self.handle), timeout)
        except TimeoutError:
            raise await no_worker(self.handle, f"the status query of run {self.id} "
                                  f"within {timeout:g} s") from None
        except RPCError as exc:
            if _no_poller(exc):
                raise await no_worker(self.handle, f"the status query of run {self.id} "
                                      "(the server has seen no worker poll its task queue "
                                      "recently)") from None
            raise await _gone(self.handle, exc, "queries") from None

    async def stream(self, from_offset: int = 0) -> AsyncIterator[StreamItem]:
        """The run's live stream from `from_offset` (docs/streaming.md): its events, the
        model's text as it is written, a `Reset` after an attempt that died mid-answer,
        and last the `StreamResult`. Each item carries its `offset`: reconnect with the
        last one seen + 1 to go on without a gap or a repeat. Follows continue-as-new;
        ends after the result (or when the run closed without one)."""
        async for item in stream_items(self.handle, from_offset):
            yield item

    async def stream_tree(self) -> AsyncIterator[tuple[tuple[str, ...], StreamItem]]:
        """The run's stream and its sub-agents' (docs/agent-trees.md), each followed
        from its start as soon as the run says it started, at every depth: (path, item),
        where the path names the sub-agents from this run down (`()` for this run,
        `("research",)` for its sub-agent). Items of one run are in order; the runs'
        items interleave as they come. Ends once every run's stream has ended."""
        merged: asyncio.Queue[tuple[tuple[str, ...], StreamItem] | None] = asyncio.Queue()
        followers: list[asyncio.Task[None]] = []

        async def follow(handle: WorkflowHandle[Any, Any], path: tuple[str, ...]) -> None:
            followed: set[str] = set()
            try:
                async for item in stream_items(handle):
                    await merged.put((path, item))
                    if isinstance(item, StreamEvent) and item.event.event == "subagent_started":
                        # The status lists the child from the workflow task that logged
                        # this event on: the child's id is there.
                        for child in (await query_status(handle)).children:
                            if child.workflow_id not in followed:
                                followed.add(child.workflow_id)
                                followers.append(asyncio.create_task(follow(
                                    handle._client.get_workflow_handle(child.workflow_id),
                                    (*path, child.tool))))
            finally:
                await merged.put(None)

        followers.append(asyncio.create_task(follow(self.handle, ())))
        ended = 0
        try:
            while ended < len(followers):
                got = await merged.get()
                if got is None:
                    ended += 1
                else:
                    yield got
        finally:
            for task in followers:
                task.cancel()
            await asyncio.gather(*followers, return_exceptions=True)

    async def pending(self) -> list[Approval]:
        """The calls waiting for a decision, with their validated arguments."""
        return (await self.status()).pending

    async def approve(self, call_id: str, *, approver: str | None = None,
                      args: dict[str, Any] | None = None, signer: Signer | None = None,
                      remember: bool = False, when: str | None = None,
                      scope: Literal["run", "session"] = "run",
                      fingerprint: str | None = None, run: str | None = None) -> None:
        """Approve a pending call, optionally with edited arguments (validated against
        the tool's schema). With `signer` the decision is signed as `signer.name` (a run
        with approver keys accepts only that). With `remember`, later calls of the same
        tool in this run (those whose arguments meet `when`, a condition as in argument
        rules) are approved without asking; a deny rule still denies them. With `scope`
        "session" (a session's turn only), so are those of the session's later turns,
        within each turn's own policy; the signature covers the scope. Raises
        InvalidDecision (nothing sent) for a decision malformed in itself, DecisionRefused
        when the run refuses it.

        A decision binds what its approver was shown: `fingerprint` (the pending call's
        `Approval.fingerprint`, or its hex part) and `run` (`RunStatus.run`, the run's
        first execution run id) name it, and the run refuses the decision when the call
        waiting now has other arguments, or a new run holds the workflow id ("the call
        changed since you looked at it"). Left out, they are the call as the run shows it
        now."""
        await self.decide(approval(call_id, approver=approver, args=args, signer=signer,
                                   remember=remember, when=when, scope=scope,
                                   fingerprint=fingerprint, run=run), signer)

    async def reject(self, call_id: str, *, reason: str, approver: str | None = None,
                     signer: Signer | None = None, fingerprint: str | None = None,
                     run: str | None = None) -> None:
        """Reject a pending call: it never runs; the model reads `reason`. `signer`,
        `fingerprint` and `run` as for `approve`. Raises InvalidDecision or
        DecisionRefused as `approve` does."""
        await self.decide(rejection(call_id, reason=reason, approver=approver,
                                    signer=signer, fingerprint=fingerprint, run=run), signer)

    async def decide(self, decision: Decision, signer: Signer | None = None) -> None:
        """Send a decision made by `approval` or `rejection` (signed here with `signer`,
        whose name must be the decision's approver): through the validated `decide`
        update; to a run whose workflow task keeps failing (the server refuses it
        updates), as the `approve`/`reject` signal, which the run checks the same way once
        a healthy worker serves it (RunStuck). Raises DecisionRefused when the run refuses
        it. When no worker answers (`Run.status` within QUERY_SECONDS), an unsigned
        decision is sent as that signal too, and NoWorker is raised with `recorded`: the
        decision takes effect when a worker picks the run up; a signed one is not sent."""
        # An unsigned decision on an ended run: said without a worker (none may be
        # there). A signed one asks the run's worker for the call it signs over first.
        desc = await describe(self.handle)
        if signer is None and desc.status != WorkflowExecutionStatus.RUNNING:
            raise errors.RunEnded(f"{self.id} has ended: it takes no more decisions "
                                  f"({ended_state(desc)}; its result stays readable)")
        line = await self._stuck()
        if line is not None and signer is not None:
            # No worker can show the call while the task fails: nothing to sign over.
            raise errors.RunStuck(
                f"{self.id}: {line}. A signed decision covers the pending call as the run "
                "shows it, and no worker can show it while the run's workflow task fails: "
                "nothing was sent; sign it once a healthy worker serves the run",
                line=line, recorded=False)
        if line is None:
            try:
                decision = await self._bound(decision, signer)
            except errors.NoWorker as exc:
                if signer is not None:  # nothing to sign over: the call is not shown
                    raise errors.NoWorker(
                        f"{exc}. A signed decision covers the pending call as the run shows "
                        "it: nothing was sent; sign it once a worker answers",
                        task_queue=exc.task_queue) from None
                earlier = await recorded_decision(self.handle, decision.call_id)
                if earlier is not None:  # sent once already, by this path or the stuck one
                    verb = "approved" if earlier.approve else "rejected"
                    raise errors.NoWorker(
                        f"{exc}. Call {preview(decision.call_id, 60)!r} is already "
                        f"{verb} by {earlier.approver} in the run's history (not sent "
                        "again): that decision takes effect when a worker picks the run up",
                        task_queue=exc.task_queue, recorded=True) from None
                await record(self.handle, await self._with_run(decision))
                raise errors.NoWorker(
                    f"{exc}. The decision is recorded in the run's history: it takes effect "
                    "when a worker picks the run up, if the call still waits for a decision "
                    f"then (`boundloop status {self.id}` shows it)",
                    task_queue=exc.task_queue, recorded=True) from None
            try:
                line = await _update_unless_stuck(self.handle, decision)
            except WorkflowUpdateFailedError as exc:
                # The validator's refusal (INVALID_DECISION), or the run failing the update.
                cause = exc.cause
                raise errors.DecisionRefused(getattr(cause, "message", None) or str(cause)
                                             ) from None
            except RPCError as exc:
                # FAILED_PRECONDITION: the task started failing as the update arrived.
                line = await self._stuck() if exc.status == \
                    RPCStatusCode.FAILED_PRECONDITION else None
                if line is None:
                    raise await _gone(self.handle, exc, "decisions") from None
            if line is None:
                return
        await record(self.handle, await self._with_run(decision))
        raise errors.RunStuck(
            f"{self.id}: {line}. The decision is recorded in the run's history and waits "
            "for a healthy worker: it takes effect when one serves the run, if the call "
            f"still waits for a decision then (`boundloop status {self.id}` shows it)",
            line=line, recorded=True)

    async def _with_run(self, decision: Decision) -> Decision:
        """`decision` naming the run it was made for, from what the server knows (no
        worker needed)."""
        if decision.run is not None:
            return decision
        first = (await self.handle.describe()).raw_description.workflow_execution_info
        return decision.model_copy(update={"run": first.first_run_id or None})

    async def _stuck(self) -> str | None:
        """The stuck line of this run (workflow task failing since …), else None."""
        try:
            return await stuck_line(self.handle, await self.handle.describe())
        except RPCError as exc:
            raise await _gone(self.handle, exc, "decisions") from None

    async def _bound(self, decision: Decision, signer: Signer | None) -> Decision:
        """`decision` naming the run and the arguments it decides (those its caller was
        shown, else the call as the run shows it now), signed with `signer` over them: a
        signature always covers what its approver was shown, never what waits later."""
        try:
            status = await self.status()
        except errors.NoWorker:
            raise  # none polls: `decide` records an unsigned decision, sends no signed one
        except errors.RunStuck:
            if signer is not None:
                raise
            # No worker can show the call (the run cannot be replayed): the decision goes
            # as it is, and the run checks what it names when one can.
            return decision
        waiting = next((a for a in status.pending if a.call_id == decision.call_id), None)
        if waiting is None:
            if signer is not None:
                raise errors.DecisionRefused(
                    f"call {preview(decision.call_id, 60)!r} is not waiting for approval in "
                    f"run {self.id}: nothing to sign")
            return decision  # the run says why it refuses it
        shown = decision.fingerprint or fingerprint(waiting.tool, waiting.arguments)
        if ":" not in shown:  # the hex part, as the CLI's hints print it
            shown = f"{waiting.tool}:{shown}"
        decision = decision.model_copy(update={"fingerprint": shown,
                                               "run": decision.run or status.run or None})
        if signer is None:
            return decision
        signature = signer.sign(
            workflow_id=self.id, call_id=waiting.call_id, step=waiting.step,
            fingerprint=shown, approve=decision.approve, arguments=decision.arguments,
            reason=decision.reason, remember=approvals.remembered(decision),
            run=decision.run)
        return decision.model_copy(update={"signature": signature})

    async def cancel(self, reason: str | None = None) -> None:
        """Ask the run to stop, in any state; it ends with reason `cancelled`, and
        `reason` (at most 500 characters) is kept in its event log and RunResult.
        Raises RunEnded when it has ended already, RunNotFound."""
        # Checked first: Temporal accepts a cancel request for a closed run, silently.
        desc = await describe(self.handle)
        if desc.status != WorkflowExecutionStatus.RUNNING:
            state = ended_state(desc)
            raise errors.RunEnded(f"{self.id} has ended: it takes no more cancels ({state}; "
                                  "nothing was changed)")
        try:
            await cancel(self.handle, reason)
        except RPCError as exc:
            raise await _gone(self.handle, exc, "cancels") from None

    async def events(self, interval: float = 0.2) -> AsyncIterator[Event]:
        """Each event-log line as it appears, until the run ends."""
        async for _status, new in follow(self.handle, interval=interval):
            for event in new:
                yield event

    async def result(self) -> RunResult:
        """Wait for the run to end and return its RunResult, whatever its reason (a run
        that stopped for any reason but `completed` ends as a Temporal failure carrying
        it). A run Temporal ended without one (terminated, timed out) raises RunEnded;
        an unknown id RunNotFound."""
        try:
            return await result_of(self.handle)
        except WorkflowFailureError as exc:
            state = await _state(self.handle)
            raise errors.RunEnded(
                f"{self.id} ended ({state}) without a RunResult: "
                f"{getattr(exc.cause, 'message', exc.cause)}") from None
        except RPCError as exc:
            raise await _gone(self.handle, exc, "waiting") from None

    async def describe(self) -> WorkflowExecutionDescription:
        """Temporal's description of the run (status, type, task queue, search
        attributes): the server answers it, no worker needed. Raises RunNotFound."""
        return await describe(self.handle)


def _no_poller(exc: RPCError) -> bool:
    """The server's refusal of a query no worker can answer: none polled the run's task
    queue lately."""
    return (exc.status == RPCStatusCode.FAILED_PRECONDITION
            and "no poller seen" in (exc.message or "").lower())


async def no_worker(handle: WorkflowHandle[Any, Any], what: str) -> errors.NoWorker:
    """NoWorker for `what` no worker answered, naming the run's task queue."""
    queue = (await describe(handle)).task_queue
    return errors.NoWorker(f"no worker answered {what}: {errors.worker_hint(queue)}",
                           task_queue=queue)


def approval(call_id: str, *, approver: str | None = None,
             args: dict[str, Any] | None = None, signer: Signer | None = None,
             remember: bool = False, when: str | None = None,
             scope: Literal["run", "session"] = "run", fingerprint: str | None = None,
             run: str | None = None) -> Decision:
    """An approval (arguments as for `Run.approve`), checked in itself before anything is
    sent: raises InvalidDecision, saying what is wrong in one line."""
    return _checked(lambda: Decision(call_id=call_id, approve=True,
                                     approver=_approver(approver, signer), arguments=args,
                                     remember=remember, when=when, scope=scope,
                                     fingerprint=fingerprint or None, run=run or None))


def rejection(call_id: str, *, reason: str, approver: str | None = None,
              signer: Signer | None = None, fingerprint: str | None = None,
              run: str | None = None) -> Decision:
    """A rejection (arguments as for `Run.reject`), checked like `approval`."""
    return _checked(lambda: Decision(call_id=call_id, approve=False,
                                     approver=_approver(approver, signer), reason=reason,
                                     fingerprint=fingerprint or None, run=run or None))


def _checked(make: Callable[[], Decision]) -> Decision:
    try:
        decision = make()
    except ValidationError as exc:  # a field out of bounds (an approver name too long, ...)
        raise errors.InvalidDecision(one_line(exc)) from None
    except ValueError as exc:  # an approver other than the signer
        raise errors.InvalidDecision(str(exc)) from None
    problem = approvals.form_problem(decision)
    if problem is not None:
        raise errors.InvalidDecision(problem)
    return decision


def _approver(approver: str | None, signer: Signer | None) -> str:
    """The decision's approver: the signer's name when signed (a different `approver`
    is a mistake, refused), else `approver` or "operator"."""
    if signer is None:
        return approver or "operator"
    if approver is not None and approver != signer.name:
        raise ValueError(f"approver {approver!r} differs from the signer's name "
                         f"{signer.name!r}: a decision is signed by its approver")
    return signer.name


async def describe(handle: WorkflowHandle[Any, Any]) -> WorkflowExecutionDescription:
    """`handle.describe()`, raising RunNotFound for an id no workflow has."""
    try:
        return await handle.describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise errors.RunNotFound(f"no run {handle.id!r}") from None
        raise


async def _state(handle: WorkflowHandle[Any, Any]) -> str:
    return ended_state(await describe(handle))


def ended_state(desc: WorkflowExecutionDescription) -> str:
    """How a closed run ended, in words: `stopped: cancelled` from its stop reason (a
    stopped run closes as a failed workflow, which says less), else Temporal's status
    (`completed`, `terminated`, ...)."""
    reason = desc.typed_search_attributes.get(sa.STOP_REASON)
    if reason and reason != "completed":
        return f"stopped: {reason}"
    return desc.status.name.lower() if desc.status else "closed"


async def _gone(handle: WorkflowHandle[Any, Any], exc: RPCError, takes: str) -> Exception:
    """What a NOT_FOUND answer means for this id: RunNotFound when no workflow has it,
    RunEnded when it has closed (a closed workflow takes no update, signal or cancel);
    any other error as it came."""
    if exc.status != RPCStatusCode.NOT_FOUND:
        return exc
    try:
        state = await _state(handle)
    except errors.RunNotFound as missing:
        return missing
    except RPCError:
        return exc
    return errors.RunEnded(f"{handle.id} has ended: it takes no more {takes} ({state}; "
                           "its result stays readable)")


async def get_session(client: Client, id: str) -> Session:
    """The session with workflow id `id`, awaited like `start_session`: the server is
    asked whether it exists. Raises RunNotFound (also for a run that is not a
    session)."""
    session = Session(client, client.get_workflow_handle(id, result_type=SessionStatus))
    desc = await describe(session.handle)
    if desc.workflow_type != SESSION_WORKFLOW:
        raise errors.RunNotFound(f"{id!r} is not a session (it is a {desc.workflow_type} "
                                 "workflow)")
    return session


class Session:
    """One conversation across turns. `say` runs one bounded turn and returns its
    RunResult (whatever its reason); a message sent while a turn runs is refused
    (`SessionRefused`), not queued."""

    def __init__(self, client: Client, handle: WorkflowHandle[Any, SessionStatus]) -> None:
        self.client = client
        self.handle = handle

    @property
    def id(self) -> str:
        """The session's workflow id (its turns are `{id}/turn-{n}`)."""
        return self.handle.id

    async def say(self, message: str, *, taken: Callable[[str], None] | None = None
                  ) -> RunResult:
        """Run one turn with the user's `message` and return its RunResult. `taken` is
        called once the session has taken the message, with what happened (`send`'s
        words: started, queued, or interrupting the running turn). Raises
        SessionRefused when the session refuses it (a turn runs and the session's
        `busy` is `refuse`), RunEnded when the session has ended, RunNotFound."""
        handle = await self._take(message)
        if taken is not None:
            taken(await self._what_happened())
        try:
            return await handle.result()
        except (WorkflowUpdateFailedError, RPCError) as exc:
            raise await self._refused(exc) from None

    async def send(self, message: str) -> str:
        """Give the session the user's `message` and return once it has taken it (not
        when its turn ends), with what happened: `turn N started`, `queued …` or
        `interrupting …`. Raises as `say` does. Follow the turn with `show()` /
        `turn(n)`."""
        await self._take(message)
        return await self._what_happened()

    async def _take(self, message: str) -> WorkflowUpdateHandle[RunResult]:
        from boundloop.workflows.session import BoundloopSessionWorkflow

        try:
            return await self.handle.start_update(
                BoundloopSessionWorkflow.say, SayRequest(message=message),
                wait_for_stage=WorkflowUpdateStage.ACCEPTED)
        except (WorkflowUpdateFailedError, RPCError) as exc:
            raise await self._refused(exc) from None

    async def _what_happened(self) -> str:
        """Read right after the session took a message (its handler has run up to its
        first wait): it either started a turn or waits behind one."""
        st = await self.show()
        if not st.waiting:
            return f"turn {st.turns} started"
        if st.limits.busy == "interrupt":
            return (f"interrupting turn {st.turns}: it stops at its next safe point, and "
                    "the next turn answers both messages")
        return (f"queued: it starts a turn when turn {st.turns} ends "
                f"({st.waiting} waiting)")

    async def show(self) -> SessionStatus:
        """Counters, the running or last turn, tokens left, when an idle session ends
        (a query while the session is open; its result once it has ended). Raises
        RunNotFound, and NoWorker when no worker answered within QUERY_SECONDS."""
        from boundloop.workflows.session import BoundloopSessionWorkflow

        desc = await describe(self.handle)
        if desc.status != WorkflowExecutionStatus.RUNNING:
            return await self.handle.result()
        try:
            return await asyncio.wait_for(
                self.handle.query(BoundloopSessionWorkflow.status), QUERY_SECONDS)
        except TimeoutError:
            raise await no_worker(self.handle, f"the status query of session {self.id} "
                                  f"within {QUERY_SECONDS:g} s") from None
        except RPCError as exc:
            if _no_poller(exc):
                raise await no_worker(self.handle, f"the status query of session {self.id} "
                                      "(the server has seen no worker poll its task queue "
                                      "recently)") from None
            raise await _gone(self.handle, exc, "queries") from None

    async def end(self) -> SessionStatus:
        """End the session (a running turn is cancelled first) and return its status.
        Raises RunEnded when it has already ended, RunNotFound."""
        from boundloop.workflows.session import BoundloopSessionWorkflow

        try:
            status = await self.handle.execute_update(BoundloopSessionWorkflow.end)
        except (WorkflowUpdateFailedError, RPCError) as exc:
            raise await self._refused(exc) from None
        return status

    async def stream(self, from_turn: int = 1, interval: float = 0.3,
                     ) -> AsyncIterator[tuple[int, StreamItem]]:
        """Each turn's stream from `from_turn` on, as (turn number, item), one turn after
        the other, until the session ends. A turn's items carry offsets within that turn:
        reconnect with `session.turn(n).stream(from_offset=...)`, then this from n + 1."""
        number = from_turn
        while True:
            status = await self.show()
            if status.turns >= number:
                run = self.turn(number)
                try:
                    await run.handle.describe()
                except RPCError:  # the turn starts a moment from now, or never did
                    if status.status == "ended":
                        number += 1
                    else:
                        await asyncio.sleep(interval)
                    continue
                async for item in run.stream():
                    yield number, item
                number += 1
                continue
            if status.status == "ended":
                return
            await asyncio.sleep(interval)

    def turn(self, number: int) -> Run:
        """Turn `number` of this session, as a Run (status, approvals, cancel, result)."""
        return Run(self.client.get_workflow_handle(
            session_core.turn_id(self.id, number), result_type=RunResult))


    async def _refused(self, exc: WorkflowUpdateFailedError | RPCError) -> Exception:
        """RunEnded for a session that has ended (refused by the session while it
        closes, or closed: a closed workflow takes no update), SessionRefused for any
        other refusal, RunNotFound; anything else as it came."""
        if isinstance(exc, RPCError):
            gone = await _gone(self.handle, exc, "messages")
            if isinstance(gone, errors.RunEnded):
                with contextlib.suppress(RPCError):
                    how = (await self.show()).ended or await _state(self.handle)
                    return errors.RunEnded(f"the session has ended (reason: {how}); start "
                                           "a new one")
            return gone
        cause = exc.cause
        if not (isinstance(cause, ApplicationError) and cause.type in (
                errors.SESSION_REFUSED, errors.TURN_FAILED)):
            return exc
        with contextlib.suppress(RPCError):
            if cause.type == errors.SESSION_REFUSED and (await self.show()).ended:
                return errors.RunEnded(cause.message)
        return errors.SessionRefused(cause.message)


# --- what a run is built on, on a workflow handle --------------------------------------


async def result_of(handle: WorkflowHandle[Any, Any]) -> RunResult:
    """The RunResult of a run however it ended: returned when `completed`, else the
    detail of the workflow's `RunStopped` failure (docs/design.md, "How a run ends").

    Anything else (terminated, timed out, failed for another cause) raises what
    `handle.result()` raises: such a run has no RunResult.
    """
    try:
        value = await handle.result()
    except CodecKeyError:
        # A client without the codec keys cannot decode the failure's details, but its
        # message is plain: a refusal (a run started in clear) still reaches it.
        refused = await refusal_message(handle)
        if refused is None:
            raise
        raise errors.PolicyRefused(refused, []) from None
    except WorkflowFailureError as exc:
        cause = exc.cause
        if (isinstance(cause, ApplicationError) and cause.type == errors.RUN_STOPPED
                and cause.details):
            return RunResult.model_validate(cause.details[0])
        if isinstance(cause, ApplicationError) and cause.type == errors.UNKNOWN_TOOLS:
            raise errors.UnknownTools(cause.message) from None
        if isinstance(cause, ApplicationError) and cause.type == errors.POLICY_REFUSED:
            raise errors.PolicyRefused(cause.message,
                                       [dict(d) for d in cause.details]) from None
        raise
    return value if isinstance(value, RunResult) else RunResult.model_validate(value)


async def refusal_message(handle: WorkflowHandle[Any, Any]) -> str | None:
    """The message of a run's PolicyRefused failure, from its close event as stored
    (undecoded), or None when it did not end refused."""
    async for event in handle.fetch_history_events(
            event_filter_type=WorkflowHistoryEventFilterType.CLOSE_EVENT):
        failure = event.workflow_execution_failed_event_attributes.failure
        if failure.application_failure_info.type == errors.POLICY_REFUSED:
            return failure.message
    return None


_STREAM_ITEM: TypeAdapter[StreamItem] = TypeAdapter(StreamItem)


#: A reader of a run's stream asks again at once after a read that brought items, and
#: after an empty one waits STREAM_POLL_FIRST, growing by half each time up to
#: STREAM_POLL_MAX (then the text shows within a second of its arrival).
STREAM_POLL_FIRST = 0.1
STREAM_POLL_MAX = 1.0
#: A read that failed for a moment is tried again after this, growing up to 2 s.
STREAM_RETRY = 0.2
_POLL_QUERY = "__temporal_workflow_stream_poll"  # the stream's own read-only query


async def stream_items(handle: WorkflowHandle[Any, Any],
                       from_offset: int = 0) -> AsyncIterator[StreamItem]:
    """The items of a run's stream from `from_offset`, each with its offset.

    Read by query, never by update: a query is not written to the run's history, so a
    reader costs the run nothing however many read it and however long the answer is
    (docs/streaming.md, "What it costs"). The workflow id's latest run is read, which
    holds the stream's newest items across continue-as-new. A read that fails for a
    moment (the server or the worker busy, a run closing or continuing as it is read, a
    timeout) is tried again from the last item seen; only a run that does not exist ends
    it."""
    client: Client = handle._client  # the handle's own client: its converter and codec
    latest = client.get_workflow_handle(handle.id)
    converter = client.data_converter.payload_converter
    offset, failures, idle = from_offset, 0, STREAM_POLL_FIRST
    while True:
        try:
            batch = await latest.query(
                _POLL_QUERY, PollInput(topics=[STREAM_TOPIC], from_offset=offset),
                result_type=PollResult)
        except (RPCError, WorkflowQueryFailedError, WorkflowQueryRejectedError) as exc:
            if isinstance(exc, RPCError) and exc.status == RPCStatusCode.NOT_FOUND:
                raise
            failures += 1
            await asyncio.sleep(min(STREAM_RETRY * failures, 2.0))
            continue
        failures = 0
        for wire in batch.items:
            item = _STREAM_ITEM.validate_python(
                converter.from_payload(_decode_payload(wire.data)))
            item = item.model_copy(update={"offset": wire.offset})
            offset = wire.offset + 1
            yield item
            if isinstance(item, StreamResult):
                return
        offset = max(offset, batch.next_offset)
        if batch.items:
            idle = STREAM_POLL_FIRST
            continue
        if await _closed(latest):
            # Closed without a StreamResult (terminated, timed out): one last read for
            # what came before the end, then the stream is over.
            last = await latest.query(
                _POLL_QUERY, PollInput(topics=[STREAM_TOPIC], from_offset=offset),
                result_type=PollResult)
            for wire in last.items:
                item = _STREAM_ITEM.validate_python(
                    converter.from_payload(_decode_payload(wire.data)))
                yield item.model_copy(update={"offset": wire.offset})
            return
        await asyncio.sleep(idle)
        idle = min(idle * 1.5, STREAM_POLL_MAX)


async def _closed(handle: WorkflowHandle[Any, Any]) -> bool:
    """Whether the workflow id's latest run is closed (not running, not continued)."""
    try:
        desc = await handle.describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise
        return False  # asked again at the next empty read
    return desc.status not in (None, WorkflowExecutionStatus.RUNNING,
                               WorkflowExecutionStatus.CONTINUED_AS_NEW)


async def query_status(handle: WorkflowHandle[Any, Any]) -> RunStatus:
    """The run's status query. Raises RunStuck (nothing sent) when the worker that took
    the query could not replay the run to answer it: its code or toolset is not the one
    the run started on (before any workflow task of the run has failed, that is how a
    bad deploy first shows)."""
    from boundloop.workflows.loop import BoundLoopWorkflow

    try:
        return await handle.query(BoundLoopWorkflow.status)
    except WorkflowQueryFailedError as exc:
        cause = preview((str(exc) or type(exc).__name__).splitlines()[0], 200)
        line = (f"the worker could not replay run {handle.id} to answer its status query "
                f"({cause}): the code or toolset it serves is not the one the run started "
                "on — deploy that again (`boundloop replay-check` names the divergence)")
        raise errors.RunStuck(line, line=line, recorded=False) from None


#: Seconds without an answer to the status query before `follow` says no worker answers.
SILENCE_SECONDS = 10.0


async def follow(handle: WorkflowHandle[Any, Any], interval: float = 0.2,
                 on_silence: Callable[[str], None] | None = None,
                 on_stuck: Callable[[str], None] | None = None,
                 ) -> AsyncIterator[tuple[RunStatus, list[Event]]]:
    """Yield (status, new events) until the run closes. `on_silence(task_queue)` is called
    once when no worker has answered the status query for a while; `on_stuck(line)` once
    each time the run's workflow task starts failing (the stuck line: cause and fix).
    A step's `model_requested` is yielded with the event after it: a shared budget that
    refuses the step takes it back (the request was never sent) for `budget_refused`."""
    seen = 0
    answered = time.monotonic()  # when a status query was last answered (or the start)
    warned = False
    stuck = False
    while True:
        desc = await handle.describe()
        retrying = (desc.raw_description.HasField("pending_workflow_task")
                    and desc.raw_description.pending_workflow_task.attempt >= 2)
        if retrying and not stuck and on_stuck is not None:
            # Only a retried task costs a history read, once per stuck spell.
            line = await stuck_line(handle, desc)
            if line is not None:
                stuck = True
                on_stuck(line)
        elif not retrying:
            stuck = False
        try:
            status = await asyncio.wait_for(query_status(handle), timeout=3)
            answered, warned = time.monotonic(), False
        except (RPCError, TimeoutError):
            # A query waits for a worker to take it (3 s at most here): only a silence this
            # long says that no worker is there (a busy one answers late).
            status = None
            silent = time.monotonic() - answered >= SILENCE_SECONDS
            if silent and not warned and on_silence is not None and not stuck:  # stuck said why
                warned = True
                on_silence(desc.task_queue)
        if status is not None:
            # Event numbers count from the run's first event: a long run's status holds
            # only its newest events, after `events_dropped` older ones.
            dropped = status.events_dropped
            end = dropped + len(status.events)
            if (desc.status == WorkflowExecutionStatus.RUNNING and end > seen
                    and status.events[-1].event == "model_requested"):
                # Not yet: the step may still be reserving its budget (see above).
                end -= 1
            new = status.events[max(seen - dropped, 0):max(end - dropped, 0)]
            seen = max(end, seen)
            yield status, new
        if desc.status != WorkflowExecutionStatus.RUNNING:
            return
        await asyncio.sleep(interval)


async def decide(handle: WorkflowHandle[Any, Any], decision: Decision) -> str:
    """Send a decision through the validated `decide` update (Temporal's errors raise:
    `Run.approve` translates them)."""
    from boundloop.workflows.loop import BoundLoopWorkflow

    return await handle.execute_update(BoundLoopWorkflow.decide, decision)


#: How often a decision in flight checks whether the run's workflow task started failing.
STUCK_CHECK_SECONDS = 1.0


async def _update_unless_stuck(handle: WorkflowHandle[Any, Any],
                               decision: Decision) -> str | None:
    """The `decide` update, given up when the run's workflow task starts failing while it
    waits: then the stuck line (the server keeps refusing the update until a healthy
    worker serves the run)."""
    update = asyncio.ensure_future(decide(handle, decision))
    try:
        while True:
            await asyncio.wait({update}, timeout=STUCK_CHECK_SECONDS)
            if not update.done():
                line = await stuck_line(handle, await handle.describe())
                if line is None:
                    continue
                if not update.done():
                    return line
            update.result()  # its answer came first: applied, or its own error raises
            return None
    finally:
        # Given up (stuck, or the stuck check failed): the cancelled RPC may still end in
        # an error of its own, which is nobody's news; retrieved, so that asyncio never
        # prints "Task exception was never retrieved" at exit.
        update.add_done_callback(_retrieved)
        update.cancel()


def _retrieved(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


async def recorded_decision(handle: WorkflowHandle[Any, Any], call_id: str
                            ) -> Decision | None:
    """The first decision on `call_id` sent as the `approve`/`reject` signal, as the run's
    history holds it (the server answers: no worker needed), or None."""
    client: Client = handle._client  # its converter and codec read the payloads
    async for event in handle.fetch_history_events():
        if not event.HasField("workflow_execution_signaled_event_attributes"):
            continue
        signaled = event.workflow_execution_signaled_event_attributes
        if signaled.signal_name not in ("approve", "reject"):
            continue
        try:
            [decision] = await client.data_converter.decode(signaled.input.payloads,
                                                            [Decision])
        except Exception:  # a payload this process cannot read: not a decision of ours
            continue
        if isinstance(decision, Decision) and decision.call_id == call_id:
            return decision
    return None


async def record(handle: WorkflowHandle[Any, Any], decision: Decision) -> None:
    """Send a decision as the `approve` or `reject` signal: the server records it in the
    run's history whatever state its workflow task is in, and the run applies it (or
    ignores it, for the reasons `decide` refuses one) when a worker replays it."""
    from boundloop.workflows.loop import BoundLoopWorkflow

    signal = BoundLoopWorkflow.approve if decision.approve else BoundLoopWorkflow.reject
    await handle.signal(signal, decision)


async def cancel(handle: WorkflowHandle[Any, Any], reason: str | None) -> None:
    """Cancel a run, with the operator's reason. The reason goes first, as a signal: the
    server records it before the cancel request, so the workflow has it when the cancel
    arrives (a reason sent to a run that then cannot be cancelled changes nothing)."""
    from boundloop.workflows.loop import BoundLoopWorkflow

    if reason is not None:
        await handle.signal(BoundLoopWorkflow.cancel_reason, CancelRequest(reason=reason))
    await handle.cancel()
