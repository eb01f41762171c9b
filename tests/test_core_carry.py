"""The pure rules of a constant-size carried state (boundloop.core.carry)."""

from __future__ import annotations

import base64

from boundloop.core import carry
from boundloop.core.limits import RunSettings
from boundloop.core.loop import Event, LoopState, ModelAttempt


def state() -> LoopState:
    return LoopState(settings=RunSettings(model="m"), allowed_tools=["lookup_stock"])


def test_the_filter_holds_every_key_it_was_given() -> None:
    keys = [f"lookup_stock:{i:016x}" for i in range(5000)]
    bits = base64.b64decode(carry.add_keys(carry.empty_filter(), keys))
    assert all(carry.may_hold(bits, k) for k in keys)
    # And says "maybe" for few others (about 1 in 10,000 at 5,000 keys).
    others = [f"lookup_stock:{i:016x}" for i in range(5000, 15000)]
    assert sum(carry.may_hold(bits, k) for k in others) < 20


def test_hand_over_moves_the_tables_into_the_segment_and_keeps_the_newest_records() -> None:
    s = state()
    s.identical_calls = {"lookup_stock:a": 2}
    s.call_ids = ["c1", "c1", "c2"]
    s.rejected_fingerprints = ["create_ticket:b"]
    s.events = [Event(step=i, event="model_requested") for i in range(250)]
    s.model_attempts = [ModelAttempt(step=i, outcome="answered", input_tokens=10,
                                     output_tokens=2) for i in range(120)]
    segment = carry.hand_over(s, previous="run-0")
    assert segment.identical_calls == {"lookup_stock:a": 2}
    assert segment.call_ids == ["c1", "c2"]
    assert segment.rejected_fingerprints == ["create_ticket:b"]
    assert (s.identical_calls, s.call_ids, s.rejected_fingerprints) == ({}, [], [])
    assert s.earlier is not None and s.earlier.previous == "run-0"
    bits = base64.b64decode(s.earlier.seen)
    assert all(carry.may_hold(bits, k) for k in segment.all_keys())
    assert len(s.events) == carry.EVENTS_KEPT and s.events_dropped == 150
    assert s.events[0].step == 150
    # The attempts no longer carried are one record: the tokens still add up.
    assert len(s.model_attempts) == carry.ATTEMPTS_KEPT + 1
    assert s.model_attempts[0].outcome == f"{carry.EARLIER_ATTEMPTS}70"
    assert sum(a.input_tokens + a.output_tokens for a in s.model_attempts) == 120 * 12
    # Folding again counts the earlier record's attempts, not itself as one.
    s.model_attempts += [ModelAttempt(step=200 + i, outcome="answered", input_tokens=1,
                                      output_tokens=0) for i in range(30)]
    assert carry.fold_attempts(s.model_attempts)[0].outcome == f"{carry.EARLIER_ATTEMPTS}100"


def test_the_newest_segment_holding_a_fingerprint_gives_its_total() -> None:
    newer = carry.Segment(identical_calls={"t:a": 3}, call_ids=["c9"])
    older = carry.Segment(identical_calls={"t:a": 1, "t:b": 1},
                          rejected_fingerprints=["t:b"], call_ids=["c1"])
    wanted = {"t:a", "t:b", carry.CALL_ID + "c1", "t:never"}
    found = carry.EarlierCalls()
    for segment in (newer, older):
        carry.look_in(segment, wanted, found)
    assert found.identical_calls == {"t:a": 3, "t:b": 1}
    assert found.rejected_fingerprints == ["t:b"]
    assert found.call_ids == ["c1"]
    assert wanted == {"t:never"} and found.runs_read == 2


def test_shown_events_stand_one_event_for_those_left_out() -> None:
    events = [Event(step=i, event="tool_success") for i in range(10)]
    assert carry.shown_events(events, 0) == events
    shown = carry.shown_events(events, 40)
    assert shown[0] == Event(step=0, event="events_dropped:40") and shown[1:] == events
    # Left out for the payload as well: one marker counting both.
    small = carry.shown_events(events, 40, excess=len(events[0].model_dump_json()) * 3)
    assert small[0].event.startswith("events_dropped:")
    assert int(small[0].event.split(":")[1]) == 40 + 10 - (len(small) - 1)


def test_the_stream_keeps_its_newest_items_by_bytes() -> None:
    assert carry.stream_cut([100] * 10) == 0
    sizes = [1000] * 40
    cut = carry.stream_cut(sizes)
    assert sum(sizes[cut:]) <= carry.STREAM_KEPT_BYTES < sum(sizes[cut - 1:])
