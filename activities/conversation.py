"""Rebuild a run's conversation from references (docs/history.md).

The workflow never sends the whole conversation to the model activity. Each item is
written to Temporal history once: new items in the `ModelRequest` that first carries
them, model output in that activity's result. The activity keeps a per-worker cache of
conversations (memory is a cache, never the source of truth); on a miss - another
worker, a restarted worker - it reads the workflow's own event history, and after
continue-as-new the earlier runs' histories. Every rebuild is checked against the
digest the workflow computed.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from boundloop.contracts import MODEL_ACTIVITY, ConversationRef, ModelRequest
from boundloop.core.conversation import ConversationMeta, Item, meta_of
from boundloop.core.turn import Turn


@dataclass
class _Entry:
    meta: ConversationMeta
    items: list[Item]


class ConversationCache:
    """LRU of workflow id -> the conversation after the last model turn."""

    def __init__(self, capacity: int = 512) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, workflow_id: str, meta: ConversationMeta) -> list[Item] | None:
        entry = self._entries.get(workflow_id)
        if entry is None or entry.meta != meta:
            self.misses += 1
            return None
        self._entries.move_to_end(workflow_id)
        self.hits += 1
        return entry.items

    def put(self, workflow_id: str, meta: ConversationMeta, items: list[Item]) -> None:
        self._entries[workflow_id] = _Entry(meta, items)
        self._entries.move_to_end(workflow_id)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()


async def _run_steps(client: Client, workflow_id: str, run_id: str,
                     before_step: int | None) -> tuple[ConversationRef | None, list[Item]]:
    """(base, items) of one run's model requests and turns, steps < `before_step`."""
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    requests: dict[int, ModelRequest] = {}
    items: list[Item] = []
    base: ConversationRef | None = None
    converter = client.data_converter
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name != MODEL_ACTIVITY:
                continue
            [req] = await converter.decode(list(attrs.input.payloads), [ModelRequest])
            assert isinstance(req, ModelRequest)
            if before_step is not None and req.step >= before_step:
                break
            if not requests:
                base = req.base
            requests[event.event_id] = req
            items.extend(req.new_items)
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            done = event.activity_task_completed_event_attributes
            if done.scheduled_event_id in requests:
                [turn] = await converter.decode(list(done.result.payloads), [Turn])
                assert isinstance(turn, Turn)
                items.extend(turn.items)
    return base, items


async def from_history(client: Client, workflow_id: str, run_id: str,
                       before_step: int | None, base: ConversationRef | None) -> list[Item]:
    """The conversation of run `run_id` up to (not including) model step `before_step`."""
    found_base, items = await _run_steps(client, workflow_id, run_id, before_step)
    base = base or found_base
    if base is None:
        return items
    earlier = await from_history(client, base.workflow_id, base.run_id, None, None)
    if meta_of(earlier) != base.meta:
        raise ApplicationError(
            f"conversation of run {base.run_id} does not match its digest",
            type="ConversationMismatch", non_retryable=True)
    return earlier + items


async def rebuild(cache: ConversationCache, client: Client, req: ModelRequest) -> list[Item]:
    """The full conversation for `req`: `prior` (cache or history) + `new_items`."""
    prior = cache.get(req.workflow_id, req.prior)
    if prior is None:
        prior = await from_history(client, req.workflow_id, req.run_id, req.step, req.base)
        if meta_of(prior) != req.prior:
            raise ApplicationError(
                f"model step {req.step}: rebuilt conversation does not match the workflow's "
                "digest", type="ConversationMismatch", non_retryable=True)
    return [*prior, *req.new_items]
