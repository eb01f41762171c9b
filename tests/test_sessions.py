"""Multi-turn sessions on the real dev server, through the scripted model: each turn is
one bounded run of the loop, continuing the conversation the turns before it built."""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

import boundloop
import boundloop.testing
from boundloop.client import result_of
from boundloop.contracts import StreamItem, StreamResult, TextDelta
from boundloop.core.limits import Limits
from boundloop.core.reasons import StopReason
from boundloop.core.session import SessionLimits
from boundloop.scripted.server import ScriptedModelServer
from tests.conftest import DEMO_TOOLS, RUN_TIMEOUT, workflow_task_failures
from tests.conftest import test_worker as make_worker
from tests.scripts import call, message, resp
from tests.support.crash_tools import tools as replay_tools

#: Bound on one session test's waits.
WAIT = RUN_TIMEOUT
_answers = iter(range(1, 1_000_000))


def answer(text: str, item_id: str | None = None) -> dict[str, Any]:
    """A final answer with an item id of its own (a provider never repeats one, and the
    scripted server refuses a conversation that holds one twice)."""
    item = {**message(text), "id": item_id or f"msg_{next(_answers)}"}
    return resp(item, rid=f"resp_{text}")


@dataclass
class Env:
    client: Client
    server: ScriptedModelServer
    queue: str
    data_dir: Path

    async def start(self, **kw: Any) -> boundloop.Session:
        return await boundloop.start_session(
            self.client, tools=kw.pop("tools", DEMO_TOOLS), model="scripted-model",
            task_queue=self.queue, **kw)

    def inputs(self) -> list[list[dict[str, Any]]]:
        return [r.body["input"] for r in self.server.requests]


@asynccontextmanager
async def session_env(client: Client, tmp_path: Path, script: list[dict[str, Any]],
                      cache: int = 512) -> AsyncIterator[Env]:
    server = ScriptedModelServer(script)
    base_url = server.start()
    queue = f"s-{uuid.uuid4().hex[:8]}"
    try:
        async with make_worker(client, queue, base_url, tmp_path / "data", cache=cache):
            yield Env(client, server, queue, tmp_path / "data")
    finally:
        server.stop()
    assert server.violations == [], server.violations


async def say(session: boundloop.Session, message: str) -> boundloop.RunResult:
    return await asyncio.wait_for(session.say(message), timeout=WAIT)


def outputs_of(items: list[dict[str, Any]]) -> dict[str, str]:
    return {i["call_id"]: i["output"] for i in items if i.get("type") == "function_call_output"}


def user_messages(items: list[dict[str, Any]]) -> list[str]:
    return [i["content"] for i in items if i.get("role") == "user"]


def three_turns() -> list[dict[str, Any]]:
    return [
        resp(call("lookup_stock", {"sku": "A-001"}, "c1"), rid="r1"),
        answer("A-001 is in stock"),
        resp(call("search_docs", {"query": "返品", "limit": 1}, "c2"), rid="r2"),
        answer("returns take 14 days"),
        answer("A-001 in stock; returns take 14 days"),
    ]


async def test_three_turns_keep_earlier_tool_results_in_the_conversation(
        temporal: Client, tmp_path: Path) -> None:
    async with session_env(temporal, tmp_path, three_turns()) as env:
        session = await env.start()
        first = await say(session, "A-001 の在庫は?")
        second = await say(session, "返品の方法は?")
        third = await say(session, "まとめて")
        shown = await session.show()
    assert [r.reason for r in (first, second, third)] == [StopReason.COMPLETED] * 3
    assert third.text == "A-001 in stock; returns take 14 days"
    inputs = env.inputs()
    # What each tool returned, as the model saw it right after the call ...
    stock = outputs_of(inputs[1])["c1"]
    docs = outputs_of(inputs[3])["c2"]
    assert json.loads(stock)["data"]["sku"] == "A-001"
    # ... is still in the conversation of the last turn, with every message in order.
    last = inputs[4]
    assert outputs_of(last) == {"c1": stock, "c2": docs}
    assert user_messages(last) == ["A-001 の在庫は?", "返品の方法は?", "まとめて"]
    texts = [c["text"] for i in last if i.get("type") == "message" and i.get("role")
             == "assistant" for c in i["content"]]
    assert texts == ["A-001 is in stock", "returns take 14 days"]
    # Each request of a later turn starts with the whole earlier conversation.
    for before, after in itertools.pairwise(inputs):
        assert after[:len(before)] == before
    assert shown.turns == 3 and shown.status == "idle"
    assert shown.steps == first.steps + second.steps + third.steps
    assert shown.total_tokens == first.total_tokens + second.total_tokens + third.total_tokens
    assert shown.last is not None and shown.last.workflow_id == f"{session.id}/turn-3"


async def test_idempotency_keys_differ_per_turn(temporal: Client, tmp_path: Path) -> None:
    script = [resp(call("lookup_stock", {"sku": "A-001"}, "c1")), answer("one"),
              resp(call("lookup_stock", {"sku": "A-001"}, "c1b")), answer("two")]
    async with session_env(temporal, tmp_path, script) as env:
        session = await env.start()
        first = await say(session, "one")
        second = await say(session, "again")
    keys = [r.headers["idempotency-key"] for r in env.server.requests]
    assert len(set(keys)) == len(keys) == 4
    assert keys[0].startswith(f"{session.id}/turn-1/") and keys[2].startswith(
        f"{session.id}/turn-2/")
    assert first.workflow_id != second.workflow_id


def create(call_id: str, title: str) -> dict[str, Any]:
    return call("create_ticket", {"title": title, "description": "d", "priority": "low"},
                call_id)


async def test_a_turn_that_hits_a_limit_ends_with_its_reason_and_the_next_turn_works(
        temporal: Client, tmp_path: Path) -> None:
    # Turn 1 asks for two tools in one response with room for one (max_tools): neither
    # runs. Turn 2 must still send a valid conversation (one output per call).
    script = [resp(call("lookup_stock", {"sku": "A-001"}, "c1"),
                   call("lookup_stock", {"sku": "B-002"}, "c2")),
              answer("fine now")]
    async with session_env(temporal, tmp_path, script) as env:
        session = await env.start(limits=Limits(max_tool_executions=1))
        first = await say(session, "two skus")
        second = await say(session, "just answer")
    assert first.reason == StopReason.MAX_TOOLS and first.tool_executions == 0
    assert second.reason == StopReason.COMPLETED and second.text == "fine now"
    outputs = outputs_of(env.inputs()[1])
    assert set(outputs) == {"c1", "c2"}
    for text in outputs.values():
        envelope = json.loads(text)
        assert envelope["error_code"] == "NOT_RUN" and "max_tools" in envelope["message"]


async def test_a_call_that_ran_before_its_turn_stopped_keeps_its_real_output(
        temporal: Client, tmp_path: Path) -> None:
    # One response, two calls: the first runs, the second waits for an approval that
    # times out (approval_timeout). The next turn tells the model what really happened.
    script = [resp(call("lookup_stock", {"sku": "A-001"}, "c1"), create("c2", "t")),
              answer("ok")]
    async with session_env(temporal, tmp_path, script) as env:
        session = await env.start(limits=Limits(approval_timeout_seconds=1.0))
        first = await say(session, "look up and file")
        second = await say(session, "what happened?")
    assert first.reason == StopReason.APPROVAL_TIMEOUT and first.tool_executions == 1
    assert second.reason == StopReason.COMPLETED
    outputs = outputs_of(env.inputs()[1])
    assert json.loads(outputs["c1"])["status"] == "success"
    assert json.loads(outputs["c2"])["error_code"] == "NOT_RUN"


async def test_a_message_during_a_running_turn_is_refused(temporal: Client,
                                                          tmp_path: Path) -> None:
    script = [resp(create("c1", "t")), answer("filed")]
    async with session_env(temporal, tmp_path, script) as env:
        session = await env.start()
        turn = asyncio.create_task(say(session, "file a ticket"))
        run = session.turn(1)

        async def pending() -> bool:
            try:
                return bool(await run.pending())
            except Exception:
                return False
        await boundloop.testing.wait_until(pending, timeout=WAIT)
        with pytest.raises(boundloop.SessionRefused, match="still running"):
            await asyncio.wait_for(session.say("another"), timeout=WAIT)
        shown = await session.show()
        assert shown.status == "running" and shown.current_turn == run.id
        await run.approve("c1")
        result = await asyncio.wait_for(turn, timeout=WAIT)
    assert result.reason == StopReason.COMPLETED
    assert len(env.server.requests) == 2  # the refused message never reached the model


async def test_an_idle_session_ends(temporal: Client, tmp_path: Path) -> None:
    async with session_env(temporal, tmp_path, [answer("hi")]) as env:
        session = await env.start(session_limits=SessionLimits(idle_seconds=1.0))
        await say(session, "hello")
        ended = await asyncio.wait_for(session.handle.result(), timeout=WAIT)
        with pytest.raises(boundloop.RunEnded, match="has ended"):
            await asyncio.wait_for(session.say("late"), timeout=WAIT)
    assert ended.ended == "idle" and ended.turns == 1 and ended.status == "ended"


async def test_end_cancels_a_running_turn_and_ends_the_session(
        temporal: Client, tmp_path: Path) -> None:
    script = [resp(create("c1", "t")), answer("never")]
    async with session_env(temporal, tmp_path, script) as env:
        session = await env.start()
        turn = asyncio.create_task(say(session, "file a ticket"))
        run = session.turn(1)

        async def pending() -> bool:
            try:
                return bool(await run.pending())
            except Exception:
                return False
        await boundloop.testing.wait_until(pending, timeout=WAIT)
        status = await asyncio.wait_for(session.end(), timeout=WAIT)
        result = await asyncio.wait_for(turn, timeout=WAIT)
        with pytest.raises(boundloop.RunEnded, match="has ended"):
            await asyncio.wait_for(session.end(), timeout=WAIT)
        assert (await session.handle.describe()).status == WorkflowExecutionStatus.COMPLETED
        assert await workflow_task_failures(session.handle) == 0
    assert result.reason == StopReason.CANCELLED and result.cancel_reason == "session ended"
    assert status.ended == "requested" and status.turns == 1


async def test_max_turns_and_the_token_budget_end_a_session(temporal: Client,
                                                            tmp_path: Path) -> None:
    # Each scripted response uses 120 tokens; a 200-token budget leaves the second turn
    # 80 tokens as its threshold, which its first response reaches (usage_limit).
    script = [answer("one"), answer("two"), answer("unused")]
    async with session_env(temporal, tmp_path, script) as env:
        session = await env.start(session_limits=SessionLimits(token_budget=200))
        first = await say(session, "one")
        second = await say(session, "two")
        with pytest.raises(boundloop.RunEnded, match="token_budget"):
            await asyncio.wait_for(session.say("three"), timeout=WAIT)
        ended = await asyncio.wait_for(session.handle.result(), timeout=WAIT)
    assert first.reason == StopReason.COMPLETED
    assert second.reason == StopReason.USAGE_LIMIT and second.text == "two"
    assert ended.ended == "token_budget" and ended.tokens_left == 0
    async with session_env(temporal, tmp_path, [answer("only")]) as env:
        session = await env.start(session_limits=SessionLimits(max_turns=1))
        await say(session, "one")
        ended = await asyncio.wait_for(session.handle.result(), timeout=WAIT)
    assert ended.ended == "max_turns"


async def test_turn_results_are_the_turns_own_run_results(temporal: Client,
                                                          tmp_path: Path) -> None:
    script = [resp(call("lookup_stock", {"sku": "A-001"}, "c1")), answer("done")]
    async with session_env(temporal, tmp_path, script) as env:
        session = await env.start()
        said = await say(session, "stock?")
        read = await asyncio.wait_for(result_of(session.turn(1).handle), timeout=WAIT)
    assert said == read


def http_error(status: int) -> dict[str, Any]:
    return {"status": status, "body": {"error": {"message": "scripted", "type": "server_error"}}}


async def test_a_turn_whose_model_request_failed_is_continued_from_history(
        temporal: Client, tmp_path: Path) -> None:
    # No conversation cache: every request is rebuilt from history. Turn 1's second
    # request is refused (model_error); its items were never sent and must not appear
    # twice in turn 2's conversation.
    script = [resp(call("lookup_stock", {"sku": "A-001"}, "c1")), http_error(400),
              answer("second turn")]
    async with session_env(temporal, tmp_path, script, cache=0) as env:
        session = await env.start()
        first = await say(session, "stock?")
        second = await say(session, "again")
    assert first.reason == StopReason.MODEL_ERROR
    assert second.reason == StopReason.COMPLETED, second.events
    last = env.inputs()[2]
    assert user_messages(last) == ["stock?", "again"]
    assert list(outputs_of(last)) == ["c1"]


async def test_a_retried_model_request_is_rebuilt_once_from_history(run_script: Any) -> None:
    # The workflow schedules a failed request again (counted retries); a later step
    # rebuilt from history must read that request's items once.
    out = await run_script([http_error(500), resp(call("lookup_stock", {"sku": "A-001"}, "c1")),
                            answer("done")], cache=0)
    assert out.result.reason == StopReason.COMPLETED, out.result.events


async def test_a_session_history_replays_without_nondeterminism(
        temporal: Client, tmp_path: Path) -> None:
    # Two turns and an end: replayed with the plugin (the toolset test_replay.py replays
    # with: a process holds one toolset per task queue), as a worker
    # that picks the session up after a restart (or a deploy) would.
    script = [resp(call("lookup_stock", {"sku": "A-001"}, "c1")), answer("one"),
              answer("two")]
    async with session_env(temporal, tmp_path, script) as env:
        session = await env.start()
        await say(session, "one")
        await say(session, "two")
        await asyncio.wait_for(session.end(), timeout=WAIT)
    replayer = Replayer(workflows=[], data_converter=pydantic_data_converter,
                        plugins=[boundloop.Plugin(replay_tools, deps=None)])
    for handle in (session.handle, session.turn(2).handle):
        history = await handle.fetch_history()
        result = await replayer.replay_workflow(history)
        assert result.replay_failure is None


async def test_a_session_stream_follows_each_turn(temporal: Client, tmp_path: Path) -> None:
    """`session.stream()` reads each turn's stream in turn order, until the session ends:
    every turn's text as written and its RunResult."""
    async with session_env(temporal, tmp_path, [answer("first answer"),
                                                answer("second answer")]) as env:
        session = await env.start()
        seen: list[tuple[int, StreamItem]] = []

        async def read() -> None:
            async for pair in session.stream():
                seen.append(pair)
        reader = asyncio.create_task(read())
        results = [await say(session, "one"), await say(session, "two")]
        await asyncio.wait_for(session.end(), WAIT)
        await asyncio.wait_for(reader, WAIT)

    for number, result in enumerate(results, start=1):
        items = [item for turn, item in seen if turn == number]
        assert "".join(i.text for i in items if isinstance(i, TextDelta)) == result.text
        assert isinstance(items[-1], StreamResult) and items[-1].result == result
    assert [turn for turn, _ in seen] == sorted(turn for turn, _ in seen)


async def test_a_turn_id_taken_by_another_workflow_refuses_that_turn_in_a_sentence(
        temporal: Client, tmp_path: Path) -> None:
    """Someone starts a workflow under the id the session's next turn would use (a raw
    Temporal client: `boundloop` refuses such ids). That `say` is refused in a sentence,
    the session goes on, and the next turn has an id of its own."""
    async with session_env(temporal, tmp_path, [answer("hello")]) as env:
        session = await env.start()
        squatter = await temporal.start_workflow(
            "Squatter", id=f"{session.id}/turn-1", task_queue=f"nobody-{uuid.uuid4().hex}")
        with pytest.raises(boundloop.SessionRefused,
                           match=rf"turn 1's workflow id '{session.id}/turn-1' is already "
                                 r"used by a workflow this session did not start"):
            await say(session, "hi")
        turn = await say(session, "hi again")
        status = await session.show()
        await squatter.terminate()
        assert await workflow_task_failures(session.handle, temporal) == 0
    assert (turn.reason, turn.text, turn.workflow_id) == ("completed", "hello",
                                                         f"{session.id}/turn-2")
    assert (status.turns, status.last and status.last.workflow_id) == (2, f"{session.id}/turn-2")
