"""Canonical JSON and byte measures shared by fingerprints, caps and digests.

Every byte count in boundloop is the UTF-8 length of compact JSON with non-ASCII kept
literal (`ensure_ascii=False`), so `"\\u5317\\u4eac"` and `"北京"` measure and hash alike.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    """Compact, key-sorted JSON with literal unicode: one text per JSON value."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def compact_json(value: Any) -> str:
    """Compact JSON keeping key order (what is sent to the model)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


#: The deepest a value written to history may nest lists and objects (a model's output
#: item, a tool's result). Temporal's payload converter writes no value nested past about
#: 250 levels, and reads none past about 200 back: a result in history the workflow could
#: never read is a stuck run. Real items and results nest a few levels.
MAX_DEPTH = 64


def nesting_depth(value: Any) -> int:
    """How many levels of lists and objects `value` nests (0 for a scalar)."""
    deepest, stack = 0, [(value, 0)]
    while stack:  # not recursive: a value may nest as deep as `json.loads` allows
        node, level = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, level + 1)
            stack.extend((v, level + 1) for v in (node.values() if isinstance(node, dict)
                                                  else node))
    return deepest


def utf8_len(text: str) -> int:
    """Bytes of `text` in UTF-8."""
    return len(text.encode("utf-8"))


def json_bytes(value: Any) -> int:
    """UTF-8 bytes of `compact_json(value)`."""
    return utf8_len(compact_json(value))


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def preview(text: str, max_bytes: int = 80) -> str:
    """`text` cut to at most `max_bytes` UTF-8 bytes without splitting a code point.

    An ellipsis marks a cut; it is counted inside the bound.
    """
    if utf8_len(text) <= max_bytes:
        return text
    mark = "…" if max_bytes >= utf8_len("…") else ""
    budget = max(0, max_bytes - utf8_len(mark))
    cut = text.encode("utf-8")[:budget].decode("utf-8", errors="ignore")
    return cut + mark
