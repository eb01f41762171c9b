"""The model's context window as a limit: estimate a request's input tokens, and stop
before sending one that would not fit. Pure: no Temporal, no I/O, no tokenizer.

The estimate needs no tokenizer download. After a response whose usage the provider
reported, the next request is that request and its answer (the tokens the provider
counted for both) plus what was added since (tool results, a user message), at
BYTES_PER_TOKEN UTF-8 bytes a token. Before the first response, or after one with no
usage, it is every byte of the request at that ratio: the instructions, the tool
declarations and the conversation's JSON.

Four bytes a token is what English text and JSON average on the common tokenizers; it
counts the conversation's JSON punctuation as tokens, which most of it is not, so it
errs high for English. For text in scripts of three UTF-8 bytes a character (Japanese,
Chinese) it can err low: a request the estimate lets through that the provider finds
too long is refused by the provider, and that refusal ends the run `context_exhausted`
too (activities/model_errors.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

from boundloop.core.canonical import json_bytes
from boundloop.core.conversation import Item
from boundloop.core.loop import LoopState
from boundloop.core.mcp_tools import MCPToolDeclaration
from boundloop.core.reasons import StopReason
from boundloop.core.turn import Trimmed

#: UTF-8 bytes counted as one token.
BYTES_PER_TOKEN = 4
#: The event logged when a run stops because its next request would not fit.
EVENT = "context_exhausted"


def _tokens(size: int) -> int:
    return -(-max(0, size) // BYTES_PER_TOKEN)  # rounded up


def estimate_input_tokens(*, conversation_bytes: int, fixed_bytes: int,
                          last_tokens: int | None, last_bytes: int) -> int:
    """The input tokens of the next request, estimated.

    `conversation_bytes`: the conversation's JSON bytes now; `fixed_bytes`: the bytes
    every request carries beside it (instructions, tool declarations); `last_tokens`:
    the input plus output tokens the last response reported (None: no usage known);
    `last_bytes`: the conversation's bytes right after that response.
    """
    if last_tokens is None:
        return _tokens(fixed_bytes + conversation_bytes)
    return last_tokens + _tokens(conversation_bytes - last_bytes)


def over_window(estimate: int, max_output_tokens: int | None, window: int) -> str | None:
    """Why a request of `estimate` input tokens, with room for `max_output_tokens`, does
    not fit `window`, in one line; None when it fits."""
    output = max_output_tokens or 0
    if estimate + output <= window:
        return None
    room = f" + max_output_tokens {output}" if output else ""
    return (f"estimated {estimate} input tokens{room} = {estimate + output} > context "
            f"window {window} (max_input_tokens): the request was not sent")


def estimate(state: LoopState, fixed_bytes: Callable[[], int]) -> int | None:
    """The run's next request's input tokens, estimated; None when the run has no
    context window. `fixed_bytes` is called only when no usage is known yet."""
    if state.limits.max_input_tokens is None:
        return None
    return estimate_input_tokens(
        conversation_bytes=state.conversation.bytes,
        fixed_bytes=fixed_bytes() if state.last_tokens is None else 0,
        last_tokens=state.last_tokens, last_bytes=state.last_bytes)


def check(state: LoopState, fixed_bytes: Callable[[], int]) -> str | None:
    """Whether the run's next request would overflow its context window: the event
    detail when it would, None when it fits or the run has no window."""
    tokens = estimate(state, fixed_bytes)
    window = state.limits.max_input_tokens
    if tokens is None or window is None:
        return None
    return over_window(tokens, state.limits.max_output_tokens, window)


def exhausted(state: LoopState, detail: str) -> StopReason:
    """Stop the run before a request that would not fit (`check`, under the `stop`
    strategy): it was never sent, so it is not a step."""
    state.steps -= 1
    if state.events and state.events[-1].event == "model_requested":
        state.events.pop()  # begin_step logged the request that is not sent
    state.log(EVENT, detail=detail)
    return state.stop(StopReason.CONTEXT_EXHAUSTED)



# --- the `trim` strategy -------------------------------------------------------------

#: The built-in tool a trimmed conversation names to read an old tool output again.
RECALL_TOOL = "recall_output"
#: The event logged when a request is sent with more old tool outputs as stubs.
TRIMMED_EVENT = "context_trimmed"


class RecallArgs(BaseModel):
    """The arguments of RECALL_TOOL."""

    model_config = ConfigDict(extra="forbid")

    call_id: str = Field(min_length=1, max_length=200,
                         description="The call_id of the tool call whose output to read "
                                     "again (named in its trimmed stub)")


RECALL_DESCRIPTION = ("Read again the full output of an earlier tool call whose output was "
                      "left out of the conversation to fit the context window (its output "
                      "says `trimmed`). Counts as a tool call.")


class Trim(BaseModel):
    """What the model activity needs to send a request under the `trim` strategy: the
    window, the newest `keep` tool outputs that stay verbatim, the `trimmed` oldest ones
    already sent as stubs (at least these are again), and the estimate's inputs
    (`estimate_input_tokens`)."""

    window: int
    max_output_tokens: int | None = None
    keep: int
    trimmed: int = 0
    fixed_bytes: int
    last_tokens: int | None = None
    last_bytes: int = 0


def stub(call_id: str, output: str) -> str:
    """What a trimmed tool output says instead of itself: what was there and how to get
    it back."""
    return json.dumps({
        "status": "trimmed", "bytes": len(output.encode("utf-8", "surrogatepass")),
        "message": f"This output was left out to fit the context window. Call "
                   f"{RECALL_TOOL} with call_id {call_id!r} to read it again."},
        ensure_ascii=False)


def _is_output(item: Item) -> bool:
    return item.get("type") == "function_call_output"


def trim_items(items: list[Item], trim: Trim) -> tuple[list[Item], Trimmed] | None:
    """The conversation to send: the `trim.trimmed` oldest tool outputs as stubs (those
    the last request sent so); when that does not fit the window, every output but the
    newest `trim.keep`; None when even that does not fit. Every call keeps an output (a
    stub is one), so the conversation stays valid for both APIs."""
    outputs = [i for i, item in enumerate(items) if _is_output(item)]
    trimmable = outputs[:max(0, len(outputs) - trim.keep)]
    sent = list(items)
    freed = 0

    def replace(index: int) -> None:
        nonlocal freed
        item = items[index]
        short = {"type": "function_call_output", "call_id": item["call_id"],
                 "output": stub(str(item["call_id"]), str(item.get("output", "")))}
        freed += json_bytes(item) - json_bytes(short)
        sent[index] = short

    done = min(trim.trimmed, len(trimmable))
    for index in trimmable[:done]:
        replace(index)
    size = json_bytes(items)

    def tokens() -> int:
        if trim.last_tokens is None:
            return _tokens(trim.fixed_bytes + size - freed)
        # The last request was sent with `trim.trimmed` stubs: its usage counts them.
        return trim.last_tokens + _tokens(size - trim.last_bytes - freed + before_freed)

    before_freed = freed
    before = tokens() if trim.last_tokens is None else trim.last_tokens + _tokens(
        size - trim.last_bytes)
    if over_window(tokens(), trim.max_output_tokens, trim.window) is not None:
        # Every output but the newest `keep` at once: the next requests send the same
        # stubs (a stable prefix) until the window is reached again.
        for index in trimmable[done:]:
            replace(index)
        done = len(trimmable)
        if over_window(tokens(), trim.max_output_tokens, trim.window) is not None:
            return None
    return sent, Trimmed(outputs=done, tokens_before=before, tokens_after=tokens())


def recall_declaration() -> MCPToolDeclaration:
    """RECALL_TOOL as the run declares it to the model (and decides its calls by): read
    only, no approval, its arguments checked against this schema in the workflow."""
    return MCPToolDeclaration(
        name=RECALL_TOOL, server="boundloop", remote_name=RECALL_TOOL,
        description=RECALL_DESCRIPTION, strict=True, needs_approval=False,
        side_effects=False, parameters={
            "type": "object", "additionalProperties": False, "required": ["call_id"],
            "properties": {"call_id": {
                "type": "string", "minLength": 1, "maxLength": 200,
                "description": "The call_id of the tool call whose output to read again "
                               "(named in its trimmed output)"}}})


def uses_recall(state: LoopState) -> bool:
    """The run trims its conversation, so its model gets RECALL_TOOL (unless the run's
    own tools have one of that name)."""
    return state.policy.context == "trim" and state.limits.max_input_tokens is not None


def trims(state: LoopState) -> bool:
    """The run fits its requests to its context window by trimming old tool outputs
    (the `trim` strategy; only runs that chose it, so no patch)."""
    return state.policy.context == "trim" and state.limits.max_input_tokens is not None


def trim_request(state: LoopState, fixed_bytes: int) -> Trim | None:
    """The `trim` of the run's next model request (None: not a trimming run)."""
    window = state.limits.max_input_tokens
    if state.policy.context != "trim" or window is None:
        return None
    return Trim(window=window, max_output_tokens=state.limits.max_output_tokens,
                keep=state.policy.context_keep, trimmed=state.trimmed_outputs,
                fixed_bytes=fixed_bytes, last_tokens=state.last_tokens,
                last_bytes=state.last_bytes)


def note_trimmed(state: LoopState, trimmed: Trimmed | None) -> None:
    """After a response: the request went out with more old outputs as stubs than the one
    before, which the event log says with the estimate before and after."""
    if trimmed is None or trimmed.outputs <= state.trimmed_outputs:
        return
    window = state.limits.max_input_tokens
    state.log(TRIMMED_EVENT, detail=(
        f"{trimmed.outputs - state.trimmed_outputs} more old tool outputs sent as stubs "
        f"({trimmed.outputs} in all): estimated {trimmed.tokens_before} -> "
        f"{trimmed.tokens_after} input tokens, context window {window}"))
    state.trimmed_outputs = trimmed.outputs
