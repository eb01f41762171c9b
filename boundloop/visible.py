"""Characters a reader cannot see, made visible: control characters (C0, C1), format
characters (bidi overrides and isolates, zero-width spaces and joiners, soft hyphens),
line and paragraph separators, lone surrogates and the Hangul fillers that render as
blank. A right-to-left override makes `"\\u202e000,01$"` read as "$10,000"; a newline in
an id writes a second log line. Where such text is shown (logs, argument views), each of
these characters is written as its escape (`\\u202e`) instead.
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any

#: Unicode categories shown as escapes: controls, format characters, surrogates, line
#: and paragraph separators.
_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
#: Letters and marks that render as nothing (used to hide text).
_BLANK = frozenset("\u034f\u115f\u1160\u17b4\u17b5\u3164\uffa0")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def invisible(ch: str) -> bool:
    """`ch` is a character a reader cannot see or that changes how others display."""
    return ch in _BLANK or unicodedata.category(ch) in _CATEGORIES


def escape_of(ch: str) -> str:
    """`\\n`, `\\x1b`, `\\u202e` or `\\U000e0041`: how `ch` is written where shown."""
    code = ord(ch)
    if ch in _SHORT:
        return _SHORT[ch]
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def escaped(text: str) -> str:
    """`text` with every invisible character written as its escape (one line always)."""
    if not any(invisible(ch) for ch in text):
        return text
    return "".join(escape_of(ch) if invisible(ch) else ch for ch in text)


def _json_escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # a surrogate pair, as JSON writes a character past U+FFFF
    return f"\\u{0xd800 + (code >> 10):04x}\\u{0xdc00 + (code & 0x3ff):04x}"


def json_visible(text: str) -> str:
    """JSON text with its invisible characters as JSON escapes (`\\u202e`): the same
    document when parsed. Outside strings JSON has ASCII only, so every such character
    stands in a string, where the escape is valid; the text's own line breaks (between
    values, as `indent` writes them) stay."""
    if not any(ch != "\n" and invisible(ch) for ch in text):
        return text
    return "".join(_json_escape(ch) if ch != "\n" and invisible(ch) else ch for ch in text)


def json_text(value: Any, *, indent: int | None = 2, sort_keys: bool = False) -> str:
    """`value` as JSON whose invisible characters are JSON escapes (`json_visible`)."""
    return json_visible(json.dumps(value, ensure_ascii=False, indent=indent,
                                   sort_keys=sort_keys))


def has_invisible(value: Any, ordinary: str = "\n\r\t") -> bool:
    """Any string in `value` (keys included, nested) holds an invisible character other
    than the `ordinary` ones (line breaks and tabs, which JSON shows as `\\n`, `\\t`)."""
    if isinstance(value, str):
        return any(ch not in ordinary and invisible(ch) for ch in value)
    if isinstance(value, dict):
        return any(has_invisible(k, ordinary) or has_invisible(v, ordinary)
                   for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(has_invisible(v, ordinary) for v in value)
    return False
