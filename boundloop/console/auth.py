"""Who may use the console: approvers' credentials, signed session cookies, CSRF tokens.

- The approvers file (BOUNDLOOP_CONSOLE_APPROVERS): lines of `NAME scrypt$N$r$p$SALT$HASH`
  (`boundloop console-approver NAME` writes one), `#` comments and blank lines. The
  credential is a password or a generated token; only its scrypt hash is stored.
- A session is a cookie holding the approver's name, a CSRF token and its expiry,
  signed with HMAC-SHA256 under the console's secret: the browser can read it but
  cannot forge or extend it. No server-side session store, so no cleanup either.
- Every state-changing form carries the session's CSRF token; the cookie is also
  `SameSite=Strict`.
- Failed sign-ins are counted per approver name and per client address
  (`SignInGuard`): after MAX_FAILURES, sign-in is refused for a lockout that doubles
  each time, without spending an scrypt on it.
- A page shows a note or an error from its query string only with the MAC the console
  put next to it (`flash_mac`, keyed by the session's CSRF token): a link made
  elsewhere cannot put words into a console page.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from boundloop.errors import BoundloopError
from boundloop.signing import check_name, name_lines, read_listing

#: scrypt's cost (2^14, r 8, p 1: ~16 MiB and some 50 ms a sign-in; the commonly
#: recommended interactive setting).
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
#: How long a sign-in lasts.
SESSION_SECONDS = 12 * 3600
COOKIE = "boundloop_console"
#: Failed sign-ins (per name, per address) before a lockout.
MAX_FAILURES = 5
#: The first lockout's default (BOUNDLOOP_CONSOLE_LOCKOUT_SECONDS); each next one of the
#: same name or address doubles, up to MAX_LOCKOUT_SECONDS (or the first, if longer).
LOCKOUT_SECONDS = 60.0
MAX_LOCKOUT_SECONDS = 3600.0
#: A name or address without a failure for this long starts from nothing again.
FORGET_SECONDS = 24 * 3600.0
#: Names and addresses tracked at most (the oldest are dropped past it).
MAX_TRACKED = 100_000


class ApproversFileError(BoundloopError, ValueError):
    """An approvers file the console cannot use; the message names the line."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _scrypt(secret: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(secret.encode("utf-8"), salt=salt, n=n, r=r, p=p,
                          maxmem=128 * r * n * 2, dklen=32)


def hash_credential(secret: str) -> str:
    """`scrypt$N$r$p$SALT$HASH` of a password or token (a fresh random salt)."""
    salt = secrets.token_bytes(16)
    digest = _scrypt(secret, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${_b64(salt)}${_b64(digest)}"


def new_token() -> str:
    """A sign-in token for an approver who should not pick a password."""
    return secrets.token_urlsafe(24)


@dataclass(frozen=True)
class Credential:
    n: int
    r: int
    p: int
    salt: bytes
    digest: bytes

    @classmethod
    def parse(cls, text: str) -> Credential:
        parts = text.split("$")
        if len(parts) != 6 or parts[0] != "scrypt":
            raise ValueError("expected `scrypt$N$r$p$SALT$HASH` "
                             "(from `boundloop console-approver NAME`)")
        try:
            n, r, p = (int(v) for v in parts[1:4])
            salt, digest = _unb64(parts[4]), _unb64(parts[5])
        except ValueError:
            raise ValueError("the scrypt parameters or base64 values are malformed") from None
        if n < 2**10 or n & (n - 1) or not 0 < r <= 64 or not 0 < p <= 16 or len(digest) != 32:
            raise ValueError("scrypt parameters out of range (N a power of 2 >= 1024)")
        return cls(n=n, r=r, p=p, salt=salt, digest=digest)

    def matches(self, secret: str) -> bool:
        return hmac.compare_digest(_scrypt(secret, self.salt, self.n, self.r, self.p),
                                   self.digest)


def parse_approvers(text: str, source: str) -> dict[str, Credential]:
    found: dict[str, Credential] = {}
    for where, name, hashed in name_lines(text, source,
                                          "`NAME scrypt$…` (one approver a line)",
                                          ApproversFileError):
        if name in found:
            raise ApproversFileError(f"{where}: {name} is listed already (one line each)")
        try:
            check_name(name)
            found[name] = Credential.parse(hashed)
        except ValueError as exc:
            raise ApproversFileError(f"{where}: {exc}") from None
    return found


def load_approvers(path: Path) -> dict[str, Credential]:
    approvers = parse_approvers(read_listing(path, "approvers file", ApproversFileError),
                                str(path))
    if not approvers:
        raise ApproversFileError(f"approvers file {path} lists no approver: nobody could "
                                 "sign in")
    return approvers


# --- signed session cookies ------------------------------------------------------------


@dataclass(frozen=True)
class SignedIn:
    approver: str
    csrf: str
    expires: int


class Sessions:
    """Issues and reads signed session cookies under `secret`."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 32:
            raise ValueError("the console secret must be at least 32 bytes")
        self._secret = secret

    def _mac(self, body: str) -> str:
        return _b64(hmac.new(self._secret, body.encode("ascii"), hashlib.sha256).digest())

    def issue(self, approver: str, now: float | None = None) -> tuple[str, SignedIn]:
        at = int(time.time() if now is None else now)
        signed = SignedIn(approver=approver, csrf=secrets.token_urlsafe(24),
                          expires=at + SESSION_SECONDS)
        body = _b64(json.dumps({"a": signed.approver, "c": signed.csrf,
                                "e": signed.expires}).encode("utf-8"))
        return f"{body}.{self._mac(body)}", signed

    def read(self, cookie: str | None, now: float | None = None) -> SignedIn | None:
        """The signed-in approver of a cookie, or None (absent, forged, expired)."""
        if not cookie or cookie.count(".") != 1:
            return None
        body, mac = cookie.split(".")
        try:
            body.encode("ascii")
            mac.encode("ascii")
        except UnicodeEncodeError:
            return None
        if not hmac.compare_digest(self._mac(body), mac):
            return None
        try:
            data = json.loads(_unb64(body))
            signed = SignedIn(approver=str(data["a"]), csrf=str(data["c"]),
                              expires=int(data["e"]))
        except (ValueError, KeyError, TypeError):
            return None
        if signed.expires <= (time.time() if now is None else now):
            return None
        return signed


def csrf_ok(signed: SignedIn, token: str | None) -> bool:
    return token is not None and hmac.compare_digest(signed.csrf.encode(),
                                                     token.encode("utf-8", "replace"))


def flash_mac(signed: SignedIn, text: str) -> str:
    """The MAC a page's note or error travels with (keyed by the session's CSRF token,
    which only that session's pages hold)."""
    return _b64(hmac.new(signed.csrf.encode("ascii"), text.encode("utf-8"),
                         hashlib.sha256).digest()[:16])


def flash_ok(signed: SignedIn, text: str, mac: str | None) -> bool:
    return mac is not None and hmac.compare_digest(flash_mac(signed, text).encode(),
                                                   mac.encode("utf-8", "replace"))


# --- failed sign-ins --------------------------------------------------------------------


@dataclass
class _Tries:
    failures: int = 0
    pending: int = 0  # checks under way (their outcome not known yet)
    lockouts: int = 0
    until: float = 0.0
    last: float = 0.0


def address_key(host: str | None) -> str:
    """The client address a lockout applies to: an IPv6 client by its /64 (one machine
    has a whole /64 to pick from)."""
    try:
        ip = ipaddress.ip_address(host or "")
    except ValueError:
        return f"addr:{host}"
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return f"addr:{ip.ipv4_mapped}"
        return f"addr:{ipaddress.ip_network(f'{ip}/64', strict=False)}"
    return f"addr:{ip}"


class SignInGuard:
    """Failed sign-ins per approver name and per client address. `begin` says whether a
    sign-in may be checked at all: not while its name or address is locked out, nor once
    its failures and the checks still under way reach MAX_FAILURES (so a burst of
    parallel tries costs MAX_FAILURES scrypts, not one each). `end` records the outcome:
    a success forgets both, the MAX_FAILURES-th failure locks it out for `lockout`
    seconds, doubled at each further lockout."""

    def __init__(self, lockout: float = LOCKOUT_SECONDS) -> None:
        if lockout <= 0:
            raise ValueError("the lockout must be positive")
        self.lockout = lockout
        self._tries: dict[str, _Tries] = {}

    @staticmethod
    def keys(name: str, address: str | None) -> tuple[str, str]:
        # A name by its digest: a typed name may be as long as a form allows.
        digest = hashlib.sha256(name.encode("utf-8", "replace")).hexdigest()[:32]
        return f"name:{digest}", address_key(address)

    def begin(self, keys: tuple[str, ...]) -> bool:
        now = time.monotonic()
        self._forget(now)
        for key in keys:
            t = self._tries.get(key)
            if t is not None and (t.until > now or t.failures + t.pending >= MAX_FAILURES):
                return False
        for key in keys:
            t = self._tries.pop(key, None) or _Tries()
            t.pending += 1
            t.last = now
            self._tries[key] = t  # last in order: the dict runs oldest to newest
        return True

    def end(self, keys: tuple[str, ...], ok: bool) -> None:
        now = time.monotonic()
        for key in keys:
            t = self._tries.get(key)
            if t is None:
                continue
            t.pending = max(0, t.pending - 1)
            if ok:
                if t.pending:
                    t.failures, t.lockouts = 0, 0
                else:
                    del self._tries[key]
                continue
            t.failures += 1
            t.last = now
            if t.failures >= MAX_FAILURES:
                t.lockouts += 1
                t.failures = 0
                longest = max(self.lockout, MAX_LOCKOUT_SECONDS)
                t.until = now + min(self.lockout * 2 ** min(t.lockouts - 1, 20), longest)

    def _forget(self, now: float) -> None:
        while self._tries:
            key, t = next(iter(self._tries.items()))
            stale = t.pending == 0 and t.until <= now and (
                (t.failures == 0 and t.lockouts == 0) or t.last + FORGET_SECONDS <= now)
            if not stale and len(self._tries) <= MAX_TRACKED:
                return
            del self._tries[key]
