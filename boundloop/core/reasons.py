"""The closed set of stop reasons: exactly one per run."""

from __future__ import annotations

from enum import StrEnum


class StopReason(StrEnum):
    """Why a run ended. `completed` only when no limit or fault cut the run short."""

    COMPLETED = "completed"
    MAX_STEPS = "max_steps"
    MAX_TOOLS = "max_tools"
    MAX_IDENTICAL_CALLS = "max_identical_calls"
    USAGE_LIMIT = "usage_limit"
    USAGE_UNKNOWN = "usage_unknown"
    BUDGET_LIMIT = "budget_limit"
    DEADLINE = "deadline"
    MODEL_ERROR = "model_error"
    INCOMPLETE = "incomplete"
    EMPTY_OUTPUT = "empty_output"
    HISTORY_LIMIT = "history_limit"
    CONTEXT_EXHAUSTED = "context_exhausted"
    RESULT_LIMIT = "result_limit"
    PROTOCOL_ERROR = "protocol_error"
    FORBIDDEN_TOOL = "forbidden_tool"
    TOOL_ERROR = "tool_error"
    APPROVAL_TIMEOUT = "approval_timeout"
    TOOL_UNAVAILABLE = "tool_unavailable"
    MAX_CHILDREN = "max_children"
    MAX_DEPTH = "max_depth"
    CANCELLED = "cancelled"


#: What an operator checks first for each reason (README table and `boundloop status`).
NEXT_CHECK: dict[StopReason, str] = {
    StopReason.COMPLETED: "nothing: the model answered within every limit",
    StopReason.MAX_STEPS: "the step limit ended the run: is the model repeating a "
                          "search? narrow the question or the tools",
    StopReason.MAX_TOOLS: "the batch or a per-tool limit would be passed; raise it or narrow tools",
    StopReason.MAX_IDENTICAL_CALLS: "the model repeated an identical call (or an invalid or "
                                    "rejected one); check the results and messages it got",
    StopReason.USAGE_LIMIT: "known tokens reached the threshold; do not rerun blindly",
    StopReason.USAGE_UNKNOWN: "a response had no usable usage; check provider billing",
    StopReason.BUDGET_LIMIT: "the USD or tool cost budget was reached, or a shared "
                             "budget refused the next request (`boundloop budget show`)",
    StopReason.DEADLINE: "processing time ran out (approval waits excluded)",
    StopReason.MODEL_ERROR: "the model request failed: the event log's model_failed:<kind> "
                            "says why (connection_refused, dns, tls, http_<status>, timeout, "
                            "…) and the CLI prints the hint that fixes it",
    StopReason.INCOMPLETE: ("the answer was cut short: status not completed, or every output "
                            "token of max_output_tokens used (cap, filter)"),
    StopReason.EMPTY_OUTPUT: "the model returned neither text nor tool calls",
    StopReason.HISTORY_LIMIT: "the conversation outgrew max_history_bytes (the event "
                              "history_limit gives its bytes), or the run's record outgrew "
                              "Temporal's payload limit (event payload_too_large:*)",
    StopReason.CONTEXT_EXHAUSTED: ("the next request would not fit the model's context "
                                   "window (max_input_tokens), or the provider refused it as "
                                   "too long: the event context_exhausted (estimate vs window) "
                                   "or model_failed:context_length_exceeded says which; "
                                   "shorten the tool results or the question"),
    StopReason.RESULT_LIMIT: "even the error envelope exceeds max_result_bytes, or a tool's "
                             "result passed Temporal's payload limit (payload_too_large:*)",
    StopReason.PROTOCOL_ERROR: "malformed model output: unknown item, bad or duplicate call id",
    StopReason.FORBIDDEN_TOOL: "the model called a tool outside the allowed set",
    StopReason.TOOL_ERROR: "a tool raised unexpectedly; its traceback is in the worker log, "
                          "in the line with the call's fingerprint",
    StopReason.APPROVAL_TIMEOUT: "nobody decided a pending approval in time",
    StopReason.TOOL_UNAVAILABLE: "the worker that took the call no longer serves its tool "
                                 "as the run was admitted (renamed, removed, or its arguments "
                                 "changed so that the call no longer fits, in a deploy); the "
                                 "event names the tool and why: serve it again, or let the "
                                 "run finish on the old version",
    StopReason.MAX_CHILDREN: "the model called more sub-agents than max_children allows "
                             "(the event subagent_not_started names the call); raise it or "
                             "tell the agent to delegate less",
    StopReason.MAX_DEPTH: "a sub-agent called a sub-agent deeper than max_depth allows; "
                          "raise it or flatten the tree",
    StopReason.CANCELLED: "an operator cancelled the run",
}
