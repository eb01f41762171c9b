"""The run workflow's version patches (docs/durability.md), and how a run asks them.

Each patch a run asks is a marker event (and an upsert of `TemporalChangeVersion`) the
first time: a run asks a bundle as one marker at its start, and the patches it bundles
are answered without one. Some patches are asked only when their situation arises (the
driver's `AskPatch`), so a run whose history never met it never writes the marker.
"""

from __future__ import annotations

from dataclasses import dataclass

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from boundloop.core import driver

#: The patch under which failures are counted by the workflow (runs that started before
#: it had Temporal count them, and stopped at the first failure Temporal returned).
COUNTED_RETRIES = "counted-retries"
#: The patch under which a stopped run withdraws the approvals still pending (before it,
#: a run cancelled while waiting kept reporting one pending).
WITHDRAWN_ON_STOP = "withdrawn-on-stop"
#: The patch under which a run is first admitted under its worker's operator policy
#: (the `admit_run` local activity, recorded once; docs/security.md).
OPERATOR_POLICY = "operator-policy"
#: The patch under which continue-as-new hands the admitted tool rules to the next run
#: (before it, the next run read them from its worker's toolset: a rename stranded it).
CARRIED_RULES = "carried-rules"
#: A run whose input carries state it was not handed by continue-as-new is refused.
CARRIED_BY_CONTINUE = "carried-by-continue"
#: A run whose input continues a conversation (`turn.follows`) is refused unless the
#: session that owns that turn started it as its child.
TURN_FOLLOWS_OWNED = "turn-follows-owned"
#: The patch under which the search attributes are upserted only when the status, stop
#: reason or pending approvals change (the counters ride along; current details show
#: them live): before it, every step's new count was one more event in history.
SPARSE_UPSERTS = "sparse-upserts"
#: The patch under which a run naming tools its worker does not serve is refused in a
#: sentence naming them and the tools served (`operator.unknown_tools_line`).
UNKNOWN_TOOLS_NAMED = "unknown-tools-named"
#: The patch under which a tool served with another argument schema than the run was
#: admitted with is decided by the admitted rules, and its calls carry the admitted
#: schema's digest (the tool activity refuses a call whose schema changed).
ADMITTED_SCHEMAS = "admitted-schemas"
#: The patch under which the admission is given the run's search attributes (an
#: operator's `budget.key_from` derives the budget key from them).
ADMIT_ATTRIBUTES = "admit-search-attributes"
#: The patch under which a short read-only tool runs as a local activity
#: (`boundloop.core.loop.runs_locally`; before it, every tool was a regular activity).
LOCAL_TOOLS = driver.LOCAL_TOOLS
#: The patch under which a session's turn takes the approvals remembered for the session
#: by its earlier turns (within its own policy), accepts decisions remembered for the
#: session, and hands them back in its RunResult.
SESSION_GRANTS = "session-grants"
#: The patch under which a run's activities go to the holder's own queue only when the
#: shared queue does not put them where the conversation is (`routing.follows_holder`):
#: before it, every activity after the first model turn went to the holder's queue.
ROUTE_WHEN_NEEDED = "route-when-needed"
#: Every patch above, asked as one. Each patch asked is a marker event and an upsert of
#: `TemporalChangeVersion` (a visibility write on the server): 12 events of a new run's
#: history went to the six it asked. A run started under this patch takes every patch
#: of BUNDLED_PATCHES without asking it; a run that started before it (no marker in its
#: history) asks them one by one as it did. A patch added later is asked on its own (or
#: goes in a new bundle, asked first beside this one).
BUNDLED = "bundled-patches-0.3"
BUNDLED_PATCHES = frozenset({
    COUNTED_RETRIES, WITHDRAWN_ON_STOP, OPERATOR_POLICY, CARRIED_RULES, CARRIED_BY_CONTINUE,
    TURN_FOLLOWS_OWNED, SPARSE_UPSERTS, UNKNOWN_TOOLS_NAMED, ADMITTED_SCHEMAS,
    ADMIT_ATTRIBUTES, LOCAL_TOOLS, SESSION_GRANTS, ROUTE_WHEN_NEEDED})
#: The patch under which carried state is refused from a run a cron schedule or a
#: workflow retry started: the server sets `continued_run_id` on those too, with the
#: input of the first run (a starter's), not one handed over by continue-as-new.
CARRIED_GENUINE = "carried-genuine"
#: The patch under which a decision must name the run (first execution run id) and the
#: arguments' fingerprint its approver was shown (`approvals.changed`).
DECISIONS_BOUND = "decisions-bound"
#: The patch under which tool idempotency keys are scoped by the run's first execution
#: run id, not the workflow id alone: a new run under a reused workflow id never shares a
#: key with an earlier run, while continue-as-new, a reset and a crash keep them.
RUN_SCOPED_KEYS = "run-scoped-keys"
#: The patch under which a model request's `Idempotency-Key` is scoped as the tools' are
#: (RUN_SCOPED_KEYS): a new run under a reused workflow id never sends the key of an
#: earlier run's request, which a provider honouring keys would answer with that run's
#: response. In BUNDLED_05 (a run that started before it asks it on its own, at its
#: start).
MODEL_KEYS_SCOPED = "model-keys-scoped"
#: The patch under which a tool asks for approval when either the rules the run was
#: admitted with or the serving worker's rules say so (a deploy never loosens an open
#: run's approvals; a tightening applies at once).
STRICTER_APPROVALS = "stricter-approvals"
#: The next bundle: every patch of BUNDLED_PATCHES and those above, asked as one marker
#: by a run that starts under it (instead of BUNDLED).
BUNDLED_04 = "bundled-patches-0.4"
#: The patch under which the workflow alone retries a model request (Temporal never
#: does: a lost worker's attempt is retried without counting, a start-to-close timeout
#: counts as a timeout), the activity bounds the whole answer (model_answer_seconds,
#: start-to-close follows it), every attempt that reached the provider is charged to
#: the run and its shared budget (usage, else the worst case), each retry is a
#: `model_retried:<kind>` event, and the stream gets what of the answer's text the
#: activity did not send (docs/streaming.md). In BUNDLED_04 (a run that started before it
#: asks it on its own).
CHARGED_ATTEMPTS = "charged-model-attempts"
BUNDLED_04_PATCHES = BUNDLED_PATCHES | {CARRIED_GENUINE, DECISIONS_BOUND, RUN_SCOPED_KEYS,
                                        STRICTER_APPROVALS, CHARGED_ATTEMPTS}
#: The next bundle: every patch of BUNDLED_04_PATCHES and MODEL_KEYS_SCOPED, asked as one
#: marker by a run that starts under it (instead of BUNDLED_04).
BUNDLED_05 = "bundled-patches-0.5"
BUNDLED_05_PATCHES = BUNDLED_04_PATCHES | {MODEL_KEYS_SCOPED}
#: The patch under which a run stops `context_exhausted` before a request that would not
#: fit its context window (`core.context.check`, `limits.max_input_tokens`), and when
#: the provider refuses a request as over the window (before it: `model_error`). Asked
#: on its own, and only when the run stops so.
CONTEXT_WINDOW = driver.CONTEXT_WINDOW
#: The patch under which a response that used every output token its request allowed
#: ends the run `incomplete` whatever its status says (`core.cut_at_the_cap`): before
#: it, such a response reported `completed` was the answer. Asked on its own, and only
#: when a response reached the cap.
CUT_AT_THE_CAP = driver.CUT_AT_THE_CAP
#: The patch under which a run under the `summarize` context strategy makes one summary
#: request before a request that would not fit its window (or that the provider refused
#: as too long), and sends the summary in place of the conversation's oldest part from
#: then on (`core.context`, `driver.Run._summarize`). Asked on its own, and only when a
#: run first summarizes.
SUMMARIZE = driver.SUMMARIZE
#: The patch under which continue-as-new hands over a state of constant size
#: (`boundloop.core.carry`); asked on its own, when the run first continues as new or
#: its tables are full.
CONSTANT_CARRY = driver.CONSTANT_CARRY


@dataclass
class Patches:
    """The bundles a run started under, asked first thing (`start`); then
    `patched(name)` answers any patch, from its bundle or by asking it."""

    bundled: bool = False  # BUNDLED (or a later bundle)
    bundled_04: bool = False  # BUNDLED_04 (or BUNDLED_05)
    bundled_05: bool = False  # BUNDLED_05

    def start(self) -> None:
        """The first command of a new run: every later patch check reads it."""
        self.bundled_05 = workflow.patched(BUNDLED_05)
        self.bundled_04 = self.bundled_05 or workflow.patched(BUNDLED_04)
        self.bundled = self.bundled_04 or workflow.patched(BUNDLED)

    def patched(self, patch: str) -> bool:
        """`workflow.patched(patch)`, answered by the bundle for a run started under it."""
        return ((self.bundled_05 and patch in BUNDLED_05_PATCHES)
                or (self.bundled_04 and patch in BUNDLED_04_PATCHES)
                or (self.bundled and patch in BUNDLED_PATCHES) or workflow.patched(patch))
