"""A streamed answer under load, through the real workflow on a dev server, the real
`openai` SDK and the scripted server (docs/streaming.md, "What it costs"; docs/guide.md,
"Shared budgets").

Each test here failed before streaming stopped waiting for its signals and abandoned
attempts were charged (patch charged-model-attempts):

- a slow publish path made the model activity outlive its start-to-close timeout, and
  Temporal sent the whole request again (the same step requested 3-6 times);
- an attempt that timed out, or a run cancelled mid-request, charged nothing;
- an answer that kept streaming past model_timeout_seconds was cut and re-sent until the
  run's deadline, with no event;
- each reader of the stream wrote an update to the run's history per poll;
- `run.stream()` died on an update's RPC timeout instead of reading on.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import (
    Client,
    Interceptor,
    OutboundInterceptor,
    QueryWorkflowInput,
    SignalWorkflowInput,
    StartWorkflowUpdateInput,
    WorkflowHandle,
    WorkflowUpdateHandle,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.service import RPCError, RPCStatusCode

import boundloop
from boundloop.budgets import set_budget, show_budget
from boundloop.client import result_of
from boundloop.contracts import (
    WORKFLOW_NAME,
    BudgetView,
    RunResult,
    StreamItem,
    StreamResult,
    TextDelta,
    run_input,
)
from boundloop.core.budget import BudgetLimits
from boundloop.core.limits import Limits, Policy, Price, RunSettings
from boundloop.scripted.server import ScriptedModelServer
from tests.conftest import DEMO_TOOLS, workflow_task_failures
from tests.conftest import test_worker as worker_for
from tests.scripts import USAGE, answer
from tests.test_streaming import text_of

#: Bound of every wait (seconds); none is an assertion on time.
WAIT = 90.0
MODEL = "scripted-model"
PUBLISH = "__temporal_workflow_stream_publish"
POLL = "__temporal_workflow_stream_poll"
#: 1 USD per output token, inputs free: an unanswered attempt's worst case in USD is
#: exactly max_output_tokens, whatever its conversation's bytes.
PRICES = {MODEL: Price(input_usd_per_mtok=0.0, output_usd_per_mtok=1_000_000.0)}
MAX_OUT = 50
QUESTION = "在庫を調べて"
LONG = "在庫はA-001が12個、B-002が3個です。" * 40 + " done ✓"


class _Outbound(OutboundInterceptor):
    def __init__(self, nxt: OutboundInterceptor, owner: Doubles) -> None:
        super().__init__(nxt)
        self._owner = owner

    async def signal_workflow(self, input: SignalWorkflowInput) -> None:
        if input.signal == PUBLISH and self._owner.hold_publish is not None:
            self._owner.publishes += 1
            await self._owner.hold_publish.wait()  # a publish path slower than any answer
        await super().signal_workflow(input)

    async def query_workflow(self, input: QueryWorkflowInput) -> Any:
        if input.query == POLL:
            self._owner.polls += 1
            if self._owner.polls in self._owner.fail_polls:
                raise RPCError("query timed out", RPCStatusCode.DEADLINE_EXCEEDED, b"")
        return await super().query_workflow(input)

    async def start_workflow_update(
            self, input: StartWorkflowUpdateInput) -> WorkflowUpdateHandle[Any]:
        if input.update == POLL:
            self._owner.polls += 1
            if self._owner.polls in self._owner.fail_polls:
                raise WorkflowUpdateRPCTimeoutOrCancelledError()
        return await super().start_workflow_update(input)


class Doubles(Interceptor):
    """The test doubles, on a client's calls: a stream publisher whose signals never get
    through while `hold_publish` is unset, and stream reads that fail (the read number
    `fail_polls` names) as a busy server's do."""

    def __init__(self, *, hold_publish: bool = False, fail_polls: frozenset[int] = frozenset()
                 ) -> None:
        self.hold_publish = asyncio.Event() if hold_publish else None
        self.fail_polls = fail_polls
        self.publishes = 0
        self.polls = 0

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        return _Outbound(next, self)


def with_doubles(client: Client, doubles: Doubles) -> Client:
    config = client.config()
    config["interceptors"] = [doubles]
    return Client(**config)


async def read_all(handle: WorkflowHandle[Any, Any]) -> list[StreamItem]:
    items: list[StreamItem] = []

    async def read() -> None:
        async for item in boundloop.Run(handle).stream():
            items.append(item)
    await asyncio.wait_for(read(), WAIT)
    return items


async def run_on(client: Client, turns: list[dict[str, Any]], tmp_path: Path, *,
                 limits: Limits, budget: str | None = None,
                 during: Callable[[WorkflowHandle[Any, Any]], Any] | None = None,
                 ) -> tuple[RunResult, ScriptedModelServer, WorkflowHandle[Any, Any],
                            BudgetView | None]:
    server = ScriptedModelServer(turns)
    base_url = server.start()
    queue = f"q-{uuid.uuid4().hex[:8]}"
    settings = RunSettings(model=MODEL, limits=limits, budget=budget,
                           policy=Policy(prices=PRICES))
    try:
        async with worker_for(client, queue, base_url, tmp_path / "data"):
            if budget is not None:
                await set_budget(client, budget, BudgetLimits(usd=100_000, tokens=10_000_000),
                                 task_queue=queue)
            handle = await client.start_workflow(
                WORKFLOW_NAME, run_input(QUESTION, instructions=None, settings=settings,
                                         tools=DEMO_TOOLS),
                id=f"test-{uuid.uuid4().hex[:12]}", task_queue=queue, result_type=RunResult)
            if during is not None:
                await during(handle)
            result = await asyncio.wait_for(result_of(handle), WAIT)
            view = await settled(client, budget) if budget is not None else None
    finally:
        server.stop()
    assert server.violations == []
    assert await workflow_task_failures(handle) == 0
    return result, server, handle, view


async def settled(client: Client, key: str) -> BudgetView:
    async def poll() -> BudgetView:
        while True:
            view = await show_budget(client, key)
            if view is not None and not view.holders:
                return view
            await asyncio.sleep(0.1)
    return await asyncio.wait_for(poll(), WAIT)


def served_tokens(server: ScriptedModelServer, answered: int) -> int:
    """Tokens the scripted server's answered requests reported (each turn: USAGE)."""
    return answered * USAGE["total_tokens"]


async def test_a_publish_path_slower_than_the_answer_never_resends_the_request(
        temporal: Client, tmp_path: Path) -> None:
    """The stream's signals never get through while the model writes slowly: the answer
    does not wait for them. One request, the run completes, the stream's text is the
    answer (the workflow adds what the activity could not send), and the tokens charged
    are the ones the server reported."""
    doubles = Doubles(hold_publish=True)
    client = with_doubles(temporal, doubles)
    slow = {**answer(LONG), "chunk_bytes": 64, "chunk_interval_seconds": 0.02}
    seen: list[StreamItem] = []

    async def reader(handle: WorkflowHandle[Any, Any]) -> None:
        seen.extend(await read_all(handle))
        assert doubles.hold_publish is not None
        doubles.hold_publish.set()

    key = f"team-{uuid.uuid4().hex[:6]}"
    result, server, _, view = await run_on(
        client, [slow], tmp_path, budget=key, during=reader,
        limits=Limits(model_timeout_seconds=2.0, max_output_tokens=MAX_OUT))
    assert view is not None
    assert (result.reason, result.steps, result.text) == ("completed", 1, LONG)
    assert len(server.requests) == 1
    assert doubles.publishes >= 1  # the activity did try to publish, and was held
    assert text_of(seen, 1) == LONG
    assert isinstance(seen[-1], StreamResult) and seen[-1].result == result
    assert result.total_tokens == served_tokens(server, 1) == view.spent.tokens
    assert not [e for e in result.events if e.event.startswith("model_")
                and e.event not in ("model_requested", "model_returned")]


async def test_an_attempt_that_timed_out_after_its_request_went_out_is_charged(
        temporal: Client, tmp_path: Path) -> None:
    """The first attempt's request reaches the server, which is silent past
    model_timeout_seconds; the second is answered. The run and the shared budget are
    charged the first attempt's worst case (max_output_tokens of output, its input bound)
    plus the second's reported usage, and the retry is an event naming the timeout and
    the charge."""
    key = f"team-{uuid.uuid4().hex[:6]}"
    silent = {**answer("never read"), "delay_seconds": 6.0}
    result, server, _, view = await run_on(
        temporal, [silent, answer("在庫があります。")], tmp_path, budget=key,
        limits=Limits(model_timeout_seconds=1.0, max_output_tokens=MAX_OUT))
    assert view is not None
    assert (result.reason, result.text) == ("completed", "在庫があります。")
    assert len(server.requests) == 2
    retried = [e for e in result.events if e.event.startswith("model_retried:")]
    assert [e.event for e in retried] == ["model_retried:timeout"]
    assert retried[0].detail is not None and "worst case" in retried[0].detail
    worst = result.total_tokens - served_tokens(server, 1)
    assert worst > MAX_OUT  # its input bound and every output token it may have had
    assert f"charged {worst} tokens" in retried[0].detail
    assert result.output_tokens == USAGE["output_tokens"] + MAX_OUT
    assert [(a.step, a.outcome, a.worst_case) for a in result.model_attempts] == [
        (1, "timeout", True), (1, "answered", False)]
    assert sum(a.input_tokens + a.output_tokens
               for a in result.model_attempts) == result.total_tokens
    assert view.spent.tokens == result.total_tokens
    assert view.spent.usd == pytest.approx(MAX_OUT + USAGE["output_tokens"])


async def test_a_run_whose_attempts_all_outlast_the_answer_bound_stops_model_error(
        temporal: Client, tmp_path: Path) -> None:
    """Every attempt streams steadily (never silent for model_timeout_seconds) for longer
    than model_answer_seconds: each is cut, counted and charged; after the model's 4
    attempts the run stops `model_error`, not at its deadline, with one event per
    attempt."""
    key = f"team-{uuid.uuid4().hex[:6]}"
    endless = {**answer(LONG), "chunk_bytes": 16, "chunk_interval_seconds": 0.1}
    result, server, _, view = await run_on(
        temporal, [endless] * 4, tmp_path, budget=key,
        limits=Limits(model_timeout_seconds=5.0, model_answer_seconds=1.0,
                      max_output_tokens=MAX_OUT))
    assert view is not None
    assert result.reason == "model_error"
    assert len(server.requests) == 4
    assert [e.event for e in result.events if e.event.startswith("model_")] == [
        "model_requested", *["model_retried:timeout"] * 3, "model_failed:timeout"]
    failed = result.events[-2]
    assert failed.detail is not None and "model_answer_seconds" in failed.detail
    assert result.output_tokens == 4 * MAX_OUT
    assert [a.outcome for a in result.model_attempts] == ["timeout"] * 4
    assert sum(a.input_tokens + a.output_tokens
               for a in result.model_attempts) == result.total_tokens
    assert result.total_tokens > 0 and view.spent.tokens == result.total_tokens
    assert view.spent.usd == pytest.approx(4 * MAX_OUT)


async def test_a_run_cancelled_while_its_request_is_out_is_charged(
        temporal: Client, tmp_path: Path) -> None:
    """The run is cancelled once its request reached the server: the request's worst case
    is charged to the run and to its budget (before: nothing)."""
    key = f"team-{uuid.uuid4().hex[:6]}"
    server_box: list[ScriptedModelServer] = []

    async def cancel_when_sent(handle: WorkflowHandle[Any, Any]) -> None:
        async def sent() -> None:
            while not server_box[0].requests:
                await asyncio.sleep(0.05)
        await asyncio.wait_for(sent(), WAIT)
        await handle.cancel()

    server = ScriptedModelServer([{**answer("never read"), "delay_seconds": 30.0}])
    server_box.append(server)
    base_url = server.start()
    queue = f"q-{uuid.uuid4().hex[:8]}"
    settings = RunSettings(model=MODEL, budget=key, policy=Policy(prices=PRICES),
                           limits=Limits(max_output_tokens=MAX_OUT))
    try:
        async with worker_for(temporal, queue, base_url, tmp_path / "data"):
            await set_budget(temporal, key, BudgetLimits(usd=100_000), task_queue=queue)
            handle = await temporal.start_workflow(
                WORKFLOW_NAME, run_input(QUESTION, instructions=None, settings=settings,
                                         tools=DEMO_TOOLS),
                id=f"test-{uuid.uuid4().hex[:12]}", task_queue=queue, result_type=RunResult)
            await cancel_when_sent(handle)
            result = await asyncio.wait_for(result_of(handle), WAIT)
            view = await settled(temporal, key)
    finally:
        server.stop()
    assert result.reason == "cancelled"
    assert len(server.requests) == 1
    assert result.output_tokens == MAX_OUT and result.total_tokens > MAX_OUT
    assert view.spent.tokens == result.total_tokens
    assert view.spent.usd == pytest.approx(MAX_OUT)


async def history_events(handle: WorkflowHandle[Any, Any]) -> list[int]:
    return [e.event_type async for e in handle.fetch_history_events()]


@pytest.mark.parametrize("repeat", [10, 80])
async def test_two_readers_write_nothing_to_the_runs_history(
        temporal: Client, tmp_path: Path, repeat: int) -> None:
    """Two readers follow a streamed answer to its end; the answer is short or 8 times
    longer (more pieces, written for longer). The run's history holds no update (readers
    read by query) and, for the one step, at most the workflow's own events plus the
    stream's signals, whose number does not grow with the answer's length in tokens."""
    text = "在庫はA-001が12個です。" * repeat
    slow = {**answer(text), "chunk_bytes": 24, "chunk_interval_seconds": 0.01}
    seen: list[list[StreamItem]] = []

    async def readers(handle: WorkflowHandle[Any, Any]) -> None:
        seen.extend(await asyncio.gather(read_all(handle), read_all(handle)))

    result, _, handle, _ = await run_on(temporal, [slow], tmp_path, during=readers,
                                     limits=Limits(max_output_tokens=MAX_OUT))
    assert result.text == text
    assert all(text_of(items, 1) == text for items in seen)
    kinds = await history_events(handle)
    E = EventType
    assert E.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED not in kinds
    assert E.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED not in kinds
    signals = kinds.count(E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED)
    assert signals <= SIGNALS_MAX
    # Each signal costs at most itself and one workflow task (3 events).
    assert len(kinds) <= BASE_EVENTS + 4 * signals


#: The most signals one attempt sends (activities.model.STREAM_SIGNALS_MAX).
SIGNALS_MAX = 48
#: The events of a one-step run unstreamed (start, tasks, markers, the model activity,
#: the upserts and the end), with room: the bound the readers' test checks against.
BASE_EVENTS = 30


async def test_run_stream_reads_on_after_a_read_timed_out(temporal: Client,
                                                          tmp_path: Path) -> None:
    """`run.stream()` from a client whose 2nd and 4th reads of the stream time out (as an
    update's RPC or a query does on a busy server): it reads on from where it was, every
    item once, to the result."""
    doubles = Doubles(fail_polls=frozenset({2, 4}))
    client = with_doubles(temporal, doubles)
    slow = {**answer(LONG), "chunk_bytes": 64, "chunk_interval_seconds": 0.02}
    seen: list[StreamItem] = []

    async def reader(handle: WorkflowHandle[Any, Any]) -> None:
        seen.extend(await read_all(client.get_workflow_handle(handle.id)))

    result, _, _, _ = await run_on(temporal, [slow], tmp_path, during=reader,
                                limits=Limits(max_output_tokens=MAX_OUT))
    assert doubles.polls >= 4
    assert [i.offset for i in seen] == list(range(len(seen)))
    assert text_of(seen, 1) == result.text == LONG
    assert isinstance(seen[-1], StreamResult) and seen[-1].result == result
    assert [i for i in seen if isinstance(i, TextDelta)]


async def test_an_attempt_whose_worker_was_killed_after_it_sent_is_charged(
        tmp_path: Path) -> None:
    """kill -9 of the worker once the request reached the server (which holds it): the
    next worker sends the request again, once, after a `model_retried:worker_lost` event
    that names the lost attempt's charge; the run's tokens are that worst case plus the
    answered attempt's usage, and the lost attempt does not count as a failure."""
    from tests.test_crash import cluster, until

    async with cluster(tmp_path) as c:
        held = {**answer("never delivered"), "delay_seconds": WAIT}
        worker = c.start_worker()
        handle = await c.start_run([held, answer("在庫があります。")],
                                   limits=Limits(max_output_tokens=MAX_OUT))

        async def arrived() -> bool:
            return len(c.model.requests) >= 1
        await until(arrived, "the first request at the model server")
        c.kill(worker)
        c.start_worker()
        result = await result_of(handle)
        requests = len(c.model.requests)
    assert (result.reason, result.text) == ("completed", "在庫があります。")
    assert requests == 2
    lost = [e for e in result.events if e.event == "model_retried:worker_lost"]
    assert len(lost) == 1 and lost[0].detail is not None and "worst case" in lost[0].detail
    assert [(a.outcome, a.worst_case) for a in result.model_attempts] == [
        ("worker_lost", True), ("answered", False)]
    assert result.output_tokens == MAX_OUT + USAGE["output_tokens"]
    assert sum(a.input_tokens + a.output_tokens
               for a in result.model_attempts) == result.total_tokens
    assert not [e for e in result.events if e.event.startswith("model_failed")]


@pytest.mark.parametrize("fault", ["cut", "no_terminator"])
async def test_a_protocol_fault_event_names_its_fault(run_script: Any, fault: str) -> None:
    out = await run_script([{**answer("short answer"), "stream_fault": fault,
                             "chunk_bytes": 5}])
    assert out.result.reason == "protocol_error"
    faults = [e for e in out.result.events if e.event == "protocol_fault"]
    assert len(faults) == 1 and faults[0].detail  # before: None
