"""Final answers that look like tool calls (never executed, flagged).

Small models often write a call as text, e.g. `{"name": "lookup_stock", "arguments":
{"sku": "A-001"}}`, when they may not (or cannot) call tools. Such text is an answer,
never parsed for calls, but the run's result says so: an operator must not read it as
the answer the user wanted.
"""

from __future__ import annotations

import json
import re
from typing import Any

#: Code fences (```json … ```) and the `<tool_call>` tags some chat templates use.
_BLOCKS = re.compile(r"```[A-Za-z0-9_+-]*[ \t]*\n?(.*?)```|<tool_call>(.*?)</tool_call>",
                     re.DOTALL)
_NAME_KEYS = ("name", "tool", "tool_name", "function", "recipient_name")
_ARGUMENT_KEYS = ("arguments", "parameters", "args", "input")
#: The opening of a call object, `{"name": "create_ticket", …` (or `[{…`): what is left
#: to read when the rest is not JSON, as a small model's cut or garbled call often is.
_OPENING = re.compile(r'\[?\s*\{\s*"(?:' + "|".join(_NAME_KEYS)
                      + r')"\s*:\s*"([A-Za-z0-9_.:-]{1,128})"')


def looks_like_tool_call(text: str, tools: list[str]) -> bool:
    """True when `text` is, or holds in a code fence, a JSON object (or a list of them)
    that names a tool with arguments, or names one of `tools`; or begins as such an
    object naming one of `tools` even though the rest is not valid JSON."""
    candidates = [text] + [a or b for a, b in _BLOCKS.findall(text)]
    known = set(tools)
    return any(_names_a_call(_json_or_none(c), known) or _opens_a_call(c, known)
               for c in candidates)


def _opens_a_call(text: str, tools: set[str]) -> bool:
    """Text that is not JSON but begins as a call object naming one of `tools`."""
    opening = _OPENING.match(text.strip())
    return opening is not None and opening.group(1) in tools


def _json_or_none(text: str) -> Any:
    text = text.strip()
    if not text.startswith(("{", "[")):
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _names_a_call(value: Any, tools: set[str], depth: int = 0) -> bool:
    if depth > 3:  # wrappers nest a level or two ({"tool_calls": [{"function": …}]})
        return False
    if isinstance(value, list):
        return any(_names_a_call(v, tools, depth + 1) for v in value)
    if not isinstance(value, dict):
        return False
    if any(_names_a_call(value.get(k), tools, depth + 1) for k in ("function", "tool_calls")
           if isinstance(value.get(k), (dict, list))):
        return True
    name = next((v for k in _NAME_KEYS if isinstance(v := value.get(k), str)), None)
    if name is not None and (name in tools or any(k in value for k in _ARGUMENT_KEYS)):
        return True
    return any(k in tools and isinstance(v, dict) for k, v in value.items())
