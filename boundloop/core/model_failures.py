"""Why a model request failed, named for an operator: a kind, a short detail, a hint.

The model activity classifies the SDK's error into a `ModelFailure`; it travels to the
workflow in the `ApplicationError`'s details and lands in the event log as
`model_failed:<kind>` with the detail. The CLI looks the hint up here by kind, so the
hints live in one table. Nothing here carries a key, a URL path or a provider body:
only the host and port, the HTTP status, the timeout.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

#: Event names of a failed model request start with this; the kind follows.
EVENT_PREFIX = "model_failed:"

CONNECTION_REFUSED = "connection_refused"
DNS = "dns"
TLS = "tls"
CONNECTION = "connection"  # any other connection failure (reset, closed mid-answer)
TIMEOUT = "timeout"
PAYLOAD_TOO_LARGE = "payload_too_large"
CONVERSATION_MISMATCH = "conversation_mismatch"
WORKER_ERROR = "worker_error"  # the activity raised something we did not map
#: The provider refused the request as longer than the model's context window (any
#: HTTP status): never retried; the run ends `context_exhausted`, not `model_error`.
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
#: The model activity sent nothing: under the `trim` or `summarize` context strategy no
#: stub or summary lets the request fit the window. Never retried; the run ends
#: `context_exhausted` with the step unsent, as under `stop`.
CONTEXT_NOT_FITTED = "context_not_fitted"


class ModelFailure(BaseModel):
    """What the activity reports and the event log keeps: `kind` is `http_<status>` or one
    of the names above; `detail` is one line without secrets."""

    model_config = ConfigDict(frozen=True)

    kind: str
    detail: str

    @staticmethod
    def from_details(details: Any) -> ModelFailure | None:
        """The failure an ApplicationError carried in its details, or None."""
        if not isinstance(details, list | tuple) or not details:
            return None
        try:
            return ModelFailure.model_validate(details[0])
        except ValidationError:
            return None


class Charge(BaseModel):
    """What a model attempt reports beside its failure (and in its heartbeats): whether
    its request went out to the provider. An attempt that failed, timed out, was lost or
    cancelled after it did is charged to the run and its shared budget: the worst case
    of its request (docs/budgets.md), since no usage came back for it."""

    model_config = ConfigDict(frozen=True)

    sent: bool
    output_bytes: int = 0

    @staticmethod
    def from_details(details: Any) -> Charge | None:
        """The charge record among an error's (or a heartbeat's) details, or None."""
        if not isinstance(details, list | tuple):
            return None
        for item in details:
            if isinstance(item, dict) and "sent" in item:
                try:
                    return Charge.model_validate(item)
                except ValidationError:
                    return None
        return None


def http_kind(status: int) -> str:
    return f"http_{status}"


def http_class(status: int) -> str:
    """The class of an HTTP status, as an operator reads it."""
    if status in (401, 403):
        return "authentication"
    if status == 404:
        return "model or route not found"
    if status == 408:
        return "provider timeout"
    if status == 429:
        return "rate limited"
    if status >= 500:
        return "provider error"
    return "request rejected"


def endpoint(host: str | None, port: int | None, scheme: str | None) -> str:
    """`host:port`, the port filled in from the scheme when the URL has none."""
    if port is None:
        port = 443 if scheme == "https" else 80
    return f"{host or '?'}:{port}"


def connection_failure(kind: str, target: str) -> ModelFailure:
    what = {CONNECTION_REFUSED: "connection refused by", DNS: "DNS lookup failed for",
            TLS: "TLS handshake failed with"}.get(kind, "connection failed to")
    return ModelFailure(kind=kind, detail=f"{what} {target}")


def http_failure(status: int, target: str) -> ModelFailure:
    return ModelFailure(kind=http_kind(status),
                        detail=f"HTTP {status} ({http_class(status)}) from {target}")


def timeout_failure(seconds: float, target: str | None = None) -> ModelFailure:
    where = f" from {target}" if target else ""
    return ModelFailure(kind=TIMEOUT, detail=f"no answer{where} after {seconds:g} s")


#: How providers say a request is over the context window: OpenAI's error code
#: (`context_length_exceeded`), llama.cpp's error type (`exceed_context_size_error`).
_CONTEXT_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error"})
#: ... and in words: llama.cpp ("the request exceeds the available context size"),
#: OpenAI and vLLM ("This model's maximum context length is N tokens").
_CONTEXT_WORDS = ("exceeds the available context size", "maximum context length is")
_NUMBER = re.compile(r"\d+")


def _error_object(body: Any) -> dict[str, Any] | None:
    """The error object of a provider's error body: `{"error": {...}}` or the body itself
    (vLLM answers `{"object": "error", "message": ...}`; the SDK hands the inner one)."""
    if not isinstance(body, dict):
        return None
    inner = body.get("error")
    return inner if isinstance(inner, dict) else body


def context_too_long(body: Any) -> bool:
    """Whether a provider's error body says the request is over the model's context
    window. Only read here, never passed on: a body may echo the prompt."""
    error = _error_object(body)
    if error is None:
        return isinstance(body, str) and any(w in body.lower() for w in _CONTEXT_WORDS)
    if any(isinstance(error.get(k), str) and error[k] in _CONTEXT_CODES
           for k in ("code", "type")):
        return True
    message = error.get("message")
    return isinstance(message, str) and any(w in message.lower() for w in _CONTEXT_WORDS)


def context_failure(status: int, target: str, body: Any) -> ModelFailure:
    """A refusal for the context window, with the window and the request's tokens when
    the provider gave them as numbers (llama.cpp's `n_ctx` and `n_prompt_tokens`, the
    first two numbers of OpenAI's and vLLM's message): numbers only, never its text."""
    error = _error_object(body) or {}
    window, asked = error.get("n_ctx"), error.get("n_prompt_tokens")
    said = error.get("message")
    message = said if isinstance(said, str) else ""
    numbers = [int(n) for n in _NUMBER.findall(message)][:2]
    if not isinstance(window, int) and "maximum context length" in message.lower() \
            and len(numbers) == 2:
        window, asked = numbers
    told = (f": {asked} tokens asked, context window {window}"
            if isinstance(window, int) and isinstance(asked, int) else "")
    return ModelFailure(kind=CONTEXT_LENGTH_EXCEEDED,
                        detail=f"HTTP {status} (over the model's context window{told}) "
                               f"from {target}")


_HINTS = {
    CONNECTION_REFUSED: "nothing listens there: check OPENAI_BASE_URL on the worker and that "
                        "the model server is running",
    DNS: "the host name does not resolve: check the host in OPENAI_BASE_URL on the worker",
    TLS: "check http:// vs https:// in OPENAI_BASE_URL and the server's certificate",
    CONNECTION: "the connection broke: check OPENAI_BASE_URL on the worker and the network "
                "between the worker and the model server",
    TIMEOUT: "the model did not answer in time: raise model_timeout_seconds (--limits "
             "'{\"model_timeout_seconds\": 120}') or check the model server's load",
    PAYLOAD_TOO_LARGE: "the response is over Temporal's payload limit: ask for shorter output",
    CONVERSATION_MISMATCH: "the worker could not rebuild the conversation from history: "
                           "see the worker log for this step",
    WORKER_ERROR: "the model activity failed inside the worker: see the worker log for this "
                  "step",
    CONTEXT_LENGTH_EXCEEDED: "the conversation outgrew the model's context window: set the "
                             "operator's context_windows entry for the model (or the run's "
                             "max_input_tokens) to the window the server really has, so the "
                             "run stops before sending, and keep tool results short "
                             "(max_result_bytes)",
    "authentication": "the key was refused: check OPENAI_API_KEY on the worker and its access "
                      "to the model",
    "model or route not found": "check the run's model name (--model, BOUNDLOOP_MODEL where "
                                "runs start), that OPENAI_BASE_URL ends in /v1, and --api chat "
                                "for servers without the Responses API",
    "request rejected": "the provider refused the request: check that the model supports "
                        "tools and the chosen API (--api responses|chat)",
    "provider timeout": "the provider timed out on every attempt: retry later or raise "
                        "model_timeout_seconds",
    "rate limited": "rate limited on every attempt: lower concurrency, wait, or raise the "
                    "provider's limits",
    "provider error": "the provider failed on every attempt: check its status page or logs",
}


def hint(kind: str) -> str:
    """The fix an operator tries first for a failure kind."""
    if kind.startswith("http_") and kind[5:].isdigit():
        return _HINTS[http_class(int(kind[5:]))]
    return _HINTS.get(kind, _HINTS[WORKER_ERROR])
