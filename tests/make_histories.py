"""Record the replay fixtures of this release in tests/histories/vMAJOR.MINOR/ (the
package version in pyproject.toml): `python -m tests.make_histories`.

Runs the real BoundLoop workflow on a fresh dev server with worker processes and the
scripted model (the demo tools), one run per history, and writes each event history as
`handle.fetch_history().to_json()`. tests/test_replay.py replays every file of every
release's folder against the current workflow code: regenerate after an intended change
of the workflow's commands (and read docs/durability.md first: old histories must still
replay, or the change needs `workflow.patched`).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import tomllib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from temporalio.client import WorkflowFailureError, WorkflowHandle

from boundloop import Agent
from boundloop import _ops as ops
from boundloop import errors as boundloop_errors
from boundloop.budgets import reset_budget, set_budget
from boundloop.contracts import (
    WORKFLOW_NAME,
    CancelRequest,
    Carried,
    Decision,
    ReleaseRequest,
    ReserveRequest,
    RunInput,
    RunResult,
    SettleRequest,
    budget_workflow_id,
)
from boundloop.core.budget import Amount, BudgetLimits, BudgetReset
from boundloop.core.conversation import ConversationMeta, ConversationRef, user_message
from boundloop.core.limits import Limits, Policy, RunSettings
from boundloop.core.loop import LoopState
from boundloop.core.rules import ArgumentRule
from boundloop.core.session import Continuation, TurnOf
from boundloop.signing import Signer, new_key
from boundloop.testing import wait_until
from boundloop.workflows.budget import BudgetLedgerWorkflow
from tests.scripts import answer, call, reasoning, resp
from tests.test_crash import (
    TICKET,
    Cluster,
    approve,
    cluster,
    pending_call,
    result_of,
    wait_recorded_waiting,
)

HISTORIES = Path(__file__).resolve().parent / "histories"


def release_folder() -> str:
    """`vMAJOR.MINOR` of the package version in pyproject.toml: each release records its
    histories in its own folder, and every older folder keeps replaying."""
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    version = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["version"]
    major, minor = str(version).split(".")[:2]
    return f"v{major}.{minor}"


#: Where this release's histories are written.
CURRENT = HISTORIES / release_folder()

Act = Callable[[Cluster, WorkflowHandle[Any, RunResult]], Awaitable[None]]


def workflow_id(name: str) -> str:
    """The workflow id a history was recorded under (replay needs it)."""
    return f"history-{name}"


async def nothing(c: Cluster, handle: WorkflowHandle[Any, RunResult]) -> None:
    return None


async def read_stream(c: Cluster, handle: WorkflowHandle[Any, RunResult]) -> None:
    """A reader follows the run's stream to its end (its polls are updates in history)."""
    async for _item in ops.stream_items(handle):
        pass


async def approve_by_signal(c: Cluster, handle: WorkflowHandle[Any, RunResult]) -> None:
    call_id = await pending_call(handle)
    await handle.signal("approve", Decision(call_id=call_id, approve=True, approver="alice"))


async def reject_by_update(c: Cluster, handle: WorkflowHandle[Any, RunResult]) -> None:
    call_id = await pending_call(handle)
    await handle.execute_update("decide", Decision(call_id=call_id, approve=False,
                                                   reason="duplicate of T-12"), result_type=str)


async def remember_by_update(c: Cluster, handle: WorkflowHandle[Any, RunResult]) -> None:
    """The first of two waiting calls approved with `remember`: the second is covered."""
    await wait_recorded_waiting(handle)
    status = await ops.query_status(handle)
    assert [a.call_id for a in status.pending] == ["m1", "m2"]
    await handle.execute_update("decide", Decision(
        call_id="m1", approve=True, approver="alice", remember=True,
        when='priority != "high"'), result_type=str)


async def crash_then_approve(c: Cluster, handle: WorkflowHandle[Any, RunResult]) -> None:
    call_id = await pending_call(handle)
    c.kill(c.workers[-1])
    c.start_worker()
    await approve(handle, call_id)


async def cancel_while_waiting(c: Cluster, handle: WorkflowHandle[Any, RunResult]) -> None:
    await pending_call(handle)
    await ops.cancel(handle, "wrong customer")


async def interrupt_during_request(c: Cluster, handle: WorkflowHandle[Any, RunResult]
                                   ) -> None:
    """A session's newer message (busy `interrupt`) while the model request is out: the
    run stops once the model has answered, before its call runs."""
    async def asked() -> bool:
        return len(c.model.requests) >= 1

    await wait_until(asked, timeout=60)
    await handle.signal("interrupt", CancelRequest(reason="interrupted by a new message"))


async def cancel_in_request(c: Cluster, handle: WorkflowHandle[Any, RunResult]) -> None:
    """`boundloop cancel` once the model request reached the scripted server."""
    async def asked() -> bool:
        return len(c.model.requests) > REQUESTS_BEFORE[handle.id]

    await wait_until(asked, timeout=60)
    await ops.cancel(handle, "asked the wrong question")


#: workflow id -> the model requests the scripted server had seen before its run started.
REQUESTS_BEFORE: dict[str, int] = {}


#: A provider failure the workflow retries itself (a durable timer, then a new attempt).
BUSY = {"status": 503, "headers": {"Retry-After": "0"},
        "body": {"error": {"message": "overloaded", "type": "server_error"}}}

#: name -> (script, what the operator does while the run is open). Call ids differ between
#: histories: the scripted server remembers each call's reasoning item across runs.
RUNS: dict[str, tuple[list[dict[str, Any]], Act]] = {
    "plain": ([
        resp(reasoning("rs_1"), call("lookup_stock", {"sku": "A-001"}, "p1"), rid="pr1"),
        resp(call("lookup_stock", {"sku": "B-002"}, "p2"), rid="pr2"),
        answer("A-001は12個、B-002は在庫切れです。", rid="pr3"),
    ], nothing),
    # Streamed answers (text deltas as signals) read by a client (poll updates).
    "streamed": ([
        {**resp(call("lookup_stock", {"sku": "A-001"}, "s1"), rid="sr1"), "chunk_bytes": 7},
        {**answer("A-001は12個です。在庫は札幌の倉庫にあります。", rid="sr2"),
         "chunk_bytes": 7, "chunk_interval_seconds": 0.05},
    ], read_stream),
    "approval": ([
        resp(call("create_ticket", TICKET, "a1"), call("lookup_stock", {"sku": "A-001"}, "a2"),
             rid="ar1"),
        answer("チケットを作成しました。", rid="ar2"),
    ], approve_by_signal),
    "rejection": ([
        resp(call("create_ticket", TICKET, "j1"), rid="jr1"),
        resp(call("create_ticket", TICKET, "j2"), rid="jr2"),
        answer("チケットは作成しませんでした。", rid="jr3"),
    ], reject_by_update),
    "crash_resume": ([
        resp(call("lookup_stock", {"sku": "B-002"}, "k1"), rid="kr1"),
        resp(call("create_ticket", TICKET, "k2"), rid="kr2"),
        answer("チケットを作成しました。", rid="kr3"),
    ], crash_then_approve),
    "retried": ([
        BUSY,
        resp(call("lookup_stock", {"sku": "A-001"}, "r1"), rid="rr1"),
        answer("A-001は12個です。", rid="rr2"),
    ], nothing),
    "cancelled": ([
        resp(call("create_ticket", TICKET, "x1"), rid="xr1"),
        answer("never sent", rid="xr2"),
    ], cancel_while_waiting),
    # The same cancel after the withdrawn-on-stop patch: the pending approval withdrawn.
    "cancelled_withdrawn": ([
        resp(call("create_ticket", TICKET, "x1"), rid="xr1"),
        answer("never sent", rid="xr2"),
    ], cancel_while_waiting),
    "interrupted": ([
        {**resp(call("lookup_stock", {"sku": "A-001"}, "i1"), rid="ir1"), "delay_seconds": 2.0},
        answer("never sent", rid="ir2"),
    ], interrupt_during_request),
}

# Three steps, two tool executions: the search attributes upserted at the status changes
# only (the sparse-upserts patch), not at every step.
RUNS["sparse_upserts"] = ([
    resp(call("lookup_stock", {"sku": "A-001"}, "q1"), rid="qr1"),
    resp(call("lookup_stock", {"sku": "B-002"}, "q2"), rid="qr2"),
    answer("A-001は12個、B-002は在庫切れです。", rid="qr3"),
], nothing)

# A short read-only tool as a local activity (a marker with its result), and one whose
# two counted attempts fail transiently (two markers, a backoff timer between them).
RUNS["local_tool"] = ([
    resp(reasoning("rs_l1"), call("lookup_stock", {"sku": "A-001"}, "l1"),
         call("flaky", {"x": "1"}, "l2"), rid="lr1"),
    answer("A-001は12個です。", rid="lr2"),
], nothing)

# Four steps on a worker with its own queue and eager activity execution on: the second
# request goes to the holder's own queue and finds its conversation there, so the rest go
# to the shared queue, where eager execution finds it too (the route-when-needed patch).
RUNS["routed_shared"] = ([
    resp(call("lookup_stock", {"sku": "A-001"}, "w1"), rid="wr1"),
    resp(call("lookup_stock", {"sku": "B-002"}, "w2"), rid="wr2"),
    resp(call("lookup_stock", {"sku": "C-003"}, "w3"), rid="wr3"),
    answer("A-001は12個、B-002は在庫切れです。", rid="wr4"),
], nothing)

# A new run asks the bundle of every earlier patch alone (one marker): its counted retry
# of a 503, its local lookups, its sparse upserts and its routing take the bundled patches.
RUNS["bundled"] = ([
    BUSY,
    resp(call("lookup_stock", {"sku": "A-001"}, "b1"), rid="br1"),
    resp(call("lookup_stock", {"sku": "B-002"}, "b2"), rid="br2"),
    answer("A-001は12個、B-002は在庫切れです。", rid="br3"),
], nothing)

#: name -> the run's tools, for the histories that need others than the demo tools.
TOOLS: dict[str, list[str]] = {"local_tool": ["lookup_stock", "flaky"]}

#: name -> the run's policy, for the histories that need one.
POLICIES: dict[str, Policy] = {
    # An argument rule asks for approval of a call its tool does not declare (approved).
    "rule_asked": Policy(rules=[ArgumentRule(tool="lookup_stock", when='sku == "B-002"',
                                             action="ask")]),
    "summarized": Policy(context="summarize", context_keep=1),
}
RUNS["rule_asked"] = ([
    resp(call("lookup_stock", {"sku": "B-002"}, "u1"), rid="ur1"),
    answer("B-002は在庫切れです。", rid="ur2"),
], approve_by_signal)


# A remembered approval (`approve --remember --when`) covers the response's second call.
RUNS["remembered"] = ([
    resp(call("create_ticket", {**TICKET, "priority": "normal"}, "m1"),
         call("create_ticket", {**TICKET, "title": "Scanner jammed", "priority": "low"}, "m2"),
         rid="mr1"),
    answer("チケットを二件作成しました。", rid="mr2"),
], remember_by_update)


#: name -> the worker's operator policy (BOUNDLOOP_POLICY, TOML) for the histories that
#: need one: the worker is restarted with it for that run.
OPERATOR_POLICIES: dict[str, str] = {
    # Admitted under the operator's policy (the `admit_run` marker): the operator's
    # `always` on lookup_stock asks, alice approves.
    "admitted": """\
[approval.lookup_stock]
approval = "always"
approvers = ["alice"]

[limits.max]
max_steps = 10
""",
}
# The budget key derived from the run's tenant search attribute (the admission is given
# the run's search attributes): the run reserves from tenant-acme's ledger.
OPERATOR_POLICIES["summarized"] = 'context = "summarize"\ncontext_keep = 1\n'
OPERATOR_POLICIES["tenant_budget"] = """\
[prices.scripted-model]
input_usd_per_mtok = 1.0
output_usd_per_mtok = 2.0

[budget]
key_from = "tenant-{BoundloopTenant}"

[limits.max]
max_output_tokens = 100
"""
#: name -> the tenant its run is started with (its ledger is set first).
TENANTS = {"tenant_budget": "acme"}
RUNS["tenant_budget"] = ([
    resp(call("lookup_stock", {"sku": "A-001"}, "t1"), rid="tr1"),
    answer("A-001は12個です。", rid="tr2"),
], nothing)
RUNS["admitted"] = ([
    resp(call("lookup_stock", {"sku": "A-001"}, "o1"), rid="or1"),
    answer("A-001は12個です。", rid="or2"),
], approve_by_signal)


# Recorded from 0.4 on, so that every branch of the run's step order has a history:
# an approval nobody decides within its timeout (stopped approval_timeout)...
RUNS["approval_timed_out"] = ([
    resp(call("create_ticket", TICKET, "e1"), rid="er1"),
], nothing)
# ...a request the provider refuses (HTTP 400: never retried, stopped model_error)...
RUNS["model_error"] = ([
    {"status": 400, "body": {"error": {"message": "bad request", "type": "invalid_request"}}},
], nothing)
# ...and a first request that cannot fit its context window (stopped context_exhausted
# before it is sent, the context-window marker). tenant_budget reserves, settles and
# releases a shared budget's amounts around its steps.
RUNS["context_exhausted"] = ([], nothing)
# A model attempt silent past model_timeout_seconds: charged its worst case, retried
# (a model_retried:timeout event) after a durable timer.
RUNS["charged_retry"] = ([
    {**answer("never seen", rid="hr0"), "delay_seconds": 4.0},
    resp(call("lookup_stock", {"sku": "A-001"}, "h1"), rid="hr1"),
    answer("A-001は12個です。", rid="hr2"),
], nothing)
# A cancel with the model request out: the attempt is charged as `cancelled`.
RUNS["cancelled_in_request"] = ([
    {**answer("never seen", rid="nr1"), "delay_seconds": 4.0},
], cancel_in_request)
# A run under the `summarize` context strategy: the second response reports 1,990 tokens,
# so the third request would not fit its 2,000-token window; one summary request (the
# context-summarize marker) replaces the question and the first call, then the third
# request is sent and answered.
RUNS["summarized"] = ([
    resp(call("lookup_stock", {"sku": "A-001"}, "m1"), rid="mr1"),
    resp(call("lookup_stock", {"sku": "B-002"}, "m2"), rid="mr2",
         usage={"input_tokens": 1970, "output_tokens": 20, "total_tokens": 1990}),
    answer("要約: A-001の在庫を調べた。", rid="mr3"),
    answer("A-001とB-002を調べました。", rid="mr4"),
], nothing)
#: name -> the run's limits, for the histories that need others than the defaults.
LIMITS: dict[str, Limits] = {
    "approval_timed_out": Limits(approval_timeout_seconds=1.0),
    "context_exhausted": Limits(max_input_tokens=20, max_output_tokens=10),
    "charged_retry": Limits(model_timeout_seconds=1.0),
    "summarized": Limits(max_input_tokens=2000),
}


#: name -> the tools a run names that its worker does not all serve: refused at admission
#: (the unknown-tools-named marker), before any model request.
REFUSED: dict[str, list[str]] = {
    "unknown_tool": ["lookup_stock", "whisper"],
}


async def squatted_turn(c: Cluster, tmp: Path) -> WorkflowHandle[Any, Any]:
    """A session whose first turn's id another workflow took (a raw client): that `say`
    is refused (the turn-id-taken marker), the next turn runs under turn-2."""
    assert c.client is not None
    session = await ops.start_session(c.client, tools=["lookup_stock"], model="scripted-model",
                                      task_queue=c.queue, id=workflow_id("session_squatted"))
    squatter = await c.client.start_workflow("Squatter", id=f"{session.id}/turn-1",
                                             task_queue="nobody-polls-this")
    try:
        await session.say("こんにちは")
    except boundloop_errors.SessionRefused as exc:
        print(f"session_squatted: {exc}")
    c.model.append(answer("こんにちは。", rid="qr1"))
    await session.say("こんにちは")
    await session.end()
    await squatter.terminate()
    return session.handle


async def signed_ledger(c: Cluster, tmp: Path) -> WorkflowHandle[Any, Any]:
    """A budget ledger whose limits a budget admin set by a signed change (the worker's
    policy holds alice's key and makes her the budget admin): started without limits,
    set by `set_signed_limits`, then a run reserves, settles and releases."""
    alice = new_key("alice", tmp)
    policy = tmp / "ledger.policy.toml"
    policy.write_text(f'[approver_keys]\nalice = "{alice.public_line.split()[1]}"\n\n'
                      '[budget]\nadmins = ["alice"]\n', encoding="utf-8")
    c.kill(c.workers[-1])
    c.start_worker(policy_file=policy)
    assert c.client is not None
    key = workflow_id("ledger")
    await set_budget(c.client, key, BudgetLimits(usd=1.0, tokens=100_000), task_queue=c.queue,
                     reap_seconds=3600, signer=Signer.from_file("alice", alice.private_path))
    handle = c.client.get_workflow_handle(budget_workflow_id(key))
    run = "history-run-1"
    await handle.execute_update(BudgetLedgerWorkflow.reserve, ReserveRequest(
        run=run, step=1, amount=Amount(usd=0.01, tokens=1000)), id=f"{run}/step-1/reserve")
    await handle.signal(BudgetLedgerWorkflow.settle, SettleRequest(
        run=run, step=1, amount=Amount(usd=0.005, tokens=500)))
    await handle.signal(BudgetLedgerWorkflow.release, run)
    await handle.query(BudgetLedgerWorkflow.show)  # the signals are in history
    c.kill(c.workers[-1])
    c.start_worker()
    return handle


async def claimed_ledger(c: Cluster, tmp: Path) -> WorkflowHandle[Any, Any]:
    """A ledger under the claims (`budget-claims`): a budget admin's signed limits, a
    run's reservation with its token, a forged settlement (refused, not recorded), the
    run's settlement and release by update, and a budget admin's signed reset."""
    alice = new_key("alice", tmp)
    policy = tmp / "claims.policy.toml"
    policy.write_text(f'[approver_keys]\nalice = "{alice.public_line.split()[1]}"\n\n'
                      '[budget]\nadmins = ["alice"]\n', encoding="utf-8")
    c.kill(c.workers[-1])
    c.start_worker(policy_file=policy)
    assert c.client is not None
    key, signer = workflow_id("ledger_claims"), Signer.from_file("alice", alice.private_path)
    await set_budget(c.client, key, BudgetLimits(usd=1.0, tokens=100_000), task_queue=c.queue,
                     reap_seconds=3600, signer=signer)
    handle = c.client.get_workflow_handle(budget_workflow_id(key))
    run, token = "history-run-1", "5" * 32
    await handle.execute_update(BudgetLedgerWorkflow.reserve, ReserveRequest(
        run=run, step=1, amount=Amount(usd=0.01, tokens=1000), token=token),
        id=f"{run}/step-1/reserve")
    await handle.signal(BudgetLedgerWorkflow.settle, SettleRequest(
        run=run, step=1, amount=Amount(), token="6" * 32))
    await handle.execute_update(BudgetLedgerWorkflow.settle_reservation, SettleRequest(
        run=run, step=1, amount=Amount(usd=0.005, tokens=500), token=token),
        id=f"{run}/step-1/settle")
    await handle.execute_update(BudgetLedgerWorkflow.release_reservation,
                                ReleaseRequest(run=run, token=token), id=f"{run}/release")
    await reset_budget(c.client, key, BudgetReset(), signer=signer)
    c.kill(c.workers[-1])
    c.start_worker()
    return handle


async def tenant_session(c: Cluster, tmp: Path) -> WorkflowHandle[Any, Any]:
    """A session started with a tenant under a policy deriving the budget key from it:
    its turn starts with the session's BoundloopTenant (the turn-tenant marker) and spends
    from tenant-globex's ledger."""
    policy = tmp / "session_tenant.policy.toml"
    policy.write_text(OPERATOR_POLICIES["tenant_budget"], encoding="utf-8")
    c.kill(c.workers[-1])
    c.start_worker(policy_file=policy)
    assert c.client is not None
    await set_budget(c.client, "tenant-globex", BudgetLimits(usd=1.0), task_queue=c.queue)
    session = await ops.start_session(
        c.client, tools=["lookup_stock"], model="scripted-model", task_queue=c.queue,
        id=workflow_id("session_tenant"),
        tenant="globex")
    c.model.append(answer("こんにちは。", rid="sr1"))
    print(f"session_tenant: {(await session.say('こんにちは')).reason.value}")
    await session.end()
    c.kill(c.workers[-1])
    c.start_worker()
    return session.handle


async def remembered_session(c: Cluster, tmp: Path, name: str = "session_remembered"
                             ) -> WorkflowHandle[Any, Any]:
    """A session whose first turn's approval is remembered for the session (the
    session-grants marker): its second turn's identical-tool call runs without asking."""
    assert c.client is not None
    session = await ops.start_session(c.client, tools=["create_ticket"],
                                      model="scripted-model", task_queue=c.queue,
                                      id=workflow_id(name))
    for scripted in [resp(call("create_ticket", TICKET, "g1"), rid="gr1"),
                     answer("チケットを作成しました。", rid="gr2"),
                     resp(call("create_ticket", TICKET, "g2"), rid="gr3"),
                     answer("もう一枚作成しました。", rid="gr4")]:
        c.model.append(scripted)
    first = asyncio.create_task(session.say("チケットを作って"))
    turn = session.turn(1)

    async def waiting() -> bool:
        try:
            return bool(await turn.pending())
        except Exception:  # the turn has not started yet
            return False
    await wait_until(waiting, timeout=60)
    await turn.approve("g1", approver="alice", remember=True, scope="session")
    await first
    second = await session.say("もう一枚")
    print(f"{name}: {second.reason.value}, "
          f"{[e.event for e in second.events if e.event.startswith('approval_')]}")
    await session.end()
    return session.handle


async def remembered_turn(c: Cluster, tmp: Path) -> WorkflowHandle[Any, Any]:
    """The second turn of such a session: it takes the session's grant (the loop's
    session-grants marker, an `approval_inherited` event) and runs its call unasked."""
    session = await remembered_session(c, tmp, "turn_remembered")
    assert c.client is not None
    return c.client.get_workflow_handle(f"{session.id}/turn-2")


async def forged_run(c: Cluster, name: str, **forged: Any) -> WorkflowHandle[Any, Any]:
    """A run whose starter wrote into its input what only the workflow itself hands on:
    refused by policy before any command of its own."""
    assert c.client is not None
    settings = RunSettings.model_validate({"model": "scripted-model",
                                           "policy": {"approval": "never"}})
    inp = RunInput(question="チケットを作って", tools=["create_ticket"], settings=settings,
                   **forged)
    handle = await c.client.start_workflow(WORKFLOW_NAME, inp, id=workflow_id(name),
                                           task_queue=c.queue, result_type=RunResult)
    try:
        await handle.result()
    except WorkflowFailureError as exc:
        print(f"{name}: {exc.cause}")
    return handle


async def forged_carried(c: Cluster, tmp: Path) -> WorkflowHandle[Any, Any]:
    """Carried state (approval never, the message unsent) in a run's first input: refused
    (the carried-by-continue marker)."""
    question = user_message("チケットを作って")
    state = LoopState(settings=RunSettings.model_validate(
        {"model": "scripted-model", "policy": {"approval": "never"}}),
        allowed_tools=["create_ticket"], conversation=ConversationMeta().extend([question]))
    return await forged_run(c, "forged_carried", carried=Carried(
        state=state, base=ConversationRef(workflow_id="none", run_id="none",
                                          meta=ConversationMeta()), unsent=[question]))


async def forged_follows(c: Cluster, tmp: Path) -> WorkflowHandle[Any, Any]:
    """Another session's conversation named as the run's `turn.follows` by a plain starter:
    refused (the turn-follows-owned marker)."""
    follows = Continuation(base=ConversationRef(workflow_id="other-session/turn-1",
                                                run_id="none", meta=ConversationMeta()),
                           conversation=ConversationMeta())
    return await forged_run(c, "forged_follows", turn=TurnOf(
        session_id="other-session", turn=2, follows=follows))


#: name -> how the history of a workflow that is not a run (a budget ledger, a session) is
#: made.
async def tree_run(c: Cluster, tmp: Path, name: str = "tree") -> WorkflowHandle[Any, Any]:
    """A run whose model calls a sub-agent (`Agent.as_tool`): the child workflow, started
    under the call's key with its allowance, answers after one lookup; what it used is
    charged to its parent, which then answers."""
    assert c.client is not None
    researcher: Agent[Any] = Agent(["lookup_stock"], model="scripted-model",
                                   task_queue=c.queue)
    writer: Agent[Any] = Agent(["search_docs"], model="scripted-model", task_queue=c.queue,
                               agents=[researcher.as_tool("research", "Looks up stock")])
    for scripted in [resp(call("research", {"question": "A-001の在庫は?"}, "tp1"), rid="tr1"),
                     resp(call("lookup_stock", {"sku": "A-001"}, "tc1"), rid="tr2"),
                     answer("A-001は12個です。", rid="tr3"),
                     answer("A-001の在庫は12個でした。", rid="tr4")]:
        c.model.append(scripted)
    handle = await c.client.start_workflow(
        WORKFLOW_NAME, writer.run_input("A-001の在庫を調べて"),
        id=workflow_id("tree"), task_queue=c.queue, result_type=RunResult)
    print(f"tree: {(await result_of(handle)).reason.value}")
    return handle


async def tree_child(c: Cluster, tmp: Path) -> WorkflowHandle[Any, Any]:
    """The sub-agent's run of `tree` (recorded with it): a child run with its place in the
    tree and its allowance as limits."""
    assert c.client is not None
    [child] = [w async for w in c.client.list_workflows(
        f"ParentWorkflowId = '{workflow_id('tree')}'")]
    return c.client.get_workflow_handle(child.id)


LEDGERS: dict[str, Callable[[Cluster, Path], Awaitable[WorkflowHandle[Any, Any]]]] = {
    "ledger": signed_ledger,
    "ledger_claims": claimed_ledger,
    "session_squatted": squatted_turn,
    "session_tenant": tenant_session,
    "session_remembered": remembered_session,
    "turn_remembered": remembered_turn,
    "forged_carried": forged_carried,
    "forged_follows": forged_follows,
    # Recorded from 0.5 on: a run with a sub-agent, and the sub-agent's own run.
    "tree": tree_run,
    "tree_child": tree_child,
}


# A run that continues as new (a server suggesting it after 12 events) after its first
# step: the first run's history hands the admitted tool rules on (`carried-rules`).
RUNS["carried_rules"] = ([
    resp(call("lookup_stock", {"sku": "A-001"}, "c1"), rid="cr1"),
    resp(call("create_ticket", TICKET, "c2"), rid="cr2"),
    answer("チケットを作成しました。", rid="cr3"),
], approve_by_signal)
# Admitted with its tools' argument schemas (`admitted-schemas`): each tool call carries
# the digest of its admitted schema.
RUNS["schemas_admitted"] = ([
    resp(call("create_ticket", TICKET, "d1"), rid="dr1"),
    answer("チケットを作成しました。", rid="dr2"),
], approve_by_signal)
#: The histories recorded on a server that suggests continue-as-new early: the file is
#: the first run's history (it ends continued as new).
CONTINUED = {"carried_rules"}
CONTINUE_AS_NEW_FLAGS = ["--dynamic-config-value", "limit.historyCount.suggestContinueAsNew=12"]


async def record(tmp: Path, names: list[str]) -> None:
    CURRENT.mkdir(parents=True, exist_ok=True)
    plain = [n for n in names if n not in CONTINUED]
    if plain:
        await record_on(tmp / "plain", plain)
    continued = [n for n in names if n in CONTINUED]
    if continued:
        await record_on(tmp / "continued", continued, CONTINUE_AS_NEW_FLAGS)


async def record_on(tmp: Path, names: list[str], flags: list[str] | None = None) -> None:
    tmp.mkdir(parents=True, exist_ok=True)
    async with cluster(tmp, queue="histories", server_flags=flags or ()) as c:
        c.start_worker()
        for name in names:
            if name in LEDGERS:
                history = await (await LEDGERS[name](c, tmp)).fetch_history()
                (CURRENT / f"{name}.json").write_text(history.to_json() + "\n",
                                                      encoding="utf-8")
                print(f"{name}: {len(history.events)} events")
                continue
            if name in REFUSED:
                handle = await c.start_run([], workflow_id=workflow_id(name),
                                           tools=REFUSED[name])
                try:
                    await handle.result()
                except WorkflowFailureError as exc:
                    print(f"{name}: {exc.cause}")
                history = await handle.fetch_history()
                (CURRENT / f"{name}.json").write_text(history.to_json() + "\n",
                                                      encoding="utf-8")
                continue
            turns, act = RUNS[name]
            if name in OPERATOR_POLICIES:
                policy = tmp / f"{name}.policy.toml"
                policy.write_text(OPERATOR_POLICIES[name], encoding="utf-8")
                c.kill(c.workers[-1])
                c.start_worker(policy_file=policy)
            tenant = TENANTS.get(name)
            if tenant is not None:
                assert c.client is not None
                await set_budget(c.client, f"tenant-{tenant}", BudgetLimits(usd=1.0),
                                 task_queue=c.queue)
            REQUESTS_BEFORE[workflow_id(name)] = len(c.model.requests)
            handle = await c.start_run(turns, workflow_id=workflow_id(name),
                                       policy=POLICIES.get(name), tenant=tenant,
                                       tools=TOOLS.get(name), limits=LIMITS.get(name))
            await act(c, handle)
            result = await result_of(handle)
            if name in CONTINUED:
                assert c.client is not None
                handle = c.client.get_workflow_handle(
                    handle.id, run_id=handle.first_execution_run_id, result_type=RunResult)
            history = await handle.fetch_history()
            (CURRENT / f"{name}.json").write_text(history.to_json() + "\n", encoding="utf-8")
            print(f"{name}: {result.reason.value}, {len(history.events)} events")
            if name in OPERATOR_POLICIES:  # the next history's worker has none
                c.kill(c.workers[-1])
                c.start_worker()
        assert c.model.violations == [], c.model.violations


def main(argv: list[str]) -> None:
    known = [*RUNS, *LEDGERS, *REFUSED]
    names = argv or known
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise SystemExit(f"unknown histories {unknown}; known: {sorted(known)}")
    with tempfile.TemporaryDirectory(prefix="boundloop-histories-") as tmp:
        asyncio.run(record(Path(tmp), names))


if __name__ == "__main__":
    main(sys.argv[1:])
