"""Every environment variable the guide lists is read by the one settings object, and
nothing else in boundloop reads the environment."""

from __future__ import annotations

import re
from pathlib import Path

from boundloop.settings import Settings

ROOT = Path(__file__).resolve().parent.parent


def test_every_variable_the_readme_lists_is_a_setting() -> None:
    readme = (ROOT / "docs" / "guide.md").read_text(encoding="utf-8")
    table = readme[readme.index("### Configuration"):]
    table = table[:table.index("\n\n", table.index("| variable"))]
    listed = set(re.findall(r"^\| `([A-Z_]+)` \|", table, flags=re.M))
    aliases = {f.alias for f in Settings.model_fields.values()}
    assert listed and listed <= aliases, listed - aliases


def test_only_the_settings_module_reads_the_environment() -> None:
    readers = []
    for package in ("boundloop", "activities", "workflows", "worker"):
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            if re.search(r"os\.environ|os\.getenv", text) and path.name != "settings.py":
                readers.append(str(path.relative_to(ROOT)))
    assert readers == []
