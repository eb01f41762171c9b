"""Files that say whom boundloop trusts, seen from another local user who may write them
(group- or world-writable): the console's approvers file, the approvers' public keys and
the operator's policy. Whoever can write one could add an approver, a key or a looser
limit; so the console and the worker refuse such a file before they start, in one line
saying how to fix it, as they refuse a private key others may read."""

from __future__ import annotations

from pathlib import Path

from boundloop.console.auth import hash_credential
from boundloop.settings import load_policy
from boundloop.signing import load_keys_file, new_key
from tests.test_cli import cli, env_for
from tests.test_worker_process import worker_env


def writable(path: Path, mode: int) -> str:
    """How a file of names to trust at `mode` is refused (after what it is)."""
    return (f"{path} is writable by others (mode {mode:04o}), so anyone who can write it "
            f"decides whom boundloop trusts: `chmod go-w {path}`")


async def test_an_approvers_file_others_may_write_keeps_the_console_from_starting(
        tmp_path: Path) -> None:
    approvers = tmp_path / "approvers"
    approvers.write_text(f"alice {hash_credential('alice-pw-0123456789')}\n")
    approvers.chmod(0o664)
    # Another user of the file's group adds an approver of their own.
    with approvers.open("a") as f:
        f.write(f"mallory {hash_credential('mallory-pw-0123456789')}\n")
    env = {**env_for(None, tmp_path), "TEMPORAL_ADDRESS": "127.0.0.1:1",
           "BOUNDLOOP_CONSOLE_APPROVERS": str(approvers)}
    code, out, err = await cli("console", "--port", "1", env=env)
    assert code == 2, (out, err)
    assert f"approvers file {writable(approvers, 0o664)}" in " ".join(err.split()), err
    assert "Traceback" not in err
    approvers.chmod(0o606)
    code, out, err = await cli("console", "--port", "1", env=env)
    assert code == 2 and "(mode 0606)" in err, (out, err)


async def test_a_keys_or_policy_file_others_may_write_keeps_the_worker_from_starting(
        tmp_path: Path) -> None:
    keys = tmp_path / "approvers.keys"
    keys.write_text(new_key("alice", tmp_path).public_line + "\n", encoding="utf-8")
    keys.chmod(0o620)
    env = worker_env(tmp_path, TEMPORAL_ADDRESS="127.0.0.1:1",
                     BOUNDLOOP_APPROVER_KEYS=str(keys), OPENAI_BASE_URL="http://127.0.0.1:9/v1")
    code, out, err = await cli("worker", env=env)
    lines = [line for line in (out + err).splitlines() if line.strip()]
    assert code == 2, lines
    assert lines == [f"error: BOUNDLOOP_APPROVER_KEYS: approver keys file "
                     f"{writable(keys, 0o620)}"], lines

    policy = tmp_path / "policy.toml"
    policy.write_text("[limits.max]\nmax_steps = 3\n", encoding="utf-8")
    policy.chmod(0o666)
    env = worker_env(tmp_path, TEMPORAL_ADDRESS="127.0.0.1:1", BOUNDLOOP_POLICY=str(policy),
                     OPENAI_BASE_URL="http://127.0.0.1:9/v1")
    code, out, err = await cli("worker", env=env)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2, err
    assert lines == [f"error: BOUNDLOOP_POLICY: policy file {writable(policy, 0o666)}"], err
    # Readable by all is fine: only writing decides whom to trust.
    policy.chmod(0o644)
    keys.chmod(0o644)
    assert load_policy(policy).limits.max == {"max_steps": 3}
    assert set(load_keys_file(keys)) == {"alice"}
