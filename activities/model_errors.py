"""Map a failed model request to Temporal's retry semantics (one retry layer).

408, 409, 429, 5xx and connection failures are retryable, honouring `Retry-After`
(seconds or an HTTP date) and `retry-after-ms`; any other 4xx is non-retryable and
stops the run with `model_error`. A refusal for the context window (any status:
`mf.context_too_long`) is `context_length_exceeded`, never retried, and stops the run
with `context_exhausted`. Each failure is named (`classify`: connection refused,
DNS, TLS, HTTP status, timeout, with the host and port) in the error's message and
details; provider error bodies never are: they may echo keys or prompts.
"""

from __future__ import annotations

import socket
import ssl
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

import openai
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from boundloop.core import model_failures as mf
from boundloop.core.model_failures import ModelFailure
from boundloop.errors import MODEL_REQUEST_REJECTED, MODEL_REQUEST_RETRYABLE

RETRYABLE_STATUS = frozenset({408, 409, 429})


def retry_after(headers: dict[str, str] | None, now: datetime | None = None) -> timedelta | None:
    """The delay a provider asked for, or None. Bounded to 5 minutes."""
    if not headers:
        return None
    lower = {k.lower(): v for k, v in headers.items()}
    delay: float | None = None
    if "retry-after-ms" in lower:
        try:
            delay = float(lower["retry-after-ms"]) / 1000
        except ValueError:
            delay = None
    if delay is None and "retry-after" in lower:
        value = lower["retry-after"].strip()
        try:
            delay = float(value)
        except ValueError:
            try:
                when = parsedate_to_datetime(value)
                delay = (when - (now or datetime.now(UTC))).total_seconds()
            except (TypeError, ValueError):
                delay = None
    if delay is None or delay < 0:
        return None
    return timedelta(seconds=min(delay, 300.0))


def classify(exc: Exception, timeout_seconds: float) -> ModelFailure:
    """The operator's name for a failed request: the kind and a one-line detail with the
    host and port (from the request URL, never its path, query or credentials)."""
    request = getattr(exc, "request", None)
    url = getattr(request, "url", None)
    target = mf.endpoint(getattr(url, "host", None), getattr(url, "port", None),
                         getattr(url, "scheme", None))
    if isinstance(exc, openai.APIStatusError):
        if mf.context_too_long(exc.body):
            return mf.context_failure(exc.status_code, target, exc.body)
        return mf.http_failure(exc.status_code, target)
    if isinstance(exc, openai.APITimeoutError):
        return mf.timeout_failure(timeout_seconds, target)
    if isinstance(exc, openai.APIConnectionError):
        return mf.connection_failure(_connection_kind(exc), target)
    return ModelFailure(kind=mf.WORKER_ERROR, detail=f"model request failed: "
                                                     f"{type(exc).__name__}")


def _connection_kind(exc: BaseException) -> str:
    """Walk the cause chain (SDK -> httpx -> httpcore -> OSError) to the socket's error."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ssl.SSLError):
            return mf.TLS
        if isinstance(cur, socket.gaierror):
            return mf.DNS
        if isinstance(cur, ConnectionRefusedError):
            return mf.CONNECTION_REFUSED
        cur = cur.__cause__ or cur.__context__
    return mf.CONNECTION


def to_application_error(exc: Exception, timeout_seconds: float = 60.0,
                         charge: tuple[Any, ...] = ()) -> ApplicationError:
    """The ApplicationError the model activity raises for `exc`: its message is the
    failure's detail, its first detail the `ModelFailure` (for the workflow's event log).

    A provider's answer or a transport failure is an expected failure: Temporal's benign
    category, so the worker logs it in the one line of "model request failed", without
    the SDK's traceback (that is for failures in our own code). `charge`: the attempt's
    `Charge` record, after the failure (whether the request reached the provider)."""
    failure = classify(exc, timeout_seconds)
    details = [failure.model_dump(), *charge]
    benign = ApplicationErrorCategory.BENIGN
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        retryable = (status in RETRYABLE_STATUS or status >= 500) \
            and failure.kind != mf.CONTEXT_LENGTH_EXCEEDED  # the same request fails again
        return ApplicationError(
            failure.detail, *details,
            type=MODEL_REQUEST_RETRYABLE if retryable else MODEL_REQUEST_REJECTED,
            non_retryable=not retryable,
            next_retry_delay=retry_after(dict(exc.response.headers)) if retryable else None,
            category=benign)
    if isinstance(exc, openai.APIConnectionError):  # timeouts included
        return ApplicationError(failure.detail, *details, type=MODEL_REQUEST_RETRYABLE,
                                category=benign)
    return ApplicationError(failure.detail, *details, type=MODEL_REQUEST_REJECTED,
                            non_retryable=True)
