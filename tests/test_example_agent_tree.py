"""examples/agent_tree.py as a reader runs it: a writer agent with a researcher
sub-agent, on an embedded dev server with the scripted model; it prints what
docs/agent-trees.md shows."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.test_docs_outputs import shown_matches

ROOT = Path(__file__).resolve().parent.parent
COMMAND = ".venv/bin/python examples/agent_tree.py"


def shown() -> list[str]:
    text = (ROOT / "docs" / "agent-trees.md").read_text(encoding="utf-8")
    block = text.split(f"$ {COMMAND}\n", 1)[1].split("```", 1)[0]
    return block.splitlines()


def test_the_agent_tree_example_prints_what_the_page_shows() -> None:
    done = subprocess.run([sys.executable, "examples/agent_tree.py"], cwd=ROOT,
                          capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    # The dev server's own lines (its banner, its logs) are not the example's.
    printed = [line for line in done.stdout.splitlines()
               if not line.startswith(("Temporal", "time="))]
    assert shown_matches(printed, shown()), (printed, shown())


def test_the_page_shows_the_examples_agents_verbatim() -> None:
    text = (ROOT / "docs" / "agent-trees.md").read_text(encoding="utf-8")
    agents = text.split("## One line per agent", 1)[1].split("```python\n", 1)[1]
    agents = agents.split("```", 1)[0]
    assert agents in (ROOT / "examples" / "agent_tree.py").read_text(encoding="utf-8")
