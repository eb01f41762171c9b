"""The script format replayed by :class:`boundloop.scripted.server.ScriptedModelServer`.

A script is JSON, either an object::

    {
      "api": "responses",          # optional: "responses" | "chat"
      "strict": true,              # optional, default true: validate incoming requests
      "description": "...",        # optional, for humans
      "turns": [ <turn>, ... ]
    }

or, as a shorthand, just the list of turns. Each turn is one HTTP answer::

    {"body": {...}}                                     # 200, body serialised as JSON
    {"status": 429, "headers": {"Retry-After": "0"},
     "body": {"error": {"message": "rate limited", "type": "rate_limit"}}}
    {"raw": "not json at all {"}                        # sent byte-for-byte (UTF-8)
    {"body": {...}, "delay_seconds": 0.2}               # wait before answering
    {"body": {...}, "note": "why this turn exists"}     # optional, for humans

Exactly one of ``body`` (any JSON value, including ``null``) and ``raw`` (a string) must be
given. Bodies are not checked against the OpenAI schemas: a script may deliberately contain
malformed output, which is the point of replaying it verbatim.
"""

from __future__ import annotations

import json
import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from boundloop.scripted.sse import StreamFault

__all__ = ["ApiKind", "Script", "Turn", "load_script", "parse_script"]

ApiKind = Literal["responses", "chat"]

# Keys that mark a dict as a raw *response body* rather than a turn; used only to give a
# helpful error when someone passes ``responses_turn(...)`` where a turn was expected.
_BODY_MARKERS = frozenset({"object", "output", "choices", "usage", "id", "error"})


class Turn(BaseModel):
    """One scripted HTTP answer; consumed by exactly one accepted request, in order."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: int = Field(default=200, ge=100, le=599)
    """HTTP status code to answer with."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Extra response headers (e.g. ``Retry-After``); may override ``Content-Type``."""
    body: Any = None
    """Any JSON value, serialised with ``json.dumps(..., ensure_ascii=False)``."""
    raw: str | None = None
    """A string sent as-is (UTF-8) with ``Content-Type: application/json``."""
    delay_seconds: float = Field(default=0.0, ge=0.0)
    """Seconds to wait before answering (after the request has been recorded)."""
    note: str | None = None
    """Free text for humans reading the script; ignored by the server."""
    stream_fault: StreamFault | None = None
    """How the answer's stream breaks when the request asks for `stream: true`
    (``boundloop.scripted.sse``): cut, no_terminator, no_usage, error_event."""
    chunk_bytes: int | None = Field(default=None, ge=1)
    """Write a streamed answer this many bytes at a time (odd sizes split UTF-8
    characters and events across reads)."""
    chunk_interval_seconds: float = Field(default=0.0, ge=0.0)
    """Seconds between the writes of a streamed answer (a model writing at its pace):
    between its `chunk_bytes` pieces, or without `chunk_bytes` between its events."""

    @model_validator(mode="before")
    @classmethod
    def _looks_like_a_turn(cls, data: Any) -> Any:
        if isinstance(data, dict) and "body" not in data and "raw" not in data:
            markers = sorted(_BODY_MARKERS.intersection(data))
            if markers:
                raise ValueError(
                    f"this looks like a response body (it has {markers}), not a turn: "
                    "wrap it as {'body': ...}"
                )
            raise ValueError("a turn needs exactly one of 'body' or 'raw'")
        return data

    @model_validator(mode="after")
    def _body_xor_raw(self) -> Turn:
        if "body" in self.model_fields_set and self.raw is not None:
            raise ValueError("a turn takes exactly one of 'body' or 'raw', not both")
        return self

    def payload(self) -> bytes:
        """The exact bytes this turn answers with."""
        if self.raw is not None:
            return self.raw.encode("utf-8")
        return json.dumps(self.body, ensure_ascii=False).encode("utf-8")


class Script(BaseModel):
    """A whole script: which API it speaks, whether requests are validated, and the turns."""

    model_config = ConfigDict(extra="forbid")

    api: ApiKind | None = None
    """If set, a request to the other API's endpoint is a violation (400, no turn consumed)."""
    strict: bool = True
    """Validate incoming requests the way the real API does (see ``validation``)."""
    description: str | None = None
    """Free text for humans; ignored by the server."""
    turns: list[Turn] = Field(default_factory=list)


def parse_script(data: Any) -> Script:
    """Build a :class:`Script` from already-decoded JSON: an object, or a bare list of turns.

    Raises ``pydantic.ValidationError`` if the data does not follow the format.
    """
    if isinstance(data, Script):
        return data
    if isinstance(data, list):
        return Script.model_validate({"turns": data})
    return Script.model_validate(data)


def load_script(path: str | os.PathLike[str]) -> Script:
    """Read a UTF-8 JSON script file (object form or bare list of turns)."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return parse_script(data)
