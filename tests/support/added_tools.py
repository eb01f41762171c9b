"""A next release's toolset that adds a read-only tool, `count_words`, to the test
tools (a change any version may carry)."""

from __future__ import annotations

from typing import Any

from boundloop import Toolset
from boundloop.tools.demo import DemoDeps
from tests.support.tools import tools as test_tools

tools = Toolset[DemoDeps]()
tools.include(test_tools)


@tools.tool()
def count_words(text: str) -> dict[str, Any]:
    """Count the words of a text."""
    return {"words": len(text.split())}
