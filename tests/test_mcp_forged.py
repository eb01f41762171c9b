"""MCP declarations seen from a starter who writes their own: the worker's MCP
configuration (its `tools` allow-list, its flags) is the operator's, and a run whose
declarations ask more is refused before any model request, the server never called.
The real workflow, a real stdio MCP server, the scripted model over HTTP."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import openai
import pytest
from temporalio.client import Client

import boundloop
from boundloop import PolicyRefused
from boundloop.core.mcp_tools import MCPServerConfig, MCPToolDeclaration
from boundloop.scripted.server import ScriptedModelServer
from boundloop.tools.demo import DemoDeps
from tests.scripts import answer, call, resp
from tests.support import mcp_servers
from tests.support.tools import tools as test_tools
from tests.test_mcp_runs import WAIT, calls_of, shop

DELETE = {"type": "object", "properties": {"record": {"type": "string"}},
          "required": ["record"]}


async def forged_run(temporal: Client, tmp_path: Path, server: MCPServerConfig,
                     forge: Any) -> tuple[list[str], ScriptedModelServer]:
    """A worker serving `server`; a run started with `forge(the worker's declarations)`
    whose model calls shop__delete_record. The fields its refusal names, and the model."""
    model = ScriptedModelServer([resp(call("shop__delete_record", {"record": "r1"}, "c1")),
                                 answer("deleted")])
    queue = f"mcp-{uuid.uuid4().hex[:8]}"
    client = openai.AsyncOpenAI(base_url=model.start(), api_key="sk-test-not-real")
    try:
        worker = boundloop.Worker(temporal, test_tools, deps=DemoDeps(data_dir=tmp_path),
                                  model=client, task_queue=queue, mcp_servers=[server],
                                  sticky_timeout=timedelta(seconds=1))
        async with worker:
            declared: list[MCPToolDeclaration] = await asyncio.wait_for(
                worker.mcp_tools(), WAIT)
            run = await boundloop.start(temporal, "消して", tools=[],
                                        mcp_tools=forge(declared), model="scripted-model",
                                        task_queue=queue)
            with pytest.raises(PolicyRefused) as refused:
                await asyncio.wait_for(run.result(), WAIT)
    finally:
        model.stop()
    return [r["field"] for r in refused.value.refusals], model


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "mcp.sqlite3"
    mcp_servers.connect(path).close()
    return path


async def test_a_tool_outside_the_workers_allow_list_is_refused(
        temporal: Client, tmp_path: Path, db: Path) -> None:
    # The operator lets runs read stock only; the starter declares the server's
    # destructive delete_record as if it were allowed, and read-only.
    def forge(declared: list[MCPToolDeclaration]) -> list[MCPToolDeclaration]:
        [lookup] = declared
        return [lookup, lookup.model_copy(update={
            "name": "shop__delete_record", "remote_name": "delete_record",
            "parameters": DELETE, "needs_approval": False, "side_effects": False})]

    fields, model = await forged_run(temporal, tmp_path, shop(db, tools=["lookup"]), forge)
    assert fields == ["mcp_tools.shop__delete_record"]
    assert model.requests == []
    assert calls_of(db, "delete_record") == []


async def test_a_tool_declared_without_the_workers_approval_is_refused(
        temporal: Client, tmp_path: Path, db: Path) -> None:
    # The worker declares delete_record as asking (destructive); the starter drops both
    # of its flags.
    def forge(declared: list[MCPToolDeclaration]) -> list[MCPToolDeclaration]:
        return [d.model_copy(update={"needs_approval": False, "side_effects": False})
                if d.remote_name == "delete_record" else d for d in declared]

    fields, model = await forged_run(temporal, tmp_path, shop(db), forge)
    assert fields == ["mcp_tools.shop__delete_record.needs_approval",
                      "mcp_tools.shop__delete_record.side_effects"]
    assert model.requests == []
    assert calls_of(db, "delete_record") == []
