"""House rules the code itself can check: no import circle between the CLI and the
demo, no test-only switch in product code."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def imported(path: Path) -> set[str]:
    """Every module `path` imports, at the top or inside a function."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_the_demo_does_not_import_the_cli() -> None:
    assert "boundloop.cli" not in imported(ROOT / "boundloop" / "demo.py")


def test_no_test_only_switch_in_product_code() -> None:
    found = [str(p.relative_to(ROOT))
             for package in ("boundloop", "activities", "workflows", "worker")
             for p in (ROOT / package).rglob("*.py")
             if "BOUNDLOOP_TEST" in p.read_text(encoding="utf-8")]
    assert found == []


def test_the_distribution_installs_only_the_boundloop_namespace(tmp_path: Path) -> None:
    """A wheel built from the repo holds one top-level package, `boundloop`, with the
    repo's workflows/, activities/ and worker/ inside it as boundloop.workflows, ..."""
    import subprocess
    import sys
    import zipfile

    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                    "-q", "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True)
    [wheel] = tmp_path.glob("boundloop-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"boundloop"}
    for package in ("workflows", "activities", "worker"):
        assert f"boundloop/{package}/__init__.py" in names
    assert "boundloop/workflows/loop.py" in names


def test_the_cli_is_a_package_of_command_groups() -> None:
    # A `boundloop/cli.py` beside the package would be shadowed by it, silently.
    assert not (ROOT / "boundloop" / "cli.py").exists()
    assert all(p.stat().st_size < 16_000 for p in (ROOT / "boundloop" / "cli").glob("*.py"))


def test_no_product_module_holds_the_test_helpers() -> None:
    # Polling and free ports are the testing kit's (boundloop.testing), not the client's.
    for module in ("client.py", "devserver.py"):
        text = (ROOT / "boundloop" / module).read_text(encoding="utf-8")
        assert "def wait_until" not in text and "def free_port" not in text, module


def calls_in(package: str) -> list[tuple[Path, ast.Call]]:
    return [(p, node) for p in sorted((ROOT / package).rglob("*.py"))
            for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
            if isinstance(node, ast.Call)]


def named(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def test_messages_are_sent_by_their_handlers_not_by_name() -> None:
    """A signal, query or update is sent by its handler (`BoundLoopWorkflow.decide`): a
    renamed handler then fails type checking, not a run in production."""
    senders = {"signal", "query", "execute_update", "start_update",
               "execute_update_with_start_workflow", "start_update_with_start_workflow"}
    found = [f"{p.relative_to(ROOT)}:{c.lineno}" for p, c in calls_in("boundloop")
             if named(c) in senders and c.args and isinstance(c.args[0], ast.Constant)
             and isinstance(c.args[0].value, str)]
    assert found == []


def test_exit_statuses_come_from_the_one_table() -> None:
    """Every status the CLI, the worker and the demo exit with is an `ExitCode`
    (boundloop/exit_codes.py), never a bare number. `run_client` is the exception: it
    exits a user's script with Python's own statuses."""
    found = [f"{p.relative_to(ROOT)}:{c.lineno}" for p, c in calls_in("boundloop")
             if named(c) in {"Exit", "_exit", "exit"} and p.name != "process.py"
             and c.args and isinstance(c.args[0], ast.Constant)]
    assert found == []
