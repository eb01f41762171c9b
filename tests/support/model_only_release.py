"""A worker of a next release that serves the model requests only (no workflow), with a
toolset that no longer has `lookup_stock`: the half of a deploy without versioning where
a run's workflow task runs on the first release and its model request on this one.

`python -m tests.support.model_only_release TASK_QUEUE MODEL_BASE_URL` (Temporal from
TEMPORAL_ADDRESS); prints "worker started" once it polls.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

import openai
from temporalio.plugin import SimplePlugin

import boundloop
from boundloop import Toolset, Worker
from boundloop.tools.demo import DemoDeps
from boundloop.tools.demo import tools as demo_tools

tools: Toolset[DemoDeps] = Toolset()
tools.include(demo_tools, exclude=["lookup_stock"])


async def main(queue: str, base_url: str) -> None:
    client = await boundloop.connect(os.environ["TEMPORAL_ADDRESS"])
    model = openai.AsyncOpenAI(base_url=base_url, api_key="sk-test-not-real")
    worker = Worker(client, tools, deps=DemoDeps(data_dir=Path(tempfile.mkdtemp())),
                    model=model, task_queue=queue, own_task_queue=False,
                    plugins=[SimplePlugin("no-workflows", workflows=lambda existing: [])])
    async with worker:
        print("worker started", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
