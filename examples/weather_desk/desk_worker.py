"""The weather desk's worker: its tools, their dependencies, a model client.

    python examples/weather_desk/desk_worker.py [--temporal HOST:PORT] [--data-dir .weather]

The model endpoint comes from the openai SDK's own settings (OPENAI_API_KEY,
OPENAI_BASE_URL).
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import httpx2 as httpx
from desk import Desk, agent
from openai import AsyncOpenAI
from weather_service import start as start_weather_service

import boundloop


async def main(temporal: str | None, task_queue: str, data_dir: Path) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    weather_url, service = start_weather_service()
    client = await boundloop.connect(temporal)
    async with httpx.AsyncClient(base_url=weather_url) as weather:
        desk = Desk(weather=weather, store=data_dir / "warnings.sqlite3")
        worker = boundloop.Worker(client, agent.replace(task_queue=task_queue), deps=desk,
                                  model=AsyncOpenAI())
        print(f"weather desk worker on {task_queue}", flush=True)
        await worker.run()
    service.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--temporal", default=None,
                        help="default: TEMPORAL_ADDRESS, else 127.0.0.1:7233")
    parser.add_argument("--task-queue", default="weather-desk")
    parser.add_argument("--data-dir", type=Path, default=Path(".weather"))
    args = parser.parse_args()
    # Temporal not reached: one line (`error: cannot reach Temporal at …`), exit 4.
    boundloop.run_client(functools.partial(main, args.temporal, args.task_queue,
                                           args.data_dir))
