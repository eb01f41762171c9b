"""What a new user building their own agent tripped on (issue 21): each fixed, each here.

Client API: `get_run` / `get_session` are awaited like `start`, and the run id keyword is
`id` as the CLI's `--id`. CLI: `run --task-queue`, another port as the README says, exit
codes of `cancel` and a second `session end`, a session's turn id refused to `run --id`.
Worker: the public logging setup, BOUNDLOOP_LOG_TOOL_ERRORS and the fingerprint hint in
a worker of one's own, deps of the wrong type refused at start, MCP commands named or
found. Client scripts end cleanly (`boundloop.run_client`). Shapes: the budget's event
order, a malformed call flagged, expected failures logged in one line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client

import boundloop
from boundloop.core.answer_shape import looks_like_tool_call
from boundloop.core.limits import Limits, RunSettings
from boundloop.core.loop import LoopState, begin_step, budget_refused
from boundloop.logs import TextFormatter
from boundloop.scripted.server import ScriptedModelServer
from boundloop.tools.demo import DemoDeps
from tests.conftest import RunScript
from tests.conftest import test_worker as make_worker
from tests.scripts import answer, body, call, resp
from tests.support.tools import tools as test_tools
from tests.test_cli import ROOT, cli, env_for

WAIT = 60.0


# --- the client API -------------------------------------------------------------------


async def test_get_run_is_awaited_like_start_and_the_id_keyword_is_id(
        temporal: Client, tmp_path: Path) -> None:
    server = ScriptedModelServer([answer("A-001: 12")])
    queue = f"nc-{uuid.uuid4().hex[:8]}"
    agent = boundloop.Agent(test_tools, model="scripted-model", allowed=["lookup_stock"],
                            task_queue=queue)
    wanted = f"nc-run-{uuid.uuid4().hex[:8]}"
    try:
        async with make_worker(temporal, queue, server.start(), tmp_path / "data"):
            started = await agent.start(temporal, "A-001?", id=wanted)
            assert started.id == wanted
            found = await boundloop.get_run(temporal, wanted)
            result = await asyncio.wait_for(found.result(), WAIT)
    finally:
        server.stop()
    assert (result.workflow_id, result.text) == (wanted, "A-001: 12")
    with pytest.raises(boundloop.RunNotFound):
        await boundloop.get_run(temporal, "no-such-run")
    with pytest.raises(boundloop.RunNotFound):
        await boundloop.get_session(temporal, "no-such-session")
    with pytest.raises(boundloop.RunNotFound, match="not a session"):
        await boundloop.get_session(temporal, wanted)


# --- the CLI --------------------------------------------------------------------------


async def test_task_queue_flag_turn_ids_and_exit_codes_from_the_cli(
        temporal: Client, tmp_path: Path) -> None:
    server = ScriptedModelServer([answer("first turn"), answer("the run's answer")])
    queue = f"nc-{uuid.uuid4().hex[:8]}"
    env = env_for(temporal, tmp_path)  # BOUNDLOOP_TASK_QUEUE unset: `boundloop`
    env.pop("BOUNDLOOP_TASK_QUEUE", None)
    agent_flags = ["--tools", "lookup_stock", "--model", "scripted-model",
                   "--task-queue", queue]
    try:
        async with make_worker(temporal, queue, server.start(), tmp_path / "data"):
            code, out, err = await cli("session", "start", "--json", *agent_flags, env=env)
            assert code == 0, err
            session = json.loads(out)["session_id"]

            # The session's next turn id, taken by a run, would fail the session's `say`.
            code, out, err = await cli("run", "hi", "--id", f"{session}/turn-1",
                                       *agent_flags, env=env)
            assert code == 2 and "session's turn id" in err, (out, err)
            assert "Traceback" not in err

            code, out, err = await cli("say", session, "hello", env=env)
            assert code == 0 and "first turn" in out, (out, err)
            # `status` of a session names the command that shows it (it was a traceback).
            code, out, err = await cli("status", session, env=env)
            assert (code, "Traceback" in err) == (2, False), (out, err)
            assert f"is a session, not a run: `boundloop session show {session}`" in err

            code, out, err = await cli("run", "A-001?", "--wait", *agent_flags, env=env)
            assert code == 0 and "the run's answer" in out, (out, err)

            code, out, err = await cli("session", "end", session, env=env)
            assert code == 0 and "ended (requested)" in out, (out, err)
            # Ending an ended session is what was asked: its final status, exit 0.
            code, out, err = await cli("session", "end", session, env=env)
            assert code == 0 and "ended (requested)" in out, (out, err)
            assert "already ended" in err
            code, out, err = await cli("status", session, "--json", env=env)  # ended too
            assert code == 2 and "is a session, not a run" in err, (out, err)

            code, out, err = await cli("cancel", "no-such-run", env=env)
            assert code == 2 and "no run 'no-such-run'" in err, (out, err)
            code, out, err = await cli("run", "hi", "--task-queue", " ", env=env)
            assert code == 2 and "--task-queue is empty" in err, (out, err)
    finally:
        server.stop()


async def test_another_port_works_as_the_readme_and_the_guide_say(tmp_path: Path) -> None:
    """The README and the guide say how to run on another port (`boundloop server --port
    P --ui-port Q`, then TEMPORAL_ADDRESS for every other command, `connect` in Python);
    done as they say, a run completes there."""
    from boundloop.testing import free_port
    from tests.test_worker_process import BOUNDLOOP, log_has, process

    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    guide = " ".join((ROOT / "docs" / "guide.md").read_text(encoding="utf-8").split())
    for page in (readme, guide):
        assert "`boundloop server --port 7300 --ui-port 8300`, then every other command" in page
        assert "TEMPORAL_ADDRESS=127.0.0.1:7300" in page
        assert "BOUNDLOOP_UI_URL=http://127.0.0.1:8300" in page  # the links the CLI prints
    assert '`boundloop.connect("127.0.0.1:7300")`' in guide
    port, ui_port = free_port(), free_port()
    env = {**env_for(None, tmp_path), "TEMPORAL_ADDRESS": f"127.0.0.1:{port}"}
    env.pop("BOUNDLOOP_UI_URL", None)
    log = tmp_path / "server.log"
    with process([BOUNDLOOP, "server", "--port", str(port), "--ui-port", str(ui_port),
                  "--data-dir", str(tmp_path / "server")], env, log) as server:
        await log_has(log, "Ctrl-C stops it.")
        await log_has(log, "Every other command")
        printed = " ".join(log.read_text(encoding="utf-8").split())
        assert f"Temporal dev server on 127.0.0.1:{port}, Web UI http://127.0.0.1:{ui_port}" \
            in printed
        # TEMPORAL_ADDRESS is already the server's: the server names what differs.
        assert (f"Every other command (and a worker) needs BOUNDLOOP_UI_URL=http://127.0.0.1:"
                f"{ui_port}:") in printed
        env["BOUNDLOOP_UI_URL"] = f"http://127.0.0.1:{ui_port}"
        code, out, err = await cli("run", "A-001とB-002の在庫をそれぞれ調べて。", "--model-script",
                                   "examples/scripts/stock_two_skus.json", env=env)
        assert code == 0 and "reason: completed" in out, (out, err)
        assert f"Web UI: http://127.0.0.1:{ui_port}/namespaces/default/workflows/" in out
        client = await boundloop.connect(f"127.0.0.1:{port}")
        assert [r async for r in client.list_workflows(page_size=10)]
        server.terminate()  # the server command stops its dev server on SIGTERM
        assert await asyncio.to_thread(server.wait, WAIT) == 0


CONNECT_SCRIPT = """
import sys
import boundloop
from boundloop.codec import EncryptionCodec

async def main():
    client = await boundloop.connect()
    print(client.service_client.config.target_host, client.namespace,
          isinstance(client.data_converter.payload_codec, EncryptionCodec))
    if sys.argv[1:] == ["count"]:
        await client.count_workflows()  # the server answers

boundloop.run_client(main)
"""


def test_connect_reads_the_settings_the_cli_reads_and_says_an_unreachable_server_in_one_line(
        temporal: Client, tmp_path: Path) -> None:
    """`boundloop.connect()` with no argument reads TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE,
    the TLS settings and the codec keys as the CLI does; a server it cannot reach, or a
    setting it cannot use, is one line through `run_client` with the CLI's exit code."""
    import base64
    import os

    def connect(extra: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in env_for(temporal, tmp_path).items()
               if not k.startswith(("TEMPORAL_", "BOUNDLOOP_CODEC"))}
        return subprocess.run([sys.executable, "-c", CONNECT_SCRIPT, *args], cwd=ROOT,
                              env={**env, **extra}, capture_output=True, text=True,
                              timeout=60)

    address = temporal.service_client.config.target_host
    key = base64.b64encode(os.urandom(32)).decode()
    done = connect({"TEMPORAL_ADDRESS": address, "BOUNDLOOP_CODEC_KEY": f"k1:{key}"},
                   "count")
    assert done.returncode == 0, done
    assert done.stdout.split() == [address, "default", "True"]
    done = connect({"TEMPORAL_ADDRESS": address, "TEMPORAL_NAMESPACE": "elsewhere"})
    assert done.returncode == 0 and done.stdout.split() == [address, "elsewhere", "False"]
    # Nothing set: the CLI's default address; no server answers on port 1.
    done = connect({"TEMPORAL_ADDRESS": "127.0.0.1:1"})
    assert done.returncode == 4, done
    assert done.stderr.strip() == (
        "error: cannot reach Temporal at 127.0.0.1:1 (connection refused): start it with "
        "`boundloop server` or set TEMPORAL_ADDRESS")
    # TLS from the environment: the dev server does not speak it.
    done = connect({"TEMPORAL_ADDRESS": address, "TEMPORAL_TLS": "1"})
    assert done.returncode == 4 and "Traceback" not in done.stderr, done
    assert done.stderr.startswith(f"error: cannot connect to Temporal at {address}: ")
    done = connect({"TEMPORAL_ADDRESS": address,
                    "TEMPORAL_TLS_CLIENT_CERT_PATH": str(tmp_path / "cert.pem")})
    assert done.returncode == 2 and done.stderr.strip() == (
        "error: mTLS needs both TEMPORAL_TLS_CLIENT_CERT_PATH and "
        "TEMPORAL_TLS_CLIENT_KEY_PATH"), done


# --- the worker -----------------------------------------------------------------------


def test_a_worker_refuses_deps_of_another_type_at_start(tmp_path: Path) -> None:
    env = {**env_for(None, tmp_path), "BOUNDLOOP_TOOLS": "tests.support.other_deps:tools",
           "OPENAI_BASE_URL": "http://127.0.0.1:1/v1"}
    done = subprocess.run([sys.executable, "-m", "boundloop.cli", "worker"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "take Clinic as ctx.deps" in lines[0] and "DemoDeps" in lines[0]
    # So does `boundloop run --model-script`, whose own worker is `boundloop worker`'s.
    done = subprocess.run([sys.executable, "-m", "boundloop.cli", "run", "hi", "--model-script",
                           "examples/scripts/stock_two_skus.json"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "take Clinic as ctx.deps" in done.stderr, done
    assert "Traceback" not in done.stderr
    # The same check for a worker of one's own, when it is built.
    from tests.support.other_deps import tools as clinic_tools

    agent = boundloop.Agent(clinic_tools, model="m")
    with pytest.raises(TypeError, match=r"take Clinic as ctx\.deps"):
        boundloop.Plugin(agent, deps=DemoDeps(data_dir=tmp_path))


async def test_a_toolset_for_any_deps_is_served_by_boundloop_worker(
        temporal: Client, tmp_path: Path) -> None:
    """`Toolset[typing.Any]()` takes any deps (no isinstance can check `Any`): `boundloop
    worker`'s deps check passes it, and a run of its tool completes."""
    from typing import Any

    assert boundloop.Toolset[Any]().deps_problem(DemoDeps(data_dir=tmp_path)) is None
    script = tmp_path / "script.json"
    script.write_text(json.dumps([resp(call("deps_kind", {}, "c1")), answer("DemoDeps")]),
                      encoding="utf-8")
    env = {**env_for(temporal, tmp_path), "BOUNDLOOP_TOOLS": "tests.support.any_deps:tools"}
    code, out, err = await cli("run", "which deps?", "--tools", "deps_kind", "--json",
                               "--model-script", str(script), env=env)
    assert code == 0 and "Traceback" not in err, (out, err)
    result = json.loads(out)
    assert (result["reason"], result["tool_executions"]) == ("completed", 1)


def test_a_wrong_mcp_command_fails_worker_start_naming_the_program(tmp_path: Path) -> None:
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"servers": [{"name": "time",
                                               "command": "mcp-server-tiem"}]}))
    env = {**env_for(None, tmp_path), "BOUNDLOOP_MCP_CONFIG": str(config),
           "OPENAI_BASE_URL": "http://127.0.0.1:1/v1"}
    done = subprocess.run([sys.executable, "-m", "boundloop.cli", "worker"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    assert "cannot start 'mcp-server-tiem': no such program" in done.stderr
    assert "worker started" not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


async def test_the_mcp_docs_command_runs_without_the_venv_on_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/mcp.md's `"command": "mcp-server-time"`, with a PATH that lacks .venv/bin
    (the worker started as `.venv/bin/boundloop worker`); the path given as a str."""
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"servers": [{"name": "time",
                                               "command": "mcp-server-time"}]}))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    servers = boundloop.load_mcp_config(str(config))
    declared = await asyncio.wait_for(boundloop.list_mcp_tools(servers), WAIT)
    assert "time__get_current_time" in [d.name for d in declared]


@pytest.mark.parametrize("opted_in", [True, False], ids=["messages", "no-messages"])
def test_own_worker_logs_with_the_public_setup_and_the_hint_can_be_followed(
        temporal: Client, tmp_path: Path, opted_in: bool) -> None:
    """A worker and client of one's own (tests/support/own_worker.py): the log line of
    the failed tool carries the fingerprint the run's event shows, and the exception's
    message only with BOUNDLOOP_LOG_TOOL_ERRORS=1; the script exits with its own status
    through `boundloop.run_client`."""
    env = env_for(temporal, tmp_path)
    env.pop("BOUNDLOOP_LOG_TOOL_ERRORS", None)
    if opted_in:
        env["BOUNDLOOP_LOG_TOOL_ERRORS"] = "1"
    done = subprocess.run([sys.executable, "-m", "tests.support.own_worker"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done
    result = boundloop.RunResult.model_validate_json(done.stdout.strip().splitlines()[-1])
    failed = [e for e in result.events if e.event == "tool_failed"]
    assert failed and failed[0].fingerprint
    logged = [line for line in done.stderr.splitlines() if "tool raised unexpectedly" in line]
    assert logged, done.stderr
    assert f"fingerprint={failed[0].fingerprint}" in logged[0]
    from tests.support.tools import SECRET_DETAIL

    # A tool's exception message is its output's kin: logged only when the operator opts in.
    assert (SECRET_DETAIL in done.stderr) is opted_in


# --- client scripts end cleanly -------------------------------------------------------


SCRIPT = """
import asyncio, os, sys
import boundloop

async def main():
    await boundloop.connect(os.environ["TEMPORAL_ADDRESS"])
    how = sys.argv[1]
    if how == "raise":
        raise ValueError("what went wrong")
    if how == "exit":
        sys.exit(3)
    if how == "interrupt":
        raise KeyboardInterrupt
    return 5

boundloop.run_client(main)
print("never printed")
"""


@pytest.mark.parametrize(("how", "code"), [
    ("return", 5), ("raise", 1), ("exit", 3), ("interrupt", 130)])
def test_run_client_exits_with_the_scripts_status_in_every_path(
        temporal: Client, tmp_path: Path, how: str, code: int) -> None:
    env = env_for(temporal, tmp_path)
    done = subprocess.run([sys.executable, "-c", SCRIPT, how], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == code, done
    assert "never printed" not in done.stdout
    assert "PyGILState" not in done.stderr and "Fatal Python error" not in done.stderr
    if how == "raise":
        assert "Traceback" in done.stderr and "ValueError: what went wrong" in done.stderr


# --- shapes of the result and the log ---------------------------------------------------


def test_a_budget_refusal_logs_no_request_that_was_never_sent() -> None:
    state = LoopState(settings=RunSettings(model="m", limits=Limits()),
                      allowed_tools=["lookup_stock"])
    begin_step(state, 0.0)
    begin_step(state, 0.0)  # step 2, refused by the budget before it is sent
    budget_refused(state, "budget 'acme' is spent")
    assert [(e.step, e.event) for e in state.events] == [
        (1, "model_requested"), (1, "budget_refused"), (1, "stopped:budget_limit")]


async def test_a_malformed_call_naming_a_known_tool_is_flagged(run_script: RunScript) -> None:
    garbled = ('{"name": "create_ticket", "arguments": {"title": "<tool_response>status":'
               ' "ok"}, "priority": ')
    assert looks_like_tool_call(garbled, ["create_ticket"])
    assert looks_like_tool_call(f"```json\n{garbled}\n```", ["create_ticket"])
    assert not looks_like_tool_call(garbled, ["lookup_stock"])  # names no tool we have
    assert not looks_like_tool_call('{"name": "Ada", "age": ', ["create_ticket"])
    # As the real model answered it: the run completes, flagged, and nothing ran.
    out = await run_script([answer(garbled)], tools=["lookup_stock", "create_ticket"])
    assert (out.result.reason, out.result.tool_executions, out.result.text) == (
        "completed", 0, garbled)
    assert out.result.answer_looks_like_tool_call is True


LLAMA_500 = body({"error": {"code": 500, "type": "server_error", "message":
                            "Value does not match the expected format"}}, status=500)


async def test_expected_failures_log_one_line_without_a_traceback(
        run_script: RunScript, caplog: pytest.LogCaptureFixture) -> None:
    """llama.cpp's HTTP 500, retried, and a tool's transient failure are expected: one
    line each, no SDK traceback; an unexpected tool exception still logs its traceback."""
    caplog.set_level(logging.DEBUG, logger="temporalio")
    out = await run_script([LLAMA_500, resp(call("flaky", {"x": "1"}, "c1")),
                            resp(call("explode", {"x": "2"}, "c2"))],
                           tools=["flaky", "explode"])
    assert out.result.reason == boundloop.StopReason.TOOL_ERROR
    traced = {getattr(r.exc_info[1], "type", type(r.exc_info[1]).__name__)
              for r in caplog.records if r.levelno >= logging.WARNING and r.exc_info}
    assert traced == {"UnexpectedToolError"}, traced  # the unexpected one keeps its traceback
    failed = [r for r in caplog.records if r.getMessage().startswith("model request failed")]
    assert failed and all(r.exc_info is None for r in failed)
    assert any("failure=http_500" in TextFormatter().format(r) for r in failed)
