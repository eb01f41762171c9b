"""The live stream of a run, through the real workflow on a dev server, with the real
`openai` SDK reading Server-Sent Events from the scripted server (docs/streaming.md).

The stream is a view: its events are the event log, its last item the RunResult, and
the text deltas of the attempt that counted make the final text.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowHandle

from boundloop.client import stream_items
from boundloop.contracts import Reset, StreamEvent, StreamItem, StreamResult, TextDelta
from tests.conftest import RunScript
from tests.scripts import answer, call, chat, chat_call, resp
from tests.test_crash import cluster, result_of, until

#: Bound of every wait below (seconds); none is an assertion on time.
WAIT = 60.0
LONG = "在庫はA-001が12個、B-002が3個です。" * 8 + " done ✓"
ARGS = {"sku": "A-001", "note": "北海道の倉庫 ✓"}


def scripts(api: str) -> list[dict[str, Any]]:
    """A tool call whose arguments stream 3 characters at a time, then a long answer, both
    written 7 bytes at a time (pieces end inside UTF-8 characters)."""
    if api == "chat":
        turns = [chat(calls=[chat_call("lookup_stock", ARGS, "c1")]), chat(LONG)]
    else:
        turns = [resp(call("lookup_stock", ARGS, "c1")), answer(LONG, rid="resp_2")]
    return [{**t, "chunk_bytes": 7} for t in turns]


async def read_all(handle: WorkflowHandle[Any, Any], from_offset: int = 0,
                   limit: int | None = None) -> list[StreamItem]:
    items: list[StreamItem] = []

    async def read() -> None:
        async for item in stream_items(handle, from_offset):
            items.append(item)
            if limit is not None and len(items) == limit:
                return  # the client goes away mid-stream
    await asyncio.wait_for(read(), WAIT)
    return items


def text_of(items: list[StreamItem], step: int) -> str:
    """The text a client shows for `step`: its attempts' deltas, less those of every
    attempt a reset voided (late ones too: docs/streaming.md)."""
    texts: dict[str, str] = {}
    void: set[str] = set()
    for item in items:
        if isinstance(item, Reset) and item.step == step:
            voided = [item.attempt] if item.attempt is not None else list(texts)
            void.update(voided)
            for attempt in voided:
                texts.pop(attempt, None)
        elif isinstance(item, TextDelta) and item.step == step and item.attempt not in void:
            texts[item.attempt] = texts.get(item.attempt, "") + item.text
    return "".join(texts.values())


@pytest.mark.parametrize("api", ["responses", "chat"])
async def test_streamed_deltas_make_the_final_text(run_script: RunScript, api: str) -> None:
    seen: dict[str, list[StreamItem]] = {}

    async def reader(handle: WorkflowHandle[Any, Any]) -> None:
        seen["live"] = await read_all(handle)  # from the start, while the run goes on
        # A client that disconnects after 5 items and reconnects by offset.
        first = await read_all(handle, limit=5)
        seen["resumed"] = first + await read_all(handle, first[-1].offset + 1)

    out = await run_script(scripts(api), api=api, tools=["lookup_stock"], during=reader)
    assert out.result.reason == "completed"
    assert all(b["stream"] is True for b in out.bodies)
    live = seen["live"]
    assert [i.offset for i in live] == list(range(len(live)))
    assert text_of(live, 2) == out.result.text == LONG
    assert [i.event for i in live if isinstance(i, StreamEvent)] == out.result.events
    last = live[-1]
    assert isinstance(last, StreamResult) and last.result == out.result
    assert seen["resumed"] == live  # every item once, none missing


def broken(api: str, fault: str) -> list[dict[str, Any]]:
    turn = chat("short answer") if api == "chat" else answer("short answer")
    return [{**turn, "stream_fault": fault, "chunk_bytes": 5}]


def twin(api: str, fault: str) -> list[dict[str, Any]]:
    """The unstreamed answer that breaks the same way."""
    if fault in ("cut", "no_terminator"):  # a body that ends early
        return [{"raw": '{"id": "resp_1", "object": "response", "output": [{"type": "mess'}]
    if fault == "no_usage":
        return [chat("short answer", usage=None) if api == "chat"
                else answer("short answer", usage=None)]
    raise AssertionError(fault)


@pytest.mark.parametrize("api", ["responses", "chat"])
@pytest.mark.parametrize("fault", ["cut", "no_terminator", "no_usage"])
async def test_a_broken_stream_stops_like_its_unstreamed_twin(
        run_script: RunScript, api: str, fault: str) -> None:
    streamed = await run_script(broken(api, fault), api=api)
    unstreamed = await run_script(twin(api, fault), api=api, stream=False)
    assert "stream" not in unstreamed.bodies[0]
    assert streamed.result.reason == unstreamed.result.reason
    assert streamed.result.reason == ("usage_unknown" if fault == "no_usage"
                                      else "protocol_error")


@pytest.mark.parametrize("api", ["responses", "chat"])
async def test_an_error_event_mid_stream_resets_and_the_retry_streams_again(
        run_script: RunScript, api: str) -> None:
    """An error event mid-answer is a provider failure like a 5xx, counted and retried
    (as its twin, a 500, is); the stream says `reset` and the retry's text counts."""
    retry = chat(LONG) if api == "chat" else answer(LONG)
    seen: list[StreamItem] = []

    async def reader(handle: WorkflowHandle[Any, Any]) -> None:
        seen.extend(await read_all(handle))

    streamed = await run_script([*broken(api, "error_event"), retry], api=api,
                                during=reader)
    error = {"status": 500, "body": {"error": {"message": "boom", "type": "server_error"}}}
    unstreamed = await run_script([error, retry], api=api, stream=False)
    assert streamed.result.reason == unstreamed.result.reason == "completed"
    assert [e.event for e in streamed.result.events] == [
        e.event for e in unstreamed.result.events]
    resets = [i for i in seen if isinstance(i, Reset)]
    assert resets and all(r.step == 1 for r in resets)
    # Whatever the failed attempt streamed (its text goes out best effort, so maybe
    # none) is voided; the retry's text is the answer, once.
    failed = {r.attempt for r in resets}
    assert all(i.attempt in failed for i in seen
               if isinstance(i, TextDelta) and i.offset < resets[0].offset)
    assert text_of(seen, 1) == streamed.result.text == LONG


async def test_stream_false_sends_no_stream_and_streams_no_text(run_script: RunScript) -> None:
    seen: list[StreamItem] = []

    async def reader(handle: WorkflowHandle[Any, Any]) -> None:
        seen.extend(await read_all(handle))

    out = await run_script([answer(LONG)], stream=False, during=reader)
    assert "stream" not in out.bodies[0]
    assert out.result.text == LONG
    assert not [i for i in seen if isinstance(i, TextDelta)]
    assert isinstance(seen[-1], StreamResult)
    assert (await result_of(out.handle)) == out.result


async def test_a_worker_killed_mid_stream_gives_a_reset_and_the_retry_text(
        tmp_path: Path) -> None:
    """kill -9 of the worker while the model is writing: the next attempt says `reset`
    for the dead one, streams the answer again, and a client's text is the retry's,
    nothing doubled."""
    slow = {**answer(LONG), "chunk_bytes": 200, "chunk_interval_seconds": 0.5}
    async with cluster(tmp_path) as c:
        worker = c.start_worker()
        handle = await c.start_run([slow, answer(LONG)], tools=["lookup_stock"])
        items: list[StreamItem] = []
        reader = asyncio.create_task(read_into(handle, items))

        async def streaming() -> bool:
            return any(isinstance(i, TextDelta) for i in items)
        await until(streaming, "the first attempt to stream text")
        c.kill(worker)
        c.start_worker()
        result = await result_of(handle)
        await asyncio.wait_for(reader, WAIT)

    assert (result.reason, result.steps, result.text) == ("completed", 1, LONG)
    dead = next(i for i in items if isinstance(i, TextDelta)).attempt
    resets = [i for i in items if isinstance(i, Reset)]
    assert [r.attempt for r in resets] == [dead]
    after = [i for i in items if isinstance(i, TextDelta) and i.offset > resets[0].offset]
    assert after and all(i.attempt != dead for i in after)
    assert "".join(i.text for i in after) == LONG  # the retry's text, once
    assert text_of(items, 1) == LONG
    assert isinstance(items[-1], StreamResult) and items[-1].result == result


async def read_into(handle: WorkflowHandle[Any, Any], items: list[StreamItem]) -> None:
    async for item in stream_items(handle):
        items.append(item)
