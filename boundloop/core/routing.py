"""Which task queue a run's next activity goes to: pure, no Temporal, no I/O.

Each worker polls the shared task queue and one of its own. The worker that ran a run's
last model request holds the conversation in its cache, so the run's tool and model
activities go to that worker's own queue and the next model request finds it there.
Worker memory is only a cache: the workflow records which queue it used (the model
turn names it), and any other worker rebuilds the conversation from history.

On the holder's queue an activity gets one attempt, with a schedule-to-start timeout:
a failure Temporal would have retried on the shared queue (the worker was lost, or is
too busy to start it) sends the activity back to the shared queue, uncounted, and the
run forgets the holder until a model request names a new one.
"""

from __future__ import annotations

from collections.abc import Collection

#: Temporal's timeout types (their names) that mean the holding worker did not run or
#: finish the attempt: never started it, stopped heartbeating, or wedged. A
#: schedule-to-close timeout is the run's deadline, never a lost worker.
LOST_TIMEOUTS = frozenset({"SCHEDULE_TO_START", "HEARTBEAT", "START_TO_CLOSE"})


def lost_on_holder(timeout_type: str | None, error_type: str | None,
                   handled: Collection[str]) -> bool:
    """Whether a failed attempt on the holder's own queue goes back to the shared queue.

    - timeout_type: the name of the Temporal timeout that ended the attempt, if one did;
    - error_type: the failure's application error type, if it has one;
    - handled: the failure types the workflow counts or handles itself (on the shared
      queue they are non-retryable too).
    Everything else is what the shared queue's retry policy retries: a lost attempt."""
    if timeout_type is not None:
        return timeout_type in LOST_TIMEOUTS
    return error_type not in handled
