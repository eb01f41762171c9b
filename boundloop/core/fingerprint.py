"""Fingerprints: tool name + canonical JSON of the arguments.

Two calls are identical when their fingerprints match, whatever the key order,
whitespace or unicode escaping of the arguments the model wrote. Logs and the event
log carry the short hash form, never the arguments themselves.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from boundloop.core.canonical import canonical_json, preview, sha256_hex


def fingerprint(tool: str, arguments: Any) -> str:
    """`"<tool>:<16 hex>"`: sha256 of `tool + "\\n" + canonical_json(arguments)`, shortened.

    `arguments` is the parsed JSON value (normally a dict). 64 bits of hash keep
    accidental collisions out of reach for the few hundred calls of a run.
    """
    digest = sha256_hex(tool + "\n" + canonical_json(arguments))
    return f"{tool}:{digest[:16]}"


def invalid_fingerprint(tool: str, arguments_text: str) -> str:
    """The fingerprint of a call whose arguments failed validation (same form).

    The canonical JSON of the arguments when the text parses as JSON, else the exact
    text (marked so it never equals a canonical JSON text): repeating an invalid call
    counts toward the identical-call limit like repeating a valid one.
    """
    try:
        body = canonical_json(json.loads(arguments_text))
        body.encode("utf-8")  # an unpaired surrogate escape cannot be hashed as UTF-8
    except (ValueError, RecursionError):  # not JSON, >4300-digit ints, surrogates
        body = "text:" + arguments_text
    digest = hashlib.sha256((tool + "\n" + body).encode("utf-8", "surrogatepass")).hexdigest()
    # An unknown tool's name is the model's text: keep the label short (the hash covers
    # the whole name); registry names are shorter, so their form is the same as above.
    return f"{preview(tool, 60)}:{digest[:16]}"
