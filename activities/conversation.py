"""Rebuild a run's conversation from references (docs/history.md).

The workflow never sends the whole conversation to the model activity, and each item
is written to Temporal history about once:
- model output items are the model activity's result;
- a tool's `function_call_output` is the tool activity's result (of a short read-only
  tool run as a local activity: the result in its marker, whose activity id is the
  call's idempotency key): the next `ModelRequest` carries only a reference to it
  (`output_ref`, the call's idempotency key); outputs the workflow wrote itself
  (invalid input, blocked, rejected) travel inline in `new_items`.

The activity keeps per-worker caches (memory is a cache, never the source of truth):
conversations by workflow id, each item held as the compact JSON a request sends it as
(`Packed`), and tool outputs by idempotency key (filled by the tool activity of the
same worker). On a miss - another worker, a restarted worker - it reads
the workflow's own event history, and after continue-as-new the earlier runs'
histories (a reference carried across continue-as-new resolves from the run before).
Every rebuild is checked against the digests the workflow computed.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from temporalio.api.common.v1 import Payloads
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import MarkerRecordedEventAttributes
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from boundloop import errors
from boundloop.contracts import (
    MODEL_ACTIVITY,
    OUTPUT_REF,
    TOOL_ACTIVITY,
    ConversationRef,
    ModelRequest,
)
from boundloop.contracts import ToolRequest as _ToolRequest
from boundloop.core.canonical import compact_json
from boundloop.core.context import text_digest
from boundloop.core.conversation import ConversationMeta, Item, meta_of
from boundloop.core.loop import ToolOutcome
from boundloop.core.turn import Turn

#: A conversation as each item's compact JSON: the bytes a request sends it as, and
#: what a worker's cache holds. A long run's conversation held as dicts is tens of
#: thousands of objects that every full garbage collection of the worker walks (in its
#: workflow tasks as much as in its activities); bytes are nothing to walk, and a
#: request joins them instead of encoding the conversation again at every step
#: (docs/benchmarks-long-runs.md).
Packed = tuple[bytes, ...]


def pack(items: Iterable[Item]) -> Packed:
    return tuple(compact_json(item).encode() for item in items)


def unpack(packed: Packed) -> list[Item]:
    items: list[Item] = json.loads(json_array(packed))
    return items


#: What every `function_call_output` item's compact JSON holds (a string's quotes are
#: escaped, so only a key of the item or of an object in it can match: decoded to tell).
_OUTPUT_TYPE = b'"type":"function_call_output"'


def tool_outputs(packed: Packed) -> tuple[list[int], list[Item]]:
    """(Where the conversation's `function_call_output` items are, those items): only
    the items that may be one are decoded."""
    at: list[int] = []
    outputs: list[Item] = []
    for index, chunk in enumerate(packed):
        if _OUTPUT_TYPE in chunk:
            item = json.loads(chunk)
            if item.get("type") == "function_call_output":
                at.append(index)
                outputs.append(item)
    return at, outputs


def json_array(packed: Packed) -> bytes:
    """The items as one JSON array: the bytes `compact_json(unpack(packed))` encodes to."""
    return b"[" + b",".join(packed) + b"]"


class _Lru(OrderedDict[str, Any]):
    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def put(self, key: str, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.capacity:
            self.popitem(last=False)


@dataclass
class _Entry:
    meta: ConversationMeta
    items: Packed
    run_id: str  # the Temporal run whose model request put it


@dataclass
class ConversationCache:
    """Per-worker LRUs: workflow id -> conversation after its last model turn, and
    idempotency key -> tool output text. Shared by the model and tool activities.

    Counters (for operators and `make bench`): `hits`/`misses` of conversation look-ups,
    `rebuilds` (model requests whose conversation was read from the event history) and
    `history_bytes` (event bytes those reads fetched). `queue` is the task queue only
    this worker polls (None outside a running worker): a run's next activities are sent
    there so they find this cache (docs/history.md, "Several workers")."""

    capacity: int = 512
    hits: int = 0
    misses: int = 0
    rebuilds: int = 0
    history_bytes: int = 0
    queue: str | None = None
    _conversations: _Lru = field(init=False)
    _outputs: _Lru = field(init=False)

    def __post_init__(self) -> None:
        self._conversations = _Lru(self.capacity)
        self._outputs = _Lru(self.capacity * 8)

    def get(self, workflow_id: str, meta: ConversationMeta) -> Packed | None:
        entry = self._conversations.get(workflow_id)
        if entry is None or entry.meta != meta:
            self.misses += 1
            return None
        self._conversations.move_to_end(workflow_id)
        self.hits += 1
        items: Packed = entry.items
        return items

    def put(self, workflow_id: str, meta: ConversationMeta, items: Packed,
            run_id: str) -> None:
        self._conversations.put(workflow_id, _Entry(meta, items, run_id))

    def conversation(self, workflow_id: str, run_id: str) -> list[Item] | None:
        """The conversation after the last model turn of the workflow's run `run_id`, if
        this worker has it: a workflow id may be reused by a new run, whose calls may
        have the call ids of the old one's."""
        entry = self._conversations.get(workflow_id)
        return None if entry is None or entry.run_id != run_id else unpack(entry.items)

    def put_output(self, key: str, output: str) -> None:
        self._outputs.put(key, output)

    def output(self, key: str) -> str | None:
        value: str | None = self._outputs.get(key)
        return value


def _resolve(items: list[Item], lookup: Callable[[str], str | None]) -> list[Item] | None:
    """Items with each `output_ref` replaced by its output; None if one is unknown."""
    resolved: list[Item] = []
    for item in items:
        # Only the workflow writes references, as tool outputs; a model's item (never a
        # function_call_output) may carry any key, `output_ref` too, and is kept as is.
        key = item.get(OUTPUT_REF) if item.get("type") == "function_call_output" else None
        if key is None:
            resolved.append(item)
            continue
        output = lookup(key)
        if output is None:
            return None
        resolved.append({"type": "function_call_output", "call_id": item["call_id"],
                         "output": output})
    return resolved


@dataclass
class _RunHistory:
    base: ConversationRef | None = None
    items: list[Item] = field(default_factory=list)  # may hold output_ref items
    outputs: dict[str, str] = field(default_factory=dict)
    bytes_read: int = 0


async def _read_run(client: Client, workflow_id: str, run_id: str,
                    before_step: int | None) -> _RunHistory:
    """One run's model requests, turns and tool outputs, up to model step `before_step`."""
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    converter = client.data_converter
    run = _RunHistory()
    models: dict[int, list[Item]] = {}  # scheduled event id -> the request's new items
    tools: dict[int, str] = {}
    summaries: dict[int, str] = {}  # scheduled event id -> a summary request's key
    async for event in handle.fetch_history_events():
        run.bytes_read += event.ByteSize()
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            name = attrs.activity_type.name
            if name == TOOL_ACTIVITY:
                [treq] = await converter.decode(list(attrs.input.payloads), [_ToolRequest])
                tools[event.event_id] = treq.idempotency_key
            elif name == MODEL_ACTIVITY:
                [req] = await converter.decode(list(attrs.input.payloads), [ModelRequest])
                assert isinstance(req, ModelRequest)
                if req.summarize is not None:
                    # A summary request adds nothing to the conversation: its answer is
                    # the summary later requests send, found by its key like an output.
                    summaries[event.event_id] = req.summarize.key
                    continue
                if before_step is not None and req.step >= before_step:
                    break
                if not models:
                    run.base = req.base
                models[event.event_id] = req.new_items
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            done = event.activity_task_completed_event_attributes
            if done.scheduled_event_id in models:
                [turn] = await converter.decode(list(done.result.payloads), [Turn])
                assert isinstance(turn, Turn)
                # A request's items count once it returned: a failed request (retried
                # by the workflow, or the last one of a stopped session turn) is
                # scheduled again or never answered, and sent nothing.
                run.items.extend(models[done.scheduled_event_id])
                run.items.extend(turn.items)
            elif done.scheduled_event_id in summaries:
                [turn] = await converter.decode(list(done.result.payloads), [Turn])
                assert isinstance(turn, Turn)
                run.outputs[summaries[done.scheduled_event_id]] = turn.text
            elif done.scheduled_event_id in tools:
                [outcome] = await converter.decode(list(done.result.payloads), [ToolOutcome])
                assert isinstance(outcome, ToolOutcome)
                run.outputs[tools[done.scheduled_event_id]] = outcome.envelope.to_output()
        elif event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            key, result = _local_tool_result(event.marker_recorded_event_attributes)
            if key is not None and result is not None:
                [outcome] = await converter.decode(list(result.payloads), [ToolOutcome])
                assert isinstance(outcome, ToolOutcome)
                run.outputs[key] = outcome.envelope.to_output()
    return run


#: Temporal's marker of a local activity's outcome: `data` (JSON: its type, its id, ...)
#: and, when it returned, `result`.
LOCAL_ACTIVITY_MARKER = "core_local_activity"


def _local_tool_result(marker: MarkerRecordedEventAttributes
                       ) -> tuple[str | None, Payloads | None]:
    """(idempotency key, result payloads) of a tool run as a local activity, whose
    activity id is the call's idempotency key; (None, None) for any other marker or a
    failed attempt."""
    if marker.marker_name != LOCAL_ACTIVITY_MARKER or "result" not in marker.details:
        return None, None
    data = marker.details["data"].payloads
    # Temporal writes `data` itself, always plain JSON (a codec never touches it).
    info = json.loads(data[0].data) if data else {}
    if info.get("activity_type") != TOOL_ACTIVITY:
        return None, None
    return str(info["activity_id"]), marker.details["result"]


def _mismatch(what: str) -> ApplicationError:
    return ApplicationError(f"{what} does not match the workflow's digest",
                            type=errors.CONVERSATION_MISMATCH, non_retryable=True)


async def from_history(client: Client, workflow_id: str, run_id: str,
                       before_step: int | None, base: ConversationRef | None,
                       cache: ConversationCache | None = None,
                       ) -> tuple[list[Item], dict[str, str]]:
    """(conversation before model step `before_step`, the tool outputs of this run and
    of the runs it continued from). A run's items may refer to outputs of the run before
    it: continue-as-new carries the unsent outputs as references. The bytes read are
    added to `cache.history_bytes`."""
    run = await _read_run(client, workflow_id, run_id, before_step)
    if cache is not None:
        cache.history_bytes += run.bytes_read
    base = base or run.base
    earlier: list[Item] = []
    outputs: dict[str, str] = {}
    if base is not None:
        earlier, outputs = await from_history(client, base.workflow_id, base.run_id, None,
                                              None, cache)
        if meta_of(earlier) != base.meta:
            raise _mismatch(f"conversation of run {base.run_id}")
    outputs.update(run.outputs)  # idempotency keys are unique across the runs
    items = _resolve(run.items, outputs.get)
    if items is None:
        raise _mismatch(f"run {run_id}: a referenced tool output is missing;")
    return earlier + items, outputs


async def summary_text(cache: ConversationCache, client: Client, req: ModelRequest,
                       workflow_id: str, run_id: str) -> str | None:
    """The text of the summary `req` sends in place of the conversation's oldest items
    (None: it sends none): the cache's, else the summary request's result in this run's
    history or an earlier run's, checked against the workflow's digest. A cached text
    of another digest is another summary under the same key (the run was reset, and
    summarized again): history has the run's own."""
    ref = req.summary
    if ref is None:
        return None
    text = cache.output(ref.key)
    if text is None or text_digest(text) != ref.digest:
        _, outputs = await from_history(client, workflow_id, run_id, req.step, req.base,
                                        cache)
        text = outputs.get(ref.key)
        if text is not None:
            cache.put_output(ref.key, text)
    if text is None or text_digest(text) != ref.digest:
        raise _mismatch(f"model step {req.step}: the summary {ref.key}")
    return text


async def rebuild(cache: ConversationCache, client: Client, req: ModelRequest,
                  workflow_id: str, run_id: str) -> tuple[Packed, bool]:
    """(The full conversation for `req`: `prior` + resolved `new_items`, checked against
    `req.expected`; whether it was read from the event history). Cache first; the event
    history when the cache cannot answer."""
    prior: Packed | None = () if req.prior.count == 0 else cache.get(workflow_id, req.prior)
    if prior is None and req.base is not None and req.base.workflow_id != workflow_id \
            and req.prior == req.base.meta:
        # A session's turn starts where the previous turn's workflow left off.
        prior = cache.get(req.base.workflow_id, req.prior)
    new = None if prior is None else _resolve(req.new_items, cache.output)
    if prior is not None and new is not None and req.prior.extend(new) == req.expected:
        return prior + pack(new), False
    cache.rebuilds += 1
    items, outputs = await from_history(client, workflow_id, run_id, req.step, req.base,
                                        cache)
    if meta_of(items) != req.prior:
        raise _mismatch(f"model step {req.step}: the rebuilt conversation")
    new = _resolve(req.new_items, outputs.get)
    if new is None or req.prior.extend(new) != req.expected:
        raise _mismatch(f"model step {req.step}: the new items")
    return pack([*items, *new]), True
