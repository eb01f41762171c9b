"""`follow` (`boundloop run --wait`, `watch`) says once that no worker answers a run, and
goes on once one does."""

from __future__ import annotations

import asyncio

from temporalio.client import Client

import boundloop
from boundloop import client as ops
from boundloop.testing import AgentEnvironment, responses, wait_until

tools = boundloop.Toolset[None]()


@tools.tool()
def echo(text: str) -> dict[str, str]:
    """Echo the text."""
    return {"echo": text}


agent = boundloop.Agent(tools, model="m")


async def test_a_run_no_worker_answers_is_said_once_then_followed_to_its_end(
        temporal: Client) -> None:
    env = AgentEnvironment(agent, deps=None, client=temporal,
                           script=[responses.answer("hi")])
    queue = env.agent.task_queue
    run = await env.agent.start(temporal, "hello")  # before its worker is there
    said: list[str] = []

    async def follow() -> list[str]:
        events: list[str] = []
        async for _status, new in ops.follow(run.handle, on_silence=said.append):
            events += [e.event for e in new]
        return events

    following = asyncio.create_task(follow())
    await wait_until(lambda: _true(bool(said)), timeout=60)
    assert said == [queue]
    # A worker comes: the same follow reads the run to its end, saying nothing more.
    async with env:
        events = await asyncio.wait_for(following, timeout=60)
    assert said == [queue]
    assert events[0] == "run_started" and events[-1].startswith("stopped:completed")


async def _true(value: bool) -> bool:
    return value
