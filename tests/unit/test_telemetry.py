"""Telemetry: trace context through message headers, JSON logs, bus metrics."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from switchyard.bus.records import Envelope
from switchyard.config import load_settings
from switchyard.telemetry import (
    Telemetry,
    TracingMiddleware,
    configure_logging,
    configure_telemetry,
)

pytestmark = pytest.mark.unit


@pytest.fixture
def telemetry() -> Iterator[tuple[Telemetry, InMemorySpanExporter, InMemoryMetricReader]]:
    spans = InMemorySpanExporter()
    reader = InMemoryMetricReader()
    made = configure_telemetry(
        "test", load_settings({}), span_exporter=spans, metric_reader=reader, install_global=False
    )
    yield made, spans, reader
    made.shutdown()


def _envelope(headers: list[tuple[str, bytes]]) -> Envelope:
    return Envelope("switchyard.requests", 2, 41, b"r-1", b"{}", tuple(headers), 0)


def _metric_points(reader: InMemoryMetricReader) -> dict[str, list[object]]:
    found: dict[str, list[object]] = {}
    data = reader.get_metrics_data()
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


def test_a_consumer_span_is_the_child_of_the_producer_span_through_headers(
    telemetry: tuple[Telemetry, InMemorySpanExporter, InMemoryMetricReader],
) -> None:
    made, spans, reader = telemetry
    tracing = TracingMiddleware(made.tracer_provider, made.meter_provider)
    headers: list[tuple[str, bytes]] = [("sy-type", b"inference-request")]
    with tracing.publishing("switchyard.requests", "inference-request", headers):
        pass
    assert [k for k, _ in headers] == ["sy-type", "traceparent"]
    with tracing.consuming(_envelope(headers), "scheduler", "inference-request"):
        pass
    published = _metric_points(reader)["switchyard.bus.published"]
    assert [p.value for p in published] == [1]  # type: ignore[attr-defined]
    producer, consumer = spans.get_finished_spans()
    assert producer.kind is SpanKind.PRODUCER
    assert consumer.kind is SpanKind.CONSUMER
    assert producer.context is not None
    assert consumer.context is not None
    assert consumer.parent is not None
    assert consumer.context.trace_id == producer.context.trace_id
    assert consumer.parent.span_id == producer.context.span_id
    assert consumer.attributes is not None
    assert consumer.attributes["messaging.kafka.offset"] == 41


def test_a_handler_error_marks_the_span_and_still_propagates(
    telemetry: tuple[Telemetry, InMemorySpanExporter, InMemoryMetricReader],
) -> None:
    made, spans, reader = telemetry
    tracing = TracingMiddleware(made.tracer_provider, made.meter_provider)
    with (
        pytest.raises(ValueError, match="bad input"),
        tracing.consuming(_envelope([]), "scheduler", "inference-request"),
    ):
        raise ValueError("bad input")
    (span,) = spans.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.events[0].name == "exception"
    points = _metric_points(reader)
    handled = points["switchyard.bus.handler.duration"]
    assert [(p.attributes["outcome"], p.count) for p in handled] == [("error", 1)]  # type: ignore[attr-defined]


def test_the_consuming_context_may_be_entered_and_left_in_separate_steps(
    telemetry: tuple[Telemetry, InMemorySpanExporter, InMemoryMetricReader],
) -> None:
    # The bus enters it in one `__anext__` and leaves it in the next, as a loop body runs.
    made, spans, _ = telemetry
    tracing = TracingMiddleware(made.tracer_provider, made.meter_provider)
    manager = tracing.consuming(_envelope([]), "g", "inference-request")
    manager.__enter__()
    inside = trace.get_current_span()
    assert inside.get_span_context().is_valid
    manager.__exit__(None, None, None)
    assert not trace.get_current_span().get_span_context().is_valid
    assert len(spans.get_finished_spans()) == 1


def test_json_logs_carry_the_trace_and_the_extra_fields(
    telemetry: tuple[Telemetry, InMemorySpanExporter, InMemoryMetricReader],
) -> None:
    made, _, _ = telemetry
    stream = io.StringIO()
    configure_logging("scheduler", load_settings({}, instance_id="sched-1"), stream=stream)
    configure_logging("scheduler", load_settings({}, instance_id="sched-1"), stream=stream)
    log = logging.getLogger("switchyard.test")
    tracer = made.tracer_provider.get_tracer("test")
    with tracer.start_as_current_span("work") as span:
        log.info("assigned %s", "r-1", extra={"worker_id": "w-3"})
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1, "configuring twice must not duplicate output"
    entry = json.loads(lines[0])
    assert entry["msg"] == "assigned r-1"
    assert entry["service"] == "scheduler"
    assert entry["instance"] == "sched-1"
    assert entry["worker_id"] == "w-3"
    assert entry["trace_id"] == format(span.get_span_context().trace_id, "032x")
    assert entry["ts"].endswith("Z")


def test_an_otlp_endpoint_adds_exporters_and_none_means_none() -> None:
    without = configure_telemetry("t", load_settings({}), install_global=False)
    assert without.exporting_to is None
    without.shutdown()
    with_endpoint = configure_telemetry(
        "t", load_settings({}, otlp_endpoint="http://127.0.0.1:4318"), install_global=False
    )
    assert with_endpoint.exporting_to == "http://127.0.0.1:4318"
    with_endpoint.shutdown()
