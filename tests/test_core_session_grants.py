"""Which of a session's remembered approvals a turn applies: never wider than its policy."""

from __future__ import annotations

from boundloop.core.rules import Grant
from boundloop.core.session import session_grants

ALICE = Grant(tool="create_ticket", approver="alice", call_id="c1", scope="session")


def test_a_turn_applies_only_grants_for_the_session_that_its_policy_allows() -> None:
    run_only = ALICE.model_copy(update={"scope": "run"})
    grants = [ALICE, run_only]
    assert session_grants(grants, tools=["create_ticket"], approvers={}, keys={}) == [ALICE]
    # Not one of the turn's tools, an approver the turn does not let decide the tool, or
    # one without a key when the turn accepts only signed decisions: not applied.
    assert session_grants(grants, tools=["lookup_stock"], approvers={}, keys={}) == []
    assert session_grants(grants, tools=["create_ticket"],
                          approvers={"create_ticket": ["bob"]}, keys={}) == []
    assert session_grants(grants, tools=["create_ticket"],
                          approvers={"create_ticket": ["alice"]}, keys={}) == [ALICE]
    assert session_grants(grants, tools=["create_ticket"], approvers={},
                          keys={"bob": "ed25519:x"}) == []
