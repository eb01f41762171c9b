"""Every environment variable the guide lists is read by the one settings object, and
nothing else in boundloop reads the environment."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from boundloop.exit_codes import ExitCode
from boundloop.settings import Settings, worker_settings_problem
from boundloop.worker.main import main
from boundloop.worker.plugin import deployment_version

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


def test_worker_versioning_needs_both_variables_in_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    for given in ({"BOUNDLOOP_DEPLOYMENT_NAME": "boundloop"}, {"BOUNDLOOP_BUILD_ID": "v2"}):
        with pytest.raises(SystemExit) as exit_:
            main(Settings(**given))  # type: ignore[arg-type]
        assert exit_.value.code == ExitCode.INVALID
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "worker versioning needs both" in err
        assert "BOUNDLOOP_DEPLOYMENT_NAME" in err and "BOUNDLOOP_BUILD_ID" in err
    both = Settings(BOUNDLOOP_DEPLOYMENT_NAME="boundloop", BOUNDLOOP_BUILD_ID="v2")
    assert worker_settings_problem(both) is None
    assert worker_settings_problem(Settings()) is None
    assert deployment_version(None, None) is None
    with pytest.raises(ValueError, match="must not contain"):
        deployment_version("bound.loop", "v2")
