"""Replay the committed histories of real runs against the current workflow code.

A change to the workflow that issues other commands (or the same ones in another
order) for an existing history fails here: such a change breaks every run that is
open when it is deployed, and needs `workflow.patched` (docs/durability.md).
Regenerate with `python -m tests.make_histories` only after an intended change.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import (
    HandleUpdateInput,
    Interceptor,
    Replayer,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

from boundloop import Plugin, errors
from tests.make_histories import HISTORIES, RUNS, workflow_id
from tests.support.crash_tools import tools

E = EventType


def load(path: str) -> WorkflowHistory:
    """`RELEASE/NAME.json` (one folder per released version, every one replayed), or an
    older `RELEASE/NAME.SUFFIX.json` kept to check a `workflow.patched` change; all were
    recorded under the workflow id of NAME."""
    file = HISTORIES / f"{path}.json"
    text = file.read_text(encoding="utf-8")
    # A session's turn runs under its own id (SESSION/turn-N), which its run checks.
    started = json.loads(text)["events"][0].get("workflowExecutionStartedEventAttributes", {})
    recorded = started.get("workflowId") or workflow_id(file.name.split(".")[0])
    return WorkflowHistory.from_json(recorded, text)


ALL_FILES = sorted(str(p.relative_to(HISTORIES).with_suffix(""))
                   for p in HISTORIES.glob("v*/*.json"))


def latest(name: str, upto: str = "v9999.0") -> str:
    """The newest release's recording of the history NAME (up to release `upto`)."""
    def release(p: str) -> tuple[int, ...]:
        return tuple(int(n) for n in p.split("/")[0][1:].split("."))
    return max((p for p in ALL_FILES if p.split("/")[1] == name
                and release(p) <= release(f"{upto}/")), key=release)


def kinds(history: WorkflowHistory) -> list[int]:
    return [event.event_type for event in history.events]


def test_every_representative_history_is_committed() -> None:
    assert set(RUNS) <= {p.split("/")[1] for p in ALL_FILES}
    assert not list(HISTORIES.glob("*.json")), "histories go in their release's folder"


@pytest.mark.parametrize("name", ALL_FILES)
async def test_history_replays_without_nondeterminism(name: str) -> None:
    """Every release's histories: runs started on any released version may be open."""
    replayer = Replayer(workflows=[], data_converter=pydantic_data_converter,
                        plugins=[Plugin(tools, deps=None)])
    result = await replayer.replay_workflow(load(name))
    assert result.replay_failure is None


def final_result(history: WorkflowHistory) -> dict[str, Any]:
    """The RunResult: the workflow's result when `completed`, else the detail of its
    `RunStopped` failure."""
    last = history.events[-1]
    if last.event_type == E.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
        info = last.workflow_execution_failed_event_attributes.failure.application_failure_info
        assert info.type == errors.RUN_STOPPED and info.non_retryable
        payload = info.details.payloads[0]
    else:
        assert last.event_type == E.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED
        payload = last.workflow_execution_completed_event_attributes.result.payloads[0]
    result: dict[str, Any] = json.loads(payload.data)
    return result


@pytest.mark.parametrize(("name", "reason", "shape"), [
    ("plain", "completed", {E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: 5}),
    ("approval", "completed", {E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED: 1}),
    ("rejection", "max_identical_calls", {E.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED: 1,
                                          E.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED: 1}),
    ("crash_resume", "completed", {E.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT: 1,
                                   E.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED: 1}),
    ("retried", "completed", {E.EVENT_TYPE_ACTIVITY_TASK_FAILED: 1,
                              E.EVENT_TYPE_TIMER_FIRED: 1, E.EVENT_TYPE_MARKER_RECORDED: 1}),
    ("cancelled", "cancelled", {E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED: 1,
                                E.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED: 1}),
    # The operator-policy patch and the admit_run local activity: two markers.
    ("admitted", "completed", {E.EVENT_TYPE_MARKER_RECORDED: 2}),
    # Two patches (operator policy, search attributes given to the admission) and the
    # admit_run marker; the run reserved from its tenant's ledger, then released.
    ("tenant_budget", "completed", {E.EVENT_TYPE_MARKER_RECORDED: 3,
                                    E.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED: 3}),
    # Two calls waiting, one update with `remember`: both ran.
    ("remembered", "completed", {E.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED: 1,
                                 E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: 4}),
    # Three steps: the Boundloop attributes upserted twice (running, completed), beside
    # the two patches' own upserts (operator-policy, sparse-upserts).
    ("sparse_upserts", "completed", {E.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES: 4,
                                     E.EVENT_TYPE_MARKER_RECORDED: 3}),
    # Five patches, admit_run, lookup_stock as a local activity (with its result),
    # flaky's two counted local attempts (failed, a backoff timer between): nine markers;
    # only the two model requests are scheduled activities.
    ("local_tool", "completed", {E.EVENT_TYPE_MARKER_RECORDED: 9,
                                 E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED: 2,
                                 E.EVENT_TYPE_TIMER_FIRED: 1}),
    # Six patches (route-when-needed among them), admit_run and three local lookups: ten
    # markers; four model requests (the second on the holder's own queue, then shared).
    ("routed_shared", "completed", {E.EVENT_TYPE_MARKER_RECORDED: 10,
                                    E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED: 4}),
    # The bundle's one patch marker, admit_run and two local lookups: four markers; the
    # 503 counted and retried after a timer (counted-retries, bundled).
    ("bundled", "completed", {E.EVENT_TYPE_MARKER_RECORDED: 4,
                              E.EVENT_TYPE_ACTIVITY_TASK_FAILED: 1, E.EVENT_TYPE_TIMER_FIRED: 1,
                              E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED: 4}),
    ("interrupted", "cancelled", {E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED: 1,
                                  E.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED: 0,
                                  E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: 1}),
])
def test_history_is_the_run_it_is_named_after(name: str, reason: str,
                                              shape: dict[int, int]) -> None:
    """Guards the fixtures themselves: a regenerated file must still show its scenario
    (the crash history: a task sent to the killed worker timed out)."""
    history = load(latest(name, upto="v0.3"))
    assert final_result(history)["reason"] == reason
    events = kinds(history)
    assert {kind: events.count(kind) for kind in shape} == shape
    assert E.EVENT_TYPE_WORKFLOW_TASK_FAILED not in events


@pytest.mark.parametrize(("name", "reason", "shape"), [
    # The approval's timer fired: no decision, no tool activity.
    ("approval_timed_out", "approval_timeout", {E.EVENT_TYPE_TIMER_FIRED: 1,
                                                E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED: 1}),
    # One attempt, refused (HTTP 400): never retried.
    ("model_error", "model_error", {E.EVENT_TYPE_ACTIVITY_TASK_FAILED: 1,
                                    E.EVENT_TYPE_TIMER_FIRED: 0}),
    # The bundle, admit_run and context-window markers; no model request.
    ("context_exhausted", "context_exhausted", {E.EVENT_TYPE_MARKER_RECORDED: 3,
                                                E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED: 0}),
    # A silent attempt failed (counted, charged), a backoff timer, then two answers.
    ("charged_retry", "completed", {E.EVENT_TYPE_ACTIVITY_TASK_FAILED: 1,
                                    E.EVENT_TYPE_TIMER_FIRED: 1,
                                    E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: 2}),
    ("cancelled_in_request", "cancelled", {E.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED: 1,
                                           E.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED: 1}),
    # Two steps: reserve, model, settle each, the lookup local; then the release.
    ("tenant_budget", "completed", {E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED: 7}),
])
def test_the_histories_of_0_4_are_the_runs_they_are_named_after(
        name: str, reason: str, shape: dict[int, int]) -> None:
    history = load(f"v0.4/{name}")
    assert final_result(history)["reason"] == reason
    events = kinds(history)
    assert {kind: events.count(kind) for kind in shape} == shape
    assert E.EVENT_TYPE_WORKFLOW_TASK_FAILED not in events


def test_the_summarized_history_is_a_run_that_summarized_once() -> None:
    """Recorded for the next release (0.5): three steps and one summary request (four
    model activities); markers: the bundle, admit_run, the two local lookups and
    context-summarize."""
    history = load("v0.5/summarized")
    assert final_result(history)["reason"] == "completed"
    events = kinds(history)
    assert events.count(E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED) == 4
    assert events.count(E.EVENT_TYPE_MARKER_RECORDED) == 5
    assert E.EVENT_TYPE_WORKFLOW_TASK_FAILED not in events


def updates(history: WorkflowHistory) -> list[str]:
    return [e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
            for e in history.events
            if e.event_type == E.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED]


def test_the_ledger_histories_before_and_after_limits_by_update() -> None:
    """A ledger started before the patch took its start input's limits (no marker); one
    after it starts without them, and a budget admin's signed update sets them."""
    before, after = load("v0.3/ledger.pre_signed"), load("v0.3/ledger")
    assert E.EVENT_TYPE_MARKER_RECORDED not in kinds(before)
    assert updates(before) == ["set_limits", "reserve"]
    assert kinds(after).count(E.EVENT_TYPE_MARKER_RECORDED) == 1
    assert updates(after) == ["set_signed_limits", "reserve"]
    # Each holds a reservation that was granted: the reap timer started.
    for history in (before, after):
        assert E.EVENT_TYPE_TIMER_STARTED in kinds(history)


def test_the_claimed_ledger_history_settles_and_releases_by_update() -> None:
    """A ledger under `budget-claims`: its marker first, the run's settlement and release
    as updates with its token, a forged settle signal in history that charged nothing,
    and a budget admin's signed reset."""
    history = load("v0.3/ledger_claims")
    assert kinds(history).count(E.EVENT_TYPE_MARKER_RECORDED) == 1
    assert updates(history) == ["set_signed_limits", "reserve", "settle_reservation",
                                "release_reservation", "reset"]
    assert kinds(history).count(E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED) == 1
    assert E.EVENT_TYPE_WORKFLOW_TASK_FAILED not in kinds(history)


#: update id -> what the replayed handler returned (JSON), filled by `_Recorder`.
REPLAYED: dict[str, Any] = {}


class _Inbound(WorkflowInboundInterceptor):
    async def handle_update_handler(self, input: HandleUpdateInput) -> Any:
        result = await super().handle_update_handler(input)
        REPLAYED[input.id] = None if result is None else result.model_dump(mode="json")
        return result


class _Recorder(Interceptor):
    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput
                                   ) -> type[WorkflowInboundInterceptor]:
        return _Inbound


@pytest.mark.parametrize("name", ["v0.3/ledger.pre_signed", "v0.3/ledger.started_with_limits",
                                  "v0.3/ledger", "v0.3/ledger_claims"])
async def test_a_replayed_ledger_answers_its_updates_as_recorded(name: str) -> None:
    """A ledger's state is rebuilt by replay: each update's answer (the limits it shows, a
    reservation granted) is the recorded one. A ledger started before the limits came by
    update keeps the limits of its start input (`started_with_limits`: started with no
    update at all, its reservation was granted by them)."""
    history = load(name)
    recorded = {
        e.workflow_execution_update_completed_event_attributes.meta.update_id: _answer(
            e.workflow_execution_update_completed_event_attributes.outcome.success.payloads)
        for e in history.events
        if e.event_type == E.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED}
    REPLAYED.clear()
    replayer = Replayer(workflows=[], data_converter=pydantic_data_converter,
                        plugins=[Plugin(tools, deps=None)], interceptors=[_Recorder()])
    assert (await replayer.replay_workflow(history)).replay_failure is None
    assert recorded == REPLAYED
    assert any(r.get("granted") for r in recorded.values())


def _answer(payloads: Any) -> Any:
    """An update's recorded answer (None: a handler that returns nothing)."""
    return json.loads(payloads[0].data) if payloads and payloads[0].data else None


def _failed_before_any_activity(name: str, markers: int, type_: str,
                                upto: str = "v9999.0") -> str:
    """The failure message of a committed history that failed with `type_` after
    `markers` markers and no activity."""
    history = load(latest(name, upto))
    events = kinds(history)
    assert events.count(E.EVENT_TYPE_MARKER_RECORDED) == markers
    assert E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED not in events
    last = history.events[-1]
    assert last.event_type == E.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED
    failure = last.workflow_execution_failed_event_attributes.failure
    assert failure.application_failure_info.type == type_
    message: str = failure.message
    return message


def test_the_unknown_tool_history_is_refused_at_admission_in_a_sentence() -> None:
    # operator-policy, the admit_run local activity, unknown-tools-named; no model request.
    message = _failed_before_any_activity("unknown_tool", 3, errors.UNKNOWN_TOOLS, "v0.3")
    assert message.startswith(
        "the worker on task queue 'histories' serves no tool named 'whisper' (it serves: ")
    # From 0.4: the bundle's one marker and the admit_run local activity.
    message = _failed_before_any_activity("unknown_tool", 2, errors.UNKNOWN_TOOLS)
    assert message.startswith(
        "the worker on task queue 'histories' serves no tool named 'whisper' (it serves: ")


@pytest.mark.parametrize(("name", "field"), [("forged_carried", "carried"),
                                           ("forged_follows", "turn.follows")])
def test_a_forged_input_history_is_refused_before_any_command(name: str, field: str) -> None:
    # Its patch's marker only: no admission, no model request, no upsert.
    message = _failed_before_any_activity(name, 1, errors.POLICY_REFUSED)
    assert message.startswith(f"the operator's policy refuses this run: {field}: ")


def test_the_squatted_session_history_refuses_that_turn_then_runs_the_next() -> None:
    history = load(latest("session_squatted"))
    events = kinds(history)
    # The turn-id-taken marker; turn-1's start failed, turn-2 started and completed.
    assert events.count(E.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_FAILED) == 1
    assert events.count(E.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED) == 1
    assert events.count(E.EVENT_TYPE_MARKER_RECORDED) == 1
    assert E.EVENT_TYPE_WORKFLOW_TASK_FAILED not in events


def test_the_tree_histories_are_a_parent_and_its_sub_agent() -> None:
    """A sub-agent's call is a child workflow in its parent's history (started, completed:
    the same few events whatever the child did); the child's own steps are in its own."""
    parent, child = load("v0.5/tree"), load("v0.5/tree_child")
    assert final_result(parent)["reason"] == "completed"
    events = kinds(parent)
    assert events.count(E.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED) == 1
    assert events.count(E.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED) == 1
    # The parent's two model requests only: the child's request and lookup are its own.
    assert events.count(E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED) == 2
    assert kinds(child).count(E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED) == 2
    started = child.events[0].workflow_execution_started_event_attributes
    assert started.parent_workflow_execution.workflow_id == parent.workflow_id
    assert child.workflow_id.startswith(f"{parent.workflow_id}/")
    assert E.EVENT_TYPE_WORKFLOW_TASK_FAILED not in events + kinds(child)
