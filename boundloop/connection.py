"""How every boundloop process reaches Temporal: `connect` (`boundloop.connect`), the one
way a client is made, with the address, namespace, TLS, API key and payload codec of the
environment or of Settings (a user's script, the worker, the CLI, the console, the demo).

The `TEMPORAL_TLS*` and `TEMPORAL_API_KEY` names are the ones the `temporal` CLI reads,
so one environment serves both.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from temporalio.client import Client, Interceptor
from temporalio.converter import PayloadCodec
from temporalio.runtime import (
    LogForwardingConfig,
    LoggingConfig,
    Runtime,
    TelemetryConfig,
    TelemetryFilter,
)
from temporalio.service import TLSConfig

from boundloop.codec import CodecKeyError, EncryptionCodec, load_keys
from boundloop.codec import data_converter as codec_converter
from boundloop.errors import BoundloopError, TemporalUnreachable
from boundloop.secret_files import shared_problem
from boundloop.settings import Settings, TemporalSettings, one_line
from boundloop.tracing import client_interceptors


class ConnectionSettingsError(BoundloopError):
    """TLS or codec settings that cannot be used (a missing file, half a key pair)."""


@dataclass(frozen=True)
class ConnectOptions:
    """What `connect` reads from settings besides the address: `tls`, `api_key`, `codec`."""

    namespace: str
    tls: bool | TLSConfig | None
    api_key: str | None
    codec: EncryptionCodec | None


def _read(path: Path, variable: str, *, secret: bool = False) -> bytes:
    try:
        mode = path.stat().st_mode
        data = path.read_bytes()
    except OSError as exc:
        raise ConnectionSettingsError(f"{variable}: cannot read {path}: "
                                      f"{exc.strerror or exc}") from None
    problem = shared_problem(variable, path, mode) if secret else None
    if problem is not None:  # the client's private key
        raise ConnectionSettingsError(problem)
    return data


def tls_config(settings: TemporalSettings) -> bool | TLSConfig | None:
    """The SDK's `tls` argument: a TLSConfig when a CA, client certificate or server name
    is set; True for TEMPORAL_TLS=1 alone (system roots); False for TEMPORAL_TLS=0;
    None otherwise (the SDK turns TLS on when an API key is given)."""
    s = settings
    if (s.temporal_tls_cert is None) != (s.temporal_tls_key is None):
        raise ConnectionSettingsError(
            "mTLS needs both TEMPORAL_TLS_CLIENT_CERT_PATH and TEMPORAL_TLS_CLIENT_KEY_PATH")
    configured = (s.temporal_tls_ca, s.temporal_tls_cert, s.temporal_tls_server_name)
    if any(v is not None for v in configured):
        if s.temporal_tls is False:
            raise ConnectionSettingsError("TEMPORAL_TLS=0 with TLS files or a server name "
                                          "set: unset one or the other")
        return TLSConfig(
            server_root_ca_cert=(_read(s.temporal_tls_ca, "TEMPORAL_TLS_SERVER_CA_CERT_PATH")
                                 if s.temporal_tls_ca else None),
            client_cert=(_read(s.temporal_tls_cert, "TEMPORAL_TLS_CLIENT_CERT_PATH")
                         if s.temporal_tls_cert else None),
            client_private_key=(_read(s.temporal_tls_key, "TEMPORAL_TLS_CLIENT_KEY_PATH",
                                      secret=True)
                                if s.temporal_tls_key else None),
            domain=s.temporal_tls_server_name)
    return s.temporal_tls


def codec(settings: TemporalSettings) -> EncryptionCodec | None:
    """The encryption codec of BOUNDLOOP_CODEC_KEYS / BOUNDLOOP_CODEC_KEY, or None."""
    try:
        keys = load_keys(keys_file=settings.codec_keys_file,
                         keys_text=(settings.codec_key.get_secret_value()
                                    if settings.codec_key else None))
    except CodecKeyError as exc:
        raise ConnectionSettingsError(str(exc)) from None
    if not keys:
        return None
    source = ("BOUNDLOOP_CODEC_KEY" if settings.codec_keys_file is None
              else f"the BOUNDLOOP_CODEC_KEYS file {settings.codec_keys_file}")
    return EncryptionCodec(keys, source=source)


codec_of = codec  # by this name where an argument named `codec` hides it


def connect_options(settings: TemporalSettings) -> ConnectOptions:
    """Everything but the address, read (files included) before connecting: a bad
    setting is one line at start, never a half-connected process."""
    api_key = settings.temporal_api_key
    return ConnectOptions(namespace=settings.temporal_namespace, tls=tls_config(settings),
                          api_key=api_key.get_secret_value() if api_key else None,
                          codec=codec(settings))


#: Why a server dropped a TLS connection it had accepted (refusing the client's
#: certificate, or its absence, happens after the TLS 1.3 handshake).
TLS_DROPPED = ("the server closed the TLS connection: it may require a client certificate "
               "(TEMPORAL_TLS_CLIENT_CERT_PATH, TEMPORAL_TLS_CLIENT_KEY_PATH) or refuse "
               "this one")


def tls_problem(exc: BaseException) -> str | None:
    """A refused certificate (the server's, or the server's alert refusing ours) in
    Client.connect's transport dump, in a few words, or None. Deterministic: retrying
    cannot fix it."""
    text = str(exc)
    if "UnknownIssuer" in text or "BadSignature" in text:
        return ("the server's TLS certificate is not signed by a trusted CA: check "
                "TEMPORAL_TLS_SERVER_CA_CERT_PATH")
    if "NotValidForName" in text:
        return ("the server's TLS certificate does not name this host: set "
                "TEMPORAL_TLS_SERVER_NAME to a name it holds")
    if "Expired" in text and "Certificate" in text:
        return "the server's TLS certificate has expired"
    if "InvalidCertificate" in text:
        return "the TLS handshake failed (the server's certificate was refused)"
    if "CertificateRequired" in text or "BadCertificate" in text:  # the server's alert
        return TLS_DROPPED
    if "InvalidContentType" in text or "CorruptMessage" in text:
        return "the server did not answer in TLS: is TLS on at this address?"
    return None


def tls_dropped(exc: BaseException, settings: TemporalSettings) -> bool:
    """With TLS on, the connection was closed or reset under the client: the shape of a
    refused (or missing) client certificate under TLS 1.3, where the server's verdict
    comes after the handshake. It may also be a server going away, so a worker keeps
    retrying it."""
    try:
        tls_on = bool(tls_config(settings)) or settings.temporal_api_key is not None
    except ConnectionSettingsError:
        return False
    return tls_on and _dropped(exc)


def _dropped(exc: BaseException) -> bool:
    dropped = ("close_notify", "CertificateRequired", "BadCertificate", "BrokenPipe",
               "broken pipe", "ConnectionReset", "reset by peer", "UnexpectedEof",
               "connection closed")
    return any(d in str(exc) for d in dropped)


def unreachable_line(address: str, exc: BaseException, tls_on: bool) -> str:
    """Why connecting to `address` failed, in one line: the TLS refusal (never fixed by
    retrying), else the server not reached and what to do."""
    problem = tls_problem(exc) or (TLS_DROPPED if tls_on and _dropped(exc) else None)
    if problem is not None:
        return f"cannot connect to Temporal at {address}: {problem}"
    return (f"cannot reach Temporal at {address} ({unreachable_reason(exc)}): start it "
            "with `boundloop server` or set TEMPORAL_ADDRESS")


def environment_settings() -> TemporalSettings:
    """The connection settings of the environment now (what `boundloop.connect` reads
    for each argument not given). Raises ConnectionSettingsError, one line."""
    try:
        return TemporalSettings()
    except ValidationError as exc:
        raise ConnectionSettingsError(f"invalid settings: {one_line(exc)}") from None


_core_logs_forwarded = False


def forward_core_logs() -> None:
    """Send the SDK core's own log lines through Python logging (stderr, our format)
    instead of letting them reach stdout, where they would corrupt `--json` output.
    Once per process, before the first client (the CLI calls it)."""
    global _core_logs_forwarded
    if _core_logs_forwarded:
        return
    _core_logs_forwarded = True
    runtime = Runtime(telemetry=TelemetryConfig(logging=LoggingConfig(
        filter=TelemetryFilter(core_level="WARN", other_level="ERROR"),
        forwarding=LogForwardingConfig(logger=logging.getLogger("temporalio.core")))))
    Runtime.set_default(runtime, error_if_already_set=False)


async def connect(target_host: str | None = None, *, namespace: str | None = None,
                  interceptors: Sequence[Interceptor] = (),
                  codec: PayloadCodec | None = None, settings: TemporalSettings | None = None,
                  **options: Any) -> Client:
    """A Temporal client with the pydantic data converter boundloop's payloads need.

    Each argument not given is read from `settings` (default: the environment now),
    with the names `boundloop worker` and the CLI read (docs/guide.md, "Configuration"):
    `target_host` from TEMPORAL_ADDRESS (else 127.0.0.1:7233), `namespace` from
    TEMPORAL_NAMESPACE (else `default`), `tls` from TEMPORAL_TLS and the TEMPORAL_TLS_*
    files and server name, `api_key` from TEMPORAL_API_KEY, `codec` from
    BOUNDLOOP_CODEC_KEYS / BOUNDLOOP_CODEC_KEY (unset: payloads in clear; reading an
    encrypted one then fails with a message naming the setting).

    - codec: encrypts every payload (`boundloop.codec.EncryptionCodec`).
    - settings: a boundloop process's `Settings` (the CLI's, the worker's) also sends the
      SDK core's log lines through Python logging and traces per BOUNDLOOP_OTEL.
    - `options` go to `temporalio.client.Client.connect`: `tls=True` or
      `tls=TLSConfig(server_root_ca_cert=..., client_cert=..., client_private_key=...,
      domain=...)`, `api_key=` (Temporal Cloud), plugins, ...

    Raises `TemporalUnreachable` when the server cannot be reached or refuses the TLS
    connection, and `ConnectionSettingsError` for settings that cannot be used (a TLS
    file that cannot be read, half a key pair, a bad codec key), each with a one-line
    message (`boundloop.run_client` prints it without a traceback).
    """
    settings = settings if settings is not None else environment_settings()
    address = target_host if target_host is not None else settings.temporal_address
    try:
        return await open_client(settings, target_host=address, namespace=namespace,
                                 interceptors=interceptors, codec=codec, **options)
    except RuntimeError as exc:
        tls_on = (bool(options["tls"]) if "tls" in options else bool(tls_config(settings))
                  ) or options.get("api_key", settings.temporal_api_key) is not None
        raise TemporalUnreachable(unreachable_line(address, exc, tls_on)) from None


async def open_client(settings: TemporalSettings, *, target_host: str | None = None,
                      namespace: str | None = None, interceptors: Sequence[Interceptor] = (),
                      codec: PayloadCodec | None = None, **options: Any) -> Client:
    """`connect`'s work, with the SDK's own error when the server is not reached (a
    RuntimeError: the worker retries it until the server is up, `connect` says it in one
    line). Settings that cannot be used are read, and refused, before connecting."""
    if "tls" not in options:
        options["tls"] = tls_config(settings)
    if "api_key" not in options and settings.temporal_api_key is not None:
        options["api_key"] = settings.temporal_api_key.get_secret_value()
    if codec is None:
        codec = codec_of(settings)
    if isinstance(settings, Settings):  # a boundloop process
        forward_core_logs()
        interceptors = [*client_interceptors(settings.otel), *interceptors]
    return await Client.connect(
        target_host if target_host is not None else settings.temporal_address,
        namespace=namespace if namespace is not None else settings.temporal_namespace,
        data_converter=codec_converter(codec), interceptors=interceptors, **options)


def unreachable_reason(exc: BaseException) -> str:
    """Why Client.connect failed, in a few words (its message is a long transport dump)."""
    text = str(exc)
    if "ConnectionRefused" in text or "Connection refused" in text:
        return "connection refused"
    if "dns error" in text or "failed to lookup" in text:
        return "the host name does not resolve"
    if "timed out" in text.lower() or "deadline" in text.lower():
        return "timed out"
    return "connection failed"
