"""Normalise raw model responses into one `Turn` (Responses API and Chat Completions).

The response body is untrusted input: these functions never raise on any JSON value.
A body they cannot make sense of yields a `Turn` with a `fault` (-> `protocol_error`).
Decisions use the presence of tool calls, never `finish_reason` (SPEC §3.4).

Conversation items are kept in Responses API form (`message`, `reasoning`,
`function_call`, `function_call_output`); `boundloop.core.conversation` renders them
as Chat Completions messages when that API is used.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from boundloop.core.canonical import compact_json, json_bytes, preview

KNOWN_ITEM_TYPES = frozenset({"message", "reasoning", "function_call"})


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


class Turn(BaseModel):
    """One model response, normalised.

    - status: "completed", or "incomplete" (Responses `status` other than completed, or a
      Chat answer cut by `finish_reason: "length"` with no tool calls).
    - items: conversation items to append, in response order.
    - calls_truncated: the calls were cut off (Chat `finish_reason: "length"`).
    - text: the answer text (all `output_text` parts joined).
    - usage: None when missing or unusable (negative, non-integer, all zero with output).
    - fault: a protocol fault (no raw model text), or None.
    - output_bytes: UTF-8 JSON bytes of `items`, for usage estimation.
    """

    model_config = ConfigDict(frozen=True)

    status: Literal["completed", "incomplete"] = "completed"
    items: list[dict[str, Any]] = Field(default_factory=list)
    text: str = ""
    usage: Usage | None = None
    fault: str | None = None
    output_bytes: int = 0
    calls_truncated: bool = False

    @property
    def calls(self) -> list[FunctionCall]:
        """The `function_call` items, in order (derived, so history holds them once)."""
        return [FunctionCall(call_id=i["call_id"], name=i["name"], arguments=i["arguments"],
                             truncated=self.calls_truncated)
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


def _arguments_text(value: Any) -> str:
    """Arguments as a string: strings verbatim; objects (an Ollama quirk) serialised."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return compact_json(value)


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
    """A faulty turn still reports the usage the provider billed (usage comes first)."""
    if turn.fault is None or not isinstance(body, dict):
        return turn
    return turn.model_copy(update={"usage": _usage(body.get("usage"), in_key, out_key, True)})


def parse_responses(body: Any) -> Turn:
    """Normalise a Responses API response body (`response.output` items)."""
    return _with_fault_usage(_parse_responses(body), body, "input_tokens", "output_tokens")


def parse_chat(body: Any, step: int) -> Turn:
    """Normalise a Chat Completions response body (`choices[0].message`).

    Quirks handled (docs/quirks.md): `arguments` as an object, a missing or empty tool
    call id (replaced by `fallback_call_id`), `finish_reason` disagreeing with the
    presence of `tool_calls`, `finish_reason: "length"` cutting arguments.
    """
    return _with_fault_usage(_parse_chat(body, step), body, "prompt_tokens",
                             "completion_tokens")


def _parse_responses(body: Any) -> Turn:
    if not isinstance(body, dict) or not isinstance(body.get("output"), list):
        return Turn(fault="response body has no output list")
    status: Literal["completed", "incomplete"] = (
        "completed" if body.get("status") == "completed" else "incomplete"
    )
    items: list[dict[str, Any]] = []
    texts: list[str] = []
    seen: set[str] = set()
    for raw in body["output"]:
        if not isinstance(raw, dict):
            return Turn(fault="output item is not an object")
        kind = raw.get("type")
        if kind not in KNOWN_ITEM_TYPES:
            return Turn(fault=f"unknown output item type {preview(str(kind), 40)!r}")
        item = dict(raw)
        if kind == "message":
            texts.append(_text_of_content(raw.get("content")))
        elif kind == "function_call":
            call_id, name = raw.get("call_id"), raw.get("name")
            if not isinstance(call_id, str) or not call_id:
                return Turn(fault="function_call without call_id")
            if call_id in seen:
                return Turn(fault="duplicate call_id in one response")
            seen.add(call_id)
            if not isinstance(name, str):
                return Turn(fault="function_call without a name")
            item["arguments"] = _arguments_text(raw.get("arguments"))
        items.append(item)
    text = "".join(texts)
    out_bytes = json_bytes(items)
    usage = _usage(body.get("usage"), "input_tokens", "output_tokens", bool(items))
    return Turn(status=status, items=items, text=text, usage=usage, output_bytes=out_bytes)


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
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        return Turn(fault="tool_calls is not a list")
    items: list[dict[str, Any]] = []
    if text:
        items.append({"type": "message", "role": "assistant",
                      "content": [{"type": "output_text", "text": text}]})
    seen: set[str] = set()
    for index, raw in enumerate(raw_calls):
        if not isinstance(raw, dict):
            return Turn(fault="tool call is not an object")
        fn = raw.get("function")
        fn = fn if isinstance(fn, dict) else {}
        call_id = raw.get("id")
        if not isinstance(call_id, str) or not call_id.strip():
            call_id = fallback_call_id(step, index)
        if call_id in seen:
            return Turn(fault="duplicate tool call id in one response")
        seen.add(call_id)
        name = fn.get("name") if isinstance(fn.get("name"), str) else ""
        arguments = _arguments_text(fn.get("arguments"))
        items.append({"type": "function_call", "call_id": call_id, "name": name,
                      "arguments": arguments})
    has_calls = bool(raw_calls)
    status: Literal["completed", "incomplete"] = (
        "incomplete" if cut and not has_calls else "completed")
    out_bytes = json_bytes(items)
    usage = _usage(body.get("usage"), "prompt_tokens", "completion_tokens", bool(items))
    return Turn(status=status, items=items, text=text, usage=usage, output_bytes=out_bytes,
                calls_truncated=cut and has_calls)
