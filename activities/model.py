"""The model activity: one model request per activity (SPEC §2), both OpenAI APIs.

The SDK client runs with `max_retries=0`; Temporal's retry policy is the only retry
layer (activities/model_errors.py). Each request carries an `Idempotency-Key` header
derived from the workflow id and the step. The raw response body is parsed by the pure
core (`boundloop.core.turn`), so malformed output becomes a typed fault, not a crash.
"""

from __future__ import annotations

import json
from typing import Any, cast

import openai
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.conversation import ConversationCache, rebuild
from activities.model_errors import to_application_error
from boundloop.contracts import MODEL_ACTIVITY, ModelRequest
from boundloop.core.canonical import json_bytes
from boundloop.core.conversation import meta_of, to_chat_messages
from boundloop.core.turn import Turn, parse_chat, parse_responses
from boundloop.settings import Settings
from boundloop.tools.registry import ToolRegistry

#: Stay under Temporal's 2 MB payload limit with room for the envelope.
MAX_TURN_BYTES = 1_500_000


def model_idempotency_key(workflow_id: str, step: int) -> str:
    return f"{workflow_id}/model/step-{step}"


class ModelActivities:
    def __init__(self, settings: Settings, registry: ToolRegistry,
                 cache: ConversationCache | None = None) -> None:
        key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
        self._client = openai.AsyncOpenAI(
            api_key=key or "not-needed", base_url=settings.openai_base_url, max_retries=0)
        self._registry = registry
        self.cache = cache or ConversationCache()

    @activity.defn(name=MODEL_ACTIVITY)
    async def model_request(self, req: ModelRequest) -> Turn:
        info = activity.info()
        items = await rebuild(self.cache, activity.client(), req)
        activity.logger.info("model request", extra={
            "step": req.step, "api": req.api, "items": len(items), "attempt": info.attempt})
        body = await self._send(req, items, info.start_to_close_timeout)
        turn = parse_chat(body, req.step) if req.api == "chat" else parse_responses(body)
        size = json_bytes(turn.model_dump(mode="json"))
        if size > MAX_TURN_BYTES:
            raise ApplicationError(
                f"model step {req.step}: response is {size} bytes, over the "
                f"{MAX_TURN_BYTES}-byte payload limit", type="PayloadTooLarge",
                non_retryable=True)
        full = [*items, *turn.items]
        self.cache.put(req.workflow_id, meta_of(full), full)
        return turn

    async def _send(self, req: ModelRequest, items: list[Any], timeout: Any) -> Any:
        headers = {"Idempotency-Key": model_idempotency_key(req.workflow_id, req.step)}
        seconds = timeout.total_seconds() if timeout else 60.0
        tools = self._registry.openai_tools(req.tools, req.api)
        extra: dict[str, Any] = {"tools": tools, "tool_choice": req.tool_choice} if tools else {}
        try:
            if req.api == "chat":
                raw = await self._client.chat.completions.with_raw_response.create(
                    model=req.model, messages=cast(Any, to_chat_messages(items, req.instructions)),
                    extra_headers=headers, timeout=seconds, **extra)
            else:
                if req.instructions:
                    extra["instructions"] = req.instructions
                raw = await self._client.responses.with_raw_response.create(
                    model=req.model, input=items, store=False,
                    include=["reasoning.encrypted_content"], extra_headers=headers,
                    timeout=seconds, **extra)
        except openai.APIError as exc:
            activity.logger.warning("model request failed", extra={
                "step": req.step, "error": type(exc).__name__,
                "status": getattr(exc, "status_code", None)})
            raise to_application_error(exc) from None
        try:
            return json.loads(raw.content)
        except (ValueError, RecursionError):  # bad JSON, bad UTF-8, >4300-digit ints
            return None  # the core turns a non-object body into a protocol fault
