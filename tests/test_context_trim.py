"""The `trim` context strategy through the real workflow (dev server, a worker whose
operator policy allows it, the scripted model over HTTP): a request that would not fit
its window is sent with its oldest tool outputs as stubs, the newest `context_keep` ones
verbatim, and the built-in `recall_output` tool reads a trimmed output again.

The scripted turns report no usage (`missing_usage: estimate`), so the estimate is the
request's own bytes: what trimming frees is what the next estimate loses.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from io import StringIO
from pathlib import Path
from typing import Any

import openai
import pytest
from rich.console import Console
from temporalio.client import Client

from boundloop import OperatorPolicy, PolicyRefused, Worker
from boundloop.client import query_status, result_of
from boundloop.contracts import WORKFLOW_NAME, RunInput, RunResult
from boundloop.core.context import RECALL_TOOL, TRIMMED_EVENT
from boundloop.core.limits import Limits, Policy, RunSettings
from boundloop.live import render
from boundloop.scripted.server import ScriptedModelServer
from boundloop.tools.demo import DemoDeps
from tests.conftest import RUN_TIMEOUT, workflow_task_failures
from tests.scripts import answer, call, chat, chat_call, resp
from tests.support.tools import tools as test_tools

#: Tool calls before the recall: each output is about 950 bytes (300 × "あ" and more).
CALLS = 6
#: 1500 tokens: five outputs fit at 4 bytes a token, six do not.
WINDOW = 1500
KEEP = 2


def script(api: str, recalls: int = 1) -> list[dict[str, Any]]:
    def turn(name: str, args: dict[str, Any], call_id: str) -> dict[str, Any]:
        if api == "chat":
            return chat(calls=[chat_call(name, args, call_id)], usage=None)
        return resp(call(name, args, call_id), usage=None, rid=f"r-{call_id}")

    calls = [turn("huge", {"chars": 300 + i}, f"c{i}") for i in range(1, CALLS + 1)]
    recall = [turn(RECALL_TOOL, {"call_id": "c1"}, f"back{n or ''}") for n in range(recalls)]
    done = chat("読み直しました。", usage=None) if api == "chat" else answer(
        "読み直しました。", usage=None)
    return [*calls, *recall, done]


def outputs(body: dict[str, Any], api: str) -> dict[str, str]:
    """call_id -> output text, in the conversation's order, from a request body."""
    if api == "chat":
        return {m["tool_call_id"]: m["content"] for m in body["messages"]
                if m.get("role") == "tool"}
    return {i["call_id"]: i["output"] for i in body["input"]
            if i.get("type") == "function_call_output"}


async def run(temporal: Client, tmp_path: Path, api: str, policy: Policy,
              operator: OperatorPolicy, cache: int = 512, recalls: int = 1,
              window: int = WINDOW) -> tuple[RunResult, ScriptedModelServer, Any]:
    server = ScriptedModelServer(script(api, recalls))
    queue = f"trim-{uuid.uuid4().hex[:8]}"
    client = openai.AsyncOpenAI(base_url=server.start(), api_key="sk-test-not-real")
    settings = RunSettings(model="scripted-model", api=api,  # type: ignore[arg-type]
                           limits=Limits(max_steps=CALLS + 5, max_tool_executions=CALLS + 4,
                                         max_input_tokens=window, token_threshold=10**6),
                           policy=policy)
    inp = RunInput(question="大きな結果を集めて", tools=["huge"], settings=settings)
    try:
        async with Worker(temporal, test_tools, deps=DemoDeps(data_dir=tmp_path),
                          model=client, task_queue=queue, policy=operator,
                          conversation_cache=cache):
            handle = await temporal.start_workflow(
                WORKFLOW_NAME, inp, id=f"trim-{queue}", task_queue=queue,
                result_type=RunResult)
            result = await asyncio.wait_for(result_of(handle), RUN_TIMEOUT)
            status = await query_status(handle)
    finally:
        server.stop()
    assert await workflow_task_failures(handle, temporal) == 0
    for request in server.requests:  # stubs among cached bytes: the SDK's encoding
        assert request.raw_body == json.dumps(request.body, ensure_ascii=False,
                                              separators=(",", ":")).encode()
    return result, server, status


TRIMS = Policy(missing_usage="estimate", context="trim", context_keep=KEEP)
ALLOWS = OperatorPolicy(context="trim", context_keep=KEEP)


@pytest.mark.parametrize(("api", "cache"), [("responses", 512), ("chat", 512),
                                            ("responses", 0)])
async def test_trim_keeps_the_newest_outputs_and_recall_reads_an_old_one(
        temporal: Client, tmp_path: Path, api: str, cache: int) -> None:
    """With a cold cache (0), every request and the recall read the run's history."""
    result, server, status = await run(temporal, tmp_path, api, TRIMS, ALLOWS, cache)
    # Every call kept an output, in both APIs' rules (the server checks each request).
    assert server.violations == []
    assert (result.reason, result.steps, result.tool_executions) == (
        "completed", CALLS + 2, CALLS + 1)
    trimmed = [e for e in result.events if e.event == TRIMMED_EVENT]
    assert trimmed, [e.event for e in result.events]
    before, after = (int(n) for n in (trimmed[0].detail or "").split("estimated ")[1]
                     .split(" input")[0].split(" -> "))
    assert after < before and before > WINDOW >= after
    bodies = [r.body for r in server.requests]
    # The first output, as it was first sent, whole.
    original = outputs(bodies[1], api)["c1"]
    assert json.loads(original)["data"]["text"] == "あ" * 301
    last = outputs(bodies[-1], api)
    ids = list(last)
    assert ids == [f"c{i}" for i in range(1, CALLS + 1)] + ["back"]
    # The newest KEEP outputs verbatim; older ones stubs naming how to get them back.
    for call_id in ids[-KEEP:-1]:
        assert json.loads(last[call_id])["data"]["text"].startswith("あ")
    for call_id in ids[:-KEEP]:
        stub = json.loads(last[call_id])
        assert stub["status"] == "trimmed", (call_id, stub)
        assert RECALL_TOOL in stub["message"] and repr(call_id) in stub["message"]
    # recall_output returned the first output whole (a tool execution like any other).
    recalled = json.loads(last["back"])
    assert recalled["status"] == "success"
    assert recalled["data"] == {"call_id": "c1", "output": json.loads(original)}
    assert [e.tool for e in result.events if e.event == "tool_success"][-1] == RECALL_TOOL
    # `status` and `watch` show the next request's estimate against the window.
    assert status.context_tokens is not None
    frame = StringIO()
    Console(file=frame, width=100).print(render("run", status))
    assert f"~{status.context_tokens} / {WINDOW} tokens" in frame.getvalue()


async def test_a_run_may_not_trim_where_the_operator_does_not_allow_it(
        temporal: Client, tmp_path: Path) -> None:
    with pytest.raises(PolicyRefused) as refused:
        await run(temporal, tmp_path, "responses", TRIMS, OperatorPolicy())
    assert refused.value.lines() == [
        "policy.context: the run asked trim; the operator's policy: stop (runs may not "
        "trim their conversation)"]


async def test_recall_is_a_tool_call_under_the_identical_call_limit(
        temporal: Client, tmp_path: Path) -> None:
    """The same recall three times with max_identical_calls 2 (the default): the third is
    blocked like any identical call, and the run ends naming that limit."""
    result, server, _ = await run(temporal, tmp_path, "responses", TRIMS, ALLOWS, recalls=3)
    assert server.violations == []
    assert result.reason == "max_identical_calls"
    recalled = [e for e in result.events if e.tool == RECALL_TOOL]
    assert [(e.event, e.call_id) for e in recalled] == [
        ("tool_success", "back"), ("tool_success", "back1"), ("blocked_identical", "back2")]
    assert result.tool_executions == CALLS + 2


async def test_a_request_no_trim_makes_fit_is_never_sent_and_not_a_step(
        temporal: Client, tmp_path: Path) -> None:
    """A 700-token window: the third request holds two outputs the run keeps verbatim
    (KEEP) and nothing older to trim. It is never sent: the run ends context_exhausted
    with the event saying why, as under `stop`, not as a provider's refusal, and the
    step it began is not counted."""
    result, server, _ = await run(temporal, tmp_path, "responses", TRIMS, ALLOWS,
                                  window=700)
    assert result.reason == "context_exhausted"
    assert len(server.requests) == 2 and result.steps == 2
    names = [e.event for e in result.events]
    assert not [n for n in names if n.startswith("model_failed")], names
    assert names[-2:] == ["context_exhausted", "stopped:context_exhausted"]
    assert names.count("model_requested") == 2
    assert "even with every tool output but the newest 2 trimmed" in (
        result.events[-2].detail or "")
