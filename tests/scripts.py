"""Tiny builders so tests read as the conversation they script (raw response bodies)."""

from __future__ import annotations

import json
from typing import Any

USAGE = {"input_tokens": 100, "output_tokens": 20, "total_tokens": 120}


def body(b: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"body": b, **extra}


def call(name: str, args: Any, call_id: str) -> dict[str, Any]:
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": name,
            "arguments": text, "status": "completed"}


def reasoning(rid: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": rid, "summary": [],
            "encrypted_content": f"gAAAA-encrypted-{rid}"}


def message(text: str) -> dict[str, Any]:
    return {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def resp(*items: dict[str, Any], usage: Any = USAGE, status: str = "completed",
         rid: str = "resp_1", **turn: Any) -> dict[str, Any]:
    b: dict[str, Any] = {"id": rid, "object": "response", "status": status,
                         "output": list(items)}
    if usage is not None:
        b["usage"] = usage
    return body(b, **turn)


def answer(text: str, **kw: Any) -> dict[str, Any]:
    return resp(message(text), **kw)


CHAT_USAGE = {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}


def chat(content: str | None = None, calls: list[dict[str, Any]] | None = None,
         finish_reason: str | None = None, usage: Any = CHAT_USAGE) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = calls
    reason = finish_reason or ("tool_calls" if calls else "stop")
    b: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion",
                         "choices": [{"index": 0, "message": msg, "finish_reason": reason}]}
    if usage is not None:
        b["usage"] = usage
    return body(b)


def chat_call(name: str, args: Any, call_id: str | None) -> dict[str, Any]:
    text = args if isinstance(args, str) or not isinstance(args, dict | list) else json.dumps(
        args, ensure_ascii=False)
    c: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": text}}
    if call_id is not None:
        c["id"] = call_id
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
