"""Every command output the README and the docs show comes from a test that runs it.

A shown output is a fenced block whose first line is `$ boundloop …`, each command
followed by what it printed. The commands that need no Temporal and no model are run
here and must print what the page shows (up to a key that differs per run); RUN_ELSEWHERE
names the tests that run the others (the README's agent and `make demo` blocks: tests/
test_readme*.py; those needing workers and a model: tests/test_docs_shown.py and the
tests of what they show). A block no test runs fails
test_every_shown_output_is_run_by_a_test, so a new output cannot join the pages untested.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_cli import env_for

ROOT = Path(__file__).resolve().parent.parent
#: The README and every page of the docs site (docs/index.md is the README).
PAGES = ("README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")
                              if p.name != "index.md"))


def shown_outputs(page: str) -> list[tuple[str, list[str]]]:
    """(first command, block lines) of each block of `page` that shows a command's output."""
    found: list[tuple[str, list[str]]] = []
    current: list[str] | None = None
    for line in (ROOT / page).read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            if current is None:
                current = []
                continue
            commands = [x for x in current if x.startswith("$ ")]
            printed = [x for x in current if x.strip() and not x.startswith(("$ ", "#"))]
            if commands and "boundloop" in commands[0] and printed:
                found.append((commands[0][2:], current[current.index(commands[0]):]))
            current = None
        elif current is not None:
            current.append(line)
    return found


#: Shown outputs this file runs: the command as the page shows it.
RUN_HERE = [
    'boundloop run "hi" --max-steps 0',
    """boundloop run "hi" --limits '{"max_result_bytes": 3000000}'""",
    "boundloop keys new alice",
]

SHOWN = "tests/test_docs_shown.py::"
REPLAY_CHECK = ("tests/test_replay_check.py::"
                "test_replay_check_catches_an_unpatched_change_before_the_deploy")

#: Shown outputs a test elsewhere runs and compares with the page: (page, first command)
#: -> that test.
RUN_ELSEWHERE = {
    ("README.md", "BOUNDLOOP_POLICY=policy.toml boundloop worker &"):
        "tests/test_readme.py::test_the_readme_policy_refuses_the_run_it_shows",
    ("README.md", "boundloop pending"):
        SHOWN + "test_the_readme_pending_watch_and_approve_print_what_it_shows",
    ("README.md", "boundloop console-approver alice --token >> approvers"):
        SHOWN + "test_the_console_lines_print_what_the_readme_shows",
    ("docs/console.md", "boundloop console-approver alice --token >> approvers"):
        SHOWN + "test_the_console_lines_print_what_the_readme_shows",
    ("docs/guide.md", "boundloop list"):
        "tests/test_tls.py::test_a_wrong_ca_is_refused_in_one_line_with_exit_4",
    ("docs/guide.md", "boundloop approve boundloop-signed-demo call_ticket --as alice"):
        "tests/test_signed_approvals.py::test_forged_as_alice_without_her_key_is_refused",
    ("docs/guide.md", "boundloop status boundloop-3f6c0a9d2e41"):
        "tests/test_cli.py::test_a_failed_model_request_is_named_with_its_hint_and_exits_3",
    ("docs/guide.md", 'boundloop run "A-001とB-002の在庫をそれぞれ調べて。" --tools lookup_stock '
     "--max-input-tokens 700 --max-output-tokens 200 --model-script "
     "examples/scripts/stock_two_skus.json"):
        "tests/test_context_window.py::test_the_cli_exits_with_the_context_exit_code",
    ("docs/guide.md", ".venv/bin/boundloop demo --interactive"):
        SHOWN + "test_the_two_terminal_walkthrough_prints_what_the_guide_shows",
    ("docs/guide.md", ".venv/bin/boundloop pending"):
        SHOWN + "test_the_two_terminal_walkthrough_prints_what_the_guide_shows",
    ("docs/guide.md", 'BOUNDLOOP_MCP_CONFIG=examples/mcp/time.toml .venv/bin/boundloop run '
     '"東京は今何時？" \\'): SHOWN + "test_the_mcp_run_prints_what_the_guide_shows",
    ("docs/guide.md", "boundloop budget set team-a --usd 5 --tokens 2000000"):
        SHOWN + "test_the_budget_blocks_print_what_the_guide_shows",
    ("docs/guide.md", "boundloop budget set team-a --usd 5 --as alice --key alice.key"):
        SHOWN + "test_the_budget_blocks_print_what_the_guide_shows",
    ("docs/guide.md", 'boundloop run "A-001の在庫は？" --wait'):
        SHOWN + "test_the_tenant_refusals_print_what_the_guide_shows",
    ("docs/guide.md", ".venv/bin/boundloop session start --tools lookup_stock --idle-seconds "
     "1800 --token-budget 50000 --id support-chat-42"):
        SHOWN + "test_the_session_transcript_prints_what_the_guide_shows",
    ("docs/sessions.md", "boundloop session start --id support-chat-7 --busy queue"):
        SHOWN + "test_the_busy_queue_transcript_prints_what_sessions_shows",
    ("docs/deploying.md", "boundloop replay-check"): REPLAY_CHECK,
    ("docs/deploying.md", "boundloop replay-check          # with the next release checked "
     "out"): REPLAY_CHECK,
    ("docs/deploying.md", "boundloop status rc-6f0c1d2e9a11"): REPLAY_CHECK,
    ("docs/deploying.md", "boundloop approve rc-6f0c1d2e9a11 t1"): REPLAY_CHECK,
    ("docs/deploying.md", "boundloop list"): REPLAY_CHECK,
    ("docs/deploying.md", "boundloop status dep-3b1f6e0c2a97"):
        "tests/test_deploys.py::test_a_changed_tool_stops_the_approved_run_with_a_typed_reason",
    ("docs/deploying.md", "boundloop status dep-8e2b5f1a6d04"):
        "tests/test_deploys.py::test_a_changed_tool_stops_the_approved_run_with_a_typed_reason",
    ("docs/security.md", "BOUNDLOOP_POLICY=bad.toml boundloop worker"):
        SHOWN + "test_a_bad_policy_file_prints_what_security_shows",
    ("docs/security.md", "BOUNDLOOP_POLICY=typo.toml boundloop worker"):
        SHOWN + "test_a_bad_policy_file_prints_what_security_shows",
    ("docs/security.md",
     'boundloop run "Open a restock ticket for B-002" --tools create_ticket \\'):
        SHOWN + "test_the_policy_refusals_print_what_security_shows",
    ("docs/security.md", 'boundloop run "Is A-001 in stock?" --tools lookup_stock --wait    '
     "# no codec keys here"): SHOWN + "test_the_clear_run_refusal_prints_what_security_shows",
}

#: Words that begin a line only boundloop prints (a result, a refusal, an event, a prompt).
OUTPUT_MARKS = ("reason: ", "answer: ", "error: ", "refused: ", "model request failed",
                "hint: ", "waiting for approval", "  step ")

#: Output blocks that show no `$` command, with the test that runs what prints them.
UNNAMED = {("README.md", "make demo"): "tests/test_readme_demo.py"}



def unnamed_outputs(page: str) -> list[int]:
    """The first line numbers of the blocks of `page` that show boundloop's output without
    a `$` line naming the command that printed it."""
    found: list[int] = []
    start: int | None = None
    lines: list[str] = []
    for n, line in enumerate((ROOT / page).read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("```"):
            if start is None:
                start, lines = n, []
                continue
            if (not any(x.startswith("$ ") for x in lines)
                    and any(x.startswith(OUTPUT_MARKS) for x in lines)):
                found.append(start)
            start = None
        elif start is not None:
            lines.append(line)
    return found


def test_every_output_block_names_its_command() -> None:
    """A block of output must show its `$ command`, so the test above finds it (or it is
    the README's `make demo` block, which tests/test_readme_demo.py compares)."""
    unnamed = {page: len(unnamed_outputs(page)) for page in PAGES}
    assert {page: n for page, n in unnamed.items() if n} == {
        "README.md": len(UNNAMED)}, unnamed


def shown_matches(printed: list[str], shown: list[str]) -> bool:
    """`printed` is what `shown` shows: line for line, where a `...` line stands for any
    lines and a `…` in a line for any text (at its end: any line that begins like it)."""
    def same(line: str, pattern: str) -> bool:
        wild = ".*".join(re.escape(part) for part in pattern.rstrip().split("…"))
        return re.fullmatch(wild, line.rstrip(), re.DOTALL) is not None

    def fits(i: int, j: int) -> bool:
        if j == len(shown):
            return i == len(printed)
        if shown[j].strip() == "...":
            return any(fits(k, j + 1) for k in range(i, len(printed) + 1))
        return i < len(printed) and same(printed[i], shown[j]) and fits(i + 1, j + 1)

    return fits(0, 0)


def shown_block(page: str, command: str) -> list[str]:
    """The lines of the block of `page` that starts with `$ command` (without it)."""
    [block] = [lines for first, lines in shown_outputs(page) if first == command]
    return block[1:]


def test_every_shown_output_is_run_by_a_test() -> None:
    shown = {(page, first) for page in PAGES for first, _ in shown_outputs(page)}
    assert shown - set(RUN_ELSEWHERE) == {
        (page, c) for page in PAGES for c in RUN_HERE if (page, c) in shown}
    assert set(RUN_ELSEWHERE) <= shown  # a block removed: drop it from RUN_ELSEWHERE
    assert {c for _, c in shown} >= set(RUN_HERE)


def test_the_tests_named_for_shown_outputs_exist() -> None:
    for test in RUN_ELSEWHERE.values():
        path, _, name = test.partition("::")
        assert (ROOT / path).is_file(), test
        assert not name or f"def {name}(" in (ROOT / path).read_text(encoding="utf-8"), test


def key_free(lines: list[str]) -> list[str]:
    return [re.sub(r"ed25519:[A-Za-z0-9+/=]{44}", "ed25519:KEY", x).rstrip() for x in lines]


@pytest.mark.parametrize("command", RUN_HERE)
def test_the_shown_output_is_what_the_command_prints(command: str, tmp_path: Path) -> None:
    [block] = [lines for page in PAGES for first, lines in shown_outputs(page)
               if first == command]
    expected = block[1:]
    nxt = next((i for i, x in enumerate(expected) if x.startswith("$ ")), len(expected))
    expected = expected[:nxt]  # the lines after a second `$` are other commands
    argv = shlex.split(command)
    assert argv[0] == "boundloop"
    done = subprocess.run([sys.executable, "-m", "boundloop.cli", *argv[1:]], cwd=tmp_path,
                          env={**env_for(None, tmp_path), "COLUMNS": "200"},
                          capture_output=True, text=True, timeout=120)
    printed = (done.stdout + done.stderr).splitlines()
    assert key_free(printed) == key_free(expected), (printed, expected)
