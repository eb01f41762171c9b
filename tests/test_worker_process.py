"""The worker as an operator runs it: a real `boundloop worker` / `python -m boundloop.worker.main`
process, its log read from its stderr."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from temporalio.client import Client

from boundloop.client import decide, query_status
from boundloop.contracts import WORKFLOW_NAME, Decision, RunInput, RunResult
from boundloop.core.limits import Policy, RunSettings
from boundloop.scripted.server import ScriptedModelServer
from boundloop.testing import wait_until
from tests.scripts import answer, call, resp

ROOT = Path(__file__).resolve().parent.parent
BOUNDLOOP = str(Path(sys.executable).parent / "boundloop")
TICKET = {"title": "補充", "description": "B-002", "priority": "high"}
WAIT = 60.0


def worker_env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OPENAI_", "BOUNDLOOP_", "TEMPORAL_"))}
    env.update({"BOUNDLOOP_DATA_DIR": str(tmp / "data"), "BOUNDLOOP_TOOLS": "",
                "BOUNDLOOP_STICKY_TIMEOUT_SECONDS": "1", **extra})
    return env


@contextmanager
def process(command: list[str], env: dict[str, str],
            log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process with stdout+stderr in `log`, killed (by its pid) when the block ends."""
    with log.open("ab") as out:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


async def log_has(log: Path, text: str, count: int = 1) -> None:
    async def seen() -> bool:
        return log.read_text(encoding="utf-8", errors="replace").count(text) >= count
    await wait_until(seen, timeout=WAIT, interval=0.1)


async def park(temporal: Client, model: ScriptedModelServer, queue: str) -> Any:
    """Start a run whose first turn asks for `create_ticket`; return once it waits for
    approval (runs start one after the other: the script is one shared sequence)."""
    model.append(resp(call("create_ticket", TICKET, "t1")))
    inp = RunInput(question="チケットを作って", tools=["create_ticket"],
                   settings=RunSettings(model="scripted-model", policy=Policy()))
    handle = await temporal.start_workflow(
        WORKFLOW_NAME, inp, id=f"evict-{uuid.uuid4().hex[:12]}", task_queue=queue,
        result_type=RunResult)

    async def parked() -> bool:
        return bool((await query_status(handle)).pending)
    await wait_until(parked, timeout=WAIT, interval=0.1)
    return handle


async def approve_all(handles: list[Any], model: ScriptedModelServer) -> list[RunResult]:
    for handle in handles:
        model.append(answer("done"))
        await asyncio.wait_for(decide(handle, Decision(
            call_id="t1", approve=True, approver="alice")), WAIT)
    return [await asyncio.wait_for(h.result(), WAIT) for h in handles]


async def test_runs_parked_on_approval_survive_eviction_and_shutdown_without_workflow_api_errors(
        temporal: Client, tmp_path: Path) -> None:
    """More runs wait for approval than the worker caches (each decision replays an
    evicted run), then the worker shuts down with runs still parked: the closed
    coroutines' cleanup must not call workflow APIs, and every run still finishes."""
    model = ScriptedModelServer([])
    queue = f"evict-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "worker.log"
    env = worker_env(tmp_path, TEMPORAL_ADDRESS=temporal.service_client.config.target_host,
                     BOUNDLOOP_TASK_QUEUE=queue, OPENAI_BASE_URL=model.start(),
                     OPENAI_API_KEY="sk-test-not-real", BOUNDLOOP_MAX_CACHED_WORKFLOWS="2")
    try:
        with process([sys.executable, "-m", "boundloop.worker.main"], env, log) as worker:
            await log_has(log, "worker started")
            first = [await park(temporal, model, queue) for _ in range(6)]
            results = await approve_all(first, model)
            later = [await park(temporal, model, queue) for _ in range(2)]
            worker.send_signal(signal.SIGINT)  # a graceful stop, as Ctrl-C or systemd
            assert worker.wait(timeout=WAIT) == 0
        with process([sys.executable, "-m", "boundloop.worker.main"], env,
                     tmp_path / "worker2.log"):
            results += await approve_all(later, model)
    finally:
        model.stop()
    assert [r.reason for r in results] == ["completed"] * 8
    text = log.read_text(encoding="utf-8", errors="replace")
    assert "Not in workflow event loop" not in text, text[-3000:]
    assert "Exception ignored" not in text, text[-3000:]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def forward(port: int, target: str) -> asyncio.Server:
    """A TCP forwarder on `port` to `target` (host:port): Temporal "coming up" there."""
    host, _, target_port = target.rpartition(":")

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(host, int(target_port))
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    return await asyncio.start_server(handle, "127.0.0.1", port)


async def test_worker_started_before_temporal_retries_in_one_line_then_connects(
        temporal: Client, tmp_path: Path) -> None:
    port = closed_port()
    log = tmp_path / "worker.log"
    env = worker_env(tmp_path, TEMPORAL_ADDRESS=f"127.0.0.1:{port}",
                     BOUNDLOOP_TASK_QUEUE=f"late-{uuid.uuid4().hex[:8]}",
                     OPENAI_BASE_URL="http://127.0.0.1:9/v1", BOUNDLOOP_MODEL="gpt-4.1")
    retry = f"cannot reach Temporal at 127.0.0.1:{port} (connection refused); retrying in"
    with process([BOUNDLOOP, "worker"], env, log) as worker:
        await log_has(log, retry, count=2)  # keeps retrying
        assert worker.poll() is None
        server = await forward(port, temporal.service_client.config.target_host)
        try:
            await log_has(log, "worker started")
            assert worker.poll() is None
        finally:
            server.close()
    text = log.read_text(encoding="utf-8")
    assert "Traceback" not in text, text
    retries = [line for line in text.splitlines() if "cannot reach Temporal" in line]
    assert len(retries) >= 2 and all(retry in line for line in retries), retries
    # BOUNDLOOP_MODEL is read where runs start: a worker given it says so.
    assert "BOUNDLOOP_MODEL is set in this worker's environment" in text


async def test_worker_refuses_a_base_url_without_a_scheme_in_one_line(tmp_path: Path) -> None:
    env = worker_env(tmp_path, TEMPORAL_ADDRESS=f"127.0.0.1:{closed_port()}",
                     OPENAI_BASE_URL="localhost:11434/v1")
    for command in ([BOUNDLOOP, "worker"], [sys.executable, "-m", "boundloop.worker.main"]):
        proc = await asyncio.create_subprocess_exec(
            *command, cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), timeout=WAIT)
        lines = [line for line in (out + err).decode().splitlines() if line.strip()]
        assert proc.returncode == 2, lines
        assert lines == ["error: OPENAI_BASE_URL must be an http:// or https:// URL such as "
                         "http://127.0.0.1:11434/v1, not 'localhost:11434/v1'"], lines


def test_an_empty_setting_means_unset(monkeypatch: Any) -> None:
    from boundloop.settings import Settings

    monkeypatch.setenv("OPENAI_BASE_URL", "")  # docker-compose's ${OPENAI_BASE_URL:-}
    monkeypatch.setenv("BOUNDLOOP_API", "")
    monkeypatch.setenv("TEMPORAL_ADDRESS", "")
    settings = Settings()
    assert settings.openai_base_url is None and not settings.model_configured
    assert (settings.api, settings.temporal_address) == ("responses", "127.0.0.1:7233")


USER_TOOLS = '''
from boundloop import Toolset

tools = Toolset()


@tools.tool()
def shout(text: str) -> str:
    """The text in capitals."""
    return text.upper()
'''


async def test_the_cli_starts_a_run_of_tools_only_its_worker_can_import(
        temporal: Client, tmp_path: Path) -> None:
    """`boundloop run --tools` needs no toolset on the client: the worker (which imports
    it) checks the names, and refuses an unknown one in a sentence naming what it serves."""
    from tests.test_cli import cli, env_for

    (tmp_path / "desk").mkdir()
    (tmp_path / "desk" / "desk_tools.py").write_text(USER_TOOLS, encoding="utf-8")
    model = ScriptedModelServer([resp(call("shout", {"text": "hi"}, "c1")), answer("HI")])
    queue = f"desk-{uuid.uuid4().hex[:8]}"
    env = worker_env(tmp_path, TEMPORAL_ADDRESS=temporal.service_client.config.target_host,
                     BOUNDLOOP_TASK_QUEUE=queue, OPENAI_BASE_URL=model.start(),
                     OPENAI_API_KEY="sk-test-not-real", BOUNDLOOP_TOOLS="desk_tools:tools",
                     PYTHONPATH=str(tmp_path / "desk"))
    client_env = {**env_for(temporal, tmp_path), "BOUNDLOOP_TOOLS": "desk_tools:tools",
                  "BOUNDLOOP_TASK_QUEUE": queue}
    try:
        with process([BOUNDLOOP, "worker"], env, tmp_path / "worker.log"):
            await log_has(tmp_path / "worker.log", "worker started")
            code, out, err = await cli("run", "shout hi", "--tools", "shout", "--model",
                                       "scripted-model", "--wait", "--json", env=client_env)
            assert code == 0, (out, err)
            result = RunResult.model_validate_json(out)
            assert (result.reason, result.tool_executions, result.text) == ("completed", 1, "HI")
            waited = await cli("run", "hi", "--tools", "shout,whisper", "--model",
                               "scripted-model", "--wait", env=client_env)
            # Without --wait too: the worker's refusal, not "started", exit 2.
            unwaited = await cli("run", "hi", "--tools", "shout,whisper", "--model",
                                 "scripted-model", env=client_env)
    finally:
        model.stop()
    for code, out, err in (waited, unwaited):
        assert code == 2, (out, err)
        assert (f"the worker on task queue {queue!r} serves no tool named 'whisper' "
                "(it serves: shout)") in " ".join(err.split()), err
        assert "Traceback" not in err
    assert "started" not in unwaited[1], unwaited  # refused: never "started"


async def test_sigterm_stops_the_worker_gracefully(temporal: Client, tmp_path: Path) -> None:
    """A deploy stops workers with SIGTERM (`docker stop`, systemd, Kubernetes): the worker
    shuts down as it does on Ctrl-C, exit 0, not killed by the signal (exit -15)."""
    log = tmp_path / "worker.log"
    env = worker_env(tmp_path, TEMPORAL_ADDRESS=temporal.service_client.config.target_host,
                     BOUNDLOOP_TASK_QUEUE=f"term-{uuid.uuid4().hex[:8]}",
                     OPENAI_API_KEY="sk-test-not-real")
    with process([sys.executable, "-m", "boundloop.worker.main"], env, log) as worker:
        await log_has(log, "worker started")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=WAIT) == 0, log.read_text(encoding="utf-8")[-2000:]
    assert "worker stopped" in log.read_text(encoding="utf-8")
