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

The holder's queue is needed only where the shared queue would not put the activity on
the holder. With eager activity execution on in the server, an activity scheduled on the
shared queue starts on the worker that ran the workflow task, and a run's workflow tasks
stay on the worker that caches the run: there the conversation already is, and the
holder's queue only adds a trip through matching. The model activity says in its turn
whether it found the conversation in its cache; from that recorded fact the run tries
the shared queue once the holder's queue has served it, stays there while the shared
queue finds the conversation, and follows the holder for good once it did not
(`follows_holder`). A short read-only tool runs as a local activity in the worker that
runs the workflow's tasks, and its output is cached there: when that is not the holder
(no eager execution put the model request there), the tool's outcome names that
worker's queue, which becomes the holder.
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


def follows_holder(cached: bool, on_holder: bool, shared_missed: bool) -> bool:
    """Whether the run's next activities go to the own queue of the worker that ran its
    last model request (rather than the shared queue).

    - cached: that request found the conversation in its worker's cache (False for a
      run's first request: nothing to find; its worker now holds the conversation);
    - on_holder: it was sent to the holder's own queue;
    - shared_missed: a request this run sent to the shared queue while a holder was
      named did not find the conversation (the shared queue does not follow it here:
      eager activity execution off in the server, or no slot free).
    A request that read its conversation from history leaves it on its own worker: follow
    that one. A hit on the shared queue says the shared queue finds it: stay. A hit on
    the holder's queue tries the shared queue, unless it already missed once."""
    if not cached:
        return True
    return on_holder and shared_missed
