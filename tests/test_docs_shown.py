"""Shown outputs of README.md and docs/guide.md that need a live Temporal, run as a reader
types them (a shell, `boundloop` on its PATH, real workers and a scripted model); each
prints what the page shows, up to what differs per run (`normalized`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import select
import shlex
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from temporalio.client import Client

from boundloop.client import query_status
from boundloop.scripted.server import ScriptedModelServer
from boundloop.testing import dev_server, free_port, wait_until
from tests.scripts import answer, call, resp
from tests.test_cli import ROOT, env_for
from tests.test_docs_outputs import shown_block, shown_matches
from tests.test_readme import blocks
from tests.test_worker_process import BOUNDLOOP, log_has, process, worker_env

GUIDE = "docs/guide.md"
SHOWN_RUN = "boundloop-520031277c0e"
WAIT = 120.0

#: What differs per run: run ids, Temporal's run ids (in Web UI links), times and dates.
#: Each is replaced by as many `#` (a table keeps its widths).
VARYING = [re.compile(p) for p in (
    r"boundloop-[0-9a-f]{12}\b",
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?\+00:00",
    r"\(\d{4}-\d\d-\d\d\)",
)]


def normalized(lines: list[str], names: dict[str, str] | None = None) -> list[str]:
    """`lines` with each of `names` (what ran -> what the page shows) as the page names
    it, and the VARYING parts blanked."""
    out: list[str] = []
    for line in lines:
        for real, shown in (names or {}).items():
            line = line.replace(real, shown)
        for pattern in VARYING:
            line = pattern.sub(lambda m: "#" * len(m.group()), line)
        out.append(line.rstrip())
    while out and not out[-1]:
        out.pop()
    return out


def commands_of(block: list[str]) -> list[tuple[str, list[str]]]:
    """(command, what it printed) of each `$` line of a shown block; a command continued
    with `\\` is joined, blank lines after an output are dropped."""
    out: list[tuple[str, list[str]]] = []
    continued = False
    for line in block:
        if line.startswith("$ "):
            out.append((line[2:], []))
        elif continued:
            out[-1] = (out[-1][0][:-1].rstrip() + " " + line.strip(), out[-1][1])
        elif out and not line.startswith("#"):
            out[-1][1].append(line)
        continued = bool(out) and not out[-1][1] and out[-1][0].endswith("\\")
    for _command, lines in out:
        while lines and not lines[-1].strip():
            lines.pop()
    return out


def shown_commands(page: str, first: str) -> list[tuple[str, list[str]]]:
    """commands_of the block of `page` whose first command is `first`."""
    return commands_of(["$ " + first, *shown_block(page, first)])


EXIT = re.compile(r"^(.*?)\s*[\[(]exit (\d+)[\])]$")


def exit_of(lines: list[str]) -> tuple[list[str], int | None]:
    """A command's shown lines without the exit code the page shows (`(exit N)` on a line
    of its own, or `[exit N]` after the last line), and that code (None: not shown)."""
    if not lines or not (m := EXIT.match(lines[-1])):
        return lines, None
    return [*lines[:-1], *([m[1]] if m[1] else [])], int(m[2])


def shell_env(temporal: Client, tmp_path: Path, **extra: str) -> dict[str, str]:
    """A reader's shell: `boundloop` on the PATH, the test's Temporal, no model settings,
    the terminal's default width off a terminal (80 columns)."""
    env = {k: v for k, v in env_for(temporal, tmp_path).items() if k not in ("COLUMNS", "LINES")}
    return {**env, "PATH": f"{Path(BOUNDLOOP).parent}{os.pathsep}{os.environ['PATH']}",
            **extra}


async def typed(command: str, env: dict[str, str], cwd: Path = ROOT) -> tuple[int, list[str]]:
    """Run `command` in a shell; its exit code and what it printed, stdout and stderr
    interleaved as a terminal shows them."""
    proc = await asyncio.create_subprocess_exec(
        "sh", "-c", command, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=WAIT)
    assert proc.returncode is not None
    return proc.returncode, out.decode().splitlines()


async def check_shown(commands: list[tuple[str, list[str]]], env: dict[str, str], *,
                      names: dict[str, str] | None = None, cwd: Path = ROOT) -> None:
    """Type each command (with each of `names`: what runs -> what the page shows) and
    compare what it prints, and the exit code the page shows, with the page."""
    names = names or {}
    for command, lines in commands:
        for real, shown in names.items():
            command = command.replace(shown, real)
        expected, code = exit_of(lines)
        got, printed = await typed(command, env, cwd)
        if " --json" in command:  # one object, shown wrapped to fit the page
            assert json.loads("".join(normalized(printed, names))) == json.loads(
                "".join(normalized(expected))), (command, printed)
        else:
            assert shown_matches(normalized(printed, names), normalized(expected)), (
                command, printed, expected)
        assert code is None or got == code, (command, got, printed)


def toml_block(page: str, marker: str) -> str:
    """The ```toml block of `page` that contains `marker`."""
    (text,) = [b for b in blocks((ROOT / page).read_text(encoding="utf-8"), "toml")
               if marker in b]
    return text


@pytest_asyncio.fixture(scope="module")
async def own_temporal(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Client]:
    """A dev server of this module's own: `pending` lists every waiting call of the
    namespace, and other tests leave runs waiting on the shared one."""
    db = tmp_path_factory.mktemp("shown") / "temporal.db"
    async with dev_server(database=str(db)) as client:
        yield client


def with_password(command: str, password: str, env: dict[str, str], cwd: Path) -> list[str]:
    """Run `command` on a terminal of its own (its controlling terminal, as a password
    prompt needs), typing `password` at each prompt once echo is off; what it showed."""
    import fcntl
    import pty
    import termios

    main, side = pty.openpty()

    def controlling() -> None:  # after setsid: the pty becomes the controlling terminal
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(["sh", "-c", command], cwd=cwd, env=env, stdin=side,
                            stdout=side, stderr=side, start_new_session=True,
                            preexec_fn=controlling)
    os.close(side)
    # Bounded: a prompt that never reaches the terminal fails the test, not hangs it.
    deadline = time.monotonic() + WAIT
    shown, answered = b"", 0
    try:
        while True:
            left = deadline - time.monotonic()
            assert left > 0 and select.select([main], [], [], left)[0], (
                "no prompt or end on the terminal", shown)
            try:
                chunk = os.read(main, 1024)
            except OSError:  # EIO: the command closed the terminal
                break
            if not chunk:
                break
            shown += chunk
            if shown.count(b":") > answered:  # a prompt: type once the terminal hides input
                while termios.tcgetattr(main)[3] & termios.ECHO:
                    assert time.monotonic() < deadline, ("echo never turned off", shown)
                answered += 1
                os.write(main, password.encode() + b"\n")
    finally:
        os.close(main)
        if proc.poll() is None and time.monotonic() >= deadline:
            proc.kill()
    assert proc.wait(timeout=WAIT) == 0, shown
    return [x.rstrip() for x in shown.decode().replace("\r", "").splitlines()]


CONSOLE_FIRST = "boundloop console-approver alice --token >> approvers"


@pytest.mark.parametrize("page", ["README.md", "docs/console.md"])
async def test_the_console_lines_print_what_the_readme_shows(temporal: Client, tmp_path: Path,
                                                            page: str) -> None:
    """Typed in a shell as the page shows them (bob's password typed on a terminal; the
    console on a free port, named as the default 8090; the test's Temporal named as the
    default 127.0.0.1:7233)."""
    commands = commands_of(["$ " + CONSOLE_FIRST, *shown_block(page, CONSOLE_FIRST)])
    (approver, shown_approver), (serve, shown_serve) = commands[0], commands[-1]
    env = shell_env(temporal, tmp_path)
    done = subprocess.run(["sh", "-c", approver], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done
    token = re.sub(r"\(shown once\): [A-Za-z0-9_-]{32}$", "(shown once): TOKEN",
                   done.stderr.strip())
    assert [token] == [re.sub(r"\(shown once\): \S+$", "(shown once): TOKEN", x)
                       for x in shown_approver]
    assert (tmp_path / "approvers").read_text().startswith("alice scrypt$")
    for command, shown in commands[1:-1]:
        if command.startswith("cat "):
            done = subprocess.run(["sh", "-c", command], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=120)
            assert [x.split("$")[:4] for x in done.stdout.splitlines()] == [
                x.split("$")[:4] for x in shown], (done.stdout, shown)
        else:  # bob's password, asked twice on the terminal, never in the file
            assert with_password(command, "correct horse battery", env, tmp_path) == shown
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



# --- runs, approvals, budgets and sessions, with workers and a scripted model -----------


def queue() -> str:
    return f"q-{uuid.uuid4().hex[:8]}"


@contextlib.asynccontextmanager
async def scripted_worker(temporal: Client, tmp_path: Path, turns: list[dict[str, Any]],
                          log: str = "worker.log", **worker: str,
                          ) -> AsyncIterator[tuple[dict[str, str], ScriptedModelServer]]:
    """A `boundloop worker` (the demo's tools, and the `worker` settings) on a queue of its
    own against a scripted model of `turns`, started; yields the shell environment of
    commands for it, and the model."""
    q = queue()
    model = ScriptedModelServer(turns)
    env = shell_env(temporal, tmp_path, BOUNDLOOP_TASK_QUEUE=q)
    try:
        with process([BOUNDLOOP, "worker"], worker_env(
                tmp_path, TEMPORAL_ADDRESS=env["TEMPORAL_ADDRESS"], BOUNDLOOP_TASK_QUEUE=q,
                OPENAI_BASE_URL=model.start(), OPENAI_API_KEY="sk-test-not-real", **worker),
                tmp_path / log):
            await log_has(tmp_path / log, "worker started")
            yield env, model
    finally:
        model.stop()


async def parked(temporal: Client, run_id: str) -> None:
    """Until the run waits for an approval."""
    handle = temporal.get_workflow_handle(run_id)

    async def waiting() -> bool:
        try:
            return bool((await query_status(handle)).pending)
        except Exception:  # not started yet
            return False
    await wait_until(waiting, timeout=WAIT, interval=0.2)


README_QUESTION = "The printer on floor 3 is broken: open a ticket"
TICKETS = "boundloop/scripts/demo_ticket.json"


async def test_the_readme_pending_watch_and_approve_print_what_it_shows(
        own_temporal: Client, tmp_path: Path) -> None:
    """The README's run: `boundloop worker --model-script` with the demo's recorded
    ticket turns, the run started as the README says, then `pending`, `watch` in the
    background and `approve`; `watch` prints its last frame and the result after
    `approve`'s line."""
    [(pending, shown_pending), (watch, _), (approve, shown_after)] = shown_commands(
        "README.md", "boundloop pending")
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    started = f'boundloop run "{README_QUESTION}" --id readme-watch-4 --tools create_ticket'
    assert f"`{started}`" in readme and f"`boundloop worker --model-script {TICKETS}`" in readme
    mine = f"readme-{uuid.uuid4().hex[:7]}"  # as long as readme-watch-4: the same widths
    names = {mine: "readme-watch-4"}
    q = queue()
    env = shell_env(own_temporal, tmp_path, BOUNDLOOP_TASK_QUEUE=q)
    log = tmp_path / "worker.log"
    with process([BOUNDLOOP, "worker", "--model-script", TICKETS],
                 worker_env(tmp_path, TEMPORAL_ADDRESS=env["TEMPORAL_ADDRESS"],
                            BOUNDLOOP_TASK_QUEUE=q), log):
        await log_has(log, "worker started")
        code, out = await typed(started.replace("readme-watch-4", mine), env)
        assert code == 0, out
        await parked(own_temporal, mine)
        await check_shown([(pending, shown_pending)], env, names=names)
        assert watch.endswith("# in another terminal"), watch
        watcher = await asyncio.create_subprocess_exec(
            "sh", "-c", watch.split("&")[0].replace("readme-watch-4", mine), cwd=ROOT,
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT)
        code, approved = await typed(approve.replace("readme-watch-4", mine), env)
        watched, _ = await asyncio.wait_for(watcher.communicate(), timeout=WAIT)
    assert (code, watcher.returncode) == (0, 0), (approved, watched)
    printed = normalized(approved + watched.decode().splitlines(), names)
    assert printed == normalized(shown_after), printed


async def test_the_two_terminal_walkthrough_prints_what_the_guide_shows(
        own_temporal: Client, tmp_path: Path) -> None:
    """docs/guide.md's "Approving a side effect (two terminals)": `demo --interactive`
    waits for a person; `pending` in the other terminal lists the call, `approve`
    decides it, and the demo goes on to the end."""
    [(demo, shown_demo)] = shown_commands(GUIDE, ".venv/bin/boundloop demo --interactive")
    operator = shown_commands(GUIDE, ".venv/bin/boundloop pending")
    env = shell_env(own_temporal, tmp_path)
    log = tmp_path / "demo.log"
    with process(["sh", "-c", f"exec {demo}"], env, log) as proc:
        await log_has(log, "--reason '...'")
        printed = log.read_text(encoding="utf-8").splitlines()
        [run_id] = re.findall(r"approve (boundloop-[0-9a-f]{12}) ", "\n".join(printed))
        assert shown_matches(normalized(printed), normalized(shown_demo)), printed
        await check_shown(operator, env, names={run_id: SHOWN_RUN})
        assert await asyncio.to_thread(proc.wait, WAIT) == 0, log.read_text()
    assert "stopped:completed" in log.read_text(encoding="utf-8").split("approve:")[-1]


async def test_the_mcp_run_prints_what_the_guide_shows(temporal: Client,
                                                       tmp_path: Path) -> None:
    """The guide's MCP run: mcp-server-time through examples/mcp/time.toml, the scripted
    model, the run's own worker; nothing after the result."""
    first = ('BOUNDLOOP_MCP_CONFIG=examples/mcp/time.toml .venv/bin/boundloop run '
             '"東京は今何時？" \\')
    commands = shown_commands(GUIDE, first)
    assert [c for c, _ in commands] == [
        'BOUNDLOOP_MCP_CONFIG=examples/mcp/time.toml .venv/bin/boundloop run "東京は今何時？" '
        "--model-script examples/scripts/mcp_time.json --tools time__get_current_time"]
    await check_shown(commands, shell_env(temporal, tmp_path))


async def test_the_session_transcript_prints_what_the_guide_shows(
        temporal: Client, tmp_path: Path) -> None:
    """The guide's session: a `boundloop worker` serving lookup_stock against a scripted
    model, then start, two turns, show, end, and a message to the ended session."""
    mine = f"support-{uuid.uuid4().hex[:7]}"  # as long as support-chat-42
    turns = [resp(call("lookup_stock", {"sku": "A-001"}, "c1")), answer("A-001: 12 in stock."),
             answer("You asked about A-001: 12 in stock.")]
    async with scripted_worker(temporal, tmp_path, turns) as (env, _):
        await check_shown(shown_commands(
            GUIDE, ".venv/bin/boundloop session start --tools lookup_stock --idle-seconds "
            "1800 --token-budget 50000 --id support-chat-42"), env,
            names={mine: "support-chat-42"})


async def test_the_budget_blocks_print_what_the_guide_shows(temporal: Client,
                                                            tmp_path: Path) -> None:
    """The guide's shared budget (a worker holding the ledger; the runs with the scripted
    model), then a budget whose worker has approver keys and alice as its admin."""
    key = f"team-{uuid.uuid4().hex[:6]}"  # a ledger of this test's own
    async with scripted_worker(temporal, tmp_path, []) as (env, _):
        await check_shown(shown_commands(
            GUIDE, "boundloop budget set team-a --usd 5 --tokens 2000000"), env,
            names={key: "team-a"})
    # Who may change a budget: alice's key on the worker, alice its only admin.
    for name in ("alice", "mallory"):
        code, out = await typed(f"boundloop keys new {name}", env, cwd=tmp_path)
        assert code == 0, out
    alice = (tmp_path / "alice.pub").read_text(encoding="utf-8").split()[1]
    policy = tmp_path / "policy.toml"
    policy.write_text(toml_block(GUIDE, "admins = [").replace("ed25519:…", alice),
                      encoding="utf-8")
    signed = f"team-{uuid.uuid4().hex[:6]}"
    async with scripted_worker(temporal, tmp_path, [], log="signed.log",
                               BOUNDLOOP_POLICY=str(policy)) as (env, _):
        await check_shown(shown_commands(
            GUIDE, "boundloop budget set team-a --usd 5 --as alice --key alice.key"), env,
            names={signed: "team-a"}, cwd=tmp_path)


async def refused_as_shown(temporal: Client, tmp_path: Path, page: str, policy_marker: str,
                           command: str, **worker: str) -> None:
    """A `boundloop worker` on the page's policy file (the toml block holding
    `policy_marker`, plus `worker` settings) refuses the run `command` starts as the page
    shows, before any model request."""
    policy = tmp_path / "policy.toml"
    policy.write_text(toml_block(page, policy_marker), encoding="utf-8")
    async with scripted_worker(temporal, tmp_path, [], BOUNDLOOP_POLICY=str(policy),
                               **worker) as (env, model):
        await check_shown(shown_commands(page, command), env)
    assert model.requests == []


async def test_the_tenant_refusals_print_what_the_guide_shows(temporal: Client,
                                                              tmp_path: Path) -> None:
    """The guide's budget per tenant: a worker whose policy derives the key from the
    run's BoundloopTenant refuses a run without one, and one naming another budget."""
    await refused_as_shown(temporal, tmp_path, GUIDE, "key_from = ",
                           'boundloop run "A-001の在庫は？" --wait')


SECURITY = "docs/security.md"


@pytest.mark.parametrize("file", ["bad.toml", "typo.toml"])
async def test_a_bad_policy_file_prints_what_security_shows(temporal: Client, tmp_path: Path,
                                                            file: str) -> None:
    """docs/security.md's bad policy files: the page's file, the worker started on it as
    the page shows (a model key set, as where workers run), its lines and exit 2 before
    it takes any task."""
    marker = {"bad.toml": "max_stepz", "typo.toml": "[approval.no_such_tool]"}[file]
    (tmp_path / file).write_text(toml_block(SECURITY, marker), encoding="utf-8")
    await check_shown(shown_commands(SECURITY, f"BOUNDLOOP_POLICY={file} boundloop worker"),
                      shell_env(temporal, tmp_path, OPENAI_API_KEY="sk-test-not-real"),
                      cwd=tmp_path)


async def test_the_policy_refusals_print_what_security_shows(temporal: Client,
                                                             tmp_path: Path) -> None:
    """docs/security.md's refused run: a worker on the page's strict.toml refuses the run
    the page starts, each field in a line, before any model request."""
    await refused_as_shown(temporal, tmp_path, SECURITY, "# strict.toml",
                           'boundloop run "Open a restock ticket for B-002" --tools '
                           'create_ticket \\')


async def test_the_clear_run_refusal_prints_what_security_shows(temporal: Client,
                                                                tmp_path: Path) -> None:
    """docs/security.md's run in clear: a worker with codec keys and the page's policy
    refuses a run started without the keys (the shell has none), before any model
    request."""
    from tests.test_codec import keyfile

    assert not any(k.startswith("BOUNDLOOP_CODEC") for k in shell_env(temporal, tmp_path))
    await refused_as_shown(temporal, tmp_path, SECURITY, "# encrypted.toml",
                           'boundloop run "Is A-001 in stock?" --tools lookup_stock --wait    '
                           "# no codec keys here",
                           BOUNDLOOP_CODEC_KEYS=str(keyfile(tmp_path, "k1")))


SESSIONS = "docs/sessions.md"


async def background(command: str, env: dict[str, str]) -> asyncio.subprocess.Process:
    """`command &` in a reader's shell: stdout and stderr to the terminal (one pipe)."""
    return await asyncio.create_subprocess_exec(
        "sh", "-c", command.split(" &", 1)[0], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


async def first_line(proc: asyncio.subprocess.Process) -> str:
    assert proc.stdout is not None
    return (await asyncio.wait_for(proc.stdout.readline(), timeout=WAIT)).decode().rstrip()


async def test_the_busy_queue_transcript_prints_what_sessions_shows(
        temporal: Client, tmp_path: Path) -> None:
    """docs/sessions.md's `--busy queue` session: a `boundloop worker` with the demo's
    tools against a scripted model; the first `say` in the background waits on its
    turn's approval, the second is queued, `session show` says so, `approve` decides, and
    `wait` prints both turns' results, in turn order."""
    [start, say1, say2, show, approve, wait] = shown_commands(
        SESSIONS, "boundloop session start --id support-chat-7 --busy queue")
    assert (say1[0].endswith("&"), "&" in say2[0], wait[0].split()[0]) == (True, True, "wait")
    mine = f"support-{uuid.uuid4().hex[:6]}"  # as long as support-chat-7
    names = {mine: "support-chat-7"}
    ticket = {"title": "Restock B-002", "description": "B-002 is out of stock",
              "priority": "high"}
    turns = [resp(call("create_ticket", ticket, "call_ticket")),
             answer("Ticket filed: Restock B-002 (high)."),
             answer("Yes: the ticket is open and a person approved it.")]
    async with scripted_worker(temporal, tmp_path, turns) as (env, _):
        await check_shown([start], env, names=names)
        first = await background(say1[0].replace("support-chat-7", mine), env)
        assert normalized([await first_line(first)], names) == normalized(say1[1])
        await parked(temporal, f"{mine}/turn-1")
        second = await background(say2[0].replace("support-chat-7", mine), env)
        assert normalized([await first_line(second)], names) == normalized(say2[1])
        await check_shown([show, approve], env, names=names)
        ends = [await asyncio.wait_for(p.communicate(), timeout=WAIT)
                for p in (first, second)]
    assert (first.returncode, second.returncode) == (0, 0)
    printed = normalized([x for out, _ in ends for x in out.decode().splitlines()], names)
    assert shown_matches(printed, normalized(wait[1])), "\n".join(printed)


# --- every python block of every page runs (or says it is a fragment) -------------------

#: The marker on the line before a block that is part of a program, not one: it names
#: what it needs (a run, a session, an MCP server's code).
FRAGMENT = "<!-- fragment:"
#: Blocks that are files a test runs as they are (the page holds them verbatim: the
#: tests named say so): their first line.
RUN_AS_FILES = {
    '"""The weather desk\'s tools:': "examples/weather_desk/desk.py "
                                      "(tests/test_example_weather_desk.py)",
    '"""The weather desk\'s worker:': "examples/weather_desk/desk_worker.py",
    '"""Ask the weather desk a question,': "examples/weather_desk/desk_client.py",
    '"""The weather desk\'s tests:': "examples/weather_desk/test_desk.py "
                                     "(tests/test_testing_kit.py)",
}
#: Blocks run below, by page and first line.
RUN_HERE = {
    ("approvals.md", "from boundloop.core.limits import Policy"),
    ("scripted-server.md", "import openai"),
    ("security.md", "from boundloop import OperatorPolicy, Worker"),
    ("streaming.md", "import boundloop"),
    ("streaming.md", 'agent = boundloop.Agent(tools, model="llama3", api="chat", stream=False)'),
    ("guide.md", "session = await boundloop.start_session(client, tools=tools, "
                 "limits=boundloop.Limits(max_steps=4),"),
    ("testing.md", '"""Writes desk_script.json: the model\'s side of one weather-desk run."""'),
}


def python_blocks(page: Path) -> list[tuple[str, str, bool]]:
    """(first line, code, marked a fragment) of each python block of `page`."""
    found: list[tuple[str, str, bool]] = []
    lines = page.read_text(encoding="utf-8").splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.strip() != "```python":
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        code = "".join(lines[i + 1:end])
        marked = i > 0 and lines[i - 1].startswith(FRAGMENT)
        found.append((code.splitlines()[0], code, marked))
    return found


def block(page: str, first: str) -> str:
    [code] = [c for line, c, _ in python_blocks(ROOT / "docs" / page) if line == first]
    return code


async def run_block(code: str, namespace: dict[str, Any]) -> dict[str, Any]:
    """Run a page's block as a reader pastes it into `python -m asyncio` (top-level
    `await` allowed), with `namespace` holding what the page says it needs."""
    import ast
    import inspect

    ran = eval(compile(code, "<docs block>", "exec",  # the docs' own code
                       flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT), namespace)
    if inspect.iscoroutine(ran):
        await ran
    return namespace


def test_every_python_block_of_the_docs_runs_or_is_marked_a_fragment() -> None:
    """Each block is run below, or is a file a test runs, or says (`<!-- fragment: … -->`
    on the line before it) what program it belongs in; the home page is the README,
    whose blocks tests/test_readme.py runs."""
    unaccounted: list[str] = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page.name == "index.md":
            continue
        for first, _code, marked in python_blocks(page):
            if not (marked or (page.name, first) in RUN_HERE
                    or any(first.startswith(f) for f in RUN_AS_FILES)):
                unaccounted.append(f"{page.name}: {first}")
    assert unaccounted == [], unaccounted
    for page, first in RUN_HERE:
        assert block(page, first)  # each one is still on its page
    for first, name in RUN_AS_FILES.items():
        text = (ROOT / name.split()[0]).read_text(encoding="utf-8")
        assert text.startswith(first), name


async def test_the_pure_blocks_run() -> None:
    """The argument rules of approvals.md and the scripted server of scripted-server.md."""
    from boundloop.core.limits import Policy

    ran = await run_block(block("approvals.md", "from boundloop.core.limits import Policy"),
                          {})
    assert isinstance(ran["policy"], Policy) and len(ran["policy"].rules) == 3
    ran = await run_block(block("scripted-server.md", "import openai"), {})
    assert ran["server"].requests == []


async def test_the_security_policy_block_builds_its_worker(temporal: Client,
                                                           tmp_path: Path) -> None:
    import openai

    import boundloop
    from boundloop.tools.demo import DemoDeps, tools

    ran = await run_block(block("security.md", "from boundloop import OperatorPolicy, Worker"),
                          {"client": temporal, "agent": boundloop.Agent(
                              tools, model="gpt-5-mini", task_queue=queue()),
                           "deps": DemoDeps(data_dir=tmp_path),
                           "model": openai.AsyncOpenAI(api_key="sk-test-not-real",
                                                       base_url="http://127.0.0.1:1/v1")})
    assert isinstance(ran["worker"], boundloop.Worker)


async def test_the_stream_reader_block_reads_a_finished_run(
        temporal: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """streaming.md's reader, as shown (`boundloop.connect()` reads TEMPORAL_ADDRESS), on
    a run that has ended: it prints each event and, last, the result."""
    import boundloop
    from tests.conftest import test_worker

    q = queue()
    model = ScriptedModelServer([answer("A-001: 12 in stock.")])
    try:
        async with test_worker(temporal, q, model.start(), tmp_path / "data"):
            agent = boundloop.Agent(["lookup_stock"], model="scripted-model", task_queue=q)
            run = await agent.start(temporal, "A-001?")
            await asyncio.wait_for(run.result(), WAIT)
            monkeypatch.setenv("TEMPORAL_ADDRESS", temporal.service_client.config.target_host)
            code = block("streaming.md", "import boundloop").replace("boundloop-3f2a9c0d1e2b",
                                                                     run.id)
            await asyncio.wait_for(run_block(code, {}), WAIT)  # a worker answers the reads
    finally:
        model.stop()
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1] == "completed A-001: 12 in stock.", printed
    assert any("run_started" in line for line in printed), printed


async def test_the_session_and_unstreamed_run_blocks_run(tmp_path: Path) -> None:
    """The guide's session from Python and streaming.md's unstreamed agent, as shown (the
    default task queue: a dev server of their own)."""
    import boundloop
    from tests.conftest import test_worker

    async with dev_server() as client:
        unstreamed = block("streaming.md", 'agent = boundloop.Agent(tools, model="llama3", '
                                           'api="chat", stream=False)')
        ran = await run_block(unstreamed, {"boundloop": boundloop, "client": client,
                                           "tools": ["lookup_stock"]})
        assert ran["agent"].stream is False
        await ran["run"].handle.terminate()  # no worker serves llama3 here
        model = ScriptedModelServer([answer("A-001: 12 in stock."),
                                     answer("You asked about A-001.")])
        try:
            async with test_worker(client, boundloop.DEFAULT_TASK_QUEUE, model.start(),
                                   tmp_path / "data"):
                code = block("guide.md", "session = await boundloop.start_session(client, "
                                         "tools=tools, limits=boundloop.Limits(max_steps=4),")
                ran = await asyncio.wait_for(run_block(code, {
                    "boundloop": boundloop, "client": client, "tools": ["lookup_stock"]}), WAIT)
        finally:
            model.stop()
    assert ran["result"].text == "You asked about A-001."
    assert ran["status"].turns == 2


async def test_an_own_worker_runs_with_no_api_key_as_testing_shows(
        temporal: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """testing.md's "Your own worker with no API key": the script written by its block,
    the scripted server as a process of its own, the weather desk's worker and client
    with only OPENAI_BASE_URL, OPENAI_API_KEY and TEMPORAL_ADDRESS set: the run completes
    with the warning approved."""
    import sys

    monkeypatch.chdir(tmp_path)
    await run_block(block("testing.md", '"""Writes desk_script.json: the model\'s side of '
                                        'one weather-desk run."""'), {})
    page = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
    shown = page[page.index("## Your own worker with no API key"):]
    port = free_port()
    assert "--port 8400 &" in shown and "OPENAI_BASE_URL=http://127.0.0.1:8400/v1" in shown
    example = ROOT / "examples" / "weather_desk"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")},
           "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1", "OPENAI_API_KEY": "no-key-needed",
           "TEMPORAL_ADDRESS": temporal.service_client.config.target_host,
           "PYTHONUNBUFFERED": "1"}
    queue_name = queue()  # the page's default, weather-desk, is any test's: one of its own
    procs = [subprocess.Popen([sys.executable, "-m", "boundloop.scripted.server",
                               "desk_script.json", "--port", str(port)], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)]
    try:
        assert procs[0].stdout is not None
        assert procs[0].stdout.readline().strip() == f"http://127.0.0.1:{port}/v1"
        procs.append(subprocess.Popen(
            [sys.executable, str(example / "desk_worker.py"), "--task-queue", queue_name,
             "--data-dir", str(tmp_path / "weather")], cwd=tmp_path, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        assert procs[1].stdout is not None
        assert "weather desk worker on" in procs[1].stdout.readline()
        client = await asyncio.to_thread(
            subprocess.run, [sys.executable, str(example / "desk_client.py"),
                             "Storm coming to Osaka on 2026-12-03?", "--task-queue", queue_name],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=WAIT)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
    assert client.returncode == 0, client
    out = client.stdout
    assert "waiting for approval: issue_warning" in out
    result = json.loads(out[out.index("\n{"):])
    assert (result["reason"], result["tool_executions"], result["text"]) == (
        "completed", 2, "A red warning for Osaka is out.")
