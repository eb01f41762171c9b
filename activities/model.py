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

import json
from typing import Any

import httpx2 as httpx
import openai
from temporalio import activity
from temporalio.exceptions import ApplicationError

from boundloop import errors
from boundloop.activities.conversation import ConversationCache, rebuild
from boundloop.activities.heartbeat import heartbeating
from boundloop.activities.model_errors import to_application_error
from boundloop.contracts import MODEL_ACTIVITY, ModelRequest
from boundloop.core.canonical import json_bytes
from boundloop.core.conversation import to_chat_messages
from boundloop.core.limits import MAX_TURN_BYTES
from boundloop.core.model_failures import ModelFailure
from boundloop.core.turn import Turn, parse_chat, parse_responses
from boundloop.tools.registry import Toolset


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
        # The run's next activities go to this worker's own queue, where this cache is.
        return turn.model_copy(update={"worker_queue": self.cache.queue})

    def _definitions(self, req: ModelRequest) -> list[dict[str, Any]]:
        """The function definitions of the run's tools, in its order: function tools from
        this worker's toolset, MCP tools from the declarations the run started with."""
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
        try:
            raw = await self._client.post(path, cast_to=httpx.Response, body=body,
                                          options={"headers": headers, "timeout": seconds})
        except openai.APIError as exc:
            error = to_application_error(exc, seconds)
            failure = ModelFailure.from_details(error.details)
            activity.logger.warning("model request failed", extra={
                "step": req.step, "error": type(exc).__name__,
                "failure": failure.kind if failure else None, "detail": error.message})
            raise error from None
        try:
            return json.loads(raw.content)
        except (ValueError, RecursionError):  # bad JSON, bad UTF-8, >4300-digit ints
            return None  # the core turns a non-object body into a protocol fault
