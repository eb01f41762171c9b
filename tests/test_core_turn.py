"""Normalising untrusted model responses (`parse_responses`, `parse_chat`) and what the
loop decides from them (`plan_calls`).

Validate status, item types and call ids; decide by the presence of tool
calls, never by `finish_reason`; text that looks like a tool call is an answer. The
response body is untrusted: parsing never raises, a body that makes no sense is a
`protocol_error`, and every call the model made gets exactly one decision.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boundloop.core import envelope as env
from boundloop.core.envelope import ToolStatus
from boundloop.core.fingerprint import invalid_fingerprint
from boundloop.core.limits import Limits, Policy, RunSettings
from boundloop.core.loop import (
    Execute,
    LoopState,
    Reply,
    StepPlan,
    ToolRule,
    account_usage,
    outputs_items,
    plan_calls,
    reply_output,
)
from boundloop.core.reasons import StopReason
from boundloop.core.turn import MISSING_NAME, Turn, Usage, parse_chat, parse_responses
from boundloop.tools.demo import tools as demo_tools
from tests.support import strategies

RULES = strategies.demo_rules()
FUZZ = settings(max_examples=200, deadline=None)

# --- strategies -------------------------------------------------------------------------

# Strings with an unpaired surrogate: what `json.loads('"\\ud800"')` gives back.
lone_surrogate_text = st.text(
    alphabet=st.characters(categories=["Cs"]) | st.sampled_from("aあ😀{}\""), min_size=1,
    max_size=6).filter(lambda s: any(0xD800 <= ord(c) <= 0xDFFF for c in s))

# What `json.loads` can give back (NaN, Infinity and lone surrogates included).
json_scalars = (st.none() | st.booleans() | st.integers() | st.floats()
                | st.text(max_size=12) | lone_surrogate_text)
json_keys = st.text(max_size=8) | st.sampled_from(["arguments", "type", "call_id", "name"])
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        json_keys | lone_surrogate_text, inner, max_size=4),
    max_leaves=10,
)
odd_values = st.sampled_from([None, 0, -1, 1.5, True, "", "x", [], [1], {}, {"a": 1},
                              [{"type": "function_call"}]]).map(copy.deepcopy) | json_values

tool_names = st.sampled_from(["lookup_stock", "search_docs", "create_ticket", "rm_rf",
                              "", "lookup_stock "])
valid_args = st.sampled_from([
    {"sku": "A-001"}, {"sku": "B-002"}, {"sku": "bad"}, {"query": "在庫", "limit": 2},
    {"query": "x", "limit": 9}, {"title": "t", "description": "d", "priority": "high"}, {},
]).map(copy.deepcopy)
argument_texts = st.one_of(
    valid_args.map(json.dumps),
    valid_args.map(lambda a: json.dumps(a, ensure_ascii=True, indent=2)),
    st.sampled_from(['{"sku": "A-0', "", "   ", "null", "[]", "42", '"A-001"', "{}", "{{"]),
    st.text(max_size=20),
)
arguments_any = argument_texts | valid_args | json_values  # objects/arrays/numbers too
call_ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_0123456789", min_size=1, max_size=10)
usage_responses = st.fixed_dictionaries({
    "input_tokens": st.integers(0, 5000), "output_tokens": st.integers(0, 5000)},
    optional={"total_tokens": st.integers(0, 10000)})
usage_chat = st.fixed_dictionaries({
    "prompt_tokens": st.integers(0, 5000), "completion_tokens": st.integers(0, 5000)},
    optional={"total_tokens": st.integers(0, 10000)})

LookupStockArgs = demo_tools.get("lookup_stock").args_model



@st.composite
def responses_items(draw: st.DrawFn) -> list[dict[str, Any]]:
    kinds = draw(st.lists(st.sampled_from(["message", "reasoning", "function_call"]),
                          max_size=6))
    ids = draw(st.lists(call_ids, min_size=len(kinds), max_size=len(kinds), unique=True))
    items: list[dict[str, Any]] = []
    for n, kind in enumerate(kinds):
        if kind == "message":
            items.append({"type": "message", "id": f"msg_{n}", "role": "assistant",
                          "status": "completed",
                          "content": [{"type": "output_text", "text": draw(st.text(max_size=30)),
                                       "annotations": []}]})
        elif kind == "reasoning":
            summary = [{"type": "summary_text", "text": draw(st.text(max_size=10))}]
            items.append({"type": "reasoning", "id": f"rs_{n}", "summary": summary})
        else:
            items.append({"type": "function_call", "id": f"fc_{n}", "call_id": ids[n],
                          "name": draw(tool_names), "arguments": draw(argument_texts),
                          "status": "completed"})
    return items


@st.composite
def responses_bodies(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {"id": "resp_1", "object": "response",
                            "status": draw(st.sampled_from(["completed", "incomplete"])),
                            "output": draw(responses_items())}
    if draw(st.booleans()):
        body["usage"] = draw(usage_responses)
    return body


@st.composite
def chat_bodies(draw: st.DrawFn) -> dict[str, Any]:
    n_calls = draw(st.integers(0, 4))
    tool_calls: list[dict[str, Any]] = [
        {"id": draw(st.one_of(call_ids, st.just(""), st.none())), "type": "function",
         "function": {"name": draw(tool_names), "arguments": draw(arguments_any)}}
        for _ in range(n_calls)]
    message: dict[str, Any] = {"role": "assistant",
                               "content": draw(st.one_of(st.none(), st.text(max_size=30)))}
    keep_empty_list = draw(st.booleans())
    if tool_calls or keep_empty_list:
        message["tool_calls"] = tool_calls
    body: dict[str, Any] = {
        "id": "chatcmpl-1", "object": "chat.completion",
        "choices": [{"index": 0, "message": message,
                     "finish_reason": draw(st.sampled_from(
                         ["stop", "tool_calls", "length", "content_filter", None]))}]}
    if draw(st.booleans()):
        body["usage"] = draw(usage_chat)
    return body


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path]
    if isinstance(value, dict):
        for key, child in value.items():
            found += _paths(child, (*path, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += _paths(child, (*path, index))
    return found


def _get(value: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        value = value[part]
    return value


@st.composite
def mutated(draw: st.DrawFn, bodies: st.SearchStrategy[dict[str, Any]]) -> Any:
    """A valid body with 1-3 mutations: keys dropped, values of the wrong type, unknown
    item types inserted, arguments as objects/arrays/numbers, ids removed."""
    body: Any = copy.deepcopy(draw(bodies))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(body)))
        op = draw(st.sampled_from(["drop", "replace", "insert", "arguments", "id"]))
        if not path:
            if op == "replace":
                body = draw(odd_values)
            continue
        parent, key = _get(body, path[:-1]), path[-1]
        target = parent[key]
        if op == "drop":
            del parent[key]
        elif op == "replace":
            parent[key] = draw(odd_values)
        elif op == "insert" and isinstance(target, list):
            unknown = draw(st.sampled_from([
                {"type": "web_search_call", "id": "ws_1"}, {"type": None}, {},
                {"type": "function_call_output", "call_id": "x", "output": "{}"},
                {"type": draw(st.text(max_size=8))}, None, 7, "function_call"]))
            target.insert(draw(st.integers(0, len(target))), copy.deepcopy(unknown))
        elif op == "arguments" and isinstance(target, dict):
            target["arguments"] = draw(st.one_of(valid_args, json_values,
                                                 st.lists(st.integers(), max_size=3)))
        elif op == "id" and isinstance(target, dict):
            for id_key in ("call_id", "id"):
                if id_key in target:
                    target[id_key] = copy.deepcopy(
                        draw(st.sampled_from([None, "", " ", 3, ["c"], "dup"])))
    return body


# --- helpers --------------------------------------------------------------------------


def new_state(policy: Policy | None = None) -> LoopState:
    return LoopState(settings=RunSettings(model="m", limits=Limits(max_tool_executions=50),
                                          policy=policy or Policy()),
                     allowed_tools=list(RULES))


STEP = StepPlan(step=1, tool_choice="auto", last=False)


def assert_well_formed(turn: Any) -> None:
    assert isinstance(turn, Turn)
    assert turn.fault is None or isinstance(turn.fault, str)
    # History and text must survive UTF-8 JSON (byte counts, digests, payloads, the next
    # request): no lone surrogates, no NaN/Infinity.
    history = json.dumps(turn.items, ensure_ascii=False, allow_nan=False,
                         separators=(",", ":")).encode("utf-8")
    turn.text.encode("utf-8")
    if turn.fault is None:
        assert turn.output_bytes == len(history)
    calls = turn.calls
    for call in calls:
        assert isinstance(call.call_id, str) and call.call_id
        assert isinstance(call.name, str)
        assert isinstance(call.arguments, str)
    if turn.fault is not None:
        assert calls == []  # a faulted response never proposes anything to execute
        return
    assert turn.status in ("completed", "incomplete")
    assert len({c.call_id for c in calls}) == len(calls)
    assert isinstance(turn.text, str)
    if turn.usage is not None:
        u = turn.usage
        assert min(u.input_tokens, u.output_tokens, u.total_tokens) >= 0


def assert_typed_decision(turn: Turn, policy: Policy | None = None) -> None:
    state = new_state(policy)
    decided = plan_calls(state, turn, STEP, RULES, "wf-fuzz")
    if isinstance(decided, StopReason):
        assert state.reason == decided
        if turn.fault is not None:
            assert decided == StopReason.PROTOCOL_ERROR
        return
    assert isinstance(decided, list)
    assert state.reason is None
    # Every call gets exactly one decision, in call order.
    assert [p.call.call_id for p in decided] == [c.call_id for c in turn.calls]
    pairs = []
    for plan in decided:
        assert isinstance(plan, Execute | Reply)
        if isinstance(plan, Execute):
            assert plan.call.name in RULES
            RULES[plan.call.name].args_model.model_validate(plan.arguments, strict=True)
            pairs.append((plan.call, env.success({"ok": True})))
        else:
            assert plan.envelope.status != ToolStatus.SUCCESS
            out = reply_output(state, plan)
            assert isinstance(out, env.Envelope)
            pairs.append((plan.call, out))
    items = outputs_items(pairs)
    assert [i["call_id"] for i in items] == [c.call_id for c in turn.calls]
    assert all(isinstance(i["output"], str) for i in items)


# --- fuzzing ----------------------------------------------------------------------------


@FUZZ
@given(body=json_values)
def test_parse_responses_never_raises_on_any_json_value(body: Any) -> None:
    turn = parse_responses(body)
    assert_well_formed(turn)
    assert_typed_decision(turn)


@FUZZ
@given(body=json_values, step=st.integers(1, 50))
def test_parse_chat_never_raises_on_any_json_value(body: Any, step: int) -> None:
    turn = parse_chat(body, step)
    assert_well_formed(turn)
    assert_typed_decision(turn)


@FUZZ
@given(body=responses_bodies())
def test_valid_responses_bodies_parse_without_fault(body: dict[str, Any]) -> None:
    turn = parse_responses(body)
    assert_well_formed(turn)
    assert turn.fault is None
    assert [c.call_id for c in turn.calls] == [
        i["call_id"] for i in body["output"] if i["type"] == "function_call"]
    assert [i["type"] for i in turn.items] == [i["type"] for i in body["output"]]
    assert_typed_decision(turn)


@FUZZ
@given(body=chat_bodies(), step=st.integers(1, 50))
def test_valid_chat_bodies_parse_without_fault(body: dict[str, Any], step: int) -> None:
    turn = parse_chat(body, step)
    assert_well_formed(turn)
    raw_calls = body["choices"][0]["message"].get("tool_calls") or []
    ids = [c["id"] for c in raw_calls if isinstance(c["id"], str) and c["id"].strip()]
    if len(set(ids)) == len(ids):
        assert turn.fault is None
        assert len(turn.calls) == len(raw_calls)
    assert_typed_decision(turn)


@FUZZ
@given(body=mutated(responses_bodies()), policy=st.sampled_from(
    [Policy(), Policy(unknown_tool="report")]))
def test_parse_responses_never_raises_on_mutated_responses(body: Any, policy: Policy) -> None:
    turn = parse_responses(body)
    assert_well_formed(turn)
    assert_typed_decision(turn, policy)


@FUZZ
@given(body=mutated(chat_bodies()), step=st.integers(1, 50), policy=st.sampled_from(
    [Policy(), Policy(unknown_tool="report")]))
def test_parse_chat_never_raises_on_mutated_responses(body: Any, step: int,
                                                      policy: Policy) -> None:
    turn = parse_chat(body, step)
    assert_well_formed(turn)
    assert_typed_decision(turn, policy)



@settings(max_examples=50, deadline=None)
@given(text=lone_surrogate_text, where=st.sampled_from(
    ["message", "reasoning", "arguments", "name", "type"]))
def test_parse_responses_never_raises_on_lone_surrogate_escapes(text: str, where: str) -> None:
    # `json.loads('"\\ud800"')` yields a lone surrogate: any JSON body can carry one.
    items = {
        "message": {"type": "message", "role": "assistant",
                    "content": [{"type": "output_text", "text": text}]},
        "reasoning": {"type": "reasoning", "summary": [{"type": "summary_text", "text": text}]},
        "arguments": {"type": "function_call", "call_id": "c1", "name": "search_docs",
                      "arguments": text},
        "name": {"type": "function_call", "call_id": "c1", "name": text, "arguments": "{}"},
        "type": {"type": text},
    }
    turn = parse_responses({"status": "completed", "output": [items[where]],
                            "usage": {"input_tokens": 5, "output_tokens": 5}})
    assert_well_formed(turn)
    assert_typed_decision(turn)


@settings(max_examples=50, deadline=None)
@given(text=lone_surrogate_text, where=st.sampled_from(["content", "arguments", "name"]))
def test_parse_chat_never_raises_on_lone_surrogate_escapes(text: str, where: str) -> None:
    fn = {"name": text if where == "name" else "search_docs",
          "arguments": text if where == "arguments" else '{"query":"q","limit":1}'}
    body = {"choices": [{"finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": text if where == "content" else None,
        "tool_calls": [{"id": "c1", "type": "function", "function": fn}]}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 3}}
    turn = parse_chat(body, 1)
    assert_well_formed(turn)
    assert_typed_decision(turn)


def test_lone_surrogate_minimal_body_parses_without_raising() -> None:
    body = json.loads('{"status":"completed","output":[{"type":"message","role":"assistant",'
                      '"content":[{"type":"output_text","text":"\\ud800"}]}]}')
    assert_well_formed(parse_responses(body))


@pytest.mark.parametrize("arguments", [
    '{"sku": ' + "1" * 4301 + "}",
    "1" * 5000,
    '{"query": "q", "limit": ' + "9" * 4400 + "}",
])
def test_plan_calls_answers_huge_integer_arguments_as_invalid_input(arguments: str) -> None:
    # Python refuses int literals over 4300 digits with ValueError, not JSONDecodeError.
    turn = parse_responses({"status": "completed", "output": [
        {"type": "function_call", "call_id": "c1", "name": "lookup_stock",
         "arguments": arguments}], "usage": {"input_tokens": 1, "output_tokens": 1}})
    assert turn.fault is None
    decided = plan_calls(new_state(), turn, STEP, RULES, "wf")
    assert isinstance(decided, list) and len(decided) == 1
    assert isinstance(decided[0], Reply)
    assert decided[0].envelope.status == ToolStatus.INVALID_INPUT


# --- examples: Chat Completions quirks --------------------------------------------------


def chat(tool_calls: list[dict[str, Any]] | None, *, content: str | None = None,
         finish_reason: str | None = "tool_calls",
         usage: Any = ...) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    body: dict[str, Any] = {"choices": [{"index": 0, "message": message,
                                         "finish_reason": finish_reason}]}
    body["usage"] = ({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
                     if usage is ... else usage)
    if usage is None:
        del body["usage"]
    return body


def tool_call(arguments: Any, *, call_id: Any = "call_1", name: str = "lookup_stock",
              ) -> dict[str, Any]:
    call: dict[str, Any] = {"type": "function", "function": {"name": name,
                                                             "arguments": arguments}}
    if call_id is not ...:
        call["id"] = call_id
    return call


def only_execute(turn: Turn) -> Execute:
    decided = plan_calls(new_state(), turn, STEP, RULES, "wf")
    assert isinstance(decided, list) and len(decided) == 1
    assert isinstance(decided[0], Execute)
    return decided[0]


def test_chat_arguments_given_as_an_object_fingerprint_like_the_string_form() -> None:
    as_object = parse_chat(chat([tool_call({"sku": "A-001"})]), 1)
    as_string = parse_chat(chat([tool_call('{ "sku" : "A-001" }')]), 1)
    as_escaped = parse_chat(chat([tool_call('{"sku":"\\u0041-001"}')]), 1)
    assert isinstance(as_object.calls[0].arguments, str)
    assert json.loads(as_object.calls[0].arguments) == {"sku": "A-001"}
    fps = {only_execute(t).fingerprint for t in (as_object, as_string, as_escaped)}
    assert len(fps) == 1


@pytest.mark.parametrize("call_id", [..., None, "", "   ", 17])
def test_missing_or_empty_chat_call_id_becomes_a_deterministic_id(call_id: Any) -> None:
    body = chat([tool_call('{"sku":"A-001"}', call_id=call_id),
                 tool_call('{"sku":"B-002"}', call_id=call_id)])
    first = [c.call_id for c in parse_chat(body, 3).calls]
    again = [c.call_id for c in parse_chat(copy.deepcopy(body), 3).calls]
    assert first == again
    assert all(isinstance(i, str) and i.strip() for i in first)
    assert len(set(first)) == 2


def test_generated_chat_call_ids_do_not_collide_across_steps() -> None:
    state = new_state()
    ids = []
    for step_no, sku in ((1, "A-001"), (2, "B-002")):
        turn = parse_chat(chat([tool_call(json.dumps({"sku": sku}), call_id=None)]), step_no)
        step = StepPlan(step=step_no, tool_choice="auto", last=False)
        decided = plan_calls(state, turn, step, RULES, "wf")
        assert isinstance(decided, list) and isinstance(decided[0], Execute)
        ids.append(turn.calls[0].call_id)
    assert ids[0] != ids[1]
    assert state.reason is None


def test_finish_reason_stop_with_tool_calls_still_yields_calls() -> None:
    turn = parse_chat(chat([tool_call('{"sku":"A-001"}')], finish_reason="stop"), 1)
    assert turn.fault is None and turn.status == "completed"
    assert [c.name for c in turn.calls] == ["lookup_stock"]
    assert not turn.calls[0].truncated
    assert only_execute(turn).arguments == {"sku": "A-001"}


def test_finish_reason_tool_calls_without_tool_calls_is_an_answer() -> None:
    turn = parse_chat(chat(None, content="A-001 has 12.", finish_reason="tool_calls"), 1)
    assert turn.calls == []
    state = new_state()
    assert plan_calls(state, turn, STEP, RULES, "wf") == StopReason.COMPLETED
    assert state.text == "A-001 has 12."


def test_finish_reason_length_with_tool_calls_is_answered_truncated_without_executing() -> None:
    turn = parse_chat(chat([tool_call('{"sku":"A-0', call_id="c1"),
                            tool_call('{"sku":"A-001"}', call_id="c2")],
                           finish_reason="length"), 1)
    assert turn.fault is None and turn.calls_truncated
    assert all(c.truncated for c in turn.calls)
    state = new_state()
    decided = plan_calls(state, turn, STEP, RULES, "wf")
    assert isinstance(decided, list) and len(decided) == 2
    for plan in decided:
        assert isinstance(plan, Reply)
        assert plan.envelope.error_code == "ARGUMENTS_TRUNCATED"
        assert plan.envelope.status == ToolStatus.INVALID_INPUT
    # Counted toward the identical-call limit (by fingerprint), never as executions.
    assert state.identical_calls == {
        invalid_fingerprint(c.name, c.arguments): 1 for c in turn.calls}
    assert state.per_tool_calls == {} and state.tool_executions == 0
    assert state.tool_executions == 0


def test_finish_reason_length_without_tool_calls_is_incomplete() -> None:
    turn = parse_chat(chat(None, content="The stock of A-0", finish_reason="length"), 1)
    assert turn.status == "incomplete"
    state = new_state()
    assert plan_calls(state, turn, STEP, RULES, "wf") == StopReason.INCOMPLETE
    assert state.text == "The stock of A-0"


def test_text_that_looks_like_a_tool_call_is_an_answer_never_executed() -> None:
    fake = '{"name": "create_ticket", "arguments": {"title": "x"}}'
    for turn in (parse_chat(chat(None, content=fake, finish_reason="tool_calls"), 1),
                 parse_responses({"status": "completed", "output": [
                     {"type": "message", "role": "assistant",
                      "content": [{"type": "output_text", "text": fake}]}],
                     "usage": {"input_tokens": 1, "output_tokens": 1}})):
        assert turn.calls == []
        state = new_state()
        assert plan_calls(state, turn, STEP, RULES, "wf") == StopReason.COMPLETED
        assert state.text == fake


def test_duplicate_chat_tool_call_id_gives_a_fault() -> None:
    turn = parse_chat(chat([tool_call('{"sku":"A-001"}', call_id="same"),
                            tool_call('{"sku":"B-002"}', call_id="same")]), 1)
    assert isinstance(turn.fault, str)
    assert plan_calls(new_state(), turn, STEP, RULES, "wf") == StopReason.PROTOCOL_ERROR


# --- examples: usage ------------------------------------------------------------------


@pytest.mark.parametrize("usage", [
    None,
    "lots",
    [],
    {"prompt_tokens": -1, "completion_tokens": 5},
    {"prompt_tokens": 5, "completion_tokens": -1},
    {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": -10},
    {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    {"prompt_tokens": 0, "completion_tokens": 0},
    {"prompt_tokens": 5},
    {"prompt_tokens": 5.5, "completion_tokens": 5},
    {"prompt_tokens": "5", "completion_tokens": 5},
    {"prompt_tokens": True, "completion_tokens": 5},
])
def test_chat_usage_missing_negative_or_all_zero_with_output_is_none(usage: Any) -> None:
    body = chat(None, content="an answer", finish_reason="stop", usage=usage)
    if usage is None:
        assert "usage" not in body
    assert parse_chat(body, 1).usage is None


@pytest.mark.parametrize("usage", [
    None,
    {"input_tokens": -3, "output_tokens": 4},
    {"input_tokens": 3, "output_tokens": 4, "total_tokens": -1},
    {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0},
    {"output_tokens": 4},
    {"input_tokens": 3, "output_tokens": None},
    {"input_tokens": 3.0, "output_tokens": 4},
])
def test_responses_usage_missing_negative_or_all_zero_with_output_is_none(usage: Any) -> None:
    body: dict[str, Any] = {"status": "completed", "output": [
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "hi"}]}]}
    if usage is not None:
        body["usage"] = usage
    assert parse_responses(body).usage is None


def test_all_zero_usage_with_empty_output_is_usable() -> None:
    turn = parse_responses({"status": "completed", "output": [],
                            "usage": {"input_tokens": 0, "output_tokens": 0,
                                      "total_tokens": 0}})
    assert turn.usage == Usage(input_tokens=0, output_tokens=0, total_tokens=0)


def test_usage_total_defaults_to_input_plus_output() -> None:
    responses = parse_responses({"status": "completed", "output": [],
                                 "usage": {"input_tokens": 7, "output_tokens": 3}})
    chat_turn = parse_chat(chat(None, content="x", finish_reason="stop",
                                usage={"prompt_tokens": 7, "completion_tokens": 3}), 1)
    assert responses.usage == chat_turn.usage == Usage(input_tokens=7, output_tokens=3,
                                                       total_tokens=10)


# --- examples: Responses API faults -----------------------------------------------------


def responses(*items: Any, status: str = "completed") -> dict[str, Any]:
    return {"status": status, "output": list(items),
            "usage": {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}}


def fc(call_id: Any = "call_1", name: Any = "lookup_stock",
       arguments: Any = '{"sku":"A-001"}') -> dict[str, Any]:
    item: dict[str, Any] = {"type": "function_call", "name": name, "arguments": arguments}
    if call_id is not ...:
        item["call_id"] = call_id
    return item


@pytest.mark.parametrize("item", [
    {"type": "web_search_call", "id": "ws_1", "status": "completed"},
    {"type": "custom_tool_call", "call_id": "c", "name": "x", "input": "y"},
    {"type": "function_call_output", "call_id": "c", "output": "{}"},
    {"type": None},
    {"type": ["message"]},
    {"type": {"name": "function_call"}},
    {"role": "assistant", "content": "no type"},
    "message",
    None,
])
def test_unknown_responses_item_type_gives_a_fault(item: Any) -> None:
    turn = parse_responses(responses(fc(), item))
    assert isinstance(turn.fault, str)
    assert turn.calls == []
    state = new_state()
    assert plan_calls(state, turn, STEP, RULES, "wf") == StopReason.PROTOCOL_ERROR
    assert state.tool_executions == 0


def test_duplicate_call_id_in_one_response_gives_a_fault() -> None:
    turn = parse_responses(responses(fc("call_1"), fc("call_1", arguments='{"sku":"B-002"}')))
    assert isinstance(turn.fault, str)
    assert turn.calls == []
    assert plan_calls(new_state(), turn, STEP, RULES, "wf") == StopReason.PROTOCOL_ERROR


@pytest.mark.parametrize("call_id", [..., None, "", 42, ["call_1"]])
def test_missing_or_malformed_responses_call_id_gives_a_fault(call_id: Any) -> None:
    turn = parse_responses(responses(fc(call_id)))
    assert isinstance(turn.fault, str)
    assert plan_calls(new_state(), turn, STEP, RULES, "wf") == StopReason.PROTOCOL_ERROR


def test_a_call_id_reused_from_an_earlier_step_is_a_protocol_error() -> None:
    state = new_state()
    first = plan_calls(state, parse_responses(responses(fc("call_1"))), STEP, RULES, "wf")
    assert isinstance(first, list)
    again = parse_responses(responses(fc("call_1", arguments='{"sku":"B-002"}')))
    step2 = StepPlan(step=2, tool_choice="auto", last=False)
    assert plan_calls(state, again, step2, RULES, "wf") == StopReason.PROTOCOL_ERROR


def test_responses_status_not_completed_is_incomplete_and_executes_nothing() -> None:
    turn = parse_responses(responses(fc(), status="incomplete"))
    assert turn.status == "incomplete"
    assert plan_calls(new_state(), turn, STEP, RULES, "wf") == StopReason.INCOMPLETE


@pytest.mark.parametrize("arguments", [{"sku": "A-001"}, ["A-001"], 42, None])
def test_responses_arguments_of_any_json_type_become_a_string(arguments: Any) -> None:
    turn = parse_responses(responses(fc(arguments=arguments)))
    assert turn.fault is None
    assert isinstance(turn.calls[0].arguments, str)
    assert_typed_decision(turn)


@pytest.mark.parametrize(("arguments", "code"), [
    ("not json", "INVALID_JSON"), ("[1, 2]", "INVALID_ARGUMENTS"), ("", "INVALID_ARGUMENTS"),
    ('{"sku": "a-1"}', "INVALID_ARGUMENTS"), ('{"sku": "A-001", "x": 1}', "INVALID_ARGUMENTS"),
])
def test_invalid_arguments_are_answered_not_executed(arguments: str, code: str) -> None:
    state = new_state()
    decided = plan_calls(state, parse_responses(responses(fc(arguments=arguments))), STEP,
                         RULES, "wf")
    assert isinstance(decided, list) and isinstance(decided[0], Reply)
    assert decided[0].envelope.status == ToolStatus.INVALID_INPUT
    assert decided[0].envelope.error_code == code
    assert decided[0].envelope.retryable
    assert state.identical_calls == {invalid_fingerprint("lookup_stock", arguments): 1}
    assert state.per_tool_calls == {} and state.tool_executions == 0


def test_reasoning_and_message_items_are_kept_in_order_next_to_calls() -> None:
    body = responses({"type": "reasoning", "id": "rs_1", "summary": []},
                     {"type": "message", "role": "assistant",
                      "content": [{"type": "output_text", "text": "Checking."}]},
                     fc("call_1"), fc("call_2", arguments='{"sku":"B-002"}'))
    turn = parse_responses(body)
    assert [i["type"] for i in turn.items] == ["reasoning", "message", "function_call",
                                               "function_call"]
    assert turn.text == "Checking."
    assert [c.call_id for c in turn.calls] == ["call_1", "call_2"]


# --- examples: what json.loads accepts but UTF-8 JSON cannot carry ----------------------


@pytest.mark.parametrize("item", [
    {"type": "message", "role": "assistant", "content": [], "arguments": "\ud800"},
    {"type": "reasoning", "summary": [{"type": "summary_text", "text": "t",
                                       "arguments": ["a\udc00"]}]},
    {"type": "message", "role": "assistant", "content": [], "arguments": float("nan")},
    {"type": "function_call", "call_id": "c1", "name": "lookup_stock",
     "arguments": '{"sku":"A-001"}', "extra": {"arguments": "\ud83d"}},
], ids=["message-surrogate", "reasoning-nested-surrogate", "message-nan",
        "function_call-extra-surrogate"])
def test_arguments_keys_outside_function_call_arguments_keep_history_valid_json(
        item: dict[str, Any]) -> None:
    # Only a function_call's own `arguments` is special; an `arguments` key elsewhere is
    # ordinary response data and must become UTF-8 JSON like everything else.
    turn = parse_responses({"status": "completed", "output": [item],
                            "usage": {"input_tokens": 2, "output_tokens": 2}})
    assert_well_formed(turn)
    assert_typed_decision(turn)


@pytest.mark.parametrize("arguments", [
    '{"query": "\\ud800", "limit": 1}',   # escaped lone surrogate in the JSON text
    '{"query": "\ud800", "limit": 1}',     # the surrogate itself
    '{"query": "q", "limit": NaN}',
    '{"query": "q", "limit": Infinity}',
])
def test_arguments_json_cannot_carry_are_refused_as_invalid_json(arguments: str) -> None:
    turn = parse_responses({"status": "completed", "output": [
        {"type": "function_call", "call_id": "c1", "name": "search_docs",
         "arguments": arguments}], "usage": {"input_tokens": 1, "output_tokens": 1}})
    assert_well_formed(turn)
    state = new_state()
    decided = plan_calls(state, turn, STEP, RULES, "wf")
    assert isinstance(decided, list) and isinstance(decided[0], Reply)
    assert decided[0].envelope.status == ToolStatus.INVALID_INPUT
    assert decided[0].envelope.error_code == "INVALID_JSON"
    assert state.identical_calls == {
        invalid_fingerprint("search_docs", turn.calls[0].arguments): 1}
    assert state.per_tool_calls == {} and state.tool_executions == 0


@pytest.mark.parametrize("name", [..., None, "", 7])
def test_nameless_calls_are_answered_with_an_error_and_never_executed(name: Any) -> None:
    # Even a registered, allowed tool named like the history placeholder never runs.
    rules = {**RULES, MISSING_NAME: ToolRule(MISSING_NAME, LookupStockArgs)}
    state = LoopState(settings=RunSettings(model="m"), allowed_tools=list(rules))
    item: dict[str, Any] = {"type": "function_call", "call_id": "c1",
                            "arguments": '{"sku":"A-001"}'}
    if name is not ...:
        item["name"] = name
    raw_call: dict[str, Any] = {"id": "c1", "type": "function",
                                "function": {"arguments": '{"sku":"A-001"}'}}
    if name is not ...:
        raw_call["function"]["name"] = name
    for turn in (parse_responses(responses(item)), parse_chat(chat([raw_call]), 1)):
        assert turn.fault is None
        assert [c.name for c in turn.calls] == [""]
        assert all(isinstance(i.get("name", ""), str) and i.get("name") != ""
                   for i in turn.items if i["type"] == "function_call")
        state = LoopState(settings=RunSettings(model="m"), allowed_tools=list(rules))
        decided = plan_calls(state, turn, STEP, rules, "wf")
        assert isinstance(decided, list) and len(decided) == 1
        assert isinstance(decided[0], Reply)
        assert decided[0].envelope.status == ToolStatus.INVALID_INPUT


def test_chat_tool_call_of_a_non_function_type_gives_a_fault() -> None:
    body = chat([{"id": "c1", "type": "custom", "custom": {"name": "x", "input": "y"}}])
    turn = parse_chat(body, 1)
    assert isinstance(turn.fault, str)
    assert plan_calls(new_state(), turn, STEP, RULES, "wf") == StopReason.PROTOCOL_ERROR


@pytest.mark.parametrize("body", ["not an object", [], {"output": "x"}, {"choices": []}])
def test_a_faulty_response_without_usage_stops_with_protocol_error(body: Any) -> None:
    for turn in (parse_responses(body), parse_chat(body, 1)):
        assert isinstance(turn.fault, str)
        state = new_state()
        assert account_usage(state, turn, 100) is None
        assert plan_calls(state, turn, STEP, RULES, "wf") == StopReason.PROTOCOL_ERROR
