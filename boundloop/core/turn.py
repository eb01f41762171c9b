"""Normalise raw model responses into one `Turn` (Responses API and Chat Completions).

The response body is untrusted input: these functions never raise on any JSON value.
A body they cannot make sense of yields a `Turn` with a `fault` (-> `protocol_error`).
Decisions use the presence of tool calls, never `finish_reason`.

Conversation items are kept in Responses API form (`message`, `reasoning`,
`function_call`, `function_call_output`); `boundloop.core.conversation` renders them
as Chat Completions messages when that API is used.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from boundloop.core.canonical import MAX_DEPTH, compact_json, json_bytes, nesting_depth, preview

KNOWN_ITEM_TYPES = frozenset({"message", "reasoning", "function_call"})

#: The name written in history for a call the model sent without a function name: both
#: APIs refuse an empty name in a replayed call, so the conversation keeps this
#: placeholder while the loop sees the call as nameless (`Turn.unnamed`) and never
#: executes it, whatever tool happens to be registered under this name (docs/quirks.md).
MISSING_NAME = "missing_function_name"

#: A UTF-16 surrogate code point: `json.loads` yields one for an unpaired `\ud800` escape,
#: and no UTF-8 encoder accepts it.
_SURROGATE = re.compile("[\ud800-\udfff]")


class FunctionCall(BaseModel):
    """One proposed call. `arguments` is always a string (objects are serialised)."""

    model_config = ConfigDict(frozen=True)

    call_id: str
    name: str
    arguments: str
    truncated: bool = False  # Chat `finish_reason: "length"`: never executed


class Usage(BaseModel):
    """Token counts of one response; None fields mean the provider did not say."""

    model_config = ConfigDict(frozen=True)

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0


class Streamed(BaseModel):
    """Which attempt streamed a turn's text, and its publisher's id in the run's stream:
    the workflow publishes what of the answer its stream lacks, then closes that
    publisher (a batch still on its way is dropped, not appended twice)."""

    model_config = ConfigDict(frozen=True)

    attempt: str
    publisher: str


class Trimmed(BaseModel):
    """How a request was sent under the `trim` context strategy: its `outputs` oldest
    tool outputs as stubs, and its input tokens estimated before and after."""

    model_config = ConfigDict(frozen=True)

    outputs: int
    tokens_before: int
    tokens_after: int


class Summarized(BaseModel):
    """What a summary request (the `summarize` context strategy) replaced: the
    conversation's oldest `count` items by the summary, which makes the conversation
    sent `removed` bytes shorter; the next request's input tokens estimated before and
    after; the summary request's own bytes (its usage estimate when none is reported)."""

    model_config = ConfigDict(frozen=True)

    count: int
    removed: int
    tokens_before: int
    tokens_after: int
    input_bytes: int


class Turn(BaseModel):
    """One model response, normalised.

    - status: "completed", or "incomplete" (Responses `status` other than completed, or a
      Chat answer cut by `finish_reason: "length"` with no tool calls).
    - items: conversation items to append, in response order.
    - calls_truncated: the calls were cut off (Chat `finish_reason: "length"`).
    - text: the answer text (all `output_text` parts joined). Not serialised: derived
      again from `items` when a Turn is read back, so history holds the text once.
    - usage: None when missing or unusable (negative, non-integer, all zero with output).
    - fault: a protocol fault (no raw model text), or None.
    - output_bytes: UTF-8 JSON bytes of `items`, for usage estimation.
    - unnamed: call ids of calls sent without a function name (history shows
      `MISSING_NAME`; the loop answers them with an error and never executes them).
    - worker_queue: the own task queue of the worker whose cache now holds the
      conversation (set by the model activity; None for a worker without one).
    - cached: the model activity found the conversation so far (and the tool outputs
      it refers to) in its worker's cache, so it read nothing from the event history
      (set only by a worker with an own queue; False for the first request of a run,
      which had nothing to find).
    """

    model_config = ConfigDict(frozen=True)

    status: Literal["completed", "incomplete"] = "completed"
    items: list[dict[str, Any]] = Field(default_factory=list)
    text: str = Field(default="", exclude=True)
    usage: Usage | None = None
    # Defaults are left out of payloads: a Turn is written to history every step.
    fault: str | None = Field(default=None, exclude_if=lambda v: v is None)
    output_bytes: int = 0
    calls_truncated: bool = Field(default=False, exclude_if=lambda v: not v)
    unnamed: list[str] = Field(default_factory=list, exclude_if=lambda v: not v)
    # The task queue of the worker that now holds the conversation in its cache (a
    # routing hint: the history stays the source of truth).
    worker_queue: str | None = Field(default=None, exclude_if=lambda v: v is None)
    # Where the request found its conversation: the workflow's routing reads it.
    cached: bool = Field(default=False, exclude_if=lambda v: not v)
    # Set by the model activity for a streamed answer.
    streamed: Streamed | None = Field(default=None, exclude_if=lambda v: v is None)
    # Set by the model activity when the request was sent with old tool outputs
    # replaced by stubs (the `trim` context strategy: boundloop.core.context).
    trimmed: Trimmed | None = Field(default=None, exclude_if=lambda v: v is None)
    # Set by the model activity on the answer of a summary request (the `summarize`
    # context strategy): its text is the summary, not a step's answer.
    summarized: Summarized | None = Field(default=None, exclude_if=lambda v: v is None)

    @model_validator(mode="after")
    def _text_from_items(self) -> Turn:
        if not self.text:
            text = "".join(_text_of_content(i.get("content")) for i in self.items
                           if i.get("type") == "message")
            object.__setattr__(self, "text", text)  # frozen model, set once at creation
        return self

    @property
    def calls(self) -> list[FunctionCall]:
        """The `function_call` items, in order (derived, so history holds them once).

        A call listed in `unnamed` has the name "" here (never executed), whatever
        placeholder its history item carries.
        """
        return [FunctionCall(call_id=i["call_id"],
                             name="" if i["call_id"] in self.unnamed else i["name"],
                             arguments=i["arguments"], truncated=self.calls_truncated)
                for i in self.items if i.get("type") == "function_call"]


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _usage(raw: Any, in_key: str, out_key: str, has_output: bool) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    inp, out = _int_or_none(raw.get(in_key)), _int_or_none(raw.get(out_key))
    total = raw.get("total_tokens")
    tot = _int_or_none(total) if total is not None else None
    if inp is None or out is None:
        return None
    if total is not None and tot is None:
        return None
    tot = inp + out if tot is None else tot
    if has_output and inp == 0 and out == 0 and tot == 0:
        return None
    return Usage(input_tokens=inp, output_tokens=out, total_tokens=tot)


def _escape_surrogates(text: str) -> str:
    """Unpaired surrogates back to their `\\uXXXX` JSON escape (valid UTF-8, same JSON)."""
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _scrub(value: Any) -> Any:
    """The body with every string UTF-8-encodable and every number finite.

    `json.loads` accepts unpaired surrogate escapes (`"\\ud800"`) and `NaN`/`Infinity`;
    neither survives UTF-8 JSON (byte counts, digests, Temporal payloads, the next
    request). Surrogates become U+FFFD; non-finite numbers become null. A call's own
    `arguments` were made text before (`_calls_arguments_as_text`), so they are clean
    already. Values without such characters are returned unchanged.
    """
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value) if _SURROGATE.search(value) else value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    if isinstance(value, dict):
        return {_scrub(k): _scrub(v) for k, v in value.items()}
    return value


def _arguments_text(value: Any) -> str:
    """Arguments as a string: strings verbatim; objects (an Ollama quirk) serialised.

    Unpaired surrogates are written back as `\\uXXXX` escapes (the JSON text the model
    meant), so history stays valid UTF-8 and the argument check refuses them.
    """
    if isinstance(value, str):
        text = value
    elif value is None:
        return ""
    else:
        try:
            text = compact_json(value)
        except RecursionError:  # nesting json.loads accepted but json.dumps does not
            return ""
    return _escape_surrogates(text) if _SURROGATE.search(text) else text


def _text_of_content(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts: list[str] = []
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, dict) and isinstance(part.get("refusal"), str):
                parts.append(part["refusal"])
    return "".join(parts)


def fallback_call_id(step: int, index: int) -> str:
    """Deterministic id for a call the provider sent without one (no clock, no random)."""
    return f"call_bl_{step}_{index}"


def _with_fault_usage(turn: Turn, body: Any, in_key: str, out_key: str) -> Turn:
    """A faulty turn still reports the usage the provider billed (usage comes first).

    When the faulty body carries no usable usage (a body that is not JSON, say), the
    turn reports zero tokens rather than None: the fault is the more specific reason,
    so the run stops with `protocol_error`, not `usage_unknown` (docs/quirks.md).
    """
    if turn.fault is None:
        return turn
    usage = _usage(body.get("usage"), in_key, out_key, True) if isinstance(body, dict) else None
    return turn.model_copy(update={"usage": usage or Usage()})


def _with_text_arguments(call: Any) -> Any:
    """`call` (a Responses `function_call` item or a Chat `function`) with `arguments` as
    JSON text, unpaired surrogates escaped: the loop's own JSON parse then sees (and
    refuses) exactly what the model wrote, rather than a U+FFFD `_scrub` would put in."""
    if isinstance(call, dict) and "arguments" in call:
        return {**call, "arguments": _arguments_text(call["arguments"])}
    return call


def _calls_arguments_as_text(body: Any) -> Any:
    """The body with each tool call's `arguments` (and only those) made JSON text."""
    if not isinstance(body, dict):
        return body
    output = body.get("output")
    if isinstance(output, list):
        body = {**body, "output": [
            _with_text_arguments(i) if isinstance(i, dict) and i.get("type") == "function_call"
            else i for i in output]}
    choices = body.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message")
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if isinstance(message, dict) and isinstance(calls, list):
            calls = [{**c, "function": _with_text_arguments(c.get("function"))}
                     if isinstance(c, dict) and "function" in c else c for c in calls]
            choice = {**choices[0], "message": {**message, "tool_calls": calls}}
            body = {**body, "choices": [choice, *choices[1:]]}
    return body


def _scrubbed(body: Any) -> Any | Turn:
    try:
        return _scrub(_calls_arguments_as_text(body))
    except RecursionError:
        return Turn(fault="response body is nested too deeply")


def parse_responses(body: Any) -> Turn:
    """Normalise a Responses API response body (`response.output` items).

    A `function_call` without a `call_id`, or repeating one, is a fault (the output
    could not be matched to it); one without a name is kept with the `MISSING_NAME`
    placeholder and answered with an error, never executed (docs/quirks.md).
    """
    clean = _scrubbed(body)
    if isinstance(clean, Turn):
        return _with_fault_usage(clean, None, "input_tokens", "output_tokens")
    return _with_fault_usage(_parse_responses(clean), clean, "input_tokens", "output_tokens")


def parse_chat(body: Any, step: int) -> Turn:
    """Normalise a Chat Completions response body (`choices[0].message`).

    Quirks handled (docs/quirks.md): `arguments` as an object, a missing or empty tool
    call id (replaced by `fallback_call_id`), a missing function name (`MISSING_NAME`
    in history, answered with an error), `finish_reason` disagreeing with the presence
    of `tool_calls`, `finish_reason: "length"` cutting arguments.
    """
    clean = _scrubbed(body)
    if isinstance(clean, Turn):
        return _with_fault_usage(clean, None, "prompt_tokens", "completion_tokens")
    return _with_fault_usage(_parse_chat(clean, step), clean, "prompt_tokens",
                             "completion_tokens")


def _parse_responses(body: Any) -> Turn:
    if not isinstance(body, dict) or not isinstance(body.get("output"), list):
        return Turn(fault="response body has no output list")
    # `incomplete_details` naming a reason is a cut answer whatever `status` says
    # (llama.cpp reports `completed` for an answer cut by max_output_tokens).
    details = body.get("incomplete_details")
    cut = isinstance(details, dict) and bool(details.get("reason"))
    status: Literal["completed", "incomplete"] = (
        "completed" if body.get("status") == "completed" and not cut else "incomplete"
    )
    items: list[dict[str, Any]] = []
    texts: list[str] = []
    seen: set[str] = set()
    unnamed: list[str] = []
    for raw in body["output"]:
        if not isinstance(raw, dict):
            return Turn(fault="output item is not an object")
        kind = raw.get("type")
        if not isinstance(kind, str) or kind not in KNOWN_ITEM_TYPES:
            return Turn(fault=f"unknown output item type {preview(str(kind), 40)!r}")
        if nesting_depth(raw) > MAX_DEPTH:  # history could not carry it
            return Turn(fault=f"output item nests deeper than {MAX_DEPTH} levels")
        item = dict(raw)
        if kind == "message":
            text = _text_of_content(raw.get("content"))
            texts.append(text)
            # Model output is the assistant speaking: an output message claiming another
            # role ("system", "developer", none) is replayed as assistant, never as a
            # higher-privilege message; content the API cannot take back becomes text.
            item["role"] = "assistant"
            if not isinstance(raw.get("content"), str | list):
                item["content"] = [{"type": "output_text", "text": text}]
        elif kind == "function_call":
            call_id, name = raw.get("call_id"), raw.get("name")
            if not isinstance(call_id, str) or not call_id:
                return Turn(fault="function_call without call_id")
            if call_id in seen:
                return Turn(fault="duplicate call_id in one response")
            seen.add(call_id)
            if not isinstance(name, str) or not name:
                unnamed.append(call_id)
                item["name"] = MISSING_NAME
            item["arguments"] = _arguments_text(raw.get("arguments"))
        items.append(item)
    text = "".join(texts)
    out_bytes = json_bytes(items)
    usage = _usage(body.get("usage"), "input_tokens", "output_tokens", bool(items))
    return Turn(status=status, items=items, text=text, usage=usage, output_bytes=out_bytes,
                unnamed=unnamed)


def _parse_chat(body: Any, step: int) -> Turn:
    if not isinstance(body, dict):
        return Turn(fault="response body is not an object")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return Turn(fault="response has no choices")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        return Turn(fault="choice has no message")
    cut = choice.get("finish_reason") == "length"
    text = _text_of_content(message.get("content"))
    if not text and isinstance(message.get("refusal"), str):
        text = message["refusal"]  # a refusal is the answer, as on the Responses API
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        return Turn(fault="tool_calls is not a list")
    items: list[dict[str, Any]] = []
    if text:
        items.append({"type": "message", "role": "assistant",
                      "content": [{"type": "output_text", "text": text}]})
    seen: set[str] = set()
    unnamed: list[str] = []
    for index, raw in enumerate(raw_calls):
        if not isinstance(raw, dict):
            return Turn(fault="tool call is not an object")
        if raw.get("type") not in (None, "function"):
            # e.g. a `custom` tool call: boundloop declares function tools only.
            return Turn(fault=f"unknown tool call type {preview(str(raw.get('type')), 40)!r}")
        fn = raw.get("function")
        fn = fn if isinstance(fn, dict) else {}
        call_id = raw.get("id")
        if not isinstance(call_id, str) or not call_id.strip():
            call_id = fallback_call_id(step, index)
        if call_id in seen:
            return Turn(fault="duplicate tool call id in one response")
        seen.add(call_id)
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            unnamed.append(call_id)
            name = MISSING_NAME
        arguments = _arguments_text(fn.get("arguments"))
        items.append({"type": "function_call", "call_id": call_id, "name": name,
                      "arguments": arguments})
    has_calls = bool(raw_calls)
    # A filtered answer is cut short too (Responses: status incomplete, content_filter).
    filtered = choice.get("finish_reason") == "content_filter"
    status: Literal["completed", "incomplete"] = (
        "incomplete" if filtered or (cut and not has_calls) else "completed")
    out_bytes = json_bytes(items)
    usage = _usage(body.get("usage"), "prompt_tokens", "completion_tokens", bool(items))
    return Turn(status=status, items=items, text=text, usage=usage, output_bytes=out_bytes,
                calls_truncated=cut and has_calls, unnamed=unnamed)
