"""The model's context window as a limit, through the real workflow (dev server, a
worker, the scripted model over HTTP): a request that would not fit is never sent, the
operator's window per model may only be lowered by a run, and a provider's refusal of a
request as too long ends the run `context_exhausted`, not `model_error`."""

from __future__ import annotations

import asyncio
import json
import shlex
import uuid
from pathlib import Path
from typing import Any

import openai
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from boundloop import OperatorPolicy, Plugin, PolicyRefused, Worker
from boundloop.client import query_status, result_of
from boundloop.contracts import WORKFLOW_NAME, RunInput, RunResult
from boundloop.core.limits import Limits, RunSettings
from boundloop.exit_codes import ExitCode
from boundloop.scripted.server import ScriptedModelServer
from boundloop.tools.demo import DemoDeps
from tests.conftest import RUN_TIMEOUT, RunScript, workflow_task_failures
from tests.scripts import answer, call, resp
from tests.support.tools import tools as test_tools
from tests.test_cli import cli, env_for

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "examples" / "scripts"
#: A tool result of 1500 × "あ": over 4500 bytes, over 1125 tokens at 4 bytes a token.
BIG = [resp(call("huge", {"chars": 1500}, "h1")), answer("長い結果でした。")]


def _events(result: RunResult) -> list[str]:
    return [e.event for e in result.events]


async def _replayed_markers(handle: WorkflowHandle[Any, Any]) -> list[bytes]:
    """The run's history replays on this code; the details of its marker events."""
    history = await handle.fetch_history()
    replayer = Replayer(workflows=[], data_converter=pydantic_data_converter,
                        plugins=[Plugin(test_tools, deps=None)])
    assert (await replayer.replay_workflow(history)).replay_failure is None
    return [e.marker_recorded_event_attributes.SerializeToString() for e in history.events
            if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED]


def _asked_context_patch(markers: list[bytes]) -> bool:
    return any(b"context-window" in m for m in markers)


async def test_a_conversation_outgrowing_its_window_stops_before_the_request(
        run_script: RunScript) -> None:
    """The first request (instructions, one tool, the question: well under 1000 tokens)
    is sent; its usage is 120 tokens, the tool's result adds over 1125: the second
    request would not fit 1000 and is never sent."""
    out = await run_script(BIG, tools=["huge"],
                           limits=Limits(max_input_tokens=1000, max_result_bytes=8000))
    r = out.result
    assert len(out.requests) == 1
    assert (r.reason, r.steps, r.tool_executions) == ("context_exhausted", 1, 1)
    assert _events(r)[-2:] == ["context_exhausted", "stopped:context_exhausted"]
    detail = r.events[-2].detail or ""
    assert detail.startswith("estimated ") and detail.endswith(
        "> context window 1000 (max_input_tokens): the request was not sent")
    # The reported 120 tokens, and the result's 4500 bytes and more at 4 a token.
    assert int(detail.split()[1]) >= 120 + 4500 // 4
    # The same run with room for the result sends the second request and completes.
    roomy = await run_script(BIG, tools=["huge"],
                             limits=Limits(max_input_tokens=5000, max_result_bytes=8000))
    assert (roomy.result.reason, len(roomy.requests)) == ("completed", 2)
    # The patch is asked only by the run it stopped: both histories replay.
    assert _asked_context_patch(await _replayed_markers(out.handle))
    assert not _asked_context_patch(await _replayed_markers(roomy.handle))


async def test_the_output_cap_is_kept_free_in_the_window(run_script: RunScript) -> None:
    """A window the first request fits alone, but not with the room its max_output_tokens
    asks: nothing is sent at all."""
    out = await run_script([answer("never")], tools=["huge"],
                           limits=Limits(max_input_tokens=400, max_output_tokens=399))
    assert (out.result.reason, out.result.steps, len(out.requests)) == (
        "context_exhausted", 0, 0)
    assert "+ max_output_tokens 399" in (out.result.events[-2].detail or "")


@pytest.mark.parametrize("script", ["openai_context_length_exceeded.json",
                                    "llama_cpp_context_size_exceeded.json",
                                    "vllm_context_length_exceeded.json"])
async def test_a_providers_too_long_refusal_ends_context_exhausted(
        script: str, run_script: RunScript) -> None:
    turns = json.loads((SCRIPTS / script).read_text(encoding="utf-8"))["turns"]
    out = await run_script(turns)
    r = out.result
    assert (r.reason, r.steps, len(out.requests)) == ("context_exhausted", 1, 1)  # no retry
    failed = [e for e in r.events if e.event.startswith("model_failed:")]
    assert [e.event for e in failed] == ["model_failed:context_length_exceeded"]
    assert (failed[0].detail or "").startswith("HTTP 400 (over the model's context window")
    assert "model_error" not in _events(r)[-1]
    assert _asked_context_patch(await _replayed_markers(out.handle))


async def _start(temporal: Client, queue: str, limits: dict[str, Any]) -> Any:
    settings = RunSettings.model_validate({"model": "scripted-model", "limits": limits})
    inp = RunInput(question="在庫を調べて", tools=["huge"], settings=settings)
    return await temporal.start_workflow(WORKFLOW_NAME, inp, id=f"ctx-{uuid.uuid4().hex[:12]}",
                                         task_queue=queue, result_type=RunResult)


async def test_the_operators_window_per_model_may_only_be_lowered(
        temporal: Client, tmp_path: Path) -> None:
    """The operator's table gives scripted-model a 5000-token window: a run that sets
    nothing gets it, a run may lower it (and stops at its own lower window), a run asking
    more is refused at admission naming the field, before any model request."""
    model = ScriptedModelServer([BIG[0], *BIG])  # the tight run's call, the plain run's
    model.start()
    queue = f"q-{uuid.uuid4().hex[:8]}"
    operator = OperatorPolicy.model_validate({"context_windows": {"scripted-model": 5000}})
    client = openai.AsyncOpenAI(base_url=model.base_url, api_key="sk-test-not-real")
    try:
        async with Worker(temporal, test_tools, deps=DemoDeps(data_dir=tmp_path), model=client,
                          task_queue=queue, policy=operator):
            looser = await _start(temporal, queue, {"max_input_tokens": 100_000})
            with pytest.raises(PolicyRefused) as refused:
                await asyncio.wait_for(result_of(looser), RUN_TIMEOUT)
            assert model.requests == []
            tighter = await _start(temporal, queue, {"max_input_tokens": 1000,
                                                     "max_result_bytes": 8000})
            tight = await asyncio.wait_for(result_of(tighter), RUN_TIMEOUT)
            tight_status = await query_status(tighter)
            assert len(model.requests) == 1
            plain = await _start(temporal, queue, {"max_result_bytes": 8000})
            done = await asyncio.wait_for(result_of(plain), RUN_TIMEOUT)
            plain_status = await query_status(plain)
    finally:
        model.stop()
    assert refused.value.lines() == [
        "limits.max_input_tokens: the run asked 100000; the operator's policy: at most 5000 "
        "(the context window of scripted-model)"]
    assert tight.reason == "context_exhausted"
    assert tight_status.limits is not None and tight_status.limits.max_input_tokens == 1000
    assert (done.reason, done.steps) == ("completed", 2)
    assert plain_status.limits is not None and plain_status.limits.max_input_tokens == 5000
    # The status query estimates the next request against the window: the last reported
    # usage (100 in, 20 out), nothing added since.
    assert plain_status.context_tokens == 120
    assert len(model.requests) == 3
    for handle in (looser, tighter, plain):
        assert await workflow_task_failures(handle, temporal) == 0


async def test_the_cli_exits_with_the_context_exit_code(temporal: Client,
                                                        tmp_path: Path) -> None:
    env = env_for(temporal, tmp_path)
    code, out, err = await cli("run", "在庫を調べて", "--model-script",
                               str(SCRIPTS / "llama_cpp_context_size_exceeded.json"), env=env)
    assert code == int(ExitCode.CONTEXT_EXHAUSTED) == 8, err
    assert "reason: context_exhausted" in out
    assert ("model request failed: context_length_exceeded — HTTP 400 (over the model's "
            "context window: 5012 tokens asked, context window 4096)") in out
    # What the guide shows: the second request would not fit (its estimate, the window).
    from tests.test_docs_outputs import shown_block, shown_matches

    command = ('boundloop run "A-001とB-002の在庫をそれぞれ調べて。" --tools lookup_stock '
               "--max-input-tokens 700 --max-output-tokens 200 --model-script "
               "examples/scripts/stock_two_skus.json")
    shown = shown_block("docs/guide.md", command)
    assert shown[-1] == "(exit 8)"
    code, out, err = await cli(*shlex.split(command)[1:], env=env)
    assert code == 8, err
    run_id = out.split()[1]
    printed = [line.replace(run_id, "boundloop-47851f30d88d") for line in out.splitlines()
               if line.strip()]
    assert shown_matches(printed, shown[:-1]), (printed, shown)
