"""Counted attempts of one activity, and where each attempt goes.

Why the workflow counts attempts itself instead of leaving retries to Temporal: a
retry policy cannot tell a provider's or a tool's failure (which must count against the
run's bounded attempts, `boundloop.core.retries`, with the backoff the provider asks
for) from an attempt lost to our own worker (a crash, a deploy, a holder queue nobody
polls), which must never use up an attempt; and only the workflow knows how much of the
run's deadline is left. So Temporal retries only lost attempts (workflows/options.py),
and every failure the activity reports comes back here to be counted, slept on with a
durable timer, and tried again or given up. A tool's attempts use this loop; a model
request's attempts are counted and charged by the driver (boundloop/core/driver.py,
`Run._charged_attempts`), one AttemptModel command each.

Where an attempt goes (`Routing`): the worker whose cache holds the run's conversation
has its own task queue; an activity sent there gets one attempt with a bounded wait to
start, and a miss goes to the shared queue without counting (docs/history.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    FailureError,
    RetryState,
    TimeoutError,
    is_cancelled_exception,
)

from boundloop.workflows import options

with workflow.unsafe.imports_passed_through():
    from boundloop.core import retries, routing

_R = TypeVar("_R")


@dataclass
class Routing:
    """Which task queue a run's next activity goes to.

    holder: the own task queue of the worker whose cache holds the conversation (named
    by the last model turn); None: the shared queue. follow: whether activities go there
    (before route-when-needed: always). shared_missed: a request sent to the shared
    queue while a holder was named did not find the conversation there (then the run
    follows the holder). active: route-when-needed, decided at the first turn naming a
    holder."""

    holder: str | None = None
    follow: bool = True
    shared_missed: bool = False
    active: bool = False

    def on_holder(self) -> bool:
        return self.holder is not None and self.follow

    def route(self, policy: RetryPolicy) -> dict[str, Any]:
        """Where the next activity goes: the holder's own queue (one attempt, bounded wait
        to start), or the shared queue with `policy` (docs/history.md, "Several workers")."""
        if not self.on_holder():
            return {"retry_policy": policy}
        return {"task_queue": self.holder, "retry_policy": options.HOLDER_RETRY,
                "schedule_to_start_timeout": options.HOLDER_START_TIMEOUT}

    def lost(self, err: ActivityError, policy: RetryPolicy) -> bool:
        """Whether the attempt failed on the holder's queue in a way the shared queue's
        `policy` would have retried; then the run forgets the holder."""
        if not self.on_holder():
            return False
        cause = err.cause
        timeout = (cause.type.name if isinstance(cause, TimeoutError) and cause.type is not None
                   else None)
        kind = cause.type if isinstance(cause, ApplicationError) else None
        if not routing.lost_on_holder(timeout, kind, policy.non_retryable_error_types or ()):
            return False
        workflow.logger.info("activity not run by the worker holding the conversation; "
                             "the shared queue takes it", extra={"timeout": timeout})
        self.holder = None
        return True

    def after_turn(self, worker_queue: str | None, cached: bool,
                   patched: Callable[[], bool]) -> None:
        """A model turn named the worker that holds the conversation now (`patched`:
        asks route-when-needed, only when it names one)."""
        # How this request was sent: by choice to the shared queue while a holder was
        # named, or to the holder's queue (not lost to the shared queue on the way).
        probed, on_holder = self.holder is not None and not self.follow, self.on_holder()
        self.holder = worker_queue
        if self.holder is not None and patched():
            self.active = True
            self.shared_missed = self.shared_missed or (probed and not cached)
            self.follow = routing.follows_holder(cached, on_holder, self.shared_missed)


@dataclass(frozen=True)
class Attempts:
    """One activity's counted attempts."""

    activity: Callable[..., Any]  # the activity, by reference
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
class Failed:
    """The attempts ended without a result: the last failure, how many were counted,
    every failed attempt (lost ones too), and whether the deadline ended them."""

    error: ActivityError
    failures: int
    attempts: list[ActivityError]
    deadline: bool


async def attempts(a: Attempts, arg: object, result_type: type[_R], *,
                   seconds_left: Callable[[], float], routes: Routing,
                   counted: Callable[[], bool]) -> _R | Failed:
    """One activity's counted attempts, the same for a model request and a tool
    execution: an attempt lost to a dead worker (Temporal retries it) or to the
    holder's queue (the shared queue takes it) is not counted; each failure of the
    provider or tool is, against `a.backoff`, until the attempts or the run's time
    (`seconds_left`) run out. `counted`: asks the counted-retries patch. A cancel of
    the run raises through. The result is decoded as the activity's own annotation
    says (`result_type` types it here)."""
    del result_type
    failures = 0
    failed: list[ActivityError] = []
    while True:
        start_to_close = timedelta(seconds=a.timeout_seconds + options.WEDGED_MARGIN)
        schedule_to_close = timedelta(seconds=max(seconds_left(), 1.0))
        try:
            if a.local_id is not None:
                # In this worker, within the workflow task: no heartbeats (the task's own
                # timeout notices a dead worker) and no routing. Its activity id is the
                # call's idempotency key: the model activity finds the result in history
                # by it.
                try:
                    result: _R = await workflow.execute_local_activity(
                        a.activity, args=[arg],
                        start_to_close_timeout=start_to_close,
                        schedule_to_close_timeout=schedule_to_close,
                        retry_policy=a.lost, activity_id=a.local_id, summary=a.summary)
                except FailureError as exc:
                    raise as_activity_error(exc, a.activity.__name__, a.local_id) from exc
            else:
                result = await workflow.execute_activity(
                    a.activity, args=[arg],
                    start_to_close_timeout=start_to_close,
                    schedule_to_close_timeout=schedule_to_close,
                    heartbeat_timeout=options.HEARTBEAT_TIMEOUT, **routes.route(a.lost),
                    summary=a.summary)
            return result
        except ActivityError as err:
            if a.on_failure is not None:
                a.on_failure()
            if is_cancelled_exception(err):
                raise asyncio.CancelledError from None  # the run was cancelled
            failed.append(err)
            in_time = seconds_left() > 0
            if (in_time or not a.deadline_ends) and a.local_id is None \
                    and routes.lost(err, a.lost):
                continue  # not a failure: the shared queue takes it (same request)
            # Schedule-to-close is the time left before the deadline: a retry refused
            # for lack of time is the deadline, not the provider.
            if a.deadline_ends and (err.retry_state == RetryState.TIMEOUT or not in_time):
                return Failed(err, failures, failed, deadline=True)
            failures += 1
            cause = err.cause if isinstance(err.cause, ApplicationError) else None
            if cause is not None and cause.type in a.retryable \
                    and err.retry_state != RetryState.TIMEOUT and counted():
                asked = cause.next_retry_delay
                delay = retries.next_delay(
                    a.backoff, failures, asked.total_seconds() if asked is not None else None,
                    seconds_left())
                if delay == "deadline" and a.deadline_ends:
                    return Failed(err, failures, failed, deadline=True)
                if not isinstance(delay, str):
                    workflow.logger.warning("activity failed; retrying", extra={
                        "activity": a.activity.__name__, "error_type": cause.type,
                        "failures": failures})
                    await workflow.sleep(delay)
                    continue
            return Failed(err, failures, failed, deadline=False)


def as_activity_error(err: FailureError, activity: str, activity_id: str) -> ActivityError:
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


def body_started(cause: BaseException | None) -> bool:
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
