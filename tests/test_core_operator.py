"""The operator's policy (boundloop.core.operator): a run may only tighten it."""

from __future__ import annotations

from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import ValidationError

from boundloop.core.limits import RunSettings
from boundloop.core.mcp_tools import MCPToolDeclaration
from boundloop.core.operator import (
    OperatorPolicy,
    Refusal,
    ToolDeclared,
    resolve,
    unserved_tools_line,
)
from boundloop.core.signatures import key_text

ALICE = key_text(Ed25519PrivateKey.generate().public_key())
MALLORY = key_text(Ed25519PrivateKey.generate().public_key())
PRICE = {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0}
DECLARED = {"lookup_stock": ToolDeclared(side_effects=False, needs_approval=False),
            "create_ticket": ToolDeclared(side_effects=True, needs_approval=True)}
TOOLS = ["lookup_stock", "create_ticket"]


def _operator(**kw: Any) -> OperatorPolicy:
    return OperatorPolicy.model_validate(kw)


def _resolve(op: OperatorPolicy, settings: dict[str, Any], tools: list[str] = TOOLS,
             mcp: list[MCPToolDeclaration] = ()) -> RunSettings | list[Refusal]:  # type: ignore[assignment]
    return resolve(op, RunSettings.model_validate({"model": "m", **settings}), tools=tools,
                   declared=DECLARED, mcp_tools=mcp)


def _fields(result: RunSettings | list[Refusal]) -> list[str]:
    assert isinstance(result, list), result
    return [r.field for r in result]


def test_no_operator_policy_changes_nothing() -> None:
    settings = RunSettings(model="m")
    assert resolve(OperatorPolicy(), settings, tools=TOOLS, declared=DECLARED) == settings


def test_approval_never_against_a_tool_that_asks_is_refused() -> None:
    refused = _resolve(OperatorPolicy(), {"policy": {"approval": "never"}})
    assert _fields(refused) == ["policy.approval"]
    assert isinstance(refused, list) and "create_ticket" in refused[0].operator
    # Without such a tool the run may say never.
    assert isinstance(_resolve(OperatorPolicy(), {"policy": {"approval": "never"}},
                               tools=["lookup_stock"]), RunSettings)


def test_operator_always_asks_through_a_rule_and_refuses_never() -> None:
    op = _operator(approval={"lookup_*": {"approval": "always"}})
    assert _fields(_resolve(op, {"policy": {"approval": "never"}}, tools=["lookup_stock"])) \
        == ["policy.approval"]
    got = _resolve(op, {}, tools=["lookup_stock"])
    assert isinstance(got, RunSettings)
    assert [(r.tool, r.action) for r in got.policy.rules] == [("lookup_stock", "ask")]


def test_a_self_added_approver_key_is_refused_a_subset_is_kept() -> None:
    op = _operator(approver_keys={"alice": ALICE})
    assert _fields(_resolve(op, {"policy": {"approver_keys": {"mallory": MALLORY}}})) \
        == ["policy.approver_keys.mallory"]
    assert _fields(_resolve(op, {"policy": {"approver_keys": {"alice": MALLORY}}})) \
        == ["policy.approver_keys.alice"]
    got = _resolve(op, {})
    assert isinstance(got, RunSettings) and got.policy.approver_keys == {"alice": ALICE}


def test_without_operator_keys_a_runs_own_keys_only_tighten() -> None:
    got = _resolve(OperatorPolicy(), {"policy": {"approver_keys": {"mallory": MALLORY}}})
    assert isinstance(got, RunSettings) and got.policy.approver_keys == {"mallory": MALLORY}


def test_approver_names_only_from_the_operators() -> None:
    op = _operator(approval={"create_ticket": {"approvers": ["alice", "bob"]}})
    assert _fields(_resolve(op, {"policy": {"approvers": {"create_ticket": ["mallory"]}}})) \
        == ["policy.approvers.create_ticket"]
    assert _fields(_resolve(op, {"policy": {"approvers": {"create_ticket": []}}})) \
        == ["policy.approvers.create_ticket"]
    got = _resolve(op, {"policy": {"approvers": {"create_ticket": ["bob"]}}})
    assert isinstance(got, RunSettings) and got.policy.approvers == {"create_ticket": ["bob"]}
    got = _resolve(op, {})
    assert isinstance(got, RunSettings)
    assert got.policy.approvers == {"create_ticket": ["alice", "bob"]}


def test_prices_are_the_operators_only() -> None:
    op = _operator(prices={"m": PRICE})
    zero = {"input_usd_per_mtok": 0.0, "output_usd_per_mtok": 0.0}
    assert _fields(_resolve(op, {"policy": {"prices": {"m": zero}}})) == ["policy.prices.m"]
    # The run's own table (RunSettings needs one for a usd_budget) may only repeat it.
    got = _resolve(op, {"limits": {"usd_budget": 0.01}, "policy": {"prices": {"m": PRICE}}})
    assert isinstance(got, RunSettings) and got.policy.prices["m"].input_usd_per_mtok == 1.0
    # A USD budget with a model the operator has no price for.
    assert _fields(_resolve(OperatorPolicy(), {"policy": {"prices": {"m": zero}},
                                               "limits": {"usd_budget": 0.01}})) \
        == ["policy.prices.m", "limits.usd_budget"]


def test_budget_required_and_fixed_key() -> None:
    op = _operator(budget={"key": "team-a", "required": True})
    assert _fields(_resolve(op, {})) == ["budget"]
    other = {"budget": "team-b", "limits": {"max_output_tokens": 100}}
    refused = _resolve(op, other)
    assert isinstance(refused, list) and refused[0].operator == "team-a"
    assert isinstance(_resolve(op, {**other, "budget": "team-a"}), RunSettings)


def test_limits_over_the_ceiling_are_refused_lower_ones_run() -> None:
    op = _operator(limits={"max": {"max_steps": 10, "deadline_seconds": 3600,
                                   "max_output_tokens": 512}})
    refused = _resolve(op, {"limits": {"max_steps": 11, "deadline_seconds": 1e6}})
    assert _fields(refused) == ["limits.max_steps", "limits.deadline_seconds"]
    assert isinstance(refused, list) and refused[0].operator == "at most 10"
    got = _resolve(op, {"limits": {"max_steps": 3}, "policy": {}})
    assert isinstance(got, RunSettings) and got.limits.max_steps == 3
    # An unset optional limit gets its ceiling (the run asked no more than it).
    assert got.limits.max_output_tokens == 512


def test_a_ceiling_below_the_builtin_default_is_what_a_run_that_set_nothing_gets() -> None:
    # A newcomer's policy: ceilings under boundloop's defaults (5 steps, 600 s, 86,400 s)
    # and no [limits.defaults]; every run that set nothing was refused for "asking" them.
    op = _operator(limits={"max": {"max_steps": 4, "deadline_seconds": 300,
                                   "approval_timeout_seconds": 3600}})
    got = _resolve(op, {})
    assert isinstance(got, RunSettings)
    assert (got.limits.max_steps, got.limits.deadline_seconds,
            got.limits.approval_timeout_seconds) == (4, 300.0, 3600.0)
    assert _resolve(op, {"limits": {"max_steps": 3}}).limits.max_steps == 3  # type: ignore[union-attr]
    assert _fields(_resolve(op, {"limits": {"max_steps": 6}})) == ["limits.max_steps"]
    # The operator's own default over its own ceiling would refuse every run: refused.
    with pytest.raises(ValidationError,
                       match=r"defaults\.max_steps = 5 is over max\.max_steps = 4"):
        _operator(limits={"max": {"max_steps": 4}, "defaults": {"max_steps": 5}})


def test_limit_defaults_apply_where_the_run_leaves_the_builtin_default() -> None:
    op = _operator(limits={"defaults": {"max_steps": 8}})
    got = _resolve(op, {})
    assert isinstance(got, RunSettings) and got.limits.max_steps == 8
    got = _resolve(op, {"limits": {"max_steps": 2}})
    assert isinstance(got, RunSettings) and got.limits.max_steps == 2


def test_tools_outside_the_allowed_set_are_refused() -> None:
    op = _operator(tools=["lookup_*"])
    assert _fields(_resolve(op, {})) == ["tools"]
    assert isinstance(_resolve(op, {}, tools=["lookup_stock"]), RunSettings)


def _mcp(needs_approval: bool, side_effects: bool) -> MCPToolDeclaration:
    return MCPToolDeclaration(name="shop__delete_record", server="shop",
                              remote_name="delete_record", description="d", parameters={},
                              strict=False, needs_approval=needs_approval,
                              side_effects=side_effects)


def test_an_mcp_declaration_looser_than_the_operators_is_refused() -> None:
    op = _operator(approval={"shop__delete_*": {"approval": "always", "side_effects": True}})
    refused = _resolve(op, {}, tools=["shop__delete_record"], mcp=[_mcp(False, False)])
    assert _fields(refused) == ["mcp_tools.shop__delete_record.needs_approval",
                                "mcp_tools.shop__delete_record.side_effects"]
    assert isinstance(_resolve(op, {}, tools=["shop__delete_record"], mcp=[_mcp(True, True)]),
                      RunSettings)


def test_operator_rules_come_first_and_allow_rules_do_not_loosen() -> None:
    op = _operator(rules=[{"tool": "transfer", "when": "amount > 100", "action": "ask"},
                          {"tool": "lookup_*", "action": "allow"}])
    got = _resolve(op, {"policy": {"rules": [{"tool": "transfer", "action": "deny"}]}},
                   tools=["lookup_stock"])
    assert isinstance(got, RunSettings)
    assert [(r.when, r.action) for r in got.policy.rules] == [("amount > 100", "ask"),
                                                               (None, "deny")]


def test_every_refusal_is_reported_at_once() -> None:
    op = _operator(approver_keys={"alice": ALICE}, budget={"required": True},
                   limits={"max": {"max_steps": 5}})
    refused = _resolve(op, {"policy": {"approval": "never", "approver_keys": {"m": MALLORY}},
                            "limits": {"max_steps": 50}})
    assert _fields(refused) == ["policy.approval", "policy.approver_keys.m", "budget",
                                "limits.max_steps"]
    assert isinstance(refused, list)
    assert refused[3].line() == "limits.max_steps: the run asked 50; the operator's policy: " \
        "at most 5"


@pytest.mark.parametrize("bad", [{"limits": {"max": {"nope": 1}}},
                                 {"limits": {"max": {"max_steps": 0}}},
                                 {"limits": {"defaults": {"max_steps": -1}}},
                                 {"approval": {"x": {"approval": "never"}}},
                                 {"prices": {"m": {"input_usd_per_mtok": -1}}},
                                 {"surprise": 1}])
def test_a_bad_operator_policy_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        OperatorPolicy.model_validate(bad)


def _resolve_as(op: OperatorPolicy, settings: dict[str, Any],
                attributes: dict[str, str]) -> RunSettings | list[Refusal]:
    return resolve(op, RunSettings.model_validate({"model": "m", **settings}), tools=TOOLS,
                   declared=DECLARED, search_attributes=attributes)


def test_a_budget_key_derived_from_the_runs_search_attribute() -> None:
    op = _operator(budget={"key_from": "tenant-{BoundloopTenant}"},
                   limits={"max": {"max_output_tokens": 100}})
    got = _resolve_as(op, {}, {"BoundloopTenant": "acme"})
    assert isinstance(got, RunSettings) and got.budget == "tenant-acme"
    out = {"limits": {"max_output_tokens": 50}}
    got = _resolve_as(op, {"budget": "tenant-acme", **out}, {"BoundloopTenant": "acme"})
    assert isinstance(got, RunSettings) and got.budget == "tenant-acme"
    # Missing (or empty): refused naming the attribute; another key: refused naming it.
    for attributes in ({}, {"BoundloopTenant": ""}, {"Other": "acme"}):
        refused = _resolve_as(op, {}, attributes)
        assert isinstance(refused, list) and [r.line() for r in refused] == [
            "search_attributes.BoundloopTenant: the run asked none; the operator's policy: "
            "required: the budget key is tenant-{BoundloopTenant}"]
    refused = _resolve_as(op, {"budget": "tenant-bigco", **out}, {"BoundloopTenant": "acme"})
    assert isinstance(refused, list) and [r.line() for r in refused] == [
        "budget: the run asked tenant-bigco; the operator's policy: tenant-acme (from "
        "tenant-{BoundloopTenant})"]
    # A value that makes no valid key is refused, never spent from.
    assert _fields(_resolve_as(op, {}, {"BoundloopTenant": "a b"})) == ["budget"]


@pytest.mark.parametrize("rule", [{"key_from": "tenant"}, {"key_from": "a b {X}"},
                                  {"key_from": "{X}", "key": "team-a"}])
def test_a_key_from_template_is_checked_when_the_policy_is_read(rule: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        OperatorPolicy.model_validate({"budget": rule})


def test_every_per_tool_entry_must_name_a_served_tool() -> None:
    served = ["lookup_stock", "create_ticket", "shop__delete_record"]
    assert unserved_tools_line(_operator(
        tools=["lookup_*", "create_ticket", "shop__*"],
        approval={"create_ticket": {"approval": "always"}, "shop__delete_*": {}},
        rules=[{"tool": "lookup_stock", "action": "ask"}],
        limits={"defaults": {"per_tool_max_calls": {"lookup_stock": 2}}}), served) is None
    line = unserved_tools_line(_operator(
        tools=["lookup_*", "creat_ticket"], approval={"no_such_tool": {}},
        rules=[{"tool": "transfer*", "action": "deny"}],
        limits={"defaults": {"per_tool_max_calls": {"lookup_stok": 2}}}), served)
    assert line == ("tools 'creat_ticket', approval.no_such_tool, rules[0].tool 'transfer*', "
                    "limits.defaults.per_tool_max_calls.lookup_stok: no tool this worker "
                    "serves has those names (it serves: lookup_stock, create_ticket, "
                    "shop__delete_record)")
    # Prices are per model, not per tool: never checked against the tools.
    assert unserved_tools_line(_operator(prices={"gpt-x": PRICE}), served) is None
