"""Payload encryption: with codec keys set, Temporal holds no prompt, tool argument or
tool output in clear; keys rotate; a missing or unknown key is a clear, recoverable
workflow task failure; `boundloop codec-server` decodes for the UI and the CLI."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

import boundloop
from boundloop.client import result_of
from boundloop.codec import ENCODING, KEY_ID, CodecKeyError, new_key_line, parse_keys
from boundloop.devserver import port_open, temporal_binary
from boundloop.scripted.server import ScriptedModelServer
from boundloop.settings import Settings
from boundloop.testing import free_port, wait_until
from boundloop.worker.main import build_worker, connect
from tests.scripts import answer, call, resp

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "boundloop.cli"]
QUESTION = "Which receipts need a scanned copy? (ref QMARK-5521)"
ARGUMENT = "receipts scanned"
OUTPUT = "Expense claims"  # the title of the document the tool returns
ANSWER = "Receipts over 10,000 JPY need a scanned copy (AMARK-88)."
MARKERS = [QUESTION, "QMARK-5521", ARGUMENT, OUTPUT, "AMARK-88"]
#: A codec server's token, as `openssl rand -hex 32` makes one (32+ URL-safe characters).
TOKEN = "3f9c1d7a5e2b8046c1d9e7f3a2b5c8d0"


def script() -> list[dict[str, Any]]:
    return [resp(call("search_docs", {"query": ARGUMENT, "limit": 1}, "c1")),
            answer(ANSWER, rid="resp_2")]


def settings_for(temporal: Client, tmp_path: Path, model: ScriptedModelServer, queue: str,
                 **extra: Any) -> Settings:
    return Settings(TEMPORAL_ADDRESS=temporal.service_client.config.target_host,
                    OPENAI_BASE_URL=model.base_url, OPENAI_API_KEY="sk-test-not-real",
                    BOUNDLOOP_TASK_QUEUE=queue, BOUNDLOOP_DATA_DIR=tmp_path / "data",
                    **extra)


@pytest.fixture
def model() -> Iterator[ScriptedModelServer]:
    server = ScriptedModelServer(script() * 4)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def keyfile(tmp_path: Path, *ids: str, name: str = "keys") -> Path:
    path = tmp_path / name
    path.write_text("# boundloop codec keys, oldest first\n"
                    + "".join(new_key_line(i) + "\n" for i in ids), encoding="utf-8")
    path.chmod(0o600)
    return path


async def ask(settings: Settings) -> tuple[WorkflowHandle[Any, Any], Any]:
    client = await connect(settings)
    async with build_worker(client, settings):
        run = await boundloop.start(client, QUESTION, tools=["search_docs"],
                                    model="scripted-model", task_queue=settings.task_queue)
        result = await asyncio.wait_for(run.result(), timeout=60)
    return run.handle, result


def show(address: str, workflow_id: str, *extra: str) -> tuple[str, list[bytes]]:
    """`temporal workflow show` as text, and every payload's data in its JSON output."""
    base = [temporal_binary(), "workflow", "show", "--address", address,
            "--workflow-id", workflow_id, *extra]
    text = subprocess.run(base, capture_output=True, text=True, timeout=60, check=True).stdout
    raw = subprocess.run([*base, "--output", "json"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    datas: list[bytes] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("data"), str) and "metadata" in node:
                datas.append(base64.b64decode(node["data"]))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(raw))
    return text + raw, datas


def in_clear(text: str, datas: list[bytes]) -> list[str]:
    blob = text.encode() + b"\n".join(datas)
    return [m for m in MARKERS if m.encode() in blob
            or json.dumps(m, ensure_ascii=True)[1:-1].encode() in blob]


async def test_encrypted_history_holds_no_prompt_argument_or_output_in_clear(
        temporal: Client, tmp_path: Path, model: ScriptedModelServer) -> None:
    address = temporal.service_client.config.target_host
    # Control: without keys the same run shows every marker (so the check below can fail).
    plain, plain_result = await ask(settings_for(temporal, tmp_path, model,
                                                 f"plain-{uuid.uuid4().hex[:6]}"))
    assert plain_result.reason == "completed"
    assert sorted(in_clear(*show(address, plain.id))) == sorted(MARKERS)

    keys = keyfile(tmp_path, "k1")
    enc, result = await ask(settings_for(temporal, tmp_path, model,
                                         f"enc-{uuid.uuid4().hex[:6]}",
                                         BOUNDLOOP_CODEC_KEYS=keys))
    assert result.reason == "completed" and result.text == ANSWER
    text, datas = show(address, enc.id)
    assert in_clear(text, datas) == []
    assert "binary/encrypted" in text
    # Through the codec server, `temporal workflow show` reads it all again.
    with codec_server(tmp_path, keys, token=TOKEN) as url:
        assert sorted(in_clear(*show(address, enc.id, "--codec-endpoint", url,
                                     "--codec-auth", f"Bearer {TOKEN}"))) == sorted(MARKERS)


async def test_key_rotation_new_payloads_use_the_newest_key_old_ones_still_decrypt(
        temporal: Client, tmp_path: Path, model: ScriptedModelServer) -> None:
    first = keyfile(tmp_path, "2026-11")
    queue = f"rot-{uuid.uuid4().hex[:6]}"
    old, _ = await ask(settings_for(temporal, tmp_path, model, queue,
                                    BOUNDLOOP_CODEC_KEYS=first))
    # Rotate: append a key; the file's last key encrypts from now on.
    rotated = tmp_path / "keys"
    rotated.write_text(first.read_text(encoding="utf-8") + new_key_line("2026-12") + "\n",
                       encoding="utf-8")
    settings = settings_for(temporal, tmp_path, model, queue, BOUNDLOOP_CODEC_KEYS=rotated)
    new, result = await ask(settings)
    assert result.reason == "completed"

    async def key_ids(handle: WorkflowHandle[Any, Any]) -> set[bytes]:
        started = (await temporal.get_workflow_handle(handle.id).fetch_history()).events[0]
        payloads = started.workflow_execution_started_event_attributes.input.payloads
        assert all(p.metadata["encoding"] == ENCODING for p in payloads)
        return {p.metadata[KEY_ID] for p in payloads}

    assert await key_ids(old) == {b"2026-11"}
    assert await key_ids(new) == {b"2026-12"}
    client = await connect(settings)
    old_result = await result_of(client.get_workflow_handle(old.id))
    assert old_result.text == ANSWER


async def workflow_task_failure_messages(temporal: Client, workflow_id: str) -> list[str]:
    return [e.workflow_task_failed_event_attributes.failure.message
            async for e in temporal.get_workflow_handle(workflow_id).fetch_history_events()
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED]


async def test_a_missing_or_unknown_key_fails_the_workflow_task_clearly_and_loses_nothing(
        temporal: Client, tmp_path: Path, model: ScriptedModelServer,
        caplog: pytest.LogCaptureFixture) -> None:
    queue = f"key-{uuid.uuid4().hex[:6]}"
    keys = keyfile(tmp_path, "k1")
    starter = await connect(settings_for(temporal, tmp_path, model, queue,
                                         BOUNDLOOP_CODEC_KEYS=keys))
    run = await boundloop.start(starter, QUESTION, tools=["search_docs"],
                                model="scripted-model", task_queue=queue)

    async def failed_with(text: str) -> bool:
        return any(text in m for m in await workflow_task_failure_messages(temporal, run.id))

    # A worker with no keys at all.
    plain = settings_for(temporal, tmp_path, model, queue)
    async with build_worker(await connect(plain), plain):
        await wait_until(lambda: failed_with("this process has no codec keys"), timeout=60)
    # A worker whose key file lacks k1 (only a newer key). Temporal records only the
    # first failure of a retried workflow task in history; later ones are in the
    # worker's log (and the Web UI's pending workflow task).
    other = settings_for(temporal, tmp_path, model, queue,
                         BOUNDLOOP_CODEC_KEYS=keyfile(tmp_path, "k2", name="other"))
    unknown = "encrypted with key id 'k1', which this process does not have (it has k2)"
    async with build_worker(await connect(other), other):
        async def logged() -> bool:
            return unknown in caplog.text

        await wait_until(logged, timeout=60)
    messages = await workflow_task_failure_messages(temporal, run.id)
    assert messages and all("Traceback" not in m for m in messages)
    # The fix the message names: give the worker k1. The run continues where it was.
    fixed = settings_for(temporal, tmp_path, model, queue, BOUNDLOOP_CODEC_KEYS=keys)
    async with build_worker(await connect(fixed), fixed):
        result = await asyncio.wait_for(run.result(), timeout=90)
    assert result.reason == "completed" and result.text == ANSWER


async def test_cli_and_worker_refuse_unusable_keys_in_one_line(
        temporal: Client, tmp_path: Path, model: ScriptedModelServer) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OPENAI_", "TEMPORAL_", "BOUNDLOOP_"))}
    env.update(TEMPORAL_ADDRESS=temporal.service_client.config.target_host,
               BOUNDLOOP_DATA_DIR=str(tmp_path / "data"))
    bad = tmp_path / "bad-keys"
    bad.write_text("k1:c2hvcnQ=\n", encoding="utf-8")  # 5 bytes, not 32
    bad.chmod(0o600)
    for command in (["worker", "--model-script", "examples/scripts/stock_two_skus.json"],
                    ["list"]):
        done = subprocess.run([*CLI, *command], cwd=ROOT, capture_output=True, text=True,
                              env={**env, "BOUNDLOOP_CODEC_KEYS": str(bad)}, timeout=60,
                              check=False)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert done.stderr.strip().splitlines()[-1] == (
            f"error: {bad} line 1: key 'k1' is 5 bytes; AES-256 needs 32"), done.stderr
    # A key file others may read (mode 0644) is refused everywhere keys are read.
    shared = keyfile(tmp_path, "k1", name="shared-keys")
    shared.chmod(0o644)
    for command in (["worker", "--model-script", "examples/scripts/stock_two_skus.json"],
                    ["list"], ["codec-server"]):
        done = subprocess.run([*CLI, *command], cwd=ROOT, capture_output=True, text=True,
                              env={**env, "BOUNDLOOP_CODEC_KEYS": str(shared)}, timeout=60,
                              check=False)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert done.stderr.strip().splitlines()[-1] == (
            f"error: BOUNDLOOP_CODEC_KEYS: {shared} is readable by others (mode 0644): "
            f"`chmod 600 {shared}` and make it the reading user's own"), done.stderr
    # The CLI reading an encrypted run without the key: one line, exit 2.
    keys = keyfile(tmp_path, "k1")
    handle, _ = await ask(settings_for(temporal, tmp_path, model,
                                       f"cli-{uuid.uuid4().hex[:6]}",
                                       BOUNDLOOP_CODEC_KEYS=keys))
    done = subprocess.run([*CLI, "status", handle.id], cwd=ROOT, capture_output=True,
                          text=True, env=env, timeout=60, check=False)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "this process has no codec keys: set BOUNDLOOP_CODEC_KEYS" in done.stderr
    assert "Traceback" not in done.stderr
    done = subprocess.run([*CLI, "status", handle.id], cwd=ROOT, capture_output=True,
                          text=True, env={**env, "BOUNDLOOP_CODEC_KEYS": str(keys)},
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "completed" in done.stdout


def test_key_lines_are_checked_without_echoing_a_key() -> None:
    line = new_key_line("2026-12")
    key_id, _, key = line.partition(":")
    assert parse_keys(line, source="x") == {key_id: base64.b64decode(key)}
    with pytest.raises(CodecKeyError, match="appears twice"):
        parse_keys(f"{line}\n{line}", source="x")
    with pytest.raises(CodecKeyError, match="not valid base64") as exc:
        parse_keys("k1:not*base64", source="x")
    assert "not*base64" not in str(exc.value)
    with pytest.raises(CodecKeyError, match="holds no key"):
        parse_keys("# nothing\n", source="x")


# --- the codec server --------------------------------------------------------------------


def codec_server(tmp_path: Path, keys: Path, *, token: str | None = TOKEN,
                 origin: str = "http://127.0.0.1:8233", args: tuple[str, ...] = (),
                 env_hosts: str | None = None) -> Any:
    """A real `boundloop codec-server` process on a free port, as a context manager."""

    @contextlib.contextmanager
    def running() -> Iterator[str]:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("BOUNDLOOP_")}
        env.update(BOUNDLOOP_CODEC_KEYS=str(keys), BOUNDLOOP_CODEC_CORS_ORIGINS=origin)
        if token:
            env["BOUNDLOOP_CODEC_TOKEN"] = token
        if env_hosts:
            env["BOUNDLOOP_CODEC_HOSTS"] = env_hosts
        log = (tmp_path / f"codec-{port}.log").open("ab")
        proc = subprocess.Popen([*CLI, "codec-server", "--port", str(port), *args], cwd=ROOT,
                                env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        try:
            for _ in range(400):  # up to 20 s for the process to listen
                if port_open("127.0.0.1", port) or proc.poll() is not None:
                    break
                time.sleep(0.05)
            assert port_open("127.0.0.1", port), (tmp_path / f"codec-{port}.log").read_text()
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            log.close()

    return running()


def start_refused(keys: Path, *args: str, **env_extra: str) -> str:
    """`boundloop codec-server ARGS` refused at start (exit 2, nothing listening): its
    one error line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOUNDLOOP_")}
    port = free_port()
    done = subprocess.run([*CLI, "codec-server", "--port", str(port), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False,
                          env={**env, "BOUNDLOOP_CODEC_KEYS": str(keys), **env_extra})
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert not port_open("127.0.0.1", port)
    return " ".join(done.stderr.split())


def test_the_codec_server_encodes_for_nobody_without_its_token(tmp_path: Path) -> None:
    """A run starter without the keys could have its run's input encrypted through
    /encode (and so pass `require_encryption`): the server needs its token on every
    request, on loopback too, and does not start without one."""
    keys = keyfile(tmp_path, "k1")
    question = {"payloads": [plain_payload({"question": "started without keys"})]}
    for args in ((), ("--host", "0.0.0.0")):
        assert start_refused(keys, *args) == (
            "error: BOUNDLOOP_CODEC_TOKEN is not set: whoever can use the codec server can "
            "encrypt and decrypt with its keys, so every request needs the token (`openssl "
            "rand -hex 32` makes one; the Web UI's codec endpoint is then "
            "http://HOST:PORT/TOKEN). For development on this machine only, --dev-no-token "
            "serves without one on 127.0.0.1")
    assert start_refused(keys, BOUNDLOOP_CODEC_TOKEN="t0ken").startswith(
        "error: BOUNDLOOP_CODEC_TOKEN must be at least 32 characters")
    assert start_refused(keys, "--host", "0.0.0.0", "--allow-no-token").startswith(
        "error: --allow-no-token is gone")
    assert start_refused(keys, "--host", "0.0.0.0", "--dev-no-token") == (
        "error: --dev-no-token serves on loopback only, not on 0.0.0.0: set "
        "BOUNDLOOP_CODEC_TOKEN to listen there")
    with codec_server(tmp_path, keys) as url:
        for path, headers in (("/encode", {}), ("/decode", {}),
                              ("/encode", {"Authorization": "Bearer guess"}),
                              ("/guess/encode", {}), (f"/{TOKEN}x/encode", {})):
            status, body, _ = post(f"{url}{path}", question, **headers)
            assert status == 401 and "payloads" not in body, (path, body)
        # The token as the CLI sends it, and as the Web UI does (the endpoint's path).
        status, sealed, _ = post(f"{url}/encode", question, Authorization=f"Bearer {TOKEN}")
        assert status == 200
        assert base64.b64decode(sealed["payloads"][0]["metadata"]["encoding"]) == ENCODING
        assert post(f"{url}/{TOKEN}/decode", sealed)[:2] == (200, question)
    # Development on this machine, said so: no token, on loopback only.
    with codec_server(tmp_path, keys, token=None, args=("--dev-no-token",)) as url:
        assert post(f"{url}/encode", question)[0] == 200


def test_the_codec_server_answers_only_its_own_host_names(tmp_path: Path) -> None:
    """DNS rebinding: a page at evil.example whose name now resolves to this machine
    sends `Host: evil.example:PORT`, the token notwithstanding (a browser's page for a
    dev server without one): refused before anything else."""
    keys = keyfile(tmp_path, "k1")
    question = {"payloads": [plain_payload({"question": "rebound"})]}
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for token, args in ((TOKEN, ()), (None, ("--dev-no-token",))):
        with codec_server(tmp_path, keys, token=token, args=args) as url:
            port = url.rsplit(":", 1)[1]
            for host in (f"evil.example:{port}", f"127.0.0.1.evil.example:{port}",
                         "127.0.0.1:1"):
                status, body, _ = post(f"{url}/encode", question, Host=host, **auth)
                assert status == 421 and "payloads" not in body, (host, body)
                assert "BOUNDLOOP_CODEC_HOSTS" in body["error"]
            for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
                assert post(f"{url}/encode", question, Host=host, **auth)[0] == 200, host
    # The names it answers are the operator's to set (a proxy's name, say).
    with codec_server(tmp_path, keys, env_hosts="codec.example.com") as url:
        assert post(f"{url}/encode", question, Host="codec.example.com", **auth)[0] == 200
        port = url.rsplit(":", 1)[1]
        assert post(f"{url}/encode", question, Host=f"127.0.0.1:{port}", **auth)[0] == 421


def test_compose_codec_healthcheck_asks_a_real_codec_server(tmp_path: Path) -> None:
    """docker-compose.yml's codec-server healthcheck, run as written against a real
    server (its port swapped for a free one): healthy while it serves, failing once not."""
    import yaml

    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    test = compose["services"]["codec-server"]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"]

    def check(url: str) -> int:
        code = test[3].replace("http://127.0.0.1:8081", url)
        assert code != test[3]
        return subprocess.run([sys.executable, "-c", code], capture_output=True,
                              timeout=30, check=False).returncode

    with codec_server(tmp_path, keyfile(tmp_path, "k1")) as url:
        assert check(url) == 0
    assert check(url) != 0


def post(url: str, body: Any, **headers: str) -> tuple[int, Any, dict[str, str]]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), dict(exc.headers)


@pytest_asyncio.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    keys = keyfile(tmp_path, "k1")
    with codec_server(tmp_path, keys) as url:
        yield url, keys


def plain_payload(value: Any) -> dict[str, Any]:
    return {"metadata": {"encoding": base64.b64encode(b"json/plain").decode()},
            "data": base64.b64encode(json.dumps(value).encode()).decode()}


async def test_codec_server_encodes_decodes_and_requires_its_token(
        served: tuple[str, Path]) -> None:
    url, _ = served
    auth = {"Authorization": f"Bearer {TOKEN}"}
    original = {"payloads": [plain_payload({"question": QUESTION})]}
    status, encoded, _ = await asyncio.to_thread(post, f"{url}/encode", original, **auth)
    assert status == 200
    sealed = encoded["payloads"][0]
    assert base64.b64decode(sealed["metadata"]["encoding"]) == ENCODING
    assert QUESTION.encode() not in base64.b64decode(sealed["data"])
    status, decoded, _ = await asyncio.to_thread(post, f"{url}/decode", encoded, **auth)
    assert (status, decoded) == (200, original)
    # No token, or another one: refused, nothing decoded.
    for headers in ({}, {"Authorization": "Bearer guess"}):
        status, body, _ = await asyncio.to_thread(post, f"{url}/decode", encoded, **headers)
        assert status == 401 and "payloads" not in body
    # A payload under a key this server lacks: 422 and the reason.
    sealed["metadata"][KEY_ID] = base64.b64encode(b"k9").decode()
    status, body, _ = await asyncio.to_thread(post, f"{url}/decode", encoded, **auth)
    assert status == 422 and "key id 'k9'" in body["error"]


async def test_codec_server_answers_the_web_ui_origin_preflight(
        served: tuple[str, Path]) -> None:
    url, _ = served

    def preflight(origin: str) -> dict[str, str]:
        request = urllib.request.Request(f"{url}/decode", method="OPTIONS", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type,x-namespace,authorization"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return {k.lower(): v for k, v in response.headers.items()}
        except urllib.error.HTTPError as exc:
            return {k.lower(): v for k, v in exc.headers.items()}

    allowed = await asyncio.to_thread(preflight, "http://127.0.0.1:8233")
    assert allowed["access-control-allow-origin"] == "http://127.0.0.1:8233"
    assert "x-namespace" in allowed["access-control-allow-headers"].lower()
    other = await asyncio.to_thread(preflight, "http://evil.example")
    assert "access-control-allow-origin" not in other


def test_keys_from_the_environment_and_conflicting_settings() -> None:
    from boundloop.connection import ConnectionSettingsError, codec, tls_config

    a, b = new_key_line("a"), new_key_line("b")
    found = codec(Settings(BOUNDLOOP_CODEC_KEY=f"{a},{b}"))
    assert found is not None and (found.key_ids, found.current) == (["a", "b"], "b")
    assert codec(Settings()) is None
    with pytest.raises(ConnectionSettingsError, match="not both"):
        codec(Settings(BOUNDLOOP_CODEC_KEY=a, BOUNDLOOP_CODEC_KEYS="/nonexistent"))
    with pytest.raises(ConnectionSettingsError, match="TEMPORAL_TLS=0"):
        tls_config(Settings(TEMPORAL_TLS="0", TEMPORAL_TLS_SERVER_NAME="x"))
    assert tls_config(Settings(TEMPORAL_TLS="1")) is True
    assert tls_config(Settings()) is None  # the SDK: TLS on only with an API key


def test_key_errors_name_the_variable_the_keys_came_from() -> None:
    """Keys from BOUNDLOOP_CODEC_KEY: errors name that variable, never "the key file"."""
    from boundloop.codec import EncryptionCodec
    from boundloop.connection import codec as settings_codec

    line = new_key_line("k1")
    other = EncryptionCodec(parse_keys(new_key_line("k1"), source="test"))
    sealed = asyncio.run(other.encode([boundloop_payload()]))[0]
    mine = settings_codec(Settings(BOUNDLOOP_CODEC_KEY=line))
    assert mine is not None
    with pytest.raises(CodecKeyError) as caught:
        mine.decrypt(sealed)
    assert "BOUNDLOOP_CODEC_KEY holds another key" in str(caught.value)
    assert "key file" not in str(caught.value)
    unknown = EncryptionCodec(parse_keys(new_key_line("k2"), source="test"))
    without = settings_codec(Settings(BOUNDLOOP_CODEC_KEY=new_key_line("k9")))
    assert without is not None
    with pytest.raises(CodecKeyError) as caught:
        without.decrypt(asyncio.run(unknown.encode([boundloop_payload()]))[0])
    assert "add that key to BOUNDLOOP_CODEC_KEY and restart" in str(caught.value)


def boundloop_payload() -> Any:
    from temporalio.api.common.v1 import Payload

    return Payload(metadata={"encoding": b"json/plain"}, data=b'"hello"')
