"""The `boundloop` CLI as a user types it (real subprocesses, real dev server)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle

from boundloop import client as ops
from boundloop.scripted.server import ScriptedModelServer
from boundloop.testing import wait_until
from tests.conftest import RunScript
from tests.scripts import answer, call, resp

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "boundloop.cli"]


def env_for(temporal: Client | None, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env["BOUNDLOOP_DATA_DIR"] = str(tmp_path / "data")
    env["TEMPORAL_ADDRESS"] = (temporal.service_client.config.target_host if temporal
                               else "127.0.0.1:1")
    return env


async def cli(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *CLI, *args, cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_invalid_limit_is_refused_before_anything_starts(tmp_path: Path) -> None:
    code, _out, err = await cli("run", "hi", "--max-steps", "0", env=env_for(None, tmp_path))
    assert code == 2
    assert "max_steps" in err and "greater than 0" in err
    code, _out, err = await cli("run", "hi", "--limits", '{"token_threshold": true}',
                                env=env_for(None, tmp_path))
    assert code == 2 and "token_threshold" in err


async def test_run_with_model_script_prints_one_json_result(temporal: Client,
                                                            tmp_path: Path) -> None:
    code, out, err = await cli(
        "run", "A-001とB-002の在庫をそれぞれ調べて。", "--json",
        "--model-script", "examples/scripts/stock_two_skus.json", env=env_for(temporal, tmp_path))
    assert code == 0, err
    result = json.loads(out)
    assert (result["reason"], result["steps"], result["tool_executions"]) == ("completed", 3, 2)
    assert "12" in result["text"]


async def test_pending_approve_and_refusals_from_the_cli(
        run_script: RunScript, temporal: Client, tmp_path: Path) -> None:
    env = env_for(temporal, tmp_path)
    seen: dict[str, Any] = {}

    async def operator(handle: WorkflowHandle[Any, Any]) -> None:
        async def listed() -> bool:
            code, out, _ = await cli("pending", "--json", env=env)
            rows = [r for r in json.loads(out) if r["workflow_id"] == handle.id]
            seen["pending"] = rows
            return code == 0 and bool(rows)

        await wait_until(listed, timeout=60, interval=0.3)
        seen["unknown"] = await cli("approve", handle.id, "nope", env=env)
        seen["bad_args"] = await cli("approve", handle.id, "t1", "--args",
                                     '{"title": "", "description": "d", "priority": "p"}',
                                     env=env)
        seen["ok"] = await cli("approve", handle.id, "t1", "--as", "alice", env=env)
        seen["twice"] = await cli("reject", handle.id, "t1", "--reason", "late", env=env)
        seen["reject"] = await cli("reject", handle.id, "t2", "--reason", "duplicate", env=env)

    ticket = {"title": "補充", "description": "B-002", "priority": "high"}
    out = await run_script([resp(call("create_ticket", ticket, "t1"),
                                 call("create_ticket", {**ticket, "priority": "low"}, "t2")),
                            answer("done")], during=operator)
    assert out.result.reason == "completed"
    assert [(r["call_id"], r["tool"]) for r in seen["pending"]] == [
        ("t1", "create_ticket"), ("t2", "create_ticket")]
    code, _, err = seen["unknown"]
    assert code == 1 and "unknown call id 'nope'" in err
    code, _, err = seen["bad_args"]
    assert code == 1 and "edited arguments do not match" in err
    assert seen["ok"][0] == 0 and "approved" in seen["ok"][1]
    code, _, err = seen["twice"]
    assert code == 1 and "already approved by alice" in err
    assert seen["reject"][0] == 0 and "rejected" in seen["reject"][1]
    assert [t["priority"] for t in out.tickets()] == ["high"]


async def test_bad_inputs_get_one_clear_line_not_a_traceback(tmp_path: Path) -> None:
    env = env_for(None, tmp_path)
    not_json = tmp_path / "bad.json"
    not_json.write_text("{nope", encoding="utf-8")
    wrong_shape = tmp_path / "shape.json"
    wrong_shape.write_text('[{"bogus": 1}]', encoding="utf-8")
    cases = [
        (["run", "hi", "--limits", '"str"'], "--limits must be a JSON object"),
        (["run", "hi", "--policy", "[1, 2]"], "--policy must be a JSON object"),
        (["run", "hi", "--deadline-seconds", "1e300"], "deadline_seconds"),
        (["run", "   "], "the question is empty"),
        (["run", "hi", "--tools", ""], "--tools is empty"),
        (["run", "hi", "--limits", '{"per_tool_max_calls": {"nope": 1}}'],
         "name tools that do not exist"),
        (["run", "hi", "--model-script", str(tmp_path)], "is a directory"),
        (["run", "hi", "--model-script", str(not_json)], "is not valid JSON"),
        (["run", "hi", "--model-script", str(wrong_shape)], "does not follow the script format"),
        (["approve", "run", "call", "--args", "[1]"], "--args must be a JSON object"),
    ]
    for args, message in cases:
        code, out, err = await cli(*args, env=env)
        assert code == 2, (args, out, err)
        assert message in err, (args, err)
        assert "Traceback" not in err, (args, err)


def test_untrusted_text_is_printed_literally() -> None:
    from io import StringIO

    from rich.console import Console

    from boundloop.terminal import safe

    buffer = StringIO()
    console = Console(file=buffer, force_terminal=False, width=200)
    model_text = "see [/INST] and [link=http://x]y[/link] \x1b[31mRED"
    console.print(f"answer: {safe(model_text)}")
    printed = buffer.getvalue()
    assert "[/INST]" in printed and "[link=http://x]" in printed
    assert "\x1b" not in printed


def test_dev_server_refuses_a_busy_port(tmp_path: Path) -> None:
    import socket

    import pytest

    from boundloop.devserver import DevServer

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(RuntimeError, match="already in use"):
            DevServer(tmp_path, port=port, ui_port=None).start()


async def test_a_killed_model_script_run_is_terminated_not_orphaned(
        temporal: Client, tmp_path: Path) -> None:
    import signal

    from temporalio.client import WorkflowExecutionStatus

    script = tmp_path / "ticket.json"
    script.write_text(json.dumps([resp(call("create_ticket", {
        "title": "t", "description": "d", "priority": "low"}, "t1"))]), encoding="utf-8")
    run_id = f"cli-term-{tmp_path.name[-8:]}"
    proc = await asyncio.create_subprocess_exec(
        *CLI, "run", "make a ticket", "--id", run_id, "--model-script", str(script),
        cwd=ROOT, env=env_for(temporal, tmp_path), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    handle = temporal.get_workflow_handle(run_id)

    async def waiting() -> bool:
        try:
            return bool((await ops.query_status(handle)).pending)
        except Exception:
            return False

    await wait_until(waiting, timeout=60, interval=0.3)
    proc.send_signal(signal.SIGTERM)
    _out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert f"terminated {run_id}" in err.decode()
    assert (await handle.describe()).status == WorkflowExecutionStatus.TERMINATED


def unframed(printed: str) -> str:
    """Printed table text with borders, padding and line wraps taken out."""
    return "".join(ch for ch in printed if ch not in "│┃║ \n")


async def test_pending_status_and_watch_show_the_full_arguments_being_approved(
        run_script: RunScript, temporal: Client, tmp_path: Path) -> None:
    """Approving what you cannot read is no approval: nothing of the arguments is cut."""
    from io import StringIO

    from rich.console import Console

    from boundloop.contracts import Decision
    from boundloop.live import render

    env = env_for(temporal, tmp_path)
    description = "B-002の在庫が0です。" * 12 + "END-OF-DESCRIPTION"
    ticket = {"title": "B-002 補充依頼", "description": description, "priority": "high"}
    seen: dict[str, Any] = {}

    async def operator(handle: WorkflowHandle[Any, Any]) -> None:
        async def waiting() -> bool:
            return bool((await ops.query_status(handle)).pending)

        await wait_until(waiting, timeout=60, interval=0.2)
        seen["pending"] = await cli("pending", env=env)
        seen["status"] = await cli("status", handle.id, env=env)
        frame = StringIO()
        Console(file=frame, width=80).print(render(handle.id, await ops.query_status(handle)))
        seen["watch"] = frame.getvalue()
        await ops.decide(handle, Decision(call_id="t1", approve=True, approver="alice"))

    out = await run_script([resp(call("create_ticket", ticket, "t1")), answer("done")],
                           during=operator)
    assert out.result.reason == "completed"
    for name in ("pending", "status"):
        code, printed, err = seen[name]
        assert code == 0, err
        assert "…" not in printed, name
        assert unframed(description) in unframed(printed), name
    assert unframed(description) in unframed(seen["watch"])
    assert '"priority":"high"' in unframed(seen["watch"])


async def test_a_stopped_run_exits_3_and_status_shows_its_result(temporal: Client,
                                                                 tmp_path: Path) -> None:
    """A stopped run's workflow fails (RunStopped); the CLI still reads its RunResult."""
    from tests.test_honest_reasons import CALL_AS_TEXT, looping_stock_script

    script = tmp_path / "loop.json"
    script.write_text(json.dumps({"api": "responses", "turns": looping_stock_script(
        "responses")}, ensure_ascii=False), encoding="utf-8")
    env = env_for(temporal, tmp_path)
    code, out, err = await cli("run", "A-001とB-002の在庫をそれぞれ調べて。", "--json",
                               "--model-script", str(script), env=env)
    assert code == 3, err
    result = json.loads(out)
    assert (result["reason"], result["text"], result["answer_looks_like_tool_call"]) == (
        "max_steps", CALL_AS_TEXT, True)
    # `status` of a stopped run exits 3 like `run --wait` (one exit-code table).
    code, out, err = await cli("status", result["workflow_id"], "--json", env=env)
    assert code == 3, err
    assert json.loads(out) == result
    code, out, err = await cli("status", result["workflow_id"], env=env)
    assert code == 3, err
    assert "reason: max_steps" in out
    assert "the answer looks like a tool call" in out
    # A decision on a run that has ended is refused (1), not "no such run" (2).
    code, out, err = await cli("approve", result["workflow_id"], "c1", env=env)
    assert code == 1, err
    assert "has ended: it takes no more decisions" in err


async def test_a_failed_model_request_is_named_with_its_hint_and_exits_3(
        temporal: Client, tmp_path: Path) -> None:
    env = env_for(temporal, tmp_path)
    script = tmp_path / "unknown-model.json"
    script.write_text(json.dumps([{"status": 404, "body": {"error": {
        "message": "The model `gpt-9` does not exist (sk-secret-in-body)"}}}]),
        encoding="utf-8")
    run_id = f"cli-404-{tmp_path.name[-8:]}"
    code, out, err = await cli("run", "hi", "--id", run_id, "--model-script", str(script),
                               env=env)
    assert code == 3, (out, err)
    assert "reason: model_error" in out
    assert "model request failed: http_404 — HTTP 404 (model or route not found) from " \
           "127.0.0.1:" in out
    assert "hint: check the run's model name" in out
    assert "sk-secret" not in out + err
    # The same from `status` and `watch` of the ended run: kind, hint, exit 3.
    for command in ("status", "watch"):
        code, out, err = await cli(command, run_id, env=env)
        assert code == 3, (command, out, err)
        assert "model_failed:http_404" in out or command == "watch"
        assert "hint: check the run's model name" in out, (command, out)
    # What docs/guide.md shows `status` print (for its port).
    from tests.test_docs_outputs import shown_block, shown_matches

    shown = shown_block("docs/guide.md", "boundloop status boundloop-3f6c0a9d2e41")
    code, out, err = await cli("status", run_id, env=env)
    printed = [re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:11434", x) for x in out.splitlines()]
    assert shown_matches(printed, shown), (printed, shown)


async def test_a_worker_with_a_wrong_base_url_names_connection_refused(
        temporal: Client, tmp_path: Path) -> None:
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = env_for(temporal, tmp_path)
    env.update({"BOUNDLOOP_TASK_QUEUE": f"cli-{tmp_path.name[-8:]}",
                "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1", "OPENAI_API_KEY": "sk-x"})
    env.pop("BOUNDLOOP_TOOLS", None)
    log = tmp_path / "worker.log"
    with log.open("ab") as sink:
        worker = subprocess.Popen([*CLI, "worker"], cwd=ROOT, env=env, stdout=sink,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        code, out, err = await cli("run", "A-001の在庫は？", "--wait", env=env)
    finally:
        worker.kill()
        worker.wait(timeout=10)
    assert code == 3, (out, err)
    assert f"model request failed: connection_refused — connection refused by " \
           f"127.0.0.1:{port}" in out, out
    assert "hint: nothing listens there: check OPENAI_BASE_URL on the worker" in out
    assert "failure=connection_refused" in log.read_text(encoding="utf-8")


async def test_exit_codes_are_one_table(temporal: Client, tmp_path: Path) -> None:
    """0 completed/ok, 2 invalid input, 3 a run that did not complete (other tests),
    4 Temporal unreachable: the same for every command."""
    env = env_for(temporal, tmp_path)
    run_id = f"cli-ok-{tmp_path.name[-8:]}"
    code, _out, err = await cli("run", "A-001とB-002の在庫をそれぞれ調べて。", "--id", run_id,
                                "--model-script", "examples/scripts/stock_two_skus.json",
                                env=env)
    assert code == 0, err
    for args in (["status", run_id], ["watch", run_id], ["list"], ["pending"]):
        code, out, err = await cli(*args, env=env)
        assert code == 0, (args, out, err)
    code, _out, err = await cli("status", "no-such-run", env=env)
    assert code == 2 and "no run 'no-such-run'" in err
    away = env_for(None, tmp_path)  # TEMPORAL_ADDRESS=127.0.0.1:1
    for args in (["status", run_id], ["watch", run_id], ["list"], ["pending"],
                 ["approve", run_id, "c1"], ["reject", run_id, "c1", "--reason", "no"],
                 ["run", "hi"]):
        code, out, err = await cli(*args, env=away)
        assert code == 4, (args, out, err)
        assert "cannot reach Temporal at 127.0.0.1:1 (connection refused)" in err, (args, err)
        assert "Traceback" not in err


async def test_a_malformed_decision_is_refused_before_connecting(tmp_path: Path) -> None:
    """What the decision itself gets wrong is said in one line, exit 2, without Temporal
    (nothing listens on 127.0.0.1:1: a connection error would mean it was sent)."""
    away = env_for(None, tmp_path)
    cases = [
        (["approve", "r", "c1", "--when", 'priority != "high"'],
         "a `when` condition is only accepted with `remember`"),
        (["approve", "r", "c1", "--remember", "--when", "priority >"], "condition 'priority >'"),
        (["approve", "r", "c1", "--remember", "--when", "x" * 501], "when: String should have"),
        (["approve", "r", "c1", "--as", "a" * 101], "approver: String should have"),
        (["approve", "r", "", "--as", "alice"], "call_id: String should have"),
        (["reject", "r", "c1", "--reason", "r" * 1001], "reason: String should have"),
    ]
    for args, message in cases:
        code, out, err = await cli(*args, env=away)
        assert code == 2, (args, out, err)
        assert err.startswith("error: invalid decision: ") and message in err, (args, err)
        assert len(err.strip().splitlines()) == 1 and "Temporal" not in err, (args, err)


async def test_deciding_and_listing_while_no_worker_answers(tmp_path: Path) -> None:
    """No worker serves a run waiting for approval: `pending` says the run waits and that
    no worker answered (naming its task queue), not that nothing waits; `approve` records
    the decision (exit 7) and says it is applied when a worker picks the run up, and a
    second one names the first; `status`, `Run.status()` and `Session.show()` name the
    task queue a worker must poll. A worker started then applies the decision."""
    import pytest

    import boundloop
    from boundloop.testing import dev_server
    from boundloop.tools.demo import list_tickets
    from tests.conftest import test_worker

    server = ScriptedModelServer([resp(call("create_ticket", {
        "title": "t", "description": "d", "priority": "low"}, "t1")), answer("done")])
    queue = f"nobody-{tmp_path.name[-8:]}"
    data = tmp_path / "data"
    async with dev_server() as temporal:  # its own: `pending` lists only this run
        env = {**env_for(temporal, tmp_path), "BOUNDLOOP_TASK_QUEUE": queue}
        agent = boundloop.Agent(["create_ticket"], model="scripted-model", task_queue=queue)
        try:
            async with test_worker(temporal, queue, server.start(), data):
                run = await agent.start(temporal, "make a ticket")

                async def waiting() -> bool:
                    return bool((await run.status()).pending)

                await wait_until(waiting, timeout=60, interval=0.3)
            # The worker is gone; the run waits for approval.
            code, out, err = await cli("pending", env=env)
            assert code == 0, (out, err)
            assert "no calls are waiting" not in out
            assert "1 run(s) wait for approval, but no worker answered" in out
            assert f"polling task queue '{queue}'" in err
            code, out, err = await cli("approve", run.id, "t1", "--as", "alice", env=env)
            assert code == 7, (out, err)
            assert "t1: approved, recorded" in out and f"task queue '{queue}'" in out
            assert "takes effect when a worker picks the run up" in out
            code, out, err = await cli("approve", run.id, "t1", "--as", "alice", env=env)
            assert code == 7 and "already approved by alice" in out, (out, err)
            code, out, err = await cli("status", run.id, env=env)
            assert code == 1 and f"polling task queue '{queue}'" in err, (out, err)
            with pytest.raises(boundloop.NoWorker, match=f"task queue '{queue}'"):
                await run.status()
            session = await agent.session(temporal)
            with pytest.raises(boundloop.NoWorker, match=f"task queue '{queue}'"):
                await session.show()
            await session.handle.terminate()
            async with test_worker(temporal, queue, server.base_url, data):
                result = await asyncio.wait_for(run.result(), 120)
        finally:
            server.stop()
    assert (result.reason, result.tool_executions) == ("completed", 1)
    assert [t["title"] for t in list_tickets(data)] == ["t"]
