"""What a run shows while it runs: its search attributes and current details (the Web
UI), and its live stream (docs/streaming.md).

Each search-attribute upsert is an event in history, so the driver says where they
happen (`driver.Publish`); current details and the stream cost no history.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.contrib.workflow_streams import WorkflowStream
from temporalio.contrib.workflow_streams._types import PublisherState

with workflow.unsafe.imports_passed_through():
    from boundloop import search_attributes as sa
    from boundloop.contracts import STREAM_TOPIC, Reset, StreamEvent, TextDelta
    from boundloop.core import approvals, carry
    from boundloop.core import loop as core
    from boundloop.core.reasons import NEXT_CHECK, StopReason
    from boundloop.core.turn import Turn

#: Text of one `TextDelta` the workflow publishes (as the activity's pieces).
STREAM_PIECE = 4096


def status_of(s: core.LoopState) -> str:
    if s.reason is None:
        return "waiting_approval" if approvals.pending_count(s) else "running"
    return "completed" if s.reason == StopReason.COMPLETED else "stopped"


def cost_of(s: core.LoopState) -> float | None:
    """The run's cost in USD, when its model has a price."""
    return round(s.cost_usd, 8) if s.settings.model in s.policy.prices else None


class Publisher:
    """The run's search attributes, current details and stream."""

    def __init__(self, state: core.LoopState, stream: WorkflowStream, *, carried: bool,
                 search_attributes: bool) -> None:
        self._state = state
        # The live stream: a view of the event log, the model's text (published by the
        # model activity) and the end. Publishing here adds nothing to history; it is
        # carried through continue-as-new.
        self.stream = stream
        self.topic = stream.topic(STREAM_TOPIC)
        self._streamed = len(state.events) if carried else 0
        self._search_attributes = search_attributes
        self._published: tuple[object, ...] = ()
        self.sparse = False  # SPARSE_UPSERTS, decided when the run starts
        #: The stream's offset when the step's model request was built (complete_text).
        self._step_mark = 0

    def publish(self, attributes: bool = True) -> None:
        """Search attributes and current details for the Web UI.

        Each upsert is an event in history: upsert only when the status, stop reason or
        pending approvals changed; the step and tool-execution counts go with it (so they
        are exact from the run's end), and current details, which cost no history, show
        them live.
        """
        s = self._state
        self.stream_events()
        pending = approvals.pending_count(s)
        status = status_of(s)
        values: tuple[object, ...] = (status, s.reason, s.steps, s.tool_executions, pending)
        if self.sparse:
            values = values[:2] + values[4:]
        if attributes and self._search_attributes and values != self._published:
            self._published = values
            workflow.upsert_search_attributes([
                sa.STATUS.value_set(status),
                sa.STOP_REASON.value_set(s.reason.value if s.reason else ""),
                sa.STEPS.value_set(s.steps),
                sa.TOOL_EXECUTIONS.value_set(s.tool_executions),
                sa.PENDING_APPROVALS.value_set(pending),
            ])
        cost = cost_of(s)
        lines = [f"**{status}**" + (f" · {s.reason.value}" if s.reason else ""),
                 f"steps {s.steps} of {s.limits.max_steps} · tool executions "
                 f"{s.tool_executions} of {s.limits.max_tool_executions}",
                 f"tokens {s.usage.total_tokens} of {s.limits.token_threshold}"
                 + (f" · cost ${cost:.6f}" if cost is not None else "")]
        if s.reason is not None and s.reason != StopReason.COMPLETED:
            lines.append(f"check: {NEXT_CHECK[s.reason]}")
        if s.answer_looks_like_tool_call:
            lines.append("**the answer looks like a tool call**: it was not executed, and "
                         "it is not an answer to the question")
        for a in s.approvals:
            if a.status == "pending":
                lines.append(f"waiting for approval: {a.tool} `{a.call_id}` since "
                             f"{a.requested_at}" + (f" (asked because: {a.asked_because})"
                                                    if a.asked_because else ""))
        workflow.set_current_details("\n\n".join(lines))

    def stream_events(self) -> None:
        """Publish the event log's records not yet in the stream, in order."""
        for event in self._state.events[self._streamed:]:
            self.topic.publish(StreamEvent(event=event))
        self._streamed = len(self._state.events)

    def mark_step(self) -> None:
        """A step's model request is built: its text comes after this point."""
        self._step_mark = self.stream._base_offset + len(self.stream._log)

    def hand_over(self) -> None:
        """Before continue-as-new with a constant-size state: the stream keeps its newest
        items and publishers (boundloop.core.carry); every event the state keeps was
        published."""
        self._streamed = len(self._state.events)
        log = self.stream._log  # the stream's own record (private)
        cut = carry.stream_cut([item.data.ByteSize() for item in log])
        if cut:
            self.stream.truncate(self.stream._base_offset + cut)
        self.stream._publishers = carry.newest(self.stream._publishers,
                                               carry.PUBLISHERS_KEPT, lambda p: p.last_seen)

    def complete_text(self, step: int, turn: Turn) -> None:
        """Publish what of the answer's text the stream lacks (the activity sends its text
        best effort, and stops waiting for it once the answer is in), then close the
        attempt's publisher: a batch of it still on its way is dropped, not appended."""
        assert turn.streamed is not None
        attempt = turn.streamed.attempt
        converter = workflow.payload_converter()
        shown = ""
        # The step's text was published after its request was built: only the items
        # since are read (reading the whole log made each step slower than the last).
        since = max(0, self._step_mark - self.stream._base_offset)
        for item in self.stream._log[since:]:  # the stream's own record (private)
            if item.topic != STREAM_TOPIC:
                continue
            value = converter.from_payload(item.data)
            if isinstance(value, dict) and value.get("kind") == "text" \
                    and value.get("step") == step and value.get("attempt") == attempt:
                shown += str(value.get("text", ""))
        self.stream._publishers[turn.streamed.publisher] = PublisherState(
            sequence=2 ** 62, last_seen=workflow.now())
        text = turn.text
        if not text.startswith(shown):
            self.topic.publish(Reset(step=step, attempt=attempt))
            shown = ""
        rest = text[len(shown):]
        for start in range(0, len(rest), STREAM_PIECE):
            self.topic.publish(TextDelta(step=step, attempt=attempt,
                                         text=rest[start:start + STREAM_PIECE]))
