"""`boundloop session start|show|end`, `boundloop say` and `boundloop watch SESSION` as a
user types them (real subprocesses, real dev server, an in-process worker)."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

from temporalio.client import Client

from boundloop.scripted.server import ScriptedModelServer
from tests.conftest import test_worker as make_worker
from tests.scripts import call, resp
from tests.test_cli import cli, env_for
from tests.test_sessions import answer


async def test_session_commands_from_the_cli(temporal: Client, tmp_path: Path) -> None:
    server = ScriptedModelServer([
        resp(call("lookup_stock", {"sku": "A-001"}, "c1"), rid="r1"),
        answer("A-001: 12 in stock"),
        answer("You asked about A-001."),
    ])
    queue = f"scli-{uuid.uuid4().hex[:8]}"
    env = {**env_for(temporal, tmp_path), "BOUNDLOOP_TASK_QUEUE": queue}
    try:
        async with make_worker(temporal, queue, server.start(), tmp_path / "data"):
            code, out, err = await cli("session", "start", "--json", "--tools", "lookup_stock",
                                       "--model", "scripted-model", "--max-turns", "5",
                                       env=env)
            assert code == 0, err
            session_id = json.loads(out)["session_id"]

            code, out, err = await cli("say", session_id, "A-001 の在庫は?", env=env)
            assert code == 0, err
            assert "reason: completed" in out and "A-001: 12 in stock" in out
            assert "tool_success" in out

            code, out, err = await cli("say", session_id, "何を聞いた?", "--json", env=env)
            assert code == 0, err
            second = json.loads(out)
            assert second["text"] == "You asked about A-001."
            assert second["workflow_id"] == f"{session_id}/turn-2"

            code, out, err = await cli("session", "show", session_id, "--json", env=env)
            assert code == 0, err
            shown = json.loads(out)
            assert (shown["status"], shown["turns"], shown["tool_executions"]) == (
                "idle", 2, 1)

            code, out, err = await cli("session", "show", session_id, env=env)
            assert code == 0 and "idle · turns 2 of 5" in out, (out, err)

            code, out, err = await cli("session", "end", session_id, env=env)
            assert code == 0 and "ended (requested)" in out, (out, err)

            code, out, err = await cli("say", session_id, "まだ?", env=env)
            assert code == 1 and "has ended" in err, (out, err)

            code, out, err = await cli("session", "end", session_id, env=env)
            assert code == 0 and "already ended" in err, (out, err)

            code, out, err = await asyncio.wait_for(
                cli("watch", session_id, env=env), timeout=60)
            assert code == 0 and "ended (requested)" in out, (out, err)

            code, out, err = await cli("say", "no-such-session", "hi", env=env)
            assert code == 2 and "no-such-session" in err, (out, err)
    finally:
        server.stop()
    assert server.violations == []


async def test_session_start_takes_a_budget_as_run_does(temporal: Client, tmp_path: Path) -> None:
    """Under an operator's policy whose budget is required, a CLI session's turns are
    admitted when the session names that budget (`session start --budget`), as `run
    --budget` is; without it each turn is refused naming the budget."""
    import openai

    import boundloop
    from boundloop.tools.demo import DemoDeps
    from tests.support.tools import tools as test_tools

    key = f"team-{uuid.uuid4().hex[:8]}"
    server = ScriptedModelServer([answer("A-001: 12 in stock")])
    queue = f"sbud-{uuid.uuid4().hex[:8]}"
    env = {**env_for(temporal, tmp_path), "BOUNDLOOP_TASK_QUEUE": queue}
    policy = boundloop.OperatorPolicy.model_validate({"budget": {"key": key,
                                                                 "required": True}})
    model = openai.AsyncOpenAI(base_url=server.start(), api_key="sk-test-not-real")
    flags = ["--tools", "lookup_stock", "--model", "scripted-model"]
    try:
        async with boundloop.Worker(temporal, test_tools, model=model, task_queue=queue,
                                    deps=DemoDeps(data_dir=tmp_path / "data"), policy=policy):
            code, out, err = await cli("budget", "set", key, "--tokens", "100000", env=env)
            assert code == 0, (out, err)
            code, out, err = await cli("session", "start", "--json", *flags, "--budget", key,
                                       "--max-output-tokens", "256", env=env)
            assert code == 0, (out, err)
            session_id = json.loads(out)["session_id"]
            code, out, err = await cli("say", session_id, "A-001 の在庫は?", env=env)
            assert code == 0 and "A-001: 12 in stock" in out, (out, err)
            code, out, err = await cli("session", "start", "--json", *flags, env=env)
            assert code == 0, (out, err)
            code, out, err = await cli("say", json.loads(out)["session_id"], "hi", env=env)
            # Refused by the policy as a run is: its refusal, exit 2 (`run` prints the same).
            assert code == 2, (out, err)
            assert "was refused by the operator's policy" in err
            assert (f"refused: budget: the run asked none; the operator's policy: required: "
                    f"{key}") in " ".join(err.split()), err
    finally:
        server.stop()
