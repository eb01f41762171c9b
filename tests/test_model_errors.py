"""HTTP failures of model requests mapped to Temporal retry semantics (one retry layer)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx2 as httpx
import openai
import pytest

from boundloop.activities.model_errors import retry_after, to_application_error


def status_error(status: int, headers: dict[str, str] | None = None) -> openai.APIStatusError:
    request = httpx.Request("POST", "http://127.0.0.1/v1/responses")
    response = httpx.Response(status, headers=headers or {}, request=request,
                              json={"error": {"message": "sk-secret leaked in body"}})
    return openai.APIStatusError("sk-secret leaked in body", response=response, body=None)


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503])
def test_transient_statuses_are_retryable(status: int) -> None:
    err = to_application_error(status_error(status))
    assert not err.non_retryable and err.type == "ModelRequestRetryable"


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_other_client_errors_are_not_retried(status: int) -> None:
    err = to_application_error(status_error(status))
    assert err.non_retryable and err.type == "ModelRequestRejected"


def test_messages_carry_the_status_not_the_provider_body() -> None:
    err = to_application_error(status_error(401))
    assert "401" in err.message and "sk-secret" not in err.message


def test_retry_after_is_honoured_in_seconds_ms_and_dates() -> None:
    now = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
    assert retry_after({"Retry-After": "7"}) == timedelta(seconds=7)
    assert retry_after({"retry-after-ms": "250"}) == timedelta(milliseconds=250)
    assert retry_after({"Retry-After": "Mon, 30 Nov 2026 12:00:30 GMT"}, now) == timedelta(
        seconds=30)
    assert retry_after({"Retry-After": "soon"}) is None
    assert retry_after({"Retry-After": "-3"}) is None
    assert retry_after({"Retry-After": "86400"}) == timedelta(minutes=5)


def test_retry_after_reaches_the_retry_delay() -> None:
    err = to_application_error(status_error(429, {"Retry-After": "3"}))
    assert err.next_retry_delay == timedelta(seconds=3)


def test_connection_failures_are_retryable() -> None:
    request = httpx.Request("POST", "http://127.0.0.1/v1/responses")
    err = to_application_error(openai.APIConnectionError(request=request))
    assert not err.non_retryable


@pytest.mark.parametrize("status", [400, 500])
def test_a_context_window_refusal_is_named_and_never_retried(status: int) -> None:
    """llama.cpp's refusal (an HTTP 500 from some of its versions: retried like any 5xx
    without the name) is `context_length_exceeded`, not retried: the same request would
    fail again. The body's text stays out of the message; its numbers are told."""
    request = httpx.Request("POST", "http://127.0.0.1:8080/v1/chat/completions")
    body = {"error": {"code": status, "message": "the request exceeds the available context "
                      "size, try increasing it (sk-secret)", "type": "exceed_context_size_error",
                      "n_prompt_tokens": 5012, "n_ctx": 4096}}
    response = httpx.Response(status, request=request, json=body)
    err = to_application_error(openai.APIStatusError("sk-secret", response=response,
                                                     body=body["error"]))
    assert err.non_retryable and err.type == "ModelRequestRejected"
    assert err.details[0]["kind"] == "context_length_exceeded"
    assert err.message == (f"HTTP {status} (over the model's context window: 5012 tokens "
                           "asked, context window 4096) from 127.0.0.1:8080")
