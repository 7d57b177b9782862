"""OpenTelemetry tracer and meter providers, configured from the environment.

With an OTLP endpoint (``SWITCHYARD_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``)
traces and metrics are exported over OTLP/HTTP; without one nothing is exported, but
spans are still created and sampled, so trace context still flows between services and
into log lines.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased

from switchyard import __version__
from switchyard.config import Settings

_globals_installed = False


@dataclass
class Telemetry:
    """The providers one process uses; :meth:`shutdown` flushes what is still buffered."""

    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    exporting_to: str | None = None
    _shut_down: bool = field(default=False, repr=False)

    def shutdown(self) -> None:
        if self._shut_down:
            return
        self._shut_down = True
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


def configure_telemetry(
    service_name: str,
    settings: Settings,
    *,
    span_exporter: SpanExporter | None = None,
    metric_reader: MetricReader | None = None,
    install_global: bool = True,
) -> Telemetry:
    """Build the tracer and meter providers for ``service_name``.

    Args:
        span_exporter: an extra exporter fed synchronously (tests pass an in-memory one).
        metric_reader: an extra metric reader (tests pass an in-memory one).
        install_global: make these the process-wide providers. Done at most once per
            process: OpenTelemetry refuses to replace global providers.
    """
    global _globals_installed
    resource = Resource.create(
        {
            "service.name": service_name,
            "service.namespace": "switchyard",
            "service.instance.id": settings.instance_id,
            "service.version": __version__,
        }
    )
    endpoint = settings.effective_otlp_endpoint()
    # When no span is exported anywhere, recording them is pure cost (about half of a
    # message's handling time): spans are then created unsampled, which keeps trace and
    # span ids flowing through headers and logs for a fraction of the price.
    records = bool(endpoint) or span_exporter is not None
    tracer_provider = TracerProvider(
        resource=resource, sampler=ParentBased(ALWAYS_ON if records else ALWAYS_OFF)
    )
    readers: list[MetricReader] = []
    if endpoint:
        # Imported only when used: the exporters pull in protobuf and requests.
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        base = endpoint.rstrip("/")
        tracer_provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{base}/v1/traces"))
        )
        readers.append(
            PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=f"{base}/v1/metrics"))
        )
    if span_exporter is not None:
        tracer_provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    if metric_reader is not None:
        readers.append(metric_reader)
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    if install_global and not _globals_installed:
        _globals_installed = True
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(meter_provider)
    return Telemetry(tracer_provider, meter_provider, exporting_to=endpoint)
