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
import collections
import contextlib
import json
import urllib.parse
from typing import Any

import httpx2 as httpx
import openai
from temporalio import activity
from temporalio.contrib.workflow_streams import WorkflowStreamClient
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from boundloop import errors
from boundloop.activities.conversation import (
    ConversationCache,
    Packed,
    json_array,
    pack,
    rebuild,
    summary_text,
    tool_outputs,
    unpack,
)
from boundloop.activities.heartbeat import heartbeating
from boundloop.activities.model_errors import to_application_error
from boundloop.contracts import MODEL_ACTIVITY, STREAM_TOPIC, ModelRequest, Reset, TextDelta
from boundloop.core import context as ctx
from boundloop.core import model_failures as mf
from boundloop.core.canonical import compact_json, json_bytes
from boundloop.core.context import trim_outputs
from boundloop.core.conversation import to_chat_messages
from boundloop.core.limits import MAX_TURN_BYTES
from boundloop.core.model_failures import ModelFailure
from boundloop.core.sse import ChatStream, ResponsesStream, SSEParser
from boundloop.core.turn import Streamed, Trimmed, Turn, parse_chat, parse_responses
from boundloop.tools.registry import Toolset

#: Streamed text goes to the run in signals (each one event in its history, and a
#: workflow task), sent by a task of their own: reading the provider's stream never
#: waits for them. The first batch leaves STREAM_FIRST after the first text; each wait
#: after it is twice the one before, up to STREAM_EVERY_MAX, so an answer of T seconds
#: costs about log2(T / STREAM_FIRST) + T / STREAM_EVERY_MAX signals whatever its
#: length in tokens. A signal still in flight when the next is due makes the next one
#: bigger (text piles up in the buffer and leaves as one batch): a slow run or a busy
#: host means fewer, larger signals, never a slower answer.
STREAM_FIRST = 0.25
STREAM_EVERY_MAX = 5.0
#: At most this many signals per attempt: past it the text waits for the end, where the
#: workflow publishes what its stream lacks of the answer (docs/streaming.md).
STREAM_SIGNALS_MAX = 48
#: One signal carries at most this much text, in pieces of at most STREAM_PIECE
#: characters (one `TextDelta` each): a signal stays well under Temporal's limits.
STREAM_BATCH_BYTES = 32 * 1024
STREAM_PIECE = 4096


#: The failure of a model request this worker cannot describe: the run was admitted
#: with a tool this worker's toolset lacks (another release's worker, in a deploy
#: without versioning, docs/deploying.md).
TOOL_NOT_SERVED = "tool_not_served"


def _tools_not_served(missing: list[str], progress: _Progress) -> ApplicationError:
    """The request is not sent: this worker cannot describe the run's tools `missing`.
    Retryable (the workflow's counted attempts): another worker of the queue that
    serves them may take the next attempt."""
    info = activity.info()
    names = ", ".join(repr(n) for n in missing)
    failure = ModelFailure(kind=TOOL_NOT_SERVED, detail=(
        f"the worker {activity.client().identity!r} on task queue {info.task_queue!r} "
        f"serves no tool named {names}, which the run was admitted with: the request "
        "was not sent (a worker of another release took it: give every worker of the "
        "queue the run's tools, or deploy with worker versioning)"))
    activity.logger.warning("model request not sent: tools not served", extra={
        "tools": missing, "task_queue": info.task_queue})
    return ApplicationError(failure.detail, failure.model_dump(), *progress.details(),
                            type=errors.MODEL_ACTIVITY_FAILED,
                            category=ApplicationErrorCategory.BENIGN)


def model_idempotency_key(scope: str, step: int, summary: bool = False) -> str:
    """The step's key (its summary request's: another), ASCII as an HTTP header must
    be: what is not (a workflow id in Japanese) is percent-encoded, so an ASCII id's key
    reads as it is."""
    key = f"{scope}/model/step-{step}" + ("/summary" if summary else "")
    return urllib.parse.quote(key, safe="/-_.~:@!$&'()*+,;=")


class ModelActivities:
    def __init__(self, client: openai.AsyncOpenAI, registry: Toolset[Any],
                 cache: ConversationCache | None = None) -> None:
        # The workflow's counted attempts are the only retry layer.
        self._client = client.with_options(max_retries=0)
        self._registry = registry
        self.cache = cache or ConversationCache()

    @activity.defn(name=MODEL_ACTIVITY)
    async def model_request(self, req: ModelRequest) -> Turn:
        progress = _Progress()
        # The heartbeats say whether the request went out: an attempt lost or timed out
        # after it did is charged to the run (the workflow reads the last heartbeat).
        async with heartbeating(progress.details):
            try:
                return await self._request(req, progress)
            except ApplicationError:
                raise
            except Exception as exc:  # our own bug or Temporal unreachable: not the provider
                activity.logger.error("model activity failed", extra={
                    "step": req.step, "error": type(exc).__name__})
                raise ApplicationError(f"model activity failed: {type(exc).__name__}",
                                       *progress.details(),
                                       type=errors.MODEL_ACTIVITY_FAILED) from None

    async def _request(self, req: ModelRequest, progress: _Progress) -> Turn:
        info = activity.info()
        wf_id, run_id = info.workflow_id or "", info.workflow_run_id or ""
        items, rebuilt = await rebuild(self.cache, activity.client(), req, wf_id, run_id)
        activity.logger.info("model request", extra={
            "step": req.step, "api": req.api, "items": len(items), "attempt": info.attempt,
            "rebuilt_from_history": rebuilt})
        timeout = req.timeout_seconds or (
            info.start_to_close_timeout.total_seconds() if info.start_to_close_timeout else 60.0)
        summary = await summary_text(self.cache, activity.client(), req, wf_id, run_id)
        if req.summarize is not None:
            if rebuilt and req.prior.count:  # the step's request finds it here
                self.cache.put(wf_id, req.prior, items[:req.prior.count], run_id)
            turn = await self._summarize(req, req.summarize, unpack(items), summary, wf_id,
                                         timeout, progress)
            return turn.model_copy(update={
                "worker_queue": self.cache.queue,
                "cached": self.cache.queue is not None and req.prior.count > 0 and not rebuilt})
        shown = items if req.summary is None or summary is None \
            else ctx.with_summary(items, req.summary.count, *pack([ctx.summary_item(summary)]))
        sent, trimmed = _fit(req, shown, progress)
        streamed: Streamed | None = None
        try:
            # `timeout` bounds each wait for the provider (silence); `answer_seconds` the
            # whole answer, however steadily its tokens arrive.
            async with asyncio.timeout(req.answer_seconds):
                body, streamed = await self._send(req, wf_id, sent, timeout, progress)
        except TimeoutError:
            raise _answer_too_long(req, progress) from None
        turn = _parse(req, body)
        size = json_bytes(turn.model_dump(mode="json"))
        if size > MAX_TURN_BYTES:
            raise ApplicationError(
                f"model step {req.step}: response is {size} bytes, over the "
                f"{MAX_TURN_BYTES}-byte payload limit", type=errors.MODEL_RESPONSE_TOO_LARGE,
                non_retryable=True)
        self.cache.put(wf_id, req.expected.extend(turn.items), items + pack(turn.items),
                       run_id)
        # This worker's own queue, where this cache is, and whether the request found the
        # conversation in it: the workflow routes the run's next activities by both.
        return turn.model_copy(update={
            "worker_queue": self.cache.queue, "streamed": streamed,
            "cached": self.cache.queue is not None and req.prior.count > 0 and not rebuilt,
            "trimmed": trimmed})

    async def _summarize(self, req: ModelRequest, spec: ctx.Summarize, items: list[Any],
                         previous: str | None, workflow_id: str, timeout: float,
                         progress: _Progress) -> Turn:
        """A summary request (the `summarize` context strategy): the oldest part of the
        conversation as sent (the current summary and the items up to the cut) as one
        transcript, the model's summary of it back, with what it replaces. The cut keeps
        the newest `spec.keep` tool outputs and never parts a call from its output."""
        cut = ctx.summary_cut(items, req.summary, previous, spec)
        if cut is None:
            raise _not_fitted(
                f"no summary lets the request fit the context window {spec.window}: "
                f"the oldest part that may be summarized (all but the newest {spec.keep} "
                "tool outputs) is too large to summarize, or what stays is too large",
                progress)
        start = req.summary.count if req.summary is not None else 0
        head = [ctx.summary_item(previous)] if previous is not None else []
        sent = ctx.summary_input([*head, *items[start:cut]])
        try:
            async with asyncio.timeout(req.answer_seconds):
                body, _ = await self._send(req, workflow_id, pack(sent), timeout, progress,
                                           instructions=ctx.SUMMARY_INSTRUCTIONS)
        except TimeoutError:
            raise _answer_too_long(req, progress) from None
        turn = _parse(req, body)
        self.cache.put_output(spec.key, turn.text)
        activity.logger.info("conversation summarized", extra={
            "step": req.step, "items": cut, "summary_bytes": len(turn.text.encode())})
        return ctx.summarized_turn(items, cut, turn, spec, json_bytes(sent))

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

    async def _send(self, req: ModelRequest, workflow_id: str, items: Packed,
                    seconds: float, progress: _Progress, instructions: str | None = None,
                    ) -> tuple[Any, Streamed | None]:
        """POST the request with the SDK's client (auth, base URL, error types) and return
        the parsed JSON body. The body is built here and sent as bytes: the SDK's per-item
        type transform of `input` costs O(conversation) on the event loop each step
        (docs/benchmarks.md), and the Responses API's `input` is the cached items' bytes
        joined, not encoded again (docs/benchmarks-long-runs.md)."""
        headers = {"Idempotency-Key": model_idempotency_key(
            req.key_scope or workflow_id, req.step, summary=req.summarize is not None)}
        instructions = instructions or req.instructions
        missing = self._registry.unknown([n for n in req.tools
                                          if n not in {d.name for d in req.mcp_tools}])
        if missing:
            raise _tools_not_served(missing, progress)
        tools = self._definitions(req)
        body: dict[str, Any] = {"model": req.model}
        if req.api == "chat":
            # Chat's messages are rendered from the items each request: what a request
            # sends is bounded by the model's context window, where the Responses input
            # is the whole cached conversation joined.
            path, key = "/chat/completions", "messages"
            conversation = compact_json(to_chat_messages(unpack(items), instructions)).encode()
        else:
            path, key, conversation = "/responses", "input", json_array(items)
            body.update(store=False, include=["reasoning.encrypted_content"])
            if instructions:
                body["instructions"] = instructions
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
        progress.sent = True  # from here on the provider may be answering: it is charged
        activity.heartbeat(*progress.details())
        try:
            raw = await self._client.post(path, cast_to=httpx.Response,
                                          content=_body(body, key, conversation),
                                          options={"headers": headers, "timeout": seconds})
            if req.stream:
                return await self._read(req, raw, seconds, progress)
        except openai.APIError as exc:
            progress.sent = _reached(exc)
            error = to_application_error(exc, seconds, progress.details())
            failure = ModelFailure.from_details(error.details)
            activity.logger.warning("model request failed", extra={
                "step": req.step, "error": type(exc).__name__,
                "failure": failure.kind if failure else None, "detail": error.message})
            raise error from None
        return _json(raw.content), None

    async def _read(self, req: ModelRequest, raw: httpx.Response, seconds: float,
                    progress: _Progress) -> tuple[Any, Streamed | None]:
        """The body of a streamed answer, assembled as the unstreamed request returns it;
        its text is published to the run's stream as it comes, by a task of its own that
        the reading never waits for (docs/streaming.md). A provider that answered without
        streaming (JSON, not events) is read as JSON."""
        if not raw.headers.get("content-type", "").startswith("text/event-stream"):
            return _json(await raw.aread()), None
        info = activity.info()
        attempt = f"{info.activity_id}.{info.attempt}"
        fold: ChatStream | ResponsesStream = ChatStream() if req.api == "chat" \
            else ResponsesStream()
        parser = SSEParser()
        text = _TextStream(WorkflowStreamClient.from_within_activity(), req.step, attempt)
        if info.attempt > 1:  # the attempt before this one died (its worker was lost)
            text.reset(Reset(step=req.step, attempt=f"{info.activity_id}.{info.attempt - 1}"))
        async with text:
            try:
                async for chunk in raw.aiter_bytes():
                    progress.output_bytes += len(chunk)
                    for data in parser.feed(chunk):
                        text.add(fold.event(data))
                        if fold.error is not None:
                            raise _stream_error(req.step, fold.error.code, progress)
            except httpx.TimeoutException:  # silence: no byte for `seconds`
                raise to_application_error(openai.APITimeoutError(raw.request), seconds,
                                           progress.details()) from None
            except httpx.TransportError:
                pass  # cut: a cut body is a protocol fault, as unstreamed
            finally:
                await raw.aclose()
        return fold.result(), Streamed(attempt=attempt, publisher=text.publisher_id)


def _parse(req: ModelRequest, body: Any) -> Turn:
    return parse_chat(body, req.step) if req.api == "chat" else parse_responses(body)


def _not_fitted(detail: str, progress: _Progress) -> ApplicationError:
    """The request is not sent: no stub or summary makes it fit the window. An expected
    end of the run (`context_exhausted`, logged as one line by the workflow), not a
    fault: benign, never retried."""
    failure = ModelFailure(kind=mf.CONTEXT_NOT_FITTED, detail=detail)
    return ApplicationError(failure.detail, failure.model_dump(), *progress.details(),
                            type=errors.MODEL_REQUEST_REJECTED, non_retryable=True,
                            category=ApplicationErrorCategory.BENIGN)


def _body(fields: dict[str, Any], key: str, conversation: bytes) -> bytes:
    """The request's JSON: `fields` and the conversation's JSON array as `key`, the bytes
    the SDK would send for them (compact, non-ASCII literal)."""
    head = compact_json(fields).encode()
    return b"%s,\"%s\":%s}" % (head[:-1], key.encode(), conversation)


def _fit(req: ModelRequest, items: Packed, progress: _Progress
         ) -> tuple[Packed, Trimmed | None]:
    """The items to send: under the `trim` context strategy, with old tool outputs as
    stubs so the request fits the window (the cache keeps them whole). A request that
    cannot fit is never sent: the run ends `context_exhausted`."""
    if req.trim is None:
        return items, None
    at, outputs = tool_outputs(items)
    size = sum(map(len, items)) + max(0, len(items) - 1) + 2  # json_array(items)'s bytes
    fitted = trim_outputs([(item, len(items[i])) for i, item in zip(at, outputs,
                                                                   strict=True)], size,
                          req.trim)
    if fitted is None:
        raise _not_fitted(
            f"the request does not fit the context window {req.trim.window} even with "
            f"every tool output but the newest {req.trim.keep} trimmed: not sent", progress)
    stubs, trimmed = fitted
    # Only the stubs are encoded: every other item is sent as the cache holds it.
    sent = list(items)
    for index, short in zip(at, stubs, strict=False):
        sent[index] = compact_json(short).encode()
    return tuple(sent), trimmed if trimmed.outputs else None


class _Progress:
    """How far one attempt got: whether its request went out (from then on the provider
    may be answering, and the run is charged for it whatever becomes of the attempt)."""

    def __init__(self) -> None:
        self.sent = False
        self.output_bytes = 0

    def details(self) -> tuple[Any, ...]:
        return (mf.Charge(sent=self.sent, output_bytes=self.output_bytes).model_dump(),)


def _reached(exc: openai.APIError) -> bool:
    """Whether a failed request reached a provider that may have worked on it: not one it
    refused with an HTTP status, nor one that never connected."""
    if isinstance(exc, openai.APIStatusError):
        return False
    if isinstance(exc, openai.APITimeoutError):
        return not isinstance(exc.__cause__, httpx.ConnectTimeout | httpx.PoolTimeout)
    return False  # a connection failure before any answer


def _answer_too_long(req: ModelRequest, progress: _Progress) -> ApplicationError:
    """The answer outlived `answer_seconds` (limits.model_answer_seconds) while its tokens
    kept coming: a timeout like silence is, counted and retried."""
    seconds = req.answer_seconds or 0.0
    failure = ModelFailure(kind=mf.TIMEOUT, detail=f"model step {req.step}: the answer was "
                           f"not finished after {seconds:g} s (model_answer_seconds)")
    activity.logger.warning("model answer too long", extra={"step": req.step,
                                                             "seconds": seconds})
    return ApplicationError(failure.detail, failure.model_dump(), *progress.details(),
                            type=errors.MODEL_REQUEST_RETRYABLE)


class _TextStream:
    """The answer text of one attempt on its way to the run's stream: best effort and
    bounded. `add` only appends to a buffer (the reading of the provider's stream never
    waits); a task of its own sends the buffer as one signal when the next is due
    (STREAM_FIRST, doubling up to STREAM_EVERY_MAX, at most STREAM_SIGNALS_MAX). Text a
    signal could not carry, or that was still on its way when the answer ended, is
    published by the workflow from the answer itself (it knows what its stream holds)."""

    def __init__(self, publisher: WorkflowStreamClient, step: int, attempt: str) -> None:
        self._publisher = publisher
        self._topic = publisher.topic(STREAM_TOPIC)
        self._step, self._attempt = step, attempt
        self._text: collections.deque[str] = collections.deque()
        self._resets: list[Reset] = []
        self._total = 0  # bytes taken in
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def publisher_id(self) -> str:
        # The stream's own dedup id for this publisher: the workflow closes it once the
        # answer is in (a signal still on its way is dropped, not appended twice).
        return self._publisher._publisher_id

    def add(self, text: str) -> None:
        if not text:
            return
        size = len(text.encode("utf-8", "surrogatepass"))
        # Past the size an answer may have, text is not streamed: the answer will be
        # refused as too large, and its text would only grow history.
        if self._total + size > MAX_TURN_BYTES:
            return
        self._total += size
        self._text.append(text)
        self._ready.set()

    def reset(self, item: Reset) -> None:
        self._resets.append(item)
        self._ready.set()

    async def __aenter__(self) -> _TextStream:
        self._task = asyncio.create_task(self._send_due())
        return self

    async def __aexit__(self, *_exc: object) -> None:
        # Not awaited to the end: the answer is in, a signal on its way goes or not.
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _send_due(self) -> None:
        wait = STREAM_FIRST
        for _ in range(STREAM_SIGNALS_MAX):
            await self._ready.wait()
            await asyncio.sleep(wait)  # the batch fills meanwhile
            self._ready.clear()
            for item in self._take():
                self._topic.publish(item)
            try:
                await self._publisher.flush()  # one signal (or a retry of a failed one)
            except Exception as exc:  # the run is slow or gone: the workflow fills in
                activity.logger.debug("stream batch not sent", extra={
                    "step": self._step, "error": type(exc).__name__})
            wait = min(wait * 2, STREAM_EVERY_MAX)

    def _take(self) -> list[Reset | TextDelta]:
        """The resets, then at most STREAM_BATCH_BYTES of text in STREAM_PIECE pieces."""
        out: list[Reset | TextDelta] = [*self._resets]
        self._resets = []
        text, size = "", 0
        while self._text and size < STREAM_BATCH_BYTES:
            piece = self._text.popleft()
            text += piece
            size += len(piece.encode("utf-8", "surrogatepass"))
        if self._text:
            self._ready.set()  # more than a batch: the next one is due too
        out += [TextDelta(step=self._step, attempt=self._attempt,
                          text=text[start:start + STREAM_PIECE])
                for start in range(0, len(text), STREAM_PIECE)]
        return out


def _json(content: bytes) -> Any:
    try:
        return json.loads(content)
    except (ValueError, RecursionError):  # bad JSON, bad UTF-8, >4300-digit ints
        return None  # the core turns a non-object body into a protocol fault


def _stream_error(step: int, code: str | None, progress: _Progress) -> ApplicationError:
    """An error event mid-stream: the provider failed after answering 200, which is a
    server error like a 5xx (retried, counted); its message stays out of history."""
    failure = ModelFailure(kind=mf.http_kind(500),
                           detail=f"model step {step}: the provider sent an error event "
                                  f"mid-stream (code {code or 'none'})")
    activity.logger.warning("model stream failed", extra={"step": step, "code": code})
    return ApplicationError(failure.detail, failure.model_dump(), *progress.details(),
                            type=errors.MODEL_REQUEST_RETRYABLE)
