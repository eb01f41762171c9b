"""The weather desk's tools: a forecast from an HTTP service, the crew on duty, and a
weather warning that a person approves before it goes out."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import date
from enum import StrEnum
from pathlib import Path

import httpx2 as httpx  # the HTTP client the openai SDK installs

import boundloop
from boundloop import ToolContext


@dataclass(frozen=True)
class Desk:
    """What the worker hands every tool as `ctx.deps`."""

    weather: httpx.AsyncClient  # base_url: the weather service
    store: Path  # the warnings database (SQLite)


class Shift(StrEnum):
    MORNING = "morning"
    NIGHT = "night"


class Level(StrEnum):
    YELLOW = "yellow"
    RED = "red"


tools = boundloop.Toolset[Desk]()


@tools.tool()
async def forecast(ctx: ToolContext[Desk], city: str, day: date) -> dict[str, object]:
    """The weather forecast for a city on a day."""
    reply = await ctx.deps.weather.get("/forecast", params={"city": city, "day": str(day)})
    reply.raise_for_status()
    return dict(reply.json())


@tools.tool()
def crew_on_duty(day: date, shift: Shift) -> dict[str, object]:
    """Who is on duty on a day's shift."""
    crew = ["Aiko", "Ben", "Chen", "Dana"]
    first = (day.toordinal() * 2 + (shift is Shift.NIGHT)) % len(crew)
    return {"day": str(day), "shift": shift.value,
            "crew": [crew[first], crew[(first + 1) % len(crew)]]}


@tools.tool(side_effects=True, needs_approval=True, terminal=True)
def issue_warning(ctx: ToolContext[Desk], city: str, day: date, level: Level) -> dict[str, object]:
    """Publish a weather warning. A person approves it first; call it once."""
    with sqlite3.connect(ctx.deps.store) as db:
        db.execute("CREATE TABLE IF NOT EXISTS warnings (key TEXT PRIMARY KEY, city TEXT,"
                   " day TEXT, level TEXT)")
        # The idempotency key makes a retried execution change nothing.
        db.execute("INSERT OR IGNORE INTO warnings VALUES (?, ?, ?, ?)",
                   (ctx.idempotency_key, city, str(day), level.value))
        (count,) = db.execute("SELECT count(*) FROM warnings").fetchone()
    return {"published": True, "warnings_in_store": count}


# The agent, defined once: its worker serves it, its client starts runs of it.
agent = boundloop.Agent(
    tools, model="gpt-5-mini", task_queue="weather-desk",
    instructions="You are a weather desk. Check the forecast before any warning.",
    limits=boundloop.Limits(max_steps=6))
