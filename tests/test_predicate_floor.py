"""A tool whose `needs_approval` is a predicate may ask, so for the operator's floor it
counts as a tool that asks: a run cannot say `approval: never` for it, with or without a
policy file (real workflow, dev server, scripted model)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import openai
import pytest
from temporalio.client import Client

from boundloop import OperatorPolicy, PolicyRefused, ToolContext, Toolset, Worker
from boundloop.client import result_of
from boundloop.contracts import WORKFLOW_NAME, RunInput, RunResult
from boundloop.core.limits import RunSettings
from boundloop.scripted.server import ScriptedModelServer
from tests.conftest import RUN_TIMEOUT
from tests.scripts import answer

tools = Toolset[None]()


@tools.tool(side_effects=True, needs_approval=lambda args: args.amount > 100)
def transfer(ctx: ToolContext[None], amount: int) -> dict[str, Any]:
    """Move money; transfers over 100 need a person's approval."""
    return {"moved": amount}


@pytest.mark.parametrize("policy", [None, OperatorPolicy()], ids=["no policy", "policy"])
async def test_approval_never_is_refused_for_a_predicate_tool(
        temporal: Client, tmp_path: Path, policy: OperatorPolicy | None) -> None:
    model = ScriptedModelServer([answer("done")])
    model.start()
    queue = f"q-{uuid.uuid4().hex[:8]}"
    llm = openai.AsyncOpenAI(base_url=model.base_url, api_key="sk-test-not-real")
    inp = RunInput(question="move 50", tools=["transfer"], settings=RunSettings.model_validate(
        {"model": "scripted-model", "policy": {"approval": "never"}}))
    try:
        async with Worker(temporal, tools, deps=None, model=llm, task_queue=queue,
                          policy=policy):
            handle = await temporal.start_workflow(
                WORKFLOW_NAME, inp, id=f"pred-{uuid.uuid4().hex[:12]}", task_queue=queue,
                result_type=RunResult)
            with pytest.raises(PolicyRefused) as refused:
                await asyncio.wait_for(result_of(handle), RUN_TIMEOUT)
    finally:
        model.stop()
    assert refused.value.lines() == [
        "policy.approval: the run asked never; the operator's policy: approval required "
        "for transfer"]
    assert model.requests == []
