""""Payloads must be encrypted" in the operator's policy: a real `boundloop worker` with
codec keys and `require_encryption = true` refuses a run started by a CLI without the keys
(its question reached Temporal in clear) before any model request, with a line saying
what to configure; the same CLI with the keys runs. A worker told to require encryption
without keys of its own does not start."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from temporalio.client import Client

import boundloop
from boundloop import OperatorPolicy, PolicyRefused, Worker
from boundloop.client import result_of
from boundloop.codec import EncryptionCodec, new_key_line, parse_keys
from boundloop.errors import BoundloopError
from boundloop.scripted.server import ScriptedModelServer
from boundloop.tools.demo import DemoDeps
from tests.conftest import RUN_TIMEOUT
from tests.scripts import answer
from tests.support.tools import tools as test_tools
from tests.test_cli import cli, env_for
from tests.test_codec import keyfile
from tests.test_worker_process import BOUNDLOOP, log_has, process, worker_env

POLICY = "require_encryption = true\n"
#: What `boundloop run --wait` prints when its question reached Temporal in clear.
REFUSED = ("refused: payloads: the run asked its input in clear (started by a client "
           "without codec keys); the operator's policy: encrypted payloads only: start "
           "runs with the workers' codec keys (BOUNDLOOP_CODEC_KEYS or BOUNDLOOP_CODEC_KEY)")


@pytest.fixture
def model() -> Iterator[ScriptedModelServer]:
    server = ScriptedModelServer([answer("在庫は十分です。")])
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def test_a_run_started_in_clear_is_refused_and_one_with_the_keys_runs(
        temporal: Client, model: ScriptedModelServer, tmp_path: Path) -> None:
    keys = keyfile(tmp_path, "k1")
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY, encoding="utf-8")
    queue = f"q-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "worker.log"
    env = worker_env(tmp_path, TEMPORAL_ADDRESS=temporal.service_client.config.target_host,
                     BOUNDLOOP_TASK_QUEUE=queue, OPENAI_BASE_URL=model.base_url,
                     OPENAI_API_KEY="sk-test-not-real", BOUNDLOOP_POLICY=str(policy),
                     BOUNDLOOP_CODEC_KEYS=str(keys))
    keyless = {**env_for(temporal, tmp_path), "BOUNDLOOP_TASK_QUEUE": queue}
    with process([BOUNDLOOP, "worker"], env, log):
        await log_has(log, "worker started")
        code, _out, err = await cli("run", "在庫は?", "--tools", "lookup_stock", "--wait",
                                    env=keyless)
        assert model.requests == []
        ran = await cli("run", "在庫は?", "--tools", "lookup_stock", "--wait",
                        env={**keyless, "BOUNDLOOP_CODEC_KEYS": str(keys)})
    assert code == 2, err
    assert REFUSED in " ".join(err.split()), err
    assert ran[0] == 0, ran
    assert "在庫は十分です。" in ran[1]
    assert len(model.requests) == 1


async def test_a_worker_requiring_encryption_without_keys_does_not_start(
        tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY, encoding="utf-8")
    env = worker_env(tmp_path, BOUNDLOOP_POLICY=str(policy), TEMPORAL_ADDRESS="127.0.0.1:1")
    code, _out, err = await cli("worker", env=env)
    assert code == 2, err
    assert err.splitlines()[-1] == (
        "error: BOUNDLOOP_POLICY: the operator's policy requires encrypted payloads "
        "(require_encryption) but this worker has no codec keys: set BOUNDLOOP_CODEC_KEYS "
        "or BOUNDLOOP_CODEC_KEY (or connect with codec=…)"), err


async def test_a_session_message_sent_in_clear_refuses_its_turn(
        temporal: Client, tmp_path: Path) -> None:
    """`Worker(policy=…)` with codec keys: a session started with the keys and told a
    message by a client without them refuses that turn before any model request (the
    session's accepted messages are read as stored); a session talked to with the keys
    runs its turn."""
    model = ScriptedModelServer([answer("在庫は十分です。")])
    model.start()
    address = temporal.service_client.config.target_host
    keyed = await boundloop.connect(address, codec=EncryptionCodec(parse_keys(
        new_key_line("k1"), source="test")))
    keyless = await boundloop.connect(address)
    queue = f"s-{uuid.uuid4().hex[:8]}"
    policy = OperatorPolicy(require_encryption=True)
    llm = openai.AsyncOpenAI(base_url=model.base_url, api_key="sk-test-not-real")
    try:
        async with Worker(keyed, test_tools, deps=DemoDeps(data_dir=tmp_path), model=llm,
                          task_queue=queue, policy=policy):
            told = await boundloop.start_session(keyed, tools=["lookup_stock"],
                                                 model="scripted-model", task_queue=queue)
            with pytest.raises(BoundloopError, match="refused: the operator's policy refuses "
                               "this run: payloads: the run asked its input in clear"):
                await asyncio.wait_for((await boundloop.get_session(
                    keyless, told.id)).say("在庫は?"), RUN_TIMEOUT)
            with pytest.raises(PolicyRefused) as refused:
                await result_of(keyed.get_workflow_handle(f"{told.id}/turn-1"))
            assert model.requests == []
            fresh = await boundloop.start_session(keyed, tools=["lookup_stock"],
                                                  model="scripted-model", task_queue=queue)
            ran = await asyncio.wait_for(fresh.say("在庫は?"), RUN_TIMEOUT)
    finally:
        model.stop()
    assert [r["field"] for r in refused.value.refusals] == ["payloads"]
    assert (ran.reason, ran.text) == ("completed", "在庫は十分です。")


async def test_worker_with_the_policy_and_no_codec_is_refused(temporal: Client,
                                                              tmp_path: Path) -> None:
    llm = openai.AsyncOpenAI(base_url="http://127.0.0.1:1/v1", api_key="sk-test-not-real")
    with pytest.raises(BoundloopError, match="no codec keys"):
        async with Worker(temporal, test_tools, deps=DemoDeps(data_dir=tmp_path), model=llm,
                          task_queue=f"q-{uuid.uuid4().hex[:8]}",
                          policy=OperatorPolicy(require_encryption=True)):
            pass
