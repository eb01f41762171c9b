"""`boundloop.Agent`: defined once, validated once, the one place a run's input is made."""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from typing import Any

import pytest
from pydantic import ValidationError

import boundloop
from boundloop.core.limits import Limits, Policy

tools = boundloop.Toolset[None]()


@tools.tool()
def look(sku: str) -> dict[str, str]:
    """Look a SKU up."""
    return {"sku": sku}


@tools.tool(side_effects=True, needs_approval=True)
def order(sku: str) -> dict[str, str]:
    """Order a SKU."""
    return {"ordered": sku}


def test_an_agent_is_checked_when_it_is_made() -> None:
    with pytest.raises(ValidationError, match="model"):
        boundloop.Agent(tools, model="")
    with pytest.raises(ValidationError, match="usd_budget is set but the price table"):
        boundloop.Agent(tools, limits=Limits(usd_budget=1.0))
    with pytest.raises(ValidationError, match="max_output_tokens is not set"):
        boundloop.Agent(tools, budget="team-a")
    with pytest.raises(ValueError, match=r"unknown tools \['teleport'\]"):
        boundloop.Agent(tools, allowed=["look", "teleport"])
    with pytest.raises(ValueError, match=r"name tools that do not exist: \['ship'\]"):
        boundloop.Agent(tools, policy=Policy(approvers={"ship": ["alice"]}))
    with pytest.raises(ValueError, match="no tools"):
        boundloop.Agent([])


def test_an_agent_is_immutable_and_replace_checks_again() -> None:
    agent = boundloop.Agent(tools, model="m", instructions="be brief")
    with pytest.raises(FrozenInstanceError):
        agent.model = "other"  # type: ignore[misc]
    other = agent.replace(model="other", allowed=["look"])
    assert (agent.model, agent.tool_names) == ("m", ("look", "order"))
    assert (other.model, other.tool_names, other.instructions) == ("other", ("look",),
                                                                   "be brief")
    with pytest.raises(ValueError, match="unknown tools"):
        agent.replace(allowed=["nope"])


def test_the_run_input_comes_from_the_agent() -> None:
    agent = boundloop.Agent(tools, model="m", api="chat", limits=Limits(max_steps=3),
                            allowed=["order"], instructions="x")
    inp = agent.run_input("buy A-1")
    assert (inp.question, inp.instructions, inp.tools) == ("buy A-1", "x", ["order"])
    assert (inp.settings.model, inp.settings.api, inp.settings.limits.max_steps) == (
        "m", "chat", 3)


def test_an_agent_of_tool_names_starts_runs_but_serves_no_worker() -> None:
    agent: boundloop.Agent[None] = boundloop.Agent(["look", order])
    assert agent.tool_names == ("look", "order")
    with pytest.raises(TypeError, match="a worker needs the toolset itself"):
        boundloop.Plugin(agent, deps=None)


def test_run_and_session_start_share_one_group_of_limit_flags() -> None:
    from typer.main import get_command

    from boundloop.cli import LIMIT_FLAGS, app

    root: Any = get_command(app)
    session = root.commands["session"]
    for command in (root.commands["run"], session.commands["start"]):
        flags = {p.name for p in command.params}
        assert set(LIMIT_FLAGS) <= flags, command.name
