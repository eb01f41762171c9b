"""Ask the weather desk a question, approve its warning, print the RunResult.

    python examples/weather_desk/desk_client.py "Storm coming to Osaka on 2026-12-03?"
"""

from __future__ import annotations

import argparse
import functools
import json

from desk import agent

import boundloop


async def main(question: str, temporal: str | None, task_queue: str, model: str) -> None:
    client = await boundloop.connect(temporal)
    desk = agent.replace(task_queue=task_queue, model=model)
    run = await desk.start(client, question)
    print(f"run {run.id}")
    async for event in run.events():
        print(f"  step {event.step} · {event.event}" + (f" · {event.tool}" if event.tool else ""))
        if event.event == "approval_requested":
            for call in await run.pending():
                print(f"waiting for approval: {call.tool} {json.dumps(call.arguments)}")
                await run.approve(call.call_id, approver="duty-officer")
    result = await run.result()
    print(result.model_dump_json(indent=2, exclude={"events"}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("question")
    parser.add_argument("--temporal", default=None,
                        help="default: TEMPORAL_ADDRESS, else 127.0.0.1:7233")
    parser.add_argument("--task-queue", default="weather-desk")
    parser.add_argument("--model", default="gpt-5-mini")
    args = parser.parse_args()
    # Exits with main's status in every path, without the interpreter teardown in which
    # the SDK's runtime can abort (temporalio/sdk-python#300).
    boundloop.run_client(functools.partial(main, args.question, args.temporal,
                                           args.task_queue, args.model))
