"""Signed decisions, the pure part: the signed message binds every field, freshness is
judged against the caller's clock, keys and key files are validated; key files on disk."""

from __future__ import annotations

import os
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from boundloop.contracts import Decision
from boundloop.core import approvals, signatures
from boundloop.core.limits import Policy
from boundloop.signing import KeyFileError, Signer, load_keys_file, new_key, parse_keys
from tests.test_core_conversation import RULES, TICKET, pending_state

NOW = datetime(2026, 12, 1, 9, 0, 0, tzinfo=UTC)
FIELDS: dict[str, Any] = {"workflow_id": "wf-approve", "call_id": "call_t", "step": 1,
                          "approve": True, "arguments": None, "reason": None}


@pytest.fixture
def alice(tmp_path: Path) -> Signer:
    return Signer.from_file("alice", new_key("alice", tmp_path).private_path)


@pytest.fixture
def mallory(tmp_path: Path) -> Signer:
    return Signer.from_file("mallory", new_key("mallory", tmp_path).private_path)


def ctx(*signers: Signer, now: datetime = NOW) -> signatures.Context:
    return signatures.Context(keys={s.name: s.public_key for s in signers},
                              workflow_id="wf-approve", now=now)


def decision(signer: Signer, approver: str | None = None, signed_at: datetime = NOW,
             **changes: Any) -> Decision:
    """A decision on the pending `call_t` signed by `signer` over FIELDS + `changes`."""
    fields = {**FIELDS, **changes}
    fp = changes.get("fingerprint", "create_ticket:" + "0" * 16)
    signature = signer.sign(workflow_id=fields["workflow_id"], call_id=fields["call_id"],
                            step=fields["step"], fingerprint=fp, approve=fields["approve"],
                            arguments=fields["arguments"], reason=fields["reason"],
                            signed_at=int(signed_at.timestamp()))
    return Decision(call_id="call_t", approve=FIELDS["approve"], approver=approver or signer.name,
                    arguments=FIELDS["arguments"], reason=FIELDS["reason"], signature=signature)


def signed_over(signer: Signer, **changes: Any) -> Decision:
    """Signed over the real pending call, then (maybe) signed over something else."""
    _state, plan = pending_state()
    return decision(signer, **{"fingerprint": plan.fingerprint, **changes})


def test_a_valid_signature_is_accepted_and_changes_nothing_itself(alice: Signer) -> None:
    state, _plan = pending_state()
    before = state.model_dump()
    assert approvals.check(state, signed_over(alice), RULES, ctx(alice)) is None
    assert state.model_dump() == before


@pytest.mark.parametrize(("field", "value"), [
    ("workflow_id", "another-run"), ("call_id", "call_other"), ("step", 2),
    ("fingerprint", "create_ticket:" + "1" * 16), ("approve", False),
    ("arguments", {**TICKET, "priority": "low"}), ("reason", "not this one"),
])
def test_a_signature_over_any_other_field_is_refused(alice: Signer, field: str,
                                                     value: Any) -> None:
    state, _plan = pending_state()
    why = approvals.check(state, signed_over(alice, **{field: value}), RULES, ctx(alice))
    assert why is not None and "not alice's over this decision" in why


def test_unsigned_unknown_and_forged_decisions_are_refused(alice: Signer,
                                                           mallory: Signer) -> None:
    state, _plan = pending_state()
    unsigned = Decision(call_id="call_t", approve=True, approver="alice")
    assert "accepts only signed decisions" in (
        approvals.check(state, unsigned, RULES, ctx(alice)) or "")
    assert "'mallory' has no public key" in (
        approvals.check(state, signed_over(mallory), RULES, ctx(alice)) or "")
    forged = signed_over(mallory, approver="alice")  # mallory's key, alice's name
    assert "not alice's" in (approvals.check(state, forged, RULES, ctx(alice)) or "")
    # Unsigned from someone without a key: told that, not to sign as themselves.
    why = approvals.check(state, Decision(call_id="call_t", approve=False, approver="mallory",
                                          reason="x"), RULES, ctx(alice)) or ""
    assert "'mallory' has no public key" in why and "--as mallory" not in why, why


def test_freshness_is_judged_against_the_runs_clock(alice: Signer) -> None:
    state, _plan = pending_state()
    age = timedelta(seconds=signatures.MAX_AGE_SECONDS)
    skew = timedelta(seconds=signatures.MAX_SKEW_SECONDS)
    ok = signed_over(alice)
    assert approvals.check(state, ok, RULES, ctx(alice, now=NOW + age)) is None
    assert approvals.check(state, ok, RULES, ctx(alice, now=NOW - skew)) is None
    old = approvals.check(state, ok, RULES, ctx(alice, now=NOW + age + timedelta(seconds=1)))
    assert old is not None and "301 s old" in old
    ahead = approvals.check(state, ok, RULES, ctx(alice, now=NOW - skew - timedelta(seconds=5)))
    assert ahead is not None and "65 s ahead" in ahead


def test_without_keys_nothing_is_checked(alice: Signer) -> None:
    state, _plan = pending_state()
    assert approvals.check(state, Decision(call_id="call_t", approve=True), RULES,
                           ctx()) is None
    assert approvals.check(state, signed_over(alice, step=9), RULES, ctx()) is None


def test_a_worker_key_cannot_be_replaced_by_the_run_policy(alice: Signer,
                                                           mallory: Signer) -> None:
    keys = signatures.run_keys({"alice": alice.public_key},
                               {"alice": mallory.public_key, "bob": mallory.public_key})
    assert keys == {"alice": alice.public_key, "bob": mallory.public_key}


@pytest.mark.parametrize(("key", "problem"), [
    ("Y1Fjsj", "starts with 'ed25519:'"), ("ed25519:not base64!", "not valid base64"),
    ("ed25519:AAAA", "32 bytes, this one is 3"),
])
def test_policy_keys_are_validated(key: str, problem: str) -> None:
    with pytest.raises(ValidationError) as info:
        Policy(approver_keys={"alice": key})
    assert "approver_keys.alice" in str(info.value) and problem in str(info.value)


def test_new_key_writes_a_private_file_only_its_owner_reads(tmp_path: Path) -> None:
    made = new_key("alice", tmp_path)
    assert stat.S_IMODE(made.private_path.stat().st_mode) == 0o600
    name, key = made.public_line.split()
    assert name == "alice" and signatures.public_key(key) is not None
    assert load_keys_file(made.public_path) == {"alice": key}
    assert Signer.from_file("alice", made.private_path).public_key == key
    with pytest.raises(KeyFileError, match="already exists"):
        new_key("alice", tmp_path)
    with pytest.raises(KeyFileError, match="must be 1-100 letters"):
        new_key("../etc/alice", tmp_path)
    os.chmod(made.private_path, 0o644)
    with pytest.raises(KeyFileError, match=r"readable by others \(mode 0644\)"):
        Signer.from_file("alice", made.private_path)
    with pytest.raises(KeyFileError, match="is not an unencrypted PEM private key"):
        Signer.from_file("alice", _private_copy(made.public_path, tmp_path))


def _private_copy(path: Path, tmp_path: Path) -> Path:
    """`path`'s bytes in a 0600 file (a public key where a private one belongs)."""
    out = tmp_path / "wrong.key"
    out.write_bytes(path.read_bytes())
    os.chmod(out, 0o600)
    return out


def test_keys_files_name_the_bad_line(tmp_path: Path, alice: Signer) -> None:
    good = f"alice {alice.public_key}"
    assert parse_keys(f"# approvers\n\n{good}\n", "k") == {"alice": alice.public_key}
    cases = [(f"{good}\n{good}\n", "k line 2: alice has a key already"),
             ("alice\n", "k line 1: expected `NAME ed25519:BASE64`"),
             ("alice ed25519:AAAA\n", "k line 1: an Ed25519 public key is 32 bytes")]
    for text, problem in cases:
        with pytest.raises(KeyFileError) as info:
            parse_keys(text, "k")
        assert problem in str(info.value)
    empty = tmp_path / "empty.keys"
    empty.write_text("# nobody yet\n", encoding="utf-8")
    with pytest.raises(KeyFileError, match="holds no key"):
        load_keys_file(empty)
    with pytest.raises(KeyFileError, match="does not exist"):
        load_keys_file(tmp_path / "missing.keys")


def test_a_signed_grant_for_the_run_cannot_be_widened_to_the_session(alice: Signer) -> None:
    state, plan = pending_state()
    run_grant = signatures.Remember(when=None, scope="run")
    signature = alice.sign(workflow_id="wf-approve", call_id="call_t", step=1,
                           fingerprint=plan.fingerprint, approve=True, arguments=None,
                           reason=None, signed_at=int(NOW.timestamp()), remember=run_grant)
    signed = Decision(call_id="call_t", approve=True, approver="alice", signature=signature,
                      remember=True)
    assert approvals.check(state, signed, RULES, ctx(alice)) is None
    widened = signed.model_copy(update={"scope": "session"})
    why = approvals.check(state, widened, RULES, ctx(alice), in_session=True)
    assert why is not None and "not alice's over this decision" in why
    # Signed for the session, it holds in a session's turn and nowhere else.
    session = alice.sign(workflow_id="wf-approve", call_id="call_t", step=1,
                         fingerprint=plan.fingerprint, approve=True, arguments=None,
                         reason=None, signed_at=int(NOW.timestamp()),
                         remember=signatures.Remember(when=None, scope="session"))
    for_session = widened.model_copy(update={"signature": session})
    assert approvals.check(state, for_session, RULES, ctx(alice), in_session=True) is None
    why = approvals.check(state, for_session, RULES, ctx(alice))
    assert why is not None and "not a session's turn" in why


# --- a decision binds the run and the arguments its approver was shown -----------------

RUN_A, RUN_B = "run-a-first-execution", "run-b-first-execution"


def bound_decision(alice: Signer, *, run: str | None, fp: str | None,
                   sign_run: str | None = None) -> Decision:
    """alice's approval of call_t naming `run` and `fp`, signed over `sign_run` (default
    `run`) and the fingerprint shown."""
    _, plan = pending_state()
    signature = alice.sign(workflow_id="wf-approve", call_id="call_t", step=1,
                           fingerprint=fp or plan.fingerprint, approve=True, arguments=None,
                           reason=None, signed_at=int(NOW.timestamp()),
                           run=sign_run if sign_run is not None else run)
    return Decision(call_id="call_t", approve=True, approver="alice", signature=signature,
                    run=run, fingerprint=fp)


def test_a_decision_for_the_run_and_arguments_shown_holds(alice: Signer) -> None:
    state, plan = pending_state()
    ok = bound_decision(alice, run=RUN_A, fp=plan.fingerprint)
    assert approvals.check(state, ok, RULES, ctx(alice), run=RUN_A, bound=True) is None


def test_a_decision_for_another_run_under_the_same_workflow_id_is_refused(
        alice: Signer) -> None:
    """The workflow id was reused: the decision (and its signature) was made for run A."""
    state, plan = pending_state()
    why = approvals.check(state, bound_decision(alice, run=RUN_A, fp=plan.fingerprint),
                          RULES, ctx(alice), run=RUN_B, bound=True)
    assert why is not None and why.startswith(approvals.CHANGED) and RUN_B in why
    # Naming run B over a signature made for run A does not verify.
    moved = bound_decision(alice, run=RUN_B, fp=plan.fingerprint, sign_run=RUN_A)
    why = approvals.check(state, moved, RULES, ctx(alice), run=RUN_B, bound=True)
    assert why is not None and "not alice's over this decision" in why


def test_a_decision_for_other_arguments_than_those_waiting_is_refused(alice: Signer) -> None:
    state, plan = pending_state()
    other = "create_ticket:0123456789abcdef"
    why = approvals.check(state, bound_decision(alice, run=RUN_A, fp=other), RULES,
                          ctx(alice), run=RUN_A, bound=True)
    assert why is not None and why.startswith(approvals.CHANGED)
    assert other in why and plan.fingerprint in why
    # Unsigned, the same.
    unsigned = Decision(call_id="call_t", approve=True, run=RUN_A, fingerprint=other)
    why = approvals.check(state, unsigned, RULES, None, run=RUN_A, bound=True)
    assert why is not None and why.startswith(approvals.CHANGED)


def test_a_signed_decision_naming_no_run_is_refused_by_a_bound_run(alice: Signer) -> None:
    """A signature over no run would hold for any run under the workflow id: a run
    started under the rule refuses it; one started before it still takes it."""
    state, _ = pending_state()
    loose = bound_decision(alice, run=None, fp=None)
    why = approvals.check(state, loose, RULES, ctx(alice), run=RUN_A, bound=True)
    assert why is not None and "names the run and the arguments" in why
    assert approvals.check(state, loose, RULES, ctx(alice), run=RUN_A) is None
