"""The conversation (size, digest, Chat rendering) and approval decisions.

- `ConversationMeta` tracks the history byte size the loop checks before a request
  (UTF-8 JSON of the conversation) and a digest chain, so extending it step by step
  must agree with measuring the whole list.
- `to_chat_messages` renders Responses-API items for Chat Completions: each `tool`
  message right after the assistant message that made the call.
- `approvals.check` refuses unknown/decided call ids, approvers outside the allow-list
  and edited arguments that fail the schema, changing nothing; `apply` records a decision.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boundloop.core import approvals
from boundloop.core.canonical import canonical_json
from boundloop.core.conversation import (
    ConversationMeta,
    function_call_output,
    meta_of,
    to_chat_messages,
    user_message,
)
from boundloop.core.envelope import ToolStatus
from boundloop.core.fingerprint import fingerprint
from boundloop.core.limits import Limits, Policy, RunSettings
from boundloop.core.loop import Execute, LoopState, Reply, StepPlan, ToolRule, plan_calls
from boundloop.core.turn import Turn, Usage
from boundloop.tools.demo import tools as demo_tools
from tests.support import strategies

FAST = settings(max_examples=60, deadline=None)

json_values = strategies.json_values(
    st.none() | st.booleans() | st.integers(-(10**15), 10**15)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12),
    keys=6, width=3, leaves=8)
items_st = st.lists(st.dictionaries(st.text(max_size=8), json_values, max_size=4), max_size=6)

CreateTicketArgs = demo_tools.get("create_ticket").args_model
LookupStockArgs = demo_tools.get("lookup_stock").args_model
SearchDocsArgs = demo_tools.get("search_docs").args_model



def compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def digest_chain(items: list[dict[str, Any]]) -> str:
    digest = ""
    for item in items:
        digest = hashlib.sha256((digest + canonical_json(item)).encode("utf-8")).hexdigest()[:32]
    return digest


# --- ConversationMeta -------------------------------------------------------------------


def test_empty_conversation_measures_as_an_empty_json_array() -> None:
    assert ConversationMeta() == meta_of([])
    assert meta_of([]).bytes == len(b"[]")
    assert meta_of([]).count == 0


@FAST
@given(items=items_st)
def test_meta_bytes_equal_the_utf8_length_of_the_compact_json_list(
        items: list[dict[str, Any]]) -> None:
    meta = meta_of(items)
    assert meta.bytes == len(compact(items).encode("utf-8"))
    assert meta.count == len(items)
    assert meta.digest == digest_chain(items)


@FAST
@given(a=items_st, b=items_st)
def test_extend_is_equivalent_to_meta_of_the_concatenation(
        a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    assert meta_of(a).extend(b) == meta_of(a + b)


@FAST
@given(items=items_st)
def test_extending_item_by_item_equals_extending_at_once(items: list[dict[str, Any]]) -> None:
    meta = ConversationMeta()
    for item in items:
        meta = meta.extend([item])
    assert meta == meta_of(items)


@FAST
@given(items=items_st, seed=st.integers(0, 2**32 - 1))
def test_meta_does_not_depend_on_key_order_inside_items(
        items: list[dict[str, Any]], seed: int) -> None:
    rnd = random.Random(seed)

    def shuffled(item: dict[str, Any]) -> dict[str, Any]:
        keys = list(item)
        rnd.shuffle(keys)
        return {k: item[k] for k in keys}

    assert meta_of([shuffled(i) for i in items]) == meta_of(items)


@FAST
@given(a=st.dictionaries(st.text(max_size=5), json_values, min_size=1, max_size=3),
       b=st.dictionaries(st.text(max_size=5), json_values, min_size=1, max_size=3))
def test_digest_changes_when_the_order_of_items_changes(
        a: dict[str, Any], b: dict[str, Any]) -> None:
    if canonical_json(a) == canonical_json(b):
        assert meta_of([a, b]) == meta_of([b, a])
    else:
        assert meta_of([a, b]).digest != meta_of([b, a]).digest


def test_japanese_text_counts_three_bytes_a_character_in_history() -> None:
    item = user_message("在庫" * 10)
    ascii_item = user_message("ab" * 10)
    assert meta_of([item]).bytes - meta_of([ascii_item]).bytes == 20 * (3 - 1)


# --- Chat Completions rendering ---------------------------------------------------------


def reasoning(n: int) -> dict[str, Any]:
    return {"type": "reasoning", "id": f"rs_{n}",
            "summary": [{"type": "summary_text", "text": f"secret plan {n}"}]}


def assistant_text(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant",
            "content": [{"type": "output_text", "text": text}]}


def function_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}


def is_assistant_item(item: dict[str, Any]) -> bool:
    return item["type"] == "function_call" or (
        item["type"] == "message" and item.get("role") == "assistant")


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A realistic run: a user message, steps of (reasoning?, text?, calls), each call's
    output right after the step, and a final answer."""
    items: list[dict[str, Any]] = [user_message(draw(st.text(max_size=20)))]
    counter = 0
    for step in range(draw(st.integers(0, 4))):
        assistant: list[dict[str, Any]] = []
        if draw(st.booleans()):
            assistant.append(reasoning(step))
        if draw(st.booleans()):
            assistant.append(assistant_text(draw(st.text(max_size=20))))
        calls = []
        for _ in range(draw(st.integers(1, 3))):
            counter += 1
            args = draw(st.sampled_from(['{"sku":"A-001"}', '{ "sku" : "\\u0041-002" }',
                                         '{"query":"在庫","limit":2}', "", "not json"]))
            calls.append(function_call(f"call_{counter}", "lookup_stock", args))
            if draw(st.booleans()):
                calls.append(reasoning(100 + counter))  # reasoning between calls
        assistant += calls
        items += assistant
        items += [function_call_output(c["call_id"], json.dumps({"status": "success", "n": i}))
                  for i, c in enumerate(calls) if c["type"] == "function_call"]
        if draw(st.booleans()):
            items.append(user_message("follow-up"))
    if draw(st.booleans()):
        items.append(reasoning(999))
        items.append(assistant_text(draw(st.text(min_size=1, max_size=20))))
    return items


def runs_of_assistant_items(items: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    runs: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    for item in items:
        if item["type"] == "reasoning":
            continue
        if is_assistant_item(item):
            current.append(item)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return runs


@settings(max_examples=150, deadline=None)
@given(items=conversations(), instructions=st.one_of(st.none(), st.just(""),
                                                      st.text(min_size=1, max_size=20)))
def test_chat_rendering_keeps_tool_messages_right_after_their_assistant_message(
        items: list[dict[str, Any]], instructions: str | None) -> None:
    messages = to_chat_messages(items, instructions)
    if instructions:
        assert messages[0] == {"role": "system", "content": instructions}
        messages = messages[1:]
    assert all(m["role"] != "system" for m in messages)

    # One assistant message per consecutive run of assistant items (reasoning ignored).
    runs = runs_of_assistant_items(items)
    assistants = [m for m in messages if m["role"] == "assistant"]
    assert len(assistants) == len(runs)
    for message, run in zip(assistants, runs, strict=True):
        calls = [i for i in run if i["type"] == "function_call"]
        texts = "".join(p["text"] for i in run if i["type"] == "message" for p in i["content"])
        rendered = message.get("tool_calls", [])
        assert [c["id"] for c in rendered] == [c["call_id"] for c in calls]
        for tc, item in zip(rendered, calls, strict=True):
            assert tc["type"] == "function"
            assert tc["function"]["name"] == item["name"]
            assert isinstance(tc["function"]["arguments"], str)
            assert tc["function"]["arguments"] == item["arguments"]  # verbatim string
        if texts:
            assert message["content"] == texts
        else:
            assert message["content"] in (None, "")
            assert rendered  # an assistant message without text carries calls

    # Each tool message answers a call of the nearest assistant message before it.
    outputs = {i["call_id"]: i["output"] for i in items if i["type"] == "function_call_output"}
    last_assistant: dict[str, Any] | None = None
    for n, message in enumerate(messages):
        if message["role"] == "assistant":
            last_assistant = message
        elif message["role"] == "tool":
            previous = messages[n - 1]
            assert previous["role"] in ("assistant", "tool")
            assert last_assistant is not None
            assert message["tool_call_id"] in [c["id"] for c in last_assistant["tool_calls"]]
            assert message["content"] == outputs[message["tool_call_id"]]
    tool_ids = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
    assert tool_ids == [i["call_id"] for i in items if i["type"] == "function_call_output"]

    # Reasoning has no Chat form and never leaks into a message.
    assert "secret plan" not in json.dumps(messages, ensure_ascii=False)
    users = [m for m in messages if m["role"] == "user"]
    assert len(users) == sum(1 for i in items if i.get("role") == "user")


def test_chat_rendering_of_a_two_step_run() -> None:
    items = [
        user_message("A-001の在庫は？"),
        reasoning(1),
        assistant_text("Checking."),
        function_call("call_1", "lookup_stock", '{"sku": "A-001"}'),
        function_call("call_2", "lookup_stock", '{"sku":"B-002"}'),
        function_call_output("call_1", '{"status":"success"}'),
        function_call_output("call_2", '{"status":"not_found"}'),
        reasoning(2),
        assistant_text("A-001: 12"),
    ]
    assert to_chat_messages(items, "Be brief.") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "A-001の在庫は？"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "lookup_stock", "arguments": '{"sku": "A-001"}'}},
            {"id": "call_2", "type": "function",
             "function": {"name": "lookup_stock", "arguments": '{"sku":"B-002"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"status":"success"}'},
        {"role": "tool", "tool_call_id": "call_2", "content": '{"status":"not_found"}'},
        {"role": "assistant", "content": "A-001: 12"},
    ]


def test_chat_rendering_without_instructions_has_no_system_message() -> None:
    messages = to_chat_messages([user_message("hi")], None)
    assert messages == [{"role": "user", "content": "hi"}]


# --- approvals --------------------------------------------------------------------------


RULES = {
    "lookup_stock": ToolRule("lookup_stock", LookupStockArgs),
    "search_docs": ToolRule("search_docs", SearchDocsArgs),
    "create_ticket": ToolRule("create_ticket", CreateTicketArgs, side_effects=True,
                              needs_approval=True),
}
T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
TICKET = {"title": "Restock A-001", "description": "Only 2 left", "priority": "high"}


@dataclass
class Decision:
    call_id: str
    approve: bool
    approver: str = "alice"
    reason: str | None = None
    arguments: dict[str, Any] | None = None
    remember: bool = False  # a grant for the rest of the run (remembered approvals)
    when: str | None = None
    scope: str = "run"  # or "session" (a session's turn)
    run: str | None = None  # the run it was made for (first execution run id)
    fingerprint: str | None = None  # of the arguments its approver was shown


def turn_with(*calls: tuple[str, str, dict[str, Any]]) -> Turn:
    return Turn(items=[function_call(cid, name, json.dumps(args)) for cid, name, args in calls],
                usage=Usage(input_tokens=1, output_tokens=1, total_tokens=2))


def pending_state(approvers: dict[str, list[str]] | None = None
                  ) -> tuple[LoopState, Execute]:
    state = LoopState(settings=RunSettings(model="m", limits=Limits(),
                                           policy=Policy(approvers=approvers or {})),
                      allowed_tools=list(RULES))
    step = StepPlan(step=1, tool_choice="auto", last=False)
    state.steps = 1
    decided = plan_calls(state, turn_with(("call_t", "create_ticket", TICKET)), step, RULES,
                         "wf-approve")
    assert isinstance(decided, list) and isinstance(decided[0], Execute)
    plan = decided[0]
    assert plan.needs_approval
    approvals.request(state, plan, 1, T0)
    return state, plan


def test_an_approval_request_is_recorded_as_pending() -> None:
    state, plan = pending_state()
    approval = approvals.find(state, "call_t")
    assert approval is not None and approval.status == "pending"
    assert approval.tool == "create_ticket"
    assert approval.arguments == TICKET
    assert approval.fingerprint == plan.fingerprint == fingerprint("create_ticket", TICKET)
    assert approval.requested_at == T0.isoformat()
    assert approvals.pending_count(state) == 1


def assert_refused_without_change(state: LoopState, decision: Decision) -> str:
    before = state.model_dump()
    why = approvals.check(state, decision, RULES)
    assert isinstance(why, str) and why
    assert state.model_dump() == before
    return why


@pytest.mark.parametrize("call_id", ["call_x", "", "call_t ", "CALL_T"])
def test_check_refuses_unknown_call_ids(call_id: str) -> None:
    state, _ = pending_state()
    assert_refused_without_change(state, Decision(call_id=call_id, approve=True))


@pytest.mark.parametrize(("first", "second"), [(True, True), (True, False), (False, True),
                                               (False, False)])
def test_check_refuses_already_decided_call_ids(first: bool, second: bool) -> None:
    state, _ = pending_state()
    decision = Decision(call_id="call_t", approve=first, reason=None if first else "no")
    assert approvals.check(state, decision, RULES) is None
    approvals.apply(state, decision, T0 + timedelta(minutes=1), RULES)
    why = assert_refused_without_change(state, Decision(call_id="call_t", approve=second,
                                                        approver="bob"))
    assert ("approved" if first else "rejected") in why
    approval = approvals.find(state, "call_t")
    assert approval is not None and approval.approver == "alice"


@FAST
@given(allowed=st.lists(st.text(min_size=1, max_size=8), max_size=3),
       approver=st.text(min_size=1, max_size=8))
def test_check_refuses_approvers_outside_the_allow_list(allowed: list[str],
                                                        approver: str) -> None:
    state, _ = pending_state({"create_ticket": allowed} if allowed else None)
    decision = Decision(call_id="call_t", approve=True, approver=approver)
    if allowed and approver not in allowed:
        why = assert_refused_without_change(state, decision)
        assert "create_ticket" in why
    else:
        assert approvals.check(state, decision, RULES) is None


def test_an_allow_list_for_another_tool_does_not_restrict_this_one() -> None:
    state, _ = pending_state({"search_docs": ["carol"]})
    assert approvals.check(state, Decision(call_id="call_t", approve=True,
                                           approver="mallory"), RULES) is None


@pytest.mark.parametrize("edited", [
    {**TICKET, "priority": "urgent"},
    {"title": "t", "description": "d"},
    {**TICKET, "assignee": "bob"},
    {**TICKET, "title": 5},
    {**TICKET, "title": ""},
])
def test_check_refuses_edited_arguments_that_fail_the_schema(edited: dict[str, Any]) -> None:
    state, _ = pending_state()
    why = assert_refused_without_change(state, Decision(call_id="call_t", approve=True,
                                                        arguments=edited))
    assert "create_ticket" in why


def test_check_refuses_edited_arguments_on_a_rejection() -> None:
    state, _ = pending_state()
    assert_refused_without_change(state, Decision(call_id="call_t", approve=False,
                                                  arguments=dict(TICKET)))


def test_a_valid_approval_is_accepted_and_apply_records_it() -> None:
    state, plan = pending_state({"create_ticket": ["alice"]})
    decision = Decision(call_id="call_t", approve=True, approver="alice")
    before = state.model_dump()
    assert approvals.check(state, decision, RULES) is None
    assert state.model_dump() == before  # check never changes state
    approvals.apply(state, decision, T0 + timedelta(seconds=30), RULES)
    approval = approvals.find(state, "call_t")
    assert approval is not None
    assert approval.status == "approved" and approval.approver == "alice"
    assert approval.decided_at == (T0 + timedelta(seconds=30)).isoformat()
    assert approvals.pending_count(state) == 0
    assert approvals.approved_plan(plan, approval) == plan
    assert state.events[-1].event == "approval_approved"


def test_an_approval_with_edited_arguments_executes_the_edited_call() -> None:
    state, plan = pending_state()
    edited = {**TICKET, "priority": "low"}
    decision = Decision(call_id="call_t", approve=True, arguments=edited)
    assert approvals.check(state, decision, RULES) is None
    approvals.apply(state, decision, T0, RULES)
    approval = approvals.find(state, "call_t")
    assert approval is not None and approval.arguments == edited
    final = approvals.approved_plan(plan, approval)
    assert final.arguments == edited
    assert final.fingerprint == fingerprint("create_ticket", edited) != plan.fingerprint
    assert final.idempotency_key == plan.idempotency_key


def test_a_rejection_is_recorded_and_an_identical_call_is_refused_without_asking() -> None:
    state, _ = pending_state()
    decision = Decision(call_id="call_t", approve=False, reason="not now")
    assert approvals.check(state, decision, RULES) is None
    approvals.apply(state, decision, T0, RULES)
    approval = approvals.find(state, "call_t")
    assert approval is not None and approval.status == "rejected"
    assert approval.reason == "not now"
    envelope = approvals.rejection(state, approval)
    assert envelope.status == ToolStatus.REJECTED and not envelope.retryable
    assert "not now" in envelope.message

    state.steps = 2
    step = StepPlan(step=2, tool_choice="auto", last=False)
    reordered = {"priority": "high", "description": "Only 2 left", "title": "Restock A-001"}
    decided = plan_calls(state, turn_with(("call_t2", "create_ticket", reordered)), step,
                         RULES, "wf-approve")
    assert isinstance(decided, list) and isinstance(decided[0], Reply)
    assert decided[0].envelope.status == ToolStatus.REJECTED
    assert approvals.find(state, "call_t2") is None
    assert approvals.pending_count(state) == 0


def test_time_left_counts_from_the_request_and_never_goes_negative() -> None:
    state, _ = pending_state()
    approval = approvals.find(state, "call_t")
    assert approval is not None
    limit = timedelta(hours=24)
    assert approvals.time_left(approval, T0, limit) == limit
    assert approvals.time_left(approval, T0 + timedelta(hours=1), limit) == timedelta(hours=23)
    assert approvals.time_left(approval, T0 + timedelta(days=3), limit) == timedelta(0)
