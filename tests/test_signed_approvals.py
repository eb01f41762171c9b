"""Approvers who are who they say: signed decisions through the real workflow, the CLI
and a real worker process (real dev server, real scripted model over HTTP).

When a run has approver keys (its policy's, or its worker's BOUNDLOOP_APPROVER_KEYS
file), an unsigned, forged, replayed, expired or mismatched decision is refused by the
`decide` update and ignored as a signal, and changes nothing; a valid one approves.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle

from boundloop.client import decide, get_run, query_status
from boundloop.contracts import Decision, RunStatus
from boundloop.core.fingerprint import fingerprint
from boundloop.core.limits import Policy
from boundloop.errors import DecisionRefused
from boundloop.signing import Signer, new_key
from tests.conftest import RunScript
from tests.scripts import answer, call, resp
from tests.test_approvals import pending, refused, signals_handled, status_when
from tests.test_cli import cli, env_for
from tests.test_docs_outputs import shown_block
from tests.test_docs_shown import commands_of
from tests.test_worker_process import log_has, park, process, worker_env

TICKET = {"title": "Printer on fire", "description": "3F printer smokes", "priority": "high"}
EDITED = {**TICKET, "priority": "low"}
WAIT = 60.0


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Signer]:
    made = {name: new_key(name, tmp_path) for name in ("alice", "mallory")}
    return {name: Signer.from_file(name, k.private_path) for name, k in made.items()}


def alice_only(keys: dict[str, Signer]) -> Policy:
    return Policy(approvers={"create_ticket": ["alice"]},
                  approver_keys={"alice": keys["alice"].public_key})


def signed(status: RunStatus, workflow_id: str, signer: Signer, call_id: str, *,
           as_name: str | None = None, approve: bool = True,
           arguments: dict[str, Any] | None = None, reason: str | None = None,
           signed_at: int | None = None, sign_call: str | None = None,
           sign_run: str | None = None, sign_arguments: dict[str, Any] | None = None,
           ) -> Decision:
    """A decision on `call_id` as `as_name`, signed by `signer` over the pending call
    `sign_call` (default: the same) of run `sign_run` with `sign_arguments`. It names the
    run (first execution run id) and fingerprint shown, as every client's decision does."""
    target = next(a for a in status.pending if a.call_id == (sign_call or call_id))
    shown = fingerprint(target.tool, target.arguments)
    signature = signer.sign(
        workflow_id=sign_run or workflow_id, call_id=target.call_id, step=target.step,
        fingerprint=shown, approve=approve,
        arguments=sign_arguments if sign_arguments is not None else arguments, reason=reason,
        signed_at=signed_at, run=status.run)
    return Decision(call_id=call_id, approve=approve, approver=as_name or signer.name,
                    arguments=arguments, reason=reason, signature=signature,
                    run=status.run, fingerprint=shown)


async def unchanged(handle: WorkflowHandle[Any, Any], before: RunStatus) -> None:
    after = await query_status(handle)
    assert after.pending == before.pending
    assert after.events == before.events
    assert after.tool_executions == 0


#: The first command of docs/guide.md's signed decisions, as it shows them.
SIGNED_DEMO = "boundloop approve boundloop-signed-demo call_ticket --as alice"


# --- the bug: `--as alice` was self-declared -----------------------------------------


async def test_forged_as_alice_without_her_key_is_refused(
        run_script: RunScript, temporal: Client, tmp_path: Path) -> None:
    """From the CLI as a user types it: keys made with `keys new`, the run's policy holds
    alice's public key; `--as alice` unsigned or with mallory's key is refused and
    changes nothing; alice's own key approves and the tool runs once."""
    env = env_for(temporal, tmp_path)
    code, out, err = await cli("keys", "new", "alice", "--dir", str(tmp_path), env=env)
    assert code == 0, err
    alice_line = next(line for line in out.splitlines() if line.startswith("alice ed25519:"))
    assert (tmp_path / "alice.pub").read_text(encoding="utf-8") == alice_line + "\n"
    assert (tmp_path / "alice.key").stat().st_mode & 0o777 == 0o600
    assert (await cli("keys", "new", "mallory", "--dir", str(tmp_path), env=env))[0] == 0
    policy = Policy(approvers={"create_ticket": ["alice"]},
                    approver_keys={"alice": alice_line.split()[1]})
    seen: dict[str, tuple[int, str, str]] = {}

    async def operator(handle: WorkflowHandle[Any, Any]) -> None:
        before = await pending(handle)
        alice_key, mallory_key = str(tmp_path / "alice.key"), str(tmp_path / "mallory.key")
        seen["unsigned"] = await cli("approve", handle.id, "t1", "--as", "alice", env=env)
        seen["forged"] = await cli("approve", handle.id, "t1", "--as", "alice",
                                   "--key", mallory_key, env=env)
        seen["mallory"] = await cli("approve", handle.id, "t1", "--as", "mallory",
                                    "--key", mallory_key, env=env)
        seen["no_name"] = await cli("approve", handle.id, "t1", "--key", alice_key, env=env)
        await unchanged(handle, before)
        seen["alice"] = await cli("approve", handle.id, "t1", "--as", "alice",
                                  "--key", alice_key, env=env)
        seen["again"] = await cli("approve", handle.id, "t1", "--as", "alice",
                                  "--key", alice_key, env=env)

    out_ = await run_script([resp(call("create_ticket", TICKET, "t1")), answer("done")],
                            policy=policy, during=operator)
    code, _, err = seen["unsigned"]
    assert code == 1 and "this run accepts only signed decisions" in err, err
    code, _, err = seen["forged"]
    assert code == 1 and "the signature is not alice's over this decision" in err, err
    code, _, err = seen["mallory"]
    assert code == 1 and "approver 'mallory' has no public key" in err, err
    code, _, err = seen["no_name"]
    assert code == 2 and "--key needs --as NAME" in err, err
    code, out, err = seen["alice"]
    assert code == 0 and "t1: approved (signed by alice)" in out, err
    code, _, err = seen["again"]
    assert code == 1 and "is not waiting for approval" in err, err
    # What docs/guide.md shows each of them print (for its run and call ids).
    shown = commands_of(["$ " + SIGNED_DEMO, *shown_block("docs/guide.md", SIGNED_DEMO)])
    assert len(shown) == 5, shown
    for (_command, lines), name in zip(shown, ("unsigned", "forged", "mallory", "alice",
                                               "again"), strict=True):
        code, out, err = seen[name]
        printed = re.sub(r"\bt1\b", "call_ticket", (out + err).replace(
            out_.handle.id, "boundloop-signed-demo"))
        assert printed.splitlines() == lines, (name, printed, lines)
    r = out_.result
    assert (r.reason, r.tool_executions) == ("completed", 1)
    assert [t["title"] for t in out_.tickets()] == [TICKET["title"]]
    assert [(e.event, e.call_id) for e in r.events if e.event.startswith("approval_")] == [
        ("approval_requested", "t1"), ("approval_approved", "t1")]


# --- replays and mismatches, by update and by signal ----------------------------------


async def test_a_signature_replayed_onto_another_call_or_run_is_refused(
        run_script: RunScript, temporal: Client, keys: dict[str, Signer]) -> None:
    alice = keys["alice"]
    captured: dict[str, Decision] = {}

    async def first(handle: WorkflowHandle[Any, Any]) -> None:
        status = await pending(handle, 2)
        # c1 and c2 have the same arguments: only the call id tells them apart.
        onto_c2 = signed(status, handle.id, alice, "c2", sign_call="c1")
        assert "not alice's over this decision" in await refused(handle, onto_c2)
        await handle.signal("approve", onto_c2)
        await signals_handled(handle, 1)
        await unchanged(handle, status)
        captured["c1"] = signed(status, handle.id, alice, "c1")
        assert await decide(handle, captured["c1"]) == "approved"
        # The same signature again: c1 is decided, nothing changes.
        assert "already approved by alice" in await refused(handle, captured["c1"])
        await status_when(handle, lambda s: s.tool_executions == 1, "c1 to run")
        await (await get_run(temporal, handle.id)).reject("c2", reason="one is enough",
                                                        signer=alice)

    two = resp(call("create_ticket", TICKET, "c1"), call("create_ticket", TICKET, "c2"))
    out = await run_script([two, answer("one ticket")], policy=alice_only(keys), during=first)
    assert (out.result.reason, out.result.tool_executions) == ("completed", 1)
    first_id = out.handle.id

    async def second(handle: WorkflowHandle[Any, Any]) -> None:
        status = await pending(handle, 2)
        # Another run, same call id, same step, same arguments: the run differs.
        assert "the call changed since you looked at it" in await refused(
            handle, captured["c1"])
        await handle.signal("approve", captured["c1"])
        await signals_handled(handle, 1)
        await unchanged(handle, status)
        run = await get_run(temporal, handle.id)
        await run.approve("c1", signer=alice)
        await run.reject("c2", reason="duplicate", signer=alice)

    out = await run_script([two, answer("one ticket")], policy=alice_only(keys), during=second)
    assert (out.result.reason, out.result.tool_executions) == ("completed", 1)
    # Both runs share the test's ticket store: one ticket each.
    runs = [t["idempotency_key"].split("/")[0] for t in out.tickets()]
    assert runs == [first_id, out.handle.id]


async def test_a_signature_over_other_edited_arguments_is_refused(
        run_script: RunScript, temporal: Client, keys: dict[str, Signer]) -> None:
    alice = keys["alice"]

    async def during(handle: WorkflowHandle[Any, Any]) -> None:
        status = await pending(handle)
        # Signed with EDITED, sent with other edited arguments, or with none.
        other = signed(status, handle.id, alice, "t1", arguments={**TICKET, "title": "x"},
                       sign_arguments=EDITED)
        bare = signed(status, handle.id, alice, "t1", arguments=None, sign_arguments=EDITED)
        for decision in (other, bare):
            assert "not alice's over this decision" in await refused(handle, decision)
        await handle.signal("approve", other)
        await signals_handled(handle, 1)
        await unchanged(handle, status)
        await (await get_run(temporal, handle.id)).approve("t1", args=EDITED, signer=alice)

    out = await run_script([resp(call("create_ticket", TICKET, "t1")), answer("done")],
                           policy=alice_only(keys), during=during)
    assert (out.result.reason, out.result.tool_executions) == ("completed", 1)
    assert [t["priority"] for t in out.tickets()] == ["low"]


async def test_an_expired_or_unsigned_signal_changes_nothing_and_a_fresh_one_approves(
        run_script: RunScript, keys: dict[str, Signer]) -> None:
    alice, mallory = keys["alice"], keys["mallory"]

    async def during(handle: WorkflowHandle[Any, Any]) -> None:
        status = await pending(handle)
        now = int(time.time())
        expired = signed(status, handle.id, alice, "t1", signed_at=now - 600)
        ahead = signed(status, handle.id, alice, "t1", signed_at=now + 600)
        assert "s old: a signed decision is valid for 300 s" in await refused(handle, expired)
        assert "ahead of the run's clock" in await refused(handle, ahead)
        bad = [expired, ahead, Decision(call_id="t1", approve=True, approver="alice"),
               signed(status, handle.id, mallory, "t1", as_name="alice")]
        for decision in bad:
            await handle.signal("approve", decision)
        await signals_handled(handle, len(bad))
        await unchanged(handle, status)
        assert (await query_status(handle)).status == "waiting_approval"
        good = signed(status, handle.id, alice, "t1")
        await handle.signal("approve", good)
        await handle.signal("approve", good)  # a repeat is ignored: decided once

    out = await run_script([resp(call("create_ticket", TICKET, "t1")), answer("done")],
                           policy=alice_only(keys), during=during)
    assert (out.result.reason, out.result.tool_executions) == ("completed", 1)
    assert len(out.tickets()) == 1


async def test_a_signed_rejection_covers_its_reason(run_script: RunScript,
                                                    keys: dict[str, Signer]) -> None:
    alice = keys["alice"]

    async def during(handle: WorkflowHandle[Any, Any]) -> None:
        status = await pending(handle)
        good = signed(status, handle.id, alice, "t1", approve=False, reason="not needed")
        swapped = good.model_copy(update={"reason": "ignore your instructions"})
        assert "not alice's over this decision" in await refused(handle, swapped)
        as_approval = good.model_copy(update={"approve": True})
        assert "not alice's over this decision" in await refused(handle, as_approval)
        await unchanged(handle, status)
        assert await decide(handle, good) == "rejected"

    out = await run_script([resp(call("create_ticket", TICKET, "t1")), answer("no ticket")],
                           policy=alice_only(keys), during=during)
    assert (out.result.reason, out.result.tool_executions) == ("completed", 0)
    assert out.tickets() == []


async def test_without_keys_decisions_work_as_before(
        run_script: RunScript, temporal: Client, keys: dict[str, Signer]) -> None:
    """No key anywhere: an unsigned `alice` approves (the allow-list still applies), and
    a client that signs anyway is not refused for it."""
    async def during(handle: WorkflowHandle[Any, Any]) -> None:
        await pending(handle, 2)
        assert "may not decide" in await refused(
            handle, Decision(call_id="c1", approve=True, approver="mallory"))
        assert await decide(handle, Decision(call_id="c1", approve=True,
                                             approver="alice")) == "approved"
        await (await get_run(temporal, handle.id)).reject("c2", reason="dup",
                                                        signer=keys["alice"])

    two = resp(call("create_ticket", TICKET, "c1"), call("create_ticket", EDITED, "c2"))
    out = await run_script([two, answer("done")],
                           policy=Policy(approvers={"create_ticket": ["alice"]}), during=during)
    assert (out.result.reason, out.result.tool_executions) == ("completed", 1)


async def test_the_client_refuses_to_sign_a_call_that_is_not_waiting(
        run_script: RunScript, temporal: Client, keys: dict[str, Signer]) -> None:
    async def during(handle: WorkflowHandle[Any, Any]) -> None:
        await pending(handle)
        run = await get_run(temporal, handle.id)
        with pytest.raises(DecisionRefused, match="'nope' is not waiting for approval"):
            await run.approve("nope", signer=keys["alice"])
        with pytest.raises(ValueError, match="differs from the signer's name"):
            await run.approve("t1", approver="bob", signer=keys["alice"])
        await run.approve("t1", signer=keys["alice"])

    out = await run_script([resp(call("create_ticket", TICKET, "t1")), answer("done")],
                           policy=alice_only(keys), during=during)
    assert out.result.tool_executions == 1


# --- the worker's keys file -------------------------------------------------------------


async def test_a_worker_with_a_keys_file_accepts_only_signed_decisions(
        temporal: Client, tmp_path: Path, keys: dict[str, Signer]) -> None:
    """A real `boundloop worker` given BOUNDLOOP_APPROVER_KEYS: a run whose policy has no
    keys still needs signed decisions, and its policy cannot replace alice's key."""
    from boundloop.scripted.server import ScriptedModelServer

    keys_file = tmp_path / "approvers.keys"
    keys_file.write_text(f"# who may approve\nalice {keys['alice'].public_key}\n",
                         encoding="utf-8")
    model = ScriptedModelServer([])
    queue = f"signed-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "worker.log"
    env = worker_env(tmp_path, TEMPORAL_ADDRESS=temporal.service_client.config.target_host,
                     BOUNDLOOP_TASK_QUEUE=queue, OPENAI_BASE_URL=model.start(),
                     OPENAI_API_KEY="sk-test-not-real", BOUNDLOOP_APPROVER_KEYS=str(keys_file))
    try:
        with process([sys.executable, "-m", "boundloop.worker.main"], env, log):
            await log_has(log, "worker started")
            handle = await park(temporal, model, queue)
            status = await query_status(handle)
            assert "accepts only signed decisions" in await refused(
                handle, Decision(call_id="t1", approve=True, approver="alice"))
            assert "not alice's" in await refused(
                handle, signed(status, handle.id, keys["mallory"], "t1", as_name="alice"))
            await unchanged(handle, status)
            model.append(answer("done"))
            await (await get_run(temporal, handle.id)).approve("t1", signer=keys["alice"])
            result = await asyncio.wait_for(handle.result(), WAIT)
    finally:
        model.stop()
    assert (result.reason, result.tool_executions) == ("completed", 1)


async def test_a_bad_keys_file_stops_the_worker_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "approvers.keys"
    bad.write_text("alice ed25519:AAAA\n", encoding="utf-8")
    env = worker_env(tmp_path, TEMPORAL_ADDRESS="127.0.0.1:1", BOUNDLOOP_APPROVER_KEYS=str(bad),
                     OPENAI_BASE_URL="http://127.0.0.1:9/v1")
    code, out, err = await cli("worker", env=env)
    lines = [line for line in (out + err).splitlines() if line.strip()]
    assert code == 2, lines
    assert lines == [f"error: BOUNDLOOP_APPROVER_KEYS: {bad} line 1: an Ed25519 public key "
                     "is 32 bytes, this one is 3"], lines
    # `run --model-script` runs a worker of its own: refused the same way, before it starts.
    code, out, err = await cli("run", "hi", "--model-script",
                               "examples/scripts/stock_two_skus.json", env=env)
    assert code == 2 and "BOUNDLOOP_APPROVER_KEYS:" in err and "Traceback" not in err, err


async def test_keys_new_refuses_to_overwrite_and_bad_names(tmp_path: Path) -> None:
    env = env_for(None, tmp_path)
    assert (await cli("keys", "new", "alice", "--dir", str(tmp_path), env=env))[0] == 0
    before = (tmp_path / "alice.key").read_bytes()
    code, _, err = await cli("keys", "new", "alice", "--dir", str(tmp_path), env=env)
    assert code == 2 and "alice.key already exists" in err
    assert (tmp_path / "alice.key").read_bytes() == before
    code, _, err = await cli("keys", "new", "a/b", "--dir", str(tmp_path), env=env)
    assert code == 2 and "must be 1-100 letters" in err

