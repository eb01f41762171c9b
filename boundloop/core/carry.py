"""What continue-as-new hands over, in constant size. Pure: no Temporal, no I/O.

A run continues as new (docs/history.md) with its counters and a few bounded windows;
what a limit needs of *every* earlier call of the run stays in the earlier Temporal
runs' histories and is looked up by reference:

- Each Temporal run hands over, in its `WorkflowExecutionContinuedAsNew` event's input,
  its **segment**: the identical-call counts, call ids and rejected fingerprints it
  touched (a count read from an earlier run is carried on as the total), and the run
  before it that handed over a segment of its own (`Earlier.previous`): a chain.
- The next run starts with empty tables and a fixed-size Bloom filter (`Earlier.seen`)
  of every fingerprint and call id in any earlier segment. A call whose key the filter
  may hold, and this run's tables do not, is looked up along the chain, newest first
  (the `earlier_calls` activity): its newest segment holds its total. The filter never
  misses a key it was given, so the identical-call limit, a human's rejection and the
  duplicate call id check see every earlier call of the run, exactly as before; a
  false positive costs one look-up that finds nothing.
- The event log, model attempts and decided approvals keep their newest records; the
  older ones stay in the earlier runs' histories, with a count (`events_dropped`, one
  summed `ModelAttempt`) so totals still add up.

Bound: a run's segment holds at most SEGMENT_MAX keys (the run continues as new once
it reaches them), the filter is FILTER_BITS bits, the event log EVENTS_KEPT events and
model attempts ATTEMPTS_KEPT records; the rest of the carried input (settings, tool
declarations, the last step's unsent outputs, the stream's newest items up to
STREAM_KEPT_BYTES) is bounded by the run's own settings and limits, never by its steps.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from pydantic import BaseModel, Field

from boundloop.core import loop as core
from boundloop.core.envelope import Envelope
from boundloop.core.fingerprint import fingerprint, invalid_fingerprint
from boundloop.core.loop import Earlier
from boundloop.core.turn import FunctionCall, Turn

_T = TypeVar("_T")

#: Bits of the Bloom filter of earlier keys (16 KiB; about 22 KB in the carried JSON).
#: With FILTER_HASHES hashes it answers "maybe" for a key never seen about once in 200
#: at 10,000 keys, once in 23 at 20,000, once in 4 at 40,000: only a look-up more,
#: never a wrong decision.
FILTER_BITS = 1 << 17
FILTER_HASHES = 4
#: A Temporal run continues as new once its segment holds this many keys, whatever the
#: server suggests (a step that adds more is finished first: one step's calls are
#: bounded by `max_tool_executions`).
SEGMENT_MAX = 2000
#: The newest records the carried state keeps of the event log and model attempts.
EVENTS_KEPT = 100
ATTEMPTS_KEPT = 50
#: The stream's newest items kept across continue-as-new, by their payload bytes: a
#: reader that follows the run is never that far behind.
STREAM_KEPT_BYTES = 16_000
#: The stream publishers (one per model attempt that streamed) whose dedup state is
#: carried: the newest ones. An attempt's text still on its way after this many later
#: attempts, and after a continue-as-new, would be appended instead of dropped.
PUBLISHERS_KEPT = 20
#: Prefix of a call id's key (fingerprints are `tool:digest` and never start so).
CALL_ID = "\x00id:"
#: The event that stands for the events a RunResult leaves out.
DROPPED = "events_dropped:"
#: Outcome of the one ModelAttempt that stands for the attempts no longer carried.
EARLIER_ATTEMPTS = "earlier_attempts:"


class Segment(BaseModel):
    """What one Temporal run touched of the whole-run tables, handed over with it."""

    identical_calls: dict[str, int] = Field(default_factory=dict)
    call_ids: list[str] = Field(default_factory=list)
    rejected_fingerprints: list[str] = Field(default_factory=list)

    def all_keys(self) -> list[str]:
        return [*self.identical_calls, *self.rejected_fingerprints,
                *(CALL_ID + c for c in self.call_ids)]


class EarlierRequest(BaseModel):
    """The `earlier_calls` activity's input: keys to find along the chain of segments
    that starts at `run_id`'s continue-as-new input (of this workflow)."""

    run_id: str
    keys: list[str]


class EarlierCalls(BaseModel):
    """What the earlier segments say of the keys asked: each fingerprint's total count
    and whether a human rejected it, and the call ids used."""

    identical_calls: dict[str, int] = Field(default_factory=dict)
    rejected_fingerprints: list[str] = Field(default_factory=list)
    call_ids: list[str] = Field(default_factory=list)
    runs_read: int = 0


def _positions(key: str) -> list[int]:
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
    return [int.from_bytes(digest[4 * i:4 * i + 4], "big") % FILTER_BITS
            for i in range(FILTER_HASHES)]


def empty_filter() -> str:
    return base64.b64encode(bytes(FILTER_BITS // 8)).decode("ascii")


def add_keys(seen: str, keys: Iterable[str]) -> str:
    bits = bytearray(base64.b64decode(seen))
    for key in keys:
        for p in _positions(key):
            bits[p >> 3] |= 1 << (p & 7)
    return base64.b64encode(bytes(bits)).decode("ascii")


def may_hold(bits: bytes, key: str) -> bool:
    return all(bits[p >> 3] & (1 << (p & 7)) for p in _positions(key))


def segment_full(state: core.LoopState) -> bool:
    """The run's tables reached SEGMENT_MAX keys: time to hand them over."""
    return (len(state.identical_calls) + len(state.call_ids)
            + len(state.rejected_fingerprints)) >= SEGMENT_MAX


def hand_over(state: core.LoopState, previous: str | None) -> Segment:
    """At continue-as-new: move the tables into the segment this run hands over, add
    their keys to the filter, and keep only the newest records of the logs. `previous`:
    the run whose input handed this run a segment (its predecessor), None for the first
    run of the chain."""
    segment = Segment(identical_calls=dict(state.identical_calls),
                      call_ids=list(dict.fromkeys(state.call_ids)),
                      rejected_fingerprints=list(state.rejected_fingerprints))
    earlier = state.earlier
    state.earlier = Earlier(
        seen=add_keys(earlier.seen if earlier is not None else empty_filter(),
                      segment.all_keys()),
        previous=previous,
        lookups=earlier.lookups if earlier is not None else 0,
        found=earlier.found if earlier is not None else 0)
    state.identical_calls, state.call_ids, state.rejected_fingerprints = {}, [], []
    dropped = len(state.events) - EVENTS_KEPT
    if dropped > 0:
        state.events = state.events[dropped:]
        state.events_dropped += dropped
    # Decided approvals are in the event log and the earlier histories; none is pending
    # between steps, where a run continues as new.
    state.approvals = [a for a in state.approvals if a.status == "pending"]
    state.model_attempts = fold_attempts(state.model_attempts)
    return segment


def fold_attempts(attempts: list[core.ModelAttempt]) -> list[core.ModelAttempt]:
    """The newest ATTEMPTS_KEPT attempts, after one that sums the older ones (so every
    attempt's tokens still add up to the run's total)."""
    cut = len(attempts) - ATTEMPTS_KEPT
    if cut <= 1:
        return attempts
    old = attempts[:cut]
    count = sum(int(a.outcome.removeprefix(EARLIER_ATTEMPTS))
                if a.outcome.startswith(EARLIER_ATTEMPTS) else 1 for a in old)
    summed = core.ModelAttempt(
        step=old[-1].step, outcome=f"{EARLIER_ATTEMPTS}{count}",
        input_tokens=sum(a.input_tokens for a in old),
        output_tokens=sum(a.output_tokens for a in old),
        worst_case=any(a.worst_case for a in old))
    return [summed, *attempts[cut:]]


def _call_fingerprint(state: core.LoopState, call: FunctionCall,
                      rules: dict[str, core.ToolRule]) -> str | None:
    """The fingerprint `plan_calls` gives the call (None: it has none)."""
    if not call.name:
        return None
    if call.name not in state.allowed_tools:
        return invalid_fingerprint(call.name, call.arguments)
    model = core._validate_arguments(call, rules[call.name])
    if isinstance(model, Envelope):
        return invalid_fingerprint(call.name, call.arguments)
    args = model if isinstance(model, dict) else model.model_dump(mode="json")
    return fingerprint(call.name, args)


def to_look_up(state: core.LoopState, turn: Turn,
               rules: dict[str, core.ToolRule]) -> list[str]:
    """The keys of the response's calls an earlier Temporal run may hold and this run's
    tables do not: their fingerprints and (on the Responses API) call ids."""
    earlier = state.earlier
    if earlier is None or not turn.calls or turn.fault is not None \
            or turn.status != "completed":
        return []
    bits = base64.b64decode(earlier.seen)
    keys: list[str] = []
    for call in turn.calls:
        fp = _call_fingerprint(state, call, rules)
        if fp is not None and fp not in state.identical_calls \
                and fp not in state.rejected_fingerprints:
            keys.append(fp)
        if state.settings.api == "responses" and call.call_id not in state.call_ids:
            keys.append(CALL_ID + call.call_id)
    return [k for k in dict.fromkeys(keys) if may_hold(bits, k)]


def look_in(segment: Segment, wanted: set[str], out: EarlierCalls) -> None:
    """Take from `segment` the keys still `wanted` (segments are read newest first: a
    fingerprint's newest segment holds its total count, since a run that read it
    carried it on with its own calls added); found keys leave `wanted`."""
    out.runs_read += 1
    for key in sorted(wanted):
        if key.startswith(CALL_ID):
            if key.removeprefix(CALL_ID) in segment.call_ids:
                out.call_ids.append(key.removeprefix(CALL_ID))
                wanted.discard(key)
        elif key in segment.identical_calls or key in segment.rejected_fingerprints:
            if key in segment.identical_calls:
                out.identical_calls[key] = segment.identical_calls[key]
            if key in segment.rejected_fingerprints:
                out.rejected_fingerprints.append(key)
            wanted.discard(key)


def take_earlier(state: core.LoopState, asked: list[str], found: EarlierCalls) -> None:
    """Put what the earlier runs hold of the keys into this run's tables (so this run's
    segment carries them on): the limits then decide as if they had never left."""
    assert state.earlier is not None
    for fp, count in found.identical_calls.items():
        state.identical_calls[fp] = count
    for fp in found.rejected_fingerprints:
        if fp not in state.rejected_fingerprints:
            state.rejected_fingerprints.append(fp)
    state.call_ids.extend(c for c in found.call_ids if c not in state.call_ids)
    hits = len(found.identical_calls) + len(found.call_ids) + len(
        set(found.rejected_fingerprints) - set(found.identical_calls))
    state.earlier = state.earlier.model_copy(update={
        "lookups": state.earlier.lookups + len(asked),
        "found": state.earlier.found + hits})


def stream_cut(sizes: list[int]) -> int:
    """How many of the stream's oldest items (of these payload sizes) to drop so the
    newest ones kept weigh at most STREAM_KEPT_BYTES."""
    kept = 0
    for i in range(len(sizes) - 1, -1, -1):
        kept += sizes[i]
        if kept > STREAM_KEPT_BYTES:
            return i + 1
    return 0


def newest(last_seen: dict[str, _T], keep: int, key: Callable[[_T], Any]) -> dict[str, _T]:
    """The `keep` entries of `last_seen` with the greatest `key`, in their order."""
    if len(last_seen) <= keep:
        return last_seen
    kept = set(sorted(last_seen, key=lambda k: key(last_seen[k]))[-keep:])
    return {k: v for k, v in last_seen.items() if k in kept}


def shown_events(events: list[core.Event], dropped: int, excess: int = 0) -> list[core.Event]:
    """The event log a RunResult shows: `events` without their oldest worth `excess`
    JSON bytes (core.events_within), after one `events_dropped:N` standing for every
    event left out (`dropped` before `events`, and those)."""
    kept = core.events_within(events, excess)
    if kept is not events and kept and kept[0].event.startswith(DROPPED):
        dropped += int(kept[0].event.removeprefix(DROPPED))
        kept = kept[1:]
    if not dropped:
        return list(kept)
    step = kept[0].step if kept else 0
    return [core.Event(step=step, event=f"{DROPPED}{dropped}"), *kept]
