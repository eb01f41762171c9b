"""A run cut short is never reported as success: the sequences a real small model
produced, scripted, through the real workflow (README, "How the loop decides")."""

from __future__ import annotations

import json
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
from temporalio.exceptions import ApplicationError

from boundloop import errors
from boundloop.core.limits import Limits, Policy
from tests.conftest import RunScript
from tests.scripts import answer, call, chat, chat_call, outputs, resp, tool_messages

#: What the model wrote as text on the forced last step, instead of an answer.
CALL_AS_TEXT = '{"name": "lookup_stock", "arguments": {"sku": "A-001"}}'
#: The invalid call it repeated: the schema's keywords echoed into the arguments.
SCHEMA_ECHO = {"sku": "A-001", "required": ["sku"], "type": "object"}
STOCK_QUESTION = "A-001とB-002の在庫をそれぞれ調べて。"


def looping_stock_script(api: str) -> list[dict[str, Any]]:
    """lookup_stock B-002, B-002, A-001, A-001 (one call a step), then the call as text."""
    skus = ["B-002", "B-002", "A-001", "A-001"]
    if api == "chat":
        return [*(chat(calls=[chat_call("lookup_stock", {"sku": s}, f"c{i}")])
                  for i, s in enumerate(skus, 1)), chat(content=CALL_AS_TEXT)]
    return [*(resp(call("lookup_stock", {"sku": s}, f"c{i}"), rid=f"r{i}")
              for i, s in enumerate(skus, 1)), answer(CALL_AS_TEXT, rid="r5")]


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_tool_call_text_on_the_forced_last_step_ends_max_steps_flagged(
        run_script: RunScript, api: str) -> None:
    out = await run_script(looping_stock_script(api), question=STOCK_QUESTION, api=api,
                           tools=["lookup_stock", "search_docs"])
    r = out.result
    assert (r.reason, r.steps, r.tool_executions) == ("max_steps", 5, 4)
    assert r.text == CALL_AS_TEXT
    assert r.answer_looks_like_tool_call is True
    assert out.bodies[4]["tool_choice"] == "none"
    assert [e.event for e in r.events][-3:] == [
        "answered", "answer_looks_like_tool_call", "stopped:max_steps"]
    # Temporal's own status shows the run did not succeed.
    desc = await out.handle.describe()
    assert desc.status == WorkflowExecutionStatus.FAILED


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_identical_invalid_calls_end_max_identical_calls(
        run_script: RunScript, api: str) -> None:
    if api == "chat":
        script = [*(chat(calls=[chat_call("lookup_stock", SCHEMA_ECHO, f"c{i}")])
                    for i in range(1, 5)), chat(content=json.dumps(SCHEMA_ECHO))]
    else:
        script = [*(resp(call("lookup_stock", SCHEMA_ECHO, f"c{i}"), rid=f"r{i}")
                    for i in range(1, 5)), answer(json.dumps(SCHEMA_ECHO), rid="r5")]
    out = await run_script(script, api=api, tools=["lookup_stock", "search_docs"])
    r = out.result
    # Two refusals as invalid input, the third identical call blocked, then the step
    # forced final (tool_choice "none") whose ignored call ends the run.
    assert (r.reason, r.steps, r.tool_executions) == ("max_identical_calls", 4, 0)
    seen = tool_messages if api == "chat" else outputs
    first, third = seen(out.bodies[1])["c1"], seen(out.bodies[3])["c3"]
    assert (first["status"], first["error_code"]) == ("invalid_input", "INVALID_ARGUMENTS")
    assert "unexpected fields 'required', 'type'" in first["message"]
    assert "expected fields: sku" in first["message"]
    assert (third["status"], third["error_code"]) == ("blocked", "IDENTICAL_CALL_LIMIT")
    assert out.bodies[3]["tool_choice"] == "none"
    fps = [e.fingerprint for e in r.events if e.event in ("invalid_input", "blocked_identical")]
    assert len(fps) == 3 and len(set(fps)) == 1 and fps[0] is not None


async def test_repeated_unknown_tool_under_report_ends_max_identical_calls(
        run_script: RunScript) -> None:
    out = await run_script([
        resp(call("get_weather", {"city": "Tokyo"}, "c1"), rid="r1"),
        resp(call("get_weather", {"city": "Tokyo"}, "c2"), rid="r2"),
        resp(call("get_weather", {"city": "Tokyo"}, "c3"), rid="r3"),
        answer("天気は調べられません。", rid="r4"),
    ], tools=["lookup_stock", "search_docs"], policy=Policy(unknown_tool="report"),
        limits=Limits(max_steps=8))
    r = out.result
    assert (r.reason, r.steps, r.text) == ("max_identical_calls", 4, "天気は調べられません。")
    unknown = outputs(out.bodies[1])["c1"]
    assert unknown["error_code"] == "UNKNOWN_TOOL"
    assert "Available tools: lookup_stock, search_docs." in unknown["message"]
    assert outputs(out.bodies[3])["c3"]["error_code"] == "IDENTICAL_CALL_LIMIT"
    assert out.bodies[3]["tool_choice"] == "none"


async def test_forbidden_tool_event_names_the_tool(run_script: RunScript) -> None:
    out = await run_script([resp(call("delete_everything", {}, "c1"))],
                           tools=["lookup_stock"])
    r = out.result
    assert r.reason == "forbidden_tool"
    assert [(e.event, e.tool, e.call_id) for e in r.events if e.event == "forbidden_tool"] == [
        ("forbidden_tool", "delete_everything", "c1")]


async def test_fenced_tool_call_answered_while_free_completes_flagged_not_executed(
        run_script: RunScript) -> None:
    text = f"Calling the tool:\n```json\n{CALL_AS_TEXT}\n```"
    out = await run_script([answer(text)], tools=["lookup_stock"])
    r = out.result
    assert (r.reason, r.tool_executions, r.text) == ("completed", 0, text)
    assert r.answer_looks_like_tool_call is True
    assert (await out.handle.describe()).status == WorkflowExecutionStatus.COMPLETED


async def test_plain_answer_is_not_flagged(run_script: RunScript) -> None:
    out = await run_script([answer("A-001は12個です。")], tools=["lookup_stock"])
    assert (out.result.reason, out.result.answer_looks_like_tool_call) == ("completed", False)


async def test_terminal_side_effect_then_forced_last_step_completes(
        run_script: RunScript) -> None:
    out = await run_script([resp(call("finish", {"x": "ok"}, "c1")), answer("finished")],
                           tools=["finish"], limits=Limits(max_steps=2))
    assert (out.result.reason, out.result.text) == ("completed", "finished")
    assert out.bodies[1]["tool_choice"] == "none"


async def test_exhausted_tool_timeout_tells_the_model_seconds_and_attempts(
        run_script: RunScript) -> None:
    out = await run_script([resp(call("sleepy", {"x": "1"}, "c1")), answer("it timed out")],
                           tools=["sleepy"])
    timed_out = outputs(out.bodies[1])["c1"]
    assert (timed_out["status"], timed_out["retryable"]) == ("temporary_error", False)
    assert "timed out after 0.5 s, 2 attempts" in timed_out["message"]
    assert out.result.reason == "completed"


async def test_a_stopped_run_fails_with_run_stopped_carrying_the_run_result(
        run_script: RunScript) -> None:
    """What a plain `handle.result()` caller sees: WorkflowFailureError whose cause is a
    non-retryable `RunStopped` ApplicationError naming the reason, the RunResult its
    first detail (`boundloop.client.result_of` returns that)."""
    out = await run_script([resp(call("delete_everything", {}, "c1"))],
                           tools=["lookup_stock"])
    with pytest.raises(WorkflowFailureError) as caught:
        await out.handle.result()
    cause = caught.value.cause
    assert isinstance(cause, ApplicationError)
    assert (cause.type, cause.non_retryable) == (errors.RUN_STOPPED, True)
    assert cause.message.startswith("run stopped: forbidden_tool — ")
    assert cause.details[0]["reason"] == "forbidden_tool"
    assert cause.details[0] == out.result.model_dump(mode="json")
