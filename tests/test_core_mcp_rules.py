"""MCP tools in the pure core: a declaration's rule validates arguments against the
server's JSON schema (no pydantic model), fingerprints the validated JSON, asks for
approval by the declaration's flags, and checks an approver's edited arguments the same
way. No Temporal, no server."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from boundloop.contracts import Decision
from boundloop.core import approvals
from boundloop.core.fingerprint import fingerprint
from boundloop.core.limits import RunSettings
from boundloop.core.loop import (
    Execute,
    LoopState,
    Reply,
    StepPlan,
    plan_calls,
)
from boundloop.core.mcp_tools import ListedTool, MCPServerConfig, declare_tools, tool_rule
from boundloop.core.turn import Turn

SCHEMA = {"type": "object", "properties": {"record": {"type": "string"},
                                           "count": {"type": "integer", "minimum": 1}},
          "required": ["record"]}
SERVER = MCPServerConfig(name="shop", command="shop-server")
[LOOKUP, DELETE] = declare_tools(SERVER, [
    ListedTool(name="lookup", input_schema=SCHEMA, read_only_hint=True),
    ListedTool(name="delete", input_schema=SCHEMA, destructive_hint=True)])
RULES = {d.name: tool_rule(d) for d in (LOOKUP, DELETE)}
NOW = datetime(2026, 12, 1, tzinfo=UTC)


def state() -> LoopState:
    return LoopState(settings=RunSettings(model="m"), allowed_tools=list(RULES))


def plan(s: LoopState, *calls: tuple[str, Any]) -> list[Execute | Reply]:
    turn = Turn(status="completed", items=[
        {"type": "function_call", "call_id": f"c{i}", "name": name,
         "arguments": args if isinstance(args, str) else json.dumps(args)}
        for i, (name, args) in enumerate(calls)])
    s.steps = 1
    out = plan_calls(s, turn, StepPlan(step=1, tool_choice="auto", last=False), RULES, "wf")
    assert isinstance(out, list)
    return out


def test_valid_arguments_execute_as_json_with_the_declarations_approval() -> None:
    read, write = plan(state(), ("shop__lookup", {"record": "r1"}),
                       ("shop__delete", {"record": "r1", "count": 2}))
    assert isinstance(read, Execute) and isinstance(write, Execute)
    assert (read.arguments, read.needs_approval) == ({"record": "r1"}, False)
    assert (write.arguments, write.needs_approval) == ({"record": "r1", "count": 2}, True)
    assert read.fingerprint == fingerprint("shop__lookup", {"record": "r1"})
    assert write.idempotency_key == "wf/step-1/call-1"


def test_arguments_outside_the_schema_are_invalid_input_and_count_as_identical_calls() -> None:
    s = state()
    bad, again = plan(s, ("shop__lookup", {"record": 5, "count": 0}),
                      ("shop__lookup", {"record": 5, "count": 0}))
    assert isinstance(bad, Reply) and isinstance(again, Reply)
    assert (bad.envelope.status.value, bad.envelope.error_code) == ("invalid_input",
                                                                    "INVALID_ARGUMENTS")
    assert "record: expected string" in bad.envelope.message
    assert "count" in bad.envelope.message
    assert bad.fingerprint == again.fingerprint
    assert s.identical_calls[bad.fingerprint or ""] == 2
    assert s.tool_executions == 0


def test_not_json_and_not_an_object_are_refused_before_the_schema() -> None:
    text, array = plan(state(), ("shop__lookup", "{nope"), ("shop__lookup", "[1]"))
    assert isinstance(text, Reply) and text.envelope.error_code == "INVALID_JSON"
    assert isinstance(array, Reply) and array.envelope.error_code == "INVALID_ARGUMENTS"


def test_edited_arguments_of_an_mcp_call_are_checked_against_its_schema() -> None:
    s = state()
    [write] = plan(s, ("shop__delete", {"record": "r1"}))
    assert isinstance(write, Execute)
    approvals.request(s, write, 1, NOW)
    refused = approvals.check(s, Decision(call_id="c0", approve=True,
                                          arguments={"record": 1}), RULES)
    assert refused is not None and refused.startswith("edited arguments do not match")
    ok = Decision(call_id="c0", approve=True, arguments={"record": "r2"})
    assert approvals.check(s, ok, RULES) is None
    approvals.apply(s, ok, NOW, RULES)
    [approval] = s.approvals
    edited = approvals.approved_plan(write, approval)
    assert edited.arguments == {"record": "r2"}
    assert edited.fingerprint == fingerprint("shop__delete", {"record": "r2"})
