"""Signed approval decisions: the message an approver signs and its pure verification.

An approver holds an Ed25519 private key; the run's policy (`approver_keys`) or the
worker's configuration holds the public keys by approver name. A signature covers the
run (workflow id), the call (call id, step, fingerprint of the arguments waiting for
approval), the decision, the approver's name, the digest of edited arguments and of the
reason, and the time it was made: it cannot be moved to another run, call, decision or
set of edited arguments, and it is valid for `MAX_AGE_SECONDS` only.

Verification is deterministic (Ed25519 verifies the same way every time, with no
randomness and no I/O), so the workflow runs it in its update validator and signal
handlers; time comes from the caller (`workflow.now()` there).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from boundloop.core.canonical import canonical_json, preview

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

# `cryptography` is imported where it is used, not here: a workflow module's parent
# packages are re-imported in Temporal's sandbox, and its native module cannot be
# loaded twice (the boundloop plugin passes it through for the workflow's own use).

#: Public keys are written `ed25519:` + base64 of the 32 raw key bytes.
KEY_PREFIX = "ed25519:"
#: Names the message, so a signature made for anything else never verifies here.
PURPOSE = "boundloop approval decision v1"
#: How long a signature stays valid after it was made (workflow time): long enough to
#: reach a worker, short enough that a captured signature is soon useless.
MAX_AGE_SECONDS = 300
#: How far in the future a signature's time may be (the signer's clock runs ahead).
MAX_SKEW_SECONDS = 60
#: Approver names: the same bound as a decision's `approver`.
NAME_MAX = 100


def public_key(text: str) -> Ed25519PublicKey:
    """The key of `ed25519:BASE64`. Raises ValueError saying what is wrong."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if not text.startswith(KEY_PREFIX):
        raise ValueError(f"a public key starts with {KEY_PREFIX!r} "
                         f"(as `boundloop keys new` prints it), not {preview(text, 20)!r}")
    try:
        raw = base64.b64decode(text[len(KEY_PREFIX):], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the public key is not valid base64") from None
    if len(raw) != 32:
        raise ValueError(f"an Ed25519 public key is 32 bytes, this one is {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


def _valid_key(text: str) -> str:
    public_key(text)
    return text


#: A public key in its text form, checked when the policy is validated.
PublicKeyText = Annotated[str, AfterValidator(_valid_key)]
ApproverName = Annotated[str, Field(min_length=1, max_length=NAME_MAX)]


def key_text(key: Ed25519PublicKey) -> str:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    raw = key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return KEY_PREFIX + base64.b64encode(raw).decode("ascii")


@dataclass(frozen=True)
class Remember:
    """The grant a remembered approval asks for: later calls meeting `when` (all if None),
    for the rest of the run or of its session (`scope`)."""

    when: str | None
    scope: str = "run"


class Signature(BaseModel):
    """An approver's signature over one decision (see `message`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: When it was signed, in Unix seconds (the signer's clock).
    signed_at: int = Field(strict=True, ge=0, le=10**11)
    #: base64 of the 64-byte Ed25519 signature.
    value: str = Field(min_length=1, max_length=200)


def digest(value: Any) -> str | None:
    """sha256 of the canonical JSON of `value` (None stays None)."""
    if value is None:
        return None
    text = canonical_json(value)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def message(*, workflow_id: str, call_id: str, step: int, fingerprint: str, approve: bool,
            approver: str, arguments: dict[str, Any] | None, reason: str | None,
            signed_at: int, remember: Remember | None = None, run: str | None = None
            ) -> bytes:
    """The bytes an approver signs: canonical JSON, one text per decision. A remembered
    approval signs its grant too (`{"when": ...}`, with `"scope": "session"` when it is for
    the session), so a run's grant cannot be widened to the session; a decision naming
    its run (first execution run id) signs it, so it never holds for another run under
    the same workflow id. Without either the text is as before, so signatures made before
    them still verify."""
    body = {
        "purpose": PURPOSE, "workflow_id": workflow_id, "call_id": call_id, "step": step,
        "fingerprint": fingerprint, "decision": "approve" if approve else "reject",
        "approver": approver, "arguments_sha256": digest(arguments),
        "reason_sha256": digest(reason), "signed_at": signed_at,
    }
    if remember is not None:
        body["remember"] = {"when": remember.when} | (
            {"scope": remember.scope} if remember.scope != "run" else {})
    if run is not None:
        body["run"] = run
    # surrogatepass: ids come from JSON and may hold lone surrogate escapes.
    return canonical_json(body).encode("utf-8", "surrogatepass")


def run_keys(worker_keys: Mapping[str, str], policy_keys: Mapping[str, str]) -> dict[str, str]:
    """The keys that judge a run's decisions: the worker's, and the run policy's for names
    the worker does not hold (the worker's configuration is the operator's; a run's
    starter cannot replace a key it holds)."""
    return {**policy_keys, **worker_keys}


@dataclass(frozen=True)
class Context:
    """What a decision's signature is checked against."""

    keys: Mapping[str, str]
    workflow_id: str
    now: datetime


def problem(ctx: Context, *, call_id: str, step: int, fingerprint: str, approve: bool,
            approver: str, arguments: dict[str, Any] | None, reason: str | None,
            signature: Signature | None, remember: Remember | None = None,
            run: str | None = None) -> str | None:
    """Why the decision's signature does not hold, or None. With no keys configured,
    decisions are not signed and nothing is checked."""
    if not ctx.keys:
        return None
    who = preview(approver, 60)
    text = ctx.keys.get(approver)
    if text is None:  # first: telling a non-approver to sign as themselves leads nowhere
        if signature is None:
            return (f"this run accepts only signed decisions, and approver {who!r} has no "
                    "public key configured for it: sign as an approver who has one "
                    "(`--as NAME --key NAME.key`)")
        return f"approver {who!r} has no public key configured for this run"
    if signature is None:
        return ("this run accepts only signed decisions: sign it with "
                f"`--as {who} --key {who}.key` (or `signer=` in the client API)")
    signed = message(workflow_id=ctx.workflow_id, call_id=call_id, step=step,
                     fingerprint=fingerprint, approve=approve, approver=approver,
                     arguments=arguments, reason=reason, signed_at=signature.signed_at,
                     remember=remember, run=run)
    return _verified(text, signature, signed, ctx.now, who,
                     "decision (another key, run, call, decision, edited arguments or "
                     "remembered grant)")


def _verified(key: str, signature: Signature, signed: bytes, now: datetime, who: str,
              what: str, clock: str = "run's") -> str | None:
    """Why `signature` is not a fresh signature by `key` over `signed`, or None."""
    from cryptography.exceptions import InvalidSignature

    age = now.timestamp() - signature.signed_at
    if age > MAX_AGE_SECONDS:
        return (f"the signature is {age:.0f} s old: a signed decision is valid for "
                f"{MAX_AGE_SECONDS} s (sign it again)")
    if -age > MAX_SKEW_SECONDS:
        return (f"the signature is dated {-age:.0f} s ahead of the {clock} clock (at most "
                f"{MAX_SKEW_SECONDS} s is allowed): check the signer's clock")
    try:
        raw = base64.b64decode(signature.value, validate=True)
    except (binascii.Error, ValueError):
        return "the signature is not valid base64"
    try:
        public_key(key).verify(raw, signed)
    except InvalidSignature:
        return f"the signature is not {who}'s over this {what}"
    return None


# --- budget limits ---------------------------------------------------------------------

#: Names the message of a budget change (never valid as an approval decision's).
BUDGET_PURPOSE = "boundloop budget limits v1"
#: Names the message of a budget reset (`boundloop budget reset`): never a limits change.
BUDGET_RESET_PURPOSE = "boundloop budget reset v1"


def budget_message(*, namespace: str, key: str, limits: Mapping[str, Any], admin: str,
                   nonce: str, signed_at: int, purpose: str = BUDGET_PURPOSE) -> bytes:
    """The bytes a budget admin signs to set `key`'s limits in `namespace`: another key,
    namespace or limits, or the same change applied twice (the ledger keeps the nonces
    it applied while they are valid), never verifies."""
    body = {"purpose": purpose, "namespace": namespace, "budget": key,
            "limits": dict(limits), "admin": admin, "nonce": nonce, "signed_at": signed_at}
    return canonical_json(body).encode("utf-8", "surrogatepass")


def unsigned_budget_change(admins: Mapping[str, str], key: str) -> str:
    """Why an unsigned change of `key`'s limits is refused where approver keys are set."""
    return (f"budget {key!r} refused the change: its workers have approver keys, so only a "
            "change signed by a budget admin "
            f"({', '.join(admins) or 'none configured: [budget] admins in the policy'}) "
            f"counts: `boundloop budget set {key} … --as NAME --key NAME.key`")


def budget_problem(admins: Mapping[str, str], *, namespace: str, key: str,
                   limits: Mapping[str, Any], admin: str, nonce: str, signature: Signature,
                   now: datetime, applied: Mapping[str, int],
                   purpose: str = BUDGET_PURPOSE) -> str | None:
    """Why a signed change of `key`'s limits (or, with BUDGET_RESET_PURPOSE, a reset:
    `limits` is then the reset) does not hold, or None. `admins`: the budget admins'
    public keys by name; `applied`: the nonces the ledger applied."""
    who = preview(admin, 60)
    text = admins.get(admin)
    if text is None:
        return (f"{who!r} is not a budget admin of this worker (budget admins: "
                f"{', '.join(admins) or 'none'})")
    if nonce in applied:
        return "this signed change was applied already (a signature counts once)"
    signed = budget_message(namespace=namespace, key=key, limits=limits, admin=admin,
                            nonce=nonce, signed_at=signature.signed_at, purpose=purpose)
    return _verified(text, signature, signed, now, who,
                     "budget change (another budget, namespace or limits)", "ledger's")
