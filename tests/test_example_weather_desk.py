"""examples/weather_desk end to end: its worker and client scripts as real processes, on
the dev server, against the scripted model; the forecast comes over HTTP from the
example's own service, the approved warning lands once in its own SQLite store."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

from temporalio.client import Client

from boundloop.scripted.server import ScriptedModelServer
from tests.scripts import answer, call, outputs, resp

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "weather_desk"
WAIT = 60.0


def wait_for_line(proc: subprocess.Popen[str], text: str) -> None:
    assert proc.stdout is not None
    end = time.monotonic() + WAIT
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if text in line:
            return
        if not line and proc.poll() is not None:
            raise AssertionError(f"the worker exited ({proc.returncode}) before {text!r}")
    raise AssertionError(f"no {text!r} from the worker")


async def test_weather_desk_example_runs_end_to_end(temporal: Client, tmp_path: Path) -> None:
    day = "2026-12-03"
    model = ScriptedModelServer([
        resp(call("forecast", {"city": "Osaka", "day": day}, "c1")),
        resp(call("crew_on_duty", {"day": day, "shift": "night"}, "c2")),
        resp(call("issue_warning", {"city": "Osaka", "day": day, "level": "red"}, "c3")),
        answer("A red warning for Osaka is out; the night crew is on duty."),
    ])
    queue = f"desk-{uuid.uuid4().hex[:8]}"
    address = temporal.service_client.config.target_host
    env = {**os.environ, "OPENAI_BASE_URL": model.start(), "OPENAI_API_KEY": "sk-test",
           "PYTHONUNBUFFERED": "1"}
    common = ["--temporal", address, "--task-queue", queue]
    worker = subprocess.Popen(
        [sys.executable, str(EXAMPLE / "desk_worker.py"), *common, "--data-dir", str(tmp_path)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        stdin=subprocess.DEVNULL)
    try:
        wait_for_line(worker, "weather desk worker on")
        client = subprocess.run(
            [sys.executable, str(EXAMPLE / "desk_client.py"), f"Storm coming to Osaka on {day}?",
             *common, "--model", "scripted-model"],
            env=env, capture_output=True, text=True, timeout=WAIT, check=False)
    finally:
        worker.terminate()
        worker.wait(timeout=10)
        model.stop()
    assert client.returncode == 0, client.stderr
    out = client.stdout
    assert "waiting for approval: issue_warning" in out and "\"level\": \"red\"" in out
    result = json.loads(out[out.index("\n{"):])
    assert (result["reason"], result["tool_executions"]) == ("completed", 3)
    assert model.violations == []
    sent = outputs(model.requests[1].body)["c1"]
    assert sent["status"] == "success" and sent["data"]["city"] == "Osaka"
    assert isinstance(sent["data"]["wind_kmh"], int)  # from the example's HTTP service
    crew = outputs(model.requests[2].body)["c2"]["data"]
    assert (crew["day"], crew["shift"], len(crew["crew"])) == (day, "night", 2)
    with sqlite3.connect(tmp_path / "warnings.sqlite3") as db:
        rows = db.execute("SELECT key, city, day, level FROM warnings").fetchall()
    # The key: the workflow id, the run's first execution run id, the call's position.
    assert [(k.split("/")[0], k.split("/", 2)[2], *rest) for k, *rest in rows] == [
        (result["workflow_id"], "step-3/call-0", "Osaka", day, "red")]


def test_readme_build_your_own_agent_is_the_example_verbatim() -> None:
    readme = (EXAMPLE.parent.parent / "docs" / "guide.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Build your own agent"):]
    section = section[:section.index("\n## ", 1)]
    for name in ("desk.py", "desk_worker.py", "desk_client.py"):
        code = (EXAMPLE / name).read_text(encoding="utf-8")
        assert f"`examples/weather_desk/{name}`:\n\n```python\n{code}```" in section, name


def test_each_tool_of_the_example_is_at_most_15_lines() -> None:
    import ast

    tree = ast.parse((EXAMPLE / "desk.py").read_text(encoding="utf-8"))
    tools = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    assert {t.name for t in tools} == {"forecast", "crew_on_duty", "issue_warning"}
    for t in tools:
        first = min([t.lineno, *(d.lineno for d in t.decorator_list)])
        assert (t.end_lineno or 0) - first + 1 <= 15, t.name
