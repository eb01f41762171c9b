"""Shown outputs of README.md and docs/guide.md that need a live Temporal, run as a reader
types them; each prints what the page shows (up to what differs per run)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

from temporalio.client import Client

from boundloop.testing import free_port
from tests.test_cli import env_for
from tests.test_docs_outputs import shown_block
from tests.test_worker_process import BOUNDLOOP, log_has

GUIDE = "docs/guide.md"
SHOWN_RUN = "boundloop-520031277c0e"
SHOWN_SINCE = "2026-11-30T15:02:11.529147+00:00"


def as_shown(text: str, run_id: str) -> list[str]:
    text = text.replace(run_id, SHOWN_RUN)
    text = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+00:00", SHOWN_SINCE, text)
    return [line.rstrip() for line in text.splitlines()]


def commands_of(block: list[str]) -> list[tuple[str, list[str]]]:
    """(command, what it printed) of each `$` line of a shown block."""
    out: list[tuple[str, list[str]]] = []
    for line in block:
        if line.startswith("$ "):
            out.append((line[2:], []))
        elif out and not line.startswith("#"):
            out[-1][1].append(line)
    return out


async def test_the_console_lines_print_what_the_readme_shows(temporal: Client,
                                                            tmp_path: Path) -> None:
    """Typed in a shell as the README shows them (the console on a free port, named as
    the default 8090; the test's Temporal named as the default 127.0.0.1:7233)."""
    [(approver, shown_approver), (serve, shown_serve)] = commands_of([
        "$ boundloop console-approver alice --token >> approvers",
        *shown_block("README.md", "boundloop console-approver alice --token >> approvers")])
    env = {**env_for(temporal, tmp_path),
           "PATH": f"{Path(BOUNDLOOP).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["sh", "-c", approver], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done
    token = re.sub(r"\(shown once\): [A-Za-z0-9_-]{32}$", "(shown once): TOKEN",
                   done.stderr.strip())
    assert [token] == [re.sub(r"\(shown once\): \S+$", "(shown once): TOKEN", x)
                       for x in shown_approver]
    assert (tmp_path / "approvers").read_text().startswith("alice scrypt$")
    port = free_port()
    log = tmp_path / "console.log"
    words = shlex.split(serve)  # NAME=VALUE … boundloop console
    given = dict(w.split("=", 1) for w in words if "=" in w)
    argv = [w for w in words if "=" not in w]
    assert argv == ["boundloop", "console"], serve
    with log.open("wb") as out:
        console = subprocess.Popen([BOUNDLOOP, *argv[1:], "--port", str(port)], cwd=tmp_path,
                                   env={**env, **given}, stdout=out, stderr=subprocess.STDOUT)
    try:
        await log_has(log, "Ctrl-C stops it.")
    finally:
        console.kill()
        console.wait(timeout=10)
    printed = log.read_text(encoding="utf-8").replace(f":{port} ", ":8090 ").replace(
        temporal.service_client.config.target_host, "127.0.0.1:7233")
    assert printed.splitlines() == shown_serve, printed

