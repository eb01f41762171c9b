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

from collections.abc import Callable

from boundloop.core.loop import LoopState
from boundloop.core.reasons import StopReason

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

