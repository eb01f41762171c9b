"""A run's starter cannot write the worker's log: a workflow id holding a newline (and a
bidi override) is written escaped on the record's own line, through a real `boundloop
worker` process logging text to its stderr."""

from __future__ import annotations

import contextlib
import re
import sys
import uuid
from pathlib import Path

from temporalio.client import Client
from temporalio.service import RPCError

from boundloop.contracts import WORKFLOW_NAME, RunInput, RunResult
from boundloop.core.limits import Policy, RunSettings
from boundloop.scripted.server import ScriptedModelServer
from tests.scripts import answer, call, resp
from tests.test_worker_process import log_has, process, worker_env

FORGED = "2026-12-03 10:00:00,000 INFO boundloop.console console decision approver=alice"


async def test_a_newline_in_a_workflow_id_cannot_write_a_log_line_of_its_own(
        temporal: Client, tmp_path: Path) -> None:
    model = ScriptedModelServer([resp(call("lookup_stock", {"sku": "A-001"}, "c1")),
                                 answer("12 in stock.")])
    queue = f"logs-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "worker.log"
    env = worker_env(tmp_path, TEMPORAL_ADDRESS=temporal.service_client.config.target_host,
                     BOUNDLOOP_TASK_QUEUE=queue, OPENAI_BASE_URL=model.start(),
                     OPENAI_API_KEY="sk-test-not-real", BOUNDLOOP_LOG_FORMAT="text")
    workflow_id = f"run-{uuid.uuid4().hex[:6]}\n{FORGED}\u202e"
    try:
        with process([sys.executable, "-m", "boundloop.worker.main"], env, log):
            await log_has(log, "worker started")
            handle = await temporal.start_workflow(
                WORKFLOW_NAME, RunInput(question="A-001?", tools=["lookup_stock"],
                                        settings=RunSettings(model="scripted-model",
                                                             policy=Policy())),
                id=workflow_id, task_queue=queue, result_type=RunResult)
            # How the run goes on is not the point: its first log lines are.
            await log_has(log, " step started ")
            with contextlib.suppress(RPCError):  # ended by itself already
                await handle.terminate("test finished")
    finally:
        model.stop()
    lines = log.read_text(encoding="utf-8").splitlines()
    # The id, escaped, on the lines that name the run; no line is the forged one.
    shown = workflow_id.replace("\n", "\\n").replace("\u202e", "\\u202e")
    naming = [x for x in lines if f"workflow_id={shown}" in x]
    assert any(" step started " in x for x in naming), lines
    assert not [x for x in lines if x.startswith(FORGED[:19])], lines
    assert not [x for x in lines if "\u202e" in x], lines
    # Every line at the margin is a record of its own: time, level, logger.
    record = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ \S+ ")
    assert all(record.match(x) or x.startswith(" ") for x in lines if x.strip()
               and not x.startswith(("scripted model", "warning:"))), lines
