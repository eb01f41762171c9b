"""The console's credentials and session cookies, on their own (boundloop/console/auth.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from boundloop.console.auth import (
    SESSION_SECONDS,
    ApproversFileError,
    Credential,
    Sessions,
    csrf_ok,
    hash_credential,
    load_approvers,
)


def test_a_credential_matches_only_its_own_secret_and_hashes_differ_by_salt() -> None:
    line = hash_credential("s3cret-password")
    assert "s3cret" not in line and line != hash_credential("s3cret-password")
    cred = Credential.parse(line)
    assert cred.matches("s3cret-password")
    assert not cred.matches("s3cret-passwore") and not cred.matches("")


def test_a_forged_tampered_or_expired_cookie_is_no_session() -> None:
    sessions = Sessions(b"k" * 32)
    cookie, signed = sessions.issue("alice", now=1000)
    assert sessions.read(cookie, now=1001) == signed
    body, mac = cookie.split(".")
    assert sessions.read(f"{body}x.{mac}", now=1001) is None
    assert sessions.read(f"{body}.{mac[:-2]}AA", now=1001) is None
    assert Sessions(b"o" * 32).read(cookie, now=1001) is None  # another console's secret
    assert sessions.read(cookie, now=1000 + SESSION_SECONDS) is None
    assert sessions.read(None) is None and sessions.read("é.é") is None
    assert csrf_ok(signed, signed.csrf) and not csrf_ok(signed, None)
    assert not csrf_ok(signed, signed.csrf + "x")


def test_an_approvers_file_is_refused_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "approvers"
    path.write_text(f"# comment\n\nalice {hash_credential('pw-0123456789')}\n")
    assert set(load_approvers(path)) == {"alice"}
    for text, problem in [
        ("alice\n", "line 1: expected `NAME scrypt"),
        ("alice md5$x\n", "line 1: expected `scrypt$"),
        (f"bad/name {hash_credential('x')}\n", "approver name"),
        (f"a {hash_credential('x')}\na {hash_credential('y')}\n", "line 2: a is listed"),
        ("alice scrypt$3$8$1$AAAA$AAAA\n", "out of range"),
        ("# nobody\n", "lists no approver"),
    ]:
        path.write_text(text)
        with pytest.raises(ApproversFileError, match=problem.replace("$", r"\$")):
            load_approvers(path)
    with pytest.raises(ApproversFileError, match="does not exist"):
        load_approvers(tmp_path / "missing")
