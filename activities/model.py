"""The model activity: one model request per activity, both OpenAI APIs.

The SDK client runs with `max_retries=0`. A failed request is raised as a typed
`ApplicationError` (activities/model_errors.py) that the workflow counts against the
request's attempts; Temporal itself only retries attempts lost to a dead worker, which
the heartbeats detect (docs/durability.md, "Crashes and retries"). Each request
carries an `Idempotency-Key` header derived from the workflow id and the step. The raw
response body is parsed by the pure core (`boundloop.core.turn`), so malformed output
becomes a typed fault, not a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from datetime import timedelta
from typing import Any

import httpx2 as httpx
import openai
from temporalio import activity
from temporalio.contrib.workflow_streams import WorkflowStreamClient
from temporalio.exceptions import ApplicationError

from boundloop import errors
from boundloop.activities.conversation import ConversationCache, rebuild
from boundloop.activities.heartbeat import heartbeating
from boundloop.activities.model_errors import to_application_error
from boundloop.contracts import MODEL_ACTIVITY, STREAM_TOPIC, ModelRequest, Reset, TextDelta
from boundloop.core import model_failures as mf
from boundloop.core.canonical import json_bytes
from boundloop.core.conversation import to_chat_messages
from boundloop.core.limits import MAX_TURN_BYTES
from boundloop.core.model_failures import ModelFailure
from boundloop.core.sse import ChatStream, ResponsesStream, SSEParser
from boundloop.core.turn import Turn, parse_chat, parse_responses
from boundloop.tools.registry import Toolset

#: How often streamed text is sent to the run: each batch is one signal in its history.
STREAM_BATCH = timedelta(milliseconds=100)
#: A batch is sent early once it holds this much text, in pieces of at most
#: STREAM_PIECE characters: one signal stays small (well under 64 KB with its
#: encoding) however fast the provider writes.
STREAM_BATCH_BYTES = 16 * 1024
STREAM_PIECE = 4096


def model_idempotency_key(workflow_id: str, step: int) -> str:
    return f"{workflow_id}/model/step-{step}"


class ModelActivities:
    def __init__(self, client: openai.AsyncOpenAI, registry: Toolset[Any],
                 cache: ConversationCache | None = None) -> None:
        # The workflow's counted attempts are the only retry layer.
        self._client = client.with_options(max_retries=0)
        self._registry = registry
        self.cache = cache or ConversationCache()

    @activity.defn(name=MODEL_ACTIVITY)
    async def model_request(self, req: ModelRequest) -> Turn:
        async with heartbeating():
            try:
                return await self._request(req)
            except ApplicationError:
                raise
            except Exception as exc:  # our own bug or Temporal unreachable: not the provider
                activity.logger.error("model activity failed", extra={
                    "step": req.step, "error": type(exc).__name__})
                raise ApplicationError(f"model activity failed: {type(exc).__name__}",
                                       type=errors.MODEL_ACTIVITY_FAILED) from None

    async def _request(self, req: ModelRequest) -> Turn:
        info = activity.info()
        wf_id, run_id = info.workflow_id or "", info.workflow_run_id or ""
        items, rebuilt = await rebuild(self.cache, activity.client(), req, wf_id, run_id)
        activity.logger.info("model request", extra={
            "step": req.step, "api": req.api, "items": len(items), "attempt": info.attempt,
            "rebuilt_from_history": rebuilt})
        timeout = req.timeout_seconds or (
            info.start_to_close_timeout.total_seconds() if info.start_to_close_timeout else 60.0)
        body = await self._send(req, wf_id, items, timeout)
        turn = parse_chat(body, req.step) if req.api == "chat" else parse_responses(body)
        size = json_bytes(turn.model_dump(mode="json"))
        if size > MAX_TURN_BYTES:
            raise ApplicationError(
                f"model step {req.step}: response is {size} bytes, over the "
                f"{MAX_TURN_BYTES}-byte payload limit", type=errors.MODEL_RESPONSE_TOO_LARGE,
                non_retryable=True)
        full = [*items, *turn.items]
        self.cache.put(wf_id, req.expected.extend(turn.items), full)
        # This worker's own queue, where this cache is, and whether the request found the
        # conversation in it: the workflow routes the run's next activities by both.
        return turn.model_copy(update={
            "worker_queue": self.cache.queue,
            "cached": self.cache.queue is not None and req.prior.count > 0 and not rebuilt})

    def _definitions(self, req: ModelRequest) -> list[dict[str, Any]]:
        """The function definitions of the run's tools, in its order: the tools the run
        describes itself (MCP tools, and tools a deploy took from this worker since the
        run was admitted) from its declarations, the others from this worker's toolset."""
        mcp = {d.name: d for d in req.mcp_tools}
        if not mcp:
            return self._registry.openai_tools(req.tools, req.api)
        own = iter(self._registry.openai_tools([n for n in req.tools if n not in mcp],
                                               req.api))
        return [mcp[n].openai_tool(req.api) if n in mcp else next(own) for n in req.tools]

    async def _send(self, req: ModelRequest, workflow_id: str, items: list[Any],
                    seconds: float) -> Any:
        """POST the request with the SDK's client (auth, base URL, error types) and return
        the parsed JSON body. The body is built here and sent as-is: the SDK's per-item
        type transform of `input` costs O(conversation) on the event loop each step
        (docs/benchmarks.md)."""
        headers = {"Idempotency-Key": model_idempotency_key(workflow_id, req.step)}
        tools = self._definitions(req)
        body: dict[str, Any] = {"model": req.model}
        if req.api == "chat":
            path = "/chat/completions"
            body["messages"] = to_chat_messages(items, req.instructions)
        else:
            path = "/responses"
            body.update(input=items, store=False, include=["reasoning.encrypted_content"])
            if req.instructions:
                body["instructions"] = req.instructions
        if tools:
            body.update(tools=tools, tool_choice=req.tool_choice)
        if req.max_output_tokens is not None:
            cap = "max_completion_tokens" if req.api == "chat" else "max_output_tokens"
            body[cap] = req.max_output_tokens
        if req.stream:
            body["stream"] = True
            if req.api == "chat":  # usage arrives in the last chunk only when asked for
                body["stream_options"] = {"include_usage": True}
            # The SDK hands back the response unread: the activity reads the events.
            headers["X-Stainless-Raw-Response"] = "stream"
        try:
            raw = await self._client.post(path, cast_to=httpx.Response, body=body,
                                          options={"headers": headers, "timeout": seconds})
            if req.stream:
                return await self._read(req, raw, seconds)
        except openai.APIError as exc:
            error = to_application_error(exc, seconds)
            failure = ModelFailure.from_details(error.details)
            activity.logger.warning("model request failed", extra={
                "step": req.step, "error": type(exc).__name__,
                "failure": failure.kind if failure else None, "detail": error.message})
            raise error from None
        return _json(raw.content)

    async def _read(self, req: ModelRequest, raw: httpx.Response, seconds: float) -> Any:
        """The body of a streamed answer, assembled as the unstreamed request returns it;
        its text is published to the run's stream as it comes (docs/streaming.md). A
        provider that answered without streaming (JSON, not events) is read as JSON."""
        if not raw.headers.get("content-type", "").startswith("text/event-stream"):
            return _json(await raw.aread())
        info = activity.info()
        attempt = f"{info.activity_id}.{info.attempt}"
        publisher = WorkflowStreamClient.from_within_activity(batch_interval=STREAM_BATCH)
        topic = publisher.topic(STREAM_TOPIC)
        fold: ChatStream | ResponsesStream = ChatStream() if req.api == "chat" \
            else ResponsesStream()
        parser = SSEParser()
        batch = _TextBatch(publisher, req.step, attempt)
        async with publisher:
            if info.attempt > 1:  # the attempt before this one died (its worker was lost)
                topic.publish(Reset(step=req.step, attempt=f"{info.activity_id}."
                                    f"{info.attempt - 1}"), force_flush=True)

            stop = asyncio.Event()

            async def tick() -> None:  # a provider that pauses still has its text sent
                while not stop.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), STREAM_BATCH.total_seconds())
                    await batch.send(due_only=True)

            ticker = asyncio.create_task(tick())
            try:
                async for chunk in raw.aiter_bytes():
                    for data in parser.feed(chunk):
                        batch.add(fold.event(data))
                        if fold.error is not None:
                            await batch.send()
                            topic.publish(Reset(step=req.step, attempt=attempt))
                            raise _stream_error(req.step, fold.error.code)
                    await batch.send(due_only=True)
                await batch.send()
            except httpx.TimeoutException:
                await batch.send()
                topic.publish(Reset(step=req.step, attempt=attempt))
                raise to_application_error(openai.APITimeoutError(raw.request),
                                           seconds) from None
            except httpx.TransportError:
                await batch.send()  # cut: a cut body is a protocol fault, as unstreamed
            finally:
                stop.set()  # not cancelled: a batch it is sending goes out whole
                with contextlib.suppress(Exception):
                    await ticker
                await raw.aclose()
        return fold.result()


class _TextBatch:
    """The answer text read since the last send: one `TextDelta` per batch (each SSE
    event holds a few characters; an item each would multiply the bytes in history)."""

    def __init__(self, publisher: WorkflowStreamClient, step: int, attempt: str) -> None:
        self._topic = publisher.topic(STREAM_TOPIC)
        self._publisher = publisher
        self._step, self._attempt = step, attempt
        self._text: list[str] = []
        self._bytes = 0  # in the batch
        self._sent = 0  # in all batches
        self._since = time.monotonic()
        self._lock = asyncio.Lock()  # one batch at a time, its pieces in order

    def add(self, text: str) -> None:
        if text:
            self._text.append(text)
            self._bytes += len(text.encode("utf-8", "surrogatepass"))

    async def send(self, *, due_only: bool = False) -> None:
        """Publish the batch (with `due_only`, only once it is STREAM_BATCH old or full),
        and wait until the run has it."""
        async with self._lock:
            await self._send(due_only)

    async def _send(self, due_only: bool) -> None:
        if not self._text or (due_only and self._bytes < STREAM_BATCH_BYTES
                              and time.monotonic() - self._since
                              < STREAM_BATCH.total_seconds()):
            return
        text, self._text, size, self._bytes = "".join(self._text), [], self._bytes, 0
        self._since = time.monotonic()
        # Past the size an answer may have, text is not streamed: the answer will be
        # refused as too large, and its text would only grow history.
        if self._sent + size > MAX_TURN_BYTES:
            return
        self._sent += size
        for start in range(0, len(text), STREAM_PIECE):
            self._topic.publish(TextDelta(step=self._step, attempt=self._attempt,
                                          text=text[start:start + STREAM_PIECE]))
            await self._publisher.flush()  # one piece a signal: each stays small


def _json(content: bytes) -> Any:
    try:
        return json.loads(content)
    except (ValueError, RecursionError):  # bad JSON, bad UTF-8, >4300-digit ints
        return None  # the core turns a non-object body into a protocol fault


def _stream_error(step: int, code: str | None) -> ApplicationError:
    """An error event mid-stream: the provider failed after answering 200, which is a
    server error like a 5xx (retried, counted); its message stays out of history."""
    failure = ModelFailure(kind=mf.http_kind(500),
                           detail=f"model step {step}: the provider sent an error event "
                                  f"mid-stream (code {code or 'none'})")
    activity.logger.warning("model stream failed", extra={"step": step, "code": code})
    return ApplicationError(failure.detail, failure.model_dump(),
                            type=errors.MODEL_REQUEST_RETRYABLE)
