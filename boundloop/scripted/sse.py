"""A scripted answer as the Server-Sent Events stream a provider sends for `stream: true`.

Any 200 turn whose body is a response object streams when the request asks for it: the
text and the tool-call arguments in small pieces (arguments 3 characters at a time, so
a piece boundary falls anywhere in the JSON), then the terminating event. A turn's
`stream_fault` breaks the stream the way providers do (docs/scripted-server.md):

- `cut`: the connection closes in the middle of an event;
- `no_terminator`: every event but the terminating one (`response.completed`,
  `data: [DONE]`);
- `no_usage`: no usage anywhere (Chat: not even the usage chunk asked for);
- `error_event`: an error event halfway, then the end of the stream.
"""

from __future__ import annotations

import json
from typing import Any, Literal

StreamFault = Literal["cut", "no_terminator", "no_usage", "error_event"]


def _pieces(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)] or []


def _event(data: Any, name: str | None = None) -> bytes:
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def responses_events(body: dict[str, Any], fault: StreamFault | None) -> list[bytes]:
    final = {k: v for k, v in body.items() if not (fault == "no_usage" and k == "usage")}
    start = {**final, "status": "in_progress", "output": []}
    start.pop("usage", None)
    out = [_event({"type": "response.created", "response": start}, "response.created")]
    output: list[Any] = body["output"] if isinstance(body.get("output"), list) else []
    for index, item in enumerate(output):
        out.append(_event({"type": "response.output_item.added", "output_index": index,
                           "item": item}, "response.output_item.added"))
        if isinstance(item, dict) and item.get("type") == "message":
            for part, content in enumerate(item.get("content") or []):
                if isinstance(content, dict) and isinstance(content.get("text"), str):
                    for piece in _pieces(content["text"], 5):
                        out.append(_event({
                            "type": "response.output_text.delta", "item_id": item.get("id"),
                            "output_index": index, "content_index": part, "delta": piece},
                            "response.output_text.delta"))
        elif isinstance(item, dict) and item.get("type") == "function_call":
            arguments = item.get("arguments")
            for piece in _pieces(arguments, 3) if isinstance(arguments, str) else []:
                out.append(_event({
                    "type": "response.function_call_arguments.delta",
                    "item_id": item.get("id"), "output_index": index, "delta": piece},
                    "response.function_call_arguments.delta"))
        out.append(_event({"type": "response.output_item.done", "output_index": index,
                           "item": item}, "response.output_item.done"))
    status = body.get("status")
    terminal = {"incomplete": "response.incomplete", "failed": "response.failed"}.get(
        status if isinstance(status, str) else "", "response.completed")
    out.append(_event({"type": terminal, "response": final}, terminal))
    return _broken(out, fault, _event({"type": "error", "code": "server_error",
                                       "message": "scripted stream error"}, "error"))


def chat_events(body: dict[str, Any], fault: StreamFault | None,
                include_usage: bool) -> list[bytes]:
    head = {"id": body.get("id"), "object": "chat.completion.chunk",
            "created": body.get("created", 0), "model": body.get("model")}
    choices: list[Any] = body["choices"] if isinstance(body.get("choices"), list) else []
    choice: dict[str, Any] = choices[0] if choices and isinstance(choices[0], dict) else {}
    message: dict[str, Any] = (choice["message"] if isinstance(choice.get("message"), dict)
                               else {})

    def chunk(delta: dict[str, Any], finish: Any = None) -> bytes:
        return _event({**head, "choices": [
            {"index": 0, "delta": delta, "finish_reason": finish}]})

    out = [chunk({"role": "assistant", "content": ""})]
    if isinstance(message.get("reasoning_content"), str):
        out += [chunk({"reasoning_content": p})
                for p in _pieces(message["reasoning_content"], 5)]
    if isinstance(message.get("content"), str):
        out += [chunk({"content": p}) for p in _pieces(message["content"], 5)]
    if isinstance(message.get("refusal"), str):
        out += [chunk({"refusal": p}) for p in _pieces(message["refusal"], 5)]
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        arguments = function.get("arguments", "")
        # Arguments that are not a string (a provider quirk) come whole, as they are.
        first = "" if isinstance(arguments, str) else arguments
        out.append(chunk({"tool_calls": [{"index": index, "id": call.get("id"),
                                          "type": call.get("type"), "function": {
                                              "name": function.get("name"),
                                              "arguments": first}}]}))
        for piece in _pieces(arguments, 3) if isinstance(arguments, str) else []:
            out.append(chunk({"tool_calls": [{"index": index,
                                              "function": {"arguments": piece}}]}))
    out.append(chunk({}, choice.get("finish_reason")))
    if include_usage and fault != "no_usage" and body.get("usage") is not None:
        out.append(_event({**head, "choices": [], "usage": body["usage"]}))
    out.append(b"data: [DONE]\n\n")
    return _broken(out, fault, _event({"error": {"message": "scripted stream error",
                                                 "type": "server_error",
                                                 "code": "server_error"}}))


def _broken(events: list[bytes], fault: StreamFault | None, error: bytes) -> list[bytes]:
    if fault == "no_terminator":
        return events[:-1]
    if fault == "error_event":
        half = max(1, len(events) // 2)
        return [*events[:half], error]
    if fault == "cut":
        half = max(1, len(events) // 2)
        return [*events[:half], events[half][:len(events[half]) // 2]]
    return events
