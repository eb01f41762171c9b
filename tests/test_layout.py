"""House rules the code itself can check: the core imports nothing but the standard
library, deterministic libraries and itself; no import circle between boundloop's
modules; one path per file; no test-only switch in product code. Read with `ast`:
nothing here imports the modules it checks."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Where each package of the distribution lives in the repo (pyproject.toml's
#: package-dir): the top-level workflows/, activities/ and worker/ are boundloop's.
PACKAGE_DIRS = {"boundloop": ROOT / "boundloop", "boundloop.workflows": ROOT / "workflows",
                "boundloop.activities": ROOT / "activities", "boundloop.worker": ROOT / "worker"}


def product_modules() -> dict[str, Path]:
    """Every module of the distribution, by its import name."""
    found: dict[str, Path] = {}
    for package, base in PACKAGE_DIRS.items():
        for path in sorted(base.rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


MODULES = product_modules()


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _imports_in(body: list[ast.stmt], *, type_checking: bool
                ) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of `body`, at any depth (functions included); those under
    `if TYPE_CHECKING:` only with `type_checking`."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _type_checking(node):
            if type_checking:
                yield from _imports_in(node.body, type_checking=type_checking)
            yield from _imports_in(node.orelse, type_checking=type_checking)
        else:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    yield from _imports_in([child], type_checking=type_checking)
                elif isinstance(child, ast.excepthandler):
                    yield from _imports_in(child.body, type_checking=type_checking)


def imported_by(module: str, *, type_checking: bool = True) -> set[str]:
    """The modules `module` imports, absolute, as deep as named (`from boundloop.core
    import envelope` is boundloop.core.envelope; `from boundloop.errors import X` is
    boundloop.errors)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in _imports_in(ast.parse(path.read_text(encoding="utf-8")).body,
                            type_checking=type_checking):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:  # relative: from the package, one level up per extra dot
            parts = package.split(".")[:len(package.split(".")) - node.level + 1]
            base = ".".join([*parts, base] if base else parts)
        for alias in node.names:
            names.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return names


def _product_module(name: str) -> str | None:
    """The module of the distribution `name` runs (itself, or the package it names
    inside), or None for one outside it."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


#: What the core may import besides the standard library and itself: deterministic
#: libraries that neither do I/O nor read the clock or the environment.
CORE_MAY_IMPORT = {"pydantic", "pydantic_core", "jsonschema", "cryptography",
                   "typing_extensions"}


def core_rule_broken() -> list[str]:
    """`module imports name` for each import of the core outside its rule: never
    temporalio, the network (httpx, openai, ...) or the rest of boundloop, not even for
    type checking or inside a function."""
    broken = []
    for module in MODULES:
        if not module.startswith("boundloop.core"):
            continue
        for name in sorted(imported_by(module)):
            top = name.split(".")[0]
            if name == "boundloop.core" or name.startswith("boundloop.core."):
                continue
            if top in sys.stdlib_module_names or top in CORE_MAY_IMPORT or top == "__future__":
                continue
            broken.append(f"{module} imports {name}")
    return broken


def test_the_core_imports_only_the_standard_library_deterministic_libraries_and_itself(
        ) -> None:
    assert core_rule_broken() == []


def import_circles() -> list[list[str]]:
    """The import circles between the distribution's modules (strongly connected groups
    of the graph, Tarjan's algorithm), each sorted.

    Every import that runs counts, at a module's top or inside a function: a function
    imports late to keep a process light (the CLI's --help, `import boundloop`) or to
    keep `cryptography` out of Temporal's sandbox, but the dependency is the module's all
    the same, and two modules that need each other can be read, changed and tested only
    together. An import under `if TYPE_CHECKING:` does not count: it never runs, and it
    exists to name a type without depending on its module (the package's `__init__`
    names every public type so)."""
    graph = {module: {target for name in imported_by(module, type_checking=False)
                      if (target := _product_module(name)) not in (None, module)}
             for module in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = stack[stack.index(module):]
            del stack[stack.index(module):]
            if len(group) > 1:
                circles.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return circles


def test_no_import_circle_between_boundloops_modules() -> None:
    assert import_circles() == []


def test_the_rules_fail_on_a_core_import_of_errors_and_on_a_circle(tmp_path: Path) -> None:
    """The checks above read what they mean: a core module importing errors.py breaks
    the core's rule (as core/limits.py once did), and a core module importing one that
    imports it back is a circle."""
    saved = MODULES["boundloop.core.canonical"]
    upward = tmp_path / "upward.py"
    upward.write_text("def limit() -> int:\n"
                      "    from boundloop.errors import PAYLOADS_TOO_LARGE\n"
                      "    return len(PAYLOADS_TOO_LARGE)\n", encoding="utf-8")
    around = tmp_path / "around.py"  # core/envelope.py imports core/canonical.py
    around.write_text("from boundloop.core import envelope\n", encoding="utf-8")
    try:
        MODULES["boundloop.core.canonical"] = upward
        assert "boundloop.core.canonical imports boundloop.errors" in core_rule_broken()
        MODULES["boundloop.core.canonical"] = around
        assert ["boundloop.core.canonical", "boundloop.core.envelope"] in import_circles()
    finally:
        MODULES["boundloop.core.canonical"] = saved


def test_every_file_has_one_path() -> None:
    """No link in the repo: workflows/, activities/ and worker/ become boundloop's by
    pyproject.toml's package-dir, which lists every folder of the tree."""
    tracked = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.splitlines()
    assert [line for line in tracked if line.startswith("120000")] == []
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))[
        "tool"]["setuptools"]
    assert {name: ROOT / path for name, path in setuptools["package-dir"].items()} == {
        name: path for name, path in PACKAGE_DIRS.items() if name != "boundloop"}
    folders = {".".join((package, *path.relative_to(base).parts))
               for package, base in PACKAGE_DIRS.items()
               for path in [base, *base.rglob("*")]
               if path.is_dir() and path.name != "__pycache__"}
    assert sorted(setuptools["packages"]) == sorted(folders)


def test_the_demo_does_not_import_the_cli() -> None:
    assert not [n for n in imported_by("boundloop.demo")
                if n == "boundloop.cli" or n.startswith("boundloop.cli.")]


def test_no_test_only_switch_in_product_code() -> None:
    found = [str(p.relative_to(ROOT))
             for package in ("boundloop", "activities", "workflows", "worker")
             for p in (ROOT / package).rglob("*.py")
             if "BOUNDLOOP_TEST" in p.read_text(encoding="utf-8")]
    assert found == []


def test_the_distribution_installs_only_the_boundloop_namespace(tmp_path: Path) -> None:
    """A wheel built from the repo holds one top-level package, `boundloop`, with the
    repo's workflows/, activities/ and worker/ inside it as boundloop.workflows, ..."""
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
