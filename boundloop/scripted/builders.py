"""Pure helpers that build raw OpenAI response bodies (and script turns) for scripts and tests.

They return plain JSON-ready dicts shaped like the real API's bodies (the shapes the ``openai``
SDK's ``Response`` / ``ChatCompletion`` models parse), so a test reads as the conversation it
scripts::

    script = [
        turn(responses_turn(reasoning=reasoning_item("rs_1"),
                            calls=[fn_call("lookup_stock", {"sku": "A-001"}, call_id="call_a")])),
        turn(responses_turn(id="resp_2", text="A-001: 12 in stock.")),
    ]

Ids are deterministic (``resp_1``, ``msg_1``, ``fc_1``, ``rs_1``, ``chatcmpl-1``, ``call_1``),
never random: pass distinct ids yourself when a script has several turns or calls. Nothing here
validates *semantics*: ``fn_call("f", '{"broken": ')`` deliberately yields malformed arguments.

Body builders: :func:`responses_turn`, :func:`chat_turn`. Items: :func:`fn_call`,
:func:`reasoning_item`, :func:`message_item`, :func:`chat_tool_call`. Usage:
:func:`usage` (Responses), :func:`chat_usage` (Chat). Turns: :func:`turn`, :func:`raw_turn`,
:func:`error_turn`.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping
from typing import Any, Literal

__all__ = [
    "CREATED_AT",
    "DEFAULT",
    "DEFAULT_MODEL",
    "chat_tool_call",
    "chat_turn",
    "chat_usage",
    "error_turn",
    "fn_call",
    "message_item",
    "raw_turn",
    "reasoning_item",
    "responses_turn",
    "turn",
    "usage",
]

CREATED_AT = 1_750_000_000
"""Fixed ``created_at`` / ``created`` timestamp, so bodies are deterministic."""
DEFAULT_MODEL = "gpt-5-mini"


class _Default(enum.Enum):
    DEFAULT = "default"


DEFAULT = _Default.DEFAULT
"""Sentinel: "use the default usage" (distinct from ``None``, which omits usage)."""

UsageArg = Mapping[str, Any] | None | _Default


def _arguments(arguments: str | Mapping[str, Any]) -> str:
    """Arguments as the API sends them: a JSON *string* (given strings are kept verbatim)."""
    if isinstance(arguments, str):
        return arguments
    return json.dumps(dict(arguments), ensure_ascii=False)


def _suffix(identifier: str, prefix: str) -> str:
    return identifier[len(prefix) :] if identifier.startswith(prefix) else identifier


# -------------------------------------------------------------------------------- usage


def usage(
    input: int = 10, output: int = 5, *, cached: int = 0, reasoning: int = 0
) -> dict[str, Any]:
    """Responses API ``usage``: ``{"input_tokens", "output_tokens", "total_tokens", ...}``."""
    return {
        "input_tokens": input,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": input + output,
    }


_responses_usage = usage


def chat_usage(
    input: int = 10, output: int = 5, *, cached: int = 0, reasoning: int = 0
) -> dict[str, Any]:
    """Chat Completions ``usage``: ``{"prompt_tokens", "completion_tokens", "total_tokens"}``."""
    return {
        "prompt_tokens": input,
        "completion_tokens": output,
        "total_tokens": input + output,
        "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": reasoning,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _resolve_usage(value: UsageArg, default: dict[str, Any]) -> dict[str, Any] | None:
    if value is DEFAULT:
        return default
    if value is None:
        return None
    assert not isinstance(value, _Default)
    return dict(value)


# -------------------------------------------------------------------------------- Responses


def fn_call(
    name: str,
    arguments: str | Mapping[str, Any],
    call_id: str = "call_1",
    *,
    id: str | None = None,
    status: str = "completed",
) -> dict[str, Any]:
    """A Responses ``function_call`` output item; ``id`` defaults to ``fc_<call_id suffix>``."""
    return {
        "type": "function_call",
        "id": id if id is not None else f"fc_{_suffix(call_id, 'call_')}",
        "call_id": call_id,
        "name": name,
        "arguments": _arguments(arguments),
        "status": status,
    }


def reasoning_item(
    id: str = "rs_1",
    encrypted_content: str | _Default | None = DEFAULT,
    *,
    summary: Iterable[str] = (),
) -> dict[str, Any]:
    """A Responses ``reasoning`` output item.

    ``encrypted_content`` defaults to a deterministic opaque string derived from ``id`` (what
    the API returns with ``include=["reasoning.encrypted_content"]``); ``None`` omits it.
    """
    item: dict[str, Any] = {
        "type": "reasoning",
        "id": id,
        "summary": [{"type": "summary_text", "text": s} for s in summary],
    }
    if encrypted_content is DEFAULT:
        item["encrypted_content"] = f"gAAAAAscripted-{id}"
    elif encrypted_content is not None:
        item["encrypted_content"] = encrypted_content
    return item


def message_item(text: str, id: str = "msg_1", *, status: str = "completed") -> dict[str, Any]:
    """A Responses assistant ``message`` output item with one ``output_text`` part."""
    return {
        "type": "message",
        "id": id,
        "role": "assistant",
        "status": status,
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def responses_turn(
    *,
    text: str | None = None,
    calls: Iterable[Mapping[str, Any]] = (),
    reasoning: Mapping[str, Any] | None = None,
    usage: UsageArg = DEFAULT,
    status: Literal["completed", "incomplete", "failed", "in_progress"] | str = "completed",
    extra_items: Iterable[Mapping[str, Any]] = (),
    id: str = "resp_1",
    model: str = DEFAULT_MODEL,
    incomplete_reason: str = "max_output_tokens",
) -> dict[str, Any]:
    """A Responses API body (``"object": "response"``).

    ``output`` is, in order: ``reasoning`` (if given), a message with ``text`` (id
    ``msg_<id suffix>``, if given), the ``calls``, then ``extra_items``. ``usage`` defaults to
    :func:`usage` () (10 in, 5 out, 15 total); ``None`` omits the key. ``status="incomplete"``
    sets ``incomplete_details.reason`` to ``incomplete_reason``. Raises ``ValueError`` if two
    output items share an ``id`` or two calls share a ``call_id``.
    """
    output: list[dict[str, Any]] = []
    if reasoning is not None:
        output.append(dict(reasoning))
    if text is not None:
        output.append(message_item(text, f"msg_{_suffix(id, 'resp_')}"))
    output.extend(dict(c) for c in calls)
    output.extend(dict(x) for x in extra_items)
    for key in ("id", "call_id"):
        values = [item[key] for item in output if isinstance(item.get(key), str)]
        dupes = sorted({v for v in values if values.count(v) > 1})
        if dupes:
            raise ValueError(f"responses_turn: duplicate output item {key} {dupes}")
    body: dict[str, Any] = {
        "id": id,
        "object": "response",
        "created_at": CREATED_AT,
        "status": status,
        "error": None,
        "incomplete_details": ({"reason": incomplete_reason} if status == "incomplete" else None),
        "instructions": None,
        "max_output_tokens": None,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "store": False,
        "temperature": 1.0,
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "metadata": {},
    }
    resolved = _resolve_usage(usage, _responses_usage())
    if resolved is not None:
        body["usage"] = resolved
    return body


# -------------------------------------------------------------------------------- Chat


def chat_tool_call(
    name: str, arguments: str | Mapping[str, Any], id: str = "call_1"
) -> dict[str, Any]:
    """A Chat Completions ``tool_calls`` entry (arguments as a JSON string)."""
    return {
        "id": id,
        "type": "function",
        "function": {"name": name, "arguments": _arguments(arguments)},
    }


def chat_turn(
    *,
    content: str | None = None,
    tool_calls: Iterable[Mapping[str, Any]] = (),
    finish_reason: str | None = None,
    usage: UsageArg = DEFAULT,
    id: str = "chatcmpl-1",
    model: str = DEFAULT_MODEL,
) -> dict[str, Any]:
    """A Chat Completions body (``"object": "chat.completion"``) with one choice.

    ``finish_reason`` defaults to ``"tool_calls"`` when there are tool calls, else ``"stop"``.
    ``usage`` defaults to :func:`chat_usage` () (10 prompt, 5 completion, 15 total); ``None``
    omits the key. ``tool_calls`` is omitted from the message when empty, as the API does.
    """
    calls = [dict(c) for c in tool_calls]
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "refusal": None,
        "annotations": [],
    }
    if calls:
        message["tool_calls"] = calls
    body: dict[str, Any] = {
        "id": id,
        "object": "chat.completion",
        "created": CREATED_AT,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason or ("tool_calls" if calls else "stop"),
            }
        ],
        "service_tier": "default",
        "system_fingerprint": None,
    }
    resolved = _resolve_usage(usage, chat_usage())
    if resolved is not None:
        body["usage"] = resolved
    return body


# -------------------------------------------------------------------------------- turns


def turn(
    body: Any,
    *,
    status: int = 200,
    headers: Mapping[str, str] | None = None,
    delay_seconds: float = 0.0,
    note: str | None = None,
) -> dict[str, Any]:
    """A script turn answering with ``body`` serialised as JSON."""
    result: dict[str, Any] = {"body": body}
    if status != 200:
        result["status"] = status
    if headers:
        result["headers"] = dict(headers)
    if delay_seconds:
        result["delay_seconds"] = delay_seconds
    if note is not None:
        result["note"] = note
    return result


def raw_turn(
    raw: str, *, status: int = 200, headers: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A script turn answering with ``raw`` byte-for-byte (e.g. truncated or non-JSON output)."""
    result: dict[str, Any] = {"raw": raw}
    if status != 200:
        result["status"] = status
    if headers:
        result["headers"] = dict(headers)
    return result


def error_turn(
    status: int,
    message: str,
    *,
    type: str = "server_error",
    code: str | None = None,
    retry_after: str | None = None,
) -> dict[str, Any]:
    """A script turn answering with an OpenAI-style error body (and ``Retry-After`` if given)."""
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    body = {"error": {"message": message, "type": type, "param": None, "code": code}}
    return turn(body, status=status, headers=headers)
