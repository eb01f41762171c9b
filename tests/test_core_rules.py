"""Argument rules: the condition language, refusals at validation, strictest match wins."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from boundloop.core.rules import ArgumentRule, evaluate, matches

TRANSFER = [ArgumentRule(tool="transfer", when="amount > 100", action="ask"),
            ArgumentRule(tool="transfer", when="amount > 10000", action="deny",
                         reason="over the daily limit")]


def rule(when: str | None, action: str = "ask", tool: str = "t") -> ArgumentRule:
    return ArgumentRule.model_validate({"tool": tool, "when": when, "action": action})


@pytest.mark.parametrize(("amount", "action", "text"), [
    (5, None, None), (100, None, None), (100.5, "ask", "amount > 100"),
    (10000, "ask", "amount > 100"), (10001, "deny", "amount > 10000 (over the daily limit)")])
def test_transfer_rules(amount: float, action: str | None, text: str | None) -> None:
    verdict = evaluate(TRANSFER, "transfer", {"amount": amount, "to": "acct"})
    assert (verdict and verdict.action) == action
    assert (verdict and verdict.text) == text


def test_strictest_wins_whatever_the_order() -> None:
    for rules in (TRANSFER, list(reversed(TRANSFER))):
        verdict = evaluate(rules, "transfer", {"amount": 50000})
        assert verdict is not None and verdict.action == "deny"
    allow = ArgumentRule(tool="transfer", action="allow")
    verdict = evaluate([allow, *TRANSFER], "transfer", {"amount": 500})
    assert verdict is not None and verdict.action == "ask"
    verdict = evaluate([allow, *TRANSFER], "transfer", {"amount": 5})
    assert verdict is not None and verdict.action == "allow"


def test_globs_match_tool_names_case_sensitively() -> None:
    rules = [ArgumentRule(tool="delete_*", action="ask")]
    assert evaluate(rules, "delete_record", {}) is not None
    assert evaluate(rules, "Delete_record", {}) is None
    assert evaluate(rules, "undelete_record", {}) is None
    verdict = evaluate(rules, "delete_x", {})
    assert verdict is not None and verdict.text == "delete_*"


@pytest.mark.parametrize(("when", "args", "expected"), [
    ('priority in ["high", "urgent"]', {"priority": "urgent"}, True),
    ('priority in ["high", "urgent"]', {"priority": "low"}, False),
    ('priority not in ["high", "urgent"]', {"priority": "low"}, True),
    ('customer.tier == "gold" and not refund', {"customer": {"tier": "gold"}, "refund": False},
     True),
    ('customer.tier == "gold" and not refund', {"customer": {"tier": "gold"}, "refund": True},
     False),
    ("amount > 100 or currency != 'USD'", {"amount": 1, "currency": "EUR"}, True),
    ("10 < amount <= 100", {"amount": 100}, True),
    ("10 < amount <= 100", {"amount": 101}, False),
    ("amount >= -5", {"amount": -5}, True),
    ("note == null", {"note": None}, True),
    ("urgent", {"urgent": True}, True),
    ("urgent == true", {"urgent": True}, True),
    ('"@" in email', {"email": "a@b"}, True),
    ("count == 1", {"count": True}, False),  # JSON kinds: a boolean is not the number 1
    ("tags == ['a', 'b']", {"tags": ["a", "b"]}, True),
])
def test_conditions(when: str, args: dict[str, Any], expected: bool) -> None:
    assert matches(rule(when), "t", args) is expected


@pytest.mark.parametrize(("when", "args"), [
    ("amount > 100", {}),                   # missing field
    ("amount > 100", {"amount": "lots"}),   # a text compared with a number
    ("customer.tier == 'gold'", {"customer": "gold"}),  # a path through a non-object
    ("urgent", {"urgent": "yes"}),          # not a boolean
    ("count > true", {"count": 2}),
])
def test_undecidable_conditions_fail_closed(when: str, args: dict[str, Any]) -> None:
    assert matches(rule(when, "ask"), "t", args)
    assert matches(rule(when, "deny"), "t", args)
    assert not matches(rule(when, "allow"), "t", args)


@pytest.mark.parametrize(("when", "says"), [
    ("__import__('os').system('id')", "function call"),
    ("open('x')", "function call"),
    ("amount + 1 > 2", "arithmetic"),
    ("amount[0] > 1", "indexing"),
    ("amount > ", "not a valid condition"),
    ("lambda: 1", "lambda"),
    ("x if y else z", "if/else"),
    ("amount is None", "unsupported comparison"),
    ("amount", None),  # a bare path is a boolean test: valid
    ("", "empty"),
    ("a.__class__ == 1", None),  # a dotted path only reads argument keys
    ("x == {'a': 1}", "mapping"),
    ("f'{x}' == 'y'", "cannot be compared"),
    ("x = 1", "not a valid condition"),
    ("1 > 2; 3", "not a valid condition"),
])
def test_parse_errors_are_refused_at_validation(when: str, says: str | None) -> None:
    if says is None:
        rule(when)
        return
    with pytest.raises(ValidationError) as info:
        rule(when)
    message = str(info.value)
    assert says in message and "when" in message


def test_dunder_paths_read_only_arguments() -> None:
    # `a.__class__` is the key "__class__" of the argument `a`, never Python's attribute.
    assert not matches(rule("a.__class__ == 'dict'", "allow"), "t", {"a": {}})
    assert matches(rule("a.__class__ == 'dict'", "allow"), "t", {"a": {"__class__": "dict"}})


def test_rules_are_data_and_round_trip() -> None:
    data = [r.model_dump() for r in TRANSFER]
    again = [ArgumentRule.model_validate(d) for d in data]
    assert again == TRANSFER
    with pytest.raises(ValidationError, match="action"):
        ArgumentRule.model_validate({"tool": "t", "action": "maybe"})
    with pytest.raises(ValidationError, match="tool"):
        ArgumentRule.model_validate({"tool": "rm -rf", "action": "deny"})
    with pytest.raises(ValidationError):
        ArgumentRule.model_validate({"tool": "t", "action": "deny", "code": "x"})


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([*TRANSFER, ArgumentRule(tool="*", action="allow"),
                                 ArgumentRule(tool="t*", when="amount < 3", action="ask")])),
       st.lists(st.sampled_from(TRANSFER)),
       st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=False), st.text(max_size=3)))
def test_adding_rules_only_tightens(base: list[ArgumentRule], extra: list[ArgumentRule],
                                    amount: Any) -> None:
    order = {None: -1, "allow": 0, "ask": 1, "deny": 2}
    before = evaluate(base, "transfer", {"amount": amount})
    after = evaluate(base + extra, "transfer", {"amount": amount})
    assert order[after and after.action] >= order[before and before.action]
    # deterministic: the same rules and arguments, the same verdict
    assert evaluate(base + extra, "transfer", {"amount": amount}) == after
