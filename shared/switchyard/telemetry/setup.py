"""OpenTelemetry tracer and meter providers, configured from the environment.

With an OTLP endpoint (``SWITCHYARD_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``)
traces and metrics are exported over OTLP/HTTP (``{endpoint}/v1/traces`` and
``{endpoint}/v1/metrics``). Without one nothing is exported: spans are still created,
with valid trace and span ids that flow through message headers and into log lines, but
unsampled, because recording spans nobody reads is about half of a message's handling
cost (see docs/architecture.md, "Telemetry").

Sampling follows OpenTelemetry's standard variables, read from the process environment:

- ``OTEL_TRACES_SAMPLER``: ``always_on``, ``always_off``, ``traceidratio``,
  ``parentbased_always_on``, ``parentbased_always_off`` or ``parentbased_traceidratio``
  (the default);
- ``OTEL_TRACES_SAMPLER_ARG``: the ratio of the two ``traceidratio`` samplers, 0 to 1;
  by default 0.1 when spans go to an OTLP endpoint, 1 when they go only to an exporter
  passed to :func:`configure_telemetry` (tests and tools that read every span). The
  other samplers ignore it.

A bad value is a :class:`~switchyard.errors.ConfigError` naming the variable.

The ``parentbased_*`` samplers decide only for a span without a parent (the root) and
otherwise follow the parent: a remote parent that is sampled, such as a client's
``traceparent`` with the sampled flag or the headers of a message published in a
sampled span, is always recorded (``remote_parent_sampled`` = always on), one that is
not is never recorded. So a client can force a trace of its request, and a trace is
recorded in every service or in none. ``traceidratio`` decides from the trace id alone,
the same way in every service that has the same ratio; ``always_on`` and ``always_off``
ignore parents.

When nothing would export spans (no endpoint and no extra exporter) every span is
unsampled whatever these variables say, a sampled remote parent included; the
variables are still checked, and a debug line says they are ignored.
``Telemetry.sampler`` describes the sampler chosen (``"parentbased_traceidratio 0.1"``).

Metrics are always readable in the Prometheus text format as well: a
:class:`~switchyard.telemetry.prometheus.PrometheusMetricReader` is attached to every
meter provider built here (``Telemetry.prometheus``), and the services serve it on
``GET /metrics``.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Mapping
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
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)

from switchyard import __version__
from switchyard.config import Settings
from switchyard.errors import ConfigError
from switchyard.telemetry.prometheus import PrometheusMetricReader

_log = logging.getLogger(__name__)

_globals_lock = threading.Lock()
_globals_installed = False

SAMPLER_VARIABLE = "OTEL_TRACES_SAMPLER"
SAMPLER_ARG_VARIABLE = "OTEL_TRACES_SAMPLER_ARG"
DEFAULT_SAMPLER = "parentbased_traceidratio"
DEFAULT_EXPORT_RATIO = 0.1
"""The ratio of root spans recorded when spans go to an OTLP endpoint and
``OTEL_TRACES_SAMPLER_ARG`` is unset: every trace a client forces, 10 % of the others."""
SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
"""The values of ``OTEL_TRACES_SAMPLER`` understood here."""
UNSAMPLED = "always_off (nothing exports spans)"
"""``Telemetry.sampler`` when no exporter is configured."""


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
        sampler: the trace sampler, described for a start-up log line:
            ``"parentbased_traceidratio 0.1"``, ``"always_on"``, :data:`UNSAMPLED`;
            empty when these providers were not built by :func:`configure_telemetry`.
    """

    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    exporting_to: str | None = None
    span_exporters: tuple[SpanExporter, ...] = ()
    metric_exporters: tuple[MetricExporter, ...] = ()
    is_global: bool = False
    owns_providers: bool = True
    prometheus: PrometheusMetricReader | None = None
    sampler: str = ""
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


def sampler_from_environment(
    env: Mapping[str, str] | None = None, *, default_ratio: float = DEFAULT_EXPORT_RATIO
) -> tuple[Sampler, str]:
    """The sampler ``OTEL_TRACES_SAMPLER`` and ``OTEL_TRACES_SAMPLER_ARG`` ask for.

    Args:
        env: the variables to read (default ``os.environ``).
        default_ratio: the ratio of a ``traceidratio`` sampler when
            ``OTEL_TRACES_SAMPLER_ARG`` is unset.

    Returns:
        The sampler and its description (``"parentbased_traceidratio 0.1"``).

    Raises:
        ConfigError: one line naming the variable, e.g.
            ``OTEL_TRACES_SAMPLER='sometimes': expected one of always_on, …``.
    """
    source = os.environ if env is None else env
    # The specification treats an empty value as unset and the names case-insensitively.
    raw_name = source.get(SAMPLER_VARIABLE, "")
    name = raw_name.strip().lower() or DEFAULT_SAMPLER
    if name not in SAMPLERS:
        raise ConfigError(
            f"invalid configuration: {SAMPLER_VARIABLE}={raw_name!r}: "
            f"expected one of {', '.join(SAMPLERS)}"
        )
    if name == "always_on":
        return ALWAYS_ON, name
    if name == "always_off":
        return ALWAYS_OFF, name
    if name == "parentbased_always_on":
        return ParentBased(ALWAYS_ON), name
    if name == "parentbased_always_off":
        return ParentBased(ALWAYS_OFF), name
    raw_arg = source.get(SAMPLER_ARG_VARIABLE, "")
    ratio = default_ratio if not raw_arg.strip() else _ratio(raw_arg)
    root = TraceIdRatioBased(ratio)
    # ParentBased's defaults: a sampled parent (remote or local) is followed, an
    # unsampled one is not; the ratio decides only for roots.
    sampler: Sampler = ParentBased(root) if name.startswith("parentbased_") else root
    return sampler, f"{name} {ratio:g}"


def _ratio(raw: str) -> float:
    try:
        ratio = float(raw)
    except ValueError:
        ratio = math.nan
    if not 0.0 <= ratio <= 1.0:  # NaN fails this too
        raise ConfigError(
            f"invalid configuration: {SAMPLER_ARG_VARIABLE}={raw!r}: "
            "expected a sampling ratio from 0 to 1"
        )
    return ratio


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

    Spans are sampled as ``OTEL_TRACES_SAMPLER`` and ``OTEL_TRACES_SAMPLER_ARG`` say
    (default ``parentbased_traceidratio``, ratio 0.1 with an OTLP endpoint, 1 with only
    ``span_exporter``), and never when nothing would export them (see the module's
    docstring).

    Args:
        span_exporter: an extra exporter fed synchronously, e.g. an in-memory one in
            tests; spans are then recorded even without an OTLP endpoint.
        metric_reader: an extra metric reader (tests pass an in-memory one). A
            :class:`PrometheusMetricReader` is always attached too
            (``Telemetry.prometheus``).
        install_global: make these the process-wide providers. Done at most once per
            process; later calls return providers that are not global
            (``Telemetry.is_global`` says which).

    Raises:
        ConfigError: a sampler variable has a bad value.
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
    # Checked even when unused, so a typo fails before an endpoint is ever set.
    # An in-process exporter is read by whoever passed it (a test, a tool), who wants
    # every span; an OTLP collector gets a tenth of the traces nobody forced.
    sampler, description = sampler_from_environment(
        default_ratio=DEFAULT_EXPORT_RATIO if endpoint else 1.0
    )
    if not endpoint and span_exporter is None:
        # Recording spans nobody reads costs CPU: not even a caller's sampled
        # `traceparent` is followed here. Unsampled spans still take their parent's
        # trace id, so ids flow through headers and logs all the same.
        sampler = ALWAYS_OFF
        description = UNSAMPLED
        if any(os.environ.get(v, "").strip() for v in (SAMPLER_VARIABLE, SAMPLER_ARG_VARIABLE)):
            _log.debug(
                "no span exporter configured: %s and %s are ignored, every span is unsampled",
                SAMPLER_VARIABLE,
                SAMPLER_ARG_VARIABLE,
            )
    tracer_provider = TracerProvider(resource=resource, sampler=sampler)
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
        sampler=description,
    )
