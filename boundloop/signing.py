"""Approver keys on disk and signing (the I/O side of boundloop.core.signatures).

- `new_key(name, directory)`: `boundloop keys new NAME` writes NAME.key (the private key,
  PKCS#8 PEM, mode 0600) and NAME.pub (one line `NAME ed25519:BASE64`).
- `Signer.from_file(name, path)`: an approver's private key, to sign decisions with
  (`Run.approve(..., signer=...)`, `boundloop approve --as NAME --key FILE`), and
  budget admins' changes of a budget (`boundloop budget set KEY --as NAME --key FILE`).
- `load_keys_file(path)`: the worker's BOUNDLOOP_APPROVER_KEYS file: lines of
  `NAME ed25519:BASE64` (NAME.pub files put together), `#` comments and blank lines.

The keys a worker serves on its task queue are registered with its toolset
(boundloop/tools/catalog.py), so every worker of a task queue must be given the same file.
"""

from __future__ import annotations

import base64
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
)

from boundloop.core import signatures
from boundloop.core.signatures import NAME_MAX, Signature
from boundloop.errors import BoundloopError
from boundloop.secret_files import writable_problem


class KeyFileError(BoundloopError, ValueError):
    """A key file boundloop cannot use; the message names the file and the problem."""


#: Names that are safe as file names (NAME.key) and as approver names.
NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._@-")


def check_name(name: str) -> str:
    if not 0 < len(name) <= NAME_MAX or not set(name) <= NAME_CHARS or name.startswith("."):
        raise KeyFileError(f"approver name {name[:NAME_MAX]!r} must be 1-{NAME_MAX} letters, "
                        "digits, '.', '_', '@' or '-' (not starting with '.')")
    return name


# --- making keys -----------------------------------------------------------------------


@dataclass(frozen=True)
class NewKey:
    private_path: Path
    public_path: Path
    public_line: str  # `NAME ed25519:BASE64`


def new_key(name: str, directory: Path) -> NewKey:
    """A new key pair for `name` in `directory`. An existing NAME.key or NAME.pub is
    never overwritten (a lost private key cannot be recovered)."""
    check_name(name)
    private_path, public_path = directory / f"{name}.key", directory / f"{name}.pub"
    for path in (private_path, public_path):
        if path.exists():
            raise KeyFileError(f"{path} already exists: keep it, or remove it first")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    line = f"{name} {signatures.key_text(key.public_key())}"
    # O_EXCL: created here with mode 0600 from the start, never readable by others.
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    public_path.write_text(line + "\n", encoding="utf-8")
    return NewKey(private_path=private_path, public_path=public_path, public_line=line)


# --- signing ---------------------------------------------------------------------------


class Signer:
    """An approver's private key: signs decisions as `name`."""

    def __init__(self, name: str, key: Ed25519PrivateKey) -> None:
        self.name = check_name(name)
        self._key = key

    @classmethod
    def from_file(cls, name: str, path: Path | str) -> Signer:
        """Load NAME.key. Refused when others may read it (as ssh refuses): a private
        key readable by the group or the world may already be someone else's."""
        path = Path(path)
        try:
            mode = path.stat().st_mode
            data = path.read_bytes()
        except FileNotFoundError:
            raise KeyFileError(f"key file {path} does not exist") from None
        except IsADirectoryError:
            raise KeyFileError(f"key file {path} is a directory") from None
        except OSError as exc:
            raise KeyFileError(f"cannot read key file {path}: {exc.strerror}") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise KeyFileError(f"key file {path} is readable by others (mode "
                            f"{stat.S_IMODE(mode):04o}): `chmod 600 {path}`")
        try:
            key = load_pem_private_key(data, password=None)
        except (ValueError, TypeError):
            raise KeyFileError(f"key file {path} is not an unencrypted PEM private key "
                            "(made by `boundloop keys new`)") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise KeyFileError(f"key file {path} holds a {type(key).__name__}, not an Ed25519 "
                            "key")
        return cls(name, key)

    @property
    def public_key(self) -> str:
        return signatures.key_text(self._key.public_key())

    def sign(self, *, workflow_id: str, call_id: str, step: int, fingerprint: str,
             approve: bool, arguments: dict[str, Any] | None, reason: str | None,
             signed_at: int | None = None,
             remember: signatures.Remember | None = None,
             run: str | None = None) -> Signature:
        """Sign one decision as `self.name` (with the grant of a remembered approval);
        `signed_at` (Unix seconds) defaults to now."""
        at = int(time.time()) if signed_at is None else signed_at
        raw = self._key.sign(signatures.message(
            workflow_id=workflow_id, call_id=call_id, step=step, fingerprint=fingerprint,
            approve=approve, approver=self.name, arguments=arguments, reason=reason,
            signed_at=at, remember=remember, run=run))
        return Signature(signed_at=at, value=base64.b64encode(raw).decode("ascii"))

    def sign_budget(self, *, namespace: str, key: str, limits: Mapping[str, Any],
                    signed_at: int | None = None) -> tuple[str, Signature]:
        """Sign a change of budget `key`'s limits (their JSON form) in `namespace`, as a
        budget admin: the nonce it was signed with and the signature."""
        at = int(time.time()) if signed_at is None else signed_at
        nonce = secrets.token_hex(16)
        raw = self._key.sign(signatures.budget_message(
            namespace=namespace, key=key, limits=limits, admin=self.name, nonce=nonce,
            signed_at=at))
        return nonce, Signature(signed_at=at, value=base64.b64encode(raw).decode("ascii"))

    def sign_budget_reset(self, *, namespace: str, key: str, reset: Mapping[str, Any],
                          signed_at: int | None = None) -> tuple[str, Signature]:
        """Sign a reset of budget `key` (its JSON form: `boundloop budget reset`) in
        `namespace`, as a budget admin: the nonce and the signature."""
        at = int(time.time()) if signed_at is None else signed_at
        nonce = secrets.token_hex(16)
        raw = self._key.sign(signatures.budget_message(
            namespace=namespace, key=key, limits=reset, admin=self.name, nonce=nonce,
            signed_at=at, purpose=signatures.BUDGET_RESET_PURPOSE))
        return nonce, Signature(signed_at=at, value=base64.b64encode(raw).decode("ascii"))


# --- the worker's public keys ----------------------------------------------------------


def parse_keys(text: str, source: str) -> dict[str, str]:
    """`NAME ed25519:BASE64` lines; raises KeyFileError naming the line."""
    keys: dict[str, str] = {}
    for where, name, key in name_lines(text, source, "`NAME ed25519:BASE64` (a NAME.pub line)",
                                       KeyFileError):
        try:
            check_name(name)
            signatures.public_key(key)
        except ValueError as exc:
            raise KeyFileError(f"{where}: {exc}") from None
        if name in keys:
            raise KeyFileError(f"{where}: {name} has a key already (one key per name)")
        keys[name] = key
    return keys


def load_keys_file(path: Path) -> dict[str, str]:
    keys = parse_keys(read_listing(path, "approver keys file", KeyFileError), str(path))
    if not keys:
        # An empty file would silently turn signing off: say so instead.
        raise KeyFileError(f"approver keys file {path} holds no key")
    return keys


# --- files of `NAME VALUE` lines (approver keys, the console's approvers) -------------


def read_listing(path: Path, what: str, error: Callable[[str], Exception]) -> str:
    """The text of `path`; `error` says in a line (naming `what`) why it cannot be read,
    or is refused: a file of names to trust that others may write."""
    try:
        text = path.read_text(encoding="utf-8")
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read {what} {path}: {exc}") from None
    problem = writable_problem(what, path, mode)
    if problem is not None:
        raise error(problem)
    return text


def name_lines(text: str, source: str, expected: str, error: Callable[[str], Exception]
               ) -> Iterator[tuple[str, str, str]]:
    """Each `NAME VALUE` line as (`SOURCE line N`, NAME, VALUE), skipping blank lines and
    `#` comments; a line of another shape raises `error` saying it `expected` one."""
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source} line {number}"
        parts = line.split()
        if len(parts) != 2:
            raise error(f"{where}: expected {expected}")
        yield where, parts[0], parts[1]
