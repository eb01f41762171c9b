"""A worker's conversation cache holds each item as the bytes a request sends it as: the
conversation of a long run adds nothing the garbage collector walks, and a request is
those bytes joined, exactly what the SDK would have encoded (docs/benchmarks-long-runs.md)."""

from __future__ import annotations

import dataclasses
import gc
import json
import types
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment

from boundloop.activities.conversation import (
    ConversationCache,
    json_array,
    pack,
    tool_outputs,
    unpack,
)
from boundloop.activities.threads import ToolThreads
from boundloop.activities.tools import ToolActivities
from boundloop.client import result_of
from boundloop.contracts import WORKFLOW_NAME, RunResult, ToolRequest, run_input
from boundloop.core.context import RECALL_TOOL
from boundloop.core.conversation import ConversationMeta
from boundloop.core.limits import Limits, RunSettings
from boundloop.scripted.builders import message_item
from boundloop.scripted.server import ScriptedModelServer
from boundloop.tools.demo import DemoDeps
from tests.conftest import test_worker as make_worker
from tests.scripts import answer, call, chat, chat_call, reasoning, resp
from tests.support.tools import tools as test_tools


def script(steps: int, api: str) -> list[dict[str, Any]]:
    """Each step a model turn with text (and, on Responses, a reasoning item) and a call."""
    if api == "chat":
        return [*(chat(f"手順 {i}", [chat_call("lookup_stock", {"sku": f"A-{i:03d}"},
                                                 f"c{i}")]) for i in range(steps)),
                chat("終わり")]
    return [*(resp(reasoning(f"rs{i}"), message_item(f"手順 {i}", f"msg_{i}"),
                   call("lookup_stock", {"sku": f"A-{i:03d}"}, f"c{i}"), rid=f"r{i}")
              for i in range(steps)), answer("終わり")]


async def run(client: Client, tmp_path: Path, steps: int, api: str = "responses",
              ) -> tuple[RunResult, ScriptedModelServer, ConversationCache]:
    server = ScriptedModelServer(script(steps, api))
    queue = f"cc-{uuid.uuid4().hex[:8]}"
    limits = Limits(max_steps=steps + 2, max_tool_executions=steps)
    inp = run_input("在庫を順に調べて", instructions="短く答えて", tools=["lookup_stock"],
                    settings=RunSettings(model="m", api=api,  # type: ignore[arg-type]
                                         limits=limits))
    try:
        async with make_worker(client, queue, server.start(), tmp_path) as worker:
            handle = await client.start_workflow(WORKFLOW_NAME, inp, id=f"cc-{queue}",
                                                 task_queue=queue, result_type=RunResult)
            result = await result_of(handle)
    finally:
        server.stop()
    assert server.violations == []
    return result, server, worker.plugin.cache


def walked(root: object) -> int:
    """How many objects reachable from `root` a full garbage collection walks (those
    it tracks), after one: classes, modules and functions are not followed."""
    gc.collect()
    seen: set[int] = set()
    stack, count = [root], 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, type | types.ModuleType | types.FunctionType):
            continue
        seen.add(id(obj))
        count += gc.is_tracked(obj)
        stack.extend(gc.get_referents(obj))
    return count


@pytest.mark.parametrize("api", ["responses", "chat"])
async def test_a_longer_conversation_adds_nothing_the_collector_walks(
        temporal: Client, tmp_path: Path, api: str) -> None:
    short, _, short_cache = await run(temporal, tmp_path / "short", 2, api)
    long, _, long_cache = await run(temporal, tmp_path / "long", 12, api)
    assert (short.reason, long.reason) == ("completed", "completed")
    # The cache holds each run's whole conversation ...
    assert len(long_cache.conversation(long.workflow_id, long.run_id) or []) > \
        len(short_cache.conversation(short.workflow_id, short.run_id) or []) + 20
    # ... and the objects a collection walks in it do not grow with its length.
    assert walked(long_cache) == walked(short_cache)


@pytest.mark.parametrize("api", ["responses", "chat"])
async def test_a_request_is_the_json_the_sdk_would_send(
        temporal: Client, tmp_path: Path, api: str) -> None:
    result, server, _ = await run(temporal, tmp_path, 3, api)
    assert result.reason == "completed" and len(server.requests) == 4
    for request in server.requests:
        assert request.headers["content-type"] == "application/json"
        # Compact, key order kept, non-ASCII literal: the SDK's own encoding.
        assert request.raw_body == json.dumps(
            request.body, ensure_ascii=False, separators=(",", ":")).encode()
    last = server.requests[-1].body
    conversation = last["messages"] if api == "chat" else last["input"]
    assert "手順 2" in json.dumps(conversation, ensure_ascii=False)
    assert last["model"] == "m" and last["tools"][0]["name" if api == "responses"
                                                    else "type"]


def test_only_the_conversations_own_tool_outputs_are_found_in_its_bytes() -> None:
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": 'say "type":"function_call_output"'},
        {"type": "function_call", "call_id": "c1", "name": "t", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1",
         "output": '{"type":"function_call_output","call_id":"forged"}'},
        # An object in an item with the type as its own key: not a tool output.
        {"type": "message", "role": "assistant",
         "content": [{"type": "function_call_output", "text": "x"}]},
        {"call_id": "c2", "output": "key order of its own", "type": "function_call_output"},
    ]
    at, outputs = tool_outputs(pack(items))
    assert at == [2, 4] and outputs == [items[2], items[4]]
    assert unpack(pack(items)) == items
    assert json_array(pack(items)) == json.dumps(items, ensure_ascii=False,
                                                 separators=(",", ":")).encode()


async def test_a_recall_never_reads_another_run_held_under_a_reused_id(
        temporal: Client, tmp_path: Path) -> None:
    """A worker's cache holds the conversation of an earlier run under the same workflow
    id (a reused id, the model activity of the new run on another worker), with a call
    of the same call id: `recall_output` in the new run reads the new run's output (its
    history), never the old run's."""
    result, _, _ = await run(temporal, tmp_path, 2)
    cache = ConversationCache()
    forged = [{"type": "function_call_output", "call_id": "c0", "output": '"OLD RUN"'}]
    cache.put(result.workflow_id, ConversationMeta().extend(forged), pack(forged),
              run_id="the-old-run")
    tools = ToolActivities(test_tools, DemoDeps(data_dir=tmp_path), cache,
                           threads=ToolThreads(1))
    env = ActivityEnvironment(client=temporal)
    env.info = dataclasses.replace(env.info, workflow_id=result.workflow_id,
                                   workflow_run_id=result.run_id)
    req = ToolRequest(tool=RECALL_TOOL, call_id="back", step=3,
                      arguments={"call_id": "c0"}, idempotency_key="k",
                      max_result_bytes=4096)
    outcome = await env.run(tools.tool_execute, req)
    assert "OLD RUN" not in outcome.envelope.to_output()
    recalled = json.loads(outcome.envelope.to_output())
    assert recalled["status"] == "success", recalled
    assert recalled["data"]["output"]["data"]["sku"] == "A-000"
