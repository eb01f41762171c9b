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
from collections.abc import Callable, Sequence
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field

from boundloop.core.canonical import json_bytes, sha256_hex
from boundloop.core.conversation import Item, SummaryRef, user_message
from boundloop.core.loop import LoopState, add_usage, estimate_usage
from boundloop.core.mcp_tools import MCPToolDeclaration
from boundloop.core.reasons import StopReason
from boundloop.core.turn import Summarized, Trimmed, Turn

T = TypeVar("T")

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
    # Under `summarize`, what is sent: the summary in place of the oldest items.
    removed = state.summary.removed if state.summary is not None else 0
    return estimate_input_tokens(
        conversation_bytes=state.conversation.bytes - removed,
        fixed_bytes=fixed_bytes() if state.last_tokens is None else 0,
        last_tokens=state.last_tokens, last_bytes=state.last_bytes - removed)


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
    unsent(state)
    state.log(EVENT, detail=detail)
    return state.stop(StopReason.CONTEXT_EXHAUSTED)


def unsent(state: LoopState) -> None:
    """The step begun is not sent: not a step, and its `model_requested` event goes (the
    newest one, before any event of a summary written for it)."""
    for i in range(len(state.events) - 1, -1, -1):
        event = state.events[i]
        if event.step != state.steps:
            break
        if event.event == "model_requested":
            del state.events[i]
            break
    state.steps -= 1


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


def trim_outputs(outputs: Sequence[tuple[Item, int]], size: int, trim: Trim,
                 ) -> tuple[list[Item], Trimmed] | None:
    """The stubs to send in place of the conversation's oldest tool outputs, oldest
    first: of the `trim.trimmed` oldest (those the last request sent so); when that does
    not fit the window, of every output but the newest `trim.keep`; None when even that
    does not fit. `outputs` are the conversation's `function_call_output` items in
    order, each with its JSON bytes, and `size` the whole conversation's JSON bytes.
    Every call keeps an output (a stub is one), so the conversation stays valid for both
    APIs."""
    trimmable = outputs[:max(0, len(outputs) - trim.keep)]
    stubs: list[Item] = []
    freed = 0

    def replace(item: Item, item_bytes: int) -> None:
        nonlocal freed
        short = {"type": "function_call_output", "call_id": item["call_id"],
                 "output": stub(str(item["call_id"]), str(item.get("output", "")))}
        freed += item_bytes - json_bytes(short)
        stubs.append(short)

    done = min(trim.trimmed, len(trimmable))
    for item, item_bytes in trimmable[:done]:
        replace(item, item_bytes)

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
        for item, item_bytes in trimmable[done:]:
            replace(item, item_bytes)
        done = len(trimmable)
        if over_window(tokens(), trim.max_output_tokens, trim.window) is not None:
            return None
    return stubs, Trimmed(outputs=done, tokens_before=before, tokens_after=tokens())


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


# --- the `summarize` strategy --------------------------------------------------------

#: The event logged when a summary replaced the oldest part of the conversation.
SUMMARIZED_EVENT = "context_summarized"
#: A summary may take at most this share of the window (1 / SUMMARY_SHARE).
SUMMARY_SHARE = 4
#: What the summary request asks of the model (its instructions).
SUMMARY_INSTRUCTIONS = (
    "You compact the earlier part of a conversation between a user, an assistant and "
    "the assistant's tools, so that the assistant can continue the task from your "
    "summary and the newer messages alone. Write a concise summary of the transcript "
    "you are given: what the user asked, what was done, every fact, number, name and id "
    "from the tool results that may still matter, and what remains to do. Plain text, "
    "no preamble.")
#: How the summary opens in the conversation sent.
SUMMARY_HEADING = "Summary of the earlier part of this conversation:\n"


class Summarize(BaseModel):
    """A summary request (the `summarize` strategy): `key` names its result, the summary
    may take `summary_tokens`, and the cut keeps the newest `keep` tool outputs whole; the
    cut is chosen so the step's request (`fixed_bytes` beside the conversation, room for
    `max_output_tokens`) fits `window` with the summary in place of the oldest items."""

    key: str
    window: int
    max_output_tokens: int | None = None
    summary_tokens: int
    keep: int
    fixed_bytes: int
    tokens_before: int


def summarizes(state: LoopState) -> bool:
    """The run summarizes the oldest part of its conversation to fit its context window
    (the `summarize` strategy)."""
    return state.policy.context == "summarize" and state.limits.max_input_tokens is not None


def summarize_request(state: LoopState, key: str, fixed_bytes: int) -> Summarize:
    """The summary request of the run's next step: its summary may take a quarter of the
    window, never more than a response may (max_output_tokens)."""
    window = state.limits.max_input_tokens
    assert window is not None
    cap = max(1, window // SUMMARY_SHARE)
    if state.limits.max_output_tokens is not None:
        cap = min(cap, state.limits.max_output_tokens)
    before = estimate(state, lambda: fixed_bytes) or 0
    return Summarize(key=key, window=window, max_output_tokens=state.limits.max_output_tokens,
                     summary_tokens=cap, keep=state.policy.context_keep,
                     fixed_bytes=fixed_bytes, tokens_before=before)


def summary_item(text: str) -> Item:
    """The summary as the conversation sends it: a user message (valid first in both
    APIs, and before a model turn)."""
    return user_message(SUMMARY_HEADING + text)


def text_digest(text: str) -> str:
    """What a SummaryRef checks its summary's text by."""
    return sha256_hex(text)[:32]


def with_summary(items: Sequence[T], count: int, summary: T) -> tuple[T, ...]:
    """The conversation as sent: `summary` (the summary's item, as `items` hold theirs)
    in place of its oldest `count` items."""
    return (summary, *items[count:])


def _is_user(item: Item) -> bool:
    return item.get("type", "message") == "message" and item.get("role") == "user"


def cut_points(items: list[Item], start: int = 0) -> list[int]:
    """Where the conversation may be cut (items[:c] summarized, items[c:] kept), for c
    after `start`: every call before the cut has its output before it and every call
    after has its output after (a function call never loses its output); the cut falls
    between model turns (after a tool output or a user message, or before a user
    message), so reasoning items stay with their calls."""
    points: list[int] = []
    open_calls: set[str] = set()
    for c in range(1, len(items) + 1):
        item = items[c - 1]
        kind = item.get("type")
        if kind == "function_call":
            open_calls.add(str(item.get("call_id")))
        elif kind == "function_call_output":
            open_calls.discard(str(item.get("call_id")))
        nxt = items[c] if c < len(items) else None
        between = kind == "function_call_output" or _is_user(item) or (
            nxt is not None and _is_user(nxt))
        if c > start and not open_calls and between and (
                nxt is None or nxt.get("type") != "function_call_output"):
            points.append(c)
    return points


def transcript(items: list[Item]) -> str:
    """The items to summarize as plain text (the summary request sends them as one user
    message, so it is valid on both APIs whatever it holds); reasoning items are
    encrypted and left out."""
    lines: list[str] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            content = item.get("content")
            text = content if isinstance(content, str) else "".join(
                str(p.get("text", "")) for p in content or [] if isinstance(p, dict))
            lines.append(f"[{item.get('role', 'user')}] {text}")
        elif kind == "function_call":
            lines.append(f"[assistant called {item.get('name')} "
                         f"(call {item.get('call_id')})] {item.get('arguments')}")
        elif kind == "function_call_output":
            lines.append(f"[tool result of call {item.get('call_id')}] {item.get('output')}")
    return "\n\n".join(lines)


def summary_input(items: list[Item]) -> list[Item]:
    """The summary request's conversation: the transcript as one user message."""
    return [user_message("Summarize this transcript:\n\n" + transcript(items))]


def summary_cut(items: list[Item], ref: SummaryRef | None, previous: str | None,
                spec: Summarize) -> int | None:
    """Where to cut the conversation for a summary: as late as keeps the newest
    `spec.keep` tool outputs whole and lets the summary request (the current summary and
    the items up to the cut) fit the window; None when there is none, or when even then
    the step's request would not fit with a summary of `spec.summary_tokens`."""
    start = ref.count if ref is not None else 0
    outputs = [i for i, item in enumerate(items) if item.get("type") == "function_call_output"]
    keep = min(spec.keep, len(outputs))
    limit = outputs[-keep] if keep else len(items)
    head = [summary_item(previous)] if ref is not None and previous is not None else []
    for c in reversed([c for c in cut_points(items, start) if c <= limit]):
        asked = _tokens(len(SUMMARY_INSTRUCTIONS.encode("utf-8"))
                        + json_bytes(summary_input([*head, *items[start:c]])))
        if asked + spec.summary_tokens > spec.window:
            continue
        # A later cut keeps less: if this one leaves no room, no cut does.
        room = spec.summary_tokens * BYTES_PER_TOKEN
        after = _tokens(spec.fixed_bytes + json_bytes(
            [summary_item(""), *items[c:]]) + room)
        if over_window(after, spec.max_output_tokens, spec.window) is not None:
            return None
        return c
    return None


def summarized_turn(items: list[Item], cut: int, turn: Turn, spec: Summarize,
                    input_bytes: int) -> Turn:
    """The summary request's answer, with what its summary replaces (`Turn.summarized`)."""
    sent = [summary_item(turn.text), *items[cut:]]
    size = json_bytes(sent)
    return turn.model_copy(update={"summarized": Summarized(
        count=cut, removed=json_bytes(items) - size, tokens_before=spec.tokens_before,
        tokens_after=_tokens(spec.fixed_bytes + size), input_bytes=input_bytes)})


def note_summarized(state: LoopState, turn: Turn, spec: Summarize) -> StopReason | None:
    """After the summary request answered: its usage counts in the run's totals as a
    step's does, under the same limits; the summary replaces the oldest part of the
    conversation in every request from now on (recorded, with the event). A stop here
    leaves the step's own request unsent."""
    done = turn.summarized
    usage = turn.usage
    if usage is None:
        state.usage.unknown_steps += 1
        if state.policy.missing_usage == "stop":
            unsent(state)
            return state.stop(StopReason.USAGE_UNKNOWN)
        usage = estimate_usage(done.input_bytes if done is not None else 0,
                               turn.output_bytes)
        state.usage.estimated = True
    add_usage(state, usage)
    if turn.fault is not None:  # malformed, as a step's answer would be
        unsent(state)
        state.log("protocol_fault", detail=f"the summary request: {turn.fault}")
        return state.stop(StopReason.PROTOCOL_ERROR)
    if done is None or not turn.text.strip():
        unsent(state)
        state.log(EVENT, detail="the summary request brought no summary: the request "
                                "was not sent")
        return state.stop(StopReason.CONTEXT_EXHAUSTED)
    state.summary = SummaryRef(key=spec.key, count=done.count, digest=text_digest(turn.text),
                               removed=done.removed)
    state.summaries += 1
    state.last_tokens = None  # the next estimate is what is sent, by its bytes
    budget = state.limits.usd_budget
    stop = (StopReason.USAGE_LIMIT if state.usage.total_tokens >= state.limits.token_threshold
            else StopReason.BUDGET_LIMIT if budget is not None and state.cost_usd >= budget
            else None)
    if stop is not None:
        unsent(state)  # first: the summary's event is of the last step sent, as the stop's
    state.log(SUMMARIZED_EVENT, detail=(
        f"{done.tokens_before} tokens before, {done.tokens_after} after (estimated): the "
        f"oldest {done.count} items of the conversation replaced by a summary, context "
        f"window {spec.window}"))
    return state.stop(stop) if stop is not None else None
