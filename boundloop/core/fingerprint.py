"""Fingerprints: tool name + canonical JSON of the arguments (SPEC §1, seed 001).

Two calls are identical when their fingerprints match, whatever the key order,
whitespace or unicode escaping of the arguments the model wrote. Logs and the event
log carry the short hash form, never the arguments themselves.
"""

from __future__ import annotations

from typing import Any

from boundloop.core.canonical import canonical_json, sha256_hex


def fingerprint(tool: str, arguments: Any) -> str:
    """`"<tool>:<16 hex>"`: sha256 of `tool + "\\n" + canonical_json(arguments)`, shortened.

    `arguments` is the parsed JSON value (normally a dict). 64 bits of hash keep
    accidental collisions out of reach for the few hundred calls of a run.
    """
    digest = sha256_hex(tool + "\n" + canonical_json(arguments))
    return f"{tool}:{digest[:16]}"
