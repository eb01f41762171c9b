"""Edges of the `boundloop` command a person sees first: what importing it costs, what
`boundloop worker` says before it has connected."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from tests.test_worker_process import BOUNDLOOP, ROOT, log_has, process, worker_env

#: Counts scrypt calls, then imports the CLI (as `boundloop …` does before any command).
COUNT_SCRYPT = """
import hashlib
calls = []
real = hashlib.scrypt
hashlib.scrypt = lambda *a, **k: calls.append(1) or real(*a, **k)
import boundloop.cli
import boundloop.console.app
print(len(calls))
"""


def test_importing_the_cli_hashes_no_credential() -> None:
    """scrypt (some 50 ms and 16 MiB) runs when a console signs someone in, not for every
    `boundloop` command."""
    done = subprocess.run([sys.executable, "-c", COUNT_SCRYPT], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0", done


async def test_the_worker_says_what_it_connects_to_before_it_has_connected(
        tmp_path: Path) -> None:
    """A server that accepts the connection and never answers: the worker's first line
    names the address, namespace and task queue it is connecting to, and no secret."""
    with socket.create_server(("127.0.0.1", 0)) as silent:  # never accepted, never answers
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        env = worker_env(tmp_path, TEMPORAL_ADDRESS=address, TEMPORAL_NAMESPACE="edges",
                         BOUNDLOOP_TASK_QUEUE="edges-q", OPENAI_BASE_URL="http://127.0.0.1:9/v1",
                         OPENAI_API_KEY="sk-test-not-real-0123456789")
        log = tmp_path / "worker.log"
        with process([BOUNDLOOP, "worker"], env, log):
            await log_has(log, "\n")  # its first line
        text = log.read_text(encoding="utf-8")
    first = text.splitlines()[0]
    assert f"connecting to Temporal at {address} (namespace edges)" in first, text
    assert "task_queue=edges-q" in first, text
    assert "sk-test" not in text
