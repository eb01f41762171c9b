"""`make demo`'s output as the README shows it: the same lines, up to what differs per
run (workflow ids, Web UI links, where the dev server and the ticket store are)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from temporalio.client import Client

from tests.test_cli import env_for
from tests.test_readme import README, ROOT, blocks


def normalized(text: str) -> list[str]:
    text = re.sub(r"boundloop-[0-9a-f]{12}", "RUN", text)
    text = re.sub(r"Web UI: \S+", "Web UI: LINK", text)
    text = re.sub(r"ticket store \([^)]*\)", "ticket store (STORE)", text)
    text = re.sub(r"─+ (.*?) ─+", r"── \1 ──", text)  # a rule as wide as the terminal
    lines = [line.rstrip() for line in text.strip().splitlines()]
    # Where Temporal is (started, or the test's) and what to do with it afterwards.
    return [line for line in lines if not line.startswith(("Temporal:", "The dev server"))]


def test_make_demo_prints_what_the_readme_shows(temporal: Client, tmp_path: Path) -> None:
    (shown,) = [b for b in blocks(README, "") if "run_started" in b]
    boundloop_cli = Path(sys.executable).parent / "boundloop"
    env = env_for(temporal, tmp_path)
    done = subprocess.run([str(boundloop_cli), "demo"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done
    assert normalized(done.stdout) == normalized(shown)
