"""The start of a run, before the driver's first command: the refusals of carried state
and conversations the run was not handed, the patches asked at start, the admission
under the worker's operator policy (a local activity, in history) and the approvals a
session's turn inherits.

The order of these commands is the run's history: every committed history replays only
if the patch markers and the admission's local activity come as they always did.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import NoReturn

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception

from boundloop.workflows import options
from boundloop.workflows.admission import RunTools
from boundloop.workflows.patches import (
    ADMIT_ATTRIBUTES,
    ADMITTED_SCHEMAS,
    CARRIED_BY_CONTINUE,
    CARRIED_GENUINE,
    CHARGED_ATTEMPTS,
    DECISIONS_BOUND,
    MODEL_KEYS_SCOPED,
    OPERATOR_POLICY,
    RUN_SCOPED_KEYS,
    SESSION_GRANTS,
    SPARSE_UPSERTS,
    STRICTER_APPROVALS,
    TURN_FOLLOWS_OWNED,
    UNKNOWN_TOOLS_NAMED,
)
from boundloop.workflows.publish import Publisher

with workflow.unsafe.imports_passed_through():
    from boundloop import errors
    from boundloop.activities.admission import Admissions
    from boundloop.contracts import AdmitRequest, RunInput
    from boundloop.core import driver, signatures
    from boundloop.core import loop as core
    from boundloop.core import session as sessions
    from boundloop.core.canonical import preview
    from boundloop.core.conversation import user_message
    from boundloop.core.operator import Refusal, unknown_tools_line
    from boundloop.tools import catalog


class Start:
    """What a run decides as it starts (read by its handlers and the driver afterwards)."""

    def __init__(self, inp: RunInput, state: core.LoopState, tools: RunTools,
                 ex: driver.Exchange, show: Publisher,
                 patched: Callable[[str], bool]) -> None:
        self._inp, self._state, self._tools, self._ex = inp, state, tools, ex
        self._show, self._patched = show, patched
        self.charged = False  # CHARGED_ATTEMPTS
        self.decisions_bound = False  # DECISIONS_BOUND
        # What tool idempotency keys are scoped by (RUN_SCOPED_KEYS).
        self.key_scope = workflow.info().workflow_id
        # What model idempotency keys are scoped by (MODEL_KEYS_SCOPED; None: the
        # workflow id, as runs before it).
        self.model_key_scope: str | None = None
        self.session_grants = False  # SESSION_GRANTS
        self.cancelled_first = False  # a cancel before the run began: it ends cancelled

    async def begin(self) -> None:
        """Everything before the driver's first command, in the order of the run's
        history (asked right after the bundles of patches)."""
        inp, info = self._inp, workflow.info()
        # Asked here, before any local activity: asked after one, a query that replays
        # the run could see the marker one workflow task early.
        self.charged = self._patched(CHARGED_ATTEMPTS)
        self._refuse_forged()
        # Asked first, so its marker goes in the first workflow task with the others.
        self._show.sparse = bool(inp.search_attributes) and self._patched(SPARSE_UPSERTS)
        # Asked first, with the run's first commands: a patch asked right after the
        # admission's local activity is asked in another workflow task on replay.
        own_schemas = self._patched(ADMITTED_SCHEMAS)
        stricter = self._patched(STRICTER_APPROVALS)
        self.decisions_bound = self._patched(DECISIONS_BOUND)
        self.key_scope = (f"{info.workflow_id}/{info.first_execution_run_id}"
                          if self._patched(RUN_SCOPED_KEYS) else info.workflow_id)
        if self.key_scope != info.workflow_id and self._patched(MODEL_KEYS_SCOPED):
            self.model_key_scope = self.key_scope
        # Asked of turns only: runs that are no session's turn never see this patch.
        self.session_grants = inp.turn is not None and self._patched(SESSION_GRANTS)
        if inp.carried is None and self._patched(OPERATOR_POLICY):
            # The admission (in history) says which tools were unknown when it started.
            try:
                await self._admit()
            except (asyncio.CancelledError, ActivityError) as err:
                if isinstance(err, ActivityError) and not is_cancelled_exception(err):
                    raise
                self.cancelled_first = True
        elif self._tools.unknown:
            self._tools.refuse_unknown(self._tools.unknown)
        if inp.carried is None:
            self._tools.offer_agents(self._state)
        if own_schemas:
            self._tools.own_schemas()
        if stricter:
            self._tools.ask_as_admitted()
        if inp.carried is None and self.session_grants:
            self._inherit_grants()
        if inp.carried is None:
            first = [user_message(inp.question)]
            self._ex.unsent = [*self._ex.unsent, *first]
            self._state.conversation = self._state.conversation.extend(first)
            self._state.log("run_started")

    def _refuse_forged(self) -> None:
        """Refuse carried state and a conversation to continue that the run was not
        handed by its own continue-as-new or by the session that owns the turn."""
        inp, info = self._inp, workflow.info()
        if inp.carried is not None and (
                (info.continued_run_id is None and self._patched(CARRIED_BY_CONTINUE))
                or (not sessions.continued_by_itself(info.continued_run_id,
                                                     info.cron_schedule, info.attempt)
                    and self._patched(CARRIED_GENUINE))):
            # Carried state skips the admission (it was admitted before continue-as-new):
            # only the run's own continue-as-new may hand it over, never a starter (a cron
            # schedule or a workflow retry starts the next run with the starter's input).
            _refuse(Refusal(field="carried", asked="a run state of its own",
                            operator="carried state comes only from the run's own "
                                     "continue-as-new (never a cron schedule or a "
                                     "retry): start the run without it"))
        if inp.tree is not None and (info.parent is None
                                     or info.parent.workflow_id != inp.tree.parent):
            # A sub-agent's run is bounded by the run that started it: a place in a tree
            # comes only from that parent, never from a starter.
            _refuse(Refusal(field="tree", asked="a place in an agent tree",
                            operator="only the run that starts a sub-agent gives it its "
                                     "place in the tree: start the run without `tree`"))
        if (inp.carried is None and inp.turn is not None and inp.turn.follows is not None
                and not sessions.owns_turn(inp.turn, info.parent.workflow_id
                                           if info.parent is not None else None,
                                           info.workflow_id)
                and self._patched(TURN_FOLLOWS_OWNED)):
            # The model would read the conversation it names (another run's, another
            # tenant's): only the session that owns the turn hands one on.
            _refuse(Refusal(field="turn.follows", asked="a conversation to continue",
                            operator="only a session continues a conversation, in the "
                                     "turns it starts: start the run without `turn`"))

    async def _admit(self) -> None:
        """The run's effective settings under the worker's operator policy, resolved once
        by a local activity whose result is in history (replay and continue-as-new, which
        carries the settings in the state, never ask the worker's current policy)."""
        inp = self._inp
        # As the run was started (the workflow upserts only its own Boundloop* ones).
        attributes = ({pair.key.name: pair.value
                       for pair in workflow.info().typed_search_attributes
                       if isinstance(pair.value, str)}
                      if self._patched(ADMIT_ATTRIBUTES) else {})
        admission = await workflow.execute_local_activity_method(
            Admissions.admit_run, AdmitRequest(settings=inp.settings, tools=list(inp.tools),
                                               mcp_tools=list(self._tools.mcp.values()),
                                               search_attributes=attributes),
            start_to_close_timeout=options.ADMIT_TIMEOUT)
        if admission.unknown:
            if self._patched(UNKNOWN_TOOLS_NAMED):
                raise ApplicationError(
                    unknown_tools_line(admission.unknown, admission.served,
                                       workflow.info().task_queue),
                    type=errors.UNKNOWN_TOOLS, non_retryable=True)
            self._tools.refuse_unknown(admission.unknown)
        if admission.settings is None:
            raise ApplicationError(
                "the operator's policy refuses this run: "
                + "; ".join(r.line() for r in admission.refusals),
                *[r.model_dump() for r in admission.refusals],
                type=errors.POLICY_REFUSED, non_retryable=True)
        self._state.settings = admission.settings
        self._tools.admit(admission)
        self._tools.offer_recall(self._state)
        served = catalog.served_on(workflow.info().task_queue)
        self._tools.keys = signatures.run_keys(served.approver_keys,
                                               self._state.policy.approver_keys)

    def _inherit_grants(self) -> None:
        """The session's remembered approvals, as far as this turn's policy allows. Taken
        only from the session that started this turn as its child: a run's own starter
        cannot hand itself approvals."""
        inp, parent = self._inp, workflow.info().parent
        if inp.turn is None or not inp.turn.grants or parent is None \
                or parent.workflow_id != inp.turn.session_id:
            return
        kept = sessions.session_grants(inp.turn.grants, tools=self._state.allowed_tools,
                                       approvers=self._state.policy.approvers,
                                       keys=self._tools.keys)
        for grant in kept:
            self._state.grants.append(grant)
            self._state.log("approval_inherited", tool=grant.tool, call_id=grant.call_id,
                            detail=f"remembered for the session by "
                                   f"{preview(grant.approver, 100)}: {grant.text}")


def _refuse(refusal: Refusal) -> NoReturn:
    """Fail the run as refused by the operator's policy (`PolicyRefused` for its starter),
    before any command of its own."""
    raise ApplicationError("the operator's policy refuses this run: " + refusal.line(),
                           refusal.model_dump(), type=errors.POLICY_REFUSED,
                           non_retryable=True)
