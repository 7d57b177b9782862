"""Telemetry: trace context through message headers, JSON logs, bus metrics, providers
(sampling: ``test_telemetry_sampling.py``)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from switchyard.bus.middleware import BusMiddleware
from switchyard.config import Settings, load_settings
from switchyard.telemetry import (
    TracingMiddleware,
    configure_logging,
    configure_telemetry,
)

from tests.support.telemetry import (
    MESSAGE_TYPE,
    TOPIC,
    Harness,
    clear_otel_variables,
    envelope,
)


@pytest.fixture(autouse=True)
def _no_ambient_otel_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_otel_variables(monkeypatch)


@pytest.fixture
def harness() -> Iterator[Harness]:
    spans = InMemorySpanExporter()
    reader = InMemoryMetricReader()
    made = configure_telemetry(
        "test", load_settings({}), span_exporter=spans, metric_reader=reader, install_global=False
    )
    yield Harness(made, spans, reader, TracingMiddleware(made.tracer_provider, made.meter_provider))
    made.shutdown()


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """configure_logging changes process-wide loggers: put them back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    noisy = {name: logging.getLogger(name).level for name in ("aiokafka", "kafka")}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, noisy_level in noisy.items():
        logging.getLogger(name).setLevel(noisy_level)


def _points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    data = reader.get_metrics_data()
    if data is None:  # nothing was measured
        return found
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


def _by_attributes(points: list[Any]) -> dict[tuple[tuple[str, Any], ...], Any]:
    return {tuple(sorted(p.attributes.items())): p for p in points}


def _current_span_id() -> int:
    return trace.get_current_span().get_span_context().span_id


# -- trace context through headers -------------------------------------------------


def test_the_tracing_middleware_is_a_bus_middleware(harness: Harness) -> None:
    middleware: BusMiddleware = harness.tracing
    assert middleware is harness.tracing


def test_a_consumer_span_is_the_child_of_the_producer_span_through_headers(
    harness: Harness,
) -> None:
    headers: list[tuple[str, bytes]] = [("sy-type", b"inference-request")]
    with harness.tracing.publishing(TOPIC, MESSAGE_TYPE, headers):
        inside_publish = _current_span_id()
    assert [k for k, _ in headers] == ["sy-type", "traceparent"]
    assert all(isinstance(v, bytes) for _, v in headers)
    with harness.tracing.consuming(envelope(headers), "scheduler", MESSAGE_TYPE):
        inside_consume = _current_span_id()

    producer, consumer = harness.spans.get_finished_spans()
    assert producer.kind is SpanKind.PRODUCER
    assert consumer.kind is SpanKind.CONSUMER
    assert producer.name == f"{TOPIC} publish"
    assert consumer.name == f"{TOPIC} process"
    assert producer.context is not None
    assert consumer.context is not None
    assert inside_publish == producer.context.span_id
    assert inside_consume == consumer.context.span_id
    assert consumer.parent is not None
    assert consumer.parent.is_remote
    assert consumer.context.trace_id == producer.context.trace_id
    assert consumer.parent.span_id == producer.context.span_id
    version, trace_id, span_id, flags = dict(headers)["traceparent"].decode().split("-")
    assert (version, trace_id, span_id) == (
        "00",
        f"{producer.context.trace_id:032x}",
        f"{producer.context.span_id:016x}",
    )
    assert int(flags, 16) & 0x01, "sampled"
    assert dict(producer.attributes or {}) == {
        "messaging.system": "kafka",
        "messaging.destination.name": TOPIC,
        "messaging.operation.type": "send",
        "messaging.operation.name": "publish",
        "switchyard.message_type": MESSAGE_TYPE,
    }
    assert dict(consumer.attributes or {}) == {
        "messaging.system": "kafka",
        "messaging.destination.name": TOPIC,
        "messaging.consumer.group.name": "scheduler",
        "messaging.destination.partition.id": "2",
        "messaging.kafka.offset": 41,
        "messaging.operation.type": "process",
        "switchyard.message_type": MESSAGE_TYPE,
    }
    assert not trace.get_current_span().get_span_context().is_valid


def test_a_publish_inside_a_span_continues_its_trace_and_replaces_a_stale_traceparent(
    harness: Harness,
) -> None:
    tracer = harness.telemetry.tracer_provider.get_tracer("test")
    stale = b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01"
    headers: list[tuple[str, bytes]] = [("traceparent", stale)]
    with tracer.start_as_current_span("client request") as root:
        with harness.tracing.publishing(TOPIC, MESSAGE_TYPE, headers):
            pass
        assert trace.get_current_span() is root
    (producer, _) = harness.spans.get_finished_spans()
    assert [k for k, _ in headers] == ["traceparent"]
    assert producer.parent is not None
    assert producer.parent.span_id == root.get_span_context().span_id
    assert dict(headers)["traceparent"] != stale


def test_a_message_without_headers_starts_a_new_trace(harness: Harness) -> None:
    with harness.tracing.consuming(envelope([]), "scheduler", MESSAGE_TYPE):
        pass
    (span,) = harness.spans.get_finished_spans()
    assert span.parent is None
    assert span.status.status_code is StatusCode.UNSET


def test_a_handler_error_marks_the_span_and_still_propagates(harness: Harness) -> None:
    with (
        pytest.raises(ValueError, match="bad input"),
        harness.tracing.consuming(envelope([]), "scheduler", MESSAGE_TYPE),
    ):
        raise ValueError("bad input")
    (span,) = harness.spans.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "ValueError: bad input"
    assert [event.name for event in span.events] == ["exception"]
    assert not trace.get_current_span().get_span_context().is_valid
    points = _points(harness.reader)
    handled = points["switchyard.bus.handler.duration"]
    assert [(p.attributes["outcome"], p.count) for p in handled] == [("error", 1)]
    consumed = points["switchyard.bus.consumed"]
    assert [(p.attributes["outcome"], p.value) for p in consumed] == [("error", 1)]


def test_a_failed_publish_marks_its_span_and_is_not_counted(harness: Harness) -> None:
    headers: list[tuple[str, bytes]] = []
    with (
        pytest.raises(ConnectionError),
        harness.tracing.publishing(TOPIC, MESSAGE_TYPE, headers),
    ):
        raise ConnectionError("broker gone")
    (span,) = harness.spans.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert "switchyard.bus.published" not in _points(harness.reader)


async def test_the_consuming_context_may_be_entered_and_left_in_separate_steps(
    harness: Harness,
) -> None:
    # The bus enters it in one `__anext__` of a subscription and leaves it in the next,
    # while the loop body (the handler) runs in between, in the same task.
    published: list[tuple[str, bytes]] = []
    with harness.tracing.publishing(TOPIC, MESSAGE_TYPE, published):
        pass
    tracer = harness.telemetry.tracer_provider.get_tracer("test")
    before = trace.get_current_span()

    manager = harness.tracing.consuming(envelope(published), "g", MESSAGE_TYPE)
    manager.__enter__()
    consumer_span_id = _current_span_id()
    await asyncio.sleep(0)  # the handler awaits
    with tracer.start_as_current_span("handler work"):
        await asyncio.sleep(0.01)
    assert _current_span_id() == consumer_span_id
    assert len(harness.spans.get_finished_spans()) == 2  # publish and handler work only
    await asyncio.sleep(0)
    assert manager.__exit__(None, None, None) is None

    assert trace.get_current_span() is before
    producer, work, consumer = harness.spans.get_finished_spans()
    assert consumer.name == f"{TOPIC} process"
    assert consumer.end_time is not None
    assert consumer.context is not None
    assert producer.context is not None
    assert consumer.context.span_id == consumer_span_id
    assert consumer.context.trace_id == producer.context.trace_id
    assert work.parent is not None
    assert work.parent.span_id == consumer_span_id
    (duration,) = _points(harness.reader)["switchyard.bus.handler.duration"]
    assert duration.count == 1
    assert duration.sum >= 0.01


async def test_consuming_scopes_in_a_row_each_end_before_the_next_begins(
    harness: Harness,
) -> None:
    for offset in range(3):
        manager = harness.tracing.consuming(envelope([]), "g", MESSAGE_TYPE)
        manager.__enter__()
        await asyncio.sleep(0)
        manager.__exit__(None, None, None)
        assert not trace.get_current_span().get_span_context().is_valid
        assert len(harness.spans.get_finished_spans()) == offset + 1
    trace_ids = {
        span.context.trace_id for span in harness.spans.get_finished_spans() if span.context
    }
    assert len(trace_ids) == 3


def test_a_scope_cannot_be_entered_twice(harness: Harness) -> None:
    manager = harness.tracing.consuming(envelope([]), "g", MESSAGE_TYPE)
    with manager, pytest.raises(RuntimeError, match="entered once"):
        manager.__enter__()


def test_without_an_exporter_spans_are_unsampled_but_ids_still_propagate() -> None:
    made = configure_telemetry("t", load_settings({}), install_global=False)
    tracing = TracingMiddleware(made.tracer_provider, made.meter_provider)
    headers: list[tuple[str, bytes]] = []
    with tracing.publishing(TOPIC, MESSAGE_TYPE, headers):
        producer = trace.get_current_span().get_span_context()
    with tracing.consuming(envelope(headers), "g", MESSAGE_TYPE):
        consumer = trace.get_current_span()
    assert producer.is_valid
    assert not consumer.is_recording()
    assert consumer.get_span_context().trace_id == producer.trace_id
    flags = dict(headers)["traceparent"].decode().rpartition("-")[2]
    assert not int(flags, 16) & 0x01, "not sampled"
    made.shutdown()


def test_without_an_exporter_a_handled_message_hands_its_context_on_unchanged() -> None:
    # Nothing records spans, so no span is made per message: the producer's context is
    # current while the message is handled, and what is published then carries it.
    made = configure_telemetry("t", load_settings({}), install_global=False)
    tracing = TracingMiddleware(made.tracer_provider, made.meter_provider)
    first: list[tuple[str, bytes]] = []
    with tracing.publishing(TOPIC, MESSAGE_TYPE, first):
        producer = trace.get_current_span().get_span_context()
    onward: list[tuple[str, bytes]] = [("traceparent", b"stale")]
    with tracing.consuming(envelope(first), "g", MESSAGE_TYPE):
        handling = trace.get_current_span().get_span_context()
        with tracing.publishing(TOPIC, MESSAGE_TYPE, onward):
            pass
    assert (handling.trace_id, handling.span_id) == (producer.trace_id, producer.span_id)
    assert [k for k, _ in onward] == ["traceparent"], "the stale value is replaced"
    assert dict(onward)["traceparent"] == dict(first)["traceparent"]
    assert not trace.get_current_span().get_span_context().is_valid, "the context is left"
    made.shutdown()


# -- metrics ---------------------------------------------------------------------------


def test_bus_metrics_count_publishes_handling_and_dead_letters(harness: Harness) -> None:
    # A second middleware on the same meter provider feeds the same instruments.
    other = TracingMiddleware(harness.telemetry.tracer_provider, harness.telemetry.meter_provider)
    for tracing in (harness.tracing, harness.tracing, other):
        with tracing.publishing(TOPIC, MESSAGE_TYPE, []):
            pass
    with harness.tracing.publishing("switchyard.completions", "completion", []):
        pass
    with harness.tracing.consuming(envelope([]), "scheduler", MESSAGE_TYPE):
        pass
    with (
        pytest.raises(RuntimeError),
        other.consuming(envelope([]), "scheduler", MESSAGE_TYPE),
    ):
        raise RuntimeError("handler failed")
    with harness.tracing.consuming(envelope([]), "scheduler", MESSAGE_TYPE):
        harness.tracing.dead_lettered(envelope([]), "scheduler", "invalid")

    points = _points(harness.reader)
    published = _by_attributes(points["switchyard.bus.published"])
    assert {key: p.value for key, p in published.items()} == {
        (("message_type", MESSAGE_TYPE), ("topic", TOPIC)): 3,
        (("message_type", "completion"), ("topic", "switchyard.completions")): 1,
    }
    consumed = _by_attributes(points["switchyard.bus.consumed"])
    assert {key: p.value for key, p in consumed.items()} == {
        (("group", "scheduler"), ("outcome", "ok"), ("topic", TOPIC)): 2,
        (("group", "scheduler"), ("outcome", "error"), ("topic", TOPIC)): 1,
    }
    durations = _by_attributes(points["switchyard.bus.handler.duration"])
    assert {key: p.count for key, p in durations.items()} == {
        (("group", "scheduler"), ("outcome", "ok"), ("topic", TOPIC)): 2,
        (("group", "scheduler"), ("outcome", "error"), ("topic", TOPIC)): 1,
    }
    assert all(p.sum >= 0 for p in durations.values())
    (dead,) = points["switchyard.bus.dead_lettered"]
    assert dict(dead.attributes) == {"topic": TOPIC, "group": "scheduler", "reason": "invalid"}
    assert dead.value == 1

    last = harness.spans.get_finished_spans()[-1]
    assert [event.name for event in last.events] == ["dead-lettered"]
    assert dict(last.events[0].attributes or {})["switchyard.dead_letter.reason"] == "invalid"


def test_dead_lettering_outside_a_span_only_counts(harness: Harness) -> None:
    harness.tracing.dead_lettered(envelope([]), "g", "undecodable")
    (dead,) = _points(harness.reader)["switchyard.bus.dead_lettered"]
    assert dead.value == 1
    assert harness.spans.get_finished_spans() == ()


# -- logs ------------------------------------------------------------------------------


def _settings(**overrides: object) -> Settings:
    return load_settings({}, instance_id="sched-1", **overrides)


@pytest.mark.usefixtures("restore_logging")
def test_json_logs_carry_the_trace_and_the_extra_fields(harness: Harness) -> None:
    stream = io.StringIO()
    configure_logging("scheduler", _settings(), stream=stream)
    log = logging.getLogger("switchyard.test")
    tracer = harness.telemetry.tracer_provider.get_tracer("test")
    with tracer.start_as_current_span("work") as span:
        log.info("assigned %s", "r-1", extra={"worker_id": "w-3", "queue_len": 4})
    (line,) = stream.getvalue().splitlines()
    entry = json.loads(line)
    context = span.get_span_context()
    assert entry == {
        "ts": entry["ts"],
        "level": "INFO",
        "logger": "switchyard.test",
        "msg": "assigned r-1",
        "service": "scheduler",
        "instance": "sched-1",
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "worker_id": "w-3",
        "queue_len": 4,
    }
    # e.g. 2026-11-22T17:50:01.123Z
    assert len(entry["ts"]) == 24
    assert entry["ts"][10] == "T"
    assert entry["ts"][19] == "."
    assert entry["ts"].endswith("Z")


@pytest.mark.usefixtures("restore_logging")
def test_json_logs_outside_a_span_have_no_ids_and_carry_exceptions() -> None:
    stream = io.StringIO()
    configure_logging("scheduler", _settings(), stream=stream)
    log = logging.getLogger("switchyard.test")
    try:
        raise KeyError("missing")
    except KeyError:
        log.exception("lookup failed", extra={"key": object()})
    (line,) = stream.getvalue().splitlines()
    entry = json.loads(line)
    assert "trace_id" not in entry
    assert "span_id" not in entry
    assert entry["level"] == "ERROR"
    assert "KeyError: 'missing'" in entry["exc"]
    assert entry["key"].startswith("<object object")


@pytest.mark.usefixtures("restore_logging")
def test_configuring_logging_twice_does_not_duplicate_output() -> None:
    stream = io.StringIO()
    configure_logging("scheduler", _settings(), stream=stream)
    configure_logging("scheduler", _settings(), stream=stream)
    logging.getLogger("switchyard.test").warning("once")
    assert len(stream.getvalue().splitlines()) == 1


@pytest.mark.usefixtures("restore_logging")
def test_text_logs_are_one_readable_line_and_levels_are_applied() -> None:
    stream = io.StringIO()
    configure_logging("scheduler", _settings(log_format="text", log_level="warning"), stream=stream)
    log = logging.getLogger("switchyard.test")
    log.info("hidden")
    log.warning("shown %d", 3)
    (line,) = stream.getvalue().splitlines()
    assert line.startswith("[scheduler] ")
    assert "WARNING" in line
    assert line.endswith("switchyard.test: shown 3")
    assert logging.getLogger("aiokafka").getEffectiveLevel() >= logging.WARNING
    assert not logging.getLogger("aiokafka").isEnabledFor(logging.INFO)


# -- providers -------------------------------------------------------------------------


def test_the_resource_names_the_service(harness: Harness) -> None:
    with harness.telemetry.tracer_provider.get_tracer("test").start_as_current_span("x"):
        pass
    (span,) = harness.spans.get_finished_spans()
    attributes = dict(span.resource.attributes)
    assert attributes["service.name"] == "test"
    assert attributes["service.namespace"] == "switchyard"
    assert attributes["service.version"] == "0.1.0"
    assert attributes["service.instance.id"] == load_settings({}).instance_id


def test_an_otlp_endpoint_adds_otlp_exporters_and_none_means_none() -> None:
    without = configure_telemetry("t", load_settings({}), install_global=False)
    assert without.exporting_to is None
    assert without.span_exporters == ()
    assert without.metric_exporters == ()
    without.shutdown()

    with_endpoint = configure_telemetry(
        "t", load_settings({}, otlp_endpoint="http://127.0.0.1:4318/"), install_global=False
    )
    assert with_endpoint.exporting_to == "http://127.0.0.1:4318/"
    (spans,) = with_endpoint.span_exporters
    (metrics,) = with_endpoint.metric_exporters
    assert isinstance(spans, OTLPSpanExporter)
    assert isinstance(metrics, OTLPMetricExporter)
    assert spans._endpoint == "http://127.0.0.1:4318/v1/traces"
    assert metrics._endpoint == "http://127.0.0.1:4318/v1/metrics"
    # Nothing was recorded, so shutting down sends nothing; a second call is a no-op.
    with_endpoint.shutdown()
    with_endpoint.shutdown()


def test_the_standard_otel_endpoint_variable_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    made = configure_telemetry("t", load_settings({}), install_global=False)
    assert made.exporting_to == "http://collector:4318"
    (spans,) = made.span_exporters
    assert isinstance(spans, OTLPSpanExporter)
    made.shutdown()


def test_installing_global_providers_twice_neither_fails_nor_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        first = configure_telemetry("t", load_settings({}))
        second = configure_telemetry("t", load_settings({}))
    assert not second.is_global
    assert not [r for r in caplog.records if "Overriding" in r.getMessage()]
    assert isinstance(trace.get_tracer_provider(), TracerProvider)
    if first.is_global:  # unless an earlier test of this process installed one already
        assert trace.get_tracer_provider() is first.tracer_provider
    second.shutdown()
