"""The tool activity: one tool execution per activity, result capped inside it.

Expected failures (`ToolFailure`) become envelopes. A tool's own failures - it raised
`TransientToolError`, it raised something unexpected, it ran past its timeout - are
raised as typed `ApplicationError`s the workflow counts against the tool's attempts;
only attempts lost to a dead worker are retried by Temporal itself (docs/durability.md,
"Crashes and retries"). An unexpected exception is logged on the worker with its
traceback (frames; the exception's message only when the operator opts in, since it may
hold raw data) and raised without its message or cause (`from None`), so no exception
text reaches history, the model or the RunResult.

Every failure says in its details whether the tool's body started (`{"started": ...}`),
and so do the heartbeats: the workflow counts a tool execution only when it did.
`async` tools are awaited on the worker's event loop (a cancel or timeout cancels
them); sync tools run on the worker's own bounded threads (activities/threads.py).
A tool from an MCP server (`req.mcp`, the run's declaration of it) is one `tools/call`
on the worker's `MCPPool` session, under the same failure types, heartbeats and cap.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from boundloop.activities.conversation import ConversationCache, from_history
from boundloop.activities.heartbeat import heartbeating
from boundloop.activities.threads import ToolThreads
from boundloop.contracts import TOOL_ACTIVITY, ToolRequest
from boundloop.core.canonical import MAX_DEPTH, compact_json, nesting_depth, preview
from boundloop.core.context import RECALL_TOOL
from boundloop.core.envelope import (
    Envelope,
    cap_envelope,
    invalid_input,
    result_too_large,
    success,
    unserializable_result,
)
from boundloop.core.fingerprint import fingerprint
from boundloop.core.loop import ToolOutcome, parse_arguments, validation_problems
from boundloop.core.mcp_tools import MCPToolDeclaration
from boundloop.errors import (
    TOOL_ARGUMENTS_CHANGED,
    TOOL_TIMED_OUT,
    TOOL_UNAVAILABLE,
    TRANSIENT_TOOL_ERROR,
    UNEXPECTED_TOOL_ERROR,
    ToolFailure,
    TransientToolError,
)
from boundloop.logs import traceback_text
from boundloop.mcp.pool import MCPPool
from boundloop.tools.registry import ToolContext, Toolset, ToolSpec


def _output_of(items: list[dict[str, Any]], call_id: str) -> str | None:
    """The output of the latest call `call_id` among `items` (Chat may reuse ids)."""
    for item in reversed(items):
        if item.get("type") == "function_call_output" and item.get("call_id") == call_id:
            return str(item.get("output", ""))
    return None


class ToolActivities:
    """`deps` is handed to every tool as `ctx.deps`. `log_error_messages` adds the
    exception messages to the traceback logged for an unexpected exception. `threads`
    run the sync tools."""

    def __init__(self, registry: Toolset[Any], deps: Any,
                 cache: ConversationCache | None = None, *, threads: ToolThreads,
                 log_error_messages: bool = False, mcp: MCPPool | None = None) -> None:
        self._registry = registry
        self._mcp = mcp
        self._deps = deps
        self._cache = cache
        self._threads = threads
        self._log_error_messages = log_error_messages

    @activity.defn(name=TOOL_ACTIVITY)
    async def tool_execute(self, req: ToolRequest) -> ToolOutcome:
        if req.mcp is not None:
            self._check_mcp_served(req.mcp)
            return self._outcome(req, await self._mcp_call(req, req.mcp))
        if req.tool == RECALL_TOOL and req.tool not in self._registry.names():
            return self._outcome(req, await self._recall(req))
        if req.tool not in self._registry.names():
            raise ApplicationError(
                f"this worker does not serve the tool {req.tool!r} (its toolset has "
                f"{', '.join(self._registry.names())})", type=TOOL_UNAVAILABLE,
                non_retryable=True)
        spec = self._registry.get(req.tool)
        if req.parameters_digest is not None \
                and spec.schema_digest != req.parameters_digest:
            # A compatible change (an optional argument added, a bound widened) keeps the
            # admitted, perhaps approved, call valid: it runs as decided. Only a call the
            # new schema refuses is unavailable, and the message says why.
            try:
                parse_arguments(spec.args_model, compact_json(req.arguments))
            except ValidationError as exc:
                raise ApplicationError(
                    f"{req.tool}'s arguments changed since the run was admitted, and this "
                    f"call no longer fits them: {validation_problems(exc)}",
                    type=TOOL_ARGUMENTS_CHANGED, non_retryable=True) from None
        fp = fingerprint(req.tool, req.arguments)
        log = {"tool": req.tool, "step": req.step, "fingerprint": fp,
               "attempt": activity.info().attempt}
        started = threading.Event()
        stopped = threading.Event()  # the attempt is over: cancelled or timed out
        timeout = req.timeout_seconds or spec.timeout.total_seconds()

        def details() -> tuple[Any, ...]:
            return ({"started": started.is_set()},)

        local = activity.info().is_local

        def beat(*extra: Any) -> None:  # a tool's own heartbeat keeps ours first
            if not local:  # a local activity has no one to tell
                activity.heartbeat(*details(), *extra)

        def failure(message: str, type_: str) -> ApplicationError:
            # A transient failure or a timeout is expected (retried, logged in one line
            # here): Temporal's benign category keeps the SDK from logging a traceback.
            return ApplicationError(message, *details(), type=type_,
                                    category=ApplicationErrorCategory.BENIGN)

        async with heartbeating(details):
            try:
                args = parse_arguments(spec.args_model, compact_json(req.arguments))
                ctx = ToolContext(deps=self._deps, idempotency_key=req.idempotency_key,
                                  workflow_id=activity.info().workflow_id or "",
                                  call_id=req.call_id, step=req.step,
                                  max_result_bytes=req.max_result_bytes, heartbeat=beat,
                                  is_cancelled=stopped.is_set)
                data = await self._call(spec, spec.bind(args, ctx), started, stopped,
                                        timeout, log)
            except ToolFailure as exc:
                envelope = exc.envelope
            except TransientToolError:
                activity.logger.warning("tool transient failure", extra=log)
                raise failure(f"{req.tool}: transient failure", TRANSIENT_TOOL_ERROR) from None
            except TimeoutError:
                raise failure(f"{req.tool}: timed out after {timeout:g} s",
                              TOOL_TIMED_OUT) from None
            except Exception as exc:
                # The traceback is in the message too, so any logging setup shows it (frames
                # and types only, unless the operator opted into messages).
                trace = traceback_text(exc, messages=self._log_error_messages)
                activity.logger.error(f"tool raised unexpectedly\n{trace}", extra={
                    **log, "error": type(exc).__name__, "traceback": trace})
                raise ApplicationError(f"{req.tool} raised {type(exc).__name__}",
                                       *details(), type=UNEXPECTED_TOOL_ERROR) from None
            else:
                envelope = success(data, terminal=spec.terminal)
                try:
                    envelope.output_bytes()
                except Exception as exc:  # anything JSON cannot carry
                    # The body ran (its side effect is done): running it again cannot
                    # fix what it returned, so the run stops with tool_error, once.
                    activity.logger.error("tool returned a value JSON cannot carry",
                                          extra={**log, "error": type(exc).__name__})
                    return ToolOutcome(envelope=unserializable_result(), fatal=True)
        return self._outcome(req, envelope, log)

    def _check_mcp_served(self, tool: MCPToolDeclaration) -> None:
        """The run's MCP tool is one this worker's servers listed when it started: a deploy
        that removed its server (or a server that no longer lists it) makes the call
        `ToolUnavailable`, never sent, never retried."""
        if self._mcp is None:
            raise ApplicationError(f"this worker has no MCP servers: it does not serve the "
                                   f"tool {tool.name!r}", type=TOOL_UNAVAILABLE,
                                   non_retryable=True)
        try:
            self._mcp.declaration(tool.name)
        except KeyError:
            raise ApplicationError(
                f"this worker's MCP servers do not serve the tool {tool.name!r} (they serve "
                f"{', '.join(d.name for d in self._mcp.declarations()) or 'no tools'})",
                type=TOOL_UNAVAILABLE, non_retryable=True) from None

    async def _recall(self, req: ToolRequest) -> Envelope:
        """The built-in `recall_output` of a run that trims its conversation: an earlier
        tool output, whole, by its call id. From this worker's conversation cache, else
        from the run's event histories (the conversation's source of truth)."""
        call_id = str(req.arguments.get("call_id", ""))
        info = activity.info()
        workflow_id = info.workflow_id or ""
        run_id = info.workflow_run_id or ""
        items = self._cache.conversation(workflow_id, run_id) if self._cache is not None \
            else None
        output = _output_of(items or [], call_id)
        if output is None:
            items, _ = await from_history(activity.client(), workflow_id, run_id, None, None)
            output = _output_of(items, call_id)
        if output is None:
            return invalid_input("UNKNOWN_CALL_ID", f"no earlier tool call of this run has "
                                 f"call_id {preview(call_id, 60)!r}")
        try:
            data: Any = json.loads(output)
        except ValueError:
            data = output
        return success({"call_id": call_id, "output": data})

    def _outcome(self, req: ToolRequest, envelope: Envelope,
                 log: dict[str, Any] | None = None) -> ToolOutcome:
        """The envelope capped at the run's result cap, as the activity's result."""
        log = log or {"tool": req.tool, "step": req.step,
                      "fingerprint": fingerprint(req.tool, req.arguments),
                      "attempt": activity.info().attempt}
        if nesting_depth(envelope.data) > MAX_DEPTH:  # history could not carry it
            activity.logger.error("tool returned a value nested too deeply", extra=log)
            return ToolOutcome(envelope=unserializable_result(), fatal=True)
        # If even RESULT_TOO_LARGE is over the cap, the workflow stops with result_limit.
        capped = cap_envelope(envelope, req.max_result_bytes) or result_too_large(
            envelope.output_bytes(), req.max_result_bytes)
        if capped is not envelope:
            activity.logger.info("tool result over cap", extra=log)
        activity.logger.info("tool executed", extra={**log, "status": capped.status.value})
        if self._cache is None:
            return ToolOutcome(envelope=capped)
        # The next model request refers to this output: it is in this worker's cache.
        self._cache.put_output(req.idempotency_key, capped.to_output())
        queue = self._cache.queue
        moved = req.holder is not None and queue is not None and queue != req.holder \
            and activity.info().is_local
        return ToolOutcome(envelope=capped, worker_queue=queue if moved else None)

    async def _mcp_call(self, req: ToolRequest, tool: MCPToolDeclaration) -> Envelope:
        """One `tools/call` on the worker's session to the tool's server (arguments were
        checked in the workflow; the pool checks them again). Its transport failures are
        counted like any tool's transient failure; the key goes to the server in `_meta`."""
        log = {"tool": req.tool, "step": req.step,
               "fingerprint": fingerprint(req.tool, req.arguments),
               "attempt": activity.info().attempt}
        # Sent to the server from here on: a failed attempt may have run there.
        started = {"started": True}
        if self._mcp is None:
            activity.logger.error("no MCP servers on this worker", extra=log)
            raise ApplicationError(f"{req.tool}: this worker has no MCP servers",
                                   {"started": False}, type=UNEXPECTED_TOOL_ERROR)
        timeout = req.timeout_seconds or tool.timeout_seconds
        async with heartbeating(lambda: (started,)):
            try:
                return await self._mcp.call(tool, req.arguments, req.idempotency_key,
                                            timeout)
            except TransientToolError:
                activity.logger.warning("tool transient failure", extra=log)
                raise ApplicationError(f"{req.tool}: transient failure", started,
                                       type=TRANSIENT_TOOL_ERROR,
                                       category=ApplicationErrorCategory.BENIGN) from None
            except LookupError:  # the run's server is not configured on this worker
                activity.logger.error("MCP server not configured on this worker", extra={
                    **log, "server": tool.server})
                raise ApplicationError(f"{req.tool}: MCP server {tool.server!r} is not "
                                       "configured on this worker", {"started": False},
                                       type=UNEXPECTED_TOOL_ERROR) from None

    async def _call(self, spec: ToolSpec, call: Callable[[], Any], started: threading.Event,
                    stopped: threading.Event, timeout: float, log: dict[str, Any]) -> Any:
        """The tool's body within `timeout`. On a timeout or a cancel, `stopped` is set
        (the tool's `ctx.is_cancelled()`); an async body is cancelled, a sync one that
        already runs keeps its thread until it returns (logged), one still waiting for a
        thread never starts."""
        if spec.is_async:
            started.set()
            try:
                return await asyncio.wait_for(call(), timeout)
            except (TimeoutError, asyncio.CancelledError) as exc:
                stopped.set()
                self._log_stop(exc, log, thread_left=False)
                raise

        def body() -> Any:
            started.set()
            return call()

        future = self._threads.submit(body)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except (TimeoutError, asyncio.CancelledError) as exc:
            stopped.set()
            future.cancel()  # a body still waiting for a thread never starts
            self._log_stop(exc, log, thread_left=not future.done())
            raise

    def _log_stop(self, exc: BaseException, log: dict[str, Any], *, thread_left: bool) -> None:
        what = "tool timed out" if isinstance(exc, TimeoutError) else "tool cancelled"
        if thread_left:
            # Python cannot stop a thread: it runs to its end, seeing is_cancelled() true.
            activity.logger.warning(f"{what}; its thread runs on until the tool returns",
                                    extra={**log, "busy_threads": self._threads.busy,
                                           "threads": self._threads.size})
        else:
            activity.logger.warning(what, extra=log)
