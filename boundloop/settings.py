"""Process settings from the environment (pydantic-settings).

Secrets (the API key) live here, in the worker's environment, and never enter
workflow input, history or logs.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from boundloop.core.operator import OperatorPolicy
from boundloop.secret_files import writable_problem


class TemporalSettings(BaseSettings):
    """How a process reaches Temporal: TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, the TLS
    files and server name, TEMPORAL_API_KEY and the payload codec keys (the fields of
    `Settings` below that `boundloop.connect` reads from the environment too)."""

    # An empty variable means unset (compose files pass `${VAR:-}` as ""), never "".
    model_config = SettingsConfigDict(env_prefix="", extra="ignore", populate_by_name=True,
                                      env_ignore_empty=True)

    temporal_address: str = Field("127.0.0.1:7233", alias="TEMPORAL_ADDRESS")
    temporal_namespace: str = Field("default", alias="TEMPORAL_NAMESPACE")
    # Secure connections (boundloop/connection.py). A CA, client cert or server name
    # turns TLS on; TEMPORAL_TLS=1 alone uses the system's roots (Temporal Cloud).
    temporal_tls: bool | None = Field(None, alias="TEMPORAL_TLS")
    temporal_tls_ca: Path | None = Field(None, alias="TEMPORAL_TLS_SERVER_CA_CERT_PATH")
    temporal_tls_cert: Path | None = Field(None, alias="TEMPORAL_TLS_CLIENT_CERT_PATH")
    temporal_tls_key: Path | None = Field(None, alias="TEMPORAL_TLS_CLIENT_KEY_PATH")
    temporal_tls_server_name: str | None = Field(None, alias="TEMPORAL_TLS_SERVER_NAME")
    temporal_api_key: SecretStr | None = Field(None, alias="TEMPORAL_API_KEY")
    # Payload encryption (boundloop/codec.py): keys never leave this process.
    codec_keys_file: Path | None = Field(None, alias="BOUNDLOOP_CODEC_KEYS")
    codec_key: SecretStr | None = Field(None, alias="BOUNDLOOP_CODEC_KEY")


class Settings(TemporalSettings):
    """- TEMPORAL_ADDRESS / TEMPORAL_NAMESPACE: the Temporal frontend.
    - BOUNDLOOP_TASK_QUEUE: task queue of workflows and activities.
    - BOUNDLOOP_DATA_DIR: the dev server database and the demo tools' SQLite store.
    - OPENAI_API_KEY / OPENAI_BASE_URL: the model endpoint (any OpenAI-compatible server).
    - BOUNDLOOP_MODEL / BOUNDLOOP_API: default model name and API flavour for new runs.
    - BOUNDLOOP_STREAM: `false` starts new runs unstreamed (a provider whose streams
      misbehave; docs/streaming.md).
    - BOUNDLOOP_UI_URL: the Web UI base, for links.
    - BOUNDLOOP_TOOLS: `package.module:attribute`, the Toolset `boundloop worker` serves
      (default: the demo tools).
    - BOUNDLOOP_LOG_FORMAT: worker logs as `text` or `json` lines.
    - BOUNDLOOP_LOG_TOOL_ERRORS: also log an unexpected tool exception's message with its
      traceback (off: messages may hold raw data).
    - BOUNDLOOP_OTEL: `console` or `otlp` tracing (needs the `otel` extra).
    - BOUNDLOOP_DEPLOYMENT_NAME / BOUNDLOOP_BUILD_ID: worker versioning (both or neither,
      docs/deploying.md): the worker joins that Worker Deployment as that version, and
      each run finishes on the version it started on.
    - BOUNDLOOP_MAX_CACHED_WORKFLOWS: workflow instances a worker keeps in memory.
    - BOUNDLOOP_STICKY_TIMEOUT_SECONDS: how long a run waits for its previous worker
      before another takes it.
    - BOUNDLOOP_APPROVER_KEYS: a file of approvers' public keys (`NAME ed25519:BASE64`
      lines, as `boundloop keys new` writes them): the worker's runs then accept only
      signed decisions.
    - BOUNDLOOP_POLICY: the operator's policy file (TOML, docs/security.md): the floor
      under every run the worker serves; a run asking anything looser is refused.
    - BOUNDLOOP_MCP_CONFIG: a JSON or TOML file of MCP servers (docs/mcp.md): the worker
      serves their tools; `boundloop run` lists them to put their declarations in the
      run's input.
    - TEMPORAL_TLS, TEMPORAL_TLS_SERVER_CA_CERT_PATH, TEMPORAL_TLS_CLIENT_CERT_PATH,
      TEMPORAL_TLS_CLIENT_KEY_PATH, TEMPORAL_TLS_SERVER_NAME, TEMPORAL_API_KEY: a secured
      cluster or Temporal Cloud (the names the `temporal` CLI reads too).
    - BOUNDLOOP_CODEC_KEYS / BOUNDLOOP_CODEC_KEY: payload encryption keys, a file of
      `id:base64key` lines or the lines themselves (boundloop/codec.py).
    - BOUNDLOOP_CODEC_TOKEN / BOUNDLOOP_CODEC_CORS_ORIGINS / BOUNDLOOP_CODEC_HOSTS:
      `boundloop codec-server`'s token (required), the Web UI's origins, and the Host
      headers it answers.
    - BOUNDLOOP_CONSOLE_APPROVERS / BOUNDLOOP_CONSOLE_KEYS / BOUNDLOOP_CONSOLE_SECRET:
      `boundloop console`'s approvers file, their private keys' directory, and the
      secret (at least 32 characters) its session cookies are signed with.
    - BOUNDLOOP_CONSOLE_LOCKOUT_SECONDS: how long `boundloop console` first refuses
      sign-in for a name or address after repeated failures (doubling each time).

    This is the only place boundloop reads the environment: the CLI reads it once and
    hands the values to the public API, which takes them as arguments (but
    `boundloop.connect`, which reads `TemporalSettings` for each argument not given).
    """

    # An empty variable means unset (compose files pass `${VAR:-}` as ""), never "".
    model_config = SettingsConfigDict(env_prefix="", extra="ignore", populate_by_name=True,
                                      env_ignore_empty=True)

    task_queue: str = Field("boundloop", alias="BOUNDLOOP_TASK_QUEUE")
    data_dir: Path = Field(Path(".boundloop"), alias="BOUNDLOOP_DATA_DIR")
    openai_api_key: SecretStr | None = Field(None, alias="OPENAI_API_KEY")
    openai_base_url: str | None = Field(None, alias="OPENAI_BASE_URL")
    model: str = Field("gpt-5-mini", alias="BOUNDLOOP_MODEL")
    api: Literal["responses", "chat"] = Field("responses", alias="BOUNDLOOP_API")
    stream: bool = Field(True, alias="BOUNDLOOP_STREAM")
    ui_url: str = Field("http://127.0.0.1:8233", alias="BOUNDLOOP_UI_URL")
    tools: str | None = Field(None, alias="BOUNDLOOP_TOOLS")
    log_format: Literal["text", "json"] = Field("text", alias="BOUNDLOOP_LOG_FORMAT")
    log_tool_error_messages: bool = Field(False, alias="BOUNDLOOP_LOG_TOOL_ERRORS")
    otel: Literal["", "console", "otlp"] = Field("", alias="BOUNDLOOP_OTEL")
    deployment_name: str | None = Field(None, alias="BOUNDLOOP_DEPLOYMENT_NAME")
    build_id: str | None = Field(None, alias="BOUNDLOOP_BUILD_ID")
    max_cached_workflows: int = Field(100, gt=0, alias="BOUNDLOOP_MAX_CACHED_WORKFLOWS")
    sticky_timeout_seconds: float = Field(10.0, gt=0, alias="BOUNDLOOP_STICKY_TIMEOUT_SECONDS")
    approver_keys_file: Path | None = Field(None, alias="BOUNDLOOP_APPROVER_KEYS")
    mcp_config: Path | None = Field(None, alias="BOUNDLOOP_MCP_CONFIG")
    policy_file: Path | None = Field(None, alias="BOUNDLOOP_POLICY")
    codec_token: SecretStr | None = Field(None, alias="BOUNDLOOP_CODEC_TOKEN")
    codec_cors_origins: str | None = Field(None, alias="BOUNDLOOP_CODEC_CORS_ORIGINS")
    # The Host headers `boundloop codec-server` answers (comma-separated `name:port`;
    # default: the address it listens on): boundloop/codec_server.py.
    codec_hosts: str | None = Field(None, alias="BOUNDLOOP_CODEC_HOSTS")
    # `boundloop console` (docs/console.md): who may sign in, their signing keys, and
    # the secret its session cookies are signed with (default: new at each start).
    console_approvers: Path | None = Field(None, alias="BOUNDLOOP_CONSOLE_APPROVERS")
    console_keys: Path | None = Field(None, alias="BOUNDLOOP_CONSOLE_KEYS")
    console_secret: SecretStr | None = Field(None, alias="BOUNDLOOP_CONSOLE_SECRET",
                                             min_length=32)
    # The first lockout after repeated failed sign-ins (per name and per address; each
    # next one doubles): boundloop/console/auth.py, SignInGuard.
    console_lockout_seconds: float = Field(60.0, gt=0,
                                           alias="BOUNDLOOP_CONSOLE_LOCKOUT_SECONDS")

    @property
    def model_configured(self) -> bool:
        return self.openai_api_key is not None or self.openai_base_url is not None


#: Settings read only where runs start (`boundloop run`), never by a worker: a worker
#: given one would silently ignore it. Value: where it takes effect instead.
CLIENT_SETTINGS = {
    "BOUNDLOOP_MODEL": "the model of new runs: set it where runs start, or `run --model`",
    "BOUNDLOOP_API": "the API of new runs: set it where runs start, or `run --api`",
    "BOUNDLOOP_UI_URL": "the Web UI links the CLI prints",
    "BOUNDLOOP_CODEC_TOKEN": "set it where `boundloop codec-server` runs",
    "BOUNDLOOP_CODEC_CORS_ORIGINS": "set it where `boundloop codec-server` runs",
    "BOUNDLOOP_CODEC_HOSTS": "set it where `boundloop codec-server` runs",
    "BOUNDLOOP_CONSOLE_APPROVERS": "set it where `boundloop console` runs",
    "BOUNDLOOP_CONSOLE_KEYS": "set it where `boundloop console` runs",
    "BOUNDLOOP_CONSOLE_SECRET": "set it where `boundloop console` runs",
    "BOUNDLOOP_CONSOLE_LOCKOUT_SECONDS": "set it where `boundloop console` runs",
}


def client_settings_given(settings: Settings) -> list[str]:
    """One warning per client-side setting given to a worker (read from its environment)."""
    given = {Settings.model_fields[name].alias for name in settings.model_fields_set}
    return [f"{name} is set in this worker's environment but only the CLI reads it "
            f"({where}); it has no effect here"
            for name, where in CLIENT_SETTINGS.items() if name in given]


def worker_settings_problem(settings: Settings) -> str | None:
    """Why a worker must not start with these settings, in one line, or None."""
    url = settings.openai_base_url
    if url is not None:
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            shown = url if "@" not in url else "…@" + url.rsplit("@", 1)[1]  # no credentials
            return (f"OPENAI_BASE_URL must be an http:// or https:// URL such as "
                    f"http://127.0.0.1:11434/v1, not {shown!r}")
    if (settings.deployment_name is None) != (settings.build_id is None):
        given, missing = (("BOUNDLOOP_DEPLOYMENT_NAME", "BOUNDLOOP_BUILD_ID")
                          if settings.build_id is None
                          else ("BOUNDLOOP_BUILD_ID", "BOUNDLOOP_DEPLOYMENT_NAME"))
        return (f"{given} is set but {missing} is not: worker versioning needs both "
                "(docs/deploying.md), or neither to run unversioned")
    return None


def one_line(exc: ValidationError) -> str:
    """A settings ValidationError as `VARIABLE: problem; …` (pydantic's text is 3 lines
    per error)."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(value)'}: {e['msg']}"
                     for e in exc.errors())


class PolicyFileError(ValueError):
    """The operator's policy file cannot be read or is invalid: `problems`, one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def load_policy(path: Path) -> OperatorPolicy:
    """The operator's policy from a TOML file (YAML is not read: pyyaml is no runtime
    dependency). Raises PolicyFileError with one line per problem."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        mode = path.stat().st_mode
    except OSError as exc:
        raise PolicyFileError([f"{path}: cannot read it "
                               f"({exc.strerror or type(exc).__name__})"]) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise PolicyFileError([f"{path}: not valid TOML ({exc})"]) from None
    problem = writable_problem("policy file", path, mode)
    if problem is not None:
        raise PolicyFileError([problem])
    try:
        return OperatorPolicy.model_validate(data)
    except ValidationError as exc:
        raise PolicyFileError([
            f"{path}: {'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}"
            for e in exc.errors(include_url=False, include_input=False,
                                include_context=False)]) from None


def process_environment() -> Mapping[str, str]:
    """The process's environment as it is now, for the `${NAME}` references of MCP server
    configs (docs/mcp.md): read each time a server is started or connected, so a
    rotated secret is picked up by the next session. Values are never logged."""
    return os.environ


class LogSettings(BaseSettings):
    """The logging variables alone (a worker of one's own reads only these):
    BOUNDLOOP_LOG_FORMAT and BOUNDLOOP_LOG_TOOL_ERRORS, as in `Settings`."""

    log_format: Literal["text", "json"] = Field("text", alias="BOUNDLOOP_LOG_FORMAT")
    log_tool_error_messages: bool = Field(False, alias="BOUNDLOOP_LOG_TOOL_ERRORS")

    model_config = SettingsConfigDict(env_prefix="", extra="ignore", populate_by_name=True,
                                      env_ignore_empty=True)


def log_settings() -> LogSettings:
    """The logging settings of the environment now. Raises ValueError (one line) for a
    value that is neither of its kind."""
    try:
        return LogSettings()
    except ValidationError as exc:
        raise ValueError(f"invalid logging settings: {one_line(exc)}") from None
