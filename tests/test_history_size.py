"""Each conversation item is written to Temporal history about once (docs/history.md)."""

from __future__ import annotations

import json

from boundloop.core.limits import Limits
from tests.conftest import Outcome, RunScript
from tests.scripts import answer, call, outputs, resp

MARK = "あ" * 64


async def events_containing(out: Outcome, text: str) -> list[str]:
    needle = text.encode("utf-8")
    found = []
    async for event in out.handle.fetch_history_events():
        raw = event.SerializeToString()
        # Payloads are JSON: non-ASCII may appear literally or \\u-escaped.
        if needle in raw or json.dumps(text).strip('"').encode() in raw:
            found.append(event.WhichOneof("attributes") or "")
    return found


async def test_a_tool_output_is_written_to_history_once(run_script: RunScript) -> None:
    out = await run_script([resp(call("huge", {"chars": 1000}, "c1")),
                            resp(call("huge", {"chars": 1001}, "c2")), answer("ok")],
                           tools=["huge"], limits=Limits(max_result_bytes=8000))
    assert out.result.reason == "completed"
    assert outputs(out.bodies[1])["c1"]["data"]["text"] == "あ" * 1000  # the model saw it
    assert await events_containing(out, MARK) == ["activity_task_completed_event_attributes",
                                                  "activity_task_completed_event_attributes"]


async def test_outputs_are_rebuilt_from_history_when_the_cache_is_cold(
        run_script: RunScript) -> None:
    script = [resp(call("huge", {"chars": 500}, "c1")), resp(call("huge", {"chars": 501}, "c2")),
              answer("ok")]
    warm = await run_script(script, tools=["huge"], limits=Limits(max_result_bytes=8000))
    cold = await run_script(script, tools=["huge"], limits=Limits(max_result_bytes=8000),
                            cache=0)
    assert cold.result.reason == "completed"
    assert [b["input"] for b in cold.bodies] == [b["input"] for b in warm.bodies]


async def test_outputs_the_workflow_writes_travel_inline(run_script: RunScript) -> None:
    out = await run_script([resp(call("lookup_stock", '{"sku": "bad"}', "c1")),
                            answer("ok")])
    assert outputs(out.bodies[1])["c1"]["status"] == "invalid_input"
