"""Every timeout and retry policy of the activities boundloop's workflows call, in one
place (the activities themselves are called by reference where they are called).

Temporal retries only what our own workers lose; every failure of a provider or a tool
is the workflow's to count (workflows/attempts.py), so a crash never uses up an attempt.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy

from boundloop import errors

#: Both run activities heartbeat every second: an attempt whose worker died is noticed
#: within this and retried by Temporal (not counted), and a cancel reaches the attempt.
HEARTBEAT_TIMEOUT = timedelta(seconds=5)
#: Start-to-close beyond the provider's or tool's own timeout (which the activity
#: enforces and reports as a counted failure): only a wedged worker reaches it.
WEDGED_MARGIN = 10.0


def worker_lost(counted: list[str]) -> RetryPolicy:
    """Temporal retries only attempts lost to our own workers (heartbeat or start-to-close
    timeouts), without limit: schedule-to-close, the time left before the run's deadline,
    bounds them. Every failure type the activity raises is the workflow's to count
    (boundloop.core.retries), so a crash never uses up an attempt."""
    # 1 s apart, no growth: the heartbeat timeout already spaces lost attempts.
    return RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=1.0,
                       maximum_attempts=0,
                       non_retryable_error_types=[*counted, errors.PAYLOADS_TOO_LARGE])


#: Provider failures (HTTP, connection, provider timeout) and failures of our own code,
#: each counted against MODEL_BACKOFF; the others end the request at once.
MODEL_RETRYABLE = (errors.MODEL_REQUEST_RETRYABLE, errors.MODEL_ACTIVITY_FAILED)
MODEL_RETRY = worker_lost([*MODEL_RETRYABLE, errors.MODEL_REQUEST_REJECTED,
                           errors.MODEL_RESPONSE_TOO_LARGE, errors.CONVERSATION_MISMATCH])
#: Under the charged-model-attempts patch: one attempt per activity; the workflow retries.
MODEL_ONCE = RetryPolicy(maximum_attempts=1)
#: A tool's own failures, each counted against the tool's attempts.
TOOL_RETRYABLE = (errors.TRANSIENT_TOOL_ERROR, errors.TOOL_TIMED_OUT,
                  errors.UNEXPECTED_TOOL_ERROR)
TOOL_RETRY = worker_lost(list(TOOL_RETRYABLE))

#: An activity sent to the worker that holds the run's conversation (its own task queue)
#: gets one attempt, which waits this long at most to start: then, or if the worker is
#: lost while running it, the activity goes to the shared queue (core/routing.py).
HOLDER_START_TIMEOUT = timedelta(seconds=5)
HOLDER_RETRY = RetryPolicy(maximum_attempts=1)

#: The run's admission under its worker's operator policy (a local activity).
ADMIT_TIMEOUT = timedelta(seconds=10)

#: The look-up of a run's earlier Temporal runs' calls (a local activity reading their
#: continue-as-new inputs: one history event each).
EARLIER_CALLS_TIMEOUT = timedelta(seconds=60)

#: The shared budget's activities (reserve, settle, release): retried 1 s apart until
#: their own bound, as the ledger answers each message once.
LEDGER_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=1.0,
                           maximum_attempts=0)
RESERVE_TIMEOUT = timedelta(seconds=60)
#: How long a run's settlement, and its release at its end, wait for the ledger's answer;
#: then the ledger's own check for closed runs releases what the run held.
SETTLE_WAIT = timedelta(minutes=5)
RELEASE_WAIT = timedelta(seconds=30)
#: The ledger's check of which runs holding budget have closed.
CLOSED_RUNS_TIMEOUT = timedelta(seconds=30)
