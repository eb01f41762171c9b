"""A user's own worker and client in one script, as the README shows them: the public
logging setup, `boundloop.run_client`, `boundloop.connect()` reading TEMPORAL_ADDRESS, a
tool that raises. Prints the RunResult as JSON.

    TEMPORAL_ADDRESS=... python -m tests.support.own_worker
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import openai

import boundloop
from boundloop.scripted.server import ScriptedModelServer
from boundloop.tools.demo import DemoDeps
from tests.scripts import call, resp
from tests.support.tools import tools


async def main() -> int:
    boundloop.configure_logging()
    server = ScriptedModelServer([resp(call("explode", {"x": "y"}, "c1"))])
    model = openai.AsyncOpenAI(base_url=server.start(), api_key="sk-test-not-real")
    client = await boundloop.connect()  # TEMPORAL_ADDRESS, as `boundloop worker` reads it
    agent = boundloop.Agent(tools, model="scripted-model", allowed=["explode"],
                            task_queue=f"own-{uuid.uuid4().hex[:8]}")
    try:
        async with boundloop.Worker(client, agent, deps=DemoDeps(data_dir=Path(os.environ[
                "BOUNDLOOP_DATA_DIR"])), model=model):
            run = await agent.start(client, "explode, please")
            result = await run.result()
    finally:
        server.stop()
    print(result.model_dump_json())
    return 0 if result.reason == boundloop.StopReason.TOOL_ERROR else 9


if __name__ == "__main__":
    boundloop.run_client(main)
