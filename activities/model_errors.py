"""Map a failed model request to Temporal's retry semantics (one retry layer).

408, 409, 429, 5xx and connection failures are retryable, honouring `Retry-After`
(seconds or an HTTP date) and `retry-after-ms`; any other 4xx is non-retryable and
stops the run with `model_error`. Messages carry the status only: provider error
bodies may echo keys or prompts.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime

import openai
from temporalio.exceptions import ApplicationError

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


def to_application_error(exc: Exception) -> ApplicationError:
    """The ApplicationError the model activity raises for `exc`."""
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        retryable = status in RETRYABLE_STATUS or status >= 500
        return ApplicationError(
            f"model request failed: HTTP {status}",
            type=MODEL_REQUEST_RETRYABLE if retryable else MODEL_REQUEST_REJECTED,
            non_retryable=not retryable,
            next_retry_delay=retry_after(dict(exc.response.headers)) if retryable else None)
    if isinstance(exc, openai.APITimeoutError):
        return ApplicationError("model request timed out", type=MODEL_REQUEST_RETRYABLE)
    if isinstance(exc, openai.APIConnectionError):
        return ApplicationError("model request could not connect", type=MODEL_REQUEST_RETRYABLE)
    return ApplicationError(f"model request failed: {type(exc).__name__}",
                            type=MODEL_REQUEST_REJECTED, non_retryable=True)
