"""Optional OpenTelemetry tracing: spans for the workflow and each activity."""

from __future__ import annotations

import uuid
from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import Client
from temporalio.contrib.opentelemetry import TracingInterceptor

from boundloop.contracts import WORKFLOW_NAME, RunInput, RunResult
from boundloop.core.limits import RunSettings
from boundloop.scripted.server import ScriptedModelServer
from boundloop.settings import Settings
from boundloop.tracing import client_interceptors
from boundloop.worker.main import build_worker
from tests.scripts import answer, call, resp


def test_tracing_is_off_by_default() -> None:
    assert client_interceptors("") == []


async def test_spans_cover_the_workflow_and_each_activity(temporal: Client,
                                                          tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    config = temporal.config()
    config["interceptors"] = [TracingInterceptor(provider.get_tracer("test"))]
    traced = Client(**config)
    server = ScriptedModelServer([resp(call("lookup_stock", {"sku": "A-001"}, "c1")),
                                  answer("12")])
    queue = f"otel-{uuid.uuid4().hex[:8]}"
    settings = Settings(OPENAI_BASE_URL=server.start(), BOUNDLOOP_TASK_QUEUE=queue,
                        BOUNDLOOP_DATA_DIR=tmp_path)
    inp = RunInput(question="q", tools=["lookup_stock"], settings=RunSettings(model="m"))
    try:
        async with build_worker(traced, settings):
            result = await traced.execute_workflow(WORKFLOW_NAME, inp, id=queue,
                                                   task_queue=queue, result_type=RunResult)
    finally:
        server.stop()
    assert result.reason == "completed"
    names = {span.name for span in exporter.get_finished_spans()}
    assert {"StartWorkflow:BoundLoop", "RunWorkflow:BoundLoop", "RunActivity:model_request",
            "RunActivity:tool_execute"} <= names
