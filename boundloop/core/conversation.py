"""The conversation: Responses-API items, their byte size, digest, and Chat rendering.

The workflow keeps only `ConversationMeta` (count, bytes, digest) after items are
appended; the model activity rebuilds the items themselves (docs/history.md). Both
sides compute the same digest, so a rebuilt conversation is checked, not trusted.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from boundloop.core.canonical import canonical_json, json_bytes, sha256_hex

Item = dict[str, Any]


class ConversationMeta(BaseModel):
    """`count` items; `bytes` = UTF-8 bytes of the compact JSON array; chained `digest`."""

    model_config = ConfigDict(frozen=True)

    count: int = 0
    bytes: int = 2  # "[]"
    digest: str = ""

    def extend(self, items: list[Item]) -> ConversationMeta:
        count, size, digest = self.count, self.bytes, self.digest
        for item in items:
            size += json_bytes(item) + (1 if count else 0)
            digest = sha256_hex(digest + canonical_json(item))[:32]  # 128 bits
            count += 1
        return ConversationMeta(count=count, bytes=size, digest=digest)


class ConversationRef(BaseModel):
    """The conversation of an earlier run: of the same workflow (continue-as-new), or
    of a session's previous turn (`boundloop.core.session`)."""

    model_config = ConfigDict(frozen=True)

    workflow_id: str
    run_id: str
    meta: ConversationMeta


class SummaryRef(BaseModel):
    """The conversation's oldest `count` items replaced by a summary (the `summarize`
    context strategy) in every request sent from then on. The summary's text is the
    result of the model activity that wrote it, in history, found by `key`; `digest`
    checks it, and `removed` is how many bytes shorter the conversation sent is than the
    whole one (the context estimate counts what is sent)."""

    model_config = ConfigDict(frozen=True)

    key: str
    count: int
    digest: str
    removed: int


def meta_of(items: list[Item]) -> ConversationMeta:
    return ConversationMeta().extend(items)


def user_message(text: str) -> Item:
    return {"type": "message", "role": "user", "content": text}


def function_call_output(call_id: str, output: str) -> Item:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def to_chat_messages(items: list[Item], instructions: str | None) -> list[dict[str, Any]]:
    """Render items as Chat Completions `messages`.

    Consecutive assistant items (text message, function calls) become one assistant
    message with `tool_calls`; each `function_call_output` becomes a `tool` message with
    the same `tool_call_id`, right after its assistant message. `reasoning` items have
    no Chat form and are left out.
    """
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    assistant: dict[str, Any] | None = None

    def flush() -> None:
        nonlocal assistant
        if assistant is not None:
            messages.append(assistant)
            assistant = None

    for item in items:
        kind = item.get("type")
        role = item.get("role")
        if (kind == "message" and role == "assistant") or kind == "function_call":
            if assistant is None:
                assistant = {"role": "assistant", "content": None}
            if kind == "message":
                text = "".join(p.get("text", "") for p in item.get("content", [])
                               if isinstance(p, dict))
                assistant["content"] = (assistant["content"] or "") + text
            else:
                assistant.setdefault("tool_calls", []).append({
                    "id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]},
                })
        elif kind == "function_call_output":
            flush()
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": item["output"]})
        elif kind == "message":
            flush()
            content = item.get("content")
            messages.append({"role": role or "user", "content": content})
        # reasoning: no Chat Completions equivalent
    flush()
    return messages


