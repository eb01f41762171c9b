"""The README is the front page: short, the two commands, an agent that runs as shown
(its printed line included), links into the documentation site, and the site's home
page is the same text."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from temporalio.client import Client

from boundloop.scripted.server import ScriptedModelServer
from tests.scripts import answer, call, resp
from tests.test_cli import env_for

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def blocks(text: str, lang: str) -> list[str]:
    """The fenced code blocks of `text` in language `lang` ("": no language)."""
    found, current, inside = [], [], None
    for line in text.splitlines(keepends=True):
        if line.startswith("```"):
            if inside is None:
                inside, current = line[3:].strip(), []
                continue
            if inside == lang:
                found.append("".join(current))
            inside = None
        elif inside is not None:
            current.append(line)
    return found


def test_the_readme_is_a_front_page_and_the_sites_home() -> None:
    assert len(README.splitlines()) <= 400
    assert "make demo" in README and "make test" in README
    for page in re.findall(r"\]\(docs/([^)#]+)", README):
        assert (ROOT / "docs" / page).is_file(), page
    home = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    assert home == README.replace("](docs/", "](")


def test_the_readme_agent_runs_and_prints_what_the_readme_shows(
        temporal: Client, tmp_path: Path) -> None:
    (code,) = [b for b in blocks(README, "python") if "boundloop.Agent(" in b]
    assert len(code.splitlines()) <= 30
    shown = [b for b in blocks(README, "") if b.startswith("completed")]
    address = temporal.service_client.config.target_host
    script = tmp_path / "agent.py"
    script.write_text(code.replace('"127.0.0.1:7233"', repr(address)), encoding="utf-8")
    model = ScriptedModelServer([resp(call("lookup_stock", {"sku": "A-001"}, "c1")),
                                 answer("A-001: 12 in stock.")])
    env = {**env_for(temporal, tmp_path), "OPENAI_BASE_URL": model.start(),
           "OPENAI_API_KEY": "sk-test-not-real"}
    try:
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
    finally:
        model.stop()
    assert done.returncode == 0, done
    assert shown and done.stdout == shown[0], (done.stdout, shown)



def test_the_readmes_agent_test_passes_as_shown(tmp_path: Path) -> None:
    """The "Test your agent" example, saved next to the README's agent.py and run by
    pytest as a user runs it: its own dev server, the scripted model, the real tool."""
    (agent,) = [b for b in blocks(README, "python") if "boundloop.Agent(" in b]
    (test,) = [b for b in blocks(README, "python") if "boundloop.testing" in b]
    (tmp_path / "agent.py").write_text(agent, encoding="utf-8")
    (tmp_path / "test_agent.py").write_text(test, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull,
         "--rootdir", str(tmp_path), "test_agent.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1 passed" in done.stdout

async def test_the_readme_policy_refuses_the_run_it_shows(temporal: Client,
                                                          tmp_path: Path) -> None:
    """The README's policy file served by a real `boundloop worker`; the `boundloop run`
    it shows prints exactly the refused lines shown, exits 2, and asks nothing of the
    model."""
    import shlex
    import uuid

    from tests.test_cli import cli
    from tests.test_worker_process import BOUNDLOOP, log_has, process, worker_env

    (policy_text,) = [b for b in blocks(README, "toml") if "[approval.create_ticket]" in b]
    (shown,) = [b for b in blocks(README, "console") if "refused:" in b]
    command = next(line for line in shown.splitlines() if line.startswith("$ boundloop run"))
    refused = [line for line in shown.splitlines() if line.startswith("refused:")]
    policy = tmp_path / "policy.toml"
    policy.write_text(policy_text, encoding="utf-8")
    queue = f"q-{uuid.uuid4().hex[:8]}"
    model = ScriptedModelServer([])
    env = worker_env(tmp_path, TEMPORAL_ADDRESS=temporal.service_client.config.target_host,
                     BOUNDLOOP_TASK_QUEUE=queue, OPENAI_BASE_URL=model.start(),
                     OPENAI_API_KEY="sk-test-not-real", BOUNDLOOP_POLICY=str(policy))
    log = tmp_path / "worker.log"
    try:
        with process([BOUNDLOOP, "worker"], env, log):
            await log_has(log, "worker started")
            code, _out, err = await cli(*shlex.split(command)[2:], env={
                **env_for(temporal, tmp_path), "BOUNDLOOP_TASK_QUEUE": queue})
    finally:
        model.stop()
    assert code == 2, err
    assert [line for line in err.splitlines() if line.startswith("refused:")] == refused
    assert model.requests == []
