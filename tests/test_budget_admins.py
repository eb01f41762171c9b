"""Who may change a shared budget: with approver keys configured, only a change signed by
a budget admin sets a ledger's limits. Tried from the least-trusted side, against a real
`boundloop worker` process configured by a policy file: an unsigned `budget set`, one
signed by an approver who is no budget admin, a signature replayed onto another budget or
other limits or applied twice, and a ledger started with limits of its own in its input.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from temporalio.client import Client, WorkflowUpdateFailedError

from boundloop import BudgetRefused
from boundloop.budgets import set_budget, show_budget
from boundloop.contracts import (
    BUDGET_WORKFLOW,
    LedgerInput,
    ReserveRequest,
    SettleRequest,
    SignedLimits,
    budget_workflow_id,
)
from boundloop.core import signatures
from boundloop.core.budget import Amount, BudgetLimits, LedgerState
from boundloop.core.operator import OperatorPolicy, budget_admin_keys
from boundloop.signing import Signer, new_key
from boundloop.workflows.budget import BudgetLedgerWorkflow
from tests.test_cli import cli, env_for
from tests.test_worker_process import BOUNDLOOP, log_has, process, worker_env

NOW = datetime(2026, 12, 2, 1, 0, tzinfo=UTC)


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Signer]:
    made = {name: new_key(name, tmp_path) for name in ("alice", "mallory")}
    return {name: Signer.from_file(name, k.private_path) for name, k in made.items()}


def policy_toml(keys: dict[str, Signer]) -> str:
    return ("[approver_keys]\n"
            + "".join(f'{name} = "{s.public_key}"\n' for name, s in keys.items())
            + '\n[budget]\nadmins = ["alice"]\n')


@pytest_asyncio.fixture
async def worker(temporal: Client, tmp_path: Path, keys: dict[str, Signer]
                 ) -> AsyncIterator[dict[str, str]]:
    """A `boundloop worker` whose policy file holds alice's and mallory's keys and makes
    alice the only budget admin; yields the CLI's environment for its task queue."""
    policy = tmp_path / "policy.toml"
    policy.write_text(policy_toml(keys), encoding="utf-8")
    queue = f"q-{uuid.uuid4().hex[:8]}"
    env = worker_env(tmp_path, TEMPORAL_ADDRESS=temporal.service_client.config.target_host,
                     BOUNDLOOP_TASK_QUEUE=queue, OPENAI_BASE_URL="http://127.0.0.1:1/v1",
                     OPENAI_API_KEY="sk-test-not-real", BOUNDLOOP_POLICY=str(policy))
    log = tmp_path / "worker.log"
    with process([BOUNDLOOP, "worker"], env, log):
        await log_has(log, "worker started")
        yield {**env_for(temporal, tmp_path), "BOUNDLOOP_TASK_QUEUE": queue}


def usd(view: Any) -> float | None:
    return None if view is None or view.limits is None else view.limits.usd


async def test_only_a_budget_admins_signed_set_changes_a_budget(
        temporal: Client, worker: dict[str, str], tmp_path: Path) -> None:
    key = f"team-{uuid.uuid4().hex[:6]}"
    code, out, err = await cli("budget", "set", key, "--usd", "5", "--as", "alice",
                               "--key", str(tmp_path / "alice.key"), env=worker)
    assert code == 0, err
    assert f"budget {key}: $5 in total" in out

    # Unsigned: refused, named, the limits unchanged.
    code, _out, err = await cli("budget", "set", key, "--usd", "1000", env=worker)
    text = " ".join(err.split())
    assert code == 1, err
    assert (f"budget '{key}' refused the change: its workers have approver keys, so only a "
            "change signed by a budget admin (alice) counts") in text, err
    # Signed by an approver who is no budget admin: refused.
    code, _out, err = await cli("budget", "set", key, "--usd", "1000", "--as", "mallory",
                                "--key", str(tmp_path / "mallory.key"), env=worker)
    assert code == 1, err
    assert "'mallory' is not a budget admin of this worker (budget admins: alice)" \
        in " ".join(err.split()), err
    assert usd(await show_budget(temporal, key)) == 5.0


async def test_a_budget_admins_signature_counts_once_for_its_key_and_limits(
        temporal: Client, worker: dict[str, str], keys: dict[str, Signer]) -> None:
    queue = worker["BOUNDLOOP_TASK_QUEUE"]
    key, other = (f"team-{uuid.uuid4().hex[:6]}" for _ in range(2))
    for k in (key, other):
        await set_budget(temporal, k, BudgetLimits(usd=5.0), task_queue=queue,
                         signer=keys["alice"])
    limits = BudgetLimits(usd=7.0)
    nonce, sig = keys["alice"].sign_budget(namespace=temporal.namespace, key=key,
                                           limits=limits.model_dump(mode="json"))
    signed = SignedLimits(limits=limits, admin="alice", nonce=nonce, signature=sig)
    ledger = temporal.get_workflow_handle(budget_workflow_id(key))
    assert usd(await ledger.execute_update(BudgetLedgerWorkflow.set_signed_limits,
                                           signed)) == 7.0

    async def refused(k: str, req: SignedLimits) -> str:
        with pytest.raises(WorkflowUpdateFailedError) as failed:
            await temporal.get_workflow_handle(budget_workflow_id(k)).execute_update(
                BudgetLedgerWorkflow.set_signed_limits, req)
        return str(failed.value.cause)

    # The same signed change again (after another change: it would undo it).
    await set_budget(temporal, key, BudgetLimits(usd=6.0), task_queue=queue,
                     signer=keys["alice"])
    assert "applied already" in await refused(key, signed)
    # A signed change not applied yet, moved onto another budget or to other limits.
    nonce, sig = keys["alice"].sign_budget(namespace=temporal.namespace, key=key,
                                           limits=limits.model_dump(mode="json"))
    fresh = SignedLimits(limits=limits, admin="alice", nonce=nonce, signature=sig)
    assert "not alice's over this budget change" in await refused(other, fresh)
    raised = fresh.model_copy(update={"limits": BudgetLimits(usd=1e9)})
    assert "not alice's over this budget change" in await refused(key, raised)
    assert usd(await show_budget(temporal, key)) == 6.0
    assert usd(await show_budget(temporal, other)) == 5.0
    # The client API raises BudgetRefused for an unsigned change.
    with pytest.raises(BudgetRefused, match="only a change signed by a budget admin"):
        await set_budget(temporal, key, BudgetLimits(usd=1e9), task_queue=queue)


async def test_a_ledger_started_with_limits_of_its_own_refuses_every_reservation(
        temporal: Client, worker: dict[str, str]) -> None:
    """Anyone who may start a workflow may start a ledger with any input: its limits are
    not taken; the ledger refuses reservations until an admin sets them."""
    key = f"team-{uuid.uuid4().hex[:6]}"
    handle = await temporal.start_workflow(
        BUDGET_WORKFLOW, LedgerInput(state=LedgerState(key=key, limits=BudgetLimits(usd=1e9))),
        id=budget_workflow_id(key), task_queue=worker["BOUNDLOOP_TASK_QUEUE"])
    view = await show_budget(temporal, key)
    assert view is not None and view.limits is None
    grant = await handle.execute_update(BudgetLedgerWorkflow.reserve, ReserveRequest(
        run="some-run", step=1, amount=Amount(usd=0.01, tokens=10)))
    assert not grant.granted and "no limits set yet" in grant.message
    code, out, _ = await cli("budget", "show", key, env=worker)
    assert code == 0 and "no limits set" in out


async def test_a_budget_admin_without_a_key_stops_the_worker(
        tmp_path: Path, keys: dict[str, Signer]) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(policy_toml(keys).replace('["alice"]', '["alice", "bob"]'),
                      encoding="utf-8")
    code, _out, err = await cli("worker", env=worker_env(
        tmp_path, BOUNDLOOP_POLICY=str(policy), TEMPORAL_ADDRESS="127.0.0.1:1"))
    assert code == 2, err
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        "error: BOUNDLOOP_POLICY: budget.admins: bob has no approver key (give each admin "
        "one in [approver_keys] or BOUNDLOOP_APPROVER_KEYS)"], err


def test_without_approver_keys_namespace_access_sets_budgets() -> None:
    assert budget_admin_keys(None, {}) is None
    assert budget_admin_keys(OperatorPolicy(), {}) is None
    # Keys without admins: nobody's change counts (an empty table, not None).
    assert budget_admin_keys(None, {"alice": "ed25519:x"}) == {}


def test_the_signed_message_binds_namespace_key_limits_admin_and_time(
        keys: dict[str, Signer]) -> None:
    alice = keys["alice"]
    admins = {"alice": alice.public_key}
    limits = BudgetLimits(usd=3.0).model_dump(mode="json")
    at = int(NOW.timestamp())
    nonce, sig = alice.sign_budget(namespace="default", key="team-a", limits=limits,
                                   signed_at=at)
    base: dict[str, Any] = {"namespace": "default", "key": "team-a", "limits": limits,
                            "admin": "alice", "nonce": nonce, "signature": sig, "now": NOW,
                            "applied": {}}
    assert signatures.budget_problem(admins, **base) is None
    for change in ({"namespace": "prod"}, {"key": "team-b"}, {"nonce": "0" * 32},
                   {"limits": BudgetLimits(usd=30.0).model_dump(mode="json")}):
        assert "not alice's" in (signatures.budget_problem(admins, **{**base, **change})
                                 or "")
    assert "applied already" in (signatures.budget_problem(
        admins, **{**base, "applied": {nonce: at}}) or "")
    late = NOW.replace(minute=10)
    assert "s old" in (signatures.budget_problem(admins, **{**base, "now": late}) or "")
    # An approval decision's signature is never a budget change's.
    assert signatures.BUDGET_PURPOSE != signatures.PURPOSE


async def test_only_a_budget_admins_signed_reset_recovers_a_ledger(
        temporal: Client, worker: dict[str, str], keys: dict[str, Signer],
        tmp_path: Path) -> None:
    """After an incident (here: a run's spending, and a run holding a reservation), an
    operator recovers the ledger with `budget reset`: signed by a budget admin it zeroes
    spent and drops the runs named; unsigned, or signed by someone else, it changes
    nothing."""
    queue = worker["BOUNDLOOP_TASK_QUEUE"]
    key = f"team-{uuid.uuid4().hex[:6]}"
    await set_budget(temporal, key, BudgetLimits(usd=5.0), task_queue=queue,
                     signer=keys["alice"])
    ledger = temporal.get_workflow_handle(budget_workflow_id(key))
    for run, token in (("spender", "1" * 32), ("holder", "2" * 32)):
        grant = await ledger.execute_update(BudgetLedgerWorkflow.reserve, ReserveRequest(
            run=run, step=1, amount=Amount(usd=2.0), token=token))
        assert grant.granted, grant.message
    await ledger.execute_update(BudgetLedgerWorkflow.settle_reservation, SettleRequest(
        run="spender", step=1, amount=Amount(usd=1.5), token="1" * 32))

    unsigned = await cli("budget", "reset", key, "--drop", "holder", env=worker)
    mallory = await cli("budget", "reset", key, "--as", "mallory", "--key",
                        str(tmp_path / "mallory.key"), env=worker)
    assert [code for code, _, _ in (unsigned, mallory)] == [1, 1]
    assert "only a change signed by a budget admin (alice)" in " ".join(unsigned[2].split())
    assert "'mallory' is not a budget admin" in " ".join(mallory[2].split())
    view = await show_budget(temporal, key)
    assert view is not None and view.spent.usd == 1.5 and len(view.holders) == 1

    code, out, err = await cli("budget", "reset", key, "--drop", "holder", "--as", "alice",
                               "--key", str(tmp_path / "alice.key"), env=worker)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"budget {key}: $5 in total"
    assert "  spent     $0.000000" in lines and "  runs holding reservations: none" in lines
