"""What the console's pages say, on their own (no server, no browser): which rule asked
for an approval, and times to the second."""

from __future__ import annotations

from typing import Any

from boundloop.console import html
from boundloop.console.app import asked_because
from boundloop.core.limits import Policy
from boundloop.core.loop import Approval, ToolRule, asked_by


def waiting(**fields: Any) -> Approval:
    return Approval(call_id="call_1", tool="pay", arguments={"amount": 250},
                    fingerprint="fp", idempotency_key="k", step=1,
                    requested_at="2026-12-05T02:31:35.123456+00:00", **fields)


def test_the_inbox_says_which_rule_asked() -> None:
    declared = ToolRule(name="pay", args_model=None, side_effects=True, needs_approval=True)
    predicate = ToolRule(name="pay", args_model=None, side_effects=True,
                         needs_approval=lambda args: True)
    quiet = ToolRule(name="pay", args_model=None, side_effects=True)
    assert asked_by(declared, Policy()) == "declaration"
    assert asked_by(predicate, Policy()) == "predicate"
    # "always" asks for every side-effecting tool, whatever it declares.
    assert asked_by(quiet, Policy(approval="always")) == "policy"
    assert asked_by(declared, Policy(approval="always")) == "policy"
    assert asked_because(waiting(asked_by="declaration")) == (
        "the tool's declaration (needs_approval=True: every call asks)")
    assert asked_because(waiting(asked_by="predicate")).startswith(
        "the tool's needs_approval predicate")
    assert asked_because(waiting(asked_by="policy")).startswith(
        "the run's approval policy (approval \"always\"")
    assert asked_because(waiting(asked_by="rule", asked_because="amount > 100")) == (
        "a policy rule: amount > 100")
    # A run on a worker from before does not record which: said as one of the two.
    assert asked_because(waiting()) == (
        "the tool requires approval (its needs_approval flag, or the run's policy)")


def test_times_are_shown_to_the_second() -> None:
    assert html.when("2026-12-05T02:31:35.123456+00:00") == "2026-12-05T02:31:35+00:00"
    assert html.when("2026-12-05T02:31:35+00:00") == "2026-12-05T02:31:35+00:00"
    assert html.when("not a time") == "not a time"
