"""OpenTelemetry tracer and meter providers, configured from the environment.

With an OTLP endpoint (``SWITCHYARD_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``)
traces and metrics are exported over OTLP/HTTP (``{endpoint}/v1/traces`` and
``{endpoint}/v1/metrics``). Without one nothing is exported: spans are still created,
with valid trace and span ids that flow through message headers and into log lines, but
unsampled, because recording spans nobody reads is about half of a message's handling
cost (see docs/architecture.md, "Telemetry").

Metrics are always readable in the Prometheus text format as well: a
:class:`~switchyard.telemetry.prometheus.PrometheusMetricReader` is attached to every
meter provider built here (``Telemetry.prometheus``), and the services serve it on
``GET /metrics``.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased

from switchyard import __version__
from switchyard.config import Settings
from switchyard.telemetry.prometheus import PrometheusMetricReader

_log = logging.getLogger(__name__)

_globals_lock = threading.Lock()
_globals_installed = False


@dataclass
class Telemetry:
    """The tracer and meter providers of one process.

    Attributes:
        exporting_to: the OTLP endpoint traces and metrics go to, or None.
        span_exporters: every exporter spans go to (OTLP, and any passed in).
        metric_exporters: every exporter metrics are pushed to (OTLP).
        is_global: whether these are the process-wide providers.
        owns_providers: whether :meth:`shutdown` shuts the providers down; False for a
            view another owner shuts down (the embedded stack's services share one).
        prometheus: the pull reader behind ``GET /metrics`` (its ``render()`` is the
            Prometheus text of every metric of ``meter_provider``), or None when these
            providers were built without one.
    """

    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    exporting_to: str | None = None
    span_exporters: tuple[SpanExporter, ...] = ()
    metric_exporters: tuple[MetricExporter, ...] = ()
    is_global: bool = False
    owns_providers: bool = True
    prometheus: PrometheusMetricReader | None = None
    _shut_down: bool = field(default=False, repr=False)

    def shutdown(self) -> None:
        """Flush what is still buffered and close the exporters. Safe to call again."""
        if self._shut_down or not self.owns_providers:
            return
        self._shut_down = True
        try:
            self.tracer_provider.shutdown()
        finally:
            self.meter_provider.shutdown()


def _install_globals(tracer_provider: TracerProvider, meter_provider: MeterProvider) -> bool:
    """Make these the process-wide providers, unless some already are.

    OpenTelemetry sets each global provider once per process and logs a warning
    ("Overriding of current TracerProvider is not allowed") on a second try, so that is
    never attempted.
    """
    global _globals_installed
    with _globals_lock:
        if _globals_installed:
            return False
        _globals_installed = True
        if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            # Someone else (e.g. opentelemetry-instrument) configured this process.
            _log.debug("global OpenTelemetry providers were already set; keeping them")
            return False
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(meter_provider)
        return True


def configure_telemetry(
    service_name: str,
    settings: Settings,
    *,
    span_exporter: SpanExporter | None = None,
    metric_reader: MetricReader | None = None,
    install_global: bool = True,
) -> Telemetry:
    """Build the tracer and meter providers for ``service_name``.

    The resource names the service (``service.name``, ``service.namespace`` =
    ``switchyard``, ``service.instance.id`` = ``settings.instance_id``,
    ``service.version``).

    Args:
        span_exporter: an extra exporter fed synchronously, e.g. an in-memory one in
            tests; spans are then recorded even without an OTLP endpoint.
        metric_reader: an extra metric reader (tests pass an in-memory one). A
            :class:`PrometheusMetricReader` is always attached too
            (``Telemetry.prometheus``).
        install_global: make these the process-wide providers. Done at most once per
            process; later calls return providers that are not global
            (``Telemetry.is_global`` says which).
    """
    resource = Resource.create(
        {
            "service.name": service_name,
            "service.namespace": "switchyard",
            "service.instance.id": settings.instance_id,
            "service.version": __version__,
        }
    )
    endpoint = settings.effective_otlp_endpoint()
    records = bool(endpoint) or span_exporter is not None
    # ParentBased: a span follows its parent's sampling decision, so a trace is recorded
    # in every service or in none. A remote parent marked sampled (a client's
    # `traceparent`) is not followed where nothing would export the spans.
    root = ALWAYS_ON if records else ALWAYS_OFF
    tracer_provider = TracerProvider(
        resource=resource, sampler=ParentBased(root, remote_parent_sampled=root)
    )
    span_exporters: list[SpanExporter] = []
    metric_exporters: list[MetricExporter] = []
    prometheus = PrometheusMetricReader()
    readers: list[MetricReader] = [prometheus]
    if endpoint:
        # Imported only when used: the exporters pull in protobuf and requests.
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        base = endpoint.rstrip("/")
        otlp_spans = OTLPSpanExporter(endpoint=f"{base}/v1/traces")
        otlp_metrics = OTLPMetricExporter(endpoint=f"{base}/v1/metrics")
        tracer_provider.add_span_processor(BatchSpanProcessor(otlp_spans))
        readers.append(PeriodicExportingMetricReader(otlp_metrics))
        span_exporters.append(otlp_spans)
        metric_exporters.append(otlp_metrics)
    if span_exporter is not None:
        tracer_provider.add_span_processor(SimpleSpanProcessor(span_exporter))
        span_exporters.append(span_exporter)
    if metric_reader is not None:
        readers.append(metric_reader)
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    is_global = install_global and _install_globals(tracer_provider, meter_provider)
    return Telemetry(
        tracer_provider,
        meter_provider,
        exporting_to=endpoint,
        span_exporters=tuple(span_exporters),
        metric_exporters=tuple(metric_exporters),
        is_global=is_global,
        prometheus=prometheus,
    )
