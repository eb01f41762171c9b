"""A streamed model response, assembled into the body the unstreamed request returns.

Both APIs stream Server-Sent Events. `SSEParser` turns bytes, split anywhere (inside a
line, inside a UTF-8 character), into events; `ResponsesStream` and `ChatStream` fold the
events into the text delta to show now and, at the end, the same JSON body an
unstreamed request gets, so `boundloop.core.turn` validates it exactly as it does that
one. A stream that ends without its terminating event (`response.completed` /
`response.incomplete` / `response.failed`, or `data: [DONE]`) assembles to None: a cut
body, like a truncated JSON body unstreamed. Pure: no I/O, no Temporal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StreamError:
    """An error event in the stream: the provider failed mid-answer. Its message is the
    provider's and never reaches the model, logs or history."""

    code: str | None


class SSEParser:
    """Incremental SSE: `feed(bytes)` returns the `data` of each event completed so far."""

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[str]:
        self._buffer += chunk
        out: list[str] = []
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                return out
            line, self._buffer = self._buffer[:end].rstrip(b"\r"), self._buffer[end + 1:]
            if not line:  # a blank line ends the event
                if self._data:
                    # Decoded per event, never per chunk: a chunk may end inside a character.
                    out.append(b"\n".join(self._data).decode("utf-8", "replace"))
                    self._data = []
            elif line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
            # `event:`, `id:`, `retry:` and comments carry nothing the body needs


def _load(data: str) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


@dataclass
class ResponsesStream:
    """The Responses API's events: text deltas, then the response in the terminating event
    (output items from `response.output_item.done` when the terminal one carries none)."""

    body: Any = None
    done: bool = False
    error: StreamError | None = None
    _items: dict[int, Any] = field(default_factory=dict)

    def event(self, data: str) -> str:
        """Fold one event in; return the answer text it adds ("" for none)."""
        ev = _load(data)
        if not isinstance(ev, dict):
            return ""
        kind = ev.get("type")
        if kind == "response.output_text.delta" and isinstance(ev.get("delta"), str):
            return str(ev["delta"])
        if kind == "response.output_item.done" and isinstance(ev.get("output_index"), int):
            self._items[ev["output_index"]] = ev.get("item")
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            response = ev.get("response")
            if isinstance(response, dict) and not response.get("output") and self._items:
                response = {**response, "output": [self._items[i] for i in sorted(self._items)]}
            self.body, self.done = response, True
        elif kind == "error":
            code = ev.get("code")
            self.error = StreamError(code=code if isinstance(code, str) else None)
        return ""

    def result(self) -> Any:
        return self.body if self.done else None


@dataclass
class _ChatCall:
    id: Any = None
    type: Any = "function"
    name: str = ""
    arguments: Any = ""


@dataclass
class ChatStream:
    """Chat Completions chunks: content and tool-call fragments joined by index, the last
    `finish_reason`, usage wherever a chunk carries it (the last one, or none)."""

    done: bool = False
    error: StreamError | None = None
    _head: dict[str, Any] = field(default_factory=dict)
    _content: list[str] = field(default_factory=list)
    _reasoning: list[str] = field(default_factory=list)
    _refusal: list[str] = field(default_factory=list)
    _calls: dict[int, _ChatCall] = field(default_factory=dict)
    _finish: Any = None
    _usage: Any = None
    _seen: bool = False

    def event(self, data: str) -> str:
        if data.strip() == "[DONE]":
            self.done = True
            return ""
        chunk = _load(data)
        if not isinstance(chunk, dict):
            return ""
        if "error" in chunk:
            err = chunk["error"]
            code = err.get("code") if isinstance(err, dict) else None
            self.error = StreamError(code=code if isinstance(code, str) else None)
            return ""
        self._seen = True
        for key in ("id", "model", "created"):
            if key in chunk and key not in self._head:
                self._head[key] = chunk[key]
        if chunk.get("usage") is not None:
            self._usage = chunk["usage"]
        text = ""
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            if choice.get("finish_reason") is not None:
                self._finish = choice["finish_reason"]
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                continue
            if isinstance(delta.get("content"), str):
                text += delta["content"]
            if isinstance(delta.get("refusal"), str):
                self._refusal.append(delta["refusal"])
            if isinstance(delta.get("reasoning_content"), str):
                self._reasoning.append(delta["reasoning_content"])
            calls = delta.get("tool_calls")
            for part in calls if isinstance(calls, list) else []:
                if not isinstance(part, dict):
                    continue
                index = part.get("index")
                call = self._calls.setdefault(index if isinstance(index, int) else 0,
                                              _ChatCall())
                if part.get("id") is not None:
                    call.id = part["id"]
                if "type" in part:  # sent with the first fragment (kept as sent)
                    call.type = part["type"]
                function = part.get("function")
                if isinstance(function, dict):
                    if isinstance(function.get("name"), str):
                        call.name += function["name"]
                    arguments = function.get("arguments")
                    if isinstance(arguments, str) and isinstance(call.arguments, str):
                        call.arguments += arguments
                    elif arguments not in (None, ""):  # an object: a quirk, kept as sent
                        call.arguments = arguments
        self._content.append(text)
        return text

    def result(self) -> Any:
        if not (self.done and self._seen):
            return None
        message: dict[str, Any] = {"role": "assistant",
                                   "content": "".join(self._content) or None}
        if self._reasoning:
            message["reasoning_content"] = "".join(self._reasoning)
        if self._refusal:
            message["refusal"] = "".join(self._refusal)
        if self._calls:
            message["tool_calls"] = [
                {"id": c.id, "type": c.type,
                 "function": {"name": c.name, "arguments": c.arguments}}
                for _, c in sorted(self._calls.items())]
        body: dict[str, Any] = {**self._head, "object": "chat.completion", "choices": [
            {"index": 0, "message": message, "finish_reason": self._finish}]}
        if self._usage is not None:
            body["usage"] = self._usage
        return body
