"""A writer agent that delegates research to a researcher agent: a bounded agent tree.

    python examples/agent_tree.py

Runs offline: an embedded Temporal dev server, a worker in this process and a scripted
model standing in for a real one (its answers are written below, in the order the two
agents ask). With a real model, the agents and the worker are the same: start a
`boundloop.Worker(client, writer, deps=..., model=AsyncOpenAI())` and
`await writer.start(client, question)`.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import boundloop
from boundloop.testing import AgentEnvironment, responses

tools = boundloop.Toolset[None]()

NOTES = {"kyoto": "Kyoto has 1,600 temples; the busiest season is November (autumn leaves).",
         "nara": "Nara's deer park has about 1,300 deer; it is a 45-minute train from Kyoto."}


@tools.tool()
def search_notes(topic: str) -> dict[str, Any]:
    """Search the travel notes for a topic (a city name)."""
    return {"topic": topic, "note": NOTES.get(topic.lower(), "no notes")}


@tools.tool()
def word_count(text: str) -> dict[str, int]:
    """Count the words of a draft."""
    return {"words": len(text.split())}


# One toolset serves both agents; each agent picks its own tools.
researcher = boundloop.Agent(tools, allowed=["search_notes"], model="gpt-5-mini",
                             instructions="Answer from the travel notes only.",
                             limits=boundloop.Limits(max_steps=4))
writer = boundloop.Agent(
    tools, allowed=["word_count"], model="gpt-5-mini",
    instructions="Write short travel blurbs. Ask the researcher for facts.",
    limits=boundloop.Limits(token_threshold=20_000, max_children=3),
    agents=[researcher.as_tool("research", "Finds facts about a city in the travel notes")])

# What the scripted model answers, in the order the requests come: the writer asks the
# researcher (a child run), which searches and answers; then the writer writes.
SCRIPT = [
    responses.call("research", {"question": "What should a visitor know about Kyoto?"}),
    responses.call("search_notes", {"topic": "kyoto"}),
    responses.answer("Kyoto has 1,600 temples; November is the busiest season."),
    responses.answer("Kyoto: 1,600 temples, best (and busiest) in November's autumn leaves."),
]


async def main() -> None:
    async with AgentEnvironment(writer, deps=None, script=SCRIPT) as env:
        run = await env.start("Write a one-line blurb about Kyoto.")
        result = await env.result(run)
        print(f"reason: {result.reason.value}")
        print(f"answer: {result.text}")
        print(f"tree total: {result.total_tokens} tokens, {result.steps} steps, "
              f"{result.tool_executions} tool executions")
        for child in (await run.status()).children:
            print(f"  └ {child.tool}: {child.state}, {child.total_tokens} of "
                  f"{child.token_allowance} tokens allowed")
        for event in result.events:
            if event.event.startswith("subagent_"):
                print(f"  step {event.step} · {event.event} · {event.detail}")


if __name__ == "__main__":
    asyncio.run(main())
    sys.stdout.flush()
    os._exit(0)  # sdk-python #300: the interpreter may abort at exit after a worker ran
