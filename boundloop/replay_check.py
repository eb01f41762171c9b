"""`boundloop replay-check`: replay the histories of open runs, sessions and budget
ledgers (and optionally the latest closed runs) against the local workflow code and
toolset before deploying it (docs/deploying.md).

A history the local code does not replay is a run that the new workers would fail
forever: its first divergent command is in the replay failure's message.

Temporal's replayer matches a command with the history by its kind and order only: a
timer of another duration, or an activity sent to another task queue, replays without
an error, and the run then waits on the history's timer (say, the approval timeout's
24 h) where the new code meant another (a 1 s timer inserted before the approval wait).
So the commands the local code issues while it replays are recorded (`_Recording`, a
workflow runner around the plugins' own) and compared with the history's: each timer's
duration (TimerStarted), each activity's type and task queue (ActivityTaskScheduled).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import temporalio.worker
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_commands import WorkflowCommand
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.client import Client, WorkflowHistory
from temporalio.plugin import SimplePlugin
from temporalio.worker import (
    Replayer,
    ReplayerConfig,
    WorkflowInstance,
    WorkflowInstanceDetails,
    WorkflowRunner,
)

from boundloop.contracts import BUDGET_WORKFLOW, SESSION_WORKFLOW, WORKFLOW_NAME
from boundloop.core.canonical import preview

__all__ = ["Divergence", "replay_check"]

#: Every boundloop workflow type: a run, a session, a budget ledger.
TYPES = (WORKFLOW_NAME, SESSION_WORKFLOW, BUDGET_WORKFLOW)


@dataclass(frozen=True)
class Divergence:
    """A history the local code does not replay."""

    workflow_id: str
    run_id: str
    workflow_type: str
    #: The replay failure: for a nondeterminism error, the first command that diverges.
    message: str


def _types() -> str:
    return ", ".join(f"'{t}'" for t in TYPES)


async def replay_check(client: Client, plugins: Sequence[temporalio.worker.Plugin], *,
                       closed: int = 0) -> tuple[int, list[Divergence]]:
    """Replay every open boundloop workflow and the `closed` latest closed runs with
    `plugins` (boundloop's Plugin with the local toolset). Returns how many histories
    were replayed and those that diverged."""
    recording = _Recording()
    replayer = Replayer(workflows=[], data_converter=client.data_converter,
                        plugins=[*plugins, recording])
    open_ones = f"WorkflowType IN ({_types()}) AND ExecutionStatus = 'Running'"
    queries: list[tuple[str, int | None]] = [(open_ones, None)]
    if closed > 0:
        queries.append((f"WorkflowType = '{WORKFLOW_NAME}' AND ExecutionStatus != 'Running'",
                        closed))
    replayed, diverged = 0, list[Divergence]()
    for query, limit in queries:
        kinds: dict[str, str] = {}
        histories = client.list_workflows(query, limit=limit)
        async with replayer.workflow_replay_iterator(
                _remember(histories.map_histories(), kinds)) as results:
            async for result in results:
                replayed += 1
                history = result.history
                issued = recording.issued.pop(history.run_id, [])
                own = recording.queues.pop(history.run_id, "")
                failure = result.replay_failure
                message = (_first_line(failure) if failure is not None
                           else first_difference(history, issued, own))
                if message is not None:
                    wf_id = history.workflow_id
                    diverged.append(Divergence(
                        workflow_id=wf_id, run_id=history.run_id,
                        workflow_type=kinds.get(wf_id, "?"), message=message))
    return replayed, diverged


def _seconds(value: Any) -> str:
    """A protobuf Duration as people read it: `86400 s`, `1.5 s`."""
    seconds = timedelta(seconds=value.seconds, microseconds=value.nanos // 1000)
    return f"{seconds.total_seconds():g} s"


def first_difference(history: WorkflowHistory, issued: Sequence[WorkflowCommand],
                     own_queue: str = "") -> str | None:
    """The first timer or activity the code issued (`issued`, in order) otherwise than
    the history has it, where Temporal's replayer does not look: a timer's duration, an
    activity's type or task queue (`own_queue`, the queue the replayer ran the code on,
    stands for the workflow's own). Commands past the end of the history are the run's
    future: nothing to compare them with. None when they all agree."""
    timers: dict[str, HistoryEvent] = {}
    activities: dict[str, HistoryEvent] = {}
    queue = ""
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            queue = event.workflow_execution_started_event_attributes.task_queue.name
        elif event.event_type == EventType.EVENT_TYPE_TIMER_STARTED:
            timers[event.timer_started_event_attributes.timer_id] = event
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            activities[event.activity_task_scheduled_event_attributes.activity_id] = event
    for command in issued:
        if command.HasField("start_timer"):
            timer = command.start_timer
            started = timers.get(str(timer.seq))
            if started is None:
                continue
            had = started.timer_started_event_attributes.start_to_fire_timeout
            if (had.seconds, had.nanos) != (timer.start_to_fire_timeout.seconds,
                                            timer.start_to_fire_timeout.nanos):
                return (f"timer {timer.seq} (HistoryEvent {started.event_id}, TimerStarted) "
                        f"was started for {_seconds(had)}, this code starts it for "
                        f"{_seconds(timer.start_to_fire_timeout)}: Temporal's replayer "
                        "matches timers by order, not duration, so the run would wait "
                        "for the history's timer")
        elif command.HasField("schedule_activity"):
            act = command.schedule_activity
            scheduled = activities.get(act.activity_id)
            if scheduled is None:
                continue
            had_act = scheduled.activity_task_scheduled_event_attributes
            wanted = queue if act.task_queue in ("", own_queue) else act.task_queue
            if had_act.activity_type.name != act.activity_type:
                return (f"activity {act.activity_id} (HistoryEvent {scheduled.event_id}, "
                        f"ActivityTaskScheduled) is {had_act.activity_type.name!r}, this "
                        f"code schedules {act.activity_type!r}")
            if had_act.task_queue.name != wanted:
                return (f"activity {act.activity_id} (HistoryEvent {scheduled.event_id}, "
                        f"{had_act.activity_type.name}) went to task queue "
                        f"{had_act.task_queue.name!r}, this code sends it to {wanted!r}")
    return None


class _Recording(SimplePlugin):
    """The commands each replayed run's code issued, by run id, in order, with the task
    queue the replayer gave the run (an activity sent to the workflow's own queue names
    it). The last plugin: it wraps the runners the others configured, the sandboxed
    one and the unsandboxed one (boundloop's workflows run unsandboxed)."""

    def __init__(self) -> None:
        super().__init__("boundloop-replay-check")
        self.issued: dict[str, list[WorkflowCommand]] = {}
        self.queues: dict[str, str] = {}

    def configure_replayer(self, config: ReplayerConfig) -> ReplayerConfig:
        config = super().configure_replayer(config)
        for key in ("workflow_runner", "unsandboxed_workflow_runner"):
            runner = config.get(key)
            if isinstance(runner, WorkflowRunner):
                config[key] = _RecordingRunner(runner, self)
        return config


class _RecordingRunner(WorkflowRunner):
    def __init__(self, runner: WorkflowRunner, recording: _Recording) -> None:
        self._runner = runner
        self._recording = recording

    def prepare_workflow(self, defn: Any) -> None:
        self._runner.prepare_workflow(defn)

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        issued = self._recording.issued.setdefault(det.info.run_id, [])
        self._recording.queues[det.info.run_id] = det.info.task_queue
        return _RecordingInstance(self._runner.create_instance(det), issued)

    def set_worker_level_failure_exception_types(
            self, types: Sequence[type[BaseException]]) -> None:
        self._runner.set_worker_level_failure_exception_types(types)


class _RecordingInstance(WorkflowInstance):
    def __init__(self, instance: WorkflowInstance, issued: list[WorkflowCommand]) -> None:
        self._instance = instance
        self._issued = issued

    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        completion = self._instance.activate(act)
        if completion.HasField("successful"):
            self._issued.extend(completion.successful.commands)
        return completion

    def get_info(self) -> Any:
        return self._instance.get_info()

    def get_serialization_context(self, *args: Any, **kwargs: Any) -> Any:
        return self._instance.get_serialization_context(*args, **kwargs)

    def get_external_store_context(self, *args: Any, **kwargs: Any) -> Any:
        return self._instance.get_external_store_context(*args, **kwargs)

    def get_thread_id(self) -> int | None:
        return self._instance.get_thread_id()


async def _remember(histories: AsyncIterator[WorkflowHistory],
                    kinds: dict[str, str]) -> AsyncIterator[WorkflowHistory]:
    """The histories, noting each one's workflow type (from its first event)."""
    async for history in histories:
        first = history.events[0] if history.events else None
        if first is not None:
            kinds[history.workflow_id] = (
                first.workflow_execution_started_event_attributes.workflow_type.name)
        yield history


def _first_line(failure: Exception) -> str:
    """The nondeterminism message (`[TMPRL1100] Nondeterminism error: …`), without the
    SDK's wrapping."""
    text = str(failure)
    start = text.find("[TMPRL")
    if start >= 0:
        text = text[start:]
        end = text.find('", source')
        text = text[:end] if end > 0 else text
    elif (at := text.find('message: "')) >= 0:
        # The workflow code raised (say, a tool the local toolset no longer has): the
        # exception's own message, not the SDK's dump of the failure with its stack.
        message = text[at + len('message: "'):]
        end = message.find('", ')
        text = "the workflow code raised: " + (message[:end] if end > 0 else message)
    return preview(text.splitlines()[0], 300) if text else type(failure).__name__
