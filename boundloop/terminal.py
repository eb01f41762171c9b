"""Printing untrusted text (model output, call ids, questions) on a terminal.

Rich reads `[...]` as markup and a terminal obeys escape sequences: model text such as
`[/INST]` would crash a print, `[link=…]` would become a hyperlink, and ANSI codes
would restyle the screen. Everything that did not come from boundloop goes through
`safe`.
"""

from __future__ import annotations

import re

from rich.markup import escape

# C0/C1 controls (ANSI escapes) and bidi overrides/isolates (text that reads backwards).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def safe(text: object) -> str:
    """`text` with control characters replaced (U+FFFD) and rich markup escaped."""
    return escape(_CONTROL.sub("\ufffd", str(text)))
