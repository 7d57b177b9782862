"""Shared pieces of the telemetry tests: a tracing harness over in-memory exporters and
records as the bus delivers them."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from switchyard.bus.records import Envelope
from switchyard.telemetry import Telemetry, TracingMiddleware

TOPIC = "switchyard.requests"
MESSAGE_TYPE = "inference-request"
OTEL_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG")
"""The standard variables telemetry reads; a test sets them itself or not at all."""


@dataclass
class Harness:
    telemetry: Telemetry
    spans: InMemorySpanExporter
    reader: InMemoryMetricReader
    tracing: TracingMiddleware


def clear_otel_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset :data:`OTEL_VARIABLES` for one test (the machine's own must not leak in)."""
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def envelope(headers: list[tuple[str, bytes]], *, topic: str = TOPIC) -> Envelope:
    """A delivered record with ``headers``."""
    return Envelope(topic, 2, 41, b"r-1", b"{}", tuple(headers), 0)
