"""Prometheus text exposition (format 0.0.4) of the OpenTelemetry metrics of a process.

:class:`PrometheusMetricReader` is an SDK metric reader (cumulative temporality) that
:func:`~switchyard.telemetry.configure_telemetry` always attaches to the meter provider,
next to the OTLP exporter when one is configured; :meth:`PrometheusMetricReader.render`
collects and renders everything the process measured, for a ``GET /metrics``:
:func:`render_metrics` maps the OpenTelemetry points to metric families and
``prometheus_client`` writes the text (escaping, number formatting).

How instruments map (see also docs/architecture.md, "Telemetry"):

* names: every character outside ``[a-zA-Z0-9_:]`` becomes ``_``
  (``switchyard.bus.handler.duration`` → ``switchyard_bus_handler_duration``), a
  ``switchyard_`` prefix is added where missing, and the instrument's unit is appended
  when it has one (``s`` → ``_seconds``, ``By`` → ``_bytes``, ``1`` on a gauge →
  ``_ratio``; annotations such as ``{request}`` add nothing);
* a counter (monotonic sum, synchronous or observable) → ``counter``, its samples (and
  its ``HELP`` and ``TYPE`` lines) named ``..._total``;
* an up-down counter (non-monotonic sum) and a gauge → ``gauge``;
* a histogram → ``histogram``: cumulative ``_bucket{le="..."}`` samples ending with
  ``le="+Inf"``, then ``_sum`` and ``_count``;
* exponential histograms are not rendered (nothing here records one);
* attributes become labels (keys sanitised like names); ``# HELP`` is the instrument's
  description, ``# TYPE`` its kind.

One family per name: points of the same name from several meters (instrumentation
scopes) are merged under one ``HELP``/``TYPE``; a name reused with another kind keeps
the first kind and drops the other's points.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping

from opentelemetry.sdk.metrics import (
    Counter,
    Histogram,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    UpDownCounter,
)
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    HistogramDataPoint,
    InMemoryMetricReader,
    MetricsData,
    NumberDataPoint,
    Sum,
)
from opentelemetry.sdk.metrics.export import (
    Histogram as HistogramData,
)
from opentelemetry.util.types import AttributeValue
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The content type of the text exposition format 0.0.4."""

PREFIX = "switchyard_"

_INVALID_NAME = re.compile(r"[^a-zA-Z0-9_:]")
_INVALID_LABEL = re.compile(r"[^a-zA-Z0-9_]")
_REPEATED_UNDERSCORES = re.compile(r"__+")

# UCUM units as OpenTelemetry uses them → the words Prometheus names carry.
_UNITS: Mapping[str, str] = {
    "d": "days",
    "h": "hours",
    "min": "minutes",
    "s": "seconds",
    "ms": "milliseconds",
    "us": "microseconds",
    "ns": "nanoseconds",
    "By": "bytes",
    "KiBy": "kibibytes",
    "MiBy": "mebibytes",
    "GiBy": "gibibytes",
    "KBy": "kilobytes",
    "MBy": "megabytes",
    "GBy": "gigabytes",
    "bit": "bits",
    "Hz": "hertz",
    "%": "percent",
}
_PER_UNITS: Mapping[str, str] = {"s": "second", "m": "minute", "h": "hour", "d": "day"}


class PrometheusMetricReader(InMemoryMetricReader):
    """A metric reader whose :meth:`render` is the Prometheus text of every metric.

    Temporality is cumulative for every instrument kind, as Prometheus expects. It is a
    pull reader: nothing is collected until :meth:`render` (or
    :meth:`get_metrics_data`) is called, so an unscraped process pays nothing for it.
    """

    def __init__(self) -> None:
        cumulative = AggregationTemporality.CUMULATIVE
        super().__init__(
            preferred_temporality={
                kind: cumulative
                for kind in (
                    Counter,
                    UpDownCounter,
                    Histogram,
                    ObservableCounter,
                    ObservableUpDownCounter,
                    ObservableGauge,
                )
            }
        )
        self._render_lock = threading.Lock()

    def render(self) -> str:
        """Collect now and return the exposition text (empty when nothing was measured,
        or once the meter provider is shut down)."""
        with self._render_lock:
            return render_metrics(self.get_metrics_data())


def metric_name(name: str, unit: str = "", *, kind: str = "gauge") -> str:
    """The Prometheus name of an instrument called ``name`` measuring in ``unit``.

    ``kind`` is the Prometheus type (``counter`` names do not get their ``_total`` here;
    a ``1`` unit becomes ``_ratio`` on a gauge only).

    >>> metric_name("switchyard.ingress.latency", "s", kind="histogram")
    'switchyard_ingress_latency_seconds'
    """
    base = _sanitise(name, _INVALID_NAME)
    if not base.startswith(PREFIX):
        base = PREFIX + base.lstrip("_")
    suffix = _unit_suffix(unit, kind)
    if suffix and not base.endswith("_" + suffix):
        base = f"{base}_{suffix}"
    if kind == "counter" and base.endswith("_total"):
        base = base[: -len("_total")]
    return base


def label_name(key: str) -> str:
    """An attribute key as a label name (``http.route`` → ``http_route``)."""
    return _sanitise(key, _INVALID_LABEL)


def render_metrics(data: MetricsData | None) -> str:
    """The text exposition of ``data`` (as a metric reader collected it), written by
    ``prometheus_client``; empty for None or when nothing was measured.

    Families are sorted by name; the points of one family keep their collected order.
    """
    if data is None:
        return ""
    families: dict[str, Metric] = {}
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                points = metric.data
                if isinstance(points, Sum):
                    kind = "counter" if points.is_monotonic else "gauge"
                elif isinstance(points, Gauge):
                    kind = "gauge"
                elif isinstance(points, HistogramData):
                    kind = "histogram"
                else:  # exponential histograms: not used here
                    continue
                name = metric_name(metric.name, metric.unit or "", kind=kind)
                family = families.get(name)
                if family is None:
                    family = families[name] = Metric(name, metric.description or "", kind)
                elif family.type != kind:
                    continue
                for point in points.data_points:
                    _add_samples(family, point)
    kept = [families[name] for name in sorted(families) if families[name].samples]
    if not kept:
        return ""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(kept))
    return generate_latest(registry).decode("utf-8")


class _Families(Collector):
    """What one render collected, handed to ``prometheus_client``'s writer."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def _add_samples(family: Metric, point: NumberDataPoint | HistogramDataPoint) -> None:
    labels = _labels(point.attributes or {})
    name = family.name
    if isinstance(point, HistogramDataPoint):
        cumulative = 0
        for bound, count in zip(point.explicit_bounds, point.bucket_counts, strict=False):
            cumulative += count
            family.add_sample(f"{name}_bucket", labels | {"le": _go_float(bound)}, cumulative)
        family.add_sample(f"{name}_bucket", labels | {"le": "+Inf"}, point.count)
        family.add_sample(f"{name}_sum", labels, point.sum)
        family.add_sample(f"{name}_count", labels, point.count)
        return
    sample = f"{name}_total" if family.type == "counter" else name
    family.add_sample(sample, labels, point.value)


def _go_float(value: float) -> str:
    """A number as Prometheus writes it (``0.5``, ``+Inf``), by ``prometheus_client``."""
    text: str = floatToGoString(value)  # type: ignore[no-untyped-call]
    return text


def _labels(attributes: Mapping[str, AttributeValue]) -> dict[str, str]:
    return {label_name(k): _label_value(v) for k, v in attributes.items()}


def _label_value(value: AttributeValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return _go_float(value) if isinstance(value, float) else str(value)
    if isinstance(value, Iterable):
        return ",".join(_label_value(v) for v in value)
    return str(value)


def _unit_suffix(unit: str, kind: str) -> str:
    unit = re.sub(r"\{[^}]*\}", "", unit).strip()
    if not unit:
        return ""
    if unit == "1":
        return "ratio" if kind == "gauge" else ""
    if unit in _UNITS:
        return _UNITS[unit]
    if "/" in unit:
        top, _, bottom = unit.partition("/")
        top_word = _UNITS.get(top, top) if top else ""
        bottom_word = _PER_UNITS.get(bottom, bottom)
        word = f"{top_word}_per_{bottom_word}" if top_word else f"per_{bottom_word}"
        return _sanitise(word, _INVALID_LABEL).strip("_")
    return _sanitise(unit, _INVALID_LABEL).strip("_")


def _sanitise(text: str, invalid: re.Pattern[str]) -> str:
    cleaned = _REPEATED_UNDERSCORES.sub("_", invalid.sub("_", text))
    if not cleaned or cleaned[0].isdigit():
        cleaned = "_" + cleaned
    return cleaned


__all__ = [
    "CONTENT_TYPE",
    "PrometheusMetricReader",
    "label_name",
    "metric_name",
    "render_metrics",
]
