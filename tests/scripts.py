"""The tests' shorthand for script turns, on boundloop.scripted.builders (the bodies the
public kit, boundloop.testing, builds too), with the usage the tests count: 100 in, 20 out."""

from __future__ import annotations

import json
from typing import Any

from boundloop.scripted import builders as b

USAGE = {"input_tokens": 100, "output_tokens": 20, "total_tokens": 120}


def body(payload: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"body": payload, **extra}


def call(name: str, args: Any, call_id: str) -> dict[str, Any]:
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return b.fn_call(name, text, call_id=call_id, id=f"fc_{call_id}")


def reasoning(rid: str) -> dict[str, Any]:
    return b.reasoning_item(rid, f"gAAAA-encrypted-{rid}")


def message(text: str) -> dict[str, Any]:
    return b.message_item(text)


def resp(*items: dict[str, Any], usage: Any = USAGE, status: str = "completed",
         rid: str = "resp_1", **turn: Any) -> dict[str, Any]:
    return body(b.responses_turn(extra_items=items, usage=usage, status=status, id=rid),
                **turn)


def answer(text: str, **kw: Any) -> dict[str, Any]:
    return resp(message(text), **kw)


CHAT_USAGE = {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}


def chat(content: str | None = None, calls: list[dict[str, Any]] | None = None,
         finish_reason: str | None = None, usage: Any = CHAT_USAGE) -> dict[str, Any]:
    return body(b.chat_turn(content=content, tool_calls=calls or (),
                            finish_reason=finish_reason, usage=usage))


def chat_call(name: str, args: Any, call_id: str | None) -> dict[str, Any]:
    text = args if isinstance(args, str) or not isinstance(args, dict | list) else json.dumps(
        args, ensure_ascii=False)
    c = b.chat_tool_call(name, text, id=call_id or "")
    if call_id is None:
        del c["id"]  # a call without an id: some servers send them
    return c


def outputs(request_body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """call_id -> parsed envelope, from a Responses API request's input."""
    found: dict[str, dict[str, Any]] = {}
    for item in request_body.get("input", []):
        if isinstance(item, dict) and item.get("type") == "function_call_output":
            found[item["call_id"]] = json.loads(item["output"])
    return found


def tool_messages(request_body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """tool_call_id -> parsed envelope, from a Chat Completions request's messages."""
    return {m["tool_call_id"]: json.loads(m["content"])
            for m in request_body.get("messages", []) if m.get("role") == "tool"}
