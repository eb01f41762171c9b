"""Agent trees' pure rules (boundloop.core.tree): a child's allowance, its policy, the
check before each of its requests, and what its caller is charged and told."""

from __future__ import annotations

from boundloop.core import tree
from boundloop.core.limits import Limits, Policy, Price, RunSettings
from boundloop.core.loop import LoopState
from boundloop.core.place import TreePlace, child_place
from boundloop.core.reasons import StopReason
from boundloop.core.rules import ArgumentRule

PRICE = Price(input_usd_per_mtok=1.0, output_usd_per_mtok=4.0)


def agent(**limits: object) -> tree.AgentTool:
    return tree.AgentTool(name="research", description="looks things up",
                          settings=RunSettings(model="m", limits=Limits.model_validate(limits)),
                          tools=["lookup_stock"], task_queue="q")


def state(**limits: object) -> LoopState:
    return LoopState(settings=RunSettings(model="m", limits=Limits.model_validate(limits),
                                          policy=Policy(prices={"m": PRICE})),
                     allowed_tools=["research"])


def test_the_allowance_is_what_is_left_less_the_reserve() -> None:
    s = state(token_threshold=10_000, max_output_tokens=500, max_tool_executions=10,
              deadline_seconds=100.0)
    s.usage.total_tokens = 4_000
    s.tool_executions = 3
    got = tree.allowance(s, agent(token_threshold=50_000, max_tool_executions=50),
                         processing_seconds=40.0, next_input_tokens=1_000, later_calls=2)
    assert isinstance(got, RunSettings)
    # 6,000 left, 1,000 + 500 kept back to read the answer.
    assert got.limits.token_threshold == 4_500
    # 7 left, two later calls of the response and this call itself kept back.
    assert got.limits.max_tool_executions == 4
    assert got.limits.deadline_seconds == 60.0 * (1 - tree.RESERVE_SHARE)
    assert got.limits.max_output_tokens == 500  # the caller's cap, as the child set none
    assert got.limits.approval_timeout_seconds == 86400.0
    waits = tree.allowance(state(approval_timeout_seconds=60.0), agent(),
                           processing_seconds=0.0, next_input_tokens=1, later_calls=0)
    assert isinstance(waits, RunSettings)
    assert waits.limits.approval_timeout_seconds == 60.0  # never longer than the caller


def test_a_child_asking_for_less_keeps_its_own_limits() -> None:
    got = tree.allowance(state(token_threshold=100_000), agent(
        token_threshold=2_000, max_output_tokens=300, deadline_seconds=5.0),
        processing_seconds=0.0, next_input_tokens=10, later_calls=0)
    assert isinstance(got, RunSettings)
    assert (got.limits.token_threshold, got.limits.max_output_tokens,
            got.limits.deadline_seconds) == (2_000, 300, 5.0)


def test_nothing_left_means_not_started() -> None:
    s = state(token_threshold=1_000)
    s.usage.total_tokens = 950
    why = tree.allowance(s, agent(), processing_seconds=0.0, next_input_tokens=100,
                         later_calls=0)
    assert isinstance(why, str) and "50 tokens left" in why
    s = state(max_tool_executions=2)
    s.tool_executions = 1
    why = tree.allowance(s, agent(), processing_seconds=0.0, next_input_tokens=1,
                         later_calls=0)
    assert isinstance(why, str) and "tool executions" in why


def test_a_usd_budget_needs_the_childs_model_priced_and_is_shared_out() -> None:
    s = state(usd_budget=1.0)
    s.cost_usd = 0.5
    got = tree.allowance(s, agent(), processing_seconds=0.0, next_input_tokens=1,
                         later_calls=0)
    assert isinstance(got, RunSettings)
    assert got.limits.usd_budget == 0.5 * (1 - tree.RESERVE_SHARE)
    unpriced = agent().model_copy(update={"settings": RunSettings(model="other")})
    why = tree.allowance(s, unpriced, processing_seconds=0.0, next_input_tokens=1,
                         later_calls=0)
    assert isinstance(why, str) and "no price" in why


def test_the_childs_policy_is_never_looser() -> None:
    deny = ArgumentRule.model_validate({"tool": "create_ticket", "action": "ask",
                                        "when": "priority == 'high'"})
    parent = Policy(approval="always", approvers={"create_ticket": ["alice", "bob"]},
                    rules=[deny], missing_usage="stop")
    child = Policy(approval="never", approvers={"create_ticket": ["bob", "mallory"]},
                   missing_usage="estimate", unknown_tool="report")
    got = tree.stricter_policy(parent, child)
    assert got.approval == "always"
    assert got.approvers == {"create_ticket": ["bob"]}
    assert got.rules == [deny]
    assert (got.missing_usage, got.unknown_tool) == ("stop", "stop")
    assert tree.stricter_policy(Policy(approval="never"), Policy()).approval == "tool"
    # No one both allow: the caller's approvers stand (an empty list would mean anyone).
    apart = tree.stricter_policy(Policy(approvers={"t": ["alice"]}),
                                 Policy(approvers={"t": ["mallory"]}))
    assert apart.approvers == {"t": ["alice"]}


def test_limits_on_children_and_depth() -> None:
    s = state(max_children=2, max_depth=2)
    s.children = 2
    why = tree.refused_by_limits(s)
    assert why is not None and why.startswith("max_children")
    envelope = tree.blocked_by_limits(s, why)
    assert envelope.error_code == "SUBAGENT_LIMIT"
    assert (s.force_final, s.pending_limit) == (True, StopReason.MAX_CHILDREN)
    s = state(max_depth=2)
    s.tree = TreePlace(root="r", parent="p", path=["a", "b"])
    why = tree.refused_by_limits(s)
    assert why is not None and why.startswith("max_depth")
    tree.blocked_by_limits(s, why)
    assert s.pending_limit == StopReason.MAX_DEPTH
    s.tree = TreePlace(root="r", parent="r", path=["a"])
    assert tree.refused_by_limits(s) is None


def test_a_child_never_sends_a_request_past_its_allowance() -> None:
    s = state(token_threshold=1_000, max_output_tokens=200)
    s.tree = TreePlace(root="r", parent="r", path=["research"])
    s.steps, s.last_tokens, s.last_bytes = 1, 600, 0
    s.log("model_requested")
    # 600 counted last time, 200 output at most: 800 <= 1,000 left.
    assert tree.check_allowance(s, fixed_bytes=0) is None
    s.usage.total_tokens = 300
    assert tree.check_allowance(s, fixed_bytes=0) == StopReason.USAGE_LIMIT
    assert s.steps == 0  # the request was not sent: not a step
    assert [e.event for e in s.events] == [tree.ALLOWANCE_SPENT, "stopped:usage_limit"]
    root = state(token_threshold=1_000)
    root.usage.total_tokens = 999
    assert tree.check_allowance(root, fixed_bytes=10**6) is None  # a root keeps its rule


def test_the_caller_is_charged_and_told_how_the_child_ended() -> None:
    s = state(token_threshold=1_000)
    ended = tree.ChildEnded(reason=StopReason.MAX_STEPS, text="partial", steps=5,
                            tool_executions=3, input_tokens=500, output_tokens=100,
                            total_tokens=600, cost_usd=0.01, cost_units=2,
                            usage_estimated=False, workflow_id="w")
    tree.charge(s, ended)
    assert (s.usage.total_tokens, s.tool_executions, s.cost_units) == (600, 3, 2)
    assert s.cost_usd == 0.01
    out = tree.output("research", ended)
    assert out.error_code == "SUBAGENT_STOPPED" and out.data["completed"] is False
    assert out.data["answer"] == "partial"
    done = tree.output("research", tree.ChildEnded(**{**ended.__dict__,
                                                      "reason": StopReason.COMPLETED}))
    assert done.status == "success" and done.data["completed"] is True
    failed = tree.output("research", tree.ChildFailed("refused", "secret operator line"))
    assert failed.error_code == "SUBAGENT_FAILED"
    assert "secret operator line" not in failed.message
    tree.charge(s, ended)
    assert tree.over_limits(s) == StopReason.USAGE_LIMIT


def test_a_childs_place() -> None:
    first = child_place(None, "root", "writer")
    assert first == TreePlace(root="root", parent="root", path=["writer"])
    second = child_place(first, "root/run/step-1/call-0/writer", "research")
    assert second.depth == 2
    assert second.line("create_ticket") == "root → writer → research → create_ticket"


def test_a_sub_agent_may_make_only_the_calls_its_caller_left() -> None:
    s = state()
    s.per_tool_calls = {"lookup_stock": 2}
    got = tree.allowance(s, agent(), processing_seconds=0.0, next_input_tokens=1,
                         later_calls=0, caps={"lookup_stock": 3, "other": 5})
    assert isinstance(got, RunSettings)
    assert got.limits.per_tool_max_calls == {"lookup_stock": 1}  # "other" is not its tool
    s.per_tool_calls = {"lookup_stock": 3}
    spent = tree.allowance(s, agent(), processing_seconds=0.0, next_input_tokens=1,
                           later_calls=0, caps={"lookup_stock": 3})
    assert isinstance(spent, RunSettings)
    [rule] = spent.policy.rules
    assert (rule.tool, rule.action, rule.when) == ("lookup_stock", "deny", None)
    tree.charge(s, child_ended_with(per_tool_calls={"lookup_stock": 1}))
    assert s.per_tool_calls == {"lookup_stock": 4}


def child_ended_with(**fields: object) -> tree.ChildEnded:
    base: dict[str, object] = dict(
        reason=StopReason.COMPLETED, text="", steps=1, tool_executions=1, input_tokens=1,
        output_tokens=1, total_tokens=2, cost_usd=None, cost_units=0,
        usage_estimated=False, workflow_id="w")
    return tree.ChildEnded(**{**base, **fields})  # type: ignore[arg-type]


def test_a_sub_agents_output_cap_fits_its_allowance() -> None:
    """With the default limits a grandchild's allowance is small: its output cap is cut
    to half of it, so it can still send a request (a 4,096 cap never could)."""
    s = state(token_threshold=3_000)
    got = tree.allowance(s, agent(), processing_seconds=0.0, next_input_tokens=100,
                         later_calls=0)
    assert isinstance(got, RunSettings)
    assert got.limits.max_output_tokens == got.limits.token_threshold // 2
