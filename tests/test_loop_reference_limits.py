"""The reference limits table, through the real workflow on a real dev server
(Responses API)."""

from __future__ import annotations

import json
import urllib.parse
import uuid

from boundloop.core.limits import Limits
from tests.conftest import RunScript
from tests.scripts import answer, body, call, outputs, reasoning, resp
from tests.support.tools import SECRET_DETAIL


async def test_two_tool_rounds_keep_reasoning_and_call_ids(run_script: RunScript) -> None:
    out = await run_script([
        resp(reasoning("rs_1"), call("lookup_stock", {"sku": "A-001"}, "c1")),
        resp(call("lookup_stock", {"sku": "B-002"}, "c2")),
        answer("A-001は12個、B-002は在庫切れです。"),
    ])
    r = out.result
    assert (r.reason, r.steps, r.tool_executions) == ("completed", 3, 2)
    assert r.text == "A-001は12個、B-002は在庫切れです。"
    assert r.total_tokens == 360
    second = out.bodies[1]["input"]
    kinds = [i["type"] for i in second]
    assert kinds == ["message", "reasoning", "function_call", "function_call_output"]
    assert second[1]["encrypted_content"] == "gAAAA-encrypted-rs_1"
    first_out = outputs(out.bodies[1])["c1"]
    assert first_out["status"] == "success"
    assert first_out["data"] == {"sku": "A-001", "found": True, "quantity": 12}
    assert outputs(out.bodies[2])["c2"]["data"]["quantity"] == 0
    assert out.bodies[0]["store"] is False
    assert out.bodies[0]["include"] == ["reasoning.encrypted_content"]
    assert out.tools_run() == ["lookup_stock", "lookup_stock"]


async def test_broken_json_goes_back_and_corrected_call_executes(run_script: RunScript) -> None:
    out = await run_script([
        resp(call("lookup_stock", '{"sku": "A-0', "bad")),
        resp(call("lookup_stock", {"sku": "A-001"}, "fixed")),
        answer("12個あります。"),
    ])
    assert (out.result.reason, out.result.tool_executions) == ("completed", 1)
    bad = outputs(out.bodies[1])["bad"]
    assert bad["status"] == "invalid_input" and bad["error_code"] == "INVALID_JSON"
    assert bad["retryable"] is True


async def test_last_step_never_executes_tools(run_script: RunScript) -> None:
    out = await run_script([resp(call("lookup_stock", {"sku": f"A-00{i}"}, f"c{i}"))
                            for i in range(1, 4)], limits=Limits(max_steps=3))
    r = out.result
    assert (r.reason, r.steps, r.tool_executions) == ("max_steps", 3, 2)
    assert [b.get("tool_choice") for b in out.bodies] == ["auto", "auto", "none"]


async def test_usage_threshold_stops_before_any_tool(run_script: RunScript) -> None:
    out = await run_script([resp(call("lookup_stock", {"sku": "A-001"}, "c1"),
                                 usage={"input_tokens": 90, "output_tokens": 10,
                                        "total_tokens": 100})],
                           limits=Limits(token_threshold=100))
    assert (out.result.reason, out.result.tool_executions) == ("usage_limit", 0)


async def test_missing_usage_stops_before_any_tool(run_script: RunScript) -> None:
    out = await run_script([resp(call("lookup_stock", {"sku": "A-001"}, "c1"), usage=None)])
    assert (out.result.reason, out.result.tool_executions) == ("usage_unknown", 0)
    assert out.result.usage_unknown is True


async def test_model_error_stops_without_leaking(run_script: RunScript) -> None:
    secret = "Incorrect API key provided: sk-live-SECRET123"
    out = await run_script([body({"error": {"message": secret, "type": "invalid_request"}},
                                 status=401)])
    r = out.result
    assert (r.reason, r.steps, r.tool_executions) == ("model_error", 1, 0)
    assert "SECRET123" not in r.model_dump_json()
    assert len(out.requests) == 1  # 401 is not retried
    assert "model_failed:http_401" in [e.event for e in r.events]


async def test_a_workflow_id_in_japanese_gets_an_ascii_idempotency_key(
        run_script: RunScript) -> None:
    """An HTTP header is ASCII: a run whose workflow id is not (a Japanese operator's
    naming) sends the model its key percent-encoded; before, every request failed to
    encode and the run ended model_error without reaching the model."""
    wid = f"在庫確認-{uuid.uuid4().hex[:8]}"
    out = await run_script([answer("done")], workflow_id=wid)
    assert (out.result.reason, out.result.steps) == ("completed", 1)
    [key] = [r.headers.get("idempotency-key") for r in out.requests]
    assert key is not None and key.isascii()
    # Scoped by the run (its first execution run id), as tool keys are.
    assert urllib.parse.unquote(key) == f"{wid}/{out.result.run_id}/model/step-1"


async def test_retryable_model_error_is_retried_by_temporal(run_script: RunScript) -> None:
    out = await run_script([
        body({"error": {"message": "overloaded", "type": "server_error"}}, status=503,
             headers={"Retry-After": "0"}),
        answer("done"),
    ])
    assert (out.result.reason, out.result.steps) == ("completed", 1)
    keys = [r.headers.get("idempotency-key") for r in out.requests]
    assert keys[0] == keys[1] and keys[0] is not None and keys[0].endswith("/model/step-1")


async def test_forbidden_tool_stops_before_any_tool(run_script: RunScript) -> None:
    out = await run_script([resp(call("lookup_stock", {"sku": "A-001"}, "c1"),
                                 call("delete_all", {}, "c2"))])
    assert (out.result.reason, out.result.tool_executions) == ("forbidden_tool", 0)


async def test_duplicate_call_id_stops_before_any_tool(run_script: RunScript) -> None:
    turn = resp(call("lookup_stock", {"sku": "A-001"}, "same"),
                call("lookup_stock", {"sku": "B-002"}, "other"))
    turn["body"]["output"][1]["call_id"] = "same"  # the builders refuse to make this
    out = await run_script([turn])
    assert (out.result.reason, out.result.tool_executions) == ("protocol_error", 0)


async def test_batch_over_tool_limit_stops_before_any_tool(run_script: RunScript) -> None:
    out = await run_script([resp(call("lookup_stock", {"sku": "A-001"}, "c1"),
                                 call("lookup_stock", {"sku": "B-002"}, "c2"))],
                           limits=Limits(max_tool_executions=1))
    assert (out.result.reason, out.result.tool_executions) == ("max_tools", 0)


async def test_incomplete_status_stops_before_any_tool(run_script: RunScript) -> None:
    out = await run_script([resp(call("lookup_stock", {"sku": "A-001"}, "c1"),
                                 status="incomplete")])
    assert (out.result.reason, out.result.tool_executions) == ("incomplete", 0)


async def test_empty_output_is_not_completed(run_script: RunScript) -> None:
    out = await run_script([resp()])
    assert (out.result.reason, out.result.steps) == ("empty_output", 1)


async def test_unknown_output_item_is_protocol_error(run_script: RunScript) -> None:
    out = await run_script([resp({"type": "web_search_call", "id": "ws_1"},
                                 call("lookup_stock", {"sku": "A-001"}, "c1"))])
    assert (out.result.reason, out.result.tool_executions) == ("protocol_error", 0)


async def test_large_utf8_output_becomes_result_too_large(run_script: RunScript) -> None:
    out = await run_script([resp(call("huge", {"chars": 1000}, "c1")), answer("取得不可")],
                           tools=["huge"], limits=Limits(max_result_bytes=256))
    assert out.result.reason == "completed"
    env = outputs(out.bodies[1])["c1"]
    assert env["error_code"] == "RESULT_TOO_LARGE" and "data" not in env


async def test_tool_exception_is_fatal_and_does_not_leak(run_script: RunScript) -> None:
    out = await run_script([resp(call("explode", {"x": "1"}, "c1"))], tools=["explode"])
    r = out.result
    assert (r.reason, r.steps) == ("tool_error", 1)
    assert "hunter2" not in r.model_dump_json()
    history = json.dumps([str(e) async for e in out.handle.fetch_history_events()])
    assert SECRET_DETAIL not in history and "hunter2" not in history


async def test_too_large_first_message_stops_before_first_request(run_script: RunScript) -> None:
    out = await run_script([answer("never")], question="あ" * 1000,
                           limits=Limits(max_history_bytes=100))
    assert (out.result.reason, out.result.steps) == ("history_limit", 0)
    assert out.requests == []
    # The event says why and what to do: its bytes against the cap.
    said = out.result.events[-2]
    assert said.event == "history_limit" and (said.detail or "").startswith(
        "the conversation is 3") and "over max_history_bytes 100" in (said.detail or "")
    assert "raise max_history_bytes" in (said.detail or "")


async def test_error_envelope_over_the_cap_is_result_limit(run_script: RunScript) -> None:
    out = await run_script([resp(call("lookup_stock", "{", "c1"))],
                           limits=Limits(max_result_bytes=10))
    assert (out.result.reason, out.result.tool_executions) == ("result_limit", 0)
