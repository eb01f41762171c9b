"""A tool author can debug an unexpected exception from the worker's log: its traceback
(frames, types) is logged there, its message only when the operator opts in; neither
reaches the model, the RunResult or the history."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from pathlib import Path

import openai
import pytest
from temporalio.client import Client

import boundloop
from boundloop.logs import TextFormatter
from boundloop.scripted.server import ScriptedModelServer
from boundloop.tools.demo import DemoDeps
from tests.conftest import RunScript
from tests.scripts import answer, call, resp
from tests.support.tools import SECRET_DETAIL, executions
from tests.support.tools import tools as test_tools

WAIT = 60.0


async def explode_once(client: Client, tmp_path: Path, *, messages: bool,
                       ) -> tuple[boundloop.RunResult, str, str]:
    """Run `explode` on a worker; (RunResult, history text, logged traceback)."""
    model = ScriptedModelServer([resp(call("explode", {"x": "1"}, "c1"))])
    queue = f"dbg-{uuid.uuid4().hex[:8]}"
    worker = boundloop.Worker(
        client, test_tools, deps=DemoDeps(data_dir=tmp_path), task_queue=queue,
        model=openai.AsyncOpenAI(base_url=model.start(), api_key="sk-x"),
        log_tool_error_messages=messages)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger().addHandler(handler)
    try:
        async with worker:
            run = await boundloop.start(client, "explode", tools=["explode"],
                                        model="scripted-model", task_queue=queue)
            result = await asyncio.wait_for(run.result(), WAIT)
    finally:
        logging.getLogger().removeHandler(handler)
        model.stop()
    history = json.dumps([str(e) async for e in run.handle.fetch_history_events()])
    logged = [r for r in records if r.getMessage().startswith("tool raised unexpectedly")]
    assert logged, "the unexpected exception was not logged"
    return result, history, TextFormatter().format(logged[0])


@pytest.mark.parametrize("messages", [False, True], ids=["default", "opted-in"])
async def test_unexpected_tool_exception_is_logged_with_its_traceback(
        temporal: Client, tmp_path: Path, messages: bool) -> None:
    result, history, line = await explode_once(temporal, tmp_path, messages=messages)
    assert result.reason == boundloop.StopReason.TOOL_ERROR
    # The frames point at the tool's own code: file, line, function and source line.
    assert "tests/support/tools.py" in line and "in explode" in line
    assert "raise RuntimeError(SECRET_DETAIL)" in line and "RuntimeError" in line
    assert (SECRET_DETAIL in line) is messages
    assert "hunter2" not in result.model_dump_json()
    assert "hunter2" not in history and "support/tools.py" not in history


async def test_a_result_json_cannot_carry_stops_the_run_after_one_execution(
        run_script: RunScript) -> None:
    """A tool returning something that is not JSON ran (its side effect is done): it is
    never run again for that, and the run stops with tool_error (a tool bug)."""
    out = await run_script([resp(call("opaque", {"size": 1, "tag": "a"}, "c1")),
                            answer("never asked")], tools=["opaque"])
    assert executions(out.data_dir) == 1
    assert (out.result.reason, out.result.tool_executions) == ("tool_error", 1)
    assert [e.event for e in out.result.events if e.tool == "opaque"] == ["tool_failed"]
    assert len(out.requests) == 1  # the model is not asked again
