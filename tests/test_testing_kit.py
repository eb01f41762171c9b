"""`boundloop.testing`, the public kit: the documented example runs as written, and the
kit scripts both APIs (what the project's own tests build on)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from temporalio.client import Client

import boundloop
from boundloop.testing import AgentEnvironment, chat, responses

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "weather_desk" / "test_desk.py"

tools = boundloop.Toolset[dict[str, int]]()


@tools.tool()
def stock(ctx: boundloop.ToolContext[dict[str, int]], sku: str) -> dict[str, int]:
    """Units in stock."""
    return {"units": ctx.deps[sku]}


def test_the_testing_page_shows_the_example_verbatim() -> None:
    page = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
    code = EXAMPLE.read_text(encoding="utf-8")
    assert f"`examples/weather_desk/test_desk.py`:\n\n```python\n{code}```" in page


def test_the_documented_example_passes() -> None:
    # As a user runs it: pytest in the example's directory, its own dev server.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull,
         "--rootdir", str(EXAMPLE.parent), "-o", "asyncio_mode=auto", EXAMPLE.name],
        cwd=EXAMPLE.parent, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "3 passed" in done.stdout


async def test_the_kit_scripts_a_chat_model_and_its_failures(temporal: Client) -> None:
    agent = boundloop.Agent(tools, model="m", api="chat")
    # A 503 is retried; a truncated body stops the run with `protocol_error`.
    script = [chat.error(503, "busy"), chat.call("stock", {"sku": "A-1"}, "call_a"),
              chat.raw('{"id": "chatcmpl-3", "choices": [')]
    async with AgentEnvironment(agent, deps={"A-1": 12}, script=script,
                                client=temporal) as env:
        result = await env.run("How many A-1?")
    assert (result.reason, result.tool_executions) == ("protocol_error", 1)
    assert [r.path for r in env.requests] == ["/v1/chat/completions"] * 3
    tool_message = env.requests[2].body["messages"][-1]
    assert (tool_message["role"], tool_message["tool_call_id"]) == ("tool", "call_a")
    assert '"units":12' in tool_message["content"].replace(" ", "")


async def test_the_kit_decides_approvals_by_call_id(temporal: Client) -> None:
    gated = boundloop.Toolset[None]()

    @gated.tool(side_effects=True, needs_approval=True)
    def ship(sku: str) -> dict[str, str]:
        """Ship a SKU."""
        return {"shipped": sku}

    agent = boundloop.Agent(gated, model="m")
    script = [responses.calls(("ship", {"sku": "A"}, "call_a"), ("ship", {"sku": "B"}, "call_b")),
              responses.answer("Shipped A only.", number=2)]
    async with AgentEnvironment(agent, deps=None, script=script, client=temporal) as env:
        run = await env.start("Ship A and B.")
        rejected = await env.reject(run, "call_b", reason="B is on hold")
        approved = await env.approve(run, "call_a")
        result = await env.result(run)
    assert (approved.arguments, rejected.arguments) == ({"sku": "A"}, {"sku": "B"})
    assert (result.reason, result.tool_executions) == ("completed", 1)


async def test_calls_without_ids_get_unique_ones_and_a_reused_id_is_named(
        temporal: Client) -> None:
    """A script of several `responses.call(...)` with no call id runs to the stop it was
    written for (here `max_steps`), not `protocol_error`; a call id the script does
    reuse ends the run `protocol_error` with a text naming that id."""
    agent = boundloop.Agent(tools, model="m", limits=boundloop.Limits(max_steps=3))
    deps = {"A-1": 1, "A-2": 2, "A-3": 3}
    script = [responses.call("stock", {"sku": f"A-{n}"}, number=n) for n in (1, 2, 3)]
    async with AgentEnvironment(agent, deps=deps, script=script, client=temporal) as env:
        result = await env.run("Count them.")
    assert (result.reason, result.tool_executions) == ("max_steps", 2)
    script = [responses.call("stock", {"sku": "A-1"}, "call_same"),
              responses.calls(("stock", {"sku": "A-2"}), ("stock", {"sku": "A-3"}, "call_same"),
                              number=2)]
    async with AgentEnvironment(agent, deps=deps, script=script, client=temporal) as env:
        result = await env.run("Count them.")
    assert (result.reason, result.tool_executions) == ("protocol_error", 1)
    assert "reused call id 'call_same' (tool 'stock')" in result.text


def test_the_testing_page_and_the_reference_name_the_environments_attributes_alike() -> None:
    """docs/testing.md and boundloop.testing's docstrings (the API reference) name what
    the model was sent the same way, and every `env.…` they name is there."""
    import re

    import boundloop.testing as kit

    page = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
    reference = "\n".join(d for d in (kit.__doc__, kit.AgentEnvironment.__doc__) if d)
    for text in (page, reference):
        assert "`env.requests`" in text
        assert "env.model.requests" not in text
        env = AgentEnvironment(boundloop.Agent(tools, model="m"), deps={}, script=[])
        for name in set(re.findall(r"\benv\.(\w+)", text)):
            assert name in vars(env) or hasattr(AgentEnvironment, name), name


async def test_the_kit_approves_a_call_waiting_in_a_sub_agent(temporal: Client,
                                                              tmp_path: Path) -> None:
    """`env.approve(run)` finds the call a sub-agent waits on and decides it there; the
    tree then completes and the ticket exists once."""
    from boundloop.tools.demo import DemoDeps, list_tickets
    from tests.support.tools import tools as test_tools

    clerk = boundloop.Agent(test_tools, allowed=["create_ticket"], model="scripted-model")
    desk = boundloop.Agent(test_tools, allowed=["lookup_stock"], model="scripted-model",
                           agents=[clerk.as_tool("clerk", "Files tickets")])
    ticket = {"title": "Printer jam", "description": "Tray 2 jams", "priority": "normal"}
    script = [responses.call("clerk", {"question": "File a ticket"}, "p1"),
              responses.call("create_ticket", ticket, "c1", number=2),
              responses.answer("Filed.", number=3),
              responses.answer("The clerk filed it.", number=4)]
    async with AgentEnvironment(desk, deps=DemoDeps(data_dir=tmp_path), script=script,
                                client=temporal) as env:
        run = await env.start("Please file a ticket")
        waiting = await env.approve(run, approver="duty-officer")
        result = await env.result(run)
    assert (waiting.tool, waiting.call_id) == ("create_ticket", "c1")
    assert result.reason == "completed"
    assert len(list_tickets(tmp_path)) == 1
