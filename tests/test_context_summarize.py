"""The `summarize` context strategy through the real workflow (dev server, a worker whose
operator policy allows it, the scripted model over HTTP): a request that would not fit
its window is sent after one summary request, whose summary replaces the oldest part of
the conversation in every request from then on; the summary is charged to the run like
a step's usage; the guarantees kept in the run's state (the identical-call limit) still
see calls made before it; a provider's refusal as too long summarizes once.

The scripted step turns report no usage (`missing_usage: estimate`), so the estimate is
the request's own bytes: the summary happens at a step the bytes decide (the sixth).
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from io import StringIO
from pathlib import Path
from typing import Any

import openai
import pytest
import pytest_asyncio
from rich.console import Console
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from boundloop import OperatorPolicy, Plugin, PolicyRefused, Worker
from boundloop.activities.conversation import ConversationCache, summary_text
from boundloop.budgets import set_budget, show_budget
from boundloop.client import query_status, result_of
from boundloop.contracts import (
    MODEL_ACTIVITY,
    WORKFLOW_NAME,
    BudgetView,
    ModelRequest,
    RunInput,
    RunResult,
)
from boundloop.core import context as ctx
from boundloop.core.budget import BudgetLimits
from boundloop.core.limits import Limits, Policy, RunSettings
from boundloop.live import render
from boundloop.scripted.server import ScriptedModelServer
from boundloop.tools.demo import DemoDeps
from tests.conftest import RUN_TIMEOUT, continue_as_new_server, workflow_task_failures
from tests.scripts import answer, call, chat, chat_call, reasoning, resp
from tests.support.tools import tools as test_tools

#: Tool calls: each output is about 950 bytes (300 × "あ" and more).
CALLS = 6
#: 1500 tokens: five outputs fit at 4 bytes a token, six do not.
WINDOW = 1500
KEEP = 2
#: The step before whose request the conversation is summarized (after c5's output).
AT = 6
SUMMARY = "要約: 在庫の大きな結果を c1〜c3 で三つ集めた。"
#: The tokens (estimated) of the steps before the summary are fewer; with the summary's
#: 1,000 they are more.
THRESHOLD = 4000
#: What the summary request reports.
SUMMARY_USAGE = {"input_tokens": 900, "output_tokens": 100, "total_tokens": 1000}


def script(api: str, *, repeat_first: bool = False,
           summary_usage: dict[str, int] = SUMMARY_USAGE) -> list[dict[str, Any]]:
    """c1..c5, the summary, c6 (or c1's call again), the answer; on the Responses API
    each call comes with a reasoning item."""
    def turn(args: dict[str, Any], call_id: str) -> dict[str, Any]:
        if api == "chat":
            return chat(calls=[chat_call("huge", args, call_id)], usage=None)
        # With a reasoning item: the server then refuses any request that sends the
        # call without it (the cut never parts them).
        return resp(reasoning(f"rs-{call_id}"), call("huge", args, call_id), usage=None,
                    rid=f"r-{call_id}")

    def said(text: str, usage: Any = None) -> dict[str, Any]:
        if api == "chat":
            return chat(text, usage=None if usage is None else {
                "prompt_tokens": usage["input_tokens"],
                "completion_tokens": usage["output_tokens"],
                "total_tokens": usage["total_tokens"]})
        return answer(text, usage=usage)

    calls = [turn({"chars": 300 + i}, f"c{i}") for i in range(1, CALLS + 1)]
    if repeat_first:
        calls[-1] = turn({"chars": 301}, "again")
    return [*calls[:AT - 1], said(SUMMARY, summary_usage), *calls[AT - 1:], said("集めました。")]


def output_ids(body: dict[str, Any], api: str) -> list[str]:
    if api == "chat":
        return [m["tool_call_id"] for m in body["messages"] if m.get("role") == "tool"]
    return [i["call_id"] for i in body["input"] if i.get("type") == "function_call_output"]


def first_message(body: dict[str, Any], api: str) -> Any:
    if api == "chat":
        return next(m["content"] for m in body["messages"] if m["role"] != "system")
    return body["input"][0]["content"]


#: The ledger's view of the run's shared budget, once the run released it.
LEDGER: dict[str, BudgetView] = {}


async def run(temporal: Client, tmp_path: Path, api: str, turns: list[dict[str, Any]], *,
              policy: Policy, operator: OperatorPolicy, limits: Limits | None = None,
              budget: str | None = None, cache: int = 512, tools: list[str] | None = None,
              during: Callable[[WorkflowHandle[Any, Any]], Awaitable[None]] | None = None,
              ) -> tuple[RunResult, ScriptedModelServer, Any, WorkflowHandle[Any, Any]]:
    server = ScriptedModelServer(turns)
    queue = f"sum-{uuid.uuid4().hex[:8]}"
    client = openai.AsyncOpenAI(base_url=server.start(), api_key="sk-test-not-real")
    settings = RunSettings(model="scripted-model", api=api,  # type: ignore[arg-type]
                           limits=limits or Limits(
                               max_steps=CALLS + 3, max_tool_executions=CALLS + 2,
                               max_input_tokens=WINDOW, token_threshold=10**6),
                           policy=policy, budget=budget)
    inp = RunInput(question="大きな結果を集めて", tools=tools or ["huge"], settings=settings)
    try:
        async with Worker(temporal, test_tools, deps=DemoDeps(data_dir=tmp_path),
                          model=client, task_queue=queue, policy=operator,
                          conversation_cache=cache):
            if budget is not None:
                await set_budget(temporal, budget, BudgetLimits(tokens=10**7), task_queue=queue)
            handle = await temporal.start_workflow(
                WORKFLOW_NAME, inp, id=f"sum-{queue}", task_queue=queue,
                result_type=RunResult)
            if during is not None:
                await during(handle)
            result = await asyncio.wait_for(result_of(handle), RUN_TIMEOUT)
            status = await query_status(handle)
            if budget is not None:
                LEDGER[budget] = await asyncio.wait_for(released(temporal, budget), RUN_TIMEOUT)
    finally:
        server.stop()
    assert await workflow_task_failures(handle, temporal) == 0
    return result, server, status, handle


async def released(temporal: Client, key: str) -> BudgetView:
    while True:
        view = await show_budget(temporal, key)
        if view is not None and not view.holders:
            return view
        await asyncio.sleep(0.05)


SUMMARIZES = Policy(missing_usage="estimate", context="summarize", context_keep=KEEP)
ALLOWS = OperatorPolicy(context=["trim", "summarize"], context_keep=KEEP)


async def model_requests(handle: WorkflowHandle[Any, Any]) -> list[ModelRequest]:
    """Every model activity the run scheduled, in order (its history)."""
    history = await handle.fetch_history()
    found: list[ModelRequest] = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == MODEL_ACTIVITY:
                [req] = pydantic_data_converter.payload_converter.from_payloads(
                    list(attrs.input.payloads), [ModelRequest])
                found.append(req)
    replayer = Replayer(workflows=[], data_converter=pydantic_data_converter,
                        plugins=[Plugin(test_tools, deps=None)])
    assert (await replayer.replay_workflow(history)).replay_failure is None
    return found


@pytest.mark.parametrize(("api", "cache"), [("responses", 512), ("chat", 512),
                                            ("responses", 0)])
async def test_a_summary_replaces_the_oldest_part_and_the_newest_outputs_stay(
        temporal: Client, tmp_path: Path, api: str, cache: int) -> None:
    """With a cold cache (0), every request and the summary read the run's history."""
    result, server, status, handle = await run(temporal, tmp_path, api, script(api),
                                               policy=SUMMARIZES, operator=ALLOWS,
                                               cache=cache)
    # Every request valid in its API's rules (the server checks each one).
    assert server.violations == []
    assert (result.reason, result.steps, result.tool_executions) == (
        "completed", CALLS + 1, CALLS)
    [event] = [e for e in result.events if e.event == ctx.SUMMARIZED_EVENT]
    found = re.match(r"(\d+) tokens before, (\d+) after \(estimated\)", event.detail or "")
    assert found is not None, event.detail
    before, after = int(found[1]), int(found[2])
    assert before > WINDOW >= after and event.step == AT
    # The guide's worked example, as it says it (the Responses API's figures briefly).
    guide = " ".join((Path(__file__).parent.parent / "docs" / "guide.md").read_text(
        encoding="utf-8").split())
    shown = f"`{event.detail}`" if api == "chat" else f"`{before} tokens before, {after} after`"
    assert shown in guide, event.detail
    assert status.summarized == 1
    bodies = [r.body for r in server.requests]
    assert len(bodies) == CALLS + 2  # the steps and one summary request
    asked = bodies[AT - 1]
    # The summary request: its own instructions, no tools, the oldest part as a
    # transcript (c1..c3; the newest two outputs, c4's and c5's, stay whole).
    if api == "chat":
        assert asked["messages"][0] == {"role": "system", "content": ctx.SUMMARY_INSTRUCTIONS}
    else:
        assert asked["instructions"] == ctx.SUMMARY_INSTRUCTIONS
    assert "tools" not in asked
    transcript = first_message(asked, api)
    assert all(f"call c{i}" in transcript for i in (1, 2, 3))
    assert "c4" not in transcript and "大きな結果を集めて" in transcript
    # Every request after it: the summary first, then the newest part whole.
    for body, ids in ((bodies[AT], ["c4", "c5"]), (bodies[-1], ["c4", "c5", "c6"])):
        assert first_message(body, api) == ctx.SUMMARY_HEADING + SUMMARY
        assert output_ids(body, api) == ids
        text = json.dumps(body, ensure_ascii=False)
        assert '"c1"' not in text and "あ" * 304 in text
    # One summary activity in history (a replay of it asks nothing again).
    reqs = await model_requests(handle)
    assert [r.summarize is not None for r in reqs].count(True) == 1
    # The question and c1..c3 with their calls (and on Responses their reasoning items).
    assert reqs[AT].summary is not None
    assert reqs[AT].summary.count == (7 if api == "chat" else 10)
    # `watch` and the console show the count with the context line.
    frame = StringIO()
    Console(file=frame, width=100).print(render("run", status))
    assert "summarized 1×" in frame.getvalue()


async def test_the_summary_counts_against_the_runs_token_threshold(
        temporal: Client, tmp_path: Path) -> None:
    """The summary request reports 1,000 tokens: a threshold the plain steps stay under
    stops the run right after the summary, before the step's request is sent."""
    limits = Limits(max_steps=CALLS + 3, max_tool_executions=CALLS + 2,
                    max_input_tokens=WINDOW, token_threshold=THRESHOLD)
    result, server, _, _ = await run(temporal, tmp_path, "responses", script("responses"),
                                     policy=SUMMARIZES, operator=ALLOWS, limits=limits)
    assert result.reason == "usage_limit"
    assert [e.event for e in result.events][-2:] == [ctx.SUMMARIZED_EVENT,
                                                     "stopped:usage_limit"]
    assert len(server.requests) == AT and result.steps == AT - 1
    assert result.input_tokens >= SUMMARY_USAGE["input_tokens"]
    assert result.total_tokens >= THRESHOLD


async def test_the_summary_is_charged_to_the_shared_budget(temporal: Client,
                                                           tmp_path: Path) -> None:
    """Runs spending from a shared budget: the ledger's spent tokens are the run's totals,
    the summary's with them. The same run with a summary reporting 1,000 tokens more
    spends 1,000 tokens more."""
    limits = Limits(max_steps=CALLS + 3, max_tool_executions=CALLS + 2,
                    max_input_tokens=WINDOW + 100, max_output_tokens=100,
                    token_threshold=10**6)
    spent = []
    for total in (1000, 2000):
        key = f"sum-{uuid.uuid4().hex[:6]}"
        usage = {"input_tokens": total - 100, "output_tokens": 100, "total_tokens": total}
        result, server, _, _ = await run(temporal, tmp_path, "responses",
                                         script("responses", summary_usage=usage),
                                         policy=SUMMARIZES, operator=ALLOWS, limits=limits,
                                         budget=key)
        assert server.violations == []
        assert result.reason == "completed"
        assert ctx.SUMMARIZED_EVENT in [e.event for e in result.events]
        assert LEDGER[key].spent.tokens == result.total_tokens
        spent.append(result.total_tokens)
    assert spent[1] - spent[0] == 1000


async def test_the_identical_call_limit_fires_on_a_call_made_before_the_summary(
        temporal: Client, tmp_path: Path) -> None:
    """After the summary the model repeats c1's call (its output is no longer in the
    conversation): with max_identical_calls 1 it is blocked, as without a summary."""
    limits = Limits(max_steps=CALLS + 3, max_tool_executions=CALLS + 2,
                    max_input_tokens=WINDOW, token_threshold=10**6, max_identical_calls=1)
    result, server, _, _ = await run(temporal, tmp_path, "responses",
                                     script("responses", repeat_first=True),
                                     policy=SUMMARIZES, operator=ALLOWS, limits=limits)
    assert server.violations == []
    assert result.reason == "max_identical_calls"
    events = [(e.event, e.call_id) for e in result.events]
    assert events.index((ctx.SUMMARIZED_EVENT, None)) < events.index(
        ("blocked_identical", "again"))
    assert result.tool_executions == CALLS - 1
    # The model is told where that result went.
    blocked = next(i for i in server.requests[-1].body["input"]
                   if i.get("type") == "function_call_output" and i["call_id"] == "again")
    assert "(or in the summary of the earlier conversation)" in blocked["output"]


async def test_a_run_may_not_summarize_where_the_operator_does_not_allow_it(
        temporal: Client, tmp_path: Path) -> None:
    with pytest.raises(PolicyRefused) as refused:
        await run(temporal, tmp_path, "responses", script("responses"), policy=SUMMARIZES,
                  operator=OperatorPolicy(context="trim"))
    assert refused.value.lines() == [
        "policy.context: the run asked summarize; the operator's policy: trim (runs may "
        "not summarize their conversation)"]


async def test_a_providers_refusal_as_too_long_summarizes_once(
        temporal: Client, tmp_path: Path) -> None:
    """The estimate lets the sixth request through (a wide window), the provider refuses
    it as too long: one summary, the same step sent again and answered. A second refusal
    after the summary ends the run context_exhausted."""
    too_long = {"status": 400, "body": {"error": {
        "message": "This model's maximum context length is 1500 tokens.",
        "type": "invalid_request_error", "param": "input",
        "code": "context_length_exceeded"}}}
    turns = script("responses")
    turns.insert(AT - 1, too_long)
    wide = Limits(max_steps=CALLS + 3, max_tool_executions=CALLS + 2,
                  max_input_tokens=100_000, token_threshold=10**6)
    # A wide window asks no summary of its own; the refused request's does (keep 2:
    # the same cut as a 1500-token window would make).
    result, server, _, _ = await run(temporal, tmp_path, "responses", turns,
                                     policy=SUMMARIZES, operator=ALLOWS, limits=wide)
    assert (result.reason, result.steps) == ("completed", CALLS + 1)
    names = [e.event for e in result.events]
    assert names.count(ctx.SUMMARIZED_EVENT) == 1
    assert names.index("model_retried:context_length_exceeded") \
        < names.index(ctx.SUMMARIZED_EVENT)
    assert output_ids(server.requests[AT + 1].body, "responses") == ["c4", "c5"]
    turns = script("responses")
    turns[AT:AT] = [too_long]
    turns.insert(AT - 1, too_long)
    result, server, _, _ = await run(temporal, tmp_path, "responses", turns,
                                     policy=SUMMARIZES, operator=ALLOWS, limits=wide)
    assert result.reason == "context_exhausted"
    names = [e.event for e in result.events]
    assert names.count(ctx.SUMMARIZED_EVENT) == 1
    assert names[-2:] == ["model_failed:context_length_exceeded", "stopped:context_exhausted"]


async def test_a_worker_killed_during_and_after_the_summary_request_summarizes_once(
        tmp_path: Path) -> None:
    """Worker processes, SIGKILL: once while the summary request is out (its attempt is
    lost and sent again, with the same idempotency key), once while the step after it is
    out (the next worker replays the run: the summary is the activity's result in
    history, never asked again). One summary, one event, the run completes."""
    from tests.test_crash import WAIT, cluster, until

    policy = tmp_path / "policy.toml"
    policy.write_text(f'context = "summarize"\ncontext_keep = {KEEP}\n', encoding="utf-8")
    turns = script("responses")
    held = answer("never delivered", usage=None, delay_seconds=WAIT)  # its worker dies
    turns[AT - 1:AT - 1] = [held]  # the summary's first attempt
    turns[AT + 1:AT + 1] = [held]  # the step's first attempt after the summary
    async with cluster(tmp_path, tools_target="tests.support.tools:tools") as c:
        worker = c.start_worker(policy_file=policy)
        handle = await c.start_run(turns, tools=["huge"], policy=SUMMARIZES, limits=Limits(
            max_steps=CALLS + 3, max_tool_executions=CALLS + 2, max_input_tokens=WINDOW,
            token_threshold=10**6, model_timeout_seconds=3.0))
        for arrived in (AT, AT + 2):  # the summary's first attempt, the step's after it
            async def out(n: int = arrived) -> bool:
                return len(c.model.requests) >= n

            await until(out, f"model request {arrived}")
            c.kill(worker)
            worker = c.start_worker(policy_file=policy)
        result = await asyncio.wait_for(result_of(handle), WAIT)
        history = await handle.fetch_history()
        assert c.model.violations == []
        assert await workflow_task_failures(handle) == 0

    assert (result.reason, result.steps, result.tool_executions) == (
        "completed", CALLS + 1, CALLS)
    assert [e.event for e in result.events].count(ctx.SUMMARIZED_EVENT) == 1
    summaries = [r for r in c.model.requests if r.body.get("instructions")
                 == ctx.SUMMARY_INSTRUCTIONS]
    # Sent twice (the first attempt's worker died), under one idempotency key.
    assert len(summaries) == 2
    assert len({r.headers.get("idempotency-key") for r in summaries}) == 1
    assert len(c.model.requests) == len(turns)
    # In history: one summary activity completed; every request after it sends it.
    scheduled: dict[int, ModelRequest] = {}
    completed = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == MODEL_ACTIVITY:
                [req] = pydantic_data_converter.payload_converter.from_payloads(
                    list(attrs.input.payloads), [ModelRequest])
                scheduled[event.event_id] = req
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            done = event.activity_task_completed_event_attributes.scheduled_event_id
            if done in scheduled:
                completed.append(scheduled[done])
    assert [r.summarize is not None for r in completed].count(True) == 1
    assert all(r.summary is not None for r in completed[AT:])
    assert first_message(c.model.requests[-1].body, "responses") \
        == ctx.SUMMARY_HEADING + SUMMARY


@pytest_asyncio.fixture(scope="module")
async def low_threshold(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Client]:
    """A dev server that suggests continue-as-new every dozen events: about every step."""
    async with continue_as_new_server(
            tmp_path_factory.mktemp("sum-can") / "temporal.db", 12) as client:
        yield client


@pytest.mark.parametrize("cache", [512, 0])
async def test_a_summary_written_in_an_earlier_temporal_run_is_sent_by_the_next(
        low_threshold: Client, tmp_path: Path, cache: int) -> None:
    """The run continues as new between steps: the summary request's result is in one
    Temporal run's history, the requests of the runs after it send it (with a cold cache
    (0) read from that earlier run's history)."""
    result, server, _, handle = await run(low_threshold, tmp_path, "responses",
                                          script("responses"), policy=SUMMARIZES,
                                          operator=ALLOWS, cache=cache)
    assert server.violations == []
    assert (result.reason, result.steps) == ("completed", CALLS + 1)
    assert [e.event for e in result.events].count(ctx.SUMMARIZED_EVENT) == 1
    for body in (server.requests[AT].body, server.requests[-1].body):
        assert first_message(body, "responses") == ctx.SUMMARY_HEADING + SUMMARY
    query = f"WorkflowId = '{handle.id}'"
    runs = [wf.run_id async for wf in low_threshold.list_workflows(query)]
    summarized_in, sent_by = set(), set()
    for run_id in runs:
        requests = await model_requests(low_threshold.get_workflow_handle(handle.id,
                                                                          run_id=run_id))
        if any(r.summarize is not None for r in requests):
            summarized_in.add(run_id)
        if any(r.summary is not None and r.summarize is None for r in requests):
            sent_by.add(run_id)
    assert len(summarized_in) == 1 and sent_by - summarized_in, (summarized_in, sent_by)


async def test_status_of_an_open_run_counts_its_summaries(temporal: Client,
                                                          tmp_path: Path) -> None:
    """After the summary the model asks for a ticket (approval): while the run waits,
    `boundloop status` shows the next request's estimate and the summaries."""
    from boundloop.client import decide
    from boundloop.contracts import Decision
    from tests.test_cli import cli, env_for

    ticket = {"title": "在庫", "description": "大きな結果", "priority": "low"}
    turns = script("responses")
    turns[AT] = resp(call("create_ticket", ticket, "t1"), usage=None, rid="r-t1")
    window = WINDOW + 150  # room for create_ticket's declaration: summarized at step AT
    limits = Limits(max_steps=CALLS + 3, max_tool_executions=CALLS + 2,
                    max_input_tokens=window, token_threshold=10**6)
    printed: list[str] = []

    async def waiting(handle: WorkflowHandle[Any, Any]) -> None:
        while True:
            st = await query_status(handle)
            if st.status == "waiting_approval":
                break
            await asyncio.sleep(0.05)
        code, out, err = await cli("status", handle.id, env=env_for(temporal, tmp_path))
        assert code == 0, err
        printed.append(out)
        assert await asyncio.wait_for(decide(handle, Decision(
            call_id="t1", approve=True, approver="alice")), RUN_TIMEOUT) == "approved"

    result, server, _, _ = await run(temporal, tmp_path, "responses", turns,
                                          policy=SUMMARIZES, operator=ALLOWS, limits=limits,
                                          tools=["huge", "create_ticket"], during=waiting)
    assert server.violations == [] and result.reason == "completed"
    [event] = [e for e in result.events if e.event == ctx.SUMMARIZED_EVENT]
    assert event.step == AT
    [line] = [x for x in printed[0].splitlines() if x.startswith("context:")]
    assert line.endswith(f"input tokens (estimated) of a {window}-token window, the "
                         "conversation summarized 1×"), line


async def test_a_summary_cached_under_its_key_by_an_earlier_reset_run_is_read_again(
        temporal: Client, tmp_path: Path) -> None:
    """A reset run summarizes again under the same key; a worker that cached the summary
    the run wrote before the reset finds another text under that key. The activity reads
    the run's own summary from history instead of failing the request as a mismatch."""
    result, _, _, handle = await run(temporal, tmp_path, "responses", script("responses"),
                                     policy=SUMMARIZES, operator=ALLOWS)
    assert result.reason == "completed"
    after = next(r for r in await model_requests(handle) if r.summary is not None)
    assert after.summary is not None
    cache = ConversationCache()
    cache.put_output(after.summary.key, "the summary written before the reset")
    text = await summary_text(cache, temporal, after, handle.id, result.run_id)
    assert text == SUMMARY and cache.output(after.summary.key) == SUMMARY
