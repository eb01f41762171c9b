"""The tool activity: one tool execution per activity, result capped inside it.

Expected failures (`ToolFailure`) become envelopes; `TransientToolError` is retried by
Temporal; anything else is logged on the worker with its traceback (frames; the
exception's message only when the operator opts in, since it may hold raw data) and
raised without its message or cause (`from None`), so no exception text reaches
history, the model or the RunResult.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.conversation import ConversationCache
from boundloop.contracts import TOOL_ACTIVITY, ToolRequest
from boundloop.core.canonical import compact_json
from boundloop.core.envelope import cap_envelope, result_too_large, success
from boundloop.core.fingerprint import fingerprint
from boundloop.core.loop import ToolOutcome, parse_arguments
from boundloop.errors import (
    TRANSIENT_TOOL_ERROR,
    UNEXPECTED_TOOL_ERROR,
    ToolFailure,
    TransientToolError,
)
from boundloop.logs import traceback_text
from boundloop.tools.registry import ToolContext, Toolset


class ToolActivities:
    """`deps` is handed to every tool as `ctx.deps`. `log_error_messages` adds the
    exception messages to the traceback logged for an unexpected exception."""

    def __init__(self, registry: Toolset[Any], deps: Any,
                 cache: ConversationCache | None = None, *,
                 log_error_messages: bool = False) -> None:
        self._registry = registry
        self._deps = deps
        self._cache = cache
        self._log_error_messages = log_error_messages

    @activity.defn(name=TOOL_ACTIVITY)
    async def tool_execute(self, req: ToolRequest) -> ToolOutcome:
        spec = self._registry.get(req.tool)
        fp = fingerprint(req.tool, req.arguments)
        log = {"tool": req.tool, "step": req.step, "fingerprint": fp,
               "attempt": activity.info().attempt}
        args = parse_arguments(spec.args_model, compact_json(req.arguments))
        ctx = ToolContext(deps=self._deps, idempotency_key=req.idempotency_key,
                          workflow_id=activity.info().workflow_id or "",
                          call_id=req.call_id, step=req.step,
                          max_result_bytes=req.max_result_bytes, heartbeat=activity.heartbeat,
                          is_cancelled=activity.is_cancelled)
        call = spec.bind(args, ctx)
        try:
            data = await call() if spec.is_async else await asyncio.to_thread(call)
            envelope = success(data, terminal=spec.terminal)
        except ToolFailure as failure:
            envelope = failure.envelope
        except TransientToolError:
            activity.logger.warning("tool transient failure", extra=log)
            raise ApplicationError(f"{req.tool}: transient failure",
                                   type=TRANSIENT_TOOL_ERROR) from None
        except Exception as exc:
            activity.logger.error("tool raised unexpectedly", extra={
                **log, "error": type(exc).__name__,
                "traceback": traceback_text(exc, messages=self._log_error_messages)})
            raise ApplicationError(f"{req.tool} raised {type(exc).__name__}",
                                   type=UNEXPECTED_TOOL_ERROR) from None
        # If even RESULT_TOO_LARGE is over the cap, the workflow stops with result_limit.
        capped = cap_envelope(envelope, req.max_result_bytes) or result_too_large(
            envelope.output_bytes(), req.max_result_bytes)
        if capped is not envelope:
            activity.logger.info("tool result over cap", extra=log)
        activity.logger.info("tool executed", extra={**log, "status": capped.status.value})
        if self._cache is not None:  # the next model request refers to this output
            self._cache.put_output(req.idempotency_key, capped.to_output())
        return ToolOutcome(envelope=capped)
