"""Optional OpenTelemetry tracing (off by default) via temporalio.contrib.opentelemetry.

`BOUNDLOOP_OTEL=console` prints spans to stderr; `BOUNDLOOP_OTEL=otlp` exports with
OTLP/gRPC (install `opentelemetry-exporter-otlp`; configure it with the standard
`OTEL_EXPORTER_OTLP_*` variables). Spans carry workflow, run and activity ids, never
payloads. Needs the `otel` extra: `pip install -e '.[otel]'`.
"""

from __future__ import annotations

from typing import Any


def client_interceptors(mode: str) -> list[Any]:
    """Interceptors for Client.connect: [] when tracing is off (`mode` empty)."""
    if not mode:
        return []
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
    from temporalio.contrib.opentelemetry import TracingInterceptor

    exporter: SpanExporter
    if mode == "console":
        exporter = ConsoleSpanExporter()
    elif mode == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found]
            OTLPSpanExporter,
        )

        exporter = OTLPSpanExporter()
    else:
        raise ValueError(f"BOUNDLOOP_OTEL must be 'console' or 'otlp', not {mode!r}")
    provider = TracerProvider(resource=Resource.create({"service.name": "boundloop"}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return [TracingInterceptor()]
