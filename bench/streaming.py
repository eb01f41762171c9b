"""`python -m bench.streaming` (part of `make bench`): what streaming costs in history.

One run answers a 2,000-token question (about 8,000 characters) unstreamed, then the
same answer streamed over about 5 seconds, written 40 bytes at a time, with a
reader following the run's stream. Reports each run's history bytes and events, the
signals that carried the text (one per batch) and the updates readers wrote (none: they
read by query).
Writes docs/benchmarks-streaming.md.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import openai
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from boundloop import Worker
from boundloop.client import result_of, stream_items
from boundloop.connection import connect
from boundloop.contracts import WORKFLOW_NAME, RunResult, TextDelta, run_input
from boundloop.core.limits import Limits, RunSettings
from boundloop.devserver import DevServer
from boundloop.scripted.server import ScriptedModelServer
from boundloop.testing import free_port
from boundloop.tools.demo import DemoDeps
from boundloop.tools.demo import tools as demo_tools

REPO = Path(__file__).resolve().parent.parent
#: About 2,000 tokens at 4 characters a token.
ANSWER = ("The stock of A-001 is 12 units in the Sapporo warehouse. " * 140)[:8000]
USAGE = {"input_tokens": 50, "output_tokens": 2000, "total_tokens": 2050}


def turn(**extra: Any) -> dict[str, Any]:
    body = {"id": "resp_1", "object": "response", "status": "completed", "usage": USAGE,
            "output": [{"type": "message", "id": "msg_1", "role": "assistant",
                        "status": "completed",
                        "content": [{"type": "output_text", "text": ANSWER,
                                     "annotations": []}]}]}
    return {"body": body, **extra}


async def one(client: Client, queue: str, stream: bool) -> dict[str, Any]:
    inp = run_input("How many A-001?", instructions=None, tools=[], settings=RunSettings(
        model="scripted-model", limits=Limits(), stream=stream))
    handle: WorkflowHandle[Any, RunResult] = await client.start_workflow(
        WORKFLOW_NAME, inp, id=f"bench-stream-{uuid.uuid4().hex[:8]}", task_queue=queue,
        result_type=RunResult)
    deltas = 0

    async def read() -> None:
        nonlocal deltas
        async for item in stream_items(handle):
            deltas += isinstance(item, TextDelta)

    reader = asyncio.create_task(read())
    result = await result_of(handle)
    await asyncio.wait_for(reader, 60)
    kinds: Counter[str] = Counter()
    size = 0
    async for event in handle.fetch_history_events():
        size += event.ByteSize()
        kinds[EventType.Name(event.event_type).removeprefix("EVENT_TYPE_")] += 1
    if result.text != ANSWER:
        raise RuntimeError(f"the {'streamed' if stream else 'unstreamed'} run ended "
                           f"{result.reason.value}, not with the answer")
    return {"stream": stream, "history_bytes": size, "events": sum(kinds.values()),
            "signals": kinds["WORKFLOW_EXECUTION_SIGNALED"],
            "updates": kinds["WORKFLOW_EXECUTION_UPDATE_ACCEPTED"], "deltas": deltas}


async def measure(tmp: Path) -> list[dict[str, Any]]:
    server = DevServer(tmp / "temporal", port=free_port(), ui_port=None).start()
    # About 5 s of writing (the events of 8,000 characters, 5 a piece, are ~240 KB):
    # 2,000-byte writes every 40 ms. The unstreamed twin answers at once.
    model = ScriptedModelServer([turn(), turn(chunk_bytes=2000, chunk_interval_seconds=0.04)])
    try:
        client = await connect(server.address)
        queue = f"bench-stream-{uuid.uuid4().hex[:6]}"
        openai_client = openai.AsyncOpenAI(base_url=model.start(), api_key="sk-not-real")
        async with Worker(client, demo_tools, deps=DemoDeps(data_dir=tmp / "data"),
                          model=openai_client, task_queue=queue):
            return [await one(client, queue, False), await one(client, queue, True)]
    finally:
        model.stop()
        server.stop()


def render(rows: list[dict[str, Any]]) -> str:
    plain, streamed = rows
    lines = [
        "# Benchmark: what streaming costs in history",
        "",
        "Written by `python -m bench.streaming` (part of `make bench`). One run answers",
        "a 2,000-token answer (8,000 characters) unstreamed; the same answer streamed",
        "over about 5 seconds, with one reader following the run's stream.",
        "",
        "| run | history bytes | events | signals (text batches) | reader polls (updates) "
        "| text deltas read |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {'streamed' if r['stream'] else 'unstreamed'} | {r['history_bytes']:,} "
                     f"| {r['events']} | {r['signals']} | {r['updates']} | {r['deltas']} |")
    extra = streamed["history_bytes"] - plain["history_bytes"]
    lines += ["", f"Streaming added {extra:,} bytes ({extra / plain['history_bytes']:.1f}x "
              f"the unstreamed history's {plain['history_bytes']:,}): the text once more, in "
              f"{streamed['signals']} signals of batched deltas (the first after 0.25 s of "
              f"writing, each wait after it twice the one before), and "
              f"{streamed['updates']} updates from the reader (it reads by query).", ""]
    return "\n".join(lines)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="boundloop-bench-stream-") as tmp:
        rows = asyncio.run(measure(Path(tmp)))
    text = render(rows)
    print(text)
    (REPO / "docs" / "benchmarks-streaming.md").write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
