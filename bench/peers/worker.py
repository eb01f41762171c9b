"""`python -m bench.peers.worker --peer NAME`: one peer's worker (run in .venv-peers).

`--peer openai-agents` serves Temporal's OpenAI Agents integration, `--peer pydantic-ai`
pydantic-ai's Temporal integration, each with its own plugin and the SDK's worker
defaults, as their documentation sets them up. Reads TEMPORAL_ADDRESS, OPENAI_BASE_URL
and OPENAI_API_KEY from the environment; prints `ready PID` once polling; SIGTERM
stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker


async def serve(peer: str, queue: str) -> None:
    address = os.environ["TEMPORAL_ADDRESS"]
    kwargs: dict[str, Any]
    if peer == "openai-agents":
        # The traces go to OpenAI's platform by default: nothing leaves this machine.
        from agents import set_tracing_disabled
        from temporalio.openai_agents import ModelActivityParameters, OpenAIAgentsPlugin

        from bench.peers.oai import ACTIVITIES, PeerOpenAIAgents

        set_tracing_disabled(True)
        plugin: Any = OpenAIAgentsPlugin(model_params=ModelActivityParameters(
            start_to_close_timeout=timedelta(seconds=60)))
        kwargs = {"workflows": [PeerOpenAIAgents], "activities": ACTIVITIES}
    elif peer == "pydantic-ai":
        from pydantic_ai.durable_exec.temporal import PydanticAIPlugin

        from bench.peers.pyd import PeerPydanticAI

        plugin = PydanticAIPlugin()
        kwargs = {"workflows": [PeerPydanticAI]}
    else:
        raise SystemExit(f"unknown peer {peer!r}")
    client = await Client.connect(address, plugins=[plugin])
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(Worker(client, task_queue=queue, **kwargs))
        print(f"ready {os.getpid()}", flush=True)
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.peers.worker")
    parser.add_argument("--peer", required=True, choices=["openai-agents", "pydantic-ai"])
    parser.add_argument("--queue", required=True)
    args = parser.parse_args()
    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
    asyncio.run(serve(args.peer, args.queue))


if __name__ == "__main__":
    main()
