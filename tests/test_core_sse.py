"""Assembling a streamed answer (boundloop.core.sse): pure, no server."""

from __future__ import annotations

import json
from typing import Any

from boundloop.core.sse import ChatStream, ResponsesStream, SSEParser
from boundloop.scripted.sse import chat_events, responses_events
from tests.scripts import answer, call, chat, chat_call, resp

ARGS_TEXT = json.dumps({"sku": "A-001", "note": "北海道の倉庫 ✓"}, ensure_ascii=False)


def fold(stream: ChatStream | ResponsesStream, payload: bytes, size: int) -> str:
    """Feed `payload` `size` bytes at a time; return the text deltas joined."""
    parser, text = SSEParser(), ""
    for start in range(0, len(payload), size):
        for data in parser.feed(payload[start:start + size]):
            text += stream.event(data)
    return text


def test_split_anywhere_even_inside_a_character_assembles_the_unstreamed_body() -> None:
    body = chat("北海道 ✓ answer", calls=[chat_call("lookup_stock", ARGS_TEXT, "c1")])["body"]
    payload = b"".join(chat_events(body, None, include_usage=True))
    for size in (1, 2, 3, 7, 11):
        stream = ChatStream()
        assert fold(stream, payload, size) == "北海道 ✓ answer"
        got: Any = stream.result()
        want, have = body["choices"][0], got["choices"][0]
        assert have["finish_reason"] == want["finish_reason"]
        assert have["message"]["content"] == want["message"]["content"]
        assert have["message"]["tool_calls"] == want["message"]["tool_calls"]
        assert got["usage"] == body["usage"]
        assert json.loads(got["choices"][0]["message"]["tool_calls"][0]["function"][
            "arguments"]) == json.loads(ARGS_TEXT)


def test_responses_body_is_the_terminating_events_response() -> None:
    body = resp(call("lookup_stock", ARGS_TEXT, "c1"))["body"]
    stream = ResponsesStream()
    fold(stream, b"".join(responses_events(body, None)), 5)
    assert stream.result() == body
    stream = ResponsesStream()
    assert fold(stream, b"".join(responses_events(answer("やあ")["body"], None)), 3) == "やあ"


def test_a_stream_without_its_end_is_a_cut_body() -> None:
    for fault in ("cut", "no_terminator"):
        chat_stream, responses_stream = ChatStream(), ResponsesStream()
        fold(chat_stream, b"".join(chat_events(chat("x")["body"], fault, True)), 4)
        fold(responses_stream, b"".join(responses_events(answer("x")["body"], fault)), 4)
        assert chat_stream.result() is None and responses_stream.result() is None


def test_an_error_event_is_reported_and_usage_may_be_missing() -> None:
    stream = ChatStream()
    fold(stream, b"".join(chat_events(chat("hello there")["body"], "error_event", True)), 9)
    assert stream.error is not None
    stream = ChatStream()
    fold(stream, b"".join(chat_events(chat("hi")["body"], "no_usage", True)), 9)
    assert "usage" not in stream.result()
