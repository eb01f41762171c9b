"""Tool arguments are validated from the model's JSON text, in strict mode: the JSON
string forms of dates, datetimes, UUIDs, enums and decimals (and nested objects) are
accepted, a string is still not an int. The workflow's check and the approval check
decide alike; approval may be a predicate over the validated arguments."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict

from boundloop.core import approvals
from boundloop.core.limits import Limits, RunSettings
from boundloop.core.loop import Execute, LoopState, Reply, StepPlan, ToolRule, plan_calls
from boundloop.core.turn import Turn, Usage

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


class Colour(StrEnum):
    RED = "red"
    BLUE = "blue"


class Place(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: str


class Booking(BaseModel):
    model_config = ConfigDict(extra="forbid")
    day: date
    at: datetime
    ref: UUID
    colour: Colour
    price: Decimal
    seats: int
    place: Place


GOOD = {"day": "2026-12-03", "at": "2026-12-03T10:00:00Z",
        "ref": "3f2b8c1e-4a5d-4e6f-9a7b-1c2d3e4f5a6b", "colour": "red", "price": "12.50",
        "seats": 2, "place": {"city": "Osaka"}}


def function_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": name,
            "arguments": arguments, "status": "completed"}


@dataclass
class Decision:
    call_id: str
    approve: bool
    approver: str = "alice"
    reason: str | None = None
    arguments: dict[str, Any] | None = None
    remember: bool = False  # a grant for the rest of the run (remembered approvals)
    when: str | None = None
    scope: str = "run"  # or "session" (a session's turn)
    run: str | None = None  # the run it was made for (first execution run id)
    fingerprint: str | None = None  # of the arguments its approver was shown


def plan(args: Any, rule: ToolRule) -> Execute | Reply:
    state = LoopState(settings=RunSettings(model="m", limits=Limits()),
                      allowed_tools=[rule.name])
    state.steps = 1
    turn = Turn(items=[function_call("c1", rule.name, json.dumps(args))],
                usage=Usage(input_tokens=1, output_tokens=1, total_tokens=2))
    plans = plan_calls(state, turn, StepPlan(step=1, tool_choice="auto", last=False),
                       {rule.name: rule}, "wf")
    assert isinstance(plans, list)
    return plans[0]


def test_json_string_forms_of_dates_uuids_enums_and_decimals_are_valid_arguments() -> None:
    out = plan(GOOD, ToolRule("book", Booking))
    assert isinstance(out, Execute), out
    assert Booking.model_validate(out.arguments) == Booking(
        day=date(2026, 12, 3), at=datetime(2026, 12, 3, 10, tzinfo=UTC),
        ref=UUID(GOOD["ref"]), colour=Colour.RED, price=Decimal("12.50"), seats=2,
        place=Place(city="Osaka"))


def test_a_string_is_still_not_an_int() -> None:
    out = plan({**GOOD, "seats": "2"}, ToolRule("book", Booking))
    assert isinstance(out, Reply)
    assert out.envelope.error_code == "INVALID_ARGUMENTS" and "seats" in out.envelope.message


def test_edited_arguments_are_validated_from_json_text_and_normalised() -> None:
    rule = ToolRule("book", Booking, needs_approval=True)
    first = plan(GOOD, rule)
    assert isinstance(first, Execute) and first.needs_approval
    state = LoopState(settings=RunSettings(model="m"), allowed_tools=["book"])
    approvals.request(state, first, 1, T0)
    rules = {"book": rule}
    edited = {**GOOD, "day": "2026-12-04", "price": 13}
    assert approvals.check(state, Decision("c1", True, arguments=edited), rules) is None
    wrong = Decision("c1", True, arguments={**GOOD, "seats": "2"})
    assert "seats" in (approvals.check(state, wrong, rules) or "")
    approvals.apply(state, Decision("c1", True, arguments=edited), T0, rules)
    approval = approvals.find(state, "c1")
    assert approval is not None
    assert (approval.arguments["day"], approval.arguments["price"]) == ("2026-12-04", "13")


def test_needs_approval_predicate_sees_the_validated_arguments() -> None:
    rule = ToolRule("book", Booking, needs_approval=lambda a: a.price > Decimal("100"))
    cheap, dear = plan(GOOD, rule), plan({**GOOD, "price": "150"}, rule)
    assert isinstance(cheap, Execute) and isinstance(dear, Execute)
    assert (cheap.needs_approval, dear.needs_approval) == (False, True)


def test_a_predicate_that_raises_asks_for_approval() -> None:
    def broken(args: Any) -> bool:
        raise KeyError("oops")

    out = plan(GOOD, ToolRule("book", Booking, needs_approval=broken))
    assert isinstance(out, Execute) and out.needs_approval
