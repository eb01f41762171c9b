"""Printing untrusted text (model output, call ids, questions) on a terminal.

Rich reads `[...]` as markup and a terminal obeys escape sequences: model text such as
`[/INST]` would crash a print, `[link=…]` would become a hyperlink, and ANSI codes
would restyle the screen. Everything that did not come from boundloop goes through
`safe`.
"""

from __future__ import annotations

import re

from rich.markup import escape

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def safe(text: object) -> str:
    """`text` with control characters replaced (U+FFFD) and rich markup escaped."""
    return escape(_CONTROL.sub("\ufffd", str(text)))
