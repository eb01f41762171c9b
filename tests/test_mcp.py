"""MCP tools against real MCP servers: the tests' own (tests/support/mcp_servers.py) over
stdio and streamable HTTP, and the published `mcp-server-time` package over stdio.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from boundloop.core.envelope import ToolStatus
from boundloop.core.mcp_tools import (
    DESTRUCTIVE_NOTE,
    IDEMPOTENCY_META_KEY,
    ListedTool,
    MCPDeclarationError,
    MCPServerConfig,
    check_arguments,
    declare_tools,
    envelope_from_result,
)
from boundloop.errors import TransientToolError
from boundloop.mcp import MCPConfigError, MCPPool, MCPServerError, load_mcp_config
from tests.support import mcp_servers
from tests.support.mcp_servers import rows

ROOT = Path(__file__).resolve().parents[1]
WAIT = 30.0  # bound on any single wait in these tests


def stdio_config(db: Path, **extra: Any) -> MCPServerConfig:
    return MCPServerConfig(name="shop", command=sys.executable,
                           args=["-m", "tests.support.mcp_servers", "stdio"],
                           env={"MCP_TEST_DB": str(db)}, cwd=ROOT, **extra)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def shared_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One database for the module's long-lived servers (starting one takes seconds)."""
    return tmp_path_factory.mktemp("mcp") / "mcp-test.sqlite3"


@pytest.fixture
def db(shared_db: Path) -> Path:
    """The server database, emptied for each test."""
    with mcp_servers.connect(shared_db) as conn:
        for table in ("requests", "effects", "deleted", "sleeps"):
            conn.execute(f"DELETE FROM {table}")
    return shared_db


def start_http_server(db: Path, port: int) -> subprocess.Popen[bytes]:
    """The tests' server on streamable HTTP, once it accepts connections."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.mcp_servers", "http", str(port)],
        cwd=ROOT, env={**os.environ, "MCP_TEST_DB": str(db)})
    deadline = time.monotonic() + WAIT
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("the HTTP MCP server did not start")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(timeout=WAIT)


@pytest.fixture(scope="module")
def http_url(shared_db: Path) -> Iterator[str]:
    port = free_port()
    proc = start_http_server(shared_db, port)
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(proc)


@pytest.fixture(scope="module", params=["stdio", "http"])
def shop(request: pytest.FixtureRequest, shared_db: Path) -> MCPServerConfig:
    if request.param == "stdio":
        return stdio_config(shared_db)
    url = request.getfixturevalue("http_url")
    return MCPServerConfig(name="shop", url=url)


@pytest_asyncio.fixture(scope="module")
async def pool(shop: MCPServerConfig) -> AsyncIterator[MCPPool]:
    async with MCPPool([shop]) as p:
        yield p


async def call(pool: MCPPool, name: str, arguments: dict[str, Any], key: str = "wf/step-1/call-0",
               timeout: float = WAIT) -> Any:
    return await asyncio.wait_for(
        pool.call(pool.declaration(f"shop__{name}"), arguments, key, timeout), WAIT + 5)


# --- listing and declarations ---------------------------------------------------------


async def test_listed_tools_are_prefixed_and_read_only_ones_need_no_approval(pool: MCPPool) -> None:
    by_name = {d.name: d for d in pool.declarations()}
    assert set(by_name) == {f"shop__{n}" for n in
                            ("lookup", "delete_record", "archive_record", "fail", "sleep", "chart",
                             "environment", "add_note")}
    lookup, delete, note = by_name["shop__lookup"], by_name["shop__delete_record"], \
        by_name["shop__add_note"]
    assert (lookup.needs_approval, lookup.side_effects) == (False, False)
    assert (delete.needs_approval, delete.side_effects) == (True, True)
    assert (note.needs_approval, note.side_effects) == (True, True)  # no annotations at all
    assert DESTRUCTIVE_NOTE in delete.description
    assert DESTRUCTIVE_NOTE not in note.description and note.description == "Add a note."
    assert lookup.remote_name == "lookup" and lookup.server == "shop"
    assert lookup.parameters["properties"]["sku"]["type"] == "string"
    assert not note.strict  # `tags` is optional: not OpenAI strict form
    fn = lookup.openai_tool("chat")["function"]
    assert fn["name"] == "shop__lookup" and fn["parameters"] == lookup.parameters


async def test_overrides_and_allow_list_shape_the_declarations(db: Path) -> None:
    config = stdio_config(
        db, prefix="s_", tools=["lookup", "delete_record"], timeout_seconds=9,
        overrides={"delete_record": {"needs_approval": False, "terminal": True, "cost_units": 2,
                                     "max_calls": 1, "timeout_seconds": 5, "name": "remove"},
                   "lookup": {"needs_approval": True}})
    async with MCPPool([config]) as pool:
        by_name = {d.name: d for d in pool.declarations()}
    assert set(by_name) == {"s_lookup", "s_remove"}
    remove = by_name["s_remove"]
    assert remove.remote_name == "delete_record"
    assert (remove.needs_approval, remove.side_effects, remove.terminal) == (False, True, True)
    assert (remove.cost_units, remove.max_calls, remove.timeout_seconds) == (2, 1, 5.0)
    lookup = by_name["s_lookup"]
    assert (lookup.needs_approval, lookup.side_effects) == (True, False)
    assert lookup.timeout_seconds == 9.0


def listed(name: str, **hints: Any) -> ListedTool:
    return ListedTool(name=name, input_schema={"type": "object", "properties": {}}, **hints)


def test_names_that_do_not_fit_openai_are_refused_with_the_tool_named() -> None:
    config = MCPServerConfig(name="srv", url="http://127.0.0.1:1/mcp")
    [dotted] = declare_tools(config, [listed("files.read")])
    assert dotted.name == "srv__files_read" and dotted.remote_name == "files.read"
    with pytest.raises(MCPDeclarationError, match=r"'x{70}'.*overrides"):
        declare_tools(config, [listed("x" * 70)])
    with pytest.raises(MCPDeclarationError, match=r"also the name of 'a\.b'"):
        declare_tools(config, [listed("a.b"), listed("a_b")])
    allow = MCPServerConfig(name="srv", url="http://127.0.0.1:1/mcp", tools=["gone"])
    with pytest.raises(MCPDeclarationError, match=r"does not list .*\['gone'\]"):
        declare_tools(allow, [listed("here")])
    with pytest.raises(MCPDeclarationError, match="not a JSON Schema object"):
        declare_tools(config, [ListedTool(name="t", input_schema={"type": "string"})])


def test_strict_schema_is_detected() -> None:
    config = MCPServerConfig(name="srv", url="http://127.0.0.1:1/mcp")
    closed = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"],
              "additionalProperties": False}
    [d] = declare_tools(config, [ListedTool(name="t", input_schema=closed)])
    assert d.strict and d.openai_tool("responses")["strict"] is True


# --- calls ------------------------------------------------------------------------------


async def test_invalid_arguments_are_answered_without_calling_the_server(
        pool: MCPPool, db: Path) -> None:
    wrong_type = await call(pool, "lookup", {"sku": 3})
    missing = await call(pool, "lookup", {})
    assert wrong_type.status == ToolStatus.INVALID_INPUT and wrong_type.retryable
    assert "sku: expected string" in wrong_type.message
    assert missing.status == ToolStatus.INVALID_INPUT
    assert "'sku' is a required property" in missing.message
    assert rows(db, "SELECT tool FROM requests") == []
    ok = await call(pool, "lookup", {"sku": "A-1"})
    assert ok.status == ToolStatus.SUCCESS
    assert rows(db, "SELECT tool FROM requests") == [("lookup",)]


async def test_is_error_results_reach_the_model_as_error_envelopes(pool: MCPPool) -> None:
    result = await call(pool, "fail", {"reason": "out of paper"})
    assert result.status == ToolStatus.PERMANENT_ERROR and result.error_code == "MCP_TOOL_ERROR"
    assert "cannot do that: out of paper" in result.data["text"]
    assert not result.retryable


async def test_idempotency_key_arrives_in_meta_and_a_repeated_key_repeats_nothing(
        pool: MCPPool, db: Path) -> None:
    first = await call(pool, "delete_record", {"record": "r1"}, key="wf/step-1/call-0")
    again = await call(pool, "delete_record", {"record": "r1"}, key="wf/step-1/call-0")
    other = await call(pool, "delete_record", {"record": "r2"}, key="wf/step-2/call-0")
    assert rows(db, "SELECT tool, key FROM requests") == [
        ("delete_record", "wf/step-1/call-0"), ("delete_record", "wf/step-1/call-0"),
        ("delete_record", "wf/step-2/call-0")]
    assert rows(db, "SELECT record FROM deleted") == [("r1",), ("r2",)]
    assert rows(db, "SELECT DISTINCT client FROM requests") == [("boundloop",)]
    assert first.data == {"structured": {"result": "deleted r1 as #1"}}
    assert again.data == {"structured": {"result": "deleted r1 as #1 (already done)"}}
    assert other.data == {"structured": {"result": "deleted r2 as #2"}}


async def test_structured_content_is_the_data_and_images_are_counted_not_sent(
        pool: MCPPool) -> None:
    a, b = await asyncio.gather(call(pool, "lookup", {"sku": "A-1"}),
                                call(pool, "lookup", {"sku": "BB-22"}))
    assert a.data == {"structured": {"sku": "A-1", "stock": 3}}
    assert b.data == {"structured": {"sku": "BB-22", "stock": 5}}
    chart = await call(pool, "chart", {})
    assert chart.status == ToolStatus.SUCCESS
    assert chart.data == {"text": "caption: stock by day", "omitted": {"image": 1}}


def test_result_mapping_caps_error_text_and_keeps_terminal() -> None:
    error = envelope_from_result({"isError": True, "content": [
        {"type": "text", "text": "x" * 10_000}]}, terminal=True)
    assert error.status == ToolStatus.PERMANENT_ERROR and not error.terminal
    assert len(error.data["text"].encode()) <= 2000
    done = envelope_from_result({"content": [{"type": "text", "text": "ok"},
                                             {"type": "resource_link", "uri": "file:///x",
                                              "name": "x"}]}, terminal=True)
    assert done.terminal and done.data == {"text": "ok", "omitted": {"resource_link": 1}}


async def test_stdio_server_killed_mid_call_raises_retryable_and_the_next_call_restarts_it(
        db: Path) -> None:
    async with MCPPool([stdio_config(db)]) as pool:
        running = asyncio.create_task(call(pool, "sleep", {"seconds": 120}))
        pid = await wait_for_row(db, "SELECT pid FROM sleeps")
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(TransientToolError):
            await asyncio.wait_for(running, WAIT)
        again = await call(pool, "lookup", {"sku": "A-1"})
        assert again.status == ToolStatus.SUCCESS
        before = pool.declarations()
        assert await asyncio.wait_for(pool.refresh(), WAIT) == before
        pids = [p for (p,) in rows(db, "SELECT pid FROM requests")]
        assert pids[0] == pid and pids[-1] != pid


async def test_http_server_restarted_mid_call_raises_retryable_and_the_next_call_reconnects(
        db: Path) -> None:
    port = free_port()
    proc = start_http_server(db, port)
    try:
        async with MCPPool([MCPServerConfig(name="shop", url=f"http://127.0.0.1:{port}/mcp")]) \
                as pool:
            running = asyncio.create_task(call(pool, "sleep", {"seconds": 120}))
            await wait_for_row(db, "SELECT pid FROM sleeps")
            proc.kill()
            proc.wait(timeout=WAIT)
            with pytest.raises(TransientToolError):
                await asyncio.wait_for(running, WAIT)
            proc = start_http_server(db, port)
            assert (await call(pool, "lookup", {"sku": "A"})).status == ToolStatus.SUCCESS
    finally:
        stop(proc)
    assert len({p for (p,) in rows(db, "SELECT pid FROM requests")}) == 2


async def test_a_cancelled_call_leaves_the_shared_session_working(db: Path) -> None:
    async with MCPPool([stdio_config(db)]) as pool:
        running = asyncio.create_task(call(pool, "sleep", {"seconds": 120}))
        await wait_for_row(db, "SELECT pid FROM sleeps")
        # The same session answers other calls while one is in flight ...
        assert (await call(pool, "lookup", {"sku": "A"})).status == ToolStatus.SUCCESS
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        # ... and after that one was cancelled (as a cancelled activity would be).
        assert (await call(pool, "lookup", {"sku": "B"})).status == ToolStatus.SUCCESS
    assert len({p for (p,) in rows(db, "SELECT pid FROM requests")}) == 1


async def test_a_timed_out_call_is_retryable_and_keeps_the_session(db: Path) -> None:
    async with MCPPool([stdio_config(db)]) as pool:
        with pytest.raises(TransientToolError):
            await call(pool, "sleep", {"seconds": 60}, timeout=1.0)
        assert (await call(pool, "lookup", {"sku": "A"})).status == ToolStatus.SUCCESS
    pids = {p for (p,) in rows(db, "SELECT pid FROM requests")}
    assert len(pids) == 1


async def test_stdio_server_gets_its_env_but_not_the_workers_environment(
        db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BOUNDLOOP_TEST_SECRET", "s3cret")
    config = stdio_config(db).model_copy(update={"env": {
        "MCP_TEST_DB": str(db), "FROM_WORKER": "${BOUNDLOOP_TEST_SECRET}"}})
    async with MCPPool([config]) as pool:
        secret = await call(pool, "environment", {"name": "BOUNDLOOP_TEST_SECRET"})
        referenced = await call(pool, "environment", {"name": "FROM_WORKER"})
    assert secret.data == {"structured": {"result": False}}
    assert referenced.data == {"structured": {"result": True}}


async def test_http_headers_take_references_to_the_workers_environment(
        http_url: str, db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = MCPServerConfig(name="shop", url=http_url,
                             headers={"X-Test-Token": "Bearer ${BOUNDLOOP_TEST_TOKEN}"})
    with pytest.raises(MCPServerError, match="no environment variable 'BOUNDLOOP_TEST_TOKEN'"):
        await asyncio.wait_for(MCPPool([config]).start(), WAIT)
    monkeypatch.setenv("BOUNDLOOP_TEST_TOKEN", "t0ken")
    async with MCPPool([config]) as pool:
        await call(pool, "lookup", {"sku": "A"})
    assert rows(db, "SELECT token FROM requests") == [("Bearer t0ken",)]


async def test_close_ends_the_stdio_server_process(db: Path) -> None:
    pool = MCPPool([stdio_config(db)])
    await pool.start()
    await call(pool, "lookup", {"sku": "A"})
    [(pid,)] = rows(db, "SELECT pid FROM requests")
    await pool.close()
    await wait_until(lambda: not alive(pid))


async def test_a_server_that_cannot_start_is_named_in_the_error(tmp_path: Path) -> None:
    missing = MCPServerConfig(name="broken", command=str(tmp_path / "no-such-server"),
                              connect_timeout_seconds=10)
    nobody = MCPServerConfig(name="nobody", url=f"http://127.0.0.1:{free_port()}/mcp",
                             connect_timeout_seconds=10)
    silent = MCPServerConfig(name="silent", command=sys.executable,
                             args=["-c", "import time; time.sleep(60)"], connect_timeout_seconds=1)
    for config in (missing, nobody, silent):
        named = (f"MCP server '{config.name}': "
                 "(could not connect|no session within 1 s|cannot start .*: no such program)")
        with pytest.raises(MCPServerError, match=named):
            await asyncio.wait_for(MCPPool([config]).start(), WAIT)


# --- the published mcp-server-time package -----------------------------------------------


async def test_published_time_server_lists_and_converts() -> None:
    config = MCPServerConfig(name="time", command=sys.executable,
                             args=["-m", "mcp_server_time", "--local-timezone", "UTC"])
    async with MCPPool([config]) as pool:
        by_name = {d.name: d for d in pool.declarations()}
        assert set(by_name) == {"time__get_current_time", "time__convert_time"}
        convert = by_name["time__convert_time"]
        assert not convert.needs_approval and not convert.side_effects
        result = await asyncio.wait_for(pool.call(convert, {
            "source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"},
            "wf/step-1/call-0", WAIT), WAIT + 5)
        assert result.status == ToolStatus.SUCCESS
        assert "T21:00" in result.data["structured"]["target"]["datetime"]
        invalid = await pool.call(convert, {"time": "12:00"}, "wf/step-1/call-1", WAIT)
        assert invalid.status == ToolStatus.INVALID_INPUT
        # The time server answers an unknown tool with JSON-RPC invalid params.
        gone = convert.model_copy(update={"remote_name": "no_such_tool"})
        refused = await asyncio.wait_for(pool.call(gone, {
            "source_timezone": "UTC", "time": "12:00", "target_timezone": "UTC"},
            "wf/step-1/call-2", WAIT), WAIT + 5)
        assert refused.status == ToolStatus.PERMANENT_ERROR
        assert refused.error_code == "MCP_REQUEST_REFUSED"


# --- configuration files ---------------------------------------------------------------


def test_config_loads_from_json_and_toml(tmp_path: Path) -> None:
    as_json = tmp_path / "mcp.json"
    as_json.write_text(json.dumps({"servers": [
        {"name": "time", "command": "mcp-server-time", "args": ["--local-timezone", "UTC"]},
        {"name": "shop", "url": "http://127.0.0.1:8000/mcp", "prefix": "",
         "overrides": {"delete_record": {"needs_approval": False}}}]}))
    as_toml = tmp_path / "mcp.toml"
    as_toml.write_text('[[servers]]\nname = "time"\ncommand = "mcp-server-time"\n'
                       'args = ["--local-timezone", "UTC"]\n\n'
                       '[[servers]]\nname = "shop"\nurl = "http://127.0.0.1:8000/mcp"\n'
                       'prefix = ""\n[servers.overrides.delete_record]\nneeds_approval = false\n')
    assert load_mcp_config(as_json) == load_mcp_config(as_toml)
    time, shop = load_mcp_config(as_json)
    assert (time.transport, time.tool_prefix) == ("stdio", "time__")
    assert (shop.transport, shop.tool_prefix) == ("streamable-http", "")


@pytest.mark.parametrize(("servers", "expected"), [
    ([{"name": "a", "command": "x", "url": "http://h/mcp"}], "exactly one of `command`"),
    ([{"name": "a"}], "exactly one of `command`"),
    ([{"name": "a", "url": "http://h/mcp", "env": {"K": "v"}}], "only to a `command`"),
    ([{"name": "a", "command": "x", "colour": "red"}], "servers.0.colour: Extra inputs"),
    ([{"name": "a b", "command": "x"}], "servers.0.name"),
    ([{"name": "a", "command": "x"}, {"name": "a", "command": "y"}], "unique"),
    ([{"name": "a", "command": "x", "tools": ["t"], "overrides": {"u": {}}}], r"\['u'\]"),
    ([{"name": "a", "command": "x", "overrides": {"t": {"max_calls": 0}}}],
     "overrides.t.max_calls"),
    ([{"name": "a", "command": "x", "headers": {"K": "v"}}], "only to a `url`"),
    ([{"name": "a", "url": "http://h/mcp", "headers": {"K": "${1X}"}}],
     r"headers\.K: \$\{1X\} is not a variable name"),
])
def test_invalid_config_names_the_field(tmp_path: Path, servers: list[dict[str, Any]],
                                        expected: str) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"servers": servers}))
    with pytest.raises(MCPConfigError, match=expected):
        load_mcp_config(path)


def test_config_errors_never_echo_env_values(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"servers": [{"name": "a", "command": "x",
                                             "env": {"TOKEN": 12345678}}]}))
    with pytest.raises(MCPConfigError) as info:
        load_mcp_config(path)
    assert "12345678" not in str(info.value) and "servers.0.env.TOKEN" in str(info.value)
    config = MCPServerConfig(name="a", url="http://h/mcp", headers={"Authorization": "s3cret"})
    assert "s3cret" not in repr(config) and "s3cret" not in str(config)
    for name, text in [("bad.json", "{"), ("bad.toml", "servers = ["), ("mcp.yaml", "")]:
        (tmp_path / name).write_text(text)
        with pytest.raises(MCPConfigError, match=name):
            load_mcp_config(tmp_path / name)


def test_a_schema_naming_draft_07_is_checked_as_draft_07() -> None:
    config = MCPServerConfig(name="srv", url="http://127.0.0.1:1/mcp")
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
              "properties": {"xs": {"type": "array", "items": [{"type": "integer"}]}}}
    [d] = declare_tools(config, [ListedTool(name="t", input_schema=schema)])
    assert check_arguments(d, {"xs": [1, "extra"]}) is None  # tuple form: draft-07 only
    bad = check_arguments(d, {"xs": ["one"]})
    assert bad is not None and "xs/0: expected integer" in bad.message


def test_argument_check_is_the_same_rule_the_workflow_can_use() -> None:
    config = MCPServerConfig(name="srv", url="http://127.0.0.1:1/mcp")
    schema = {"type": "object", "properties": {"n": {"type": "integer", "enum": [1, 2]}},
              "required": ["n"]}
    [d] = declare_tools(config, [ListedTool(name="t", input_schema=schema)])
    assert check_arguments(d, {"n": 1}) is None
    bad = check_arguments(d, {"n": 3})
    assert bad is not None and "n: expected one of [1, 2]" in bad.message
    assert mcp_servers.IDEMPOTENCY_META_KEY == IDEMPOTENCY_META_KEY


# --- helpers -----------------------------------------------------------------------------


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


async def wait_until(predicate: Any, timeout: float = WAIT) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.05)


async def wait_for_row(db: Path, sql: str) -> Any:
    found: list[Any] = []

    def check() -> bool:
        found[:] = rows(db, sql) if db.exists() else []
        return bool(found)

    await wait_until(check)
    return found[0][0]
