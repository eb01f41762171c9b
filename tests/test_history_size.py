"""Each conversation item is written to Temporal history about once (docs/history.md)."""

from __future__ import annotations

import json

import pytest
from temporalio.api.enums.v1 import EventType

from boundloop import search_attributes as sa
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


@pytest.mark.parametrize(("tool", "where"), [
    ("huge", "marker_recorded_event_attributes"),  # a short read-only tool: local
    ("huge_remote", "activity_task_completed_event_attributes"),  # opted out
])
async def test_a_tool_output_is_written_to_history_once(run_script: RunScript, tool: str,
                                                        where: str) -> None:
    out = await run_script([resp(call(tool, {"chars": 1000}, "c1")),
                            resp(call(tool, {"chars": 1001}, "c2")), answer("ok")],
                           tools=[tool], limits=Limits(max_result_bytes=8000))
    assert out.result.reason == "completed"
    assert outputs(out.bodies[1])["c1"]["data"]["text"] == "あ" * 1000  # the model saw it
    assert await events_containing(out, MARK) == [where, where]


@pytest.mark.parametrize("tool", ["huge", "huge_remote"])
async def test_outputs_are_rebuilt_from_history_when_the_cache_is_cold(
        run_script: RunScript, tool: str) -> None:
    """From the tool activity's completion, or a local activity's marker."""
    script = [resp(call(tool, {"chars": 500}, "c1")), resp(call(tool, {"chars": 501}, "c2")),
              answer("ok")]
    warm = await run_script(script, tools=[tool], limits=Limits(max_result_bytes=8000))
    cold = await run_script(script, tools=[tool], limits=Limits(max_result_bytes=8000),
                            cache=0)
    assert cold.result.reason == "completed"
    assert [b["input"] for b in cold.bodies] == [b["input"] for b in warm.bodies]


async def test_outputs_the_workflow_writes_travel_inline(run_script: RunScript) -> None:
    out = await run_script([resp(call("lookup_stock", '{"sku": "bad"}', "c1")),
                            answer("ok")])
    assert outputs(out.bodies[1])["c1"]["status"] == "invalid_input"


async def test_search_attributes_are_upserted_when_the_status_changes_not_every_step(
        run_script: RunScript) -> None:
    """Each upsert is a history event: a 4-step run upserts when it starts running and
    when it ends (the counts ride along), not once per step."""
    out = await run_script([resp(call("lookup_stock", {"sku": f"A-00{i}"}, f"c{i}"))
                            for i in range(1, 4)] + [answer("ok")],
                           limits=Limits(max_steps=6))
    assert (out.result.reason, out.result.steps) == ("completed", 4)
    upserts = [e async for e in out.handle.fetch_history_events()
               if e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
               and sa.STATUS.name in e.upsert_workflow_search_attributes_event_attributes
               .search_attributes.indexed_fields]
    assert len(upserts) == 2
    attrs = (await out.handle.describe()).typed_search_attributes
    assert (attrs.get(sa.STATUS), attrs.get(sa.STEPS), attrs.get(sa.TOOL_EXECUTIONS)) == (
        "completed", 4, 3)


async def test_a_new_run_asks_one_patch_however_many_it_takes(run_script: RunScript) -> None:
    """Each patch asked is a marker and a `TemporalChangeVersion` upsert: a new run takes
    every patch of the bundle (operator policy, sparse upserts, local tools, routing, ...)
    by asking the bundle alone, so its history holds one of each."""
    out = await run_script([resp(call("lookup_stock", {"sku": "A-001"}, "c1")),
                            resp(call("lookup_stock", {"sku": "B-002"}, "c2")),
                            answer("ok")])
    assert (out.result.reason, out.result.steps) == ("completed", 3)
    events = [e async for e in out.handle.fetch_history_events()]
    patches = [json.loads(e.marker_recorded_event_attributes.details["patch-data"]
                          .payloads[0].data)["id"] for e in events
               if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
               and e.marker_recorded_event_attributes.marker_name == "core_patch"]
    assert patches == ["bundled-patches-0.5"]
    versions = [e for e in events
                if e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
                and "TemporalChangeVersion" in e.upsert_workflow_search_attributes_event_attributes
                .search_attributes.indexed_fields]
    assert len(versions) == 1
    # The bundled patches took effect: the lookups ran as local activities (markers, no
    # tool activity), and the attributes were upserted only at the status changes.
    scheduled = [e.activity_task_scheduled_event_attributes.activity_type.name for e in events
                 if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
    assert scheduled == ["model_request"] * 3
    upserts = [e for e in events
               if e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
               and sa.STATUS.name in e.upsert_workflow_search_attributes_event_attributes
               .search_attributes.indexed_fields]
    assert len(upserts) == 2
