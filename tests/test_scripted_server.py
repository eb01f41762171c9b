"""Tests of the scripted model server, driven over real HTTP by the real ``openai`` SDK."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import openai
import pydantic
import pytest
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from boundloop.scripted.builders import (
    chat_tool_call,
    chat_turn,
    chat_usage,
    error_turn,
    fn_call,
    raw_turn,
    reasoning_item,
    responses_turn,
    turn,
    usage,
)
from boundloop.scripted.script import Script, Turn, load_script, parse_script
from boundloop.scripted.server import ScriptedModelServer
from boundloop.scripted.validation import (
    reasoning_requirements,
    validate_chat_request,
    validate_responses_request,
)

REPO = Path(__file__).resolve().parents[1]
STOCK_SCRIPT = REPO / "examples" / "scripts" / "stock_two_skus.json"
MODEL = "gpt-5-mini"

Serve = Callable[..., ScriptedModelServer]


@pytest.fixture
def serve() -> Iterator[Serve]:
    """Start servers for a test and always stop them afterwards."""
    servers: list[ScriptedModelServer] = []

    def _serve(script: Any, **kwargs: Any) -> ScriptedModelServer:
        server = ScriptedModelServer(script, **kwargs)
        servers.append(server)
        server.start()
        return server

    yield _serve
    for server in servers:
        server.stop()


def client_for(server: ScriptedModelServer, **kwargs: Any) -> openai.OpenAI:
    kwargs.setdefault("max_retries", 0)
    return openai.OpenAI(api_key="test", base_url=server.base_url, **kwargs)


def post_json(client: openai.OpenAI, path: str, body: Any) -> httpx2.Response:
    """POST an arbitrary (possibly invalid) JSON body through the SDK's own transport."""
    return client.post(path, body=body, cast_to=httpx2.Response)


# ------------------------------------------------------------------------------------- replay


def test_turns_are_replayed_in_order_across_both_endpoints(serve: Serve) -> None:
    server = serve(
        [
            turn(responses_turn(id="resp_1", text="first")),
            turn(chat_turn(id="chatcmpl-2", content="second")),
            turn(responses_turn(id="resp_3", text="third")),
        ]
    )
    client = client_for(server)

    r1 = client.responses.create(model=MODEL, input="a")
    c2 = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "b"}])
    r3 = client.responses.create(model=MODEL, input="c")

    assert (r1.id, r1.output_text) == ("resp_1", "first")
    assert (c2.id, c2.choices[0].message.content) == ("chatcmpl-2", "second")
    assert (r3.id, r3.output_text) == ("resp_3", "third")
    assert [r.turn_index for r in server.requests] == [0, 1, 2]
    assert [r.path for r in server.requests] == [
        "/v1/responses",
        "/v1/chat/completions",
        "/v1/responses",
    ]
    assert server.turns_remaining == 0
    server.assert_no_violations()


def test_raw_turn_is_sent_byte_for_byte(serve: Serve) -> None:
    raw = 'not json at all { "ü'
    server = serve([raw_turn(raw)])
    client = client_for(server)

    http = client.responses.with_raw_response.create(model=MODEL, input="q").http_response

    assert http.status_code == 200
    assert http.headers["content-type"] == "application/json"
    assert http.content == raw.encode("utf-8")


def test_malformed_body_fields_are_replayed_verbatim(serve: Serve) -> None:
    broken_args = '{"sku": "A-0'  # truncated JSON, as a model might emit
    body = responses_turn(
        calls=[fn_call("lookup_stock", broken_args, call_id="call_x")], usage=None
    )
    body["status"] = "bogus-status"
    server = serve([turn(body), turn(body)])
    client = client_for(server)

    http = client.responses.with_raw_response.create(model=MODEL, input="q").http_response
    response = client.responses.create(model=MODEL, input="q")

    assert http.json() == body
    assert "usage" not in http.json()
    call = response.output[0]
    assert call.type == "function_call" and call.arguments == broken_args
    assert str(response.status) == "bogus-status"
    assert response.usage is None


def test_error_status_and_retry_after_header_are_replayed(serve: Serve) -> None:
    server = serve(
        [
            {
                "status": 429,
                "headers": {"Retry-After": "0"},
                "body": {"error": {"message": "rate limited", "type": "rate_limit"}},
            }
        ]
    )
    client = client_for(server)

    with pytest.raises(openai.RateLimitError) as exc:
        client.responses.create(model=MODEL, input="q")

    assert exc.value.status_code == 429
    assert exc.value.response.headers["retry-after"] == "0"
    assert exc.value.body == {"message": "rate limited", "type": "rate_limit"}
    assert server.requests[0].turn_index == 0
    assert server.requests[0].status == 429
    server.assert_no_violations()


def test_sdk_retry_consumes_the_next_turn(serve: Serve) -> None:
    server = serve(
        [
            error_turn(503, "overloaded", retry_after="0.001"),
            turn(responses_turn(text="after retry")),
        ]
    )
    client = client_for(server, max_retries=1)

    response = client.responses.create(model=MODEL, input="q")

    assert response.output_text == "after retry"
    assert [r.status for r in server.requests] == [503, 200]
    assert [r.headers["x-stainless-retry-count"] for r in server.requests] == ["0", "1"]


def test_delay_seconds_is_waited_out_before_answering(serve: Serve) -> None:
    delays: list[float] = []
    server = serve(
        [turn(responses_turn(text="slow"), delay_seconds=0.25), turn(responses_turn(text="fast"))],
        sleep=delays.append,
    )
    client = client_for(server)

    assert client.responses.create(model=MODEL, input="q").output_text == "slow"
    assert client.responses.create(model=MODEL, input="q").output_text == "fast"
    assert delays == [0.25]


def test_chunk_interval_alone_paces_a_stream_one_event_at_a_time(serve: Serve) -> None:
    """`chunk_interval_seconds` without `chunk_bytes` waits between the stream's events
    (it did nothing: the stream went out in one write); with it, between the pieces."""
    waits: list[float] = []
    paced = {**turn(responses_turn(text="paced")), "chunk_interval_seconds": 0.25}
    pieces = {**turn(responses_turn(text="pieces")), "chunk_interval_seconds": 0.5,
              "chunk_bytes": 4096}
    server = serve([paced, pieces], sleep=waits.append)
    client = client_for(server)
    events = list(client.responses.create(model=MODEL, input="q", stream=True))
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == "paced"
    assert waits == [0.25] * (len(events) - 1)  # one write per event
    waits.clear()
    events = list(client.responses.create(model=MODEL, input="q", stream=True))
    assert events[-1].response.output_text == "pieces"
    assert waits == []  # the whole stream is one 4 KiB piece: nothing to wait between


def test_exhausted_script_answers_500_and_records_violation(serve: Serve) -> None:
    server = serve([turn(responses_turn(text="only"))])
    client = client_for(server)
    client.responses.create(model=MODEL, input="q")

    with pytest.raises(openai.InternalServerError) as exc:
        client.responses.create(model=MODEL, input="again")

    assert exc.value.status_code == 500
    assert exc.value.body == {
        "message": "scripted server: script exhausted after 1 turns",
        "type": "server_error",
        "param": None,
        "code": None,
    }
    assert len(server.violations) == 1
    assert "script exhausted after 1 turns" in server.violations[0]
    assert server.requests[-1].turn_index is None


def test_append_adds_turns_while_running(serve: Serve) -> None:
    server = serve([turn(responses_turn(text="one"))])
    client = client_for(server)
    assert client.responses.create(model=MODEL, input="q").output_text == "one"

    server.append(turn(responses_turn(id="resp_2", text="two")))

    assert client.responses.create(model=MODEL, input="q").output_text == "two"
    assert server.turns_consumed == 2


def test_concurrent_requests_each_consume_a_distinct_turn(serve: Serve) -> None:
    n = 8
    server = serve([turn(responses_turn(id=f"resp_{i}", text=f"t{i}")) for i in range(n)])
    client = client_for(server)
    results: list[str] = []
    lock = threading.Lock()

    def call() -> None:
        text = client.responses.create(model=MODEL, input="q").output_text
        with lock:
            results.append(text)

    threads = [threading.Thread(target=call) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert sorted(results) == sorted(f"t{i}" for i in range(n))
    assert sorted(r.turn_index for r in server.requests if r.turn_index is not None) == list(
        range(n)
    )
    server.assert_no_violations()


# ------------------------------------------------------------------------------------- recording


def test_requests_are_recorded_with_headers_and_body(serve: Serve) -> None:
    server = serve([turn(responses_turn(text="ok"))])
    client = client_for(server)

    response = client.responses.create(
        model=MODEL,
        input=[{"role": "user", "content": "在庫は？"}],
        store=False,
        extra_headers={"Idempotency-Key": "wf-1/act-2/attempt-1"},
    )

    assert response._request_id == "req_scripted_1"
    (recorded,) = server.requests
    assert recorded.method == "POST"
    assert recorded.path == "/v1/responses"
    assert recorded.headers["idempotency-key"] == "wf-1/act-2/attempt-1"
    assert recorded.headers["authorization"] == "Bearer test"
    assert recorded.body == {
        "model": MODEL,
        "input": [{"role": "user", "content": "在庫は？"}],
        "store": False,
    }
    assert json.loads(recorded.raw_body) == recorded.body
    assert (recorded.turn_index, recorded.status, recorded.violations) == (0, 200, ())


def test_non_json_request_body_is_rejected_and_recorded(serve: Serve) -> None:
    server = serve([turn(responses_turn(text="unused"))])
    client = client_for(server)

    with pytest.raises(openai.BadRequestError) as exc:
        client.post(
            "/responses",
            content=b"{oops",
            options={"headers": {"Content-Type": "application/json"}},
            cast_to=httpx2.Response,
        )

    assert "could not parse the JSON body" in exc.value.message
    (recorded,) = server.requests
    assert (recorded.body, recorded.raw_body, recorded.turn_index) == (None, b"{oops", None)
    assert server.turns_consumed == 0


def test_unknown_path_is_404_and_a_violation(serve: Serve) -> None:
    server = serve([turn(responses_turn(text="unused"))])
    client = client_for(server)

    with pytest.raises(openai.NotFoundError) as exc:
        client.get("/models", cast_to=httpx2.Response)

    assert "Invalid URL (GET /v1/models)" in exc.value.message
    assert server.violations == ["request #1 GET /v1/models: unexpected request GET /v1/models"]
    assert server.turns_consumed == 0


# ------------------------------------------------------------------------------------- strict

_FC_A = {
    "type": "function_call",
    "call_id": "call_a",
    "name": "lookup_stock",
    "arguments": '{"sku": "A-001"}',
}
_OUT_A = {"type": "function_call_output", "call_id": "call_a", "output": '{"stock": 12}'}
_USER = {"role": "user", "content": "A-001の在庫は？"}
_TOOL = {
    "type": "function",
    "name": "lookup_stock",
    "parameters": {"type": "object", "properties": {"sku": {"type": "string"}}},
}


def _responses(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "input": [_USER, _FC_A, _OUT_A], "tools": [_TOOL]}
    body.update(overrides)
    return {k: v for k, v in body.items() if v is not None}


RESPONSES_VIOLATIONS = [
    pytest.param(
        _responses(input=[_USER, _FC_A]),
        "No tool output found for function call call_a.",
        id="call-without-output",
    ),
    pytest.param(
        _responses(input=[_USER, {**_OUT_A, "call_id": "call_zzz"}]),
        "No tool call found for function call output with call_id call_zzz.",
        id="output-without-call",
    ),
    pytest.param(
        _responses(input=[_USER, _OUT_A, _FC_A]),
        "No tool call found for function call output with call_id call_a.",
        id="output-before-call",
    ),
    pytest.param(
        _responses(input=[_USER, _FC_A, _OUT_A, _OUT_A]),
        "Duplicate function call output found for call_id call_a",
        id="duplicate-output",
    ),
    pytest.param(
        _responses(input=[_USER, {**_FC_A, "arguments": {"sku": "A-001"}}, _OUT_A]),
        "Invalid type for 'input[1].arguments': expected a string, but got an object instead.",
        id="arguments-not-string",
    ),
    pytest.param(
        _responses(input=[_USER, _FC_A, {**_OUT_A, "output": {"stock": 12}}]),
        "Invalid type for 'input[2].output': expected one of a string or array of input "
        "content parts, but got an object instead.",
        id="output-not-string",
    ),
    pytest.param(
        {"input": "hi"},
        "Missing required parameter: 'model'.",
        id="missing-model",
    ),
    pytest.param(
        _responses(input=42),
        "Invalid type for 'input'",
        id="input-not-string-or-list",
    ),
    pytest.param(
        _responses(tools={"type": "function"}),
        "Invalid type for 'tools': expected an array, but got an object instead.",
        id="tools-not-list",
    ),
    pytest.param(
        _responses(tools=[{"type": "function", "function": {"name": "lookup_stock"}}]),
        "Missing required parameter: 'tools[0].name'.",
        id="chat-style-tool",
    ),
    pytest.param(
        _responses(tools=[{"type": "function", "name": "lookup_stock"}]),
        "Missing required parameter: 'tools[0].parameters'.",
        id="tool-without-parameters",
    ),
    pytest.param(
        _responses(tools=["lookup_stock"]),
        "Invalid type for 'tools[0]': expected an object, but got a string instead.",
        id="tool-not-object",
    ),
    pytest.param(
        _responses(tool_choice="sometimes"),
        "Invalid value for 'tool_choice': 'sometimes'. "
        "Supported values are: 'none', 'auto', and 'required'.",
        id="bad-tool-choice",
    ),
    pytest.param(
        _responses(input=[_USER, {**_FC_A, "id": "fc_a"}, _OUT_A, {**_FC_A, "id": "fc_a"}]),
        "Duplicate item found with id fc_a.",
        id="duplicate-item-id",
    ),
    pytest.param(
        _responses(input=[{"role": "tool", "content": "x"}]),
        "Invalid value for 'input[0].role': 'tool'.",
        id="bad-message-role",
    ),
    pytest.param(
        _responses(previous_response_id="resp_never_served", input=[_USER]),
        "Previous response with id 'resp_never_served' not found.",
        id="unknown-previous-response",
    ),
]


@pytest.mark.parametrize(("body", "expected"), RESPONSES_VIOLATIONS)
def test_responses_request_violations_are_400_and_recorded(
    serve: Serve, body: dict[str, Any], expected: str
) -> None:
    server = serve([turn(responses_turn(text="unused"))])
    client = client_for(server)

    with pytest.raises(openai.BadRequestError) as exc:
        post_json(client, "/responses", body)

    assert exc.value.status_code == 400
    assert isinstance(exc.value.body, dict)
    assert exc.value.body["type"] == "invalid_request_error"
    assert any(expected in v for v in server.violations), server.violations
    assert any(expected in v for v in server.requests[0].violations)
    assert server.requests[0].turn_index is None
    assert server.turns_consumed == 0
    # The rejected request consumed nothing: a valid one still gets the first turn.
    assert post_json(client, "/responses", _responses()).json()["id"] == "resp_1"


RESPONSES_ACCEPTED = [
    pytest.param(_responses(), id="paired-call"),
    pytest.param(_responses(input="just a string", tools=None), id="string-input"),
    pytest.param(
        _responses(
            input=[_USER, _FC_A, {**_OUT_A, "output": [{"type": "input_text", "text": "12"}]}]
        ),
        id="output-as-content-parts",
    ),
    pytest.param(
        _responses(tool_choice={"type": "function", "name": "lookup_stock"}),
        id="tool-choice-object",
    ),
    pytest.param(_responses(tools=[{"type": "web_search"}]), id="builtin-tool"),
]


@pytest.mark.parametrize("body", RESPONSES_ACCEPTED)
def test_valid_responses_requests_pass_strict_validation(
    serve: Serve, body: dict[str, Any]
) -> None:
    server = serve([turn(responses_turn(text="ok"))])

    assert post_json(client_for(server), "/responses", body).status_code == 200
    assert server.violations == []
    assert server.requests[0].turn_index == 0


def _served_reasoning_then_call(serve: Serve) -> tuple[ScriptedModelServer, list[dict[str, Any]]]:
    """Serve reasoning rs_1 + function_call call_a; return the server and the replayed items."""
    server = serve(
        [
            turn(
                responses_turn(
                    reasoning=reasoning_item("rs_1", "enc-rs-1"),
                    calls=[fn_call("lookup_stock", {"sku": "A-001"}, call_id="call_a")],
                )
            ),
            turn(responses_turn(id="resp_2", text="done")),
        ]
    )
    first = client_for(server).responses.create(model=MODEL, input=[_USER], tools=[_TOOL])  # type: ignore[list-item]
    items = [item.model_dump(exclude_none=True) for item in first.output]
    assert [i["type"] for i in items] == ["reasoning", "function_call"]
    return server, items


def test_replaying_the_served_reasoning_before_its_call_is_accepted(serve: Serve) -> None:
    server, (rs, fc) = _served_reasoning_then_call(serve)
    extra_rs = reasoning_item("rs_other", None)

    body = _responses(input=[_USER, rs, extra_rs, fc, _OUT_A])

    assert post_json(client_for(server), "/responses", body).json()["id"] == "resp_2"
    server.assert_no_violations()


@pytest.mark.parametrize(
    ("arrange", "expected"),
    [
        pytest.param(
            lambda rs, fc: [_USER, fc, _OUT_A],
            "Item 'fc_a' of type 'function_call' was provided without its required "
            "'reasoning' item: 'rs_1'.",
            id="reasoning-dropped",
        ),
        pytest.param(
            lambda rs, fc: [_USER, rs, {"role": "assistant", "content": "hm"}, fc, _OUT_A],
            "Item 'fc_a' of type 'function_call' was provided without its required "
            "'reasoning' item: 'rs_1'.",
            id="message-between-reasoning-and-call",
        ),
        pytest.param(
            lambda rs, fc: [_USER, fc, rs, _OUT_A],
            "without its required 'reasoning' item: 'rs_1'",
            id="reasoning-after-call",
        ),
        pytest.param(
            lambda rs, fc: [_USER, {**rs, "encrypted_content": "tampered"}, fc, _OUT_A],
            "The encrypted content for item rs_1 could not be verified",
            id="encrypted-content-changed",
        ),
        pytest.param(
            lambda rs, fc: [
                _USER,
                {k: v for k, v in rs.items() if k != "encrypted_content"},
                fc,
                _OUT_A,
            ],
            "The encrypted content for item rs_1 could not be verified",
            id="encrypted-content-dropped",
        ),
    ],
)
def test_served_reasoning_must_precede_its_function_call(
    serve: Serve,
    arrange: Callable[[dict[str, Any], dict[str, Any]], list[Any]],
    expected: str,
) -> None:
    server, (rs, fc) = _served_reasoning_then_call(serve)

    with pytest.raises(openai.BadRequestError) as exc:
        post_json(client_for(server), "/responses", _responses(input=arrange(rs, fc)))

    assert expected in exc.value.message
    assert len(server.violations) == 1 and expected in server.violations[0]
    assert server.turns_consumed == 1


def test_previous_response_id_brings_served_calls_into_context(serve: Serve) -> None:
    server, _ = _served_reasoning_then_call(serve)

    body = {"model": MODEL, "previous_response_id": "resp_1", "input": [_OUT_A]}

    assert post_json(client_for(server), "/responses", body).json()["id"] == "resp_2"
    server.assert_no_violations()


_CALLS_AB = [
    chat_tool_call("lookup_stock", {"sku": "A-001"}, id="call_a"),
    chat_tool_call("lookup_stock", {"sku": "B-002"}, id="call_b"),
]
_ASSISTANT_CALLS: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": _CALLS_AB}
_TOOL_A = {"role": "tool", "tool_call_id": "call_a", "content": '{"stock": 12}'}
_TOOL_B = {"role": "tool", "tool_call_id": "call_b", "content": '{"stock": 0}'}
_CHAT_USER = {"role": "user", "content": "A-001とB-002の在庫は？"}


def _chat(messages: list[Any] | None, **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "messages": messages}
    body.update(overrides)
    return {k: v for k, v in body.items() if v is not None}


def _with_call(index: int, **changes: Any) -> dict[str, Any]:
    calls = [dict(c) for c in _CALLS_AB]
    calls[index].update(changes)
    return {**_ASSISTANT_CALLS, "tool_calls": calls}


CHAT_VIOLATIONS = [
    pytest.param(_chat(None), "Missing required parameter: 'messages'.", id="missing-messages"),
    pytest.param(
        _chat([]),
        "Invalid 'messages': empty array. Expected an array with minimum length 1",
        id="empty-messages",
    ),
    pytest.param(
        {"messages": [_CHAT_USER]}, "Missing required parameter: 'model'.", id="missing-model"
    ),
    pytest.param(
        _chat([{"role": "bot", "content": "hi"}]),
        "Invalid value for 'messages[0].role': 'bot'. Supported values are: 'system', "
        "'developer', 'user', 'assistant', and 'tool'.",
        id="bad-role",
    ),
    pytest.param(
        _chat([_CHAT_USER, _ASSISTANT_CALLS, _TOOL_A]),
        "An assistant message with 'tool_calls' must be followed by tool messages responding "
        "to each 'tool_call_id'. The following tool_call_ids did not have response messages: "
        "call_b",
        id="missing-tool-response",
    ),
    pytest.param(
        _chat([_CHAT_USER, _ASSISTANT_CALLS, _TOOL_A, _CHAT_USER, _TOOL_B]),
        "The following tool_call_ids did not have response messages: call_b",
        id="user-message-before-tool-response",
    ),
    pytest.param(
        _chat(
            [_CHAT_USER, _ASSISTANT_CALLS, _TOOL_A, _TOOL_B, {**_TOOL_B, "tool_call_id": "call_z"}]
        ),
        "Invalid parameter: 'tool_call_id' of 'call_z' not found in 'tool_calls' of previous "
        "message.",
        id="extra-tool-response",
    ),
    pytest.param(
        _chat([_CHAT_USER, _ASSISTANT_CALLS, _TOOL_A, _TOOL_B, _TOOL_A]),
        "Duplicate tool message for tool_call_id 'call_a'",
        id="duplicate-tool-response",
    ),
    pytest.param(
        _chat([_CHAT_USER, _TOOL_A]),
        "Invalid parameter: messages with role 'tool' must be a response to a preceeding "
        "message with 'tool_calls'.",
        id="tool-without-assistant",
    ),
    pytest.param(
        _chat([_CHAT_USER, _with_call(0, id=""), _TOOL_A, _TOOL_B]),
        "Invalid 'messages[1].tool_calls[0].id': empty string.",
        id="empty-tool-call-id",
    ),
    pytest.param(
        _chat([_CHAT_USER, _with_call(1, type="custom"), _TOOL_A, _TOOL_B]),
        "Invalid value for 'messages[1].tool_calls[1].type': 'custom'. "
        "Supported values are: 'function'.",
        id="tool-call-type-not-function",
    ),
    pytest.param(
        _chat(
            [_CHAT_USER, _with_call(0, function={"name": "", "arguments": "{}"}), _TOOL_A, _TOOL_B]
        ),
        "Invalid 'messages[1].tool_calls[0].function.name': empty string.",
        id="empty-function-name",
    ),
    pytest.param(
        _chat(
            [
                _CHAT_USER,
                _with_call(0, function={"name": "lookup_stock", "arguments": {"sku": "A-001"}}),
                _TOOL_A,
                _TOOL_B,
            ]
        ),
        "Invalid type for 'messages[1].tool_calls[0].function.arguments': expected a string, "
        "but got an object instead.",
        id="arguments-not-string",
    ),
    pytest.param(
        _chat([_CHAT_USER, _ASSISTANT_CALLS, {**_TOOL_A, "content": {"stock": 12}}, _TOOL_B]),
        "Invalid type for 'messages[2].content': expected one of a string or array of text "
        "content parts, but got an object instead.",
        id="tool-content-not-string",
    ),
    pytest.param(
        _chat([_CHAT_USER, _ASSISTANT_CALLS, {"role": "tool", "content": "12"}, _TOOL_B]),
        "Missing required parameter: 'messages[2].tool_call_id'.",
        id="tool-message-without-id",
    ),
    pytest.param(
        _chat([_CHAT_USER], tools=[{"type": "function", "name": "lookup_stock"}]),
        "Missing required parameter: 'tools[0].function'.",
        id="responses-style-tool",
    ),
    pytest.param(
        _chat([_CHAT_USER], tool_choice="any"),
        "Invalid value for 'tool_choice': 'any'.",
        id="bad-tool-choice",
    ),
]


@pytest.mark.parametrize(("body", "expected"), CHAT_VIOLATIONS)
def test_chat_request_violations_are_400_and_recorded(
    serve: Serve, body: dict[str, Any], expected: str
) -> None:
    server = serve([turn(chat_turn(content="unused"))])
    client = client_for(server)

    with pytest.raises(openai.BadRequestError) as exc:
        post_json(client, "/chat/completions", body)

    assert exc.value.status_code == 400
    assert any(expected in v for v in server.violations), server.violations
    assert server.requests[0].turn_index is None
    assert server.turns_consumed == 0
    valid = _chat([_CHAT_USER, _ASSISTANT_CALLS, _TOOL_A, _TOOL_B])
    assert post_json(client, "/chat/completions", valid).json()["id"] == "chatcmpl-1"


CHAT_ACCEPTED = [
    pytest.param(_chat([_CHAT_USER, _ASSISTANT_CALLS, _TOOL_A, _TOOL_B]), id="in-order"),
    pytest.param(_chat([_CHAT_USER, _ASSISTANT_CALLS, _TOOL_B, _TOOL_A]), id="any-order"),
    pytest.param(
        _chat(
            [
                _CHAT_USER,
                _ASSISTANT_CALLS,
                {**_TOOL_A, "content": [{"type": "text", "text": "12"}]},
                _TOOL_B,
            ]
        ),
        id="tool-content-text-parts",
    ),
    pytest.param(
        _chat(
            [{"role": "developer", "content": "be brief"}, _CHAT_USER],
            tools=[{"type": "function", "function": {"name": "lookup_stock"}}],
            tool_choice="required",
        ),
        id="tools-and-tool-choice",
    ),
]


@pytest.mark.parametrize("body", CHAT_ACCEPTED)
def test_valid_chat_requests_pass_strict_validation(serve: Serve, body: dict[str, Any]) -> None:
    server = serve([turn(chat_turn(content="ok"))])

    assert post_json(client_for(server), "/chat/completions", body).status_code == 200
    assert server.violations == []


def test_non_strict_server_serves_invalid_requests(serve: Serve) -> None:
    server = serve([turn(responses_turn(text="served anyway"))], strict=False)

    response = post_json(client_for(server), "/responses", _responses(input=[_USER, _FC_A]))

    assert response.json()["output"][0]["content"][0]["text"] == "served anyway"
    assert server.violations == []
    assert server.requests[0].turn_index == 0


def test_script_strict_false_is_honoured(serve: Serve) -> None:
    server = serve({"strict": False, "turns": [turn(chat_turn(content="ok"))]})

    assert post_json(client_for(server), "/chat/completions", {"messages": []}).status_code == 200
    assert server.violations == []


def test_request_to_the_other_api_is_a_violation(serve: Serve) -> None:
    server = serve({"api": "responses", "turns": [turn(responses_turn(text="r"))]}, strict=False)
    client = client_for(server)

    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[_CHAT_USER])  # type: ignore[list-item]

    assert "this script speaks the 'responses' API" in server.violations[0]
    assert server.turns_consumed == 0
    assert client.responses.create(model=MODEL, input="q").output_text == "r"


# ------------------------------------------------------------------------------------- exchanges


def _lookup_stock(arguments: str) -> str:
    stock = {"A-001": 12, "B-002": 0}
    sku = json.loads(arguments)["sku"]
    return json.dumps({"sku": sku, "stock": stock[sku]})


def test_stock_example_runs_a_strictly_valid_responses_loop(serve: Serve) -> None:
    """Drive the shipped demo script the way a stateless tool loop does."""
    server = serve(load_script(STOCK_SCRIPT))
    client = client_for(server)
    items: list[Any] = [{"role": "user", "content": "A-001とB-002の在庫をそれぞれ調べて。"}]

    for _ in range(5):
        response = client.responses.create(
            model=MODEL,
            input=items,
            tools=[_TOOL],  # type: ignore[list-item]
            store=False,
            include=["reasoning.encrypted_content"],
        )
        items += [item.model_dump(exclude_none=True) for item in response.output]
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            break
        items += [
            {
                "type": "function_call_output",
                "call_id": c.call_id,
                "output": _lookup_stock(c.arguments),
            }
            for c in calls
        ]

    server.assert_no_violations()
    assert server.turns_consumed == 3 and server.turns_remaining == 0
    assert "A-001" in response.output_text and "12" in response.output_text
    assert "B-002" in response.output_text and "在庫切れ" in response.output_text
    assert response.usage is not None and response.usage.total_tokens > 0
    last_input = server.requests[-1].body["input"]
    assert [i.get("type") for i in last_input[1:4]] == [
        "reasoning",
        "function_call",
        "function_call_output",
    ]


def test_multi_turn_chat_exchange_passes_strict_validation(serve: Serve) -> None:
    server = serve(
        {
            "api": "chat",
            "turns": [
                turn(
                    chat_turn(
                        tool_calls=[
                            chat_tool_call("lookup_stock", {"sku": "A-001"}, id="call_a"),
                            chat_tool_call("lookup_stock", {"sku": "B-002"}, id="call_b"),
                        ],
                        usage=chat_usage(95, 40),
                    )
                ),
                turn(chat_turn(id="chatcmpl-2", content="A-001は12個、B-002は在庫切れです。")),
            ],
        }
    )
    client = client_for(server)
    messages: list[Any] = [_CHAT_USER]
    tools: Any = [{"type": "function", "function": {"name": "lookup_stock", "parameters": {}}}]

    first = client.chat.completions.create(model=MODEL, messages=messages, tools=tools)
    assistant = first.choices[0].message
    messages.append(assistant.model_dump(exclude_none=True))
    for call in reversed(assistant.tool_calls or []):  # answered in reverse: any order is fine
        assert call.type == "function"
        messages.append(
            {
                "role": "tool",
                "tool_call_id": call.id,
                "content": _lookup_stock(call.function.arguments),
            }
        )
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=tools)

    assert first.choices[0].finish_reason == "tool_calls"
    assert first.usage is not None and first.usage.total_tokens == 135
    assert second.choices[0].message.content == "A-001は12個、B-002は在庫切れです。"
    server.assert_no_violations()


# ------------------------------------------------------------------------------------- scripts


def test_load_script_accepts_object_and_list_shorthand(tmp_path: Path) -> None:
    turns = [turn(responses_turn(text="x")), raw_turn("{"), error_turn(429, "slow down")]
    obj = tmp_path / "obj.json"
    obj.write_text(json.dumps({"api": "chat", "strict": False, "turns": turns}), "utf-8")
    short = tmp_path / "list.json"
    short.write_text(json.dumps(turns), "utf-8")

    from_obj, from_list = load_script(obj), load_script(short)

    assert (from_obj.api, from_obj.strict) == ("chat", False)
    assert (from_list.api, from_list.strict) == (None, True)
    assert from_obj.turns == from_list.turns
    assert [t.status for t in from_list.turns] == [200, 200, 429]
    assert from_list.turns[1].payload() == b"{"


def test_server_accepts_a_path(serve: Serve, tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps([turn(responses_turn(text="from file"))]), "utf-8")

    server = serve(str(path))

    assert client_for(server).responses.create(model=MODEL, input="q").output_text == "from file"


@pytest.mark.parametrize(
    ("bad_turn", "expected"),
    [
        pytest.param({"body": {}, "raw": "x"}, "exactly one of 'body' or 'raw'", id="both"),
        pytest.param({"status": 500}, "exactly one of 'body' or 'raw'", id="neither"),
        pytest.param(responses_turn(text="x"), "wrap it as {'body': ...}", id="bare-body"),
        pytest.param({"body": {}, "bogus": 1}, "bogus", id="unknown-key"),
        pytest.param({"body": {}, "delay_seconds": -1}, "delay_seconds", id="negative-delay"),
    ],
)
def test_invalid_turns_are_rejected(bad_turn: dict[str, Any], expected: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=r".*") as exc:
        parse_script([bad_turn])
    assert expected in str(exc.value)


def test_body_may_be_json_null() -> None:
    script = parse_script([{"body": None}])
    assert script.turns[0].payload() == b"null"
    assert isinstance(script, Script) and isinstance(script.turns[0], Turn)


def test_module_entry_point_serves_a_script(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps([turn(responses_turn(text="by hand"))]), "utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "boundloop.scripted.server", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        base_url = proc.stdout.readline().strip()
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
        client = openai.OpenAI(api_key="test", base_url=base_url, max_retries=0)
        assert client.responses.create(model=MODEL, input="q").output_text == "by hand"
    finally:
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert "served 1 of 1 turns, 0 violation(s)" in stderr


# ------------------------------------------------------------------------------------- builders


def test_builder_defaults_are_valid_and_deterministic() -> None:
    assert usage() == usage(10, 5)
    assert (usage()["input_tokens"], usage()["output_tokens"], usage()["total_tokens"]) == (
        10,
        5,
        15,
    )
    assert (chat_usage()["prompt_tokens"], chat_usage()["total_tokens"]) == (10, 15)
    body = responses_turn(
        text="hi", reasoning=reasoning_item(), calls=[fn_call("f", {"q": "在庫"})]
    )
    assert body == responses_turn(
        text="hi", reasoning=reasoning_item(), calls=[fn_call("f", {"q": "在庫"})]
    )
    assert [i["id"] for i in body["output"]] == ["rs_1", "msg_1", "fc_1"]
    assert body["output"][2]["arguments"] == '{"q": "在庫"}'
    parsed = Response.model_validate(body)
    assert parsed.output_text == "hi"
    assert parsed.usage is not None and parsed.usage.total_tokens == 15
    chat = ChatCompletion.model_validate(chat_turn(tool_calls=[chat_tool_call("f", "{}")]))
    assert chat.choices[0].finish_reason == "tool_calls"
    assert chat_turn(content="x")["choices"][0]["finish_reason"] == "stop"
    assert "tool_calls" not in chat_turn(content="x")["choices"][0]["message"]


def test_builders_can_omit_usage_and_keep_malformed_arguments() -> None:
    assert "usage" not in responses_turn(text="x", usage=None)
    assert "usage" not in chat_turn(content="x", usage=None)
    assert fn_call("f", '{"a": ')["arguments"] == '{"a": '
    assert chat_tool_call("f", "not json")["function"]["arguments"] == "not json"
    assert "encrypted_content" not in reasoning_item("rs_2", None)
    incomplete = responses_turn(text="cut", status="incomplete")
    assert incomplete["incomplete_details"] == {"reason": "max_output_tokens"}


def test_responses_turn_rejects_duplicate_call_ids() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        responses_turn(calls=[fn_call("f", {}), fn_call("g", {})])


# ------------------------------------------------------------------------------------- pure checks


def test_reasoning_requirements_bind_only_an_immediately_following_call() -> None:
    output = [
        reasoning_item("rs_1", "e1"),
        fn_call("f", {}, call_id="call_1"),
        fn_call("g", {}, call_id="call_2"),
        reasoning_item("rs_2", None),
        {"type": "message", "id": "msg_1", "role": "assistant", "content": []},
        fn_call("h", {}, call_id="call_3"),
    ]

    required = reasoning_requirements(output)

    assert set(required) == {"call_1"}
    assert (required["call_1"].reasoning_id, required["call_1"].encrypted_content) == ("rs_1", "e1")


def test_validators_are_pure_and_accept_valid_bodies() -> None:
    body = _responses()
    snapshot = json.dumps(body)
    assert validate_responses_request(body) == []
    assert json.dumps(body) == snapshot
    assert validate_chat_request(_chat([_CHAT_USER, _ASSISTANT_CALLS, _TOOL_A, _TOOL_B])) == []
    assert validate_responses_request([]) == [
        "Invalid body: expected a JSON object, but got an array instead."
    ]
    assert validate_chat_request("x") == [
        "Invalid body: expected a JSON object, but got a string instead."
    ]
