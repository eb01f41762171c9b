"""Files holding secrets (codec keys, TLS private keys, console credentials) are refused
when others may read them, as ssh refuses such a private key: a secret readable by the
group or the world may already be someone else's. Files saying whom to trust (the
console's approvers, approvers' public keys, the operator's policy) are refused when
others may write them: whoever can write one could add themselves."""

from __future__ import annotations

import stat
from pathlib import Path


def shared_problem(setting: str, path: Path, mode: int) -> str | None:
    """Why `path` (named by `setting`, of st_mode `mode`) is refused, or None. The fix is
    mode 0600 owned by the reading user (in the image, uid 10001), not `chmod 644`."""
    if not mode & (stat.S_IRWXG | stat.S_IRWXO):
        return None
    return (f"{setting}: {path} is readable by others (mode {stat.S_IMODE(mode):04o}): "
            f"`chmod 600 {path}` and make it the reading user's own")


def writable_problem(what: str, path: Path, mode: int) -> str | None:
    """Why `path` (a file of `what`, of st_mode `mode`) is refused, or None: writable by
    the group or the world, another local user could add an approver or a key, or loosen
    a limit. The fix is `chmod go-w`, not a copy others still write."""
    if not mode & (stat.S_IWGRP | stat.S_IWOTH):
        return None
    return (f"{what} {path} is writable by others (mode {stat.S_IMODE(mode):04o}), so "
            f"anyone who can write it decides whom boundloop trusts: `chmod go-w {path}`")
