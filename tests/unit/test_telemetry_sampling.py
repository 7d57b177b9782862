"""Telemetry: which traces are recorded, by the standard ``OTEL_TRACES_SAMPLER`` and
``OTEL_TRACES_SAMPLER_ARG`` variables and by whether anything exports spans."""

from __future__ import annotations

import logging

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from switchyard.config import load_settings
from switchyard.errors import ConfigError
from switchyard.telemetry import Telemetry, TracingMiddleware, configure_telemetry

from tests.support.telemetry import MESSAGE_TYPE, TOPIC, Harness, clear_otel_variables, envelope


@pytest.fixture(autouse=True)
def _no_ambient_otel_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_otel_variables(monkeypatch)


SAMPLED_PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
UNSAMPLED_PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"


def _in_memory(monkeypatch: pytest.MonkeyPatch, **variables: str) -> Harness:
    """Telemetry with an in-memory span exporter, under these OTEL_TRACES_SAMPLER* values."""
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    spans = InMemorySpanExporter()
    reader = InMemoryMetricReader()
    made = configure_telemetry(
        "t", load_settings({}), span_exporter=spans, metric_reader=reader, install_global=False
    )
    return Harness(
        made, spans, reader, TracingMiddleware(made.tracer_provider, made.meter_provider)
    )


def _recorded(harness: Harness, traceparent: str | None) -> bool:
    """Whether a message consumed with this ``traceparent`` (None: none) is recorded."""
    headers = [] if traceparent is None else [("traceparent", traceparent.encode())]
    harness.spans.clear()
    with harness.tracing.consuming(envelope(headers), "g", MESSAGE_TYPE):
        pass
    return len(harness.spans.get_finished_spans()) == 1


@pytest.mark.parametrize(
    ("sampler", "arg", "described", "root", "sampled_parent", "unsampled_parent"),
    [
        ("always_on", None, "always_on", True, True, True),
        ("always_off", None, "always_off", False, False, False),
        ("traceidratio", "1", "traceidratio 1", True, True, True),
        ("traceidratio", "0", "traceidratio 0", False, False, False),
        ("parentbased_always_on", None, "parentbased_always_on", True, True, False),
        ("parentbased_always_off", None, "parentbased_always_off", False, True, False),
        ("parentbased_traceidratio", "1", "parentbased_traceidratio 1", True, True, False),
        ("parentbased_traceidratio", "0", "parentbased_traceidratio 0", False, True, False),
        # Names are case-insensitive; a sampler without a ratio ignores the argument.
        (" ParentBased_Always_On ", "not a ratio", "parentbased_always_on", True, True, False),
    ],
)
def test_each_sampler_value_records_what_it_names(
    monkeypatch: pytest.MonkeyPatch,
    sampler: str,
    arg: str | None,
    described: str,
    root: bool,
    sampled_parent: bool,
    unsampled_parent: bool,
) -> None:
    variables = {"OTEL_TRACES_SAMPLER": sampler}
    if arg is not None:
        variables["OTEL_TRACES_SAMPLER_ARG"] = arg
    harness = _in_memory(monkeypatch, **variables)
    assert harness.telemetry.sampler == described
    assert _recorded(harness, None) is root
    assert _recorded(harness, SAMPLED_PARENT) is sampled_parent
    assert _recorded(harness, UNSAMPLED_PARENT) is unsampled_parent
    harness.telemetry.shutdown()


def test_ratio_zero_records_nothing_but_still_follows_a_sampled_remote_parent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    harness = _in_memory(
        monkeypatch, OTEL_TRACES_SAMPLER="parentbased_traceidratio", OTEL_TRACES_SAMPLER_ARG="0"
    )
    headers: list[tuple[str, bytes]] = []
    with harness.tracing.publishing(TOPIC, MESSAGE_TYPE, headers):
        pass
    with harness.tracing.consuming(envelope(headers), "g", MESSAGE_TYPE):
        pass
    assert harness.spans.get_finished_spans() == ()
    flags = dict(headers)["traceparent"].decode().rpartition("-")[2]
    assert not int(flags, 16) & 0x01, "downstream services are told not to record either"

    # A caller that sent a sampled traceparent forces the trace, down the whole chain.
    forwarded: list[tuple[str, bytes]] = []
    forced = [("traceparent", SAMPLED_PARENT.encode())]
    with (
        harness.tracing.consuming(envelope(forced), "g", MESSAGE_TYPE),
        harness.tracing.publishing(TOPIC, MESSAGE_TYPE, forwarded),
    ):
        pass
    with harness.tracing.consuming(envelope(forwarded), "h", MESSAGE_TYPE):
        pass
    spans = harness.spans.get_finished_spans()
    assert [s.kind for s in spans] == [SpanKind.PRODUCER, SpanKind.CONSUMER, SpanKind.CONSUMER]
    assert {f"{s.context.trace_id:032x}" for s in spans if s.context} == {
        SAMPLED_PARENT.split("-")[1]
    }
    harness.telemetry.shutdown()


def test_with_only_an_in_memory_exporter_every_trace_is_recorded_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    harness = _in_memory(monkeypatch)
    assert harness.telemetry.sampler == "parentbased_traceidratio 1"
    assert all(_recorded(harness, None) for _ in range(20))
    assert _recorded(harness, SAMPLED_PARENT)
    assert not _recorded(harness, UNSAMPLED_PARENT)
    harness.telemetry.shutdown()


def _decision(made: Telemetry, trace_id: int, traceparent: str | None = None) -> Decision:
    """The sampler's decision for a span of ``trace_id`` (no span is made, none exported)."""
    parent = None
    if traceparent is not None:
        parent = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
    result = made.tracer_provider.sampler.should_sample(parent, trace_id, "x")
    return result.decision


def test_with_an_otlp_endpoint_the_default_is_a_tenth_of_unforced_traces() -> None:
    made = configure_telemetry(
        "t", load_settings({}, otlp_endpoint="http://127.0.0.1:4318"), install_global=False
    )
    assert made.sampler == "parentbased_traceidratio 0.1"
    # The ratio sampler keeps a trace when its id's low 64 bits fall in the first tenth.
    assert _decision(made, 1) is Decision.RECORD_AND_SAMPLE
    assert _decision(made, 2**63) is Decision.DROP
    assert _decision(made, 2**63, SAMPLED_PARENT) is Decision.RECORD_AND_SAMPLE
    assert _decision(made, 1, UNSAMPLED_PARENT) is Decision.DROP
    made.shutdown()


def test_the_ratio_alone_changes_the_default_samplers_ratio(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.5")
    made = configure_telemetry(
        "t", load_settings({}, otlp_endpoint="http://127.0.0.1:4318"), install_global=False
    )
    assert made.sampler == "parentbased_traceidratio 0.5"
    assert _decision(made, 2**62) is Decision.RECORD_AND_SAMPLE
    assert _decision(made, 2**63 + 2**62) is Decision.DROP
    made.shutdown()


def test_without_an_exporter_the_sampler_variables_are_ignored(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
    with caplog.at_level(logging.DEBUG, logger="switchyard.telemetry.setup"):
        made = configure_telemetry("t", load_settings({}), install_global=False)
    assert made.sampler == "always_off (nothing exports spans)"
    assert _decision(made, 1) is Decision.DROP
    assert _decision(made, 1, SAMPLED_PARENT) is Decision.DROP
    (line,) = [r for r in caplog.records if "OTEL_TRACES_SAMPLER" in r.getMessage()]
    assert line.levelno == logging.DEBUG
    assert "ignored" in line.getMessage()
    made.shutdown()


@pytest.mark.parametrize(
    ("variables", "named"),
    [
        ({"OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER='sometimes'"),
        ({"OTEL_TRACES_SAMPLER": "parentbased_jaeger_remote"}, "OTEL_TRACES_SAMPLER="),
        (
            {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "ten percent"},
            "OTEL_TRACES_SAMPLER_ARG='ten percent'",
        ),
        ({"OTEL_TRACES_SAMPLER_ARG": "1.5"}, "OTEL_TRACES_SAMPLER_ARG='1.5'"),
        ({"OTEL_TRACES_SAMPLER_ARG": "-0.1"}, "OTEL_TRACES_SAMPLER_ARG='-0.1'"),
        ({"OTEL_TRACES_SAMPLER_ARG": "nan"}, "OTEL_TRACES_SAMPLER_ARG='nan'"),
    ],
)
@pytest.mark.parametrize("exporter", [True, False], ids=["exporter", "no-exporter"])
def test_a_bad_sampler_value_is_a_one_line_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], named: str, exporter: bool
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    spans = InMemorySpanExporter() if exporter else None
    with pytest.raises(ConfigError) as raised:
        configure_telemetry("t", load_settings({}), span_exporter=spans, install_global=False)
    message = str(raised.value)
    assert "\n" not in message
    assert named in message
