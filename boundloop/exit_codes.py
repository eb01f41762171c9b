"""Exit statuses, the same for every command (`boundloop …`, `boundloop worker`, the demo).

One table: the CLI, the worker's command-line edge and the terminal printer read it
here (docs: README "Exit codes").
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    #: Done; for `run --wait`, `watch`, `status`, `say`, `demo`: the run completed.
    OK = 0
    #: The command could not do it: a decision refused, a run that has ended, no worker
    #: answered, a port in use.
    FAILED = 1
    #: Invalid input (flags, settings, limits, a script, an unknown run): nothing changed.
    INVALID = 2
    #: The run ended without completing: a stop reason other than `completed` (and
    #: `context_exhausted`, below), or terminated / timed out by Temporal.
    STOPPED = 3
    #: Temporal could not be reached, or refused the connection (TLS).
    UNREACHABLE = 4
    #: `replay-check`: a history the local code does not replay (a deploy would strand
    #: that workflow).
    DIVERGED = 5
    #: The run's workflow task keeps failing (`status` names the cause and the fix).
    STUCK = 6
    #: `approve`/`reject` while no worker answers for the run: the decision is recorded
    #: in its history and takes effect when a worker picks the run up.
    RECORDED = 7
    #: The run stopped `context_exhausted`: its next request would not fit the model's
    #: context window (or the provider refused it as too long).
    CONTEXT_EXHAUSTED = 8
