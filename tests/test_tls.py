"""Secure connections for real: a worker and the CLI reach the dev server only through a
TLS-terminating proxy that demands a client certificate (mTLS), with certificates this
test generates; a wrong CA is refused in one line with exit code 4."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client

import boundloop
from boundloop.connection import tls_config
from boundloop.settings import Settings
from tests.support.tls import CertificateAuthority, Pair, TlsProxy
from tests.test_docs_outputs import shown_block

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "boundloop.cli"]
QUESTION = "A-001とB-002の在庫をそれぞれ調べて。"


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    ca = CertificateAuthority(tmp_path / "pki", "boundloop-test-ca")
    server = ca.issue("server", dns=["temporal.test", "localhost"], client=False)
    client = ca.issue("worker-client", dns=["worker"], client=True)
    other = CertificateAuthority(tmp_path / "pki", "someone-elses-ca")
    return {"ca": ca.pair.cert, "server_cert": server.cert, "server_key": server.key,
            "client_cert": client.cert, "client_key": client.key,
            "wrong_ca": other.pair.cert}


@pytest.fixture
def proxy(temporal: Client, pki: dict[str, Path]) -> Iterator[TlsProxy]:
    with TlsProxy(temporal.service_client.config.target_host,
                  Pair(pki["server_cert"], pki["server_key"]), client_ca=pki["ca"]) as p:
        yield p


def tls_env(tmp_path: Path, proxy: TlsProxy, pki: dict[str, Path], *,
            ca: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OPENAI_", "TEMPORAL_", "BOUNDLOOP_"))}
    env.update({"TEMPORAL_ADDRESS": proxy.address,
                "TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(ca or pki["ca"]),
                "TEMPORAL_TLS_CLIENT_CERT_PATH": str(pki["client_cert"]),
                "TEMPORAL_TLS_CLIENT_KEY_PATH": str(pki["client_key"]),
                # Dialled by IP; the certificate names temporal.test.
                "TEMPORAL_TLS_SERVER_NAME": "temporal.test",
                "BOUNDLOOP_DATA_DIR": str(tmp_path / "data"),
                "BOUNDLOOP_TASK_QUEUE": f"tls-{uuid.uuid4().hex[:8]}"})
    return env


async def cli(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *CLI, *args, cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_worker_and_cli_run_a_question_through_mtls(
        tmp_path: Path, proxy: TlsProxy, pki: dict[str, Path]) -> None:
    env = tls_env(tmp_path, proxy, pki)
    log = tmp_path / "worker.log"
    with log.open("ab") as sink:
        worker = subprocess.Popen(
            [*CLI, "worker", "--model-script", "examples/scripts/stock_two_skus.json"],
            cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL)
    try:
        code, out, err = await cli("run", QUESTION, "--wait", "--json", env=env)
    finally:
        worker.terminate()
        worker.wait(timeout=20)
    assert code == 0, (out, err, log.read_text(encoding="utf-8"))
    result = json.loads(out)
    assert result["reason"] == "completed"
    assert result["tool_executions"] == 2 and result["text"], result
    # Both processes connected through the proxy (no other route to the server exists
    # in their environment).
    assert proxy.handshakes >= 2


async def test_public_api_connects_with_the_sdks_tls_config(
        tmp_path: Path, proxy: TlsProxy, pki: dict[str, Path]) -> None:
    settings = Settings(**tls_env(tmp_path, proxy, pki))
    tls = tls_config(settings)
    assert not isinstance(tls, bool) and tls is not None
    client = await boundloop.connect(proxy.address, tls=tls)
    info = await client.workflow_service.get_system_info(GetSystemInfoRequest())
    assert info.server_version
    assert proxy.handshakes >= 1


async def test_a_wrong_ca_is_refused_in_one_line_with_exit_4(
        tmp_path: Path, proxy: TlsProxy, pki: dict[str, Path]) -> None:
    env = tls_env(tmp_path, proxy, pki, ca=pki["wrong_ca"])
    code, out, err = await cli("list", env=env)
    assert code == 4, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0] == (f"error: cannot connect to Temporal at {proxy.address}: the server's "
                        "TLS certificate is not signed by a trusted CA: check "
                        "TEMPORAL_TLS_SERVER_CA_CERT_PATH")
    # What docs/guide.md shows (for its address).
    [shown] = shown_block("docs/guide.md", "boundloop list")
    assert lines[0] == shown.replace("127.0.0.1:7443", proxy.address)
    # The worker does not retry what retrying cannot fix: it exits 4 in one line too.
    proc = await asyncio.create_subprocess_exec(
        *CLI, "worker", "--model-script", "examples/scripts/stock_two_skus.json", cwd=ROOT,
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    wout, werr = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 4, (wout, werr)
    assert lines[0] in werr.decode().splitlines(), werr.decode()
    assert "Traceback" not in werr.decode() + wout.decode()


async def test_a_missing_certificate_file_is_refused_before_connecting(
        tmp_path: Path, proxy: TlsProxy, pki: dict[str, Path]) -> None:
    env = tls_env(tmp_path, proxy, pki)
    env["TEMPORAL_TLS_CLIENT_KEY_PATH"] = str(tmp_path / "nope.pem")
    code, _out, err = await cli("list", env=env)
    assert code == 2
    assert err.strip() == (f"error: TEMPORAL_TLS_CLIENT_KEY_PATH: cannot read "
                           f"{tmp_path / 'nope.pem'}: No such file or directory")
    del env["TEMPORAL_TLS_CLIENT_KEY_PATH"]
    code, _out, err = await cli("list", env=env)
    assert code == 2
    assert "mTLS needs both TEMPORAL_TLS_CLIENT_CERT_PATH and TEMPORAL_TLS_CLIENT_KEY_PATH" \
        in err


async def test_a_client_key_others_may_read_is_refused_before_connecting(
        tmp_path: Path, proxy: TlsProxy, pki: dict[str, Path]) -> None:
    """The client's private key is a secret like a codec key: mode 0644 is refused in
    one line (exit 2), for the CLI and the worker alike."""
    env = tls_env(tmp_path, proxy, pki)
    key = pki["client_key"]
    key.chmod(0o644)
    line = (f"error: TEMPORAL_TLS_CLIENT_KEY_PATH: {key} is readable by others (mode "
            f"0644): `chmod 600 {key}` and make it the reading user's own")
    code, _out, err = await cli("list", env=env)
    assert (code, err.strip()) == (2, line)
    code, _out, err = await cli("worker", env=env)
    assert (code, err.strip().splitlines()[-1]) == (2, line)
    key.chmod(0o600)
    code, _out, err = await cli("list", env=env)
    assert code == 0, err


async def test_a_client_without_its_certificate_is_refused_by_an_mtls_server(
        tmp_path: Path, proxy: TlsProxy, pki: dict[str, Path]) -> None:
    env = tls_env(tmp_path, proxy, pki)
    del env["TEMPORAL_TLS_CLIENT_CERT_PATH"], env["TEMPORAL_TLS_CLIENT_KEY_PATH"]
    code, out, err = await cli("list", env=env)
    assert code == 4, (out, err)
    assert err.strip() == (f"error: cannot connect to Temporal at {proxy.address}: the "
                           "server closed the TLS connection: it may require a client "
                           "certificate (TEMPORAL_TLS_CLIENT_CERT_PATH, "
                           "TEMPORAL_TLS_CLIENT_KEY_PATH) or refuse this one"), err


async def test_a_certificate_for_another_name_is_refused_naming_the_setting(
        tmp_path: Path, proxy: TlsProxy, pki: dict[str, Path]) -> None:
    env = tls_env(tmp_path, proxy, pki)
    env["TEMPORAL_TLS_SERVER_NAME"] = "other.test"
    code, out, err = await cli("list", env=env)
    assert code == 4, (out, err)
    assert err.strip().endswith("the server's TLS certificate does not name this host: set "
                                "TEMPORAL_TLS_SERVER_NAME to a name it holds"), err
